# Replay throughput: flat step records through Observatory.Replay (the gateway's
# ingest path: validation, EntropyTracker, StepDetector), with two references from
# the same run: reading and decoding the lines alone, and the gateway's own
# SchemaInterceptor.ingest/2 on envelopes already in memory.
#
#   MIX_ENV=prod mix run --no-start bench/replay.exs             # 200k steps, best of 3 rounds
#   MIX_ENV=prod mix run --no-start bench/replay.exs -- --quick  # 50k steps, 1 round
#   MIX_ENV=prod mix run --no-start bench/replay.exs -- --real-runs ../shared/datasets/real_runs/steps.jsonl.gz
#
# The records come from Observatory.Replay.ExampleDataset (healthy and looping
# sessions, ~350 bytes a line) written to a temporary file. Every run gets its own
# copy with its own session ids, so no run continues another's sessions. Other work
# on the machine lowers the figures: the load average is printed with them.
alias Observatory.Gateway.SchemaInterceptor
alias Observatory.Replay
alias Observatory.Replay.{ExampleDataset, Input, Record}

Application.put_env(:observatory, ObservatoryWeb.Endpoint, server: false)
Application.put_env(:observatory, :demo, false)
# As mix observatory.replay does: nothing reads the session log.
Application.put_env(:observatory, :session_log_size, 1)
{:ok, _} = Application.ensure_all_started(:observatory)
Logger.configure(level: :error)

quick? = "--quick" in System.argv()
target = if quick?, do: 50_000, else: 200_000
rounds = if quick?, do: 1, else: 3
dir = Path.join(System.tmp_dir!(), "observatory_replay_bench_#{System.os_time()}")
File.mkdir_p!(dir)

# ~230 flat steps per scale unit (12 sessions). "P0-" is replaced per run.
scale = div(target, 230) + 1

# -- --real-runs PATH: a recorded corpus (flat records, .jsonl or .jsonl.gz) instead,
# e.g. ../shared/datasets/real_runs/steps.jsonl.gz (18,544 steps, ~570 bytes a line).
{opts, _, _} =
  OptionParser.parse(System.argv() -- ["--"], strict: [real_runs: :string, quick: :boolean])

{lines, sessions} =
  case opts[:real_runs] do
    nil ->
      {ExampleDataset.lines(scale: scale, prefix: "P0-", bad_lines: false, envelopes: false),
       12 * scale}

    path ->
      text = File.read!(path)
      text = if String.ends_with?(path, ".gz"), do: :zlib.gunzip(text), else: text
      # Each run's own session ids: "P0-" before every one, replaced per run.
      text = :binary.replace(text, ~s("session_id": "), ~s("session_id": "P0-), [:global])
      lines = String.split(text, "\n", trim: true)
      ids = Enum.uniq(Enum.map(lines, &hd(Regex.run(~r/"session_id": "([^"]*)"/, &1))))
      {lines, length(ids)}
  end

data = IO.iodata_to_binary(Enum.map(lines, &[&1, ?\n]))
n = length(lines)
# Every run below happens in a process of its own, as the mix task's would: a caller
# holding this list (200k binaries) would slow its own garbage collections.
lines = nil
_ = lines

copy = fn run ->
  path = Path.join(dir, "#{run}.jsonl")
  File.write!(path, :binary.replace(data, "P0-", "#{run}-", [:global]))
  path
end

load =
  case :os.cmd(~c"cat /proc/loadavg 2>/dev/null") |> to_string() |> Float.parse() do
    {load, _} -> load
    :error -> "n/a"
  end

IO.puts(
  "#{n} flat records in #{sessions} sessions, #{div(byte_size(data), n)} bytes a line, " <>
    "#{Float.round(byte_size(data) / 1_048_576, 1)} MiB; schedulers: #{System.schedulers_online()}; " <>
    "1-min load average (this run's setup included): #{load}\n"
)

defmodule Bench do
  # Reading and decoding every line, nothing else: the floor of any replay.
  def read_and_decode(path) do
    path
    |> Input.chunks()
    |> Enum.reduce(0, fn {:lines, lines, _}, count ->
      Enum.reduce(lines, count, fn {_n, line}, count ->
        {:ok, %{}} = Observatory.JSON.decode(line)
        count + 1
      end)
    end)
  end

  # The envelopes replay would send, built before the clock starts, split by session
  # the way the replay's workers split them: one ETS table per part, so the processes
  # that ingest them do not carry 100k binaries on their heaps (their collector would
  # copy them again and again, and the reference would be slower than it is).
  def envelopes(path, parts) do
    tables = for _ <- 1..parts, do: :ets.new(:envelopes, [:set, :public, read_concurrency: true])

    path
    |> Input.lines()
    |> Enum.reduce(%{}, fn {_n, line}, counts ->
      {:flat, sid, head, tail} = Record.read(line, "2026-02-22T10:30:00Z")
      count = Map.get(counts, sid, 0) + 1
      table = Enum.at(tables, :erlang.phash2(sid, parts))
      :ets.insert(table, {:ets.info(table, :size), Record.envelope_json(head, tail, count)})
      Map.put(counts, sid, count)
    end)

    tables
  end

  # SchemaInterceptor.ingest/2 alone, one process per part.
  def ingest(tables) do
    tables
    |> Enum.map(fn table ->
      Task.async(fn -> ingest(table, 0, :ets.info(table, :size)) end)
    end)
    |> Enum.each(&Task.await(&1, :infinity))

    Enum.each(tables, &:ets.delete/1)
  end

  defp ingest(_table, n, n), do: :ok

  defp ingest(table, i, n) do
    {:ok, _} = SchemaInterceptor.ingest(:ets.lookup_element(table, i, 2))
    ingest(table, i + 1, n)
  end
end

rate = fn micros -> n / (micros / 1_000_000) end
base_path = copy.("base")

# Each round runs every configuration once, so a burst of other work on the machine
# slows all of them alike; each keeps its best round.
configs = [
  {"read + JSON decode only (baseline)", fn _ -> base_path end,
   fn path -> ^n = Bench.read_and_decode(path) end},
  {"gateway alone: SchemaInterceptor.ingest/2 on envelopes in memory, 1 process",
   fn round -> Bench.envelopes(copy.("g1r#{round}"), 1) end, &Bench.ingest/1},
  {"gateway alone: the same, 2 processes (sessions split as replay splits them)",
   fn round -> Bench.envelopes(copy.("g2r#{round}"), 2) end, &Bench.ingest/1},
  {"replay of the file, 1 worker", fn round -> copy.("w1r#{round}") end,
   fn path -> ^n = Replay.run([path], workers: 1).steps end},
  {"replay of the file, 2 workers", fn round -> copy.("w2r#{round}") end,
   fn path -> ^n = Replay.run([path], workers: 2).steps end}
]

best =
  for round <- 1..rounds, {label, setup, run} <- configs, reduce: %{} do
    best ->
      input = setup.(round)

      micros =
        Task.async(fn -> :timer.tc(fn -> run.(input) end) end)
        |> Task.await(:infinity)
        |> elem(0)

      Map.update(best, label, micros, &min(&1, micros))
  end

baseline = rate.(best["read + JSON decode only (baseline)"])
IO.puts("best of #{rounds} rounds\n")
IO.puts("| run | steps/s | vs read + decode |")
IO.puts("|---|---:|---:|")

for {label, _, _} <- configs do
  r = rate.(best[label])
  IO.puts("| #{label} | #{round(r)} | #{Float.round(r / baseline * 100, 1)}% |")
end

File.rm_rf!(dir)
