defmodule Observatory.IngestSettingsTest do
  # The settings every step reads are kept as one snapshot (Observatory.IngestSettings):
  # Observatory.configure/1 applies them to the very next step, Application.put_env/3
  # alone at the snapshot's next refresh (every :settings_refresh_ms), FR-9.11's three
  # entropy settings are still read from the environment on every call.
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.{DecisionLog, LoopVerdict, SchemaInterceptor}
  alias Observatory.IngestSettings
  alias Observatory.Test.HTTP

  setup do
    on_exit(&LoopVerdict.reload_rules/0)

    restore_env_on_exit([
      :step_detection,
      :session_log_size,
      :idempotency,
      :alert_source,
      :loop_verdict,
      :settings_refresh_ms
    ])

    %{sid: unique_session("settings")}
  end

  defp step(sid, n, input \\ "/same"), do: HTTP.repeated_read(sid, n, input)

  defp action(sid, n) do
    {:ok, %{step: %{action: action}}} = SchemaInterceptor.ingest(step(sid, n))
    action
  end

  defp keeper, do: Process.whereis(IngestSettings)

  # No tick of the keeper's own while a test looks (it is a minute away).
  defp quiet_keeper, do: Observatory.configure(settings_refresh_ms: 60_000)

  describe "Observatory.configure/1" do
    test "applies each setting to the very next step", %{sid: sid} do
      quiet_keeper()
      Observatory.configure(step_detection: [stagnation_warn: 5, stagnation_block: 8])
      assert for(n <- 1..3, do: action(sid, n)) == [:continue, :continue, :continue]

      Observatory.configure(step_detection: [stagnation_warn: 2, stagnation_block: 8])
      assert action(sid, 4) == :warn

      # The idempotency check off: the same delivery is scored again.
      json = Observatory.JSON.encode!(step(sid, 5, "/other"))
      {:ok, %{replayed: false}} = SchemaInterceptor.ingest(json)
      assert {:ok, %{replayed: true}} = SchemaInterceptor.ingest(json)
      Observatory.configure(idempotency: [enabled: false])
      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(json)

      # The session log's ring, and the alert source.
      assert length(Observatory.Gateway.SessionLog.steps(sid)) == 6
      Observatory.configure(session_log_size: 2)
      for n <- 6..7, do: {:ok, _} = SchemaInterceptor.ingest(step(sid, n, "/x"))
      assert length(Observatory.Gateway.SessionLog.steps(sid)) == 2
      Observatory.configure(alert_source: :verdict)
      assert Observatory.Gateway.AlertSource.current() == :verdict
    end

    test "a :loop_verdict normalization key is applied at once (the rules rebuilt)" do
      token = fn t ->
        envelope = HTTP.envelope(%{"action" => %{"tool_input" => %{"job_token" => "tok-#{t}"}}})
        elem(DecisionLog.from_map(envelope), 2).verdict_keys
      end

      assert token.(1) != token.(2)
      Observatory.configure(loop_verdict: [extra_volatile_keys: ["job_token"]])
      assert token.(1) == token.(2)
    end

    test "an invalid value is refused with a message naming it; nothing changes", %{sid: sid} do
      quiet_keeper()
      Observatory.configure(step_detection: [stagnation_warn: 2, stagnation_block: 8])

      # A valid setting beside the refused one is not put either.
      error =
        assert_raise ArgumentError, fn ->
          Observatory.configure(
            alert_source: :verdict,
            step_detection: [stagnation_warn: 5, stagnation_block: 2]
          )
        end

      assert error.message =~ ":step_detection must be warn thresholds at most their block"
      assert error.message =~ "got: [stagnation_warn: 5, stagnation_block: 2]"
      assert Application.get_env(:observatory, :alert_source) != :verdict
      assert Application.get_env(:observatory, :step_detection)[:stagnation_block] == 8

      # The old thresholds still apply: a warning at a streak of two.
      assert for(n <- 1..3, do: action(sid, n)) == [:continue, :continue, :warn]
    end

    test "each bad value's message says what the setting takes" do
      refused = fn settings ->
        assert_raise(ArgumentError, fn -> Observatory.configure(settings) end).message
      end

      assert refused.(alert_source: :both) =~
               ":alert_source must be :entropy or :verdict, got: :both"

      assert refused.(pubsub: {String, :bus}) =~ "broadcast/3, subscribe/2 and unsubscribe/2"
      assert refused.(pubsub: String) =~ ":pubsub must be {module, server}, got: String"
      assert refused.(idempotency: [max_steps: 0]) =~ "max_steps: a positive integer"
      assert refused.(idempotency: [enabled: 1]) =~ "enabled: true or false"
      assert refused.(idempotency: [max_step: 5]) =~ "a keyword list of :enabled"

      assert refused.(loop_verdict: [repeat_suspect: 4, repeat_loop: 3]) =~
               "invalid :loop_verdict thresholds"

      assert refused.(loop_verdict: [hex_ids: 1]) =~ "hex_ids: true or false"
      assert refused.(loop_verdict: :on) =~ ":loop_verdict must be a keyword list, got: :on"
      assert refused.(step_detection: [stuck_warn: "five"]) =~ "stuck_warn: a positive integer"
      assert refused.(session_log_size: 0) =~ ":session_log_size must be a positive integer"
      assert refused.(session_log_max_bytes: "1GB") =~ "got: \"1GB\""
      assert refused.(entropy_window_size: 2_000) =~ "an integer 1..1024"
      assert refused.(entropy_loop_threshold: 1.5) =~ "a number 0..1"
      assert refused.(settings_refresh_ms: 0) =~ "a positive integer"

      assert refused.(kill_switch: []) =~
               "unknown setting :kill_switch (it takes :alert_source, :pubsub"

      assert refused.(:verdict) =~ "takes a keyword list of settings, got: :verdict"
    end
  end

  describe "Application.put_env/3 alone" do
    test "applies at the keeper's next refresh, not before", %{sid: sid} do
      quiet_keeper()
      Observatory.configure(step_detection: [stagnation_warn: 5, stagnation_block: 8])
      Application.put_env(:observatory, :step_detection, stagnation_warn: 2, stagnation_block: 8)
      assert for(n <- 1..2, do: action(sid, n)) == [:continue, :continue]

      # The keeper's tick, as its timer sends it.
      send(keeper(), :tick)
      :sys.get_state(keeper())
      assert action(sid, 3) == :warn
    end

    test "applies within :settings_refresh_ms: the keeper's own timer", %{sid: sid} do
      Observatory.configure(
        settings_refresh_ms: 20,
        step_detection: [stagnation_warn: 5, stagnation_block: 8]
      )

      assert for(n <- 1..2, do: action(sid, n)) == [:continue, :continue]
      Application.put_env(:observatory, :step_detection, stagnation_warn: 1, stagnation_block: 8)
      pid = keeper()
      :erlang.trace(pid, true, [:receive])

      try do
        assert_receive {:trace, ^pid, :receive, :tick}, 2_000
        :sys.get_state(pid)
      after
        :erlang.trace(pid, false, [:receive])
      end

      assert action(sid, 3) == :warn
    end

    test "an invalid value does what it did: the detector's error, with a warning", %{sid: sid} do
      quiet_keeper()
      Application.put_env(:observatory, :step_detection, :not_a_list)

      log =
        capture_log(fn ->
          send(keeper(), :tick)
          :sys.get_state(keeper())

          # Scored without the detector's verdict, which failed.
          assert {:ok, %{step: nil, verdict: %{}}} = SchemaInterceptor.ingest(step(sid, 1))
        end)

      assert log =~ "invalid :step_detection thresholds :not_a_list"
      assert Process.alive?(keeper())
    end

    test "Application's config_change/3 (a release upgrade) refreshes at once", %{sid: sid} do
      quiet_keeper()
      assert for(n <- 1..2, do: action(sid, n)) == [:continue, :continue]
      Application.put_env(:observatory, :step_detection, stagnation_warn: 1, stagnation_block: 8)
      assert :ok = Observatory.Application.config_change([], [], [])
      assert action(sid, 3) == :warn
    end
  end

  describe "the snapshot" do
    test "an unchanged setting does not write the :persistent_term again; a changed one does" do
      quiet_keeper()
      before = :persistent_term.get(IngestSettings)
      pid = keeper()
      # Every :persistent_term.put/2 the keeper calls comes here as a message.
      :erlang.trace_pattern({:persistent_term, :put, 2}, true, [:local])
      :erlang.trace(pid, true, [:call])

      tick = fn ->
        send(pid, :tick)
        :sys.get_state(pid)
      end

      try do
        for _ <- 1..3, do: tick.()
        assert IngestSettings.refresh() == :ok
        refute_received {:trace, ^pid, :call, {:persistent_term, :put, _}}
        assert :erts_debug.same(before, :persistent_term.get(IngestSettings))

        Application.put_env(:observatory, :session_log_size, 7)
        tick.()
        assert_received {:trace, ^pid, :call, {:persistent_term, :put, [IngestSettings, _]}}
        assert IngestSettings.get(:session_log_size) == 7
      after
        :erlang.trace(pid, false, [:call])
        :erlang.trace_pattern({:persistent_term, :put, 2}, false, [:local])
      end
    end

    test "survives the keeper's crash; the restarted keeper reads the settings again" do
      Observatory.configure(session_log_size: 4)
      before = :persistent_term.get(IngestSettings)

      pid = keeper()
      ref = Process.monitor(pid)
      Process.exit(pid, :kill)
      assert_receive {:DOWN, ^ref, :process, ^pid, :killed}
      # Kept while no keeper runs, and not written again by the new one (unchanged).
      assert IngestSettings.get(:session_log_size) == 4
      new = Observatory.Test.Remote.await_new(IngestSettings, [pid], 2_000)
      :sys.get_state(new)
      assert :erts_debug.same(before, :persistent_term.get(IngestSettings))

      # A setting put while it was down is read by the restarted one.
      Application.put_env(:observatory, :session_log_size, 6)
      ref = Process.monitor(new)
      Process.exit(new, :kill)
      assert_receive {:DOWN, ^ref, :process, ^new, :killed}
      newer = Observatory.Test.Remote.await_new(IngestSettings, [new], 2_000)
      :sys.get_state(newer)
      assert IngestSettings.get(:session_log_size) == 6
    end
  end

  describe "without a snapshot (the application not started, or storage off)" do
    test "each setting is read from the environment on every call" do
      quiet_keeper()
      IngestSettings.forget()

      try do
        Application.put_env(:observatory, :session_log_size, 9)
        assert IngestSettings.get(:session_log_size) == 9
        # The session log's put reads its three settings as one.
        assert {envelope_cap, {9, bytes_cap}} = IngestSettings.get(:session_log_put)

        assert envelope_cap ==
                 Application.get_env(:observatory, :session_log_max_envelope_bytes, 16_384)

        assert bytes_cap == Application.get_env(:observatory, :session_log_max_bytes, 268_435_456)
        Application.put_env(:observatory, :idempotency, enabled: false)
        assert IngestSettings.get(:idempotency_limits) == nil
      after
        IngestSettings.refresh()
      end

      assert {_read, %{session_log_size: 9, session_log_put: {_, {9, _}}}} =
               :persistent_term.get(IngestSettings)
    end
  end

  describe "FR-9.11: the three entropy settings are read on every call" do
    test "put with Application.put_env alone, each applies to the next step", %{sid: sid} do
      quiet_keeper()

      read = fn n, path ->
        json =
          HTTP.envelope(%{
            "meta" => %{"session_id" => sid, "step_id" => "#{sid}-#{n}"},
            "action" => %{"tool_call" => "read_file", "tool_input" => %{"path" => path}}
          })

        {:ok, result} = SchemaInterceptor.ingest(json)
        result
      end

      # Four steps, two tools inputs: the tuples (intent, tool, status) are all alike.
      for n <- 1..4, do: read.(n, "/f#{n}")
      Application.put_env(:observatory, :entropy_window_size, 2)
      assert %{entropy_score: 0.5, severity: :normal} = read.(5, "/f5")
      Application.put_env(:observatory, :entropy_warning_threshold, 0.6)
      assert %{entropy_score: 0.5, severity: :warning} = read.(6, "/f6")
      Application.put_env(:observatory, :entropy_loop_threshold, 0.55)
      assert %{entropy_score: 0.5, severity: :loop} = read.(7, "/f7")
    end
  end
end
