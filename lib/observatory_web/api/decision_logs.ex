defmodule ObservatoryWeb.API.DecisionLogs do
  @moduledoc """
  `POST /api/v1/decision_logs`: one envelope (`application/json`) or many, one per
  line (`application/x-ndjson`).

  One envelope: `200` with the gateway's answer, `400` for malformed JSON, `422` with
  its violations. Many: `200` when any line was accepted, `422` when none was; blank
  lines are skipped. Also: `401` without a valid agent key, `413` over the body limit,
  `415` for another content type.

  Ingest is idempotent (`Observatory.Gateway.Idempotency`): a step sent again — same
  session, `meta.step_id` and body — is answered with its first answer, marked
  `"replayed": true` and, for one envelope, the header `Idempotent-Replayed: true`;
  it is not counted again. A step id already used with a different body is refused:
  `409 step_conflict` (a rejected line in a batch). While the first delivery is still
  being scored, a retry gets `503 step_in_progress` with `Retry-After: 1`. A batch's
  answer counts its replayed lines in `replayed` (they are also `accepted`).

  The key's agent acts only as itself (issue 13): an envelope whose `meta.agent_id`
  is another agent, or whose session the gateway has recorded for another agent, is
  refused — `403 forbidden` alone, a rejected line in a batch — and touches nothing.

  Error answers and logs are capped, so a body of bad lines cannot be turned into a
  much bigger answer or log (issue 13, finding 4): an envelope's answer lists its
  first 20 violations (`violation_count` has them all); a batch lists every
  accepted line and the first 20 rejected ones (`rejected` counts them all,
  `omitted` those not listed), and logs the first 3 rejected lines and one summary.
  """

  alias Observatory.Gateway.SchemaInterceptor
  alias ObservatoryWeb.{Auth, Conn}

  require Logger

  @ndjson ["application/x-ndjson", "application/jsonl", "application/x-jsonlines"]

  # Caps on what one request can make the server say (answer) and write (log).
  @max_violations 20
  @max_rejected_lines 20
  @max_logged_lines 3

  def create(conn) do
    with {:ok, agent} <- Auth.require_agent(conn),
         {:ok, kind} <- kind(conn),
         {:ok, body} <- body(conn) do
      case kind do
        :single -> single(conn, body, agent)
        :batch -> batch(conn, body, agent)
      end
    end
  end

  defp single(conn, body, agent) do
    case SchemaInterceptor.ingest(body, agent: agent, envelope: false) do
      {:ok, %{replayed: true} = result} ->
        Conn.json(conn, 200, answer(result), [{"Idempotent-Replayed", "true"}])

      {:ok, result} ->
        Conn.json(conn, 200, answer(result))

      {:error, {:conflict, violation}} ->
        Conn.error(conn, 409, "step_conflict", "step " <> violation.reason, %{
          violations: [violation]
        })

      {:error, {:in_progress, violation}} ->
        Conn.error(
          conn,
          503,
          "step_in_progress",
          "step " <> violation.reason,
          %{violations: [violation]},
          [{"Retry-After", "1"}]
        )

      {:error, {:forbidden, violation}} ->
        Conn.error(
          conn,
          403,
          "forbidden",
          "an agent key sends only its own agent's steps, in its own sessions",
          %{violations: [violation]}
        )

      {:error, {:unavailable, violation}} ->
        Conn.error(conn, 503, "owner_unavailable", violation.reason, %{violations: [violation]})

      {:error, {:invalid, [%{path: "$", reason: "invalid JSON" <> _} | _] = violations}} ->
        Conn.error(conn, 400, "malformed_json", "the body is not valid JSON", capped(violations))

      {:error, {:invalid, violations}} ->
        Conn.error(
          conn,
          422,
          "invalid_decision_log",
          "the DecisionLog has #{length(violations)} problem(s)",
          capped(violations)
        )
    end
  end

  defp capped(violations) do
    %{
      violations: Enum.take(violations, @max_violations),
      violation_count: length(violations)
    }
  end

  defp batch(conn, body, agent) do
    {results, rejected} =
      body
      |> String.split("\n")
      |> Enum.with_index(1)
      |> Enum.reduce({[], []}, fn {line, number}, {results, rejected} ->
        if String.trim(line) == "" do
          {results, rejected}
        else
          case SchemaInterceptor.ingest(line, log_violations: false, agent: agent, envelope: false) do
            {:ok, result} -> {[Map.put(answer(result), :line, number) | results], rejected}
            {:error, {:invalid, violations}} -> {results, [{number, violations} | rejected]}
            {:error, {_refused, violation}} -> {results, [{number, [violation]} | rejected]}
          end
        end
      end)

    rejected = Enum.reverse(rejected)
    log_rejected(rejected, length(results) + length(rejected))

    listed =
      for {number, violations} <- Enum.take(rejected, @max_rejected_lines) do
        Map.merge(%{line: number, accepted: false}, capped(violations))
      end

    accepted = length(results)
    status = if accepted > 0 or rejected == [], do: 200, else: 422

    Conn.json(conn, status, %{
      accepted: accepted,
      replayed: Enum.count(results, & &1.replayed),
      rejected: length(rejected),
      omitted: max(length(rejected) - @max_rejected_lines, 0),
      results: Enum.sort_by(Enum.reverse(results) ++ listed, & &1.line)
    })
  end

  # One log entry per rejected line for the first few, then one summary.
  defp log_rejected([], _lines), do: :ok

  defp log_rejected(rejected, lines) do
    for {number, violations} <- Enum.take(rejected, @max_logged_lines) do
      Logger.warning(
        "schema_violation: DecisionLog rejected (batch line #{number}): " <>
          Enum.map_join(Enum.take(violations, 5), "; ", &"#{&1.path} #{&1.reason}"),
        event: :schema_violation
      )
    end

    if length(rejected) > @max_logged_lines do
      Logger.warning(
        "schema_violation: #{length(rejected)} of #{lines} batch lines rejected; " <>
          "the first #{@max_logged_lines} are logged above",
        event: :schema_violation
      )
    end

    :ok
  end

  defp answer(result) do
    %{
      accepted: true,
      step_id: result.step_id,
      session_id: result.session_id,
      entropy_score: result.entropy_score,
      severity: result.severity,
      paused: result.paused,
      verdict: result.verdict,
      step: result.step,
      directives: result.directives,
      replayed: result.replayed
    }
  end

  defp kind(conn) do
    case Conn.content_type(conn) do
      "application/json" ->
        {:ok, :single}

      type when type in @ndjson ->
        {:ok, :batch}

      other ->
        Conn.error(
          conn,
          415,
          "unsupported_media_type",
          "send application/json or application/x-ndjson, not #{inspect(other)}"
        )

        :halt
    end
  end

  defp body(conn) do
    with {:error, :too_large} <- Conn.read_body(conn) do
      Conn.error(conn, 413, "body_too_large", "the body exceeds #{Conn.max_body_bytes()} bytes")
      :halt
    end
  end
end
