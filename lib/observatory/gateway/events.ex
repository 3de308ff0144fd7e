defmodule Observatory.Gateway.Events do
  @moduledoc """
  Where Observatory publishes: the PubSub server named in config and the topics.

      config :observatory, :pubsub, {Observatory.PubSub, Observatory.PubSub}  # default
      config :observatory, :pubsub, {Phoenix.PubSub, MyApp.PubSub}           # a Phoenix host

  The module must have Phoenix.PubSub's `broadcast/3`, `subscribe/2` and `unsubscribe/2`.
  """

  @default {Observatory.PubSub, Observatory.PubSub}

  @doc "Topic of `EntropyAlertEvent`s (FR-9.10)."
  def entropy_alerts, do: "gateway:entropy_alerts"
  @doc "Topic of node state changes."
  def topology, do: "gateway:topology"
  @doc "Topic of every validated, re-scored DecisionLog."
  def decision_logs, do: "gateway:decision_logs"

  @doc "The configured `{module, server}`."
  @spec pubsub() :: {module(), atom()}
  def pubsub do
    case Application.get_env(:observatory, :pubsub, @default) do
      {module, server} when is_atom(module) and is_atom(server) ->
        {module, server}

      other ->
        raise ArgumentError, "expected :pubsub to be {module, name}, got: #{inspect(other)}"
    end
  end

  @doc "Broadcasts through the configured PubSub server."
  @spec broadcast(String.t(), term()) :: :ok | {:error, term()}
  def broadcast(topic, message) do
    {module, server} = pubsub()
    module.broadcast(server, topic, message)
  end

  @doc "Subscribes the caller through the configured PubSub server."
  @spec subscribe(String.t()) :: :ok | {:error, term()}
  def subscribe(topic) do
    {module, server} = pubsub()
    module.subscribe(server, topic)
  end

  @doc "Removes the caller's subscriptions to `topic` on the configured PubSub server."
  @spec unsubscribe(String.t()) :: :ok
  def unsubscribe(topic) do
    {module, server} = pubsub()
    module.unsubscribe(server, topic)
  end
end
