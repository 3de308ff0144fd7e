defmodule ObservatoryWeb.GradedResponseAPITest do
  # Graded response: the operator API — guidance notes per agent, budgets (settings,
  # usage, reset), the kill switch's modes, notification sinks. Real HTTP.
  # Changes the budgets' and notifications' configuration: not async.
  use ExUnit.Case, async: false
  @moduletag :capture_log

  alias Observatory.{Budget, JSON, KillSwitch}
  alias Observatory.Test.HTTP

  setup do
    keys = [:budgets, :notifications, :kill_switch]
    # Restored as they were, unset ones unset.
    Observatory.TrackerCase.restore_env_on_exit(keys)

    Application.put_env(:observatory, :budgets, prices: %{"gpt-test" => %{input: 1, output: 2}})
    n = System.unique_integer([:positive])
    agent = "agent-graded-#{n}"
    HTTP.key_for(agent)
    %{agent: agent, n: n}
  end

  defp put(path, body, headers \\ HTTP.operator_headers()), do: request(:put, path, body, headers)
  defp post(path, body \\ ""), do: request(:post, path, body, HTTP.operator_headers())

  defp request(method, path, body, headers) do
    body = if is_binary(body), do: body, else: JSON.encode!(body)
    headers = for {k, v} <- headers, do: {String.to_charlist(k), String.to_charlist(v)}
    url = String.to_charlist(HTTP.url(path))

    {:ok, {{_, status, _}, _headers, resp}} =
      :httpc.request(method, {url, headers, ~c"application/json", body}, [], body_format: :binary)

    %{status: status, body: elem(JSON.decode(resp), 1)}
  end

  defp get(path), do: HTTP.get(path, HTTP.operator_headers())

  describe "operator API: guidance notes per agent" do
    test "on, off, back to the default; shown with what is in force", %{agent: agent} do
      assert get("/api/v1/agents/#{agent}").body["guidance"] == %{
               "setting" => "default",
               "enabled" => false
             }

      assert put("/api/v1/agents/#{agent}/guidance", %{enabled: true}).body["guidance"] == %{
               "setting" => "on",
               "enabled" => true
             }

      assert KillSwitch.agent(agent).guidance == true

      assert put("/api/v1/agents/#{agent}/guidance", %{enabled: false}).body["guidance"][
               "setting"
             ] == "off"

      assert put("/api/v1/agents/#{agent}/guidance", %{enabled: nil}).body["guidance"]["setting"] ==
               "default"

      assert put("/api/v1/agents/#{agent}/guidance", %{enabled: "yes"}).status == 422
      assert put("/api/v1/agents/nobody-#{agent}/guidance", %{enabled: true}).status == 404
      assert put("/api/v1/agents/#{agent}/guidance", %{enabled: true}, []).status == 401

      assert [
               %{
                 "event_type" => "settings_changed",
                 "details" => %{"changes" => %{"guidance" => nil}}
               }
               | _
             ] = get("/api/v1/agents/#{agent}").body["events"]
    end
  end

  describe "operator API: budgets" do
    test "set limits and mode, read usage, reset a session and the window", %{agent: agent, n: n} do
      resp =
        put("/api/v1/agents/#{agent}/budget", %{
          session_tokens: 1000,
          window_cost_usd: 2.5,
          mode: "warn"
        })

      assert resp.status == 200

      assert %{
               "session_tokens" => 1000,
               "window_cost_usd" => 2.5,
               "mode" => "warn",
               "window_seconds" => 3600
             } = resp.body["budget"]

      session = "sess-api-#{n}"
      Budget.count_request(KillSwitch.agent(agent), session)
      body = get("/api/v1/agents/#{agent}/budget").body

      assert %{
               "total" => %{"requests" => 1},
               "window" => %{"requests" => 1, "exhausted" => false}
             } = body

      assert [%{"session_id" => ^session, "requests" => 1}] = body["sessions"]

      # The session's own view carries its usage.
      assert %{"usage" => %{"requests" => 1, "since_loop" => nil}} =
               get("/api/v1/sessions/#{session}").body

      assert %{
               "scope" => %{"kind" => "session", "session_id" => ^session},
               "spent" => %{"requests" => 1}
             } = post("/api/v1/agents/#{agent}/budget/reset", %{session_id: session}).body

      assert %{"scope" => %{"kind" => "window"}, "spent" => %{"requests" => 1}} =
               post("/api/v1/agents/#{agent}/budget/reset").body

      assert get("/api/v1/agents/#{agent}/budget").body["window"]["requests"] == 0

      other = "agent-graded-other-#{n}"
      HTTP.key_for(other)
      Budget.count_request(KillSwitch.agent(other), "sess-other-#{n}")

      assert post("/api/v1/agents/#{agent}/budget/reset", %{session_id: "sess-other-#{n}"}).status ==
               403
    end

    test "negative limits and unknown keys: 422 with every violation", %{agent: agent} do
      resp =
        put("/api/v1/agents/#{agent}/budget", %{session_tokens: -1, window_seconds: 5, tokens: 3})

      assert resp.status == 422

      assert [%{"path" => "session_tokens"}, %{"path" => "tokens"}, %{"path" => "window_seconds"}] =
               resp.body["violations"]

      assert put("/api/v1/agents/nobody-#{agent}/budget", %{session_tokens: 5}).status == 404
    end
  end

  describe "agent events are bounded" do
    test "past :max_events_per_agent the oldest go; deleting the agent forgets its budget", %{
      agent: agent,
      n: n
    } do
      Application.put_env(
        :observatory,
        :kill_switch,
        Keyword.put(Application.get_env(:observatory, :kill_switch), :max_events_per_agent, 5)
      )

      for k <- 1..200,
          do:
            {:ok, _} =
              Observatory.KillSwitch.Agents.record_event(agent, "guidance_injected", %{k: k})

      # Trimmed every 64th event of the node: at most 63 past the cap, the newest kept.
      count = length(KillSwitch.events(agent_id: agent, limit: 1000))
      assert count in 5..68
      assert hd(KillSwitch.events(agent_id: agent)).details.k == 200

      session = "sess-deleted-#{n}"
      Budget.count_request(KillSwitch.agent(agent), session)
      assert Budget.session_usage(session).requests == 1
      {:ok, _} = KillSwitch.delete(agent)
      assert Budget.session_usage(session).requests == 0
      assert Observatory.Budget.Store.session_meta(session) == nil
    end
  end

  describe "operator API: the kill switch's mode" do
    test "enforce, warn, shadow; anything else refused", %{agent: agent} do
      assert put("/api/v1/agents/#{agent}/kill_switch", %{enabled: true, mode: "shadow"}).body[
               "kill_switch"
             ]["mode"] == "shadow"

      assert KillSwitch.agent(agent).kill_switch.mode == :shadow
      resp = put("/api/v1/agents/#{agent}/kill_switch", %{mode: "off"})
      assert resp.status == 422
      assert resp.body["message"] == "mode must be enforce, warn or shadow, got: \"off\""
    end

    test "the configured mode is checked at start" do
      Application.put_env(
        :observatory,
        :kill_switch,
        Keyword.put(Application.get_env(:observatory, :kill_switch), :mode, :soft)
      )

      error = assert_raise ArgumentError, fn -> KillSwitch.check_config!() end

      assert Exception.message(error) =~
               "expected config :observatory, :kill_switch, :mode to be :enforce, :warn or :shadow, got: :soft"
    end
  end

  describe "operator API: notification sinks" do
    test "added, listed redacted, tested, removed; a private address is refused", %{n: n} do
      Application.put_env(:observatory, :notifications, sinks: [])
      name = "ops-#{n}"

      hook = Observatory.Test.Upstream.start(fn _ -> {200, "application/json", "{}"} end)
      url = "http://127.0.0.1:#{hook.port}/hooks/T0/B0/secret-part-#{n}"
      resp = put("/api/v1/notifications/sinks/#{name}", %{type: "slack", url: url})
      assert resp.status == 200

      assert %{
               "name" => ^name,
               "type" => "slack",
               "source" => "api",
               "url" => "http://127.0.0.1:" <> shown
             } = resp.body

      refute shown =~ "secret-part"

      listed = get("/api/v1/notifications/sinks").body["sinks"]
      assert Enum.any?(listed, &(&1["name"] == name))
      refute inspect(listed) =~ "secret-part"

      assert post("/api/v1/notifications/sinks/#{name}/test").body == %{
               "name" => name,
               "delivered" => true
             }

      assert_receive {:upstream_request, body, _}
      assert body =~ "Test alert from Observatory"

      assert request(:delete, "/api/v1/notifications/sinks/#{name}", "", HTTP.operator_headers()).status ==
               200

      assert request(:delete, "/api/v1/notifications/sinks/#{name}", "", HTTP.operator_headers()).status ==
               404

      Application.put_env(
        :observatory,
        :kill_switch,
        Keyword.put(
          Application.get_env(:observatory, :kill_switch),
          :webhook_allow_private_networks,
          false
        )
      )

      resp =
        put("/api/v1/notifications/sinks/#{name}", %{type: "webhook", url: "http://10.0.0.8/hook"})

      assert resp.status == 422

      assert resp.body["message"] =~
               "url must not point at a loopback, private or link-local address"

      assert put("/api/v1/notifications/sinks/#{name}", %{type: "pagerduty"}).body["message"] ==
               "routing_key is required"

      assert put("/api/v1/notifications/sinks/#{name}", %{type: "slack", url: url}, []).status ==
               401
    end
  end
end
