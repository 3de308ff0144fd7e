# What the session log's put costs, taken apart: SessionLog.put/3 for a ~600-byte
# step's envelope, and each thing it does alone (the settings it reads, measuring the
# envelope, the head's counter, copying the envelope into ETS); and
# SessionLog.put_json/4, which the ingest calls: the step kept as its JSON text.
#
#   MIX_ENV=prod mix run bench/session_log_cost.exs             # ~30 s
#   MIX_ENV=prod mix run bench/session_log_cost.exs -- --quick
#
# Then, where the log is a Rust store (Observatory.Native.session_log_trim/4), how
# long its trim's and sweep's calls take: 100,000 sessions of two 600-byte steps
# each, and 768 sessions of twenty 16 KB steps, dropped chunk by chunk (a budget of
# 2,048 a call, as the SessionLog process calls it), each call timed (wall time:
# a call preempted by another program counts whole); the longest must stay well
# under 1 ms.
#
# 1,000 sessions. VM CPU time per call (:erlang.statistics(:runtime)), the median of
# the rounds, as bench/scoring_cost.exs measures.
#
# Then put_json/4 into full rings, as the ingest writes a session's step over the one
# its ring held 20 steps before (memory the caches no longer hold), in two cases: each
# text a few bytes longer than the one its slot holds (an id with one more digit; the
# case of bench/ingest_breakdown.exs, whose warm-up steps are a few bytes shorter
# than its timed ones), and lengths fluctuating by up to 150 bytes (the slots' buffers
# settled). Wall ns, the median batch of 20.
import Bitwise
alias Observatory.Gateway.{DecisionLog, SessionLog}

Logger.configure(level: :error)
{rounds, n} = if "--quick" in System.argv(), do: {3, 10_000}, else: {7, 40_000}

Code.require_file("glue_step.exs", __DIR__)

envelopes =
  for i <- 0..(n - 1) do
    json =
      Observatory.Bench.GlueStep.file_read(
        %{
          "step_id" => "step-#{i}",
          "session_id" => "sess-#{rem(i, 1000)}",
          "agent_id" => "agent-#{rem(i, 50)}",
          "timestamp" => "2026-02-22T10:30:00.123Z"
        },
        i
      )

    {:ok, envelope, fields} = DecisionLog.parse(json)
    {fields.session_id, envelope, json}
  end
  |> List.to_tuple()

cpu_ns = fn fun ->
  samples =
    for _ <- 1..rounds do
      {_, _} = :erlang.statistics(:runtime)
      for i <- 0..(n - 1), do: fun.(elem(envelopes, i))
      {_, ms} = :erlang.statistics(:runtime)
      ms * 1_000_000 / n
    end

  samples |> Enum.sort() |> Enum.at(div(rounds, 2)) |> round()
end

scratch = :ets.new(:bench_slots, [:public, :set, write_concurrency: true, read_concurrency: true])

rows = [
  {"SessionLog.put_json/4 (the step as its text: what the ingest calls)",
   fn {sid, _, json} -> SessionLog.put_json(sid, json, 0.5, nil) end},
  {"SessionLog.put/3, the whole (the step as its term)",
   fn {sid, e, _} -> SessionLog.put(sid, e, nil) end},
  {"  its settings (3 application-environment reads)",
   fn _ ->
     Application.get_env(:observatory, :session_log_size, 20)
     Application.get_env(:observatory, :session_log_max_envelope_bytes, 16_384)
     Application.get_env(:observatory, :session_log_max_bytes, 268_435_456)
   end},
  {"  measuring the envelope (:erlang.external_size/1)",
   fn {_, e, _} -> :erlang.external_size(e) end},
  {"  copying the envelope into an ETS table",
   fn {sid, e, _} -> :ets.insert(scratch, {{sid, 1}, e}) end},
  {"  clocks and the unique order (system_time, unique_integer)",
   fn _ ->
     System.system_time(:millisecond)
     System.unique_integer([:monotonic, :positive])
   end}
]

for _ <- 1..2,
    i <- 0..(n - 1),
    do: SessionLog.put(elem(elem(envelopes, i), 0), elem(elem(envelopes, i), 1), nil)

load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg") |> to_string() |> String.trim()
IO.puts("1-min load average at the start: #{load}; #{n} puts a round, #{rounds} rounds\n")
IO.puts("| what | CPU ns per step |\n|---|---:|")
for {label, fun} <- rows, do: IO.puts("| #{label} | #{cpu_ns.(fun)} |")

# Full rings, texts of about `bytes` bytes: a lap fills fresh sessions' rings with
# texts `grow` bytes shorter than the timed ones (or as long, fluctuating), then
# times a step a session, each batch of 20 made just before it.
ring_case = fn bytes, grow, laps ->
  sessions = 250

  text = fn sid, n, extra ->
    pad = String.duplicate("x", bytes - 60 + extra)

    IO.iodata_to_binary([
      ~s({"meta":{"session_id":"),
      sid,
      ~s("},"n":),
      Integer.to_string(n),
      ~s(,"pad":"),
      pad,
      ~s("})
    ])
  end

  wobble = fn n -> if grow == 0, do: rem(n * 7919, 150), else: 0 end

  for lap <- 1..laps do
    ids = for s <- 1..sessions, do: "ring-#{bytes}-#{grow}-#{lap}-#{s}"
    # Fluctuating: the rings go round a few times before the timing, as a long session's.
    fills = if grow == 0, do: 60, else: 20
    for n <- 1..fills, sid <- ids, do: SessionLog.put_json(sid, text.(sid, n, wobble.(n)), 0.5)

    for chunk <- Enum.chunk_every(ids, 20) do
      inputs = for sid <- chunk, do: {sid, text.(sid, 99, grow + wobble.(99 + byte_size(sid)))}
      t0 = System.monotonic_time(:nanosecond)
      Enum.each(inputs, fn {sid, json} -> SessionLog.put_json(sid, json, 0.5) end)
      (System.monotonic_time(:nanosecond) - t0) / length(inputs)
    end
  end
  |> List.flatten()
  |> Enum.sort()
  |> then(&Enum.at(&1, div(length(&1), 2)))
  |> round()
end

laps = if "--quick" in System.argv(), do: 4, else: 12

IO.puts(
  "\n| put_json/4 into full rings, wall ns (median batch of 20) | 600 B | 4 KiB |\n|---|---:|---:|"
)

for {label, grow} <- [
      {"each text 8 bytes longer than the one its slot holds", 8},
      {"lengths fluctuating by up to 150 bytes", 0}
    ] do
  IO.puts("| #{label} | #{ring_case.(700, grow, laps)} | #{ring_case.(4_200, grow, laps)} |")
end

if function_exported?(Observatory.Native, :session_log_trim, 4) do
  alias Observatory.Native
  store = Native.session_log_new()
  {_, _, json} = elem(envelopes, 0)

  chunk_calls = fn drop ->
    Stream.repeatedly(fn -> :timer.tc(drop) end)
    |> Enum.reduce_while([], fn {us, {_, done}}, acc ->
      if done, do: {:halt, [us | acc]}, else: {:cont, [us | acc]}
    end)
    |> Enum.sort()
  end

  fill = fn sessions, steps, json ->
    for i <- 1..sessions,
        _ <- 1..steps,
        do: Native.session_log_put_json(store, "fill-#{i}", json, 0.5, nil, {20, 1 <<< 40}, nil)
  end

  report = fn label, times ->
    IO.puts(
      "| #{label} | #{length(times)} | #{Enum.at(times, div(length(times), 2))} | #{List.last(times)} |"
    )
  end

  big = String.duplicate("x", 16_000)
  IO.puts("\n| dropped, a budget of 2,048 a call | calls | median µs a call | longest µs |")
  IO.puts("|---|---:|---:|---:|")
  fill.(100_000, 2, json)

  report.(
    "trim of 100,000 sessions of 2 steps",
    chunk_calls.(fn -> Native.session_log_trim(store, 0, 0, 2048) end)
  )

  fill.(100_000, 2, json)

  report.(
    "idle sweep of the same",
    chunk_calls.(fn -> Native.session_log_sweep(store, 1 <<< 60, 2048) end)
  )

  fill.(768, 20, big)

  report.(
    "trim of 768 sessions of 20 × 16 KB",
    chunk_calls.(fn -> Native.session_log_trim(store, 0, 0, 2048) end)
  )
end
