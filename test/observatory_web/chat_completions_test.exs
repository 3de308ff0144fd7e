defmodule ObservatoryWeb.ChatCompletionsTest do
  # The proxy over real sockets, against real upstreams on loopback (MochiWeb, port 0).
  # Changes :llm_upstream: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.KillSwitch.{Agents, Windows}
  alias ObservatoryWeb.API.ChatCompletions
  alias Observatory.Test.{HTTP, ToolConversation, Upstream}

  @keys [:llm_upstream, :llm_upstream_api_key, :llm_timeout_ms]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn -> for {key, value} <- saved, do: Application.put_env(:observatory, key, value) end)

    %{agent: "agent-proxy-#{System.unique_integer([:positive])}"}
  end

  defp use_upstream(%{url: url}), do: use_upstream(url)
  defp use_upstream(url), do: Application.put_env(:observatory, :llm_upstream, url)

  defp chat(agent, body, extra_headers \\ []) do
    headers = [{"authorization", "Bearer " <> HTTP.key_for(agent)}, {"x-agent-id", agent}]
    body = if is_binary(body), do: body, else: JSON.encode!(body)
    HTTP.post("/v1/chat/completions", body, headers: headers ++ extra_headers)
  end

  # The request a looping tool agent sends after its k-th turn: the same call, the
  # same result, every time.
  defp looping(k),
    do:
      ToolConversation.body(
        :chat_completions,
        "Deploy build 4821.",
        List.duplicate({"deploy", %{build: 4821}, "error: timeout"}, k)
      )

  # A prompt without tools, the same up to its numbers.
  defp asking(k), do: Upstream.request("Attempt #{k} at 2024-06-01T12:0#{rem(k, 10)}:00Z.")

  defp enable(agent, settings),
    do: {:ok, _} = KillSwitch.configure(agent, Map.put(settings, :enabled, true))

  defp upstream_calls do
    receive do
      {:upstream_request, _, _} -> 1 + upstream_calls()
    after
      0 -> 0
    end
  end

  # The stub reports a request once it has answered it, which may be just after the
  # agent has the answer: wait for the `n` expected, then count any more.
  defp upstream_calls(n) do
    for _ <- 1..n//1, do: assert_receive({:upstream_request, _, _}, 1_000)
    n + upstream_calls()
  end

  describe "Kill Switch Enforcement" do
    test "Deactivate on threshold exceeded", %{agent: agent} do
      use_upstream(Upstream.answering("Deployment failed: timeout."))
      enable(agent, %{window_size: 5, threshold: 8})

      {statuses, log} = with_log(fn -> for k <- 1..6, do: chat(agent, looping(k)).status end)
      assert log =~ "kill switch deactivated agent #{inspect(agent)}"

      # Request k answers the k-th identical call with the same result: (k - 1) × (1.0
      # + 1.5), 7.5 at the fourth, 10 at the fifth, which is refused and never reaches
      # the upstream.
      assert statuses == [200, 200, 200, 200, 403, 403]
      assert upstream_calls(4) == 4

      assert %{active: false, deactivated_by: :kill_switch} = Agents.get(agent)
      body = HTTP.get("/api/v1/agents/#{agent}", HTTP.operator_headers()).body
      assert %{"active" => false, "deactivated_by" => "kill_switch"} = body
    end

    test "Use standard inactive response", %{agent: agent} do
      use_upstream(Upstream.answering("Same answer."))
      enable(agent, %{window_size: 5, threshold: 2})
      capture_log(fn -> for k <- 1..3, do: chat(agent, looping(k)) end)
      assert %{deactivated_by: :kill_switch} = Agents.get(agent)
      upstream_calls()

      stopped = chat(agent, looping(9))
      assert stopped.status == 403
      refute stopped.status == 429

      assert stopped.body == %{
               "error" => %{
                 "message" => "Agent #{agent} is inactive",
                 "type" => "agent_inactive",
                 "code" => "agent_inactive",
                 "param" => nil
               }
             }

      # The same answer as an agent an operator deactivated.
      manual = agent <> "-manual"
      {:ok, _} = Agents.fetch_or_register(manual)
      {:ok, _} = KillSwitch.deactivate(manual, operator: "alice")
      by_hand = chat(manual, looping(1))
      assert by_hand.status == stopped.status

      assert by_hand.body ==
               JSON.encode!(ChatCompletions.inactive_body(manual)) |> JSON.decode() |> elem(1)

      assert String.replace(by_hand.body["error"]["message"], manual, agent) ==
               stopped.body["error"]["message"]

      assert upstream_calls() == 0, "an inactive agent's requests never reach the upstream"

      # Answered before the body is even read: a body that is not JSON gets the same.
      assert chat(agent, "{not json").status == 403
    end

    test "Record kill switch event", %{agent: agent} do
      use_upstream(Upstream.answering("Deployment failed: timeout."))
      enable(agent, %{window_size: 5, threshold: 8})
      capture_log(fn -> for k <- 1..5, do: chat(agent, looping(k)) end)

      [event] = for e <- KillSwitch.events(agent_id: agent), e.event_type == "kill_switch", do: e

      # The model's text answers are not compared: each was followed by a request that
      # answers tool calls (in a real loop, the answer was the call).
      assert %{
               score: 10.0,
               threshold: 8.0,
               window_size: 5,
               window_len: 5,
               similar_prompts: 4,
               similar_responses: 0,
               repeated_tool_calls: 4
             } = event.details

      json = HTTP.get("/api/v1/agents/#{agent}", HTTP.operator_headers()).body

      assert [%{"event_type" => "kill_switch", "details" => %{"score" => 10.0}} | _] =
               json["events"]
    end
  end

  describe "Kill Switch Configuration" do
    test "Enable kill switch", %{agent: agent} do
      use_upstream(Upstream.answering("Working on it."))
      assert chat(agent, looping(1)).status == 200
      assert Windows.entries(agent) == nil, "off by default"

      enable(agent, %{window_size: 10, threshold: 100})
      first = chat(agent, looping(2))
      second = chat(agent, looping(3))
      assert first.headers["x-observatory-kill-switch-score"] == "0.0"
      assert second.headers["x-observatory-kill-switch-score"] == "2.5"
      assert length(Windows.entries(agent)) == 2
    end

    test "Disable kill switch", %{agent: agent} do
      # Thirty identical steps: the step detector's block is out of the way here.
      saved = Application.get_env(:observatory, :step_detection)
      on_exit(fn -> Observatory.configure(step_detection: saved || []) end)

      Observatory.configure(
        step_detection: [
          stagnation_warn: 1_000,
          stagnation_block: 1_000,
          stuck_warn: 1_000,
          stuck_block: 1_000
        ]
      )

      use_upstream(Upstream.answering("Deployment failed: timeout."))

      for k <- 1..30 do
        resp = chat(agent, looping(k))
        assert resp.status == 200
        refute Map.has_key?(resp.headers, "x-observatory-kill-switch-score")
      end

      assert %{active: true, deactivated_by: nil, kill_switch: %{enabled: false}} =
               Agents.get(agent)

      assert upstream_calls(30) == 30
    end
  end

  describe "Kill Switch State Management" do
    test "Response hash capture", %{agent: agent} do
      use_upstream(Upstream.answering("Deployment 4821 failed at 2024-06-01T12:00:00Z."))
      enable(agent, %{threshold: 100})
      resp = chat(agent, looping(1))
      assert resp.status == 200

      assert get_in(resp.body, ["choices", Access.at(0), "message", "content"]) =~
               "Deployment 4821"

      assert [%{response_hash: hash}] = Windows.entries(agent)
      assert hash == KillSwitch.fingerprint("Deployment 4821 failed at 2024-06-01T12:00:00Z.")

      # An answer with tool calls only has no text to hash.
      tools_only =
        JSON.encode!(%{choices: [%{message: %{role: "assistant", content: nil, tool_calls: []}}]})

      use_upstream(Upstream.start(fn _ -> {200, "application/json", tools_only} end))
      assert chat(agent, asking(2)).status == 200
      assert [%{response_hash: ^hash}, %{response_hash: nil}] = Windows.entries(agent)
    end
  end

  describe "forwarding" do
    test "the body goes upstream unchanged, with the upstream's key, and the answer comes back",
         %{agent: agent} do
      upstream = Upstream.answering("Hello.")
      use_upstream(upstream)
      Application.put_env(:observatory, :llm_upstream_api_key, "sk-upstream")
      body = JSON.encode!(looping(1)) <> "\n"

      resp = chat(agent, body)
      assert resp.status == 200
      assert resp.body == JSON.decode(Upstream.completion("Hello.")) |> elem(1)
      assert_receive {:upstream_request, ^body, "Bearer sk-upstream"}, 1_000
    end

    test "an upstream error in JSON is the agent's to see", %{agent: agent} do
      limited = JSON.encode!(%{error: %{message: "Rate limit reached", type: "requests"}})
      use_upstream(Upstream.start(fn _ -> {429, "application/json", limited} end))
      resp = chat(agent, looping(1))
      assert resp.status == 429
      assert resp.body["error"]["message"] == "Rate limit reached"
    end
  end

  describe "bad input" do
    test "an upstream that is down gives a 502 with a clear body", %{agent: agent} do
      use_upstream(Upstream.closed_url())

      capture_log(fn ->
        resp = chat(agent, looping(1))
        assert resp.status == 502

        assert %{"error" => %{"type" => "upstream_error", "message" => message}} = resp.body
        assert message =~ "cannot connect to the LLM upstream (connection refused)"
      end)
    end

    test "an upstream that answers garbage gives a 502 with a clear body", %{agent: agent} do
      cases = [
        {200, "text/html", "<html>Bad Gateway</html>", "HTTP 200 with a body that is not JSON"},
        {200, "application/json", ~s({"ok": true}),
         "HTTP 200 with JSON that is not a chat completion"},
        {500, "text/plain", "Internal Server Error", "HTTP 500 with a body that is not JSON"},
        {200, "application/json", "", "HTTP 200 with a body that is not JSON"}
      ]

      capture_log(fn ->
        for {status, type, body, expected} <- cases do
          use_upstream(Upstream.start(fn _ -> {status, type, body} end))
          resp = chat(agent, looping(1))
          assert resp.status == 502, "#{status} #{inspect(body)}"
          assert resp.body["error"]["type"] == "upstream_error"
          assert resp.body["error"]["message"] =~ expected
        end
      end)
    end

    test "an upstream that does not answer in time gives a 502", %{agent: agent} do
      Application.put_env(:observatory, :llm_timeout_ms, 200)

      use_upstream(
        Upstream.start(fn _ ->
          Process.sleep(1_000)
          {200, "application/json", Upstream.completion("late")}
        end)
      )

      capture_log(fn ->
        resp = chat(agent, looping(1))
        assert resp.status == 502
        assert resp.body["error"]["message"] == "the LLM upstream did not answer in time"
      end)
    end

    test "no upstream configured gives a 502 that says so", %{agent: agent} do
      use_upstream(nil)

      capture_log(fn ->
        resp = chat(agent, looping(1))
        assert resp.status == 502
        assert resp.body["error"]["message"] =~ "no LLM upstream is configured"
      end)
    end

    test "bad requests get OpenAI-shaped 4xx answers and are not forwarded", %{agent: agent} do
      use_upstream(Upstream.answering("ok"))
      key = {"authorization", "Bearer " <> HTTP.key_for(agent)}
      json = JSON.encode!(looping(1))
      post = fn body, headers -> HTTP.post("/v1/chat/completions", body, headers: headers) end

      cases = [
        {"no key", post.(json, [{"x-agent-id", agent}]), 401, "invalid_api_key"},
        {"operator token",
         post.(json, [
           {"authorization", "Bearer " <> HTTP.operator_token()},
           {"x-agent-id", agent}
         ]), 401, "invalid_api_key"},
        {"another agent id", post.(json, [key, {"x-agent-id", agent <> "-other"}]), 403,
         "agent_id_mismatch"},
        {"bad agent id", post.(json, [key, {"x-agent-id", String.duplicate("a", 300)}]), 403,
         "agent_id_mismatch"},
        {"malformed JSON", chat(agent, "{\"messages\": "), 400, "invalid_json"},
        {"not an object", chat(agent, "[1, 2]"), 400, "invalid_body"},
        {"content type",
         HTTP.post("/v1/chat/completions", json,
           headers: [key, {"x-agent-id", agent}],
           content_type: "text/plain"
         ), 415, "unsupported_media_type"}
      ]

      for {name, resp, status, code} <- cases do
        assert resp.status == status, "#{name}: #{resp.status}"
        assert %{"error" => %{"code" => ^code, "message" => message}} = resp.body, name
        assert is_binary(message)
      end

      assert upstream_calls() == 0
      assert HTTP.get("/healthz").status == 200
    end

    test "nothing recorded is lost when the upstream fails", %{agent: agent} do
      enable(agent, %{
        window_size: 10,
        threshold: 100,
        notification_webhook: "https://hooks.example.com/x"
      })

      use_upstream(Upstream.answering("fine"))
      assert chat(agent, asking(1)).status == 200
      before = Agents.get(agent)
      events = KillSwitch.events(agent_id: agent)

      capture_log(fn ->
        use_upstream(Upstream.closed_url())
        assert chat(agent, asking(2)).status == 502
        use_upstream(Upstream.start(fn _ -> {200, "text/html", "garbage"} end))
        assert chat(agent, asking(3)).status == 502
        assert chat(agent, "{bad").status == 400
      end)

      assert Agents.get(agent) == before
      assert KillSwitch.events(agent_id: agent) == events
      # The agent did send the two forwarded requests: they stay in its window.
      assert [%{response_hash: h}, %{response_hash: nil}, %{response_hash: nil}] =
               Windows.entries(agent)

      assert h == KillSwitch.fingerprint("fine")
    end
  end
end
