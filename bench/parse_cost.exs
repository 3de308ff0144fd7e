# The parse NIF alone, as the HTTP API calls it: `DecisionLog.parse(json, envelope:
# false)` over the ~600-byte step of bench/glue_step.exs and its small and 4 KiB
# variants (the result cut to a two-field map, or 42 lines instead of 3): 200 bodies,
# each with its own step id, built before the clock starts and parsed in turn (they
# stay in the caches, as a body just read from its socket is). Per size: rounds of
# `calls` parses, timed in the VM's CPU time (:erlang.statistics(:runtime): a loaded
# machine's preemptions do not count) and in wall time; the medians of the rounds.
#
#   MIX_ENV=prod mix run --no-start bench/parse_cost.exs            # 7 rounds of 50,000
#   MIX_ENV=prod mix run --no-start bench/parse_cost.exs -- --quick # 5 rounds of 20,000
#
# For an A/B, run it alternately in two checkouts built with MIX_ENV=prod.

Code.require_file("glue_step.exs", __DIR__)

alias Observatory.Bench.GlueStep
alias Observatory.Gateway.DecisionLog

Logger.configure(level: :error)
quick? = "--quick" in System.argv()
{rounds, calls} = if quick?, do: {5, 20_000}, else: {7, 50_000}

line =
  "  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\n"

# The 600 B step's result swapped for another size's (the rest byte for byte the same).
resize = fn json, size ->
  {:ok, envelope} = Observatory.JSON.decode(json)
  %{"meta" => %{"step_id" => id}} = envelope

  result =
    case size do
      :small -> %{"bytes" => 1024, "etag" => id}
      :"600 B" -> envelope["action"]["result"]
      :"4 KiB" -> %{"content" => "# #{id}\n" <> String.duplicate(line, 42), "lines" => 43}
    end

  Observatory.JSON.encode!(put_in(envelope, ["action", "result"], result))
end

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end

IO.puts("DecisionLog.parse(json, envelope: false): #{rounds} rounds of #{calls} calls")
IO.puts("| size | bytes | CPU ns a call (median) | wall ns a call (median) |")
IO.puts("|---|---:|---:|---:|")

for size <- [:small, :"600 B", :"4 KiB"] do
  bodies = for i <- 1..200, do: resize.(GlueStep.message(i, "p"), size)
  {:ok, nil, _} = DecisionLog.parse(hd(bodies), envelope: false)

  times =
    for _ <- 1..rounds do
      :erlang.garbage_collect()
      {_, _} = :erlang.statistics(:runtime)
      t0 = System.monotonic_time(:nanosecond)

      for _ <- 1..div(calls, 200),
          do: Enum.each(bodies, &DecisionLog.parse(&1, envelope: false))

      wall = System.monotonic_time(:nanosecond) - t0
      {_, ms} = :erlang.statistics(:runtime)
      {ms * 1_000_000 / calls, wall / calls}
    end

  cpu = median.(Enum.map(times, &elem(&1, 0)))
  wall = median.(Enum.map(times, &elem(&1, 1)))
  IO.puts("| #{size} | #{byte_size(hd(bodies))} | #{round(cpu)} | #{round(wall)} |")
end
