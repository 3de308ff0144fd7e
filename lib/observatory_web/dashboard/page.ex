defmodule ObservatoryWeb.Dashboard.Page do
  @moduledoc """
  `GET /`: the Session Cluster Manager page.

  Without a signed-in operator it redirects to `/login`. Otherwise it renders the
  manager once, unconnected (`mount/3` with a socket that is not live: the current
  fleet, no subscriptions), inside the page chrome: the operator's name, the live
  connection status and a sign-out form. The page script then opens
  `/dashboard/events`, where a connected manager takes over
  (`ObservatoryWeb.Dashboard.EventStream`).
  """

  import ObservatoryWeb.HTML, only: [escape: 1]

  alias ObservatoryWeb.Conn
  alias ObservatoryWeb.Dashboard.{Layout, Session}
  alias ObservatoryWeb.SessionClusterManager, as: Manager
  alias ObservatoryWeb.SessionClusterManager.Socket

  @doc "GET /"
  @spec show(Conn.t()) :: :ok
  def show(conn) do
    case Session.fetch(conn) do
      {:ok, session} -> render(conn, session)
      {:error, :unauthenticated} -> Conn.redirect(conn, "/login")
    end
  end

  defp render(conn, session) do
    {:ok, socket} = Manager.mount(%{}, %{"operator" => session.operator}, Socket.new())
    csrf = Session.csrf_token(session)

    body = [
      ~s(<header class="topbar"><div class="brand"><span class="brand-mark"></span>Observatory</div>),
      ~s(<div class="topbar-title">Session Cluster Manager</div>),
      ~s(<div class="topbar-right">),
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
      Manager.render(socket.assigns),
      "</main>"
    ]

    page =
      Layout.page("Session Cluster Manager · Observatory", body, csrf_token: csrf, script: true)

    Conn.html(conn, 200, page, Layout.headers())
  end
end
