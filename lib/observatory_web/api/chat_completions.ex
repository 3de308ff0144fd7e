defmodule ObservatoryWeb.API.ChatCompletions do
  @moduledoc """
  `POST /v1/chat/completions`: an OpenAI-compatible proxy that enforces the kill
  switch (`Observatory.KillSwitch`) and forwards to `config :observatory,
  :llm_upstream`.

  The agent authenticates with its own agent key (`Authorization: Bearer <key>` or
  `X-Agent-Key`), which names it: `X-Agent-Id` is optional and, if sent, must be the
  key's agent (`403 agent_id_mismatch` otherwise). Agents are registered by operators
  (issuing a key), never by a request. Point an OpenAI SDK at
  `http://<observatory>/v1` with the agent key as its API key.

  Answers, all errors in OpenAI's shape `{"error": {"message", "type", "code"}}`:

  | status | when |
  |---|---|
  | upstream's | the upstream answered (its status and JSON body, unchanged) |
  | 400 `invalid_request_error` | body not a JSON object, `"stream": true`; with an insecure shared key, no or bad `X-Agent-Id` |
  | 401 `invalid_request_error` | no valid agent key |
  | 403 `agent_inactive` | the agent is inactive — deactivated by an operator or by the kill switch, the same answer for both; also the request that tripped the switch |
  | 403 `agent_id_mismatch` | `X-Agent-Id` names another agent than the key's |
  | 403 `unknown_agent` | the agent is not registered (deleted) |
  | 413, 415 | body over `:max_body_bytes`; not `application/json` |
  | 502 `upstream_error` | upstream down, timing out, or answering something that is not JSON (or, on success, not a chat completion) |

  When the kill switch is on, the answer carries `X-Observatory-Kill-Switch-Score`.
  """

  require Logger

  alias Observatory.{KillSwitch, Metrics}
  alias Observatory.KillSwitch.Upstream
  alias ObservatoryWeb.{Auth, Conn}

  def create(conn) do
    Metrics.inc(:proxy_requests)

    with {:ok, agent_id} <- authenticate(conn),
         :ok <- still_active(conn, agent_id),
         :ok <- json_content(conn),
         {:ok, body} <- body(conn),
         {:ok, request} <- fingerprint(conn, body),
         {:ok, verdict} <- admit(conn, agent_id, request),
         {:ok, response} <- forward(conn, body) do
      respond(conn, agent_id, verdict, response)
    end
  end

  @doc """
  The standard inactive-agent answer: the same whatever deactivated the agent
  (seed 003, "Use standard inactive response"), and not a 429.
  """
  @spec inactive_body(String.t()) :: map()
  def inactive_body(agent_id) do
    %{
      error: %{
        message: "Agent #{agent_id} is inactive",
        type: "agent_inactive",
        code: "agent_inactive",
        param: nil
      }
    }
  end

  # The agent is the key's (issue 13; `Auth.proxy_agent/1`).
  defp authenticate(conn) do
    case Auth.proxy_agent(conn) do
      {:ok, agent_id} -> {:ok, agent_id}
      {:error, {status, type, code, message}} -> error(conn, status, type, code, message)
    end
  end

  # Answer an inactive agent before reading its body.
  defp still_active(conn, agent_id) do
    if KillSwitch.active?(agent_id), do: :ok, else: inactive(conn, agent_id)
  end

  defp json_content(conn) do
    case Conn.content_type(conn) do
      "application/json" ->
        :ok

      other ->
        error(
          conn,
          415,
          "invalid_request_error",
          "unsupported_media_type",
          "send application/json, not #{inspect(other)}"
        )
    end
  end

  defp body(conn) do
    case Conn.read_body(conn) do
      {:ok, body} ->
        {:ok, body}

      {:error, :too_large} ->
        error(
          conn,
          413,
          "invalid_request_error",
          "body_too_large",
          "the body exceeds #{Conn.max_body_bytes()} bytes"
        )
    end
  end

  defp fingerprint(conn, body) do
    case KillSwitch.fingerprint_request(body) do
      {:ok, %{stream: true}} ->
        error(
          conn,
          400,
          "invalid_request_error",
          "stream_unsupported",
          "streaming is not supported by this proxy; send \"stream\": false"
        )

      {:ok, request} ->
        {:ok, request}

      {:error, {:invalid_json, message}} ->
        error(conn, 400, "invalid_request_error", "invalid_json", message)

      {:error, :not_an_object} ->
        error(
          conn,
          400,
          "invalid_request_error",
          "invalid_body",
          "the body must be a JSON object"
        )
    end
  end

  defp admit(conn, agent_id, request) do
    case KillSwitch.check_request(agent_id, request) do
      {:ok, verdict} ->
        {:ok, verdict}

      {:error, {:inactive, _agent}} ->
        inactive(conn, agent_id)

      {:error, :invalid_agent_id} ->
        invalid_agent_id(conn)

      {:error, :unknown_agent} ->
        error(
          conn,
          403,
          "unknown_agent",
          "unknown_agent",
          "no such agent is registered; an operator registers it by issuing its key"
        )
    end
  end

  defp forward(conn, body) do
    case Upstream.post(body) do
      {:ok, response} ->
        {:ok, response}

      {:error, message} ->
        upstream_error(conn, message)
    end
  end

  defp respond(conn, agent_id, verdict, %{status: status} = response) when status in 200..299 do
    case KillSwitch.fingerprint_response(response.body) do
      {:ok, hash} ->
        if verdict, do: KillSwitch.observe_response(agent_id, hash)
        pass_through(conn, verdict, response)

      {:error, {:invalid_json, _}} ->
        upstream_error(
          conn,
          "the LLM upstream answered HTTP #{status} with a body that is not JSON"
        )

      {:error, :not_a_completion} ->
        upstream_error(
          conn,
          "the LLM upstream answered HTTP #{status} with JSON that is not a chat completion"
        )
    end
  end

  # An upstream error in JSON (a 400 for a bad model name, a 429 rate limit) is the
  # agent's to see; anything else is a broken upstream.
  defp respond(conn, _agent_id, verdict, %{status: status} = response) do
    case Observatory.JSON.decode(response.body) do
      {:ok, _} ->
        pass_through(conn, verdict, response)

      {:error, _} ->
        upstream_error(
          conn,
          "the LLM upstream answered HTTP #{status} with a body that is not JSON"
        )
    end
  end

  defp pass_through(conn, verdict, response) do
    headers =
      [{"Cache-Control", "no-store"}] ++
        if verdict,
          do: [{"X-Observatory-Kill-Switch-Score", Float.to_string(verdict.score)}],
          else: []

    Conn.send_resp(conn, response.status, "application/json", response.body, headers)
  end

  defp invalid_agent_id(conn) do
    error(
      conn,
      400,
      "invalid_request_error",
      "invalid_agent_id",
      "X-Agent-Id must be 1 to 256 bytes of UTF-8 without control characters"
    )
  end

  defp inactive(conn, agent_id) do
    Metrics.inc(:proxy_inactive)
    Conn.json(conn, 403, inactive_body(agent_id))
    :halt
  end

  defp upstream_error(conn, message) do
    Metrics.inc(:upstream_errors)
    Logger.warning("chat completions proxy: #{message}")
    error(conn, 502, "upstream_error", "upstream_error", message)
  end

  defp error(conn, status, type, code, message) do
    Conn.json(conn, status, %{error: %{message: message, type: type, code: code, param: nil}})
    :halt
  end
end
