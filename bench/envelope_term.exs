# What the envelope's term costs in the parse NIF: `DecisionLog.parse/2` with the term
# (`envelope: true`, what an in-process caller of SchemaInterceptor.ingest/1 gets) minus
# without it, over bench/breakdown_steps.exs's three sizes and "4 KiB, one line": the
# 4 KiB step with its result's escaped newlines written as spaces, one 3.6 KiB string
# the body holds without escapes (where a sub-binary of the body would save a copy:
# measured, no cheaper, not shipped; docs/ingest-cost.md). 1,000 bodies
# a size, parsed in turn; seven alternated pairs of medians of batches (a batch the
# machine's other work interrupted lands in the slow tail): the least of each side and
# the median of the pairs' differences.
#
#   MIX_ENV=prod mix run --no-start bench/envelope_term.exs
#
# For an A/B, run it alternately in two checkouts built with MIX_ENV=prod.
Code.require_file("breakdown_steps.exs", __DIR__)

alias Observatory.Bench.BreakdownSteps
alias Observatory.Gateway.DecisionLog

:ok = BreakdownSteps.publish(:envelope_term)
batches = 60

bodies = fn
  :one_line ->
    for i <- 0..999,
        do: BreakdownSteps.message(:envelope_term, :large, i, "t-") |> String.replace("\\n", "  ")

  size ->
    for i <- 0..999, do: BreakdownSteps.message(:envelope_term, size, i, "t-")
end

# The median of `batches` passes over the bodies, in ns per parse.
time = fn bodies, term? ->
  passes =
    for _ <- 1..batches do
      t0 = System.monotonic_time(:nanosecond)
      Enum.each(bodies, &DecisionLog.parse(&1, envelope: term?))
      (System.monotonic_time(:nanosecond) - t0) / length(bodies)
    end

  passes |> Enum.sort() |> Enum.at(div(batches, 2))
end

IO.puts(
  "1-min load average at the start: #{File.read!("/proc/loadavg") |> String.split() |> hd()}"
)

IO.puts("| body | no term: ns | with the term: ns | the term: ns (median of 7 pairs) |")
IO.puts("|---|---:|---:|---:|")

for {size, label} <- BreakdownSteps.sizes() ++ [one_line: "4 KiB, one line"] do
  list = bodies.(size)
  pairs = for _ <- 1..7, do: {time.(list, false), time.(list, true)}
  {without, with} = Enum.unzip(pairs)
  diffs = pairs |> Enum.map(fn {f, t} -> t - f end) |> Enum.sort()

  IO.puts(
    "| #{label} | #{round(Enum.min(without))} | #{round(Enum.min(with))} | #{round(Enum.at(diffs, 3))} |"
  )
end
