defmodule Observatory.Gateway.EntropyTrackerPropertyTest do
  # PropEr (Debian's erlang-proper) drives record_and_score/3 with random step
  # sequences and window sizes and compares every answer with a list model.
  use ExUnit.Case, async: true

  alias Observatory.Gateway.EntropyTracker

  @moduletag :property

  setup do
    name = :"prop_tracker_#{System.unique_integer([:positive])}"
    start_supervised!({EntropyTracker, name: name})
    %{tracker: name}
  end

  test "UC-0250 / FR-9.2 / FR-9.3: the window is the last N steps and the score is distinct/len",
       %{tracker: tracker} do
    steps =
      :proper_types.list(
        :proper_types.tuple([:proper_types.range(0, 3), :proper_types.range(0, 2)])
      )

    property =
      :proper.forall(steps, fn steps ->
        sid = "prop-#{System.unique_integer([:positive])}"
        size = Application.get_env(:observatory, :entropy_window_size, 5)

        steps
        |> Enum.with_index(1)
        |> Enum.all?(fn {{tool, status}, n} ->
          tuple = {"intent", "tool-#{tool}", Enum.at([:success, :failure, :timeout], status)}

          {:ok, score, severity} =
            EntropyTracker.record_and_score(sid, tuple, tracker: tracker, agent_id: "a")

          model = steps |> Enum.take(n) |> Enum.take(-size)
          expected = Float.round(length(Enum.uniq(model)) / length(model), 4)
          window = EntropyTracker.window(sid, tracker: tracker)

          length(window) == length(model) and score == expected and
            severity == severity_of(expected)
        end)
      end)

    assert :proper.quickcheck(property, [:quiet, numtests: 300]) == true
  end

  defp severity_of(s) when s < 0.25, do: :loop
  defp severity_of(s) when s < 0.5, do: :warning
  defp severity_of(_), do: :normal
end
