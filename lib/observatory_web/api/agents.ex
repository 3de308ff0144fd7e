defmodule ObservatoryWeb.API.Agents do
  @moduledoc """
  The operator API for agents and their kill switch (seed 003). Operator token
  required on every route.

    * `GET /api/v1/agents` — `{"agents": [agent]}`, sorted by id;
    * `GET /api/v1/agents/:id` — the agent, its window's current `score` and its
      latest `events` (newest first, `?events=N`, default 20, at most 1000); `404`;
    * `PUT /api/v1/agents/:id/kill_switch` — any of `enabled`, `window_size` (2..1000),
      `threshold` (> 0), `mode` (`enforce`, `warn`, `shadow`), `notification_webhook`
      (URL or null); registers the agent if it is new; `422` with every violation; the
      answer carries `warnings` (alert notifications not configured, a threshold the
      window can never exceed);
    * `PUT /api/v1/agents/:id/guidance` — `{"enabled": true | false | null}` (null: the
      configured default): guidance notes for the agent's looping sessions
      (`Observatory.Proxy.Guidance`); `404`, `422`;
    * `GET /api/v1/agents/:id/budget` — the budget's settings and what the agent spent:
      in total, within its window, per recent session (`?sessions=N`, default 20, at
      most 200); `404`;
    * `PUT /api/v1/agents/:id/budget` — any of `mode`, `session_requests`,
      `session_tokens`, `session_cost_usd`, `window_seconds`, `window_requests`,
      `window_tokens`, `window_cost_usd` (`Observatory.Budget.Settings`); `404`, `422`;
    * `POST /api/v1/agents/:id/budget/reset` — forgets what was spent: `{"session_id":
      "..."}` for a session, an empty body for the agent's rolling window; `404`, `403`
      (a session of another agent);
    * `POST /api/v1/agents/:id/activate`, `POST /api/v1/agents/:id/deactivate` —
      optional body `{"reason": "..."}`; `404` unknown agent, `409` already so;
    * `DELETE /api/v1/agents/:id` — deletes the agent, its events and its keys; `404`;
    * `POST /api/v1/agents/:id/keys` — issues a key (registering the agent if new):
      `201` with the key, shown this once; `409` at `:max_agents` or 10 keys;
    * `GET /api/v1/agents/:id/keys` — the agent's keys (ids and dates, never the keys);
    * `POST /api/v1/agents/:id/keys/rotate` — a new key, every other key revoked; `404`;
    * `DELETE /api/v1/agents/:id/keys/:key_id` — revokes one key; `404`.

  An agent as JSON:

      {"agent_id": "agent-7", "active": false, "deactivated_by": "kill_switch",
       "deactivated_at": "2026-02-22T10:30:00.000000Z",
       "status": "deactivated_by_kill_switch", "status_label": "Deactivated by Kill Switch",
       "kill_switch": {"enabled": true, "window_size": 5, "threshold": 5.5, "mode": "enforce",
                       "max_score": 18.0},
       "guidance": {"setting": "default", "enabled": false},
       "budget": {"mode": "enforce", "session_tokens": 2000000, "window_seconds": 3600, …},
       "notification_webhook": "https://hooks.slack.com/…Xk4q",
       "notification_webhook_unreadable": false, "notifications_configured": true,
       "score": {"score": 7.5, "similar_prompts": 3, "similar_responses": 0,
                 "repeated_tool_calls": 3, "window_len": 4, "window_size": 5},
       "created_at": "...", "updated_at": "..."}

  `status_label` is what the dashboard shows: "Deactivated by Kill Switch" when the
  switch stopped the agent, "Inactive" when an operator did, "Active" otherwise.
  A webhook URL is its own credential: it is shown back redacted (its origin and last
  four characters, `Observatory.KillSwitch.WebhookURL.redact/1`), in events too, and
  stored sealed; `notification_webhook_unreadable` is true when it was sealed under
  another key (the `:secret_key_base` changed) and must be set again.
  `score` is null while the switch is off (no window).
  """

  alias Observatory.{AgentKeys, Budget, JSON}
  alias Observatory.KillSwitch
  alias Observatory.Proxy.Guidance
  alias Observatory.KillSwitch.{Settings, WebhookURL}
  alias ObservatoryWeb.{Auth, Conn}

  def index(conn) do
    with {:ok, _} <- authorize(conn) do
      Conn.json(conn, 200, %{agents: Enum.map(KillSwitch.agents(), &view/1)})
    end
  end

  def show(conn, id) do
    with {:ok, _} <- authorize(conn),
         {:ok, agent} <- fetch(conn, id) do
      limit = events_limit(conn.query["events"])
      events = KillSwitch.events(agent_id: id, limit: limit)

      Conn.json(
        conn,
        200,
        Map.put(view(agent), :events, Enum.map(events, &KillSwitch.event_json/1))
      )
    end
  end

  def configure(conn, id) do
    with {:ok, operator} <- authorize(conn),
         {:ok, params} <- json_object(conn) do
      case KillSwitch.configure(id, params, operator: operator) do
        {:ok, agent} ->
          Conn.json(conn, 200, Map.put(view(agent), :warnings, warnings(agent)))

        {:error, {:invalid, violations}} ->
          Conn.error(
            conn,
            422,
            "invalid_settings",
            Enum.map_join(violations, "; ", &"#{&1.path} #{&1.reason}"),
            %{violations: violations}
          )

        {:error, :invalid_agent_id} ->
          Conn.error(conn, 400, "invalid_agent_id", "an agent id is 1 to 256 bytes of UTF-8")

        {:error, :agent_limit} ->
          Conn.error(conn, 409, "agent_limit_reached", "no more agents can be registered")

        {:error, :no_majority} ->
          Conn.no_majority(conn)
      end
    end
  end

  def guidance(conn, id) do
    with {:ok, operator} <- authorize(conn),
         {:ok, params} <- json_object(conn) do
      case params do
        %{"enabled" => setting} when setting in [true, false, nil] and map_size(params) == 1 ->
          case Guidance.configure(id, setting, operator: operator) do
            {:ok, agent} -> Conn.json(conn, 200, view(agent))
            {:error, :not_found} -> Conn.error(conn, 404, "not_found", "no such agent")
            {:error, :no_majority} -> Conn.no_majority(conn)
          end

        _ ->
          Conn.error(conn, 422, "invalid_settings", ~s(send {"enabled": true | false | null}))
      end
    end
  end

  def budget(conn, id) do
    with {:ok, _} <- authorize(conn),
         {:ok, agent} <- fetch(conn, id) do
      sessions = limit(conn.query["sessions"], 20, 200)
      usage = Budget.agent_usage(agent, sessions: sessions)

      Conn.json(
        conn,
        200,
        Map.merge(%{agent_id: id, budget: Budget.settings_json(agent.budget)}, usage)
      )
    end
  end

  def configure_budget(conn, id) do
    with {:ok, operator} <- authorize(conn),
         {:ok, params} <- json_object(conn) do
      case Budget.configure(id, params, operator: operator) do
        {:ok, agent} ->
          Conn.json(conn, 200, view(agent))

        {:error, {:invalid, violations}} ->
          Conn.error(
            conn,
            422,
            "invalid_settings",
            Enum.map_join(violations, "; ", &"#{&1.path} #{&1.reason}"),
            %{violations: violations}
          )

        {:error, :not_found} ->
          Conn.error(conn, 404, "not_found", "no such agent")

        {:error, :no_majority} ->
          Conn.no_majority(conn)
      end
    end
  end

  def reset_budget(conn, id) do
    with {:ok, operator} <- authorize(conn),
         {:ok, params} <- json_object(conn, allow_empty: true) do
      case params do
        %{"session_id" => session} when is_binary(session) ->
          reset(conn, id, session_id: session, operator: operator)

        params when map_size(params) == 0 ->
          reset(conn, id, operator: operator)

        _ ->
          Conn.error(conn, 400, "bad_request", ~s(send {"session_id": "..."} or an empty body))
      end
    end
  end

  defp reset(conn, id, opts) do
    case Budget.reset(id, opts) do
      {:ok, details} ->
        Conn.json(conn, 200, Map.put(details, :agent_id, id))

      {:error, :not_found} ->
        Conn.error(conn, 404, "not_found", "no such agent")

      {:error, :not_this_agent} ->
        Conn.error(conn, 403, "forbidden", "the session belongs to another agent")

      {:error, :no_majority} ->
        Conn.no_majority(conn)
    end
  end

  defp limit(nil, default, _max), do: default

  defp limit(text, default, max) do
    case Integer.parse(text) do
      {n, ""} when n > 0 -> min(n, max)
      _ -> default
    end
  end

  def delete(conn, id) do
    with {:ok, operator} <- authorize(conn) do
      case KillSwitch.delete(id, operator: operator) do
        {:ok, revoked} ->
          Conn.json(conn, 200, %{agent_id: id, deleted: true, revoked_keys: revoked})

        {:error, :not_found} ->
          Conn.error(conn, 404, "not_found", "no such agent")
      end
    end
  end

  def issue_key(conn, id) do
    with {:ok, operator} <- authorize(conn) do
      case AgentKeys.issue(id, operator: operator) do
        {:ok, issued} ->
          Conn.json(conn, 201, key_json(issued))

        {:error, :invalid_agent_id} ->
          Conn.error(conn, 400, "invalid_agent_id", "an agent id is 1 to 256 bytes of UTF-8")

        {:error, :agent_limit} ->
          Conn.error(conn, 409, "agent_limit_reached", "no more agents can be registered")

        {:error, :not_found} ->
          Conn.error(conn, 404, "not_found", "the agent was deleted meanwhile")

        {:error, :too_many_keys} ->
          Conn.error(
            conn,
            409,
            "too_many_keys",
            "the agent holds #{AgentKeys.max_keys_per_agent()} keys; revoke one first"
          )

        {:error, :no_majority} ->
          Conn.no_majority(conn)
      end
    end
  end

  def rotate_key(conn, id) do
    with {:ok, operator} <- authorize(conn) do
      case AgentKeys.rotate(id, operator: operator) do
        {:ok, issued} -> Conn.json(conn, 201, key_json(issued))
        {:error, :no_majority} -> Conn.no_majority(conn)
        {:error, _} -> Conn.error(conn, 404, "not_found", "no such agent")
      end
    end
  end

  def keys(conn, id) do
    with {:ok, _} <- authorize(conn),
         {:ok, _agent} <- fetch(conn, id) do
      keys =
        for info <- AgentKeys.list(id) do
          %{
            key_id: info.key_id,
            created_at: DateTime.to_iso8601(info.created_at),
            seeded: info.seeded
          }
        end

      Conn.json(conn, 200, %{agent_id: id, keys: keys})
    end
  end

  def revoke_key(conn, id, key_id) do
    with {:ok, operator} <- authorize(conn) do
      case AgentKeys.revoke(id, key_id, operator: operator) do
        :ok -> Conn.json(conn, 200, %{agent_id: id, key_id: key_id, revoked: true})
        {:error, :not_found} -> Conn.error(conn, 404, "not_found", "no such key for this agent")
      end
    end
  end

  # The only answer that ever carries a key in clear.
  defp key_json(issued) do
    %{
      agent_id: issued.agent_id,
      key_id: issued.key_id,
      key: issued.key,
      created_at: DateTime.to_iso8601(issued.created_at),
      revoked: Map.get(issued, :revoked, [])
    }
  end

  def activate(conn, id), do: command(conn, id, &KillSwitch.activate/2)
  def deactivate(conn, id), do: command(conn, id, &KillSwitch.deactivate/2)

  @doc "An agent as JSON-ready data (see the module doc)."
  @spec view(map()) :: map()
  def view(agent) do
    ks = agent.kill_switch

    %{
      agent_id: agent.id,
      active: agent.active,
      deactivated_by: agent.deactivated_by,
      deactivated_at: agent.deactivated_at && DateTime.to_iso8601(agent.deactivated_at),
      status: status(agent),
      status_label: status_label(agent),
      kill_switch: %{
        enabled: ks.enabled,
        window_size: ks.window_size,
        threshold: ks.threshold,
        mode: Atom.to_string(Map.get(ks, :mode, :enforce)),
        max_score: Settings.max_score(ks.window_size)
      },
      guidance: %{
        setting:
          case agent.guidance do
            true -> "on"
            false -> "off"
            nil -> "default"
          end,
        enabled: Guidance.enabled?(agent)
      },
      budget: Budget.settings_json(agent.budget),
      notification_webhook: WebhookURL.redact(agent.notification_webhook),
      notification_webhook_unreadable: agent[:notification_webhook_unreadable] == true,
      notifications_configured: KillSwitch.notifications_configured?(agent),
      score: score(agent),
      created_at: DateTime.to_iso8601(agent.created_at),
      updated_at: DateTime.to_iso8601(agent.updated_at)
    }
  end

  @doc """
  An agent's status: `"active"`, `"deactivated_by_kill_switch"` (inactive, stopped by
  the kill switch) or `"inactive"` (deactivated by an operator, or for no recorded
  reason).
  """
  @spec status(map()) :: String.t()
  def status(%{active: true}), do: "active"
  def status(%{deactivated_by: :kill_switch}), do: "deactivated_by_kill_switch"
  def status(_), do: "inactive"

  @doc """
  What the dashboard shows for an agent's status (seed 003, "Display deactivation
  reason in dashboard"): "Active", "Deactivated by Kill Switch", or the standard
  "Inactive" when `deactivated_by` is `:manual` or nil.
  """
  @spec status_label(map()) :: String.t()
  def status_label(%{active: true}), do: "Active"
  def status_label(%{deactivated_by: :kill_switch}), do: "Deactivated by Kill Switch"
  def status_label(_), do: "Inactive"

  defp score(%{kill_switch: %{enabled: false}}), do: nil

  defp score(agent) do
    case KillSwitch.status(agent.id) do
      nil -> nil
      status -> status.signals |> Map.merge(Map.delete(status, :signals))
    end
  end

  defp warnings(%{kill_switch: %{enabled: false}}), do: []

  defp warnings(agent) do
    notifications =
      if KillSwitch.notifications_configured?(agent),
        do: [],
        else: [
          %{
            code: "notifications_not_configured",
            message:
              "No alert notification is configured: set notification_webhook so someone " <>
                "hears when the kill switch stops this agent."
          }
        ]

    %{window_size: size, threshold: threshold} = agent.kill_switch
    max = Settings.max_score(size)

    unreachable =
      if threshold >= max,
        do: [
          %{
            code: "threshold_unreachable",
            message:
              "A window of #{size} scores at most #{max}: a threshold of #{threshold} " <>
                "is never exceeded."
          }
        ],
        else: []

    notifications ++ unreachable
  end

  defp command(conn, id, fun) do
    with {:ok, operator} <- authorize(conn),
         {:ok, params} <- json_object(conn, allow_empty: true),
         {:ok, reason} <- reason(conn, params) do
      case fun.(id, operator: operator, reason: reason) do
        {:ok, agent} ->
          Conn.json(conn, 200, view(agent))

        {:error, :not_found} ->
          Conn.error(conn, 404, "not_found", "no such agent")

        {:error, :already_active} ->
          Conn.error(conn, 409, "already_active", "the agent is already active")

        {:error, :already_inactive} ->
          Conn.error(conn, 409, "already_inactive", "the agent is already inactive")

        {:error, :no_majority} ->
          Conn.no_majority(conn)
      end
    end
  end

  defp reason(_conn, %{"reason" => reason}) when is_binary(reason), do: {:ok, reason}
  defp reason(_conn, params) when not is_map_key(params, "reason"), do: {:ok, ""}

  defp reason(conn, _params),
    do: halt(Conn.error(conn, 400, "bad_request", ~s(send {"reason": "..."} or an empty body)))

  defp fetch(conn, id) do
    case KillSwitch.agent(id) do
      nil -> halt(Conn.error(conn, 404, "not_found", "no such agent"))
      agent -> {:ok, agent}
    end
  end

  defp json_object(conn, opts \\ []) do
    case Conn.read_body(conn) do
      {:ok, ""} ->
        if opts[:allow_empty],
          do: {:ok, %{}},
          else: halt(Conn.error(conn, 400, "bad_request", "send a JSON object"))

      {:ok, body} ->
        case JSON.decode(body) do
          {:ok, map} when is_map(map) ->
            {:ok, map}

          {:ok, _} ->
            halt(Conn.error(conn, 400, "bad_request", "send a JSON object"))

          {:error, message} ->
            halt(
              Conn.error(conn, 400, "malformed_json", "the body is not valid JSON: #{message}")
            )
        end

      {:error, :too_large} ->
        halt(Conn.error(conn, 413, "body_too_large", "the body is too large"))
    end
  end

  defp authorize(conn) do
    with {:error, :unauthorized} <- Auth.operator(conn) do
      halt(
        Conn.error(
          conn,
          401,
          "unauthorized",
          "send an operator token: Authorization: Bearer <token>"
        )
      )
    end
  end

  defp events_limit(nil), do: 20

  defp events_limit(text) do
    case Integer.parse(text) do
      {n, ""} when n > 0 -> min(n, 1000)
      _ -> 20
    end
  end

  defp halt(:ok), do: :halt
end
