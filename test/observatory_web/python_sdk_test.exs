defmodule ObservatoryWeb.PythonSDKTest do
  # Issue 15: unmodified agents on the real `openai` and `anthropic` Python SDKs (PyPI,
  # installed by bin/setup into test/python/.venv) change only their base URL and get
  # the whole product: answers, streams as they arrive, steps, alerts.
  # Changes the upstream configuration: not async.
  use ExUnit.Case, async: false

  @moduletag :python

  alias Observatory.Gateway.{Events, SessionLog}
  alias Observatory.JSON
  alias Observatory.Test.{HTTP, Upstream}

  @python Path.expand("../python/.venv/bin/python", __DIR__)
  @script Path.expand("../python/sdk_agents.py", __DIR__)
  @keys [:llm_upstream, :anthropic_upstream]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn -> for {key, value} <- saved, do: Application.put_env(:observatory, key, value) end)

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
          {200, "application/json", tool_call_completion()}

        true ->
          {200, "application/json", Upstream.completion("Hello.")}
      end
    end)
  end

  defp tool_call_completion do
    JSON.encode!(%{
      id: "chatcmpl-test",
      object: "chat.completion",
      created: 1_700_000_000,
      model: "test-model",
      choices: [
        %{
          index: 0,
          finish_reason: "tool_calls",
          message: %{
            role: "assistant",
            content: nil,
            tool_calls: [
              %{
                id: "call_#{System.unique_integer([:positive])}",
                type: "function",
                function: %{name: "read_file", arguments: ~s({"path": "build.log"})}
              }
            ]
          }
        }
      ]
    })
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

  defp run_agents(agent, release) do
    env =
      for var <-
            ~w(OPENAI_API_KEY OPENAI_BASE_URL ANTHROPIC_API_KEY ANTHROPIC_AUTH_TOKEN ANTHROPIC_BASE_URL),
          do: {var, nil}

    args = [@script, ObservatoryWeb.Endpoint.url(), HTTP.key_for(agent), agent, release.url]
    {out, status} = System.cmd(@python, args, env: env, stderr_to_stdout: true)
    assert status == 0, out
    out |> String.split("\n", trim: true) |> List.last() |> JSON.decode() |> elem(1)
  end

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
end
