# The per-request work the LLM proxy added for keyed sessions and open-request
# enforcement, each call alone, 10,000 times after a warm-up, in this VM:
#
#   OBSERVATORY_PORT=0 OBSERVATORY_DATA_DIR=$(mktemp -d) MIX_ENV=prod mix run bench/proxy_request_work.exs
#
# The baseline, in the same run, is the session id of earlier releases: a SHA-256 of
# the agent id and the conversation's start, unkeyed and unnormalized.
alias Observatory.{AgentKeys, KillSwitch}
alias Observatory.Proxy.{OpenRequests, SessionId}

Logger.configure(level: :error)

{:ok, %{key: key}} =
  with {:error, :too_many_keys} <- AgentKeys.issue("bench-work"),
       do: AgentKeys.rotate("bench-work")

body = %{
  "model" => "m",
  "messages" => [
    %{"role" => "system", "content" => "You fix builds. Now: 2025-01-01T00:00:00Z, request 42."},
    %{"role" => "user", "content" => "Fix the build."}
  ]
}

hash = AgentKeys.hash(key)

headers = [
  {"content-type", "application/json"},
  {"x-request-id", "req_1"},
  {"date", "Wed, 01 Jan 2025 00:00:00 GMT"},
  {"openai-processing-ms", "12"},
  {"x-ratelimit-remaining-requests", "99"},
  {"connection", "close"}
]

measure = fn fun ->
  for _ <- 1..1_000, do: fun.()
  {us, _} = :timer.tc(fn -> for _ <- 1..10_000, do: fun.() end)
  us / 10_000
end

unkeyed = fn ->
  start = {nil, Enum.take(body["messages"], 2)}
  digest = :crypto.hash(:sha256, :erlang.term_to_binary({"bench-work", start}, [:deterministic]))
  "proxy-" <> Base.encode16(binary_part(digest, 0, 12), case: :lower)
end

baseline = measure.(unkeyed)

rows = [
  {"session id, unkeyed (earlier releases; the baseline)", baseline},
  {"session id, keyed and normalized", measure.(fn -> SessionId.derive("bench-work", body) end)},
  {"open request: register, check agent/key/session, unregister",
   measure.(fn ->
     entry = OpenRequests.register(%{agent_id: "bench-work", key_hash: hash, session_id: "s"})
     OpenRequests.check(entry)
     OpenRequests.unregister(entry)
   end)},
  {"the key's agent and hash again",
   measure.(fn ->
     ObservatoryWeb.Auth.agent_for_key(key)
     AgentKeys.hash(key)
   end)},
  {"step-detector block check",
   measure.(fn -> Observatory.Gateway.StepDetector.block("proxy-bench") end)},
  {"upstream headers filtered",
   measure.(fn -> ObservatoryWeb.API.LLMProxy.upstream_headers(headers) end)},
  {"request-bytes budget",
   measure.(fn -> KillSwitch.Upstream.with_request_bytes(100, fn -> :ok end) end)}
]

IO.puts("| work per request | µs | × the unkeyed session id |")
IO.puts("|---|---:|---:|")

for {name, us} <- rows,
    do: IO.puts("| #{name} | #{Float.round(us, 2)} | #{Float.round(us / baseline, 1)} |")
