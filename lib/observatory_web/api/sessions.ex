defmodule ObservatoryWeb.API.Sessions do
  @moduledoc """
  Session state and the HITL commands (design.md §5).

    * `GET /api/v1/sessions/:id` — window, score, severity, loop verdict, pause, the
      alert, the recent steps (arguments and results cut), the explanation of the
      verdict and of the entropy window (`Observatory.Gateway.Evidence`), and what the
      session spent through the proxy (`usage`: requests, tokens, cost, and since its
      first loop alarm; `Observatory.Budget.session_usage/1`); operator, or the agent
      key of the session's own agent; `owner_node` names the cluster node that holds
      the session;
    * `GET /api/v1/sessions/:id/steps/:step` — one stored step whole: its envelope as
      the gateway stored it and its texts uncut (same access);
    * `POST /api/v1/sessions/:id/pause` and `/resume` — operator token; optional JSON body
      `{"reason": "..."}`; `409` when already paused / not paused; a resume on a
      cluster node cut off from the majority is `503 no_majority`;
    * `POST /api/v1/sessions/:id/step_detector/reset` — lift a step-detector block (operator);
    * `GET /api/v1/hitl/audit?session_id=&limit=` — the audit log (operator).
  """

  alias Observatory.Gateway.{
    Alerts,
    EntropyTracker,
    Evidence,
    HITL,
    LoopVerdict,
    SessionLog,
    StepDetector
  }

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
          owner_unavailable(conn)
      end
    end
  end

  @doc "GET /api/v1/sessions/:id/steps/:step"
  def step(conn, id, step) do
    with {:ok, principal} <- authorize(conn, &Auth.agent_or_operator/1) do
      case {Integer.parse(step), Cluster.call_owner(id, __MODULE__, :lookup_step, [id, step])} do
        {{n, ""}, {:ok, {session, found}}} when n > 0 and found != nil ->
          if readable?(principal, session),
            do: Conn.json(conn, 200, found),
            else: Conn.error(conn, 404, "not_found", "no such step")

        {_, {:error, :owner_unavailable}} ->
          Conn.error(
            conn,
            503,
            "owner_unavailable",
            "the session's owner in the gateway cluster did not answer in time; retry"
          )

        _ ->
          Conn.error(
            conn,
            404,
            "not_found",
            "no such step: the gateway keeps a session's last " <>
              "#{SessionLog.size()} steps"
          )
      end
    end
  end

  @doc false
  # On the owner: the tracker's session and the step, whole; nil when not stored.
  def lookup_step(id, step) do
    session = EntropyTracker.session(id)

    found =
      with {n, ""} when n > 0 <- Integer.parse(step),
           %{} = stored <- SessionLog.step(id, n) do
        [text] = Evidence.steps([stored], full: [n])

        %{
          session_id: id,
          step: n,
          received_at: DateTime.to_iso8601(text.at),
          call: text.call,
          arguments: text.arguments,
          result: text.result,
          envelope: stored.envelope
        }
      else
        _ -> nil
      end

    {session, found}
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

  # Pauses and resumes are replicated writes: made by the node that got the request,
  # enforced by every node, whatever the session's owner does (a frozen owner cannot
  # hold them, and nothing is run twice).
  def pause(conn, id), do: command(conn, id, &HITL.pause/2)
  def resume(conn, id), do: command(conn, id, &HITL.resume/2)

  # The step detector's streaks live on the session's owner: the reset runs there,
  # once, or is answered 503 when the owner does not answer in time.
  def reset_step_detector(conn, id) do
    with {:ok, operator} <- authorize(conn, &Auth.operator/1) do
      case Cluster.call_owner(id, StepDetector, :reset, [id, [operator: operator]]) do
        {:ok, :ok} ->
          state = Cluster.on_owner(id, StepDetector, :state, [id])
          Conn.json(conn, 200, %{session_id: id, step_detector: state})

        {:ok, {:error, :unknown_session}} ->
          Conn.error(conn, 404, "not_found", "the step detector has no state for this session")

        {:ok, {:error, :no_majority}} ->
          Conn.no_majority(conn)

        {:error, :owner_unavailable} ->
          owner_unavailable(conn)
      end
    end
  end

  defp owner_unavailable(conn) do
    Conn.error(
      conn,
      503,
      "owner_unavailable",
      "the session's owner in the gateway cluster did not answer in time; retry"
    )
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
    window = (session && session.window) || []
    verdict = LoopVerdict.session(id)
    stored = SessionLog.steps(id)
    evidence = MapSet.new((verdict && verdict.evidence) || [])
    numbered = Evidence.window_numbers(window, stored)
    in_window = MapSet.new(numbered, &elem(&1, 0))

    %{
      session_id: id,
      agent_id: session && session.agent_id,
      window:
        for {n, {intent, tool_call, status}} <- numbered do
          %{step: n, intent: intent, tool_call: tool_call, action_status: status}
        end,
      entropy_score: session && session.score,
      severity: session && session.severity,
      verdict: verdict,
      alert: alert(Alerts.get(id)),
      paused: pause != nil,
      pause: pause && entry(pause),
      step_detector: StepDetector.state(id),
      messages: SessionLog.count(id),
      usage: Observatory.Budget.session_usage(id),
      steps:
        for step <- Evidence.steps(stored, result_bytes: 2_000, arguments_bytes: 1_000) do
          step
          |> Map.drop([:number, :at])
          |> Map.merge(%{
            step: step.number,
            received_at: DateTime.to_iso8601(step.at),
            evidence: MapSet.member?(evidence, step.number),
            in_entropy_window: MapSet.member?(in_window, step.number)
          })
        end,
      explanation: %{
        verdict: Evidence.explain_verdict(verdict, stored),
        entropy_window: Evidence.explain_window(window, stored)
      },
      # The cluster node that holds the session's state and scores its steps.
      owner_node: node()
    }
  end

  defp alert(nil), do: nil

  defp alert(alert) do
    alert
    |> Map.take([:source, :rule, :reason, :evidence, :alerts])
    |> Map.merge(%{
      since: DateTime.to_iso8601(alert.since),
      last_alert_at: DateTime.to_iso8601(alert.last_at)
    })
  end

  defp command(conn, id, fun) do
    with {:ok, operator} <- authorize(conn, &Auth.operator/1),
         {:ok, reason} <- reason(conn) do
      case fun.(id, operator: operator, reason: reason) do
        {:ok, entry} ->
          Conn.json(conn, 200, %{session_id: id, paused: HITL.paused?(id), audit: entry(entry)})

        {:error, :no_majority} ->
          Conn.no_majority(conn)

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

  # The message names what the route takes: an agent whose own key is refused a pause
  # is told an operator token is needed, not that its key is invalid.
  defp authorize(conn, check) do
    with {:error, :unauthorized} <- check.(conn) do
      needed =
        if check == (&Auth.operator/1),
          do: "an operator token",
          else: "the session's agent key or an operator token"

      halt(Conn.error(conn, 401, "unauthorized", "send #{needed}: Authorization: Bearer <token>"))
    end
  end

  defp halt(:ok), do: :halt

  defp entry(entry), do: %{entry | at: DateTime.to_iso8601(entry.at)}

  defp elem_or({n, ""}, _default) when n > 0, do: n
  defp elem_or(_, default), do: default
end
