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
  | GET | /healthz | none | `ObservatoryWeb.API.Health`: 200, or 503 when a dependency is down or a cluster node cannot reach a majority |
  | GET | /metrics | none | `ObservatoryWeb.API.Health`: Prometheus text |
  """

  require Logger

  alias ObservatoryWeb.API.{
    Agents,
    ChatCompletions,
    DecisionLogs,
    Health,
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

  # Each route once: the request dispatch below is generated from this table, and
  # `routes/0` returns it (the OpenAPI description's test checks it against the table).
  # `{method, path, {module, function}}`: `:name` segments are passed to the function
  # after the conn, in order.
  @routes [
    {"POST", "/api/v1/decision_logs", {DecisionLogs, :create}},
    {"GET", "/api/v1/sessions", {SessionList, :index}},
    {"GET", "/api/v1/sessions/:id", {Sessions, :show}},
    {"GET", "/api/v1/sessions/:id/steps/:step", {Sessions, :step}},
    {"POST", "/api/v1/sessions/:id/pause", {Sessions, :pause}},
    {"POST", "/api/v1/sessions/:id/resume", {Sessions, :resume}},
    {"POST", "/api/v1/sessions/:id/step_detector/reset", {Sessions, :reset_step_detector}},
    {"GET", "/api/v1/hitl/audit", {Sessions, :audit}},
    {"POST", "/api/v1/tool_calls/check", {ToolCalls, :check}},
    {"GET", "/", {Page, :cluster}},
    {"GET", "/agents", {Page, :agents}},
    {"GET", "/agents/:id", {Page, :agent}},
    {"GET", "/login", {Login, :new}},
    {"POST", "/login", {Login, :create}},
    {"POST", "/logout", {Login, :delete}},
    {"GET", "/dashboard/events", {EventStream, :stream}},
    {"POST", "/dashboard/events", {EventStream, :dispatch}},
    {"GET", "/assets/:name", {Assets, :serve}},
    {"POST", "/v1/chat/completions", {ChatCompletions, :create}},
    {"POST", "/v1/messages", {Messages, :create}},
    {"POST", "/v1/responses", {Responses, :create}},
    {"POST", "/v1/messages/count_tokens", {PassThrough, :count_tokens}},
    {"GET", "/v1/models", {PassThrough, :models}},
    {"GET", "/v1/models/:id", {PassThrough, :models}},
    {"GET", "/api/v1/agents", {Agents, :index}},
    {"GET", "/api/v1/agents/:id", {Agents, :show}},
    {"PUT", "/api/v1/agents/:id/kill_switch", {Agents, :configure}},
    {"PUT", "/api/v1/agents/:id/guidance", {Agents, :guidance}},
    {"GET", "/api/v1/agents/:id/budget", {Agents, :budget}},
    {"PUT", "/api/v1/agents/:id/budget", {Agents, :configure_budget}},
    {"POST", "/api/v1/agents/:id/budget/reset", {Agents, :reset_budget}},
    {"GET", "/api/v1/notifications/sinks", {Notifications, :index}},
    {"PUT", "/api/v1/notifications/sinks/:name", {Notifications, :put}},
    {"DELETE", "/api/v1/notifications/sinks/:name", {Notifications, :delete}},
    {"POST", "/api/v1/notifications/sinks/:name/test", {Notifications, :test}},
    {"POST", "/api/v1/agents/:id/activate", {Agents, :activate}},
    {"POST", "/api/v1/agents/:id/deactivate", {Agents, :deactivate}},
    {"DELETE", "/api/v1/agents/:id", {Agents, :delete}},
    {"GET", "/api/v1/agents/:id/keys", {Agents, :keys}},
    {"POST", "/api/v1/agents/:id/keys", {Agents, :issue_key}},
    {"POST", "/api/v1/agents/:id/keys/rotate", {Agents, :rotate_key}},
    {"DELETE", "/api/v1/agents/:id/keys/:key_id", {Agents, :revoke_key}},
    {"GET", "/healthz", {Health, :show}},
    {"GET", "/metrics", {Health, :metrics}}
  ]

  @doc """
  Every route served: `{method, path}` with `:name` for a path parameter, in the
  order they are matched.
  """
  @spec routes() :: [{String.t(), String.t()}]
  def routes, do: for({method, path, _handler} <- @routes, do: {method, path})

  # A path as a match pattern: literal segments, and a variable per `:name`.
  segments = fn path ->
    for segment <- String.split(path, "/", trim: true) do
      case segment do
        ":" <> name -> Macro.var(String.to_atom(name), __MODULE__)
        literal -> literal
      end
    end
  end

  for {method, path, {module, function}} <- @routes do
    pattern = segments.(path)
    params = Enum.reject(pattern, &is_binary/1)

    defp route(conn, unquote(method), unquote(pattern)),
      do: unquote(module).unquote(function)(conn, unquote_splicing(params))
  end

  defp route(conn, method, path) do
    if known_path?(path),
      do: Conn.error(conn, 405, "method_not_allowed", "#{method} is not allowed here"),
      else: Conn.error(conn, 404, "not_found", "no such route")
  end

  # A path some route serves, with another method: 405 rather than 404.
  any = Macro.var(:_, nil)

  for pattern <-
        @routes
        |> Enum.map(fn {_, path, _} ->
          Enum.map(segments.(path), &if(is_binary(&1), do: &1, else: any))
        end)
        |> Enum.uniq() do
    defp known_path?(unquote(pattern)), do: true
  end

  defp known_path?(_), do: false
end
