defmodule Observatory.Gateway.Events do
  @moduledoc """
  Where Observatory publishes: the PubSub server named in config and the topics.

      config :observatory, :pubsub, {Observatory.PubSub, Observatory.PubSub}  # default
      config :observatory, :pubsub, {Phoenix.PubSub, MyApp.PubSub}           # a Phoenix host

  The module must have Phoenix.PubSub's `broadcast/3`, `subscribe/2` and
  `unsubscribe/2`. Observatory starts a server only for the default: any other is the
  host's, started in its own supervision tree, and the host then has one PubSub.

  Subscribe with `subscribe/1` — it goes to whichever server is configured:

      Observatory.Gateway.Events.subscribe("gateway:entropy_alerts")

  ## Misconfiguration

  `check!/0`, at start, refuses a value that is not `{module, name}` or a module
  without that API. A server name that no process has is found once the host's
  application has started (`Observatory.PubSubCheck`), and said in the log with the
  name the host's endpoint uses. Until it is fixed, a broadcast is dropped with the
  same message in the log (at most once a minute) — the step that caused it is still
  scored, stored and answered — and `subscribe/1` raises it.
  """

  require Logger

  @default {Observatory.PubSub, Observatory.PubSub}

  @doc "Topic of `EntropyAlertEvent`s (FR-9.10)."
  @spec entropy_alerts() :: String.t()
  def entropy_alerts, do: "gateway:entropy_alerts"
  @doc "Topic of node state changes."
  @spec topology() :: String.t()
  def topology, do: "gateway:topology"
  @doc "Topic of every validated, re-scored DecisionLog."
  @spec decision_logs() :: String.t()
  def decision_logs, do: "gateway:decision_logs"

  @doc "The configured `{module, server}`."
  @spec pubsub() :: {module(), atom()}
  def pubsub do
    case Observatory.IngestSettings.get(:pubsub) do
      {module, server} when is_atom(module) and is_atom(server) ->
        {module, server}

      other ->
        raise ArgumentError,
              "expected config :observatory, :pubsub to be {module, name} " <>
                "(e.g. {Phoenix.PubSub, MyApp.PubSub}), got: #{inspect(other)}"
    end
  end

  @doc "Whether the configured server is Observatory's own, which it starts itself."
  @spec own?({module(), atom()}) :: boolean()
  def own?(pubsub \\ pubsub()), do: pubsub == @default

  @doc """
  Raises `ArgumentError` unless `:pubsub` is `{module, name}` and the module has
  Phoenix.PubSub's `broadcast/3`, `subscribe/2` and `unsubscribe/2` (run at start).
  """
  @spec check!() :: :ok
  def check! do
    :persistent_term.put({__MODULE__, :logged_at}, :atomics.new(1, signed: true))
    {module, _server} = pubsub()

    missing =
      for {f, a} <- [broadcast: 3, subscribe: 2, unsubscribe: 2],
          not exported?(module, f, a),
          do: "#{f}/#{a}"

    if missing != [] do
      raise ArgumentError,
            "config :observatory, :pubsub names #{inspect(module)}, which " <>
              if(Code.ensure_loaded?(module),
                do: "lacks #{Enum.join(missing, ", ")}",
                else: "is not available"
              ) <> ": name Phoenix.PubSub (or Observatory.PubSub) and your server"
    end

    :ok
  end

  defp exported?(module, f, a),
    do: Code.ensure_loaded?(module) and function_exported?(module, f, a)

  @doc "Whether a process runs under the configured server's name."
  @spec running?() :: boolean()
  def running? do
    {_module, server} = pubsub()
    Process.whereis(server) != nil
  end

  @doc """
  What is wrong when the configured server does not run: the key, the name, and
  the name the host's endpoint uses for its own PubSub (`pubsub_server`), if any.
  """
  @spec not_running_message() :: String.t()
  def not_running_message do
    {module, server} = pubsub()

    hint =
      case endpoint_pubsubs() -- [server] do
        [] -> "the name your application starts it with ({#{inspect(module)}, name: …})"
        names -> "your endpoint's pubsub_server, #{Enum.map_join(names, " or ", &inspect/1)}"
      end

    "config :observatory, :pubsub names #{inspect(server)}, but no process has that name: " <>
      "Observatory's events go nowhere and its pages cannot subscribe. Name #{hint}"
  end

  # The pubsub_server of every endpoint configured in a loaded application.
  defp endpoint_pubsubs do
    for {app, _, _} <- Application.loaded_applications(),
        {_key, config} <- Application.get_all_env(app),
        Keyword.keyword?(config),
        server = Keyword.get(config, :pubsub_server),
        is_atom(server) and server != nil,
        uniq: true,
        do: server
  end

  @doc """
  Broadcasts through the configured PubSub server. A server that does not run drops
  the message (`{:error, :pubsub_not_running}`) and says why in the log, at most once
  a minute: a step's scoring and answer never depend on the dashboard's bus.
  """
  @spec broadcast(String.t(), term()) :: :ok | {:error, term()}
  def broadcast(topic, message), do: broadcast(pubsub(), topic, message)

  # Through the `{module, server}` given: read once by the caller, not again here.
  defp broadcast({module, server}, topic, message) do
    module.broadcast(server, topic, message)
  rescue
    error in ArgumentError ->
      if Process.whereis(server) != nil, do: reraise(error, __STACKTRACE__)
      log_not_running()
      {:error, :pubsub_not_running}
  end

  @doc """
  `broadcast/2` of the message `fun` makes, made only when someone may receive it:
  with Observatory's own server, a topic nobody follows on any node costs one
  lookup and `fun` is not called; a host's server is always given the message.
  `pubsub` is the configured `{module, server}` (`pubsub/0`), for a caller that has
  read it already for the same step: the message goes through it, the setting is
  not read again.
  """
  @spec broadcast_lazy(String.t(), (() -> term()), {module(), atom()}) ::
          :ok | {:error, term()}
  def broadcast_lazy(topic, fun, pubsub \\ pubsub()) do
    case pubsub do
      {Observatory.PubSub, server} ->
        if Observatory.PubSub.Peer.subscribed?(server, topic),
          do: broadcast(pubsub, topic, fun.()),
          else: :ok

      _host ->
        broadcast(pubsub, topic, fun.())
    end
  end

  @doc false
  # Logs `not_running_message/0`, at most once a minute however many processes
  # broadcast at once (Observatory.PubSubCheck's report included).
  def log_not_running do
    case :persistent_term.get({__MODULE__, :logged_at}, nil) do
      # Before the application started (check!/0 makes the clock): say it each time.
      nil ->
        Logger.error(not_running_message())

      clock ->
        now = System.monotonic_time(:second)
        last = :atomics.get(clock, 1)

        if (last == 0 or now - last > 60) and
             :atomics.compare_exchange(clock, 1, last, now) == :ok,
           do: Logger.error(not_running_message())
    end
  end

  @doc """
  Subscribes the caller through the configured PubSub server; raises `ArgumentError`
  saying what to fix when the server does not run.
  """
  @spec subscribe(String.t()) :: :ok | {:error, term()}
  def subscribe(topic) do
    {module, server} = pubsub()
    module.subscribe(server, topic)
  rescue
    error in ArgumentError ->
      if running?(),
        do: reraise(error, __STACKTRACE__),
        else: raise(ArgumentError, not_running_message())
  end

  @doc """
  For Observatory's own processes, from `init/1`: subscribes the caller to `topics`
  now if the bus runs. A host's PubSub starts after Observatory (a dependency starts
  first), so until it does the caller is sent `{Observatory.Gateway.Events,
  :subscribe, topics}` every 500 ms, and hands it back here from `handle_info/2`.
  Nothing is published on that bus before it runs, so nothing is missed.
  """
  @spec subscribe_when_up([String.t()]) :: :ok
  def subscribe_when_up(topics) do
    if running?() do
      for topic <- topics, do: :ok = subscribe(topic)
    else
      Process.send_after(self(), {__MODULE__, :subscribe, topics}, 500)
    end

    :ok
  end

  @doc "Removes the caller's subscriptions to `topic` on the configured PubSub server."
  @spec unsubscribe(String.t()) :: :ok
  def unsubscribe(topic) do
    {module, server} = pubsub()
    module.unsubscribe(server, topic)
  end
end
