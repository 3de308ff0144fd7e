defmodule Observatory.Test.FakeHost do
  @moduledoc false
  # The application callback of a host app in the :peer tests (Observatory.Test.Remote.
  # load_fake_host/2): its tree starts a PubSub named `bus`, as a Phoenix host's
  # starts its Phoenix.PubSub, after Observatory (a dependency) has started.
  use Application

  @impl true
  def start(_type, bus) do
    children = if bus, do: [{Observatory.PubSub, name: bus}], else: []
    Supervisor.start_link(children, strategy: :one_for_one)
  end
end
