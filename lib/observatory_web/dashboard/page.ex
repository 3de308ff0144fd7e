defmodule ObservatoryWeb.Dashboard.Page do
  @moduledoc """
  The dashboard's pages, each hosting one core module
  (`ObservatoryWeb.Dashboard.EventStream` lists them):

    * `GET /` — the Session Cluster Manager;
    * `GET /agents` — the agents (`ObservatoryWeb.AgentList`);
    * `GET /agents/:agent_id` — one agent (`ObservatoryWeb.AgentDetail`); `404` (the
      same live page, saying so) while no such agent is registered.

  Without a signed-in operator a page redirects to `/login`. Otherwise it renders the
  core module once, unconnected (`mount/3` with a socket that is not live: the current
  state, no subscriptions), inside the page chrome: the navigation, the operator's
  name, the alert source in force (`OBSERVATORY_ALERT_SOURCE`), the live connection
  status and a sign-out form. `<body data-stream>` names
  the page's event stream; the page script opens it, and a connected mount of the
  same module takes over.
  """

  import ObservatoryWeb.HTML, only: [escape: 1]

  alias ObservatoryWeb.Conn
  alias ObservatoryWeb.Dashboard.{EventStream, Layout, Session}
  alias ObservatoryWeb.SessionClusterManager.Socket

  @nav [{"cluster", "/", "Session Cluster Manager"}, {"agents", "/agents", "Agents"}]
  @titles %{"cluster" => "Session Cluster Manager"}

  @doc "GET /: the Session Cluster Manager."
  def cluster(conn), do: show(conn, "cluster")

  @doc "GET /agents: the agents list."
  def agents(conn), do: show(conn, "agents")

  @doc "GET /agents/:id: one agent's page."
  def agent(conn, id), do: show(conn, "agent", %{"agent_id" => id})

  @doc "A page: `cluster`, `agents`, or `agent` with `%{\"agent_id\" => id}`."
  @spec show(Conn.t(), String.t(), map()) :: :ok
  def show(conn, view \\ "cluster", params \\ %{}) do
    case Session.fetch(conn) do
      {:ok, session} -> render(conn, session, view, params)
      {:error, :unauthenticated} -> Conn.redirect(conn, "/login")
    end
  end

  defp render(conn, session, view, params) do
    {:ok, module} = EventStream.view(view)
    {:ok, socket} = module.mount(params, %{"operator" => session.operator}, Socket.new())
    csrf = Session.csrf_token(session)
    title = @titles[view] || socket.assigns[:page_title] || "Dashboard"
    # An agent page for an id nobody registered: a 404, still live (it may register).
    status = if view == "agent" and socket.assigns.agent == nil, do: 404, else: 200

    body = [
      ~s(<header class="topbar"><div class="brand"><span class="brand-mark"></span>Observatory</div>),
      nav(view),
      ~s(<div class="topbar-right">),
      alert_source(),
      ~s(<span id="live-status" class="live" data-state="connecting" role="status">Connecting…</span>),
      ~s(<span class="operator" title="signed-in operator">),
      escape(session.operator),
      "</span>",
      ~s(<form method="post" action="/logout" class="logout">),
      ~s(<input type="hidden" name="_csrf_token" value="),
      escape(csrf),
      ~s("><button type="submit" class="btn btn-ghost">Sign out</button></form>),
      "</div></header>",
      ~s(<main class="page">),
      module.render(socket.assigns),
      "</main>"
    ]

    page =
      Layout.page("#{title} · Observatory", body,
        csrf_token: csrf,
        script: true,
        stream: EventStream.stream_path(view, params)
      )

    Conn.html(conn, status, page, Layout.headers())
  end

  # Which signal raises the alerts (OBSERVATORY_ALERT_SOURCE), on every page.
  defp alert_source do
    source = Observatory.Gateway.AlertSource.current()

    [
      ~s(<span id="alert-source" class="alert-source" data-source="),
      escape(source),
      ~s(" title="Which signal raises alerts: OBSERVATORY_ALERT_SOURCE=entropy or verdict">),
      ~s(Alerts from <strong>),
      escape(Observatory.Gateway.AlertSource.describe(source)),
      "</strong></span>"
    ]
  end

  # The agent pages sit under "Agents".
  defp nav(view) do
    current = if view == "agent", do: "agents", else: view

    [
      ~s(<nav class="topnav" aria-label="Dashboard">),
      for {name, href, label} <- @nav do
        [
          ~s(<a href="),
          href,
          ~s("),
          if(name == current, do: ~s( aria-current="page"), else: ""),
          ">",
          label,
          "</a>"
        ]
      end,
      "</nav>"
    ]
  end
end
