defmodule Observatory.DirtySchedulingTest do
  # Holds every dirty CPU scheduler: nothing else may run beside it.
  use ExUnit.Case, async: false

  alias Observatory.Gateway.DecisionLog
  alias Observatory.Native
  alias Observatory.Test.HTTP

  @hold_ms 1_500

  # Fills every dirty CPU scheduler for `@hold_ms`, as large steps being parsed would.
  # Each holder says `:holding` just before its NIF call and `{:released, pid}` after.
  defp hold_dirty_schedulers do
    test = self()

    for _ <- 1..:erlang.system_info(:dirty_cpu_schedulers) do
      spawn_link(fn ->
        send(test, :holding)
        Native.dirty_cpu_hold(@hold_ms)
        send(test, {:released, self()})
      end)
    end
    |> tap(fn holders -> for _ <- holders, do: assert_receive(:holding) end)
  end

  defp await_released(holders),
    do: for(pid <- holders, do: assert_receive({:released, ^pid}, 5_000))

  describe "finding 1: /healthz never waits behind request work" do
    test "it answers 200 while every dirty CPU scheduler is busy" do
      holders = hold_dirty_schedulers()
      assert %{status: 200, body: %{"status" => "ok", "sessions" => n}} = HTTP.get("/healthz")
      assert is_integer(n)
      refute_received {:released, _}, "/healthz waited for a dirty scheduler"
      await_released(holders)
    end
  end

  describe "finding 1: a NIF call holds a normal scheduler only for small inputs" do
    test "a step up to the dirty threshold is parsed on a normal scheduler, a larger one is not" do
      threshold = Observatory.Native.Cost.dirty_bytes()
      small = envelope(threshold)
      large = envelope(threshold * 4)
      assert byte_size(small) <= threshold and byte_size(large) > threshold

      holders = hold_dirty_schedulers()
      # The small step does not wait for the dirty schedulers...
      assert {:ok, _, _} = DecisionLog.parse(small)
      refute_received {:released, _}

      # ...the large one does: it runs on one, never on a normal scheduler.
      test = self()
      spawn_link(fn -> send(test, {:parsed, DecisionLog.parse(large)}) end)
      assert_receive {:released, first}, 5_000
      assert_receive {:parsed, {:ok, _, _}}, 5_000
      await_released(List.delete(holders, first))
    end
  end

  # An envelope of at most `bytes` bytes whose result is a CSV line (`1,1,1,…`).
  defp envelope(bytes) do
    base =
      Observatory.JSON.encode!(%{
        "meta" => %{
          "step_id" => "s-1",
          "session_id" => "dirty-sched",
          "agent_id" => "agent-dirty",
          "timestamp" => "2026-02-22T10:30:00Z"
        },
        "cognition" => %{"intent" => "read"},
        "action" => %{"tool_call" => "cat", "status" => "success", "result" => ""}
      })

    csv = String.duplicate("1,", div(bytes - byte_size(base), 2))
    String.replace(base, ~s("result":""), ~s("result":"#{csv}"))
  end
end
