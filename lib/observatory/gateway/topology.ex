defmodule Observatory.Gateway.Topology do
  @moduledoc """
  Node state updates on `"gateway:topology"`, one node per agent session.

      %{event_type: "topology_update", session_id: "sess-abc", agent_id: "agent-7",
        state: "blocked", color: "#f59e0b"}

  | state | meaning | color |
  |---|---|---|
  | `active` | sending steps, healthy | green `#22c55e` |
  | `idle` | healthy, quiet | grey `#94a3b8` |
  | `blocked` | entropy WARNING | amber `#f59e0b` |
  | `alert_entropy` | entropy LOOP (flashing red) | red `#ef4444` |
  | `paused` | paused by an operator (HITL) | blue `#3b82f6` |
  """

  alias Observatory.Gateway.{Events, HITL}

  @states %{
    "active" => "#22c55e",
    "idle" => "#94a3b8",
    "blocked" => "#f59e0b",
    "alert_entropy" => "#ef4444",
    "paused" => "#3b82f6"
  }

  @type state :: String.t()

  @doc "Every state and its color."
  def states, do: @states

  @doc "Builds a topology update."
  @spec update(String.t(), String.t() | nil, state()) :: map()
  def update(session_id, agent_id, state) when is_map_key(@states, state) do
    %{
      event_type: "topology_update",
      session_id: session_id,
      agent_id: agent_id,
      state: state,
      color: Map.fetch!(@states, state)
    }
  end

  @doc """
  Broadcasts a node's new state. A paused session keeps showing `paused` until an
  operator resumes it: other states are not broadcast for it unless `force: true`
  (which HITL uses for pause and resume themselves).
  """
  @spec broadcast(String.t(), String.t() | nil, state(), keyword()) :: :ok | {:error, term()}
  def broadcast(session_id, agent_id, state, opts \\ []) do
    if Keyword.get(opts, :force, false) or not HITL.paused?(session_id) do
      Events.broadcast(Events.topology(), update(session_id, agent_id, state))
    else
      :ok
    end
  end
end
