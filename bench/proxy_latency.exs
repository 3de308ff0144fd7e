# The LLM proxy's added latency per request: the same requests sent straight to a
# stub upstream on loopback and through Observatory's proxy, in the same run.
#
#   OBSERVATORY_PORT=0 OBSERVATORY_DATA_DIR=$(mktemp -d) MIX_ENV=prod mix run bench/proxy_latency.exs
#   ... mix run bench/proxy_latency.exs -- --quick
#
# One client, one request at a time, a new connection per request on both paths (the
# proxy opens one to the upstream per request too). Time to first byte is the answer's
# head for a whole answer and its first event for a stream; total is its last byte.
# Scenarios: a plain chat completion; the same with the kill switch on and a tool turn
# in the conversation (step ingestion); a streamed completion of 20 events; an
# Anthropic message; a Responses API call; a chat completion carrying a 900 KiB
# conversation.
#
# Before/after in the same run: start this checkout and an older one as gateways of
# their own (each its own port and data directory, this run's stub as its upstream,
# an operator token), and name them; their requests are interleaved:
#
#   start() { (cd $1 && OBSERVATORY_PORT=$2 OBSERVATORY_DATA_DIR=$(mktemp -d) \
#     OBSERVATORY_LLM_UPSTREAM=http://127.0.0.1:41307/v1 OBSERVATORY_ANTHROPIC_UPSTREAM=http://127.0.0.1:41307 \
#     OBSERVATORY_OPERATOR_TOKENS=bench:bench-token MIX_ENV=prod mix run --no-halt &) }
#   start /tmp/old 4131; start . 4130
#   ... mix run bench/proxy_latency.exs -- --stub-port 41307 --token bench-token \
#         --candidate http://127.0.0.1:4130 --baseline http://127.0.0.1:4131
alias Observatory.{AgentKeys, JSON, KillSwitch}
alias Observatory.Proxy.HTTPClient

Logger.configure(level: :error)

{opts, _, _} =
  OptionParser.parse(System.argv() -- ["--"],
    strict: [
      quick: :boolean,
      stub_port: :integer,
      candidate: :string,
      baseline: :string,
      token: :string
    ]
  )

n = if opts[:quick], do: 200, else: 2_000
baseline = opts[:baseline]

completion =
  JSON.encode!(%{
    id: "chatcmpl-bench",
    object: "chat.completion",
    model: "bench-model",
    choices: [
      %{index: 0, message: %{role: "assistant", content: String.duplicate("All good. ", 30)}}
    ]
  })

events =
  for k <- 1..20 do
    chunk = %{
      object: "chat.completion.chunk",
      choices: [%{index: 0, delta: %{content: "t#{k} "}}]
    }

    "data: " <> JSON.encode!(chunk) <> "\n\n"
  end ++ ["data: [DONE]\n\n"]

message =
  JSON.encode!(%{
    id: "msg_bench",
    type: "message",
    role: "assistant",
    content: [%{type: "text", text: String.duplicate("All good. ", 30)}]
  })

response =
  JSON.encode!(%{
    id: "resp_bench",
    object: "response",
    output: [
      %{
        type: "message",
        role: "assistant",
        content: [%{type: "output_text", text: String.duplicate("All good. ", 30)}]
      }
    ]
  })

# The stub upstream: MochiWeb on loopback, answering at once.
stub = fn req ->
  body = :mochiweb_request.recv_body(8 * 1024 * 1024, req) |> IO.iodata_to_binary()

  cond do
    body =~ ~s("stream":true) ->
      resp =
        :mochiweb_request.respond({200, [{"Content-Type", "text/event-stream"}], :chunked}, req)

      for e <- events, do: :mochiweb_response.write_chunk(e, resp)
      :mochiweb_response.write_chunk("", resp)

    body =~ ~s("max_tokens") ->
      :mochiweb_request.respond({200, [{"Content-Type", "application/json"}], message}, req)

    body =~ ~s("input") ->
      :mochiweb_request.respond({200, [{"Content-Type", "application/json"}], response}, req)

    true ->
      :mochiweb_request.respond({200, [{"Content-Type", "application/json"}], completion}, req)
  end
end

{:ok, stub_pid} =
  :mochiweb_http.start_link(
    name: :bench_upstream,
    ip: {127, 0, 0, 1},
    port: opts[:stub_port] || 0,
    loop: stub
  )

stub_url = "http://127.0.0.1:#{:mochiweb_socket_server.get(stub_pid, :port)}"

Application.put_env(:observatory, :llm_upstream, stub_url <> "/v1")
Application.put_env(:observatory, :anthropic_upstream, stub_url)
{:ok, _} = KillSwitch.configure("bench-watched", %{"enabled" => true, "threshold" => 1_000})

# Each agent's own key (it names the agent); a data dir reused across runs rotates it.
local_keys =
  Map.new(["bench-plain", "bench-watched"], fn agent ->
    {:ok, %{key: key}} =
      with {:error, :too_many_keys} <- AgentKeys.issue(agent, operator: "bench"),
           do: AgentKeys.rotate(agent, operator: "bench")

    {agent, key}
  end)

# Another gateway's keys, issued and its kill switch configured over its operator API.
remote_keys = fn url, token ->
  :inets.start()
  operator = [{~c"authorization", String.to_charlist("Bearer " <> token)}]

  call = fn method, path, body ->
    request = {String.to_charlist(url <> path), operator, ~c"application/json", body}
    {:ok, {{_, status, _}, _, answer}} = :httpc.request(method, request, [], body_format: :binary)
    {status, answer}
  end

  {200, _} =
    call.(:put, "/api/v1/agents/bench-watched/kill_switch", ~s({"enabled":true,"threshold":1000}))

  Map.new(["bench-plain", "bench-watched"], fn agent ->
    {201, answer} =
      case call.(:post, "/api/v1/agents/#{agent}/keys", "") do
        {201, _} = issued -> issued
        {409, _} -> call.(:post, "/api/v1/agents/#{agent}/keys/rotate", "")
      end

    {:ok, %{"key" => key}} = JSON.decode(answer)
    {agent, key}
  end)
end

# The gateway measured: this VM's, or (for a fair before/after, each in a VM of its
# own) the one named by --candidate.
{gateway, keys} =
  case opts[:candidate] do
    nil -> {ObservatoryWeb.Endpoint.url(), local_keys}
    url -> {url, remote_keys.(url, opts[:token])}
  end

baseline_keys = if baseline, do: remote_keys.(baseline, opts[:token])

headers = fn agent, keys ->
  [
    {"content-type", "application/json"},
    {"authorization", "Bearer " <> keys[agent]},
    {"anthropic-version", "2023-06-01"}
  ]
end

# One request: {microseconds to the first byte, microseconds to the last}.
measure = fn url, hdrs, body ->
  t0 = System.monotonic_time(:microsecond)
  {:ok, conn} = HTTPClient.request(url, hdrs, body)
  {:ok, 200, _, conn} = HTTPClient.read_head(conn)
  {:data, _, conn} = HTTPClient.read(conn)
  first = System.monotonic_time(:microsecond)
  {:ok, _, conn} = HTTPClient.read_all(conn)
  last = System.monotonic_time(:microsecond)
  HTTPClient.close(conn)
  {first - t0, last - t0}
end

# A session per request (the task names it): the same call in one session would be
# blocked by the step detector after five repeats.
tool_turn = fn k ->
  [
    %{role: "user", content: "Fix build #{k}."},
    %{
      role: "assistant",
      tool_calls: [
        %{
          id: "call_#{k}",
          type: "function",
          function: %{name: "read_file", arguments: ~s({"path":"build.log"})}
        }
      ]
    },
    %{role: "tool", tool_call_id: "call_#{k}", content: "error: no such file"}
  ]
end

# A long conversation: 900 KiB of earlier tool results (under the 1 MiB cap of older
# releases, so that both gateways take it).
long_history =
  for k <- 1..30 do
    %{role: "user", content: "Log #{k}:\n" <> String.duplicate("ok: step passed\n", 1_900)}
  end

scenarios = [
  {"chat completion", "/v1/chat/completions", "/v1/chat/completions", "bench-plain",
   fn k -> %{model: "m", messages: [%{role: "user", content: "Attempt #{k}"}]} end},
  {"chat completion, 900 KiB conversation", "/v1/chat/completions", "/v1/chat/completions",
   "bench-plain",
   fn k -> %{model: "m", messages: long_history ++ [%{role: "user", content: "Attempt #{k}"}]} end},
  {"Responses API", "/v1/responses", "/v1/responses", "bench-plain",
   fn k -> %{model: "m", input: "Attempt #{k}"} end},
  {"+ kill switch on, tool turn (a step ingested)", "/v1/chat/completions",
   "/v1/chat/completions", "bench-watched", fn k -> %{model: "m", messages: tool_turn.(k)} end},
  {"streamed, 20 events", "/v1/chat/completions", "/v1/chat/completions", "bench-plain",
   fn k -> %{model: "m", stream: true, messages: [%{role: "user", content: "Attempt #{k}"}]} end},
  {"Anthropic message", "/v1/messages", "/v1/messages", "bench-plain",
   fn k -> %{model: "m", max_tokens: 10, messages: [%{role: "user", content: "Attempt #{k}"}]} end}
]

percentile = fn sorted, p ->
  Enum.at(sorted, min(length(sorted) - 1, trunc(length(sorted) * p)))
end

IO.puts(
  "#{n} requests per path and scenario, one at a time; schedulers: #{System.schedulers_online()}" <>
    if(baseline, do: "; baseline gateway #{baseline}", else: "") <> "\n"
)

IO.puts(
  "| scenario | direct TTFB p50 / p99 | proxy TTFB p50 / p99 | direct total p50 / p99 | proxy total p50 / p99 | added p50 (TTFB / total) |" <>
    if(baseline,
      do: " baseline proxy total p50 / p99 | added by the baseline p50 (total) |",
      else: ""
    )
)

IO.puts("|---|---:|---:|---:|---:|---:|" <> if(baseline, do: "---:|---:|", else: ""))

for {name, direct_path, proxy_path, agent, body_fun} <- scenarios do
  # The baseline takes what it knew: no Responses API before this release.
  against_baseline? = baseline != nil and proxy_path != "/v1/responses"

  # Warm-up, then direct and proxied requests interleaved, so that all see the same load.
  for k <- 1..20 do
    body = JSON.encode!(body_fun.(-k))
    measure.(gateway <> proxy_path, headers.(agent, keys), body)

    if against_baseline?,
      do: measure.(baseline <> proxy_path, headers.(agent, baseline_keys), body)
  end

  samples =
    for k <- 1..n do
      body = JSON.encode!(body_fun.(k))

      {measure.(stub_url <> direct_path, headers.(agent, keys), body),
       measure.(gateway <> proxy_path, headers.(agent, keys), body),
       if(against_baseline?,
         do: measure.(baseline <> proxy_path, headers.(agent, baseline_keys), body)
       )}
    end

  stats = fn pick ->
    sorted = samples |> Enum.map(pick) |> Enum.sort()
    {percentile.(sorted, 0.5), percentile.(sorted, 0.99)}
  end

  {dt50, dt99} = stats.(fn {{t, _}, _, _} -> t end)
  {pt50, pt99} = stats.(fn {_, {t, _}, _} -> t end)
  {dl50, dl99} = stats.(fn {{_, l}, _, _} -> l end)
  {pl50, pl99} = stats.(fn {_, {_, l}, _} -> l end)
  us = fn v -> "#{v} µs" end

  baseline_columns =
    cond do
      against_baseline? ->
        {bl50, bl99} = stats.(fn {_, _, {_, l}} -> l end)
        " #{us.(bl50)} / #{us.(bl99)} | +#{bl50 - dl50} µs |"

      baseline ->
        " – | – |"

      true ->
        ""
    end

  IO.puts(
    "| #{name} | #{us.(dt50)} / #{us.(dt99)} | #{us.(pt50)} / #{us.(pt99)} | #{us.(dl50)} / #{us.(dl99)} | " <>
      "#{us.(pl50)} / #{us.(pl99)} | +#{pt50 - dt50} / +#{pl50 - dl50} µs |" <> baseline_columns
  )
end
