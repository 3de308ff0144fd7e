defmodule Observatory.Gateway.AlertSourceTest do
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.{AlertSource, EntropyAlertEvent, SchemaInterceptor}
  alias Observatory.Test.HTTP

  setup do
    restore_env_on_exit([:alert_source])
    subscribe_gateway_topics()
    %{sid: unique_session("sess-source")}
  end

  defp ingest(sid, intent, tool, input, status, result) do
    {:ok, r} =
      SchemaInterceptor.ingest(
        HTTP.envelope(%{
          "meta" => %{"session_id" => sid},
          "cognition" => %{"intent" => intent},
          "action" => %{
            "tool_call" => tool,
            "tool_input" => input,
            "status" => status,
            "result" => result
          }
        })
      )

    r
  end

  # Eight different files: the ratio's false alarm.
  defp read_files(sid) do
    for n <- 1..8,
        do: ingest(sid, "read", "read_file", %{"path" => "f#{n}.ex"}, "success", "text #{n}")
  end

  # list → read → test, three identical rounds: the ratio's miss (3 of 5 is Normal).
  defp abc_cycle(sid) do
    for _ <- 1..3 do
      [
        ingest(sid, "explore", "list_dir", %{"path" => "src"}, "success", ["a.py"]),
        ingest(sid, "read", "read_file", %{"path" => "src/a.py"}, "success", "x = 1"),
        ingest(sid, "verify", "run_tests", %{}, "failure", %{"failed" => 1})
      ]
    end
    |> List.flatten()
  end

  describe ":entropy (the FRD-009 default)" do
    test "is the default" do
      Application.delete_env(:observatory, :alert_source)
      Observatory.IngestSettings.refresh()
      assert AlertSource.current() == :entropy
    end

    test "the ratio raises the alarm on eight different files; the verdict says progress",
         %{sid: sid} do
      Observatory.configure(alert_source: :entropy)
      results = read_files(sid)
      assert List.last(results).severity == :loop
      assert List.last(results).verdict.verdict == :progress
      assert_receive %{event_type: "entropy_alert", session_id: ^sid} = event
      refute Map.has_key?(event, :alert_source), "FRD-009's event, unchanged"
      assert_receive %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"}
    end

    test "the ratio misses an A → B → C cycle", %{sid: sid} do
      Observatory.configure(alert_source: :entropy)
      assert List.last(abc_cycle(sid)).verdict.verdict == :loop
      refute_receive %{event_type: "entropy_alert", session_id: ^sid}, 50
    end
  end

  describe ":verdict" do
    setup do
      Observatory.configure(alert_source: :verdict)
    end

    test "no alarm for eight different files", %{sid: sid} do
      assert List.last(read_files(sid)).severity == :loop
      refute_receive %{event_type: "entropy_alert", session_id: ^sid}, 50
      refute_receive %{event_type: "topology_update", session_id: ^sid}, 10
    end

    test "an A → B → C cycle raises an EntropyAlertEvent with every FR-9.7 field", %{sid: sid} do
      results = abc_cycle(sid)
      # Issue 26: the third round's first step is the third revisit in six steps (A and B
      # again with the same answers; C's `%{"failed" => 1}` holds no text): loop at 7.
      assert Enum.map(results, & &1.verdict.verdict) |> Enum.count(&(&1 == :loop)) == 3

      assert_receive %{event_type: "entropy_alert", session_id: ^sid} = event
      assert {:ok, _} = EntropyAlertEvent.validate(event)

      assert %{
               agent_id: "agent-http",
               entropy_score: 0.6,
               window_size: 5,
               occurrence_count: 2,
               repeated_pattern: %{
                 intent: "explore",
                 tool_call: "list_dir",
                 action_status: "success"
               },
               alert_source: "verdict",
               rule: :revisit,
               evidence: [1, 2, 4, 5, 7]
             } = event

      assert event.reason =~ "3 of the last 6 steps repeated an earlier call"
      assert_receive %{event_type: "topology_update", session_id: ^sid, state: "blocked"}
      assert_receive %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"}
    end

    test "a tracker error leaves no gateway score: the loop alert is not sent", %{sid: sid} do
      # Three steps (each its own step_id), the same call failing the same way.
      env = fn ->
        HTTP.envelope(%{
          "meta" => %{"session_id" => sid},
          "action" => %{"tool_input" => %{"path" => "x"}, "result" => "ENOENT"}
        })
      end

      log =
        capture_log(fn ->
          for _ <- 1..3,
              do: {:ok, _} = SchemaInterceptor.ingest(env.(), tracker: :no_such_tracker)
        end)

      assert log =~ "alert not sent"
      refute_receive %{event_type: "entropy_alert", session_id: ^sid}, 50
      assert_receive %{event_type: "topology_update", session_id: ^sid, state: "alert_entropy"}
    end

    test "suspect is amber, and progress after it brings the node back to active", %{sid: sid} do
      fail = fn -> ingest(sid, "read", "read_file", %{"path" => "x"}, "failure", "ENOENT") end
      fail.()
      assert %{verdict: %{verdict: :suspect}} = fail.()
      assert_receive %{event_type: "topology_update", session_id: ^sid, state: "blocked"}

      assert %{verdict: %{verdict: :progress}} =
               ingest(sid, "read", "read_file", %{"path" => "x"}, "success", "found it")

      assert_receive %{event_type: "topology_update", session_id: ^sid, state: "active"}
    end
  end

  test "alert?/2 says which results alarm under each source, from one pass", %{sid: sid} do
    Observatory.configure(alert_source: :entropy)
    files = read_files(sid)
    cycle = abc_cycle(unique_session("sess-source-abc"))
    assert Enum.any?(files, &AlertSource.alert?(&1, :entropy))
    refute Enum.any?(files, &AlertSource.alert?(&1, :verdict))
    refute Enum.any?(cycle, &AlertSource.alert?(&1, :entropy))
    assert Enum.count(cycle, &AlertSource.alert?(&1, :verdict)) == 3
    refute AlertSource.alert?(%{severity: nil, verdict: nil}, :verdict)
  end

  test "an unknown value is logged once and read as :entropy" do
    # A value configure/1 refuses, put as a host's config would put it.
    Application.put_env(:observatory, :alert_source, :both)
    Observatory.IngestSettings.refresh()

    log =
      capture_log(fn ->
        assert AlertSource.current() == :entropy
        assert AlertSource.current() == :entropy
      end)

    assert length(String.split(log, ":alert_source is :both")) == 2
  end
end

defmodule Observatory.Gateway.AlertSourceConfigTest do
  # Reads config/runtime.exs with the environment variable set: not async.
  use ExUnit.Case, async: false

  alias Observatory.Gateway.AlertSource

  @runtime Path.expand("../../../config/runtime.exs", __DIR__)

  defp runtime_with(value) do
    saved = System.get_env("OBSERVATORY_ALERT_SOURCE")
    System.put_env("OBSERVATORY_ALERT_SOURCE", value)

    try do
      Config.Reader.read!(@runtime, env: :prod)
    after
      if saved,
        do: System.put_env("OBSERVATORY_ALERT_SOURCE", saved),
        else: System.delete_env("OBSERVATORY_ALERT_SOURCE")
    end
  end

  describe "issue 18: OBSERVATORY_ALERT_SOURCE chooses the alert source at start" do
    test "entropy and verdict (any case, spaces trimmed) set :alert_source" do
      assert runtime_with("verdict")[:observatory][:alert_source] == :verdict
      assert runtime_with(" Entropy ")[:observatory][:alert_source] == :entropy
    end

    test "any other value stops the start with a message naming the variable and the value" do
      error = assert_raise RuntimeError, fn -> runtime_with("verdit") end

      assert error.message ==
               ~s(OBSERVATORY_ALERT_SOURCE must be "entropy" or "verdict", got: "verdit")

      assert_raise RuntimeError, ~r/got: ""/, fn -> runtime_with("") end
    end

    test "unset, the configured value (default :entropy) stays" do
      System.delete_env("OBSERVATORY_ALERT_SOURCE")

      refute Keyword.has_key?(
               Config.Reader.read!(@runtime, env: :prod)[:observatory] || [],
               :alert_source
             )
    end

    test "the application refuses an invalid :alert_source at start (validate!/1)" do
      assert AlertSource.validate!(:entropy) == :ok
      assert AlertSource.validate!(:verdict) == :ok

      assert_raise ArgumentError,
                   "expected :alert_source to be :entropy or :verdict (OBSERVATORY_ALERT_SOURCE=entropy|verdict), got: \"verdict\"",
                   fn -> AlertSource.validate!("verdict") end
    end
  end
end
