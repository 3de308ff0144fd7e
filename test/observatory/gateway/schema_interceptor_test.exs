defmodule Observatory.Gateway.SchemaInterceptorTest do
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.{Events, SchemaInterceptor, SessionLog}
  alias Observatory.Test.HTTP

  setup do
    :ok = Events.subscribe(Events.decision_logs())
    %{sid: unique_session("sess-si")}
  end

  defp message(sid, n, intent \\ "search", tool \\ "read_file") do
    HTTP.envelope(%{
      "meta" => %{"session_id" => sid, "step_id" => "#{sid}-#{n}"},
      "cognition" => %{"intent" => intent, "entropy_score" => 0.9},
      "action" => %{"tool_call" => tool}
    })
  end

  describe "FR-9.8 gateway-authoritative entropy_score" do
    test "positive: the agent says 0.9, the gateway computes 0.15 and downstream receives 0.15",
         %{sid: sid} do
      Application.put_env(:observatory, :entropy_window_size, 20)
      for n <- 1..18, do: {:ok, _} = SchemaInterceptor.ingest(message(sid, n))
      {:ok, _} = SchemaInterceptor.ingest(message(sid, 19, "plan", "write_file"))

      assert {:ok, result} =
               SchemaInterceptor.ingest(
                 HTTP.envelope(%{
                   "meta" => %{"session_id" => sid, "step_id" => "last"},
                   "cognition" => %{"intent" => "verify", "entropy_score" => 0.9},
                   "action" => %{"tool_call" => "run_tests"}
                 })
               )

      assert result.entropy_score == 0.15
      assert result.severity == :loop

      assert_receive %{event_type: "decision_log", step_id: "last", envelope: envelope}
      assert envelope["cognition"]["entropy_score"] == 0.15
      refute contains_value?(envelope, 0.9), "the agent's value is kept nowhere"
    end

    test "negative: a tracker error keeps the agent's value and logs a schema_violation",
         %{sid: sid} do
      log =
        capture_log(fn ->
          assert {:ok, result} =
                   SchemaInterceptor.ingest(message(sid, 1), tracker: :no_such_tracker)

          assert result.entropy_score == 0.9
          assert result.severity == nil
        end)

      assert log =~ "schema_violation"
      assert log =~ "entropy computation failed"
      assert_receive %{event_type: "decision_log", session_id: ^sid, envelope: envelope}
      assert envelope["cognition"]["entropy_score"] == 0.9
    end
  end

  describe "FR-9.9 SchemaInterceptor call contract" do
    test "positive: a valid message is scored synchronously, in the caller's process",
         %{sid: sid} do
      me = self()
      :erlang.trace(me, true, [:procs])

      assert {:ok, %{entropy_score: 1.0, severity: :normal}} =
               SchemaInterceptor.ingest(message(sid, 1, "plan", "write_file"))

      :erlang.trace(me, false, [:procs])
      refute_received {:trace, ^me, :spawn, _, _}, "no Task or other process was used"
      assert EntropyTracker.window(sid) == [{"plan", "write_file", :failure}]
      assert [%{"meta" => %{"step_id" => _}}] = SessionLog.recent(sid)
    end

    test "negative: an invalid message is rejected and never updates the window", %{sid: sid} do
      bad = put_in(message(sid, 1), ["meta", "timestamp"], "not a time")

      log =
        capture_log(fn ->
          assert {:error, {:invalid, [%{path: "meta.timestamp"}]}} = SchemaInterceptor.ingest(bad)
        end)

      assert log =~ "schema_violation"
      assert EntropyTracker.window(sid) == []
      refute_received %{event_type: "decision_log", session_id: ^sid}
    end
  end

  test "JSON text and maps take the same path", %{sid: sid} do
    json = Observatory.JSON.encode!(message(sid, 1))
    assert {:ok, %{entropy_score: 1.0}} = SchemaInterceptor.ingest(json)
    assert {:ok, %{entropy_score: 0.5}} = SchemaInterceptor.ingest(message(sid, 2))
  end

  # Before: nil, a list or a keyword list raised FunctionClauseError in
  # DecisionLog.from_map/1, where the documented contract is {:error, {:invalid, _}}.
  test "neither a map nor JSON text: {:error, {:invalid, _}} at \"$\", not a crash" do
    log =
      capture_log(fn ->
        for bad <- [nil, [1], [meta: %{}], 42, {:ok, %{}}] do
          assert {:error, {:invalid, [%{path: "$", reason: reason}]}} =
                   SchemaInterceptor.ingest(bad)

          assert reason =~ "must be an envelope: a map or its JSON text, got: #{inspect(bad)}"
        end
      end)

    assert log =~ "schema_violation"
  end

  describe "the ingest's glue: directives and counters" do
    setup %{sid: sid} do
      agent = "agent-glue-#{System.unique_integer([:positive])}"
      {:ok, _} = Observatory.KillSwitch.Agents.fetch_or_register(agent)

      # The same call and result every time: the step detector warns, then blocks.
      step = fn n ->
        HTTP.envelope(%{
          "meta" => %{"session_id" => sid, "agent_id" => agent, "step_id" => "#{sid}-#{n}"},
          "action" => %{
            "tool_call" => "run_code",
            "tool_input" => %{"code" => "1 + 1"},
            "result" => %{"out" => 2},
            "status" => "success"
          }
        })
      end

      %{agent: agent, step: step}
    end

    test "a step with nothing to say gets no directives; paused, its agent inactive and " <>
           "blocked: pause, stop and block, in that order, from the next step on",
         %{sid: sid, agent: agent, step: step} do
      assert {:ok, %{directives: [], paused: false, step: %{action: :continue}}} =
               SchemaInterceptor.ingest(step.(1))

      {:ok, _} = Observatory.Gateway.HITL.pause(sid, operator: "alice", reason: "looping")
      {:ok, _} = Observatory.KillSwitch.deactivate(agent, operator: "alice", reason: "test")

      assert {:ok, %{paused: true, directives: [%{"type" => "pause"}, %{"type" => "stop"}]}} =
               SchemaInterceptor.ingest(step.(2))

      blocked =
        Enum.find_value(3..12, fn n ->
          {:ok, result} = SchemaInterceptor.ingest(step.(n))
          if result.step.action == :block, do: result
        end)

      assert %{
               "type" => "pause",
               "reason" => "looping",
               "operator" => "alice",
               "since" => since
             } = hd(blocked.directives)

      assert {:ok, _, 0} = DateTime.from_iso8601(since)

      assert [_pause, %{"type" => "stop", "code" => "agent_inactive"}, block] = blocked.directives

      assert %{"type" => "block", "source" => "step_detector", "guidance" => guidance} = block
      assert is_binary(guidance)

      # A retry of the blocked step is told the same, the session's state as it is now.
      {:ok, _} = Observatory.Gateway.HITL.resume(sid, operator: "alice", reason: "fixed")
      {:ok, _} = Observatory.KillSwitch.activate(agent, operator: "alice", reason: "fixed")
      [block_again] = blocked.directives -- Enum.take(blocked.directives, 2)
      retry = step.(blocked.step.stagnation_streak + 1)

      assert {:ok, %{replayed: true, directives: [^block_again]}} =
               SchemaInterceptor.ingest(retry)
    end

    test "a scored step is counted once (the step, its severity, its verdict); a retry is not",
         %{step: step} do
      names = [
        :messages,
        :normal,
        :warning,
        :loop,
        :verdict_progress,
        :verdict_suspect,
        :verdict_loop,
        :entropy_errors,
        :verdict_errors
      ]

      counts = fn -> Map.new(names, &{&1, Observatory.Metrics.get(&1)}) end
      before = counts.()
      {:ok, first} = SchemaInterceptor.ingest(step.(1))
      after_one = counts.()
      delta = Map.new(names, &{&1, after_one[&1] - before[&1]})

      assert delta.messages == 1
      assert delta[first.severity] == 1
      assert delta[:"verdict_#{first.verdict.verdict}"] == 1
      assert Enum.sum(Map.values(delta)) == 3, "nothing else counted: #{inspect(delta)}"

      assert {:ok, %{replayed: true}} = SchemaInterceptor.ingest(step.(1))
      assert counts.() == after_one
    end
  end

  defp contains_value?(value, target) when is_map(value),
    do: Enum.any?(value, fn {_k, v} -> contains_value?(v, target) end)

  defp contains_value?(value, target) when is_list(value),
    do: Enum.any?(value, &contains_value?(&1, target))

  defp contains_value?(value, target), do: value == target
end
