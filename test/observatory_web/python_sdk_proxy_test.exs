defmodule ObservatoryWeb.PythonSDKProxyTest do
  # Issue 19 items 3–6 with the real `openai` and `anthropic` Python SDKs (installed by
  # bin/setup into test/python/.venv), base URL and key changed only, against stub
  # upstreams that answer by the request's model name (test/python/sdk_proxy.py).
  # Changes the upstream configuration: not async.
  use ExUnit.Case, async: false

  @moduletag :python

  alias Observatory.Gateway.{Events, SessionLog}
  alias Observatory.{JSON, KillSwitch}
  alias Observatory.Test.{HTTP, PythonSDK, Upstream}

  @keys [:llm_upstream, :anthropic_upstream]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn -> for {key, value} <- saved, do: Application.put_env(:observatory, key, value) end)

    %{agent: "agent-sdk-proxy-#{System.unique_integer([:positive])}"}
  end

  @rate_limited_openai [
    {"retry-after", "20"},
    {"x-request-id", "req_openai_429"},
    {"x-ratelimit-remaining-requests", "0"}
  ]
  @rate_limited_anthropic [
    {"retry-after", "30"},
    {"request-id", "req_anthropic_429"},
    {"anthropic-ratelimit-requests-remaining", "0"}
  ]

  # Holds a stream open (keep-alive comments) until the proxy hangs up, at most 15 s.
  defp hold(resp, test, deadline \\ System.monotonic_time(:millisecond) + 15_000) do
    Process.sleep(50)

    cond do
      System.monotonic_time(:millisecond) > deadline -> send(test, :held_too_long)
      Upstream.write_chunk(resp, ": keep-alive\n\n") == :closed -> send(test, :upstream_hung_up)
      true -> hold(resp, test, deadline)
    end
  end

  defp chat_tool_call(path),
    do:
      Upstream.tool_call_completion(
        "call_#{System.unique_integer([:positive])}",
        "read_file",
        %{path: path}
      )

  defp fresh_path, do: "src/file_#{System.unique_integer([:positive])}.ex"

  defp openai_upstream(test) do
    Upstream.start(fn body, _headers, %{path: path} ->
      request = elem(JSON.decode(body), 1)
      model = request["model"]
      send(test, {:openai_request, model, byte_size(body)})

      case {path, model, request["stream"] == true} do
        {_, "rate-limited", _} ->
          {429, "application/json", @rate_limited_openai,
           ~s({"error": {"message": "Rate limit reached", "type": "requests", "param": null, "code": "rate_limit_exceeded"}})}

        {"/v1/chat/completions", "held", true} ->
          {:chunked, 200, "text/event-stream",
           fn resp ->
             Upstream.write_chunk(resp, Upstream.chunk_event("Hel"))
             hold(resp, test)
           end}

        {"/v1/responses", "held", true} ->
          {start, [first | _], _stop} = Upstream.response_events(["Hel", "lo"])

          {:chunked, 200, "text/event-stream",
           fn resp ->
             Upstream.write_chunk(resp, IO.iodata_to_binary(start ++ [first]))
             hold(resp, test)
           end}

        {"/v1/chat/completions", "loop", false} ->
          {200, "application/json", chat_tool_call("build.log")}

        {"/v1/chat/completions", _progress_or_big, false} ->
          {200, "application/json", chat_tool_call(fresh_path())}

        {"/v1/responses", "loop", false} ->
          {200, "application/json", Upstream.response("", [{"read_file", %{path: "build.log"}}])}

        {"/v1/responses", "loop", true} ->
          {:chunked, 200, "text/event-stream",
           fn resp ->
             for e <- Upstream.response_call_events("read_file", %{path: "build.log"}),
                 do: Upstream.write_chunk(resp, e)
           end}
      end
    end)
  end

  defp anthropic_upstream(test) do
    Upstream.start(fn body ->
      request = elem(JSON.decode(body), 1)

      case {request["model"], request["stream"] == true} do
        {"rate-limited", _} ->
          {429, "application/json", @rate_limited_anthropic,
           ~s({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})}

        {"held", true} ->
          {start, [first | _], _stop} = Upstream.message_events(["Hel", "lo"])

          {:chunked, 200, "text/event-stream",
           fn resp ->
             Upstream.write_chunk(resp, IO.iodata_to_binary(start ++ [first]))
             hold(resp, test)
           end}

        {"progress", false} ->
          {200, "application/json", Upstream.message("", [{"read_file", %{path: fresh_path()}}])}
      end
    end)
  end

  defp control(agent) do
    Upstream.start(fn command ->
      case command do
        "deactivate" ->
          {:ok, _} = KillSwitch.deactivate(agent, operator: "test", reason: "sdk test")

        "activate" ->
          {:ok, _} = KillSwitch.activate(agent, operator: "test")
      end

      {200, "text/plain", "done"}
    end)
  end

  defp run(agent, control),
    do: PythonSDK.run!("sdk_proxy.py", [HTTP.key_for(agent), agent, control.url])

  test "issue 19 items 3–6: sessions, sizes, the Responses API, upstream headers and enforcement, as the SDKs see them",
       %{agent: agent} do
    test = self()
    Application.put_env(:observatory, :llm_upstream, openai_upstream(test).url)

    Application.put_env(
      :observatory,
      :anthropic_upstream,
      "http://127.0.0.1:#{anthropic_upstream(test).port}"
    )

    Events.subscribe(Events.entropy_alerts())
    seen = run(agent, control(agent))

    # Item 3: a system prompt with the time and a request id keeps one session, named
    # back on every answer, with the agent's steps in it.
    for api <- ["openai", "anthropic"] do
      assert [session] = Enum.uniq(seen["timestamped"][api]), api
      assert "proxy-" <> _ = session
      assert length(SessionLog.recent(session)) == 4, api
    end

    # Item 4: a conversation past 2 MiB (150 KB tool results) is forwarded, every turn.
    assert %{"statuses" => statuses, "bytes" => bytes} = seen["big"]
    assert statuses == List.duplicate(200, 16)
    assert bytes > 2 * 1024 * 1024
    largest = largest_forwarded("big")
    assert largest > 2 * 1024 * 1024

    # Item 4: an agent on the Responses API, plain and streamed, calling the same tool
    # each turn: its steps are recorded and it is alarmed.
    for mode <- ["responses_plain", "responses_stream"] do
      assert %{"session" => session, "statuses" => statuses} = seen[mode]
      assert statuses == List.duplicate(200, 6), mode
      steps = SessionLog.recent(session)
      assert length(steps) == 5, mode
      assert Enum.all?(steps, &(&1["proxy"]["api"] == "responses"))

      assert Enum.all?(
               steps,
               &match?(
                 %{"tool_call" => "read_file", "result" => "error: no such file"},
                 &1["action"]
               )
             )

      assert_received %{event_type: "entropy_alert", session_id: ^session, agent_id: ^agent}
    end

    # Item 5: a 429's headers reach the SDK (which reads its retry delay and request id
    # from them).
    assert %{
             "status" => 429,
             "request_id" => "req_openai_429",
             "retry_after" => "20",
             "remaining" => "0",
             "session" => "proxy-" <> _
           } = seen["rate_limited"]["openai"]

    assert %{
             "status" => 429,
             "request_id" => "req_anthropic_429",
             "retry_after" => "30",
             "remaining" => "0"
           } = seen["rate_limited"]["anthropic"]

    # Item 6: the step detector's block refuses the next request, with its guidance.
    assert %{"statuses" => statuses, "message" => message} = seen["blocked"]
    assert statuses == List.duplicate(200, 6) ++ [403]
    assert message =~ "is blocked by the step detector: Loop blocked:"

    # Item 6: a deactivation ends an open stream at once, with the API's error.
    for api <- ["openai", "responses", "anthropic"] do
      assert %{"pieces" => ["Hel"], "error" => error, "message" => message} =
               seen["deactivated"][api],
             inspect({api, seen["deactivated"][api]})

      assert error in ["APIError", "APIStatusError"], inspect({api, error})
      assert message =~ "Agent #{agent} is inactive", inspect({api, message})
      assert_received :upstream_hung_up
    end

    refute_received :held_too_long
  end

  defp largest_forwarded(model, largest \\ 0) do
    receive do
      {:openai_request, ^model, bytes} -> largest_forwarded(model, max(largest, bytes))
    after
      0 -> largest
    end
  end
end
