defmodule Observatory.Gateway.EntropyTracker do
  @moduledoc """
  The single owner of per-session entropy windows (FRD-009, ADR-018, UC-0250).

  Every step of an agent session is reduced to an `{intent, tool_call, action_status}`
  tuple. The tracker keeps the last N tuples of each session (N =
  `:entropy_window_size`, default 5) and scores the window by its uniqueness ratio,
  `distinct / length`, rounded to 4 places:

      iex> alias Observatory.Gateway.EntropyTracker
      iex> EntropyTracker.record_and_score("doc-sess", {"search", "read_file", :failure}, agent_id: "agent-1")
      {:ok, 1.0, :normal}

  | score | severity | what happens |
  |---|---|---|
  | `< 0.25` | `:loop` | `EntropyAlertEvent` on `"gateway:entropy_alerts"`, node `alert_entropy` |
  | `0.25 ≤ s < 0.50` | `:warning` | node `blocked` (amber), no alert |
  | `≥ 0.50` | `:normal` | nothing, or node back to `active` after WARNING/LOOP |

  Thresholds and window size are read from the application environment on every call
  (see `Observatory.Gateway.EntropyConfig`).

  ## Design

  The windows live in a Rust store (a NIF resource) created and owned by this
  GenServer. Callers do not queue behind the GenServer: `record_and_score/3` calls the
  NIF in the caller's own process, and the store is sharded with a lock per shard, so
  two schedulers record at once. The handle is kept where only this module looks it up
  and no public function returns it: no other module can touch the windows (FR-9.1).

  If the tracker crashes, its supervisor restarts it with a new, empty store: windows
  restart from scratch and callers get no error (UC-0250 F1).

  Memory is bounded: sessions idle longer than `:entropy_session_ttl_ms` are swept
  every `:entropy_sweep_interval_ms`, and at most about `:entropy_max_sessions` are kept
  (the least recently seen are evicted first). Idle time is measured on a clock the
  tracker advances every `:entropy_clock_tick_ms` (1 s), so a step costs no OS clock
  read. Those four are read when the tracker starts.
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{
    ActionStatus,
    Alerts,
    AlertSource,
    EntropyAlertEvent,
    EntropyConfig,
    Events,
    StepScore
  }

  alias Observatory.Gateway.Topology
  alias Observatory.{Native, NativeStores}

  @type severity :: :loop | :warning | :normal
  @type entropy_tuple :: {intent :: String.t(), tool_call :: String.t(), ActionStatus.t()}
  @type reason ::
          :invalid_session_id
          | :invalid_agent_id
          | :invalid_tuple
          | :invalid_status
          | :field_too_long
          | :invalid_utf8
          | :missing_agent_id
          | :not_started
          | :internal_error

  # Shards cut lock contention between schedulers; each holds at least ~1024 sessions
  # so that least-recently-seen eviction, exact within a shard, stays close to global.
  @max_shards 64
  @min_sessions_per_shard 1024

  ## Client API

  @doc """
  Starts a tracker.

  ## Options
    * `:name` — registered name, default `#{inspect(__MODULE__)}`.
    * `:max_sessions` — default `Application.get_env(:observatory, :entropy_max_sessions, 1_000_000)`.
    * `:session_ttl_ms` — default `:entropy_session_ttl_ms`, 30 minutes.
    * `:sweep_interval_ms` — default `:entropy_sweep_interval_ms`, 60 seconds.
    * `:tick_ms` — default `:entropy_clock_tick_ms`, 1 second: the resolution of idle time.
  """
  def start_link(opts \\ []) do
    name = Keyword.get(opts, :name, __MODULE__)

    unless is_atom(name) do
      raise ArgumentError, "expected :name to be an atom, got: #{inspect(name)}"
    end

    GenServer.start_link(__MODULE__, Keyword.put(opts, :name, name), name: name)
  end

  @doc "Same as `record_and_score/3` with no options."
  @spec record_and_score(String.t(), entropy_tuple()) ::
          {:ok, float(), severity()} | {:error, reason()}
  def record_and_score(session_id, tuple), do: record_and_score(session_id, tuple, [])

  @doc """
  Appends `tuple` to the session's window, scores it and acts on the severity.

  Returns `{:ok, score, severity}`, or `{:error, reason}` for bad input (nothing is
  recorded) and for a LOOP whose session has no known agent (`:missing_agent_id`: the
  window is updated, the alert is not sent, a warning is logged; FR-9.7).

  ## Options
    * `:agent_id` — the session's agent; remembered for later calls that omit it.
    * `:tracker` — the tracker's name, default `#{inspect(__MODULE__)}`.
    * `:alerts` — `true` (default) to act on the severity as FR-9.4–9.6 say; `false` to
      score only, with no broadcast (and no `:missing_agent_id`): what
      `SchemaInterceptor` does when `config :observatory, :alert_source, :verdict`
      hands alerting to `Observatory.Gateway.AlertSource`.
    * `:config` — `Observatory.Gateway.EntropyConfig.read/0` as the caller read it for
      this call (default: read now). The ingest reads it once per step and hands it to
      the loop verdict too.
  """
  @spec record_and_score(String.t(), entropy_tuple(), keyword()) ::
          {:ok, float(), severity()} | {:error, reason()}
  def record_and_score(session_id, tuple, opts)

  def record_and_score(session_id, {intent, tool_call, status}, opts)
      when is_binary(session_id) and is_binary(intent) and is_binary(tool_call) and
             is_list(opts) do
    with {:ok, code} <- ActionStatus.to_code(status),
         {:ok, agent_id} <- agent_id(opts),
         {:ok, store} <- store(opts) do
      {window_size, loop_threshold, warning_threshold} =
        Keyword.get_lazy(opts, :config, &EntropyConfig.read/0)

      store
      |> record(
        session_id,
        intent,
        tool_call,
        code,
        agent_id,
        window_size,
        loop_threshold,
        warning_threshold
      )
      |> settle(session_id, agent_id, Keyword.get(opts, :alerts, true) != false)
    end
  end

  def record_and_score(session_id, _tuple, _opts) when not is_binary(session_id),
    do: {:error, :invalid_session_id}

  def record_and_score(_session_id, _tuple, _opts), do: {:error, :invalid_tuple}

  @doc false
  # What `record_and_score/3` makes of the NIF's answer (`entropy_record`'s tuple or
  # `{:error, reason}`): acts on the severity if `alerts?`, emits the score's telemetry.
  # Also for the ingest, which records through `Observatory.Gateway.StepScore`.
  @spec settle(tuple(), String.t(), String.t() | nil, boolean()) ::
          {:ok, float(), severity()} | {:error, reason()}
  def settle(recorded, session_id, agent_id, alerts?) do
    recorded
    |> act(session_id, alerts?)
    |> emit_score(session_id, agent_id)
  end

  @doc false
  # The ingest's one NIF call per step (`Observatory.Gateway.StepScore`): the step's
  # tuple recorded in `tracker`'s window and, in the same call, the loop verdict and the
  # step detector over their own stores (`others`: `{keys, verdict_config, step,
  # step_settings}`, the settings packed as `LoopVerdict.packed_config/0` and
  # `StepDetector.scoring_settings/0` give them). The three stores are found with one
  # lookup, in the row their owners publish them in (`StepScore.publish/2`; a tracker
  # of another name is looked up apart). Made here so that the tracker's store never
  # leaves this module (FR-9.1). Returns `Native.score_step/7`'s answer; raises what
  # the NIF raises for arguments of the wrong shape.
  def score_step(tracker, session_id, entropy, others) do
    {keys, verdict_config, step, step_settings} = others

    {_, default, verdict_store, step_store} =
      NativeStores.get_row_cached(StepScore) || {StepScore, nil, nil, nil}

    store =
      if tracker == __MODULE__,
        do: default,
        else: NativeStores.get({__MODULE__, tracker}, nil)

    Native.score_step(
      {store, verdict_store, step_store},
      session_id,
      entropy,
      keys,
      verdict_config,
      step,
      step_settings
    )
  end

  # The event's maps are built only when events go somewhere (a dispatcher).
  defp emit_score({:ok, score, severity} = result, session_id, agent_id) do
    case Observatory.Telemetry.dispatcher() do
      nil ->
        result

      dispatcher ->
        dispatcher.execute([:observatory, :entropy, :score], %{score: score}, %{
          session_id: session_id,
          agent_id: agent_id,
          severity: severity
        })

        result
    end
  end

  defp emit_score(error, _session_id, _agent_id), do: error

  @doc """
  The session's current state, or `nil` if it has no window.

      %{window: [{"plan", "write_file", :success}, ...], agent_id: "agent-1",
        score: 1.0, severity: :normal}
  """
  @spec session(String.t(), keyword()) :: map() | nil
  def session(session_id, opts \\ []) when is_binary(session_id) do
    with {:ok, store} <- store(opts),
         {window, agent_id, score, severity, _last_seen} <-
           call_nif(store, :entropy_session, [session_id]) do
      %{
        window: Enum.map(window, fn {i, t, code} -> {i, t, ActionStatus.from_code(code)} end),
        agent_id: agent_id,
        score: score,
        severity: severity
      }
    else
      _ -> nil
    end
  end

  @doc "The session's window, oldest first (`[]` when it has none)."
  @spec window(String.t(), keyword()) :: [entropy_tuple()]
  def window(session_id, opts \\ []) do
    case session(session_id, opts) do
      %{window: window} -> window
      nil -> []
    end
  end

  @doc """
  Up to `limit` sessions (default 1000), most recently seen first, for dashboards:
  `%{session_id, agent_id, score, severity, idle_ms}`.
  """
  @spec sessions(keyword()) :: [map()]
  def sessions(opts \\ []) do
    with {:ok, store} <- store(opts) do
      now = System.monotonic_time(:millisecond)

      for {id, agent, score, severity, seen} <-
            Native.entropy_list(store, Keyword.get(opts, :limit, 1000)) do
        %{
          session_id: id,
          agent_id: agent,
          score: score,
          severity: severity,
          idle_ms: max(now - seen, 0)
        }
      end
    else
      _ -> []
    end
  end

  @doc "Drops a session's window (its next step starts a fresh one)."
  @spec forget(String.t(), keyword()) :: boolean()
  def forget(session_id, opts \\ []) when is_binary(session_id) do
    case store(opts) do
      {:ok, store} -> call_nif(store, :entropy_forget, [session_id]) == true
      _ -> false
    end
  end

  @doc "Counts: sessions held, evicted over capacity, expired by TTL."
  @spec stats(keyword()) :: %{
          sessions: non_neg_integer(),
          evicted: non_neg_integer(),
          expired: non_neg_integer()
        }
  def stats(opts \\ []) do
    {:ok, store} = store(opts)
    {sessions, evicted, expired} = Native.entropy_stats(store)
    %{sessions: sessions, evicted: evicted, expired: expired}
  end

  @doc """
  Sessions held, read without a dirty scheduler (`stats/1` counts on one): for health
  checks, which must answer while request work fills the dirty schedulers.
  """
  @spec session_count(keyword()) :: non_neg_integer()
  def session_count(opts \\ []) do
    {:ok, store} = store(opts)
    Native.entropy_count(store)
  end

  @doc "Drops idle sessions now instead of at the next periodic sweep."
  @spec sweep(keyword()) :: non_neg_integer()
  def sweep(opts \\ []) do
    GenServer.call(Keyword.get(opts, :tracker, __MODULE__), :sweep)
  end

  ## Acting on a score

  defp act({:error, _} = error, _session_id, _alerts), do: error

  defp act({score, severity, _previous, _len, _detail}, _session_id, false),
    do: {:ok, score, severity}

  defp act({score, :loop, _previous, window_len, detail}, session_id, true) do
    {agent_id, intent, tool_call, code, count} = detail

    if agent_id == nil do
      Logger.warning(
        "entropy LOOP for session #{inspect(session_id)} with no known agent_id: alert not sent"
      )

      {:error, :missing_agent_id}
    else
      event = %{
        event_type: "entropy_alert",
        session_id: session_id,
        agent_id: agent_id,
        entropy_score: score,
        window_size: window_len,
        repeated_pattern: %{
          intent: intent,
          tool_call: tool_call,
          action_status: Atom.to_string(ActionStatus.from_code(code))
        },
        occurrence_count: count
      }

      with {:ok, event} <- EntropyAlertEvent.validate(event) do
        Observatory.Metrics.inc(:alerts)
        Alerts.alert(session_id, agent_id, :entropy, alert_details(event))
        Events.broadcast(Events.entropy_alerts(), event)
        AlertSource.emit_alert(event, :entropy)
        Topology.broadcast(session_id, agent_id, "alert_entropy")
        {:ok, score, :loop}
      end
    end
  end

  defp act({score, :warning, previous, _len, {agent_id, _, _, _, _}}, session_id, true) do
    if previous == :loop, do: Alerts.clear(session_id, :entropy)
    Topology.broadcast(session_id, agent_id, "blocked")
    {:ok, score, :warning}
  end

  defp act({score, :normal, previous, _len, {agent_id, _, _, _, _}}, session_id, true)
       when previous in [:warning, :loop] do
    if previous == :loop, do: Alerts.clear(session_id, :entropy)
    Topology.broadcast(session_id, agent_id, "active")
    {:ok, score, :normal}
  end

  defp act({score, :normal, _previous, _len, _detail}, _session_id, true),
    do: {:ok, score, :normal}

  # What the alert list shows of an entropy alert (`Observatory.Gateway.Alerts`).
  defp alert_details(event) do
    %{repeated_pattern: p, occurrence_count: count, window_size: size} = event

    %{
      rule: :entropy,
      reason: Alerts.entropy_reason(event),
      entropy_score: event.entropy_score,
      pattern: p,
      occurrence_count: count,
      window_size: size
    }
  end

  ## Store access

  defp agent_id(opts) do
    case Keyword.get(opts, :agent_id) do
      nil -> {:ok, nil}
      id when is_binary(id) -> {:ok, id}
      _ -> {:error, :invalid_agent_id}
    end
  end

  defp store(opts) do
    case NativeStores.get({__MODULE__, Keyword.get(opts, :tracker, __MODULE__)}, nil) do
      nil -> {:error, :not_started}
      store -> {:ok, store}
    end
  end

  # The hot path calls the NIF directly (no apply/3). A panic in Rust arrives as an
  # :nif_panicked error: the caller gets an error tuple, the tracker and the VM keep running.
  defp record(store, session_id, intent, tool_call, code, agent_id, size, loop, warning) do
    Native.entropy_record(
      store,
      session_id,
      intent,
      tool_call,
      code,
      agent_id,
      size,
      loop,
      warning
    )
  rescue
    e in ErlangError ->
      Logger.error("EntropyTracker NIF entropy_record failed: #{Exception.message(e)}")
      {:error, :internal_error}
  end

  defp call_nif(store, fun, args) do
    apply(Native, fun, [store | args])
  rescue
    e in ErlangError ->
      Logger.error("EntropyTracker NIF #{fun} failed: #{Exception.message(e)}")
      {:error, :internal_error}
  end

  ## Server

  @impl true
  def init(opts) do
    Process.flag(:trap_exit, true)
    name = Keyword.fetch!(opts, :name)
    max = option(opts, :max_sessions, :entropy_max_sessions, 1_000_000)
    ttl = option(opts, :session_ttl_ms, :entropy_session_ttl_ms, :timer.minutes(30))
    interval = option(opts, :sweep_interval_ms, :entropy_sweep_interval_ms, :timer.minutes(1))
    tick = option(opts, :tick_ms, :entropy_clock_tick_ms, 1_000)

    shards = max |> div(@min_sessions_per_shard) |> max(1) |> min(@max_shards)
    store = Native.entropy_store_new(shards, max)
    # Replacing the entry releases the store of a crashed predecessor (UC-0250 F1).
    NativeStores.put({__MODULE__, name}, store)
    if name == __MODULE__, do: StepScore.publish(:entropy, store)
    state = %{name: name, store: store, ttl: ttl, interval: interval, tick: tick}
    tick_now(state)
    schedule_sweep(state)
    {:ok, state}
  end

  @impl true
  def handle_call(:sweep, _from, state), do: {:reply, sweep_now(state), state}

  @impl true
  def handle_info(:tick, state) do
    tick_now(state)
    {:noreply, state}
  end

  def handle_info(:sweep, state) do
    sweep_now(state)
    schedule_sweep(state)
    {:noreply, state}
  end

  def handle_info(msg, state) do
    Logger.debug("EntropyTracker ignored an unexpected message: #{inspect(msg)}")
    {:noreply, state}
  end

  @impl true
  def terminate(reason, %{name: name}) when reason in [:normal, :shutdown], do: unpublish(name)
  def terminate({:shutdown, _}, %{name: name}), do: unpublish(name)
  def terminate(_reason, _state), do: :ok

  defp unpublish(name) do
    if name == __MODULE__, do: StepScore.publish(:entropy, nil)
    NativeStores.erase({__MODULE__, name})
  end

  defp sweep_now(%{store: store, ttl: ttl}) do
    Native.entropy_sweep(store, System.monotonic_time(:millisecond), ttl)
  end

  defp schedule_sweep(%{interval: interval}), do: Process.send_after(self(), :sweep, interval)

  defp tick_now(%{store: store, tick: tick}) do
    Native.entropy_tick(store, System.monotonic_time(:millisecond))
    Process.send_after(self(), :tick, tick)
  end

  defp option(opts, key, env_key, default) do
    case Keyword.get_lazy(opts, key, fn -> Application.get_env(:observatory, env_key, default) end) do
      n when is_integer(n) and n > 0 ->
        n

      other ->
        raise ArgumentError,
              "expected #{inspect(key)} to be a positive integer, got: #{inspect(other)}"
    end
  end
end
