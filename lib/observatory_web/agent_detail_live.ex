if Code.ensure_loaded?(Phoenix.LiveView) do
  defmodule ObservatoryWeb.AgentDetailLive do
    @moduledoc """
    The Agent Detail page as a Phoenix LiveView, for host apps that have Phoenix.
    Compiled only when `Phoenix.LiveView` is loaded.

    Every callback is `ObservatoryWeb.AgentDetail`'s: this module only hands
    LiveView's socket to it and wraps its HTML, like
    `ObservatoryWeb.SessionClusterManagerLive`. The route's `:agent_id` names the agent:

        # router.ex
        live_session :observatory,
          session: {MyAppWeb.OperatorAuth, :observatory_session, []} do
          live "/observatory", ObservatoryWeb.SessionClusterManagerLive
          live "/observatory/agents/:agent_id", ObservatoryWeb.AgentDetailLive
        end

    where `observatory_session(conn)` returns `%{"operator" => name, "agents_path" =>
    "/observatory/agents"}`: the name recorded in the agent's events, and where the
    page's links to the agents point.
    """

    use Phoenix.LiveView

    alias ObservatoryWeb.AgentDetail

    @impl true
    def mount(params, session, socket), do: AgentDetail.mount(params, session, socket)

    @impl true
    def handle_info(message, socket), do: AgentDetail.handle_info(message, socket)

    @impl true
    def handle_event(event, params, socket), do: AgentDetail.handle_event(event, params, socket)

    @impl true
    def render(assigns) do
      assigns = Phoenix.Component.assign(assigns, :html, html(assigns))

      ~H"""
      <div class="observatory-dashboard"><%= Phoenix.HTML.raw(@html) %></div>
      """
    end

    # The page's own safe HTML (every agent-supplied string already escaped) and the
    # stylesheet, scoped under `.scm`.
    defp html(assigns) do
      IO.iodata_to_binary([
        "<style>",
        ObservatoryWeb.Dashboard.Assets.css(),
        "</style>",
        AgentDetail.render(assigns)
      ])
    end
  end
end
