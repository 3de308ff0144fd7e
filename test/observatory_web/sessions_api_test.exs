defmodule ObservatoryWeb.SessionsAPITest do
  # Real HTTP against the server the application started (port 0 in test). Each test
  # uses agents of its own, so the global session list can be filtered to its rows.
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.HITL
  alias Observatory.Test.HTTP

  defp agent(prefix), do: unique_session(prefix)

  defp post_step(sid, agent, overrides) do
    envelope =
      HTTP.envelope(
        Map.merge(%{"meta" => %{"session_id" => sid, "agent_id" => agent}}, overrides, fn _k,
                                                                                          a,
                                                                                          b ->
          Map.merge(a, b)
        end)
      )

    resp = HTTP.post_json("/api/v1/decision_logs", envelope, headers: HTTP.agent_headers(agent))
    assert resp.status == 200, inspect(resp.body)
    resp.body
  end

  defp tuple_step(sid, agent, intent, tool),
    do:
      post_step(sid, agent, %{
        "cognition" => %{"intent" => intent},
        "action" => %{"tool_call" => tool}
      })

  defp list(query, headers \\ HTTP.operator_headers()),
    do: HTTP.get("/api/v1/sessions?" <> query, headers)

  defp ids(resp), do: Enum.map(resp.body["sessions"], & &1["session_id"])

  describe "issue 18: GET /api/v1/sessions is for operators" do
    test "no token, a wrong token or an agent key: 401; an operator token: 200" do
      assert HTTP.get("/api/v1/sessions").status == 401
      assert list("", [{"authorization", "Bearer nope"}]).status == 401
      assert list("", [{"authorization", "Bearer " <> HTTP.agent_key()}]).status == 401
      assert %{status: 200, body: %{"sessions" => sessions}} = list("")
      assert is_list(sessions)
    end
  end

  describe "operator routes name the credential they take" do
    test "an agent key pausing, resuming or resetting a session is told an operator token is needed" do
      agent_key = [{"authorization", "Bearer " <> HTTP.agent_key()}]
      sid = unique_session("sess-not-yours")

      for action <- ["pause", "resume", "step_detector/reset"] do
        resp = HTTP.post("/api/v1/sessions/#{sid}/#{action}", "", headers: agent_key)
        assert resp.status == 401
        assert resp.body["message"] == "send an operator token: Authorization: Bearer <token>"
      end

      resp = HTTP.get("/api/v1/sessions/#{sid}", [{"authorization", "Bearer nope"}])
      assert resp.status == 401
      assert resp.body["message"] =~ "the session's agent key or an operator token"
    end
  end

  describe "issue 18: rows and filters" do
    setup do
      a = agent("agent-rows")
      [looping, warned, healthy, paused] = for p <- ~w(l w h p), do: unique_session("api-#{p}")

      for _ <- 1..5, do: tuple_step(looping, a, "search", "read_file")
      for _ <- 1..4, do: tuple_step(warned, a, "search", "read_file")
      tuple_step(warned, a, "plan", "write_file")
      for i <- 1..3, do: tuple_step(healthy, a, "step #{i}", "tool_#{i}")
      tuple_step(paused, a, "x", "y")
      {:ok, _} = HITL.pause(paused, operator: "ops", reason: "")
      on_exit(fn -> HITL.resume(paused, operator: "ops") end)

      %{agent: a, looping: looping, warned: warned, healthy: healthy, paused: paused}
    end

    test "each row: session, agent, state, entropy, verdict and rule, paused/blocked, last step, node",
         %{agent: a, looping: looping} do
      resp = list("agent_id=#{a}&state=alert")
      assert resp.status == 200
      assert [row] = resp.body["sessions"]

      assert %{
               "session_id" => ^looping,
               "agent_id" => ^a,
               "state" => "alert",
               "alerted" => true,
               "entropy_score" => 0.2,
               "severity" => "loop",
               "verdict" => "loop",
               "rule" => "repeat",
               "paused" => false,
               "blocked" => false,
               "steps" => 5,
               "last_step_at" => last,
               "node" => node
             } = row

      assert node == Atom.to_string(node())
      assert {:ok, _, 0} = DateTime.from_iso8601(last)
    end

    test "filters by state, severity, verdict and agent", ctx do
      a = ctx.agent
      assert ids(list("agent_id=#{a}&state=alert")) == [ctx.looping]
      assert ids(list("agent_id=#{a}&state=warning")) == [ctx.warned]
      assert ids(list("agent_id=#{a}&state=paused")) == [ctx.paused]
      assert ids(list("agent_id=#{a}&severity=loop")) == [ctx.looping]

      assert ids(list("agent_id=#{a}&severity=normal")) |> Enum.sort() ==
               Enum.sort([ctx.healthy, ctx.paused])

      assert ctx.looping in ids(list("agent_id=#{a}&verdict=loop"))
      refute ctx.healthy in ids(list("agent_id=#{a}&verdict=loop"))
      assert ids(list("agent_id=#{a}&state=active")) == [ctx.healthy]
      assert length(ids(list("agent_id=#{a}"))) == 4
      assert ids(list("agent_id=#{a}-nobody")) == []

      assert [%{"paused" => true, "state" => "paused"}] =
               list("agent_id=#{a}&state=paused").body["sessions"]
    end

    test "a bad filter value is a 400 naming the values it takes" do
      assert %{status: 400, body: %{"message" => message}} = list("state=blocked")
      assert message == "state must be one of alert, warning, paused, active, idle"

      assert %{status: 400, body: %{"message" => "severity must be one of loop, warning, normal"}} =
               list("severity=high")

      assert %{
               status: 400,
               body: %{"message" => "verdict must be one of progress, suspect, loop"}
             } = list("verdict=maybe")
    end
  end

  describe "issue 18: newest activity first, a page at a time" do
    test "a cursor walks every row once; the last page has no cursor; new activity moves a row first" do
      a = agent("agent-pages")
      sids = for i <- 1..5, do: unique_session("api-page-#{i}")
      for sid <- sids, do: tuple_step(sid, a, "x", "y")

      pages =
        Stream.unfold("agent_id=#{a}&limit=2", fn
          nil ->
            nil

          query ->
            %{status: 200, body: body} = list(query)
            next = body["next_cursor"] && "agent_id=#{a}&limit=2&cursor=#{body["next_cursor"]}"
            {body["sessions"], next}
        end)
        |> Enum.to_list()

      assert Enum.map(pages, &length/1) == [2, 2, 1]
      rows = Enum.concat(pages)
      assert Enum.sort(Enum.map(rows, & &1["session_id"])) == Enum.sort(sids)

      keys = Enum.map(rows, &{&1["last_step_at"], &1["session_id"]})
      assert keys == Enum.sort(keys, :desc), "newest activity first"

      # The oldest session sends a step: it is first now.
      oldest = List.last(rows)["session_id"]
      tuple_step(oldest, a, "z", "w")
      assert hd(ids(list("agent_id=#{a}&limit=2"))) == oldest
    end

    test "the page size is bounded and the cursor checked" do
      assert %{status: 400, body: %{"message" => "limit must be an integer from 1 to 200"}} =
               list("limit=201")

      assert list("limit=0").status == 400
      assert list("limit=ten").status == 400
      assert list("limit=200").status == 200

      assert %{status: 400, body: %{"message" => "cursor is not one" <> _}} =
               list("cursor=%25%25")

      assert list("cursor=bm90LWEtY3Vyc29y").status == 400
      assert length(list("").body["sessions"]) <= 50, "50 by default"
    end
  end

  describe "issue 18: GET /api/v1/sessions/:id shows the recent steps" do
    @failure "collected 4 items\nE   assert 401 == 200\n1 failed, 3 passed in 0.42s"

    defp pytest(sid, agent) do
      post_step(sid, agent, %{
        "cognition" => %{"intent" => "run the tests"},
        "action" => %{
          "tool_call" => "bash",
          "tool_input" => %{"command" => "pytest tests/test_auth.py -x"},
          "status" => "failure",
          "result" => %{"exit_code" => 1, "stdout" => @failure}
        }
      })
    end

    test "each step with its number, time, call, arguments, result and status, under the verdict's numbers" do
      a = agent("agent-steps")
      sid = unique_session("api-steps")
      tuple_step(sid, a, "plan", "read_file")
      for _ <- 1..4, do: pytest(sid, a)

      %{status: 200, body: body} = HTTP.get("/api/v1/sessions/#{sid}", HTTP.operator_headers())

      assert %{
               "verdict" => %{"verdict" => "loop", "rule" => "repeat", "evidence" => [2, 3, 4, 5]}
             } = body

      assert Enum.map(body["steps"], & &1["step"]) == [1, 2, 3, 4, 5]
      assert Enum.map(body["window"], & &1["step"]) == [1, 2, 3, 4, 5]

      assert %{
               "step" => 5,
               "step_id" => _,
               "received_at" => _,
               "timestamp" => "2026-02-22T10:30:00Z",
               "intent" => "run the tests",
               "tool_call" => "bash",
               "status" => "failure",
               "call" => "pytest tests/test_auth.py -x",
               "arguments" => ~s({"command":"pytest tests/test_auth.py -x"}),
               "result" => "exit_code: 1\nstdout:\n" <> @failure,
               "truncated" => false,
               "evidence" => true,
               "in_entropy_window" => true
             } = List.last(body["steps"])

      assert %{"evidence" => false} = hd(body["steps"])

      assert %{
               "verdict" => %{
                 "rule" => "repeat",
                 "steps" => [2, 3, 4, 5],
                 "calls" => [%{"tool" => "bash", "call" => "pytest tests/test_auth.py -x"}],
                 "times" => 4,
                 "outcome" => "the same failure",
                 "arguments" => %{"kind" => "same"},
                 "result" => %{"kind" => "same"}
               },
               "entropy_window" => %{"window_steps" => [1, 2, 3, 4, 5], "count" => 4}
             } = body["explanation"]
    end

    test "a long result is cut in the session, whole at /steps/:step; only its agent or an operator reads it" do
      a = agent("agent-whole")
      sid = unique_session("api-whole")
      long = Enum.map_join(1..200, "\n", &"log line #{&1}")

      post_step(sid, a, %{"action" => %{"tool_input" => %{"command" => "make"}, "result" => long}})

      %{body: body} = HTTP.get("/api/v1/sessions/#{sid}", HTTP.operator_headers())
      assert [%{"truncated" => true, "result" => cut}] = body["steps"]
      refute cut =~ "log line 100\n"

      path = "/api/v1/sessions/#{sid}/steps/1"
      assert %{status: 200, body: whole} = HTTP.get(path, HTTP.operator_headers())
      assert %{"step" => 1, "result" => ^long, "call" => "make", "received_at" => _} = whole
      assert whole["envelope"]["action"]["result"] == long

      assert HTTP.get(path, HTTP.agent_headers(a)).status == 200
      assert HTTP.get(path, HTTP.agent_headers(agent("agent-stranger"))).status == 404
      assert HTTP.get(path).status == 401
      assert HTTP.get("/api/v1/sessions/#{sid}/steps/2", HTTP.operator_headers()).status == 404
      assert HTTP.get("/api/v1/sessions/#{sid}/steps/one", HTTP.operator_headers()).status == 404
      assert HTTP.get("/api/v1/sessions/#{sid}/steps/0", HTTP.operator_headers()).status == 404
    end
  end
end
