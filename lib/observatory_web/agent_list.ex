defmodule ObservatoryWeb.AgentList do
  @moduledoc """
  The agents page: every agent registered with the kill switch, its status, its
  switch and settings, its current loop score and whether its alerts go anywhere,
  each linking to its Agent Detail page (`ObservatoryWeb.AgentDetail`). LiveView
  callbacks as plain functions, like `ObservatoryWeb.SessionClusterManager`.

    * `mount/3` — when connected, subscribes to `"gateway:kill_switch"` and schedules
      a periodic refresh (a new agent registers itself with its first proxied request,
      which broadcasts nothing; scores move with every request).
    * `handle_info/2` — any kill switch event, or the refresh, reloads the list.
    * `handle_event/3` — none: actions are on each agent's page.
    * `render/1` — a table; every agent id is escaped, and URL-encoded in links.

  At most 500 agents are shown (sorted by id), with a note saying how many exist.
  """

  require Logger

  import ObservatoryWeb.HTML, only: [escape: 1, escape_exact: 1]

  alias ObservatoryWeb.LivePage
  alias Observatory.Gateway.Events
  alias Observatory.KillSwitch
  alias ObservatoryWeb.AgentDetail
  alias ObservatoryWeb.AgentDetail.View, as: DetailView
  alias ObservatoryWeb.SessionClusterManager.{Socket, View}

  @refresh {__MODULE__, :refresh}
  @shown 500

  @doc "The events `handle_event/3` accepts: none."
  @spec events() :: [String.t()]
  def events, do: []

  @doc "The topics `mount/3` subscribes a connected page to."
  @spec topics() :: [String.t()]
  def topics, do: [KillSwitch.topic()]

  @doc "Mounts the list; see the module doc."
  def mount(_params, session, socket) do
    if Socket.connected?(socket) do
      for topic <- topics(), do: :ok = Events.subscribe(topic)
      LivePage.schedule_refresh(@refresh)
    end

    socket =
      socket
      |> Socket.assign(:agents_path, AgentDetail.agents_path(session))
      |> Socket.assign(:page_title, "Agents")
      |> load()

    {:ok, socket}
  end

  @doc "Reloads on a kill switch event or the periodic refresh."
  def handle_info(@refresh, socket) do
    LivePage.schedule_refresh(@refresh)
    {:noreply, load(socket)}
  end

  def handle_info(%{event_type: _, agent_id: _}, socket), do: {:noreply, load(socket)}

  def handle_info(message, socket) do
    Logger.debug("AgentList ignored an unexpected message: #{inspect(message)}")
    {:noreply, socket}
  end

  @doc "There are no actions on the list: every event is refused."
  def handle_event(event, params, socket) do
    Logger.debug("AgentList refused event #{inspect(event)} #{inspect(params)}")
    {:noreply, socket}
  end

  @doc "The list as HTML iodata: its `parts/1`, in order."
  @spec render(map()) :: iodata()
  def render(assigns), do: Keyword.values(parts(assigns))

  @doc "The list as one part (`ObservatoryWeb.LiveParts`): it changes as a whole."
  @spec parts(map()) :: [{atom(), iodata()}]
  def parts(assigns), do: [html_list: list(assigns)]

  defp list(assigns) do
    rows = assigns.agents

    [
      ~s(<div id="agent-list" class="scm agent-list" data-live-root>),
      ~s(<section id="agents-panel" class="panel" aria-labelledby="agents-title">),
      ~s(<header class="panel-head"><h2 id="agents-title">Agents</h2><span class="pill" data-count="),
      escape(assigns.total),
      ~s(">),
      escape(assigns.total),
      if(assigns.total == 1, do: " agent", else: " agents"),
      "</span></header>",
      if(assigns.total > length(rows),
        do: [~s(<p class="muted">The first ), escape(length(rows)), " by id.</p>"],
        else: ""
      ),
      body(rows, assigns.agents_path),
      "</section></div>"
    ]
  end

  defp body([], _path), do: [~s(<p class="empty">No agents yet. ), how_to_register(), "</p>"]

  defp body(rows, path) do
    [
      ~s(<div class="table-wrap"><table class="agents-table"><thead><tr>),
      ~s(<th scope="col">Agent</th><th scope="col">Status</th><th scope="col">Kill switch</th>),
      ~s(<th scope="col" class="num">Score</th><th scope="col">Notifications</th><th scope="col">Updated</th>),
      "</tr></thead><tbody>",
      Enum.map(rows, &row(&1, path)),
      "</tbody></table></div>"
    ]
  end

  defp row(%{agent: agent, score: score, notifications: notifications?}, path) do
    id = escape(agent.id)
    ks = agent.kill_switch

    [
      ~s(<tr id="),
      View.dom_id("agent", agent.id),
      ~s(" class="agent-row" data-agent-id="),
      escape_exact(agent.id),
      ~s("><td class="who"><a class="mono agent-link" href="),
      escape(DetailView.agent_path(path, agent.id)),
      ~s("),
      ObservatoryWeb.HTML.navigate(),
      ">",
      id,
      "</a></td><td>",
      DetailView.status_badge(agent),
      "</td><td>",
      if(ks.enabled,
        do: [
          ~s(<span class="ad-on">on</span> <span class="muted">window ),
          escape(ks.window_size),
          ", threshold ",
          escape(ks.threshold),
          "</span>"
        ],
        else: ~s(<span class="muted">off</span>)
      ),
      ~s(</td><td class="num">),
      case score do
        nil -> ~s(<span class="muted">–</span>)
        %{score: s} -> :erlang.float_to_binary(s / 1, decimals: 2)
      end,
      "</td><td>",
      if(notifications?,
        do: "configured",
        else: ~s(<span class="muted">not configured</span>)
      ),
      ~s(</td><td class="when">),
      Calendar.strftime(agent.updated_at, "%Y-%m-%d %H:%M:%S"),
      " UTC</td></tr>"
    ]
  end

  defp load(socket) do
    all = KillSwitch.agents()

    rows =
      for agent <- Enum.take(all, @shown) do
        %{
          agent: agent,
          score: if(agent.kill_switch.enabled, do: KillSwitch.status(agent.id)),
          notifications: KillSwitch.notifications_configured?(agent)
        }
      end

    socket
    |> Socket.assign(:agents, rows)
    |> Socket.assign(:total, length(all))
  end

  @doc false
  # How an agent gets registered, for the pages that show none. A page does not know
  # where a host app mounted the agents API, so it names both ways in.
  def how_to_register do
    ~s(An operator registers an agent by issuing its key: <code>POST /api/v1/agents/:id/keys</code> ) <>
      ~s[on the agents API (under the path a host app mounts it at), or ] <>
      ~s(<code>Observatory.AgentKeys.issue/2</code> from Elixir.)
  end
end
