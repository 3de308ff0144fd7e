defmodule Observatory.Bench.ReferenceDetectors do
  @moduledoc false
  # Two well-known agent loop detectors, re-implemented plainly over a session's flat
  # step records (maps with "tool_call", "tool_input", "action_status" or "status",
  # "result", as in a replay JSONL line), as baselines for bench/real_runs.exs. Each
  # returns the 0-based index of the step at which it would first alarm, or nil.
  #
  # What both compare:
  #   * an action is {tool_call, tool_input}; tool_input as decoded JSON compared with
  #     ===, which is canonical-JSON equality (key order ignored, 1 and 1.0 differ,
  #     strings exactly as recorded);
  #   * an observation is the step's result: the text as recorded (a non-string result
  #     compared as decoded JSON, like the input). Nothing is normalised: OpenHands'
  #     "ignore the pid" special cases (below) are not modelled;
  #   * an error is action_status failure, error or timeout.

  @errors ["failure", "error", "timeout"]

  @doc """
  OpenHands-style stuck detector, after OpenHands' `openhands/controller/stuck.py`
  (`StuckDetector.is_stuck`), checked after every step over the steps up to it:

    1. the same action with the same observation 4 times in a row
       (`_is_stuck_repeating_action_observation`);
    2. the same action 3 times in a row, each ending in an error
       (`_is_stuck_repeating_action_error`, where an error is an `ErrorObservation`);
    3. the last 6 steps alternate between two (action, observation) pairs,
       A B A B A B (`_is_stuck_action_observation_pattern`).

  Left out: the monologue, context-window and empty-response scenarios (they look at
  agent messages and condensation events, which flat step records do not have), the
  IPython SyntaxError special case, and `_eq_no_pid`'s special cases (a shell
  observation compared by command and exit code only; edits compared by their first 3
  lines): here an observation is its result text.
  """
  def openhands_stuck(steps) do
    first_alarm(steps, [], fn step, recent ->
      recent = Enum.take([openhands_event(step) | recent], 6)
      {stuck?(recent), recent}
    end)
  end

  @doc """
  Gemini-CLI-style detector, after gemini-cli's
  `packages/core/src/services/loopDetectionService.ts` (`checkToolCallLoop`): the
  identical tool call (name and arguments) `TOOL_CALL_LOOP_THRESHOLD` = 5 times in a
  row. Gemini CLI keys a call by `name:JSON.stringify(args)` (key order as sent);
  here the arguments are compared as canonical JSON. Its content-chanting and
  LLM-judged checks need the model's streamed text and are left out.
  """
  def gemini_identical_calls(steps, threshold \\ 5) do
    first_alarm(steps, {nil, 0}, fn step, {last, count} ->
      action = action(step)
      count = if count > 0 and action === last, do: count + 1, else: 1
      {count >= threshold, {action, count}}
    end)
  end

  # The index of the first step for which `check` says true, threading its state.
  defp first_alarm(steps, state, check) do
    steps
    |> Enum.with_index()
    |> Enum.reduce_while(state, fn {step, index}, state ->
      case check.(step, state) do
        {true, _state} -> {:halt, {:alarm, index}}
        {false, state} -> {:cont, state}
      end
    end)
    |> case do
      {:alarm, index} -> index
      _state -> nil
    end
  end

  # `recent` is newest first.
  defp stuck?(recent),
    do: repeating_pair?(recent) or repeating_error?(recent) or alternating?(recent)

  defp repeating_pair?([{a, o, _} | _] = recent) do
    last4 = Enum.take(recent, 4)
    length(last4) == 4 and Enum.all?(last4, fn {a2, o2, _} -> a2 === a and o2 === o end)
  end

  defp repeating_error?([{a, _, _} | _] = recent) do
    last3 = Enum.take(recent, 3)
    length(last3) == 3 and Enum.all?(last3, fn {a2, _, error?} -> a2 === a and error? end)
  end

  defp alternating?([e0, e1, e2, e3, e4, e5]),
    do: same?(e0, e2) and same?(e0, e4) and same?(e1, e3) and same?(e1, e5)

  defp alternating?(_recent), do: false

  defp same?({a, o, _}, {a2, o2, _}), do: a === a2 and o === o2

  defp openhands_event(step),
    do: {action(step), Map.get(step, "result"), status(step) in @errors}

  defp action(step), do: {Map.get(step, "tool_call"), Map.get(step, "tool_input")}

  defp status(step), do: Map.get(step, "action_status") || Map.get(step, "status")
end
