defmodule ObservatoryWeb.DashboardTest do
  # The dashboard over real sockets: sign-in, CSRF, the guards on every page and
  # action, and the Server-Sent Events stream that hosts the Session Cluster Manager.
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.HITL
  alias Observatory.Test.DashboardClient, as: Client
  alias Observatory.Test.HTTP
  alias ObservatoryWeb.Dashboard.{Assets, EventStream, Session}

  @hostile "<img src=x onerror=alert(1)>"

  defp loop_over_http(sid, steps \\ 5) do
    for _ <- 1..steps do
      msg = HTTP.envelope(%{"meta" => %{"session_id" => sid, "agent_id" => "agent-web"}})

      assert HTTP.post_json("/api/v1/decision_logs", msg, headers: HTTP.agent_headers("agent-web")).status ==
               200
    end
  end

  defp post_event(auth, page_id, event, params, opts \\ []) do
    body = Observatory.JSON.encode!(%{page_id: page_id, event: event, params: params})

    Client.request(:post, "/dashboard/events",
      cookie: Keyword.get(opts, :cookie, auth.cookie),
      type: "application/json",
      headers: [{"x-csrf-token", Keyword.get(opts, :csrf, auth.csrf)}],
      body: body
    )
  end

  defp mount_event(stream) do
    {{:event, "mount", %{"page_id" => page_id, "html" => html}}, stream} =
      Client.next_event(stream)

    {page_id, html, stream}
  end

  defp unpause(sid), do: if(HITL.paused?(sid), do: HITL.resume(sid, operator: "test"))

  describe "sign-in" do
    test "GET / without a sign-in redirects to /login" do
      resp = Client.request(:get, "/")
      assert resp.status == 303
      assert Client.header(resp, "location") == "/login"
    end

    test "the login form carries a CSRF token matching its cookie, under a strict CSP" do
      resp = Client.request(:get, "/login")
      assert resp.status == 200
      "observatory_login_csrf=" <> token = Client.cookie(resp, "observatory_login_csrf")
      assert resp.body =~ ~s(name="_csrf_token" value="#{token}")
      assert resp.body =~ ~s(type="password")
      csp = Client.header(resp, "content-security-policy")
      assert csp =~ "script-src 'self'"
      refute csp =~ "unsafe-inline"
      assert Client.header(resp, "x-frame-options") == "DENY"
    end

    test "a good token and CSRF token sign in with an HttpOnly, SameSite=Strict signed cookie" do
      form = Client.request(:get, "/login")
      cookie = Client.cookie(form, "observatory_login_csrf")
      "observatory_login_csrf=" <> csrf = cookie

      resp =
        Client.post_form("/login", %{"_csrf_token" => csrf, "token" => HTTP.operator_token()},
          cookie: cookie
        )

      assert resp.status == 303
      assert Client.header(resp, "location") == "/"

      [set] = for c <- Client.set_cookies(resp), c =~ "observatory_session=", do: c
      assert set =~ "HttpOnly"
      assert set =~ "SameSite=Strict"
      assert set =~ "Path=/"
      refute set =~ HTTP.operator_token(), "the token itself is never stored"

      page = Client.request(:get, "/", cookie: Client.cookie(resp, "observatory_session"))
      assert page.status == 200

      assert page.body =~
               ~s(<span class="operator" title="signed-in operator">test-operator</span>)

      assert page.body =~ ~s(<meta name="csrf-token")
      assert page.body =~ ~s(id="alerts-panel")
      # Issue 18: the header says which signal raises the alerts.
      assert page.body =~
               ~s(<span id="alert-source" class="alert-source" data-source="entropy")

      assert page.body =~ "Alerts from <strong>entropy ratio</strong>"
      assert page.body =~ ~s(<script src="/assets/#{Assets.path("dashboard.js")}" defer></script>)
    end

    test "a missing or wrong CSRF token is a 403, a wrong operator token a 401" do
      form = Client.request(:get, "/login")
      cookie = Client.cookie(form, "observatory_login_csrf")
      "observatory_login_csrf=" <> csrf = cookie
      good = HTTP.operator_token()

      assert Client.post_form("/login", %{"token" => good}, cookie: cookie).status == 403

      assert Client.post_form("/login", %{"_csrf_token" => "forged", "token" => good},
               cookie: cookie
             ).status == 403

      assert Client.post_form("/login", %{"_csrf_token" => csrf, "token" => good}).status == 403

      wrong =
        Client.post_form("/login", %{"_csrf_token" => csrf, "token" => "nope"}, cookie: cookie)

      assert wrong.status == 401
      assert wrong.body =~ "That token is not an operator token."
      assert Client.cookie(wrong, "observatory_session") == nil

      agent_key =
        Client.post_form("/login", %{"_csrf_token" => csrf, "token" => HTTP.agent_key()},
          cookie: cookie
        )

      assert agent_key.status == 401, "an agent key is not an operator token"
    end

    test "a tampered, expired or revoked session cookie is no sign-in" do
      auth = Client.sign_in()
      "observatory_session=" <> value = auth.cookie
      [payload, mac] = String.split(value, ".")

      forged_payload =
        Observatory.JSON.encode!(%{"op" => "mallory", "csrf" => "x", "exp" => 9_999_999_999})
        |> Base.url_encode64(padding: false)

      for bad <- [
            "observatory_session=#{forged_payload}.#{mac}",
            "observatory_session=#{payload}.#{String.reverse(mac)}",
            "observatory_session=#{payload}",
            "observatory_session=garbage"
          ] do
        assert Client.request(:get, "/", cookie: bad).status == 303, bad
      end

      expired = %{Session.new("test-operator") | expires: System.system_time(:second) - 1}
      cookie = "observatory_session=" <> Session.sign(expired)
      assert Client.request(:get, "/", cookie: cookie).status == 303

      revoked = "observatory_session=" <> Session.sign(Session.new("former-operator"))
      assert Client.request(:get, "/", cookie: revoked).status == 303
    end

    test "sign-out needs the CSRF token and clears the cookie" do
      auth = Client.sign_in()

      assert Client.post_form("/logout", %{}, cookie: auth.cookie).status == 403
      resp = Client.post_form("/logout", %{"_csrf_token" => auth.csrf}, cookie: auth.cookie)
      assert resp.status == 303
      assert Client.header(resp, "location") == "/login"
      assert Client.cookie(resp, "observatory_session") == "observatory_session="
    end
  end

  describe "every action is guarded" do
    test "the event stream and the event endpoint are 401 without a sign-in" do
      assert Client.request(:get, "/dashboard/events").status == 401

      resp =
        Client.request(:post, "/dashboard/events",
          type: "application/json",
          body: ~s({"page_id": "x", "event": "pause_inspect", "params": {}})
        )

      assert resp.status == 401
    end

    test "a POST with a missing or wrong CSRF token is a 403 and pauses nothing" do
      auth = Client.sign_in()
      sid = unique_session("sess-csrf")
      stream = Client.open_stream(auth.cookie)
      {page_id, _html, _stream} = mount_event(stream)

      assert post_event(auth, page_id, "pause_inspect", %{session_id: sid}, csrf: "").status ==
               403

      other = Client.sign_in()

      assert post_event(auth, page_id, "pause_inspect", %{session_id: sid}, csrf: other.csrf).status ==
               403

      refute HITL.paused?(sid)
      Client.close_stream(stream)
    end

    test "malformed requests, unknown events and unknown pages are refused" do
      auth = Client.sign_in()
      stream = Client.open_stream(auth.cookie)
      {page_id, _html, _} = mount_event(stream)

      assert post_event(auth, page_id, "drop_tables", %{}).status == 400
      assert post_event(auth, "no-such-page", "close_inspect", %{}).status == 404

      bad_json =
        Client.request(:post, "/dashboard/events",
          cookie: auth.cookie,
          type: "application/json",
          headers: [{"x-csrf-token", auth.csrf}],
          body: "[1,2]"
        )

      assert bad_json.status == 400
      Client.close_stream(stream)
    end

    test "assets are served, unknown ones are 404" do
      js = Client.request(:get, "/assets/dashboard.js")
      assert js.status == 200
      assert Client.header(js, "content-type") =~ "javascript"
      assert js.body =~ "EventSource"
      assert Client.request(:get, "/assets/manager.css").body =~ ".scm"
      assert Client.request(:get, "/assets/nope.js").status == 404
    end

    test "pages link assets by a digest of their content, cached for good; plain names are revalidated" do
      digested = Client.request(:get, "/assets/" <> Assets.path("manager.css"))
      assert digested.status == 200
      assert Client.header(digested, "cache-control") == "public, max-age=31536000, immutable"
      assert digested.body == Assets.css()

      assert Client.header(Client.request(:get, "/assets/manager.css"), "cache-control") ==
               "no-cache"

      # A digest that is not the content's is no file.
      assert Client.request(:get, "/assets/manager-0000000000.css").status == 404
    end
  end

  describe "the event stream (Server-Sent Events)" do
    test "a broadcast reaches an open page within 1 s, without a reload" do
      auth = Client.sign_in()
      stream = Client.open_stream(auth.cookie)
      assert stream.head =~ "HTTP/1.1 200"
      assert stream.head =~ "text/event-stream"
      {page_id, html, stream} = mount_event(stream)

      assert [{_pid, {"test-operator", ObservatoryWeb.SessionClusterManager}}] =
               Registry.lookup(EventStream.registry(), page_id)

      assert html =~ ~s(id="alerts-panel")

      sid = unique_session("sess-sse")
      started = System.monotonic_time(:millisecond)
      loop_over_http(sid)

      {{:event, "render", %{"html" => html}}, stream} =
        Client.await_event(
          stream,
          fn
            {:event, "render", %{"html" => h}} ->
              h =~ ~s(class="alert-row" data-session-id="#{sid}")

            _ ->
              false
          end,
          1_000
        )

      assert System.monotonic_time(:millisecond) - started < 1_000
      assert html =~ "agent-web"
      Client.close_stream(stream)
    end

    test "Pause and Inspect over the event endpoint pauses the session and pushes the panel" do
      auth = Client.sign_in()
      sid = unique_session("sess-click")
      on_exit(fn -> unpause(sid) end)
      stream = Client.open_stream(auth.cookie)
      {page_id, _html, stream} = mount_event(stream)
      loop_over_http(sid, 7)

      {_, stream} =
        Client.await_event(stream, fn
          {:event, "render", %{"html" => h}} -> h =~ ~s(data-session-id="#{sid}" data-alerts="3")
          _ -> false
        end)

      resp = post_event(auth, page_id, "pause_inspect", %{session_id: sid})
      assert resp.status == 204
      assert HITL.paused?(sid)

      assert %{"paused" => true} =
               HTTP.get("/api/v1/sessions/#{sid}", HTTP.operator_headers()).body

      assert [%{operator: "test-operator", action: :pause}] = HITL.audit_log(session_id: sid)

      {{:event, "render", %{"html" => html}}, stream} =
        Client.await_event(stream, fn
          {:event, "render", %{"html" => h}} -> h =~ ~s(data-paused="true")
          _ -> false
        end)

      assert html =~ ~s(class="node state-paused" data-session-id="#{sid}")
      assert html =~ ">Resume</button>"
      assert length(Regex.scan(~r/class="alert-row"/, html)) >= 1
      assert length(Regex.scan(~r/data-session-id="#{sid}" data-alerts/, html)) == 1

      assert post_event(auth, page_id, "resume", %{session_id: sid}).status == 204
      refute HITL.paused?(sid)
      Client.close_stream(stream)
    end

    test "a form-encoded event with the CSRF token in a field works too" do
      auth = Client.sign_in()
      sid = unique_session("sess-form")
      on_exit(fn -> unpause(sid) end)
      stream = Client.open_stream(auth.cookie)
      {page_id, _html, _} = mount_event(stream)

      resp =
        Client.post_form(
          "/dashboard/events",
          %{
            "page_id" => page_id,
            "event" => "pause_inspect",
            "session_id" => sid,
            "_csrf_token" => auth.csrf
          },
          cookie: auth.cookie
        )

      assert resp.status == 204
      assert HITL.paused?(sid)
      Client.close_stream(stream)
    end

    test "a hostile session id arrives escaped in the pushed HTML" do
      auth = Client.sign_in()
      sid = @hostile <> unique_session("")
      stream = Client.open_stream(auth.cookie)
      {_page_id, _html, stream} = mount_event(stream)
      loop_over_http(sid)

      {{:event, "render", %{"html" => html}}, stream} =
        Client.await_event(stream, fn
          {:event, "render", %{"html" => h}} -> h =~ "alert-row"
          _ -> false
        end)

      assert html =~ ~s[data-session-id="&lt;img src=x onerror=alert(1)&gt;]
      refute html =~ "<img"
      Client.close_stream(stream)
    end

    test "sends a heartbeat, and the page process ends when the browser goes away" do
      Application.put_env(:observatory, :dashboard_heartbeat_ms, 50)
      on_exit(fn -> Application.delete_env(:observatory, :dashboard_heartbeat_ms) end)
      auth = Client.sign_in()
      stream = Client.open_stream(auth.cookie)
      {page_id, _html, stream} = mount_event(stream)
      [{pid, _}] = Registry.lookup(EventStream.registry(), page_id)
      ref = Process.monitor(pid)

      {{:comment, "heartbeat"}, _stream} = Client.await_event(stream, &match?({:comment, _}, &1))

      Client.close_stream(stream)
      assert_receive {:DOWN, ^ref, :process, ^pid, :normal}, 1_000
      assert post_event(auth, page_id, "close_inspect", %{}).status == 404
    end
  end
end
