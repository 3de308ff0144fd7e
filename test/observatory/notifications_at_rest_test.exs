defmodule Observatory.NotificationsAtRestTest do
  # A notification sink's secrets — a Slack webhook URL, a PagerDuty routing key, a
  # webhook's signing secret — are credentials: stored sealed (Observatory.AtRest),
  # shown back only redacted. Changes :secret_key_base and writes raw Mnesia records:
  # not async.
  use Observatory.TrackerCase, async: false
  @moduletag :capture_log

  alias Observatory.{AtRest, DataDirLock, JSON, Notifications}
  alias Observatory.Test.{HTTP, Upstream}

  @sinks :observatory_notification_sinks

  setup do
    restore_env_on_exit([:secret_key_base, :notifications])
    Application.put_env(:observatory, :notifications, sinks: [], backoff_ms: 5)
    n = System.unique_integer([:positive])
    names = for kind <- ~w(slack oncall audit), do: "#{kind}-#{n}"
    on_exit(fn -> for name <- names, do: Notifications.delete_sink(name) end)

    %{
      n: n,
      slack: "slack-#{n}",
      oncall: "oncall-#{n}",
      audit: "audit-#{n}",
      url_secret: "XXURLSECRET#{n}XX",
      routing_key: "R0UTINGKEY#{n}SECRET",
      hmac: "HMACSECRET#{n}"
    }
  end

  defp put_all(c) do
    {:ok, _} =
      Notifications.put_sink(c.slack, %{
        "type" => "slack",
        "url" => "https://hooks.slack.com/services/T000/B000/#{c.url_secret}"
      })

    {:ok, _} =
      Notifications.put_sink(c.oncall, %{"type" => "pagerduty", "routing_key" => c.routing_key})

    {:ok, _} =
      Notifications.put_sink(c.audit, %{
        "type" => "webhook",
        "url" => "https://audit.example.com/observatory",
        "secret" => c.hmac
      })
  end

  defp files_holding(text) do
    for path <- Path.wildcard(Path.join(DataDirLock.dir(), "**/*")),
        File.regular?(path),
        File.read!(path) =~ text,
        do: path
  end

  defp stored(name) do
    [{@sinks, ^name, stored}] = :mnesia.dirty_read(@sinks, name)
    stored
  end

  defp put_via_api(name, spec) do
    headers =
      for {k, v} <- HTTP.operator_headers(), do: {String.to_charlist(k), String.to_charlist(v)}

    url = String.to_charlist(HTTP.url("/api/v1/notifications/sinks/#{name}"))
    body = JSON.encode!(spec)

    {:ok, {{_, status, _}, _, resp}} =
      :httpc.request(:put, {url, headers, ~c"application/json", body}, [], body_format: :binary)

    {:ok, decoded} = JSON.decode(resp)
    %{status: status, body: decoded}
  end

  describe "notification sinks' secrets are sealed at rest" do
    test "no file of the data directory holds a sink's URL, routing key or signing secret",
         c do
      put_all(c)
      :ok = :mnesia.sync_log()
      :dumped = :mnesia.dump_log()

      assert AtRest.sealed?(stored(c.slack).url)
      assert AtRest.sealed?(stored(c.oncall).routing_key)
      assert AtRest.sealed?(stored(c.audit).secret)
      assert AtRest.sealed?(stored(c.audit).url)
      # Names, types and events stay readable: the list needs no key.
      assert stored(c.oncall).type == :pagerduty

      for secret <- [c.url_secret, c.routing_key, c.hmac],
          do: assert(files_holding(secret) == [], "#{secret} found in plain")

      # The dispatcher gets them whole.
      sinks = Map.new(Notifications.all_sinks(), fn {_, sink} -> {sink.name, sink} end)
      assert sinks[c.slack].url == "https://hooks.slack.com/services/T000/B000/#{c.url_secret}"
      assert sinks[c.oncall].routing_key == c.routing_key
      assert sinks[c.audit].secret == c.hmac
    end

    test "a sealed sink still delivers, signed with its opened secret", c do
      test = self()

      stub =
        Upstream.start(fn body, headers ->
          send(test, {:delivered, body, headers})
          {202, "application/json", "{}"}
        end)

      {:ok, _} =
        Notifications.put_sink(c.audit, %{
          "type" => "webhook",
          "url" => stub.url <> "/hook-#{c.url_secret}",
          "secret" => c.hmac
        })

      assert AtRest.sealed?(stored(c.audit).url)
      assert Notifications.test_sink(c.audit) == :ok
      assert_receive {:delivered, body, headers}
      signature = :crypto.mac(:hmac, :sha256, c.hmac, body) |> Base.encode16(case: :lower)
      assert headers["x-observatory-signature"] == "sha256=" <> signature
    end

    test "the API shows every secret redacted, never whole", c do
      url = "https://hooks.slack.com/services/T000/B000/#{c.url_secret}"
      put = put_via_api(c.slack, %{type: "slack", url: url})
      assert put.status == 200
      assert put.body["url"] == "https://hooks.slack.com/…" <> String.slice(url, -4, 4)
      assert put_via_api(c.oncall, %{type: "pagerduty", routing_key: c.routing_key}).status == 200

      listed = HTTP.get("/api/v1/notifications/sinks", HTTP.operator_headers())
      assert listed.status == 200
      by_name = Map.new(listed.body["sinks"], &{&1["name"], &1})
      assert by_name[c.slack]["unreadable"] == false
      assert by_name[c.oncall]["routing_key"] == "set"

      for secret <- [c.url_secret, c.routing_key],
          do: refute(inspect([put.body, listed.body]) =~ secret)
    end

    test "a sealed value copied onto another sink or field does not open", c do
      put_all(c)
      slack_url = stored(c.slack).url

      {:atomic, :ok} =
        :mnesia.transaction(fn ->
          :mnesia.write({@sinks, c.audit, %{stored(c.audit) | url: slack_url}})
        end)

      refute Enum.any?(Notifications.all_sinks(), fn {_, sink} -> sink.name == c.audit end)

      assert %{unreadable: true, url: nil} =
               Enum.find(Notifications.sinks(), &(&1.name == c.audit))
    end

    test "secrets an older release stored in plain are sealed at start", c do
      put_all(c)
      plain_url = "https://hooks.slack.com/services/T000/B000/#{c.url_secret}"

      {:atomic, :ok} =
        :mnesia.transaction(fn ->
          :mnesia.write({@sinks, c.slack, %{stored(c.slack) | url: plain_url}})
          :mnesia.write({@sinks, c.oncall, %{stored(c.oncall) | routing_key: c.routing_key}})
        end)

      # A plain value is read as it is meanwhile.
      assert Enum.find(Notifications.sinks(), &(&1.name == c.slack)).unreadable == false
      assert Notifications.seal_plain_sinks() == 2
      assert AtRest.sealed?(stored(c.slack).url)
      assert AtRest.sealed?(stored(c.oncall).routing_key)
      assert Notifications.seal_plain_sinks() == 0

      sinks = Map.new(Notifications.all_sinks(), fn {_, sink} -> {sink.name, sink} end)
      assert sinks[c.slack].url == plain_url
      assert sinks[c.oncall].routing_key == c.routing_key
    end

    test "sealed under another secret_key_base: listed as unreadable, sends nothing, asks to set it again",
         c do
      put_all(c)
      Application.put_env(:observatory, :secret_key_base, String.duplicate("another-secret-", 4))

      assert Notifications.all_sinks() |> Enum.filter(fn {_, s} -> s.name =~ "#{c.n}" end) == []

      shown = Enum.find(Notifications.sinks(), &(&1.name == c.oncall))
      assert %{unreadable: true, routing_key: nil, type: "pagerduty", source: "api"} = shown

      assert {:error, "cannot be read (sealed under another key): set it again"} =
               Notifications.test_sink(c.oncall)

      # Set again, it is sealed under the new key and read.
      {:ok, _} =
        Notifications.put_sink(c.oncall, %{"type" => "pagerduty", "routing_key" => c.routing_key})

      assert %{unreadable: false, routing_key: "set"} =
               Enum.find(Notifications.sinks(), &(&1.name == c.oncall))
    end
  end
end
