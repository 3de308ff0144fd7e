# Ingest throughput: a DecisionLog JSON validated, scored and broadcast.
#
#   MIX_ENV=prod mix run bench/ingest.exs             # in-process + HTTP (needs wrk)
#   MIX_ENV=prod mix run bench/ingest.exs -- --quick
#
# In-process: SchemaInterceptor.ingest/1 on JSON text, 1 and 2 callers, 1k sessions.
# HTTP: wrk POSTing envelopes to /api/v1/decision_logs against the same server's
# /healthz as the baseline (the cost of HTTP alone), reported as a ratio.
alias Observatory.Gateway.SchemaInterceptor

Logger.configure(level: :error)
quick? = "--quick" in System.argv()
per_caller = if quick?, do: 50_000, else: 300_000
wrk_seconds = if quick?, do: 3, else: 10

intents = ~w(search plan execute summarize)
tools = ~w(read_file write_file list_files run_shell grep http_get sql edit)
statuses = ~w(success failure pending)

messages =
  for i <- 0..9_999 do
    Observatory.JSON.encode!(%{
      "meta" => %{
        "step_id" => "step-#{i}",
        "session_id" => "sess-#{rem(i, 1000)}",
        "agent_id" => "agent-#{rem(i, 50)}",
        "parent_step_id" => "step-#{i - 1}",
        "timestamp" => "2026-02-22T10:30:00.123Z"
      },
      "cognition" => %{
        "intent" => Enum.at(intents, rem(i, 4)),
        "reasoning_chain" => ["read the task", "pick a tool"],
        "confidence" => 0.8,
        "entropy_score" => 0.9
      },
      "action" => %{
        "tool_call" => Enum.at(tools, rem(div(i, 4), 8)),
        "tool_input" => %{"path" => "/srv/app/file-#{rem(i, 37)}.ex", "limit" => 200},
        "status" => Enum.at(statuses, rem(i, 3)),
        "result" => %{"bytes" => 1024 + i}
      }
    })
  end
  |> List.to_tuple()

IO.puts(
  "message size: ~#{byte_size(elem(messages, 0))} bytes; schedulers: #{System.schedulers_online()}\n"
)

run = fn callers ->
  parent = self()

  {micros, _} =
    :timer.tc(fn ->
      pids =
        for c <- 1..callers do
          spawn_link(fn ->
            for n <- 1..per_caller do
              {:ok, _} = SchemaInterceptor.ingest(elem(messages, rem(n * 7 + c, 10_000)))
            end

            send(parent, {:done, self()})
          end)
        end

      for pid <- pids, do: receive(do: ({:done, ^pid} -> :ok))
    end)

  callers * per_caller / (micros / 1_000_000)
end

IO.puts("| in-process callers | messages/s |")
IO.puts("|---:|---:|")
for callers <- [1, 2], do: IO.puts("| #{callers} | #{round(run.(callers))} |")

if System.find_executable("wrk") do
  # Agent "a"'s own key: a key acts only as its agent (issue 13).
  {:ok, %{key: bench_key}} = Observatory.AgentKeys.issue("a")
  url = ObservatoryWeb.Endpoint.url()
  script = Path.join(System.tmp_dir!(), "observatory_wrk.lua")

  File.write!(script, """
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer #{bench_key}"
  local n = 0
  request = function()
    n = n + 1
    local body = string.format('{"meta":{"step_id":"w%d","session_id":"wsess-%d","agent_id":"a","timestamp":"2026-02-22T10:30:00Z"},"cognition":{"intent":"search","entropy_score":0.9},"action":{"tool_call":"read_file","tool_input":{"path":"/x"},"status":"success"}}', n, n % 1000)
    return wrk.format(nil, "/api/v1/decision_logs", nil, body)
  end
  """)

  wrk = fn args ->
    {out, 0} = System.cmd("wrk", ["-t2", "-c32", "-d#{wrk_seconds}s" | args])
    [_, rps] = Regex.run(~r/Requests\/sec:\s+([\d.]+)/, out)
    [_, non2xx] = Regex.run(~r/Non-2xx or 3xx responses: (\d+)/, out) || [nil, "0"]
    {String.to_float(rps), String.to_integer(non2xx)}
  end

  {health, _} = wrk.([url <> "/healthz"])
  {ingest, errors} = wrk.(["-s", script, url])

  IO.puts("\nHTTP (wrk -t2 -c32 -d#{wrk_seconds}s, wrk and the server share the machine)")
  IO.puts("| endpoint | requests/s |")
  IO.puts("|---|---:|")
  IO.puts("| GET /healthz (baseline) | #{round(health)} |")

  IO.puts(
    "| POST /api/v1/decision_logs | #{round(ingest)} (#{Float.round(ingest / health * 100, 1)}% of baseline, #{errors} non-2xx) |"
  )
else
  IO.puts("\nwrk not found: install it (bin/setup does) for the HTTP figures")
end
