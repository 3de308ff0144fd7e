defmodule Observatory.KillSwitch.Supervisor do
  @moduledoc """
  Starts the kill switch: the agent store is set up first (Mnesia started, tables
  loaded) in `init/1`, so nothing after it in the application's supervision tree —
  the HTTP server in particular — runs before agent records can be read. Then the
  window store's owner, the task supervisor for notifications, the proxy's upstream
  slots and its memory of ingested steps.
  """

  use Supervisor

  def start_link(opts \\ []), do: Supervisor.start_link(__MODULE__, opts, name: __MODULE__)

  @impl true
  def init(_opts) do
    :ok = Observatory.KillSwitch.Agents.setup()
    :ok = Observatory.AgentKeys.setup()

    children = [
      Observatory.KillSwitch.Windows,
      {Task.Supervisor, name: Observatory.KillSwitch.TaskSupervisor},
      Observatory.KillSwitch.Upstream,
      Observatory.Proxy.StepMemory
    ]

    Supervisor.init(children, strategy: :one_for_one)
  end
end
