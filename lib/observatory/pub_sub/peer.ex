defmodule Observatory.PubSub.Peer do
  @moduledoc false
  # One per PubSub instance and node. It joins the instance's :pg group; broadcasts
  # from other nodes arrive here and are dispatched to this node's subscribers.
  use GenServer

  @group :peers

  def start_link(pubsub), do: GenServer.start_link(__MODULE__, pubsub)

  @doc "The :pg scope of a PubSub instance (the same name on every node)."
  def scope(pubsub), do: Module.concat(pubsub, PG)

  @doc "Sends a broadcast to the peers of `pubsub` on every other node."
  def forward(pubsub, topic, message, from, dispatcher) do
    for peer <- :pg.get_members(scope(pubsub), @group), node(peer) != node() do
      send(peer, {:forward, topic, message, from, dispatcher})
    end

    :ok
  end

  @impl true
  def init(pubsub) do
    :ok = :pg.join(scope(pubsub), @group, self())
    {:ok, pubsub}
  end

  @impl true
  def handle_info({:forward, topic, message, from, dispatcher}, pubsub) do
    Observatory.PubSub.dispatch(pubsub, from, topic, message, dispatcher)
    {:noreply, pubsub}
  end
end
