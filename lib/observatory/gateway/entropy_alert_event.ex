defmodule Observatory.Gateway.EntropyAlertEvent do
  @moduledoc """
  The event broadcast on `"gateway:entropy_alerts"` when a session enters LOOP (FR-9.7).

      %{
        event_type: "entropy_alert",
        session_id: "sess-abc",
        agent_id: "agent-7",
        entropy_score: 0.2,
        window_size: 5,
        repeated_pattern: %{intent: "search", tool_call: "read_file", action_status: "failure"},
        occurrence_count: 5
      }

  `validate/1` is the broadcaster's check: an event with a missing or mistyped field
  is never published.
  """

  @type t :: %{
          event_type: String.t(),
          session_id: String.t(),
          agent_id: String.t(),
          entropy_score: float(),
          window_size: pos_integer(),
          repeated_pattern: %{
            intent: String.t(),
            tool_call: String.t(),
            action_status: String.t()
          },
          occurrence_count: pos_integer()
        }

  @fields [
    :event_type,
    :session_id,
    :agent_id,
    :entropy_score,
    :window_size,
    :repeated_pattern,
    :occurrence_count
  ]

  @doc "The fields every event must carry."
  def fields, do: @fields

  @doc "Checks every FR-9.7 field; returns the event or the fields that are wrong."
  @spec validate(map()) :: {:ok, t()} | {:error, {:invalid_alert_event, [atom()]}}
  def validate(event) when is_map(event) do
    case Enum.reject(@fields, &valid_field?(&1, Map.get(event, &1))) do
      [] -> {:ok, event}
      bad -> {:error, {:invalid_alert_event, bad}}
    end
  end

  defp valid_field?(:event_type, v), do: v == "entropy_alert"
  defp valid_field?(:session_id, v), do: is_binary(v) and v != ""
  defp valid_field?(:agent_id, v), do: is_binary(v) and v != ""
  defp valid_field?(:entropy_score, v), do: is_float(v)
  defp valid_field?(:window_size, v), do: is_integer(v) and v > 0
  defp valid_field?(:occurrence_count, v), do: is_integer(v) and v > 0

  defp valid_field?(:repeated_pattern, %{intent: i, tool_call: t, action_status: s}),
    do: is_binary(i) and is_binary(t) and is_binary(s)

  defp valid_field?(:repeated_pattern, _), do: false
end
