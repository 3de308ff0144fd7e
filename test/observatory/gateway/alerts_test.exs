defmodule Observatory.Gateway.AlertsTest do
  # The alert list is global (one table per node) and some tests change the alert
  # source: not async.
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.{Alerts, EntropyTracker, Events, SchemaInterceptor}

  @loop_step {"search", "read_file", :failure}

  setup do
    restore_env_on_exit([:alert_source, :alert_log_level, :alerts_max_sessions])
    :ok = Events.subscribe(Alerts.topic())
    :ok
  end

  defp loop!(sid, n \\ 5, agent \\ "agent-a"),
    do: record_all(sid, List.duplicate(@loop_step, n), agent_id: agent)

  # The lines are logged at :info by default, below the tests' Logger level.
  defp logged(fun) do
    Application.put_env(:observatory, :alert_log_level, :warning)
    capture_log(fun)
  end

  defp failing_call(sid, i) do
    Observatory.Test.HTTP.envelope(%{
      "meta" => %{"session_id" => sid, "agent_id" => "agent-v"},
      "cognition" => %{"intent" => "try #{i}"},
      "action" => %{
        "tool_call" => "bash",
        "tool_input" => %{"command" => "make"},
        "status" => "failure",
        "result" => "make: *** [all] Error 1"
      }
    })
  end

  defp other_call(sid, i) do
    Observatory.Test.HTTP.envelope(%{
      "meta" => %{"session_id" => sid, "agent_id" => "agent-v"},
      "cognition" => %{"intent" => "step #{i}"},
      "action" => %{
        "tool_call" => "read_file",
        "tool_input" => %{"path" => "file#{i}.txt"},
        "status" => "success",
        "result" => "contents #{i}"
      }
    })
  end

  describe "issue 18: the sessions alerted now, under :entropy (FRD-009's LOOP)" do
    test "a LOOP puts the session in the list once, with since, rule and count, logged once" do
      sid = unique_session("al-loop")

      log = logged(fn -> loop!(sid, 8) end)

      assert [line] = Regex.scan(~r/LOOP session="#{sid}"[^\n]*/, log)
      assert hd(line) =~ ~s(agent="agent-a" rule=entropy source=entropy)
      assert hd(line) =~ "5 of the last 5 steps are search → read_file → failure"
      assert_receive %{event_type: "alert_raised", session_id: ^sid, rule: :entropy}
      refute_receive %{event_type: "alert_raised", session_id: ^sid}, 20

      assert %{
               agent_id: "agent-a",
               source: :entropy,
               rule: :entropy,
               alerts: 4,
               entropy_score: 0.2,
               occurrence_count: 5,
               window_size: 5,
               pattern: %{intent: "search", tool_call: "read_file", action_status: "failure"},
               since: %DateTime{} = since,
               last_at: %DateTime{} = last_at,
               node: node
             } = Alerts.get(sid)

      assert node == node()
      assert DateTime.compare(last_at, since) in [:gt, :eq]
      assert Enum.count(Alerts.list(), &(&1.session_id == sid)) == 1
    end

    test "leaving LOOP (WARNING or Normal) takes the session off the list, logged once" do
      sid = unique_session("al-recover")
      loop!(sid)
      assert Alerts.get(sid)

      log = logged(fn -> record_all(sid, distinct_tuples(3)) end)

      assert Alerts.get(sid) == nil
      assert log =~ ~s(no longer alerted: session="#{sid}")
      assert length(Regex.scan(~r/no longer alerted: session="#{sid}"/, log)) == 1
      assert_receive %{event_type: "alert_cleared", session_id: ^sid, why: "recovered"}

      # A second loop is a second transition: logged again.
      log = logged(fn -> loop!(sid) end)
      assert log =~ ~s(LOOP session="#{sid}")
    end

    test "a WARNING is not an alert" do
      sid = unique_session("al-warn")

      assert {:ok, 0.4, :warning} =
               record_all(sid, List.duplicate(@loop_step, 4) ++ [{"a", "b", :success}])

      assert Alerts.get(sid) == nil
    end

    test "the list is newest first; :alert_log_level false logs nothing" do
      Application.put_env(:observatory, :alert_log_level, false)
      [first, second] = for p <- ~w(al-first al-second), do: unique_session(p)

      log =
        capture_log(fn ->
          loop!(first)
          loop!(second)
        end)

      refute log =~ "LOOP"
      ids = for a <- Alerts.list(), a.session_id in [first, second], do: a.session_id
      assert ids == [second, first]
    end
  end

  describe "issue 18: under :verdict the loop verdict alerts" do
    test "a loop verdict puts the session in the list with its rule and evidence; progress clears it" do
      Observatory.configure(alert_source: :verdict)
      sid = unique_session("al-verdict")

      log =
        logged(fn ->
          for i <- 1..3, do: {:ok, _} = SchemaInterceptor.ingest(failing_call(sid, i))
        end)

      assert log =~ ~s(LOOP session="#{sid}" agent="agent-v" rule=repeat source=verdict)

      assert %{source: :verdict, rule: :repeat, evidence: [1, 2, 3], reason: reason} =
               Alerts.get(sid)

      assert reason =~ "the same call 3 times in a row"

      capture_log(fn ->
        for i <- 1..2, do: {:ok, _} = SchemaInterceptor.ingest(other_call(sid, i))
      end)

      assert Alerts.get(sid) == nil
      assert_receive %{event_type: "alert_cleared", session_id: ^sid, source: :verdict}
    end

    test "alerts of the other source are not listed, and the sweep drops them" do
      sid = unique_session("al-other-source")
      loop!(sid)
      assert Alerts.get(sid)
      Observatory.configure(alert_source: :verdict)
      assert Alerts.get(sid) == nil
      refute Enum.any?(Alerts.list(), &(&1.session_id == sid))
      assert Enum.any?(Alerts.list(source: :entropy), &(&1.session_id == sid))

      Alerts.sweep()
      refute Enum.any?(Alerts.list(source: :entropy), &(&1.session_id == sid))

      assert_receive %{
        event_type: "alert_cleared",
        session_id: ^sid,
        why: "the alert source is now verdict"
      }
    end
  end

  describe "issue 18: bounded memory" do
    test "a row goes with its session: the sweep drops sessions the tracker forgot" do
      sid = unique_session("al-evicted")
      loop!(sid)
      assert Alerts.get(sid)
      EntropyTracker.forget(sid)

      capture_log(fn -> Alerts.sweep() end)

      assert Alerts.get(sid) == nil

      assert_receive %{
        event_type: "alert_cleared",
        session_id: ^sid,
        why: "the session was evicted"
      }
    end

    test "past :alerts_max_sessions the least recently alerted go" do
      # Sync tests run alone: this one may empty the list.
      :ets.delete_all_objects(Alerts)
      Application.put_env(:observatory, :alerts_max_sessions, 10)
      prefix = unique_session("al-cap")

      log =
        capture_log(fn ->
          for i <- 1..30, do: loop!("#{prefix}-#{i}")
          # The trim runs in the alert list's process: wait until it has handled it.
          :sys.get_state(Alerts)
        end)

      assert log =~ "over :alerts_max_sessions"
      assert length(Alerts.list(limit: 1_000_000)) <= 10
      assert Alerts.get("#{prefix}-30"), "the newest stays"
      assert Alerts.get("#{prefix}-1") == nil, "the oldest went"
    end
  end
end
