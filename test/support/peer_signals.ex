defmodule Observatory.Test.PeerSignals do
  @moduledoc false
  # Run on a :peer node (test modules cannot be loaded there): forwards what the peer
  # logs and the telemetry events it emits to a process of the test node, and holds
  # the cluster's heal lock on demand.

  @doc "Sends `{:peer_log, node, level, message}` to `pid` for each log event here."
  def forward_logs(pid) do
    :ok = :logger.add_handler(:observatory_test_forward, __MODULE__, %{config: %{pid: pid}})
  end

  @doc false
  # :logger's handler callback.
  def log(%{level: level, msg: msg}, %{config: %{pid: pid}}) do
    send(pid, {:peer_log, node(), level, text(msg)})
  end

  defp text({:string, chardata}), do: IO.chardata_to_string(chardata)
  defp text({:report, report}), do: inspect(report)
  defp text({format, args}), do: IO.chardata_to_string(:io_lib.format(format, args))

  @doc "Sends `{:telemetry, event, measurements, metadata}` to `pid` for each event here."
  def forward_telemetry(pid) do
    forwarder =
      spawn(fn ->
        Process.register(self(), :observatory_telemetry_test)
        forward(pid)
      end)

    Observatory.Telemetry.put_dispatcher(Observatory.Test.TelemetryRecorder)
    {:ok, forwarder}
  end

  defp forward(pid) do
    receive do
      message -> send(pid, message)
    end

    forward(pid)
  end

  @doc """
  Takes the heal lock on this node for a process of its own (as a heal that hangs
  would hold it) until `release_heal_lock/1`. Returns the holder.

  A heal may hold the lock when this is called (the leader's check of the replicas
  runs about a second after a node joins, so soon after a cluster starts): the lock
  is then taken once that heal lets go of it (`:global` retries until it is free).
  """
  def hold_heal_lock do
    parent = self()

    holder =
      spawn(fn ->
        true = :global.set_lock({Observatory.Cluster.Heal, self()}, [node()], :infinity)
        send(parent, :held)

        receive do
          :release -> :global.del_lock({Observatory.Cluster.Heal, self()}, [node()])
        end
      end)

    receive do
      :held -> holder
    after
      30_000 ->
        Process.exit(holder, :kill)

        raise "could not take the heal lock within 30 s: #{Observatory.Cluster.Heal.lock_holder()}"
    end
  end

  def release_heal_lock(holder), do: send(holder, :release)
end
