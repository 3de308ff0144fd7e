defmodule Observatory.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    children = [
      {Observatory.PubSub, name: Observatory.PubSub},
      Observatory.Gateway.EntropyTracker
    ]

    Supervisor.start_link(children, strategy: :one_for_one, name: Observatory.Supervisor)
  end
end
