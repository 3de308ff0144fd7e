# A step costs time linear in its size, whatever its shape, through the whole ingest
# path, and /healthz answers while large steps are being parsed.
#
#   export ERL_FLAGS="+sbwt none +sbwtdcpu none +sbwtdio none"   # see below
#   OBSERVATORY_PORT=0 MIX_ENV=prod mix run --no-start bench/linearity.exs            # 64 KiB vs 1 MiB
#   OBSERVATORY_PORT=0 MIX_ENV=prod mix run --no-start bench/linearity.exs -- --quick # 16 KiB vs 256 KiB
#   ... -- --quick --runs 1   # an older checkout, whose quadratic parsers take seconds a step
#   ... -- --typical          # only the cost of a typical small step, five times
#
# Costs are the VM's CPU time per run (statistics(:runtime)), so a loaded machine does
# not inflate them; /healthz answer times are wall time. Schedulers that spin before
# they sleep count that spinning as CPU time: ERL_FLAGS above turns it off.
#
# 1. SchemaInterceptor.ingest/1 on a step whose `action.result` is a text of each
#    shape (CSV, number lists, logs of timestamps and ids …), or that shape as JSON
#    itself (`[1,1,1,…]`): nanoseconds per byte of the body at both sizes, against
#    a step of prose of the same size in the same run, and the typical step of
#    bench/ingest.exs (µs per step).
# 2. The most a call holds a normal scheduler: the same shapes, parsed at the size
#    where calls move to a dirty scheduler (Observatory.Native.Cost), in ms.
# 3. Over HTTP: /healthz answer times while two clients keep posting 192 KiB CSV
#    steps, against /healthz alone.
#
# It runs against an older checkout too (it uses only the public ingest API), which is
# how the before/after figures in the README were taken.
alias Observatory.Gateway.SchemaInterceptor

quick? = "--quick" in System.argv()
{small, large} = if quick?, do: {16 * 1024, 256 * 1024}, else: {64 * 1024, 1024 * 1024}

Observatory.Replay.prepare_app(own_data_dir: true)
endpoint = Application.get_env(:observatory, ObservatoryWeb.Endpoint, [])

Application.put_env(
  :observatory,
  ObservatoryWeb.Endpoint,
  Keyword.merge(endpoint, server: true, port: 0)
)

Application.put_env(:observatory, :max_body_bytes, 4 * 1024 * 1024)
Logger.configure(level: :error)
{:ok, _} = Application.ensure_all_started(:observatory)

prose =
  "The agent read the configuration file and found that the service listens on the " <>
    "loopback interface only; it then asked the operator whether to open the port. "

shapes = [
  {"prose (baseline)", prose},
  {"csv 1,1,1", "1,"},
  {"decimals 1.2.3", "1.2."},
  {"csv rows", "10,200,3.5,4000\n"},
  {"Unix times 1739870000,", "1739870000,"},
  {"digit-dash 1-1-1", "1-"},
  {"dates 2024-01-15,", "2024-01-15,"},
  {"uuid groups a1b2c3d4-", "a1b2c3d4-"},
  {"hex ids", "a1b2c3d4e5 "},
  {"volatile pid 1", "pid 1 "},
  {"lines 1\\n", "1\n"},
  {"quotes \"1\",", "\"1\","},
  {"objects {\"k\":[0]},", "{\"k\":[0]},"}
]

envelope = fn result ->
  Observatory.JSON.encode!(%{
    "meta" => %{
      "step_id" => "s-#{System.unique_integer([:positive])}",
      "session_id" => "lin-#{System.unique_integer([:positive])}",
      "agent_id" => "agent-lin",
      "timestamp" => "2026-02-22T10:30:00Z"
    },
    "cognition" => %{"intent" => "read"},
    "action" => %{
      "tool_call" => "run_shell",
      "tool_input" => %{"cmd" => "cat data.csv"},
      "status" => "success",
      "result" => result
    }
  })
end

text_of = fn unit, n -> String.duplicate(unit, max(div(n, byte_size(unit)), 1)) end

# The shape as a JSON value where it is one (`1,1,1` → [1,1,1,0]), else nil.
json_of = fn unit, n ->
  case Observatory.JSON.decode("[" <> text_of.(unit, n) <> "0]") do
    {:ok, value} -> value
    _ -> nil
  end
end

# The VM's CPU time per run, in µs, over at least `runs` runs and 200 ms: CPU time,
# not wall time, so that other processes on a shared machine do not count (the VM's
# own housekeeping does, a little). Dirty schedulers' time is included.
best = fn fun, runs ->
  {cpu0, _} = :erlang.statistics(:runtime)
  t0 = System.monotonic_time(:millisecond)

  n =
    Stream.iterate(1, &(&1 + 1))
    |> Enum.find(fn n ->
      fun.()
      n >= runs and System.monotonic_time(:millisecond) - t0 >= 200
    end)

  {cpu1, _} = :erlang.statistics(:runtime)
  (cpu1 - cpu0) * 1000 / n
end

ingest_ns_per_byte = fn body, runs ->
  best.(fn -> {:ok, _} = SchemaInterceptor.ingest(body) end, runs) * 1000 / byte_size(body)
end

# --runs N: fewer runs for a checkout whose parsers take seconds on these inputs.
runs =
  case OptionParser.parse(System.argv(),
         strict: [runs: :integer, quick: :boolean, typical: :boolean]
       ) do
    {opts, _, _} -> Keyword.get(opts, :runs, if(quick?, do: 5, else: 7))
  end

label = fn n ->
  if n >= 1024 * 1024, do: "#{div(n, 1024 * 1024)} MiB", else: "#{div(n, 1024)} KiB"
end

# The cost of a typical small step (bench/ingest.exs's), for before/after comparisons
# of what every step pays: `-- --typical` runs only this, five times. Each ingest has
# a step_id of its own, as bench/ingest.exs's do (a gateway that answers retries from
# memory would otherwise time one step and its replays); the bodies are made before
# the clock starts.
typical_step_cost = fn ->
  n = 20_000
  round = System.unique_integer([:positive])

  typical = fn i ->
    Observatory.JSON.encode!(%{
      "meta" => %{
        "step_id" => "step-#{round}-#{i}",
        "session_id" => "sess-typical",
        "agent_id" => "agent-1",
        "parent_step_id" => "step-0",
        "timestamp" => "2026-02-22T10:30:00.123Z"
      },
      "cognition" => %{
        "intent" => "search",
        "reasoning_chain" => ["read the task", "pick a tool"]
      },
      "action" => %{
        "tool_call" => "read_file",
        "tool_input" => %{"path" => "/srv/app/file-7.ex", "limit" => 200},
        "status" => "success",
        "result" => %{"bytes" => 1031}
      }
    })
  end

  bodies = Enum.map(1..n, typical)
  {cpu0, _} = :erlang.statistics(:runtime)

  for body <- bodies do
    {:ok, result} = SchemaInterceptor.ingest(body)
    # Older checkouts have no :replayed.
    true = result[:replayed] in [nil, false]
  end

  {cpu1, _} = :erlang.statistics(:runtime)

  IO.puts(
    "\ntypical step (#{byte_size(hd(bodies))} B, bench/ingest.exs's shape): " <>
      "#{Float.round((cpu1 - cpu0) * 1000 / n, 1)} µs of CPU per step, one caller"
  )
end

if "--typical" in System.argv() do
  for _ <- 1..5, do: typical_step_cost.()
  System.halt(0)
end

IO.puts(
  "schedulers: #{System.schedulers_online()}, dirty CPU: #{:erlang.system_info(:dirty_cpu_schedulers)}\n"
)

IO.puts("1. SchemaInterceptor.ingest/1, ns per byte of the body\n")

IO.puts("| result | as | #{label.(small)} | #{label.(large)} | growth | × prose |")

IO.puts("|---|---|---:|---:|---:|---:|")

prose_large =
  for {name, unit} <- shapes,
      {as, make} <- [text: &text_of.(&1, &2), json: json_of],
      reduce: nil do
    prose_large ->
      with a when a != nil <- make.(unit, small), b when b != nil <- make.(unit, large) do
        at_small = ingest_ns_per_byte.(envelope.(a), runs)
        at_large = ingest_ns_per_byte.(envelope.(b), runs)
        prose_large = prose_large || at_large

        IO.puts(
          "| #{name} | #{as} | #{Float.round(at_small, 1)} | #{Float.round(at_large, 1)} | " <>
            "#{Float.round(at_large / at_small, 2)}× | #{Float.round(at_large / prose_large, 1)}× |"
        )

        prose_large
      else
        _ -> prose_large
      end
  end

_ = prose_large

typical_step_cost.()

threshold =
  if Code.ensure_loaded?(Observatory.Native.Cost),
    do: Observatory.Native.Cost.dirty_bytes(),
    else: 64 * 1024

IO.puts(
  "\n2. A step of #{label.(threshold)} parsed on a normal scheduler (the largest that is)\n"
)

IO.puts("| result | as | ms |")
IO.puts("|---|---|---:|")

worst =
  for {name, unit} <- shapes, {as, make} <- [text: &text_of.(&1, &2), json: json_of], reduce: 0 do
    worst ->
      case make.(unit, threshold - 300) do
        nil ->
          worst

        result ->
          body = envelope.(result)
          rules = Observatory.Gateway.LoopVerdict.rules()
          us = best.(fn -> Observatory.Native.decision_log_parse(body, rules, true) end, runs)
          IO.puts("| #{name} | #{as} | #{Float.round(us / 1000, 2)} |")
          max(worst, us)
      end
  end

IO.puts("\nmost a normal scheduler was held: #{Float.round(worst / 1000, 2)} ms")

IO.puts("\n3. GET /healthz while two clients post 192 KiB CSV steps (ms)\n")
:inets.start()
{:ok, %{key: key}} = Observatory.AgentKeys.issue("agent-lin")
url = ObservatoryWeb.Endpoint.url()

healthz_ms = fn ->
  {us, {:ok, {{_, 200, _}, _, _}}} =
    :timer.tc(fn -> :httpc.request(:get, {~c"#{url}/healthz", []}, [timeout: 60_000], []) end)

  us / 1000
end

summary = fn times ->
  sorted = Enum.sort(times)

  "median #{Float.round(Enum.at(sorted, div(length(sorted), 2)), 1)}, max #{Float.round(List.last(sorted), 1)}"
end

idle = for _ <- 1..20, do: healthz_ms.()
csv_body = envelope.(text_of.("1,", 192 * 1024))
parent = self()

posters =
  for _ <- 1..2 do
    spawn_link(fn ->
      post = fn loop ->
        receive do
          :stop -> send(parent, :stopped)
        after
          0 ->
            :httpc.request(
              :post,
              {~c"#{url}/api/v1/decision_logs", [{~c"authorization", ~c"Bearer #{key}"}],
               ~c"application/json", csv_body},
              [timeout: 120_000],
              []
            )

            loop.(loop)
        end
      end

      post.(post)
    end)
  end

Process.sleep(200)
busy = for _ <- 1..10, do: healthz_ms.()
for pid <- posters, do: send(pid, :stop)
for _ <- posters, do: receive(do: (:stopped -> :ok), after: (180_000 -> :ok))

IO.puts("| /healthz | ms |")
IO.puts("|---|---|")
IO.puts("| alone | #{summary.(idle)} |")
IO.puts("| beside two clients posting 192 KiB CSV steps | #{summary.(busy)} |")
