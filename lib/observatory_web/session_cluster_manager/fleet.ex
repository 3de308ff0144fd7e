defmodule ObservatoryWeb.SessionClusterManager.Fleet do
  @moduledoc """
  The fleet topology: one node per agent session and the state it shows.

  | state | from | shown as |
  |---|---|---|
  | `paused` | a HITL pause in force | blue |
  | `alert_entropy` | severity `:loop` | flashing red |
  | `blocked` | severity `:warning` | amber `#f59e0b` |
  | `active` | healthy, a step within the last 30 s | green |
  | `idle` | healthy, quiet for 30 s or more | grey |

  A node keeps its entropy state (`base`) apart from `paused`, and shows `paused`
  whenever it is set: a `blocked` or `alert_entropy` update that arrives after a pause
  (the tracker and HITL broadcast from different processes, so their messages can
  cross) changes `base`, not what the operator sees. Only a resume clears `paused`.

  Two kinds of input keep it current:

    * `snapshot/3` — the tracker's sessions (`EntropyTracker.sessions/1`) and the
      pauses in force (`HITL.paused_sessions/0`); authoritative, taken at mount and
      then periodically, which is also how new healthy sessions and idleness show up
      (the tracker broadcasts only changes of severity);
    * `apply_update/2`, `pause/2`, `resume/2`, `put_score/4` — the live
      `"gateway:topology"`, `"gateway:hitl"` and alert events in between.

  Each node also carries the session's loop verdict (issue 8) next to its entropy
  score: `put_verdicts/2` from `LoopVerdict.flagged/1` with each snapshot (a session
  it does not list is at `:progress`), `put_verdict/3` from `"gateway:loop_verdict"`.
  Which of the two signals sets the node's state is `config :observatory,
  :alert_source`; the snapshot is given severities accordingly (see
  `ObservatoryWeb.SessionClusterManager`).
  """

  @idle_after_ms 30_000
  @order %{"alert_entropy" => 0, "blocked" => 1, "paused" => 2, "active" => 3, "idle" => 4}
  @states Map.keys(@order)

  @type node_state :: String.t()
  @type fleet_node :: %{
          session_id: String.t(),
          agent_id: String.t() | nil,
          base: node_state(),
          paused: boolean(),
          score: float() | nil,
          verdict: :progress | :suspect | :loop | nil,
          verdict_reason: String.t() | nil
        }
  @type t :: %{String.t() => fleet_node()}

  @doc "The states a node can show, in the order the view lists them."
  @spec states() :: [node_state()]
  def states, do: Enum.sort_by(@states, &Map.fetch!(@order, &1))

  @doc "An empty fleet."
  @spec new() :: t()
  def new, do: %{}

  @doc """
  A fleet built from a tracker listing (`%{session_id, agent_id, score, severity,
  idle_ms}`) and the pause entries in force. `idle_after_ms` defaults to 30 s.
  """
  @spec snapshot([map()], [map()], non_neg_integer()) :: t()
  def snapshot(sessions, pauses, idle_after_ms \\ @idle_after_ms) do
    paused = MapSet.new(pauses, & &1.session_id)

    nodes =
      for s <- sessions, into: %{} do
        {s.session_id,
         %{
           session_id: s.session_id,
           agent_id: s.agent_id,
           base: derive(s.severity, s.idle_ms, idle_after_ms),
           paused: MapSet.member?(paused, s.session_id),
           score: s.score,
           verdict: :progress,
           verdict_reason: nil
         }}
      end

    # A paused session the tracker no longer holds (evicted) still shows as paused.
    Enum.reduce(pauses, nodes, fn pause, acc ->
      Map.put_new(acc, pause.session_id, blank(pause.session_id, nil) |> Map.put(:paused, true))
    end)
  end

  @doc "The entropy state a tracker listing entry maps to (without the pause)."
  @spec derive(atom() | nil, non_neg_integer(), non_neg_integer()) :: node_state()
  def derive(severity, idle_ms, idle_after_ms \\ @idle_after_ms)
  def derive(:loop, _idle_ms, _), do: "alert_entropy"
  def derive(:warning, _idle_ms, _), do: "blocked"
  def derive(_normal, idle_ms, idle_after) when idle_ms < idle_after, do: "active"
  def derive(_normal, _idle_ms, _), do: "idle"

  @doc """
  Applies a `"gateway:topology"` update. `paused` sets the pause; any other state
  becomes the node's entropy state and shows only when the node is not paused.
  """
  @spec apply_update(t(), map()) :: t()
  def apply_update(fleet, %{session_id: id, state: "paused"} = update) do
    fleet |> upsert(id, Map.get(update, :agent_id)) |> put_in([id, :paused], true)
  end

  def apply_update(fleet, %{session_id: id, state: state} = update) when state in @states do
    fleet |> upsert(id, Map.get(update, :agent_id)) |> put_in([id, :base], state)
  end

  def apply_update(fleet, _unknown), do: fleet

  @doc "Sets a node's latest score (from an `EntropyAlertEvent`), adding the node if new."
  @spec put_score(t(), String.t(), String.t() | nil, float()) :: t()
  def put_score(fleet, id, agent_id, score) do
    fleet |> upsert(id, agent_id) |> put_in([id, :score], score)
  end

  @doc """
  Sets the loop verdict of the listed sessions (`%{session_id, verdict, reason}`, as
  `LoopVerdict.flagged/1` gives them); sessions absent from the fleet are not added.
  """
  @spec put_verdicts(t(), [map()]) :: t()
  def put_verdicts(fleet, flagged) do
    Enum.reduce(flagged, fleet, fn %{session_id: id} = v, acc ->
      if Map.has_key?(acc, id), do: put_verdict(acc, id, v), else: acc
    end)
  end

  @doc "Sets a node's loop verdict (from a `\"gateway:loop_verdict\"` event), adding the node if new."
  @spec put_verdict(t(), String.t(), map()) :: t()
  def put_verdict(fleet, id, %{verdict: verdict} = v) do
    fleet
    |> upsert(id, Map.get(v, :agent_id))
    |> update_in([id], &%{&1 | verdict: verdict, verdict_reason: Map.get(v, :reason)})
  end

  @doc "Marks a session paused (a HITL pause)."
  @spec pause(t(), String.t()) :: t()
  def pause(fleet, id), do: fleet |> upsert(id, nil) |> put_in([id, :paused], true)

  @doc "Clears a session's pause (a HITL resume)."
  @spec resume(t(), String.t()) :: t()
  def resume(fleet, id) do
    if Map.has_key?(fleet, id), do: put_in(fleet, [id, :paused], false), else: fleet
  end

  @doc "The state a node shows."
  @spec state(fleet_node()) :: node_state()
  def state(%{paused: true}), do: "paused"
  def state(%{base: base}), do: base

  @doc "The state shown for a session, or nil when the fleet has no such node."
  @spec state_of(t(), String.t()) :: node_state() | nil
  def state_of(fleet, id) do
    case Map.get(fleet, id) do
      nil -> nil
      node -> state(node)
    end
  end

  @doc "The nodes, most urgent state first, then by session id."
  @spec nodes(t()) :: [fleet_node()]
  def nodes(fleet) do
    fleet |> Map.values() |> Enum.sort_by(&{Map.fetch!(@order, state(&1)), &1.session_id})
  end

  @doc "How many nodes show each state (every state present, zero or more)."
  @spec counts(t()) :: %{node_state() => non_neg_integer()}
  def counts(fleet) do
    zero = Map.new(@states, &{&1, 0})

    Enum.reduce(Map.values(fleet), zero, fn node, acc ->
      Map.update!(acc, state(node), &(&1 + 1))
    end)
  end

  defp upsert(fleet, id, agent_id) do
    case Map.get(fleet, id) do
      nil -> Map.put(fleet, id, blank(id, agent_id))
      node when is_binary(agent_id) -> Map.put(fleet, id, %{node | agent_id: agent_id})
      _node -> fleet
    end
  end

  defp blank(id, agent_id) do
    %{
      session_id: id,
      agent_id: agent_id,
      base: "active",
      paused: false,
      score: nil,
      verdict: nil,
      verdict_reason: nil
    }
  end
end
