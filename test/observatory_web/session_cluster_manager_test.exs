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

  # Handles the reload the manager asked itself for after events about the inspected
  # session (it coalesces a burst into one).
  defp settle(socket) do
    receive do
      {Manager, :reload_inspect} = reload -> socket |> feed([reload]) |> settle()
    after
      0 -> socket
    end
  end

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
               "gateway:alerts",
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

      assert %{session_id: ^sid, agent_id: "agent-loop", score: 0.2, occurrence_count: 5} =
               Alerts.get(socket.assigns.alerts, sid)

      assert %{agent_id: "agent-loop", score: 0.2} = socket.assigns.fleet[sid]

      assert page =~ ~s(data-session-id="#{sid}")
      assert page =~ "agent-loop"
      assert page =~ "<code>search</code>"
      assert page =~ "<code>read_file</code>"
      assert page =~ ~s(<span class="status status-failure">failure</span>)
      assert page =~ ~s(<td class="num score"><span class="cell-label">Score </span>0.20</td>)
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
      rows = Enum.filter(Alerts.rows(socket.assigns.alerts), &(&1.session_id in [sid, other]))

      assert [%{session_id: ^other}, %{session_id: ^sid, alerts: 3} = row] = rows
      assert DateTime.compare(row.at, row.since) in [:gt, :eq]

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

      assert [%{score: 0.1, occurrence_count: 10, alerts: 2, since: ^at}] = Alerts.rows(alerts)
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
      assert page =~ ~s(<strong>Entropy window</strong> <span class="muted">steps 1–5</span>)
      assert page =~ " in 5 of 5 steps"
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
      socket = socket |> feed([log]) |> settle()

      assert List.last(socket.assigns.inspect.window) == {"plan", "write_file", :success}
      assert html(socket) =~ ~s(<code class="tool">write_file</code>)

      {:noreply, socket} = Manager.handle_event("close_inspect", %{}, socket)
      assert socket.assigns.inspect == nil
      {:ok, _} = SchemaInterceptor.ingest(envelope(sid, "plan", "write_file", "success"))
      refute_receive %{event_type: "decision_log", session_id: ^sid}, 50
      assert html(socket) =~ "Choose <strong>Inspect</strong>"
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
      escaped = Regex.escape(ObservatoryWeb.HTML.escape(sid))
      assert length(Regex.scan(~r/data-session-id="#{escaped}"/, page)) == 3
    end

    test "bidi controls in a session id, agent id, intent or tool show as markers; buttons keep the exact id" do
      socket = mount!()
      # Displayed as-is, "sess-\u202ELTR" would read "sess-RTL": another session's id.
      sid = unique_session("sess-\u202ELTR-")
      on_exit(fn -> unpause(sid) end)

      record_all(sid, List.duplicate({"fix \u2067it\u2069", "run\u200F_tests", :failure}, 5),
        agent_id: "agent-\u202Dx"
      )

      socket = feed(socket, collect_alerts(sid))
      {:noreply, socket} = Manager.handle_event("pause_inspect", %{"session_id" => sid}, socket)
      assert HITL.paused?(sid)
      page = html(socket)

      shown = String.replace(sid, "\u202E", "⟨U+202E⟩")
      # Displayed: alert row (title and text), Inspect's Session fact, node (title, text).
      assert length(Regex.scan(~r/>#{Regex.escape(shown)}</, page)) >= 3
      assert page =~ ~s(title="#{shown}")
      assert page =~ "agent-⟨U+202D⟩x"
      assert page =~ "fix ⟨U+2067⟩it⟨U+2069⟩"
      assert page =~ "run⟨U+200F⟩_tests"

      # Every occurrence of a control is inside a value the page sends back (or matches
      # on), never in displayed text or a title.
      for [attribute] <- Regex.scan(~r/[a-z_-]+="[^"]*\x{202E}[^"]*"/u, page) do
        assert attribute =~ ~r/\A(data-session-id|phx-value-session_id)="/
      end

      visible = Regex.replace(~r/\s(data-session-id|phx-value-session_id)="[^"]*"/, page, "")
      refute visible =~ ~r/[\x{061C}\x{200E}\x{200F}\x{202A}-\x{202E}\x{2066}-\x{2069}]/u

      # The buttons name the session exactly: Resume acts on it.
      assert page =~ ~s(phx-click="resume" phx-value-session_id="#{sid}")
      {:noreply, _} = Manager.handle_event("resume", %{"session_id" => sid}, socket)
      refute HITL.paused?(sid)
    end

    test "a 1 KiB intent or tool name shows its start in the alert row, the whole in its title" do
      socket = mount!()
      sid = unique_session("sess-long-intent")
      # A proxied call's arguments are its intent: up to 1 KiB, 8 lines of the row each.
      intent = "write_file " <> String.duplicate("<lorem> ipsum ", 72)
      tool = String.duplicate("t", 1024)
      record_all(sid, List.duplicate({intent, tool, :failure}, 5), agent_id: "agent-loop")

      page = socket |> feed(collect_alerts(sid)) |> html()
      [row] = Regex.run(~r/<tr [^>]*data-session-id="#{sid}".*?<\/tr>/s, page)

      shown = intent |> String.slice(0, 160) |> ObservatoryWeb.HTML.escape()

      assert row =~
               ~s(<code class="cut" title="#{ObservatoryWeb.HTML.escape(intent)}">#{shown}…</code>)

      assert row =~ ~s(<code class="cut" title="#{tool}">#{String.slice(tool, 0, 160)}…</code>)
      refute row =~ ~s(>#{ObservatoryWeb.HTML.escape(intent)}<)
    end

    test "element ids are hashes, not the session id" do
      id = ObservatoryWeb.SessionClusterManager.View.dom_id("node", @hostile)
      assert id =~ ~r/\Anode-[0-9a-f]{16}\z/
    end
  end

  describe "issue 18: alerts are server state" do
    test "a session that looped before the page opened is listed on load, once" do
      sid = unique_session("sess-before")
      record_all(sid, List.duplicate(@loop_step, 7), agent_id: "agent-early")

      socket = mount!(connected?: false)
      page = html(socket)

      assert %{agent_id: "agent-early", rule: :entropy, alerts: 3, since: %DateTime{}} =
               Alerts.get(socket.assigns.alerts, sid)

      assert length(Regex.scan(~r/class="alert-row" data-session-id="#{sid}"/, page)) == 1
      assert page =~ "5 of 5 steps in the window"
    end

    test "an alerted session quieter than 500 newer ones is still a node, counted in the summary, which says how many are shown" do
      sid = unique_session("sess-buried")
      record_all(sid, List.duplicate(@loop_step, 5), agent_id: "agent-loop")

      # A busy fleet: 501 sessions more recently active than the loop (the tracker's
      # clock, which stamps each step, moved on a millisecond in between): the page
      # shows the 500 latest and the loop, one fewer than the gateway holds, whatever
      # other tests left in the tracker.
      store =
        Observatory.NativeStores.get(
          {Observatory.Gateway.EntropyTracker, Observatory.Gateway.EntropyTracker},
          nil
        )

      Observatory.Native.entropy_tick(store, System.monotonic_time(:millisecond) + 1)

      for i <- 1..501,
          do: record_all(unique_session("sess-busy-#{i}"), [{"plan", "tool", :success}])

      socket = mount!(connected?: false)
      assert Alerts.get(socket.assigns.alerts, sid)

      assert %{base: "alert_entropy", agent_id: "agent-loop", score: 0.2} =
               socket.assigns.fleet[sid]

      page = html(socket)

      assert page =~
               ~r/<li id="node-[0-9a-f]+" class="node state-alert_entropy" data-session-id="#{sid}"/

      [alerts] =
        Regex.run(~r/data-state="alert_entropy"><span class="stat-n">(\d+)</, page,
          capture: :all_but_first
        )

      assert String.to_integer(alerts) >= 1

      # The summary counts what the gateway holds, and says how many are shown.
      [held, shown] =
        Regex.run(
          ~r/<span class="stat-n">(\d+)<\/span><span class="stat-label">sessions · (\d+) shown/,
          page,
          capture: :all_but_first
        )

      assert String.to_integer(held) >= 501
      assert String.to_integer(shown) == map_size(socket.assigns.fleet)
      assert String.to_integer(held) > String.to_integer(shown)
    end

    test "a reload lists what the last page listed; a recovered session is not listed" do
      sid = unique_session("sess-reload")
      record_all(sid, List.duplicate(@loop_step, 5))
      first = mount!(connected?: false)
      second = mount!(connected?: false)
      assert Alerts.get(first.assigns.alerts, sid) == Alerts.get(second.assigns.alerts, sid)

      record_all(sid, distinct_tuples(3))
      assert Alerts.get(mount!(connected?: false).assigns.alerts, sid) == nil
    end

    test "alert_raised adds a row, alert_cleared removes it, the refresh re-reads the list" do
      socket = mount!()
      sid = unique_session("sess-events")
      record_all(sid, List.duplicate(@loop_step, 5))
      assert_receive %{event_type: "alert_raised", session_id: ^sid, rule: :entropy} = raised
      socket = feed(socket, [raised])
      assert %{source: :entropy, alerts: 0} = Alerts.get(socket.assigns.alerts, sid)
      # The alert event that follows is the first one counted (not the second).
      [alert] = collect_alerts(sid)
      socket = feed(socket, [alert])
      assert %{alerts: 1} = Alerts.get(socket.assigns.alerts, sid)

      record_all(sid, distinct_tuples(3))
      assert_receive %{event_type: "alert_cleared", session_id: ^sid} = cleared
      socket = feed(socket, [cleared])
      assert Alerts.get(socket.assigns.alerts, sid) == nil

      # A row the page never heard of appears at the refresh (a fresh listing: no cache).
      Application.put_env(:observatory, :dashboard_refresh_ms, 1)
      on_exit(fn -> Application.delete_env(:observatory, :dashboard_refresh_ms) end)
      other = unique_session("sess-missed")
      record_all(other, List.duplicate(@loop_step, 5))
      socket = feed(socket, [{Manager, :refresh}])
      assert Alerts.get(socket.assigns.alerts, other)
    end

    test "a paused row offers Inspect and Resume, a running one Pause and Inspect" do
      sid = unique_session("sess-paused-row")
      on_exit(fn -> unpause(sid) end)
      record_all(sid, List.duplicate(@loop_step, 5))
      {:ok, _} = HITL.pause(sid, operator: "bob", reason: "")

      page = html(mount!(connected?: false))

      [row] =
        Regex.run(~r{<tr id="[^"]+" class="alert-row" data-session-id="#{sid}".*?</tr>}s, page)

      assert row =~ ~s(phx-click="resume" phx-value-session_id="#{sid}">Resume</button>)
      assert row =~ ~s(phx-click="inspect" phx-value-session_id="#{sid}">Inspect</button>)
      refute row =~ "Pause and Inspect"

      unpause(sid)
      page = html(mount!(connected?: false))

      [row] =
        Regex.run(~r{<tr id="[^"]+" class="alert-row" data-session-id="#{sid}".*?</tr>}s, page)

      assert row =~ ">Pause and Inspect</button>"
      refute row =~ ">Resume</button>"
    end

    test "with the verdict as the source, the panel is Verdict Alerts and lists loop verdicts" do
      restore_env_on_exit([:alert_source])
      Observatory.configure(alert_source: :verdict)
      sid = unique_session("sess-verdict-alert")
      for _ <- 1..3, do: {:ok, _} = SchemaInterceptor.ingest(pytest_step(sid))

      socket = mount!(connected?: false)

      assert %{source: :verdict, rule: :repeat, reason: reason} =
               Alerts.get(socket.assigns.alerts, sid)

      assert reason =~ "3 times in a row"
      page = html(socket)
      assert page =~ ~s(<h2 id="alerts-title">Verdict Alerts</h2>)
      assert page =~ "the <strong>loop verdict</strong> calls a loop now"
    end
  end

  describe "issue 18: the alert source is shown" do
    test "in the standalone header, the LiveView navigation and the panel's title" do
      restore_env_on_exit([:alert_source])

      assert ObservatoryWeb.LiveParts.nav("/ops", :cluster) |> IO.iodata_to_binary() =~
               ~s(<span class="scm-source" data-source="entropy">Alerts from <strong>entropy ratio</strong></span>)

      assert html(mount!(connected?: false)) =~ ~s(<h2 id="alerts-title">Entropy Alerts</h2>)

      Observatory.configure(alert_source: :verdict)

      assert ObservatoryWeb.LiveParts.nav("/ops", :cluster) |> IO.iodata_to_binary() =~
               "Alerts from <strong>loop verdict</strong>"

      assert html(mount!(connected?: false)) =~ ~s(<h2 id="alerts-title">Verdict Alerts</h2>)
    end
  end

  describe "issue 18: a loop the entropy ratio does not see is pointed out" do
    test "free-text intents: the verdict's loop, not alerted under :entropy, is named with the fix" do
      sid = unique_session("sess-free-text")

      for i <- 1..4 do
        step = pytest_step(sid)
        intent = Enum.at(["Let me re-run the tests", "Running pytest again to check"], rem(i, 2))

        {:ok, %{severity: severity}} =
          SchemaInterceptor.ingest(put_in(step, ["cognition", "intent"], intent))

        refute severity == :loop
      end

      socket = mount!()
      assert Alerts.get(socket.assigns.alerts, sid) == nil
      page = html(socket)
      # Every such session is counted (other tests' too); the first three are named.
      missed =
        for node <- Fleet.nodes(socket.assigns.fleet),
            node.verdict == :loop,
            Alerts.get(socket.assigns.alerts, node.session_id) == nil,
            do: node.session_id

      assert sid in missed
      [hint] = Regex.run(~r{<p class="panel-note source-hint".*?</p>}s, page)
      assert hint =~ ~s(data-count="#{length(missed)}")

      for id <- Enum.take(missed, 3),
          do: assert(hint =~ ~s(<span class="mono">#{id}</span>))

      assert hint =~ "<code>OBSERVATORY_ALERT_SOURCE=verdict</code>"

      {:noreply, socket} = Manager.handle_event("inspect", %{"session_id" => sid}, socket)
      assert html(socket) =~ "Not alerted: the alert source is the entropy ratio"
    end
  end

  describe "issue 18: Inspect shows the evidence" do
    test "any fleet node opens Inspect, without pausing" do
      sid = unique_session("sess-node")
      record_all(sid, distinct_tuples(2))
      socket = mount!()

      assert html(socket) =~
               ~s(phx-click="inspect" phx-value-session_id="#{sid}">Inspect</button>)

      {:noreply, socket} = Manager.handle_event("inspect", %{"session_id" => sid}, socket)
      assert %{session_id: ^sid, pause: nil} = socket.assigns.inspect
      refute HITL.paused?(sid)

      assert html(socket) =~
               ~s(<aside id="inspector" class="panel inspector" aria-labelledby="inspector-title" data-session-id="#{sid}" data-paused="false">)
    end

    test "the repeated command, its failure text, and what did not change, under the same step numbers" do
      sid = unique_session("sess-pytest")
      for _ <- 1..6, do: {:ok, _} = SchemaInterceptor.ingest(pytest_step(sid))
      socket = mount!()
      {:noreply, socket} = Manager.handle_event("inspect", %{"session_id" => sid}, socket)
      page = html(socket)

      %{verdict: %{verdict: :loop, rule: :repeat, evidence: evidence}} = socket.assigns.inspect
      assert evidence == [1, 2, 3, 4, 5, 6]
      assert page =~ ~s(<code class="call">pytest tests/test_auth.py -x</code>)
      assert page =~ "6 times, the same failure"
      assert page =~ "E   assert 401 == 200"

      assert page =~
               ~s(<li data-change="same"><strong>Arguments:</strong> the same each time</li>)

      assert page =~ ~s(<li data-change="same"><strong>Failure:</strong> the same each time</li>)

      # The steps list, the verdict's evidence and the entropy window: one numbering.
      listed =
        for [_, n] <- Regex.scan(~r/data-step="(\d+)" data-evidence="true"/, page),
            do: String.to_integer(n)

      assert listed == evidence

      window =
        for [_, n] <-
              Regex.scan(~r/data-step="(\d+)" data-evidence="\w+" data-window="true"/, page),
            do: String.to_integer(n)

      assert window == [2, 3, 4, 5, 6]
      assert page =~ ~s(<strong>Entropy window</strong> <span class="muted">steps 2–6</span>)
      # Identical repeats are one line each, naming the first.
      assert length(Regex.scan(~r/The same call, arguments and result as #1\./, page)) == 5
    end

    test "what changed between repeats: the numbers, shown masked with their values" do
      sid = unique_session("sess-timeout")

      for ms <- [5003, 5011, 4998] do
        {:ok, _} =
          SchemaInterceptor.ingest(
            step(sid, "sql", %{"query" => "SELECT count(*) FROM orders"}, "timeout", %{
              "error" => "canceling statement due to statement timeout",
              "elapsed_ms" => ms
            })
          )
      end

      socket = mount!()
      {:noreply, socket} = Manager.handle_event("inspect", %{"session_id" => sid}, socket)
      page = html(socket)
      assert %{verdict: %{verdict: :loop}} = socket.assigns.inspect
      assert page =~ "3 times, the same failure, apart from numbers"

      assert page =~
               ~s(<code>elapsed_ms: #</code> <span class="muted"># = </span>5003 → 5011 → 4998)
    end

    test "toggle_step shows a step's result whole, and cuts it again" do
      sid = unique_session("sess-long")
      long = Enum.map_join(1..40, "\n", &"line #{&1} of the build log")

      {:ok, _} =
        SchemaInterceptor.ingest(step(sid, "bash", %{"command" => "make"}, "failure", long))

      socket = mount!()
      {:noreply, socket} = Manager.handle_event("inspect", %{"session_id" => sid}, socket)
      refute html(socket) =~ "line 20 of the build log"
      assert html(socket) =~ "line 40 of the build log", "a cut result keeps its last lines"
      assert html(socket) =~ ~s(phx-value-step="1">Show all</button>)

      {:noreply, socket} =
        Manager.handle_event("toggle_step", %{"session_id" => sid, "step" => "1"}, socket)

      assert html(socket) =~ "line 20 of the build log"
      assert html(socket) =~ ~s(phx-value-step="1">Show less</button>)

      # Still whole after the session's next step (the panel reloads).
      {:ok, _} =
        SchemaInterceptor.ingest(step(sid, "bash", %{"command" => "make"}, "failure", long))

      assert_receive %{event_type: "decision_log", session_id: ^sid} = log
      socket = socket |> feed([log]) |> settle()
      assert html(socket) =~ "line 20 of the build log"

      {:noreply, socket} =
        Manager.handle_event("toggle_step", %{"session_id" => sid, "step" => "1"}, socket)

      refute html(socket) =~ "line 20 of the build log"

      {:noreply, socket} =
        Manager.handle_event("toggle_step", %{"session_id" => "other", "step" => "1"}, socket)

      assert {:error, _} = socket.assigns.notice
    end

    test "a burst of events about the inspected session reloads the panel once" do
      sid = unique_session("sess-burst")
      socket = mount!()
      {:noreply, socket} = Manager.handle_event("inspect", %{"session_id" => sid}, socket)
      logs = for _ <- 1..5, do: %{event_type: "decision_log", session_id: sid}
      socket = feed(socket, logs)
      assert_received {Manager, :reload_inspect}
      refute_received {Manager, :reload_inspect}
      assert socket.assigns.reload_pending
      socket = feed(socket, [{Manager, :reload_inspect}])
      refute socket.assigns.reload_pending
    end

    test "agent-supplied arguments and results are escaped" do
      sid = unique_session("sess-xss-steps")

      {:ok, _} =
        SchemaInterceptor.ingest(
          step(
            sid,
            "<b>tool</b>",
            %{"command" => "<script>alert(1)</script>"},
            "failure",
            "<img src=x onerror=alert(2)>"
          )
        )

      socket = mount!()
      {:noreply, socket} = Manager.handle_event("inspect", %{"session_id" => sid}, socket)
      page = html(socket)
      refute page =~ "<script>alert(1)"
      refute page =~ "<img src=x"
      refute page =~ "<b>tool"
      assert page =~ "&lt;script&gt;alert(1)&lt;/script&gt;"
      assert page =~ "&lt;img src=x onerror=alert(2)&gt;"
    end
  end

  @pytest_failure "collected 4 items\n\ntests/test_auth.py ...F\n\n" <>
                    ">       assert resp.status_code == 200\nE   assert 401 == 200\n\n" <>
                    "FAILED tests/test_auth.py::test_login - assert 401 == 200\n1 failed, 3 passed in 0.42s"

  defp pytest_step(sid) do
    step(sid, "bash", %{"command" => "pytest tests/test_auth.py -x"}, "failure", %{
      "exit_code" => 1,
      "stdout" => @pytest_failure
    })
  end

  defp step(sid, tool, input, status, result) do
    Observatory.Test.HTTP.envelope(%{
      "meta" => %{"session_id" => sid, "agent_id" => "agent-evidence"},
      "cognition" => %{"intent" => "run the tests again"},
      "action" => %{
        "tool_call" => tool,
        "tool_input" => input,
        "status" => status,
        "result" => result
      }
    })
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
      assert html(socket) =~ ~s(<div class="why-verdict" data-rule="repeat">)
      assert html(socket) =~ "steps 1–3"
    end

    test "the snapshot carries verdicts; with alert_source :verdict they set the state" do
      restore_env_on_exit([:alert_source])
      sid = unique_session("sess-verdict-snap")
      for _ <- 1..2, do: {:ok, _} = SchemaInterceptor.ingest(failing_read(sid))

      socket = mount!()
      assert %{verdict: :suspect, base: "active"} = socket.assigns.fleet[sid]

      Observatory.configure(alert_source: :verdict)
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

      # A heal that changed nothing leaves the notice as it was.
      quiet = %{report | changed: 0, notes: []}
      socket = feed(socket, [%{event_type: "cluster_reconciled", report: quiet}])
      assert {:info, ^text} = socket.assigns.notice
    end
  end
end
