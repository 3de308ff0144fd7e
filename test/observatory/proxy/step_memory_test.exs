defmodule Observatory.Proxy.StepMemoryTest do
  # Changes :proxy_step_memory: not async.
  use ExUnit.Case, async: false

  alias Observatory.Proxy.StepMemory

  setup do
    saved = Application.get_env(:observatory, :proxy_step_memory)
    on_exit(fn -> Application.put_env(:observatory, :proxy_step_memory, saved) end)
    %{session: "sess-memory-#{System.unique_integer([:positive])}"}
  end

  describe "issue 15: no step counted twice" do
    test "a key is claimed once, per session", %{session: session} do
      assert StepMemory.claim(session, "k1")
      refute StepMemory.claim(session, "k1")
      assert StepMemory.claim(session <> "-other", "k1")
    end

    test "a released key (its step was not ingested) is claimed again", %{session: session} do
      assert StepMemory.claim(session, "refused")
      assert StepMemory.release(session, "refused") == :ok
      assert StepMemory.claim(session, "refused")
      refute StepMemory.claim(session, "refused")
      # Releasing what was never claimed is harmless.
      assert StepMemory.release(session, "never") == :ok
    end

    test "racing claims of one key: exactly one wins", %{session: session} do
      wins =
        1..50
        |> Task.async_stream(fn _ -> StepMemory.claim(session, "raced") end, max_concurrency: 50)
        |> Enum.count(&match?({:ok, true}, &1))

      assert wins == 1
    end
  end

  describe "issue 15: the memory is bounded (:proxy_step_memory)" do
    test "past the cap the oldest keys are forgotten first", %{session: session} do
      Application.put_env(:observatory, :proxy_step_memory, 10)
      for k <- 1..25, do: assert(StepMemory.claim(session, "k#{k}"))
      assert StepMemory.size() <= 10
      # The newest are remembered, the oldest forgotten (so claimable again).
      refute StepMemory.claim(session, "k25")
      assert StepMemory.claim(session, "k1")
    end
  end
end
