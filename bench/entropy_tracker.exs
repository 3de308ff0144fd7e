# EntropyTracker.record_and_score/3 (Rust NIF store, called in the caller's process)
# against the plain-Elixir reference (bench/reference_tracker.exs), in one run.
#
#   MIX_ENV=prod mix run bench/entropy_tracker.exs            # full run (~2 min)
#   MIX_ENV=prod mix run bench/entropy_tracker.exs -- --quick # smaller, for a smoke test
#
# Reports throughput for 1 and 2 concurrent callers over 1k and 100k sessions, the
# median cost of one call with one caller, and memory per session with 1M sessions.
Code.require_file("reference_tracker.exs", __DIR__)

alias Observatory.Bench.ReferenceTracker
alias Observatory.Gateway.EntropyTracker

Logger.configure(level: :error)
quick? = "--quick" in System.argv()
calls_per_caller = if quick?, do: 100_000, else: 1_000_000
memory_sessions = if quick?, do: 100_000, else: 1_000_000

intents = ~w(search plan execute summarize)
tools = ~w(read_file write_file list_files run_shell grep http_get sql edit)
statuses = [:success, :failure, :pending]

# A fixed vocabulary of tuples, indexed by a counter: realistic fleet traffic.
vocab =
  for(i <- intents, t <- tools, s <- statuses, do: {i, t, s})
  |> List.to_tuple()

vocab_size = tuple_size(vocab)
session_ids = fn n -> for(i <- 0..(n - 1), do: "sess-#{i}") |> List.to_tuple() end

run_callers = fn callers, sessions, fun ->
  ids = session_ids.(sessions)
  # Warm up: give every session a window first.
  for i <- 0..(sessions - 1), do: fun.(elem(ids, i), elem(vocab, rem(i, vocab_size)))
  parent = self()

  {micros, _} =
    :timer.tc(fn ->
      pids =
        for c <- 1..callers do
          spawn_link(fn ->
            Enum.each(1..calls_per_caller, fn n ->
              k = n * 7919 + c
              fun.(elem(ids, rem(k, sessions)), elem(vocab, rem(k, vocab_size)))
            end)

            send(parent, {:done, self()})
          end)
        end

      for pid <- pids, do: receive(do: ({:done, ^pid} -> :ok))
    end)

  callers * calls_per_caller / (micros / 1_000_000)
end

fresh_tracker = fn ->
  name = :"bench_tracker_#{System.unique_integer([:positive])}"
  {:ok, pid} = EntropyTracker.start_link(name: name, max_sessions: 2_000_000)
  {name, pid}
end

nif_fun = fn name ->
  opts = [tracker: name, agent_id: "agent-1"]
  fn sid, tuple -> {:ok, _, _} = EntropyTracker.record_and_score(sid, tuple, opts) end
end

ref_fun = fn pid ->
  fn sid, tuple -> {:ok, _, _} = ReferenceTracker.record_and_score(pid, sid, tuple) end
end

IO.puts("schedulers: #{System.schedulers_online()}, calls per caller: #{calls_per_caller}\n")
IO.puts("| sessions | callers | EntropyTracker calls/s | reference calls/s | ratio |")
IO.puts("|---:|---:|---:|---:|---:|")

for sessions <- [1_000, 100_000], callers <- [1, 2] do
  {name, tracker} = fresh_tracker.()
  nif = run_callers.(callers, sessions, nif_fun.(name))
  GenServer.stop(tracker)
  {:ok, ref_pid} = ReferenceTracker.start_link(5)
  ref = run_callers.(callers, sessions, ref_fun.(ref_pid))
  GenServer.stop(ref_pid)

  IO.puts(
    "| #{sessions} | #{callers} | #{round(nif)} | #{round(ref)} | #{Float.round(nif / ref, 1)}× |"
  )
end

# Median cost of one call: time batches of 100 calls, take the median batch.
median_ns = fn fun ->
  ids = session_ids.(100_000)
  for i <- 0..99_999, do: fun.(elem(ids, i), elem(vocab, rem(i, vocab_size)))

  samples =
    for b <- 1..2_000 do
      t0 = System.monotonic_time(:nanosecond)

      for j <- 1..100 do
        k = b * 100 + j
        fun.(elem(ids, rem(k * 7919, 100_000)), elem(vocab, rem(k, vocab_size)))
      end

      (System.monotonic_time(:nanosecond) - t0) / 100
    end

  Enum.at(Enum.sort(samples), div(length(samples), 2))
end

{name, tracker} = fresh_tracker.()
nif_median = median_ns.(nif_fun.(name))
GenServer.stop(tracker)
{:ok, ref_pid} = ReferenceTracker.start_link(5)
ref_median = median_ns.(ref_fun.(ref_pid))

IO.puts(
  "\nmedian per call, 1 caller, 100k sessions: EntropyTracker #{round(nif_median)} ns, " <>
    "reference #{round(ref_median)} ns (#{Float.round(ref_median / nif_median, 1)}× faster)"
)

GenServer.stop(ref_pid)

# Memory: resident set size growth while filling 1M sessions with 5 tuples each.
rss_bytes = fn ->
  [kb] =
    Regex.run(~r/VmRSS:\s+(\d+) kB/, File.read!("/proc/self/status"), capture: :all_but_first)

  String.to_integer(kb) * 1024
end

:erlang.garbage_collect()
before = rss_bytes.()
{name, tracker} = fresh_tracker.()
opts = [tracker: name, agent_id: "agent-1"]

for s <- 0..(memory_sessions - 1), k <- 0..4 do
  sid = "sess-#{s}"
  EntropyTracker.record_and_score(sid, elem(vocab, rem(s * 5 + k, vocab_size)), opts)
end

:erlang.garbage_collect()
grown = rss_bytes.() - before
sessions = EntropyTracker.stats(tracker: name).sessions
_ = tracker

IO.puts(
  "memory: #{sessions} sessions x 5 tuples: RSS grew #{div(grown, 1024 * 1024)} MiB = " <>
    "#{round(grown / sessions)} bytes/session"
)
