defmodule Observatory.Replay.Report do
  @moduledoc """
  Renders an `Observatory.Replay` report: a table for people, JSON for programs, and
  the progress line `mix observatory.replay` shows while it reads.
  """

  @doc """
  The report as text: settings, one row per session, the bad lines and the summary.

  ## Options
    * `:flagged` — list only the sessions that reached WARNING or LOOP or that the
      step detector warned or blocked (the summary still counts every session).
  """
  @spec text(Observatory.Replay.report(), keyword()) :: iodata()
  def text(report, opts \\ []) do
    sessions = sessions(report, opts)
    s = report.settings

    [
      "Replayed ",
      Enum.join(report.sources, ", "),
      "\n",
      "entropy: window #{s.window_size}, LOOP below #{s.loop_threshold}, WARNING below #{s.warning_threshold}; ",
      "step detector: stagnation warn #{s.stagnation_warn} block #{s.stagnation_block}, ",
      "stuck warn #{s.stuck_warn} block #{s.stuck_block}\n",
      verdict_settings(s),
      "alert source: #{s.alert_source}\n\n",
      table(sessions, length(report.sessions)),
      loop_verdicts(sessions),
      would_trip(report[:would_trip]),
      bad_lines(report),
      input_errors(report),
      summary(report)
    ]
  end

  @doc "The report as a JSON document (`--json`)."
  @spec json(Observatory.Replay.report(), keyword()) :: binary()
  def json(report, opts \\ []) do
    Observatory.JSON.encode!(%{
      sources: report.sources,
      settings: report.settings,
      summary: report.summary,
      lines: report.lines,
      sessions: sessions(report, opts),
      bad_lines: %{count: report.bad_lines, lines: report.bad},
      input_errors: report.input_errors,
      would_trip: report[:would_trip],
      elapsed_ms: div(report.elapsed_us, 1000)
    })
  end

  @doc """
  One progress line: a bar when the total size is known (files), a count otherwise
  (stdin).

      iex> Observatory.Replay.Report.progress_line(%{bytes: 50, total_bytes: 200, lines: 1500}, 2_000_000)
      "[#####               ]  25%  1,500 lines  750 lines/s"
      iex> Observatory.Replay.Report.progress_line(%{bytes: 50, total_bytes: nil, lines: 1500}, 1_000_000)
      "1,500 lines  1,500 lines/s"
  """
  @spec progress_line(map(), non_neg_integer()) :: String.t()
  def progress_line(%{bytes: bytes, total_bytes: total, lines: lines}, elapsed_us) do
    rate = if elapsed_us > 0, do: round(lines * 1_000_000 / elapsed_us), else: 0
    count = "#{delimit(lines)} lines  #{delimit(rate)} lines/s"

    case total do
      total when is_integer(total) and total > 0 ->
        fraction = min(bytes / total, 1.0)
        done = round(fraction * 20)

        percent =
          fraction |> Kernel.*(100) |> round() |> Integer.to_string() |> String.pad_leading(3)

        "[" <>
          String.duplicate("#", done) <>
          String.duplicate(" ", 20 - done) <> "] #{percent}%  " <> count

      _ ->
        count
    end
  end

  ## Text

  defp sessions(report, opts) do
    if Keyword.get(opts, :flagged, false),
      do: Enum.filter(report.sessions, &flagged?/1),
      else: report.sessions
  end

  defp flagged?(s),
    do:
      s.first_warning || s.first_loop || s.first_step_warning || s.first_step_block ||
        s.first_suspect || s.first_verdict_loop

  @headers [
    "session",
    "agent",
    "steps",
    "1st WARNING",
    "1st LOOP",
    "alerts",
    "lowest",
    "step detector",
    "verdict"
  ]
  # Right-aligned columns.
  @right [false, false, true, true, true, true, true, false, false]

  defp table([], 0), do: "No steps were accepted.\n\n"
  defp table([], _all), do: "No session was flagged.\n\n"

  defp table(sessions, _all) do
    rows = Enum.map(sessions, &row/1)

    widths =
      Enum.reduce(rows, Enum.map(@headers, &String.length/1), fn row, widths ->
        Enum.zip_with(row, widths, &max(String.length(&1), &2))
      end)

    Enum.map([@headers | rows], fn row ->
      cells =
        [row, widths, @right]
        |> Enum.zip_with(fn [cell, width, right?] ->
          if right?, do: String.pad_leading(cell, width), else: String.pad_trailing(cell, width)
        end)

      [cells |> Enum.join("  ") |> String.trim_trailing(), "\n"]
    end) ++ ["\n"]
  end

  defp row(s) do
    [
      s.session_id,
      s.agent_id,
      Integer.to_string(s.steps),
      step(s.first_warning),
      step(s.first_loop),
      Integer.to_string(s.alerts),
      score(s.lowest_score),
      step_detector(s),
      verdict(s)
    ]
  end

  defp verdict_settings(%{verdict: v} = s) do
    never = fn n -> if n == :never, do: "never", else: n end

    [
      "verdict: repeat suspect #{v.repeat_suspect} loop #{v.repeat_loop} ",
      "(blank results #{v.blank_repeat_loop}), cycles up to #{v.max_period} calls ",
      "suspect #{v.cycle_suspect} loop #{v.cycle_loop}, near repeat (#{v.near_share} % shared) ",
      "suspect #{v.near_repeat_suspect} loop #{v.near_repeat_loop} ",
      "(blank results #{v.blank_near_repeat_loop}), failure run suspect ",
      "#{v.failure_run_suspect} loop #{never.(v.failure_run_loop)}, revisits in ",
      "#{v.revisit_window} steps suspect #{v.revisit_suspect} loop #{never.(v.revisit_loop)}, ",
      "same failure suspect #{v.failure_suspect} loop #{never.(v.failure_loop)}, ",
      "history #{v.history}",
      if(s.extra_volatile_keys == [],
        do: "",
        else: "; extra volatile keys: #{Enum.join(s.extra_volatile_keys, ", ")}"
      ),
      "\n"
    ]
  end

  # Why each session's verdict first said loop: the rule, the reason, the evidence.
  defp loop_verdicts(sessions) do
    case Enum.filter(sessions, & &1.first_verdict_loop) do
      [] ->
        []

      looped ->
        [
          "Loop verdicts (first loop: rule, reason, evidence steps)\n",
          Enum.map(looped, fn s ->
            [
              "  #{s.session_id}  step #{s.first_verdict_loop.step}  #{s.verdict_rule}: ",
              "#{s.verdict_reason} [#{Enum.join(s.verdict_evidence, ", ")}]\n"
            ]
          end),
          "\n"
        ]
    end
  end

  # The shadow run of the kill switch and the budgets on the recorded LLM requests.
  defp would_trip(nil), do: []

  defp would_trip(w) do
    ks = w.kill_switch
    b = w.budgets
    limits = for {k, v} <- b.limits, k != :window_seconds, v != nil, do: "#{k} #{v}"

    [
      "Kill switch and budgets on #{delimit(w.requests)} recorded LLM requests of #{w.agents} agent(s) ",
      "(#{delimit(w.spent.tokens)} tokens, #{usd(w.spent.cost_usd)}), each alone, in enforce mode\n",
      "  kill switch (window #{ks.window_size}, threshold #{ks.threshold}): ",
      "#{ks.agents_stopped} agent(s) would have been stopped\n",
      Enum.map(ks.trips, fn t ->
        [
          "    #{t.agent_id}  at its request #{t.request} (#{t.source}:#{t.line}",
          if(t.at, do: ", #{t.at}", else: ""),
          ")  score #{t.score}  would have saved #{saved(t.saved)}\n"
        ]
      end),
      "  budgets (",
      if(limits == [], do: "no limit", else: Enum.join(limits, ", ")),
      if(Enum.any?(limits, &String.starts_with?(&1, "window")),
        do: "; window #{b.limits.window_seconds} s",
        else: ""
      ),
      "): #{length(b.stops)} stop(s)\n",
      Enum.map(b.stops, fn stop ->
        who =
          if stop.scope == :session,
            do: "session #{stop.session_id} of #{stop.agent_id}",
            else: "agent #{stop.agent_id} (its window)"

        [
          "    #{who}: #{stop.limit} #{stop.used} of #{stop.max} at #{stop.source}:#{stop.line}",
          if(stop.at, do: " (#{stop.at})", else: ""),
          "  would have saved #{saved(stop.saved)}\n"
        ]
      end),
      "  would have saved in all: kill switch #{saved(ks.saved)}; budgets #{saved(b.saved)}\n\n"
    ]
  end

  defp saved(s),
    do: "#{delimit(s.requests)} requests, #{delimit(s.tokens)} tokens, #{usd(s.cost_usd)}"

  defp usd(cost), do: "$" <> :erlang.float_to_binary(cost / 1, decimals: 4)

  defp verdict(%{first_verdict_loop: %{step: n}, verdict_rule: rule}),
    do: "loop at #{n} (#{rule})"

  defp verdict(%{first_suspect: %{step: n}}), do: "suspect at #{n}"
  defp verdict(_session), do: "-"

  defp step(nil), do: "-"
  defp step(%{step: n}), do: Integer.to_string(n)

  defp score(nil), do: "-"
  defp score(score), do: to_string(score)

  defp step_detector(%{first_step_warning: nil, first_step_block: nil}), do: "-"

  defp step_detector(s) do
    [
      s.first_step_warning && "warn at #{s.first_step_warning.step}",
      s.first_step_block && "blocked at #{s.first_step_block.step}"
    ]
    |> Enum.reject(&is_nil/1)
    |> Enum.join(", ")
  end

  defp bad_lines(%{bad_lines: 0}), do: []

  defp bad_lines(report) do
    shown = length(report.bad)

    [
      "Bad lines: #{report.bad_lines}",
      if(shown < report.bad_lines, do: " (the first #{shown} below)", else: ""),
      "\n",
      Enum.map(report.bad, fn bad ->
        ["  ", bad.source, ":", Integer.to_string(bad.line), "  ", bad.reason, "\n"]
      end),
      "\n"
    ]
  end

  defp input_errors(%{input_errors: []}), do: []

  defp input_errors(report) do
    [
      "Input errors (these sources were not read to the end):\n",
      Enum.map(report.input_errors, &["  ", &1.source, ": ", &1.reason, "\n"]),
      "\n"
    ]
  end

  defp summary(report) do
    s = report.summary
    seconds = report.elapsed_us / 1_000_000
    rate = if report.elapsed_us > 0, do: round(s.steps / seconds), else: 0

    [
      "Summary\n",
      line("sessions", s.sessions),
      line("steps", s.steps),
      replayed_line(s),
      line("sessions with WARNING", s.sessions_warning),
      line("sessions with LOOP", s.sessions_loop),
      line("alerts (LOOP steps)", s.alerts),
      line("step detector warned", s.sessions_step_warning),
      line("step detector blocked", s.sessions_step_block),
      line("verdict SUSPECT", s.sessions_verdict_suspect),
      line("verdict LOOP", s.sessions_verdict_loop),
      line("alarmed (#{s.alert_source})", s.sessions_alarmed),
      line("bad lines", s.bad_lines),
      "  #{String.pad_trailing("time", 24)}#{:erlang.float_to_binary(seconds, decimals: 2)} s (#{delimit(rate)} steps/s)\n"
    ]
  end

  # Only when the input held steps met twice (a recorded retry, a re-sent request).
  defp replayed_line(%{replayed_steps: n}) when n > 0, do: line("steps met again", n)
  defp replayed_line(_summary), do: []

  defp line(label, n), do: ["  ", String.pad_trailing(label, 24), delimit(n), "\n"]

  defp delimit(n) when is_integer(n) do
    n
    |> Integer.to_string()
    |> String.reverse()
    |> String.replace(~r/(\d{3})(?=\d)/, "\\1,")
    |> String.reverse()
  end
end
