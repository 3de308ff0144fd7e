import Config

# A bad setting stops the start with its one line on standard error and exit status 1,
# like every start-up error (Observatory.StartupError, which cannot run yet: this file
# is read before the application starts). A stack trace of this file would say nothing
# more; OBSERVATORY_STARTUP_TRACE=1 raises instead, trace and all. Read in a VM where
# Observatory already runs (a test, a remote console) it raises too: that is no start
# to stop.
bad_setting = fn message ->
  starting? = not List.keymember?(Application.started_applications(), :observatory, 0)

  if starting? and System.get_env("OBSERVATORY_STARTUP_TRACE") in [nil, "", "0", "false"] do
    IO.puts(:stderr, "error: " <> message)
    System.halt(1)
  else
    raise message
  end
end

# Keys and tokens from the environment override the config files:
#   OBSERVATORY_AGENT_KEYS="key1,key2"  shared agent keys (insecure: any agent can act as
#     any other); refused at start unless OBSERVATORY_INSECURE_SHARED_AGENT_KEYS=1.
#     Issue each agent its own key instead: POST /api/v1/agents/:id/keys.
#   OBSERVATORY_OPERATOR_TOKENS="alice:token1,bob:token2"
#   OBSERVATORY_PORT=4000  OBSERVATORY_IP=127.0.0.1
#   OBSERVATORY_SECRET_KEY_BASE=<at least 32 random bytes, e.g. `openssl rand -base64 48`>
#     signs the dashboard's sign-in cookies; unset, a random key is generated at boot
#     (Observatory.Application) and sign-ins do not survive a restart.
if keys = System.get_env("OBSERVATORY_AGENT_KEYS") do
  config :observatory, agent_keys: String.split(keys, ",", trim: true)
end

if insecure = System.get_env("OBSERVATORY_INSECURE_SHARED_AGENT_KEYS") do
  config :observatory, insecure_shared_agent_keys: insecure in ["1", "true"]
end

if tokens = System.get_env("OBSERVATORY_OPERATOR_TOKENS") do
  operator_tokens =
    for pair <- String.split(tokens, ",", trim: true), into: %{} do
      case String.split(pair, ":", parts: 2) do
        [name, token] when name != "" and token != "" ->
          {token, name}

        _ ->
          bad_setting.(
            "OBSERVATORY_OPERATOR_TOKENS is name:token pairs separated by commas " <>
              "(alice:t1,bob:t2); one pair has no name or no token"
          )
      end
    end

  config :observatory, operator_tokens: operator_tokens
end

if port = System.get_env("OBSERVATORY_PORT") do
  case Integer.parse(port) do
    {n, ""} when n in 0..65_535 -> config :observatory, ObservatoryWeb.Endpoint, port: n
    _ -> bad_setting.("OBSERVATORY_PORT must be a port number (0..65535), got: #{inspect(port)}")
  end
end

if ip = System.get_env("OBSERVATORY_IP") do
  case :inet.parse_address(String.to_charlist(ip)) do
    {:ok, address} ->
      config :observatory, ObservatoryWeb.Endpoint, ip: address

    _ ->
      bad_setting.("OBSERVATORY_IP must be an IP address such as 127.0.0.1, got: #{inspect(ip)}")
  end
end

#   OBSERVATORY_DATA_DIR=/var/lib/observatory
#   OBSERVATORY_LLM_UPSTREAM=https://api.openai.com/v1  OBSERVATORY_LLM_API_KEY=sk-...
#   OBSERVATORY_ANTHROPIC_UPSTREAM=https://api.anthropic.com  OBSERVATORY_ANTHROPIC_API_KEY=sk-ant-...
if dir = System.get_env("OBSERVATORY_DATA_DIR") do
  config :observatory, data_dir: dir
end

if upstream = System.get_env("OBSERVATORY_LLM_UPSTREAM") do
  config :observatory, llm_upstream: upstream
end

if key = System.get_env("OBSERVATORY_LLM_API_KEY") do
  config :observatory, llm_upstream_api_key: key
end

if cacertfile = System.get_env("OBSERVATORY_LLM_CACERTFILE") do
  config :observatory, llm_upstream_cacertfile: cacertfile
end

if upstream = System.get_env("OBSERVATORY_ANTHROPIC_UPSTREAM") do
  config :observatory, anthropic_upstream: upstream
end

if key = System.get_env("OBSERVATORY_ANTHROPIC_API_KEY") do
  config :observatory, anthropic_upstream_api_key: key
end

# OBSERVATORY_ALERT_SOURCE=entropy|verdict — which signal raises alerts: the FRD-009
# entropy ratio (the default) or the loop verdict (docs/dashboard.md, "Choose what raises
# the alerts").
if source = System.get_env("OBSERVATORY_ALERT_SOURCE") do
  alert_source =
    case source |> String.trim() |> String.downcase() do
      "entropy" ->
        :entropy

      "verdict" ->
        :verdict

      _other ->
        bad_setting.(
          "OBSERVATORY_ALERT_SOURCE must be \"entropy\" or \"verdict\", got: " <>
            inspect(source)
        )
    end

  config :observatory, alert_source: alert_source
end

#   OBSERVATORY_LLM_TIMEOUT_MS=600000  OBSERVATORY_LLM_MAX_STREAM_MS=1800000
#   OBSERVATORY_LLM_MAX_REQUEST_BYTES=33554432
for {var, key} <- [
      {"OBSERVATORY_LLM_TIMEOUT_MS", :llm_timeout_ms},
      {"OBSERVATORY_LLM_MAX_STREAM_MS", :llm_max_stream_ms},
      {"OBSERVATORY_LLM_MAX_REQUEST_BYTES", :llm_max_request_bytes}
    ],
    value = System.get_env(var) do
  case Integer.parse(value) do
    {n, ""} when n > 0 -> config :observatory, [{key, n}]
    _ -> bad_setting.("#{var} must be a positive integer, got: #{inspect(value)}")
  end
end

#   OBSERVATORY_KILL_SWITCH_PROMPT=newest_input|last_user_message  what a request's prompt
#     is for the kill switch (README "Kill switch — How it scores")
if prompt = System.get_env("OBSERVATORY_KILL_SWITCH_PROMPT") do
  source =
    case prompt do
      "newest_input" ->
        :newest_input

      "last_user_message" ->
        :last_user_message

      other ->
        bad_setting.(
          "OBSERVATORY_KILL_SWITCH_PROMPT must be newest_input or last_user_message, got: #{inspect(other)}"
        )
    end

  config :observatory, :kill_switch, prompt: source
end

#   OBSERVATORY_KILL_SWITCH_MODE=enforce|warn|shadow  the mode of agents registered from
#     now on (docs/shadow_mode.md)
if mode = System.get_env("OBSERVATORY_KILL_SWITCH_MODE") do
  mode =
    case mode do
      "enforce" ->
        :enforce

      "warn" ->
        :warn

      "shadow" ->
        :shadow

      other ->
        bad_setting.(
          "OBSERVATORY_KILL_SWITCH_MODE must be enforce, warn or shadow, got: #{inspect(other)}"
        )
    end

  config :observatory, :kill_switch, mode: mode
end

#   OBSERVATORY_GUIDANCE=on|off  guidance notes for agents without a setting of their own
#     (docs/guidance.md)
if guidance = System.get_env("OBSERVATORY_GUIDANCE") do
  enabled =
    case guidance do
      on when on in ["on", "1", "true"] -> true
      off when off in ["off", "0", "false"] -> false
      other -> bad_setting.("OBSERVATORY_GUIDANCE must be on or off, got: #{inspect(other)}")
    end

  config :observatory, :guidance, enabled: enabled
end

#   OBSERVATORY_PRICES_FILE=/etc/observatory/prices.json  the budgets' price table, JSON:
#     {"gpt-4.1": {"input": 2.0, "output": 8.0}} (USD per million tokens; docs/budgets.md)
if file = System.get_env("OBSERVATORY_PRICES_FILE") do
  budgets = Application.get_env(:observatory, :budgets, [])
  config :observatory, :budgets, Keyword.put(budgets, :prices_file, file)
end

if demo = System.get_env("OBSERVATORY_DEMO") do
  config :observatory, demo: demo in ["1", "true"]
end

if secret = System.get_env("OBSERVATORY_SECRET_KEY_BASE") do
  if byte_size(secret) < 32 do
    bad_setting.("OBSERVATORY_SECRET_KEY_BASE must be at least 32 bytes long")
  end

  config :observatory, secret_key_base: secret
end

# A cluster (README "Cluster", docs/cluster.md). The node's own name and cookie come
# from the VM (`elixir --name`/`--cookie`, or RELEASE_NODE/RELEASE_COOKIE in a release).
#   OBSERVATORY_CLUSTER_NODES="obs@10.0.0.1,obs@10.0.0.2"  the static member list
#   OBSERVATORY_CLUSTER_DNS=observatory.internal  A records polled; each is
#     <OBSERVATORY_CLUSTER_BASENAME, default "observatory">@<address>
#   OBSERVATORY_CLUSTER_DNS_NAMESERVERS="10.0.0.2:53,10.0.0.3"  resolvers (default: the system's)
# and one variable per timing (milliseconds; the defaults in Observatory.Cluster):
#   OBSERVATORY_CLUSTER_POLL_MS, _RPC_TIMEOUT_MS, _JOIN_TIMEOUT_MS, _HEARTBEAT_MS,
#   _MEMBER_TIMEOUT_MS, _WRITE_TIMEOUT_MS, _HEAL_TIMEOUT_MS, _LOAD_TIMEOUT_MS, _VERIFY_MS
cluster_nodes = System.get_env("OBSERVATORY_CLUSTER_NODES")
cluster_dns = System.get_env("OBSERVATORY_CLUSTER_DNS")

if cluster_nodes || cluster_dns do
  config :observatory, :cluster,
    nodes: for(n <- String.split(cluster_nodes || "", ",", trim: true), do: String.to_atom(n)),
    dns: cluster_dns,
    dns_basename: System.get_env("OBSERVATORY_CLUSTER_BASENAME", "observatory")
end

if nameservers = System.get_env("OBSERVATORY_CLUSTER_DNS_NAMESERVERS") do
  servers =
    for server <- String.split(nameservers, ",", trim: true) do
      {host, port} =
        case String.split(server, ":") do
          [host] -> {host, "53"}
          [host, port] -> {host, port}
          _ -> {"", ""}
        end

      with {:ok, ip} <- :inet.parse_address(String.to_charlist(host)),
           {port, ""} when port in 1..65_535 <- Integer.parse(port) do
        {ip, port}
      else
        _ ->
          bad_setting.(
            "OBSERVATORY_CLUSTER_DNS_NAMESERVERS: #{inspect(server)} is not <ip>[:port]"
          )
      end
    end

  config :observatory, :cluster, dns_nameservers: servers
end

for {env, key} <- [
      {"OBSERVATORY_CLUSTER_POLL_MS", :poll_ms},
      {"OBSERVATORY_CLUSTER_RPC_TIMEOUT_MS", :rpc_timeout_ms},
      {"OBSERVATORY_CLUSTER_JOIN_TIMEOUT_MS", :join_timeout_ms},
      {"OBSERVATORY_CLUSTER_HEARTBEAT_MS", :heartbeat_ms},
      {"OBSERVATORY_CLUSTER_MEMBER_TIMEOUT_MS", :member_timeout_ms},
      {"OBSERVATORY_CLUSTER_WRITE_TIMEOUT_MS", :write_timeout_ms},
      {"OBSERVATORY_CLUSTER_HEAL_TIMEOUT_MS", :heal_timeout_ms},
      {"OBSERVATORY_CLUSTER_LOAD_TIMEOUT_MS", :load_timeout_ms},
      {"OBSERVATORY_CLUSTER_VERIFY_MS", :verify_ms}
    ],
    value = System.get_env(env) do
  case Integer.parse(value) do
    {ms, ""} when ms > 0 -> config :observatory, :cluster, [{key, ms}]
    _ -> bad_setting.("#{env} must be a positive number of milliseconds, got: #{inspect(value)}")
  end
end
