defmodule ObservatoryWeb.SignInSecurityTest do
  # Issue 13, findings 13 and 14: sign-out revokes the dashboard session on the server,
  # and credential guessing is throttled per client.
  use Observatory.TrackerCase, async: false

  alias Observatory.Test.DashboardClient, as: Client
  alias Observatory.Test.HTTP
  alias ObservatoryWeb.AuthThrottle
  alias ObservatoryWeb.Dashboard.Session

  describe "finding 13: sign-out revokes the dashboard session server-side" do
    test "a cookie copied before sign-out no longer signs in" do
      auth = Client.sign_in()
      copy = auth.cookie
      assert Client.request(:get, "/", cookie: copy).status == 200

      resp = Client.post_form("/logout", %{"_csrf_token" => auth.csrf}, cookie: auth.cookie)
      assert resp.status == 303

      page = Client.request(:get, "/", cookie: copy)
      assert page.status == 303
      assert Client.header(page, "location") == "/login"
      assert Client.request(:get, "/dashboard/events", cookie: copy).status == 401

      # Another sign-in of the same operator is a session of its own.
      assert Client.request(:get, "/", cookie: Client.sign_in().cookie).status == 200
    end

    test "an event stream opened before sign-out ends at its next heartbeat" do
      restore_env_on_exit([:dashboard_heartbeat_ms])
      Application.put_env(:observatory, :dashboard_heartbeat_ms, 100)
      auth = Client.sign_in()
      stream = Client.open_stream(auth.cookie)
      {{:event, "mount", _}, stream} = Client.next_event(stream)
      assert {{:comment, "heartbeat"}, stream} = Client.next_event(stream, 1_000)

      assert Client.post_form("/logout", %{"_csrf_token" => auth.csrf}, cookie: auth.cookie).status ==
               303

      assert ended?(stream)
    end

    test "a revocation is durable and expired ones are dropped at the next sign-out" do
      table = Session.revocations_table()
      old = %{Session.new("test-operator") | expires: System.system_time(:second) - 10}
      :ok = Session.revoke(old)
      assert :mnesia.dirty_read(table, old.sid) != []
      assert :mnesia.table_info(table, :storage_type) == :disc_copies

      current = Session.new("test-operator")
      :ok = Session.revoke(current)
      assert :mnesia.dirty_read(table, old.sid) == []
      refute Session.valid?(current)
    end
  end

  describe "finding 14: sign-in attempts are throttled per client" do
    setup do
      restore_env_on_exit([:auth_throttle])

      Application.put_env(:observatory, :auth_throttle,
        max_failures: 5,
        window_s: 60,
        lockout_s: 30,
        max_clients: 100
      )

      AuthThrottle.reset()
      on_exit(&AuthThrottle.reset/0)
    end

    test "after 5 distinct wrong operator tokens the API answers 429 with Retry-After to wrong ones" do
      for n <- 1..5,
          do:
            assert(
              HTTP.get("/api/v1/agents", [{"authorization", "Bearer guess-#{n}"}]).status == 401
            )

      locked = HTTP.get("/api/v1/agents", [{"authorization", "Bearer guess-6"}])
      assert locked.status == 429
      assert locked.body["error"] == "too_many_attempts"
      assert String.to_integer(locked.headers["retry-after"]) in 1..30

      # Valid credentials are still accepted (hardening round 2, finding 3).
      assert HTTP.get("/api/v1/agents", HTTP.operator_headers()).status == 200
      assert HTTP.post_json("/api/v1/decision_logs", HTTP.envelope()).status == 200
      # Requests without a credential are not guesses: health stays open.
      assert HTTP.get("/healthz").status == 200
    end

    test "a stale key retried does not lock out the other agents on the same address" do
      Application.put_env(:observatory, :auth_throttle,
        max_failures: 3,
        window_s: 60,
        lockout_s: 30
      )

      stale = [headers: [{"authorization", "Bearer stale-key-before-rotation"}]]

      # One agent keeps its old key after a rotation: every retry is a 401, none a 429.
      for _ <- 1..20,
          do:
            assert(HTTP.post_json("/api/v1/decision_logs", HTTP.envelope(), stale).status == 401)

      # Every agent and the operator on 127.0.0.1 are the same client, and are still served.
      assert HTTP.post_json("/api/v1/decision_logs", HTTP.envelope()).status == 200
      assert HTTP.get("/api/v1/agents", HTTP.operator_headers()).status == 200
      assert AuthThrottle.check("127.0.0.1") == :ok
    end

    test "guessing distinct tokens is throttled" do
      Application.put_env(:observatory, :auth_throttle,
        max_failures: 3,
        window_s: 60,
        lockout_s: 30
      )

      stale = [headers: [{"authorization", "Bearer stale-key-before-rotation"}]]
      guess = fn n -> [{"authorization", "Bearer guess-#{n}"}] end

      # A stale key retried counts once, between the guesses as before them.
      for _ <- 1..5, do: HTTP.post_json("/api/v1/decision_logs", HTTP.envelope(), stale)
      assert HTTP.get("/api/v1/agents", guess.(1)).status == 401
      for _ <- 1..5, do: HTTP.post_json("/api/v1/decision_logs", HTTP.envelope(), stale)
      assert HTTP.get("/api/v1/agents", guess.(2)).status == 401

      # The third distinct wrong credential locks the client out, for wrong credentials.
      assert HTTP.get("/api/v1/agents", guess.(3)).status == 429
      assert HTTP.get("/api/v1/agents", guess.(4)).status == 429
      assert HTTP.post_json("/api/v1/decision_logs", HTTP.envelope(), stale).status == 429
      assert HTTP.get("/api/v1/agents", HTTP.operator_headers()).status == 200
      assert HTTP.post_json("/api/v1/decision_logs", HTTP.envelope()).status == 200
    end

    test "a client's failed credentials are kept bounded: at most max_failures + 1 digests" do
      for n <- 1..1_000, do: AuthThrottle.failure("192.0.2.9", "guess-#{n}")
      assert [{"192.0.2.9", digests, _, _}] = :ets.lookup(AuthThrottle, "192.0.2.9")
      assert length(digests) == 6
      assert {:error, _} = AuthThrottle.check("192.0.2.9")
    end

    test "concurrent distinct guesses are each counted" do
      Application.put_env(:observatory, :auth_throttle,
        max_failures: 50,
        window_s: 60,
        lockout_s: 30
      )

      1..49
      |> Task.async_stream(&AuthThrottle.failure("192.0.2.10", "guess-#{&1}"), max_concurrency: 8)
      |> Stream.run()

      assert AuthThrottle.check("192.0.2.10") == :ok
      AuthThrottle.failure("192.0.2.10", "guess-50")
      assert {:error, _} = AuthThrottle.check("192.0.2.10")
    end

    test "the sign-in form is throttled too, with a clear page and Retry-After" do
      form = Client.request(:get, "/login")
      login_cookie = Client.cookie(form, "observatory_login_csrf")
      "observatory_login_csrf=" <> csrf = login_cookie

      attempt = fn token ->
        Client.post_form("/login", %{"_csrf_token" => csrf, "token" => token},
          cookie: login_cookie
        )
      end

      for n <- 1..5, do: assert(attempt.("guess-#{n}").status == 401)

      locked = attempt.("guess-6")
      assert locked.status == 429
      assert locked.body =~ "Too many failed sign-ins from this address"
      assert Client.header(locked, "retry-after") =~ ~r/^\d+$/
      assert Client.cookie(locked, "observatory_session") == nil

      # The right token still signs in (hardening round 2, finding 3).
      signed_in = attempt.(HTTP.operator_token())
      assert signed_in.status == 303
      assert Client.cookie(signed_in, "observatory_session") != nil
    end

    test "X-Forwarded-For does not make a new client" do
      for n <- 1..5 do
        headers = [{"authorization", "Bearer guess-#{n}"}, {"x-forwarded-for", "10.0.0.#{n}"}]
        assert HTTP.get("/api/v1/agents", headers).status == 401
      end

      assert HTTP.get("/api/v1/agents", [
               {"x-forwarded-for", "10.9.9.9"},
               {"authorization", "Bearer guess-6"}
             ]).status ==
               429
    end

    test "a lockout ends; the failures of a window are forgotten after it" do
      Application.put_env(:observatory, :auth_throttle, max_failures: 2, window_s: 1, lockout_s: 1)

      for n <- 1..2, do: AuthThrottle.failure("192.0.2.1", "guess-#{n}")
      assert {:error, 1} = AuthThrottle.check("192.0.2.1")
      assert AuthThrottle.check("192.0.2.2") == :ok
      Process.sleep(1_100)
      assert AuthThrottle.check("192.0.2.1") == :ok
      AuthThrottle.sweep()
      assert AuthThrottle.size() == 0
    end

    test "an IPv6 client is its /64: new addresses in it are no new client" do
      for n <- 1..5, do: AuthThrottle.failure("2001:db8:1:2::#{n}", "guess-#{n}")
      assert {:error, _} = AuthThrottle.check("2001:db8:1:2:ffff::9")
      assert AuthThrottle.check("2001:db8:1:3::1") == :ok
      # An IPv4-mapped address is its IPv4 address.
      for n <- 1..5, do: AuthThrottle.failure("::ffff:192.0.2.77", "guess-#{n}")
      assert {:error, _} = AuthThrottle.check("192.0.2.77")
    end
  end

  describe "hardening round 2, finding 2: a flood of addresses locks nobody else out" do
    setup do
      restore_env_on_exit([:auth_throttle])

      Application.put_env(:observatory, :auth_throttle,
        max_failures: 10,
        window_s: 60,
        lockout_s: 60,
        max_clients: 100
      )

      AuthThrottle.reset()
      on_exit(&AuthThrottle.reset/0)
    end

    test "one wrong key from each of 1,000 addresses, then 11 from one more: clients that never failed are served" do
      for n <- 1..1_000,
          do: AuthThrottle.failure("198.51.#{div(n, 256)}.#{rem(n, 256)}", "k-#{n}")

      for n <- 1..11, do: AuthThrottle.failure("203.0.113.200", "guess-#{n}")

      # Memory is bounded by evicting, not by pooling newcomers into one entry.
      assert AuthThrottle.size() <= 100
      assert {:error, _} = AuthThrottle.check("203.0.113.200")
      assert AuthThrottle.check("203.0.113.7") == :ok
      assert AuthThrottle.check("127.0.0.1") == :ok

      # Loopback agents and operators, and a newcomer's wrong key, are answered as usual.
      assert HTTP.post_json("/api/v1/decision_logs", HTTP.envelope()).status == 200
      assert HTTP.get("/api/v1/agents", HTTP.operator_headers()).status == 200
      assert HTTP.get("/api/v1/agents", [{"authorization", "Bearer wrong"}]).status == 401
    end
  end

  describe "hardening round 2, finding 3: others' failures never lock out a valid credential" do
    setup do
      restore_env_on_exit([:auth_throttle])

      Application.put_env(:observatory, :auth_throttle,
        max_failures: 10,
        window_s: 60,
        lockout_s: 60,
        max_clients: 100
      )

      AuthThrottle.reset()
      on_exit(&AuthThrottle.reset/0)
    end

    test "after 10 random keys from an address, its valid agent keys and operator token still work" do
      for n <- 1..10 do
        HTTP.post_json("/api/v1/decision_logs", HTTP.envelope(),
          headers: [{"authorization", "Bearer random-#{n}"}]
        )
      end

      assert {:error, _} = AuthThrottle.check("127.0.0.1")
      assert HTTP.post_json("/api/v1/decision_logs", HTTP.envelope()).status == 200

      own =
        HTTP.envelope(%{
          "meta" => %{
            "agent_id" => "agent-r2-3",
            "session_id" => "sess-r2-3-#{System.unique_integer()}"
          }
        })

      assert HTTP.post_json("/api/v1/decision_logs", own,
               headers: HTTP.agent_headers("agent-r2-3")
             ).status ==
               200

      assert HTTP.get("/api/v1/agents", HTTP.operator_headers()).status == 200
      # The wrong ones get 429 with Retry-After.
      wrong = HTTP.get("/api/v1/agents", [{"authorization", "Bearer random-11"}])
      assert wrong.status == 429
      assert wrong.headers["retry-after"] =~ ~r/^\d+$/
    end

    test "ten agents using their own valid keys on an operator route do not lock their address" do
      for n <- 1..10 do
        headers = HTTP.agent_headers("agent-r2-op-#{n}")
        assert HTTP.get("/api/v1/agents", headers).status == 401
      end

      assert AuthThrottle.check("127.0.0.1") == :ok
      assert AuthThrottle.size() == 0
      assert HTTP.get("/api/v1/agents", [{"authorization", "Bearer wrong"}]).status == 401
    end
  end

  # Reads until the server closes the stream (heartbeats may still be in flight).
  defp ended?(stream, tries \\ 20) do
    case Client.next_event(stream, 1_000) do
      {{:error, :closed}, _} -> true
      {{:comment, _}, stream} when tries > 0 -> ended?(stream, tries - 1)
      _ -> false
    end
  end
end
