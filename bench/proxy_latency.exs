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
# Anthropic message.
alias Observatory.{AgentKeys, JSON, KillSwitch}
alias Observatory.Proxy.HTTPClient

Logger.configure(level: :error)
quick? = "--quick" in System.argv()
n = if quick?, do: 200, else: 2_000

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

# The stub upstream: MochiWeb on loopback, answering at once.
stub = fn req ->
  body = :mochiweb_request.recv_body(req) |> IO.iodata_to_binary()

  cond do
    body =~ ~s("stream":true) ->
      resp =
        :mochiweb_request.respond({200, [{"Content-Type", "text/event-stream"}], :chunked}, req)

      for e <- events, do: :mochiweb_response.write_chunk(e, resp)
      :mochiweb_response.write_chunk("", resp)

    body =~ ~s("max_tokens") ->
      :mochiweb_request.respond({200, [{"Content-Type", "application/json"}], message}, req)

    true ->
      :mochiweb_request.respond({200, [{"Content-Type", "application/json"}], completion}, req)
  end
end

{:ok, stub_pid} =
  :mochiweb_http.start_link(name: :bench_upstream, ip: {127, 0, 0, 1}, port: 0, loop: stub)

stub_url = "http://127.0.0.1:#{:mochiweb_socket_server.get(stub_pid, :port)}"

Application.put_env(:observatory, :llm_upstream, stub_url <> "/v1")
Application.put_env(:observatory, :anthropic_upstream, stub_url)
gateway = ObservatoryWeb.Endpoint.url()
{:ok, _} = KillSwitch.configure("bench-watched", %{"enabled" => true, "threshold" => 1_000})

# Each agent's own key (it names the agent); a data dir reused across runs rotates it.
keys =
  Map.new(["bench-plain", "bench-watched"], fn agent ->
    {:ok, %{key: key}} =
      with {:error, :too_many_keys} <- AgentKeys.issue(agent, operator: "bench"),
           do: AgentKeys.rotate(agent, operator: "bench")

    {agent, key}
  end)

headers = fn agent ->
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

tool_turn = fn k ->
  [
    %{role: "user", content: "Fix the build."},
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

scenarios = [
  {"chat completion", "/v1/chat/completions", "/v1/chat/completions", "bench-plain",
   fn k -> %{model: "m", messages: [%{role: "user", content: "Attempt #{k}"}]} end},
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
  "#{n} requests per path and scenario, one at a time; schedulers: #{System.schedulers_online()}\n"
)

IO.puts(
  "| scenario | direct TTFB p50 / p99 | proxy TTFB p50 / p99 | direct total p50 / p99 | proxy total p50 / p99 | added p50 (TTFB / total) |"
)

IO.puts("|---|---:|---:|---:|---:|---:|")

for {name, direct_path, proxy_path, agent, body_fun} <- scenarios do
  # Warm-up, then direct and proxied requests interleaved, so that both see the same load.
  for k <- 1..20,
      do: measure.(gateway <> proxy_path, headers.(agent), JSON.encode!(body_fun.(-k)))

  samples =
    for k <- 1..n do
      body = JSON.encode!(body_fun.(k))

      upstream_path =
        if direct_path == "/v1/messages", do: "/v1/messages", else: "/v1/chat/completions"

      {measure.(stub_url <> upstream_path, headers.(agent), body),
       measure.(gateway <> proxy_path, headers.(agent), body)}
    end

  stats = fn pick ->
    sorted = samples |> Enum.map(pick) |> Enum.sort()
    {percentile.(sorted, 0.5), percentile.(sorted, 0.99)}
  end

  {dt50, dt99} = stats.(fn {{t, _}, _} -> t end)
  {pt50, pt99} = stats.(fn {_, {t, _}} -> t end)
  {dl50, dl99} = stats.(fn {{_, l}, _} -> l end)
  {pl50, pl99} = stats.(fn {_, {_, l}} -> l end)
  us = fn v -> "#{v} µs" end

  IO.puts(
    "| #{name} | #{us.(dt50)} / #{us.(dt99)} | #{us.(pt50)} / #{us.(pt99)} | #{us.(dl50)} / #{us.(dl99)} | " <>
      "#{us.(pl50)} / #{us.(pl99)} | +#{pt50 - dt50} / +#{pl50 - dl50} µs |"
  )
end
