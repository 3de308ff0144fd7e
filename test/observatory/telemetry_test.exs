defmodule Observatory.TelemetryTest do
  # :telemetry is not on this machine (no Hex; Debian ships no erlang telemetry
  # package), so these tests route Observatory.Telemetry's dispatch to a recorder with
  # :telemetry.execute/3's signature and check every event the gateway emits. With
  # :telemetry loaded, the last describe attaches a real handler.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.{JSON, KillSwitch, Telemetry}
  alias Observatory.Gateway.{HITL, SchemaInterceptor}
  alias Observatory.Test.{HTTP, TelemetryRecorder, Upstream}

  setup do
    previous = Telemetry.put_dispatcher(TelemetryRecorder)
    Process.register(self(), :observatory_telemetry_test)

    on_exit(fn -> Telemetry.put_dispatcher(previous) end)
    %{sid: "sess-telemetry-#{System.unique_integer([:positive])}"}
  end

  defp ingest(sid, n) do
    {:ok, _} =
      SchemaInterceptor.ingest(
        HTTP.envelope(%{
          "meta" => %{"session_id" => sid, "agent_id" => "agent-tel", "step_id" => "s#{n}"}
        })
      )
  end

  # The recorder sees every test's events: keep this session's.
  defp receive_event(event, sid) do
    receive do
      {:telemetry, ^event, measurements, %{session_id: ^sid} = metadata} ->
        {measurements, metadata}
    after
      1_000 -> flunk("no #{inspect(event)} for #{sid}")
    end
  end

  describe "events for ingest, scoring and alerts" do
    test "an accepted envelope: ingest stop with its duration, and its score", %{sid: sid} do
      ingest(sid, 1)

      {m, meta} = receive_event([:observatory, :ingest, :stop], sid)
      assert is_integer(m.duration) and m.duration >= 0

      assert meta == %{
               result: :ok,
               session_id: sid,
               agent_id: "agent-tel",
               violations: 0,
               replayed: false
             }

      {m, meta} = receive_event([:observatory, :entropy, :score], sid)
      assert m == %{score: 1.0}
      assert meta == %{session_id: sid, agent_id: "agent-tel", severity: :normal}
    end

    test "a retried step: ingest stop says replayed, and nothing is scored again", %{sid: sid} do
      ingest(sid, 1)
      {_, %{replayed: false}} = receive_event([:observatory, :ingest, :stop], sid)
      {_, _} = receive_event([:observatory, :entropy, :score], sid)

      ingest(sid, 1)
      {_, meta} = receive_event([:observatory, :ingest, :stop], sid)
      assert %{result: :ok, replayed: true} = meta
      refute_received {:telemetry, [:observatory, :entropy, :score], _, %{session_id: ^sid}}
    end

    test "a rejected envelope: ingest stop with result :invalid and the violation count" do
      capture_log(fn -> {:error, {:invalid, _}} = SchemaInterceptor.ingest(~s({"meta": {}})) end)

      assert_receive {:telemetry, [:observatory, :ingest, :stop], %{duration: _},
                      %{result: :invalid, session_id: nil, violations: n}}

      assert n > 0
    end

    test "a loop raises one alert event with its score and source", %{sid: sid} do
      for n <- 1..5, do: ingest(sid, n)

      {m, meta} = receive_event([:observatory, :alert], sid)
      assert m == %{entropy_score: 0.2, occurrence_count: 5}
      assert meta == %{session_id: sid, agent_id: "agent-tel", source: :entropy}

      severities =
        for _ <- 1..5, do: elem(receive_event([:observatory, :entropy, :score], sid), 1).severity

      assert severities == [:normal, :normal, :warning, :warning, :loop]
    end
  end

  describe "events for pauses and kill switch trips" do
    test "pause and resume, with operator and reason", %{sid: sid} do
      {:ok, _} = HITL.pause(sid, operator: "alice", reason: "looping")
      {m, meta} = receive_event([:observatory, :hitl, :pause], sid)
      assert is_integer(m.system_time)
      assert meta == %{session_id: sid, operator: "alice", reason: "looping"}

      {:ok, _} = HITL.resume(sid, operator: "bob", reason: "fixed")
      {_, meta} = receive_event([:observatory, :hitl, :resume], sid)
      assert meta == %{session_id: sid, operator: "bob", reason: "fixed"}
    end

    test "a kill switch trip, with the score over the threshold" do
      agent = "agent-tel-#{System.unique_integer([:positive])}"
      {:ok, _} = KillSwitch.configure(agent, %{enabled: true, threshold: 1})

      capture_log(fn ->
        for k <- 1..5 do
          body = Upstream.request("Attempt #{k}: retry the deploy of build 4821.")
          {:ok, fp} = KillSwitch.fingerprint_request(JSON.encode!(body))
          KillSwitch.check_request(agent, fp)
        end
      end)

      assert_receive {:telemetry, [:observatory, :kill_switch, :trip],
                      %{score: score, threshold: 1.0},
                      %{agent_id: ^agent, window_size: 5, window_len: len}}

      assert score > 1.0 and len >= 2
    end
  end

  describe "without :telemetry nothing is required" do
    test "the dispatcher is :telemetry exactly when its module is loaded" do
      Telemetry.put_dispatcher(previous_default())
      expected = if Code.ensure_loaded?(:telemetry), do: :telemetry, else: nil
      assert Telemetry.dispatcher() == expected
    end

    test "with no dispatcher, events go nowhere and ingest works", %{sid: sid} do
      Telemetry.put_dispatcher(nil)
      ingest(sid, 1)
      refute_receive {:telemetry, _, _, _}, 50
      assert Telemetry.execute([:observatory, :x], %{}, %{}) == :ok
    end
  end

  # Forget the decision so dispatcher/0 detects again.
  defp previous_default do
    :persistent_term.erase(Telemetry.Dispatcher)
    Telemetry.dispatcher()
  end

  if Code.ensure_loaded?(:telemetry) do
    describe "with :telemetry" do
      test "a handler attached to [:observatory, :alert] gets the alert", %{sid: sid} do
        Telemetry.put_dispatcher(:telemetry)
        parent = self()
        handler = "observatory-test-#{sid}"

        :ok =
          apply(:telemetry, :attach, [
            handler,
            [:observatory, :alert],
            fn _event, m, meta, _ -> send(parent, {:handled, m, meta}) end,
            nil
          ])

        on_exit(fn -> apply(:telemetry, :detach, [handler]) end)
        for n <- 1..5, do: ingest(sid, n)
        assert_receive {:handled, %{entropy_score: 0.2}, %{session_id: ^sid}}
      end
    end
  end
end
