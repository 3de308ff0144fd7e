defmodule ObservatoryWeb.RequestHygieneTest do
  # Issue 13, findings 3 and 4: what the server does with bytes it cannot trust —
  # invalid UTF-8 in a path, a query or a header, a Content-Length that is not a
  # number — and how big an error answer and its log may get.
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.HITL
  alias Observatory.Test.DashboardClient, as: Client
  alias Observatory.Test.HTTP

  defp raw_request(lines), do: HTTP.raw([Enum.join(lines, "\r\n"), "\r\n\r\n"])

  describe "finding 3: invalid UTF-8 in a path or header is a 400 before any state changes" do
    test "pausing bad%FFid answers 400 and applies no pause" do
      bad = <<"bad", 0xFF, "id">>
      resp = HTTP.post("/api/v1/sessions/bad%FFid/pause", "", headers: HTTP.operator_headers())

      assert resp.status == 400
      assert resp.body["error"] == "bad_request"
      assert resp.body["message"] =~ "not valid UTF-8"
      refute HITL.paused?(bad)
      refute HITL.paused?("bad%FFid")
      assert HTTP.get("/api/v1/hitl/audit", HTTP.operator_headers()).status == 200
    end

    test "a malformed percent-escape in a path is a 400, not a literal segment" do
      response =
        raw_request([
          "POST /api/v1/sessions/bad%G1id/pause HTTP/1.1",
          "Host: localhost",
          "Authorization: Bearer #{HTTP.operator_token()}",
          "Content-Length: 0"
        ])

      assert response =~ "HTTP/1.1 400"
      refute HITL.paused?("bad%G1id")
    end

    test "invalid UTF-8 in the query string is a 400" do
      resp = HTTP.get("/api/v1/hitl/audit?session_id=%FF", HTTP.operator_headers())
      assert resp.status == 400
    end

    test "a header that is not UTF-8 is a 400 (raw bytes, not mojibake)" do
      response =
        raw_request([
          "POST /api/v1/sessions/s-hdr/pause HTTP/1.1",
          "Host: localhost",
          "Authorization: Bearer #{HTTP.operator_token()}",
          <<"X-Note: caf", 0xE9>>,
          "Content-Length: 0"
        ])

      assert response =~ "HTTP/1.1 400"
      assert response =~ "a header is not valid UTF-8"
      refute HITL.paused?("s-hdr")
    end

    test "a negative or malformed Content-Length is a 400, not a 500" do
      for length <- ["-5", "abc", "1e3", "5, 5"] do
        response =
          raw_request([
            "POST /api/v1/decision_logs HTTP/1.1",
            "Host: localhost",
            "Authorization: Bearer #{HTTP.agent_key()}",
            "Content-Type: application/json",
            "Content-Length: #{length}"
          ])

        assert response =~ "HTTP/1.1 400", "Content-Length: #{length} gave #{response}"
        assert response =~ "Content-Length must be a decimal number"
      end

      assert HTTP.get("/healthz").status == 200
    end

    test "a stored string that is not UTF-8 cannot break the audit API" do
      bad = <<"stored-", 0xFF, "-", System.unique_integer([:positive])::32>>
      {:ok, _} = HITL.pause(bad, operator: "test", reason: <<"why ", 0xC3>>)
      on_exit(fn -> HITL.resume(bad, operator: "test") end)

      resp = HTTP.get("/api/v1/hitl/audit", HTTP.operator_headers())
      assert resp.status == 200
      assert Enum.any?(resp.body["entries"], &(&1["reason"] == "why \uFFFD"))
    end

    test "a stored string that is not UTF-8 cannot stop the dashboard's event stream" do
      auth = Client.sign_in()
      stream = Client.open_stream(auth.cookie)
      {{:event, "mount", _}, stream} = Client.next_event(stream)

      bad = <<"stream-", 0xFF, "-", System.unique_integer([:positive])::32>>
      {:ok, _} = HITL.pause(bad, operator: "test", reason: "bad bytes")
      on_exit(fn -> HITL.resume(bad, operator: "test") end)

      sid = unique_session("sess-after-bad")

      for _ <- 1..5 do
        msg = HTTP.envelope(%{"meta" => %{"session_id" => sid}})
        assert HTTP.post_json("/api/v1/decision_logs", msg).status == 200
      end

      {{:event, "render", %{"html" => html}}, stream} =
        Client.await_event(
          stream,
          fn
            {:event, "render", %{"html" => h}} -> h =~ sid
            _ -> false
          end,
          3_000
        )

      assert html =~ sid
      Client.close_stream(stream)
    end
  end
end
