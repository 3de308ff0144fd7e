defmodule Observatory.Gateway.HITLTest do
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.{Events, HITL, SchemaInterceptor, SessionLog}
  alias Observatory.Test.HTTP

  setup do
    :ok = Events.subscribe(Events.topology())
    :ok = Events.subscribe(HITL.topic())
    %{sid: unique_session("sess-hitl")}
  end

  test "pause and resume are audited with operator, time and reason", %{sid: sid} do
    assert {:ok, pause} = HITL.pause(sid, operator: "alice", reason: "looping")
    assert %{action: :pause, operator: "alice", reason: "looping", at: %DateTime{}} = pause
    assert HITL.paused?(sid)
    assert_receive %{event_type: "hitl_pause", session_id: ^sid}
    assert_receive %{event_type: "topology_update", session_id: ^sid, state: "paused"}

    assert {:error, :already_paused} = HITL.pause(sid, operator: "bob")

    assert {:ok, %{action: :resume, operator: "bob"}} =
             HITL.resume(sid, operator: "bob", reason: "ok")

    refute HITL.paused?(sid)
    assert_receive %{event_type: "topology_update", session_id: ^sid, state: "active"}
    assert {:error, :not_paused} = HITL.resume(sid, operator: "bob")

    assert [%{action: :resume}, %{action: :pause}] = HITL.audit_log(session_id: sid)
  end

  test "a resumed node shows its entropy state again, not a blanket active", %{sid: sid} do
    record_all(sid, List.duplicate({"search", "read_file", :failure}, 5), agent_id: "agent-7")
    assert_receive %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"}
    {:ok, _} = HITL.pause(sid, operator: "alice", reason: "")
    assert_receive %{event_type: "topology_update", session_id: ^sid, state: "paused"}
    {:ok, _} = HITL.resume(sid, operator: "alice", reason: "")

    assert_receive %{
      event_type: "topology_update",
      session_id: ^sid,
      agent_id: "agent-7",
      state: "alert_entropy",
      color: "#ef4444"
    }

    refute_received %{event_type: "topology_update", session_id: ^sid, state: "active"}
  end

  test "commands need an operator and a valid session id" do
    assert {:error, :invalid_operator} = HITL.pause("s", reason: "x")
    assert {:error, :invalid_session_id} = HITL.pause("", operator: "a")
    assert {:error, :invalid_reason} = HITL.pause("s", operator: "a", reason: 7)
  end

  test "a paused session's messages are still accepted and stored, with a pause directive",
       %{sid: sid} do
    {:ok, _} = HITL.pause(sid, operator: "alice", reason: "inspect")
    assert_receive %{state: "paused", session_id: ^sid}
    msg = HTTP.envelope(%{"meta" => %{"session_id" => sid}})

    for _ <- 1..5 do
      assert {:ok, %{paused: true, directives: [%{"type" => "pause", "operator" => "alice"}]}} =
               SchemaInterceptor.ingest(msg)
    end

    assert length(SessionLog.recent(sid)) == 5, "nothing is lost"
    assert length(EntropyTracker.window(sid)) == 5
    refute_received %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"}
    refute_received %{event_type: "topology_update", session_id: ^sid, state: "blocked"}

    {:ok, _} = HITL.resume(sid, operator: "alice")
    assert {:ok, %{paused: false, directives: []}} = SchemaInterceptor.ingest(msg)
    assert_receive %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"}
  end
end
