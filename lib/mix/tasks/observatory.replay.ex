defmodule Mix.Tasks.Observatory.Replay do
  @shortdoc "Replays recorded agent steps through the gateway and reports the loops"

  @moduledoc """
  Replays recorded agent steps through Observatory's real ingest path — DecisionLog
  validation, the EntropyTracker, the step detector and the loop verdict — and reports,
  per session, where it first reached WARNING and LOOP and where the verdict first said
  loop, and why.

      mix observatory.replay examples/agent_steps.jsonl
      mix observatory.replay logs/*.jsonl.gz --window-size 10 --loop-threshold 0.3
      mix observatory.replay logs/*.jsonl.gz --alert-source verdict --extra-volatile-keys job_token
      zcat old/*.gz | mix observatory.replay --json > report.json

  Input is JSONL files, or stdin when no file (or `-`) is given; plain or gzip
  (recognised by its magic bytes, not by its name). Each line is a full DecisionLog
  envelope, a recorded LLM request (`{"api": "chat_completions" | "messages",
  "agent_id", "session_id", "request": body}`: the previous turn's tool calls are its
  steps, each once; see `Observatory.Replay.ProxyRequest`) or a flat step record:

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
  The report is all that goes to stdout: the application's logs go to stderr. In a
  fresh VM the application gets a temporary data directory of its own, so a replay
  never touches — or waits for the lock of — a gateway running on the configured one.

  ## Options

    * `--json` — print the report as JSON instead of a table: stdout carries nothing
      else (logs and the compiler's messages go to stderr)
    * `--flagged` — list only sessions that reached WARNING or LOOP, that the step
      detector warned or blocked, or that the verdict called suspect or loop (the
      summary still counts every session)
    * `--window-size N` — entropy window (default: `:entropy_window_size`, 5)
    * `--loop-threshold X` — LOOP below this score (default 0.25)
    * `--warning-threshold X` — WARNING below this score (default 0.50)
    * `--stagnation-warn N`, `--stagnation-block N` — step detector, repeated
      approach and outcome (default 3 and 5)
    * `--stuck-warn N`, `--stuck-block N` — step detector, new approaches with a
      repeated outcome (default 5 and 8)
    * `--alert-source entropy|verdict` — which signal's alarms the summary counts as
      `alarmed` (default: `config :observatory, :alert_source`, `entropy`); both are
      always in the table
    * the loop verdict's thresholds (defaults: `config :observatory, :loop_verdict`):
      `--history N` (steps remembered, 2..64), `--repeat-suspect N`, `--repeat-loop N`
      (the same call saying nothing new, in a row; 2 and 3), `--blank-repeat-loop N`
      (the same, every result empty; 4), `--max-period N` (longest cycle, 1..8; 5),
      `--cycle-suspect N`, `--cycle-loop N` (2 and 3), `--failure-suspect N`,
      `--failure-loop N|never` (different calls, the same failure; 3 and never),
      `--near-share N` (the percent of input word pairs two nearly identical calls
      share, 50..100; 75; 100: identical calls only), `--near-repeat-suspect N`, `--near-repeat-loop N` (nearly identical
      calls in a row, the same result; 3 and 4), `--blank-near-repeat-loop N` (the
      same, every result empty; 6), `--failure-run-suspect N`,
      `--failure-run-loop N|never` (calls in a row failing with the same error; 3 and
      4), `--revisit-window N`, `--revisit-suspect N`, `--revisit-loop N|never`
      (earlier calls re-run with the same result among the last N steps; 6, 2 and 3)
    * `--extra-volatile-keys k1,k2` — words whose numbers or string values are per-call
      ids in your logs (`job_token`, `run`), added to the verdict's volatile words;
      repeatable
    * `--workers N` — processes ingesting steps; sessions are spread over them by a
      hash of their id, each session's steps stay in order (default: one per
      scheduler)
    * `--no-progress`, `--quiet` (`-q`) — no progress bar; it is drawn on stderr when
      stderr is a terminal, or always with `--progress`

  Recorded LLM requests also go through the kill switch and the budgets in a shadow
  run (`Observatory.Replay.WouldTrip`); its settings:

    * `--kill-switch-window N`, `--kill-switch-threshold X` — default: the settings of
      new agents (`config :observatory, :kill_switch`; 5 and 5.5)
    * `--budget-session-requests N`, `--budget-session-tokens N`,
      `--budget-session-cost USD`, `--budget-window-requests N`,
      `--budget-window-tokens N`, `--budget-window-cost USD`, `--budget-window-seconds N`
      — limits, over the defaults of new agents (`config :observatory, :budgets,
      :defaults`)
    * `--prices FILE` — the price table, JSON: `{"gpt-4.1": {"input": 2.0, "output": 8.0}}`
      (USD per million tokens), instead of `config :observatory, :budgets, :prices`

  ## Report

  For recorded LLM requests, which agents the kill switch would have stopped and which
  sessions (or agents' windows) the budgets would have, at which request and line,
  and what the requests refused from there would have saved (requests, tokens, cost).

  Per session: its accepted steps; the step number (1-based, counting the session's
  accepted steps) of its first WARNING and first LOOP; its alerts; its lowest entropy
  score; the steps at which the step detector first warned and blocked; and where the
  loop verdict first said suspect or loop, with its rule. Then, for every session the
  verdict called a loop, the rule, the reason in words and the evidence steps; the bad
  lines; and a summary: sessions, steps, sessions with WARNING, sessions with LOOP (a
  session that loops usually passes through WARNING first and counts in both), alerts,
  the verdict's suspects and loops, and the sessions alarmed under the alert source. An alert is an `EntropyAlertEvent`: the gateway sends one on every LOOP
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
    quiet: :boolean,
    alert_source: :string,
    history: :integer,
    max_period: :integer,
    repeat_suspect: :integer,
    repeat_loop: :integer,
    blank_repeat_loop: :integer,
    cycle_suspect: :integer,
    cycle_loop: :integer,
    failure_suspect: :integer,
    failure_loop: :string,
    near_share: :integer,
    near_repeat_suspect: :integer,
    near_repeat_loop: :integer,
    blank_near_repeat_loop: :integer,
    failure_run_suspect: :integer,
    failure_run_loop: :string,
    revisit_window: :integer,
    revisit_suspect: :integer,
    revisit_loop: :string,
    extra_volatile_keys: :keep,
    kill_switch_window: :integer,
    kill_switch_threshold: :float,
    budget_session_requests: :integer,
    budget_session_tokens: :integer,
    budget_session_cost: :float,
    budget_window_seconds: :integer,
    budget_window_requests: :integer,
    budget_window_tokens: :integer,
    budget_window_cost: :float,
    prices: :string
  ]
  @budget_flags [
    budget_session_requests: "session_requests",
    budget_session_tokens: "session_tokens",
    budget_session_cost: "session_cost_usd",
    budget_window_seconds: "window_seconds",
    budget_window_requests: "window_requests",
    budget_window_tokens: "window_tokens",
    budget_window_cost: "window_cost_usd"
  ]
  @overrides [
    :window_size,
    :loop_threshold,
    :warning_threshold,
    :stagnation_warn,
    :stagnation_block,
    :stuck_warn,
    :stuck_block,
    :alert_source,
    :history,
    :max_period,
    :repeat_suspect,
    :repeat_loop,
    :blank_repeat_loop,
    :cycle_suspect,
    :cycle_loop,
    :failure_suspect,
    :failure_loop,
    :near_share,
    :near_repeat_suspect,
    :near_repeat_loop,
    :blank_near_repeat_loop,
    :failure_run_suspect,
    :failure_run_loop,
    :revisit_window,
    :revisit_suspect,
    :revisit_loop,
    :extra_volatile_keys
  ]

  @impl Mix.Task
  def run(argv) do
    {opts, files} = parse!(argv)
    sources = sources!(files)
    start_app(opts)

    try do
      Replay.configure(Keyword.take(opts, @overrides))
    rescue
      e in ArgumentError -> Mix.raise("observatory.replay: #{Exception.message(e)}")
    end

    shadow = shadow_settings!(opts)
    workers = Keyword.get(opts, :workers, System.schedulers_online())
    workers >= 1 || Mix.raise("observatory.replay: --workers must be at least 1")
    progress = progress(opts)
    level = Logger.level()
    Logger.configure(level: :error)

    report =
      try do
        Replay.run(sources, [workers: workers, progress: progress && progress.update] ++ shadow)
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

  # The kill switch's and the budgets' settings for the shadow run of recorded LLM
  # requests, and the price table (--prices FILE, JSON: model => {input, output, …}).
  defp shadow_settings!(opts) do
    if file = opts[:prices] do
      prices =
        with {:ok, text} <- File.read(file),
             {:ok, %{} = prices} <- Observatory.JSON.decode(text) do
          prices
        else
          _ ->
            Mix.raise(
              "observatory.replay: --prices #{file} must be a JSON object of model => prices"
            )
        end

      budgets = Application.get_env(:observatory, :budgets, [])
      Application.put_env(:observatory, :budgets, Keyword.put(budgets, :prices, prices))

      try do
        Observatory.Budget.Prices.check!()
      rescue
        e in ArgumentError ->
          Mix.raise("observatory.replay: --prices #{file}: #{Exception.message(e)}")
      end
    end

    kill_switch =
      for {flag, key} <- [kill_switch_window: :window_size, kill_switch_threshold: :threshold],
          Keyword.has_key?(opts, flag),
          do: {key, opts[flag]}

    if n = kill_switch[:window_size],
      do:
        n in Observatory.KillSwitch.Settings.window_sizes() ||
          bad_flag!("--kill-switch-window must be 2 to 1000, got: #{n}")

    if t = kill_switch[:threshold],
      do: t > 0 || bad_flag!("--kill-switch-threshold must be greater than 0, got: #{t}")

    params =
      for {flag, key} <- @budget_flags,
          Keyword.has_key?(opts, flag),
          into: %{},
          do: {key, opts[flag]}

    budget =
      case Observatory.Budget.Settings.validate(params) do
        {:ok, changes} ->
          Keyword.new(changes)

        {:error, violations} ->
          flags =
            Map.new(@budget_flags, fn {flag, key} ->
              {key, "--" <> String.replace(Atom.to_string(flag), "_", "-")}
            end)

          bad_flag!(Enum.map_join(violations, "; ", &"#{flags[&1.path] || &1.path} #{&1.reason}"))
      end

    [kill_switch: kill_switch, budget: budget]
  end

  defp parse!(argv) do
    case OptionParser.parse(argv, strict: @switches, aliases: [q: :quiet]) do
      {opts, files, []} ->
        {typed(opts), files}

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

  # The flags that are not plain numbers: --alert-source, --failure-loop,
  # --failure-run-loop and --revisit-loop (N or never), --extra-volatile-keys
  # (repeatable, comma-separated).
  defp typed(opts) do
    {words, opts} = Keyword.pop_values(opts, :extra_volatile_keys)
    words = Enum.flat_map(words, &String.split(&1, ",", trim: true)) |> Enum.map(&String.trim/1)

    opts
    |> Keyword.new(fn
      {:alert_source, "entropy"} ->
        {:alert_source, :entropy}

      {:alert_source, "verdict"} ->
        {:alert_source, :verdict}

      {:alert_source, other} ->
        bad_flag!("--alert-source must be entropy or verdict, got: #{other}")

      {key, "never"} when key in [:failure_loop, :failure_run_loop, :revisit_loop] ->
        {key, :never}

      {key, n} when key in [:failure_loop, :failure_run_loop, :revisit_loop] ->
        {key, integer_flag!("--" <> String.replace(Atom.to_string(key), "_", "-"), n)}

      other ->
        other
    end)
    |> then(&if(words == [], do: &1, else: Keyword.put(&1, :extra_volatile_keys, words)))
  end

  defp integer_flag!(flag, text) do
    case Integer.parse(text) do
      {n, ""} -> n
      _ -> bad_flag!("#{flag} must be an integer or never, got: #{text}")
    end
  end

  defp bad_flag!(message), do: Mix.raise("observatory.replay: #{message}")

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
  # that runtime.exs (e.g. OBSERVATORY_DEMO=1) cannot turn them back on. The report is
  # the only thing on stdout: logs go to stderr, and with --json so does the compiler's
  # chatter.
  defp start_app(opts) do
    # Where Observatory already runs (its own test suite, an iex -S mix session),
    # configuring again would restart Logger under running code: only a fresh VM
    # configures and starts the application.
    running? = List.keymember?(Application.started_applications(), :observatory, 0)

    unless running? do
      shell = Mix.shell()
      if opts[:json], do: Mix.shell(Mix.Shell.Quiet)

      try do
        Mix.Task.run("app.config")
      after
        Mix.shell(shell)
      end

      Logger.configure_backend(:console, device: :standard_error)
    end

    Replay.prepare_app(own_data_dir: not running?)
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
