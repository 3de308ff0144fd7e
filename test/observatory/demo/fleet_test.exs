defmodule Observatory.Demo.FleetTest do
  # Runs the demo fleet (fixed session ids, global stores): not async.
  use Observatory.TrackerCase, async: false

  alias Observatory.Demo.Fleet
  alias Observatory.Gateway.{Events, Evidence, HITL, LoopVerdict, SessionLog}

  setup do
    restore_env_on_exit([:demo_interval_ms])
    Application.put_env(:observatory, :demo_interval_ms, 5)
    :ok = Events.subscribe(Events.decision_logs())

    on_exit(fn ->
      if HITL.paused?("sess-stuck"), do: HITL.resume("sess-stuck", operator: "test")
    end)

    start_supervised!(Fleet)
    :ok
  end

  # Waits for `n` more steps of `session` (each step's decision log event).
  defp await_steps(session, n) when n > 0 do
    assert_receive %{event_type: "decision_log", session_id: ^session}, 5_000
    await_steps(session, n - 1)
  end

  defp await_steps(_session, 0), do: :ok

  describe "issue 18: a believable demo" do
    test "its agents are registered, so their agent pages work" do
      for {_session, agent, _step} <- Fleet.agents() do
        assert %{active: true} = Observatory.KillSwitch.agent(agent)
      end
    end

    test "the stuck agent repeats one identical failing call with a result; its evidence names it" do
      await_steps("sess-stuck", 4)
      steps = SessionLog.steps("sess-stuck")
      actions = Enum.map(steps, & &1.envelope["action"])

      assert [%{"status" => "failure", "result" => %{"stdout" => stdout}} | _] = actions
      assert length(Enum.uniq(actions)) == 1, "one identical call, one identical result"
      assert stdout =~ "assert 401 == 200"

      assert %{verdict: :loop, rule: :repeat} = verdict = LoopVerdict.session("sess-stuck")

      assert %{
               calls: [%{tool: "bash", call: "pytest tests/test_auth.py -x"}],
               outcome: "the same failure",
               excerpt: excerpt
             } = Evidence.explain_verdict(verdict, steps)

      assert excerpt =~ "FAILED tests/test_auth.py::test_login_returns_token - assert 401 == 200"
    end

    test "the ping-pong agent is a cycle, the recovering agent's timeouts differ only in a number" do
      await_steps("sess-pingpong", 7)
      assert %{verdict: :loop, rule: :cycle} = LoopVerdict.session("sess-pingpong")

      await_steps("sess-recovers", 1)

      timeouts =
        Enum.filter(
          SessionLog.steps("sess-recovers"),
          &(&1.envelope["action"]["status"] == "timeout")
        )

      assert length(timeouts) >= 2
      texts = for s <- timeouts, do: Evidence.texts(s.envelope).result

      assert %{kind: :numbers, changes: [%{line: "elapsed_ms: #"}]} =
               Evidence.compare(texts, Enum.map(timeouts, & &1.number))
    end

    test "the healthy agents are never alarmed by the loop verdict: an order or a module a round is a new target" do
      # Each round the support agent looks up, searches for and answers about another
      # order, the coder reads and edits another module: calls that differ only in a
      # number are new targets, never revisits of the round before. Earlier tests ran
      # the same fleet from its first step: start from a clean history.
      for session <- ["sess-healthy-1", "sess-healthy-2"], do: LoopVerdict.forget(session)

      for _round <- 1..30 do
        await_steps("sess-healthy-2", 1)

        for session <- ["sess-healthy-1", "sess-healthy-2"] do
          verdict = LoopVerdict.session(session)

          assert verdict == nil or verdict.verdict == :progress,
                 "#{session} alarmed: #{inspect(verdict)}"
        end
      end
    end

    test "a paused demo session stops sending until it is resumed" do
      await_steps("sess-stuck", 1)
      {:ok, _} = HITL.pause("sess-stuck", operator: "test", reason: "demo")
      # A step already on its way may still arrive: start counting after two rounds.
      await_steps("sess-healthy-1", 2)
      flush("sess-stuck")
      count = SessionLog.count("sess-stuck")

      await_steps("sess-healthy-1", 5)
      refute_received %{event_type: "decision_log", session_id: "sess-stuck"}
      assert SessionLog.count("sess-stuck") == count

      {:ok, _} = HITL.resume("sess-stuck", operator: "test")
      await_steps("sess-stuck", 1)
    end
  end

  defp flush(session) do
    receive do
      %{event_type: "decision_log", session_id: ^session} -> flush(session)
    after
      0 -> :ok
    end
  end
end
