# The ingest's glue here against another build of it, in one VM: the modules that
# make the glue are loaded from this build and from the other in turn (their .beam
# files), and the same pieces and the whole ingest are timed with each, one right
# after the other. Both sides share the VM, its tables, its NIF and the machine's
# load at that moment, so differences of tens of ns show that two separate runs
# (each ±1–2 µs on a shared machine) cannot.
#
#   MIX_ENV=prod mix run bench/ingest_glue_ab.exs -- --against ../other    # ~2 min
#   MIX_ENV=prod mix run bench/ingest_glue_ab.exs -- --against ../other --quick
#   MIX_ENV=prod mix run bench/ingest_glue_ab.exs -- --against ../other --settings
#
# `--settings` swaps the modules that read the ingest's settings and stores too
# (StepScore, Idempotency, AlertSource, Events, SessionLog, NativeStores): the two
# ways of reading them compared in one VM.
#
# The other checkout must be built with MIX_ENV=prod. Only modules whose public
# functions both builds have are swapped (`modules` below); the NIF is this build's.
alias Observatory.Gateway.{Events, HITL, SchemaInterceptor, SessionOwners}

Logger.configure(level: :error)

{opts, _, _} =
  OptionParser.parse(System.argv() -- ["--"],
    strict: [against: :string, quick: :boolean, settings: :boolean]
  )

against = opts[:against] || raise "give --against DIR, another checkout built with MIX_ENV=prod"
{rounds, loop_n, ingest_n} = if opts[:quick], do: {6, 100_000, 4_000}, else: {12, 200_000, 10_000}

modules = [
  Observatory.Gateway.SchemaInterceptor,
  Observatory.Gateway.SessionOwners,
  Observatory.Gateway.EntropyTracker,
  Observatory.Storage,
  Observatory.Telemetry,
  Observatory.Cluster,
  Observatory.PubSub.Peer
]

settings_readers = [
  Observatory.Gateway.StepScore,
  Observatory.Gateway.Idempotency,
  Observatory.Gateway.AlertSource,
  Observatory.Gateway.Events,
  Observatory.Gateway.SessionLog,
  Observatory.NativeStores
]

modules = if opts[:settings], do: modules ++ settings_readers, else: modules

ebin = fn dir -> Path.join(Path.expand(dir), "_build/prod/lib/observatory/ebin") end
builds = [this: ebin.(File.cwd!()), other: ebin.(against)]

load = fn dir ->
  for m <- modules do
    file = Path.join(dir, "#{m}.beam")
    :code.purge(m)
    {:module, ^m} = :code.load_binary(m, String.to_charlist(file), File.read!(file))
  end
end

# The ~600-byte step of bench/ingest_glue_cost.exs: 1,000 sessions, 50 agents, every
# step a new one.
Code.require_file("glue_step.exs", __DIR__)
message = &Observatory.Bench.GlueStep.message(&1, "ab")

for a <- 0..49, do: {:ok, _} = Observatory.KillSwitch.Agents.fetch_or_register("agent-#{a}")
for i <- 0..9_999, do: SchemaInterceptor.ingest(message.(i), envelope: false)
ids = List.to_tuple(for s <- 0..999, do: {"glue-#{s}", "agent-#{rem(s, 50)}"})
own = {Observatory.PubSub, Observatory.PubSub}

# Each piece as the ingest calls it, over the benchmark's sessions (warm: a loop).
pieces = [
  {"safety reads (pause, block, kill switch)",
   fn {s, a} ->
     HITL.pause_of(s)
     Observatory.Storage.read(:observatory_step_blocks, s)
     Observatory.KillSwitch.active?(a)
   end},
  {"session ownership (cluster owner, claim/2)",
   fn {s, a} ->
     Observatory.Cluster.owner(s, [])
     SessionOwners.claim(s, a)
   end},
  {"broadcast (no subscriber)",
   fn {s, _} -> Events.broadcast_lazy(Events.decision_logs(), fn -> s end, own) end},
  {"entropy settle (a normal step)",
   fn {s, a} ->
     Observatory.Gateway.EntropyTracker.settle(
       {0.5, :normal, :normal, 5, {a, "i", "t", 0, 1}},
       s,
       a,
       true
     )
   end},
  {"storage check + telemetry dispatcher ×2",
   fn _ ->
     Observatory.Storage.require!()
     Observatory.Telemetry.dispatcher()
     Observatory.Telemetry.dispatcher()
   end}
]

loop_ns = fn fun ->
  {t, _} =
    :timer.tc(fn ->
      Enum.reduce(0..(loop_n - 1), 0, fn i, _ ->
        fun.(elem(ids, rem(i, 1000)))
        0
      end)
    end)

  {t0, _} =
    :timer.tc(fn ->
      Enum.reduce(0..(loop_n - 1), 0, fn i, _ ->
        elem(ids, rem(i, 1000))
        0
      end)
    end)

  (t - t0) * 1000 / loop_n
end

counter = :atomics.new(1, [])

# The whole ingest (no envelope term, as the HTTP API calls it): the median batch of
# 20 (wall) and the VM's CPU time per step over the round.
ingest_ns = fn ->
  start = :atomics.add_get(counter, 1, ingest_n) + 100_000
  inputs = for i <- start..(start + ingest_n - 1), do: message.(i)
  :erlang.garbage_collect()
  {_, _} = :erlang.statistics(:runtime)

  batches =
    for batch <- Enum.chunk_every(inputs, 20) do
      t0 = System.monotonic_time(:nanosecond)
      Enum.each(batch, &SchemaInterceptor.ingest(&1, envelope: false))
      (System.monotonic_time(:nanosecond) - t0) / 20
    end

  {_, ms} = :erlang.statistics(:runtime)
  {Enum.at(Enum.sort(batches), div(length(batches), 2)), ms * 1_000_000 / ingest_n}
end

load_avg = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg") |> to_string() |> String.trim()
IO.puts("1-min load average at the start: #{load_avg}; #{rounds} rounds, each side in turn\n")

# Each measurement is taken with one build, then at once with the other (which goes
# first alternates), so that a difference is paired with the machine's load of the
# same few seconds.
measure = fn key, take ->
  fn acc, r ->
    order = if rem(r, 2) == 0, do: builds, else: Enum.reverse(builds)

    for {side, dir} <- order, reduce: acc do
      acc ->
        load.(dir)
        Map.update(acc, {side, key}, [take.()], &[take.() | &1])
    end
  end
end

# Each whole-ingest round once with each build (unmeasured) so both are warm.
for {_side, dir} <- builds, do: load.(dir) && ingest_ns.()

steps =
  [
    measure.(:wall, fn -> elem(ingest_ns.(), 0) end),
    measure.(:cpu, fn -> elem(ingest_ns.(), 1) end)
  ] ++ for({label, fun} <- pieces, do: measure.(label, fn -> loop_ns.(fun) end))

samples =
  for r <- 1..rounds, step <- steps, reduce: %{} do
    acc -> step.(acc, r)
  end

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end

# Paired: each round's this-minus-other, so the machine's load in that round cancels.
paired = fn key ->
  Enum.zip(Enum.reverse(samples[{:this, key}]), Enum.reverse(samples[{:other, key}]))
  |> Enum.map(fn {a, b} -> a - b end)
  |> median.()
end

row = fn label, key ->
  IO.puts(
    "| #{label} | #{round(median.(samples[{:other, key}]))} | " <>
      "#{round(median.(samples[{:this, key}]))} | #{round(paired.(key))} |"
  )
end

IO.puts(
  "| ns per step (medians of the rounds) | other (#{against}) | this | this − other, paired |"
)

IO.puts("|---|---:|---:|---:|")
for {label, _} <- pieces, do: row.(label <> " (a loop)", label)
row.("whole ingest, no envelope term, median batch of 20 (wall)", :wall)
row.("whole ingest, no envelope term, VM CPU", :cpu)
