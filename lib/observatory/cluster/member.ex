defmodule Observatory.Cluster.Member do
  @moduledoc """
  This node's membership of the cluster (`Observatory.Cluster`): in the `:pg` group
  of gateways while it runs. Started last in the application's tree, so a node owns
  sessions only once it can score them, and stopped first, so it hands them over
  (to fresh windows on the next owners) before its tracker stops.
  """

  use GenServer

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @impl true
  def init(_opts) do
    Process.flag(:trap_exit, true)
    :ok = :pg.join(Observatory.Cluster.scope(), Observatory.Cluster.group(), self())
    {:ok, nil}
  end

  @impl true
  def terminate(_reason, _state) do
    :pg.leave(Observatory.Cluster.scope(), Observatory.Cluster.group(), self())
  end
end
