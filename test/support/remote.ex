defmodule Observatory.Test.Remote do
  @moduledoc false
  # Functions run on a :peer node. Test modules are compiled in memory and cannot be
  # loaded there, so anything a peer executes lives in test/support.

  def start_pubsub(name) do
    {:ok, pid} = Supervisor.start_link([{Observatory.PubSub, name: name}], strategy: :one_for_one)
    Process.unlink(pid)
    :ok
  end

  @doc "Subscribes a process on this node that forwards what it gets to `parent`."
  def subscribe_and_forward(pubsub, topic, parent) do
    spawn(fn ->
      :ok = Observatory.PubSub.subscribe(pubsub, topic)
      send(parent, :subscribed)

      receive do
        msg -> send(parent, {:remote_got, msg})
      end
    end)

    :ok
  end

  @doc """
  Starts Observatory here as a release would (`:permanent`: if its top supervisor
  gives up, this VM ends), with `env` over the application environment. (A
  permanent application that fails to start ends the VM too: `:temporary` lets a
  test read the error.) Logs are off: the tests that use this kill processes on
  purpose.
  """
  def start_app(env, type \\ :permanent) do
    :logger.set_primary_config(:level, :emergency)
    Application.put_env(:logger, :level, :emergency)
    for {key, value} <- env, do: Application.put_env(:observatory, key, value)

    with {:ok, _} = started <- Application.ensure_all_started(:observatory, type) do
      Logger.configure(level: :emergency)
      started
    end
  end

  @doc """
  Kills the process registered as `name` `times` times, each time as soon as it is
  back (waiting at most 2 s for it); returns the pids killed.
  """
  def kill_repeatedly(name, times) do
    Enum.reduce(1..times, [], fn _, killed ->
      pid = await_new(name, killed, 2_000)
      Process.exit(pid, :kill)
      [pid | killed]
    end)
  end

  @doc "The pid registered as `name` once it is not one of `old`; nil after `timeout_ms`."
  def await_new(name, old, timeout_ms) do
    pid = Process.whereis(name)

    cond do
      pid != nil and pid not in old -> pid
      timeout_ms <= 0 -> nil
      true -> Process.sleep(5) && await_new(name, old, timeout_ms - 5)
    end
  end

  @doc "Whether the application runs here."
  def running?, do: List.keymember?(Application.started_applications(), :observatory, 0)

  @doc "GET `path` on this node's server: `{status, decoded body}`."
  def get(path) do
    %{status: status, body: body} = Observatory.Test.HTTP.get(path)
    {status, body}
  end

  @doc "Sends every log event of this node to `pid` as `{:peer_log, text, mfa}`, and nowhere else."
  def forward_logs(pid) do
    Application.put_env(:logger, :backends, [])
    _ = :logger.remove_handler(:default)
    :ok = :logger.set_primary_config(:level, :all)
    :ok = :logger.add_handler(:observatory_test_forward, __MODULE__, %{config: %{pid: pid}})
  end

  @doc false
  # :logger handler callback.
  def log(%{msg: msg, meta: meta}, %{config: %{pid: pid}}) do
    text =
      case msg do
        {:string, s} -> IO.chardata_to_string(s)
        {:report, r} -> inspect(r)
        {format, args} -> format |> :io_lib.format(args) |> IO.chardata_to_string()
      end

    send(pid, {:peer_log, text, Map.get(meta, :mfa)})
  end

  @doc """
  Applies `m.f(a)` here: `{:ok, result}`, or `{:raised, exception_module, message}`
  (an exception does not cross :erpc as itself).
  """
  def try_call(m, f, a) do
    {:ok, apply(m, f, a)}
  rescue
    error -> {:raised, error.__struct__, Exception.message(error)}
  end

  @doc """
  The guides' subscribe example (docs/sending-steps.md), run here: a process subscribed with
  `Observatory.Gateway.Events.subscribe/1` that forwards what it gets to `parent`.
  """
  def events_subscribe_and_forward(topic, parent) do
    spawn(fn ->
      :ok = Observatory.Gateway.Events.subscribe(topic)
      send(parent, :subscribed)
      forward_all(parent)
    end)

    :ok
  end

  defp forward_all(parent) do
    receive do
      msg ->
        send(parent, {:remote_got, msg})
        forward_all(parent)
    end
  end

  @doc """
  Loads a host application, `:fake_host`, that depends on Observatory and whose
  supervision tree starts a PubSub named `bus` (none when nil), as a Phoenix host's
  does; `env` is its environment (an endpoint's `pubsub_server`).
  """
  def load_fake_host(bus, env \\ []) do
    spec = [
      description: ~c"a host app",
      vsn: ~c"0.1.0",
      modules: [],
      registered: [],
      applications: [:kernel, :stdlib, :elixir, :logger, :observatory],
      mod: {Observatory.Test.FakeHost, bus},
      env: env
    ]

    :ok = :application.load({:application, :fake_host, spec})
  end
end
