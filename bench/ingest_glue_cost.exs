# What the ingest costs around its two NIF stages (the parse, the scoring): each
# piece of the glue called alone as the ingest calls it (the median of batches of 20
# calls), their sum, and the whole ingest, also in the VM's CPU time per step
# (:erlang.statistics(:runtime), the median of the rounds; other programs on the
# machine are not counted in it).
#
#   MIX_ENV=prod mix run bench/ingest_glue_cost.exs             # ~1 min
#   MIX_ENV=prod mix run bench/ingest_glue_cost.exs -- --quick  # ~20 s
#
# The ~600-byte step of bench/ingest_breakdown.exs (a reasoning chain, a file read and
# a few lines of it), 1,000 sessions, 50 registered agents, every step a new one.
# Only public calls that every version of the ingest has: run the same script on two
# builds, alternately, to compare them (with bench/glue_step.exs, its step).
alias Observatory.Gateway.{DecisionLog, Events, HITL, Idempotency, SchemaInterceptor}
alias Observatory.Gateway.{SessionLog, SessionOwners}
alias Observatory.{Cluster, KillSwitch, Metrics}

Logger.configure(level: :error)
{rounds, n} = if "--quick" in System.argv(), do: {5, 4_000}, else: {11, 10_000}

Code.require_file("glue_step.exs", __DIR__)
message = &Observatory.Bench.GlueStep.message(&1, "g")

for a <- 0..49, do: {:ok, _} = KillSwitch.Agents.fetch_or_register("agent-#{a}")
# Warm: every session's windows full, the stores at their steady size.
for i <- 0..29_999, do: SchemaInterceptor.ingest(message.(i), envelope: false)

counter = :atomics.new(1, [])
next = fn -> :atomics.add_get(counter, 1, 1) + 100_000 end

parsed = fn ->
  json = message.(next.())
  {:ok, _envelope, fields} = DecisionLog.parse(json, envelope: false)
  {fields, json}
end

# ns per call of `fun`: the median of batches of 20 calls (wall clock; a batch that
# other programs interrupted lands in the slow tail, not the median), inputs made by
# `input` outside the timing.
batch_ns = fn input, fun ->
  samples =
    for _ <- 1..div(rounds * n, 20) do
      inputs = for _ <- 1..20, do: input.()
      t0 = System.monotonic_time(:nanosecond)
      Enum.each(inputs, fun)
      (System.monotonic_time(:nanosecond) - t0) / 20
    end

  samples |> Enum.sort() |> Enum.at(div(length(samples), 2))
end

# CPU ns per call of `fun` (all the VM's threads: what the call makes other
# processes do counts too), the median of `rounds` rounds of `n` calls.
cpu_ns = fn input, fun ->
  samples =
    for _ <- 1..rounds do
      inputs = for _ <- 1..n, do: input.()
      {_, _} = :erlang.statistics(:runtime)
      Enum.each(inputs, fun)
      {_, ms} = :erlang.statistics(:runtime)
      ms * 1_000_000 / n
    end

  samples |> Enum.sort() |> Enum.at(div(rounds, 2))
end

# As agents send steps: a session's last step some seconds ago (the benchmark's own
# steps come back to a session within milliseconds). Outside the timing.
age = fn session_id ->
  :ets.update_element(
    SessionOwners.Owners,
    session_id,
    {3, System.monotonic_time(:millisecond) - 5_000}
  )
end

aged = fn ->
  {f, json} = parsed.()
  age.(f.session_id)
  {f, json}
end

# What a retry is answered from, as the ingest keeps it: the score, the severity, the
# loop verdict and the step detector's verdict, as tuples of their values (an
# ingest before that kept the maps: 314 bytes of external term against 137).
answer = fn ->
  {0.81, :normal, {:loop_verdict, :progress, :progress, nil, "no repetition", [], 17},
   {:step_verdict, :full_progress, 0, 0, :continue, nil}}
end

pieces = [
  # The one setting read outside the pieces below (each of them reads its own: the
  # idempotency limits, the session log's caps, the PubSub server).
  {"alert source (AlertSource.current)", fn _ -> Observatory.Gateway.AlertSource.current() end},
  {"session ownership (cluster owner, the session's agent)",
   fn {f, _} ->
     Cluster.owner(f.session_id, [])
     SessionOwners.claim(f.session_id, f.agent_id)
   end},
  {"session ownership, the session's last step 5 s before", :aged,
   fn {f, _} ->
     Cluster.owner(f.session_id, [])
     SessionOwners.claim(f.session_id, f.agent_id)
   end},
  {"idempotency (claim + complete)",
   fn {f, _} ->
     {:new, ticket} = Idempotency.claim(f)
     Idempotency.complete(ticket, answer.())
   end},
  {"safety reads (pause, kill switch)",
   fn {f, _} ->
     HITL.pause_of(f.session_id)
     KillSwitch.active?(f.agent_id)
   end},
  {"session log (put_json)", fn {f, json} -> SessionLog.put_json(f.session_id, json, 0.5, 3) end},
  {"broadcast (no subscriber)",
   fn {f, _} -> Events.broadcast_lazy(Events.decision_logs(), fn -> f end) end},
  {"metrics + telemetry",
   fn {f, _} ->
     Metrics.inc(:messages)
     Metrics.inc(:normal)
     Metrics.inc(:verdict_progress)
     Metrics.observe_latency(12)

     Observatory.Telemetry.execute([:observatory, :ingest, :stop], %{duration: 12}, %{
       result: :ok,
       session_id: f.session_id,
       agent_id: f.agent_id
     })
   end}
]

load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg 2>/dev/null") |> to_string() |> String.trim()
IO.puts("1-min load average at the start: #{load}; #{rounds} rounds of #{n} calls\n")
IO.puts("| piece | ns per step (median batch) |\n|---|---:|")

# The aged row is shown beside the others, not summed with them.
sum =
  Enum.reduce(pieces, 0, fn
    {label, :aged, fun}, acc ->
      IO.puts("| (#{label}) | #{round(batch_ns.(aged, fun))} |")
      acc

    {label, fun}, acc ->
      ns = batch_ns.(parsed, fun)
      IO.puts("| #{label} | #{round(ns)} |")
      acc + ns
  end)

IO.puts("| **the pieces above, summed** | **#{round(sum)}** |")

ingest = &SchemaInterceptor.ingest(&1, envelope: false)
new_message = fn -> message.(next.()) end

IO.puts(
  "| whole ingest, no envelope term (as the HTTP API calls it) | " <>
    "#{round(batch_ns.(new_message, ingest))} |"
)

aged_message = fn ->
  i = next.()
  age.("glue-#{rem(i, 1000)}")
  message.(i)
end

IO.puts(
  "| whole ingest, no envelope term, each session's last step 5 s before | " <>
    "#{round(batch_ns.(aged_message, ingest))} |"
)

cpu = fn input -> :erlang.float_to_binary(cpu_ns.(input, ingest) / 1000, decimals: 1) end

IO.puts(
  "\nwhole ingest, no envelope term, VM CPU time per step: #{cpu.(new_message)} µs; " <>
    "each session's last step 5 s before: #{cpu.(aged_message)} µs"
)
