defmodule ObservatoryWeb.SessionClusterManager do
  @moduledoc """
  The Session Cluster Manager (FR-9.10): the alerts panel, the fleet topology, Pause
  and Inspect and the evidence behind an alert, written as LiveView callbacks that are
  plain functions.

      {:ok, socket} = mount(%{}, %{"operator" => "alice"}, Socket.new(connected?: true))
      # an EntropyAlertEvent arrives on "gateway:entropy_alerts"
      {:noreply, socket} = handle_info(event, socket)
      {:noreply, socket} = handle_event("pause_inspect", %{"session_id" => id}, socket)
      html = render(socket.assigns) |> IO.iodata_to_binary()

  ## Callbacks

    * `mount/3` — when connected, subscribes to `"gateway:entropy_alerts"`,
      `"gateway:topology"`, `"gateway:hitl"`, `"gateway:loop_detection"`,
      `"gateway:loop_verdict"` and `"gateway:alerts"`, and schedules a periodic
      refresh; loads the sessions alerted now (`Observatory.Gateway.Alerts`, from every
      member of a cluster), the topology snapshot from `EntropyTracker.sessions/1`, the
      loop verdicts (`LoopVerdict.flagged/1`) and the pauses in force. With
      `config :observatory, :alert_source, :verdict` a node's state follows its verdict
      (loop → `alert_entropy`, suspect → `blocked`) instead of its entropy severity. The
      operator's name comes from the session's `"operator"` key and is what the HITL
      audit log records for the dashboard's commands; `"agents_path"` (default
      `"/agents"`) is where fleet nodes' agent names link to.
    * `handle_info/2` — an `EntropyAlertEvent` adds or updates its session's row (one
      row per session), `alert_raised` / `alert_cleared` add and remove rows, topology
      and HITL events go to the fleet, and events about the inspected session reload
      the Inspect panel (a burst of them, once). The refresh re-reads the alert list
      and the fleet. Messages it does not know are logged at debug level and ignored.
    * `handle_event/3` — `"pause_inspect"` issues the HITL Pause for the row's session
      and opens the Inspect panel; `"inspect"` opens it without pausing (any fleet
      node, a paused row); `"resume"`, `"close_inspect"`, `"toggle_step"` (shows a
      step's arguments and result whole, or cut again; `"step"` is its number) and
      `"reset_step"` (lifts a step-detector block, seed 002). Each takes
      `%{"session_id" => id}`.
    * `render/1` — the whole manager as safe HTML iodata (`ObservatoryWeb.HTML` escapes
      every agent-supplied string); buttons carry `phx-click` and `phx-value-*`.

  ## Two hosts, one set of functions

  The callbacks read `socket.assigns` and write through `Socket.assign/3`, which
  works on `ObservatoryWeb.SessionClusterManager.Socket` (Observatory's page server,
  `ObservatoryWeb.Dashboard.EventStream`, and the tests) and on a
  `Phoenix.LiveView.Socket` (`ObservatoryWeb.SessionClusterManagerLive`). The page
  server pushes `render/1` over Server-Sent Events; LiveView diffs it.

  While a session is being inspected the manager also follows `"gateway:decision_logs"`
  so the window it shows stays current, and stops when the panel is closed.
  """

  require Logger

  alias ObservatoryWeb.{LivePage, SnapshotCache}
  alias Observatory.Cluster
  alias Observatory.Gateway.{AlertSource, EntropyTracker, Events, HITL, LoopVerdict, StepDetector}
  alias ObservatoryWeb.SessionClusterManager.{Alerts, Fleet, Inspector, Socket, View}

  @events ["pause_inspect", "inspect", "resume", "close_inspect", "toggle_step", "reset_step"]
  @refresh {__MODULE__, :refresh}
  @reload {__MODULE__, :reload_inspect}
  @snapshot_limit 500

  @type socket :: Socket.t() | struct()

  @doc "The events `handle_event/3` accepts."
  @spec events() :: [String.t()]
  def events, do: @events

  @doc "The topics `mount/3` subscribes a connected page to."
  @spec topics() :: [String.t()]
  def topics,
    do: [
      Events.entropy_alerts(),
      Events.topology(),
      HITL.topic(),
      StepDetector.topic(),
      LoopVerdict.topic(),
      Observatory.Gateway.Alerts.topic(),
      Observatory.Cluster.Monitor.topic()
    ]

  @doc "Mounts the manager; see the module doc."
  @spec mount(map() | :not_mounted_at_router, map(), socket) :: {:ok, socket}
        when socket: socket()
  def mount(_params, session, socket) do
    if Socket.connected?(socket) do
      for topic <- topics(), do: :ok = Events.subscribe(topic)
      LivePage.schedule_refresh(@refresh)
    end

    socket =
      socket
      |> Socket.assign(:operator, LivePage.operator(session))
      |> Socket.assign(:agents_path, ObservatoryWeb.AgentDetail.agents_path(session))
      |> Socket.assign(:alert_source, AlertSource.current())
      # A page opens on the alerts and the fleet as they are now; its refreshes share
      # one listing.
      |> Socket.assign(:alerts, Alerts.replace(Alerts.new(), alert_list()))
      |> Socket.assign(:fleet, fleet_snapshot())
      |> Socket.assign(:held, held())
      |> Socket.assign(:steps, step_list())
      |> Socket.assign(:inspect, nil)
      |> Socket.assign(:expanded, [])
      |> Socket.assign(:reload_pending, false)
      |> Socket.assign(:following, nil)
      |> Socket.assign(:notice, nil)

    {:ok, socket}
  end

  @doc "Handles a gateway event or the periodic refresh; see the module doc."
  @spec handle_info(term(), socket) :: {:noreply, socket} when socket: socket()
  def handle_info(%{event_type: "entropy_alert"} = event, socket) do
    %{session_id: id, agent_id: agent_id, entropy_score: score} = event
    alerts = Alerts.put(socket.assigns.alerts, event, DateTime.utc_now())

    socket
    |> Socket.assign(:alerts, alerts)
    |> Socket.assign(:fleet, Fleet.put_score(socket.assigns.fleet, id, agent_id, score))
    |> noreply()
  end

  def handle_info(%{event_type: "alert_raised"} = event, socket) do
    socket
    |> Socket.assign(:alerts, Alerts.raised(socket.assigns.alerts, event))
    |> schedule_reload(event.session_id)
    |> noreply()
  end

  def handle_info(%{event_type: "alert_cleared", session_id: id}, socket) do
    socket
    |> Socket.assign(:alerts, Alerts.delete(socket.assigns.alerts, id))
    |> schedule_reload(id)
    |> noreply()
  end

  def handle_info(@reload, socket) do
    socket
    |> Socket.assign(:reload_pending, false)
    |> reload_now()
    |> noreply()
  end

  def handle_info(%{event_type: "topology_update", session_id: id} = update, socket) do
    socket
    |> Socket.assign(:fleet, Fleet.apply_update(socket.assigns.fleet, update))
    |> schedule_reload(id)
    |> noreply()
  end

  def handle_info(%{event_type: "hitl_pause", session_id: id}, socket) do
    socket
    |> Socket.assign(:fleet, Fleet.pause(socket.assigns.fleet, id))
    |> schedule_reload(id)
    |> noreply()
  end

  def handle_info(%{event_type: "hitl_resume", session_id: id}, socket) do
    socket
    |> Socket.assign(:fleet, Fleet.resume(socket.assigns.fleet, id))
    |> schedule_reload(id)
    |> noreply()
  end

  def handle_info(%{event_type: "loop_detection"}, socket) do
    {:noreply, Socket.assign(socket, :steps, step_list())}
  end

  def handle_info(%{event_type: "loop_verdict", session_id: id} = event, socket) do
    socket
    |> Socket.assign(:fleet, Fleet.put_verdict(socket.assigns.fleet, id, event))
    |> schedule_reload(id)
    |> noreply()
  end

  # In a cluster: the replicas were merged after a partition or a restart. The
  # operator is told what was decided, when anything was (an empty heal says nothing).
  def handle_info(%{event_type: "cluster_reconciled", report: %{changed: 0}}, socket),
    do: {:noreply, socket}

  def handle_info(%{event_type: "cluster_reconciled", report: report}, socket) do
    notice(socket, {:info, reconciled(report)})
  end

  def handle_info(%{event_type: "decision_log", session_id: id}, socket) do
    {:noreply, schedule_reload(socket, id)}
  end

  def handle_info(@refresh, socket) do
    LivePage.schedule_refresh(@refresh)

    socket
    |> Socket.assign(:alert_source, AlertSource.current())
    |> Socket.assign(:alerts, Alerts.replace(socket.assigns.alerts, alerts_snapshot()))
    |> Socket.assign(:fleet, snapshot())
    |> Socket.assign(:held, SnapshotCache.fetch({__MODULE__, :held}, max_age(), &held/0))
    |> Socket.assign(:steps, steps())
    |> schedule_reload(inspected(socket))
    |> noreply()
  end

  def handle_info(message, socket) do
    Logger.debug("SessionClusterManager ignored an unexpected message: #{inspect(message)}")
    {:noreply, socket}
  end

  @doc "Handles an operator's click; see the module doc."
  @spec handle_event(String.t(), map(), socket) :: {:noreply, socket} when socket: socket()
  def handle_event("pause_inspect", %{"session_id" => id}, socket) when is_binary(id) do
    opts = [operator: socket.assigns.operator, reason: "Pause and Inspect"]

    case HITL.pause(id, opts) do
      {:ok, _entry} -> inspect_paused(socket, id, {:info, "Paused. The agent is told to wait."})
      {:error, :already_paused} -> inspect_paused(socket, id, {:info, "Already paused."})
      {:error, reason} -> notice(socket, {:error, "Could not pause: #{reason}."})
    end
  end

  def handle_event("inspect", %{"session_id" => id}, socket) when is_binary(id) do
    socket
    |> open_inspect(id)
    |> notice(nil)
  end

  def handle_event("toggle_step", %{"session_id" => id, "step" => step}, socket)
      when is_binary(id) and is_binary(step) do
    case {inspected(socket), Integer.parse(step)} do
      {^id, {n, ""}} ->
        expanded = socket.assigns.expanded

        expanded =
          if n in expanded, do: List.delete(expanded, n), else: Enum.take([n | expanded], 20)

        socket
        |> Socket.assign(:expanded, expanded)
        |> reload_now()
        |> notice(socket.assigns.notice)

      _other ->
        notice(socket, {:error, "That step is not in the Inspect panel."})
    end
  end

  def handle_event("resume", %{"session_id" => id}, socket) when is_binary(id) do
    opts = [operator: socket.assigns.operator, reason: "Resumed from the dashboard"]

    case HITL.resume(id, opts) do
      {:ok, _entry} ->
        socket
        |> Socket.assign(:fleet, Fleet.resume(socket.assigns.fleet, id))
        |> reload_inspect(id)
        |> notice({:info, "Resumed."})

      {:error, :not_paused} ->
        socket |> reload_inspect(id) |> notice({:info, "The session is not paused."})

      {:error, :no_majority} ->
        notice(socket, {:error, no_majority("resume")})

      {:error, reason} ->
        notice(socket, {:error, "Could not resume: #{reason}."})
    end
  end

  def handle_event("close_inspect", _params, socket) do
    socket
    |> follow(nil)
    |> Socket.assign(:inspect, nil)
    |> Socket.assign(:expanded, [])
    |> notice(nil)
  end

  def handle_event("reset_step", %{"session_id" => id}, socket) when is_binary(id) do
    message =
      case Cluster.call_owner(id, StepDetector, :reset, [id, [operator: socket.assigns.operator]]) do
        {:ok, :ok} ->
          {:info, "Step detector reset: the session may run again."}

        {:ok, {:error, :unknown_session}} ->
          {:info, "The step detector has nothing for this session."}

        {:ok, {:error, :no_majority}} ->
          {:error, no_majority("reset")}

        {:error, :owner_unavailable} ->
          {:error, "The session's node did not answer; retry."}
      end

    # Fresh, not the shared listing: the operator looks for the reset's effect.
    socket
    |> Socket.assign(:steps, step_list())
    |> notice(message)
  end

  def handle_event(event, params, socket) do
    Logger.debug("SessionClusterManager refused event #{inspect(event)} #{inspect(params)}")
    notice(socket, {:error, "Unknown action."})
  end

  defp reconciled(report) do
    what =
      case report do
        %{kind: :heal, losers: losers} ->
          "healed a partition (#{Enum.join(losers, ", ")} rejoined)"

        %{kind: :restart, joined: node} ->
          "merged the copy of #{node}, restarted"

        _ ->
          "found its replicas different and merged them"
      end

    {shown, rest} = Enum.split(report.notes, 3)
    more = if rest == [], do: "", else: " (and #{length(rest)} more: see /healthz)"

    "The cluster #{what}: #{report.changed} record(s) reconciled. " <>
      Enum.join(shown, "; ") <> more
  end

  defp no_majority(what) do
    "Could not #{what}: this node cannot reach the majority of its cluster, and " <>
      "refuses to lower safety state until the partition heals. Use a node of the majority."
  end

  @doc "The manager as HTML iodata; every agent-supplied string is escaped."
  @spec render(map()) :: iodata()
  def render(assigns), do: View.render(assigns)

  ## Helpers

  defp inspect_paused(socket, id, message) do
    socket
    |> Socket.assign(:fleet, Fleet.pause(socket.assigns.fleet, id))
    |> open_inspect(id)
    |> notice(message)
  end

  # Opens the Inspect panel on a session (a step shown whole stays so only while the
  # same session is inspected).
  defp open_inspect(socket, id) do
    expanded = if inspected(socket) == id, do: socket.assigns.expanded, else: []

    socket
    |> follow(id)
    |> Socket.assign(:expanded, expanded)
    |> Socket.assign(:inspect, Inspector.load(id, full: expanded))
  end

  # Follows "gateway:decision_logs" while a session is inspected, so its window stays
  # current; `nil` stops following.
  defp follow(socket, id) do
    following = socket.assigns.following
    live? = Socket.connected?(socket)

    cond do
      not live? -> socket
      following != nil and id != nil -> socket
      following == nil and id != nil -> subscribe_decision_logs(socket)
      following != nil and id == nil -> unsubscribe_decision_logs(socket)
      true -> socket
    end
  end

  defp subscribe_decision_logs(socket) do
    :ok = Events.subscribe(Events.decision_logs())
    Socket.assign(socket, :following, Events.decision_logs())
  end

  defp unsubscribe_decision_logs(socket) do
    :ok = Events.unsubscribe(Events.decision_logs())
    Socket.assign(socket, :following, nil)
  end

  defp reload_inspect(socket, nil), do: socket

  defp reload_inspect(socket, id) do
    if inspected(socket) == id, do: reload_now(socket), else: socket
  end

  defp reload_now(socket) do
    case inspected(socket) do
      nil -> socket
      id -> Socket.assign(socket, :inspect, Inspector.load(id, full: socket.assigns.expanded))
    end
  end

  # Events about the inspected session come in bursts (each of its steps brings a
  # decision log, maybe a verdict and a topology update): the panel is reloaded once,
  # when the process gets to the message sent here, after the burst.
  defp schedule_reload(socket, id) do
    cond do
      id == nil or inspected(socket) != id -> socket
      socket.assigns.reload_pending -> socket
      true -> request_reload(socket)
    end
  end

  defp request_reload(socket) do
    send(self(), @reload)
    Socket.assign(socket, :reload_pending, true)
  end

  defp inspected(%{assigns: %{inspect: %{session_id: id}}}), do: id
  defp inspected(_socket), do: nil

  defp notice(socket, message), do: {:noreply, Socket.assign(socket, :notice, message)}
  defp noreply(socket), do: {:noreply, socket}

  # Shared by every open manager page (ObservatoryWeb.SnapshotCache): one scan of the
  # fleet per refresh interval, however many pages are open.
  defp snapshot, do: SnapshotCache.fetch({__MODULE__, :fleet}, max_age(), &fleet_snapshot/0)

  defp steps,
    do: SnapshotCache.fetch({__MODULE__, :steps}, max_age(), fn -> step_list() end)

  defp alerts_snapshot,
    do: SnapshotCache.fetch({__MODULE__, :alerts}, max_age(), &alert_list/0)

  # Every member's alerted sessions (issue 14): each is on its session's owner. Each
  # with what it spent through the proxy (budgets are replicated: read here).
  defp alert_list do
    for alert <- Observatory.Gateway.Alerts.gather(limit: @snapshot_limit),
        do: Map.put(alert, :usage, Observatory.Budget.session_usage(alert.session_id))
  end

  defp max_age,
    do: div(Application.get_env(:observatory, :dashboard_refresh_ms, 2_000) * 9, 10)

  # Every member's streaks (issue 14); a durable block is listed by every member
  # that does not hold the session live: once.
  defp step_list, do: Cluster.gather(StepDetector, :active, []) |> Enum.uniq_by(& &1.session_id)

  defp fleet_snapshot do
    # Every member's sessions (issue 14): each session is on one node only.
    flagged = Cluster.gather(LoopVerdict, :flagged, [@snapshot_limit])
    listed = Cluster.gather(EntropyTracker, :sessions, [[limit: @snapshot_limit]])
    sessions = listed ++ alerted_beyond(listed)

    sessions =
      if AlertSource.current() == :verdict,
        do: by_verdict(sessions, Map.new(flagged, &{&1.session_id, &1.verdict})),
        else: sessions

    sessions
    |> Fleet.snapshot(HITL.paused_sessions())
    |> Fleet.put_verdicts(flagged)
  end

  # The tracker lists its most recently active sessions only: an alerted session
  # quieter than the newest @snapshot_limit (a busy fleet, a flood of new sessions)
  # is added from its alert, so the topology and the summary count every session the
  # alerts panel lists.
  defp alerted_beyond(listed) do
    shown = MapSet.new(listed, & &1.session_id)
    now = System.system_time(:millisecond)

    for row <- Observatory.Gateway.Alerts.gather(limit: @snapshot_limit),
        not MapSet.member?(shown, row.session_id) do
      %{
        session_id: row.session_id,
        agent_id: row.agent_id,
        score: row.entropy_score,
        severity: :loop,
        idle_ms: max(now - DateTime.to_unix(row.last_at, :millisecond), 0)
      }
    end
  end

  # How many sessions every member holds: the topology shows only the newest
  # @snapshot_limit of them (and the alerted and paused ones), the summary says so.
  defp held, do: Cluster.gather(__MODULE__, :held_here, []) |> Enum.sum()

  @doc false
  # This member's count, as a list for `Cluster.gather/3`.
  def held_here, do: [EntropyTracker.session_count()]

  # With the verdict as the alert source, a node's state follows the verdict.
  defp by_verdict(sessions, verdicts) do
    severity = %{loop: :loop, suspect: :warning, progress: :normal}
    Enum.map(sessions, &%{&1 | severity: severity[Map.get(verdicts, &1.session_id, :progress)]})
  end
end
