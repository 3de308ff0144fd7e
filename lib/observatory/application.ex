defmodule Observatory.Application do
  @moduledoc false
  use Application
  require Logger

  # A failed start is one line that says what to do (Observatory.StartupError): printed,
  # ending the VM, when Observatory runs as its own server; logged and returned in a host.
  @impl true
  def start(_type, _args) do
    case with(:ok <- prepare_data_dir(), do: start_tree()) do
      {:ok, pid} ->
        {:ok, pid}

      {:error, reason} ->
        Observatory.NativeStores.forget()
        Observatory.StartupError.report(reason)
    end
  rescue
    exception ->
      Observatory.NativeStores.forget()

      if Observatory.StartupError.halt?(),
        do: Observatory.StartupError.report(exception),
        else: reraise(exception, __STACKTRACE__)
  end

  # Before anything touches the data directory: refuse one other users can read (said
  # by Observatory.StartupError).
  defp prepare_data_dir do
    case Observatory.DataDir.prepare() do
      :ok -> :ok
      {:error, message} -> {:error, {:data_dir_refused, message}}
    end
  end

  defp start_tree do
    # Settings are read from the environment until the snapshot's keeper runs (a
    # snapshot a stopped instance left would be stale).
    Observatory.IngestSettings.forget()
    Observatory.Metrics.setup()
    # Where the Rust stores are published (not :persistent_term: see the module).
    Observatory.NativeStores.setup()
    # Before any durable write can run (Observatory.Storage.transaction/2).
    Observatory.Cluster.Gate.setup()
    Observatory.Gateway.AlertSource.validate!()
    Observatory.Gateway.Events.check!()
    ensure_secret_key_base()
    # A bad setting stops the start with a message that names it (checked once: a
    # supervisor restarting later must not fail on it).
    Observatory.Budget.check_config!()
    Observatory.Proxy.Guidance.check_config!()
    Observatory.Notifications.check_config!()
    Observatory.ConfigCheck.settings!()
    crash_dump_in_data_dir()
    warn_without_operator_tokens()

    # A VM with storage off (a task beside a running server) runs nothing of
    # Observatory: Observatory.Storage.decide/0.
    storage = Observatory.Storage.decide()
    Observatory.Storage.put_mode(storage)

    children = if storage == :on, do: children(), else: []

    # The lock and Mnesia come first, so nothing reads or writes before they are up.
    # :one_for_one: no child keeps a reference into another that a restart would make
    # stale (Mnesia's tables are read by name; pages die with the PubSub registry
    # they subscribed in, which links them). Each supervisor below absorbs its own
    # children's crash bursts, and so does this one: killing a child here five times
    # in a second must not end the application (with OTP's default, 3 restarts in
    # 5 s, it did, and a permanent application ends the VM).
    Supervisor.start_link(children,
      strategy: :one_for_one,
      max_restarts: 20,
      max_seconds: 5,
      name: Observatory.Supervisor
    )
  end

  @impl true
  def prep_stop(state) do
    # The Rust stores' table goes with this application: lookups read it, uncached,
    # from now on (again in stop/1, after the owners' last writes).
    Observatory.NativeStores.forget()
    state
  end

  @impl true
  def stop(_state) do
    Observatory.NativeStores.forget()
    Observatory.IngestSettings.forget()
  end

  # A release upgrade's new configuration: the settings snapshot follows it at once.
  @impl true
  def config_change(_changed, _new, _removed), do: Observatory.IngestSettings.refresh()

  # Supervisors are wrapped (Observatory.Supervision) so that one killed outright
  # restarts cleanly instead of colliding with its orphaned children.
  defp children do
    children = [
      Observatory.DataDirLock,
      Observatory.Storage,
      pubsub(),
      Observatory.Supervision.child_spec(Observatory.Gateway.Supervisor),
      Observatory.Supervision.child_spec(Observatory.KillSwitch.Supervisor),
      # The dashboard's shared listings; the LiveViews use it in a host app too.
      ObservatoryWeb.SnapshotCache,
      # Failed credentials per client, for whichever server answers the APIs: this
      # one's, or a host's endpoint (ObservatoryWeb.AgentAPIPlug, LLMProxyPlug).
      ObservatoryWeb.AuthThrottle
    ]

    # The settings snapshot first: every step reads it. Clustering (issue 14) around
    # the rest: see Observatory.Cluster.wrap/1.
    [Observatory.IngestSettings | Observatory.Cluster.wrap(children ++ web_children())]
  end

  # Observatory's own PubSub, unless the host named its own (config :observatory,
  # :pubsub): then there is one bus, the host's, checked once the host has started.
  defp pubsub do
    if Observatory.Gateway.Events.own?(),
      do: Observatory.Supervision.child_spec({Observatory.PubSub, name: Observatory.PubSub}),
      else: Observatory.PubSubCheck
  end

  # The HTTP server and the demo fleet run only when configured on: Observatory's own
  # config (config/config.exs) turns the server on; a host app that uses Observatory as
  # a library gets neither unless it asks.
  defp web_children do
    server =
      if ObservatoryWeb.Endpoint.server?(),
        do: [Observatory.Supervision.child_spec(ObservatoryWeb.Supervisor)],
        else: []

    demo =
      if Application.get_env(:observatory, :demo, false), do: [Observatory.Demo.Fleet], else: []

    server ++ demo
  end

  # A crash dump goes to the data directory, not the working directory, when
  # Observatory runs as its own server and nothing chose a place (bin/start,
  # bin/cluster and the release set ERL_CRASH_DUMP before the VM starts; this covers
  # `mix run`). The VM reads the variable when it writes the dump. A host app's VM
  # is the host's to configure.
  defp crash_dump_in_data_dir do
    data_dir = Application.get_env(:observatory, :data_dir)

    if ObservatoryWeb.Endpoint.server?() and data_dir != nil and
         System.get_env("ERL_CRASH_DUMP") in [nil, ""] do
      File.mkdir_p!(data_dir)
      System.put_env("ERL_CRASH_DUMP", Path.expand(Path.join(data_dir, "erl_crash.dump")))
    end
  end

  # The dashboard signs its session cookies with :secret_key_base. When nothing set it
  # (OBSERVATORY_SECRET_KEY_BASE, config), a random key is made now: sign-ins then
  # last until the next restart. Said only when Observatory's own server runs: a host
  # app does its own sign-in and has no use for the notice.
  defp ensure_secret_key_base do
    unless Application.get_env(:observatory, :secret_key_base) do
      key = :crypto.strong_rand_bytes(48) |> Base.encode64()
      Application.put_env(:observatory, :secret_key_base, key)
      :persistent_term.put({__MODULE__, :generated_secret_key_base}, key)

      cond do
        # Each node would seal with a key of its own: none could read the webhook URLs
        # and notification sinks another node stored (Observatory.AtRest).
        Observatory.Cluster.enabled?() ->
          Logger.warning(
            "no :secret_key_base configured (OBSERVATORY_SECRET_KEY_BASE) on a cluster " <>
              "node: set the same one on every node, or the nodes cannot read the webhook " <>
              "URLs and notification sinks each other stored, nor each other's sign-ins"
          )

        ObservatoryWeb.Endpoint.server?() ->
          Logger.warning(
            "no OBSERVATORY_SECRET_KEY_BASE set: generated one, so dashboard sign-ins end " <>
              "when the gateway restarts; set one, e.g. OBSERVATORY_SECRET_KEY_BASE=$(openssl rand -base64 48)"
          )

        true ->
          :ok
      end
    end
  end

  @doc false
  # Whether :secret_key_base was configured, not generated at start (Observatory.AtRest
  # derives its key from a configured one only: a generated one changes at restart).
  def secret_key_base_configured? do
    case Application.get_env(:observatory, :secret_key_base) do
      nil -> false
      key -> key != :persistent_term.get({__MODULE__, :generated_secret_key_base}, nil)
    end
  end

  # Without an operator token nobody can sign in to the dashboard or use the operator
  # API: said once, with the fix, when Observatory's own server runs.
  defp warn_without_operator_tokens do
    if ObservatoryWeb.Endpoint.server?() and
         Application.get_env(:observatory, :operator_tokens, %{}) == %{} do
      Logger.warning(
        "no operator token configured: nobody can sign in to the dashboard or use the " <>
          "operator API; set OBSERVATORY_OPERATOR_TOKENS=<name>:<token>, e.g. " <>
          "OBSERVATORY_OPERATOR_TOKENS=alice:$(openssl rand -hex 24)"
      )
    end
  end
end
