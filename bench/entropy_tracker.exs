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

# The same store call without the three Application.get_env/3 reads FR-9.11 requires
# on every call: shows what the NIF store itself costs (a breakdown, not the API).
store_fun = fn name ->
  store = :persistent_term.get({EntropyTracker, name})

  fn sid, {intent, tool, status} ->
    {:ok, code} = Observatory.Gateway.ActionStatus.to_code(status)

    {_, _, _, _, _} =
      Observatory.Native.entropy_record(store, sid, intent, tool, code, "agent-1", 5, 0.25, 0.5)
  end
end

ref_fun = fn pid ->
  fn sid, tuple -> {:ok, _, _} = ReferenceTracker.record_and_score(pid, sid, tuple) end
end

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
GenServer.stop(tracker)

IO.puts(
  "memory (measured first, in a fresh VM): #{sessions} sessions x 5 tuples: RSS grew " <>
    "#{div(grown, 1024 * 1024)} MiB = #{round(grown / sessions)} bytes/session\n"
)

IO.puts("schedulers: #{System.schedulers_online()}, calls per caller: #{calls_per_caller}\n")

IO.puts(
  "| sessions | callers | record_and_score calls/s | reference calls/s | ratio | store only (no config reads) calls/s | ratio |"
)

IO.puts("|---:|---:|---:|---:|---:|---:|---:|")

for sessions <- [1_000, 100_000], callers <- [1, 2] do
  {name, tracker} = fresh_tracker.()
  nif = run_callers.(callers, sessions, nif_fun.(name))
  GenServer.stop(tracker)
  {name, tracker} = fresh_tracker.()
  bare = run_callers.(callers, sessions, store_fun.(name))
  GenServer.stop(tracker)
  {:ok, ref_pid} = ReferenceTracker.start_link(5)
  ref = run_callers.(callers, sessions, ref_fun.(ref_pid))
  GenServer.stop(ref_pid)

  IO.puts(
    "| #{sessions} | #{callers} | #{round(nif)} | #{round(ref)} | #{Float.round(nif / ref, 1)}× | " <>
      "#{round(bare)} | #{Float.round(bare / ref, 1)}× |"
  )
end

# Median cost of one call: time batches of 100 calls, take the median batch.
median_ns = fn fun, sessions ->
  ids = session_ids.(sessions)
  for i <- 0..(sessions - 1), do: fun.(elem(ids, i), elem(vocab, rem(i, vocab_size)))

  samples =
    for b <- 1..2_000 do
      t0 = System.monotonic_time(:nanosecond)

      for j <- 1..100 do
        k = b * 100 + j
        fun.(elem(ids, rem(k * 7919, sessions)), elem(vocab, rem(k, vocab_size)))
      end

      (System.monotonic_time(:nanosecond) - t0) / 100
    end

  Enum.at(Enum.sort(samples), div(length(samples), 2))
end

IO.puts("\n| median ns per call, 1 caller | record_and_score | store only | reference |")
IO.puts("|---|---:|---:|---:|")

for sessions <- [1_000, 100_000] do
  {name, tracker} = fresh_tracker.()
  full = median_ns.(nif_fun.(name), sessions)
  GenServer.stop(tracker)
  {name, tracker} = fresh_tracker.()
  bare = median_ns.(store_fun.(name), sessions)
  GenServer.stop(tracker)
  {:ok, ref_pid} = ReferenceTracker.start_link(5)
  ref = median_ns.(ref_fun.(ref_pid), sessions)
  GenServer.stop(ref_pid)
  IO.puts("| #{sessions} sessions | #{round(full)} | #{round(bare)} | #{round(ref)} |")
end

# What FR-9.11's per-call configuration read costs on this machine.
{micros, _} =
  :timer.tc(fn -> for _ <- 1..200_000, do: Observatory.Gateway.EntropyConfig.read() end)

IO.puts(
  "\nEntropyConfig.read/0 (three Application.get_env/3): #{round(micros * 1000 / 200_000)} ns"
)
