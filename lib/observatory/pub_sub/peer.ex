defmodule Observatory.PubSub.Peer do
  @moduledoc false
  # One per PubSub instance and node. It joins the instance's :pg group; broadcasts
  # from other nodes arrive here and are dispatched to this node's subscribers.
  use GenServer

  @group :peers
  @scopes __MODULE__.Scopes

  def start_link(pubsub), do: GenServer.start_link(__MODULE__, pubsub)

  @doc "The :pg scope of a PubSub instance (the same name on every node)."
  # Every broadcast needs it: the name is made once and kept (Module.concat/2 costs
  # about a microsecond, four times a step), every instance's under one atom key (a
  # tuple key costs ~40 ns more a read). Two instances named at once may each write
  # the map without the other's: the one left out is made again at its next read.
  def scope(pubsub) do
    case :persistent_term.get(@scopes, nil) do
      %{^pubsub => scope} ->
        scope

      scopes ->
        scope = Module.concat(pubsub, PG)
        :persistent_term.put(@scopes, Map.put(scopes || %{}, pubsub, scope))
        scope
    end
  end

  @doc """
  Whether `topic` has a subscriber on any node (local ones join at once); false
  when the instance's `:pg` scope does not run, as `:pg.get_members/2` answers then.

  Asked on every ingested step, mostly of a topic nobody follows: `:pg` keeps a
  group's row in the scope's table (named after the scope) only while the group has
  members, so `:ets.member/2` answers without copying the members, and without the
  exception `:pg.get_members/2` raises and catches for a group with none.
  """
  def subscribed?(pubsub, topic) do
    :ets.member(scope(pubsub), {:topic, topic})
  rescue
    ArgumentError -> false
  end

  @doc """
  Sends a broadcast to the peer of `pubsub` on every other node that has a
  subscriber to `topic`; returns those nodes. A node without one gets nothing: in a
  cluster every step is broadcast, and most nodes' pages follow few topics.
  """
  def forward(pubsub, topic, message, from, dispatcher) do
    scope = scope(pubsub)

    case for(pid <- :pg.get_members(scope, {:topic, topic}), node(pid) != node(), do: node(pid)) do
      [] ->
        []

      listening ->
        for peer <- :pg.get_members(scope, @group), node(peer) in listening do
          send(peer, {:forward, topic, message, from, dispatcher})
          node(peer)
        end
    end
  end

  @doc "Makes the caller's node one that `forward/5` sends `topic` to (the caller listens)."
  def listen(pubsub, topic), do: :pg.join(scope(pubsub), {:topic, topic}, self())

  @doc "Undoes every `listen/2` of the caller for `topic`."
  def unlisten(pubsub, topic) do
    scope = scope(pubsub)
    group = {:topic, topic}

    for pid <- :pg.get_local_members(scope, group), pid == self() do
      :pg.leave(scope, group, pid)
    end

    :ok
  end

  @impl true
  def init(pubsub) do
    scope = scope(pubsub)
    :ok = :pg.join(scope, @group, self())

    # A restarted :pg scope (this process restarts with it) starts empty: the local
    # subscribers rejoin their topics' groups, which `subscribed?/2` and remote nodes
    # go by. A restarted Registry restarts this too, with no subscribers to rejoin.
    for {topic, pid} <- Registry.select(pubsub, [{{:"$1", :"$2", :_}, [], [{{:"$1", :"$2"}}]}]) do
      :pg.join(scope, {:topic, topic}, pid)
    end

    {:ok, pubsub}
  end

  @impl true
  def handle_info({:forward, topic, message, from, dispatcher}, pubsub) do
    Observatory.PubSub.dispatch(pubsub, from, topic, message, dispatcher)
    {:noreply, pubsub}
  end
end
