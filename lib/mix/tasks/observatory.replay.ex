defmodule Mix.Tasks.Observatory.Replay do
  @shortdoc "Replays recorded agent steps through the gateway and reports the loops"

  @moduledoc """
  Replays recorded agent steps through Observatory's real ingest path — DecisionLog
  validation, the EntropyTracker and the step detector — and reports, per session,
  where it first reached WARNING and LOOP.

      mix observatory.replay examples/agent_steps.jsonl
      mix observatory.replay logs/*.jsonl.gz --window-size 10 --loop-threshold 0.3
      zcat old/*.gz | mix observatory.replay --json > report.json

  Input is JSONL files, or stdin when no file (or `-`) is given; plain or gzip
  (recognised by its magic bytes, not by its name). Each line is a full DecisionLog
  envelope or a flat step record:

      {"session_id": "s1", "agent_id": "a1", "intent": "search", "tool_call": "grep",
       "action_status": "failure", "tool_input": {...}, "result": {...},
       "prompt_text": "...", "response_text": "..."}

  `agent_id`, `tool_input`, `result`, `prompt_text` and `response_text` are optional
  (`status` may stand for `action_status`); a record without `agent_id` is replayed as
  agent `"unknown-agent"`, one without `timestamp` at the time the replay started
  (`Observatory.Replay.Record` has the whole mapping). Lines that are not JSON objects
  or that the gateway rejects are counted and listed with their line numbers; they
  never stop the replay.

  The task starts the application without its HTTP server and demo fleet, keeps one
  envelope per session in the session log instead of 20 (nothing reads it), and
  silences the per-line `schema_violation` warnings (the report lists the bad lines).

  ## Options

    * `--json` — print the report as JSON instead of a table
    * `--flagged` — list only sessions that reached WARNING or LOOP or that the step
      detector warned or blocked (the summary still counts every session)
    * `--window-size N` — entropy window (default: `:entropy_window_size`, 5)
    * `--loop-threshold X` — LOOP below this score (default 0.25)
    * `--warning-threshold X` — WARNING below this score (default 0.50)
    * `--stagnation-warn N`, `--stagnation-block N` — step detector, repeated
      approach and outcome (default 3 and 5)
    * `--stuck-warn N`, `--stuck-block N` — step detector, new approaches with a
      repeated outcome (default 5 and 8)
    * `--workers N` — processes ingesting steps; sessions are spread over them by a
      hash of their id, each session's steps stay in order (default: one per
      scheduler)
    * `--no-progress`, `--quiet` (`-q`) — no progress bar; it is drawn on stderr when
      stderr is a terminal, or always with `--progress`

  ## Report

  Per session: its accepted steps; the step number (1-based, counting the session's
  accepted steps) of its first WARNING and first LOOP; its alerts; its lowest entropy
  score; and the steps at which the step detector first warned and blocked. Then the
  bad lines and a summary: sessions, steps, sessions with WARNING, sessions with LOOP
  (a session that loops usually passes through WARNING first and counts in both),
  alerts. An alert is an `EntropyAlertEvent`: the gateway sends one on every LOOP
  step (FR-9.4, FR-9.7), and `alerts` counts the steps scored LOOP, which is the same
  number.

  The task exits with status 1 when a source could not be read to the end (a read
  error or a corrupt gzip file), after printing the report.
  """

  use Mix.Task

  alias Observatory.Replay
  alias Observatory.Replay.Report

  @switches [
    json: :boolean,
    flagged: :boolean,
    window_size: :integer,
    loop_threshold: :float,
    warning_threshold: :float,
    stagnation_warn: :integer,
    stagnation_block: :integer,
    stuck_warn: :integer,
    stuck_block: :integer,
    workers: :integer,
    progress: :boolean,
    quiet: :boolean
  ]
  @overrides [
    :window_size,
    :loop_threshold,
    :warning_threshold,
    :stagnation_warn,
    :stagnation_block,
    :stuck_warn,
    :stuck_block
  ]

  @impl Mix.Task
  def run(argv) do
    {opts, files} = parse!(argv)
    sources = sources!(files)
    start_app()

    try do
      Replay.configure(Keyword.take(opts, @overrides))
    rescue
      e in ArgumentError -> Mix.raise("observatory.replay: #{Exception.message(e)}")
    end

    workers = Keyword.get(opts, :workers, System.schedulers_online())
    workers >= 1 || Mix.raise("observatory.replay: --workers must be at least 1")
    progress = progress(opts)
    level = Logger.level()
    Logger.configure(level: :error)

    report =
      try do
        Replay.run(sources, workers: workers, progress: progress && progress.update)
      after
        Logger.configure(level: level)
        progress && progress.clear.()
      end

    output =
      if opts[:json], do: [Report.json(report, opts), "\n"], else: Report.text(report, opts)

    IO.write(output)

    if report.input_errors != [] do
      Mix.raise(
        "observatory.replay: #{length(report.input_errors)} source(s) could not be read to the end"
      )
    end

    report
  end

  defp parse!(argv) do
    case OptionParser.parse(argv, strict: @switches, aliases: [q: :quiet]) do
      {opts, files, []} ->
        {opts, files}

      {_opts, _files, invalid} ->
        bad =
          Enum.map_join(invalid, ", ", fn {switch, value} ->
            if value, do: "#{switch} #{value}", else: switch
          end)

        Mix.raise(
          "observatory.replay: invalid option(s): #{bad} (see `mix help observatory.replay`)"
        )
    end
  end

  defp sources!([]), do: [:stdio]

  defp sources!(files) do
    for file <- files do
      cond do
        file == "-" -> :stdio
        File.regular?(file) -> file
        true -> Mix.raise("observatory.replay: no such file: #{file}")
      end
    end
  end

  # The application, without the HTTP server and the demo fleet; read config first so
  # that runtime.exs (e.g. OBSERVATORY_DEMO=1) cannot turn them back on.
  defp start_app do
    # Where Observatory already runs (its own test suite, an iex -S mix session),
    # configuring again would restart Logger under running code: only a fresh VM
    # configures and starts the application.
    running? = List.keymember?(Application.started_applications(), :observatory, 0)
    unless running?, do: Mix.Task.run("app.config")
    endpoint = Application.get_env(:observatory, ObservatoryWeb.Endpoint, [])

    Application.put_env(
      :observatory,
      ObservatoryWeb.Endpoint,
      Keyword.put(endpoint, :server, false)
    )

    Application.put_env(:observatory, :demo, false)
    Application.put_env(:observatory, :session_log_size, 1)
    unless running?, do: Mix.Task.run("app.start")
  end

  # A progress bar on stderr, redrawn at most 5 times a second: on a terminal, or
  # wherever stderr goes with --progress.
  defp progress(opts) do
    show? =
      case Keyword.fetch(opts, :progress) do
        {:ok, forced} -> forced
        :error -> not Keyword.get(opts, :quiet, false) and stderr_terminal?()
      end

    if show? do
      started = System.monotonic_time(:microsecond)
      last_draw = :atomics.new(1, signed: true)
      :atomics.put(last_draw, 1, started)

      %{
        update: fn info ->
          now = System.monotonic_time(:microsecond)

          if now - :atomics.get(last_draw, 1) >= 200_000 do
            :atomics.put(last_draw, 1, now)
            IO.write(:stderr, ["\r", Report.progress_line(info, now - started), "\e[K"])
          end
        end,
        clear: fn -> IO.write(:stderr, "\r\e[K") end
      }
    end
  end

  # OTP 25 cannot tell whether its stderr is a terminal (:io.columns/1 answers
  # :enotsup under -noshell), but a child process inherits that stderr and can.
  defp stderr_terminal? do
    case System.find_executable("sh") do
      nil -> false
      sh -> match?({_, 0}, System.cmd(sh, ["-c", "test -t 2"]))
    end
  end
end
