defmodule ObservatoryWeb.SessionClusterManager.Alerts do
  @moduledoc """
  The alerts panel's rows: every session alerted now under the configured alert
  source, one row each (FR-9.10's dedup), most recently raised first.

  The rows are the gateway's (`Observatory.Gateway.Alerts`): `replace/2` puts the list
  gathered from every member, at mount and at each refresh, so a page opened after a
  loop began lists it, and a reload lists what the last page listed. Between
  refreshes the page follows the events: an `EntropyAlertEvent` adds the session or
  updates its row (score, pattern, last alert, ×N; FR-9.10), `alert_raised` adds it,
  `alert_cleared` removes it. At most `limit` rows are kept (the least recently raised
  go first), so a page stays small whatever the fleet does.

      alerts = Alerts.new() |> Alerts.put(event, DateTime.utc_now())
      [%{session_id: "sess-xyz", alerts: 1}] = Alerts.rows(alerts)
  """

  @default_limit 200

  defstruct rows: %{}, seq: 0, limit: @default_limit

  @type row :: %{
          session_id: String.t(),
          agent_id: String.t() | nil,
          source: :entropy | :verdict,
          rule: atom(),
          reason: String.t(),
          score: float() | nil,
          window_size: pos_integer() | nil,
          pattern: %{intent: String.t(), tool_call: String.t(), action_status: String.t()} | nil,
          occurrence_count: pos_integer() | nil,
          alerts: non_neg_integer(),
          since: DateTime.t(),
          at: DateTime.t(),
          node: node() | nil,
          usage: map() | nil,
          seq: non_neg_integer()
        }
  @type t :: %__MODULE__{
          rows: %{String.t() => row()},
          seq: non_neg_integer(),
          limit: pos_integer()
        }

  @doc "No rows; `:limit` caps how many are kept (default #{@default_limit})."
  @spec new(keyword()) :: t()
  def new(opts \\ []), do: %__MODULE__{limit: Keyword.get(opts, :limit, @default_limit)}

  @doc "The rows of the gateway's alert list (`Observatory.Gateway.Alerts.gather/1`), replacing these."
  @spec replace(t(), [map()]) :: t()
  def replace(%__MODULE__{} = alerts, gathered) do
    # Gathered newest first: reversed, a stable sort keeps ties in order.
    gathered
    |> Enum.reverse()
    |> Enum.sort_by(&DateTime.to_unix(&1.since, :microsecond))
    |> Enum.reduce(%{alerts | rows: %{}}, fn alert, acc ->
      seq = acc.seq + 1

      row = %{
        session_id: alert.session_id,
        agent_id: alert.agent_id,
        source: alert.source,
        rule: alert.rule,
        reason: alert.reason,
        score: alert.entropy_score,
        window_size: alert.window_size,
        pattern: alert.pattern,
        occurrence_count: alert.occurrence_count,
        alerts: alert.alerts,
        since: alert.since,
        at: alert.last_at,
        node: Map.get(alert, :node),
        usage: Map.get(alert, :usage),
        seq: seq
      }

      %{acc | rows: Map.put(acc.rows, alert.session_id, row), seq: seq}
    end)
    |> trim()
  end

  @doc "Records an `EntropyAlertEvent` received at `at` (FR-9.10): adds or updates the session's row."
  @spec put(t(), map(), DateTime.t()) :: t()
  def put(%__MODULE__{} = alerts, %{session_id: id} = event, %DateTime{} = at) do
    previous = Map.get(alerts.rows, id)
    verdict? = Map.get(event, :alert_source) == "verdict"

    row =
      (previous || blank(id, at, alerts.seq + 1))
      |> Map.merge(%{
        agent_id: event.agent_id,
        source: if(verdict?, do: :verdict, else: :entropy),
        score: event.entropy_score,
        window_size: event.window_size,
        pattern: event.repeated_pattern,
        occurrence_count: event.occurrence_count,
        alerts: if(previous, do: previous.alerts + 1, else: 1),
        at: at
      })
      |> Map.merge(why(event, verdict?))

    %{alerts | rows: Map.put(alerts.rows, id, row), seq: max(alerts.seq, row.seq)} |> trim()
  end

  @doc "Adds the session of an `alert_raised` event (`Observatory.Gateway.Alerts`) if it has no row."
  @spec raised(t(), map()) :: t()
  def raised(%__MODULE__{rows: rows} = alerts, %{session_id: id} = event) do
    if Map.has_key?(rows, id) do
      alerts
    else
      # Its alert event follows (or was not sent): that one is counted.
      row =
        blank(id, event.since, alerts.seq + 1)
        |> Map.merge(%{
          agent_id: event.agent_id,
          source: event.source,
          rule: event.rule,
          reason: event.reason,
          alerts: 0
        })

      %{alerts | rows: Map.put(rows, id, row), seq: row.seq} |> trim()
    end
  end

  @doc "Removes a session's row (its alert was cleared)."
  @spec delete(t(), String.t()) :: t()
  def delete(%__MODULE__{rows: rows} = alerts, session_id),
    do: %{alerts | rows: Map.delete(rows, session_id)}

  @doc "The rows, most recently raised first."
  @spec rows(t()) :: [row()]
  def rows(%__MODULE__{rows: rows}), do: rows |> Map.values() |> Enum.sort_by(& &1.seq, :desc)

  @doc "How many sessions have a row."
  @spec count(t()) :: non_neg_integer()
  def count(%__MODULE__{rows: rows}), do: map_size(rows)

  @doc "The row of a session, or nil."
  @spec get(t(), String.t()) :: row() | nil
  def get(%__MODULE__{rows: rows}, session_id), do: Map.get(rows, session_id)

  defp blank(id, since, seq) do
    %{
      session_id: id,
      agent_id: nil,
      source: :entropy,
      rule: :entropy,
      reason: "",
      score: nil,
      window_size: nil,
      pattern: nil,
      occurrence_count: nil,
      alerts: 1,
      since: since,
      at: since,
      node: nil,
      usage: nil,
      seq: seq
    }
  end

  # The rule and reason of an alert event: the verdict's, or the entropy window's.
  defp why(event, true), do: %{rule: event.rule, reason: event.reason}

  defp why(event, false),
    do: %{rule: :entropy, reason: Observatory.Gateway.Alerts.entropy_reason(event)}

  defp trim(%{rows: rows, limit: limit} = alerts) when map_size(rows) > limit do
    oldest = rows |> Map.values() |> Enum.min_by(& &1.seq)
    trim(%{alerts | rows: Map.delete(rows, oldest.session_id)})
  end

  defp trim(alerts), do: alerts
end
