# bench/ is not compiled by mix: the reference detectors that bench/real_runs.exs
# compares the alert sources with are loaded from there.
Code.require_file("../../bench/reference_detectors.exs", __DIR__)

defmodule Observatory.Bench.ReferenceDetectorsTest do
  use ExUnit.Case, async: true

  alias Observatory.Bench.ReferenceDetectors

  defp step(command, result, status \\ "success"),
    do: %{
      "tool_call" => "bash",
      "tool_input" => %{"command" => command},
      "action_status" => status,
      "result" => result
    }

  defp times(n, fun), do: Enum.map(1..n, fun)

  describe "OpenHands-style: the same action and the same observation 4 times" do
    test "alarms on the fourth repeat" do
      steps = [step("ls", "a b") | times(4, fn _ -> step("cat x", "no change") end)]
      assert ReferenceDetectors.openhands_stuck(steps) == 4
    end

    test "does not alarm on 3 repeats, or on 4 whose observations differ" do
      assert ReferenceDetectors.openhands_stuck(times(3, fn _ -> step("cat x", "same") end)) ==
               nil

      polling = times(6, &step("job status", "#{&1 * 10}% done"))
      assert ReferenceDetectors.openhands_stuck(polling) == nil
    end

    test "compares inputs as JSON, not as text: key order does not matter" do
      a = %{
        "tool_call" => "read",
        "tool_input" => %{"path" => "x", "lines" => 10},
        "result" => "r"
      }

      b = %{a | "tool_input" => Map.new([{"lines", 10}, {"path", "x"}])}
      assert ReferenceDetectors.openhands_stuck([a, b, a, b]) == 3

      other = %{a | "tool_input" => %{"path" => "x", "lines" => 10.0}}
      assert ReferenceDetectors.openhands_stuck([a, b, other, a]) == nil
    end
  end

  describe "OpenHands-style: the same action ending in an error 3 times" do
    test "alarms on the third error even when the error text changes" do
      steps = [
        step("ls", "a b") | times(3, &step("DISCUSSION", "line #{&1}: not found", "failure"))
      ]

      assert ReferenceDetectors.openhands_stuck(steps) == 3
    end

    test "counts error and timeout statuses as errors, in the flat record's status field" do
      steps =
        for status <- ["error", "timeout", "failure"],
            do: %{
              "tool_call" => "curl",
              "tool_input" => %{},
              "status" => status,
              "result" => status
            }

      assert ReferenceDetectors.openhands_stuck(steps) == 2
    end

    test "does not alarm when one of the three succeeds, or the actions differ" do
      steps = [
        step("make", "error 1", "failure"),
        step("make", "error 2", "failure"),
        step("make", "ok")
      ]

      assert ReferenceDetectors.openhands_stuck(steps) == nil

      different = times(3, &step("grep sym#{&1} .", "", "failure"))
      assert ReferenceDetectors.openhands_stuck(different) == nil
    end
  end

  describe "OpenHands-style: A, B, A, B, A, B of actions and observations" do
    test "alarms on the sixth step of the alternation" do
      steps = times(3, fn _ -> [step("edit f", "edited"), step("make", "build failed")] end)
      assert ReferenceDetectors.openhands_stuck(List.flatten(steps)) == 5
    end

    test "does not alarm on five steps, or when an observation moves on" do
      steps = times(3, fn _ -> [step("edit f", "edited"), step("make", "build failed")] end)
      assert ReferenceDetectors.openhands_stuck(Enum.take(List.flatten(steps), 5)) == nil

      moving = times(3, &[step("edit f", "edited"), step("make", "#{&1} tests failed")])
      assert ReferenceDetectors.openhands_stuck(List.flatten(moving)) == nil
    end
  end

  describe "Gemini-style: the identical tool call 5 times in a row" do
    test "alarms on the fifth identical call, whatever the results" do
      steps = [step("ls", "a") | times(5, &step("job status", "#{&1 * 10}%"))]
      assert ReferenceDetectors.gemini_identical_calls(steps) == 5
    end

    test "does not alarm on 4, on an interrupted run, or on different arguments" do
      four = times(4, fn _ -> step("cat x", "same") end)
      assert ReferenceDetectors.gemini_identical_calls(four) == nil
      assert ReferenceDetectors.gemini_identical_calls(four ++ [step("ls", "a")] ++ four) == nil

      paths = times(6, &step("cat file#{&1}", "same"))
      assert ReferenceDetectors.gemini_identical_calls(paths) == nil
    end
  end
end
