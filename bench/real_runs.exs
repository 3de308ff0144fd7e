# How well do the alert sources catch loops on real agent runs, next to two well-known
# detectors? Replays labelled sessions through the gateway's own ingest path
# (Observatory.Replay, the engine of mix observatory.replay) and reports, per detector
# and per source, the looping sessions caught, the clean sessions alarmed, all sessions
# alarmed and how many steps after the start of the identical run the first alarm came.
#
#   MIX_ENV=prod mix run --no-start bench/real_runs.exs
#   MIX_ENV=prod mix run --no-start bench/real_runs.exs -- --data DIR --scripted DIR --list --json
#     (also --stuck FILE, --reads FILE)
#
# With --no-start the script starts the application itself, as mix observatory.replay
# does: without the HTTP server and the demo fleet, and with the logger quiet, so stdout
# holds only the tables (or the JSON). Plain `mix run` works too, but then the
# application's start-up log lines come first and it listens on its port.
#
# Sources (each replayed on its own):
#   * the dev corpus: DIR/steps.jsonl.gz with its labels in DIR/sessions.jsonl
#     (--data, default ../shared/datasets/real_runs), one table per corpus `source`
#     (intercode, tau-bench) and one for all; the run starts at `first_run4_start`;
#   * scripted runs, if --scripted DIR (default bench/real_runs/scripted) holds
#     steps.jsonl and sessions.jsonl (`label` looping/clean, `loop_start`: the 0-based
#     step where the loop starts);
#   * the labelled scenario suite, test/fixtures/loop_verdict_scenarios.json:
#     must-flag = looping, must-not-flag = clean, anything else = other; the run starts
#     at the first step of the scenario's longest run of identical calls (the earliest,
#     if several are as long; step 0 if no call repeats).
#
# Hand labels (--stuck FILE, default bench/real_runs/stuck/labels.jsonl): per source
# and split (dev / held-out), the stuck sessions each detector caught, the fine ones it
# alarmed and its precision; and, for the exact label's clean InterCode sessions, how
# many of those a reader saw were stuck and what the ones each detector alarmed on were.
#
# Exact-clean alarms read (--reads FILE, default bench/real_runs/stuck/exact_clean_reads.jsonl):
# per source and detector, the exact-clean sessions alarmed that a reader found stuck,
# found fine, or has not read (the file's reads, and the dev labels of the stuck sample); and, from the stuck sample's strata, an estimate of the
# share of exact-clean sessions that are stuck (with how many sessions read it rests on)
# and the exact-clean alarm rate that implies for a detector catching 85 % of stuck
# sessions.
#
# Detectors: `:entropy` alarms at a session's first step at LOOP (FRD-009's uniqueness
# ratio), `:verdict` at its first step whose loop verdict was loop; one replay judges
# both, whatever :alert_source is. OpenHands-style and Gemini-style are the reference
# detectors of bench/reference_detectors.exs, run over the same step records.
#
# "median steps to alarm" is the median, over the caught looping sessions that have a
# run start, of (0-based step of the first alarm) - (run start): 0 = on the run's first
# step, 3 = on its fourth. An alarm before the run counts with its negative value in
# the median, and "alarm before run" counts those sessions.
#
# Options: --list prints, per source and detector, the missed looping sessions and the
# alarmed clean sessions; --json prints the figures (and, with --list, the lists) as
# one JSON document instead of the tables.
Code.require_file("reference_detectors.exs", __DIR__)
Code.require_file("exact_clean_reads.exs", __DIR__)

defmodule Observatory.Bench.RealRuns do
  @moduledoc false

  alias Observatory.Bench.ReferenceDetectors
  alias Observatory.JSON
  alias Observatory.Replay
  alias Observatory.Replay.Input

  @detectors [
    entropy: "`:entropy` (FRD-009)",
    verdict: "`:verdict`",
    openhands: "OpenHands-style stuck",
    gemini: "Gemini-style 5 identical calls"
  ]

  def detectors, do: @detectors

  @doc """
  Replays one steps file and returns its sessions, in file order: id, records and the
  0-based step of each detector's first alarm. Also returns the replay's figures.
  """
  def judge(steps_path) do
    {records, positions} = read_steps(steps_path)
    report = Replay.run([steps_path])

    if report.bad_lines > 0 or report.input_errors != [] do
      IO.puts(:stderr, "#{steps_path}: #{report.bad_lines} bad lines #{inspect(report.bad)}")
    end

    by_id = Map.new(report.sessions, &{&1.session_id, &1})
    # The replay marks the line of a first alarm; its 0-based step is the line's
    # position among the session's records.
    at = fn mark -> mark && Map.fetch!(positions, mark.line) end

    sessions =
      for {id, steps} <- records do
        replayed = Map.get(by_id, id, %{first_loop: nil, first_verdict_loop: nil})

        %{
          id: id,
          steps: steps,
          alarms: %{
            entropy: at.(replayed.first_loop),
            verdict: at.(replayed.first_verdict_loop),
            openhands: ReferenceDetectors.openhands_stuck(steps),
            gemini: ReferenceDetectors.gemini_identical_calls(steps)
          }
        }
      end

    {sessions, report}
  end

  # The decoded records of each session in file order, and line number => 0-based
  # position of that line's record in its session.
  defp read_steps(path) do
    {order, by_id, positions} =
      path
      |> Input.lines()
      |> Enum.reduce({[], %{}, %{}}, fn {line_no, text}, {order, by_id, positions} ->
        case JSON.decode(text) do
          {:ok, %{"session_id" => id} = record} when is_binary(id) ->
            steps = Map.get(by_id, id)
            order = if steps, do: order, else: [id | order]
            steps = steps || []

            {order, Map.put(by_id, id, [record | steps]),
             Map.put(positions, line_no, length(steps))}

          _other ->
            {order, by_id, positions}
        end
      end)

    records = for id <- Enum.reverse(order), do: {id, Enum.reverse(Map.fetch!(by_id, id))}
    {records, positions}
  end

  def read_jsonl(path) do
    for {_line_no, text} <- Input.lines(path) do
      {:ok, object} = JSON.decode(text)
      object
    end
  end

  @doc "The figures of one detector over labelled sessions."
  def figures(sessions, detector) do
    alarm = fn s -> s.alarms[detector] end
    looping = Enum.filter(sessions, &(&1.label == "looping"))
    clean = Enum.filter(sessions, &(&1.label == "clean"))
    caught = Enum.filter(looping, alarm)

    delays = for s <- caught, is_integer(s.start), do: alarm.(s) - s.start

    %{
      detector: detector,
      sessions: length(sessions),
      alarmed: Enum.count(sessions, alarm),
      looping: length(looping),
      looping_caught: length(caught),
      clean: length(clean),
      clean_alarmed: Enum.count(clean, alarm),
      median_steps_to_alarm: median(delays),
      alarm_before_run: Enum.count(delays, &(&1 < 0)),
      missed: for(s <- looping, !alarm.(s), do: %{session: s.name, run_start: s.start}),
      false_alarms: for(s <- clean, alarm.(s), do: %{session: s.name, alarm_step: alarm.(s)})
    }
  end

  @doc """
  The figures of one detector against hand labels (`stuck` / `fine`): stuck sessions
  caught, fine sessions alarmed, and precision (stuck among all alarmed).
  """
  def stuck_figures(sessions, detector) do
    alarm = fn s -> s.alarms[detector] end
    stuck = Enum.filter(sessions, &(&1.stuck_label == "stuck"))
    fine = Enum.filter(sessions, &(&1.stuck_label == "fine"))
    caught = Enum.count(stuck, alarm)
    false_alarms = for s <- fine, alarm.(s), do: %{session: s.name, alarm_step: alarm.(s)}
    missed = for s <- stuck, !alarm.(s), do: %{session: s.name, stuck_from: s.stuck_from}

    %{
      detector: detector,
      stuck: length(stuck),
      stuck_caught: caught,
      fine: length(fine),
      fine_alarmed: length(false_alarms),
      precision:
        if(caught + length(false_alarms) > 0, do: caught / (caught + length(false_alarms))),
      missed: missed,
      false_alarms: false_alarms
    }
  end

  def stuck_table(rows) do
    [
      "### Stuck labels (dev-corpus sessions read by hand: bench/real_runs/stuck)\n\n",
      "| source | split | detector | stuck caught | fine alarmed | precision |\n",
      "|---|---|---|---:|---:|---:|\n",
      Enum.map(rows, fn {source, split, f} ->
        precision = if f.precision, do: "#{Float.round(100 * f.precision, 1)} %", else: "-"

        "| #{source} | #{split} | #{@detectors[f.detector]} | " <>
          "#{ratio(f.stuck_caught, f.stuck)} | #{ratio(f.fine_alarmed, f.fine)} | #{precision} |\n"
      end),
      "\n"
    ]
  end

  @doc """
  What the hand labels say about the exact label's *clean* sessions (no two identical
  actions in a row): of those read, how many a reader called stuck, and of each
  detector's alarms on clean sessions, how many were read and what they were.
  """
  def clean_read(clean, labels, detector) do
    read = Enum.filter(clean, &labels[&1.id])
    alarmed = Enum.filter(clean, & &1.alarms[detector])
    alarmed_read = Enum.filter(alarmed, &labels[&1.id])

    %{
      detector: detector,
      clean: length(clean),
      read: length(read),
      read_stuck: Enum.count(read, &(labels[&1.id] == "stuck")),
      alarmed: length(alarmed),
      alarmed_read: length(alarmed_read),
      alarmed_read_stuck: Enum.count(alarmed_read, &(labels[&1.id] == "stuck"))
    }
  end

  def clean_read_table(rows) do
    [
      "### Exact-clean InterCode sessions, read by hand (bench/real_runs/stuck, stratum ic-clean)\n\n",
      "| detector | clean alarmed | alarmed and read: stuck / read | read: stuck / read |\n",
      "|---|---:|---:|---:|\n",
      Enum.map(rows, fn f ->
        "| #{@detectors[f.detector]} | #{ratio(f.alarmed, f.clean)} | " <>
          "#{f.alarmed_read_stuck} / #{f.alarmed_read} | #{ratio(f.read_stuck, f.read)} |\n"
      end),
      "\n"
    ]
  end

  def clean_alarm_reads_table(rows) do
    [
      "### Exact-clean alarms, read by hand (bench/real_runs/stuck/exact_clean_reads.jsonl)\n\n",
      "| source | detector | clean alarmed | read: stuck | read: fine | not read |\n",
      "|---|---|---:|---:|---:|---:|\n",
      Enum.map(rows, fn {source, f} ->
        "| #{source} | #{@detectors[f.detector]} | #{ratio(f.alarmed, f.clean)} | " <>
          "#{f.read_stuck} | #{f.read_fine} | #{f.not_read} |\n"
      end),
      "\n"
    ]
  end

  def clean_stuck_share_table(rows) do
    pct = fn x -> if x, do: "#{Float.round(100 * x, 1)} %", else: "-" end

    [
      "### Stuck agents among exact-clean sessions (estimated from the stuck sample)\n\n",
      "| source | exact-clean | read in the sample: stuck / read (strata) | estimated stuck (95 % interval) | ",
      "exact-clean alarmed at #{round(100 * elem(hd(rows), 1).recall)} % recall, no false alarm (95 % interval) |\n",
      "|---|---:|---:|---:|---:|\n",
      Enum.map(rows, fn {source, e} ->
        "| #{source} | #{e.clean} | #{e.read_stuck} / #{e.read} (#{Enum.join(e.strata, ", ")}) | " <>
          "#{pct.(e.stuck_share)} (#{pct.(e.stuck_share_low)}–#{pct.(e.stuck_share_high)}) | " <>
          "#{pct.(e.implied_alarm_rate)} (#{pct.(e.implied_alarm_rate_low)}–#{pct.(e.implied_alarm_rate_high)}) |\n"
      end),
      "\n"
    ]
  end

  def stuck_lists(rows) do
    for {source, split, f} <- rows, split != "all", source != "all" do
      [
        "stuck labels, #{source} #{split}, #{@detectors[f.detector]}: missed stuck (#{length(f.missed)})\n",
        Enum.map(f.missed, &"  #{&1.session} (stuck from step #{&1.stuck_from})\n"),
        "stuck labels, #{source} #{split}, #{@detectors[f.detector]}: alarmed fine (#{length(f.false_alarms)})\n",
        Enum.map(f.false_alarms, &"  #{&1.session} (alarm at step #{&1.alarm_step})\n")
      ]
    end
  end

  defp median([]), do: nil

  defp median(values) do
    sorted = Enum.sort(values)
    n = length(sorted)
    mid = div(n, 2)

    if rem(n, 2) == 1,
      do: Enum.at(sorted, mid),
      else: half_sum(Enum.at(sorted, mid - 1), Enum.at(sorted, mid))
  end

  # 4 for (3 + 5) / 2, 3.5 for (3 + 4) / 2.
  defp half_sum(a, b) when rem(a + b, 2) == 0, do: div(a + b, 2)
  defp half_sum(a, b), do: (a + b) / 2

  def table(title, sessions, figures) do
    count = fn label -> Enum.count(sessions, &(&1.label == label)) end

    [
      "### #{title}\n\n",
      "#{length(sessions)} sessions: #{count.("looping")} looping, #{count.("clean")} clean, ",
      "#{length(sessions) - count.("looping") - count.("clean")} other\n\n",
      "| detector | looping caught | clean alarmed | all alarmed | median steps to alarm | alarm before run |\n",
      "|---|---:|---:|---:|---:|---:|\n",
      Enum.map(figures, fn f ->
        "| #{@detectors[f.detector]} | #{ratio(f.looping_caught, f.looping)} | " <>
          "#{ratio(f.clean_alarmed, f.clean)} | #{f.alarmed} / #{f.sessions} | " <>
          "#{f.median_steps_to_alarm || "-"} | #{f.alarm_before_run} |\n"
      end),
      "\n"
    ]
  end

  defp ratio(_n, 0), do: "-"
  defp ratio(n, total), do: "#{n} / #{total} (#{Float.round(100 * n / total, 1)} %)"

  def lists(title, figures) do
    Enum.map(figures, fn f ->
      [
        "#{title}, #{@detectors[f.detector]}: missed looping (#{length(f.missed)})\n",
        Enum.map(f.missed, &"  #{&1.session} (run starts at step #{&1.run_start})\n"),
        "#{title}, #{@detectors[f.detector]}: alarmed clean (#{length(f.false_alarms)})\n",
        Enum.map(f.false_alarms, &"  #{&1.session} (alarm at step #{&1.alarm_step})\n")
      ]
    end)
  end

  @doc "Step index where the session's longest run of identical calls starts."
  def longest_run_start(steps) do
    steps
    |> Enum.map(&{&1["tool_call"], &1["tool_input"]})
    |> Enum.chunk_by(& &1)
    |> Enum.reduce({0, 0, 0}, fn run, {at, best, best_at} ->
      n = length(run)
      if n > best, do: {at + n, n, at}, else: {at + n, best, best_at}
    end)
    |> elem(2)
  end
end

alias Observatory.Bench.ExactCleanReads
alias Observatory.Bench.RealRuns
alias Observatory.JSON

Logger.configure(level: :error)

unless List.keymember?(Application.started_applications(), :observatory, 0) do
  Observatory.Replay.prepare_app(own_data_dir: true)
  {:ok, _apps} = Application.ensure_all_started(:observatory)
end

argv = with ["--" | rest] <- System.argv(), do: rest

{opts, _args} =
  OptionParser.parse!(argv,
    strict: [
      data: :string,
      scripted: :string,
      stuck: :string,
      reads: :string,
      list: :boolean,
      json: :boolean
    ]
  )

data = Keyword.get(opts, :data, "../shared/datasets/real_runs")
scripted = Keyword.get(opts, :scripted, "bench/real_runs/scripted")
started = System.monotonic_time(:millisecond)

# Each group: {title, sessions with :label, :start and :name}.
label_sessions = fn sessions, info ->
  for s <- sessions do
    Map.merge(s, Map.get_lazy(info, s.id, fn -> %{label: "other", start: nil, name: s.id} end))
  end
end

## The dev corpus

dev_labels =
  for s <- RealRuns.read_jsonl(Path.join(data, "sessions.jsonl")), into: %{} do
    {s["session_id"],
     %{
       label: s["label"],
       start: s["first_run4_start"],
       name: s["session_id"],
       source: s["source"]
     }}
  end

{dev, report} = RealRuns.judge(Path.join(data, "steps.jsonl.gz"))
dev = label_sessions.(dev, dev_labels)
dev_steps = report.steps

dev_groups =
  dev
  |> Enum.group_by(&Map.get(&1, :source, "unlabelled"))
  |> Enum.sort()
  |> Enum.map(fn {source, sessions} -> {"dev corpus: #{source}", sessions} end)

groups = dev_groups ++ [{"dev corpus: all", dev}]

## Stuck labels: a sample of the dev corpus read by hand (bench/real_runs/stuck/README.md)

stuck_file = Keyword.get(opts, :stuck, "bench/real_runs/stuck/labels.jsonl")

stuck_rows =
  if File.regular?(stuck_file) do
    labels = Map.new(RealRuns.read_jsonl(stuck_file), &{&1["session_id"], &1})

    labelled =
      for s <- dev, label = labels[s.id] do
        Map.merge(s, %{
          stuck_label: label["label"],
          stuck_from: label["stuck_from"],
          split: label["split"]
        })
      end

    missing = map_size(labels) - length(labelled)
    missing == 0 or IO.puts(:stderr, "#{missing} labelled sessions are not in the dev corpus")

    for source <- ["intercode", "tau-bench", "all"],
        split <- ["dev", "held-out", "all"],
        sessions =
          Enum.filter(
            labelled,
            &((source == "all" or &1.source == source) and (split == "all" or &1.split == split))
          ),
        {detector, _} <- RealRuns.detectors() do
      {source, split, RealRuns.stuck_figures(sessions, detector)}
    end
  else
    IO.puts(:stderr, "no stuck labels at #{stuck_file}")
    []
  end

# The exact label's clean InterCode sessions against the hand labels: an agent can be
# stuck without two identical actions in a row, so "clean alarmed" counts some true
# alarms; the ones read say how many.
clean_read_rows =
  if File.regular?(stuck_file) do
    read = Map.new(RealRuns.read_jsonl(stuck_file), &{&1["session_id"], &1["label"]})
    clean = Enum.filter(dev, &(&1.label == "clean" and &1.source == "intercode"))
    for {detector, _} <- RealRuns.detectors(), do: RealRuns.clean_read(clean, read, detector)
  else
    []
  end

# The exact-clean alarms read by hand (bench/real_runs/stuck/exact_clean_reads.jsonl):
# per source and detector, how many a reader found stuck, found fine, or has not read;
# and how many exact-clean sessions the stuck sample says are stuck, with what that
# implies for the exact-clean alarm rate of a detector that catches 85 % of stuck agents.
reads_file = Keyword.get(opts, :reads, "bench/real_runs/stuck/exact_clean_reads.jsonl")

{clean_alarm_rows, clean_share_rows} =
  if File.regular?(reads_file) and File.regular?(stuck_file) do
    labels = Map.new(RealRuns.read_jsonl(stuck_file), &{&1["session_id"], &1})

    # A dev session of the stuck sample was read when it was labelled; held-out ones
    # count as not read here (their alarms are never opened).
    reads =
      for({id, %{"split" => "dev", "label" => label}} <- labels, into: %{}, do: {id, label})
      |> Map.merge(Map.new(RealRuns.read_jsonl(reads_file), &{&1["session_id"], &1["read"]}))

    labelled =
      for s <- dev, label = labels[s.id] do
        Map.merge(s, %{stuck_label: label["label"], stratum: label["stratum"]})
      end

    by_source =
      for source <- ["intercode", "tau-bench", "all"] do
        in_source = &(source == "all" or &1.source == source)
        {source, Enum.filter(dev, &(in_source.(&1) and &1.label == "clean")), in_source}
      end

    {for {source, clean, _} <- by_source, {detector, _} <- RealRuns.detectors() do
       {source, ExactCleanReads.alarm_reads(clean, reads, detector)}
     end,
     for {source, clean, in_source} <- by_source do
       {source, ExactCleanReads.stuck_share(clean, Enum.filter(labelled, in_source), 0.85)}
     end}
  else
    IO.puts(:stderr, "no exact-clean reads at #{reads_file}")
    {[], []}
  end

## Scripted runs

scripted_steps = Path.join(scripted, "steps.jsonl")
scripted_sessions = Path.join(scripted, "sessions.jsonl")

groups =
  if File.regular?(scripted_steps) and File.regular?(scripted_sessions) do
    labels =
      for s <- RealRuns.read_jsonl(scripted_sessions), into: %{} do
        {s["session_id"], %{label: s["label"], start: s["loop_start"], name: s["session_id"]}}
      end

    {sessions, _report} = RealRuns.judge(scripted_steps)
    clash = Enum.filter(sessions, &Map.has_key?(dev_labels, &1.id))
    clash == [] or raise "scripted session ids also in the dev corpus: #{inspect(clash)}"
    groups ++ [{"scripted runs", label_sessions.(sessions, labels)}]
  else
    IO.puts(:stderr, "no scripted runs in #{scripted} (steps.jsonl + sessions.jsonl)")
    groups
  end

## The labelled scenario suite

{:ok, %{"scenarios" => scenarios}} =
  JSON.decode(File.read!("test/fixtures/loop_verdict_scenarios.json"))

dir = Path.join(System.tmp_dir!(), "observatory_real_runs_#{System.unique_integer([:positive])}")
File.mkdir_p!(dir)
scenario_file = Path.join(dir, "scenarios.jsonl")

lines =
  for {scenario, i} <- Enum.with_index(scenarios, 1), step <- scenario["steps"] do
    JSON.encode!(%{
      "session_id" => "scenario-#{i}",
      "agent_id" => "agent-scenario-#{i}",
      "intent" => step["intent"],
      "tool_call" => step["tool"],
      "tool_input" => step["input"],
      "status" => step["status"],
      "result" => step["result"]
    })
  end

File.write!(scenario_file, Enum.join(lines, "\n") <> "\n")
{scenario_sessions, _report} = RealRuns.judge(scenario_file)
File.rm_rf!(dir)

scenario_sessions =
  for s <- scenario_sessions do
    "scenario-" <> i = s.id
    scenario = Enum.at(scenarios, String.to_integer(i) - 1)

    label =
      case scenario["label"] do
        "must-flag" -> "looping"
        "must-not-flag" -> "clean"
        _ -> "other"
      end

    Map.merge(s, %{
      label: label,
      start: RealRuns.longest_run_start(s.steps),
      name: "#{s.id} (#{scenario["name"]})"
    })
  end

groups = groups ++ [{"labelled scenarios", scenario_sessions}]

## Output

results =
  for {title, sessions} <- groups do
    {title, sessions, for({d, _} <- RealRuns.detectors(), do: RealRuns.figures(sessions, d))}
  end

seconds = (System.monotonic_time(:millisecond) - started) / 1000
list? = Keyword.get(opts, :list, false)

if Keyword.get(opts, :json, false) do
  IO.puts(
    JSON.encode!(%{
      settings: report.settings,
      elapsed_s: seconds,
      sources:
        for {title, sessions, figures} <- results do
          %{
            source: title,
            sessions: length(sessions),
            detectors:
              for f <- figures do
                if list?, do: f, else: Map.drop(f, [:missed, :false_alarms])
              end
          }
        end,
      stuck_labels:
        for {source, split, f} <- stuck_rows do
          f = if list?, do: f, else: Map.drop(f, [:missed, :false_alarms])
          Map.merge(f, %{source: source, split: split})
        end,
      exact_clean_read: clean_read_rows,
      exact_clean_alarm_reads:
        for({source, f} <- clean_alarm_rows, do: Map.put(f, :source, source)),
      exact_clean_stuck_share:
        for({source, e} <- clean_share_rows, do: Map.put(e, :source, source))
    })
  )
else
  s = report.settings

  IO.puts(
    "Settings: entropy window #{s.window_size}, LOOP below #{s.loop_threshold}; " <>
      "dev corpus #{dev_steps} steps replayed; #{Float.round(seconds, 1)} s in all\n"
  )

  for {title, sessions, figures} <- results do
    IO.write(RealRuns.table(title, sessions, figures))
  end

  if stuck_rows != [], do: IO.write(RealRuns.stuck_table(stuck_rows))
  if clean_read_rows != [], do: IO.write(RealRuns.clean_read_table(clean_read_rows))
  if clean_alarm_rows != [], do: IO.write(RealRuns.clean_alarm_reads_table(clean_alarm_rows))
  if clean_share_rows != [], do: IO.write(RealRuns.clean_stuck_share_table(clean_share_rows))

  if list? do
    # "dev corpus: all" would repeat the per-source lists.
    for {title, _sessions, figures} <- results, title != "dev corpus: all" do
      IO.write(RealRuns.lists(title, figures))
    end

    IO.write(RealRuns.stuck_lists(stuck_rows))
  end
end
