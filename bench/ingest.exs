# Ingest throughput: a DecisionLog JSON validated, scored and broadcast.
#
#   MIX_ENV=prod mix run bench/ingest.exs             # in-process + HTTP (needs wrk)
#   MIX_ENV=prod mix run bench/ingest.exs -- --quick
#   MIX_ENV=prod mix run bench/ingest.exs -- --http   # HTTP only
#   MIX_ENV=prod mix run bench/ingest.exs -- --http --quick --accounting
#     # and, per route, the schedulers' time by state and the reductions by process
#   ELIXIR_ERL_OPTIONS="+S 1" taskset -c 0 mix run bench/ingest.exs -- --http --wrk-cpu 1
#     # the server on one core, wrk (one thread) on the other
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
# Where the ingest route's time goes, from the same run: the route also sent steps it
# has already answered (every one a retry: the full HTTP handling, the key check, the
# parse and the idempotency answer, no scoring), and the same VM ingests the fleet's
# steps in-process (new ones, then again as retries), as the handler calls it. From
# these it estimates how much server CPU one µs of in-process ingest costs when it is
# served over HTTP, and the route's share of the baseline's rate if the ingest cost
# X µs (the model is printed with its figures).
alias Observatory.Gateway.{Idempotency, SchemaInterceptor}

Logger.configure(level: :error)
quick? = "--quick" in System.argv()
# Where each route's server time goes: the schedulers' time by state (`:msacc`) and the
# reductions of the connection processes against every other process's.
accounting? = "--accounting" in System.argv()
# `--wrk-cpu N`: wrk runs on CPU N alone (`taskset`), one thread; start the server on
# the other CPU to keep the two apart.
wrk_cpu =
  case Enum.drop_while(System.argv(), &(&1 != "--wrk-cpu")) do
    ["--wrk-cpu", cpu | _] -> String.to_integer(cpu)
    _ -> nil
  end

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
  Observatory.configure(idempotency: Keyword.put(configured, :enabled, on?))
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
  # `steps`: `:loop`, every step of a session the same call (the entropy window says
  # LOOP and an alert is raised on every step); `:fleet`, each session's steps vary
  # their intent, tool and status as a working agent's do (the in-process breakdown's
  # workload: no loop, no alert); `:retry`, the fleet's steps 1..1000 of run `retry_run`
  # over and over (once sent, every one is answered from memory). `fleet_step/3` below
  # writes the same text in Elixir (the in-process figures): keep the two alike.
  retry_run = "retry#{System.unique_integer([:positive])}"
  # `:batch`: the fleet's steps, this many a request as NDJSON (one envelope a line).
  batch_steps = 20

  lua = fn path, send_body?, steps ->
    script =
      Path.join(
        System.tmp_dir!(),
        "observatory_wrk_#{:erlang.phash2({path, send_body?, steps, retry_run})}.lua"
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
    local fleet, retry, batch = #{steps != :loop}, #{steps == :retry}, #{steps == :batch}
    local step = function()
      n = n + 1
      local m, tag = n, "w" .. (id or "0")
      if retry then m, tag = n % 1000 + 1, "#{retry_run}" end
      local s, k = m % 1000, math.floor(m / 1000)
      local intent, tool, status = "execute", "read_file", "success"
      if fleet then
        intent = intents[(k + s) % 4 + 1]
        tool = tools[(k * 3 + s) % 8 + 1]
        if k % 5 == 4 then status = "failure" end
      end
      return string.format('{"meta":{"step_id":"%s-%d","session_id":"#{if steps == :loop, do: "wsess", else: "fsess"}-%d","agent_id":"a","parent_step_id":"%s-%d","timestamp":"2026-02-22T10:30:00.123Z"},"cognition":{"intent":"%s","reasoning_chain":["read the failing test","open the module it names"],"confidence":0.8,"entropy_score":0.9},"action":{"tool_call":"%s","tool_input":{"path":"/srv/app/lib/app/file_%d.ex","limit":200},"status":"%s","result":{"content":"# step %d\\\\n  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\\\\n  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\\\\n  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\\\\n","lines":4}}}', tag, m, s, tag, m - 1, intent, tool, m % 37, status, m)
    end
    -- A batch: #{batch_steps} steps, one envelope a line (its own Content-Type; a
    -- request's own headers replace wrk.headers, so the key goes again).
    local ndjson = {["Content-Type"] = "application/x-ndjson", ["Authorization"] = "Bearer #{bench_key}"}
    request = function()
      if batch then
        local lines = {}
        for i = 1, #{batch_steps} do lines[i] = step() end
        return wrk.format("POST", "#{path}", ndjson, table.concat(lines, "\\n"))
      end
      local body = step()
      if #{send_body?} then
        return wrk.format("POST", "#{path}", nil, body)
      else
        return wrk.format("GET", "#{path}")
      end
    end
    """)

    script
  end

  # The fleet's step `m` under step-id tag `tag`, as the Lua above writes it.
  fleet_step = fn tag, m ->
    s = rem(m, 1000)
    k = div(m, 1000)
    intent = Enum.at(~w(search plan execute summarize), rem(k + s, 4))

    tool =
      Enum.at(
        ~w(read_file write_file list_files run_shell grep http_get sql edit),
        rem(k * 3 + s, 8)
      )

    status = if rem(k, 5) == 4, do: "failure", else: "success"

    line =
      ~S"  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\n"

    ~s|{"meta":{"step_id":"#{tag}-#{m}","session_id":"fsess-#{s}","agent_id":"a","parent_step_id":"#{tag}-#{m - 1}","timestamp":"2026-02-22T10:30:00.123Z"},"cognition":{"intent":"#{intent}","reasoning_chain":["read the failing test","open the module it names"],"confidence":0.8,"entropy_score":0.9},"action":{"tool_call":"#{tool}","tool_input":{"path":"/srv/app/lib/app/file_#{rem(m, 37)}.ex","limit":200},"status":"#{status}","result":{"content":"# step #{m}\\n#{line}#{line}#{line}","lines":4}}}|
  end

  # CPU time in µs, user + system, of this VM (the server) from /proc: the VM's own
  # `:erlang.statistics(:runtime)` counts user time only, and a server's socket work
  # is system time. (Without /proc: the user time alone.)
  clock_ticks =
    case System.cmd("getconf", ["CLK_TCK"], stderr_to_stdout: true) do
      {ticks, 0} -> String.to_integer(String.trim(ticks))
      _ -> 100
    end

  vm_cpu = fn ->
    case File.read("/proc/self/stat") do
      {:ok, stat} ->
        [_, fields] = String.split(stat, ") ", parts: 2)
        [utime, stime] = fields |> String.split() |> Enum.slice(11, 2)
        (String.to_integer(utime) + String.to_integer(stime)) * 1_000_000 / clock_ticks

      _ ->
        {runtime_ms, _} = :erlang.statistics(:runtime)
        runtime_ms * 1000
    end
  end

  # Requests per second, the server's CPU time per request (the VM's, user + system,
  # over the run: its schedulers, its socket work and anything a request sets off in
  # other processes, divided by the requests answered) and wrk's (bash's `time`).
  # `--accounting`: the schedulers' threads' time by state over the run (microstate
  # accounting: wall time, so a thread the OS took off its core is counted too), and
  # the reductions of the VM's processes. MochiWeb's acceptors become the connections'
  # processes, and a connection's process may exit before the run's end: so the
  # connections' reductions are the VM's total less every other process's.
  reductions = fn ->
    for pid <- Process.list(),
        info = Process.info(pid, [:reductions, :registered_name, :dictionary, :initial_call]),
        info != nil,
        into: %{} do
      name =
        case info[:registered_name] do
          [] -> info[:dictionary][:"$initial_call"] || info[:initial_call]
          registered -> registered
        end

      {pid, {name, info[:reductions]}}
    end
  end

  accounting_start = fn ->
    :msacc.start()
    :msacc.reset()
    {total, _} = :erlang.statistics(:reductions)
    {reductions.(), total}
  end

  accounting_stop = fn {before, total_before}, requests ->
    {total, _} = :erlang.statistics(:reductions)
    after_run = reductions.()
    states = :msacc.stats() |> Enum.filter(&(&1.type == :scheduler))
    :msacc.stop()

    per_state =
      for state <- [:emulator, :gc, :port, :check_io, :other, :aux, :sleep], into: %{} do
        {state, Enum.sum(for thread <- states, do: thread.counters[state]) / requests}
      end

    connection? = fn name -> match?({:mochiweb_acceptor, _, _}, name) end

    others =
      for {pid, {name, now}} <- after_run,
          not connection?.(name),
          {_, was} = Map.get(before, pid, {name, 0}),
          now > was do
        {name, now - was}
      end
      |> Enum.group_by(&elem(&1, 0), &elem(&1, 1))
      |> Enum.map(fn {name, deltas} -> {name, Enum.sum(deltas) / requests} end)
      |> Enum.sort_by(&(-elem(&1, 1)))

    others_total = Enum.sum(for {_, n} <- others, do: n)

    %{
      states: per_state,
      connections: (total - total_before) / requests - others_total,
      others: others_total,
      top: Enum.take(others, 3)
    }
  end

  wrk_command = if wrk_cpu, do: "taskset -c #{wrk_cpu} wrk -t1", else: "wrk -t2"

  wrk = fn script ->
    before = vm_cpu.()
    accounting = if accounting?, do: accounting_start.()

    {out, 0} =
      System.cmd(
        "bash",
        [
          "-c",
          ~s(TIMEFORMAT="wrk-cpu %U %S"; time #{wrk_command} -c32 -d#{wrk_seconds}s -s "$0" "$1"),
          script,
          url
        ],
        stderr_to_stdout: true
      )

    cpu = vm_cpu.() - before
    [_, total] = Regex.run(~r/(\d+) requests in/, out)
    [_, rps] = Regex.run(~r/Requests\/sec:\s+([\d.]+)/, out)
    [_, non2xx] = Regex.run(~r/Non-2xx or 3xx responses: (\d+)/, out) || [nil, "0"]
    [_, wrk_user, wrk_sys] = Regex.run(~r/wrk-cpu ([\d.]+) ([\d.]+)/, out)
    total = max(String.to_integer(total), 1)

    %{
      rps: String.to_float(rps),
      server: cpu / total,
      wrk: (String.to_float(wrk_user) + String.to_float(wrk_sys)) * 1_000_000 / total,
      non2xx: String.to_integer(non2xx),
      accounting: accounting && accounting_stop.(accounting, total)
    }
  end

  # The retry route's steps, ingested in-process (agent "a", as the handler calls it)
  # before each of its runs: then every one it sends is answered from memory, whatever
  # the other routes' steps evicted meanwhile. A text unlike wrk's would be refused
  # (409): the route's non-2xx count says so.
  prime_retries = fn ->
    for m <- 1..1000,
        do:
          {:ok, _} =
            SchemaInterceptor.ingest(fleet_step.(retry_run, m), agent: "a", envelope: false)
  end

  # CPU µs a step of `SchemaInterceptor.ingest/2` as the HTTP handler calls it, in one
  # process, over `steps` (the VM does nothing else meanwhile).
  in_process = fn steps ->
    task =
      Task.async(fn ->
        :erlang.statistics(:runtime)

        for step <- steps,
            do: {:ok, _} = SchemaInterceptor.ingest(step, agent: "a", envelope: false)

        {_, cpu_ms} = :erlang.statistics(:runtime)
        cpu_ms * 1000 / length(steps)
      end)

    Task.await(task, :infinity)
  end

  # The cheapest routes (the baselines), a body sent to the 404 (what reading past a
  # body costs, no handler), and the ingest. In alternating rounds, so that the
  # machine's other work slows each alike; each round's ingest is a share of that
  # round's faster baseline, and the table gives the medians.
  routes = [
    {"GET /assets/dashboard.css (a stylesheet from memory)",
     lua.("/assets/dashboard.css", false, :loop)},
    {"GET /no-such-page (the router's 404)", lua.("/no-such-page", false, :loop)},
    {"POST /no-such-page, the ~600-byte step as its body (404)",
     lua.("/no-such-page", true, :loop)},
    {"POST /api/v1/decision_logs, ~600-byte step, every session looping (an alert a step)",
     lua.("/api/v1/decision_logs", true, :loop)},
    {"POST /api/v1/decision_logs, ~600-byte step, a fleet at work (no loop)",
     lua.("/api/v1/decision_logs", true, :fleet)},
    {"POST /api/v1/decision_logs, the fleet's steps again (every one a retry, answered from memory)",
     lua.("/api/v1/decision_logs", true, :retry)},
    {"POST /api/v1/decision_logs, the fleet's steps #{batch_steps} a request (NDJSON)",
     lua.("/api/v1/decision_logs", true, :batch)}
  ]

  # The last three routes, by their place in the list.
  batch_route = length(routes) - 1
  retry_route = batch_route - 1
  fleet_route = retry_route - 1

  rounds =
    for round <- 1..http_rounds do
      results =
        for {{name, script}, i} <- Enum.with_index(routes) do
          if i == retry_route, do: prime_retries.()
          {name, wrk.(script)}
        end

      [{_, %{rps: asset}}, {_, %{rps: not_found}} | _] = results

      # The same VM ingests the fleet's kind of steps in-process: new ones, then the
      # same again (every one a retry).
      new_steps = for m <- 1..5_000, do: fleet_step.("p#{round}-#{retry_run}", m)
      new = in_process.(new_steps)
      replayed = in_process.(new_steps)
      {results, max(asset, not_found), {new, replayed}}
    end

  median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end

  IO.puts(
    "\nHTTP (#{wrk_command} -c32 -d#{wrk_seconds}s, #{http_rounds} alternating rounds, medians; " <>
      if(wrk_cpu,
        do: "wrk on CPU #{wrk_cpu} alone)",
        else: "wrk and the server share the machine)"
      )
  )

  IO.puts(
    "| route | requests/s | share of the faster baseline | server CPU a request | wrk's CPU a request |"
  )

  IO.puts("|---|---:|---:|---:|---:|")

  # Per route, the medians over the rounds: requests/s, share %, server and wrk CPU µs.
  figures =
    for {{name, _script}, i} <- Enum.with_index(routes) do
      per_round =
        for {results, baseline, _} <- rounds, do: {elem(Enum.at(results, i), 1), baseline}

      rps = median.(for {run, _} <- per_round, do: run.rps)
      share = median.(for {run, baseline} <- per_round, do: run.rps / baseline * 100)
      server = median.(for {run, _} <- per_round, do: run.server)
      wrk_cpu = median.(for {run, _} <- per_round, do: run.wrk)
      non2xx = Enum.sum(for {run, _} <- per_round, do: run.non2xx)
      # The 404s answer 404 by design; any other route's non-2xx answer is a failure.
      failed = if String.contains?(name, "404"), do: "", else: " (#{non2xx} non-2xx)"

      IO.puts(
        "| #{name} | #{round(rps)}#{failed} | #{Float.round(share, 1)} % | #{r.(server)} µs | #{r.(wrk_cpu)} µs |"
      )

      %{rps: rps, share: share, server: server, wrk: wrk_cpu}
    end

  batch = Enum.at(figures, batch_route)
  single = Enum.at(figures, fleet_route)

  IO.puts("""

  In batches of #{batch_steps} (NDJSON): #{round(batch.rps * batch_steps)} steps a second, \
  #{r.(batch.server / batch_steps)} µs of server CPU a step, against one step a request's \
  #{round(single.rps)} and #{r.(single.server)} µs.\
  """)

  if accounting? do
    IO.puts("""

    Where each route's server time goes (medians over the rounds, per request): the \
    schedulers' threads' time by state (µs, wall time: counts a thread the OS took off \
    its core), and the reductions of the connections' processes against every other \
    process's (the three most, by their registered name or initial call)
    | route | server CPU | emulator | gc | port | check_io | other, aux | connections' reductions | other processes' | the most |
    |---|---:|---:|---:|---:|---:|---:|---:|---:|---|\
    """)

    for {{name, _script}, i} <- Enum.with_index(routes) do
      runs = for {results, _, _} <- rounds, do: elem(Enum.at(results, i), 1)
      of = fn f -> median.(Enum.map(runs, f)) end
      state = fn key -> r.(of.(& &1.accounting.states[key])) end
      top = Enum.max_by(runs, & &1.accounting.others).accounting.top

      IO.puts(
        "| #{name} | #{r.(of.(& &1.server))} | #{state.(:emulator)} | #{state.(:gc)} " <>
          "| #{state.(:port)} | #{state.(:check_io)} " <>
          "| #{r.(of.(&(&1.accounting.states.other + &1.accounting.states.aux)))} " <>
          "| #{round(of.(& &1.accounting.connections))} | #{r.(of.(& &1.accounting.others))} " <>
          "| #{Enum.map_join(top, ", ", fn {who, n} -> "#{inspect(who)} #{r.(n)}" end)} |"
      )
    end
  end

  # What the ingest route's server CPU is made of, and what its share would be with a
  # cheaper ingest. The model, stated so that later runs can check it:
  #   - the machine spends S (the server's CPU) + C (wrk's) on a request, and a
  #     saturated machine's rate is inversely proportional to it: a route's share of
  #     the baseline is about (S_base + C_base) / (S_route + C_route) (printed beside
  #     the measured share, as a check);
  #   - the fleet route and the retry route differ only in what the ingest does, so
  #     k = (S_fleet − S_retry) / (X_new − X_replayed) is the server CPU that a µs of
  #     in-process ingest (X, measured in this VM in the same run) costs once served;
  #   - with an ingest of X µs in-process the route would cost
  #     S(X) = S_retry + k × (X − X_replayed), and its share would be about
  #     (S_base + C_base) / (S(X) + C_fleet).
  {new_x, replayed_x} =
    {median.(for {_, _, {new, _}} <- rounds, do: new),
     median.(for {_, _, {_, replayed}} <- rounds, do: replayed)}

  base =
    if Enum.at(figures, 0).rps >= Enum.at(figures, 1).rps,
      do: Enum.at(figures, 0),
      else: Enum.at(figures, 1)

  fleet = Enum.at(figures, fleet_route)
  retry = Enum.at(figures, retry_route)
  k = (fleet.server - retry.server) / max(new_x - replayed_x, 0.1)
  machine = fn route -> route.server + route.wrk end
  fixed = retry.server - k * replayed_x

  IO.puts("""

  In-process, in the same VM, one caller (the rounds' medians): a new fleet step costs \
  #{r.(new_x)} µs of CPU, the same step again (a retry) #{r.(replayed_x)} µs.
  Served: the fleet route #{r.(fleet.server)} µs of server CPU a request, the retry \
  route #{r.(retry.server)} µs, the baseline #{r.(base.server)} µs; wrk #{r.(fleet.wrk)}, \
  #{r.(retry.wrk)} and #{r.(base.wrk)} µs.
  So a µs of in-process ingest costs k = #{r.(k)} µs of server CPU once served \
  (#{r.(fleet.server - retry.server)} µs for #{r.(new_x - replayed_x)} µs), and the \
  route's own work (k × X taken off the retry route) is #{r.(fixed)} µs, the \
  baseline's #{r.(base.server)}.
  The model's share for the fleet route: #{Float.round(machine.(base) / machine.(fleet) * 100, 1)} % \
  (measured #{Float.round(fleet.share, 1)} %); for the retry route: \
  #{Float.round(machine.(base) / machine.(retry) * 100, 1)} % (measured \
  #{Float.round(retry.share, 1)} %).

  | the ingest of a new step in-process, CPU | the route's server CPU (model) | share of the baseline (model) |
  |---:|---:|---:|\
  """)

  for x <- Enum.uniq([Float.round(new_x, 1), 16.0, 12.0, 8.0, 4.0, 0.0]) do
    s_x = fixed + k * x
    today = if x == Float.round(new_x, 1), do: " (today)", else: ""

    IO.puts(
      "| #{r.(x)} µs#{today} | #{r.(s_x)} µs | " <>
        "#{Float.round(machine.(base) / (s_x + fleet.wrk) * 100, 1)} % |"
    )
  end
else
  IO.puts("\nwrk not found: install it (bin/setup does) for the HTTP figures")
end
