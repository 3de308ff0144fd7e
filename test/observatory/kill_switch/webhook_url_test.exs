defmodule Observatory.KillSwitch.WebhookURLTest do
  # Changes the global :kill_switch config: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.KillSwitch
  alias Observatory.KillSwitch.{Settings, WebhookURL}
  alias Observatory.Test.Upstream

  setup do
    saved = Application.get_env(:observatory, :kill_switch)
    on_exit(fn -> Application.put_env(:observatory, :kill_switch, saved) end)
    %{agent: "webhook-#{System.unique_integer([:positive])}"}
  end

  defp allow_private(allow?) do
    config = Application.get_env(:observatory, :kill_switch)

    Application.put_env(
      :observatory,
      :kill_switch,
      Keyword.put(config, :webhook_allow_private_networks, allow?)
    )
  end

  defp webhook_error(url) do
    case Settings.validate(%{"notification_webhook" => url}) do
      {:ok, _} -> nil
      {:error, [%{path: "notification_webhook", reason: reason}]} -> reason
    end
  end

  # A receiver on loopback that answers every POST with `status` and `headers`, and
  # tells the test process `{tag, body}`.
  defp receiver(tag, status, headers \\ []) do
    test = self()

    loop = fn req ->
      body = :mochiweb_request.recv_body(req) |> IO.iodata_to_binary()
      :mochiweb_request.respond({status, headers, ""}, req)
      send(test, {tag, body})
    end

    name = :"hook_#{System.unique_integer([:positive])}"
    {:ok, pid} = :mochiweb_http.start_link(name: name, ip: {127, 0, 0, 1}, port: 0, loop: loop)
    "http://127.0.0.1:#{:mochiweb_socket_server.get(pid, :port)}/alerts"
  end

  # Trips the agent's kill switch, which sends its notification; returns the log.
  defp trip(agent, webhook) do
    {:ok, _} = KillSwitch.configure(agent, %{enabled: true, threshold: 0.5})
    if webhook, do: {:ok, _} = KillSwitch.configure(agent, %{notification_webhook: webhook})

    capture_log(fn ->
      for k <- 1..5 do
        body = Upstream.request("Attempt #{k}: retry the deploy of build 4821.")
        {:ok, fp} = KillSwitch.fingerprint_request(Observatory.JSON.encode!(body))
        KillSwitch.check_request(agent, fp)
      end

      # The notification runs in a task: give it time to run (or be refused).
      Process.sleep(500)
    end)
  end

  describe "finding 8: webhook URLs are validated when set" do
    test "loopback, private, link-local and reserved hosts are refused by default" do
      allow_private(false)

      for url <- [
            "http://127.0.0.1:9000/hook",
            "http://localhost/hook",
            "http://10.1.2.3/hook",
            "http://172.20.0.1/hook",
            "http://192.168.1.1/hook",
            "http://169.254.169.254/latest/meta-data",
            "http://100.64.0.1/hook",
            "http://0.0.0.0/hook",
            "http://[::1]/hook",
            "http://[fe80::1]/hook",
            "http://[fd00::1]/hook",
            "http://[::ffff:127.0.0.1]/hook"
          ] do
        assert webhook_error(url) =~
                 "must not point at a loopback, private or link-local address",
               url
      end
    end

    test "public addresses, and hosts that do not resolve yet, are accepted" do
      allow_private(false)

      for url <- [
            "https://93.184.216.34/hook",
            "http://[2606:4700::1111]/hook",
            "https://hooks.example.com/a"
          ] do
        assert webhook_error(url) == nil, url
      end
    end

    test "an operator setting allows private networks" do
      allow_private(true)
      assert webhook_error("http://127.0.0.1:9000/hook") == nil
      assert webhook_error("http://10.1.2.3/hook") == nil
    end

    test "user information in the URL is refused, even with private networks allowed" do
      allow_private(true)

      for url <- ["https://user:pass@hooks.example.com/a", "http://user@127.0.0.1/a"] do
        assert webhook_error(url) =~ "must not carry a user name or password", url
      end
    end

    test "private?/1 knows the ranges" do
      assert WebhookURL.private?({127, 0, 0, 1})
      assert WebhookURL.private?({172, 31, 255, 255})
      refute WebhookURL.private?({172, 32, 0, 1})
      refute WebhookURL.private?({100, 128, 0, 1})
      refute WebhookURL.private?({8, 8, 8, 8})
      refute WebhookURL.private?({0x2606, 0x4700, 0, 0, 0, 0, 0, 0x1111})
    end
  end

  describe "finding 8: webhook deliveries are checked again and follow no redirect" do
    test "a loopback webhook set in the configuration is not POSTed to", %{agent: agent} do
      url = receiver(:hook, 204)
      allow_private(false)
      config = Application.get_env(:observatory, :kill_switch)

      Application.put_env(
        :observatory,
        :kill_switch,
        Keyword.put(config, :notification_webhook, url)
      )

      log = trip(agent, nil)
      refute_received {:hook, _}
      assert log =~ "kill switch notification not sent: the webhook must not point at a loopback"
    end

    test "a redirect is not followed", %{agent: agent} do
      allow_private(true)
      target = receiver(:redirect_target, 204)
      url = receiver(:hook, 307, [{"Location", target}])

      trip(agent, url)
      assert_received {:hook, body}
      assert body =~ "kill_switch"
      refute_received {:redirect_target, _}
    end

    test "an https:// webhook whose certificate the system does not trust gets nothing (review finding)" do
      allow_private(true)

      dir =
        Path.join(System.tmp_dir!(), "observatory-hook-tls-#{System.unique_integer([:positive])}")

      File.mkdir_p!(dir)
      on_exit(fn -> File.rm_rf!(dir) end)

      %{port: port, listen: listen} =
        Observatory.Test.TLSServer.start(%{
          answer: {204, "text/plain", ""},
          notify: self(),
          dir: dir
        })

      on_exit(fn -> :ssl.close(listen) end)

      log =
        capture_log(fn ->
          assert {:error, :failed} =
                   Observatory.KillSwitch.Notifier.deliver("https://localhost:#{port}/hook", %{
                     "event" => "kill_switch"
                   })
        end)

      assert log =~ "kill switch notification failed"
      refute_received {:tls_request, _}
    end

    test "with private networks allowed, a loopback webhook is delivered", %{agent: agent} do
      allow_private(true)
      trip(agent, receiver(:hook, 204))
      assert_received {:hook, body}
      assert body =~ agent
    end
  end
end
