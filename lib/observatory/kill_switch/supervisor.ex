defmodule Observatory.KillSwitch.Supervisor do
  @moduledoc """
  Starts the kill switch: the configured agent keys are checked and seeded in
  `init/1` (the agent store — Mnesia and its tables — is set up before, by
  `Observatory.Storage`), then the window store's owner, the task supervisor for
  notifications, the proxy's upstream slots and its registry of open requests (ended
  when their agent, key or session stops being valid), the budgets' housekeeping, and
  the notifications' dispatcher with its tasks. (The budgets', guidance notes' and
  notifications' configuration is checked when the application starts:
  `Observatory.Application`.)
  """

  use Supervisor

  def start_link(opts \\ []), do: Supervisor.start_link(__MODULE__, opts, name: __MODULE__)

  @impl true
  def init(_opts) do
    Observatory.KillSwitch.check_config!()
    # The agent store (Mnesia and its tables) is up already (Observatory.Storage).
    :ok = Observatory.AgentKeys.setup()

    children = [
      Observatory.KillSwitch.Windows,
      {Task.Supervisor, name: Observatory.KillSwitch.TaskSupervisor},
      Observatory.KillSwitch.Upstream,
      Observatory.Proxy.OpenRequests,
      Observatory.Budget.Server,
      {Task.Supervisor, name: Observatory.Notifications.TaskSupervisor},
      Observatory.Notifications.Dispatcher
    ]

    Supervisor.init(children, strategy: :one_for_one, max_restarts: 20, max_seconds: 5)
  end
end
