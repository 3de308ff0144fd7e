defmodule Observatory.KillSwitch.Supervisor do
  @moduledoc """
  Starts the kill switch: the window store's owner, the task supervisor for
  notifications and the proxy's HTTP client. The agent store (Mnesia) is set up
  before it by `Observatory.Storage`.
  """

  use Supervisor

  def start_link(opts \\ []), do: Supervisor.start_link(__MODULE__, opts, name: __MODULE__)

  @impl true
  def init(_opts) do
    children = [
      Observatory.KillSwitch.Windows,
      {Task.Supervisor, name: Observatory.KillSwitch.TaskSupervisor},
      Observatory.KillSwitch.Upstream
    ]

    Supervisor.init(children, strategy: :one_for_one, max_restarts: 20, max_seconds: 5)
  end
end
