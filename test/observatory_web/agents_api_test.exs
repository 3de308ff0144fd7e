defmodule ObservatoryWeb.AgentsAPITest do
  # The operator API for agents over real sockets. Changes the global webhook: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.KillSwitch.Agents
  alias Observatory.Test.HTTP

  setup do
    saved = Application.get_env(:observatory, :kill_switch)
    on_exit(fn -> Application.put_env(:observatory, :kill_switch, saved) end)
    %{agent: "agent-api-#{System.unique_integer([:positive])}"}
  end

  defp get(path), do: HTTP.get(path, HTTP.operator_headers())

  defp put_settings(agent, settings) do
    request(:put, "/api/v1/agents/#{encode(agent)}/kill_switch", JSON.encode!(settings))
  end

  defp post_action(agent, action, body \\ ""),
    do: request(:post, "/api/v1/agents/#{encode(agent)}/#{action}", body)

  defp encode(id), do: URI.encode(id, &URI.char_unreserved?/1)

  # HTTP.post cannot PUT: a small :httpc call with the operator token.
  defp request(method, path, body, headers \\ HTTP.operator_headers()) do
    headers = for {k, v} <- headers, do: {String.to_charlist(k), String.to_charlist(v)}
    req = {String.to_charlist(HTTP.url(path)), headers, ~c"application/json", body}
    {:ok, {{_, status, _}, _, resp}} = :httpc.request(method, req, [], body_format: :binary)
    {:ok, decoded} = JSON.decode(resp)
    %{status: status, body: decoded}
  end

  defp trip(agent) do
    {:ok, _} = KillSwitch.configure(agent, %{enabled: true, threshold: 1})
    fp = %{prompt_hash: 42, tool_signatures: [], stream: false}
    capture_log(fn -> for _ <- 1..3, do: KillSwitch.check_request(agent, fp) end)
    %{deactivated_by: :kill_switch} = Agents.get(agent)
  end

  describe "Kill Switch UI (the operator API the Agent Detail page will use)" do
    test "Toggle visibility: the agent JSON carries the toggle and its settings", %{agent: agent} do
      {:ok, _} = Agents.fetch_or_register(agent)
      body = get("/api/v1/agents/#{agent}").body

      assert %{
               "agent_id" => ^agent,
               "active" => true,
               "kill_switch" => %{
                 "enabled" => false,
                 "window_size" => 5,
                 "threshold" => 5.5,
                 "max_score" => 18.0
               },
               "score" => nil,
               "events" => []
             } = body
    end

    test "Notification check on enable", %{agent: agent} do
      resp = put_settings(agent, %{enabled: true})
      assert resp.status == 200
      assert resp.body["notifications_configured"] == false

      assert [%{"code" => "notifications_not_configured", "message" => message}] =
               resp.body["warnings"]

      assert message =~ "notification_webhook"

      resp = put_settings(agent, %{notification_webhook: "https://hooks.example.com/alerts"})
      assert resp.body["notifications_configured"] == true
      assert resp.body["warnings"] == []

      # A global webhook counts too.
      other = agent <> "-global"

      Application.put_env(
        :observatory,
        :kill_switch,
        Keyword.put(saved(), :notification_webhook, "https://hooks.example.com/all")
      )

      assert put_settings(other, %{enabled: true}).body["notifications_configured"] == true
      assert put_settings(other, %{enabled: true}).body["warnings"] == []
    end

    test "Configure parameters", %{agent: agent} do
      resp = put_settings(agent, %{enabled: true, window_size: 25, threshold: 12.5})
      assert resp.status == 200

      assert resp.body["kill_switch"] == %{
               "enabled" => true,
               "window_size" => 25,
               "threshold" => 12.5,
               "mode" => "enforce",
               "max_score" => 108.0
             }

      assert %{kill_switch: %{enabled: true, window_size: 25, threshold: 12.5}} =
               Agents.get(agent)

      assert get("/api/v1/agents/#{agent}").body["kill_switch"]["window_size"] == 25

      # Partial updates keep the rest; a threshold the window can never exceed is flagged.
      resp = put_settings(agent, %{window_size: 2})

      assert resp.body["kill_switch"] == %{
               "enabled" => true,
               "window_size" => 2,
               "threshold" => 12.5,
               "mode" => "enforce",
               "max_score" => 4.5
             }

      assert Enum.any?(resp.body["warnings"], &(&1["code"] == "threshold_unreachable"))

      [changed | _] = get("/api/v1/agents/#{agent}").body["events"]

      assert %{
               "event_type" => "settings_changed",
               "details" => %{"operator" => "test-operator", "changes" => %{"window_size" => 2}}
             } = changed
    end
  end

  describe "Deactivation Reason Tracking (what the dashboard shows)" do
    test "Display deactivation reason in dashboard", %{agent: agent} do
      trip(agent)
      body = get("/api/v1/agents/#{agent}").body

      assert %{
               "active" => false,
               "deactivated_by" => "kill_switch",
               "status" => "deactivated_by_kill_switch",
               "status_label" => "Deactivated by Kill Switch"
             } = body

      assert is_binary(body["deactivated_at"])
      assert %{"score" => score, "window_len" => 3} = body["score"]
      assert score > 1
    end

    test "Display manual deactivation in dashboard", %{agent: agent} do
      {:ok, _} = Agents.fetch_or_register(agent)

      resp = post_action(agent, "deactivate", ~s({"reason": "maintenance"}))

      assert %{
               status: 200,
               body: %{
                 "deactivated_by" => "manual",
                 "status_label" => "Inactive",
                 "status" => "inactive"
               }
             } = resp

      assert [%{"event_type" => "manual_deactivation", "details" => details} | _] =
               get("/api/v1/agents/#{agent}").body["events"]

      assert details == %{"operator" => "test-operator", "reason" => "maintenance"}

      listed = Enum.find(get("/api/v1/agents").body["agents"], &(&1["agent_id"] == agent))
      assert %{"active" => false, "status_label" => "Inactive"} = listed
    end

    test "activation clears the reason and the window (POST /activate)", %{agent: agent} do
      trip(agent)

      resp = post_action(agent, "activate")
      assert resp.status == 200

      assert %{
               "active" => true,
               "deactivated_by" => nil,
               "status_label" => "Active",
               "score" => nil
             } = resp.body

      again = post_action(agent, "activate")
      assert again.status == 409
      assert again.body["error"] == "already_active"
    end
  end

  describe "bad input" do
    test "settings out of range are rejected with a message, and nothing changes", %{agent: agent} do
      {:ok, _} = Agents.fetch_or_register(agent)
      before = Agents.get(agent)

      cases = [
        {%{window_size: 1}, "window_size must be an integer from 2 to 1000, got: 1"},
        {%{window_size: 1001}, "window_size must be an integer from 2 to 1000, got: 1001"},
        {%{window_size: "10"}, ~s(window_size must be an integer from 2 to 1000, got: "10")},
        {%{window_size: 10.5}, "window_size must be an integer from 2 to 1000, got: 10.5"},
        {%{threshold: 0}, "threshold must be a number greater than 0, got: 0"},
        {%{threshold: -2.5}, "threshold must be a number greater than 0, got: -2.5"},
        {%{threshold: nil}, "threshold must be a number greater than 0, got: nil"},
        {%{enabled: "yes"}, ~s(enabled must be true or false, got: "yes")},
        {%{notification_webhook: "ftp://x"},
         "notification_webhook must be an http:// or https:// URL"},
        {%{windowSize: 5},
         "windowSize is not a setting (use enabled, mode, notification_webhook, threshold, window_size)"}
      ]

      for {settings, message} <- cases do
        resp = put_settings(agent, Map.put_new(settings, :enabled, true))
        assert resp.status == 422, inspect(settings)
        assert resp.body["error"] == "invalid_settings"
        assert resp.body["message"] =~ message
        assert [%{"path" => _, "reason" => _}] = resp.body["violations"]
      end

      both = put_settings(agent, %{window_size: 0, threshold: 0})
      assert Enum.map(both.body["violations"], & &1["path"]) == ["threshold", "window_size"]

      assert Agents.get(agent) == before
      assert KillSwitch.events(agent_id: agent) == []
    end

    test "a body that is not a JSON object is a 400", %{agent: agent} do
      path = "/api/v1/agents/#{agent}/kill_switch"
      assert %{status: 400, body: %{"error" => "malformed_json"}} = request(:put, path, "{")
      assert %{status: 400, body: %{"error" => "bad_request"}} = request(:put, path, "[1]")
      assert %{status: 400} = request(:put, path, "")
      assert %{status: 400} = post_action(agent, "deactivate", ~s({"reason": 7}))
    end

    test "an operator token is required on every route", %{agent: agent} do
      agent_key = [{"authorization", "Bearer " <> HTTP.agent_key()}]

      for {method, path} <- [
            get: "/api/v1/agents",
            get: "/api/v1/agents/#{agent}",
            put: "/api/v1/agents/#{agent}/kill_switch",
            post: "/api/v1/agents/#{agent}/activate",
            post: "/api/v1/agents/#{agent}/deactivate"
          ],
          headers <- [[], agent_key] do
        resp =
          if method == :get,
            do: HTTP.get(path, headers),
            else: request(method, path, ~s({"enabled": true}), headers)

        assert resp.status == 401, "#{method} #{path}"
        assert resp.body["error"] == "unauthorized"
      end

      assert Agents.get(agent) == nil
    end

    test "unknown agents are 404; actions already in force are 409", %{agent: agent} do
      assert get("/api/v1/agents/#{agent}").status == 404
      assert post_action(agent, "activate").status == 404
      assert post_action(agent, "deactivate").status == 404

      {:ok, _} = Agents.fetch_or_register(agent)
      assert post_action(agent, "deactivate").status == 200

      assert %{status: 409, body: %{"error" => "already_inactive"}} =
               post_action(agent, "deactivate")

      assert HTTP.get("/api/v1/agents/#{agent}/nope", HTTP.operator_headers()).status == 404
    end
  end

  test "GET /api/v1/agents/:id lists the latest events first, ?events= caps them", %{agent: agent} do
    for size <- 2..6, do: put_settings(agent, %{window_size: size})
    events = get("/api/v1/agents/#{agent}?events=3").body["events"]
    assert Enum.map(events, & &1["details"]["changes"]["window_size"]) == [6, 5, 4]
    assert Enum.all?(events, &match?({:ok, _, 0}, DateTime.from_iso8601(&1["at"])))
  end

  test "an agent id with a slash is addressed percent-encoded", %{agent: agent} do
    id = agent <> "/worker-1"
    assert put_settings(id, %{enabled: true, threshold: 5}).status == 200
    assert get("/api/v1/agents/#{encode(id)}").body["agent_id"] == id
  end

  defp saved, do: Application.get_env(:observatory, :kill_switch, [])
end
