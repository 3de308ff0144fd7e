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
end
