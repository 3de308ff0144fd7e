defmodule Observatory.Gateway.Supervisor do
  @moduledoc """
  The gateway's detectors and stores: session ownership, the entropy tracker, HITL,
  the step detector, the loop verdict, the call breaker, the session log, the alerted
  sessions and the memory of answered steps (`Idempotency`), each restarted on its own
  (`:one_for_one`: none depends on another's process).

  A restart is cheap and safe here: the safety state a crash could lose (pauses, the
  audit log, step detector blocks) is durable in Mnesia and read back, and the rest
  (entropy windows, streaks) starts afresh by design. So the supervisor absorbs a
  burst of crashes — 20 restarts in 5 s — before it gives up to its parent;
  OTP's default (3 in 5 s) turned five kills of the tracker in one second into the
  end of the VM.
  """

  use Supervisor

  def start_link(opts \\ []), do: Supervisor.start_link(__MODULE__, opts, name: __MODULE__)

  @impl true
  def init(_opts) do
    children = [
      Observatory.Gateway.SessionOwners,
      Observatory.Gateway.SessionOwners.Failover,
      Observatory.Gateway.EntropyTracker,
      Observatory.Gateway.HITL,
      Observatory.Gateway.StepDetector,
      Observatory.Gateway.LoopVerdict,
      Observatory.Gateway.CallBreaker,
      Observatory.Gateway.SessionLog,
      Observatory.Gateway.Alerts,
      Observatory.Gateway.Idempotency
    ]

    Supervisor.init(children, strategy: :one_for_one, max_restarts: 20, max_seconds: 5)
  end
end
