defmodule ObservatoryWeb.APITest do
  # Real HTTP against the server the application started (port 0 in test).
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.{EntropyTracker, HITL}
  alias Observatory.Test.HTTP

  setup do
    %{sid: unique_session("sess-api")}
  end

  defp msg(sid, overrides \\ %{}),
    do: HTTP.envelope(Map.merge(%{"meta" => %{"session_id" => sid}}, overrides))

  describe "POST /api/v1/decision_logs" do
    test "accepts an envelope and answers with the gateway's score", %{sid: sid} do
      resp = HTTP.post_json("/api/v1/decision_logs", msg(sid))
      assert resp.status == 200

      assert %{
               "accepted" => true,
               "session_id" => ^sid,
               "entropy_score" => 1.0,
               "severity" => "normal",
               "paused" => false,
               "directives" => [],
               "verdict" => %{
                 "verdict" => "progress",
                 "previous" => nil,
                 "rule" => "none",
                 "step_number" => 1,
                 "evidence" => [],
                 "reason" => "the session's first step: nothing to compare yet"
               }
             } = resp.body

      assert resp.headers["x-content-type-options"] == "nosniff"
    end

    test "the loop verdict is in the answer, with its reason and evidence", %{sid: sid} do
      # Three steps (each its own step_id) with the same call and the same failure.
      failed = fn ->
        msg(sid, %{"action" => %{"result" => %{"error" => "ENOENT: config.yml"}}})
      end

      [_, second, third] = for _ <- 1..3, do: HTTP.post_json("/api/v1/decision_logs", failed.())
      assert %{"verdict" => %{"verdict" => "suspect", "rule" => "repeat"}} = second.body

      assert %{
               "severity" => "warning",
               "verdict" => %{
                 "verdict" => "loop",
                 "previous" => "suspect",
                 "rule" => "repeat",
                 "evidence" => [1, 2, 3],
                 "reason" => "the same call 3 times in a row, its result saying nothing new"
               }
             } = third.body
    end

    test "the FR-9.8 example: agent says 0.9, the gateway answers 0.15 after a loop", %{sid: sid} do
      Application.put_env(:observatory, :entropy_window_size, 20)
      for _ <- 1..18, do: HTTP.post_json("/api/v1/decision_logs", msg(sid))

      HTTP.post_json("/api/v1/decision_logs", msg(sid, %{"action" => %{"tool_call" => "grep"}}))

      last =
        HTTP.post_json("/api/v1/decision_logs", msg(sid, %{"action" => %{"tool_call" => "ls"}}))

      assert %{"entropy_score" => 0.15, "severity" => "loop"} = last.body
    end

    test "NDJSON: one result per line, bad lines reported with their line number", %{sid: sid} do
      lines = [
        Observatory.JSON.encode!(msg(sid)),
        "",
        "{not json",
        Observatory.JSON.encode!(put_in(msg(sid), ["action", "status"], "exploded")),
        Observatory.JSON.encode!(msg(sid))
      ]

      capture_log(fn ->
        resp =
          HTTP.post("/api/v1/decision_logs", Enum.join(lines, "\n"),
            content_type: "application/x-ndjson"
          )

        assert resp.status == 200
        assert %{"accepted" => 2, "rejected" => 2, "results" => results} = resp.body
        assert Enum.map(results, & &1["line"]) == [1, 3, 4, 5]

        assert [%{"accepted" => true}, %{"accepted" => false}, %{"violations" => [v]}, _] =
                 results

        assert v == %{"path" => "action.status", "reason" => v["reason"]}
      end)

      assert length(EntropyTracker.window(sid)) == 2
    end

    test "NDJSON with no valid line is a 422", %{sid: _} do
      capture_log(fn ->
        resp = HTTP.post("/api/v1/decision_logs", "{}\n[]", content_type: "application/x-ndjson")
        assert resp.status == 422
        assert resp.body["rejected"] == 2
      end)
    end
  end

  describe "the kill switch holds on the agents' API, not only the proxy" do
    test "an inactive agent's steps are kept and answered with a stop directive; its calls denied",
         %{sid: sid} do
      agent = "agent-inactive-#{System.unique_integer([:positive])}"
      headers = HTTP.agent_headers(agent)
      step = fn -> msg(sid, %{"meta" => %{"session_id" => sid, "agent_id" => agent}}) end
      call = %{session_id: sid, tool: "deploy", arguments: %{}}

      assert HTTP.post_json("/api/v1/decision_logs", step.(), headers: headers).body["directives"] ==
               []

      {:ok, _} = Observatory.KillSwitch.deactivate(agent, operator: "alice", reason: "test")

      answer = HTTP.post_json("/api/v1/decision_logs", step.(), headers: headers)
      assert answer.status == 200 and answer.body["accepted"] == true

      assert [%{"type" => "stop", "code" => "agent_inactive", "message" => message}] =
               answer.body["directives"]

      assert message =~ agent
      assert length(EntropyTracker.window(sid)) == 2, "the step is kept"

      assert %{"decision" => "deny", "code" => "agent_inactive"} =
               HTTP.post_json("/api/v1/tool_calls/check", call, headers: headers).body

      # The same through the Elixir API: the stop is the agent's, whatever the entry point.
      assert {:ok, %{directives: [%{"type" => "stop"}]}} =
               Observatory.Gateway.SchemaInterceptor.ingest(step.())
    end
  end

  describe "bad input gets a 4xx with the list of problems, and nothing accepted is lost" do
    test "each case", %{sid: sid} do
      assert HTTP.post_json("/api/v1/decision_logs", msg(sid)).status == 200
      deep = String.duplicate(~s({"a":), 300) <> "1" <> String.duplicate("}", 300)
      huge_string = String.duplicate("x", 2_000)

      cases = [
        {"malformed JSON", "{\"meta\": ", 400, "$"},
        {"invalid UTF-8", <<"{\"meta\": \"", 0xFF, 0xFE, "\"}">>, 400, "$"},
        {"deep nesting", deep, 400, "$"},
        {"wrong types", Observatory.JSON.encode!(put_in(msg(sid), ["meta", "session_id"], 7)),
         422, "meta.session_id"},
        {"missing fields", ~s({"meta": {}, "cognition": {}, "action": {}}), 422, "meta.step_id"},
        {"unknown status",
         Observatory.JSON.encode!(put_in(msg(sid), ["action", "status"], "exploded")), 422,
         "action.status"},
        {"oversized field",
         Observatory.JSON.encode!(put_in(msg(sid), ["cognition", "intent"], huge_string)), 422,
         "cognition.intent"},
        {"not an object", "[1, 2, 3]", 422, "$"}
      ]

      capture_log(fn ->
        for {name, body, status, first_path} <- cases do
          resp = HTTP.post("/api/v1/decision_logs", body)
          assert resp.status == status, "#{name}: got #{resp.status}"
          assert [%{"path" => ^first_path} | _] = resp.body["violations"], name
        end
      end)

      assert EntropyTracker.window(sid) == [{"search", "read_file", :failure}],
             "nothing lost or added"

      assert HTTP.get("/healthz").status == 200
    end

    test "a wrong or missing agent key is a 401", %{sid: sid} do
      for headers <- [
            [],
            [{"authorization", "Bearer wrong"}],
            [{"authorization", "Bearer test-operator-token"}]
          ] do
        resp = HTTP.post_json("/api/v1/decision_logs", msg(sid), headers: headers)
        assert resp.status == 401
        assert resp.body["error"] == "unauthorized"
      end

      assert HTTP.post_json("/api/v1/decision_logs", msg(sid),
               headers: [{"x-agent-key", "test-agent-key"}]
             ).status == 200
    end

    test "another content type is a 415", %{sid: sid} do
      resp =
        HTTP.post("/api/v1/decision_logs", Observatory.JSON.encode!(msg(sid)),
          content_type: "text/plain"
        )

      assert resp.status == 415
    end

    test "a 10 MB body is refused with 413 before it is read", %{sid: sid} do
      size = 10 * 1024 * 1024

      response =
        HTTP.raw([
          "POST /api/v1/decision_logs HTTP/1.1\r\nHost: localhost\r\n",
          "Authorization: Bearer test-agent-key\r\nContent-Type: application/json\r\n",
          "Content-Length: #{size}\r\n\r\n",
          String.duplicate("x", 64 * 1024)
        ])

      assert response =~ "HTTP/1.1 413"
      assert response =~ "body_too_large"
      assert HTTP.post_json("/api/v1/decision_logs", msg(sid)).status == 200
    end
  end

  describe "sessions and HITL over HTTP" do
    test "GET shows window, score, severity and paused", %{sid: sid} do
      for _ <- 1..5, do: HTTP.post_json("/api/v1/decision_logs", msg(sid))
      resp = HTTP.get("/api/v1/sessions/#{sid}", HTTP.operator_headers())
      assert resp.status == 200

      assert %{
               "session_id" => ^sid,
               "agent_id" => "agent-http",
               "entropy_score" => 0.2,
               "severity" => "loop",
               "paused" => false,
               "verdict" => %{"verdict" => "loop", "rule" => "repeat", "step_number" => 5},
               "messages" => 5,
               "window" => [
                 %{"intent" => "search", "tool_call" => "read_file", "action_status" => "failure"}
                 | _
               ]
             } = resp.body

      assert HTTP.get("/api/v1/sessions/#{sid}", [{"authorization", "Bearer test-agent-key"}]).status ==
               200

      assert HTTP.get("/api/v1/sessions/#{sid}").status == 401
      assert HTTP.get("/api/v1/sessions/nope-#{sid}", HTTP.operator_headers()).status == 404
    end

    test "pause and resume need the operator token and are audited", %{sid: sid} do
      HTTP.post_json("/api/v1/decision_logs", msg(sid))
      path = "/api/v1/sessions/#{sid}/pause"

      assert HTTP.post(path, "", headers: [{"authorization", "Bearer test-agent-key"}]).status ==
               401

      resp = HTTP.post_json(path, %{"reason" => "looping"}, headers: HTTP.operator_headers())
      assert resp.status == 200

      assert %{
               "paused" => true,
               "audit" => %{"operator" => "test-operator", "reason" => "looping"}
             } = resp.body

      assert HITL.paused?(sid)
      assert HTTP.post(path, "", headers: HTTP.operator_headers()).status == 409

      answer = HTTP.post_json("/api/v1/decision_logs", msg(sid))

      assert %{"paused" => true, "directives" => [%{"type" => "pause", "reason" => "looping"}]} =
               answer.body

      assert %{"paused" => true} =
               HTTP.get("/api/v1/sessions/#{sid}", HTTP.operator_headers()).body

      resume = HTTP.post("/api/v1/sessions/#{sid}/resume", "", headers: HTTP.operator_headers())
      assert resume.status == 200
      refute HITL.paused?(sid)

      audit = HTTP.get("/api/v1/hitl/audit?session_id=#{sid}", HTTP.operator_headers())

      assert [%{"action" => "resume"}, %{"action" => "pause", "operator" => "test-operator"}] =
               audit.body["entries"]
    end

    test "a hostile session id is just data", %{sid: sid} do
      hostile = "<img src=x onerror=alert(1)>#{sid}"
      assert HTTP.post_json("/api/v1/decision_logs", msg(hostile)).status == 200

      resp =
        HTTP.get(
          "/api/v1/sessions/#{URI.encode(hostile, &URI.char_unreserved?/1)}",
          HTTP.operator_headers()
        )

      assert resp.status == 200
      assert resp.body["session_id"] == hostile
      assert resp.headers["content-type"] =~ "application/json"
    end
  end

  test "healthz, metrics, 404 and 405" do
    assert %{status: 200, body: %{"status" => "ok"}} = HTTP.get("/healthz")
    metrics = HTTP.get("/metrics")
    assert metrics.status == 200
    assert metrics.body =~ "observatory_decision_logs_total"
    assert metrics.body =~ ~s(observatory_ingest_duration_microseconds_bucket{le="+Inf"})
    assert metrics.body =~ ~s(observatory_severity_total{severity="loop"})
    assert metrics.body =~ ~s(observatory_verdict_total{verdict="suspect"})
    assert metrics.body =~ ~r/^observatory_step_replays_total \d+$/m
    assert metrics.body =~ ~r/^observatory_idempotency_steps \d+$/m
    assert metrics.body =~ ~r/^observatory_idempotency_bytes \d+$/m
    assert HTTP.get("/nope").status == 404
    assert HTTP.get("/api/v1/decision_logs").status == 405
  end
end
