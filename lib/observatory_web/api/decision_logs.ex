defmodule ObservatoryWeb.API.DecisionLogs do
  @moduledoc """
  `POST /api/v1/decision_logs`: one envelope (`application/json`) or many, one per
  line (`application/x-ndjson`).

  One envelope: `200` with the gateway's answer, `400` for malformed JSON, `422` with
  every violation. Many: `200` with one result per line when any line was accepted,
  `422` when none was; blank lines are skipped. Also: `401` without a valid agent
  key, `413` over the body limit, `415` for another content type.
  """

  alias Observatory.Gateway.SchemaInterceptor
  alias ObservatoryWeb.{Auth, Conn}

  @ndjson ["application/x-ndjson", "application/jsonl", "application/x-jsonlines"]

  def create(conn) do
    with {:ok, _} <- auth(conn),
         {:ok, kind} <- kind(conn),
         {:ok, body} <- body(conn) do
      case kind do
        :single -> single(conn, body)
        :batch -> batch(conn, body)
      end
    end
  end

  defp single(conn, body) do
    case SchemaInterceptor.ingest(body) do
      {:ok, result} ->
        Conn.json(conn, 200, answer(result))

      {:error, {:invalid, [%{path: "$", reason: "invalid JSON" <> _} | _] = violations}} ->
        Conn.error(conn, 400, "malformed_json", "the body is not valid JSON", %{
          violations: violations
        })

      {:error, {:invalid, violations}} ->
        Conn.error(
          conn,
          422,
          "invalid_decision_log",
          "the DecisionLog has #{length(violations)} problem(s)",
          %{
            violations: violations
          }
        )
    end
  end

  defp batch(conn, body) do
    results =
      body
      |> String.split("\n")
      |> Enum.with_index(1)
      |> Enum.reject(fn {line, _} -> String.trim(line) == "" end)
      |> Enum.map(fn {line, number} ->
        case SchemaInterceptor.ingest(line) do
          {:ok, result} ->
            Map.put(answer(result), :line, number)

          {:error, {:invalid, violations}} ->
            %{line: number, accepted: false, violations: violations}
        end
      end)

    accepted = Enum.count(results, & &1.accepted)
    status = if accepted > 0 or results == [], do: 200, else: 422

    Conn.json(conn, status, %{
      accepted: accepted,
      rejected: length(results) - accepted,
      results: results
    })
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
      directives: result.directives
    }
  end

  defp auth(conn) do
    with {:error, :unauthorized} <- Auth.agent(conn) do
      Conn.error(conn, 401, "unauthorized", "send a valid agent key: Authorization: Bearer <key>")
      :halt
    end
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
