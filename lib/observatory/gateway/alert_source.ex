defmodule Observatory.Gateway.AlertSource do
  @moduledoc """
  Which signal raises `EntropyAlertEvent`s and topology states (issue 8):

      config :observatory, :alert_source, :entropy   # the default: FRD-009 as written
      config :observatory, :alert_source, :verdict   # the loop verdict

  With `:entropy` nothing changes: `EntropyTracker.record_and_score/3` acts on the
  uniqueness ratio (FR-9.4–9.6). With `:verdict`, `SchemaInterceptor` asks the tracker
  to score without acting (`alerts: false`) and `act/5` broadcasts from the step's
  `Observatory.Gateway.LoopVerdict` instead, with the same shapes and the same rhythm:

  | verdict | entropy's equivalent | what is broadcast |
  |---|---|---|
  | `:loop` | LOOP | an `EntropyAlertEvent` on `"gateway:entropy_alerts"`, node `alert_entropy` |
  | `:suspect` | WARNING | node `blocked` (amber) |
  | `:progress` after `:suspect` or `:loop` | back to Normal | node `active` |

  A verdict alert keeps every FR-9.7 field: `entropy_score` is the tracker's score for
  the same step, and `window_size`, `repeated_pattern` and `occurrence_count` describe
  the entropy window at that step (its most frequent tuple, ties to the most recent),
  read from the tracker. Four more fields say why it fired: `alert_source: "verdict"`,
  `rule`, `reason` and `evidence` (the step numbers). A step whose score is unknown (the
  tracker failed) cannot fill `entropy_score`: its alert is not sent, and logged.

  The environment sets it too: `OBSERVATORY_ALERT_SOURCE=entropy` or `=verdict`
  (`config/runtime.exs`); any other value stops the gateway at start with a message
  naming the variable. The application also refuses to start with an invalid
  `:alert_source` (`validate!/1`). The dashboard's header shows the source in force.

  Read on every step from the settings snapshot (`Observatory.configure/1` applies a
  change to the next step, `Application.put_env/3` within `:settings_refresh_ms`). A
  value put at run time with `Application.put_env/3` to an unknown one is logged once and
  read as `:entropy`, and so is `:verdict` while `LoopVerdict` is not running: an alert
  source that cannot alert would silence the gateway.
  """

  require Logger

  alias Observatory.Gateway.{
    Alerts,
    EntropyAlertEvent,
    EntropyTracker,
    Events,
    LoopVerdict,
    Topology
  }

  @type t :: :entropy | :verdict

  @doc """
  Checks a configured alert source at start: `:ok`, or an `ArgumentError` that shows
  the bad value.

      iex> Observatory.Gateway.AlertSource.validate!(:verdict)
      :ok
      iex> Observatory.Gateway.AlertSource.validate!(:verdit)
      ** (ArgumentError) expected :alert_source to be :entropy or :verdict (OBSERVATORY_ALERT_SOURCE=entropy|verdict), got: :verdit
  """
  @spec validate!(term()) :: :ok
  def validate!(value \\ Application.get_env(:observatory, :alert_source, :entropy))
  def validate!(value) when value in [:entropy, :verdict], do: :ok

  def validate!(value) do
    raise ArgumentError,
          "expected :alert_source to be :entropy or :verdict " <>
            "(OBSERVATORY_ALERT_SOURCE=entropy|verdict), got: #{inspect(value)}"
  end

  @doc "A short name of a source for people: the dashboard's header and panel."
  @spec describe(t()) :: String.t()
  def describe(:entropy), do: "entropy ratio"
  def describe(:verdict), do: "loop verdict"

  @doc "The alert source in force (see the module doc)."
  @spec current() :: t()
  def current do
    case Observatory.IngestSettings.get(:alert_source) do
      :entropy ->
        :entropy

      :verdict ->
        if LoopVerdict.running?(),
          do: :verdict,
          else: fallback(:verdict, "LoopVerdict is not running")

      other ->
        fallback(other, "expected :entropy or :verdict")
    end
  end

  @doc """
  Whether an ingest result (`SchemaInterceptor.ingest/2`) raises an `EntropyAlertEvent`
  under `source`. Every result carries both signals whatever the configured source, so
  a replay can count the alarms of both from one pass:

      Enum.any?(results, &AlertSource.alert?(&1, :verdict))
  """
  @spec alert?(map(), t()) :: boolean()
  def alert?(%{severity: severity}, :entropy), do: severity == :loop
  def alert?(%{verdict: %{verdict: verdict}}, :verdict), do: verdict == :loop
  def alert?(%{}, :verdict), do: false

  @doc """
  Broadcasts what the step's verdict calls for (see the module doc). `score` is the
  tracker's score for the step (nil when it failed).

  ## Options
    * `:tracker` — the `EntropyTracker` to read the window from (default: the application's).
  """
  @spec act(String.t(), String.t(), LoopVerdict.verdict(), float() | nil, keyword()) ::
          :ok | {:error, term()}
  def act(session_id, agent_id, verdict, score, opts \\ [])

  def act(session_id, agent_id, %{verdict: :loop} = verdict, score, opts) do
    # The alert state first: a page that reads it on the alert event finds the session.
    Alerts.alert(session_id, agent_id, :verdict, %{
      rule: verdict.rule,
      reason: verdict.reason,
      evidence: verdict.evidence,
      entropy_score: score
    })

    result =
      with {:ok, event} <- alert_event(session_id, agent_id, verdict, score, opts),
           {:ok, event} <- EntropyAlertEvent.validate(event) do
        Observatory.Metrics.inc(:alerts)
        Events.broadcast(Events.entropy_alerts(), event)
        emit_alert(event, :verdict)
      end

    if result != :ok do
      Logger.warning(
        "verdict LOOP for session #{inspect(session_id)}: alert not sent (#{inspect(result)})"
      )
    end

    Topology.broadcast(session_id, agent_id, "alert_entropy")
    result
  end

  def act(session_id, agent_id, %{verdict: :suspect} = verdict, _score, _opts) do
    clear_loop(session_id, verdict)
    Topology.broadcast(session_id, agent_id, "blocked")
  end

  def act(
        session_id,
        agent_id,
        %{verdict: :progress, previous: previous} = verdict,
        _score,
        _opts
      )
      when previous in [:suspect, :loop] do
    clear_loop(session_id, verdict)
    Topology.broadcast(session_id, agent_id, "active")
  end

  def act(_session_id, _agent_id, _verdict, _score, _opts), do: :ok

  defp clear_loop(session_id, %{previous: :loop}), do: Alerts.clear(session_id, :verdict)
  defp clear_loop(_session_id, _verdict), do: :ok

  @doc false
  # The `[:observatory, :alert]` telemetry event (`Observatory.Telemetry`), for an
  # alert just broadcast by `source` (`:entropy` or `:verdict`).
  @spec emit_alert(map(), :entropy | :verdict) :: :ok
  def emit_alert(event, source) do
    Observatory.Telemetry.execute(
      [:observatory, :alert],
      %{entropy_score: event.entropy_score, occurrence_count: event.occurrence_count},
      %{session_id: event.session_id, agent_id: event.agent_id, source: source}
    )
  end

  defp alert_event(_session_id, _agent_id, _verdict, score, _opts) when not is_float(score),
    do: {:error, :no_entropy_score}

  defp alert_event(session_id, agent_id, verdict, score, opts) do
    tracker = [tracker: Keyword.get(opts, :tracker, EntropyTracker)]

    case EntropyTracker.window(session_id, tracker) do
      [] ->
        {:error, :no_entropy_window}

      window ->
        {{intent, tool_call, status}, count} = most_frequent(window)

        {:ok,
         %{
           event_type: "entropy_alert",
           session_id: session_id,
           agent_id: agent_id,
           entropy_score: score,
           window_size: length(window),
           repeated_pattern: %{
             intent: intent,
             tool_call: tool_call,
             action_status: Atom.to_string(status)
           },
           occurrence_count: count,
           alert_source: "verdict",
           rule: verdict.rule,
           reason: verdict.reason,
           evidence: verdict.evidence
         }}
    end
  end

  # The most frequent tuple, ties to the one seen most recently (as the tracker does).
  defp most_frequent(window) do
    counts = Enum.frequencies(window)
    last_seen = window |> Enum.with_index() |> Map.new()
    Enum.max_by(counts, fn {tuple, count} -> {count, Map.fetch!(last_seen, tuple)} end)
  end

  # Logged once per distinct bad value (not once per step).
  defp fallback(value, why) do
    key = {__MODULE__, :warned}

    if :persistent_term.get(key, nil) != value do
      :persistent_term.put(key, value)

      Logger.warning(
        "config :observatory, :alert_source is #{inspect(value)} (#{why}): " <>
          "alerts come from the entropy tracker"
      )
    end

    :entropy
  end
end
