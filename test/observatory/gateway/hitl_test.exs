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
    # Each call a new step (a new step_id).
    msg = fn -> HTTP.envelope(%{"meta" => %{"session_id" => sid}}) end

    for _ <- 1..5 do
      assert {:ok, %{paused: true, directives: [%{"type" => "pause", "operator" => "alice"}]}} =
               SchemaInterceptor.ingest(msg.())
    end

    assert length(SessionLog.recent(sid)) == 5, "nothing is lost"
    assert length(EntropyTracker.window(sid)) == 5
    refute_received %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"}
    refute_received %{event_type: "topology_update", session_id: ^sid, state: "blocked"}

    {:ok, _} = HITL.resume(sid, operator: "alice")
    assert {:ok, %{paused: false, directives: []}} = SchemaInterceptor.ingest(msg.())
    assert_receive %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"}
  end

  describe "finding 9: pauses and the audit log survive a crash of HITL and a node restart" do
    test "HITL killed: the pause is still enforced and the audit log is whole", %{sid: sid} do
      {:ok, _} = HITL.pause(sid, operator: "alice", reason: "before the crash")
      before = HITL.audit_log(session_id: sid)

      kill_and_await_restart(HITL)

      assert HITL.paused?(sid)
      assert %{operator: "alice", reason: "before the crash"} = HITL.pause_of(sid)
      assert HITL.audit_log(session_id: sid) == before
      assert sid in Enum.map(HITL.paused_sessions(), & &1.session_id)

      msg = HTTP.envelope(%{"meta" => %{"session_id" => sid}})

      assert {:ok, %{paused: true, directives: [%{"type" => "pause"}]}} =
               SchemaInterceptor.ingest(msg)

      # The audit log goes on after the restart, in order.
      {:ok, _} = HITL.resume(sid, operator: "bob", reason: "after")

      assert [%{action: :resume, operator: "bob"}, %{action: :pause}] =
               HITL.audit_log(session_id: sid)

      refute HITL.paused?(sid)
    end

    test "a restart of the application and of Mnesia keeps the pause", %{sid: sid} do
      {:ok, _} = HITL.pause(sid, operator: "alice", reason: "across a restart")

      # This process subscribed (setup): the PubSub registry's partition is linked to it.
      Process.flag(:trap_exit, true)
      :ok = Application.stop(:observatory)
      :stopped = :mnesia.stop()
      {:ok, _} = Application.ensure_all_started(:observatory)

      assert %{operator: "alice", reason: "across a restart"} = HITL.pause_of(sid)
      assert [%{action: :pause, session_id: ^sid}] = HITL.audit_log(session_id: sid)
      assert {:error, :already_paused} = HITL.pause(sid, operator: "bob")
    end
  end

  defp kill_and_await_restart(name) do
    old = Process.whereis(name)
    Process.exit(old, :kill)
    await_new(name, old, 200)
  end

  defp await_new(name, old, tries) do
    case Process.whereis(name) do
      pid when is_pid(pid) and pid != old -> pid
      _ when tries > 0 -> Process.sleep(10) && await_new(name, old, tries - 1)
      _ -> flunk("#{inspect(name)} did not come back")
    end
  end
end
