# Where the scoring of one step goes: the entropy window, the loop verdict and the
# step detector, each NIF alone, the three back to back, the one call the ingest makes
# (score_step), and what surrounds them (the settings read per step, the stores
# looked up, the Elixir that acts on the answers).
#
#   MIX_ENV=prod mix run bench/scoring_cost.exs             # ~1 min
#   MIX_ENV=prod mix run bench/scoring_cost.exs -- --quick  # ~15 s
#   MIX_ENV=prod mix run bench/scoring_cost.exs -- --against ../other-checkout  # ~5 min
#
# `--against DIR`: the scoring stage as the ingest runs it (bench/scoring_stage.exs),
# run in turn in DIR (another checkout, built with MIX_ENV=prod: *before*) and in this
# one (*after*), each in a VM of its own with one scheduler, rounds alternated, for a
# fleet at work and for every session looping; then this checkout's table below.
#
# 1,000 sessions, 40 steps each (10 with --quick). The table's rows feed the same steps
# to the same sessions again and again (and the warm-up three times before them), so
# the verdict's history and the step detector's see repeats: its sessions end up
# looping, and its "ingest's scoring" rows cost what a looping fleet costs.
# `--against` measures the stage on a fleet at work (bench/scoring_stage.exs).
# Figures are the VM's CPU time per call (:erlang.statistics(:runtime)), the median
# of the rounds: on a machine shared with other work, wall time measures the
# neighbours as much as the code.
alias Observatory.Gateway.{DecisionLog, EntropyConfig, EntropyTracker, LoopVerdict}
alias Observatory.Gateway.{StepDetector, StepScore}
alias Observatory.{Native, NativeStores}

Logger.configure(level: :error)
{rounds, n} = if "--quick" in System.argv(), do: {3, 10_000}, else: {7, 40_000}

# Before (DIR) and after (here), alternated: the median of each side's runs, each run
# the median of its rounds.
{opts, _, _} =
  OptionParser.parse(System.argv() -- ["--"], strict: [against: :string, quick: :boolean])

if opts[:against] do
  stage = Path.expand("scoring_stage.exs", __DIR__)
  runs = if opts[:quick], do: 3, else: 5

  run = fn dir, workload ->
    data = Path.join(System.tmp_dir!(), "scoring-stage-#{System.unique_integer([:positive])}")

    {out, 0} =
      System.cmd("mix", ["run", stage, "--", workload, "9"],
        cd: dir,
        stderr_to_stdout: true,
        env: [
          {"MIX_ENV", "prod"},
          {"OBSERVATORY_PORT", "0"},
          {"OBSERVATORY_DATA_DIR", data},
          {"ELIXIR_ERL_OPTIONS", "+S 1"}
        ]
      )

    File.rm_rf!(data)
    [_, ^workload, median, _min] = Regex.run(~r/scoring_stage (\w+) (\d+) (\d+)/, out)
    String.to_integer(median)
  end

  mid = fn xs -> xs |> Enum.sort() |> Enum.at(div(length(xs), 2)) end
  load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg") |> to_string() |> String.trim()

  IO.puts(
    "before: #{opts[:against]}; after: #{File.cwd!()}; 1-min load #{load}; #{runs} runs each\n"
  )

  IO.puts("| the ingest's scoring stage, CPU ns per step | before | after | after / before |")
  IO.puts("|---|---:|---:|---:|")

  for workload <- ~w(work loop) do
    {before, after_} =
      Enum.unzip(
        for _ <- 1..runs, do: {run.(opts[:against], workload), run.(File.cwd!(), workload)}
      )

    {b, a} = {mid.(before), mid.(after_)}

    label =
      if workload == "work",
        do: "a fleet at work (no alert)",
        else: "every session looping (alerts, blocks)"

    IO.puts("| #{label} | #{b} | #{a} | #{Float.round(a / b, 2)} |")
  end

  IO.puts("")
end

intents = ~w(search plan execute summarize)
tools = ~w(read_file write_file list_files run_shell grep http_get sql edit)

step = fn i ->
  {s, k} = {rem(i, 1000), div(i, 1000)}

  %{
    "meta" => %{
      "step_id" => "step-#{i}",
      "session_id" => "sess-#{s}",
      "agent_id" => "agent-#{rem(s, 50)}",
      "timestamp" => "2026-02-22T10:30:00.123Z"
    },
    "cognition" => %{"intent" => Enum.at(intents, rem(k + s, 4)), "entropy_score" => 0.9},
    "action" => %{
      "tool_call" => Enum.at(tools, rem(k * 3 + s, 8)),
      "tool_input" => %{"path" => "/srv/app/lib/app/file_#{k}.ex", "limit" => 200},
      "status" => if(rem(k, 5) == 4, do: "failure", else: "success"),
      "result" => %{"content" => "# step #{i}\n", "lines" => 4}
    }
  }
  |> Observatory.JSON.encode!()
  |> DecisionLog.parse()
  |> elem(2)
end

# The steps live in :persistent_term: kept on the process heap, every garbage
# collection of the loops below copied all of them (a fifth of the time measured).
:persistent_term.put(:scoring_cost_steps, List.to_tuple(for i <- 0..(n - 1), do: step.(i)))

defmodule ScoringCost do
  # `fun` on each step, nothing kept.
  def each(fun, n), do: each(fun, 0, n)
  defp each(_fun, n, n), do: :ok

  defp each(fun, i, n) do
    fun.(elem(:persistent_term.get(:scoring_cost_steps), i))
    each(fun, i + 1, n)
  end
end

cpu_ns = fn fun ->
  samples =
    for _ <- 1..rounds do
      {_, _} = :erlang.statistics(:runtime)
      ScoringCost.each(fun, n)
      {_, ms} = :erlang.statistics(:runtime)
      ms * 1_000_000 / n
    end

  samples |> Enum.sort() |> Enum.at(div(rounds, 2)) |> round()
end

config = EntropyConfig.read()
{window, loop, warning} = config

stores =
  {NativeStores.get({EntropyTracker, EntropyTracker}, nil), LoopVerdict.store_or_nil(),
   StepDetector.store_or_nil()}

{estore, vstore, sstore} = stores
verdict_config = LoopVerdict.config()
{thresholds, history} = StepDetector.step_settings()
# score_step takes both packed (once per change of the configuration).
packed_config = LoopVerdict.packed_config()
{_thresholds, packed_settings} = StepDetector.scoring_settings()
code = fn f -> elem(Observatory.Gateway.ActionStatus.to_code(f.status), 1) end

entropy_nif = fn f ->
  Native.entropy_record(
    estore,
    f.session_id,
    f.intent,
    f.tool_call,
    code.(f),
    f.agent_id,
    window,
    loop,
    warning
  )
end

verdict_nif = fn f ->
  Native.verdict_observe(vstore, f.session_id, f.verdict_keys, {:normal, window}, verdict_config)
end

step_nif = fn f ->
  Native.step_analyze(sstore, f.session_id, f.approach, f.outcome, thresholds, history)
end

rows = [
  {"entropy_record NIF alone", entropy_nif},
  {"verdict_observe NIF alone", verdict_nif},
  {"step_analyze NIF alone", step_nif},
  {"the three NIFs back to back",
   fn f ->
     entropy_nif.(f)
     verdict_nif.(f)
     step_nif.(f)
   end},
  {"score_step NIF (the three in one call)",
   fn f ->
     entropy = {f.intent, f.tool_call, code.(f), f.agent_id, config, true}

     Native.score_step(
       stores,
       f.session_id,
       entropy,
       f.verdict_keys,
       packed_config,
       {f.approach, f.outcome},
       packed_settings
     )
   end},
  {"EntropyTracker.record_and_score/3 (reads the three entropy settings)",
   fn f ->
     EntropyTracker.record_and_score(f.session_id, {f.intent, f.tool_call, f.status},
       agent_id: f.agent_id
     )
   end},
  {"LoopVerdict.observe/4",
   fn f ->
     LoopVerdict.observe(f.session_id, f.verdict_keys, :normal,
       agent_id: f.agent_id,
       step_id: f.step_id,
       window_size: window
     )
   end},
  {"StepDetector.analyze/3",
   fn f -> StepDetector.analyze(f.session_id, f.approach, f.outcome) end},
  {"the ingest's scoring: StepScore.score/3 (the settings read), the three settles",
   fn f ->
     {e, v, s, t} = StepScore.score(f, EntropyTracker, true)
     EntropyTracker.settle(e, f.session_id, f.agent_id, true)
     LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id)
     StepDetector.settle(s, f.session_id, t)
   end},
  {"  of which: StepScore.settings/0 (the five settings, what they come to)",
   fn _ -> StepScore.settings() end},
  {"  of which: the three stores looked up (one row)",
   fn _ -> NativeStores.get_row(StepScore) end},
  {"  of which: the step detector's durable-block read",
   fn f -> Observatory.Storage.read(:observatory_step_blocks, f.session_id) end}
]

# The ingest's scoring as it was (the three calls, each with its wrapper, as
# SchemaInterceptor.accept/3 made them) against the one call, in alternate rounds.
apart = fn f ->
  config = EntropyConfig.read()

  {:ok, _, severity} =
    EntropyTracker.record_and_score(f.session_id, {f.intent, f.tool_call, f.status},
      agent_id: f.agent_id,
      tracker: EntropyTracker,
      alerts: true,
      config: config
    )

  LoopVerdict.observe(f.session_id, f.verdict_keys, severity,
    agent_id: f.agent_id,
    step_id: f.step_id,
    window_size: elem(config, 0)
  )

  StepDetector.analyze(f.session_id, f.approach, f.outcome)
end

together = fn f ->
  {e, v, s, t} = StepScore.score(f, EntropyTracker, true)
  EntropyTracker.settle(e, f.session_id, f.agent_id, true)
  LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id)
  StepDetector.settle(s, f.session_id, t)
end

# Every session warmed: windows and histories full.
for _ <- 1..3, do: ScoringCost.each(&StepScore.score(&1, EntropyTracker, config, true), n)

load = :os.cmd(~c"cut -d' ' -f1 /proc/loadavg") |> to_string() |> String.trim()
IO.puts("1-min load average at the start: #{load}; #{n} steps a round, #{rounds} rounds\n")
IO.puts("| what | CPU ns per step |\n|---|---:|")
for {label, fun} <- rows, do: IO.puts("| #{label} | #{cpu_ns.(fun)} |")

# A and B in alternate rounds, so that the machine's other work weighs on both alike.
one_round = fn fun ->
  {_, _} = :erlang.statistics(:runtime)
  ScoringCost.each(fun, n)
  {_, ms} = :erlang.statistics(:runtime)
  ms * 1_000_000 / n
end

{a, b} = Enum.unzip(for _ <- 1..(rounds * 2), do: {one_round.(apart), one_round.(together)})

mid = fn xs -> xs |> Enum.sort() |> Enum.at(length(xs) |> div(2)) |> round() end

IO.puts("""

| the ingest's scoring, alternate rounds | CPU ns per step |
|---|---:|
| three calls, each with its wrapper (before) | #{mid.(a)} |
| one call, StepScore (now) | #{mid.(b)} (#{round(100 * (1 - mid.(b) / mid.(a)))} % less) |
""")
