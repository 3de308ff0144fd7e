defmodule Observatory.Gateway.LoopVerdictScenariosTest do
  # The labelled scenario suite of issue 8, through the real ingest path: every step is
  # a DecisionLog envelope given to SchemaInterceptor.ingest/1, which validates it,
  # scores it with the EntropyTracker (FRD-009 defaults) and judges it with the
  # LoopVerdict. Each test checks the verdict and, for contrast, what the uniqueness
  # ratio says about the same steps. The same fixture runs in Rust
  # (native/observatory_core/src/loop_verdict/scenarios.rs).
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.SchemaInterceptor

  @fixture Path.expand("../../fixtures/loop_verdict_scenarios.json", __DIR__)
  @external_resource @fixture
  @scenarios @fixture
             |> File.read!()
             |> Observatory.JSON.decode()
             |> elem(1)
             |> Map.fetch!("scenarios")

  setup do
    # FRD-009's defaults and the default alert source, whatever other tests did.
    for key <- [:entropy_window_size, :entropy_loop_threshold, :entropy_warning_threshold],
        do: Application.delete_env(:observatory, key)

    restore_env_on_exit([:alert_source])
    Observatory.configure(alert_source: :entropy)
    :ok
  end

  test "the fixture has every pattern of the issue, labelled" do
    labels = Enum.frequencies_by(@scenarios, & &1["label"])
    assert labels["must-flag"] >= 5 and labels["must-not-flag"] >= 5
  end

  for scenario <- @scenarios do
    @scenario scenario
    test "#{scenario["label"]}: #{scenario["name"]}" do
      run = ingest_all(@scenario)
      expect = @scenario["expect"]
      trace = Enum.map(run, &{&1.step_number, &1.verdict, &1.severity, &1.reason})
      last = List.last(run)

      assert Atom.to_string(last.verdict) == expect["verdict"], inspect(trace, pretty: true)

      assert Atom.to_string(highest(run)) == expect["max_verdict"],
             inspect(trace, pretty: true)

      assert first_at(run, :verdict, :loop) == expect["verdict_first_loop"],
             inspect(trace, pretty: true)

      # The contrast: what the uniqueness ratio says about the same steps.
      assert Atom.to_string(last.severity) == expect["entropy"], inspect(trace, pretty: true)

      assert first_at(run, :severity, :loop) == expect["entropy_first_loop"],
             inspect(trace, pretty: true)

      if @scenario["label"] == "must-flag" do
        assert last.rule != :none
        assert last.evidence != [] and Enum.all?(last.evidence, &(&1 in 1..last.step_number))
        assert is_binary(last.reason) and last.reason != ""
      end
    end
  end

  defp ingest_all(scenario) do
    sid = unique_session("sess-scenario")

    scenario["steps"]
    |> Enum.with_index(1)
    |> Enum.map(fn {step, n} ->
      {:ok, result} = SchemaInterceptor.ingest(envelope(sid, step, n))
      Map.merge(result.verdict, %{severity: result.severity})
    end)
  end

  defp envelope(sid, step, n) do
    action =
      %{"tool_call" => step["tool"], "tool_input" => step["input"], "status" => step["status"]}
      |> then(
        &if Map.has_key?(step, "result"), do: Map.put(&1, "result", step["result"]), else: &1
      )

    %{
      "meta" => %{
        "step_id" => "#{sid}-#{n}",
        "session_id" => sid,
        "agent_id" => "agent-scenario",
        "timestamp" => "2026-02-22T10:30:00Z"
      },
      "cognition" => %{"intent" => step["intent"]},
      "action" => action
    }
  end

  defp highest(run) do
    Enum.max_by(run, &Enum.find_index([:progress, :suspect, :loop], fn l -> l == &1.verdict end)).verdict
  end

  defp first_at(run, key, value) do
    case Enum.find(run, &(Map.fetch!(&1, key) == value)) do
      nil -> nil
      step -> step.step_number
    end
  end
end
