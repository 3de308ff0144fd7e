defmodule Observatory.Cluster.GateTest do
  # The gate every durable write passes in a cluster. Global to the VM: not async.
  use ExUnit.Case, async: false

  alias Observatory.Cluster.Gate

  setup do
    on_exit(&Gate.open/0)
  end

  test "an open gate runs the write at once" do
    refute Gate.closed?()
    assert Gate.pass(0, fn -> :written end) == :written
  end

  test "a closed gate holds a write until it opens, then runs it" do
    :ok = Gate.close(5_000)
    assert Gate.closed?()
    task = Task.async(fn -> Gate.pass(5_000, fn -> :written end) end)
    refute Task.yield(task, 100)
    Gate.open()
    assert Task.await(task) == :written
  end

  test "a write that waited longer than its timeout is refused and not run" do
    :ok = Gate.close(5_000)
    me = self()
    assert Gate.pass(50, fn -> send(me, :ran) end) == {:error, :closed}
    refute_received :ran
  end

  test "closing waits for the writes already under way" do
    me = self()

    writer =
      Task.async(fn ->
        Gate.pass(1_000, fn ->
          send(me, :writing)
          Process.sleep(200)
          :done
        end)
      end)

    assert_receive :writing
    started = System.monotonic_time(:millisecond)
    assert Gate.close(5_000) == :ok
    assert System.monotonic_time(:millisecond) - started >= 150
    assert Task.await(writer) == :done
  end

  test "a close expires on its own (a reconciler that died holds writes no longer)" do
    :ok = Gate.close(50)
    Process.sleep(60)
    refute Gate.closed?()
    assert Gate.pass(0, fn -> :written end) == :written
  end
end
