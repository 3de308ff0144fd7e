defmodule ObservatoryWeb.AgentDetailGradedTest do
  # The graded response on the Agent Detail page, its callbacks as plain functions:
  # guidance notes shown and switched, the kill switch's mode, the budget's limits and
  # mode, what the agent and its sessions spent (since the loop began too), resets,
  # and the new events; and the dashboard's Inspect panel and alert rows with a
  # session's spend. Changes the budgets' configuration: not async.
  use ExUnit.Case, async: false
  @moduletag :capture_log

  alias Observatory.{Budget, KillSwitch}
  alias Observatory.Budget.Store
  alias Observatory.KillSwitch.Agents
  alias ObservatoryWeb.AgentDetail
  alias ObservatoryWeb.SessionClusterManager.{Alerts, Socket, View}

  @hostile "<img src=x onerror=alert(1)>"

  setup do
    Observatory.TrackerCase.restore_env_on_exit([:budgets, :guidance])

    Application.put_env(:observatory, :budgets,
      prices: %{"gpt-test" => %{input: 2.0, output: 8.0}}
    )

    id = "agent-ui-graded-#{System.unique_integer([:positive])}"
    {:ok, _} = Agents.fetch_or_register(id)
    %{agent: id}
  end

  defp mount!(id) do
    {:ok, socket} =
      AgentDetail.mount(
        %{"agent_id" => id},
        %{"operator" => "alice"},
        Socket.new(connected?: true)
      )

    socket
  end

  defp event(socket, name, params \\ %{}) do
    {:noreply, socket} = AgentDetail.handle_event(name, params, socket)
    socket
  end

  defp html(socket), do: socket.assigns |> AgentDetail.render() |> IO.iodata_to_binary()

  # Counts a request and its usage in `session`, as the proxy does.
  defp spend(agent_id, session, usage \\ %{"prompt_tokens" => 1000, "completion_tokens" => 100}) do
    agent = KillSwitch.agent(agent_id)
    Budget.count_request(agent, session)
    Budget.record(agent, session, :chat_completions, "gpt-test", usage)
  end

  describe "Agent Detail: guidance notes shown and switched" do
    test "default, on, off: the setting, what is in force, the event", %{agent: id} do
      socket = mount!(id)

      assert html(socket) =~
               ~s(id="guidance-panel" class="panel" aria-labelledby="guidance-title" data-setting="default" data-enabled="false")

      assert html(socket) =~ "Default (off)"

      socket = event(socket, "set_guidance", %{"setting" => "on"})
      assert KillSwitch.agent(id).guidance == true
      assert {:info, "Guidance notes on: " <> _} = socket.assigns.notice
      assert html(socket) =~ ~s(data-setting="on" data-enabled="true")

      socket = event(socket, "set_guidance", %{"setting" => "off"})
      assert KillSwitch.agent(id).guidance == false
      assert html(socket) =~ ~s(data-setting="off" data-enabled="false")

      Application.put_env(:observatory, :guidance, enabled: true)
      socket = event(socket, "set_guidance", %{"setting" => "default"})
      assert html(socket) =~ ~s(data-setting="default" data-enabled="true")

      assert event(socket, "set_guidance", %{"setting" => "maybe"}).assigns.notice ==
               {:error, "Unknown action."}
    end
  end

  describe "Agent Detail: the kill switch's mode" do
    test "saved with the settings and said in the panel", %{agent: id} do
      {:ok, _} = KillSwitch.configure(id, %{"enabled" => true})
      socket = mount!(id)
      assert html(socket) =~ ~s(<option value="enforce" selected>)

      socket =
        event(socket, "save_settings", %{
          "window_size" => "5",
          "threshold" => "5.5",
          "mode" => "shadow"
        })

      assert KillSwitch.agent(id).kill_switch.mode == :shadow

      assert socket.assigns.notice ==
               {:info, "Saved: window of 5 requests, threshold 5.5, shadow mode."}

      page = html(socket)
      assert page =~ ~s(<option value="shadow" selected>)
      assert page =~ "in <strong>shadow</strong> mode"

      socket =
        event(socket, "save_settings", %{
          "window_size" => "5",
          "threshold" => "5.5",
          "mode" => "off"
        })

      assert html(socket) =~ "Mode must be enforce, warn or shadow, got: &quot;off&quot;"
    end
  end

  describe "Agent Detail: the budget" do
    test "limits and mode saved; a bad value shown next to its field", %{agent: id} do
      socket = mount!(id)

      assert html(socket) =~
               ~s(id="budget-panel" class="panel ad-budget" aria-labelledby="budget-title" data-mode="enforce")

      socket =
        event(socket, "save_budget", %{
          "mode" => "warn",
          "session_tokens" => "50000",
          "session_cost_usd" => "0.5",
          "window_requests" => "",
          "window_seconds" => "600"
        })

      assert %{
               mode: :warn,
               session_tokens: 50_000,
               session_cost_usd: 0.5,
               window_requests: nil,
               window_seconds: 600
             } = KillSwitch.agent(id).budget

      assert socket.assigns.notice == {:info, "Budget saved."}
      assert html(socket) =~ ~s(id="budget-session_tokens" name="session_tokens" type="number")

      socket = event(socket, "save_budget", %{"session_tokens" => "-3", "window_seconds" => "5"})
      page = html(socket)
      assert page =~ "Tokens per session must be an integer &gt;= 0 or null, got: -3"
      assert page =~ "Window (seconds) must be an integer from 60 to 2592000, got: 5"
      assert KillSwitch.agent(id).budget.session_tokens == 50_000
    end

    test "what the agent and its sessions spent, since the loop began; resets", %{agent: id} do
      session = "sess-ui-#{id}"
      spend(id, session)
      Budget.loop_began(session)
      spend(id, session)
      spend(id, @hostile)

      socket = mount!(id)
      page = html(socket)
      # 3 × (1000 × 2 + 100 × 8) per million.
      assert page =~ ~s(<dd id="budget-total">3 requests · 3,300 tokens · $0.0084</dd>)

      assert page =~
               ~s(<td class="mono">#{session}</td><td class="num">2</td><td class="num">2,200</td><td class="num">$0.0056</td><td>1 request · 1,100 tokens · $0.0028</td>)

      # A session id is text.
      assert page =~ "&lt;img src=x onerror=alert(1)&gt;"
      refute page =~ @hostile

      socket = event(socket, "reset_budget", %{"session_id" => session})
      assert {:info, "Session " <> _} = socket.assigns.notice
      assert Budget.session_usage(session).requests == 0

      socket = event(socket, "reset_budget")
      assert {:info, "The rolling window reset" <> _} = socket.assigns.notice
      assert html(socket) =~ ~s(<dd id="budget-window">0 requests · 0 tokens</dd>)

      assert [%{event_type: "budget_reset"}, %{event_type: "budget_reset"} | _] =
               socket.assigns.events
    end

    test "the new events have their titles and words", %{agent: id} do
      {:ok, _} = Budget.configure(id, %{"session_requests" => 0})
      Budget.check(KillSwitch.agent(id), "sess-ev-#{id}")

      {:ok, _} =
        Agents.record_event(id, "guidance_injected", %{
          session_id: "s",
          source: "loop_verdict",
          note: "[Observatory] Loop warning: <b>x</b>"
        })

      {:ok, _} =
        Agents.record_event(id, "kill_switch_would_trip", %{
          mode: "shadow",
          score: 7.5,
          threshold: 5.5,
          repeated_tool_calls: 3,
          similar_prompts: 3,
          similar_responses: 0
        })

      page = html(mount!(id))
      assert page =~ ~s(<span class="ad-event-type">Budget exhausted</span>)

      assert page =~
               "budget_exhausted: session sess-ev-#{id} has used 0 requests of its 0 requests"

      assert page =~ ~s(<span class="ad-event-type">Guidance note</span>)
      assert page =~ "[Observatory] Loop warning: &lt;b&gt;x&lt;/b&gt;"
      assert page =~ ~s(<span class="ad-event-type">Kill switch would have stopped it</span>)
      assert page =~ "In shadow mode: score 7.50 exceeded the threshold 5.50"
    end
  end

  describe "dashboard: a session's tokens and cost, and what it spent since the loop began" do
    test "the Inspect panel and the alert row show them", %{agent: id} do
      session = "sess-dash-#{id}"
      spend(id, session)
      Budget.loop_began(session)
      spend(id, session)
      usage = Budget.session_usage(session)

      inspect = %{
        session_id: session,
        agent_id: id,
        window: [],
        score: nil,
        severity: nil,
        verdict: nil,
        alert: nil,
        pause: nil,
        messages: 2,
        steps: [],
        explained: %{verdict: nil, window: nil},
        usage: usage
      }

      row = %{
        session_id: session,
        agent_id: id,
        source: :entropy,
        rule: :entropy,
        reason: "5 of the last 5 steps are x",
        entropy_score: 0.2,
        window_size: 5,
        pattern: nil,
        occurrence_count: 5,
        alerts: 3,
        since: DateTime.utc_now(),
        last_at: DateTime.utc_now(),
        usage: usage
      }

      assigns = %{
        notice: nil,
        fleet: ObservatoryWeb.SessionClusterManager.Fleet.snapshot([], []),
        alerts: Alerts.replace(Alerts.new(), [row]),
        inspect: inspect,
        steps: []
      }

      page = assigns |> View.render() |> IO.iodata_to_binary()
      assert page =~ ~s(<span id="inspect-spent">2 requests · 2,200 tokens · $0.0056</span>)

      assert page =~
               ~s(<span id="inspect-since-loop">1 request · 1,100 tokens · $0.0028 <span class="muted">since)

      assert page =~ "spent since: 1 request · 1,100 tokens · $0.0028"
      assert Store.session_meta(session).loop_at
    end
  end
end
