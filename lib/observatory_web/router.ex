defmodule ObservatoryWeb.Router do
  @moduledoc """
  Routes each request to its handler. Every handler answers; anything that raises
  becomes a JSON 500 and is logged, and the server keeps serving.

  | method | path | auth | handler |
  |---|---|---|---|
  | POST | /api/v1/decision_logs | agent key | `ObservatoryWeb.API.DecisionLogs` |
  | GET | /api/v1/sessions | operator | `ObservatoryWeb.API.SessionList` |
  | GET | /api/v1/sessions/:id | agent key or operator | `ObservatoryWeb.API.Sessions` |
  | GET | /api/v1/sessions/:id/steps/:step | agent key or operator | `ObservatoryWeb.API.Sessions` |
  | POST | /api/v1/sessions/:id/pause | operator | `ObservatoryWeb.API.Sessions` |
  | POST | /api/v1/sessions/:id/resume | operator | `ObservatoryWeb.API.Sessions` |
  | POST | /api/v1/sessions/:id/step_detector/reset | operator | `ObservatoryWeb.API.Sessions` |
  | GET | /api/v1/hitl/audit | operator | `ObservatoryWeb.API.Sessions` |
  | POST | /api/v1/tool_calls/check | agent key | `ObservatoryWeb.API.ToolCalls` |
  | GET | / | operator sign-in (cookie) | `ObservatoryWeb.Dashboard.Page` |
  | GET | /agents, /agents/:id | operator sign-in (cookie) | `ObservatoryWeb.Dashboard.Page` |
  | GET, POST | /login | CSRF token | `ObservatoryWeb.Dashboard.Login` |
  | POST | /logout | sign-in + CSRF token | `ObservatoryWeb.Dashboard.Login` |
  | GET | /dashboard/events | sign-in | `ObservatoryWeb.Dashboard.EventStream` (SSE) |
  | POST | /dashboard/events | sign-in + CSRF token | `ObservatoryWeb.Dashboard.EventStream` |
  | GET | /assets/{dashboard.js,dashboard.css,manager.css} | none | `ObservatoryWeb.Dashboard.Assets` |
  | POST | /v1/chat/completions | agent key | `ObservatoryWeb.API.ChatCompletions` |
  | POST | /v1/responses | agent key | `ObservatoryWeb.API.Responses` |
  | POST | /v1/messages | agent key | `ObservatoryWeb.API.Messages` |
  | POST | /v1/messages/count_tokens | agent key | `ObservatoryWeb.API.PassThrough` |
  | GET | /v1/models, /v1/models/:id | agent key | `ObservatoryWeb.API.PassThrough` |
  | GET | /api/v1/agents | operator | `ObservatoryWeb.API.Agents` |
  | GET | /api/v1/agents/:id | operator | `ObservatoryWeb.API.Agents` |
  | PUT | /api/v1/agents/:id/kill_switch | operator | `ObservatoryWeb.API.Agents` |
  | PUT | /api/v1/agents/:id/guidance | operator | `ObservatoryWeb.API.Agents` |
  | GET, PUT | /api/v1/agents/:id/budget | operator | `ObservatoryWeb.API.Agents` |
  | POST | /api/v1/agents/:id/budget/reset | operator | `ObservatoryWeb.API.Agents` |
  | GET | /api/v1/notifications/sinks | operator | `ObservatoryWeb.API.Notifications` |
  | PUT, DELETE | /api/v1/notifications/sinks/:name | operator | `ObservatoryWeb.API.Notifications` |
  | POST | /api/v1/notifications/sinks/:name/test | operator | `ObservatoryWeb.API.Notifications` |
  | POST | /api/v1/agents/:id/activate | operator | `ObservatoryWeb.API.Agents` |
  | POST | /api/v1/agents/:id/deactivate | operator | `ObservatoryWeb.API.Agents` |
  | DELETE | /api/v1/agents/:id | operator | `ObservatoryWeb.API.Agents` |
  | GET, POST | /api/v1/agents/:id/keys | operator | `ObservatoryWeb.API.Agents` |
  | POST | /api/v1/agents/:id/keys/rotate | operator | `ObservatoryWeb.API.Agents` |
  | DELETE | /api/v1/agents/:id/keys/:key_id | operator | `ObservatoryWeb.API.Agents` |
  | GET | /healthz | none | `Observatory.Health`: 200, or 503 when a dependency is down or a cluster node cannot reach a majority |
  | GET | /metrics | none | Prometheus text |
  """

  require Logger

  @agent_actions ["kill_switch", "activate", "deactivate", "keys", "guidance", "budget"]

  alias ObservatoryWeb.API.{
    Agents,
    ChatCompletions,
    DecisionLogs,
    Messages,
    Notifications,
    PassThrough,
    Responses,
    SessionList,
    Sessions,
    ToolCalls
  }

  alias ObservatoryWeb.{Auth, AuthThrottle, Conn}
  alias ObservatoryWeb.Dashboard.{Assets, EventStream, Login, Page}

  # A failed request's log entry is cut here: an exception can carry a client's data.
  @max_log_bytes 4096

  @doc false
  # A request to Observatory's own server (ObservatoryWeb.Endpoint): every route.
  def call(req), do: serve(Conn.new(ObservatoryWeb.Conn.MochiWeb, req), :all)

  @typedoc """
  Which routes a server answers: `:all` (Observatory's own server), or one API a host
  mounts — `:agents_api` (`/api/v1/…`: steps, tool-call checks, sessions, operator
  routes) or `:llm_proxy` (`/v1/…`: the LLM proxy).
  """
  @type api :: :all | :agents_api | :llm_proxy

  @doc """
  Answers `conn` with the routes of `api`; a path of another API is `404`. The same
  checks come first, whatever the server: a request that cannot be read is `400`, a
  locked-out client's credentials `429`.
  """
  @spec serve(Conn.t(), api()) :: :ok | :halt
  def serve(conn, api) do
    try do
      cond do
        conn.bad_request -> refuse(conn)
        conn.not_implemented -> not_implemented(conn)
        throttled = throttled(conn) -> too_many_attempts(conn, throttled)
        api == :all or api(conn.path_info) == api -> route(conn, conn.method, conn.path_info)
        true -> Conn.error(conn, 404, "not_found", "no such route")
      end
    rescue
      # A write the cluster could not take now (replicas being reconciled): nothing
      # was written, and the client is told to retry.
      exception in Observatory.Cluster.Unavailable ->
        Conn.send_resp(
          conn,
          503,
          "application/json",
          Observatory.JSON.encode!(%{error: "cluster_unavailable", message: exception.message}),
          [{"Retry-After", "1"}, {"Cache-Control", "no-store"}]
        )

      exception ->
        message =
          "#{conn.method} /#{Enum.join(conn.path_info, "/")} failed: " <>
            Exception.format(:error, exception, __STACKTRACE__)

        Logger.error(truncate(message, @max_log_bytes))
        Conn.error(conn, 500, "internal_error", "the request failed; see the server log")
    end
  end

  @doc "Whether `path_info` is one of `api`'s routes (with any method)."
  @spec route?(api(), [String.t()]) :: boolean()
  def route?(api, path_info),
    do: known_path?(path_info) and (api == :all or api(path_info) == api)

  # The API a path belongs to; the dashboard, its assets, /healthz and /metrics are
  # Observatory's own server's only.
  defp api(["api", "v1" | _]), do: :agents_api
  defp api(["v1" | _]), do: :llm_proxy
  defp api(_path), do: :gateway

  # A request we cannot read is answered and its connection closed: MochiWeb would
  # otherwise parse its Content-Length to decide about keep-alive, and crash.
  defp refuse(conn) do
    Conn.close_after(conn)
    Conn.error(conn, 400, "bad_request", conn.bad_request)
  end

  # A body in a transfer coding we cannot read: refused before it is read, and the
  # connection closed (its unread body is no next request).
  defp not_implemented(conn) do
    Process.put(:mochiweb_request_force_close, true)
    Conn.error(conn, 501, "not_implemented", conn.not_implemented)
  end

  # A locked-out client's wrong credentials are answered 429 here; its valid ones go
  # on to their handler, whatever the client's failures (AuthThrottle). The sign-in
  # form's token is in its body: `Login` applies the same rule.
  defp throttled(conn) do
    with true <- Auth.credential?(conn),
         {:error, retry_after_s} <- AuthThrottle.check(conn.remote_ip),
         false <- Auth.valid_credential?(conn) do
      retry_after_s
    else
      _ -> nil
    end
  end

  defp too_many_attempts(conn, retry_after_s) do
    body = %{
      error: "too_many_attempts",
      message: "too many failed credentials from this client; retry in #{retry_after_s} s"
    }

    Conn.send_resp(conn, 429, "application/json", Observatory.JSON.encode!(body), [
      {"Retry-After", Integer.to_string(retry_after_s)},
      {"Cache-Control", "no-store"}
    ])
  end

  @doc "`text` cut to at most `max` bytes (on a character boundary), marked when cut."
  @spec truncate(String.t(), pos_integer()) :: String.t()
  def truncate(text, max) when byte_size(text) <= max, do: text

  def truncate(text, max) do
    cut = text |> binary_part(0, max) |> String.chunk(:valid) |> Enum.filter(&String.valid?/1)
    IO.iodata_to_binary([cut, " … (#{byte_size(text)} bytes, cut)"])
  end

  defp route(conn, "POST", ["api", "v1", "decision_logs"]), do: DecisionLogs.create(conn)
  defp route(conn, "GET", ["api", "v1", "sessions"]), do: SessionList.index(conn)
  defp route(conn, "GET", ["api", "v1", "sessions", id]), do: Sessions.show(conn, id)

  defp route(conn, "GET", ["api", "v1", "sessions", id, "steps", step]),
    do: Sessions.step(conn, id, step)

  defp route(conn, "POST", ["api", "v1", "sessions", id, "pause"]), do: Sessions.pause(conn, id)
  defp route(conn, "POST", ["api", "v1", "sessions", id, "resume"]), do: Sessions.resume(conn, id)
  defp route(conn, "GET", ["api", "v1", "hitl", "audit"]), do: Sessions.audit(conn)

  defp route(conn, "POST", ["api", "v1", "sessions", id, "step_detector", "reset"]),
    do: Sessions.reset_step_detector(conn, id)

  defp route(conn, "POST", ["api", "v1", "tool_calls", "check"]), do: ToolCalls.check(conn)
  defp route(conn, "GET", []), do: Page.show(conn)
  defp route(conn, "GET", ["agents"]), do: Page.show(conn, "agents")
  defp route(conn, "GET", ["agents", id]), do: Page.show(conn, "agent", %{"agent_id" => id})
  defp route(conn, "GET", ["login"]), do: Login.new(conn)
  defp route(conn, "POST", ["login"]), do: Login.create(conn)
  defp route(conn, "POST", ["logout"]), do: Login.delete(conn)
  defp route(conn, "GET", ["dashboard", "events"]), do: EventStream.stream(conn)
  defp route(conn, "POST", ["dashboard", "events"]), do: EventStream.dispatch(conn)
  defp route(conn, "GET", ["assets", name]), do: Assets.serve(conn, name)

  defp route(conn, "POST", ["v1", "chat", "completions"]), do: ChatCompletions.create(conn)
  defp route(conn, "POST", ["v1", "messages"]), do: Messages.create(conn)
  defp route(conn, "POST", ["v1", "responses"]), do: Responses.create(conn)
  defp route(conn, "POST", ["v1", "messages", "count_tokens"]), do: PassThrough.count_tokens(conn)
  defp route(conn, "GET", ["v1", "models"]), do: PassThrough.models(conn)
  defp route(conn, "GET", ["v1", "models", id]), do: PassThrough.models(conn, id)
  defp route(conn, "GET", ["api", "v1", "agents"]), do: Agents.index(conn)
  defp route(conn, "GET", ["api", "v1", "agents", id]), do: Agents.show(conn, id)

  defp route(conn, "PUT", ["api", "v1", "agents", id, "kill_switch"]),
    do: Agents.configure(conn, id)

  defp route(conn, "PUT", ["api", "v1", "agents", id, "guidance"]), do: Agents.guidance(conn, id)
  defp route(conn, "GET", ["api", "v1", "agents", id, "budget"]), do: Agents.budget(conn, id)

  defp route(conn, "PUT", ["api", "v1", "agents", id, "budget"]),
    do: Agents.configure_budget(conn, id)

  defp route(conn, "POST", ["api", "v1", "agents", id, "budget", "reset"]),
    do: Agents.reset_budget(conn, id)

  defp route(conn, "GET", ["api", "v1", "notifications", "sinks"]), do: Notifications.index(conn)

  defp route(conn, "PUT", ["api", "v1", "notifications", "sinks", name]),
    do: Notifications.put(conn, name)

  defp route(conn, "DELETE", ["api", "v1", "notifications", "sinks", name]),
    do: Notifications.delete(conn, name)

  defp route(conn, "POST", ["api", "v1", "notifications", "sinks", name, "test"]),
    do: Notifications.test(conn, name)

  defp route(conn, "POST", ["api", "v1", "agents", id, "activate"]), do: Agents.activate(conn, id)

  defp route(conn, "POST", ["api", "v1", "agents", id, "deactivate"]),
    do: Agents.deactivate(conn, id)

  defp route(conn, "DELETE", ["api", "v1", "agents", id]), do: Agents.delete(conn, id)
  defp route(conn, "GET", ["api", "v1", "agents", id, "keys"]), do: Agents.keys(conn, id)
  defp route(conn, "POST", ["api", "v1", "agents", id, "keys"]), do: Agents.issue_key(conn, id)

  defp route(conn, "POST", ["api", "v1", "agents", id, "keys", "rotate"]),
    do: Agents.rotate_key(conn, id)

  defp route(conn, "DELETE", ["api", "v1", "agents", id, "keys", key_id]),
    do: Agents.revoke_key(conn, id, key_id)

  # In a cluster the body says how this node sees it: who it runs with, whom it
  # cannot reach, and (without a majority) what it refuses.
  defp route(conn, "GET", ["healthz"]) do
    cluster = Observatory.Health.cluster()

    case Observatory.Health.check() do
      {:ok, checks} ->
        sessions = Observatory.Gateway.EntropyTracker.session_count()

        Conn.json(
          conn,
          200,
          Map.merge(%{status: "ok", checks: checks, sessions: sessions}, cluster)
        )

      {:error, checks} ->
        Conn.json(conn, 503, Map.merge(%{status: "degraded", checks: checks}, cluster))
    end
  end

  defp route(conn, "GET", ["metrics"]) do
    Conn.text(conn, 200, Observatory.Metrics.render(), "text/plain; version=0.0.4")
  end

  defp route(conn, method, path) do
    if known_path?(path),
      do: Conn.error(conn, 405, "method_not_allowed", "#{method} is not allowed here"),
      else: Conn.error(conn, 404, "not_found", "no such route")
  end

  defp known_path?(["api", "v1", "decision_logs"]), do: true
  defp known_path?(["api", "v1", "sessions" | _]), do: true
  defp known_path?(["api", "v1", "tool_calls", "check"]), do: true
  defp known_path?([]), do: true
  defp known_path?(["agents"]), do: true
  defp known_path?(["agents", _]), do: true
  defp known_path?([page]) when page in ["login", "logout"], do: true
  defp known_path?(["dashboard", "events"]), do: true
  defp known_path?(["v1", "chat", "completions"]), do: true
  defp known_path?(["v1", "responses"]), do: true
  defp known_path?(["v1", "messages"]), do: true
  defp known_path?(["v1", "messages", "count_tokens"]), do: true
  defp known_path?(["v1", "models"]), do: true
  defp known_path?(["v1", "models", _id]), do: true
  defp known_path?(["api", "v1", "hitl", "audit"]), do: true

  defp known_path?(["api", "v1", "agents" | rest]),
    do:
      match?([], rest) or match?([_], rest) or match?([_, a] when a in @agent_actions, rest) or
        match?([_, "keys", _], rest) or match?([_, "budget", "reset"], rest)

  defp known_path?(["api", "v1", "notifications", "sinks" | rest]),
    do: match?([], rest) or match?([_], rest) or match?([_, "test"], rest)

  defp known_path?(["healthz"]), do: true
  defp known_path?(["metrics"]), do: true
  defp known_path?(_), do: false
end
