# The ingest's scoring stage as bench/ingest_breakdown.exs times it — each batch of 20
# steps parsed just before it is scored, so that the sessions' state is as cold as it is
# in a gateway that parses, logs and answers between two steps of a session — alone, by
# step size, with more batches than the breakdown gives it (its row at 1 caller, with
# less spread); the stage's NIF call alone (`Native.score_step/7`, its arguments built
# before the clock starts, as `StepScore.score/3` builds them); and each size's steps
# scored after steps of another size were parsed: what of a step's size reaches the
# scoring.
#
#   MIX_ENV=prod mix run bench/scoring_cold.exs             # ~30 s
#   MIX_ENV=prod mix run bench/scoring_cold.exs -- 40       # rounds (default 20)
#
# Prints a table of the median batch of 20 (wall ns a step), each case's batches
# spread over the rounds, the cases alternated in each round.
# 1,000 sessions a size, 50 agents, every step a new one (bench/ingest_breakdown.exs's
# steps and its warm-up: a fleet at work, no alert, no verdict, no block).
Code.require_file("breakdown_steps.exs", __DIR__)

alias Observatory.Bench.BreakdownSteps
alias Observatory.Gateway.{DecisionLog, SchemaInterceptor}

Logger.configure(level: :error)

rounds =
  case System.argv() -- ["--"] do
    [r | _] -> String.to_integer(r)
    [] -> 20
  end

sizes = BreakdownSteps.sizes()
:ok = BreakdownSteps.publish(:bench_scoring_cold)
message = &BreakdownSteps.message(:bench_scoring_cold, &1, &2, &3)

for a <- 0..49, do: {:ok, _} = Observatory.KillSwitch.Agents.fetch_or_register("agent-#{a}")

for {size, _} <- sizes,
    n <- 0..(BreakdownSteps.templates() * 2),
    do: SchemaInterceptor.ingest(message.(size, n, "warm-"))

fresh = fn -> "r#{System.unique_integer([:positive])}-" end
counter = :atomics.new(1, [])

# As the breakdown's scoring row: the stage, its answers settled.
score = fn {_e, f} -> BreakdownSteps.score_and_settle(f) end

nif = fn args -> apply(Observatory.Native, :score_step, args) end

# `batches` batches of 20 steps of `size`, each batch parsed just before it is timed
# and then, when `other` is given, 20 steps of size `other` parsed too (not scored):
# wall ns a step, each batch. `what`: the stage, or its NIF call alone; `:fresh`: the
# stage, each step scored right after its own parse, as the ingest scores it (each
# call timed alone, the clock's own cost included).
run = fn
  :fresh, size, nil, batches ->
    for _ <- 1..batches do
      ns =
        for _ <- 1..20, reduce: 0 do
          acc ->
            n = :atomics.add_get(counter, 1, 1)
            {:ok, envelope, fields} = DecisionLog.parse(message.(size, n, fresh.()))
            t0 = System.monotonic_time(:nanosecond)
            score.({envelope, fields})
            acc + System.monotonic_time(:nanosecond) - t0
        end

      ns / 20
    end

  what, size, other, batches ->
    for _ <- 1..batches do
      inputs =
        for _ <- 1..20 do
          n = :atomics.add_get(counter, 1, 1)
          {:ok, envelope, fields} = DecisionLog.parse(message.(size, n, fresh.()))
          if what == :nif, do: BreakdownSteps.score_step_args(fields), else: {envelope, fields}
        end

      if other, do: for(j <- 1..20, do: DecisionLog.parse(message.(other, j, fresh.())))
      fun = if what == :nif, do: nif, else: score
      t0 = System.monotonic_time(:nanosecond)
      Enum.each(inputs, fun)
      (System.monotonic_time(:nanosecond) - t0) / 20
    end
end

cases =
  for(size <- [:small, :medium, :large], what <- [:stage, :nif, :fresh], do: {what, size, nil}) ++
    [{:stage, :medium, :large}, {:stage, :large, :small}]

label = fn
  {:nif, size, nil} ->
    "#{Keyword.fetch!(sizes, size)}: the NIF call alone"

  {:fresh, size, nil} ->
    "#{Keyword.fetch!(sizes, size)}: each step right after its own parse"

  {:stage, size, nil} ->
    Keyword.fetch!(sizes, size)

  {_, size, other} ->
    "#{Keyword.fetch!(sizes, size)}, then #{Keyword.fetch!(sizes, other)} parsed"
end

load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg") |> to_string() |> String.trim()

results =
  Enum.reduce(1..rounds, %{}, fn _, acc ->
    Enum.reduce(cases, acc, fn {what, size, other} = c, acc ->
      samples = run.(what, size, other, 100)
      Map.update(acc, c, samples, &(&1 ++ samples))
    end)
  end)

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end
IO.puts("1-min load average at the start: #{load}; #{rounds} rounds of 100 batches of 20 a row\n")

IO.puts("| scoring stage, steps parsed just before | wall ns a step, median batch of 20 |")
IO.puts("|---|---:|")
for c <- cases, do: IO.puts("| #{label.(c)} | #{round(median.(results[c]))} |")
