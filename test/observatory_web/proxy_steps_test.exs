defmodule ObservatoryWeb.ProxyStepsTest do
  # Issue 15 item 3: an agent that only talks to the LLM proxy gets the whole product.
  # Real sockets, a stub upstream on loopback, the application's real tracker,
  # interceptor and HITL. Changes :llm_upstream: not async.
  use ExUnit.Case, async: false

  alias Observatory.Gateway.{DecisionLog, Events, HITL, Idempotency, SessionLog}
  alias Observatory.{JSON, Metrics}
  alias Observatory.Proxy.Steps
  alias Observatory.Test.{HTTP, Upstream}

  doctest Steps
  alias ObservatoryWeb.SessionClusterManager, as: Manager
  alias ObservatoryWeb.SessionClusterManager.{Alerts, Socket}

  setup do
    saved = Application.get_env(:observatory, :llm_upstream)
    on_exit(fn -> Application.put_env(:observatory, :llm_upstream, saved) end)
    upstream = Upstream.answering("Trying again.")
    Application.put_env(:observatory, :llm_upstream, upstream.url)
    n = System.unique_integer([:positive])
    %{agent: "agent-steps-#{n}", n: n}
  end

  defp chat(agent, body, headers \\ []) do
    headers = HTTP.agent_headers(agent) ++ headers
    HTTP.post("/v1/chat/completions", JSON.encode!(body), headers: headers)
  end

  # The conversation an OpenAI-style agent re-sends after `turns` turns, each one
  # assistant tool call and its result.
  # `call` gives each turn's call, and its result (the same error by default).
  defp conversation(task, turns, call \\ fn k -> {"read_file", %{path: "build-#{k}.log"}} end) do
    history =
      Enum.flat_map(1..turns//1, fn k ->
        {name, args, result} =
          case call.(k) do
            {name, args} -> {name, args, "error: file not found"}
            {_name, _args, _result} = given -> given
          end

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
          %{role: "tool", tool_call_id: "call_#{k}", content: result}
        ]
      end)

    %{
      model: "test-model",
      messages:
        [%{role: "system", content: "You fix builds."}, %{role: "user", content: task}] ++
          history
    }
  end

  defp steps(session_id), do: Enum.map(SessionLog.recent(session_id), & &1["action"])

  describe "issue 15: steps from proxied traffic" do
    test "each tool call of the previous turn becomes a DecisionLog, no step twice across turns",
         %{agent: agent, n: n} do
      session = "sess-proxy-#{n}"
      headers = [{"x-session-id", session}]

      # Turn 0: no tool call yet; then three turns, each re-sending the whole history.
      assert chat(agent, conversation("Fix build #{n}", 0), headers).status == 200
      assert steps(session) == []

      for turns <- 1..3 do
        assert chat(agent, conversation("Fix build #{n}", turns), headers).status == 200
      end

      assert [
               %{"tool_call" => "read_file", "tool_input" => %{"path" => "build-1.log"}},
               %{"tool_call" => "read_file", "tool_input" => %{"path" => "build-2.log"}},
               %{"tool_call" => "read_file", "tool_input" => %{"path" => "build-3.log"}} = last
             ] = steps(session)

      assert %{"status" => "success", "result" => "error: file not found"} = last

      [envelope | _] = Enum.reverse(SessionLog.recent(session))
      assert envelope["meta"]["agent_id"] == agent
      # The step's intent is its call (OpenAI tool turns have no text of their own).
      assert envelope["cognition"]["intent"] == ~s(read_file {"path":"build-3.log"})
      refute Map.has_key?(envelope["cognition"], "reasoning_chain")
      assert envelope["proxy"] == %{"api" => "chat_completions", "tool_call_id" => "call_3"}
      assert is_float(envelope["cognition"]["entropy_score"])
      # Three different calls: three tuples, nothing repeats.
      assert envelope["cognition"]["entropy_score"] == 1.0

      # A retry of the same turn (the SDK after a timeout) adds nothing: the gateway
      # answers its step as a replay.
      {proxied, replays} = {Metrics.get(:proxy_steps), Metrics.get(:step_replays)}
      assert chat(agent, conversation("Fix build #{n}", 3), headers).status == 200
      assert length(steps(session)) == 3
      assert SessionLog.count(session) == 3
      assert Metrics.get(:proxy_steps) == proxied
      assert Metrics.get(:step_replays) > replays
    end

    test "without X-Session-Id the session is derived from the conversation, stable across turns",
         %{agent: agent, n: n} do
      for turns <- 1..2, do: chat(agent, conversation("Task #{n}", turns))
      session = Steps.session_id(agent, JSON.encode!(conversation("Task #{n}", 1)) |> decode())
      assert "proxy-" <> _ = session
      assert length(steps(session)) == 2

      # Another conversation of the same agent is another session.
      other = Steps.session_id(agent, JSON.encode!(conversation("Other #{n}", 1)) |> decode())
      refute other == session
      assert steps(other) == []
    end

    test "a bad X-Session-Id is refused with a clear OpenAI-shaped 400", %{agent: agent} do
      resp = chat(agent, conversation("x", 1), [{"x-session-id", String.duplicate("s", 300)}])
      assert resp.status == 400
      assert resp.body["error"]["code"] == "invalid_session_id"
    end

    test "a looping agent that only talks to the proxy lands in the Entropy Alerts panel; " <>
           "Pause and Inspect refuses its next request",
         %{agent: agent, n: n} do
      {:ok, socket} = Manager.mount(%{}, %{"operator" => "alice"}, Socket.new(connected?: true))

      same = fn _k -> {"read_file", %{path: "build.log"}} end
      for turns <- 1..6, do: chat(agent, conversation("Loop #{n}", turns, same))
      session = Steps.session_id(agent, decode(JSON.encode!(conversation("Loop #{n}", 1))))

      assert_receive %{event_type: "entropy_alert", session_id: ^session} = alert, 5_000
      assert alert.agent_id == agent

      {:noreply, socket} = Manager.handle_info(alert, socket)
      assert [%{session_id: ^session} | _] = Alerts.rows(socket.assigns.alerts)
      page = socket.assigns |> Manager.render() |> IO.iodata_to_binary()
      assert page =~ ~s(phx-value-session_id="#{session}">Pause and Inspect</button>)

      {:noreply, _socket} =
        Manager.handle_event("pause_inspect", %{"session_id" => session}, socket)

      on_exit(fn -> HITL.paused?(session) && HITL.resume(session, operator: "test") end)

      # Refused in the API's own shape, not held; the step it carried is still recorded.
      before = SessionLog.count(session)
      flush_upstream()
      paused = chat(agent, conversation("Loop #{n}", 7, same))
      assert paused.status == 403
      assert %{"code" => "session_paused", "message" => message} = paused.body["error"]
      assert message =~ "session #{session} is paused by an operator (Pause and Inspect)"
      assert SessionLog.count(session) == before + 1
      refute_received {:upstream_request, _, _}

      {:ok, _} = HITL.resume(session, operator: "alice")

      # Seven identical calls with the same result: the step detector has blocked the
      # session too, and its block refuses the next request the way a pause does.
      blocked = chat(agent, conversation("Loop #{n}", 8, same))
      assert blocked.status == 403
      assert blocked.body["error"]["code"] == "session_blocked"
      :ok = Observatory.Gateway.StepDetector.reset(session, operator: "alice")
      assert chat(agent, conversation("Loop #{n}", 9, same)).status == 200
    end
  end

  describe "issue 19: proxied steps that score right (FRD-009's tuple is the call)" do
    test "a healthy agent reading a different file each turn is not a LOOP under the default alert source",
         %{agent: agent, n: n} do
      assert Application.get_env(:observatory, :alert_source) == :entropy
      Events.subscribe(Events.entropy_alerts())
      session = "sess-healthy-#{n}"
      # Each file its own text (the same error twelve times would be "stuck": the step
      # detector blocks new approaches that keep getting one result).
      files = fn k ->
        {"read_file", %{path: "src/handlers/h_#{k}.py"}, "def handler_#{k}(request): ..."}
      end

      for turns <- 1..12 do
        assert chat(agent, conversation("Read the handlers #{n}", turns, files), [
                 {"x-session-id", session}
               ]).status == 200
      end

      envelopes = SessionLog.recent(session)
      assert length(envelopes) == 12
      # Twelve different calls: twelve different tuples, the ratio never moves from 1.0.
      assert Enum.all?(envelopes, &(&1["cognition"]["entropy_score"] == 1.0))

      assert hd(envelopes)["cognition"]["intent"] ==
               ~s(read_file {"path":"src/handlers/h_1.py"})

      refute_received %{event_type: "entropy_alert", session_id: ^session}
    end

    test "the same call with the same result is a LOOP, however the model words its turns",
         %{agent: agent, n: n} do
      Events.subscribe(Events.entropy_alerts())
      session = "sess-reworded-#{n}"
      use_anthropic(Upstream.start(fn _ -> {200, "application/json", Upstream.message("ok")} end))

      words = ["Let me read the log.", "Trying again.", "One more time.", "Again.", "Retrying."]

      for turns <- 1..5 do
        body = anthropic_loop(Enum.take(words, turns))
        assert messages(agent, body, [{"x-session-id", session}]).status == 200
      end

      envelopes = SessionLog.recent(session)
      assert length(envelopes) == 5

      assert Enum.uniq(for e <- envelopes, do: e["cognition"]["intent"]) == [
               ~s(read_file {"path":"build.log"})
             ]

      # The model's own words are kept beside the step, not in its intent.
      assert for(e <- envelopes, do: e["cognition"]["reasoning_chain"]) == Enum.map(words, &[&1])
      assert_received %{event_type: "entropy_alert", session_id: ^session}
    end

    test "an intent is at most 1 KiB, and long calls that differ stay different" do
      long = fn tail -> %{"content" => String.duplicate("x", 2000) <> tail, "path" => "a.txt"} end
      a = Steps.intent("write_file", long.("a"))
      b = Steps.intent("write_file", long.("b"))
      assert byte_size(a) <= 1024 and byte_size(b) <= 1024
      assert a != b
      assert a == Steps.intent("write_file", long.("a"))
      assert String.starts_with?(a, ~s(write_file {"content":"xxx))
      assert Steps.intent("run", "not json") == "run not json"
      # Cut on a character boundary.
      assert String.valid?(Steps.intent("say", %{"text" => String.duplicate("é", 1000)}))
    end
  end

  describe "issue 13 finding 1 × issue 15: proxied steps go only into the agent's own sessions" do
    test "an X-Session-Id naming another agent's session is refused with 403 forbidden; nothing is recorded or sent",
         %{agent: victim, n: n} do
      attacker = "#{victim}-attacker"
      session = "sess-victim-#{n}"
      assert chat(victim, conversation("Fix #{n}", 1), [{"x-session-id", session}]).status == 200
      assert length(steps(session)) == 1
      flush_upstream()

      forged = chat(attacker, conversation("Forged #{n}", 2), [{"x-session-id", session}])
      assert forged.status == 403
      assert forged.body["error"]["code"] == "forbidden"
      assert length(steps(session)) == 1
      refute_received {:upstream_request, _, _}

      # Nor can it learn whether the session is paused: the same refusal.
      {:ok, _} = HITL.pause(session, operator: "alice", reason: "inspect")
      on_exit(fn -> HITL.paused?(session) && HITL.resume(session, operator: "test") end)
      probed = chat(attacker, conversation("Forged #{n}", 2), [{"x-session-id", session}])
      assert probed.body["error"]["code"] == "forbidden"

      assert chat(victim, conversation("Fix #{n}", 2), [{"x-session-id", session}]).body["error"][
               "code"
             ] == "session_paused"

      # The attacker's own session works as before.
      own = "sess-attacker-#{n}"
      assert chat(attacker, conversation("Own #{n}", 1), [{"x-session-id", own}]).status == 200
      assert [%{"tool_call" => "read_file"}] = steps(own)
    end

    test "Steps.record ingests as the given agent: a session recorded for another agent gets no step",
         %{agent: victim, n: n} do
      session = "sess-victim-direct-#{n}"
      assert chat(victim, conversation("Fix #{n}", 1), [{"x-session-id", session}]).status == 200

      {count, log} =
        ExUnit.CaptureLog.with_log(fn ->
          body = decode(JSON.encode!(conversation("Other #{n}", 1)))
          Steps.record(:openai, "#{victim}-other", session, body)
        end)

      assert count == 0
      assert log =~ "is a session of another agent"
      assert length(steps(session)) == 1
      # The refused step is not remembered as answered: were it allowed later, the turn
      # re-sent would bring it in (review finding: a claimed key was kept on refusal).
      other_body = decode(JSON.encode!(conversation("Other #{n}", 1)))
      [{_key, refused}] = Steps.envelopes(:openai, "#{victim}-other", session, other_body)
      {:ok, _parsed, fields} = DecisionLog.from_map(refused)
      assert {:new, ticket} = Idempotency.claim(fields)

      Idempotency.release(ticket)

      body = decode(JSON.encode!(conversation("Fix #{n}", 2)))
      assert Steps.record(:openai, victim, session, body) == 1
      assert length(steps(session)) == 2
    end
  end

  defp flush_upstream do
    receive do
      {:upstream_request, _, _} -> flush_upstream()
    after
      0 -> :ok
    end
  end

  defp decode(json), do: elem(JSON.decode(json), 1)

  defp use_anthropic(upstream) do
    saved = Application.get_env(:observatory, :anthropic_upstream)
    on_exit(fn -> Application.put_env(:observatory, :anthropic_upstream, saved) end)
    Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{upstream.port}")
  end

  defp messages(agent, body, headers) do
    headers = HTTP.agent_headers(agent) ++ headers
    HTTP.post("/v1/messages", JSON.encode!(body), headers: headers)
  end

  # An Anthropic agent's conversation: each turn says its words beside the same call,
  # which gets the same result.
  defp anthropic_loop(words) do
    history =
      words
      |> Enum.with_index(1)
      |> Enum.flat_map(fn {said, k} ->
        [
          %{
            role: "assistant",
            content: [
              %{type: "text", text: said},
              %{
                type: "tool_use",
                id: "toolu_#{k}",
                name: "read_file",
                input: %{path: "build.log"}
              }
            ]
          },
          %{
            role: "user",
            content: [%{type: "tool_result", tool_use_id: "toolu_#{k}", content: "no such file"}]
          }
        ]
      end)

    %{
      model: "claude-test",
      max_tokens: 100,
      messages: [%{role: "user", content: "Fix it."} | history]
    }
  end
end
