defmodule ObservatoryWeb.Supervisor do
  @moduledoc """
  Observatory's own HTTP server: the registry of open dashboard pages, the reaper of
  idle connections, then the endpoint. (The throttle of failed credentials runs
  without it too, for a host's endpoint: `Observatory.Application`.)

  `:one_for_one`: a page registers itself in the registry and the registry's
  partition is linked to it, so a registry that dies takes its pages with it (their
  browsers reconnect to the new one); the endpoint and the requests it is serving
  need not restart for that. Like `Observatory.Gateway.Supervisor` it absorbs a
  burst of crashes (20 restarts in 5 s) before it gives up to its parent.
  """

  use Supervisor

  def start_link(opts \\ []), do: Supervisor.start_link(__MODULE__, opts, name: __MODULE__)

  @impl true
  def init(_opts) do
    children = [
      Observatory.Supervision.child_spec(
        {Registry, keys: :unique, name: ObservatoryWeb.Dashboard.EventStream.registry()}
      ),
      ObservatoryWeb.Endpoint.IdleReaper,
      ObservatoryWeb.Endpoint
    ]

    Supervisor.init(children, strategy: :one_for_one, max_restarts: 20, max_seconds: 5)
  end
end
