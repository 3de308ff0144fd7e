defmodule ObservatoryWeb.API.Sessions do
  @moduledoc """
  Session state and the HITL commands (design.md §5).

    * `GET /api/v1/sessions/:id` — window, score, severity, loop verdict, pause, and what
      the session spent through the proxy (`usage`: requests, tokens, cost, and since
      its first loop alarm; `Observatory.Budget.session_usage/1`) (operator, or the
      agent key of the session's own agent);
    * `POST /api/v1/sessions/:id/pause` and `/resume` — operator token; optional JSON body
      `{"reason": "..."}`; `409` when already paused / not paused;
    * `POST /api/v1/sessions/:id/step_detector/reset` — lift a step-detector block (operator);
    * `GET /api/v1/hitl/audit?session_id=&limit=` — the audit log (operator).
  """

  alias Observatory.Gateway.{EntropyTracker, HITL, LoopVerdict, SessionLog, StepDetector}
  alias Observatory.{Cluster, JSON}
  alias ObservatoryWeb.{Auth, Conn}

  def show(conn, id) do
    with {:ok, principal} <- authorize(conn, &Auth.agent_or_operator/1) do
      # In a cluster (issue 14) the session's state is on its owner: read it there,
      # and only there (a local read would not know whose session it is).
      case Cluster.call_owner(id, __MODULE__, :lookup, [id]) do
        {:ok, {session, view}} when view != nil ->
          if readable?(principal, session),
            do: Conn.json(conn, 200, view),
            else: Conn.error(conn, 404, "not_found", "no such session")

        {:ok, {_session, nil}} ->
          Conn.error(conn, 404, "not_found", "no such session")

        {:error, :owner_unavailable} ->
          Conn.error(
            conn,
            503,
            "owner_unavailable",
            "the session's owner in the gateway cluster did not answer in time; retry"
          )
      end
    end
  end

  @doc false
  # The tracker's session and the session's view; no view when nothing knows it.
  def lookup(id) do
    session = EntropyTracker.session(id)
    pause = HITL.pause_of(id)

    unknown? =
      session == nil and pause == nil and StepDetector.state(id) == nil and
        LoopVerdict.session(id) == nil and Observatory.Budget.Store.session_meta(id) == nil

    {session, if(not unknown?, do: view(id, session, pause))}
  end

  # An agent reads only its own sessions (the same 404 as for a session that does
  # not exist, so session ids cannot be probed); operators read every session.
  defp readable?({:operator, _}, _session), do: true
  defp readable?({:agent, :any_agent}, _session), do: true
  defp readable?({:agent, agent}, %{agent_id: agent}), do: true
  defp readable?({:agent, _agent}, _session), do: false

  # Commands run on the session's owner, which answers its steps (issue 14).
  def pause(conn, id), do: command(conn, id, &Cluster.on_owner(&1, HITL, :pause, [&1, &2]))
  def resume(conn, id), do: command(conn, id, &Cluster.on_owner(&1, HITL, :resume, [&1, &2]))

  def reset_step_detector(conn, id) do
    with {:ok, operator} <- authorize(conn, &Auth.operator/1) do
      case Cluster.on_owner(id, StepDetector, :reset, [id, [operator: operator]]) do
        :ok ->
          state = Cluster.on_owner(id, StepDetector, :state, [id])
          Conn.json(conn, 200, %{session_id: id, step_detector: state})

        {:error, :unknown_session} ->
          Conn.error(conn, 404, "not_found", "the step detector has no state for this session")
      end
    end
  end

  def audit(conn) do
    with {:ok, _} <- authorize(conn, &Auth.operator/1) do
      limit = conn.query |> Map.get("limit", "100") |> Integer.parse() |> elem_or(100)
      entries = HITL.audit_log(session_id: conn.query["session_id"], limit: min(limit, 1000))
      Conn.json(conn, 200, %{entries: Enum.map(entries, &entry/1)})
    end
  end

  @doc false
  def view(id, session, pause) do
    %{
      session_id: id,
      agent_id: session && session.agent_id,
      window:
        for {intent, tool_call, status} <- (session && session.window) || [] do
          %{intent: intent, tool_call: tool_call, action_status: status}
        end,
      entropy_score: session && session.score,
      severity: session && session.severity,
      verdict: LoopVerdict.session(id),
      paused: pause != nil,
      pause: pause && entry(pause),
      step_detector: StepDetector.state(id),
      messages: SessionLog.count(id),
      usage: Observatory.Budget.session_usage(id)
    }
  end

  defp command(conn, id, fun) do
    with {:ok, operator} <- authorize(conn, &Auth.operator/1),
         {:ok, reason} <- reason(conn) do
      case fun.(id, operator: operator, reason: reason) do
        {:ok, entry} ->
          paused = Cluster.on_owner(id, HITL, :paused?, [id])
          Conn.json(conn, 200, %{session_id: id, paused: paused, audit: entry(entry)})

        {:error, conflict} when conflict in [:already_paused, :not_paused] ->
          Conn.error(
            conn,
            409,
            Atom.to_string(conflict),
            "the session is #{if conflict == :already_paused, do: "already paused", else: "not paused"}"
          )

        {:error, other} ->
          Conn.error(conn, 422, Atom.to_string(other), "invalid command")
      end
    end
  end

  defp reason(conn) do
    case Conn.read_body(conn) do
      {:ok, ""} ->
        {:ok, ""}

      {:ok, body} ->
        case JSON.decode(body) do
          {:ok, %{"reason" => r}} when is_binary(r) ->
            {:ok, r}

          {:ok, map} when is_map(map) and not is_map_key(map, "reason") ->
            {:ok, ""}

          _ ->
            halt(
              Conn.error(conn, 400, "bad_request", ~s(send {"reason": "..."} or an empty body))
            )
        end

      {:error, :too_large} ->
        halt(Conn.error(conn, 413, "body_too_large", "the body is too large"))
    end
  end

  defp authorize(conn, check) do
    with {:error, :unauthorized} <- check.(conn) do
      halt(
        Conn.error(conn, 401, "unauthorized", "send a valid token: Authorization: Bearer <token>")
      )
    end
  end

  defp halt(:ok), do: :halt

  defp entry(entry), do: %{entry | at: DateTime.to_iso8601(entry.at)}

  defp elem_or({n, ""}, _default) when n > 0, do: n
  defp elem_or(_, default), do: default
end
