defmodule ObservatoryWeb.AgentDetailTest do
  # The Agent Detail page's callbacks as plain functions: no browser, no HTTP. The test
  # process plays the page process: mount/3 subscribes it to "gateway:kill_switch",
  # and the kill switch's real broadcasts land in its mailbox. Changes the global
  # webhook in some tests: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.KillSwitch
  alias Observatory.KillSwitch.{Agents, Windows}
  alias ObservatoryWeb.{AgentDetail, AgentList}
  alias ObservatoryWeb.AgentDetail.View
  alias ObservatoryWeb.SessionClusterManager.Socket

  @hostile "<img src=x onerror=alert(1)>"
  @loop %{prompt_hash: 42, tool_signatures: [], stream: false}

  setup do
    saved = Application.get_env(:observatory, :kill_switch)
    on_exit(fn -> Application.put_env(:observatory, :kill_switch, saved) end)
    %{agent: "agent-ui-#{System.unique_integer([:positive])}"}
  end

  defp register(id) do
    {:ok, agent} = Agents.fetch_or_register(id)
    agent
  end

  defp mount!(id, opts \\ [connected?: true]) do
    {:ok, socket} =
      AgentDetail.mount(%{"agent_id" => id}, %{"operator" => "alice"}, Socket.new(opts))

    socket
  end

  defp event(socket, name, params \\ %{}) do
    {:noreply, socket} = AgentDetail.handle_event(name, params, socket)
    socket
  end

  defp info(socket, message) do
    {:noreply, socket} = AgentDetail.handle_info(message, socket)
    socket
  end

  defp html(socket), do: socket.assigns |> AgentDetail.render() |> IO.iodata_to_binary()

  # Enables the switch with a threshold of 1 and sends the same prompt until it trips.
  defp trip!(id) do
    {:ok, _} = KillSwitch.configure(id, %{enabled: true, window_size: 5, threshold: 1})
    capture_log(fn -> for _ <- 1..3, do: KillSwitch.check_request(id, @loop) end)
    %{deactivated_by: :kill_switch} = Agents.get(id)
  end

  defp set_global_webhook(url) do
    config = Application.get_env(:observatory, :kill_switch, [])

    Application.put_env(
      :observatory,
      :kill_switch,
      Keyword.put(config, :notification_webhook, url)
    )
  end

  # What the status indicator says.
  defp indicator(page) do
    [_, label] =
      Regex.run(~r{<span id="agent-status"[^>]*><span class="dot"></span>([^<]+)</span>}, page)

    label
  end

  describe "mount/3" do
    test "subscribes to gateway:kill_switch when connected and loads the agent", %{agent: id} do
      register(id)
      socket = mount!(id)

      assert AgentDetail.topics() == ["gateway:kill_switch"]
      Observatory.Gateway.Events.broadcast("gateway:kill_switch", %{probe: id})
      assert_receive %{probe: ^id}

      assert %{agent_id: ^id, operator: "alice", agents_path: "/agents", prompt: false} =
               socket.assigns

      assert socket.assigns.agent.id == id
      assert socket.assigns.page_title == "Agent #{id}"
    end

    test "an unconnected mount (the first HTTP render) renders without subscribing", %{agent: id} do
      register(id)
      socket = mount!(id, connected?: false)
      Observatory.Gateway.Events.broadcast("gateway:kill_switch", %{probe: id})
      refute_receive %{probe: ^id}, 50
      assert html(socket) =~ ~s(id="kill-switch-panel")
    end

    test "an unknown agent gets a panel saying so, and no toggle or actions", %{agent: id} do
      socket = mount!(id)
      page = html(socket)

      assert socket.assigns.agent == nil
      assert page =~ ~s(id="agent-missing")
      assert page =~ "No agent is registered as <code>#{id}</code>"
      # Both ways in: the page cannot know where a host mounted the agents API.
      assert page =~ "<code>POST /api/v1/agents/:id/keys</code> on the agents API"
      assert page =~ "under the path a host app mounts it at"
      assert page =~ "<code>Observatory.AgentKeys.issue/2</code> from Elixir"
      refute page =~ "kill-switch-toggle"
      refute page =~ ~s(phx-click="activate")

      assert event(socket, "toggle_kill_switch", %{"enabled" => "true"}).assigns.notice ==
               {:error, "No such agent."}

      assert Agents.get(id) == nil, "the page never registers an agent"
    end

    test "the refresh picks up an agent registered after the page opened", %{agent: id} do
      socket = mount!(id)
      register(id)
      socket = info(socket, {AgentDetail, :refresh})
      assert socket.assigns.agent.id == id
      assert html(socket) =~ ~s(id="kill-switch-toggle")
    end
  end

  describe "Kill Switch UI: Toggle visibility" do
    test "viewing the Agent Detail page shows the toggle and the settings", %{agent: id} do
      register(id)
      page = mount!(id) |> html()

      assert page =~
               ~s(<button type="button" id="kill-switch-toggle" class="switch" role="switch" aria-checked="false" aria-labelledby="ks-title" phx-click="toggle_kill_switch" phx-value-enabled="true">)

      assert page =~ ~s(<span class="switch-label">Off</span>)

      assert page =~
               ~s(<form id="kill-switch-settings" class="ad-form" phx-submit="save_settings" novalidate>)

      assert page =~
               ~r/<input id="ks-window_size" name="window_size" type="number"[^>]* value="5"/

      assert page =~ ~r/<input id="ks-threshold" name="threshold" type="number"[^>]* value="5.5"/
      assert page =~ "Off: nothing is scored or stopped."
    end

    test "an enabled switch shows as on, with the settings it has", %{agent: id} do
      {:ok, _} = KillSwitch.configure(id, %{enabled: true, window_size: 6, threshold: 7.5})
      page = mount!(id) |> html()

      assert page =~ ~s(role="switch" aria-checked="true")
      assert page =~ ~s(phx-value-enabled="false")
      assert page =~ ~s(<span class="switch-label">On</span>)
      assert page =~ ~r/name="window_size"[^>]* value="6"/
      assert page =~ ~r/name="threshold"[^>]* value="7.5"/
    end

    test "negative: turning the switch off hides nothing, and says nothing is blocked", %{
      agent: id
    } do
      {:ok, _} = KillSwitch.configure(id, %{enabled: true})
      socket = mount!(id) |> event("toggle_kill_switch", %{"enabled" => "false"})

      assert %{kill_switch: %{enabled: false}} = Agents.get(id)
      page = html(socket)
      assert page =~ ~s(aria-checked="false")
      assert page =~ ~s(id="kill-switch-settings")
      assert socket.assigns.notice == {:info, "Kill switch off: nothing is scored or stopped."}
      assert page =~ "The switch is off: no window, no score."
    end

    test "negative: a toggle with a bad value changes nothing", %{agent: id} do
      register(id)
      socket = mount!(id) |> event("toggle_kill_switch", %{"enabled" => "maybe"})
      assert socket.assigns.notice == {:error, "Unknown action."}
      assert %{kill_switch: %{enabled: false}} = Agents.get(id)
    end
  end

  describe "Kill Switch UI: Notification check on enable" do
    test "enabling with no alert notification configured prompts for one", %{agent: id} do
      register(id)
      socket = mount!(id) |> event("toggle_kill_switch", %{"enabled" => "true"})

      assert %{kill_switch: %{enabled: true}} = Agents.get(id)
      assert socket.assigns.prompt

      assert socket.assigns.notice ==
               {:info, "Kill switch on. No alert notification is configured."}

      page = html(socket)
      assert page =~ ~s(<section id="notification-prompt" class="ad-prompt" role="alertdialog")
      assert page =~ "Configure alert notifications"

      assert page =~
               ~s(<form id="prompt-webhook" class="ad-form" phx-submit="save_webhook" novalidate>)

      assert page =~ ~s(<input id="prompt-webhook-url" name="notification_webhook")
      assert page =~ ~s(phx-click="dismiss_prompt">Not now</button>)

      assert page =~
               ~s(id="notifications-panel" class="panel" aria-labelledby="notif-title" data-configured="false")
    end

    test "a webhook saved from the prompt closes it, and alerts are configured", %{agent: id} do
      register(id)

      socket =
        mount!(id)
        |> event("toggle_kill_switch", %{"enabled" => "true"})
        |> event("save_webhook", %{
          "notification_webhook" => " https://hooks.example.com/a ",
          "form" => "prompt"
        })

      assert %{notification_webhook: "https://hooks.example.com/a"} = Agents.get(id)
      refute socket.assigns.prompt
      assert socket.assigns.notifications_configured
      page = html(socket)
      refute page =~ "notification-prompt"
      assert page =~ ~s(data-configured="true")
      # Shown back redacted only: a webhook URL is a secret (hardening round 2, finding 8).
      assert page =~ ~s(<code class="ad-url">https://hooks.example.com/…</code>)
      refute page =~ "hooks.example.com/a"
    end

    test "a bad webhook keeps the prompt open with the message next to its field", %{agent: id} do
      register(id)

      socket =
        mount!(id)
        |> event("toggle_kill_switch", %{"enabled" => "true"})
        |> event("save_webhook", %{
          "notification_webhook" => ~s("><script>x</script>),
          "form" => "prompt"
        })

      assert socket.assigns.prompt
      assert %{notification_webhook: nil} = Agents.get(id)
      page = html(socket)

      assert page =~
               ~s(<p id="prompt-webhook-url-error" class="field-error">Webhook URL must be an http:// or https:// URL)

      assert page =~ ~s(value="&quot;&gt;&lt;script&gt;x&lt;/script&gt;")
      refute page =~ "<script>"
      refute page =~ ~s(id="webhook-url-error"), "only the form it came from shows the error"
    end

    test "dismissing the prompt leaves the switch on", %{agent: id} do
      register(id)

      socket =
        mount!(id)
        |> event("toggle_kill_switch", %{"enabled" => "true"})
        |> event("dismiss_prompt")

      refute socket.assigns.prompt
      refute html(socket) =~ "notification-prompt"
      assert %{kill_switch: %{enabled: true}} = Agents.get(id)
      assert html(socket) =~ "None: when the kill switch stops this agent, nobody is told."
    end

    test "negative: no prompt when the agent has a webhook", %{agent: id} do
      {:ok, _} = KillSwitch.configure(id, %{notification_webhook: "https://hooks.example.com/b"})
      socket = mount!(id) |> event("toggle_kill_switch", %{"enabled" => "true"})

      assert %{kill_switch: %{enabled: true}} = Agents.get(id)
      refute socket.assigns.prompt
      assert socket.assigns.notice == {:info, "Kill switch on."}
      refute html(socket) =~ "notification-prompt"
    end

    test "negative: no prompt when the global webhook is set", %{agent: id} do
      set_global_webhook("https://hooks.example.com/global")
      register(id)
      socket = mount!(id) |> event("toggle_kill_switch", %{"enabled" => "true"})

      refute socket.assigns.prompt
      page = html(socket)
      refute page =~ "notification-prompt"
      assert page =~ "POSTed to the global webhook"
      refute page =~ "hooks.example.com/global", "the global URL is not shown"
    end

    test "negative: turning the switch off never prompts", %{agent: id} do
      {:ok, _} = KillSwitch.configure(id, %{enabled: true})
      socket = mount!(id) |> event("toggle_kill_switch", %{"enabled" => "false"})
      refute socket.assigns.prompt
      refute html(socket) =~ "notification-prompt"
    end

    test "the prompt closes when a webhook is set elsewhere (the API)", %{agent: id} do
      register(id)
      socket = mount!(id) |> event("toggle_kill_switch", %{"enabled" => "true"})
      assert_receive %{event_type: "settings_changed", agent_id: ^id}

      {:ok, _} = KillSwitch.configure(id, %{notification_webhook: "https://hooks.example.com/c"})
      assert_receive %{event_type: "settings_changed", agent_id: ^id} = changed
      socket = info(socket, changed)
      refute socket.assigns.prompt
    end
  end

  describe "Kill Switch UI: Configure parameters" do
    test "with the switch enabled, window_size and threshold are saved", %{agent: id} do
      {:ok, _} = KillSwitch.configure(id, %{enabled: true})
      socket = mount!(id) |> event("save_settings", %{"window_size" => "5", "threshold" => "8"})

      assert %{kill_switch: %{enabled: true, window_size: 5, threshold: 8.0}} = Agents.get(id)

      assert socket.assigns.notice ==
               {:info, "Saved: window of 5 requests, threshold 8.0."}

      assert socket.assigns.settings_form == nil

      [changed | _] = KillSwitch.events(agent_id: id)
      assert %{event_type: "settings_changed", details: %{operator: "alice"}} = changed
      assert changed.details.changes == %{window_size: 5, threshold: 8.0}

      page = html(socket)
      assert page =~ ~r/name="window_size"[^>]* value="5"/
      assert page =~ ~r/name="threshold"[^>]* value="8.0"/
      assert page =~ "A window of 5 scores at most 18.0."
      assert page =~ ~s(<code>threshold</code> 8.0, <code>window_size</code> 5)
    end

    test "one field alone is a partial update; a form with neither is refused", %{agent: id} do
      {:ok, _} = KillSwitch.configure(id, %{enabled: true, window_size: 7})
      socket = mount!(id) |> event("save_settings", %{"threshold" => "12"})
      assert %{kill_switch: %{window_size: 7, threshold: 12.0}} = Agents.get(id)

      assert event(socket, "save_settings", %{"enabled" => "false"}).assigns.notice ==
               {:error, "Unknown action."}

      assert %{kill_switch: %{enabled: true}} = Agents.get(id)
    end

    test "a decimal threshold is accepted", %{agent: id} do
      {:ok, _} = KillSwitch.configure(id, %{enabled: true})
      mount!(id) |> event("save_settings", %{"window_size" => "12", "threshold" => "9.5"})
      assert %{kill_switch: %{window_size: 12, threshold: 9.5}} = Agents.get(id)
    end

    test "negative: out-of-range values are refused with the backend's messages next to the fields",
         %{agent: id} do
      {:ok, _} = KillSwitch.configure(id, %{enabled: true, window_size: 7, threshold: 6})
      events_before = KillSwitch.events(agent_id: id)

      socket = mount!(id) |> event("save_settings", %{"window_size" => "1", "threshold" => "0"})

      assert %{kill_switch: %{window_size: 7, threshold: 6.0}} = Agents.get(id)
      assert KillSwitch.events(agent_id: id) == events_before
      assert socket.assigns.notice == {:error, "Not saved: check the highlighted fields."}

      page = html(socket)
      assert page =~ ~r/name="window_size"[^>]* value="1"[^>]* aria-invalid="true"/
      assert page =~ ~r/name="threshold"[^>]* value="0"[^>]* aria-invalid="true"/

      assert page =~
               ~s(<p id="ks-window_size-error" class="field-error">Window size must be an integer from 2 to 1000, got: 1</p>)

      assert page =~
               ~s(<p id="ks-threshold-error" class="field-error">Threshold must be a number greater than 0, got: 0</p>)

      # A later valid save clears the errors.
      socket = event(socket, "save_settings", %{"window_size" => "8", "threshold" => "6"})
      refute html(socket) =~ "field-error"
      assert %{kill_switch: %{window_size: 8}} = Agents.get(id)
    end

    test "negative: text where a number belongs is refused, shown as typed and escaped", %{
      agent: id
    } do
      register(id)

      socket =
        mount!(id)
        |> event("save_settings", %{"window_size" => "ten", "threshold" => "<b>8</b>"})

      page = html(socket)
      assert page =~ ~s(Window size must be an integer from 2 to 1000, got: &quot;ten&quot;)

      assert page =~
               ~s(Threshold must be a number greater than 0, got: &quot;&lt;b&gt;8&lt;/b&gt;&quot;)

      assert page =~ ~s(value="&lt;b&gt;8&lt;/b&gt;")
      refute page =~ "<b>8</b>"
      assert %{kill_switch: %{window_size: 5, threshold: 5.5}} = Agents.get(id)
    end

    test "a threshold the window can never exceed is pointed out", %{agent: id} do
      {:ok, _} = KillSwitch.configure(id, %{enabled: true})
      socket = mount!(id) |> event("save_settings", %{"window_size" => "3", "threshold" => "9"})

      assert html(socket) =~
               "A window of 3 scores at most 9.0: a threshold of 9.0 is never exceeded"
    end
  end

  describe "Deactivation Reason Tracking: Display deactivation reason in dashboard" do
    test "an agent the kill switch stopped shows \"Deactivated by Kill Switch\", live", %{
      agent: id
    } do
      register(id)
      socket = mount!(id)
      assert indicator(html(socket)) == "Active"

      trip!(id)
      assert_receive %{event_type: "kill_switch", agent_id: ^id} = tripped
      socket = info(socket, tripped)
      page = html(socket)

      assert indicator(page) == "Deactivated by Kill Switch"

      assert page =~
               ~s(id="agent-status" class="ad-status ad-status-deactivated_by_kill_switch" data-status="deactivated_by_kill_switch")

      assert page =~ "The kill switch stopped this agent"
      # What stops it on each way in: the proxy, its steps, its tool-call checks.
      assert page =~ "answered with a <code>stop</code> directive, its tool-call checks denied"
      assert page =~ ~s(phx-click="activate">Activate</button>)
      refute page =~ ~s(phx-submit="deactivate")

      # The event with its details, and the score that tripped it.
      assert page =~ ~s(data-event-type="kill_switch")

      assert page =~
               "Score 2.00 exceeded the threshold 1.00: 2 similar prompts × 1.0 + 0 similar responses × 2.0 + 0 repeated tool calls × 1.5, over 3 of 5 requests."

      assert page =~ ~s(<span id="score-value" class="ad-score-n over">2.00</span>)
      assert page =~ ~s(<dd id="score-window">3 of 5 requests</dd>)
      assert page =~ ~r/Similar prompts<\/dt><dd>2 <span class="muted">× 1.0 = 2.0/
    end

    test "activating from the page shows \"Active\" and clears the window", %{agent: id} do
      register(id)
      trip!(id)
      socket = mount!(id) |> event("activate")

      assert %{active: true, deactivated_by: nil} = Agents.get(id)
      assert Windows.status(id) == nil
      assert socket.assigns.notice == {:info, "Activated: its window starts empty."}
      page = html(socket)
      assert indicator(page) == "Active"
      assert page =~ "No request scored yet"

      assert [%{event_type: "activation", details: %{operator: "alice"} = details} | _] =
               KillSwitch.events(agent_id: id)

      assert details.previously_deactivated_by == :kill_switch
      assert page =~ "it had been deactivated by the kill switch"
      assert event(socket, "activate").assigns.notice == {:info, "Already active."}
    end

    test "negative: an active agent does not show it", %{agent: id} do
      register(id)
      page = mount!(id) |> html()
      assert indicator(page) == "Active"
      refute page =~ "Deactivated by Kill Switch"
    end

    test "negative: events about other agents change nothing", %{agent: id} do
      register(id)
      other = id <> "-other"
      register(other)
      socket = mount!(id)
      trip!(other)
      assert_receive %{event_type: "kill_switch", agent_id: ^other} = tripped
      assert info(socket, tripped) == socket
    end
  end

  describe "Deactivation Reason Tracking: Display manual deactivation in dashboard" do
    test "an agent an operator deactivated shows the standard \"Inactive\"", %{agent: id} do
      register(id)
      socket = mount!(id) |> event("deactivate", %{"reason" => "  maintenance "})

      assert %{active: false, deactivated_by: :manual} = Agents.get(id)
      page = html(socket)
      assert indicator(page) == "Inactive"
      refute page =~ "Deactivated by Kill Switch"
      assert page =~ ~s(data-status="inactive")
      assert page =~ "Deactivated by an operator"
      assert page =~ "answered with a <code>stop</code> directive"
      assert page =~ ~s{By <span class="ad-who">alice</span> (maintenance).}
      assert event(socket, "deactivate").assigns.notice == {:info, "Already inactive."}
    end

    test "an inactive agent whose deactivated_by is null shows \"Inactive\" too" do
      now = DateTime.utc_now()

      agent = %{
        id: "agent-legacy",
        active: false,
        deactivated_by: nil,
        deactivated_at: nil,
        kill_switch: %{enabled: false, window_size: 10, threshold: 10.0},
        notification_webhook: nil,
        created_at: now,
        updated_at: now
      }

      assigns = %{
        agent_id: agent.id,
        agent: agent,
        agents_path: "/agents",
        notice: nil,
        prompt: false,
        settings_form: nil,
        webhook_form: nil,
        notifications_configured: false,
        score: nil,
        events: []
      }

      page = assigns |> View.render() |> IO.iodata_to_binary()
      assert indicator(page) == "Inactive"
      refute page =~ "Deactivated by Kill Switch"
    end

    test "negative: a manual deactivation of a tripped agent is not possible twice", %{agent: id} do
      register(id)
      trip!(id)
      socket = mount!(id) |> event("deactivate")
      assert socket.assigns.notice == {:info, "Already inactive."}
      assert indicator(html(socket)) == "Deactivated by Kill Switch"
    end
  end

  describe "escaping" do
    test "a hostile agent id is text everywhere, and URL-encoded in links" do
      id = @hostile <> "#{System.unique_integer([:positive])}"
      register(id)
      page = mount!(id) |> event("deactivate", %{"reason" => "<b>why</b>"}) |> html()

      refute page =~ "<img"
      refute page =~ "<b>why</b>"
      assert page =~ ~s{<h1 id="agent-title" class="mono">&lt;img src=x onerror=alert(1)&gt;}
      assert page =~ ~s{data-agent-id="&lt;img src=x onerror=alert(1)&gt;}
      assert page =~ "(&lt;b&gt;why&lt;/b&gt;)"

      assert View.agent_path("/agents", @hostile) ==
               "/agents/%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E"
    end
  end

  test "an unknown event is refused with a notice", %{agent: id} do
    register(id)
    socket = mount!(id)
    after_event = event(socket, "drop_tables", %{})
    assert after_event.assigns.notice == {:error, "Unknown action."}
    assert after_event.assigns.agent == socket.assigns.agent
  end

  describe "AgentList" do
    test "lists agents with their status indicator and a link to their page", %{agent: id} do
      register(id)
      tripped = id <> "-tripped"
      register(tripped)
      trip!(tripped)
      hostile = @hostile <> "#{System.unique_integer([:positive])}"
      register(hostile)

      {:ok, socket} = AgentList.mount(%{}, %{}, Socket.new(connected?: true))
      page = socket.assigns |> AgentList.render() |> IO.iodata_to_binary()

      assert AgentList.events() == []

      assert page =~
               ~s(<a class="mono agent-link" href="/agents/#{id}"#{ObservatoryWeb.HTML.navigate()}>#{id}</a>)

      assert page =~ ~r/data-agent-id="#{tripped}">.*?Deactivated by Kill Switch/
      assert page =~ ~r/data-agent-id="#{tripped}">.*?<span class="ad-on">on<\/span>/
      assert page =~ ~s(href="/agents/%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E)
      refute page =~ "<img"

      # Live: an event reloads the list.
      {:ok, _} = KillSwitch.deactivate(id, operator: "bob")
      assert_receive %{event_type: "manual_deactivation", agent_id: ^id} = deactivated
      {:noreply, socket} = AgentList.handle_info(deactivated, socket)
      page = socket.assigns |> AgentList.render() |> IO.iodata_to_binary()
      assert page =~ ~r/data-agent-id="#{id}">.*?data-status="inactive"/
    end
  end
end
