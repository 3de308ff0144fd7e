defmodule Observatory.KillSwitchTest do
  # The kill switch's public API over Mnesia and the window store; one agent per test.
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias Observatory.{Gateway.Events, JSON, KillSwitch}
  alias Observatory.KillSwitch.{Agents, Windows}
  alias Observatory.Test.Upstream

  setup do
    %{agent: "agent-ks-#{System.unique_integer([:positive])}"}
  end

  # The same prompt every time, up to its numbers: what a looping agent sends.
  defp looping(k),
    do: fingerprint(Upstream.request("Attempt #{k}: retry the deploy of build 4821."))

  defp fingerprint(body) do
    {:ok, fp} = KillSwitch.fingerprint_request(JSON.encode!(body))
    fp
  end

  # The score of each request, up to `:stopped` for the one that was refused.
  defp send_until_stopped(agent, max) do
    1..max
    |> Enum.reduce_while([], fn k, scores ->
      case KillSwitch.check_request(agent, looping(k)) do
        {:ok, verdict} -> {:cont, [verdict && verdict.score | scores]}
        {:error, {:inactive, _}} -> {:halt, [:stopped | scores]}
      end
    end)
    |> Enum.reverse()
  end

  describe "Kill Switch Configuration" do
    test "Enable kill switch", %{agent: agent} do
      {:ok, agent_record} = KillSwitch.configure(agent, %{"enabled" => true, "threshold" => 3})
      assert agent_record.kill_switch.enabled

      capture_log(fn ->
        # Prompt similarity alone: scores 0, 1, 2, 3, then 4 > 3 stops the agent.
        assert send_until_stopped(agent, 10) == [0.0, 1.0, 2.0, 3.0, :stopped]
      end)

      assert %{active: false, deactivated_by: :kill_switch} = Agents.get(agent)
    end

    test "Disable kill switch", %{agent: agent} do
      # Off by default: a new agent is registered with the switch disabled.
      {:ok, _} = Agents.fetch_or_register(agent)
      assert {:ok, nil} = KillSwitch.check_request(agent, looping(0))
      assert %{kill_switch: %{enabled: false}, active: true} = Agents.get(agent)

      for k <- 1..50, do: assert({:ok, nil} = KillSwitch.check_request(agent, looping(k)))
      assert Windows.entries(agent) == nil, "no loop detection: no window at all"

      # Turning it off drops the window of an agent that had one.
      {:ok, _} = KillSwitch.configure(agent, %{enabled: true, threshold: 100})
      for k <- 1..5, do: KillSwitch.check_request(agent, looping(k))
      assert length(Windows.entries(agent)) == 5
      {:ok, _} = KillSwitch.configure(agent, %{enabled: false, threshold: 1})
      assert Windows.entries(agent) == nil
      for k <- 1..20, do: assert({:ok, nil} = KillSwitch.check_request(agent, looping(k)))
      assert Agents.get(agent).active
    end

    test "Configure window size", %{agent: agent} do
      {:ok, _} = KillSwitch.configure(agent, %{enabled: true, window_size: 4, threshold: 100})
      scores = for k <- 1..10, do: elem(KillSwitch.check_request(agent, looping(k)), 1).score

      # The last 4 requests: a request is compared with the 3 before it, never more.
      assert scores == [0.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
      assert %{window_len: 4, window_size: 4} = KillSwitch.status(agent)

      # A smaller size applies at once.
      {:ok, _} = KillSwitch.configure(agent, %{window_size: 2})
      assert %{window_len: 2, window_size: 2, score: 1.0} = KillSwitch.status(agent)
    end

    test "Configure threshold", %{agent: agent} do
      {:ok, _} = KillSwitch.configure(agent, %{enabled: true, window_size: 20, threshold: 5})

      capture_log(fn ->
        # Reaching 5.0 is not exceeding it; 6.0 is.
        assert send_until_stopped(agent, 20) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, :stopped]
      end)

      [event] = KillSwitch.events(agent_id: agent, limit: 1)
      assert event.details.score == 6.0
      assert event.details.threshold == 5.0
    end
  end

  describe "Kill Switch State Management" do
    test "Clear window on activate", %{agent: agent} do
      {:ok, _} = KillSwitch.configure(agent, %{enabled: true, threshold: 2})
      capture_log(fn -> send_until_stopped(agent, 10) end)
      assert length(Windows.entries(agent)) == 4, "the window is kept while inactive"

      {:ok, _} = KillSwitch.activate(agent, operator: "alice")
      assert Windows.entries(agent) == nil
      assert KillSwitch.status(agent) == nil
      assert {:ok, %{score: 0.0, window_len: 1}} = KillSwitch.check_request(agent, looping(99))

      # Activating an agent that is active changes nothing and clears nothing.
      assert {:error, :already_active} = KillSwitch.activate(agent, operator: "alice")
      assert length(Windows.entries(agent)) == 1
    end
  end

  describe "Deactivation Reason Tracking" do
    test "Store deactivation reason", %{agent: agent} do
      {:ok, _} = KillSwitch.configure(agent, %{enabled: true, threshold: 1})
      capture_log(fn -> send_until_stopped(agent, 10) end)

      assert %{active: false, deactivated_by: :kill_switch, deactivated_at: %DateTime{}} =
               Agents.get(agent)

      manual = agent <> "-manual"
      {:ok, _} = Agents.fetch_or_register(manual)

      assert {:ok, %{deactivated_by: :manual}} =
               KillSwitch.deactivate(manual, operator: "bob", reason: "maintenance")

      assert %{active: false, deactivated_by: :manual} = Agents.get(manual)
      assert {:error, :already_inactive} = KillSwitch.deactivate(manual, operator: "bob")
      assert {:error, :not_found} = KillSwitch.deactivate(agent <> "-nobody")

      [event | _] = KillSwitch.events(agent_id: manual)

      assert %{
               event_type: "manual_deactivation",
               details: %{operator: "bob", reason: "maintenance"}
             } = event
    end

    test "Clear deactivation reason on activate", %{agent: agent} do
      {:ok, _} = KillSwitch.configure(agent, %{enabled: true, threshold: 1})
      capture_log(fn -> send_until_stopped(agent, 10) end)

      assert {:ok, %{active: true, deactivated_by: nil, deactivated_at: nil}} =
               KillSwitch.activate(agent)

      {:ok, _} = KillSwitch.deactivate(agent, operator: "bob")
      assert {:ok, %{deactivated_by: nil}} = KillSwitch.activate(agent, operator: "bob")
      assert %{active: true, deactivated_by: nil} = Agents.get(agent)

      types = for e <- KillSwitch.events(agent_id: agent), do: e.event_type

      assert types == [
               "activation",
               "manual_deactivation",
               "activation",
               "kill_switch",
               "settings_changed"
             ]

      assert [
               %{details: %{previously_deactivated_by: :manual}},
               _,
               %{details: %{previously_deactivated_by: :kill_switch}} | _
             ] = KillSwitch.events(agent_id: agent)
    end
  end

  describe "Kill Switch Enforcement" do
    test "Record kill switch event (details, broadcast, log)", %{agent: agent} do
      :ok = Events.subscribe(KillSwitch.topic())
      {:ok, _} = KillSwitch.configure(agent, %{enabled: true, window_size: 5, threshold: 2.5})

      log =
        capture_log(fn ->
          assert {:ok, _} = KillSwitch.check_request(agent, looping(1))
          KillSwitch.observe_response(agent, Upstream.completion("Deploy failed: timeout"))
          assert {:ok, _} = KillSwitch.check_request(agent, looping(2))
          KillSwitch.observe_response(agent, Upstream.completion("Deploy failed: timeout"))

          assert {:error, {:inactive, %{deactivated_by: :kill_switch}}} =
                   KillSwitch.check_request(agent, looping(3))
        end)

      assert log =~ "kill switch deactivated agent #{inspect(agent)}: score 4.0 > threshold 2.5"

      assert [%{event_type: "kill_switch", agent_id: ^agent, at: %DateTime{}, details: details}] =
               KillSwitch.events(agent_id: agent)
               |> Enum.filter(&(&1.event_type == "kill_switch"))

      assert %{
               score: 4.0,
               threshold: 2.5,
               window_size: 5,
               window_len: 3,
               similar_prompts: 2,
               similar_responses: 1,
               repeated_tool_calls: 0
             } = details

      assert details.prompt_hash =~ ~r/^[0-9A-F]{16}$/

      assert_receive %{event_type: "kill_switch", agent_id: ^agent, details: %{score: 4.0}}
      # A second trip cannot happen while the agent is inactive.
      assert {:error, {:inactive, _}} = KillSwitch.check_request(agent, looping(4))

      assert length(
               Enum.filter(KillSwitch.events(agent_id: agent), &(&1.event_type == "kill_switch"))
             ) == 1
    end
  end

  test "concurrent requests over the threshold deactivate once and record one event", %{
    agent: agent
  } do
    {:ok, _} = KillSwitch.configure(agent, %{enabled: true, window_size: 50, threshold: 3})

    {results, _log} =
      with_log(fn ->
        1..40
        |> Task.async_stream(&KillSwitch.check_request(agent, looping(&1)), max_concurrency: 8)
        |> Enum.map(fn {:ok, result} -> result end)
      end)

    admitted = Enum.count(results, &match?({:ok, _}, &1))
    assert admitted == 4, "scores 0, 1, 2 and 3 pass; every later request is refused"
    assert Enum.count(results, &match?({:error, {:inactive, _}}, &1)) == 36

    kill_events =
      for e <- KillSwitch.events(agent_id: agent), e.event_type == "kill_switch", do: e

    assert length(kill_events) == 1
  end

  test "the notification webhook receives the kill switch event", %{agent: agent} do
    hook = Upstream.start(fn _ -> {204, "text/plain", ""} end)
    webhook = "http://127.0.0.1:#{hook.port}/alerts"

    {:ok, record} =
      KillSwitch.configure(agent, %{enabled: true, threshold: 0.5, notification_webhook: webhook})

    assert KillSwitch.notifications_configured?(record)
    capture_log(fn -> send_until_stopped(agent, 5) end)

    assert_receive {:upstream_request, body, _}, 5_000

    assert {:ok,
            %{"event_type" => "kill_switch", "agent_id" => ^agent, "details" => %{"score" => 1.0}}} =
             JSON.decode(body)
  end

  test "bad input is refused and stores nothing", %{agent: agent} do
    for bad <- ["", String.duplicate("a", 257), "tab\there", <<0xFF>>, 42] do
      assert {:error, :invalid_agent_id} = KillSwitch.check_request(bad, looping(1))
      assert {:error, :invalid_agent_id} = KillSwitch.configure(bad, %{enabled: true})
    end

    assert {:error, {:invalid, [%{path: "window_size"}]}} =
             KillSwitch.configure(agent, %{window_size: 1})

    assert Agents.get(agent) == nil, "a refused configuration registers nothing"
  end
end

defmodule Observatory.KillSwitch.AgentLimitTest do
  # Changes the global :kill_switch config: not async.
  use ExUnit.Case, async: false

  alias Observatory.KillSwitch
  alias Observatory.KillSwitch.Agents

  setup do
    saved = Application.get_env(:observatory, :kill_switch)
    on_exit(fn -> Application.put_env(:observatory, :kill_switch, saved) end)
  end

  test "no agent is registered beyond :max_agents; known agents keep working" do
    known = "agent-limit-#{System.unique_integer([:positive])}"
    {:ok, _} = Agents.fetch_or_register(known)

    Application.put_env(
      :observatory,
      :kill_switch,
      Keyword.put(saved_config(), :max_agents, Agents.count())
    )

    fp = %{prompt_hash: 1, tool_signatures: [], stream: false}
    assert {:error, :unknown_agent} = KillSwitch.check_request(known <> "-new", fp)
    assert {:error, :agent_limit} = KillSwitch.configure(known <> "-new", %{enabled: true})
    assert {:error, :agent_limit} = Observatory.AgentKeys.issue(known <> "-new")
    assert {:ok, nil} = KillSwitch.check_request(known, fp)
    assert Agents.get(known <> "-new") == nil
  end

  defp saved_config, do: Application.get_env(:observatory, :kill_switch, [])
end
