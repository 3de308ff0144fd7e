# The ingest's scoring stage alone, as `SchemaInterceptor.accept/3` runs it: the
# settings read (FR-9.11's three among them), `StepScore.score` (one NIF call: the
# entropy window, the loop verdict and the step detector) and the three settles
# (alerts, broadcasts, the durable block, telemetry). Prints one line, `scoring_stage <workload> <CPU ns per step, median>
# <min>`, so that `bench/scoring_cost.exs -- --against DIR` can run it in two checkouts
# in turn (it uses only what both have).
#
#   MIX_ENV=prod mix run bench/scoring_stage.exs -- work   # a fleet at work
#   MIX_ENV=prod mix run bench/scoring_stage.exs -- loop   # every session looping
#
# `work`: 1,000 sessions, 50 agents, every step new (the entropy severity normal, no
# verdict, no block). `loop`: 1,000 sessions each sending the same failing step again
# and again: entropy LOOP alerts, loop verdicts, step warnings, then durable blocks.
# Figures are the VM's CPU time (:erlang.statistics(:runtime)) over rounds of 20,000
# steps; the parsed steps live in :persistent_term, so the loop's own garbage
# collections do not copy them.
alias Observatory.Gateway.{DecisionLog, EntropyConfig, EntropyTracker, LoopVerdict}
alias Observatory.Gateway.{StepDetector, StepScore}

Logger.configure(level: :error)

{workload, rounds} =
  case System.argv() -- ["--"] do
    [w, r | _] -> {w, String.to_integer(r)}
    [w] -> {w, 9}
    [] -> {"work", 9}
  end

n = 20_000
intents = ~w(search plan execute summarize)
tools = ~w(read_file write_file list_files run_shell grep http_get sql edit)

step = fn i ->
  {s, k} = {rem(i, 1000), div(i, 1000)}

  action =
    case workload do
      "work" ->
        %{
          "tool_call" => Enum.at(tools, rem(k * 3 + s, 8)),
          "tool_input" => %{"path" => "/srv/app/lib/app/file_#{k}.ex", "limit" => 200},
          "status" => if(rem(k, 5) == 4, do: "failure", else: "success"),
          "result" => %{"content" => "# step #{i}\n", "lines" => 4}
        }

      "loop" ->
        %{
          "tool_call" => "run_shell",
          "tool_input" => %{"cmd" => "mix test test/app_test.exs"},
          "status" => "failure",
          "result" => %{"error" => "1 test, 1 failure"}
        }
    end

  %{
    "meta" => %{
      "step_id" => "step-#{i}",
      "session_id" => "sess-#{workload}-#{s}",
      "agent_id" => "agent-#{rem(s, 50)}",
      "timestamp" => "2026-02-22T10:30:00.123Z"
    },
    "cognition" => %{
      "intent" => if(workload == "loop", do: "fix", else: Enum.at(intents, rem(k + s, 4))),
      "entropy_score" => 0.9
    },
    "action" => action
  }
  |> Observatory.JSON.encode!()
  |> DecisionLog.parse()
  |> elem(2)
end

:persistent_term.put(:scoring_stage_steps, List.to_tuple(for i <- 0..(n - 1), do: step.(i)))

# As the ingest calls it: StepScore.score/3 reads the settings itself where it has it
# (FR-9.11's three among them); before, the ingest read EntropyConfig.read/0 first.
score_step =
  if Code.ensure_loaded?(StepScore) and function_exported?(StepScore, :score, 3),
    do: fn f -> StepScore.score(f, EntropyTracker, true) end,
    else: fn f -> StepScore.score(f, EntropyTracker, EntropyConfig.read(), true) end

score = fn f ->
  {e, v, s, t} = score_step.(f)
  EntropyTracker.settle(e, f.session_id, f.agent_id, true)
  LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id)
  s && StepDetector.settle(s, f.session_id, t)
end

defmodule ScoringStage do
  def run(_score, i, n) when i == n, do: :ok

  def run(score, i, n) do
    score.(elem(:persistent_term.get(:scoring_stage_steps), i))
    run(score, i + 1, n)
  end
end

# Warm: every session's window and history full (and, looping, every session blocked).
for _ <- 1..2, do: ScoringStage.run(score, 0, n)

samples =
  for _ <- 1..rounds do
    {_, _} = :erlang.statistics(:runtime)
    ScoringStage.run(score, 0, n)
    {_, ms} = :erlang.statistics(:runtime)
    ms * 1_000_000 / n
  end

# What the steps came to, one more round: the workload is the one intended.
counts = :counters.new(1, [])
tally = :ets.new(:scoring_stage_tally, [:set, :public])

ScoringStage.run(
  fn f ->
    {e, v, s, t} = score_step.(f)
    entropy = EntropyTracker.settle(e, f.session_id, f.agent_id, true)
    verdict = LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id)
    step = s && StepDetector.settle(s, f.session_id, t)
    severity = with {:ok, _, severity} <- entropy, do: severity, else: (_ -> :error)
    level = with {:ok, v} <- verdict, do: v.verdict, else: (_ -> :error)
    action = with {:ok, s} <- step, do: s.action, else: (_ -> :error)

    for key <- [{:entropy, severity}, {:verdict, level}, {:step, action}],
        do: :ets.update_counter(tally, key, 1, {key, 0})

    :counters.add(counts, 1, 1)
  end,
  0,
  n
)

came_to =
  tally
  |> :ets.tab2list()
  |> Enum.sort()
  |> Enum.map_join(", ", fn {{k, v}, c} -> "#{k} #{v} #{c}" end)

IO.puts("steps came to: #{came_to}")

sorted = Enum.sort(samples)

IO.puts(
  "scoring_stage #{workload} #{round(Enum.at(sorted, div(rounds, 2)))} #{round(hd(sorted))}"
)

# `-- work 9 split`: where the stage's time goes, in this checkout only (it needs
# StepScore.score/3): the whole stage, the one call with its Elixir around it but no
# settles, the NIF alone (its arguments built as StepScore builds them, the settings
# read once), the three settles alone (on the answers this round's steps got), and
# the five settings read. Rounds alternated; CPU ns per step, medians.
if "split" in System.argv() and function_exported?(StepScore, :score, 3) do
  alias Observatory.{Native, NativeStores}

  {_, e_store, v_store, s_store} = NativeStores.get_row(StepScore)
  stores = {e_store, v_store, s_store}
  {entropy_config, verdict_config, {_, step_settings}} = StepScore.settings()
  code = fn f -> elem(Observatory.Gateway.ActionStatus.to_code(f.status), 1) end

  nif = fn f ->
    entropy = {f.intent, f.tool_call, code.(f), f.agent_id, entropy_config, true}
    step = if f.outcome, do: {f.approach, f.outcome}

    Native.score_step(
      stores,
      f.session_id,
      entropy,
      f.verdict_keys,
      verdict_config,
      step,
      step_settings
    )
  end

  answers =
    for i <- 0..(n - 1), into: %{} do
      f = elem(:persistent_term.get(:scoring_stage_steps), i)
      {f.step_id, score_step.(f)}
    end

  :persistent_term.put(:scoring_stage_answers, answers)

  settles = fn f ->
    {e, v, s, t} = Map.fetch!(:persistent_term.get(:scoring_stage_answers), f.step_id)
    EntropyTracker.settle(e, f.session_id, f.agent_id, true)
    LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id)
    s && StepDetector.settle(s, f.session_id, t)
  end

  parts = [
    {"the whole stage (StepScore.score/3 and the three settles)", score},
    {"StepScore.score/3 alone (settings, the stores' row, the NIF call)", score_step},
    {"  of which: the score_step NIF alone", nif},
    {"  of which: the five settings read (StepScore.settings/0)",
     fn _ -> StepScore.settings() end},
    {"  of which: the stores' row looked up", fn _ -> NativeStores.get_row(StepScore) end},
    {"the three settles alone (maps, telemetry, the durable-block read)", settles},
    {"  of which: the step detector's durable-block read",
     fn f -> Observatory.Storage.read(:observatory_step_blocks, f.session_id) end},
    {"  of which: the answers looked up for the settles (the bench's own cost)",
     fn f -> Map.fetch!(:persistent_term.get(:scoring_stage_answers), f.step_id) end}
  ]

  times =
    for _ <- 1..rounds, {label, fun} <- parts, reduce: %{} do
      acc ->
        {_, _} = :erlang.statistics(:runtime)
        ScoringStage.run(fun, 0, n)
        {_, ms} = :erlang.statistics(:runtime)
        Map.update(acc, label, [ms * 1_000_000 / n], &[ms * 1_000_000 / n | &1])
    end

  IO.puts("\n| #{workload}: the stage taken apart | CPU ns per step |\n|---|---:|")

  for {label, _} <- parts do
    sorted = Enum.sort(times[label])
    IO.puts("| #{label} | #{round(Enum.at(sorted, div(rounds, 2)))} |")
  end
end
