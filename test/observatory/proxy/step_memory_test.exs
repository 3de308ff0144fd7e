defmodule Observatory.Proxy.StepMemoryTest do
  # Changes :proxy_step_memory: not async.
  use ExUnit.Case, async: false

  alias Observatory.Proxy.StepMemory

  @keys [:proxy_step_memory, :proxy_step_memory_per_agent]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn ->
      for {key, value} <- saved,
          do:
            if(value,
              do: Application.put_env(:observatory, key, value),
              else: Application.delete_env(:observatory, key)
            )
    end)

    n = System.unique_integer([:positive])
    %{session: "sess-memory-#{n}", agent: "agent-memory-#{n}"}
  end

  describe "issue 15: no step counted twice" do
    test "a key is claimed once, per agent and session", %{session: session, agent: agent} do
      assert StepMemory.claim(agent, session, "k1")
      refute StepMemory.claim(agent, session, "k1")
      assert StepMemory.claim(agent, session <> "-other", "k1")
      assert StepMemory.claim(agent <> "-other", session, "k1")
    end

    test "a released key (its step was not ingested) is claimed again", %{
      session: session,
      agent: agent
    } do
      assert StepMemory.claim(agent, session, "refused")
      assert StepMemory.size(agent) == 1
      assert StepMemory.release(agent, session, "refused") == :ok
      assert StepMemory.size(agent) == 0
      assert StepMemory.claim(agent, session, "refused")
      refute StepMemory.claim(agent, session, "refused")
      # Releasing what was never claimed is harmless.
      assert StepMemory.release(agent, session, "never") == :ok
    end

    test "racing claims of one key: exactly one wins", %{session: session, agent: agent} do
      wins =
        1..50
        |> Task.async_stream(fn _ -> StepMemory.claim(agent, session, "raced") end,
          max_concurrency: 50
        )
        |> Enum.count(&match?({:ok, true}, &1))

      assert wins == 1
    end
  end

  describe "issue 15: the memory is bounded (:proxy_step_memory)" do
    test "past the cap the oldest keys are forgotten first", %{session: session, agent: agent} do
      Application.put_env(:observatory, :proxy_step_memory, 10)
      for k <- 1..25, do: assert(StepMemory.claim(agent, session, "k#{k}"))
      assert StepMemory.size() <= 10
      # The newest are remembered, the oldest forgotten (so claimable again).
      refute StepMemory.claim(agent, session, "k25")
      assert StepMemory.claim(agent, session, "k1")
    end
  end

  describe "issue 20 finding 7: one agent cannot flush another's proxy step memory" do
    test "past its own quota an agent forgets only its own oldest keys", %{
      session: session,
      agent: victim
    } do
      Application.put_env(:observatory, :proxy_step_memory, 1_000)
      Application.put_env(:observatory, :proxy_step_memory_per_agent, 50)
      attacker = victim <> "-attacker"

      for k <- 1..20, do: assert(StepMemory.claim(victim, session, "turn-#{k}"))

      # Ten times the total cap of distinct turns from another agent, many sessions.
      for k <- 1..10_000, do: StepMemory.claim(attacker, "flood-#{rem(k, 97)}", "k#{k}")

      assert StepMemory.size(attacker) == 50
      assert StepMemory.size(victim) == 20
      # Every turn of the victim's is still remembered: a retry counts nothing again.
      for k <- 1..20, do: refute(StepMemory.claim(victim, session, "turn-#{k}"))
      # The attacker kept its newest keys only.
      refute StepMemory.claim(attacker, "flood-#{rem(10_000, 97)}", "k10000")
      assert StepMemory.claim(attacker, "flood-1", "k1")
    end
  end
end
