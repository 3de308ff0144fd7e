defmodule ObservatoryWeb.ProxyTransportTest do
  # Issue 19 items 3–6 and issue 20 findings 4 and 9: sessions, sizes, upstream headers
  # and enforcement on open requests, over real sockets against stub upstreams on
  # loopback. Changes the proxy's configuration: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.{AgentKeys, JSON, KillSwitch}
  alias Observatory.Gateway.{HITL, SessionLog, StepDetector}
  alias Observatory.KillSwitch.Upstream, as: Slots
  alias Observatory.Proxy.{HTTPClient, SSE, SessionId}
  alias Observatory.Test.{HTTP, Upstream}

  @keys [
    :llm_upstream,
    :anthropic_upstream,
    :llm_upstream_api_key,
    :llm_max_request_bytes,
    :llm_max_stream_ms,
    :llm_max_event_bytes,
    :llm_timeout_ms
  ]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn ->
      for {key, value} <- saved do
        if value == nil,
          do: Application.delete_env(:observatory, key),
          else: Application.put_env(:observatory, key, value)
      end
    end)

    n = System.unique_integer([:positive])
    %{agent: "agent-transport-#{n}", n: n}
  end

  defp use_openai(%{url: url}), do: Application.put_env(:observatory, :llm_upstream, url)

  defp use_anthropic(%{port: port}),
    do: Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{port}")

  defp chat(agent, body, headers \\ []) do
    HTTP.post("/v1/chat/completions", JSON.encode!(body),
      headers: HTTP.agent_headers(agent) ++ headers
    )
  end

  # A tool-calling conversation after `turns` turns, under `system`.
  defp conversation(system, task, turns, call \\ fn _ -> {"read_file", %{path: "build.log"}} end) do
    history =
      Enum.flat_map(1..turns//1, fn k ->
        {name, args} = call.(k)

        [
          %{
            role: "assistant",
            content: nil,
            tool_calls: [
              %{
                id: "call_#{k}",
                type: "function",
                function: %{name: name, arguments: JSON.encode!(args)}
              }
            ]
          },
          %{role: "tool", tool_call_id: "call_#{k}", content: "error: no such file"}
        ]
      end)

    %{
      model: "test-model",
      messages: [%{role: "system", content: system}, %{role: "user", content: task}] ++ history
    }
  end

  defp timestamped(k),
    do:
      "You fix builds. Now: 2025-03-0#{rem(k, 9) + 1}T10:#{10 + k}:00Z, " <>
        "request #{uuid()}, attempt #{k}."

  defp uuid do
    <<a::binary-8, b::binary-4, c::binary-4, d::binary-4, e::binary-12>> =
      Base.encode16(:crypto.strong_rand_bytes(16), case: :lower)

    Enum.join([a, b, c, d, e], "-")
  end

  describe "issue 19 item 3: derived sessions" do
    test "a system prompt with a timestamp, a UUID and a counter per request keeps one session",
         %{agent: agent, n: n} do
      use_openai(Upstream.answering("Trying."))
      different = fn k -> {"read_file", %{path: "src/#{k}.ex"}} end

      answers =
        for turns <- 0..5,
            do: chat(agent, conversation(timestamped(turns), "Fix #{n}", turns, different))

      sessions = answers |> Enum.map(& &1.headers["x-observatory-session-id"]) |> Enum.uniq()
      assert [session] = sessions
      assert session =~ ~r/^proxy-[0-9a-f]{32}$/
      assert length(SessionLog.recent(session)) == 5
    end

    test "another task, or another agent with the same conversation, is another session",
         %{agent: agent, n: n} do
      use_openai(Upstream.answering("ok"))

      session = fn agent, task ->
        chat(agent, conversation("S", task, 1)).headers["x-observatory-session-id"]
      end

      mine = session.(agent, "Fix #{n}")
      assert session.(agent, "Fix #{n}") == mine
      refute session.(agent, "Other #{n}") == mine
      refute session.(agent <> "-b", "Fix #{n}") == mine
    end

    test "X-Session-Id stays the explicit way, and is named back", %{agent: agent, n: n} do
      use_openai(Upstream.answering("ok"))
      resp = chat(agent, conversation("S", "x", 1), [{"x-session-id", "run-#{n}"}])
      assert resp.status == 200
      assert resp.headers["x-observatory-session-id"] == "run-#{n}"
    end

    test "the id is keyed with a durable server secret", %{agent: agent} do
      secret = SessionId.secret()
      assert byte_size(secret) == 32
      # Made once, kept in Mnesia (disc, on every node of a cluster).
      assert SessionId.secret() == secret
      assert [{_, _, ^secret}] = :mnesia.dirty_read(:observatory_proxy_secrets, :session_id_key)

      body = %{"messages" => [%{"role" => "user", "content" => "x"}]}
      data = :erlang.term_to_binary({agent, SessionId.start(body)}, [:deterministic])
      mac = :crypto.mac(:hmac, :sha256, secret, data) |> binary_part(0, 16)
      assert SessionId.derive(agent, body) == "proxy-" <> Base.encode16(mac, case: :lower)
    end
  end

  describe "issue 20 finding 4: proxy session ids cannot be precomputed" do
    # The id of earlier releases: SHA-256 of the agent id and the conversation's start,
    # which anyone who knows both can compute.
    defp unkeyed_id(agent, body) do
      messages = body["messages"]
      first_user = Enum.find_index(messages, &(&1["role"] == "user"))
      term = {agent, {Map.get(body, "system"), Enum.take(messages, first_user + 1)}}
      digest = :crypto.hash(:sha256, :erlang.term_to_binary(term, [:deterministic]))
      "proxy-" <> Base.encode16(binary_part(digest, 0, 12), case: :lower)
    end

    test "an agent that writes first into the id it computed for a victim takes nothing",
         %{agent: victim, n: n} do
      use_openai(Upstream.answering("ok"))
      attacker = victim <> "-attacker"
      body = conversation("You fix builds.", "Fix #{n}", 1)
      squatted = unkeyed_id(victim, JSON.decode(JSON.encode!(body)) |> elem(1))

      envelope = %{
        meta: %{
          step_id: "squat-#{n}",
          session_id: squatted,
          agent_id: attacker,
          timestamp: "2025-01-01T00:00:00Z"
        },
        cognition: %{intent: "squat"},
        action: %{tool_call: "noop", status: "success"}
      }

      assert HTTP.post_json("/api/v1/decision_logs", envelope,
               headers: HTTP.agent_headers(attacker)
             ).status == 200

      {resp, log} = with_log(fn -> chat(victim, body) end)
      assert resp.status == 200
      refute log =~ "was refused"

      session = resp.headers["x-observatory-session-id"]
      refute session == squatted
      assert [%{"meta" => %{"agent_id" => ^victim}}] = SessionLog.recent(session)
    end
  end

  describe "issue 19 item 4: proxied bodies have a cap of their own" do
    test "a 2 MiB conversation (over :max_body_bytes) is forwarded byte for byte", %{agent: agent} do
      test = self()

      use_openai(
        Upstream.start(fn body ->
          send(test, {:forwarded, body})
          {200, "application/json", Upstream.completion("ok")}
        end)
      )

      big = String.duplicate("log line 42: nothing to see\n", 80_000)
      body = JSON.encode!(%{model: "m", messages: [%{role: "user", content: big}]})
      assert byte_size(body) > 2 * 1024 * 1024

      resp = HTTP.post("/v1/chat/completions", body, headers: HTTP.agent_headers(agent))
      assert resp.status == 200
      assert_receive {:forwarded, ^body}
    end

    test "past :llm_max_request_bytes, 413 in the API's own shape, from Content-Length",
         %{agent: agent} do
      use_openai(Upstream.answering("never"))
      default = ObservatoryWeb.API.LLMProxy.max_request_bytes()
      assert default == 32 * 1024 * 1024

      for {path, extra, shape} <- [
            {"/v1/chat/completions", "",
             &match?(%{"error" => %{"code" => "body_too_large"}}, &1)},
            {"/v1/responses", "", &match?(%{"error" => %{"code" => "body_too_large"}}, &1)},
            {"/v1/messages", "anthropic-version: 2023-06-01\r\n",
             &match?(%{"type" => "error", "error" => %{"type" => "request_too_large"}}, &1)}
          ] do
        head =
          "POST #{path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer #{HTTP.key_for(agent)}\r\n" <>
            "Content-Type: application/json\r\n#{extra}Content-Length: #{default + 1}\r\n\r\n"

        response = HTTP.raw(head)
        assert response =~ "HTTP/1.1 413", path
        [_, json] = String.split(response, "\r\n\r\n", parts: 2)
        assert shape.(elem(JSON.decode(json), 1)), json
      end
    end
  end

  describe "issue 19 item 4: the bodies held at once have a budget" do
    test "past :llm_max_request_bytes_in_flight, 503 gateway_busy with Retry-After; one alone always passes",
         %{agent: agent} do
      use_openai(Upstream.answering("ok"))
      Application.put_env(:observatory, :llm_max_request_bytes_in_flight, 10_000)
      on_exit(fn -> Application.delete_env(:observatory, :llm_max_request_bytes_in_flight) end)

      # One request larger than the whole budget, alone: admitted.
      big = %{model: "m", messages: [%{role: "user", content: String.duplicate("x", 20_000)}]}
      assert chat(agent, big).status == 200

      # A slow client holds 9,000 bytes of the budget while its body trickles in.
      {:ok, slow} =
        :gen_tcp.connect(~c"127.0.0.1", ObservatoryWeb.Endpoint.port(), [:binary, active: false])

      :ok =
        :gen_tcp.send(
          slow,
          "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer #{HTTP.key_for(agent)}\r\n" <>
            "Content-Type: application/json\r\nContent-Length: 9000\r\n\r\n{\"model\": "
        )

      await(fn -> Slots.request_bytes_in_flight() >= 9_000 end)

      # (:httpc would retry a 503 with Retry-After by itself: the agent's side is raw.)
      body =
        JSON.encode!(%{
          model: "m",
          messages: [%{role: "user", content: String.duplicate("y", 2_000)}]
        })

      headers = [{"content-type", "application/json"} | HTTP.agent_headers(agent)]
      {:ok, conn} = HTTPClient.request(HTTP.url("/v1/chat/completions"), headers, body)
      {:ok, 503, busy_headers, conn} = HTTPClient.read_head(conn)
      {:ok, busy, _} = HTTPClient.read_all(conn)
      assert {:ok, %{"error" => %{"code" => "gateway_busy"}}} = JSON.decode(busy)
      assert {"retry-after", "1"} in busy_headers

      :gen_tcp.close(slow)
      await(fn -> Slots.request_bytes_in_flight() == 0 end)
      assert chat(agent, conversation("S", "after", 0)).status == 200
    end
  end

  # Polls a condition another process makes true (a socket's bytes being read).
  defp await(condition, tries \\ 200) do
    cond do
      condition.() -> :ok
      tries == 0 -> flunk("the condition never held")
      true -> Process.sleep(10) && await(condition, tries - 1)
    end
  end

  describe "issue 19 item 5: upstream headers pass through, error or not" do
    @upstream_key "sk-upstream-secret-key"

    defp rate_limited(status) do
      [
        {"retry-after", "7"},
        {"retry-after-ms", "7000"},
        {"x-request-id", "req_#{status}"},
        {"x-ratelimit-remaining-requests", "0"},
        {"x-ratelimit-reset-tokens", "6m0s"},
        {"anthropic-ratelimit-requests-remaining", "0"},
        {"openai-processing-ms", "12"},
        # Not to be passed on:
        {"set-cookie", "__cf_bm=abc; path=/"},
        {"alt-svc", ~s(h3=":443")},
        {"strict-transport-security", "max-age=31536000"},
        {"keep-alive", "timeout=5"},
        {"x-echo", "Bearer " <> @upstream_key},
        {"x-observatory-session-id", "forged"}
      ]
    end

    defp passed_on?(headers) do
      headers["retry-after"] == "7" and headers["retry-after-ms"] == "7000" and
        headers["x-ratelimit-remaining-requests"] == "0" and
        headers["x-ratelimit-reset-tokens"] == "6m0s" and
        headers["anthropic-ratelimit-requests-remaining"] == "0" and
        headers["openai-processing-ms"] == "12"
    end

    defp dropped?(headers) do
      Enum.all?(
        ["set-cookie", "alt-svc", "strict-transport-security", "keep-alive", "x-echo"],
        &(headers[&1] == nil)
      ) and not Enum.any?(headers, fn {_, v} -> v =~ @upstream_key end)
    end

    test "a 429's retry-after, request id and rate limits reach the agent (OpenAI, Anthropic)",
         %{agent: agent} do
      Application.put_env(:observatory, :llm_upstream_api_key, @upstream_key)

      error =
        ~s({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}})

      use_openai(Upstream.start(fn _ -> {429, "application/json", rate_limited(429), error} end))

      use_anthropic(
        Upstream.start(fn _ ->
          {429, "application/json", rate_limited(429),
           ~s({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})}
        end)
      )

      openai = chat(agent, conversation("S", "x", 0))
      assert openai.status == 429
      assert openai.body == elem(JSON.decode(error), 1)
      assert openai.headers["x-request-id"] == "req_429"
      assert passed_on?(openai.headers) and dropped?(openai.headers)
      assert "proxy-" <> _ = openai.headers["x-observatory-session-id"]

      anthropic =
        HTTP.post(
          "/v1/messages",
          JSON.encode!(%{model: "m", max_tokens: 5, messages: [%{role: "user", content: "x"}]}),
          headers: [{"x-api-key", HTTP.key_for(agent)}, {"anthropic-version", "2023-06-01"}]
        )

      assert anthropic.status == 429
      assert anthropic.body["error"]["type"] == "rate_limit_error"
      assert passed_on?(anthropic.headers) and dropped?(anthropic.headers)
    end

    test "a success and a stream carry them too", %{agent: agent} do
      Application.put_env(:observatory, :llm_upstream_api_key, @upstream_key)

      use_openai(
        Upstream.start(fn body ->
          if body =~ ~s("stream":true),
            do:
              {:chunked, 200, "text/event-stream", rate_limited(200),
               fn resp ->
                 Upstream.write_chunk(resp, Upstream.chunk_event("hi"))
                 Upstream.write_chunk(resp, "data: [DONE]\n\n")
               end},
            else: {200, "application/json", rate_limited(200), Upstream.completion("hi")}
        end)
      )

      plain = chat(agent, conversation("S", "x", 0))
      assert plain.status == 200
      assert passed_on?(plain.headers) and dropped?(plain.headers)

      body = JSON.encode!(Map.put(conversation("S", "x", 0), :stream, true))
      headers = [{"content-type", "application/json"} | HTTP.agent_headers(agent)]
      {:ok, conn} = HTTPClient.request(HTTP.url("/v1/chat/completions"), headers, body)
      {:ok, 200, stream_headers, conn} = HTTPClient.read_head(conn)
      {:ok, _, _} = HTTPClient.read_all(conn)
      stream_headers = Map.new(stream_headers)
      assert stream_headers["x-request-id"] == "req_200"
      assert passed_on?(stream_headers) and dropped?(stream_headers)
      assert stream_headers["x-observatory-session-id"] =~ "proxy-"
    end

    test "a broken answer's 502 keeps the upstream's retry-after" do
      assert ObservatoryWeb.API.LLMProxy.upstream_headers([
               {"retry-after", "30"},
               {"connection", "close, x-hop"},
               {"x-hop", "1"},
               {"transfer-encoding", "chunked"},
               {"content-length", "12"}
             ]) == [{"retry-after", "30"}]
    end
  end

  describe "issue 19 item 6: a step-detector block refuses the session's next request" do
    test "like a pause: the API's shape, the block's guidance, nothing sent, steps kept",
         %{agent: agent, n: n} do
      test = self()

      use_anthropic(
        Upstream.start(fn _ ->
          send(test, :upstream_called)
          {200, "application/json", Upstream.message("", [{"read_file", %{path: "build.log"}}])}
        end)
      )

      session = "sess-blocked-#{n}"

      request = fn turns ->
        blocks =
          Enum.flat_map(1..turns//1, fn k ->
            [
              %{
                role: "assistant",
                content: [
                  %{
                    type: "tool_use",
                    id: "tu_#{k}",
                    name: "read_file",
                    input: %{path: "build.log"}
                  }
                ]
              },
              %{
                role: "user",
                content: [%{type: "tool_result", tool_use_id: "tu_#{k}", content: "no such file"}]
              }
            ]
          end)

        HTTP.post(
          "/v1/messages",
          JSON.encode!(%{
            model: "m",
            max_tokens: 5,
            messages: [%{role: "user", content: "Fix #{n}"} | blocks]
          }),
          headers: [
            {"x-api-key", HTTP.key_for(agent)},
            {"anthropic-version", "2023-06-01"},
            {"x-session-id", session}
          ]
        )
      end

      # Five identical steps, then the sixth: its fifth repeat blocks the session, and
      # the request that carries it is the first refused.
      for turns <- 0..5, do: assert(request.(turns).status == 200)
      assert %{blocked: false} = StepDetector.state(session)
      flush(:upstream_called)

      refused = request.(6)
      assert %{blocked: true} = StepDetector.state(session)
      assert refused.status == 403

      assert %{
               "type" => "error",
               "error" => %{"type" => "permission_error", "message" => message}
             } = refused.body

      assert message =~ "session #{session} is blocked by the step detector: Loop blocked:"
      assert refused.headers["x-observatory-session-id"] == session
      refute_received :upstream_called
      assert SessionLog.count(session) == 6

      :ok = StepDetector.reset(session, operator: "alice")
      assert request.(7).status == 200
    end
  end

  ## Open requests end when their agent, key or session stops being valid

  # An upstream that streams one event, then waits for :go (writing keep-alive
  # comments, so that it notices a hang-up); tells the test when the proxy hung up.
  defp held_stream(first, rest) do
    test = self()

    Upstream.start(fn _ ->
      {:chunked, 200, "text/event-stream",
       fn resp ->
         Upstream.write_chunk(resp, first)
         send(test, {:streaming, self()})

         case hold(resp) do
           :go -> for piece <- rest, do: Upstream.write_chunk(resp, piece)
           :closed -> send(test, :upstream_hung_up)
         end
       end}
    end)
  end

  defp hold(resp) do
    receive do
      :go -> :go
    after
      50 ->
        case Upstream.write_chunk(resp, ": keep-alive\n\n") do
          :ok -> hold(resp)
          :closed -> :closed
        end
    end
  end

  defp open_stream(path, headers, body), do: path |> open_held(headers, body) |> elem(0)

  # The agent's connection, once the upstream holds the stream, and the upstream.
  defp open_held(path, headers, body) do
    headers = [{"content-type", "application/json"} | headers]
    {:ok, conn} = HTTPClient.request(HTTP.url(path), headers, JSON.encode!(body), timeout: 5_000)
    {:ok, 200, _headers, conn} = HTTPClient.read_head(conn)
    assert_receive {:streaming, upstream}, 5_000
    {conn, upstream}
  end

  # Every event until the proxy ends the stream.
  defp events_to_end(conn) do
    {:ok, raw, _conn} = HTTPClient.read_all(conn)
    {events, _, _} = SSE.parse(SSE.new(), raw)
    Enum.reject(events, &(&1.data == ""))
  end

  defp chat_stream(agent, headers \\ []), do: agent |> chat_stream_held(headers) |> elem(0)

  defp chat_stream_held(agent, headers \\ []) do
    use_openai(
      held_stream(Upstream.chunk_event("Hel"), [Upstream.chunk_event("lo"), "data: [DONE]\n\n"])
    )

    body = Map.put(conversation("S", "Stream #{agent}", 0), :stream, true)

    auth =
      if List.keymember?(headers, "authorization", 0), do: [], else: HTTP.agent_headers(agent)

    open_held("/v1/chat/completions", auth ++ headers, body)
  end

  describe "issue 19 item 6 / issue 20 finding 9: open streams end when their credential or agent stops being valid" do
    test "a deactivation ends an open stream at once, with an error event in OpenAI's shape",
         %{agent: agent} do
      conn = chat_stream(agent)
      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice", reason: "runaway")

      assert %{data: %{"error" => error}} = List.last(events_to_end(conn))
      assert %{"code" => "agent_inactive", "message" => message} = error
      assert message == "Agent #{agent} is inactive"
      assert_receive :upstream_hung_up, 2_000
    end

    test "a revoked key ends it (401 in the stream); a rotation too", %{agent: agent} do
      {:ok, %{key: key, key_id: key_id}} = AgentKeys.issue(agent)
      conn = chat_stream(agent, [{"authorization", "Bearer " <> key}])
      :ok = AgentKeys.revoke(agent, key_id)

      assert %{data: %{"error" => %{"code" => "invalid_api_key"}}} =
               List.last(events_to_end(conn))

      assert_receive :upstream_hung_up, 2_000

      {:ok, %{key: key}} = AgentKeys.issue(agent)
      conn = chat_stream(agent, [{"authorization", "Bearer " <> key}])
      {:ok, _} = AgentKeys.rotate(agent)

      assert %{data: %{"error" => %{"code" => "invalid_api_key"}}} =
               List.last(events_to_end(conn))
    end

    test "a pause of its session ends it, with the pause's reason", %{agent: agent, n: n} do
      session = "sess-paused-stream-#{n}"
      conn = chat_stream(agent, [{"x-session-id", session}])
      {:ok, _} = HITL.pause(session, operator: "alice", reason: "inspect")
      on_exit(fn -> HITL.paused?(session) && HITL.resume(session, operator: "test") end)

      assert %{data: %{"error" => error}} = List.last(events_to_end(conn))
      assert %{"code" => "session_paused", "message" => message} = error
      assert message =~ "(inspect)"
    end

    test "another agent's deactivation leaves the stream alone", %{agent: agent} do
      {conn, upstream} = chat_stream_held(agent)
      other = agent <> "-other"
      HTTP.key_for(other)
      {:ok, _} = KillSwitch.deactivate(other, operator: "alice")
      send(upstream, :go)

      texts =
        for %{data: %{"choices" => [%{"delta" => d}]}} <- events_to_end(conn), do: d["content"]

      assert texts == ["Hel", "lo"]
    end

    test "Anthropic and Responses streams end with their APIs' error events", %{agent: agent} do
      {start, [first | rest], stop} = Upstream.message_events(["Hel", "lo"])
      use_anthropic(held_stream(IO.iodata_to_binary(start ++ [first]), rest ++ stop))

      conn =
        open_stream(
          "/v1/messages",
          [{"x-api-key", HTTP.key_for(agent)}, {"anthropic-version", "2023-06-01"}],
          %{model: "m", max_tokens: 5, stream: true, messages: [%{role: "user", content: "hi"}]}
        )

      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice")
      events = events_to_end(conn)

      assert %{
               event: "error",
               data: %{"type" => "error", "error" => %{"type" => "permission_error"}}
             } = List.last(events)

      {:ok, _} = KillSwitch.activate(agent, operator: "alice")
      {start, [first | rest], stop} = Upstream.response_events(["Hel", "lo"])
      use_openai(held_stream(IO.iodata_to_binary(start ++ [first]), rest ++ stop))

      conn =
        open_stream("/v1/responses", HTTP.agent_headers(agent), %{
          model: "m",
          input: "hi",
          stream: true
        })

      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice")

      assert %{
               event: "error",
               data: %{
                 "type" => "error",
                 "code" => "agent_inactive",
                 "error" => %{"code" => "agent_inactive"}
               }
             } = List.last(events_to_end(conn))
    end

    test "a watcher that crashed comes back and ends the stream all the same", %{agent: agent} do
      conn = chat_stream(agent)
      old = Process.whereis(Observatory.Proxy.OpenRequests)
      Process.exit(old, :kill)
      await(fn -> Process.whereis(Observatory.Proxy.OpenRequests) not in [nil, old] end)
      # Subscribed again once its first message is handled.
      :sys.get_state(Observatory.Proxy.OpenRequests)

      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice")
      assert %{data: %{"error" => %{"code" => "agent_inactive"}}} = List.last(events_to_end(conn))
    end

    test "a request waiting for a whole answer is answered 403 at once", %{agent: agent} do
      test = self()

      use_openai(
        Upstream.start(fn _ ->
          send(test, {:streaming, self()})

          receive do
            :go -> {200, "application/json", Upstream.completion("late")}
          after
            5_000 -> {200, "application/json", Upstream.completion("too late")}
          end
        end)
      )

      task = Task.async(fn -> chat(agent, conversation("S", "wait", 0)) end)
      assert_receive {:streaming, _}, 5_000
      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice")
      resp = Task.await(task)
      assert resp.status == 403
      assert resp.body["error"]["code"] == "agent_inactive"
    end

    test "a stream ends after :llm_max_stream_ms, with an error event", %{agent: agent} do
      Application.put_env(:observatory, :llm_max_stream_ms, 300)

      {events, log} =
        with_log(fn ->
          conn = chat_stream(agent)
          events_to_end(conn)
        end)

      assert [_, %{data: %{"error" => %{"code" => "upstream_error", "message" => message}}}] =
               events

      assert message =~ "the stream reached its maximum duration of 300 ms"
      assert log =~ "maximum duration"
    end

    test "the upstream timeout defaults to the SDKs' 600 s, configurable" do
      assert Application.get_env(:observatory, :llm_timeout_ms) == 600_000
      Application.delete_env(:observatory, :llm_timeout_ms)
      assert Slots.timeout_ms() == 600_000
      Application.put_env(:observatory, :llm_timeout_ms, 1_000)
      assert Slots.timeout_ms() == 1_000
    end
  end

  defp flush(message) do
    receive do
      ^message -> flush(message)
    after
      0 -> :ok
    end
  end

  describe "issue 20 finding 6 through the proxy: an event over the cap ends the stream" do
    test "with an error event; the upstream is hung up on", %{agent: agent} do
      Application.put_env(:observatory, :llm_max_event_bytes, 64 * 1024)
      giant = "data: {\"x\":\"" <> String.duplicate("a", 100_000) <> "\"}\n\n"

      use_openai(
        Upstream.start(fn _ ->
          {:chunked, 200, "text/event-stream", fn resp -> Upstream.write_chunk(resp, giant) end}
        end)
      )

      body = JSON.encode!(Map.put(conversation("S", "giant", 0), :stream, true))
      headers = [{"content-type", "application/json"} | HTTP.agent_headers(agent)]

      capture_log(fn ->
        {:ok, conn} = HTTPClient.request(HTTP.url("/v1/chat/completions"), headers, body)
        {:ok, 200, _, conn} = HTTPClient.read_head(conn)
        {:ok, raw, _} = HTTPClient.read_all(conn)

        assert {[%{data: %{"error" => %{"message" => message}}}], _, _} =
                 SSE.parse(SSE.new(), raw)

        assert message =~ "larger than 65536 bytes"
      end)
    end
  end
end
