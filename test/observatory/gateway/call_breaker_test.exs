defmodule Observatory.Gateway.CallBreakerTest do
  use Observatory.TrackerCase, async: false

  @moduletag :capture_log

  alias Observatory.Gateway.{CallBreaker, Events, StepDetector}
  alias Observatory.Test.HTTP

  @agent "agent-cb"

  setup do
    :ok = Events.subscribe(StepDetector.topic())

    %{
      sid: unique_session("sess-cb"),
      t0: 1_000_000_000 + System.unique_integer([:positive]) * 100_000
    }
  end

  test "20 identical calls in 60 s are allowed, the 21st is denied", %{sid: sid, t0: t0} do
    for i <- 1..20 do
      assert {:allow, ^i} =
               CallBreaker.check(@agent, sid, "fetch", %{"url" => "x"}, now_ms: t0 + i)
    end

    assert {:deny, 20, retry} =
             CallBreaker.check(@agent, sid, "fetch", %{"url" => "x"}, now_ms: t0 + 30)

    assert retry == 60_000 - 29

    assert_receive %{
      event_type: "loop_detection",
      kind: "circuit_breaker",
      session_id: ^sid,
      tool: "fetch"
    }
  end

  test "the window slides: once the oldest call leaves it, a call is allowed again", %{
    sid: sid,
    t0: t0
  } do
    for i <- 1..20, do: CallBreaker.check(@agent, sid, "fetch", %{}, now_ms: t0 + i * 1_000)
    assert {:deny, _, _} = CallBreaker.check(@agent, sid, "fetch", %{}, now_ms: t0 + 60_000)
    assert {:allow, 20} = CallBreaker.check(@agent, sid, "fetch", %{}, now_ms: t0 + 61_000)
    assert {:deny, _, _} = CallBreaker.check(@agent, sid, "fetch", %{}, now_ms: t0 + 61_500)
  end

  test "different arguments, tools and sessions are separate keys; key order is not", %{
    sid: sid,
    t0: t0
  } do
    for i <- 1..20,
        do: CallBreaker.check(@agent, sid, "fetch", %{"a" => 1, "b" => 2}, now_ms: t0 + i)

    assert {:deny, _, _} =
             CallBreaker.check(@agent, sid, "fetch", %{"b" => 2, "a" => 1}, now_ms: t0 + 21)

    assert {:allow, 1} =
             CallBreaker.check(@agent, sid, "fetch", %{"a" => 1, "b" => 3}, now_ms: t0 + 21)

    assert {:allow, 1} =
             CallBreaker.check(@agent, sid, "search", %{"a" => 1, "b" => 2}, now_ms: t0 + 21)

    assert {:allow, 1} =
             CallBreaker.check(@agent, "other-" <> sid, "fetch", %{"a" => 1, "b" => 2},
               now_ms: t0 + 21
             )
  end

  test "two agents with the same session id do not share counts", %{sid: sid, t0: t0} do
    for i <- 1..20, do: CallBreaker.check("agent-a", sid, "fetch", %{}, now_ms: t0 + i)
    assert {:deny, 20, _} = CallBreaker.check("agent-a", sid, "fetch", %{}, now_ms: t0 + 21)

    assert {:allow, 1} = CallBreaker.check("agent-b", sid, "fetch", %{}, now_ms: t0 + 21)
    assert {:allow, 1} = CallBreaker.check(:any_agent, sid, "fetch", %{}, now_ms: t0 + 21)
    assert_receive %{kind: "circuit_breaker", agent_id: "agent-a", session_id: ^sid}

    # No agent id and session id spell another pair's key.
    for i <- 1..20, do: CallBreaker.check("a:b", "c" <> sid, "fetch", %{}, now_ms: t0 + i)
    assert {:allow, 1} = CallBreaker.check("a", "b:c" <> sid, "fetch", %{}, now_ms: t0 + 21)
  end

  test "two agents with the same session id do not share counts through the API", %{sid: sid} do
    # The session is known only to the breaker (the tracker has no owner for it).
    call = %{"session_id" => sid, "tool" => "read_file", "arguments" => %{"path" => "/x"}}
    other = [headers: HTTP.agent_headers("agent-cb-other")]

    ExUnit.CaptureLog.capture_log(fn ->
      for _ <- 1..21, do: HTTP.post_json("/api/v1/tool_calls/check", call, other)
    end)

    assert %{status: 200, body: %{"decision" => "allow", "count" => 1}} =
             HTTP.post_json("/api/v1/tool_calls/check", call)

    assert %{body: %{"decision" => "deny"}} =
             HTTP.post_json("/api/v1/tool_calls/check", call, other)
  end

  test "POST /api/v1/tool_calls/check answers allow or deny with the reason", %{sid: sid} do
    call = %{"session_id" => sid, "tool" => "read_file", "arguments" => %{"path" => "/etc/x"}}

    for i <- 1..20 do
      resp = HTTP.post_json("/api/v1/tool_calls/check", call)
      assert %{status: 200, body: %{"decision" => "allow", "count" => ^i}} = resp
    end

    ExUnit.CaptureLog.capture_log(fn ->
      resp = HTTP.post_json("/api/v1/tool_calls/check", call)
      assert %{"decision" => "deny", "reason" => reason, "retry_after_ms" => _} = resp.body
      assert reason =~ "identical calls of read_file"
    end)

    assert HTTP.post_json("/api/v1/tool_calls/check", %{"tool" => "x"}).status == 422
    assert HTTP.post("/api/v1/tool_calls/check", "{nope").status == 422
    assert HTTP.post_json("/api/v1/tool_calls/check", call, headers: []).status == 401
  end
end
