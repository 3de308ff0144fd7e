defmodule Observatory.Gateway.LoopVerdict do
  @moduledoc """
  One verdict per step and session — `:progress`, `:suspect` or `:loop` — with the rule
  that decided it, a reason in words and the step numbers that are its evidence
  (issue 8). It catches the loops FRD-009's uniqueness ratio misses and explains away
  the ones it invents.

  The ratio looks at `{intent, tool_call, status}` only: reading eight different files,
  polling a job that moves 10 % → 80 % or writing ten different files all look like a
  pure loop to it, and an agent that alternates edit/build, cycles A → B → C or tries
  `grep`, `rg`, `find` and `ack` for the same missing symbol never does. The verdict
  also looks at each step's **call** (tool + `action.tool_input`) and **outcome**
  (status + `action.result`), hashed by the DecisionLog parse from the canonical JSON
  it already writes for the step detector, with per-call ids normalized away:
  timestamps and Unix times, UUIDs, hex ids, and numbers after volatile words and keys
  (`pid 4242`, `"elapsed_ms": 239`). Plain numbers are kept: `file3.txt` and `file4.txt`
  are different calls, `progress: 10` and `progress: 80` different results.

      {:ok, result} = Observatory.Gateway.SchemaInterceptor.ingest(json)
      result.verdict
      #=> %{verdict: :loop, previous: :suspect, rule: :repeat,
      #     reason: "the same call 3 times in a row, its result saying nothing new",
      #     evidence: [4, 5, 6], step_number: 6}

  ## Rules

  Each session keeps its last `history` steps. On every step, in this order:

    * **repeat** (a) — the same call several times in a row: suspect when the last
      `repeat_suspect` of them had the same outcome, loop at `repeat_loop`;
      **progress** when the outcome changed (polling, a retry that worked);
    * **cycle** (b) — a block of 2..`max_period` calls repeated (A B A B, A B C A B C):
      suspect when its outcomes repeated for `cycle_suspect` blocks, loop at
      `cycle_loop`; **progress** when an outcome in the block changed. The same call
      whose answer flaps (X, Y, X, Y) is a cycle of outcomes, judged the same way;
    * **same_failure** (c) — the step failed (`failure`, `error`, `timeout`) with a
      result, and that same outcome ended `failure_suspect` / `failure_loop` different
      calls in the history;
    * **near_repeat** (e) — nearly identical calls in a row (the same tool, at least
      `near_share` percent of the input's word pairs the same), each with the same
      answer (word for word between different calls): suspect at
      `near_repeat_suspect`, loop at `near_repeat_loop` (`blank_near_repeat_loop` when
      every answer was empty). Also a loop when the newest `blank_near_repeat_loop`
      steps were all answered with nothing and each is a *rework* of another of them
      (re-sent, nearly identical, or the same tool's call keeping every word pair of the
      other and adding words, a stage appended to a pipeline that printed nothing):
      one command worked over while nothing comes back. The same command on other
      targets (a pair lost, or only digits changed) is no rework;
    * **failure_run** (f) — the newest non-empty answers all failed with the same error
      (numbers kept: a count of failing tests that moves is progress), whatever the
      calls, steps with an empty answer between them set aside: suspect at
      `failure_run_suspect`, loop at `failure_run_loop`. An error that quotes its own
      call is the same error when, without the call's words, it is the same and the
      later call is the earlier one with words added (a pipeline grown by a stage).
      Also when the newest answers all open with the same line, failures and successes
      mixed (the newest a failure, or two successes), none saying more than one other
      line: something in front of every call rejects it (a fence the shell runs as a
      command, a missing wrapper);
    * **revisit** (g) — the step repeats an earlier one (the same or a nearly identical
      call, the same non-empty answer; or the identical call, empty again, with only
      failures and empty answers since), and so do `revisit_suspect` / `revisit_loop`
      of the last `revisit_window` steps: re-run lookups, re-reads, cycles of any
      length up to the history;
    * **entropy** (d) — only when the others say nothing, and only if `entropy_rule`: the
      entropy severity is WARNING or LOOP. Explained (**progress**) when every
      `(call, outcome)` pair in the entropy window differs, suspect otherwise — never
      loop.

  No rule: progress. Otherwise the strongest level wins, ties to the earlier rule in the
  order (a), (b), (e), (f), (g), (c), (d). The guide `docs/stuck-detection.md` says what
  (e)–(g) see and how to tune them.

  ## Configuration

      config :observatory, :loop_verdict,
        history: 16,                      # steps remembered per session (2..64)
        repeat_suspect: 2, repeat_loop: 3,
        max_period: 5,                    # longest cycle looked for (1..8; 1: no cycles)
        cycle_suspect: 2, cycle_loop: 3,  # repetitions of the whole cycle
        failure_suspect: 3, failure_loop: :never,
        entropy_rule: true,
        near_share: 75,                   # nearly identical: % of input word pairs shared
        near_repeat_suspect: 3, near_repeat_loop: 4, blank_near_repeat_loop: 6,
        failure_run_suspect: 3, failure_run_loop: 4,
        revisit_window: 6, revisit_suspect: 2, revisit_loop: 3,
        # normalization, read at start and by reload_rules/0
        volatile_keys: :default,          # or a list of words that replaces the default
        extra_volatile_keys: [],          # added to them
        hex_ids: true, epoch_timestamps: true,
        normalize_input_numbers: false, normalize_result_numbers: false,
        max_sessions: 100_000             # read at start

  Thresholds are read on every step from the settings snapshot (`Observatory.configure/1`
  applies a change to the next step, `Application.put_env/3` within
  `:settings_refresh_ms`); an invalid set is logged once and replaced by the defaults. The normalization is read when the verdict starts (or by `reload_rules/0`):
  changing how steps hash in the middle of a session would make old and new steps
  incomparable. Sessions idle for `:entropy_session_ttl_ms` are forgotten.

  `config :observatory, :alert_source` (`:entropy`, the default, or `:verdict`) decides
  which signal raises `EntropyAlertEvent`s and topology states: see
  `Observatory.Gateway.AlertSource`.

  ## Events

  A change of verdict (progress → suspect, suspect → loop, loop → progress …) goes out
  on `"gateway:loop_verdict"`:

      %{event_type: "loop_verdict", session_id: "sess-1", agent_id: "agent-7",
        step_id: "s-6", step_number: 6, verdict: :loop, previous: :suspect,
        rule: :repeat, reason: "…", evidence: [4, 5, 6]}

  ## Design

  The rules run in Rust (`observatory_core::loop_verdict`): a `KeyedStore` of
  per-session rings, owned by this GenServer, called from the caller's process like the
  step detector; the GenServer only creates the store and sweeps idle sessions.
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{EntropyConfig, Events, IdleSweep}
  alias Observatory.{Native, NativeStores}

  @thresholds [
    history: 16,
    max_period: 5,
    repeat_suspect: 2,
    repeat_loop: 3,
    blank_repeat_loop: 4,
    cycle_suspect: 2,
    cycle_loop: 3,
    failure_suspect: 3,
    failure_loop: :never,
    entropy_rule: true,
    near_share: 75,
    near_repeat_suspect: 3,
    near_repeat_loop: 4,
    blank_near_repeat_loop: 6,
    failure_run_suspect: 3,
    failure_run_loop: 4,
    revisit_window: 6,
    revisit_suspect: 2,
    revisit_loop: 3
  ]
  @normalization [
    volatile_keys: :default,
    extra_volatile_keys: [],
    hex_ids: true,
    epoch_timestamps: true,
    normalize_input_numbers: false,
    normalize_result_numbers: false
  ]
  @defaults @thresholds ++ @normalization ++ [max_sessions: 100_000]
  # Where the rules' generation is kept (see rules/0).
  # Keyed by an atom (in :persistent_term and the process dictionary): a tuple key is
  # hashed on every read, ~20 ns each.
  @rules_generation __MODULE__.RulesGeneration

  @rules_text "each suspect threshold must be >= 2 and <= its loop threshold (or :never " <>
                "for failure_loop, failure_run_loop, revisit_loop), blank_repeat_loop and " <>
                "blank_near_repeat_loop >= 2, history 2..64, max_period 1..8, near_share 50..100, " <>
                "revisit_window 2..64"

  @type level :: :progress | :suspect | :loop
  @type rule ::
          :none
          | :repeat
          | :cycle
          | :near_repeat
          | :failure_run
          | :revisit
          | :same_failure
          | :entropy
  @typedoc """
  What the DecisionLog parse computes for the verdict, packed in one binary: the
  call's and the outcome's 64-bit hashes and their other views (the tool's, the
  input's word-pair set and its words without digits, the result's before
  normalization, its gist, skeleton and opening line), the result's line and number
  sketches, and whether it has a result, failed, is blank.
  Opaque: pass it from `DecisionLog.parse/1` to `observe/4`.
  """
  @type keys :: binary()
  @type verdict :: %{
          verdict: level(),
          previous: level() | nil,
          rule: rule(),
          reason: String.t(),
          evidence: [pos_integer()],
          step_number: pos_integer()
        }

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The topic of verdict changes."
  def topic, do: "gateway:loop_verdict"

  @doc "Every setting and its default."
  def defaults, do: @defaults

  @doc "The settings in force (defaults merged with `config :observatory, :loop_verdict`)."
  def settings do
    case Application.get_env(:observatory, :loop_verdict, []) do
      env when is_list(env) -> Keyword.merge(@defaults, env)
      _other -> @defaults
    end
  end

  @doc "The names of the per-step thresholds (`:history`, `:repeat_loop`, …)."
  @spec threshold_keys() :: [atom()]
  def threshold_keys, do: Keyword.keys(@thresholds)

  @doc """
  Checks thresholds (merged over the settings in force) the way every step does:
  `:ok`, or `{:error, message}` naming what is wrong.

      iex> Observatory.Gateway.LoopVerdict.check_thresholds(repeat_loop: 3)
      :ok
      iex> Observatory.Gateway.LoopVerdict.check_thresholds(repeat_suspect: 4, repeat_loop: 3)
      {:error, "invalid :loop_verdict thresholds: each suspect threshold must be >= 2 and <= its loop threshold (or :never for failure_loop, failure_run_loop, revisit_loop), blank_repeat_loop and blank_near_repeat_loop >= 2, history 2..64, max_period 1..8, near_share 50..100, revisit_window 2..64"}
  """
  @spec check_thresholds(keyword()) :: :ok | {:error, String.t()}
  def check_thresholds(thresholds) when is_list(thresholds) do
    if valid_config?(to_tuple(Keyword.merge(settings(), thresholds))),
      do: :ok,
      else: {:error, "invalid :loop_verdict thresholds: " <> @rules_text}
  end

  @doc "The default volatile words (from the Rust core)."
  @spec default_volatile_keys() :: [String.t()]
  def default_volatile_keys, do: Native.verdict_default_volatile_words()

  @doc """
  Judges one step of a session: `keys` as `Observatory.Gateway.DecisionLog.parse/1`
  gives them (`fields.verdict_keys`), `severity` the entropy tracker's for the same step
  (nil: rule (d) is skipped).

  A change of verdict is broadcast on `topic/0`; `:agent_id` and `:step_id` in `opts`
  go into that event. `:window_size` is the entropy window the severity was scored
  over, when the caller has read it for this step (default: read now).
  """
  @spec observe(String.t(), keys(), :loop | :warning | :normal | nil, keyword()) ::
          {:ok, verdict()} | {:error, atom()}
  def observe(session_id, keys, severity, opts \\ []) when is_binary(session_id) do
    with {:ok, store} <- store() do
      entropy =
        if severity,
          do: {severity, Keyword.get_lazy(opts, :window_size, &EntropyConfig.window_size/0)}

      store
      |> Native.verdict_observe(session_id, keys, entropy, config())
      |> settle(session_id, Keyword.get(opts, :agent_id), Keyword.get(opts, :step_id))
    end
  rescue
    e in [ArgumentError, ErlangError] ->
      Logger.error("LoopVerdict NIF verdict_observe failed: #{Exception.message(e)}")
      {:error, :internal_error}
  end

  @doc false
  # What `observe/4` makes of the NIF's answer (`verdict_observe`'s tuple or `{:error,
  # reason}`): the verdict, broadcast when it changed. Also for the ingest, which
  # observes through `Observatory.Gateway.StepScore`.
  @spec settle(tuple(), String.t(), String.t() | nil, String.t() | nil) ::
          {:ok, verdict()} | {:error, atom()}
  def settle({level, previous, rule, reason, evidence, step}, session_id, agent_id, step_id) do
    verdict = %{
      verdict: level,
      previous: previous,
      rule: rule,
      reason: reason,
      evidence: evidence,
      step_number: step
    }

    if level != (previous || :progress), do: announce(session_id, verdict, agent_id, step_id)
    {:ok, verdict}
  end

  def settle({:error, reason}, _session_id, _agent_id, _step_id), do: {:error, reason}

  @doc "The session's latest verdict (without `previous`), or nil."
  @spec session(String.t()) :: map() | nil
  def session(session_id) when is_binary(session_id) do
    with {:ok, store} <- store(),
         {level, rule, reason, evidence, step} <- Native.verdict_state(store, session_id) do
      %{verdict: level, rule: rule, reason: reason, evidence: evidence, step_number: step}
    else
      _ -> nil
    end
  end

  @doc "Sessions whose latest verdict is `:suspect` or `:loop` (for the dashboard)."
  @spec flagged(non_neg_integer()) :: [map()]
  def flagged(limit \\ 500) do
    case store() do
      {:ok, store} ->
        for {id, level, rule, reason, evidence, step} <- Native.verdict_list(store, limit) do
          %{
            session_id: id,
            verdict: level,
            rule: rule,
            reason: reason,
            evidence: evidence,
            step_number: step
          }
        end

      _ ->
        []
    end
  end

  @doc "Forgets a session's history (its next step starts afresh, as step 1)."
  @spec forget(String.t()) :: boolean()
  def forget(session_id) do
    case store() do
      {:ok, store} -> Native.verdict_forget(store, session_id)
      _ -> false
    end
  end

  @doc "Whether the verdict is running (its store exists)."
  @spec running?() :: boolean()
  def running?, do: match?({:ok, _}, store())

  @doc false
  # The normalization rules the DecisionLog parse hashes with (nil: the defaults).
  # Each process keeps the rules it read last, with the generation they were put
  # under: a step pays a `:persistent_term` read of an integer and a process
  # dictionary read (~0.015 µs) where the table's lookup, copying the rules' reference
  # out and counting it in and out, cost ~0.2 µs. Only the integer is a persistent
  # term: the rules themselves are not (see NativeStores for why). The rules are put
  # in the table before their generation, so a process that reads a new generation
  # finds the new rules.
  def rules do
    generation = :persistent_term.get(@rules_generation, 0)

    case Process.get(@rules_generation) do
      {^generation, rules} ->
        rules

      _ ->
        rules = NativeStores.get({__MODULE__, :rules}, nil)
        Process.put(@rules_generation, {generation, rules})
        rules
    end
  end

  defp put_rules do
    NativeStores.put({__MODULE__, :rules}, build_rules())
    :persistent_term.put(@rules_generation, :erlang.unique_integer([:positive, :monotonic]))
  end

  @doc """
  Rebuilds the normalization rules from the current configuration. Steps hashed
  before and after compare as different calls: call it between sessions.
  """
  @spec reload_rules() :: :ok
  def reload_rules, do: GenServer.call(__MODULE__, :reload_rules)

  ## Per-step configuration

  @doc false
  # The thresholds as `verdict_observe` takes them (a tuple), rebuilt only when the
  # application env changes: a step pays one env read and one comparison.
  def config, do: elem(configs(), 0)

  @doc false
  # The same thresholds packed as `score_step` takes them (`StepScore`, every step):
  # read whole by the NIF in one call, where the tuple took some thirty.
  def packed_config, do: elem(configs(), 1)

  @doc false
  # The same for the setting `env` as the caller read it (`StepScore`).
  def packed_config(env), do: elem(configs(env), 1)

  defp configs, do: configs(Application.get_env(:observatory, :loop_verdict, []))

  defp configs(env) do
    Observatory.DerivedSetting.get({__MODULE__, :config}, env, fn env ->
      tuple = build_config(env)
      {tuple, Native.verdict_config_pack(tuple)}
    end)
  end

  defp build_config(env) do
    tuple = to_tuple(if is_list(env), do: Keyword.merge(@defaults, env), else: @defaults)

    if valid_config?(tuple) do
      tuple
    else
      Logger.warning(
        "invalid :loop_verdict thresholds #{inspect(env)}: #{@rules_text}; using the defaults"
      )

      to_tuple(@defaults)
    end
  end

  defp to_tuple(s) do
    {s[:history], s[:max_period], {s[:repeat_suspect], s[:repeat_loop], s[:blank_repeat_loop]},
     {s[:cycle_suspect], s[:cycle_loop]}, {s[:failure_suspect], never_as_zero(s[:failure_loop])},
     s[:entropy_rule],
     {{s[:near_share], s[:near_repeat_suspect], s[:near_repeat_loop], s[:blank_near_repeat_loop]},
      {s[:failure_run_suspect], never_as_zero(s[:failure_run_loop])},
      {s[:revisit_window], s[:revisit_suspect], never_as_zero(s[:revisit_loop])}}}
  end

  # The NIF takes 0 for "never".
  defp never_as_zero(:never), do: 0
  defp never_as_zero(0), do: -1
  defp never_as_zero(n), do: n

  defp valid_config?(
         {history, period, {rs, rl, rb}, {cs, cl}, {fs, fl}, entropy,
          {{nb, ns, nl, nbl}, {frs, frl}, {rw, rvs, rvl}}} = tuple
       ) do
    Enum.all?(
      [history, period, rs, rl, rb, cs, cl, fs, fl, nb, ns, nl, nbl, frs, frl, rw, rvs, rvl],
      &(is_integer(&1) and &1 >= 0)
    ) and
      is_boolean(entropy) and Native.verdict_config_check(tuple) == :ok
  rescue
    _ in [ArgumentError, ErlangError] -> false
  end

  defp build_rules do
    s = settings()

    words =
      case s[:volatile_keys] do
        list when is_list(list) ->
          list

        :default ->
          default_volatile_keys()

        other ->
          Logger.warning(
            "invalid :loop_verdict :volatile_keys #{inspect(other)}: expected :default " <>
              "or a list of strings; using the default words"
          )

          default_volatile_keys()
      end

    Native.verdict_rules_new(
      s[:hex_ids] == true,
      s[:epoch_timestamps] == true,
      s[:normalize_input_numbers] == true,
      s[:normalize_result_numbers] == true,
      Enum.filter(words ++ List.wrap(s[:extra_volatile_keys]), &is_binary/1)
    )
  end

  defp announce(session_id, verdict, agent_id, step_id) do
    Events.broadcast(
      topic(),
      Map.merge(verdict, %{
        event_type: "loop_verdict",
        session_id: session_id,
        agent_id: agent_id,
        step_id: step_id
      })
    )
  end

  defp store do
    case store_or_nil() do
      nil -> {:error, :not_started}
      store -> {:ok, store}
    end
  end

  @doc false
  # The verdict's store, or nil when it is not running (for `StepScore`).
  def store_or_nil, do: NativeStores.get({__MODULE__, :store}, nil)

  ## Server

  @impl true
  def init(_opts) do
    max = settings()[:max_sessions]

    unless is_integer(max) and max > 0 do
      raise ArgumentError,
            "expected :loop_verdict :max_sessions to be a positive integer, got: #{inspect(max)}"
    end

    shards = max |> div(1024) |> max(1) |> min(64)
    put_rules()
    store = Native.verdict_store_new(shards, max)
    NativeStores.put({__MODULE__, :store}, store)
    Observatory.Gateway.StepScore.publish(:verdict, store)
    IdleSweep.schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_call(:reload_rules, _from, state) do
    put_rules()
    {:reply, :ok, state}
  end

  @impl true
  def handle_info(:sweep, state) do
    {:ok, store} = store()
    Native.verdict_sweep(store, System.monotonic_time(:millisecond), IdleSweep.ttl_ms())
    IdleSweep.schedule()
    {:noreply, state}
  end

  def handle_info(msg, state) do
    Logger.debug("LoopVerdict ignored an unexpected message: #{inspect(msg)}")
    {:noreply, state}
  end
end
