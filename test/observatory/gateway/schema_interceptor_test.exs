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

  defp contains_value?(value, target) when is_map(value),
    do: Enum.any?(value, fn {_k, v} -> contains_value?(v, target) end)

  defp contains_value?(value, target) when is_list(value),
    do: Enum.any?(value, &contains_value?(&1, target))

  defp contains_value?(value, target), do: value == target
end
