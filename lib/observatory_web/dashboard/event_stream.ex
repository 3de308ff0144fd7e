defmodule ObservatoryWeb.Dashboard.EventStream do
  @moduledoc """
  The live side of the dashboard: a Server-Sent Events stream per open page, and the
  endpoint its clicks are posted to. Together they host a page's core module — one
  written as LiveView callbacks that are plain functions (`mount/3`, `handle_info/2`,
  `handle_event/3`, `render/1`, and `events/0` listing the events it accepts) — the
  way LiveView would:

  | view | core module | page |
  |---|---|---|
  | `cluster` (default) | `ObservatoryWeb.SessionClusterManager` | `/` |
  | `agents` | `ObservatoryWeb.AgentList` | `/agents` |
  | `agent` | `ObservatoryWeb.AgentDetail` | `/agents/:agent_id` |

  ## `GET /dashboard/events?view=...` (signed-in operator, else `401`)

  The MochiWeb connection process becomes the page's process. It mounts the view's
  core module, connected (so it subscribes to its topics), with the other query
  parameters as its params (`?view=agent&agent_id=agent-7`), registers itself in
  `ObservatoryWeb.Dashboard.Pages` under a random page id, and answers with a chunked
  `text/event-stream`:

      retry: 1000
      event: mount
      data: {"page_id": "...", "html": "<div id=\\"scm\\" data-live-root ...>"}

      event: render
      data: {"html": "..."}

  Then it loops on `receive`: each message goes to `handle_info/2` (or
  `handle_event/3` for a click), the mailbox is drained so a burst costs one render,
  and the new HTML is pushed if it changed. A comment line goes out every 15 s as a
  heartbeat. When the browser goes away (the socket closes, or a write fails) the
  process exits normally and the registry forgets the page.

  After a gateway restart the browser's `EventSource` reconnects by itself; the new
  stream mounts afresh and its first event carries the full state.

  ## `POST /dashboard/events`

  JSON `{"page_id", "event", "params"}` with the CSRF token in `X-CSRF-Token`, or a
  form with `page_id`, `event`, `_csrf_token` and the params as the other fields.
  `401` without sign-in, `403` for a bad CSRF token, `400` for a malformed request,
  `404` when the page is gone (or is another operator's), `400` for an event the
  page's core module does not accept; otherwise the page process runs
  `handle_event/3`, pushes the re-render, and the answer is `204`.
  """

  require Logger

  alias Observatory.JSON
  alias ObservatoryWeb.Conn
  alias ObservatoryWeb.Dashboard.Session
  alias ObservatoryWeb.SessionClusterManager.Socket

  @registry ObservatoryWeb.Dashboard.Pages
  @heartbeat {__MODULE__, :heartbeat}
  @drain_max 500
  @event_timeout 5_000
  @views %{
    "cluster" => ObservatoryWeb.SessionClusterManager,
    "agents" => ObservatoryWeb.AgentList,
    "agent" => ObservatoryWeb.AgentDetail
  }

  @doc "The registry of open pages (started by the application)."
  def registry, do: @registry

  @doc "The core module of a view (see the table above)."
  @spec view(String.t()) :: {:ok, module()} | :error
  def view(name), do: Map.fetch(@views, name)

  @doc "The URL of a view's event stream, with its params."
  @spec stream_path(String.t(), map()) :: String.t()
  def stream_path("cluster", params) when params == %{}, do: "/dashboard/events"

  def stream_path(name, params),
    do: "/dashboard/events?" <> URI.encode_query(Map.put(params, "view", name))

  @doc "GET /dashboard/events"
  @spec stream(Conn.t()) :: :ok | no_return()
  def stream(conn) do
    {name, params} = Map.pop(conn.query, "view", "cluster")

    with {:ok, session} <- Session.fetch(conn),
         {:ok, module} <- view(name) do
      open(conn, session, module, params)
    else
      {:error, _} -> Conn.error(conn, 401, "unauthorized", "sign in at /login")
      :error -> Conn.error(conn, 404, "not_found", "no such view")
    end
  end

  @doc "POST /dashboard/events"
  @spec dispatch(Conn.t()) :: :ok
  def dispatch(conn) do
    with {:ok, session} <- authenticate(conn),
         {:ok, request} <- parse(conn),
         :ok <- check_csrf(conn, session, request),
         {:ok, pid, module} <- lookup(conn, request.page_id, session.operator),
         :ok <- check_event(conn, module, request.event) do
      deliver(conn, pid, request)
    end
  end

  ## The page process

  defp open(conn, session, module, params) do
    page_id = Session.random()
    {:ok, _} = Registry.register(@registry, page_id, {session.operator, module})

    {:ok, socket} =
      module.mount(params, %{"operator" => session.operator}, Socket.new(connected?: true))

    headers = [
      {"Cache-Control", "no-store"},
      {"X-Accel-Buffering", "no"} | Conn.security_headers()
    ]

    resp = :mochiweb_request.ok({"text/event-stream; charset=utf-8", headers, :chunked}, conn.req)
    watch_socket(conn.req)
    html = html(module, socket)
    write(resp, ["retry: 1000\n", event("mount", %{page_id: page_id, html: html})])
    schedule_heartbeat()

    loop(%{
      resp: resp,
      req: conn.req,
      module: module,
      socket: socket,
      html: html,
      session: session
    })
  end

  defp loop(state) do
    receive do
      message -> state |> handle(message) |> drain(@drain_max) |> push() |> loop()
    end
  end

  defp drain(state, 0), do: state

  defp drain(state, n) do
    receive do
      message -> state |> handle(message) |> drain(n - 1)
    after
      0 -> state
    end
  end

  defp handle(_state, {:tcp_closed, _}), do: exit(:normal)
  defp handle(_state, {:tcp_error, _, _}), do: exit(:normal)

  defp handle(state, {:tcp, _, _data}) do
    # Browsers send nothing on an event stream; keep watching for the close.
    watch_socket(state.req)
    state
  end

  # A stream opened before a sign-out (or expiry) ends at the next heartbeat.
  defp handle(state, @heartbeat) do
    unless Session.valid?(state.session), do: exit(:normal)
    write(state.resp, ": heartbeat\n\n")
    schedule_heartbeat()
    state
  end

  defp handle(state, {:dashboard_event, from, ref, event, params}) do
    {:noreply, socket} = state.module.handle_event(event, params, state.socket)
    # Push before answering, so the click's result is on its way when the POST returns.
    state = push(%{state | socket: socket})
    send(from, {ref, :ok})
    state
  end

  defp handle(state, message) do
    {:noreply, socket} = state.module.handle_info(message, state.socket)
    %{state | socket: socket}
  end

  defp push(state) do
    case html(state) do
      same when same == state.html ->
        state

      html ->
        write(state.resp, event("render", %{html: html}))
        %{state | html: html}
    end
  end

  defp html(%{module: module, socket: socket}), do: html(module, socket)
  defp html(module, socket), do: socket.assigns |> module.render() |> IO.iodata_to_binary()

  defp event(name, data), do: ["event: ", name, "\ndata: ", JSON.encode_lossy!(data), "\n\n"]

  # A failed write exits the process normally (MochiWeb's own behaviour).
  defp write(resp, data), do: :mochiweb_response.write_chunk(data, resp)

  defp watch_socket(req) do
    :mochiweb_socket.setopts(:mochiweb_request.get(:socket, req), active: :once)
  end

  defp schedule_heartbeat do
    Process.send_after(
      self(),
      @heartbeat,
      Application.get_env(:observatory, :dashboard_heartbeat_ms, 15_000)
    )
  end

  ## Posting an event to a page

  defp authenticate(conn) do
    with {:error, _} <- Session.fetch(conn) do
      halt(Conn.error(conn, 401, "unauthorized", "sign in at /login"))
    end
  end

  defp parse(conn) do
    with {:ok, body} <- read(conn),
         {:ok, request} <- decode(Conn.content_type(conn), body) do
      {:ok, request}
    else
      :halt -> :halt
      {:error, message} -> halt(Conn.error(conn, 400, "bad_request", message))
    end
  end

  defp read(conn) do
    with {:error, :too_large} <- Conn.read_body(conn) do
      halt(Conn.error(conn, 413, "body_too_large", "the body is too large"))
    end
  end

  defp decode("application/json", body) do
    case JSON.decode(body) do
      {:ok, %{"page_id" => page, "event" => event} = json}
      when is_binary(page) and is_binary(event) ->
        params = Map.get(json, "params", %{})

        if is_map(params),
          do: {:ok, %{page_id: page, event: event, params: params, csrf: nil}},
          else: {:error, "params must be an object"}

      _ ->
        {:error, ~s(send {"page_id": "...", "event": "...", "params": {...}})}
    end
  end

  defp decode("application/x-www-form-urlencoded", body) do
    fields = URI.decode_query(body)
    {base, params} = Map.split(fields, ["page_id", "event", "_csrf_token"])

    case base do
      %{"page_id" => page, "event" => event} ->
        {:ok, %{page_id: page, event: event, params: params, csrf: base["_csrf_token"]}}

      _ ->
        {:error, "send page_id and event"}
    end
  rescue
    ArgumentError -> {:error, "malformed form body"}
  end

  defp decode(_other, _body),
    do: {:error, "send application/json or application/x-www-form-urlencoded"}

  defp check_csrf(conn, session, request) do
    token = Conn.header(conn, "x-csrf-token") || request.csrf

    if Session.valid_csrf?(session, token),
      do: :ok,
      else: halt(Conn.error(conn, 403, "invalid_csrf_token", "reload the page and try again"))
  end

  defp check_event(conn, module, event) do
    if event in module.events(),
      do: :ok,
      else: halt(Conn.error(conn, 400, "unknown_event", "no such event"))
  end

  defp lookup(conn, page_id, operator) do
    case Registry.lookup(@registry, page_id) do
      [{pid, {^operator, module}}] -> {:ok, pid, module}
      _ -> halt(Conn.error(conn, 404, "page_gone", "the page is not connected; reload it"))
    end
  end

  defp deliver(conn, pid, request) do
    ref = Process.monitor(pid)
    send(pid, {:dashboard_event, self(), ref, request.event, request.params})

    receive do
      {^ref, :ok} ->
        Process.demonitor(ref, [:flush])
        Conn.no_content(conn)

      {:DOWN, ^ref, :process, _, _} ->
        Conn.error(conn, 404, "page_gone", "the page is not connected; reload it")
    after
      @event_timeout ->
        Process.demonitor(ref, [:flush])
        Logger.warning("dashboard page #{inspect(pid)} did not answer an event in time")
        Conn.error(conn, 504, "timeout", "the page did not answer in time")
    end
  end

  defp halt(:ok), do: :halt
end
