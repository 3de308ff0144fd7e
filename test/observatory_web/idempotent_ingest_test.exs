defmodule ObservatoryWeb.IdempotentIngestTest do
  # A retried step is answered again, never counted twice: over HTTP, one envelope and
  # NDJSON batches. Real HTTP against the server the application started.
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.{DecisionLog, Idempotency, SessionLog}
  alias Observatory.JSON
  alias Observatory.Test.HTTP

  setup do
    sid = unique_session("sess-retry")
    %{sid: sid}
  end

  defp step(sid, n, result \\ "no such file") do
    HTTP.envelope(%{
      "meta" => %{"session_id" => sid, "step_id" => "#{sid}-#{n}", "agent_id" => "agent-http"},
      "action" => %{"tool_input" => %{"path" => "a.txt"}, "result" => result}
    })
  end

  defp post(body), do: HTTP.post("/api/v1/decision_logs", body)

  defp post_ndjson(lines),
    do:
      HTTP.post("/api/v1/decision_logs", Enum.join(lines, "\n"),
        content_type: "application/x-ndjson"
      )

  describe "one envelope posted again" do
    test "the same step posted 3 times: 200 three times, the same answer, one step counted",
         %{sid: sid} do
      body = JSON.encode!(step(sid, 1))
      [first, second, third] = for _ <- 1..3, do: post(body)

      assert first.status == 200 and first.body["replayed"] == false
      refute Map.has_key?(first.headers, "idempotent-replayed")

      for again <- [second, third] do
        assert again.status == 200
        assert again.body["replayed"] == true
        assert again.headers["idempotent-replayed"] == "true"
        assert Map.delete(again.body, "replayed") == Map.delete(first.body, "replayed")
      end

      assert length(EntropyTracker.window(sid)) == 1
      assert SessionLog.count(sid) == 1
    end

    test "a changed body under a used step id: 409 step_conflict naming the step", %{sid: sid} do
      assert post(JSON.encode!(step(sid, 1))).status == 200
      resp = post(JSON.encode!(step(sid, 1, "found it")))

      assert resp.status == 409

      assert %{
               "error" => "step_conflict",
               "message" => message,
               "violations" => [%{"path" => "meta.step_id"}]
             } = resp.body

      assert message =~ ~s(step "#{sid}-1" of session "#{sid}" was already recorded)
      assert length(EntropyTracker.window(sid)) == 1
    end

    test "a retry while the first delivery is being scored: 503 step_in_progress, Retry-After",
         %{sid: sid} do
      envelope = step(sid, 1)
      {:ok, _parsed, fields} = DecisionLog.from_map(envelope)
      # This process plays the first delivery, still scoring.
      {:new, ticket} = Idempotency.claim(fields)

      # Raw bytes: :httpc itself retries a 503 that carries Retry-After, as clients should.
      body = JSON.encode!(envelope)

      response =
        HTTP.raw(
          "POST /api/v1/decision_logs HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" <>
            "Authorization: Bearer #{HTTP.agent_key()}\r\nContent-Type: application/json\r\n" <>
            "Content-Length: #{byte_size(body)}\r\n\r\n" <> body
        )

      assert response =~ ~r/\AHTTP\/1.1 503/
      assert response =~ ~r/\r\nRetry-After: 1\r\n/i
      assert response =~ ~s("error":"step_in_progress")
      Idempotency.release(ticket)
      assert post(JSON.encode!(envelope)).status == 200
    end
  end

  describe "an NDJSON batch re-sent whole" do
    test "is counted once: the second answer replays every line", %{sid: sid} do
      lines = for n <- 1..4, do: JSON.encode!(step(sid, n))

      first = post_ndjson(lines)
      again = post_ndjson(lines)

      assert %{"accepted" => 4, "replayed" => 0, "rejected" => 0} = first.body
      assert %{"accepted" => 4, "replayed" => 4, "rejected" => 0} = again.body

      for {a, b} <- Enum.zip(first.body["results"], again.body["results"]) do
        assert b["replayed"] == true
        assert Map.delete(b, "replayed") == Map.delete(a, "replayed")
      end

      assert SessionLog.count(sid) == 4
      assert length(EntropyTracker.window(sid)) == 4
    end

    test "a batch cut short and re-sent with the rest: the sent lines replayed, the rest new",
         %{sid: sid} do
      lines = for n <- 1..4, do: JSON.encode!(step(sid, n))
      post_ndjson(Enum.take(lines, 2))
      resp = post_ndjson(lines)

      assert %{"accepted" => 4, "replayed" => 2} = resp.body
      assert Enum.map(resp.body["results"], & &1["replayed"]) == [true, true, false, false]
      assert SessionLog.count(sid) == 4
    end

    test "a line with a changed body under a used step id is a rejected line", %{sid: sid} do
      post_ndjson([JSON.encode!(step(sid, 1))])

      {resp, log} =
        with_log(fn ->
          post_ndjson([JSON.encode!(step(sid, 1, "changed")), JSON.encode!(step(sid, 2))])
        end)

      assert log =~ "batch line 1"

      assert %{"accepted" => 1, "rejected" => 1, "results" => [conflict, _]} = resp.body
      assert %{"line" => 1, "accepted" => false, "violations" => [violation]} = conflict
      assert violation["path"] == "meta.step_id"
      assert violation["reason"] =~ "already recorded with a different body"
    end
  end
end
