defmodule ObservatoryWeb.SessionClusterManager.Inspector do
  @moduledoc """
  What the Inspect panel shows for one session, read fresh from the gateway:
  its current entropy window (oldest step first), score and severity from
  `EntropyTracker.session/1`, its loop verdict from `LoopVerdict.session/1`, its alert
  (`Observatory.Gateway.Alerts`), the pause in force from `HITL.pause_of/1`, how many
  DecisionLogs it has sent (`SessionLog.count/1`), and the evidence: its recent steps
  with their calls, arguments and results, and what repeats
  (`Observatory.Gateway.Evidence.for_session/2`), and what it spent through the proxy,
  in all and since its loop began (`Observatory.Budget.session_usage/1`). Every step
  is named by the session's step number, which the verdict's evidence and the window
  use too.

  `load/2` costs a few ETS and NIF reads and a comparison of at most the stored steps;
  the manager calls it again when the inspected session changes (coalescing a burst
  of its steps into one load).
  """

  alias Observatory.Gateway.{Alerts, EntropyTracker, Evidence, HITL, LoopVerdict, SessionLog}

  @type t :: %{
          session_id: String.t(),
          agent_id: String.t() | nil,
          window: [EntropyTracker.entropy_tuple()],
          score: float() | nil,
          severity: EntropyTracker.severity() | nil,
          verdict: map() | nil,
          alert: map() | nil,
          pause: HITL.audit_entry() | nil,
          messages: non_neg_integer(),
          steps: [map()],
          explained: %{verdict: map() | nil, window: map() | nil},
          usage: map()
        }

  @doc """
  The session's current state. `:full` — step numbers whose arguments and result are
  shown whole (the panel's "Show all").
  """
  @spec load(String.t(), keyword()) :: t()
  def load(session_id, opts \\ []) when is_binary(session_id) do
    # A read: an owner that does not answer in time leaves what this node knows.
    case Observatory.Cluster.call_owner(session_id, __MODULE__, :load_here, [session_id, opts]) do
      {:ok, loaded} -> loaded
      {:error, :owner_unavailable} -> load_here(session_id, opts)
    end
  end

  # In a cluster (issue 14) on the session's owner, where its window and steps live.
  @doc false
  def load_here(session_id, opts \\ []) do
    session = EntropyTracker.session(session_id)
    window = (session && session.window) || []
    verdict = LoopVerdict.session(session_id)

    evidence =
      Evidence.for_session(session_id, Keyword.merge(opts, window: window, verdict: verdict))

    %{
      session_id: session_id,
      agent_id: session && session.agent_id,
      window: window,
      score: session && session.score,
      severity: session && session.severity,
      verdict: verdict,
      alert: Alerts.get(session_id),
      pause: HITL.pause_of(session_id),
      messages: SessionLog.count(session_id),
      steps: evidence.steps,
      explained: %{verdict: evidence.verdict, window: evidence.window},
      usage: Observatory.Budget.session_usage(session_id)
    }
  end
end
