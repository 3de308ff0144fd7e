defmodule ObservatoryWeb.PythonSDKTest do
  # Issue 15: unmodified agents on the real `openai` and `anthropic` Python SDKs (PyPI,
  # installed by bin/setup into test/python/.venv) change only their base URL and get
  # the whole product: answers, streams as they arrive, steps, alerts.
  # Changes the upstream configuration: not async.
  use ExUnit.Case, async: false

  @moduletag :python

  alias Observatory.Gateway.{Events, LoopVerdict, SessionLog}
  alias Observatory.{JSON, KillSwitch}
  alias Observatory.KillSwitch.Agents
  alias Observatory.Test.{HTTP, PythonSDK, Upstream}

  @keys [:llm_upstream, :anthropic_upstream, :alert_source]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn ->
      for {key, value} <- saved, do: Application.put_env(:observatory, key, value)
      Observatory.IngestSettings.refresh()
    end)

    %{id: System.unique_integer([:positive])}
  end

  # Holds a stream after its first piece until the SDK agent calls the release URL.
  defp hold(resp, name, rest) do
    Process.register(self(), name)

    receive do
      :go -> :ok
    after
      10_000 -> send(:python_sdk_test, :never_released)
    end

    for piece <- rest, do: Upstream.write_chunk(resp, piece)
  end

  defp openai_upstream(id) do
    Upstream.start(fn body ->
      request = elem(JSON.decode(body), 1)

      cond do
        request["stream"] ->
          {:chunked, 200, "text/event-stream",
           fn resp ->
             Upstream.write_chunk(resp, Upstream.chunk_event("Hel"))
             hold(resp, :"held_openai_#{id}", [Upstream.chunk_event("lo."), "data: [DONE]\n\n"])
           end}

        request["tools"] ->
          id = "call_#{System.unique_integer([:positive])}"

          {200, "application/json",
           Upstream.tool_call_completion(id, "read_file", %{path: "build.log"})}

        true ->
          {200, "application/json", Upstream.completion("Hello.")}
      end
    end)
  end

  defp anthropic_upstream(id) do
    Upstream.start(fn body ->
      request = elem(JSON.decode(body), 1)

      cond do
        request["stream"] ->
          {start, [first | deltas], stop} = Upstream.message_events(["Hel", "lo."])

          {:chunked, 200, "text/event-stream",
           fn resp ->
             for e <- start ++ [first], do: Upstream.write_chunk(resp, e)
             hold(resp, :"held_anthropic_#{id}", deltas ++ stop)
           end}

        request["tools"] ->
          {200, "application/json", Upstream.message("", [{"read_file", %{path: "build.log"}}])}

        true ->
          {200, "application/json", Upstream.message("Hello.")}
      end
    end)
  end

  defp run_agents(agent, release),
    do: PythonSDK.run!("sdk_agents.py", [HTTP.key_for(agent), agent, release.url])

  describe "issue 15: agents on the real openai and anthropic SDKs, base_url changed only" do
    test "answers, streams in pieces, steps once each, and an entropy alert per looping agent",
         %{id: id} do
      Process.register(self(), :python_sdk_test)
      Application.put_env(:observatory, :llm_upstream, openai_upstream(id).url)

      Application.put_env(
        :observatory,
        :anthropic_upstream,
        "http://127.0.0.1:#{anthropic_upstream(id).port}"
      )

      release =
        Upstream.start(fn which ->
          send(:"held_#{which}_#{id}", :go)
          {200, "text/plain", "released"}
        end)

      Events.subscribe(Events.entropy_alerts())
      agent = "agent-sdk-#{id}"
      seen = run_agents(agent, release)

      # Both streams delivered their first piece while the upstream still held the rest.
      refute_received :never_released

      assert %{
               "plain" => "Hello.",
               "stream" => ["Hel", "lo."],
               "loop" => %{"session" => openai_session, "statuses" => openai_statuses}
             } = seen["openai"]

      assert %{
               "plain" => "Hello.",
               "stream" => ["Hel", "lo."],
               "final" => "Hello.",
               "loop" => %{"session" => anthropic_session, "statuses" => anthropic_statuses}
             } = seen["anthropic"]

      # The seventh turn carries the sixth identical step: the step detector blocks the
      # session, and its block refuses that request (the way a pause does).
      assert openai_statuses == List.duplicate(200, 6) ++ [403]
      assert anthropic_statuses == List.duplicate(200, 6) ++ [403]

      # Seven turns re-sending a growing conversation: six tool calls answered, six steps.
      openai_steps = for e <- SessionLog.recent(openai_session), do: e["action"]
      assert length(openai_steps) == 6

      assert Enum.all?(
               openai_steps,
               &match?(%{"tool_call" => "read_file", "status" => "success"}, &1)
             )

      anthropic_steps = for e <- SessionLog.recent(anthropic_session), do: e["action"]
      assert length(anthropic_steps) == 6
      assert Enum.all?(anthropic_steps, &match?(%{"tool_input" => %{"path" => "build.log"}}, &1))
      assert Enum.all?(anthropic_steps, &(&1["status"] == "failure"))

      for session <- [openai_session, anthropic_session] do
        assert_received %{event_type: "entropy_alert", session_id: ^session, agent_id: ^agent}
      end
    end
  end

  ## Issue 19: tool-calling agents at the kill switch's defaults

  # The stub model: asks for one file per turn. For "Read every handler module." the
  # next handler (h_1, h_2, …: calls that differ only in a number), re-reading h_18 once
  # at turn 20; for anything else build.log, every time. Streams when asked to.
  # Anthropic turns say a sentence beside the call, as Claude does.
  defp model_upstream do
    Upstream.start(fn body ->
      {:ok, request} = JSON.decode(body)
      messages = request["messages"]
      answered = Enum.count(messages, &(&1["role"] == "tool")) + anthropic_results(messages)
      n = answered + 1

      path =
        cond do
          hd(messages)["content"] != "Read every handler module." -> "build.log"
          n == 20 -> "src/handlers/h_18.py"
          true -> "src/handlers/h_#{n}.py"
        end

      cond do
        request["max_tokens"] && request["stream"] ->
          {:chunked, 200, "text/event-stream",
           fn resp ->
             for e <-
                   Upstream.tool_use_events("Reading #{path}.", "toolu_#{n}", "read_file", %{
                     path: path
                   }),
                 do: Upstream.write_chunk(resp, e)
           end}

        request["max_tokens"] ->
          {200, "application/json",
           Upstream.message("Reading #{path}.", [{"toolu_#{n}", "read_file", %{path: path}}])}

        request["stream"] ->
          {:chunked, 200, "text/event-stream",
           fn resp ->
             for e <- Upstream.tool_call_chunks("call_#{n}", "read_file", %{path: path}),
                 do: Upstream.write_chunk(resp, e)
           end}

        true ->
          {200, "application/json",
           Upstream.tool_call_completion("call_#{n}", "read_file", %{path: path})}
      end
    end)
  end

  defp anthropic_results(messages) do
    Enum.sum(
      for %{"role" => "user", "content" => blocks} when is_list(blocks) <- messages,
          do: Enum.count(blocks, &(&1["type"] == "tool_result"))
    )
  end

  defp use_model do
    upstream = model_upstream()
    Application.put_env(:observatory, :llm_upstream, upstream.url)
    Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{upstream.port}")
  end

  # A run of sdk_tool_agents.py for a new agent with the kill switch as given: its
  # agent id and session, and the plan entry.
  defp tool_run(api, kind, kill_switch) do
    n = System.unique_integer([:positive])
    agent = "agent-tools-#{api}-#{n}"
    key = HTTP.key_for(agent)
    if kill_switch, do: {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true})

    {task, tools, turns} =
      case kind do
        :healthy -> {"Read every handler module.", "files", 30}
        :looping -> {"Fix the build.", "broken", 8}
      end

    %{
      agent: agent,
      session: "#{agent}-session",
      plan: %{
        api: api,
        key: key,
        session: "#{agent}-session",
        task: task,
        turns: turns,
        tools: tools
      }
    }
  end

  defp run_tools(runs) do
    seen = PythonSDK.run!("sdk_tool_agents.py", [JSON.encode!(Enum.map(runs, & &1.plan))])
    Enum.zip(runs, seen)
  end

  defp entropy_scores(session),
    do: for(e <- SessionLog.recent(session), do: e["cognition"]["entropy_score"])

  # A healthy agent must never be stopped nor alarmed; a looping one must be alarmed,
  # and stopped once its kill switch is on.
  defp check_healthy(source, run, seen) do
    assert seen == %{"statuses" => List.duplicate(200, 30), "error" => nil}, "#{source}"
    assert %{active: true, deactivated_by: nil} = Agents.get(run.agent)

    assert for(e <- KillSwitch.events(agent_id: run.agent), do: e.event_type) == [
             "settings_changed"
           ]

    # Its results differ only in their numbers: similar prompts, 4 of 4 at most; its
    # calls all differ but one re-read (1.5). The window never went past 5.5.
    assert %{score: score} = KillSwitch.status(run.agent)
    assert score <= 4.0

    # 29 calls answered, one step each, each its own call but the re-read: the entropy
    # ratio stays normal (the re-read makes 4 tuples of 5) and the verdict says
    # progress. (The session log keeps the latest steps.)
    assert SessionLog.count(run.session) == 29
    steps = SessionLog.recent(run.session)
    intents = for s <- steps, do: s["cognition"]["intent"]
    assert length(Enum.uniq(intents)) == length(steps) - 1
    assert Enum.min(entropy_scores(run.session)) == 0.8
    assert %{verdict: :progress} = LoopVerdict.session(run.session)
    session = run.session
    refute_received %{event_type: "entropy_alert", session_id: ^session}
  end

  defp check_looping(source, run, seen, switch_on?) do
    session = run.session
    agent = run.agent

    if switch_on? do
      # Requests 2..4 answer the same call with the same result: 0, 2.5, 5.0; the
      # fifth scores 7.5 > 5.5 and is refused with the inactive-agent answer.
      assert seen["statuses"] == [200, 200, 200, 200, 403], "#{source}"
      assert seen["error"] in ["agent_inactive", "Agent #{agent} is inactive"]
      assert %{active: false, deactivated_by: :kill_switch} = Agents.get(agent)

      assert [%{details: %{repeated_tool_calls: 3, similar_prompts: 3}}] =
               for(e <- KillSwitch.events(agent_id: agent), e.event_type == "kill_switch", do: e)

      # The verdict saw the loop before the switch stopped it (three repeats).
      assert %{verdict: :loop} = LoopVerdict.session(session)
    else
      # The seventh request carries the sixth identical step: the step detector blocks
      # the session, and its block refuses that request like a pause.
      assert seen["statuses"] == List.duplicate(200, 6) ++ [403], inspect({source, seen})
      # OpenAI's error code, or Anthropic's message.
      assert seen["error"] == "session_blocked" or
               seen["error"] =~ "is blocked by the step detector"

      assert %{active: true} = Agents.get(agent)
      assert_received %{event_type: "entropy_alert", session_id: ^session, agent_id: ^agent}
    end
  end

  describe "issue 19: tool agents on the real SDKs, streamed and not, kill switch defaults" do
    for source <- [:entropy, :verdict] do
      @source source
      test "#{inspect(source)}: healthy, 30 turns of different files: never deactivated nor " <>
             "alarmed; the same call and result: alarmed, deactivated with the switch on" do
        use_model()
        Events.subscribe(Events.entropy_alerts())
        Observatory.configure(alert_source: @source)

        runs =
          for api <- ["openai", "anthropic"],
              {kind, switch} <- [healthy: true, looping: false, looping: true],
              do: {kind, switch, tool_run(api, kind, switch)}

        {seen, log} =
          ExUnit.CaptureLog.with_log(fn -> run_tools(for {_, _, run} <- runs, do: run) end)

        # Two agents stopped, the two looping ones whose switch is on.
        assert length(Regex.scan(~r/kill switch deactivated agent/, log)) == 2

        for {{kind, switch, run}, {run, seen}} <- Enum.zip(runs, seen) do
          case kind do
            :healthy -> check_healthy(@source, run, seen)
            :looping -> check_looping(@source, run, seen, switch)
          end
        end
      end
    end
  end
end
