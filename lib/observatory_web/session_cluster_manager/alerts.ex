defmodule ObservatoryWeb.SessionClusterManager.Alerts do
  @moduledoc """
  The Entropy Alerts panel's rows: one per session, however many alerts it sent
  (FR-9.10 negative path).

  A row is keyed by `session_id`. A later `EntropyAlertEvent` for the same session
  updates its score, pattern, count and time and bumps `alerts`; it never adds a
  second row. Rows are listed most recent alert first, and at most `limit` are kept
  (the least recent is dropped first), so a page stays small whatever the fleet does.

      alerts = Alerts.new() |> Alerts.put(event, DateTime.utc_now())
      [%{session_id: "sess-xyz", alerts: 1}] = Alerts.rows(alerts)
  """

  @default_limit 200

  defstruct rows: %{}, seq: 0, limit: @default_limit

  @type row :: %{
          session_id: String.t(),
          agent_id: String.t(),
          score: float(),
          window_size: pos_integer(),
          pattern: %{intent: String.t(), tool_call: String.t(), action_status: String.t()},
          occurrence_count: pos_integer(),
          alerts: pos_integer(),
          first_at: DateTime.t(),
          at: DateTime.t(),
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

  @doc "Records an `EntropyAlertEvent` received at `at`."
  @spec put(t(), map(), DateTime.t()) :: t()
  def put(%__MODULE__{} = alerts, %{session_id: id} = event, %DateTime{} = at) do
    seq = alerts.seq + 1
    previous = Map.get(alerts.rows, id)

    row = %{
      session_id: id,
      agent_id: event.agent_id,
      score: event.entropy_score,
      window_size: event.window_size,
      pattern: event.repeated_pattern,
      occurrence_count: event.occurrence_count,
      alerts: if(previous, do: previous.alerts + 1, else: 1),
      first_at: if(previous, do: previous.first_at, else: at),
      at: at,
      seq: seq
    }

    %{alerts | rows: Map.put(alerts.rows, id, row), seq: seq} |> trim()
  end

  @doc "The rows, most recent alert first."
  @spec rows(t()) :: [row()]
  def rows(%__MODULE__{rows: rows}), do: rows |> Map.values() |> Enum.sort_by(& &1.seq, :desc)

  @doc "How many sessions have a row."
  @spec count(t()) :: non_neg_integer()
  def count(%__MODULE__{rows: rows}), do: map_size(rows)

  @doc "The row of a session, or nil."
  @spec get(t(), String.t()) :: row() | nil
  def get(%__MODULE__{rows: rows}, session_id), do: Map.get(rows, session_id)

  defp trim(%{rows: rows, limit: limit} = alerts) when map_size(rows) > limit do
    oldest = rows |> Map.values() |> Enum.min_by(& &1.seq)
    trim(%{alerts | rows: Map.delete(rows, oldest.session_id)})
  end

  defp trim(alerts), do: alerts
end
