defmodule ObservatoryWeb.SessionClusterManagerTest do
  # The manager's callbacks as plain functions: no browser, no HTTP. The test process
  # plays the page process: mount/3 subscribes it, and the gateway's real broadcasts
  # land in its mailbox.
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.{Events, HITL, SchemaInterceptor}
  alias ObservatoryWeb.SessionClusterManager, as: Manager
  alias ObservatoryWeb.SessionClusterManager.{Alerts, Fleet, Socket}

  @loop_step {"search", "read_file", :failure}
  @hostile "<img src=x onerror=alert(1)>"

  defp mount!(opts \\ [connected?: true]) do
    {:ok, socket} = Manager.mount(%{}, %{"operator" => "alice"}, Socket.new(opts))
    socket
  end

  defp html(socket), do: socket.assigns |> Manager.render() |> IO.iodata_to_binary()

  # Drives a session into LOOP and returns the EntropyAlertEvents it broadcast.
  defp loop!(sid, steps \\ 5) do
    record_all(sid, List.duplicate(@loop_step, steps), agent_id: "agent-loop")
    collect_alerts(sid)
  end

  defp collect_alerts(sid, acc \\ []) do
    receive do
      %{event_type: "entropy_alert", session_id: ^sid} = alert ->
        collect_alerts(sid, [alert | acc])
    after
      0 -> Enum.reverse(acc)
    end
  end

  defp feed(socket, messages) do
    Enum.reduce(messages, socket, fn message, socket ->
      {:noreply, socket} = Manager.handle_info(message, socket)
      socket
    end)
  end

  defp unpause(sid), do: if(HITL.paused?(sid), do: HITL.resume(sid, operator: "test"))

  describe "FR-9.10 mount/3" do
    test "subscribes to gateway:entropy_alerts (and topology, hitl) when connected" do
      sid = unique_session("sess-mount")
      socket = mount!()

      Events.broadcast("gateway:entropy_alerts", %{probe: sid})
      Events.broadcast("gateway:topology", %{probe: sid, topic: :topology})
      Events.broadcast("gateway:hitl", %{probe: sid, topic: :hitl})

      assert_receive %{probe: ^sid}
      assert_receive %{probe: ^sid, topic: :topology}
      assert_receive %{probe: ^sid, topic: :hitl}
      assert socket.assigns.operator == "alice"

      assert Manager.topics() == [
               "gateway:entropy_alerts",
               "gateway:topology",
               "gateway:hitl",
               "gateway:loop_detection",
               "gateway:loop_verdict",
               "gateway:cluster"
             ]
    end

    test "an unconnected mount (the first HTTP render) renders without subscribing" do
      socket = mount!(connected?: false)
      sid = unique_session("sess-static")
      Events.broadcast("gateway:entropy_alerts", %{probe: sid})
      refute_receive %{probe: ^sid}, 50
      assert html(socket) =~ ~s(id="alerts-panel")
    end

    test "loads the topology snapshot: loop, warning, normal and paused sessions" do
      [looping, warned, healthy, paused] =
        for p <- ~w(snap-loop snap-warn snap-ok snap-paused), do: unique_session(p)

      record_all(looping, List.duplicate(@loop_step, 5))
      record_all(warned, List.duplicate(@loop_step, 4) ++ [{"a", "b", :success}])
      record_all(healthy, distinct_tuples(3))
      record_all(paused, distinct_tuples(2))
      {:ok, _} = HITL.pause(paused, operator: "bob", reason: "")
      on_exit(fn -> unpause(paused) end)

      fleet = mount!(connected?: false).assigns.fleet

      assert Fleet.state_of(fleet, looping) == "alert_entropy"
      assert Fleet.state_of(fleet, warned) == "blocked"
      assert Fleet.state_of(fleet, healthy) == "active"
      assert Fleet.state_of(fleet, paused) == "paused"
      assert fleet[looping].agent_id == "agent-test"
      assert fleet[looping].score == 0.2
    end

    test "the operator defaults to \"dashboard\" when the session names none" do
      {:ok, socket} = Manager.mount(%{}, %{}, Socket.new())
      assert socket.assigns.operator == "dashboard"
    end
  end

  describe "FR-9.10 positive: an alert is rendered with Pause and Inspect" do
    test "a real EntropyAlertEvent lands in the Entropy Alerts panel" do
      socket = mount!()
      sid = unique_session("sess-alert")
      [alert] = loop!(sid)

      socket = feed(socket, [alert])
      page = html(socket)

      assert [%{session_id: ^sid, agent_id: "agent-loop", score: 0.2, occurrence_count: 5}] =
               Alerts.rows(socket.assigns.alerts)

      assert %{agent_id: "agent-loop", score: 0.2} = socket.assigns.fleet[sid]

      assert page =~ ~s(data-session-id="#{sid}")
      assert page =~ "agent-loop"
      assert page =~ "<code>search</code>"
      assert page =~ "<code>read_file</code>"
      assert page =~ ~s(<span class="status status-failure">failure</span>)
      assert page =~ ~s(<td class="num score">0.20</td>)
      assert page =~ ~s(<span class="agent">agent-loop</span>)
      assert page =~ ~s(<span class="count">5 of 5 steps in the window</span>)
      assert page =~ ~r/<time datetime="[^"]+">\d\d:\d\d:\d\d UTC<\/time>/

      assert page =~
               ~s(phx-click="pause_inspect" phx-value-session_id="#{sid}">Pause and Inspect</button>)
    end
  end

  describe "FR-9.10 negative: a second alert within 5 s dedupes" do
    test "one row per session, updated in place, however many alerts arrive" do
      socket = mount!()
      sid = unique_session("sess-dedupe")
      other = unique_session("sess-other")
      alerts = loop!(sid, 7)
      assert length(alerts) == 3, "5 identical steps alert, and so does each step after"

      socket = feed(socket, alerts ++ loop!(other))
      rows = Alerts.rows(socket.assigns.alerts)

      assert [%{session_id: ^other}, %{session_id: ^sid, alerts: 3} = row] = rows
      assert DateTime.compare(row.at, row.first_at) in [:gt, :eq]

      page = html(socket)
      assert length(Regex.scan(~r/class="alert-row" data-session-id="#{sid}"/, page)) == 1
      assert page =~ "×3"
    end

    test "a later alert updates the row's score and pattern" do
      at = DateTime.utc_now()
      event = fn score, count -> alert_event("s-1", score, count) end

      alerts =
        Alerts.new()
        |> Alerts.put(event.(0.2, 5), at)
        |> Alerts.put(event.(0.1, 10), DateTime.add(at, 2, :second))

      assert [%{score: 0.1, occurrence_count: 10, alerts: 2, first_at: ^at}] = Alerts.rows(alerts)
    end

    test "the panel keeps at most :limit sessions, dropping the least recent" do
      alerts =
        Enum.reduce(1..5, Alerts.new(limit: 3), fn i, acc ->
          Alerts.put(acc, alert_event("s-#{i}", 0.2, 5), DateTime.utc_now())
        end)

      assert Enum.map(Alerts.rows(alerts), & &1.session_id) == ["s-5", "s-4", "s-3"]
    end
  end

  describe "handle_event(\"pause_inspect\")" do
    test "issues the HITL Pause and shows the window and the paused state, with Resume" do
      socket = mount!()
      sid = unique_session("sess-pause")
      on_exit(fn -> unpause(sid) end)
      socket = feed(socket, loop!(sid))

      {:noreply, socket} = Manager.handle_event("pause_inspect", %{"session_id" => sid}, socket)

      assert HITL.paused?(sid)

      assert [%{action: :pause, operator: "alice", session_id: ^sid}] =
               HITL.audit_log(session_id: sid)

      assert_receive %{event_type: "hitl_pause", session_id: ^sid}

      assert %{session_id: ^sid, window: window, pause: %{operator: "alice"}} =
               socket.assigns.inspect

      assert window == List.duplicate(@loop_step, 5)
      assert Fleet.state_of(socket.assigns.fleet, sid) == "paused"

      page = html(socket)
      assert page =~ ~s(id="inspector" class="panel inspector")
      assert page =~ ~s(data-paused="true")
      assert length(Regex.scan(~r{<li><code>search</code>}, page)) == 5
      assert page =~ ~s(phx-click="resume" phx-value-session_id="#{sid}">Resume</button>)
      assert page =~ ~s(class="node state-paused" data-session-id="#{sid}")
    end

    test "an already paused session is inspected without a second pause" do
      socket = mount!()
      sid = unique_session("sess-already")
      on_exit(fn -> unpause(sid) end)
      {:ok, _} = HITL.pause(sid, operator: "bob", reason: "earlier")

      {:noreply, socket} = Manager.handle_event("pause_inspect", %{"session_id" => sid}, socket)

      assert socket.assigns.inspect.pause.operator == "bob"
      assert socket.assigns.notice == {:info, "Already paused."}
      assert length(HITL.audit_log(session_id: sid)) == 1
    end

    test "the Inspect panel follows the session's new steps while it is open" do
      socket = mount!()
      sid = unique_session("sess-follow")
      on_exit(fn -> unpause(sid) end)
      loop!(sid)
      {:noreply, socket} = Manager.handle_event("pause_inspect", %{"session_id" => sid}, socket)

      {:ok, _} = SchemaInterceptor.ingest(envelope(sid, "plan", "write_file", "success"))
      assert_receive %{event_type: "decision_log", session_id: ^sid} = log
      socket = feed(socket, [log])

      assert List.last(socket.assigns.inspect.window) == {"plan", "write_file", :success}
      assert html(socket) =~ "<code>write_file</code>"

      {:noreply, socket} = Manager.handle_event("close_inspect", %{}, socket)
      assert socket.assigns.inspect == nil
      {:ok, _} = SchemaInterceptor.ingest(envelope(sid, "plan", "write_file", "success"))
      refute_receive %{event_type: "decision_log", session_id: ^sid}, 50
      assert html(socket) =~ "Choose <strong>Pause and Inspect</strong>"
    end

    test "an invalid session id is refused with a notice" do
      socket = mount!()
      {:noreply, socket} = Manager.handle_event("pause_inspect", %{"session_id" => ""}, socket)
      assert {:error, "Could not pause: invalid_session_id."} = socket.assigns.notice
      assert socket.assigns.inspect == nil
    end
  end

  describe "handle_event(\"resume\")" do
    test "resumes the session and the panel shows it running" do
      socket = mount!()
      sid = unique_session("sess-resume")
      on_exit(fn -> unpause(sid) end)
      record_all(sid, distinct_tuples(3))
      {:noreply, socket} = Manager.handle_event("pause_inspect", %{"session_id" => sid}, socket)

      {:noreply, socket} = Manager.handle_event("resume", %{"session_id" => sid}, socket)

      refute HITL.paused?(sid)
      assert [%{action: :resume, operator: "alice"} | _] = HITL.audit_log(session_id: sid)
      assert socket.assigns.inspect.pause == nil
      assert Fleet.state_of(socket.assigns.fleet, sid) == "active"
      assert html(socket) =~ ~s(data-paused="false")

      {:noreply, socket} = Manager.handle_event("resume", %{"session_id" => sid}, socket)
      assert socket.assigns.notice == {:info, "The session is not paused."}
    end

    test "an unknown event leaves the state alone and says so" do
      socket = mount!()
      {:noreply, after_event} = Manager.handle_event("drop_tables", %{}, socket)
      assert after_event.assigns.notice == {:error, "Unknown action."}
      assert after_event.assigns.fleet == socket.assigns.fleet
    end
  end

  describe "topology states" do
    test "a node shows each state broadcast on gateway:topology" do
      socket = mount!()
      sid = unique_session("sess-topo")

      for state <- ~w(blocked alert_entropy active idle paused) do
        update = %{event_type: "topology_update", session_id: sid, agent_id: "a", state: state}
        assert Fleet.state_of(feed(socket, [update]).assigns.fleet, sid) == state
      end
    end

    test "paused overrides later blocked and alert_entropy updates until resumed" do
      socket = mount!()
      sid = unique_session("sess-override")

      socket =
        feed(socket, [
          %{event_type: "hitl_pause", session_id: sid},
          topology(sid, "blocked"),
          topology(sid, "alert_entropy")
        ])

      assert Fleet.state_of(socket.assigns.fleet, sid) == "paused"
      assert html(socket) =~ ~s(data-session-id="#{sid}" data-state="paused")

      socket = feed(socket, [%{event_type: "hitl_resume", session_id: sid}])
      assert Fleet.state_of(socket.assigns.fleet, sid) == "alert_entropy"
    end

    test "real broadcasts: LOOP flashes red, a pause shows paused and survives the next LOOP" do
      socket = mount!()
      sid = unique_session("sess-real")
      on_exit(fn -> unpause(sid) end)
      record_all(sid, List.duplicate(@loop_step, 5))

      assert_receive %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"} =
                       u1

      socket = feed(socket, [u1])
      assert Fleet.state_of(socket.assigns.fleet, sid) == "alert_entropy"
      assert html(socket) =~ ~s(class="node state-alert_entropy" data-session-id="#{sid}")

      {:ok, _} = HITL.pause(sid, operator: "bob", reason: "")
      assert_receive %{event_type: "hitl_pause", session_id: ^sid} = p
      assert_receive %{event_type: "topology_update", session_id: ^sid, state: "paused"} = u2
      socket = feed(socket, [p, u2])
      record_all(sid, [@loop_step])
      socket = feed(socket, collect_alerts(sid))
      assert Fleet.state_of(socket.assigns.fleet, sid) == "paused"
    end

    test "derive/3: severity first, then idleness" do
      assert Fleet.derive(:loop, 0) == "alert_entropy"
      assert Fleet.derive(:warning, 999_999) == "blocked"
      assert Fleet.derive(:normal, 29_999) == "active"
      assert Fleet.derive(:normal, 30_000) == "idle"
      assert Fleet.derive(nil, 60_000) == "idle"
    end

    test "the periodic refresh reloads the snapshot and schedules the next one" do
      Application.put_env(:observatory, :dashboard_refresh_ms, 10)
      on_exit(fn -> Application.delete_env(:observatory, :dashboard_refresh_ms) end)
      socket = mount!()
      sid = unique_session("sess-refresh")
      record_all(sid, distinct_tuples(2))

      # Generous timeouts: a 10 ms timer can fire late on a loaded 2-core machine.
      assert_receive {ObservatoryWeb.SessionClusterManager, :refresh} = tick, 2_000
      socket = feed(socket, [tick])
      assert Fleet.state_of(socket.assigns.fleet, sid) == "active"
      assert_receive {ObservatoryWeb.SessionClusterManager, :refresh}, 2_000
    end

    test "an unknown message changes nothing" do
      socket = mount!(connected?: false)
      assert {:noreply, ^socket} = Manager.handle_info({:something, :else}, socket)
    end
  end

  describe "render/1 escapes every agent-supplied string" do
    test "a hostile session id, agent id, intent and tool stay text everywhere" do
      socket = mount!()
      sid = @hostile <> unique_session("")
      on_exit(fn -> unpause(sid) end)

      record_all(sid, List.duplicate({"<b>intent</b>", "<script>x()</script>", :failure}, 5),
        agent_id: ~s[agent" onclick="alert(2)]
      )

      socket = feed(socket, collect_alerts(sid))
      {:noreply, socket} = Manager.handle_event("pause_inspect", %{"session_id" => sid}, socket)
      page = html(socket)

      refute page =~ "<img"
      refute page =~ "<script"
      refute page =~ "<b>intent"
      refute page =~ ~s(" onclick=")
      assert page =~ "&lt;img src=x onerror=alert(1)&gt;"
      assert page =~ "&lt;script&gt;x()&lt;/script&gt;"
      assert page =~ "agent&quot; onclick=&quot;alert(2)"
      # Alert row, inspector, node: the id shows in each, always escaped.
      assert length(Regex.scan(~r/data-session-id="&lt;img src=x onerror=alert\(1\)&gt;/, page)) ==
               3
    end

    test "element ids are hashes, not the session id" do
      id = ObservatoryWeb.SessionClusterManager.View.dom_id("node", @hostile)
      assert id =~ ~r/\Anode-[0-9a-f]{16}\z/
    end
  end

  defp topology(sid, state),
    do: %{event_type: "topology_update", session_id: sid, agent_id: "a", state: state}

  defp alert_event(sid, score, count) do
    %{
      event_type: "entropy_alert",
      session_id: sid,
      agent_id: "agent",
      entropy_score: score,
      window_size: 5,
      repeated_pattern: %{intent: "search", tool_call: "read_file", action_status: "failure"},
      occurrence_count: count
    }
  end

  defp envelope(sid, intent, tool, status) do
    %{
      "meta" => %{
        "step_id" => "step-#{System.unique_integer([:positive])}",
        "session_id" => sid,
        "agent_id" => "agent-loop",
        "timestamp" => "2026-02-22T10:30:00Z"
      },
      "cognition" => %{"intent" => intent},
      "action" => %{"tool_call" => tool, "status" => status}
    }
  end

  describe "seed 002 step detector panel" do
    defp same_step(sid) do
      Observatory.Test.HTTP.envelope(%{
        "meta" => %{"session_id" => sid},
        "action" => %{
          "tool_call" => "run_code",
          "tool_input" => %{"code" => "x"},
          "result" => "boom"
        }
      })
    end

    test "streaks show per session; a blocked session is reset from the panel" do
      sid = unique_session("sess-steps")
      socket = mount!()
      for _ <- 1..6, do: {:ok, _} = SchemaInterceptor.ingest(same_step(sid))
      assert_receive %{event_type: "loop_detection", kind: "block", session_id: ^sid}
      socket = feed(socket, [%{event_type: "loop_detection", kind: "block", session_id: sid}])

      assert %{stagnation_streak: 5, blocked: true} =
               Enum.find(socket.assigns.steps, &(&1.session_id == sid))

      page = html(socket)
      assert page =~ ~s(data-session-id="#{sid}" data-blocked="true")
      assert page =~ ~s(phx-click="reset_step")

      {:noreply, socket} = Manager.handle_event("reset_step", %{"session_id" => sid}, socket)
      assert {:info, "Step detector reset" <> _} = socket.assigns.notice
      refute Enum.any?(socket.assigns.steps, &(&1.session_id == sid))
      assert Observatory.Gateway.StepDetector.state(sid).blocked == false
    end
  end

  describe "issue 8 loop verdict next to the entropy score" do
    defp failing_read(sid) do
      Observatory.Test.HTTP.envelope(%{
        "meta" => %{"session_id" => sid},
        "action" => %{"tool_input" => %{"path" => "x"}, "result" => "ENOENT"}
      })
    end

    test "gateway:loop_verdict events set the node's verdict; the inspector shows why" do
      sid = unique_session("sess-verdict-ui")
      on_exit(fn -> unpause(sid) end)
      socket = mount!()
      for _ <- 1..3, do: {:ok, _} = SchemaInterceptor.ingest(failing_read(sid))
      assert_receive %{event_type: "loop_verdict", session_id: ^sid, verdict: :suspect} = suspect
      assert_receive %{event_type: "loop_verdict", session_id: ^sid, verdict: :loop} = loop
      socket = feed(socket, [suspect, loop])

      assert %{verdict: :loop, verdict_reason: reason} = socket.assigns.fleet[sid]
      assert reason =~ "3 times in a row, its result saying nothing new"
      page = html(socket)
      assert page =~ ~s(class="verdict verdict-loop" data-verdict="loop")

      {:noreply, socket} = Manager.handle_event("pause_inspect", %{"session_id" => sid}, socket)
      assert %{verdict: %{verdict: :loop, evidence: [1, 2, 3]}} = socket.assigns.inspect
      assert html(socket) =~ "(steps 1, 2, 3)"
    end

    test "the snapshot carries verdicts; with alert_source :verdict they set the state" do
      saved = Application.get_env(:observatory, :alert_source)
      on_exit(fn -> Application.put_env(:observatory, :alert_source, saved) end)
      sid = unique_session("sess-verdict-snap")
      for _ <- 1..2, do: {:ok, _} = SchemaInterceptor.ingest(failing_read(sid))

      socket = mount!()
      assert %{verdict: :suspect, base: "active"} = socket.assigns.fleet[sid]

      Application.put_env(:observatory, :alert_source, :verdict)
      socket = mount!()
      assert %{verdict: :suspect, base: "blocked"} = socket.assigns.fleet[sid]
    end
  end

  describe "a cluster's reconciliation shown to the operator" do
    test "a heal's decisions reach the page as a notice, escaped" do
      socket = mount!()

      report = %{
        kind: :heal,
        losers: [:"obs3@10.0.0.3"],
        changed: 5,
        notes: [
          "agent \"#{@hostile}\": inactive on obs3, active on obs1: kept inactive, the safer state",
          "session \"s1\": paused on obs3, not on obs1: paused everywhere",
          "agent key k1 of \"a\": revoked (its revocation holds)",
          "session \"s2\": blocked everywhere"
        ]
      }

      Events.broadcast("gateway:cluster", %{event_type: "cluster_reconciled", report: report})
      assert_receive %{event_type: "cluster_reconciled"} = event
      socket = feed(socket, [event])

      assert {:info, text} = socket.assigns.notice
      assert text =~ "healed a partition (obs3@10.0.0.3 rejoined): 5 record(s) reconciled"
      assert text =~ "kept inactive, the safer state"
      assert text =~ "and 1 more: see /healthz"

      html = html(socket)
      refute html =~ @hostile
      assert html =~ "&lt;img src=x"
    end
  end
end
