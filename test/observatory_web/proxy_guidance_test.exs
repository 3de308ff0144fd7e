defmodule ObservatoryWeb.ProxyGuidanceTest do
  # Graded response, item 1: a looping proxied session's next request carries a
  # guidance note in its newest tool result, in each API's shape; nothing for a healthy
  # session or with the setting off; the agent's own body is what the steps and the
  # kill switch read. Real sockets and a stub upstream that reports what it received.
  # Changes the upstream configuration: not async.
  use ExUnit.Case, async: false
  @moduletag :capture_log

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.Gateway.{Events, SessionLog}
  alias Observatory.Proxy.{BodyEdit, Guidance}
  alias Observatory.Test.{HTTP, ToolConversation, Upstream}

  doctest BodyEdit

  @keys [:llm_upstream, :anthropic_upstream, :guidance]
  @paths %{
    chat_completions: "/v1/chat/completions",
    messages: "/v1/messages",
    responses: "/v1/responses"
  }
  @loop {"read_file", %{"path" => "build.log"}, "error: no such file: build.log"}

  setup do
    # Restored as they were, unset ones unset.
    Observatory.TrackerCase.restore_env_on_exit(@keys)

    upstream =
      Upstream.start(fn _body, _headers, %{path: path} ->
        case path do
          "/v1/chat/completions" -> {200, "application/json", Upstream.completion("ok")}
          "/v1/responses" -> {200, "application/json", Upstream.response("ok")}
          "/v1/messages" -> {200, "application/json", Upstream.message("ok")}
        end
      end)

    Application.put_env(:observatory, :llm_upstream, upstream.url)
    Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{upstream.port}")
    Application.put_env(:observatory, :guidance, enabled: false)
    %{n: System.unique_integer([:positive])}
  end

  defp agent(n, api, guidance) do
    agent = "agent-guidance-#{api}-#{n}"
    HTTP.key_for(agent)
    {:ok, _} = Guidance.configure(agent, guidance)
    agent
  end

  # Sends the conversation after `turns` and returns the body the upstream received.
  defp send_turns(agent, api, turns, session) do
    body = ToolConversation.json(api, "Fix the build.", turns)

    headers =
      HTTP.agent_headers(agent) ++
        [{"x-session-id", session}, {"anthropic-version", "2023-06-01"}]

    resp = HTTP.post(@paths[api], body, headers: headers)
    assert resp.status == 200, inspect(resp)
    assert_receive {:upstream_request, received, _auth}
    {body, received}
  end

  # The newest tool result's text, in each shape.
  defp newest_result(:chat_completions, body), do: List.last(body["messages"])["content"]
  defp newest_result(:responses, body), do: List.last(body["input"])["output"]

  defp newest_result(:messages, body),
    do: List.last(List.last(body["messages"])["content"])["content"]

  defp decode(json), do: elem(JSON.decode(json), 1)

  describe "guidance note: a looping session's next request carries it in its newest tool result" do
    for api <- [:chat_completions, :messages, :responses] do
      @api api
      test "#{api}: the second repeat brings the note, naming the call; the rest byte for byte",
           %{n: n} do
        agent = agent(n, @api, true)
        session = "sess-guidance-#{@api}-#{n}"
        Events.subscribe(KillSwitch.topic())

        # One step: nothing repeats, the body goes up as it was sent.
        {sent, received} = send_turns(agent, @api, [@loop], session)
        assert received == sent

        # The same call and result again: the loop verdict says suspect.
        {sent, received} = send_turns(agent, @api, [@loop, @loop], session)
        refute received == sent
        note = newest_result(@api, decode(received))
        assert note =~ "error: no such file: build.log\n\n[Observatory] Loop warning: "
        assert note =~ ~s(read_file {"path":"build.log"})
        assert note =~ "change your approach, or stop and summarize what is blocking you."

        # Nothing else changed: without the inserted text, the received body is the sent
        # one, byte for byte.
        "error: no such file: build.log" <> added = note
        escaped = added |> JSON.encode!() |> String.slice(1..-2//1)
        assert String.replace(received, escaped, "", global: false) == sent

        # The third: the verdict says loop.
        {_sent, received} = send_turns(agent, @api, List.duplicate(@loop, 3), session)
        assert newest_result(@api, decode(received)) =~ "the same call 3 times in a row"

        # The fourth: the step detector warns (three repeats after the first), in its words.
        {_sent, received} = send_turns(agent, @api, List.duplicate(@loop, 4), session)
        note = newest_result(@api, decode(received))
        assert note =~ "[Observatory] Loop warning: 3 steps in a row re-ran code"
        assert note =~ ~s(Repeated call: read_file {"path":"build.log"})

        # Every note recorded as an event of the agent (newest first), and broadcast.
        events =
          for e <- KillSwitch.events(agent_id: agent), e.event_type == "guidance_injected", do: e

        assert [
                 %{details: %{source: "step_detector", session_id: ^session}},
                 %{
                   details: %{source: "loop_verdict", repeats: ~s(read_file {"path":"build.log"})}
                 },
                 %{details: %{source: "loop_verdict"}}
               ] = events

        assert_received %{event_type: "guidance_injected", agent_id: ^agent}

        # The steps were read from the agent's own body: no note in what was recorded.
        for step <- SessionLog.recent(session),
            do: assert(step["action"]["result"] == "error: no such file: build.log")
      end
    end

    test "a retry of the request carries the same note", %{n: n} do
      agent = agent(n, :chat_completions, true)
      session = "sess-guidance-retry-#{n}"
      send_turns(agent, :chat_completions, [@loop], session)
      {_, first} = send_turns(agent, :chat_completions, [@loop, @loop], session)
      {_, retry} = send_turns(agent, :chat_completions, [@loop, @loop], session)
      assert retry == first
      assert newest_result(:chat_completions, decode(retry)) =~ "[Observatory] Loop warning"
    end

    test "a block-list result gets a text block", %{n: n} do
      agent = agent(n, :messages, true)
      session = "sess-guidance-blocks-#{n}"
      blocks = [%{"type" => "text", "text" => "error: no such file: build.log"}]
      turn = {"read_file", %{"path" => "build.log"}, blocks}
      send_turns(agent, :messages, [turn], session)
      {_, received} = send_turns(agent, :messages, [turn, turn], session)

      assert [^blocks, [_ | _] = with_note] = [blocks, newest_result(:messages, decode(received))]

      assert [
               %{"type" => "text", "text" => "error: no such file: build.log"},
               %{"type" => "text", "text" => "[Observatory] Loop warning: " <> _}
             ] = with_note
    end
  end

  describe "guidance note: an agent stuck without an identical repeat (nearly identical calls, one answer)" do
    # The same query re-sent with another LIMIT: never the identical call twice, so the
    # exact-repeat rules and the step detector stay quiet; the near-repeat rule is what
    # sees it.
    defp query(limit, answer),
      do:
        {"sql", %{"query" => "SELECT code FROM template WHERE name = 'Book' LIMIT #{limit}"},
         answer}

    @missing "Error: Table 'docs.template' doesn't exist"

    test "the third nearly identical call brings the note, the fourth names the loop", %{n: n} do
      agent = agent("near-#{n}", :chat_completions, true)
      session = "sess-near-#{n}"
      turns = for limit <- [1, 10, 100, 1000], do: query(limit, @missing)

      for k <- 1..2 do
        {sent, received} = send_turns(agent, :chat_completions, Enum.take(turns, k), session)
        assert received == sent
      end

      {_sent, received} = send_turns(agent, :chat_completions, Enum.take(turns, 3), session)
      note = newest_result(:chat_completions, decode(received))

      assert note =~
               @missing <> "\n\n[Observatory] Loop warning: 3 nearly identical calls in a row"

      assert note =~ "LIMIT 100"

      {_sent, received} = send_turns(agent, :chat_completions, turns, session)
      note = newest_result(:chat_completions, decode(received))
      assert note =~ "Loop warning: 4 nearly identical calls in a row"

      assert [%{details: %{source: "loop_verdict"}}, %{details: %{source: "loop_verdict"}}] =
               for(
                 e <- KillSwitch.events(agent_id: agent),
                 e.event_type == "guidance_injected",
                 do: e
               )
    end

    test "the near-miss: the same query narrowed, its answer changing each time, gets no note",
         %{n: n} do
      agent = agent("narrowing-#{n}", :chat_completions, true)
      session = "sess-narrowing-#{n}"
      turns = for limit <- [1000, 100, 10, 1], do: query(limit, "#{limit} rows")

      for k <- 1..4 do
        {sent, received} = send_turns(agent, :chat_completions, Enum.take(turns, k), session)
        assert received == sent
      end
    end
  end

  describe "guidance note: nothing for a healthy session, or with the setting off" do
    for api <- [:chat_completions, :messages, :responses] do
      @api api
      test "#{api}: different calls, six turns: every body goes up as sent", %{n: n} do
        agent = agent(n, @api, true)
        session = "sess-healthy-#{@api}-#{n}"

        turns =
          for k <- 1..6, do: {"read_file", %{"path" => "src/h_#{k}.py"}, "def h_#{k}(): pass"}

        for k <- 1..6 do
          {sent, received} = send_turns(agent, @api, Enum.take(turns, k), session)
          assert received == sent
        end

        assert KillSwitch.events(agent_id: agent)
               |> Enum.filter(&(&1.event_type == "guidance_injected")) == []
      end
    end

    test "the agent's setting off wins over a default on; nil follows the default", %{n: n} do
      Application.put_env(:observatory, :guidance, enabled: true)
      off = agent(n, :chat_completions, false)
      default = agent(n + 1, :chat_completions, nil)

      for turns <- 1..3 do
        {sent, received} =
          send_turns(off, :chat_completions, List.duplicate(@loop, turns), "off-#{n}")

        assert received == sent
      end

      send_turns(default, :chat_completions, [@loop], "default-#{n}")
      {sent, received} = send_turns(default, :chat_completions, [@loop, @loop], "default-#{n}")
      refute received == sent

      # The default off: an agent without a setting gets nothing.
      Application.put_env(:observatory, :guidance, enabled: false)

      {sent, received} =
        send_turns(default, :chat_completions, [@loop, @loop, @loop], "default-#{n}")

      assert received == sent
    end
  end

  test "guidance note: the kill switch reads the agent's body, with or without a note", %{n: n} do
    with_notes = agent(n, :chat_completions, true)
    without = agent(n + 1, :chat_completions, false)

    for agent <- [with_notes, without] do
      {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true, "threshold" => 100})

      for turns <- 1..4,
          do: send_turns(agent, :chat_completions, List.duplicate(@loop, turns), "ks-#{agent}")
    end

    assert KillSwitch.window(with_notes) == KillSwitch.window(without)
    assert KillSwitch.status(with_notes).score == KillSwitch.status(without).score
  end
end
