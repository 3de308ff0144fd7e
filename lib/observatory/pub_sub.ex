defmodule Observatory.PubSub do
  @moduledoc """
  Topic-based publish/subscribe with Phoenix.PubSub's API, built on Elixir's
  `Registry` (fan-out on this node) and OTP's `:pg` (fan-out across nodes).

  Hex packages cannot be installed where Observatory is built, so this module is the
  default transport for Observatory's events. Its functions have the same names,
  arguments and semantics as `Phoenix.PubSub`'s, so a host app that runs Phoenix can
  point Observatory at its own server instead and nothing else changes:

      # config/config.exs of the host app
      config :observatory, :pubsub, {Phoenix.PubSub, MyApp.PubSub}

  ## Usage

      children = [{Observatory.PubSub, name: MyApp.Events}]

      Observatory.PubSub.subscribe(MyApp.Events, "gateway:entropy_alerts")
      Observatory.PubSub.broadcast(MyApp.Events, "gateway:entropy_alerts", %{hello: 1})
      # => the subscriber receives %{hello: 1}

  ## How it works

  Each instance runs a `:rest_for_one` supervisor with a duplicate-keys `Registry`
  (named after the instance: subscribers register under the topic) and a
  `Observatory.PubSub.Peer` process that joins a `:pg` group. A broadcast sends the
  message once to the peer on every other node that has a subscriber to the topic
  (each subscriber is also in the topic's `:pg` group, which `:pg` leaves for it when
  it exits), which dispatches it to its local subscribers, and dispatches it locally
  itself. Messages sent over `:pg` are not
  acknowledged: a node that is unreachable misses them, as with Phoenix.PubSub.

  One difference from Phoenix.PubSub: another node learns of a new subscriber when
  `:pg` tells it, a moment after `subscribe/3` returns (usually well under a
  millisecond; longer on a loaded node). A broadcast made on another node in that
  window does not reach the new subscriber; broadcasts on the subscriber's own node
  always do. Point Observatory at `Phoenix.PubSub` (above) when that matters.
  """

  @type t :: atom()
  @type topic :: binary()
  @type message :: term()
  @type dispatcher :: module()

  @doc "Returns a child spec for an instance; `:name` is required."
  @spec child_spec(keyword()) :: Supervisor.child_spec()
  def child_spec(opts) do
    name = Keyword.get(opts, :name) || raise ArgumentError, "the :name option is required"

    unless is_atom(name) do
      raise ArgumentError, "expected :name to be an atom, got: #{inspect(name)}"
    end

    %{
      id: name,
      start: {Observatory.PubSub.Supervisor, :start_link, [name]},
      type: :supervisor
    }
  end

  @doc """
  Subscribes the caller to `topic`. Each `subscribe/3` adds one registration, so a
  process subscribed twice receives each message twice, as with Phoenix.PubSub.

  ## Options
    * `:metadata` — a term stored with the subscription and handed to dispatchers.
  """
  @spec subscribe(t(), topic(), keyword()) :: :ok | {:error, term()}
  def subscribe(pubsub, topic, opts \\ []) when is_atom(pubsub) and is_binary(topic) do
    case Registry.register(pubsub, topic, opts[:metadata]) do
      {:ok, _} -> Observatory.PubSub.Peer.listen(pubsub, topic)
      {:error, _} = error -> error
    end
  end

  @doc "Removes all of the caller's subscriptions to `topic`."
  @spec unsubscribe(t(), topic()) :: :ok
  def unsubscribe(pubsub, topic) when is_atom(pubsub) and is_binary(topic) do
    :ok = Registry.unregister(pubsub, topic)
    Observatory.PubSub.Peer.unlisten(pubsub, topic)
  end

  @doc "Sends `message` to every subscriber of `topic` on every connected node."
  @spec broadcast(t(), topic(), message(), dispatcher()) :: :ok
  def broadcast(pubsub, topic, message, dispatcher \\ __MODULE__)
      when is_atom(pubsub) and is_binary(topic) and is_atom(dispatcher) do
    # Every subscriber, on any node, is in the topic's :pg group (it joins before
    # `subscribe/3` returns): a topic nobody follows costs this one lookup.
    if Observatory.PubSub.Peer.subscribed?(pubsub, topic) do
      Observatory.PubSub.Peer.forward(pubsub, topic, message, :none, dispatcher)
      dispatch(pubsub, :none, topic, message, dispatcher)
    end

    :ok
  end

  @doc "Like `broadcast/4`, except that `from` does not receive the message."
  @spec broadcast_from(t(), pid(), topic(), message(), dispatcher()) :: :ok
  def broadcast_from(pubsub, from, topic, message, dispatcher \\ __MODULE__)
      when is_atom(pubsub) and is_pid(from) and is_binary(topic) and is_atom(dispatcher) do
    Observatory.PubSub.Peer.forward(pubsub, topic, message, from, dispatcher)
    dispatch(pubsub, from, topic, message, dispatcher)
  end

  @doc "Sends `message` to the subscribers of `topic` on this node only."
  @spec local_broadcast(t(), topic(), message(), dispatcher()) :: :ok
  def local_broadcast(pubsub, topic, message, dispatcher \\ __MODULE__)
      when is_atom(pubsub) and is_binary(topic) and is_atom(dispatcher) do
    dispatch(pubsub, :none, topic, message, dispatcher)
  end

  @doc "Like `local_broadcast/4`, except that `from` does not receive the message."
  @spec local_broadcast_from(t(), pid(), topic(), message(), dispatcher()) :: :ok
  def local_broadcast_from(pubsub, from, topic, message, dispatcher \\ __MODULE__)
      when is_atom(pubsub) and is_pid(from) and is_binary(topic) and is_atom(dispatcher) do
    dispatch(pubsub, from, topic, message, dispatcher)
  end

  @doc """
  The default dispatcher: sends `message` to every subscriber except `from`.
  A custom dispatcher implements `dispatch/3` with the same arguments.
  """
  @spec dispatch([{pid(), term()}], pid() | :none, message()) :: :ok
  def dispatch(entries, from, message) do
    for {pid, _metadata} <- entries, pid != from, do: send(pid, message)
    :ok
  end

  @doc false
  def dispatch(pubsub, from, topic, message, dispatcher) do
    Registry.dispatch(pubsub, topic, &dispatcher.dispatch(&1, from, message))
  end
end
