defmodule ObservatoryWeb.AgentDetail do
  @moduledoc """
  The Agent Detail page (seed 003, "Kill Switch UI" and "Deactivation Reason
  Tracking"): one agent's status, its kill switch toggle and settings, its alert
  notifications, its current loop score and its recent events — written, like
  `ObservatoryWeb.SessionClusterManager`, as LiveView callbacks that are plain
  functions.

      {:ok, socket} = mount(%{"agent_id" => "agent-7"}, %{"operator" => "alice"}, Socket.new(connected?: true))
      {:noreply, socket} = handle_event("toggle_kill_switch", %{"enabled" => "true"}, socket)
      # a kill_switch event arrives on "gateway:kill_switch"
      {:noreply, socket} = handle_info(event, socket)
      html = render(socket.assigns) |> IO.iodata_to_binary()

  ## Callbacks

    * `mount/3` — `params["agent_id"]` names the agent. When connected, subscribes to
      `"gateway:kill_switch"` and schedules a periodic refresh (the score moves with
      every proxied request, which broadcasts nothing). Loads the agent, its score and
      its latest events. An unknown agent renders a "not registered" panel; the
      refresh picks the agent up when its first request registers it.
    * `handle_info/2` — an event about this agent (a trip, an operator's action, a
      settings change, from this page or anywhere else) reloads it; events about other
      agents are ignored.
    * `handle_event/3`:
      * `"toggle_kill_switch"` `%{"enabled" => "true" | "false"}` — turns the switch on
        or off. Turning it on while no alert notification is configured (neither the
        agent's webhook nor the global one) opens a prompt to configure one
        (seed: "Notification check on enable"); the switch is on either way.
      * `"save_settings"` `%{"window_size", "threshold", "mode"}` — form strings; the
        backend's validation messages are shown next to the fields, with the values as
        typed.
      * `"save_webhook"` `%{"notification_webhook"}` — the agent's webhook; blank
        removes it. Closes the prompt once alerts go somewhere.
      * `"dismiss_prompt"` — closes the prompt.
      * `"activate"`, `"deactivate"` (`%{"reason" => text}` optional) — as the
        operator; audited in the agent's events.
      * `"set_guidance"` `%{"setting" => "on" | "off" | "default"}` — guidance notes
        for the agent's looping sessions (`Observatory.Proxy.Guidance`).
      * `"save_budget"` — the budget's mode and limits (`Observatory.Budget.Settings`);
        a blank limit is no limit.
      * `"reset_budget"` — `%{"session_id" => id}` forgets what a session spent; no
        session, the agent's rolling window.
    * `render/1` — safe HTML iodata (`ObservatoryWeb.AgentDetail.View`); buttons carry
      `phx-click`/`phx-value-*`, forms `phx-submit`.

  Everything goes through `Observatory.KillSwitch`, `Observatory.Budget` and
  `Observatory.Proxy.Guidance` — the same functions the operator API
  (`ObservatoryWeb.API.Agents`) calls — so the page and the API cannot disagree.
  The agent the page acts on is the one it was mounted for: events carry no agent id.

  ## Session keys

    * `"operator"` — recorded in the agent's events (default `"dashboard"`);
    * `"agents_path"` — where the agents pages are mounted (default `"/agents"`), for
      links.
  """

  require Logger

  alias ObservatoryWeb.LivePage
  alias Observatory.{Budget, KillSwitch}
  alias Observatory.Proxy.Guidance
  alias ObservatoryWeb.AgentDetail.View
  alias ObservatoryWeb.SessionClusterManager.Socket

  @events ~w(toggle_kill_switch save_settings save_webhook dismiss_prompt activate deactivate
             set_guidance save_budget reset_budget)
  @budget_fields ~w(mode session_requests session_tokens session_cost_usd window_seconds
                    window_requests window_tokens window_cost_usd)
  @refresh {__MODULE__, :refresh}
  @events_shown 20
  @sessions_shown 10

  @type socket :: Socket.t() | struct()

  @doc "The events `handle_event/3` accepts."
  @spec events() :: [String.t()]
  def events, do: @events

  @doc "The topics `mount/3` subscribes a connected page to."
  @spec topics() :: [String.t()]
  def topics, do: [KillSwitch.topic()]

  @doc "Mounts the page for `params[\"agent_id\"]`; see the module doc."
  @spec mount(map() | :not_mounted_at_router, map(), socket) :: {:ok, socket}
        when socket: socket()
  def mount(params, session, socket) do
    id = agent_id(params)

    if Socket.connected?(socket) do
      for topic <- topics(), do: :ok = Observatory.Gateway.Events.subscribe(topic)
      LivePage.schedule_refresh(@refresh)
    end

    socket =
      socket
      |> Socket.assign(:agent_id, id)
      |> Socket.assign(:operator, LivePage.operator(session))
      |> Socket.assign(:agents_path, agents_path(session))
      |> Socket.assign(:page_title, "Agent #{id}")
      |> Socket.assign(:notice, nil)
      |> Socket.assign(:prompt, false)
      |> Socket.assign(:settings_form, nil)
      |> Socket.assign(:webhook_form, nil)
      |> Socket.assign(:budget_form, nil)
      |> load()

    {:ok, socket}
  end

  @doc "Handles a kill switch event or the periodic refresh; see the module doc."
  @spec handle_info(term(), socket) :: {:noreply, socket} when socket: socket()
  def handle_info(%{event_type: _, agent_id: id}, %{assigns: %{agent_id: id}} = socket) do
    {:noreply, load(socket)}
  end

  def handle_info(%{event_type: _, agent_id: _other}, socket), do: {:noreply, socket}

  def handle_info(@refresh, socket) do
    LivePage.schedule_refresh(@refresh)
    {:noreply, load(socket)}
  end

  def handle_info(message, socket) do
    Logger.debug("AgentDetail ignored an unexpected message: #{inspect(message)}")
    {:noreply, socket}
  end

  @doc "Handles an operator's click or form; see the module doc."
  @spec handle_event(String.t(), map(), socket) :: {:noreply, socket} when socket: socket()
  def handle_event(event, params, %{assigns: %{agent: nil}} = socket) when event in @events do
    Logger.debug("AgentDetail refused #{inspect(event)} #{inspect(params)}: no such agent")
    socket |> load() |> notice({:error, "No such agent."})
  end

  def handle_event("toggle_kill_switch", %{"enabled" => enabled}, socket)
      when enabled in ["true", "false"] do
    on? = enabled == "true"

    case configure(socket, %{"enabled" => on?}) do
      {:ok, agent} ->
        prompt? = on? and not KillSwitch.notifications_configured?(agent)

        message =
          cond do
            not on? -> "Kill switch off: nothing is scored or stopped."
            prompt? -> "Kill switch on. No alert notification is configured."
            true -> "Kill switch on."
          end

        socket
        |> Socket.assign(:prompt, prompt?)
        |> load()
        |> notice({:info, message})

      {:error, reason} ->
        notice(socket, {:error, "Could not change the kill switch: #{describe(reason)}."})
    end
  end

  def handle_event("save_settings", params, socket)
      when is_map_key(params, "window_size") or is_map_key(params, "threshold") do
    values = Map.take(params, ["window_size", "threshold", "mode"])

    changes =
      Map.new(values, fn
        {"window_size", value} -> {"window_size", integer(value)}
        {"threshold", value} -> {"threshold", number(value)}
        {"mode", value} -> {"mode", value}
      end)

    case configure(socket, changes) do
      {:ok, agent} ->
        %{window_size: size, threshold: threshold, mode: mode} = agent.kill_switch

        socket
        |> Socket.assign(:settings_form, nil)
        |> load()
        # The mode is named when it is not the default (enforce).
        |> notice(
          {:info,
           "Saved: window of #{size} requests, threshold #{threshold}" <>
             if(mode == :enforce, do: ".", else: ", #{mode} mode.")}
        )

      {:error, {:invalid, violations}} ->
        socket
        |> Socket.assign(:settings_form, form(values, violations))
        |> notice({:error, "Not saved: check the highlighted fields."})

      {:error, reason} ->
        notice(socket, {:error, "Not saved: #{describe(reason)}."})
    end
  end

  def handle_event("save_webhook", params, socket) when is_map(params) do
    value = params |> Map.get("notification_webhook", "") |> to_string() |> String.trim()

    case configure(socket, %{"notification_webhook" => blank_to_nil(value)}) do
      {:ok, agent} ->
        configured? = KillSwitch.notifications_configured?(agent)

        message =
          cond do
            agent.notification_webhook -> "Alerts for this agent go to its webhook."
            configured? -> "Webhook removed: alerts go to the global webhook."
            true -> "Webhook removed: no alert notification is configured."
          end

        # load/1 closes the prompt once alerts go somewhere.
        socket
        |> Socket.assign(:webhook_form, nil)
        |> load()
        |> notice({:info, message})

      {:error, {:invalid, violations}} ->
        # Shown in the form it came from: the prompt or the notifications panel.
        source = if params["form"] == "prompt", do: "prompt", else: "panel"
        values = %{"notification_webhook" => value, "form" => source}

        socket
        |> Socket.assign(:webhook_form, form(values, violations))
        |> notice({:error, "Not saved: check the webhook URL."})

      {:error, reason} ->
        notice(socket, {:error, "Not saved: #{describe(reason)}."})
    end
  end

  def handle_event("dismiss_prompt", _params, socket) do
    socket |> Socket.assign(:prompt, false) |> notice(nil)
  end

  def handle_event("activate", _params, socket) do
    opts = [operator: socket.assigns.operator, reason: "Activated from the dashboard"]

    case KillSwitch.activate(socket.assigns.agent_id, opts) do
      {:ok, _agent} -> socket |> load() |> notice({:info, "Activated: its window starts empty."})
      {:error, :already_active} -> socket |> load() |> notice({:info, "Already active."})
      {:error, reason} -> notice(socket, {:error, "Could not activate: #{describe(reason)}."})
    end
  end

  def handle_event("deactivate", params, socket) do
    reason = params |> Map.get("reason", "") |> to_string() |> String.trim()
    opts = [operator: socket.assigns.operator, reason: reason]

    case KillSwitch.deactivate(socket.assigns.agent_id, opts) do
      {:ok, _agent} ->
        socket |> load() |> notice({:info, "Deactivated: its requests are refused."})

      {:error, :already_inactive} ->
        socket |> load() |> notice({:info, "Already inactive."})

      {:error, reason} ->
        notice(socket, {:error, "Could not deactivate: #{describe(reason)}."})
    end
  end

  def handle_event("set_guidance", %{"setting" => setting}, socket)
      when setting in ["on", "off", "default"] do
    value = %{"on" => true, "off" => false, "default" => nil}[setting]
    opts = [operator: socket.assigns.operator]

    case Guidance.configure(socket.assigns.agent_id, value, opts) do
      {:ok, agent} ->
        message =
          if Guidance.enabled?(agent),
            do:
              "Guidance notes on: a looping session's next request tells the model what repeats.",
            else: "Guidance notes off: requests go upstream as the agent sent them."

        socket |> load() |> notice({:info, message})

      {:error, reason} ->
        notice(socket, {:error, "Not saved: #{describe(reason)}."})
    end
  end

  def handle_event("save_budget", params, socket) when is_map(params) do
    values = Map.take(params, @budget_fields)

    changes =
      Map.new(values, fn
        {"mode", value} -> {"mode", value}
        {key, value} -> {key, limit(value)}
      end)

    case Budget.configure(socket.assigns.agent_id, changes, operator: socket.assigns.operator) do
      {:ok, _agent} ->
        socket
        |> Socket.assign(:budget_form, nil)
        |> load()
        |> notice({:info, "Budget saved."})

      {:error, {:invalid, violations}} ->
        socket
        |> Socket.assign(:budget_form, form(values, violations))
        |> notice({:error, "Not saved: check the highlighted fields."})

      {:error, reason} ->
        notice(socket, {:error, "Not saved: #{describe(reason)}."})
    end
  end

  def handle_event("reset_budget", params, socket) do
    session = params["session_id"]
    opts = [operator: socket.assigns.operator]

    opts =
      if is_binary(session) and session != "", do: [{:session_id, session} | opts], else: opts

    case Budget.reset(socket.assigns.agent_id, opts) do
      {:ok, %{spent: spent}} ->
        what = if opts[:session_id], do: "Session #{session}", else: "The rolling window"

        socket
        |> load()
        |> notice(
          {:info,
           "#{what} reset (it had spent #{spent.requests} requests, #{spent[:tokens] || 0} tokens)."}
        )

      {:error, reason} ->
        notice(socket, {:error, "Not reset: #{describe(reason)}."})
    end
  end

  def handle_event(event, params, socket) do
    Logger.debug("AgentDetail refused event #{inspect(event)} #{inspect(params)}")
    notice(socket, {:error, "Unknown action."})
  end

  @doc "The page as HTML iodata; every agent-supplied string is escaped."
  @spec render(map()) :: iodata()
  def render(assigns), do: View.render(assigns)

  ## Helpers

  # Reads the agent, its score and events afresh. A form with errors is kept until it
  # is saved; without one the fields show the stored settings.
  defp load(socket) do
    id = socket.assigns.agent_id
    agent = id && KillSwitch.agent(id)

    configured? = agent != nil and KillSwitch.notifications_configured?(agent)
    enabled? = agent != nil and agent.kill_switch.enabled
    events = if agent, do: KillSwitch.events(agent_id: id, limit: @events_shown), else: []

    socket
    |> Socket.assign(:agent, agent)
    |> Socket.assign(:usage, agent && Budget.agent_usage(agent, sessions: @sessions_shown))
    |> Socket.assign(:notifications_configured, configured?)
    |> Socket.assign(:score, agent && score(agent))
    |> Socket.assign(:events, events)
    # The prompt stays open while it is still true: on, and alerts go nowhere.
    |> Socket.assign(:prompt, socket.assigns.prompt and enabled? and not configured?)
  end

  defp score(%{kill_switch: %{enabled: false}}), do: nil
  defp score(agent), do: KillSwitch.status(agent.id)

  defp configure(socket, changes) do
    KillSwitch.configure(socket.assigns.agent_id, changes, operator: socket.assigns.operator)
  end

  # Form fields arrive as strings: a whole number becomes one, anything else is passed
  # on as typed, so the backend's message shows the operator's own value.
  defp integer(value) when is_binary(value) do
    case Integer.parse(String.trim(value)) do
      {n, ""} -> n
      _ -> value
    end
  end

  defp integer(value), do: value

  defp number(value) when is_binary(value) do
    text = String.trim(value)

    case Integer.parse(text) do
      {n, ""} ->
        n

      _ ->
        case Float.parse(text) do
          {x, ""} -> x
          _ -> value
        end
    end
  end

  defp number(value), do: value

  # A budget limit as typed: blank is no limit.
  defp limit(value) when is_binary(value) do
    case String.trim(value) do
      "" -> nil
      text -> number(text)
    end
  end

  defp limit(value), do: value

  defp form(values, violations) do
    %{
      values: values,
      errors: Map.new(violations, fn %{path: path, reason: reason} -> {path, reason} end)
    }
  end

  defp describe(:agent_limit), do: "no more agents can be registered"
  defp describe(:invalid_agent_id), do: "an agent id is 1 to 256 bytes of UTF-8"
  defp describe(:not_found), do: "no such agent"
  defp describe(:not_this_agent), do: "the session belongs to another agent"

  defp describe(:no_majority),
    do: "this node cannot reach the majority of its cluster; use a node of the majority"

  defp describe(other), do: inspect(other)

  defp notice(socket, message), do: {:noreply, Socket.assign(socket, :notice, message)}

  defp blank_to_nil(""), do: nil
  defp blank_to_nil(value), do: value

  defp agent_id(%{"agent_id" => id}) when is_binary(id), do: id
  defp agent_id(_params), do: nil

  @doc false
  def agents_path(%{"agents_path" => "/" <> _ = path}), do: String.trim_trailing(path, "/")
  def agents_path(_session), do: "/agents"
end
