# What one ingest costs, stage by stage: SchemaInterceptor.ingest/1 on a DecisionLog
# of three sizes, and each stage of it called alone, against the plain-Elixir
# reference tracker's record_and_score (ADR-018, bench/reference_tracker.exs)
# measured in the same run: the yardstick of every ratio.
#
#   MIX_ENV=prod mix run bench/ingest_breakdown.exs             # ~2 min
#   MIX_ENV=prod mix run bench/ingest_breakdown.exs -- --quick  # ~30 s
#
# Steps: "small" (~300 bytes: a tool call and a one-number result), "600 B" (a
# reasoning chain, a file read and a few lines of its content), "4 KiB" (the same
# with a 3.6 KiB file read back, the size of a real coding agent's median result).
# 1,000 sessions, 50 agents, a mix of tools and statuses as a fleet sends them (the
# entropy severity is mostly normal); every ingested step is a new one (its own
# step_id). Each figure is the median of many batches of 20 calls: a batch that
# other programs on this shared machine interrupted lands in the slow tail, not the
# median. The stages are called as the ingest calls them, on the same sessions; their
# sum is not the whole (what ties them together, and a cache warmed by one stage
# for the next, are in the whole only).
Code.require_file("reference_tracker.exs", __DIR__)
Code.require_file("glue_step.exs", __DIR__)
Code.require_file("breakdown_steps.exs", __DIR__)

alias Observatory.Bench.ReferenceTracker
alias Observatory.Gateway.{DecisionLog, Events, HITL, Idempotency, SchemaInterceptor, SessionLog}
alias Observatory.Metrics

Logger.configure(level: :error)
quick? = "--quick" in System.argv()
# Batches of 20 calls per stage and round; rounds interleave the stages so that the
# machine's other work slows them alike.
{rounds, batches} = if quick?, do: {3, 100}, else: {5, 300}
batch = 20

alias Observatory.Bench.BreakdownSteps

{intents, tools} = {BreakdownSteps.intents(), BreakdownSteps.tools()}
sizes = BreakdownSteps.sizes()
templates = BreakdownSteps.templates()
:ok = BreakdownSteps.publish(:bench_breakdown)
message = &BreakdownSteps.message(:bench_breakdown, &1, &2, &3)

# The median of `batches` timings of `fun` over 100 inputs, each made by `input`
# (outside the timing), in ns per call.
# Inputs are numbered by one counter for the whole run: each session's steps go on
# through its templates, whichever stage or caller takes them.
step_counter = :atomics.new(1, [])

time_batches = fn input, fun, batches ->
  for _ <- 1..batches do
    inputs = for _ <- 1..batch, do: input.(:atomics.add_get(step_counter, 1, 1))
    t0 = System.monotonic_time(:nanosecond)
    Enum.each(inputs, fun)
    (System.monotonic_time(:nanosecond) - t0) / batch
  end
end

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end

# A counter per run so that every ingested step id is new.
fresh = fn -> "r#{System.unique_integer([:positive])}-" end

# The reference design: one GenServer, 5-tuple windows, 1,000 sessions warmed.
{:ok, ref} = ReferenceTracker.start_link(5)

ref_input = fn n ->
  {"sess-#{rem(n, 1000)}",
   {Enum.at(intents, rem(n, 4)), Enum.at(tools, rem(div(n, 4), 8)), :success}}
end

for n <- 0..4_999,
    do: ReferenceTracker.record_and_score(ref, elem(ref_input.(n), 0), elem(ref_input.(n), 1))

# The agents are registered, as the kill switch has them once they have sent steps.
for a <- 0..49, do: {:ok, _} = Observatory.KillSwitch.Agents.fetch_or_register("agent-#{a}")

# Every stage's inputs, as the ingest has them: a parsed step and what came before.
parsed = fn size, n ->
  json = message.(size, n, fresh.())
  {:ok, envelope, fields} = DecisionLog.parse(json)
  {envelope, fields, json}
end

pubsub_event = fn {envelope, f, _json} ->
  %{
    event_type: "decision_log",
    session_id: f.session_id,
    agent_id: f.agent_id,
    step_id: f.step_id,
    severity: :normal,
    verdict: :progress,
    envelope: envelope
  }
end

kept_answer = Observatory.Bench.GlueStep.kept_answer()

stages = [
  {"decode + validate (parse NIF)",
   fn size -> {&message.(size, &1, fresh.()), &DecisionLog.parse/1} end},
  # As the HTTP API, the replay and the demo fleet call it (`envelope: false`): the
  # envelope's term is not built.
  {"decode + validate, no envelope term",
   fn size -> {&message.(size, &1, fresh.()), &DecisionLog.parse(&1, envelope: false)} end},
  # The entropy window, the loop verdict and the step detector: one NIF call
  # (StepScore), its answers settled as the ingest settles them, with the settings
  # read for the step (FR-9.11's three among them).
  {"scoring: entropy + verdict + step detector (one NIF call)",
   fn size ->
     {&parsed.(size, &1), fn {_e, f, _json} -> BreakdownSteps.score_and_settle(f) end}
   end},
  {"safety reads (pause, block, kill switch)",
   fn size ->
     {&parsed.(size, &1),
      fn {_e, f, _json} ->
        HITL.pause_of(f.session_id)
        Observatory.KillSwitch.active?(f.agent_id)
        Observatory.Storage.read(:observatory_step_blocks, f.session_id)
      end}
   end},
  # The envelope stored as its text, with the gateway's score (as the ingest stores it).
  {"session log",
   fn size ->
     {&parsed.(size, &1), fn {_e, f, json} -> SessionLog.put_json(f.session_id, json, 0.5) end}
   end},
  {"idempotency (claim + complete)",
   fn size ->
     {&parsed.(size, &1),
      fn {_e, f, _json} ->
        {:new, ticket} = Idempotency.claim(f)
        # What the ingest keeps for a retry: the score, the severity, the loop verdict
        # and the step detector's verdict, as tuples of their values; stored as the
        # ingest stores it (unmeasured when its shape bounds its size).
        SchemaInterceptor.complete_kept(ticket, kept_answer)
      end}
   end},
  # The pair's second call alone: the answer stored for a retry (its claim made
  # before the clock starts). The row above less this one is the claim.
  {"  of which: complete alone",
   fn size ->
     {fn n ->
        {_e, f, _json} = parsed.(size, n)
        {:new, ticket} = Idempotency.claim(f)
        ticket
      end, &SchemaInterceptor.complete_kept(&1, kept_answer)}
   end},
  # Who owns the session: the cluster's owner node (one :persistent_term read with
  # clustering off) and the agent that owns it (SessionOwners, one ETS lookup).
  {"session ownership (cluster owner, session's agent)",
   fn size ->
     {&parsed.(size, &1),
      fn {_e, f, _json} ->
        Observatory.Cluster.owner(f.session_id, [])
        Observatory.Gateway.SessionOwners.claim(f.session_id, f.agent_id)
      end}
   end},
  # As the ingest broadcasts: the event is made only when someone follows the topic.
  {"broadcasts (no subscriber)",
   fn size ->
     {&parsed.(size, &1),
      fn p -> Events.broadcast_lazy(Events.decision_logs(), fn -> pubsub_event.(p) end) end}
   end},
  {"metrics + telemetry",
   fn size ->
     {&parsed.(size, &1),
      fn {_e, f, _json} ->
        # As the ingest counts a step (the step, its severity, its verdict: one read of
        # the counters' array) and emits its event (metadata built only when events go
        # somewhere).
        Metrics.inc(:messages, :normal, :verdict_progress)
        Metrics.observe_latency(12)

        case Observatory.Telemetry.dispatcher() do
          nil ->
            :ok

          dispatcher ->
            dispatcher.execute([:observatory, :ingest, :stop], %{duration: 12}, %{
              result: :ok,
              session_id: f.session_id,
              agent_id: f.agent_id,
              violations: 0,
              replayed: false
            })
        end
      end}
   end},
  {"**whole ingest**",
   fn size -> {&message.(size, &1, fresh.()), &SchemaInterceptor.ingest/1} end},
  {"**whole ingest, no envelope term** (as the HTTP API calls it)",
   fn size ->
     {&message.(size, &1, fresh.()), &SchemaInterceptor.ingest(&1, envelope: false)}
   end}
]

load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg 2>/dev/null") |> to_string() |> String.trim()

# The durable blocks a step's safety read looks up: a table that earlier runs (the
# HTTP bench's looping sessions) filled makes that read dearer, so two checkouts
# compared should start from the same state (an empty `data/prod`).
blocks = :mnesia.table_info(:observatory_step_blocks, :size)

IO.puts(
  "schedulers: #{System.schedulers_online()}; 1-min load average at the start: #{load}; " <>
    "step-detector blocks kept: #{blocks}; message sizes: " <>
    Enum.map_join(sizes, ", ", fn {size, label} ->
      "#{label} = #{byte_size(message.(size, 0, "r1-"))} bytes"
    end) <>
    "\n"
)

# Warm every session of every size with whole ingests (windows full, memory touched).
for {size, _} <- sizes,
    n <- 0..(templates * 2),
    do: SchemaInterceptor.ingest(message.(size, n, "warm-"))

# Two callers: each ingests batches; per-step cost from the median batch, and the pair's
# steps per second against the reference's with two callers too.
two_callers = fn input, fun, batches ->
  parent = self()

  {micros, per_call} =
    :timer.tc(fn ->
      pids =
        for _ <- 1..2 do
          spawn_link(fn ->
            send(parent, {:done, self(), time_batches.(input, fun, batches)})
          end)
        end

      Enum.flat_map(pids, fn pid -> receive(do: ({:done, ^pid, samples} -> samples)) end)
    end)

  {median.(per_call), 2 * batches * batch / (micros / 1_000_000)}
end

# samples: {stage, size} => [ns per call]; the reference's under :reference.
# Each stage's batches also in the VM's CPU time (:erlang.statistics(:runtime), all
# its threads): what other programs on the machine take is not counted in it, which
# the wall clock does count. {ms, calls} per key, beside the samples.
timed = fn input, fun ->
  {_, _} = :erlang.statistics(:runtime)
  samples = time_batches.(input, fun, batches)
  {_, ms} = :erlang.statistics(:runtime)
  {samples, {ms, batches * batch}}
end

add = fn acc, key, {samples, {ms, calls}} ->
  Map.update(acc, key, {samples, ms, calls}, fn {s, m, c} -> {s ++ samples, m + ms, c + calls} end)
end

reference_call = fn {s, t} -> ReferenceTracker.record_and_score(ref, s, t) end

samples =
  Enum.reduce(1..rounds, %{}, fn _round, acc ->
    acc = add.(acc, :reference, timed.(ref_input, reference_call))

    for {label, stage} <- stages, {size, _} <- sizes, reduce: acc do
      acc ->
        {input, fun} = stage.(size)
        add.(acc, {label, size}, timed.(input, fun))
    end
  end)

{ref_samples, ref_ms, ref_calls} = samples[:reference]
ref_ns = median.(ref_samples)
r = fn x -> :erlang.float_to_binary(x / 1, decimals: 1) end

IO.puts(
  "reference record_and_score (ADR-018, one GenServer call): #{round(ref_ns)} ns, 1 caller\n"
)

IO.puts(
  "| stage (1 caller) | " <>
    Enum.map_join(sizes, " | ", fn {_, l} -> "#{l}: ns | × ref" end) <> " |"
)

IO.puts("|---|" <> String.duplicate("---:|---:|", length(sizes)))

for {label, _} <- stages do
  cells =
    Enum.map_join(sizes, " | ", fn {size, _} ->
      ns = median.(elem(samples[{label, size}], 0))
      "#{round(ns)} | #{r.(ns / ref_ns)}×"
    end)

  IO.puts("| #{label} | #{cells} |")
end

# Against the targets (600 B within 2× the reference, 4 KiB within 4×), as the HTTP
# API calls the ingest: how much of each line the two NIF stages take, what the
# other stages and the rest (the whole less the stages' sum) come to, and what the
# whole would have to lose.
stage_ns = fn label, size -> median.(elem(samples[{label, size}], 0)) end

nif_stages = [
  "decode + validate, no envelope term",
  "scoring: entropy + verdict + step detector (one NIF call)"
]

other_stages =
  for {label, _} <- stages,
      label not in nif_stages,
      not String.starts_with?(label, ["decode", "  ", "**"]),
      do: label

whole_label = "**whole ingest, no envelope term** (as the HTTP API calls it)"

IO.puts(
  """

  | against the target, no envelope term | 600 B | 4 KiB |
  |---|---:|---:|
  """ <>
    Enum.map_join(
      [
        {"the line (× the reference)", fn _, line -> line * ref_ns end},
        {"parse + scoring (the two NIF stages)",
         fn size, _ -> Enum.sum(Enum.map(nif_stages, &stage_ns.(&1, size))) end},
        {"every other stage (#{length(other_stages)})",
         fn size, _ -> Enum.sum(Enum.map(other_stages, &stage_ns.(&1, size))) end},
        {"the rest (the whole less the stages' sum)",
         fn size, _ ->
           stage_ns.(whole_label, size) -
             Enum.sum(Enum.map(nif_stages ++ other_stages, &stage_ns.(&1, size)))
         end},
        {"the whole", fn size, _ -> stage_ns.(whole_label, size) end},
        {"the whole less the line",
         fn size, line -> stage_ns.(whole_label, size) - line * ref_ns end}
      ],
      "\n",
      fn {label, value} ->
        cells =
          Enum.map_join([medium: 2, large: 4], " | ", fn {size, line} ->
            ns = value.(size, line)
            "#{round(ns)} ns (#{r.(ns / ref_ns)}×)"
          end)

        "| #{label} | #{cells} |"
      end
    )
)

# The whole ingest and the reference in CPU time: every call, slow ones included.
ref_cpu = ref_ms * 1000 / ref_calls

IO.puts(
  "\n| 1 caller, VM CPU time per call | " <> Enum.map_join(sizes, " | ", &elem(&1, 1)) <> " |"
)

IO.puts("|---|" <> String.duplicate("---:|", length(sizes)))

IO.puts(
  "| reference record_and_score | #{r.(ref_cpu)} µs |" <>
    String.duplicate(" |", length(sizes) - 1)
)

for label <- ["**whole ingest**", "**whole ingest, no envelope term** (as the HTTP API calls it)"] do
  cells =
    Enum.map_join(sizes, " | ", fn {size, _} ->
      {_, ms, calls} = samples[{label, size}]
      us = ms * 1000 / calls
      "#{r.(us)} µs, #{r.(us / ref_cpu)}×"
    end)

  IO.puts("| #{label} | #{cells} |")
end

# Two callers at once, whole ingest and reference, one after the other.
{ref2_ns, ref2_rate} =
  two_callers.(
    ref_input,
    fn {s, t} -> ReferenceTracker.record_and_score(ref, s, t) end,
    batches * 2
  )

IO.puts("\n| 2 callers | ns per call (median batch) | × ref | calls/s, both | × ref's calls/s |")
IO.puts("|---|---:|---:|---:|---:|")
IO.puts("| reference record_and_score | #{round(ref2_ns)} | 1.0× | #{round(ref2_rate)} | 1.00 |")

for {size, label} <- sizes do
  {ns, rate} =
    two_callers.(&message.(size, &1, fresh.()), &SchemaInterceptor.ingest/1, batches * 2)

  IO.puts(
    "| whole ingest, #{label} | #{round(ns)} | #{r.(ns / ref2_ns)}× | #{round(rate)} | " <>
      "#{:erlang.float_to_binary(rate / ref2_rate, decimals: 2)} |"
  )
end

# What the steps came to: a fleet at work, not a fleet in loops (the costly paths —
# alerts, durable blocks — are rare, as on a gateway in front of real agents).
m = &Observatory.Metrics.get/1

IO.puts(
  "\nsteps scored: #{m.(:messages)}; entropy warning #{m.(:warning)}, loop #{m.(:loop)}; " <>
    "verdict suspect #{m.(:verdict_suspect)}, loop #{m.(:verdict_loop)}; " <>
    "step detector warn #{m.(:step_warnings)}, block #{m.(:step_blocks)}"
)
