# The whole ingest as the caches find it in a server: in a loop, with some memory read
# between two steps (what a request's other work — the kernel's TCP path, the HTTP
# handling, other connections — does to the core's caches between two ingests),
# against the same loop with nothing between them.
#
#   MIX_ENV=prod mix run bench/ingest_cold.exs            # ~1 min
#   MIX_ENV=prod mix run bench/ingest_cold.exs -- --quick # ~20 s
#
# The breakdown's 600-byte steps (bench/breakdown_steps.exs: 1,000 sessions, 50
# agents, a fleet at work), ingested as the HTTP API calls it (`envelope: false`).
# Between two steps a binary of N KiB is hashed (`:erlang.phash2/1` reads all of it;
# not timed). A copy would not do: glibc copies large blocks with stores that bypass
# the caches. The sizes alternate round by round; each figure is the median over the
# rounds of the mean wall time of an ingest, timed around the call alone.
Code.require_file("breakdown_steps.exs", __DIR__)

alias Observatory.Bench.BreakdownSteps
alias Observatory.Gateway.SchemaInterceptor

Logger.configure(level: :error)
quick? = "--quick" in System.argv()
{rounds, steps} = if quick?, do: {3, 3_000}, else: {7, 6_000}
evict_kib = [0, 256, 1024, 4096]

:ok = BreakdownSteps.publish(:bench_ingest_cold)
load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg 2>/dev/null") |> to_string() |> String.trim()

IO.puts(
  "schedulers: #{System.schedulers_online()}; 1-min load average at the start: #{load}; " <>
    "#{rounds} rounds of #{steps} steps a size\n"
)

# Every run its own step ids: a step sent again would be answered from memory.
run = fn kib, tag ->
  source = :binary.copy(<<1>>, max(kib, 1) * 1024)
  messages = for i <- 1..steps, do: BreakdownSteps.message(:bench_ingest_cold, :medium, i, tag)

  Task.async(fn ->
    total =
      Enum.reduce(messages, 0, fn message, total ->
        if kib > 0, do: :erlang.phash2(source)
        started = :erlang.monotonic_time(:nanosecond)
        {:ok, _} = SchemaInterceptor.ingest(message, envelope: false)
        total + :erlang.monotonic_time(:nanosecond) - started
      end)

    total / steps
  end)
  |> Task.await(:infinity)
end

# Warm up: the stores filled as on a working gateway.
for round <- 1..2, do: run.(0, "warm#{round}-")

results = for round <- 1..rounds, kib <- evict_kib, do: {kib, run.(kib, "r#{round}-#{kib}-")}

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end
per_size = for kib <- evict_kib, into: %{}, do: {kib, median.(for {^kib, ns} <- results, do: ns)}

IO.puts("""
| memory read between two steps | whole ingest, 600 B, wall ns | × with nothing between |
|---:|---:|---:|\
""")

for kib <- evict_kib do
  IO.puts(
    "| #{kib} KiB | #{round(per_size[kib])} | #{Float.round(per_size[kib] / per_size[0], 2)}× |"
  )
end
