# What the ingest's two synchronous stores (besides the detectors) cost per step: the
# idempotency claim + complete and the session log's put_json/4, each in the cases a
# gateway meets — the store not yet full and full (every claim evicting the oldest
# step), a session's log ring not yet full (its first steps) and full — and, beside
# them, the pieces each is made of (settings, clocks, ETS operations).
#
#   MIX_ENV=prod mix run bench/store_cost.exs             # ~1 min
#   MIX_ENV=prod mix run bench/store_cost.exs -- --quick  # ~20 s
#
# The ~600-byte step of bench/ingest_breakdown.exs, 1,000 sessions, 50 agents, every
# step a new one. Each row in wall time, the median batch of 20 calls, and in the VM's
# CPU time (:erlang.statistics(:runtime): other programs on the machine are not
# counted, the VM's idle schedulers spinning are), the median round; the rows of a
# round run one after the other, the rounds repeat them. The rows "each batch parsed
# just before" are the breakdown's case (bench/ingest_breakdown.exs): the stores'
# rows cold in the caches, as in an ingest, where the step's parse comes first. Only public calls that every version
# of the two stores has: run the same script on two builds, alternately, to compare
# them.
alias Observatory.Gateway.{DecisionLog, Idempotency, SessionLog}

Logger.configure(level: :error)
{rounds, n} = if "--quick" in System.argv(), do: {5, 10_000}, else: {9, 20_000}

Code.require_file("glue_step.exs", __DIR__)

json = fn i, session ->
  Observatory.Bench.GlueStep.file_read(
    %{
      "step_id" => "st-#{i}-#{System.unique_integer([:positive])}",
      "session_id" => session,
      "agent_id" => "agent-#{rem(i, 50)}",
      "parent_step_id" => "step-#{i - 1}",
      "timestamp" => "2026-02-22T10:30:00.123Z"
    },
    i
  )
end

# n parsed steps over 1,000 sessions named by `prefix`: {fields, json}.
steps = fn prefix ->
  for i <- 0..(n - 1) do
    text = json.(i, "#{prefix}-#{rem(i, 1000)}")
    {:ok, _envelope, fields} = DecisionLog.parse(text, envelope: false)
    {fields, text}
  end
end

# What a retry is answered from, as the ingest keeps it.
answer =
  {0.81, :normal, {:loop_verdict, :progress, :progress, nil, "no repetition", [], 17},
   {:step_verdict, :full_progress, 0, 0, :continue, nil}}

claim_complete = fn {f, _} ->
  {:new, ticket} = Idempotency.claim(f)
  Idempotency.complete(ticket, answer)
end

# Per call of `fun` over `inputs`: the wall ns of each batch of 20 calls (a batch
# that other programs interrupted lands in the slow tail, not the median), and the
# VM's CPU ns over them all.
# With `cold`, each batch's steps are parsed again just before it, as the ingest
# parses a step just before it stores it: the stores' rows are no longer in the
# caches the parse used (the breakdown's case); the parse's time is not counted.
time = fn inputs, fun, cold ->
  {_, _} = :erlang.statistics(:runtime)

  batches =
    for batch <- Enum.chunk_every(inputs, 20) do
      if cold, do: Enum.each(batch, fn {_, text} -> DecisionLog.parse(text) end)
      t0 = System.monotonic_time(:nanosecond)
      Enum.each(batch, fun)
      (System.monotonic_time(:nanosecond) - t0) / length(batch)
    end

  {_, ms} = :erlang.statistics(:runtime)
  {batches, if(cold, do: nil, else: ms * 1_000_000 / length(inputs))}
end

# The whole store emptied (every step forgotten) before a round of `inputs`.
forget_all = fn -> Idempotency.sweep(-1) end

# The store at its cap (`max_steps`, 100,000 by default) before a round: every claim
# of the round evicts the oldest step.
fill = fn ->
  forget_all.()
  cap = Idempotency.settings()[:max_steps]

  for i <- 1..cap do
    f = %{
      session_id: "fill-#{rem(i, 1000)}",
      step_id: "f#{i}",
      agent_id: "agent-#{rem(i, 50)}",
      fingerprint: <<i::128>>
    }

    claim_complete.({f, nil})
  end
end

rows = [
  {"idempotency claim + complete, the store not full (no eviction)", forget_all,
   fn r -> steps.("idem-a#{r}") end, claim_complete},
  {"idempotency claim + complete, the store full (each claim evicts the oldest)", fill,
   fn r -> steps.("idem-b#{r}") end, claim_complete},
  {"idempotency claim + complete, store full, each batch parsed just before", fill,
   {:cold, fn r -> steps.("idem-c#{r}") end}, claim_complete},
  {"  term_to_binary of the answer", nil, fn _ -> List.duplicate(answer, n) end,
   &:erlang.term_to_binary/1},
  {"  the :idempotency setting and the clock", nil, fn _ -> List.duplicate(0, n) end,
   fn _ ->
     Application.get_env(:observatory, :idempotency, [])
     :erlang.monotonic_time(:millisecond)
   end},
  # Each round its own sessions: 20 steps of each of 1,000 new sessions fill their
  # rings (:session_log_size, 20) in the round's second half.
  {"session log put_json, a session's first steps (ring not full)", nil,
   fn r -> steps.("log-a#{r}") |> Enum.take(div(n, 2)) end,
   fn {f, text} -> SessionLog.put_json(f.session_id, text, 0.5, 3) end},
  {"session log put_json, rings full (a session's 21st step on)", nil,
   fn r ->
     inputs = steps.("log-b#{r}")
     for _ <- 1..2, {f, text} <- inputs, do: SessionLog.put_json(f.session_id, text, 0.5, 3)
     inputs
   end, fn {f, text} -> SessionLog.put_json(f.session_id, text, 0.5, 3) end},
  {"session log put_json, rings full, each batch parsed just before", nil,
   {:cold,
    fn r ->
      inputs = steps.("log-c#{r}")
      for _ <- 1..2, {f, text} <- inputs, do: SessionLog.put_json(f.session_id, text, 0.5, 3)
      inputs
    end}, fn {f, text} -> SessionLog.put_json(f.session_id, text, 0.5, 3) end},
  {"  the three caps (application-environment reads)", nil, fn _ -> List.duplicate(0, n) end,
   fn _ ->
     Application.get_env(:observatory, :session_log_size, 20)
     Application.get_env(:observatory, :session_log_max_envelope_bytes, 16_384)
     Application.get_env(:observatory, :session_log_max_bytes, 268_435_456)
   end},
  {"  the clocks (system_time, unique_integer)", nil, fn _ -> List.duplicate(0, n) end,
   fn _ ->
     System.system_time(:millisecond)
     System.unique_integer([:monotonic, :positive])
   end},
  {"  the store's lookup (NativeStores.get/2)", nil, fn _ -> List.duplicate(0, n) end,
   fn _ -> Observatory.NativeStores.get(SessionLog, nil) end}
]

load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg") |> to_string() |> String.trim()
IO.puts("1-min load average at the start: #{load}; #{rounds} rounds of #{n} calls\n")

samples =
  Enum.reduce(1..rounds, %{}, fn r, acc ->
    Enum.reduce(rows, acc, fn {label, before, inputs, fun}, acc ->
      {cold, inputs} =
        case inputs do
          {:cold, make} -> {true, make.(r)}
          make -> {false, make.(r)}
        end

      if before, do: before.()
      :erlang.garbage_collect()
      {batches, cpu} = time.(inputs, fun, cold)
      Map.update(acc, label, {batches, [cpu]}, fn {b, c} -> {batches ++ b, [cpu | c]} end)
    end)
  end)

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) |> round() end

IO.puts("| what | ns per call (median batch of 20) | CPU ns per call (median round) |")
IO.puts("|---|---:|---:|")

for {label, _, _, _} <- rows do
  {batches, cpu} = samples[label]
  cpu = if Enum.any?(cpu, &is_nil/1), do: "", else: median.(cpu)
  IO.puts("| #{label} | #{median.(batches)} | #{cpu} |")
end
