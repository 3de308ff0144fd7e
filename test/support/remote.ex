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
end
