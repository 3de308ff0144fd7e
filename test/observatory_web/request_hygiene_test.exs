defmodule ObservatoryWeb.RequestHygieneTest do
  # Issue 13, findings 3 and 4: what the server does with bytes it cannot trust —
  # invalid UTF-8 in a path, a query or a header, a Content-Length that is not a
  # number — and how big an error answer and its log may get.
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.HITL
  alias Observatory.Test.DashboardClient, as: Client
  alias Observatory.Test.{HTTP, Upstream}

  # A request head: its lines, each ended by CRLF, and the blank line.
  defp head(lines), do: Enum.join(lines, "\r\n") <> "\r\n\r\n"

  defp raw_request(lines), do: HTTP.raw(head(lines))

  # Sends `bytes` on a new connection; what the server answers within `ms`, and whether
  # it closed the connection by then. (The idle timeout is longer: an answer here is
  # an answer, not the timeout.)
  defp exchange(bytes, ms \\ 3_000) do
    {:ok, socket} =
      :gen_tcp.connect(~c"127.0.0.1", ObservatoryWeb.Endpoint.port(), [:binary, active: false])

    :ok = :gen_tcp.send(socket, bytes)
    deadline = System.monotonic_time(:millisecond) + ms
    result = read_until(socket, "", deadline)
    :gen_tcp.close(socket)
    result
  end

  defp read_until(socket, acc, deadline) do
    left = deadline - System.monotonic_time(:millisecond)

    case left > 0 && :gen_tcp.recv(socket, 0, left) do
      {:ok, data} -> read_until(socket, acc <> data, deadline)
      {:error, :closed} -> {acc, :closed}
      _ -> {acc, :open}
    end
  end

  defp post_head(extra) do
    [
      "POST /api/v1/decision_logs HTTP/1.1",
      "Host: localhost",
      "Content-Type: application/json",
      "Authorization: Bearer #{HTTP.agent_key()}" | extra
    ]
    |> head()
  end

  defp chunk(data, ext \\ ""),
    do: Integer.to_string(byte_size(data), 16) <> ext <> "\r\n" <> data <> "\r\n"

  describe "hardening round 2: HTTP framing errors are answered at once" do
    test "a chunk extension carrying a CR is a 400 and the connection is closed, not a 500" do
      body = Observatory.JSON.encode!(HTTP.envelope())

      bytes =
        post_head(["Transfer-Encoding: chunked"]) <> chunk(body, ~s(;note="a\rb")) <> "0\r\n\r\n"

      assert {"HTTP/1.1 400 " <> _ = answer, :closed} = exchange(bytes)
      assert answer =~ "a chunk extension holds a control character"
    end

    test "well-formed chunk extensions are ignored, and the connection stays open" do
      body = Observatory.JSON.encode!(HTTP.envelope())
      {first, second} = String.split_at(body, 10)

      request =
        post_head(["Transfer-Encoding: chunked"]) <>
          chunk(first, ";name=value") <>
          chunk(second, ~s( ; q="x y")) <> "0\r\nX-Trailer: 1\r\n\r\n"

      {answers, :open} = exchange(request <> request, 1_500)
      assert [_, _] = String.split(answers, "HTTP/1.1 200 OK", trim: true)
    end

    test "broken chunk framing is a 400: a size that is not hex, data not ended by CRLF, a bare LF" do
      for broken <- ["zz\r\nabc\r\n0\r\n\r\n", "3\r\nabcX\r\n0\r\n\r\n", "3\nabc\r\n0\r\n\r\n"] do
        assert {"HTTP/1.1 400 " <> _, :closed} =
                 exchange(post_head(["Transfer-Encoding: chunked"]) <> broken)
      end
    end

    test "an unknown Transfer-Encoding is a 501 at once" do
      for coding <- ["gzip", "gzip, chunked", "identity"] do
        bytes = post_head(["Transfer-Encoding: #{coding}"]) <> "{}"
        assert {"HTTP/1.1 501 " <> _ = answer, :closed} = exchange(bytes)
        assert answer =~ "not_implemented"
      end
    end

    test "a header with a space before its colon (Content-Length : 7) is a 400 at once" do
      bytes = post_head(["Content-Length : 2"]) <> "{}"
      assert {"HTTP/1.1 400 " <> _ = answer, :closed} = exchange(bytes)
      assert answer =~ "a header line is malformed"
    end

    test "a request line that is not HTTP is a 400 at once" do
      for line <- ["HELLO", "GET / HTTP/9.x", <<1, 2, " x">>] do
        assert {"HTTP/1.1 400 " <> _, :closed} = exchange(line <> "\r\n\r\n")
      end
    end

    test "Transfer-Encoding and Content-Length together are a 400 (request smuggling)" do
      bytes = post_head(["Transfer-Encoding: chunked", "Content-Length: 5"]) <> "0\r\n\r\n"
      assert {"HTTP/1.1 400 " <> _ = answer, :closed} = exchange(bytes)
      assert answer =~ "not both"
    end

    test "a chunked body over the limit is a 413" do
      restore_env_on_exit([:max_body_bytes])
      Application.put_env(:observatory, :max_body_bytes, 1_000)
      big = String.duplicate("x", 800)
      bytes = post_head(["Transfer-Encoding: chunked"]) <> chunk(big) <> chunk(big) <> "0\r\n\r\n"
      assert {"HTTP/1.1 413 " <> _, _} = exchange(bytes)
    end
  end

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

  describe "header values with control characters are a 400" do
    setup do
      saved = Application.get_env(:observatory, :anthropic_upstream)
      on_exit(fn -> Application.put_env(:observatory, :anthropic_upstream, saved) end)
    end

    defp messages_request(version_line) do
      body =
        ~s({"model":"claude-test","max_tokens":10,"messages":[{"role":"user","content":"hi"}]})

      HTTP.raw([
        head([
          "POST /v1/messages HTTP/1.1",
          "Host: localhost",
          "Connection: close",
          "Authorization: Bearer #{HTTP.agent_key()}",
          "Content-Type: application/json",
          version_line,
          "Content-Length: #{byte_size(body)}"
        ]),
        body
      ])
    end

    test "a folded or CR-split anthropic-version is a 400 and nothing goes upstream" do
      upstream = Upstream.start(fn _body -> {200, "application/json", Upstream.message("hi")} end)
      Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{upstream.port}")

      for line <- [
            "anthropic-version: 2023-06-01\r\n X-Injected: yes",
            "anthropic-version: 2023-06-01\rX-Injected: yes"
          ] do
        response = messages_request(line)
        assert response =~ "HTTP/1.1 400", "#{inspect(line)} gave #{response}"
        assert response =~ "a header value contains a control character"
      end

      refute_received {:upstream_request, _, _}

      # The same request with a clean header goes through.
      assert messages_request("anthropic-version: 2023-06-01") =~ "HTTP/1.1 200"
      assert_receive {:upstream_request, _, _}, 1_000
    end

    test "NUL, DEL and other control bytes are a 400 and apply no pause; a tab is allowed" do
      for {byte, n} <- Enum.with_index([0x00, 0x01, 0x0B, 0x1F, 0x7F]) do
        session = "s-ctl-#{n}"

        response =
          raw_request([
            "POST /api/v1/sessions/#{session}/pause HTTP/1.1",
            "Host: localhost",
            "Authorization: Bearer #{HTTP.operator_token()}",
            <<"X-Note: a", byte, "b">>,
            "Content-Length: 0"
          ])

        assert response =~ "HTTP/1.1 400", "byte #{byte} gave #{response}"
        refute HITL.paused?(session)
      end

      response =
        raw_request([
          "POST /api/v1/sessions/s-ctl-tab/pause HTTP/1.1",
          "Host: localhost",
          "Connection: close",
          "Authorization: Bearer #{HTTP.operator_token()}",
          "X-Note: a\tb",
          "Content-Length: 0"
        ])

      refute response =~ "HTTP/1.1 400"
      assert HITL.paused?("s-ctl-tab")
    end
  end

  describe "issue 24: a small body no handler read does not cost the connection" do
    # One answer off `socket`: its head (lower case) and body, by its Content-Length.
    defp read_answer(socket, acc \\ "") do
      with [head, rest] <- String.split(acc, "\r\n\r\n", parts: 2),
           [_, length] <- Regex.run(~r/content-length: (\d+)/i, head),
           length = String.to_integer(length),
           true <- byte_size(rest) >= length do
        <<body::binary-size(length), more::binary>> = rest
        {String.downcase(head), body, more}
      else
        _ ->
          {:ok, data} = :gen_tcp.recv(socket, 0, 3_000)
          read_answer(socket, acc <> data)
      end
    end

    defp connect do
      {:ok, socket} =
        :gen_tcp.connect(~c"127.0.0.1", ObservatoryWeb.Endpoint.port(), [:binary, active: false])

      socket
    end

    defp post_404(body, extra \\ []) do
      head(
        ["POST /no-such-page HTTP/1.1", "Host: localhost", "Content-Length: #{byte_size(body)}"] ++
          extra
      ) <> body
    end

    @get_404 "GET /no-such-page?next=1 HTTP/1.1\r\nHost: localhost\r\n\r\n"

    test "a POST answered 404 unread keeps its connection, and the next request on it is answered" do
      socket = connect()
      :ok = :gen_tcp.send(socket, post_404(String.duplicate("x", 600)))
      {head, body, ""} = read_answer(socket)
      assert head =~ ~r"^http/1.1 404 "
      refute head =~ "connection: close"
      assert body =~ "not_found"

      :ok = :gen_tcp.send(socket, @get_404)
      {head, _body, ""} = read_answer(socket)
      assert head =~ ~r"^http/1.1 404 "
      :gen_tcp.close(socket)
    end

    test "pipelined after the unread body, the next request is read from its first byte" do
      socket = connect()
      # The body looks like a request: skipped by its length, it is never answered.
      decoy = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
      :ok = :gen_tcp.send(socket, post_404(decoy) <> @get_404)
      {first, _, more} = read_answer(socket)
      {second, body, rest} = read_answer(socket, more)
      assert first =~ ~r"^http/1.1 404 " and second =~ ~r"^http/1.1 404 "
      assert body =~ "not_found"
      assert rest == ""
      assert {:error, :timeout} = :gen_tcp.recv(socket, 0, 200)
      :gen_tcp.close(socket)
    end

    test "an unread body over 64 KiB still closes the connection after the answer" do
      head = post_404("") |> String.replace("Content-Length: 0", "Content-Length: 70000")
      {answer, state} = exchange(head)
      assert answer =~ ~r"^HTTP/1.1 404 "
      assert String.downcase(answer) =~ "connection: close"
      assert state == :closed
    end

    test "a body behind Expect: 100-continue is not waited for: the connection closes" do
      {answer, state} =
        exchange(
          post_404("", ["Expect: 100-continue"])
          |> String.replace("Content-Length: 0", "Content-Length: 600")
        )

      assert answer =~ ~r"^HTTP/1.1 404 "
      assert String.downcase(answer) =~ "connection: close"
      assert state == :closed
    end

    test "a small body a handler refused as too large (413) still closes the connection" do
      previous = Application.get_env(:observatory, :max_body_bytes)
      Application.put_env(:observatory, :max_body_bytes, 1_000)

      on_exit(fn ->
        if previous,
          do: Application.put_env(:observatory, :max_body_bytes, previous),
          else: Application.delete_env(:observatory, :max_body_bytes)
      end)

      body = String.duplicate("x", 2_000)
      {answer, state} = exchange(post_head(["Content-Length: #{byte_size(body)}"]) <> body)
      assert answer =~ ~r"^HTTP/1.1 413 "
      assert String.downcase(answer) =~ "connection: close"
      assert state == :closed
    end
  end

  describe "issue 24: a Content-Length body is read whole, in as few reads as it arrives in" do
    defp ingest_request(envelope, extra \\ []) do
      body = Observatory.JSON.encode!(envelope)
      {post_head(["Content-Length: #{byte_size(body)}" | extra]), body}
    end

    test "a 300 KiB step sent in pieces is read whole and answered; the connection is kept" do
      content = String.duplicate("0123456789abcdef", 300 * 64)
      envelope = HTTP.envelope(%{"action" => %{"result" => %{"content" => content}}})
      {head, body} = ingest_request(envelope)
      # Sockets from before this connection are other tests' (read_lengths/1 skips them).
      older_sockets = MapSet.new(:erlang.ports())
      socket = connect()
      # Every read of the socket the server makes, counted (MochiWeb read 8 KiB at a time).
      :erlang.trace_pattern({:mochiweb_socket, :recv, 3}, true, [:global])
      :erlang.trace(:all, true, [:call, {:tracer, self()}])

      on_exit(fn ->
        :erlang.trace(:all, false, [:call])
        :erlang.trace_pattern({:mochiweb_socket, :recv, 3}, false, [:global])
      end)

      :ok = :gen_tcp.send(socket, head)
      # Three pieces, the client pausing between them, as a slow network delivers them.
      third = div(byte_size(body), 3)
      <<one::binary-size(third), two::binary-size(third), three::binary>> = body

      for piece <- [one, two, three] do
        :ok = :gen_tcp.send(socket, piece)
        Process.sleep(20)
      end

      {answer, answer_body, ""} = read_answer(socket)
      :erlang.trace(:all, false, [:call])
      assert answer =~ ~r"^http/1.1 200 "
      refute answer =~ "connection: close"
      assert read_lengths(older_sockets) == [byte_size(body)]
      assert {:ok, %{"step_id" => step_id}} = Observatory.JSON.decode(answer_body)
      assert step_id == envelope["meta"]["step_id"]

      :ok = :gen_tcp.send(socket, @get_404)
      {answer, _body, ""} = read_answer(socket)
      assert answer =~ ~r"^http/1.1 404 "
      :gen_tcp.close(socket)
    end

    defp read_lengths(older_sockets) do
      receive do
        {:trace, _pid, :call, {:mochiweb_socket, :recv, [socket, length, _timeout]}} ->
          if MapSet.member?(older_sockets, socket),
            do: read_lengths(older_sockets),
            else: [length | read_lengths(older_sockets)]
      after
        0 -> []
      end
    end

    test "pipelined after a body that was read, the next request is read from its first byte" do
      {head, body} = ingest_request(HTTP.envelope())
      socket = connect()
      :ok = :gen_tcp.send(socket, head <> body <> @get_404)
      {first, _, more} = read_answer(socket)
      {second, _, rest} = read_answer(socket, more)
      assert first =~ ~r"^http/1.1 200 " and second =~ ~r"^http/1.1 404 "
      assert rest == ""
      :gen_tcp.close(socket)
    end

    test "Expect: 100-continue: the client is told to go on, then its body is read and answered" do
      envelope = HTTP.envelope()
      {head, body} = ingest_request(envelope, ["Expect: 100-continue"])
      socket = connect()
      :ok = :gen_tcp.send(socket, head)
      {:ok, continue} = :gen_tcp.recv(socket, 0, 3_000)
      assert continue =~ ~r"^HTTP/1.1 100 Continue\r\n"
      :ok = :gen_tcp.send(socket, body)
      {answer, answer_body, ""} = read_answer(socket)
      assert answer =~ ~r"^http/1.1 200 "
      assert {:ok, %{"step_id" => step_id}} = Observatory.JSON.decode(answer_body)
      assert step_id == envelope["meta"]["step_id"]
      :gen_tcp.close(socket)
    end

    test "a body announced over the limit is refused 413 before it is sent, and the connection closes" do
      # Nothing of the 5 MiB is sent: the answer cannot have waited for it.
      {answer, state} = exchange(post_head(["Content-Length: #{5 * 1024 * 1024}"]))
      assert answer =~ ~r"^HTTP/1.1 413 "
      assert String.downcase(answer) =~ "connection: close"
      assert state == :closed
    end

    test "header names are matched in any case, known to the parser or not" do
      envelope = HTTP.envelope()
      body = Observatory.JSON.encode!(envelope)

      request =
        head([
          "POST /api/v1/decision_logs HTTP/1.1",
          "HOST: localhost",
          "CONTENT-TYPE: application/json",
          "x-AGENT-key: #{HTTP.agent_key()}",
          "content-LENGTH: #{byte_size(body)}"
        ]) <> body

      {answer, _state} = exchange(request, 1_000)
      assert answer =~ ~r"^HTTP/1.1 200 "
      assert answer =~ envelope["meta"]["step_id"]
    end
  end

  describe "issue 24: the request head is read in one go and parsed from the buffer" do
    # The socket work of the server's connection processes while `fun` runs: every
    # call of `gen_tcp:recv/3`, `inet:setopts/2` and `gen_tcp:unrecv/2` made by a
    # process other than the test's own, in order, on a socket opened while `fun` ran.
    # (A connection an earlier test left open may still read its socket meanwhile.)
    defp server_socket_calls(fun) do
      older_sockets = MapSet.new(:erlang.ports())
      calls = [{:gen_tcp, :recv, 3}, {:inet, :setopts, 2}, {:gen_tcp, :unrecv, 2}]
      for mfa <- calls, do: :erlang.trace_pattern(mfa, true, [:global])
      :erlang.trace(:all, true, [:call, {:tracer, self()}])

      try do
        fun.()
      after
        :erlang.trace(:all, false, [:call])
        for mfa <- calls, do: :erlang.trace_pattern(mfa, false, [:global])
      end

      me = self()

      collect = fn collect ->
        receive do
          {:trace, pid, :call, {m, f, [socket | _] = args}} when pid != me ->
            if MapSet.member?(older_sockets, socket),
              do: collect.(collect),
              else: [{m, f, length(args)} | collect.(collect)]

          {:trace, _pid, :call, _} ->
            collect.(collect)
        after
          0 -> []
        end
      end

      collect.(collect)
    end

    defp twenty_headers do
      for i <- 1..18, do: "X-Client-Header-#{i}: value #{i}"
    end

    test "a head of 20 headers in one packet takes one read of the socket, no round trip per line" do
      request =
        head(
          ["GET /no-such-page HTTP/1.1", "Host: localhost", "Connection: close"] ++
            twenty_headers()
        )

      # A kept-alive connection from before, used meanwhile: its reads are not this
      # request's (an earlier test's connection may be read while this one runs).
      older = connect()
      :ok = :gen_tcp.send(older, @get_404)
      {"http/1.1 404 " <> _, _body, ""} = read_answer(older)

      calls =
        server_socket_calls(fn ->
          :ok = :gen_tcp.send(older, @get_404)
          {"http/1.1 404 " <> _, _body, ""} = read_answer(older)
          {answer, state} = exchange(request)
          assert answer =~ ~r"^HTTP/1.1 404 "
          assert state == :closed
        end)

      :gen_tcp.close(older)

      # MochiWeb's loop: an `inet:setopts/2` (and a message) per line, 23 here.
      assert calls == [{:gen_tcp, :recv, 3}]
    end

    test "a body in the same packet as the head goes back to the socket whole and is read once" do
      envelope = HTTP.envelope()
      body = Observatory.JSON.encode!(envelope)
      request = post_head(["Content-Length: #{byte_size(body)}", "Connection: close"]) <> body

      calls =
        server_socket_calls(fn ->
          {answer, _state} = exchange(request)
          assert answer =~ ~r"^HTTP/1.1 200 "
          assert answer =~ envelope["meta"]["step_id"]
        end)

      assert [{:gen_tcp, :recv, 3}, {:gen_tcp, :unrecv, 2}] = Enum.take(calls, 2)
      refute {:inet, :setopts, 2} in calls
    end

    test "a head split over several packets, mid-line and between CR and LF, is read whole" do
      socket = connect()
      :ok = :inet.setopts(socket, nodelay: true)
      key = HTTP.agent_key()
      envelope = HTTP.envelope()
      body = Observatory.JSON.encode!(envelope)

      pieces = [
        "POST /api/v1/deci",
        "sion_logs HTTP/1.1\r",
        "\nHost: localhost\r\nContent-Type: appl",
        "ication/json\r\nAuthorization: Bearer #{key}\r\nContent-Len",
        "gth: #{byte_size(body)}\r\n\r",
        "\n" <> body
      ]

      for piece <- pieces do
        :ok = :gen_tcp.send(socket, piece)
        # Each piece its own packet: the server sees the head arrive in parts.
        Process.sleep(5)
      end

      {answer, answer_body, ""} = read_answer(socket)
      assert answer =~ ~r"^http/1.1 200 "
      assert {:ok, %{"step_id" => step_id}} = Observatory.JSON.decode(answer_body)
      assert step_id == envelope["meta"]["step_id"]
      :gen_tcp.close(socket)
    end

    test "three requests in one packet are each answered, in order, from their first byte" do
      socket = connect()
      :ok = :gen_tcp.send(socket, @get_404 <> "\r\n" <> @get_404 <> @get_404)
      {first, _, more} = read_answer(socket)
      {second, _, more} = read_answer(socket, more)
      {third, body, rest} = read_answer(socket, more)
      assert Enum.all?([first, second, third], &(&1 =~ ~r"^http/1.1 404 "))
      assert body =~ "not_found"
      assert rest == ""
      :gen_tcp.close(socket)
    end

    test "a request line over 8 KiB is a 414 and the connection closes" do
      path = "/" <> String.duplicate("a", ObservatoryWeb.Endpoint.limits().max_request_line)
      {answer, state} = exchange("GET #{path} HTTP/1.1\r\nHost: localhost\r\n\r\n")
      assert answer =~ ~r"^HTTP/1.1 414 URI Too Long\r\n"
      assert answer =~ "\r\nConnection: close\r\n"
      assert answer =~ "uri_too_long"
      assert state == :closed
    end

    test "more than 100 headers is a 431 and the connection closes" do
      headers = for i <- 1..101, do: "X-H#{i}: v"
      {answer, state} = exchange(head(["GET / HTTP/1.1" | headers]))
      assert answer =~ ~r"^HTTP/1.1 431 Request Header Fields Too Large\r\n"
      assert answer =~ "request_header_fields_too_large"
      assert state == :closed

      # 100 are served.
      {answer, _} = exchange(head(["GET /no-such-page HTTP/1.1" | Enum.take(headers, 99)]))

      assert answer =~ ~r"^HTTP/1.1 404 "
    end

    test "a head over 64 KiB is a 431, even as one header line that never ends" do
      long = String.duplicate("v", 40_000)

      {answer, state} = exchange("GET / HTTP/1.1\r\nX-A: #{long}\r\nX-B: #{long}\r\n\r\n")

      assert answer =~ ~r"^HTTP/1.1 431 "
      assert state == :closed

      # No line end ever comes: the answer does not wait for one.
      {answer, state} = exchange("GET / HTTP/1.1\r\nX-A: " <> String.duplicate("v", 70_000))
      assert answer =~ ~r"^HTTP/1.1 431 "
      assert state == :closed
    end

    test "whitespace after a header value is not part of it (a key followed by a tab is the key)" do
      envelope = HTTP.envelope()
      body = Observatory.JSON.encode!(envelope)

      request =
        head([
          "POST /api/v1/decision_logs HTTP/1.1",
          "Host: localhost",
          "Content-Type: application/json \t",
          "Authorization: Bearer #{HTTP.agent_key()} \t ",
          "Content-Length: #{byte_size(body)}"
        ]) <> body

      {answer, _state} = exchange(request, 1_000)
      assert answer =~ ~r"^HTTP/1.1 200 "
    end
  end

  describe "issue 24: one reading of Content-Length" do
    test "a padded Content-Length (\" 12 \") on an unread body: skipped by its length, the connection kept" do
      socket = connect()

      request =
        "POST /no-such-page HTTP/1.1\r\nHost: localhost\r\nContent-Length:  12 \r\n\r\n" <>
          "GET /x HTTP/"

      :ok = :gen_tcp.send(socket, request <> @get_404)
      {first, _, more} = read_answer(socket)
      {second, _, rest} = read_answer(socket, more)
      assert first =~ ~r"^http/1.1 404 " and second =~ ~r"^http/1.1 404 "
      refute first =~ "connection: close"
      assert rest == ""
      :gen_tcp.close(socket)
    end

    test "a padded Content-Length on a body a handler reads: read by its length, answered 200" do
      envelope = HTTP.envelope()
      body = Observatory.JSON.encode!(envelope)
      socket = connect()
      :ok = :gen_tcp.send(socket, post_head(["Content-Length:   #{byte_size(body)}\t "]) <> body)
      {answer, answer_body, ""} = read_answer(socket)
      assert answer =~ ~r"^http/1.1 200 "
      assert answer_body =~ envelope["meta"]["step_id"]
      :gen_tcp.close(socket)
    end

    test "an invalid Content-Length (12x, +12, two values) is a 400 and the connection closes" do
      for value <- ["12x", "+12", "12, 12", "1 2"] do
        {answer, state} =
          exchange(
            "POST /no-such-page HTTP/1.1\r\nHost: localhost\r\nContent-Length: #{value}\r\n\r\n" <>
              String.duplicate("x", 12)
          )

        assert answer =~ ~r"^HTTP/1.1 400 ", value
        assert answer =~ "Content-Length must be a decimal number", value
        assert state == :closed, value
      end
    end

    test "ObservatoryWeb.Conn.parse_content_length/1: digits with optional whitespace, else :invalid" do
      assert ObservatoryWeb.Conn.parse_content_length("12") == 12
      assert ObservatoryWeb.Conn.parse_content_length(" 12 ") == 12
      assert ObservatoryWeb.Conn.parse_content_length("\t0") == 0

      for bad <- ["", " ", "12x", "+12", "-1", "0x10", "1 2", "12, 12", String.duplicate("9", 20)] do
        assert ObservatoryWeb.Conn.parse_content_length(bad) == :invalid, inspect(bad)
      end
    end
  end

  describe "issue 24: the answer's head is written by the adapter" do
    defp head_only(socket, acc \\ "") do
      case String.split(acc, "\r\n\r\n", parts: 2) do
        [head, rest] ->
          {String.downcase(head), rest}

        [_] ->
          {:ok, data} = :gen_tcp.recv(socket, 0, 3_000)
          head_only(socket, acc <> data)
      end
    end

    test "status line, the handler's headers, Content-Length and Date; kept alive" do
      socket = connect()
      :ok = :gen_tcp.send(socket, @get_404)
      {head, body, ""} = read_answer(socket)
      [status | lines] = String.split(head, "\r\n")
      assert status == "http/1.1 404 not found"
      assert "content-type: application/json" in lines
      assert "x-content-type-options: nosniff" in lines
      assert "content-length: #{byte_size(body)}" in lines
      assert Enum.any?(lines, &(&1 =~ ~r"^date: \w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d gmt$"))
      refute Enum.any?(lines, &String.starts_with?(&1, "connection:"))
      :gen_tcp.close(socket)
    end

    test "Connection: close, as one option among others, closes after an answer that says so" do
      {answer, state} =
        exchange("GET /no-such-page HTTP/1.1\r\nHost: localhost\r\nConnection: TE, Close\r\n\r\n")

      assert answer =~ ~r"^HTTP/1.1 404 "
      assert answer =~ "\r\nConnection: close\r\n"
      assert state == :closed
    end

    test "HTTP/1.0: answered in 1.0, closed unless the client asks for keep-alive" do
      {answer, state} = exchange("GET /no-such-page HTTP/1.0\r\n\r\n")
      assert answer =~ ~r"^HTTP/1.0 404 "
      assert answer =~ "\r\nConnection: close\r\n"
      assert state == :closed

      socket = connect()
      :ok = :gen_tcp.send(socket, "GET /no-such-page HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
      {head, _body, ""} = read_answer(socket)
      assert head =~ ~r"^http/1.0 404 "
      refute head =~ "connection: close"
      :ok = :gen_tcp.send(socket, @get_404)
      {head, _body, ""} = read_answer(socket)
      assert head =~ ~r"^http/1.1 404 "
      :gen_tcp.close(socket)
    end

    test "a chunked answer (MochiWeb writes its head) announces the close the adapter makes" do
      {:ok, listen} = :gen_tcp.listen(0, [:binary, active: false])
      {:ok, port} = :inet.port(listen)
      {:ok, client} = :gen_tcp.connect(~c"127.0.0.1", port, [:binary, active: false])
      {:ok, server} = :gen_tcp.accept(listen)
      line = {:GET, {:abs_path, ~c"/events"}, {1, 1}}

      for {connection, closes?} <- [{"TE, close", true}, {"keep-alive", false}] do
        adapter = ObservatoryWeb.Conn.MochiWeb
        req = adapter.new_request(server, [], line, [{:Connection, connection}])
        assert adapter.should_close?(req) == closes?
        resp = adapter.send_chunked(req, 200, [{"Content-Type", "text/plain"}])
        :ok = adapter.end_chunked(resp)
        {head, rest} = head_only(client)
        assert head =~ "transfer-encoding: chunked"
        assert String.contains?(head, "connection: close") == closes?, connection
        # The last chunk, read off before the next answer.
        assert last_chunk(client, rest) == "0\r\n\r\n"
      end

      Enum.each([client, server, listen], &:gen_tcp.close/1)
    end

    defp last_chunk(socket, acc) do
      if String.ends_with?(acc, "\r\n\r\n") do
        acc
      else
        {:ok, data} = :gen_tcp.recv(socket, 0, 1_000)
        last_chunk(socket, acc <> data)
      end
    end

    test "HEAD: the head with the body's Content-Length, no body" do
      socket = connect()
      :ok = :gen_tcp.send(socket, "HEAD /no-such-page HTTP/1.1\r\nHost: localhost\r\n\r\n")
      {head, rest} = head_only(socket)
      assert [_, length] = Regex.run(~r/content-length: (\d+)/, head)
      assert String.to_integer(length) > 0
      # The next answer starts right after the head: no body came between.
      :ok = :gen_tcp.send(socket, @get_404)
      {next, _body, ""} = read_answer(socket, rest)
      assert next =~ ~r"^http/1.1 404 "
      :gen_tcp.close(socket)
    end
  end

  describe "finding 4: error answers and logs are capped" do
    test "1 MiB of bad NDJSON lines gives a small answer and a small log" do
      body = String.duplicate("x\n", div(1024 * 1024, 2))
      lines = div(byte_size(body), 2)

      {resp, log} =
        with_log([level: :warning], fn ->
          HTTP.post("/api/v1/decision_logs", body, content_type: "application/x-ndjson")
        end)

      assert resp.status == 422
      assert %{"accepted" => 0, "rejected" => ^lines, "omitted" => omitted} = resp.body
      assert omitted == lines - 20
      assert length(resp.body["results"]) == 20

      assert [%{"line" => 1, "accepted" => false, "violation_count" => 1} | _] =
               resp.body["results"]

      answer_bytes = byte_size(Observatory.JSON.encode!(resp.body))
      assert answer_bytes < 16 * 1024, "answer of #{answer_bytes} bytes"
      assert byte_size(log) < 4 * 1024, "log of #{byte_size(log)} bytes"
      assert log =~ "#{lines} of #{lines} batch lines rejected"
    end

    test "a batch still answers every accepted line, with the rejected ones capped" do
      sid = unique_session("sess-batch-cap")
      good = Observatory.JSON.encode!(HTTP.envelope(%{"meta" => %{"session_id" => sid}}))
      body = Enum.join([good | List.duplicate("{}", 30)] ++ [good], "\n")

      resp = HTTP.post("/api/v1/decision_logs", body, content_type: "application/x-ndjson")
      assert resp.status == 200
      assert %{"accepted" => 2, "rejected" => 30, "omitted" => 10} = resp.body
      lines = Enum.map(resp.body["results"], & &1["line"])
      assert lines == Enum.to_list(1..21) ++ [32]
    end

    test "one envelope's answer lists at most 20 violations and counts them all" do
      resp = HTTP.post("/api/v1/decision_logs", "{}", [])
      assert resp.status == 422
      assert resp.body["violation_count"] == length(resp.body["violations"])
      assert resp.body["violation_count"] <= 20
    end
  end
end
