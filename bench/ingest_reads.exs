# The reads one ingest makes, counted: application-env reads (`:application.get_env`),
# `:persistent_term` reads and ETS calls, each with the function that makes it, per
# step of the ~600-byte step of bench/glue_step.exs (as the HTTP API ingests it: no
# envelope term). Counted by tracing the calling process over 20 steps of a warm
# fleet, so the figures are counts, not timings (the tracing slows the steps).
#
#   MIX_ENV=prod mix run bench/ingest_reads.exs
#
# Run it in another checkout (copied there) to compare the counts of two builds.
alias Observatory.Gateway.SchemaInterceptor

Logger.configure(level: :error)
Code.require_file("glue_step.exs", __DIR__)
message = &Observatory.Bench.GlueStep.message(&1, "reads")

for a <- 0..49, do: {:ok, _} = Observatory.KillSwitch.Agents.fetch_or_register("agent-#{a}")
for i <- 0..2_999, do: SchemaInterceptor.ingest(message.(i), envelope: false)

steps = for i <- 3_000..3_019, do: message.(i)
n = length(steps)
me = self()
caller = [{:_, [], [{:message, {:caller}}]}]

for mfa <- [{:application, :get_env, :_}, {:persistent_term, :get, :_}, {:ets, :_, :_}],
    do: :erlang.trace_pattern(mfa, caller, [:local])

pid =
  spawn(fn ->
    receive do: (:go -> :ok)
    for step <- steps, do: SchemaInterceptor.ingest(step, envelope: false)
    send(me, :done)
  end)

:erlang.trace(pid, true, [:call, :set_on_spawn, {:tracer, me}])
send(pid, :go)

collect = fn collect, acc ->
  receive do
    {:trace, _, :call, {m, f, args}, from} -> collect.(collect, [{m, f, args, from} | acc])
    :done -> acc
  end
end

calls = collect.(collect, [])
:erlang.trace(:all, false, [:call])
:erlang.trace_pattern({:_, :_, :_}, false, [:local])

# `:application.get_env/3` calls `/2`'s work itself: the reads are the calls made
# from outside the module.
reads = fn what ->
  Enum.filter(calls, fn {m, f, _args, {from, _, _}} -> {m, f} == what and from != m end)
end

table = fn title, rows ->
  IO.puts("\n| #{title} | per step |\n|---|---:|")

  rows
  |> Enum.frequencies()
  |> Enum.sort_by(fn {key, count} -> {-count, inspect(key)} end)
  |> Enum.each(fn {key, count} -> IO.puts("| `#{inspect(key)}` | #{count / n} |") end)

  IO.puts("| **in all** | **#{length(rows) / n}** |")
end

table.(
  "application-env reads: setting, read by",
  for(
    {_, _, [_app, key | _], {m, f, a}} <- reads.({:application, :get_env}),
    do: {key, "#{inspect(m)}.#{f}/#{a}"}
  )
)

table.(
  ":persistent_term reads: key, read by",
  for(
    {_, _, [key | _], {m, f, a}} <- reads.({:persistent_term, :get}),
    do: {key, "#{inspect(m)}.#{f}/#{a}"}
  )
)

# The application controller's own lookup of each env read is not the ingest's.
ets =
  for {:ets, f, [table | _], {m, fun, a}} <- calls,
      m != :application_controller,
      do: {f, if(is_reference(table), do: :unnamed, else: table), "#{inspect(m)}.#{fun}/#{a}"}

table.("ETS calls: function, table, made by", ets)

# What one read costs (ns, a loop of 1M; the loop's own cost taken off): an
# application-env read, and where this build has it, a read of the settings snapshot.
time = fn fun ->
  loop = fn f -> :timer.tc(fn -> Enum.reduce(1..1_000_000, 0, fn _, _ -> f.() && 0 end) end) end
  {us, _} = loop.(fun)
  {us0, _} = loop.(fn -> true end)
  (us - us0) / 1_000
end

IO.puts("\n| one read | ns |\n|---|---:|")

IO.puts(
  "| `:application.get_env(:observatory, :session_log_size, 20)` | " <>
    "#{round(time.(fn -> :application.get_env(:observatory, :session_log_size, 20) end))} |"
)

if Code.ensure_loaded?(Observatory.IngestSettings) do
  IO.puts(
    "| `Observatory.IngestSettings.get(:session_log_size)` | " <>
      "#{round(time.(fn -> Observatory.IngestSettings.get(:session_log_size) end))} |"
  )
end
