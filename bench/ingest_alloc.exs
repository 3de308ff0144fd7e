# What one ingest allocates on the caller's heap and collects, that the stages timed
# alone do not show: words allocated per step, minor and major collections per step,
# reductions, for the whole ingest of the ~600-byte step (bench/glue_step.exs, as the
# HTTP API calls it: no envelope term) and for each stage called alone as the ingest
# calls it; with `--calls`, the function calls a step makes (call-count tracing).
#
#   MIX_ENV=prod mix run bench/ingest_alloc.exs              # ~20 s
#   MIX_ENV=prod mix run bench/ingest_alloc.exs -- --calls   # and the calls a step makes
#
# Words allocated are counted from the collections' own reports (`:erlang.trace/3`
# with `:garbage_collection`): before each collection the heap holds what was
# allocated since the last one ended, so the sum over a run of the heap's growth
# between collections (plus heap fragments, the words NIFs and messages add outside
# the heap) is every word the run allocated. Each run is a fresh process with the
# default heap, as an HTTP handler's; its inputs are made first (their words are not
# counted) and read in place. Counts, not times: they do not depend on the machine's
# load. One timing at the end says what the collections cost: the whole ingest's CPU
# time in a process that collects as an HTTP handler does, and in one whose heap is
# never collected.
alias Observatory.Gateway.{DecisionLog, EntropyTracker, Events, HITL, Idempotency}
alias Observatory.Gateway.{LoopVerdict, SchemaInterceptor, SessionLog, SessionOwners}
alias Observatory.Gateway.{StepDetector, StepScore}

Logger.configure(level: :error)
calls? = "--calls" in System.argv()
n = 5_000

Code.require_file("glue_step.exs", __DIR__)
message = &Observatory.Bench.GlueStep.message(&1, "al")

for a <- 0..49, do: {:ok, _} = Observatory.KillSwitch.Agents.fetch_or_register("agent-#{a}")
for i <- 0..9_999, do: SchemaInterceptor.ingest(message.(i), envelope: false)

counter = :atomics.new(1, [])
fresh = fn -> for _ <- 1..n, do: message.(:atomics.add_get(counter, 1, 1) + 100_000) end

parsed = fn ->
  for json <- fresh.() do
    {:ok, _, fields} = DecisionLog.parse(json, envelope: false)
    {json, fields}
  end
end

# The collections of one process, as the tracer receives them: words allocated, minor
# and major collections.
tracer = fn ->
  loop = fn loop, acc ->
    receive do
      {:trace, _, start, info} when start in [:gc_minor_start, :gc_major_start] ->
        kind = if start == :gc_minor_start, do: :minor, else: :major
        grown = info[:heap_size] + info[:mbuf_size] - acc.after_last
        loop.(loop, %{acc | kind => Map.fetch!(acc, kind) + 1, words: acc.words + grown})

      {:trace, _, done, info} when done in [:gc_minor_end, :gc_major_end] ->
        loop.(loop, %{acc | after_last: info[:heap_size]})

      :reset ->
        loop.(loop, %{acc | minor: 0, major: 0, words: 0})

      {:report, to} ->
        send(to, {:report, acc})
    end
  end

  loop.(loop, %{minor: 0, major: 0, words: 0, after_last: 0})
end

# Runs `fun` over `inputs` in a fresh process; per step: words, minor and major
# collections (the run's last collection, forced to count what is left, not among
# them), reductions.
measure = fn inputs, fun ->
  parent = self()
  t = spawn(tracer)

  # The inputs as a persistent term: read in place, never copied to the process's
  # heap, so that its live data is what the steps leave, as an HTTP handler's is.
  :persistent_term.put({__MODULE__, :inputs}, List.to_tuple(inputs))

  pid =
    spawn(fn ->
      receive do
        :go -> :ok
      end

      inputs = :persistent_term.get({__MODULE__, :inputs})
      :erlang.garbage_collect()
      send(t, :reset)
      {:reductions, r0} = :erlang.process_info(self(), :reductions)
      for i <- 0..(n - 1), do: fun.(elem(inputs, i))
      {:reductions, r1} = :erlang.process_info(self(), :reductions)
      :erlang.garbage_collect()
      send(parent, {:done, self(), r1 - r0})
    end)

  :erlang.trace(pid, true, [:garbage_collection, {:tracer, t}])
  send(pid, :go)
  reductions = receive(do: ({:done, ^pid, r} -> r))
  # The tracer has had every report once the traced process is gone.
  ref = Process.monitor(pid)
  receive(do: ({:DOWN, ^ref, _, _, _} -> :ok))
  send(t, {:report, self()})
  acc = receive(do: ({:report, acc} -> acc))
  Process.exit(t, :kill)

  %{
    words: acc.words / n,
    minor: acc.minor / n,
    major: (acc.major - 1) / n,
    red: reductions / n
  }
end

kept = Observatory.Bench.GlueStep.kept_answer()

rows = [
  {"whole ingest, no envelope term", fresh, &SchemaInterceptor.ingest(&1, envelope: false)},
  {"parse, no envelope term", fresh, &DecisionLog.parse(&1, envelope: false)},
  {"session ownership (cluster owner, claim)", parsed,
   fn {_, f} ->
     Observatory.Cluster.owner(f.session_id, [])
     SessionOwners.claim(f.session_id, f.agent_id)
   end},
  {"idempotency claim + complete", parsed,
   fn {_, f} ->
     {:new, ticket} = Idempotency.claim(f)
     Idempotency.complete(ticket, kept)
   end},
  {"scoring + settles", parsed,
   fn {_, f} ->
     {e, v, s, thresholds} = StepScore.score(f, EntropyTracker, true)
     EntropyTracker.settle(e, f.session_id, f.agent_id, true)
     LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id)
     s && StepDetector.settle(s, f.session_id, thresholds)
   end},
  {"safety reads (pause, block, kill switch)", parsed,
   fn {_, f} ->
     HITL.pause_of(f.session_id)
     Observatory.Storage.read(:observatory_step_blocks, f.session_id)
     Observatory.KillSwitch.active?(f.agent_id)
   end},
  {"session log", parsed, fn {json, f} -> SessionLog.put_json(f.session_id, json, 0.5, 3) end},
  {"broadcast (no subscriber)", parsed,
   fn {_, f} -> Events.broadcast_lazy(Events.decision_logs(), fn -> f end) end},
  {"settings the glue reads (alert source, PubSub)", parsed,
   fn _ ->
     Observatory.Gateway.AlertSource.current()
     Events.pubsub()
   end}
]

IO.puts("#{n} steps a row, each run in a fresh process with the default heap\n")

IO.puts("| per step | words allocated | minor GCs | major GCs | reductions |")

IO.puts("|---|---:|---:|---:|---:|")

results =
  for {label, inputs, fun} <- rows do
    m = measure.(inputs.(), fun)

    IO.puts(
      "| #{label} | #{round(m.words)} | #{Float.round(m.minor, 4)} | " <>
        "#{Float.round(m.major, 4)} | #{round(m.red)} |"
    )

    m
  end

[whole | stages] = results
rest = whole.words - Enum.sum(Enum.map(stages, & &1.words))
IO.puts("| the whole less the stages (the glue's own terms) | #{round(rest)} | | | |")

# What the collections cost: the whole ingest in a process with the default heap (it
# collects as above) and in one whose heap never needs collecting (`min_heap_size` of
# 2M words), alternated, the VM's CPU time per step (nothing else runs in this VM).
cpu_per_step = fn spawn_opts ->
  :persistent_term.put({__MODULE__, :inputs}, List.to_tuple(fresh.()))
  parent = self()

  :erlang.spawn_opt(
    fn ->
      inputs = :persistent_term.get({__MODULE__, :inputs})
      {_, _} = :erlang.statistics(:runtime)
      for i <- 0..(n - 1), do: SchemaInterceptor.ingest(elem(inputs, i), envelope: false)
      {_, ms} = :erlang.statistics(:runtime)
      send(parent, {:cpu, ms * 1_000_000 / n})
    end,
    spawn_opts
  )

  receive(do: ({:cpu, ns} -> ns))
end

{default, roomy} =
  Enum.reduce(1..6, {[], []}, fn r, {d, b} ->
    order = if rem(r, 2) == 0, do: [:default, :roomy], else: [:roomy, :default]

    Enum.reduce(order, {d, b}, fn
      :default, {d, b} -> {[cpu_per_step.([]) | d], b}
      :roomy, {d, b} -> {d, [cpu_per_step.(min_heap_size: 2_000_000) | b]}
    end)
  end)

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end

IO.puts(
  "\nwhole ingest, VM CPU per step (median of 6 alternated runs of #{n}): default heap " <>
    "#{round(median.(default))} ns, a heap never collected #{round(median.(roomy))} ns"
)

# The terms the ingest builds for its answer, in words (the answer itself) and bytes
# (the answer kept for a retry, as the store holds it).
{:ok, result} = SchemaInterceptor.ingest(hd(fresh.()), envelope: false)

IO.puts(
  "\nthe answer (`result`): #{:erts_debug.flat_size(result)} words; " <>
    "the answer kept for a retry: #{byte_size(:erlang.term_to_binary(kept))} bytes " <>
    "(term_to_binary of the tuple)"
)

if calls? do
  inputs = fresh.()
  parent = self()

  pid =
    spawn(fn ->
      receive(do: (:go -> :ok))
      Enum.each(inputs, &SchemaInterceptor.ingest(&1, envelope: false))
      send(parent, :done)
    end)

  :erlang.trace_pattern({:_, :_, :_}, true, [:call_count, :local])
  :erlang.trace(pid, true, [:call])
  send(pid, :go)
  receive(do: (:done -> :ok))

  counts =
    for {m, _} <- :code.all_loaded(),
        {f, a} <- m.module_info(:functions),
        {:call_count, c} = :erlang.trace_info({m, f, a}, :call_count),
        is_integer(c) and c > 0,
        do: {c / n, {m, f, a}}

  :erlang.trace_pattern({:_, :_, :_}, false, [:call_count, :local])
  total = counts |> Enum.map(&elem(&1, 0)) |> Enum.sum()
  IO.puts("\nfunction calls a step: #{round(total)} (those made at least once a step:)")

  for {c, {m, f, a}} <- Enum.sort(counts, :desc), c >= 1 do
    IO.puts("  #{Float.round(c, 2)}  #{inspect(m)}.#{f}/#{a}")
  end
end
