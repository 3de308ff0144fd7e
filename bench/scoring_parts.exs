# The ingest's scoring stage taken apart where its state is cold, as
# bench/scoring_cold.exs times it (each batch of 20 steps parsed just before it is
# timed): the stage, `StepScore.score/3` alone, its settings read, the three entropy
# settings read alone, the stores' row, the NIF call alone with all three
# stores, with none (its entry, its arguments decoded, three error answers) and with
# each store alone, and the three settles alone (on answers scored before the batch's
# steps were parsed, so that they are as cold). What each part costs where the
# ingest pays it; the parts do not add up to the stage (a part timed alone leaves the
# next step's lines where the part before it would have evicted them).
#
#   MIX_ENV=prod mix run bench/scoring_parts.exs          # ~10 s
#   MIX_ENV=prod mix run bench/scoring_parts.exs -- 20    # rounds (default 12)
#
# Prints the median batch of 20 (wall ns a step) of each part and size, the parts
# alternated in each round. The steps and the warm-up are bench/ingest_breakdown.exs's
# (1,000 sessions a size, 50 agents, every step new: a fleet at work).
Code.require_file("breakdown_steps.exs", __DIR__)

alias Observatory.Bench.BreakdownSteps
alias Observatory.Gateway.{DecisionLog, EntropyTracker, SchemaInterceptor, StepScore}

Logger.configure(level: :error)

rounds =
  case System.argv() -- ["--"] do
    [r | _] -> String.to_integer(r)
    [] -> 12
  end

defmodule ScoringParts do
  @moduledoc false
  # The parts, compiled (a closure of this script would run in the evaluator).
  alias Observatory.Gateway.{EntropyConfig, EntropyTracker, LoopVerdict, StepDetector}
  alias Observatory.Gateway.StepScore

  def stage(f) do
    {e, v, s, thresholds} = StepScore.score(f, EntropyTracker, true)
    settles({e, v, s, thresholds}, f)
  end

  def score(f), do: StepScore.score(f, EntropyTracker, true)
  def settings(_f), do: StepScore.settings()
  def entropy_reads(_f), do: EntropyConfig.read()
  def row(_f), do: Observatory.NativeStores.get_row_cached(StepScore)
  def nif(args), do: apply(Observatory.Native, :score_step, args)

  def settles({e, v, s, thresholds}, f) do
    EntropyTracker.settle(e, f.session_id, f.agent_id, true)
    LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id)
    s && StepDetector.settle(s, f.session_id, thresholds)
  end

  def each([], _fun), do: :ok

  def each([x | rest], fun),
    do:
      (
        fun.(x)
        each(rest, fun)
      )
end

:ok = BreakdownSteps.publish(:bench_scoring_parts)
message = &BreakdownSteps.message(:bench_scoring_parts, &1, &2, &3)

for a <- 0..49, do: {:ok, _} = Observatory.KillSwitch.Agents.fetch_or_register("agent-#{a}")

for {size, _} <- BreakdownSteps.sizes(),
    n <- 0..(BreakdownSteps.templates() * 2),
    do: SchemaInterceptor.ingest(message.(size, n, "warm-"))

counter = :atomics.new(1, [])

parse = fn size ->
  n = :atomics.add_get(counter, 1, 1)
  {:ok, _envelope, fields} = DecisionLog.parse(message.(size, n, "r#{n}-"))
  fields
end

# The NIF's arguments as StepScore.score/3 builds them, with the stores picked.
nif_args = fn f, pick ->
  {e, v, s} = BreakdownSteps.score_stores()

  stores =
    case pick do
      :all -> {e, v, s}
      :none -> {nil, nil, nil}
      :entropy -> {e, nil, nil}
      :verdict -> {nil, v, nil}
      :step -> {nil, nil, s}
    end

  BreakdownSteps.score_step_args(f, stores)
end

# One batch: 20 steps parsed, then the part timed over them.
batch = fn part, size ->
  fields = for _ <- 1..20, do: parse.(size)

  {fun, inputs} =
    case part do
      {:nif, pick} ->
        {&ScoringParts.nif/1, Enum.map(fields, &nif_args.(&1, pick))}

      :settles ->
        answers = for f <- fields, do: {ScoringParts.score(f), f}
        for _ <- 1..20, do: parse.(size)
        {fn {answer, f} -> ScoringParts.settles(answer, f) end, answers}

      name ->
        {&apply(ScoringParts, name, [&1]), fields}
    end

  t0 = System.monotonic_time(:nanosecond)
  ScoringParts.each(inputs, fun)
  (System.monotonic_time(:nanosecond) - t0) / 20
end

parts = [
  {:stage, "the stage (StepScore.score/3 and the three settles)"},
  {:score, "StepScore.score/3 alone"},
  {:settings, "  the five settings read (StepScore.settings/0)"},
  {:entropy_reads, "  of which the three entropy settings, read alone (EntropyConfig.read/0)"},
  {:row, "  the stores' row"},
  {{:nif, :all}, "  the NIF call alone"},
  {{:nif, :none}, "    with no store (entry, arguments, three error answers)"},
  {{:nif, :entropy}, "    with the entropy window's store alone"},
  {{:nif, :verdict}, "    with the loop verdict's store alone"},
  {{:nif, :step}, "    with the step detector's store alone"},
  {:settles, "the three settles alone"}
]

sizes = BreakdownSteps.sizes()
load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg") |> to_string() |> String.trim()

results =
  for _ <- 1..rounds, {part, _} <- parts, {size, _} <- sizes, reduce: %{} do
    acc ->
      samples = for _ <- 1..25, do: batch.(part, size)
      Map.update(acc, {part, size}, samples, &(&1 ++ samples))
  end

median = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end
IO.puts("1-min load average at the start: #{load}; #{rounds} rounds of 25 batches of 20 a part\n")

IO.puts(
  "| scoring stage, steps parsed just before | " <>
    Enum.map_join(sizes, " | ", &elem(&1, 1)) <> " |"
)

IO.puts("|---|" <> String.duplicate("---:|", length(sizes)))

for {part, label} <- parts do
  row = Enum.map_join(sizes, " | ", fn {size, _} -> round(median.(results[{part, size}])) end)
  IO.puts("| #{label} | #{row} |")
end
