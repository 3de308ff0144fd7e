defmodule Observatory.PubSub.Supervisor do
  @moduledoc false
  # Registry first, then the :pg scope and the peer that forwards remote broadcasts:
  # :rest_for_one, so a restarted Registry restarts the forwarding that depends on it.
  use Supervisor

  def start_link(name) do
    Supervisor.start_link(__MODULE__, name, name: Module.concat(name, Supervisor))
  end

  @impl true
  def init(name) do
    scope = Observatory.PubSub.Peer.scope(name)

    children = [
      # One partition: a broadcast then costs one ETS lookup. Subscribers are few and
      # long-lived; broadcasts are many.
      # Wrapped: a killed registry restarts once its partition has released its name.
      Observatory.Supervision.child_spec({Registry, keys: :duplicate, name: name}),
      %{id: :pg, start: {:pg, :start_link, [scope]}},
      {Observatory.PubSub.Peer, name}
    ]

    Supervisor.init(children, strategy: :rest_for_one)
  end
end
