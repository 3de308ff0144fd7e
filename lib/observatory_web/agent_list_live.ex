if Code.ensure_loaded?(Phoenix.LiveView) do
  defmodule ObservatoryWeb.AgentListLive do
    @moduledoc """
    The agents list as a Phoenix LiveView, for host apps that have Phoenix. Compiled
    only when `Phoenix.LiveView` is loaded; mounted by
    `ObservatoryWeb.LiveRouter.observatory_dashboard/2` at `…/agents`.

    Every callback is `ObservatoryWeb.AgentList`'s; like
    `ObservatoryWeb.SessionClusterManagerLive` it puts the page in an assign
    (`ObservatoryWeb.LiveParts`), so a refresh that changes nothing sends nothing.
    """

    use Phoenix.LiveView

    alias ObservatoryWeb.{AgentList, LiveParts}

    @impl true
    def mount(params, session, socket) do
      {:ok, socket} = AgentList.mount(params, session, socket)

      frame = LiveParts.frame(session["observatory_path"], :agents)
      {:ok, socket |> assign(frame) |> parts()}
    end

    @impl true
    def handle_info(message, socket), do: message |> AgentList.handle_info(socket) |> parts()

    @impl true
    def handle_event(event, params, socket),
      do: event |> AgentList.handle_event(params, socket) |> parts()

    @impl true
    def render(assigns) do
      ~H"""
      <div class="observatory-dashboard"><%= Phoenix.HTML.raw(@observatory_css) %><%= Phoenix.HTML.raw(@observatory_nav) %><%= Phoenix.HTML.raw(@html_list) %></div>
      """
    end

    defp parts({:noreply, socket}), do: {:noreply, parts(socket)}
    defp parts(socket), do: LiveParts.assign(socket, AgentList.parts(socket.assigns))
  end
end
