defmodule ObservatoryWeb.MessagesTest do
  # Issue 15 item 2: POST /v1/messages (Anthropic) through the kill switch, against
  # stub Anthropic upstreams on loopback. Changes :anthropic_upstream: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.Gateway.SessionLog
  alias Observatory.KillSwitch.{Agents, Windows}
  alias Observatory.Proxy.{HTTPClient, SSE}
  alias Observatory.Test.{HTTP, Upstream}
  alias ObservatoryWeb.API.Messages

  @keys [:anthropic_upstream, :anthropic_upstream_api_key, :llm_max_concurrent]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn -> for {key, value} <- saved, do: Application.put_env(:observatory, key, value) end)

    %{agent: "agent-anthropic-#{System.unique_integer([:positive])}"}
  end

  defp use_upstream(%{port: port}),
    do: Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{port}")

  defp headers(agent, extra \\ []) do
    HTTP.agent_headers(agent) ++ extra
  end

  defp messages(agent, body, extra \\ []) do
    body = if is_binary(body), do: body, else: JSON.encode!(body)
    HTTP.post("/v1/messages", body, headers: headers(agent, extra))
  end

  # The conversation an Anthropic agent sends after `turns` identical tool calls.
  defp looping(turns, opts \\ []) do
    error? = Keyword.get(opts, :is_error, false)

    history =
      Enum.flat_map(1..turns//1, fn k ->
        [
          %{
            role: "assistant",
            content: [
              %{type: "tool_use", id: "toolu_#{k}", name: "deploy", input: %{build: 4821}}
            ]
          },
          %{
            role: "user",
            content: [
              %{
                type: "tool_result",
                tool_use_id: "toolu_#{k}",
                content: "timeout",
                is_error: error?
              }
            ]
          }
        ]
      end)

    %{
      model: "claude-test",
      max_tokens: 100,
      stream: Keyword.get(opts, :stream, false),
      messages: [%{role: "user", content: "Deploy build 4821."} | history]
    }
  end

  describe "issue 15: Anthropic Messages through the proxy" do
    test "the body goes upstream unchanged with the configured x-api-key and the agent's anthropic-version",
         %{agent: agent} do
      test = self()

      upstream =
        Upstream.start(fn body, headers ->
          send(test, {:anthropic, body, headers})
          {200, "application/json", Upstream.message("Deploying.")}
        end)

      use_upstream(upstream)
      Application.put_env(:observatory, :anthropic_upstream_api_key, "sk-ant-upstream")
      body = JSON.encode!(looping(0))

      resp =
        messages(agent, body, [{"anthropic-version", "2023-06-01"}, {"x-api-key", "agent-side"}])

      assert resp.status == 200
      assert resp.body == JSON.decode(Upstream.message("Deploying.")) |> elem(1)

      assert_received {:anthropic, ^body, headers}
      assert headers["x-api-key"] == "sk-ant-upstream"
      assert headers["anthropic-version"] == "2023-06-01"
      refute Map.has_key?(headers, "authorization"), "the agent key stays at the gateway"
    end

    test "the agent key as x-api-key (the Anthropic SDK's api_key) authenticates as its agent and stays at the gateway",
         %{agent: agent} do
      test = self()

      upstream =
        Upstream.start(fn body, headers ->
          send(test, {:anthropic, body, headers})
          {200, "application/json", Upstream.message("Deploying.")}
        end)

      use_upstream(upstream)
      Application.put_env(:observatory, :anthropic_upstream_api_key, nil)
      {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true, "threshold" => 100})
      key = HTTP.key_for(agent)

      resp = HTTP.post("/v1/messages", JSON.encode!(looping(0)), headers: [{"x-api-key", key}])
      assert resp.status == 200
      assert length(KillSwitch.window(agent)) == 1, "the request counted for the key's agent"

      assert_received {:anthropic, _body, headers}
      refute Map.has_key?(headers, "x-api-key"), "the agent key is not sent upstream"
      refute Map.has_key?(headers, "authorization")
    end

    test "a looping agent trips the kill switch and gets the inactive answer in Anthropic's shape",
         %{agent: agent} do
      use_upstream(
        Upstream.start(fn _ ->
          {200, "application/json", Upstream.message("Deploy timed out.")}
        end)
      )

      {:ok, _} =
        KillSwitch.configure(agent, %{"enabled" => true, "window_size" => 5, "threshold" => 8})

      {statuses, log} = with_log(fn -> for k <- 1..5, do: messages(agent, looping(k)).status end)
      assert log =~ "kill switch deactivated agent #{inspect(agent)}"
      # Request k answers the k-th identical call with the same result: (k - 1) × (1.0
      # + 1.5), 10 > 8 at the fifth.
      assert statuses == [200, 200, 200, 200, 403]
      assert %{active: false, deactivated_by: :kill_switch} = Agents.get(agent)

      stopped = messages(agent, looping(6))
      assert stopped.status == 403

      assert stopped.body == %{
               "type" => "error",
               "error" => %{
                 "type" => "permission_error",
                 "message" => "Agent #{agent} is inactive"
               }
             }

      assert stopped.body == JSON.decode(JSON.encode!(Messages.inactive_body(agent))) |> elem(1)
    end

    test "the answer's text blocks are the response fingerprint; tool_use blocks are not text",
         %{agent: agent} do
      answer = Upstream.message("Deployment 4821 failed.", [{"deploy", %{build: 4821}}])
      use_upstream(Upstream.start(fn _ -> {200, "application/json", answer} end))
      {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true, "threshold" => 100})

      assert messages(agent, looping(1)).status == 200
      assert [%{response_hash: hash, tool_signatures: [_]}] = Windows.entries(agent)
      assert hash == KillSwitch.fingerprint("Deployment 4821 failed.")
    end

    test "tool_use and tool_result blocks become steps, once each; is_error is a failure",
         %{agent: agent} do
      use_upstream(Upstream.start(fn _ -> {200, "application/json", Upstream.message("ok")} end))
      session = "sess-anthropic-#{System.unique_integer([:positive])}"

      for turns <- [1, 2, 2, 3] do
        assert messages(agent, looping(turns, is_error: true), [{"x-session-id", session}]).status ==
                 200
      end

      steps = for e <- SessionLog.recent(session), do: e["action"]
      assert length(steps) == 3

      assert Enum.all?(steps, &match?(%{"tool_call" => "deploy", "status" => "failure"}, &1))
      assert hd(steps)["tool_input"] == %{"build" => 4821}
      assert hd(SessionLog.recent(session))["proxy"]["api"] == "messages"
    end

    test "a streamed answer arrives in pieces and its assembled text is fingerprinted",
         %{agent: agent} do
      test = self()
      {start, deltas, stop} = Upstream.message_events(["Deploy ", "timed out."])

      upstream =
        Upstream.start(fn _ ->
          {:chunked, 200, "text/event-stream",
           fn resp ->
             for e <- start ++ [hd(deltas)], do: Upstream.write_chunk(resp, e)
             send(test, {:held, self()})

             receive do
               :go -> for e <- tl(deltas) ++ stop, do: Upstream.write_chunk(resp, e)
             end
           end}
        end)

      use_upstream(upstream)
      {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true, "threshold" => 100})
      body = JSON.encode!(looping(1, stream: true))
      req_headers = [{"content-type", "application/json"} | headers(agent)]

      {:ok, conn} =
        HTTPClient.request(HTTP.url("/v1/messages"), req_headers, body, timeout: 10_000)

      {:ok, 200, resp_headers, conn} = HTTPClient.read_head(conn)
      assert {"content-type", "text/event-stream; charset=utf-8"} in resp_headers

      # The first delta is here while the upstream holds the rest.
      {early, conn} = read_until(conn, "content_block_delta")
      assert_receive {:held, held}

      assert [%{"delta" => %{"text" => "Deploy "}}] =
               for(%{event: "content_block_delta", data: d} <- early, do: d)

      send(held, :go)

      {:ok, rest, _} = HTTPClient.read_all(conn)
      {later, _, _} = SSE.parse(SSE.new(), rest)
      assert List.last(later).event == "message_stop"

      assert [%{response_hash: hash}] = Windows.entries(agent)
      assert hash == KillSwitch.fingerprint("Deploy timed out.")
    end

    test "errors are in Anthropic's shape", %{agent: agent} do
      use_upstream(Upstream.start(fn _ -> {200, "text/html", "<html>"} end))

      capture_log(fn ->
        cases = [
          {"no key", HTTP.post("/v1/messages", "{}", headers: [{"x-agent-id", agent}]), 401,
           "authentication_error"},
          {"a wrong x-api-key",
           HTTP.post("/v1/messages", "{}", headers: [{"x-api-key", "oak_not-a-key"}]), 401,
           "authentication_error"},
          {"X-Agent-Id of another agent",
           messages(agent, looping(0), [{"x-agent-id", "agent-http"}]), 403, "permission_error"},
          {"malformed JSON", messages(agent, "{\"messages\": "), 400, "invalid_request_error"},
          {"broken upstream", messages(agent, looping(0)), 502, "api_error"}
        ]

        for {name, resp, status, type} <- cases do
          assert resp.status == status, "#{name}: #{resp.status}"

          assert %{"type" => "error", "error" => %{"type" => ^type, "message" => m}} = resp.body,
                 name

          assert is_binary(m)
        end
      end)

      Application.put_env(:observatory, :anthropic_upstream, nil)

      capture_log(fn ->
        resp = messages(agent, looping(0))
        assert resp.status == 502
        assert resp.body["error"]["message"] =~ "no Anthropic upstream is configured"
      end)
    end
  end

  defp read_until(conn, event, sse \\ SSE.new(), acc \\ []) do
    {:data, data, conn} = HTTPClient.read(conn)
    {events, _, sse} = SSE.parse(sse, data)
    acc = acc ++ events

    if Enum.any?(acc, &(&1.event == event)),
      do: {acc, conn},
      else: read_until(conn, event, sse, acc)
  end
end
