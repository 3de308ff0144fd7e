defmodule ObservatoryWeb.SignInSecurityTest do
  # Issue 13, findings 13 and 14: sign-out revokes the dashboard session on the server,
  # and credential guessing is throttled per client.
  use Observatory.TrackerCase, async: false

  alias Observatory.Test.DashboardClient, as: Client
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

  # Reads until the server closes the stream (heartbeats may still be in flight).
  defp ended?(stream, tries \\ 20) do
    case Client.next_event(stream, 1_000) do
      {{:error, :closed}, _} -> true
      {{:comment, _}, stream} when tries > 0 -> ended?(stream, tries - 1)
      _ -> false
    end
  end
end
