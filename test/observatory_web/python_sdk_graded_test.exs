defmodule ObservatoryWeb.PythonSDKGradedTest do
  # The graded response with unmodified agents on the real `openai` (Chat Completions
  # and Responses) and `anthropic` Python SDKs, base URL and key changed only
  # (test/python/sdk_graded.py), against a stub upstream that plays the model:
  # guidance notes in the next tool result, budgets on streamed usage, a loop alarm
  # paged and resolved, shadow mode. Changes the upstream, guidance, budget and
  # notification configuration: not async.
  use ExUnit.Case, async: false

  @moduletag :python
  @moduletag :capture_log

  alias Observatory.{Budget, JSON, KillSwitch}
  alias Observatory.KillSwitch.Agents
  alias Observatory.Proxy.Guidance
  alias Observatory.Test.{HTTP, PythonSDK, Upstream}

  @keys [:llm_upstream, :anthropic_upstream, :guidance, :budgets, :notifications]
  @apis ["chat", "responses", "anthropic"]

  setup do
    # Restored as they were, unset ones unset.
    Observatory.TrackerCase.restore_env_on_exit(@keys)

    upstream = model_upstream(self())
    Application.put_env(:observatory, :llm_upstream, upstream.url)
    Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{upstream.port}")
    Application.put_env(:observatory, :guidance, enabled: false)
    %{n: System.unique_integer([:positive])}
  end

  ## The stub model: one read_file call per turn. "Fix the build" reads build.log every
  ## turn (a loop); "Read every handler" reads src/h_<turn>.py; "Loop then recover"
  ## reads build.log for five turns, then new files. Every answer reports 1,000 input
  ## and 100 output tokens (a stream in its usage events). It reports each request to
  ## the test as {:model, api, task, body}.

  defp model_upstream(test) do
    Upstream.start(fn body, _headers, %{path: path} ->
      {:ok, request} = JSON.decode(body)
      {api, task, answered} = read(path, request)
      send(test, {:model, api, task, request})
      n = answered + 1

      file =
        cond do
          task =~ "Fix the build" -> "build.log"
          task =~ "Loop then recover" and n <= 5 -> "build.log"
          true -> "src/h_#{n}.py"
        end

      answer(api, request["stream"] == true, request, n, file)
    end)
  end

  defp read("/v1/chat/completions", r),
    do: {:chat, hd(r["messages"])["content"], Enum.count(r["messages"], &(&1["role"] == "tool"))}

  defp read("/v1/responses", r),
    do:
      {:responses, hd(r["input"])["content"],
       Enum.count(r["input"], &(&1["type"] == "function_call_output"))}

  defp read("/v1/messages", r) do
    results =
      for %{"role" => "user", "content" => blocks} when is_list(blocks) <- r["messages"],
          do: Enum.count(blocks, &(&1["type"] == "tool_result"))

    {:anthropic, hd(r["messages"])["content"], Enum.sum(results)}
  end

  defp answer(:chat, false, _request, n, file) do
    {:ok, completion} =
      JSON.decode(Upstream.tool_call_completion("call_#{n}", "read_file", %{path: file}))

    usage = %{prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100}
    {200, "application/json", JSON.encode!(Map.put(completion, "usage", usage))}
  end

  defp answer(:chat, true, request, n, file) do
    usage =
      if get_in(request, ["stream_options", "include_usage"]),
        do: [
          "data: " <>
            JSON.encode!(%{
              id: "chatcmpl-test",
              object: "chat.completion.chunk",
              model: "gpt-test",
              choices: [],
              usage: %{prompt_tokens: 1000, completion_tokens: 100, total_tokens: 1100}
            }) <> "\n\n"
        ],
        else: []

    [done | chunks] =
      Enum.reverse(Upstream.tool_call_chunks("call_#{n}", "read_file", %{path: file}))

    events = Enum.reverse(chunks) ++ usage ++ [done]

    {:chunked, 200, "text/event-stream",
     fn resp -> for e <- events, do: Upstream.write_chunk(resp, e) end}
  end

  defp answer(:responses, false, _request, _n, file) do
    {200, "application/json",
     responses_usage(Upstream.response("", [{"read_file", %{path: file}}]))}
  end

  defp answer(:responses, true, _request, _n, file) do
    events =
      for e <- Upstream.response_call_events("read_file", %{path: file}), do: responses_usage(e)

    {:chunked, 200, "text/event-stream",
     fn resp -> for e <- events, do: Upstream.write_chunk(resp, e) end}
  end

  defp answer(:anthropic, false, _request, n, file) do
    body = Upstream.message("Reading #{file}.", [{"toolu_#{n}", "read_file", %{path: file}}])
    {200, "application/json", anthropic_usage(body)}
  end

  defp answer(:anthropic, true, _request, n, file) do
    events =
      for e <-
            Upstream.tool_use_events("Reading #{file}.", "toolu_#{n}", "read_file", %{path: file}),
          do: anthropic_usage(e)

    {:chunked, 200, "text/event-stream",
     fn resp -> for e <- events, do: Upstream.write_chunk(resp, e) end}
  end

  defp responses_usage(text),
    do:
      text
      |> String.replace(~s("input_tokens":1,), ~s("input_tokens":1000,))
      |> String.replace(~s("output_tokens":1,), ~s("output_tokens":100,))

  defp anthropic_usage(text),
    do:
      text
      |> String.replace(~s("input_tokens":1), ~s("input_tokens":1000))
      |> String.replace(~r/"output_tokens":\d+/, ~s("output_tokens":100))

  ## Runs

  defp new_run(api, kind, n, opts \\ []) do
    agent = "agent-graded-#{api}-#{kind}-#{n}"
    key = HTTP.key_for(agent)

    task =
      case kind do
        :looping -> "Fix the build. [#{agent}]"
        :healthy -> "Read every handler module. [#{agent}]"
        :recovering -> "Loop then recover. [#{agent}]"
      end

    %{
      agent: agent,
      session: "#{agent}-session",
      task: task,
      plan: %{
        api: api,
        key: key,
        session: "#{agent}-session",
        task: task,
        turns: Keyword.get(opts, :turns, 5),
        stream: Keyword.get(opts, :stream, "odd"),
        max_retries: Keyword.get(opts, :max_retries, 0)
      }
    }
  end

  defp run(runs) do
    seen = PythonSDK.run!("sdk_graded.py", [JSON.encode!(Enum.map(runs, & &1.plan))])
    Enum.zip(runs, seen)
  end

  # The bodies the model received for a run's task, in order.
  defp received(task) do
    receive do
      {:model, api, ^task, body} -> [{api, body} | received(task)]
    after
      0 -> []
    end
  end

  defp newest_result(:chat, body), do: List.last(body["messages"])["content"]
  defp newest_result(:responses, body), do: List.last(body["input"])["output"]

  defp newest_result(:anthropic, body) do
    case List.last(body["messages"])["content"] do
      [_ | _] = blocks -> List.last(blocks)["content"]
      _text -> nil
    end
  end

  defp notes(task) do
    for {api, body} <- received(task),
        result = newest_result(api, body),
        is_binary(result),
        result =~ "[Observatory]",
        do: result
  end

  describe "real SDKs: a looping tool agent receives the guidance note in its next tool result" do
    test "chat, responses, anthropic: the note from the second repeat on; none for a healthy agent or with the setting off",
         %{n: n} do
      runs =
        for api <- @apis, {kind, setting} <- [looping: true, healthy: true, looping: false] do
          run = new_run(api, kind, "#{n}-#{setting}")
          {:ok, _} = Guidance.configure(run.agent, setting)
          {kind, setting, run}
        end

      for {{kind, setting, run}, {_run, seen}} <-
            Enum.zip(runs, run(for {_, _, r} <- runs, do: r)) do
        # Five turns: the step detector warns at the fifth, blocks later.
        assert seen["statuses"] == List.duplicate(200, 5), inspect({run.agent, seen})
        notes = notes(run.task)

        case {kind, setting} do
          {:looping, true} ->
            # Requests 3, 4 and 5 carry the second, third and fourth identical step.
            assert length(notes) == 3, inspect({run.agent, notes})

            assert Enum.all?(
                     notes,
                     &(&1 =~ "error: no such file: build.log\n\n[Observatory] Loop warning")
                   )

            assert Enum.all?(notes, &(&1 =~ ~s(read_file {"path":"build.log"})))

            assert length(
                     for e <- KillSwitch.events(agent_id: run.agent),
                         e.event_type == "guidance_injected",
                         do: e
                   ) == 3

          _healthy_or_off ->
            assert notes == [], inspect({run.agent, notes})

            assert for(
                     e <- KillSwitch.events(agent_id: run.agent),
                     e.event_type == "guidance_injected",
                     do: e
                   ) == []
        end
      end
    end
  end

  describe "real SDKs: a session over its token budget is refused with budget_exhausted" do
    test "streamed answers' usage counted; the SDK does not retry the 429", %{n: n} do
      refusals = Observatory.Metrics.get(:budget_refusals)

      runs =
        for api <- @apis do
          # The SDKs' default retries (2): x-should-retry: false must stop them.
          run = new_run(api, :healthy, "budget-#{n}", turns: 6, stream: "always", max_retries: 2)
          {:ok, _} = Budget.configure(run.agent, %{"session_tokens" => 2500})
          run
        end

      for {run, seen} <- run(runs) do
        # 1,100 tokens an answer: 3,300 >= 2,500 after three; the fourth is refused.
        assert seen["statuses"] == [200, 200, 200, 429], inspect({run.agent, seen})

        assert seen["error"] == "budget_exhausted" or
                 seen["error"] =~ "budget_exhausted: session #{run.session}",
               inspect(seen)

        assert %{
                 requests: 3,
                 tokens: 3300,
                 input_tokens: 3000,
                 output_tokens: 300,
                 exhausted: true
               } = Budget.session_usage(run.session)

        assert [%{details: %{mode: "enforce"}}] =
                 for(
                   e <- KillSwitch.events(agent_id: run.agent),
                   e.event_type == "budget_exhausted",
                   do: e
                 )
      end

      # One refusal per agent: none of the three SDKs retried.
      assert Observatory.Metrics.get(:budget_refusals) == refusals + 3
    end
  end

  describe "real SDKs: a loop alarm reaches a stub Slack and a stub PagerDuty once, and the recovery resolves it" do
    test "five identical steps alarm; new steps after them resolve", %{n: n} do
      test = self()

      sink = fn name ->
        Upstream.start(fn body ->
          send(test, {:sink, name, elem(JSON.decode(body), 1)})
          {202, "application/json", ~s({"status":"success"})}
        end)
      end

      slack = sink.(:slack)
      pagerduty = sink.(:pagerduty)

      Application.put_env(:observatory, :notifications,
        sinks: [
          [name: "team-sdk-#{n}", type: :slack, url: slack.url <> "/services/T0/B0/secret"],
          [
            name: "oncall-sdk-#{n}",
            type: :pagerduty,
            routing_key: "routing-key-#{n}",
            url: pagerduty.url <> "/v2/enqueue"
          ]
        ]
      )

      # Eight turns: steps 1-5 the same (LOOP at the fifth), 6 and 7 new (back to normal).
      run = new_run("chat", :recovering, "notify-#{n}", turns: 8)
      [{^run, seen}] = run([run])
      assert seen["statuses"] == List.duplicate(200, 8)
      session = run.session

      assert_receive {:sink, :pagerduty,
                      %{
                        "event_action" => "trigger",
                        "dedup_key" => "observatory:loop:" <> ^session,
                        "payload" => %{"summary" => summary}
                      }}

      assert summary =~ "Loop alarm: session #{session} of agent #{run.agent}"
      assert_receive {:sink, :slack, %{"text" => ":rotating_light: Loop alarm: session " <> _}}

      assert_receive {:sink, :pagerduty,
                      %{
                        "event_action" => "resolve",
                        "dedup_key" => "observatory:loop:" <> ^session
                      }}

      assert_receive {:sink, :slack, %{"text" => ":white_check_mark: Recovered: session " <> _}}

      # What the session spent since the loop began: from the request whose step (the
      # fifth identical one) raised the alarm, the sixth, to the eighth.
      assert %{requests: 8, since_loop: %{requests: 3, tokens: 3300}} =
               Budget.session_usage(session)

      # Exactly once each: nothing more is in flight or waiting.
      state = :sys.get_state(Observatory.Notifications.Dispatcher)
      assert state.tasks == %{} and state.busy == %{}
      refute_received {:sink, _, _}
    end
  end

  describe "real SDKs: a shadow-mode agent is never refused; its would-trip is recorded" do
    test "kill switch and budget in shadow mode: every request served, the stops recorded once",
         %{n: n} do
      runs =
        for api <- @apis do
          run = new_run(api, :looping, "shadow-#{n}", turns: 6)
          {:ok, _} = KillSwitch.configure(run.agent, %{"enabled" => true, "mode" => "shadow"})
          {:ok, _} = Budget.configure(run.agent, %{"session_requests" => 2, "mode" => "shadow"})
          run
        end

      for {run, seen} <- run(runs) do
        # In enforce mode the kill switch stops this agent at its fifth request (and
        # the budget at its third); in shadow mode all six are served.
        assert seen["statuses"] == List.duplicate(200, 6), inspect({run.agent, seen})
        assert %{active: true, deactivated_by: nil} = Agents.get(run.agent)

        assert [%{details: %{mode: "shadow", score: score}}] =
                 for(
                   e <- KillSwitch.events(agent_id: run.agent),
                   e.event_type == "kill_switch_would_trip",
                   do: e
                 )

        assert score > 5.5

        assert [%{details: %{mode: "shadow"}}] =
                 for(
                   e <- KillSwitch.events(agent_id: run.agent),
                   e.event_type == "budget_would_exhaust",
                   do: e
                 )
      end
    end
  end
end
