defmodule ObservatoryWeb.ResponsesTest do
  # Issue 19 item 4: the OpenAI Responses API through the proxy, and the requests the
  # SDKs make beside the model calls. Real sockets, stub upstreams on loopback.
  # Changes the upstream configuration: not async.
  use ExUnit.Case, async: false

  alias Observatory.Gateway.{Events, SessionLog}
  alias Observatory.{JSON, KillSwitch}
  alias Observatory.KillSwitch.Windows
  alias Observatory.Proxy.{HTTPClient, SSE}
  alias Observatory.Test.{HTTP, Upstream}

  @keys [:llm_upstream, :anthropic_upstream, :llm_upstream_api_key, :anthropic_upstream_api_key]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn -> for {key, value} <- saved, do: Application.put_env(:observatory, key, value) end)

    n = System.unique_integer([:positive])
    %{agent: "agent-responses-#{n}", n: n}
  end

  defp use_openai(%{url: url}), do: Application.put_env(:observatory, :llm_upstream, url)

  defp use_anthropic(%{port: port}),
    do: Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{port}")

  defp post(agent, path, body, headers \\ []) do
    HTTP.post(path, JSON.encode!(body), headers: HTTP.agent_headers(agent) ++ headers)
  end

  # The input an agent on the Responses API re-sends after `turns` turns, each one
  # function call and its output.
  defp input(task, turns, call \\ fn _k -> {"read_file", %{path: "build.log"}} end) do
    items =
      Enum.flat_map(1..turns//1, fn k ->
        {name, args} = call.(k)

        [
          %{
            type: "function_call",
            id: "fc_#{k}",
            call_id: "call_#{k}",
            name: name,
            arguments: JSON.encode!(args)
          },
          %{type: "function_call_output", call_id: "call_#{k}", output: "error: no such file"}
        ]
      end)

    %{
      model: "test-model",
      instructions: "You fix builds.",
      input: [%{role: "user", content: [%{type: "input_text", text: task}]} | items]
    }
  end

  describe "issue 19 item 4: POST /v1/responses" do
    test "is forwarded to <upstream>/responses with the gateway's key, the answer unchanged",
         %{agent: agent} do
      test = self()

      upstream =
        Upstream.start(fn body, headers, line ->
          send(test, {:seen, line, headers})
          assert {:ok, %{"input" => "Say hello."}} = JSON.decode(body)
          {200, "application/json", Upstream.response("Hello.")}
        end)

      use_openai(upstream)
      Application.put_env(:observatory, :llm_upstream_api_key, "sk-upstream-secret")

      resp = post(agent, "/v1/responses", %{model: "test-model", input: "Say hello."})
      assert resp.status == 200
      assert resp.body == elem(JSON.decode(Upstream.response("Hello.")), 1)
      assert "proxy-" <> _ = resp.headers["x-observatory-session-id"]

      assert_receive {:seen, %{method: "POST", path: "/v1/responses"}, headers}
      assert headers["authorization"] == "Bearer sk-upstream-secret"
      refute headers["authorization"] =~ HTTP.key_for(agent)
    end

    test "function_call items and their outputs become steps, each once, as `responses`",
         %{agent: agent, n: n} do
      use_openai(Upstream.start(fn _ -> {200, "application/json", Upstream.response("ok")} end))
      session = "sess-responses-#{n}"
      different = fn k -> {"read_file", %{path: "src/#{k}.ex"}} end

      for turns <- 0..3 do
        assert post(agent, "/v1/responses", input("Fix #{n}", turns, different), [
                 {"x-session-id", session}
               ]).status == 200
      end

      # A retried turn adds nothing.
      post(agent, "/v1/responses", input("Fix #{n}", 3, different), [{"x-session-id", session}])

      envelopes = Enum.reverse(SessionLog.recent(session))
      assert length(envelopes) == 3

      assert for(e <- envelopes, do: e["action"]["tool_input"]["path"]) ==
               ["src/3.ex", "src/2.ex", "src/1.ex"]

      [newest | _] = envelopes
      assert newest["proxy"] == %{"api" => "responses", "tool_call_id" => "call_3"}

      assert %{
               "tool_call" => "read_file",
               "status" => "success",
               "result" => "error: no such file"
             } = newest["action"]
    end

    test "a looping agent is alarmed; the step detector's block refuses it", %{agent: agent, n: n} do
      use_openai(
        Upstream.start(fn _ ->
          {200, "application/json", Upstream.response("", [{"read_file", %{path: "build.log"}}])}
        end)
      )

      Events.subscribe(Events.entropy_alerts())
      answers = for turns <- 0..7, do: post(agent, "/v1/responses", input("Loop #{n}", turns))
      session = hd(answers).headers["x-observatory-session-id"]
      assert Enum.all?(answers, &(&1.headers["x-observatory-session-id"] == session))

      assert_received %{event_type: "entropy_alert", session_id: ^session, agent_id: ^agent}

      assert %{status: 403, body: %{"error" => %{"code" => "session_blocked"}}} =
               List.last(answers)
    end

    test "with the kill switch on, a looping agent is stopped", %{agent: agent, n: n} do
      use_openai(
        Upstream.start(fn _ ->
          {200, "application/json", Upstream.response("", [{"read_file", %{path: "build.log"}}])}
        end)
      )

      {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true, "threshold" => 5})

      # The kill switch reads each turn's function_call_output as its newest input and
      # sees the same call each time: 0, 2.5, 5, then 7.5 > 5.
      scores =
        for turns <- 0..4 do
          resp = post(agent, "/v1/responses", input("Loop #{n}", turns))
          {resp.status, resp.headers["x-observatory-kill-switch-score"]}
        end

      assert scores == [{200, "0.0"}, {200, "0.0"}, {200, "2.5"}, {200, "5.0"}, {403, nil}]
      assert %{active: false, deactivated_by: :kill_switch} = KillSwitch.agent(agent)
    end

    test "the kill switch reads the outputs of a turn that answers tool calls", %{agent: agent} do
      use_openai(
        Upstream.start(fn _ -> {200, "application/json", Upstream.response("Noted.")} end)
      )

      {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true, "threshold" => 1_000})

      assert post(agent, "/v1/responses", input("Fix the build", 2)).status == 200
      assert [entry] = Windows.entries(agent)
      assert entry.prompt_hash == KillSwitch.fingerprint("error: no such file")
      assert entry.response_hash == KillSwitch.fingerprint("Noted.")
      assert length(entry.tool_signatures) == 1

      assert post(agent, "/v1/responses", %{model: "m", input: "A new task"}).status == 200
      assert [_, %{prompt_hash: prompt}] = Windows.entries(agent)
      assert prompt == KillSwitch.fingerprint("A new task")
    end

    test "streamed: events pass as they arrive; the text is fingerprinted at the end",
         %{agent: agent} do
      {start, deltas, stop} = Upstream.response_events(["Hel", "lo."])

      use_openai(
        Upstream.start(fn _ ->
          {:chunked, 200, "text/event-stream",
           fn resp -> for e <- start ++ deltas ++ stop, do: Upstream.write_chunk(resp, e) end}
        end)
      )

      {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true, "threshold" => 1_000})
      body = JSON.encode!(%{model: "m", input: "Say hello.", stream: true})

      headers = [
        {"authorization", "Bearer " <> HTTP.key_for(agent)},
        {"content-type", "application/json"}
      ]

      {:ok, conn} = HTTPClient.request(HTTP.url("/v1/responses"), headers, body, timeout: 5_000)
      {:ok, 200, resp_headers, conn} = HTTPClient.read_head(conn)
      assert Map.new(resp_headers)["content-type"] =~ "text/event-stream"
      {:ok, raw, _} = HTTPClient.read_all(conn)
      assert raw == IO.iodata_to_binary(start ++ deltas ++ stop)

      {events, _, _} = SSE.parse(SSE.new(), raw)
      assert for(%{data: %{"delta" => d}} <- events, do: d) == ["Hel", "lo."]
      assert [%{response_hash: hash}] = Windows.entries(agent)
      assert hash == KillSwitch.fingerprint("Hello.")
    end

    test "errors are in OpenAI's shape; a 2xx that is not a response is a 502", %{agent: agent} do
      use_openai(Upstream.start(fn _ -> {200, "application/json", ~s({"choices": []})} end))

      bad = HTTP.post("/v1/responses", "[1]", headers: HTTP.agent_headers(agent))
      assert bad.status == 400

      assert %{"error" => %{"code" => "invalid_body", "type" => "invalid_request_error"}} =
               bad.body

      ExUnit.CaptureLog.capture_log(fn ->
        broken = post(agent, "/v1/responses", %{model: "m", input: "x"})
        assert broken.status == 502
        assert broken.body["error"]["message"] =~ "JSON that is not a response"
      end)
    end
  end

  describe "issue 19 item 4: GET /v1/models and POST /v1/messages/count_tokens pass through" do
    test "models go to the OpenAI upstream, or to Anthropic's when anthropic-version is sent",
         %{agent: agent} do
      test = self()

      handler = fn which ->
        fn _body, headers, line ->
          send(test, {which, line, headers})
          {200, "application/json", [{"x-request-id", "req_#{which}"}], ~s({"data": []})}
        end
      end

      use_openai(Upstream.start(handler.(:openai)))
      use_anthropic(Upstream.start(handler.(:anthropic)))
      Application.put_env(:observatory, :anthropic_upstream_api_key, "sk-ant-secret")

      openai = HTTP.get("/v1/models", HTTP.agent_headers(agent))
      assert openai.status == 200
      assert openai.body == %{"data" => []}
      assert openai.headers["x-request-id"] == "req_openai"
      assert_receive {:openai, %{method: "GET", path: "/v1/models"}, _}

      one = HTTP.get("/v1/models/gpt-4o%3Amini", HTTP.agent_headers(agent))
      assert one.status == 200
      assert_receive {:openai, %{path: "/v1/models/gpt-4o%3Amini"}, _}

      anthropic =
        HTTP.get("/v1/models?limit=20", [
          {"x-api-key", HTTP.key_for(agent)},
          {"anthropic-version", "2023-06-01"}
        ])

      assert anthropic.status == 200
      assert anthropic.headers["x-request-id"] == "req_anthropic"
      assert_receive {:anthropic, %{method: "GET", path: "/v1/models?limit=20"}, headers}
      assert headers["x-api-key"] == "sk-ant-secret"
      assert headers["anthropic-version"] == "2023-06-01"
    end

    test "count_tokens goes to the Anthropic upstream, body and answer unchanged", %{agent: agent} do
      test = self()

      use_anthropic(
        Upstream.start(fn body, _headers, line ->
          send(test, {:seen, body, line})
          {200, "application/json", ~s({"input_tokens": 12})}
        end)
      )

      body = %{model: "claude-test", messages: [%{role: "user", content: "Hello"}]}
      resp = post(agent, "/v1/messages/count_tokens", body, [{"anthropic-version", "2023-06-01"}])
      assert resp.status == 200
      assert resp.body == %{"input_tokens" => 12}
      assert_receive {:seen, forwarded, %{method: "POST", path: "/v1/messages/count_tokens"}}
      assert forwarded == JSON.encode!(body)
    end

    test "need a valid key of an active agent; errors in the API's shape", %{agent: agent} do
      use_openai(Upstream.start(fn _ -> {200, "application/json", ~s({"data": []})} end))

      use_anthropic(
        Upstream.start(fn _ -> {200, "application/json", ~s({"input_tokens": 1})} end)
      )

      assert HTTP.get("/v1/models", [{"authorization", "Bearer nope"}]).status == 401

      HTTP.key_for(agent)
      {:ok, _} = KillSwitch.deactivate(agent, operator: "test")
      inactive = HTTP.get("/v1/models", HTTP.agent_headers(agent))
      assert inactive.status == 403
      assert inactive.body["error"]["code"] == "agent_inactive"

      counted = post(agent, "/v1/messages/count_tokens", %{model: "m", messages: []})
      assert counted.status == 403
      assert %{"type" => "error", "error" => %{"type" => "permission_error"}} = counted.body
    end
  end
end
