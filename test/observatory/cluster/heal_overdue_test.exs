defmodule Observatory.Cluster.HealOverdueTest do
  # A heal still running after heal_timeout_ms (its write holds have expired) is said
  # once, with where it is stuck; a heal that finished in time says nothing. The
  # monitor's callback is called as its process would call it. Not async: it sets the
  # telemetry dispatcher and registers the recorder's name.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.Cluster.Monitor
  alias Observatory.{Telemetry, Test.TelemetryRecorder}

  setup do
    previous = Telemetry.put_dispatcher(TelemetryRecorder)
    Process.register(self(), :observatory_telemetry_test)

    on_exit(fn -> Telemetry.put_dispatcher(previous) end)
  end

  defp stuck_heal, do: spawn(fn -> receive do: (:never -> :ok) end)

  test "a heal still running: one warning naming the nodes, how long and where it is, and a telemetry event" do
    heal = stuck_heal()
    started = System.monotonic_time(:millisecond) - 15_200
    state = %{heal: heal}

    log =
      capture_log(fn ->
        assert {:noreply, ^state} =
                 Monitor.handle_info({:heal_overdue, heal, :check, [:a@h, :b@h], started}, state)
      end)

    assert log =~ "cluster: heal stalled: the heal (check) among [:a@h, :b@h] has run for"

    assert log =~ ~r/longer than heal_timeout_ms \(15000 ms\); it is in \{[^}]+, \d+\}/

    assert_received {:telemetry, [:observatory, :cluster, :heal_stalled], %{duration_ms: ms},
                     %{reason: :overdue, nodes: [:a@h, :b@h], kind: :check, node: node}}

    assert ms >= 15_200
    assert node == node()
    Process.exit(heal, :kill)
  end

  # A stall's warning on the leader names what its latest heal came to; one that found
  # the cluster whole was recorded as nil, and the warning said "none finished".
  test "a heal that finished whole or verified is remembered as such for a stall's warning" do
    state = %{heal: self(), last_outcome: "failed: earlier"}

    assert {:noreply, %{heal: nil, last_outcome: whole}} =
             Monitor.handle_info({:heal_done, :check, :whole}, state)

    assert whole == "found every member's Mnesia running as one"

    assert {:noreply, %{last_outcome: verified}} =
             Monitor.handle_info({:heal_done, :verify, {:verified, %{changed: 0}}}, state)

    assert verified =~ "compared the replicas"
  end

  test "a heal that finished before its time (another heal, or none, runs now): nothing said" do
    finished = stuck_heal()
    state = %{heal: nil}

    log =
      capture_log(fn ->
        assert {:noreply, ^state} =
                 Monitor.handle_info({:heal_overdue, finished, :verify, [:a@h], 0}, state)

        assert {:noreply, _} =
                 Monitor.handle_info({:heal_overdue, finished, :verify, [:a@h], 0}, %{
                   heal: stuck_heal()
                 })
      end)

    refute log =~ "heal stalled"
    refute_received {:telemetry, [:observatory, :cluster, :heal_stalled], _, _}
    Process.exit(finished, :kill)
  end
end
