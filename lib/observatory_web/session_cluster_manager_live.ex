if Code.ensure_loaded?(Phoenix.LiveView) do
  defmodule ObservatoryWeb.SessionClusterManagerLive do
    @moduledoc """
    The Session Cluster Manager as a Phoenix LiveView, for host apps that have
    Phoenix. Compiled only when `Phoenix.LiveView` is loaded.

    Every callback is `ObservatoryWeb.SessionClusterManager`'s: this module only
    hands LiveView's socket to it and wraps its HTML. It uses API that LiveView 0.20
    and 1.x share (`use Phoenix.LiveView`, `Phoenix.Component.assign/3`,
    `Phoenix.LiveView.connected?/1`, `~H` with `<%= %>`, `Phoenix.HTML.raw/1`).

        # router.ex
        live_session :observatory,
          session: {MyAppWeb.OperatorAuth, :observatory_session, []} do
          live "/observatory", ObservatoryWeb.SessionClusterManagerLive
        end

    where `observatory_session(conn)` returns `%{"operator" => name}`: the name the
    HITL audit log records for Pause and Resume. Point Observatory at the app's
    PubSub (`config :observatory, :pubsub, {Phoenix.PubSub, MyApp.PubSub}`).
    """

    use Phoenix.LiveView

    alias ObservatoryWeb.SessionClusterManager, as: Manager

    @impl true
    def mount(params, session, socket), do: Manager.mount(params, session, socket)

    @impl true
    def handle_info(message, socket), do: Manager.handle_info(message, socket)

    @impl true
    def handle_event(event, params, socket), do: Manager.handle_event(event, params, socket)

    @impl true
    def render(assigns) do
      assigns = Phoenix.Component.assign(assigns, :html, html(assigns))

      ~H"""
      <div class="observatory-dashboard"><%= Phoenix.HTML.raw(@html) %></div>
      """
    end

    # The manager's own safe HTML (every agent-supplied string already escaped) and
    # its stylesheet, scoped under `.scm`.
    defp html(assigns) do
      IO.iodata_to_binary([
        "<style>",
        ObservatoryWeb.Dashboard.Assets.css(),
        "</style>",
        Manager.render(assigns)
      ])
    end
  end
end
