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
        do: Native.session_log_put_json(store, "fill-#{i}", json, 0.5, nil, {20, 1 <<< 40})
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
