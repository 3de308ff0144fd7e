defmodule Observatory.Gateway.SchemaInterceptor do
  @moduledoc """
  The gateway's ingest path for one DecisionLog (ADR-015, FR-9.8, FR-9.9):

    1. validate the envelope (`Observatory.Gateway.DecisionLog`); an invalid message is
       rejected with every violation, logged as a `schema_violation`, and never reaches
       the tracker;
    2. call `EntropyTracker.record_and_score/3` synchronously, in the caller's process;
    3. overwrite `cognition.entropy_score` with the gateway's score (the agent's value
       is kept nowhere in the outbound message); if the tracker returns an error, keep
       the agent's value and log a `schema_violation` noting the failed computation;
    4. store the envelope (`SessionLog`) and broadcast it on `"gateway:decision_logs"`;
    5. feed the step detector (seed 002) when the step has a result;
    6. answer with the score, the severity, the step verdict and the directives for the
       agent — `pause` when an operator has paused the session (design.md §5), `warn`
       or `block` with guidance from the step detector.

      {:ok, result} = SchemaInterceptor.ingest(json)
      result.entropy_score  #=> 0.2
      result.directives     #=> [%{"type" => "pause", ...}] when paused
  """

  require Logger

  alias Observatory.Gateway.{DecisionLog, EntropyTracker, Events, HITL, SessionLog, StepDetector}
  alias Observatory.Metrics

  @type result :: %{
          step_id: String.t(),
          session_id: String.t(),
          agent_id: String.t(),
          entropy_score: number() | nil,
          severity: EntropyTracker.severity() | nil,
          paused: boolean(),
          step: StepDetector.verdict() | nil,
          directives: [map()],
          envelope: map()
        }

  @doc """
  Ingests one envelope, given as JSON text or as a map.

  Returns `{:ok, result}` or `{:error, {:invalid, violations}}`.

  ## Options
    * `:tracker` — the `EntropyTracker` to score with (default: the application's).
  """
  @spec ingest(binary() | map(), keyword()) ::
          {:ok, result()} | {:error, {:invalid, [DecisionLog.violation()]}}
  def ingest(message, opts \\ []) do
    started = System.monotonic_time(:microsecond)

    parsed =
      if is_binary(message), do: DecisionLog.parse(message), else: DecisionLog.from_map(message)

    result =
      case parsed do
        {:ok, envelope, fields} -> {:ok, accept(envelope, fields, opts)}
        {:error, violations} -> reject(violations)
      end

    Metrics.observe_latency(System.monotonic_time(:microsecond) - started)
    result
  end

  defp accept(envelope, fields, opts) do
    Metrics.inc(:messages)
    tuple = {fields.intent, fields.tool_call, fields.status}

    tracker_opts = [
      agent_id: fields.agent_id,
      tracker: Keyword.get(opts, :tracker, EntropyTracker)
    ]

    {envelope, score, severity} =
      case EntropyTracker.record_and_score(fields.session_id, tuple, tracker_opts) do
        {:ok, score, severity} ->
          Metrics.inc(severity)
          {put_in(envelope, ["cognition", "entropy_score"], score), score, severity}

        {:error, reason} ->
          Metrics.inc(:entropy_errors)

          Logger.warning(
            "schema_violation: entropy computation failed for session #{inspect(fields.session_id)} " <>
              "step #{inspect(fields.step_id)}: #{inspect(reason)}; the agent's entropy_score is kept",
            event: :schema_violation
          )

          {envelope, get_in(envelope, ["cognition", "entropy_score"]), nil}
      end

    step = analyze_step(fields)
    pause = HITL.pause_of(fields.session_id)
    SessionLog.put(fields.session_id, envelope)

    Events.broadcast(Events.decision_logs(), %{
      event_type: "decision_log",
      session_id: fields.session_id,
      agent_id: fields.agent_id,
      step_id: fields.step_id,
      severity: severity,
      envelope: envelope
    })

    %{
      step_id: fields.step_id,
      session_id: fields.session_id,
      agent_id: fields.agent_id,
      entropy_score: score,
      severity: severity,
      paused: pause != nil,
      step: step,
      directives: directives(pause) ++ step_directives(step),
      envelope: envelope
    }
  end

  # Layer 1 of seed 002; a step without a result has no outcome and is not analysed.
  defp analyze_step(%{outcome: nil}), do: nil

  defp analyze_step(fields) do
    case StepDetector.analyze(fields.session_id, fields.approach, fields.outcome) do
      {:ok, verdict} -> verdict
      {:error, _} -> nil
    end
  end

  defp step_directives(%{action: :warn} = step) do
    Metrics.inc(:step_warnings)
    [%{"type" => "warn", "source" => "step_detector", "guidance" => step.guidance}]
  end

  defp step_directives(%{action: :block} = step) do
    Metrics.inc(:step_blocks)
    [%{"type" => "block", "source" => "step_detector", "guidance" => step.guidance}]
  end

  defp step_directives(_), do: []

  defp reject(violations) do
    Metrics.inc(:violations)

    Logger.warning(
      "schema_violation: DecisionLog rejected: " <>
        Enum.map_join(violations, "; ", &"#{&1.path} #{&1.reason}"),
      event: :schema_violation
    )

    {:error, {:invalid, violations}}
  end

  defp directives(nil), do: []

  defp directives(pause) do
    [
      %{
        "type" => "pause",
        "reason" => pause.reason,
        "operator" => pause.operator,
        "since" => DateTime.to_iso8601(pause.at)
      }
    ]
  end
end
