# Ingest throughput: a DecisionLog JSON validated, scored and broadcast.
#
#   MIX_ENV=prod mix run bench/ingest.exs             # in-process + HTTP (needs wrk)
#   MIX_ENV=prod mix run bench/ingest.exs -- --quick
#   MIX_ENV=prod mix run bench/ingest.exs -- --http   # HTTP only
#
# In-process: SchemaInterceptor.ingest/1 on JSON text, 1 and 2 callers, 1k sessions,
# every step a new one (its own step_id), with the idempotency check and without it
# (`enabled: false`), in alternating rounds of the same run (the median of each): the
# check's cost per step is the difference, and their ratio. Then steps sent twice:
# the second time each is a retry, answered from memory (a replay).
# HTTP: wrk POSTing ~600-byte envelopes (a file read and a few lines of its content)
# to /api/v1/decision_logs against the same server's cheapest routes, in alternating
# rounds (3; medians): GET /assets/dashboard.css (a 3.6 KiB stylesheet sent from
# memory) and a 404 (the router's answer to an unknown path). The faster of the two
# is the baseline: the cost of HTTP alone. (/healthz checks Mnesia and the stores:
# not the cheapest.) Beside them, the same body POSTed to the 404: what a request
# body costs the server when no handler reads it. Each route also gets the server's
# CPU time per request (the VM's, over the run), which other programs on the
# machine do not move as much as they move the rates. The ingest is sent twice: every
# session looping (each step the same call: the entropy window says LOOP and an alert
# is raised on every step), and a fleet at work (the in-process breakdown's steps:
# intent, tool and status vary, no loop).
alias Observatory.Gateway.{Idempotency, SchemaInterceptor}

Logger.configure(level: :error)
quick? = "--quick" in System.argv()
http_only? = "--http" in System.argv()
# Rounds with the check and without it, alternately; steps per caller in each.
{rounds, per_caller} = if quick?, do: {3, 20_000}, else: {7, 50_000}
wrk_seconds = if quick?, do: 3, else: 10
http_rounds = 3

intents = ~w(search plan execute summarize)
tools = ~w(read_file write_file list_files run_shell grep http_get sql edit)
statuses = ~w(success failure pending)

# Each message is a template around its step_id: every ingest is a new step.
templates =
  for i <- 0..9_999 do
    Observatory.JSON.encode!(%{
      "meta" => %{
        "step_id" => "@STEP@",
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
    |> String.split("@STEP@")
    |> List.to_tuple()
  end
  |> List.to_tuple()

# Off the callers' heaps (a persistent term is read in place): a caller carrying 10 000
# templates would copy them at every garbage collection, and make whatever adds garbage
# look dearer than it is.
:persistent_term.put({:bench_ingest, :templates}, templates)
{pre, post} = elem(templates, 0)

load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg 2>/dev/null") |> to_string() |> String.trim()

IO.puts(
  "message size: ~#{byte_size(pre <> "r1-1-1" <> post)} bytes; schedulers: #{System.schedulers_online()}; " <>
    "1-min load average at the start: #{load}\n"
)

# `callers` processes each ingest `count` steps, step ids tagged with `run`.
# Returns {messages per second, CPU µs a step}: the VM's CPU time does not count the
# time other programs on the machine take, which the wall clock does.
run = fn callers, run, count ->
  parent = self()
  :erlang.statistics(:runtime)

  {micros, _} =
    :timer.tc(fn ->
      pids =
        for c <- 1..callers do
          spawn_link(fn ->
            tag = run <> "-" <> Integer.to_string(c) <> "-"
            templates = :persistent_term.get({:bench_ingest, :templates})

            for n <- 1..count do
              {pre, post} = elem(templates, rem(n * 7 + c, 10_000))
              {:ok, _} = SchemaInterceptor.ingest(pre <> tag <> Integer.to_string(n) <> post)
            end

            send(parent, {:done, self()})
          end)
        end

      for pid <- pids, do: receive(do: ({:done, ^pid} -> :ok))
    end)

  {_, cpu_ms} = :erlang.statistics(:runtime)
  {callers * count / (micros / 1_000_000), cpu_ms * 1000 / (callers * count)}
end

check = fn on? ->
  configured = Application.get_env(:observatory, :idempotency, [])
  Application.put_env(:observatory, :idempotency, Keyword.put(configured, :enabled, on?))
end

r = fn x -> :erlang.float_to_binary(x / 1, decimals: 2) end

unless http_only? do
  # The check's memory full first (100 000 steps, the default cap): every measured step
  # with the check then also evicts the oldest, as on a busy gateway.
  check.(true)
  run.(1, "warm", 110_000)

  IO.puts("""
  | in-process callers | without the check | with the check | the check a step (CPU) | ratio (CPU) | ratio (wall) | a retry (replayed) |
  |---:|---:|---:|---:|---:|---:|---:|\
  """)

  median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end

  for callers <- [1, 2] do
    # Alternately, so that the machine's other work slows both alike; the median of each.
    runs =
      for round <- 1..rounds, on? <- [true, false] do
        check.(on?)
        {on?, run.(callers, "c#{callers}-#{on?}-#{round}", per_caller)}
      end

    figures = fn on? ->
      mine = for {^on?, figures} <- runs, do: figures
      {median.(Enum.map(mine, &elem(&1, 0))), median.(Enum.map(mine, &elem(&1, 1)))}
    end

    {{with, with_cpu}, {without, without_cpu}} = {figures.(true), figures.(false)}

    # Steps sent twice: the second time every one is answered from memory. (Fewer of
    # them: all must fit under the default cap, 100 000 remembered.)
    check.(true)
    run.(callers, "r#{callers}", 20_000)
    {replayed, replayed_cpu} = run.(callers, "r#{callers}", 20_000)

    IO.puts(
      "| #{callers} | #{round(without)} msg/s, #{r.(without_cpu)} µs CPU " <>
        "| #{round(with)} msg/s, #{r.(with_cpu)} µs CPU " <>
        "| #{r.(with_cpu - without_cpu)} µs " <>
        "| #{r.(with_cpu / without_cpu)} | #{r.(without / with)} " <>
        "| #{round(replayed)} msg/s, #{r.(replayed_cpu)} µs CPU |"
    )
  end

  IO.puts(
    "\nremembered at the end: #{inspect(Idempotency.stats())} (#{inspect(Idempotency.settings())})\n"
  )
end

if System.find_executable("wrk") do
  # Agent "a"'s own key: a key acts only as its agent (issue 13).
  # The keys of earlier runs on the same data directory first: an agent holds 10 at most.
  Observatory.AgentKeys.revoke_all("a")
  {:ok, %{key: bench_key}} = Observatory.AgentKeys.issue("a")
  url = ObservatoryWeb.Endpoint.url()
  # Every run the same client work (wrk's Lua builds the ~600-byte body each time); the
  # baselines build it and send a GET without it, so only the server's work differs.
  # `fleet?`: each session's steps vary their intent, tool and status as a working
  # agent's do (the in-process breakdown's workload: no loop, no alert); otherwise
  # every step of a session is the same call (the entropy window says LOOP and an
  # alert is raised on every step).
  lua = fn path, send_body?, fleet? ->
    script =
      Path.join(
        System.tmp_dir!(),
        "observatory_wrk_#{:erlang.phash2({path, send_body?, fleet?})}.lua"
      )

    File.write!(script, """
    wrk.headers["Content-Type"] = "application/json"
    wrk.headers["Authorization"] = "Bearer #{bench_key}"
    -- Each run and thread its own step ids: a step id sent again would be answered as
    -- a replay (or refused, under another body). Runs are seconds apart.
    local threads, n, run = 0, 0, tostring(os.time())
    setup = function(thread)
      threads = threads + 1
      thread:set("id", run .. "-" .. tostring(threads))
    end
    local intents = {"search", "plan", "execute", "summarize"}
    local tools = {"read_file", "write_file", "list_files", "run_shell", "grep", "http_get", "sql", "edit"}
    request = function()
      n = n + 1
      local s, k = n % 1000, math.floor(n / 1000)
      local intent, tool, status = "execute", "read_file", "success"
      if #{fleet?} then
        intent = intents[(k + s) % 4 + 1]
        tool = tools[(k * 3 + s) % 8 + 1]
        if k % 5 == 4 then status = "failure" end
      end
      local body = string.format('{"meta":{"step_id":"w%s-%d","session_id":"#{if fleet?, do: "fsess", else: "wsess"}-%d","agent_id":"a","parent_step_id":"w%s-%d","timestamp":"2026-02-22T10:30:00.123Z"},"cognition":{"intent":"%s","reasoning_chain":["read the failing test","open the module it names"],"confidence":0.8,"entropy_score":0.9},"action":{"tool_call":"%s","tool_input":{"path":"/srv/app/lib/app/file_%d.ex","limit":200},"status":"%s","result":{"content":"# step %d\\\\n  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\\\\n  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\\\\n  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\\\\n","lines":4}}}', id or "0", n, s, id or "0", n - 1, intent, tool, n % 37, status, n)
      if #{send_body?} then
        return wrk.format("POST", "#{path}", nil, body)
      else
        return wrk.format("GET", "#{path}")
      end
    end
    """)

    script
  end

  # Requests per second, and the server's CPU time per request: the VM's whole CPU
  # time over the run (its schedulers, and anything a request sets off in other
  # processes) divided by the requests answered. wrk's own work is not in it.
  wrk = fn script ->
    :erlang.statistics(:runtime)
    {out, 0} = System.cmd("wrk", ["-t2", "-c32", "-d#{wrk_seconds}s", "-s", script, url])
    {_, cpu_ms} = :erlang.statistics(:runtime)
    [_, total] = Regex.run(~r/(\d+) requests in/, out)
    [_, rps] = Regex.run(~r/Requests\/sec:\s+([\d.]+)/, out)
    [_, non2xx] = Regex.run(~r/Non-2xx or 3xx responses: (\d+)/, out) || [nil, "0"]

    {String.to_float(rps), cpu_ms * 1000 / max(String.to_integer(total), 1),
     String.to_integer(non2xx)}
  end

  # The cheapest routes (the baselines), a body sent to the 404 (what reading past a
  # body costs, no handler), and the ingest. In alternating rounds, so that the
  # machine's other work slows each alike; each round's ingest is a share of that
  # round's faster baseline, and the table gives the medians.
  routes = [
    {"GET /assets/dashboard.css (a stylesheet from memory)",
     lua.("/assets/dashboard.css", false, false)},
    {"GET /no-such-page (the router's 404)", lua.("/no-such-page", false, false)},
    {"POST /no-such-page, the ~600-byte step as its body (404)",
     lua.("/no-such-page", true, false)},
    {"POST /api/v1/decision_logs, ~600-byte step, every session looping (an alert a step)",
     lua.("/api/v1/decision_logs", true, false)},
    {"POST /api/v1/decision_logs, ~600-byte step, a fleet at work (no loop)",
     lua.("/api/v1/decision_logs", true, true)}
  ]

  rounds =
    for _round <- 1..http_rounds do
      results = for {name, script} <- routes, do: {name, wrk.(script)}
      [{_, {asset, _, _}}, {_, {not_found, _, _}} | _] = results
      {results, max(asset, not_found)}
    end

  median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end

  IO.puts(
    "\nHTTP (wrk -t2 -c32 -d#{wrk_seconds}s, #{http_rounds} alternating rounds, medians; " <>
      "wrk and the server share the machine)"
  )

  IO.puts("| route | requests/s | share of the faster baseline | server CPU a request |")
  IO.puts("|---|---:|---:|---:|")

  for {{name, _script}, i} <- Enum.with_index(routes) do
    per_round = for {results, baseline} <- rounds, do: {elem(Enum.at(results, i), 1), baseline}
    rps = median.(for {{rps, _, _}, _} <- per_round, do: rps)
    share = median.(for {{rps, _, _}, baseline} <- per_round, do: rps / baseline * 100)
    cpu = median.(for {{_, cpu, _}, _} <- per_round, do: cpu)
    non2xx = Enum.sum(for {{_, _, n}, _} <- per_round, do: n)
    # The 404s answer 404 by design; any other route's non-2xx answer is a failure.
    failed = if String.contains?(name, "404"), do: "", else: " (#{non2xx} non-2xx)"
    IO.puts("| #{name} | #{round(rps)}#{failed} | #{Float.round(share, 1)} % | #{r.(cpu)} µs |")
  end
else
  IO.puts("\nwrk not found: install it (bin/setup does) for the HTTP figures")
end
