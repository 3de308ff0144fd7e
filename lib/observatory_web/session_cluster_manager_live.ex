if Code.ensure_loaded?(Phoenix.LiveView) do
  defmodule ObservatoryWeb.SessionClusterManagerLive do
    @moduledoc """
    The Session Cluster Manager as a Phoenix LiveView, for host apps that have
    Phoenix. Compiled only when `Phoenix.LiveView` is loaded; mounted by
    `ObservatoryWeb.LiveRouter.observatory_dashboard/2`.

    Every callback is `ObservatoryWeb.SessionClusterManager`'s: this module hands
    LiveView's socket to it, then puts the page's parts in assigns
    (`ObservatoryWeb.LiveParts`), so an update sends only the parts that changed. It
    uses API that LiveView 0.20 and 1.x share (`use Phoenix.LiveView`,
    `Phoenix.Component.assign/3`, `Phoenix.LiveView.connected?/1`, `~H` with `<%= %>`,
    `Phoenix.HTML.raw/1`).
    """

    use Phoenix.LiveView

    alias ObservatoryWeb.{LiveParts, SessionClusterManager}
    alias ObservatoryWeb.SessionClusterManager.View

    @impl true
    def mount(params, session, socket) do
      {:ok, socket} = SessionClusterManager.mount(params, session, socket)

      frame = LiveParts.frame(session["observatory_path"], :cluster)
      {:ok, socket |> assign(frame) |> parts()}
    end

    @impl true
    def handle_info(message, socket),
      do: message |> SessionClusterManager.handle_info(socket) |> parts()

    @impl true
    def handle_event(event, params, socket),
      do: event |> SessionClusterManager.handle_event(params, socket) |> parts()

    @impl true
    def render(assigns) do
      ~H"""
      <div class="observatory-dashboard"><%= Phoenix.HTML.raw(@observatory_css) %><%= Phoenix.HTML.raw(@observatory_nav) %><%= Phoenix.HTML.raw(@html_notice) %><%= Phoenix.HTML.raw(@html_summary) %><%= Phoenix.HTML.raw(@html_alerts) %><%= Phoenix.HTML.raw(@html_inspect) %><%= Phoenix.HTML.raw(@html_topology) %><%= Phoenix.HTML.raw(@html_nodes_alert_entropy) %><%= Phoenix.HTML.raw(@html_nodes_blocked) %><%= Phoenix.HTML.raw(@html_nodes_paused) %><%= Phoenix.HTML.raw(@html_nodes_active) %><%= Phoenix.HTML.raw(@html_nodes_idle) %><%= Phoenix.HTML.raw(@html_topology_end) %><%= Phoenix.HTML.raw(@html_steps) %></div>
      """
    end

    defp parts({:noreply, socket}), do: {:noreply, parts(socket)}
    defp parts(socket), do: LiveParts.assign(socket, View.parts(socket.assigns))
  end
end
