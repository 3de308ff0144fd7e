if Code.ensure_loaded?(Phoenix.LiveView) do
  defmodule ObservatoryWeb.AgentDetailLive do
    @moduledoc """
    The Agent Detail page as a Phoenix LiveView, for host apps that have Phoenix.
    Compiled only when `Phoenix.LiveView` is loaded; mounted by
    `ObservatoryWeb.LiveRouter.observatory_dashboard/2` at `…/agents/:agent_id`.

    Every callback is `ObservatoryWeb.AgentDetail`'s; like
    `ObservatoryWeb.SessionClusterManagerLive` it puts the page's parts in assigns
    (`ObservatoryWeb.LiveParts`), so an update sends only the parts that changed.
    """

    use Phoenix.LiveView

    alias ObservatoryWeb.{AgentDetail, LiveParts}
    alias ObservatoryWeb.AgentDetail.View

    @impl true
    def mount(params, session, socket) do
      {:ok, socket} = AgentDetail.mount(params, session, socket)

      frame = LiveParts.frame(session["observatory_path"], :agents)
      {:ok, socket |> assign(frame) |> parts()}
    end

    @impl true
    def handle_info(message, socket), do: message |> AgentDetail.handle_info(socket) |> parts()

    @impl true
    def handle_event(event, params, socket),
      do: event |> AgentDetail.handle_event(params, socket) |> parts()

    @impl true
    def render(assigns) do
      ~H"""
      <div class="observatory-dashboard"><%= Phoenix.HTML.raw(@observatory_css) %><%= Phoenix.HTML.raw(@observatory_nav) %><%= Phoenix.HTML.raw(@html_notice) %><%= Phoenix.HTML.raw(@html_header) %><%= Phoenix.HTML.raw(@html_panels) %><%= Phoenix.HTML.raw(@html_events) %></div>
      """
    end

    defp parts({:noreply, socket}), do: {:noreply, parts(socket)}
    defp parts(socket), do: LiveParts.assign(socket, View.parts(socket.assigns))
  end
end
