defmodule ObservatoryWeb.SessionClusterManager.Inspector do
  @moduledoc """
  What the Inspect panel shows for one session, read fresh from the gateway:
  its current entropy window (oldest step first), score and severity from
  `EntropyTracker.session/1`, its loop verdict from `LoopVerdict.session/1`, the pause
  in force from `HITL.pause_of/1`, and how many DecisionLogs it has sent
  (`SessionLog.count/1`).

  `load/1` is cheap (a NIF lookup and two ETS reads), so the manager calls it again
  whenever an event about the inspected session arrives.
  """

  alias Observatory.Gateway.{EntropyTracker, HITL, LoopVerdict, SessionLog}

  @type t :: %{
          session_id: String.t(),
          agent_id: String.t() | nil,
          window: [EntropyTracker.entropy_tuple()],
          score: float() | nil,
          severity: EntropyTracker.severity() | nil,
          verdict: map() | nil,
          pause: HITL.audit_entry() | nil,
          messages: non_neg_integer()
        }

  @doc "The session's current state."
  @spec load(String.t()) :: t()
  def load(session_id) when is_binary(session_id) do
    # A read: an owner that does not answer in time leaves what this node knows.
    case Observatory.Cluster.call_owner(session_id, __MODULE__, :load_here, [session_id]) do
      {:ok, loaded} -> loaded
      {:error, :owner_unavailable} -> load_here(session_id)
    end
  end

  # In a cluster (issue 14) on the session's owner, where its window lives.
  @doc false
  def load_here(session_id) do
    session = EntropyTracker.session(session_id)

    %{
      session_id: session_id,
      agent_id: session && session.agent_id,
      window: (session && session.window) || [],
      score: session && session.score,
      severity: session && session.severity,
      verdict: LoopVerdict.session(session_id),
      pause: HITL.pause_of(session_id),
      messages: SessionLog.count(session_id)
    }
  end
end
