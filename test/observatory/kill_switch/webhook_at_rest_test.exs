defmodule Observatory.KillSwitch.WebhookAtRestTest do
  # Changes :secret_key_base and writes raw Mnesia records: not async.
  use Observatory.TrackerCase, async: false

  alias Observatory.{AtRest, DataDirLock, KillSwitch}
  alias Observatory.KillSwitch.{Agents, WebhookURL}
  alias Observatory.Test.HTTP

  doctest Observatory.KillSwitch.WebhookURL

  setup do
    restore_env_on_exit([:secret_key_base])
    n = System.unique_integer([:positive])
    secret = "hook-secret-#{n}-Xk4q"

    %{
      agent: "hooked-#{n}",
      url: "https://hooks.example.com/services/T00/B00/#{secret}",
      secret: secret
    }
  end

  defp put_settings(agent, settings) do
    headers =
      for {k, v} <- HTTP.operator_headers(), do: {String.to_charlist(k), String.to_charlist(v)}

    body = Observatory.JSON.encode!(settings)
    url = String.to_charlist(HTTP.url("/api/v1/agents/#{agent}/kill_switch"))

    {:ok, {{_, status, _}, _, resp}} =
      :httpc.request(:put, {url, headers, ~c"application/json", body}, [], body_format: :binary)

    {:ok, decoded} = Observatory.JSON.decode(resp)
    %{status: status, body: decoded}
  end

  defp files_holding(text) do
    for path <- Path.wildcard(Path.join(DataDirLock.dir(), "**/*")),
        File.regular?(path),
        File.read!(path) =~ text,
        do: path
  end

  describe "finding 8: webhook URLs are not stored in plain" do
    test "the agent's URL is stored sealed: no file of the data directory holds it",
         %{agent: agent, url: url, secret: secret} do
      {:ok, _} = KillSwitch.configure(agent, %{notification_webhook: url})
      :ok = :mnesia.sync_log()
      :dumped = :mnesia.dump_log()

      assert [{_, ^agent, stored}] = :mnesia.dirty_read(:observatory_agents, agent)
      assert AtRest.sealed?(stored.notification_webhook)
      assert files_holding(secret) == []
      # It still works: read back whole for delivery.
      assert Agents.get(agent).notification_webhook == url
    end

    test "the API, the events and the dashboard show it redacted, never whole",
         %{agent: agent, url: url, secret: secret} do
      resp = put_settings(agent, %{notification_webhook: url})

      assert resp.status == 200
      assert resp.body["notification_webhook"] == "https://hooks.example.com/…Xk4q"

      shown = HTTP.get("/api/v1/agents/#{agent}", HTTP.operator_headers())
      assert shown.body["notification_webhook"] == "https://hooks.example.com/…Xk4q"
      assert shown.body["notification_webhook_unreadable"] == false
      [event | _] = shown.body["events"]

      assert event["details"]["changes"]["notification_webhook"] ==
               "https://hooks.example.com/…Xk4q"

      refute inspect(shown.body) =~ secret
    end

    test "URLs an older release stored in plain are sealed at start, their events redacted",
         %{agent: agent, url: url, secret: secret} do
      {:ok, _} = KillSwitch.configure(agent, %{enabled: false})
      [{table, ^agent, stored}] = :mnesia.dirty_read(:observatory_agents, agent)
      key = {agent, 1, 1}

      event = %{
        id: "1-1",
        agent_id: agent,
        event_type: "settings_changed",
        at: DateTime.utc_now(),
        details: %{changes: %{notification_webhook: url}}
      }

      {:atomic, :ok} =
        :mnesia.transaction(fn ->
          :mnesia.write({table, agent, %{stored | notification_webhook: url}})
          :mnesia.write({:observatory_agent_events, key, event})
        end)

      :ok = Agents.setup()

      [{_, ^agent, resealed}] = :mnesia.dirty_read(:observatory_agents, agent)
      assert AtRest.sealed?(resealed.notification_webhook)
      assert Agents.get(agent).notification_webhook == url
      [{_, ^key, redacted}] = :mnesia.dirty_read(:observatory_agent_events, key)
      assert redacted.details.changes.notification_webhook == WebhookURL.redact(url)
      refute inspect(redacted) =~ secret
    end

    test "sealed under another secret_key_base, it reads as unreadable, never as garbage",
         %{agent: agent, url: url} do
      {:ok, _} = KillSwitch.configure(agent, %{notification_webhook: url})

      Application.put_env(:observatory, :secret_key_base, String.duplicate("another-secret-", 4))

      assert %{notification_webhook: nil, notification_webhook_unreadable: true} =
               Agents.get(agent)

      shown = HTTP.get("/api/v1/agents/#{agent}", HTTP.operator_headers())
      assert shown.body["notification_webhook"] == nil
      assert shown.body["notification_webhook_unreadable"] == true
    end

    test "without a configured secret_key_base the key is a 0600 file in the data directory" do
      Application.delete_env(:observatory, :secret_key_base)
      path = Path.join(DataDirLock.dir(), "at_rest.key")
      sealed = AtRest.seal("https://hooks.example.com/x", "aad")
      assert {:ok, "https://hooks.example.com/x"} = AtRest.unseal(sealed, "aad")
      assert {:error, :corrupt} = AtRest.unseal(sealed, "other aad")
      assert File.stat!(path).size == 32
      assert Bitwise.band(File.stat!(path).mode, 0o777) == 0o600
    end
  end
end
