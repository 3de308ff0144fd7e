defmodule ObservatoryWeb.ProxyBudgetTest do
  # Graded response, item 2: budgets. Tokens counted from every answer's usage,
  # streamed answers included; limits per session and per rolling window; past one the
  # next request is refused with budget_exhausted (enforce), or served and recorded
  # (warn, shadow); an operator raises or resets it. Real sockets, stub upstreams.
  # Changes the upstream and budget configuration: not async.
  use ExUnit.Case, async: false
  @moduletag :capture_log

  alias Observatory.{Budget, JSON, KillSwitch}
  alias Observatory.Budget.{Prices, Settings, Store}
  alias Observatory.Gateway.Events
  alias Observatory.Test.{HTTP, Upstream}

  doctest Observatory.Budget.Usage
  doctest Observatory.Budget.Settings

  @keys [:llm_upstream, :anthropic_upstream, :budgets]
  @prices %{
    "gpt-test" => %{input: 2.0, cached_input: 0.5, output: 8.0},
    "claude-test" => %{input: 3.0, output: 15.0}
  }

  setup do
    # Restored as they were, unset ones unset.
    Observatory.TrackerCase.restore_env_on_exit(@keys)

    Application.put_env(:observatory, :budgets, prices: @prices)
    test = self()

    upstream =
      Upstream.start(fn body, _headers, %{path: path} ->
        request = elem(JSON.decode(body), 1)
        send(test, {:request, path, request})
        answer(path, request)
      end)

    Application.put_env(:observatory, :llm_upstream, upstream.url)
    Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{upstream.port}")
    n = System.unique_integer([:positive])
    agent = "agent-budget-#{n}"
    HTTP.key_for(agent)
    %{agent: agent, session: "sess-budget-#{n}", n: n}
  end

  ## The stub model: 100 input tokens (40 of them cached), 20 output, on every API.

  defp answer("/v1/chat/completions", %{"stream" => true} = request) do
    with_usage = get_in(request, ["stream_options", "include_usage"]) == true

    chunk = fn choices, usage ->
      chunk = %{
        id: "c",
        object: "chat.completion.chunk",
        model: "gpt-test-2025-01-01",
        choices: choices
      }

      chunk = if with_usage, do: Map.put(chunk, :usage, usage), else: chunk
      "data: " <> JSON.encode!(chunk) <> "\n\n"
    end

    usage = %{
      prompt_tokens: 100,
      completion_tokens: 20,
      prompt_tokens_details: %{cached_tokens: 40}
    }

    {:chunked, 200, "text/event-stream",
     fn resp ->
       Upstream.write_chunk(
         resp,
         chunk.([%{index: 0, delta: %{content: "Hel"}, finish_reason: nil}], nil)
       )

       Upstream.write_chunk(
         resp,
         chunk.([%{index: 0, delta: %{content: "lo"}, finish_reason: "stop"}], nil)
       )

       if with_usage, do: Upstream.write_chunk(resp, chunk.([], usage))
       Upstream.write_chunk(resp, "data: [DONE]\n\n")
     end}
  end

  defp answer("/v1/chat/completions", _request) do
    {200, "application/json",
     JSON.encode!(%{
       id: "c",
       object: "chat.completion",
       model: "gpt-test",
       choices: [
         %{index: 0, message: %{role: "assistant", content: "Hello"}, finish_reason: "stop"}
       ],
       usage: %{
         prompt_tokens: 100,
         completion_tokens: 20,
         prompt_tokens_details: %{cached_tokens: 40}
       }
     })}
  end

  defp answer("/v1/responses", %{"stream" => true}) do
    {start, deltas, stop} = Upstream.response_events(["Hel", "lo"])
    stop = Enum.map(stop, &String.replace(&1, ~s("input_tokens":1,), ~s("input_tokens":100,)))
    stop = Enum.map(stop, &String.replace(&1, ~s("output_tokens":1,), ~s("output_tokens":20,)))

    {:chunked, 200, "text/event-stream",
     fn resp -> for e <- start ++ deltas ++ stop, do: Upstream.write_chunk(resp, e) end}
  end

  defp answer("/v1/messages", %{"stream" => true}) do
    {start, deltas, stop} = Upstream.message_events(["Hel", "lo"])

    start =
      Enum.map(
        start,
        &(&1
          |> String.replace(~s("input_tokens":1), ~s("input_tokens":100))
          |> String.replace("test-model", "claude-test"))
      )

    stop = Enum.map(stop, &String.replace(&1, ~s("output_tokens":2), ~s("output_tokens":20)))

    {:chunked, 200, "text/event-stream",
     fn resp -> for e <- start ++ deltas ++ stop, do: Upstream.write_chunk(resp, e) end}
  end

  defp answer("/v1/messages", _request) do
    {200, "application/json",
     Upstream.message("Hello")
     |> String.replace("test-model", "claude-test")
     |> String.replace(~s("input_tokens":1), ~s("input_tokens":100))
     |> String.replace(~s("output_tokens":1), ~s("output_tokens":20))}
  end

  defp chat(agent, session, extra \\ %{}) do
    body =
      Map.merge(
        %{model: "gpt-test", messages: [%{role: "user", content: "Hi #{session}"}]},
        extra
      )

    HTTP.post("/v1/chat/completions", JSON.encode!(body),
      headers: HTTP.agent_headers(agent) ++ [{"x-session-id", session}]
    )
  end

  defp messages(agent, session, extra \\ %{}) do
    body =
      Map.merge(
        %{model: "claude-test", max_tokens: 50, messages: [%{role: "user", content: "Hi"}]},
        extra
      )

    headers =
      HTTP.agent_headers(agent) ++
        [{"x-session-id", session}, {"anthropic-version", "2023-06-01"}]

    HTTP.post("/v1/messages", JSON.encode!(body), headers: headers)
  end

  describe "budgets: tokens and cost counted from usage, streamed answers included" do
    test "a chat completion, whole: tokens, cached tokens and cost per session and agent", %{
      agent: agent,
      session: session
    } do
      assert chat(agent, session).status == 200
      assert chat(agent, session).status == 200

      usage = Budget.session_usage(session)

      assert %{
               requests: 2,
               input_tokens: 200,
               cached_input_tokens: 80,
               output_tokens: 40,
               tokens: 240
             } = usage

      # (60 × 2 + 40 × 0.5 + 20 × 8) per million, twice: 0.0006 USD.
      assert_in_delta usage.cost_usd, 2 * (60 * 2.0 + 40 * 0.5 + 20 * 8.0) / 1.0e6, 1.0e-12
      assert usage.agent_id == agent
      assert %{total: %{requests: 2, tokens: 240}} = Budget.agent_usage(KillSwitch.agent(agent))
    end

    test "a streamed chat completion: the proxy asks for the usage chunk, and keeps it from an agent that did not",
         %{agent: agent, session: session} do
      resp = chat(agent, session, %{stream: true})
      assert resp.status == 200

      assert_received {:request, "/v1/chat/completions",
                       %{"stream_options" => %{"include_usage" => true}}}

      # (OpenAI writes "usage": null in every other chunk; only the usage chunk goes.)
      refute resp.body =~ ~s("usage":{)
      assert resp.body =~ ~s("content":"lo")
      assert resp.body =~ "[DONE]"
      # Dated snapshot of a priced model: priced.
      assert %{tokens: 120, unpriced_answers: 0} = usage = Budget.session_usage(session)
      assert usage.cost_usd > 0

      # An agent that asked for it gets it.
      resp = chat(agent, session, %{stream: true, stream_options: %{include_usage: true}})
      assert resp.body =~ ~s("usage":{)
      assert Budget.session_usage(session).tokens == 240
    end

    test "a streamed Responses answer: usage of response.completed", %{
      agent: agent,
      session: session
    } do
      body = %{model: "gpt-test", input: "Hi", stream: true}

      resp =
        HTTP.post("/v1/responses", JSON.encode!(body),
          headers: HTTP.agent_headers(agent) ++ [{"x-session-id", session}]
        )

      assert resp.status == 200
      assert %{input_tokens: 100, output_tokens: 20} = Budget.session_usage(session)
    end

    test "a Messages answer, whole and streamed: message_start's input, message_delta's output",
         %{agent: agent, session: session} do
      assert messages(agent, session).status == 200
      assert messages(agent, session, %{stream: true}).status == 200

      assert %{requests: 2, input_tokens: 200, output_tokens: 40} =
               usage = Budget.session_usage(session)

      assert_in_delta usage.cost_usd, 2 * (100 * 3.0 + 20 * 15.0) / 1.0e6, 1.0e-12
    end

    test "an unpriced model: tokens counted, cost not, and said", %{
      agent: agent,
      session: session
    } do
      ExUnit.CaptureLog.capture_log(fn ->
        assert chat(agent, session, %{model: "gpt-test-mini"}).status == 200
      end)

      # The answer names gpt-test (the stub's): priced by the answer's model.
      assert Budget.session_usage(session).unpriced_answers == 0

      Application.put_env(:observatory, :budgets, prices: %{"other" => %{input: 1, output: 1}})

      log = ExUnit.CaptureLog.capture_log(fn -> assert chat(agent, session).status == 200 end)
      assert log =~ ~s(model "gpt-test" has no price)
      assert %{unpriced_answers: 1, tokens: 240} = Budget.session_usage(session)
    end
  end

  describe "budgets: past a limit the next request is refused with budget_exhausted" do
    test "a session over its token limit: 429 in each API's shape, once recorded, no retry",
         %{agent: agent, session: session} do
      {:ok, _} = Budget.configure(agent, %{"session_tokens" => 200}, operator: "alice")
      Events.subscribe(KillSwitch.topic())

      assert chat(agent, session, %{stream: true}).status == 200
      assert chat(agent, session, %{stream: true}).status == 200
      # 240 tokens >= 200: refused, not sent upstream.
      flush_requests()
      resp = chat(agent, session)
      assert resp.status == 429
      assert resp.headers["x-should-retry"] == "false"

      assert %{
               "error" => %{
                 "code" => "budget_exhausted",
                 "type" => "budget_exhausted",
                 "message" => message
               }
             } = resp.body

      assert message =~
               "session #{session} has used 240 tokens of its 200 tokens (session_tokens)"

      refute_received {:request, _, _}

      resp = messages(agent, session)
      assert resp.status == 429

      assert %{
               "type" => "error",
               "error" => %{"type" => "rate_limit_error", "message" => "budget_exhausted: " <> _}
             } = resp.body

      # One stop, one event: not one per refused request.
      assert [%{details: %{mode: "enforce", scope: %{kind: "session"}}}] =
               for(
                 e <- KillSwitch.events(agent_id: agent),
                 e.event_type == "budget_exhausted",
                 do: e
               )

      assert_received %{event_type: "budget_exhausted", agent_id: ^agent}
      assert Budget.session_usage(session).exhausted
      # Another session of the agent is not affected.
      assert chat(agent, session <> "-other").status == 200
    end

    test "an operator raises the limit or resets the session: served again, recovered announced",
         %{agent: agent, session: session} do
      {:ok, _} = Budget.configure(agent, %{"session_requests" => 1})
      Events.subscribe(KillSwitch.topic())
      assert chat(agent, session).status == 200
      assert chat(agent, session).status == 429

      {:ok, _} = Budget.configure(agent, %{"session_requests" => 2})
      assert chat(agent, session).status == 200

      assert_received %{
        event_type: "budget_recovered",
        agent_id: ^agent,
        details: %{scope: %{kind: "session"}}
      }

      assert chat(agent, session).status == 429

      assert {:ok, %{spent: %{requests: 2}}} =
               Budget.reset(agent, session_id: session, operator: "bob")

      assert Budget.session_usage(session).requests == 0
      assert chat(agent, session).status == 200

      assert [%{details: %{operator: "bob"}}] =
               for(e <- KillSwitch.events(agent_id: agent), e.event_type == "budget_reset", do: e)
    end

    test "a rolling window counts every session of the agent", %{agent: agent, n: n} do
      {:ok, _} = Budget.configure(agent, %{"window_requests" => 3, "window_seconds" => 600})
      assert chat(agent, "a-#{n}").status == 200
      assert chat(agent, "b-#{n}").status == 200
      assert chat(agent, "c-#{n}").status == 200
      resp = chat(agent, "d-#{n}")
      assert resp.status == 429

      assert resp.body["error"]["message"] =~
               "agent #{agent} (within its rolling window) has used 3 requests of its 3 requests"

      assert %{window: %{requests: 3, exhausted: true}} =
               Budget.agent_usage(KillSwitch.agent(agent))

      {:ok, _} = Budget.reset(agent)
      assert chat(agent, "d-#{n}").status == 200
    end

    test "a cost limit, at the configured prices", %{agent: agent, session: session} do
      # 0.0003 USD per request.
      {:ok, _} = Budget.configure(agent, %{"session_cost_usd" => 0.0005})
      assert chat(agent, session).status == 200
      assert chat(agent, session).status == 200
      assert %{status: 429, body: %{"error" => %{"message" => message}}} = chat(agent, session)
      assert message =~ "has used $0.0006 of its $0.0005 (session_cost_usd)"
    end
  end

  describe "budgets: shadow and warn modes refuse nothing and record the would-be stop" do
    for mode <- ["shadow", "warn"] do
      @mode mode
      test "#{mode}: every request served, one budget_would_exhaust event", %{
        agent: agent,
        session: session
      } do
        {:ok, _} = Budget.configure(agent, %{"session_requests" => 1, "mode" => @mode})

        for _ <- 1..4, do: assert(chat(agent, session).status == 200)

        assert [
                 %{
                   details: %{
                     mode: @mode,
                     limits: [%{limit: "session_requests", used: 1, max: 1}]
                   }
                 }
               ] =
                 for(
                   e <- KillSwitch.events(agent_id: agent),
                   e.event_type == "budget_would_exhaust",
                   do: e
                 )

        assert Budget.session_usage(session).requests == 4
      end
    end
  end

  describe "budgets: what was spent since the loop began" do
    test "the session's first loop alarm marks its spend; later spend is reported apart",
         %{agent: agent, session: session} do
      assert chat(agent, session).status == 200

      Events.broadcast(Observatory.Gateway.Alerts.topic(), %{
        event_type: "alert_raised",
        session_id: session,
        agent_id: agent,
        since: DateTime.utc_now()
      })

      # The server marks it on the alert; it has handled it once it answers.
      :sys.get_state(Observatory.Budget.Server)
      assert chat(agent, session).status == 200
      assert chat(agent, session).status == 200

      assert %{requests: 3, since_loop: %{requests: 2, tokens: 240, loop_at: _}} =
               Budget.session_usage(session)

      # A later alarm moves nothing.
      refute Store.mark_loop(session, DateTime.utc_now())
    end
  end

  describe "budgets: bad configuration gets a clear error" do
    test "negative limits, unknown keys, a cost limit without prices" do
      assert {:error,
              [%{path: "session_tokens", reason: "must be an integer >= 0 or null, got: -5"}]} =
               Settings.validate(%{"session_tokens" => -5})

      assert {:error,
              [%{path: "window_cost_usd", reason: "must be a number >= 0 (USD) or null, got: -1"}]} =
               Settings.validate(%{"window_cost_usd" => -1})

      assert {:error, [%{path: "tokens", reason: "is not a budget setting" <> _}]} =
               Settings.validate(%{"tokens" => 5})

      assert {:error, [%{path: "mode", reason: "must be enforce, warn or shadow, got: \"off\""}]} =
               Settings.validate(%{"mode" => "off"})

      Application.put_env(:observatory, :budgets, prices: %{})

      assert {:error, [%{path: "session_cost_usd", reason: "needs prices: " <> _}]} =
               Settings.validate(%{"session_cost_usd" => 1})
    end

    test "the configuration is checked at start: prices, aliases, defaults" do
      bad = [
        {[prices: %{"gpt" => %{input: -1, output: 1}}],
         ~s(the input price of "gpt" in config :observatory, :budgets, :prices must be a number >= 0)},
        {[prices: %{"gpt" => %{input: 1}}],
         ~s(the price of "gpt" in config :observatory, :budgets, :prices has no :output)},
        {[prices: %{"gpt" => %{input: 1, output: 1, per_call: 2}}],
         "unknown key :per_call in the price of \"gpt\""},
        {[prices: %{"gpt" => %{input: 1, output: 1}}, aliases: %{"prod" => "gpt-5"}],
         ~s(config :observatory, :budgets, :aliases maps "prod" to "gpt-5", a model the price table does not have)},
        {[defaults: [session_tokens: -10]],
         "config :observatory, :budgets, :defaults: session_tokens must be an integer >= 0 or null, got: -10"},
        {[defaults: [window_cost_usd: 5]], "window_cost_usd needs prices"},
        {[budget: 5], "unknown key :budget in config :observatory, :budgets"}
      ]

      for {config, message} <- bad do
        Application.put_env(:observatory, :budgets, config)
        error = assert_raise ArgumentError, fn -> Budget.check_config!() end
        assert Exception.message(error) =~ message
      end

      Application.put_env(:observatory, :budgets,
        prices: %{"gpt" => %{input: 1, output: 2}},
        aliases: %{"prod" => "gpt"}
      )

      assert Budget.check_config!() == :ok
      assert Prices.price("prod") == Prices.price("gpt")
      assert Prices.price("gpt-2025-04-14").output == 2000
      assert Prices.price("gpt-mini") == nil

      # A price file (OBSERVATORY_PRICES_FILE): read, merged under the configured prices.
      file = Path.join(System.tmp_dir!(), "prices-#{System.unique_integer([:positive])}.json")
      on_exit(fn -> File.rm(file) end)

      File.write!(
        file,
        ~s({"gpt": {"input": 9, "output": 9}, "claude": {"input": 3, "output": 15}})
      )

      Application.put_env(:observatory, :budgets,
        prices: %{"gpt" => %{input: 1, output: 2}},
        prices_file: file
      )

      assert Budget.check_config!() == :ok
      assert Prices.price("claude").output == 15_000
      assert Prices.price("gpt").output == 2000

      Application.put_env(:observatory, :budgets, prices_file: file <> ".missing")
      error = assert_raise ArgumentError, fn -> Budget.check_config!() end
      assert Exception.message(error) =~ "prices_file #{file}.missing: no such file or directory"
      File.write!(file, "[1, 2]")
      Application.put_env(:observatory, :budgets, prices_file: file)
      error = assert_raise ArgumentError, fn -> Budget.check_config!() end
      assert Exception.message(error) =~ "must be a JSON object"
    end
  end

  test "budgets: a refused request is not sent and not counted", %{agent: agent, session: session} do
    {:ok, _} = Budget.configure(agent, %{"session_requests" => 0})
    assert chat(agent, session).status == 429
    refute_received {:request, _, _}
    assert Budget.session_usage(session).requests == 0
  end

  defp flush_requests do
    receive do
      {:request, _, _} -> flush_requests()
    after
      0 -> :ok
    end
  end
end
