defmodule ObservatoryWeb.API.ToolCalls do
  @moduledoc """
  `POST /api/v1/tool_calls/check` — the circuit breaker for an MCP proxy (seed 002,
  layer 2). Body: `{"session_id": "...", "tool": "...", "arguments": {...}}`.

  `200` with `{"decision": "allow", "count": n}` or
  `{"decision": "deny", "reason": "...", "count": n, "retry_after_ms": ms}`; for an
  inactive agent (the kill switch or an operator deactivated it) every call is
  `{"decision": "deny", "code": "agent_inactive", "reason": "..."}`, not counted, until
  an operator activates it;
  `422` for a body without a session id or tool; `403` for a session the gateway has
  recorded for another agent than the key's; `503 owner_unavailable` in a cluster when
  the session's owner does not answer in time.
  """

  alias Observatory.Gateway.CallBreaker
  alias Observatory.{JSON, KillSwitch}
  alias ObservatoryWeb.{Auth, Conn}

  def check(conn) do
    with {:ok, agent} <- Auth.agent(conn) |> or_401(conn),
         {:ok, body} <- Conn.read_body(conn) |> or_413(conn),
         {:ok, session_id, tool, arguments} <- parse(body) |> or_422(conn),
         :ok <- own_session(conn, agent, session_id),
         :ok <- active(conn, agent) do
      # The breaker's counts live on the session's owner (issue 14), per agent.
      case Observatory.Cluster.call_owner(session_id, CallBreaker, :check, [
             agent,
             session_id,
             tool,
             arguments
           ]) do
        {:ok, {:allow, count}} ->
          Conn.json(conn, 200, %{decision: "allow", count: count})

        {:ok, {:deny, count, retry_after}} ->
          Conn.json(conn, 200, %{
            decision: "deny",
            reason:
              "#{count} identical calls of #{tool} within the breaker window; retry in #{retry_after} ms",
            count: count,
            retry_after_ms: retry_after
          })

        {:ok, {:error, reason}} ->
          Conn.error(conn, 422, "invalid_arguments", reason)

        {:error, :owner_unavailable} ->
          owner_unavailable(conn)
      end
    end
  end

  # An agent checks calls in its own sessions only: another agent's breaker is not
  # its to fill. Whose session it is is asked of its owner, and no answer is no yes.
  defp own_session(conn, agent, session_id) do
    case Auth.session_access(agent, session_id) do
      :ok ->
        :ok

      {:error, :forbidden} ->
        halt(Conn.error(conn, 403, "forbidden", "the session belongs to another agent"))

      {:error, :owner_unavailable} ->
        halt(owner_unavailable(conn))
    end
  end

  # The kill switch holds here too: an agent that checks its calls before it runs
  # them (an MCP proxy) runs none while it is inactive.
  defp active(_conn, :any_agent), do: :ok

  defp active(conn, agent) do
    if KillSwitch.active?(agent) do
      :ok
    else
      halt(
        Conn.json(conn, 200, %{
          decision: "deny",
          code: "agent_inactive",
          reason: "Agent #{agent} is inactive; an operator activates it again"
        })
      )
    end
  end

  defp owner_unavailable(conn),
    do:
      Conn.error(
        conn,
        503,
        "owner_unavailable",
        "the session's owner in the gateway cluster did not answer in time; retry"
      )

  defp parse(body) do
    case JSON.decode(body) do
      {:ok, %{"session_id" => sid, "tool" => tool} = call}
      when is_binary(sid) and byte_size(sid) in 1..256 and is_binary(tool) and
             byte_size(tool) in 1..1024 ->
        {:ok, sid, tool, Map.get(call, "arguments")}

      {:ok, _} ->
        {:error, ~s(send {"session_id": string, "tool": string, "arguments": any})}

      {:error, reason} ->
        {:error, "invalid JSON: #{reason}"}
    end
  end

  defp or_401({:ok, _} = ok, _conn), do: ok

  defp or_401(_, conn),
    do:
      halt(
        Conn.error(
          conn,
          401,
          "unauthorized",
          "send a valid agent key: Authorization: Bearer <key>"
        )
      )

  defp or_413({:ok, _} = ok, _conn), do: ok
  defp or_413(_, conn), do: halt(Conn.error(conn, 413, "body_too_large", "the body is too large"))

  defp or_422({:error, message}, conn),
    do: halt(Conn.error(conn, 422, "invalid_request", message))

  defp or_422(ok, _conn), do: ok

  defp halt(:ok), do: :halt
end
