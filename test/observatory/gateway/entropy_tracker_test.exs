defmodule Observatory.Gateway.EntropyTrackerTest do
  # Not async: FR-9.11 tests change the global application environment.
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.{EntropyAlertEvent, EntropyTracker}

  doctest EntropyTracker

  @loop {"search", "read_file", :failure}

  setup do
    subscribe_gateway_topics()
    :ok
  end

  describe "FR-9.1 module location and ownership" do
    test "positive: record_and_score/2 records and state accumulates across calls" do
      sid = unique_session()
      assert {:ok, 1.0, :normal} = EntropyTracker.record_and_score(sid, @loop)
      assert {:ok, 0.5, :normal} = EntropyTracker.record_and_score(sid, @loop)
      assert length(EntropyTracker.window(sid)) == 2
    end

    test "negative: no public function hands out the store, and a forged handle reaches nothing" do
      exported = EntropyTracker.__info__(:functions) |> Keyword.keys()
      refute :store in exported
      refute :handle in exported

      assert_raise ArgumentError, fn ->
        Observatory.Native.entropy_record(make_ref(), "s", "i", "t", 0, nil, 5, 0.25, 0.5)
      end
    end
  end

  describe "FR-9.2 sliding window" do
    test "positive: a sixth tuple evicts the first and the score is recomputed" do
      sid = unique_session()
      [first | _] = tuples = distinct_tuples(5)
      record_all(sid, tuples)
      assert {:ok, 1.0, :normal} = EntropyTracker.record_and_score(sid, @loop)
      window = EntropyTracker.window(sid)
      assert length(window) == 5
      refute first in window
      assert List.last(window) == @loop
    end

    test "negative: a partial window is scored over the N entries it has" do
      sid = unique_session()
      record_all(sid, [@loop, @loop])

      assert {:ok, 0.6667, :normal} =
               EntropyTracker.record_and_score(sid, {"plan", "write_file", :success})

      assert length(EntropyTracker.window(sid)) == 3
    end
  end

  describe "FR-9.3 uniqueness ratio" do
    test "positive: five identical tuples score 0.2" do
      sid = unique_session()
      assert {:ok, 0.2, :loop} = record_all(sid, List.duplicate(@loop, 5))
    end

    test "negative: five distinct tuples score 1.0 and raise no alert" do
      sid = unique_session()
      assert {:ok, 1.0, :normal} = record_all(sid, distinct_tuples(5))
      refute_received %{event_type: "entropy_alert", session_id: ^sid}
    end

    test "exact equality: the status alone tells tuples apart" do
      sid = unique_session()
      record_all(sid, [{"search", "read_file", :failure}])

      assert {:ok, 1.0, :normal} =
               EntropyTracker.record_and_score(sid, {"search", "read_file", :success})
    end
  end

  describe "FR-9.4 LOOP threshold" do
    test "positive: below 0.25 broadcasts the alert and alert_entropy, returns :loop" do
      sid = unique_session()
      assert {:ok, 0.2, :loop} = record_all(sid, List.duplicate(@loop, 5))
      assert_received %{event_type: "entropy_alert", session_id: ^sid, entropy_score: 0.2}

      assert_received %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"}
    end

    test "negative: exactly 0.25 is WARNING and sends no alert" do
      sid = unique_session()
      assert {:ok, 0.25, :warning} = record_all(sid, List.duplicate(@loop, 4))
      refute_received %{event_type: "entropy_alert", session_id: ^sid}
    end
  end

  describe "FR-9.5 WARNING threshold" do
    test "positive: 0.4 is WARNING, node blocked amber, no alert" do
      sid = unique_session()
      other = {"plan", "write_file", :success}
      assert {:ok, 0.4, :warning} = record_all(sid, [@loop, @loop, @loop, other, other])

      assert_received %{
        event_type: "topology_update",
        session_id: ^sid,
        state: "blocked",
        color: "#f59e0b"
      }

      refute_received %{event_type: "entropy_alert", session_id: ^sid}
    end

    test "negative: a prior WARNING does not suppress the LOOP alert" do
      sid = unique_session()
      assert {:ok, 0.3333, :warning} = record_all(sid, List.duplicate(@loop, 3))
      assert {:ok, 0.25, :warning} = EntropyTracker.record_and_score(sid, @loop, [])
      assert {:ok, 0.2, :loop} = EntropyTracker.record_and_score(sid, @loop, [])
      assert_received %{event_type: "entropy_alert", session_id: ^sid}
    end
  end

  describe "FR-9.6 Normal range" do
    test "positive: 0.8 is Normal with no alert; recovery resets the node to active" do
      sid = unique_session()
      record_all(sid, List.duplicate(@loop, 3))
      assert_received %{event_type: "topology_update", session_id: ^sid, state: "blocked"}
      [a, b, c] = distinct_tuples(3)
      assert {:ok, 0.5, :normal} = EntropyTracker.record_and_score(sid, a)
      assert {:ok, 0.8, :normal} = record_all(sid, [b, c])
      assert_received %{event_type: "topology_update", session_id: ^sid, state: "active"}
      refute_received %{event_type: "entropy_alert", session_id: ^sid}
    end

    test "negative: exactly 0.50 is Normal with no alert and no topology change" do
      sid = unique_session()
      assert {:ok, 0.5, :normal} = record_all(sid, [@loop, @loop])
      refute_received %{session_id: ^sid}
    end

    test "a healthy session that was never degraded broadcasts nothing" do
      sid = unique_session()
      record_all(sid, distinct_tuples(5))
      refute_received %{session_id: ^sid}
    end
  end

  describe "FR-9.7 EntropyAlertEvent fields" do
    test "positive: every field, with the most frequent tuple and its count" do
      sid = unique_session()
      pattern = {"search", "list_files", :failure}
      Application.put_env(:observatory, :entropy_loop_threshold, 0.45)
      assert {:ok, 0.4, :loop} = record_all(sid, [pattern, pattern, @loop, pattern, pattern])

      assert_received %{event_type: "entropy_alert", session_id: ^sid} = event
      assert {:ok, ^event} = EntropyAlertEvent.validate(event)

      assert event == %{
               event_type: "entropy_alert",
               session_id: sid,
               agent_id: "agent-test",
               entropy_score: 0.4,
               window_size: 5,
               repeated_pattern: %{
                 intent: "search",
                 tool_call: "list_files",
                 action_status: "failure"
               },
               occurrence_count: 4
             }
    end

    test "window_size is the actual size while fewer than 5 tuples arrived" do
      sid = unique_session()
      Application.put_env(:observatory, :entropy_loop_threshold, 0.6)
      assert {:ok, 0.5, :loop} = record_all(sid, [@loop, @loop])
      assert_received %{event_type: "entropy_alert", session_id: ^sid, window_size: 2}
    end

    test "negative: no known agent_id → warning, {:error, :missing_agent_id}, no event" do
      sid = unique_session()

      log =
        capture_log(fn ->
          assert {:error, :missing_agent_id} = record_all(sid, List.duplicate(@loop, 5), [])
        end)

      assert log =~ "no known agent_id"
      assert log =~ sid
      refute_received %{event_type: "entropy_alert", session_id: ^sid}
      assert length(EntropyTracker.window(sid)) == 5, "the window is still updated"
    end

    test "negative: an event with a missing or mistyped field is rejected by the broadcaster" do
      {:ok, _} = EntropyAlertEvent.validate(valid_event())

      for field <- EntropyAlertEvent.fields() do
        assert {:error, {:invalid_alert_event, [^field]}} =
                 EntropyAlertEvent.validate(Map.delete(valid_event(), field))
      end

      assert {:error, {:invalid_alert_event, [:entropy_score]}} =
               EntropyAlertEvent.validate(%{valid_event() | entropy_score: "0.2"})

      assert {:error, {:invalid_alert_event, [:repeated_pattern]}} =
               EntropyAlertEvent.validate(%{valid_event() | repeated_pattern: %{intent: "x"}})
    end

    test "the agent_id given once is remembered for later steps" do
      sid = unique_session()
      EntropyTracker.record_and_score(sid, @loop, agent_id: "agent-remembered")
      assert {:ok, 0.2, :loop} = record_all(sid, List.duplicate(@loop, 4), [])
      assert_received %{event_type: "entropy_alert", agent_id: "agent-remembered"}
    end
  end

  describe "FR-9.11 runtime configuration" do
    test "positive: a loop threshold of 0.30 turns 0.28 into LOOP on the next call" do
      sid = unique_session()
      Application.put_env(:observatory, :entropy_window_size, 25)
      tuples = List.duplicate(@loop, 19) ++ distinct_tuples(6)
      assert {:ok, 0.28, :warning} = record_all(sid, tuples)
      Application.put_env(:observatory, :entropy_loop_threshold, 0.30)
      assert {:ok, 0.28, :loop} = EntropyTracker.record_and_score(sid, @loop, [])
    end

    test "positive: a smaller window size trims the window on the next call" do
      sid = unique_session()
      record_all(sid, distinct_tuples(5))
      Application.put_env(:observatory, :entropy_window_size, 3)
      assert {:ok, 1.0, :normal} = EntropyTracker.record_and_score(sid, @loop)
      assert length(EntropyTracker.window(sid)) == 3
      Application.put_env(:observatory, :entropy_window_size, 8)
      record_all(sid, distinct_tuples(6))
      assert length(EntropyTracker.window(sid)) == 8
    end

    test "negative: an invalid threshold logs a warning once and the default applies" do
      sid = unique_session()
      Application.put_env(:observatory, :entropy_loop_threshold, "high")

      log =
        capture_log(fn ->
          assert {:ok, 0.2, :loop} = record_all(sid, List.duplicate(@loop, 5))
        end)

      assert log =~ ":entropy_loop_threshold"
      assert log =~ ~s("high")

      assert length(String.split(log, "invalid :observatory :entropy_loop_threshold")) == 2,
             "logged once for five calls"
    end

    test "negative: invalid window sizes and warning thresholds fall back to defaults" do
      sid = unique_session()

      capture_log(fn ->
        Application.put_env(:observatory, :entropy_window_size, 0)
        Application.put_env(:observatory, :entropy_warning_threshold, 7)
        record_all(sid, distinct_tuples(7))
        assert length(EntropyTracker.window(sid)) == 5
        assert {:ok, 0.3333, :warning} = record_all(unique_session(), List.duplicate(@loop, 3))
      end)
    end
  end

  describe "UC-0250 acceptance" do
    test "S1: six calls with distinct tuples keep exactly 5 entries without the oldest" do
      sid = "sess-abc-#{System.unique_integer([:positive])}"
      [oldest | _] = tuples = distinct_tuples(5)
      record_all(sid, tuples)
      sixth = {"execute", "run_shell", :failure}
      assert {:ok, 1.0, :normal} = EntropyTracker.record_and_score(sid, sixth)
      window = EntropyTracker.window(sid)
      assert length(window) == 5
      refute oldest in window
      assert List.last(window) == sixth
    end

    test "S2: three distinct tuples on a fresh session score 1.0 over the partial window" do
      sid = unique_session("sess-new")
      [a, b, c] = distinct_tuples(3)
      assert {:ok, 1.0, :normal} = EntropyTracker.record_and_score(sid, a)
      assert {:ok, 1.0, :normal} = EntropyTracker.record_and_score(sid, b)
      assert {:ok, 1.0, :normal} = EntropyTracker.record_and_score(sid, c)
    end

    test "F1: after the tracker crashes and restarts, windows start fresh with no error" do
      sid = unique_session()
      record_all(sid, List.duplicate(@loop, 4))
      pid = Process.whereis(EntropyTracker)
      ref = Process.monitor(pid)
      Process.exit(pid, :kill)
      assert_receive {:DOWN, ^ref, :process, ^pid, :killed}
      wait_until(fn -> Process.whereis(EntropyTracker) not in [nil, pid] end)
      # The name is registered before init/1 runs; wait for init to swap in the new store.
      :sys.get_state(EntropyTracker)

      assert {:ok, 1.0, :normal} = EntropyTracker.record_and_score(sid, @loop)
      assert EntropyTracker.window(sid) == [@loop]
    end
  end

  describe "bad input" do
    test "each gets an error a caller can match on, and the tracker keeps running" do
      sid = unique_session()
      long = String.duplicate("x", 1025)
      pid = Process.whereis(EntropyTracker)

      assert {:error, :invalid_session_id} = EntropyTracker.record_and_score(:atom_id, @loop)
      assert {:error, :invalid_session_id} = EntropyTracker.record_and_score("", @loop)

      assert {:error, :invalid_session_id} =
               EntropyTracker.record_and_score(String.duplicate("s", 257), @loop)

      assert {:error, :field_too_long} =
               EntropyTracker.record_and_score(sid, {long, "read_file", :failure})

      assert {:error, :field_too_long} =
               EntropyTracker.record_and_score(sid, {"search", long, :failure})

      assert {:error, :invalid_utf8} =
               EntropyTracker.record_and_score(sid, {<<0xFF, 0xFE>>, "t", :failure})

      assert {:error, :invalid_utf8} = EntropyTracker.record_and_score(<<0xC3, 0x28>>, @loop)

      assert {:error, :invalid_status} =
               EntropyTracker.record_and_score(sid, {"search", "read_file", :exploded})

      assert {:error, :invalid_status} =
               EntropyTracker.record_and_score(sid, {"search", "read_file", "failure"})

      assert {:error, :invalid_tuple} = EntropyTracker.record_and_score(sid, {"search", "t"})

      assert {:error, :invalid_tuple} =
               EntropyTracker.record_and_score(sid, {:search, "t", :failure})

      assert {:error, :invalid_tuple} = EntropyTracker.record_and_score(sid, "not a tuple")

      assert {:error, :invalid_agent_id} =
               EntropyTracker.record_and_score(sid, @loop, agent_id: :nope)

      assert {:error, :invalid_agent_id} =
               EntropyTracker.record_and_score(sid, @loop, agent_id: "")

      assert EntropyTracker.window(sid) == [], "nothing was recorded"
      assert Process.whereis(EntropyTracker) == pid
      assert {:ok, 1.0, :normal} = EntropyTracker.record_and_score(sid, @loop)
    end

    test "a panic in Rust is an exception in the caller, not a crash of the VM" do
      assert_raise ErlangError, ~r/nif_panicked/, fn -> Observatory.Native.panic_probe() end
      assert {:ok, _, _} = EntropyTracker.record_and_score(unique_session(), @loop)
    end
  end

  describe "bounded memory" do
    setup do
      name = :"tracker_#{System.unique_integer([:positive])}"

      {:ok, _} =
        start_supervised(
          {EntropyTracker, name: name, max_sessions: 64, session_ttl_ms: 200, tick_ms: 5}
        )

      %{opts: [tracker: name, agent_id: "a"]}
    end

    test "the store holds at most max_sessions, evicting the least recently seen", %{opts: opts} do
      for i <- 1..200, do: EntropyTracker.record_and_score("s#{i}", @loop, opts)
      stats = EntropyTracker.stats(opts)
      assert stats.sessions == 64
      assert stats.evicted == 200 - 64
      assert EntropyTracker.window("s136", opts) == [], "the least recently seen went first"
      assert EntropyTracker.window("s200", opts) == [@loop], "the newest survives"
    end

    test "idle sessions expire after the TTL", %{opts: opts} do
      EntropyTracker.record_and_score("idle", @loop, opts)
      Process.sleep(250)
      # Advance the store's clock now rather than wait for the periodic tick, which a
      # loaded machine may delay.
      tracker = Process.whereis(opts[:tracker])
      send(tracker, :tick)
      :sys.get_state(tracker)
      EntropyTracker.record_and_score("fresh", @loop, opts)
      assert EntropyTracker.sweep(opts) == 1
      assert EntropyTracker.window("idle", opts) == []
      assert EntropyTracker.window("fresh", opts) == [@loop]
      assert EntropyTracker.stats(opts).expired == 1
    end

    test "a stopped tracker's store is freed (no resource leak)", %{opts: opts} do
      # The stores of trackers stopped by earlier tests are freed only once every
      # process that read them has been garbage-collected: counted before that, one
      # of them may go while this test runs and the count comes out one short.
      before = settled_live_stores()
      name = :"leak_#{System.unique_integer([:positive])}"
      {:ok, pid} = EntropyTracker.start_link(name: name)
      for i <- 1..100, do: EntropyTracker.record_and_score("s#{i}", @loop, tracker: name)
      assert Observatory.Native.live_stores() == before + 1
      GenServer.stop(pid)
      _ = opts

      # Other tests' stores may be freed meanwhile, so the count can fall below `before`.
      # The store goes once every process that read it has been garbage-collected.
      wait_until(
        fn ->
          Enum.each(Process.list(), &:erlang.garbage_collect/1)
          Observatory.Native.live_stores() <= before
        end,
        1_000
      )
    end
  end

  test "sessions/1 lists sessions, most recently seen first" do
    name = :"list_#{System.unique_integer([:positive])}"
    start_supervised!({EntropyTracker, name: name})
    EntropyTracker.record_and_score("first", @loop, tracker: name, agent_id: "a")
    Process.sleep(5)
    :sys.get_state(name)
    EntropyTracker.record_and_score("second", @loop, tracker: name)

    assert [%{session_id: _, severity: :normal, score: 1.0}, _] =
             EntropyTracker.sessions(tracker: name)

    assert [%{agent_id: "a"}] =
             Enum.filter(EntropyTracker.sessions(tracker: name), &(&1.session_id == "first"))

    assert length(EntropyTracker.sessions(tracker: name, limit: 1)) == 1
  end

  test "concurrent callers on one session never lose the window's shape" do
    sid = unique_session()

    1..8
    |> Task.async_stream(fn i -> record_all(sid, List.duplicate({"i#{i}", "t", :success}, 50)) end)
    |> Stream.run()

    assert length(EntropyTracker.window(sid)) == 5
  end

  defp valid_event do
    %{
      event_type: "entropy_alert",
      session_id: "s",
      agent_id: "a",
      entropy_score: 0.2,
      window_size: 5,
      repeated_pattern: %{intent: "i", tool_call: "t", action_status: "failure"},
      occurrence_count: 5
    }
  end

  # The count of live stores once it no longer falls from one round of collections
  # to the next (stores already released elsewhere are gone).
  defp settled_live_stores(last \\ nil, tries \\ 100) do
    Enum.each(Process.list(), &:erlang.garbage_collect/1)
    now = Observatory.Native.live_stores()

    if now == last or tries == 0,
      do: now,
      else: Process.sleep(10) && settled_live_stores(now, tries - 1)
  end

  defp wait_until(fun, tries \\ 100) do
    cond do
      fun.() -> :ok
      tries == 0 -> flunk("condition not met in time")
      true -> Process.sleep(10) && wait_until(fun, tries - 1)
    end
  end
end
