defmodule Observatory.NotificationsTest do
  # Graded response, item 3: loop alarms, kill-switch trips and budget stops reach the
  # configured sinks — a JSON webhook, a Slack incoming webhook, PagerDuty Events v2 —
  # once per session until recovery, rate-limited, retried with backoff, under the
  # webhook SSRF rules, secrets never logged nor shown back. Stub sinks on loopback.
  # The dispatcher and the sinks are global: not async.
  use Observatory.TrackerCase, async: false
  @moduletag :capture_log

  import ExUnit.CaptureLog

  alias Observatory.{Budget, JSON, KillSwitch, Notifications}
  alias Observatory.Gateway.{Events, SchemaInterceptor}
  alias Observatory.Notifications.{Dispatcher, Sink}
  alias Observatory.Test.{HTTP, Upstream}

  @routing_key "R0UTINGKEYSECRET0000000000000000"

  # A delivery goes through the dispatcher and an HTTP request to a stub: under load
  # it takes well over ExUnit's default 100 ms. assert_receive returns on arrival.
  @delivery 5_000

  setup do
    restore_env_on_exit([:notifications, :kill_switch])
    test = self()

    # Each stub reports what it received as {:sink, name, decoded body, headers}; its
    # answers come from `answers` (status, headers), then 202.
    stub = fn name, answers ->
      {:ok, agent} = Agent.start_link(fn -> answers end)

      Upstream.start(fn body, headers ->
        send(test, {:sink, name, elem(JSON.decode(body), 1), Map.put(headers, :raw, body)})

        case Agent.get_and_update(agent, fn
               [first | rest] -> {first, rest}
               [] -> {nil, []}
             end) do
          nil -> {202, "application/json", ~s({"status":"success"})}
          {status, extra} -> {status, "application/json", extra, ~s({"error":"busy"})}
        end
      end)
    end

    %{stub: stub, n: System.unique_integer([:positive])}
  end

  defp configure(sinks, extra \\ []) do
    Application.put_env(
      :observatory,
      :notifications,
      [sinks: sinks, backoff_ms: 5, max_backoff_ms: 20] ++ extra
    )
  end

  # The dispatcher keeps a rate-limit bucket per sink name: each test names its own.
  defp slack(url, name \\ "team"),
    do: [name: name, type: :slack, url: url <> "/services/T000/B000/XXXXSECRETXXXX"]

  defp pagerduty(url),
    do: [name: "oncall", type: :pagerduty, routing_key: @routing_key, url: url <> "/v2/enqueue"]

  # Five identical steps: an entropy LOOP (an EntropyAlertEvent); two different ones
  # after it: back to normal (the node active again).
  defp loop(session, agent) do
    for k <- 1..5, do: {:ok, _} = SchemaInterceptor.ingest(step(session, agent, k, "read_file"))
  end

  defp recover(session, agent) do
    for {k, tool} <- [{6, "write_file"}, {7, "run_tests"}],
        do: {:ok, _} = SchemaInterceptor.ingest(step(session, agent, k, tool))
  end

  defp step(session, agent, k, tool) do
    HTTP.envelope(%{
      "meta" => %{"session_id" => session, "agent_id" => agent, "step_id" => "#{session}-#{k}"},
      "cognition" => %{"intent" => "read the build log"},
      "action" => %{"tool_call" => tool}
    })
  end

  # Everything the dispatcher was sent has been handled, and every delivery is done.
  defp await_dropped(count, deadline \\ System.monotonic_time(:millisecond) + @delivery) do
    cond do
      Observatory.Metrics.get(:notifications_dropped) >= count ->
        :ok

      System.monotonic_time(:millisecond) > deadline ->
        flunk("the dispatcher never dropped an alarm past the rate limit")

      true ->
        receive do
        after
          5 -> await_dropped(count, deadline)
        end
    end
  end

  defp settled do
    state = :sys.get_state(Dispatcher)

    if state.tasks == %{} and state.busy == %{} do
      state
    else
      receive do
      after
        5 -> settled()
      end
    end
  end

  describe "notifications: a loop alarm reaches Slack and PagerDuty once; recovery resolves it" do
    test "trigger once per session however many alerts, resolve on recovery", %{stub: stub, n: n} do
      slack_url = stub.(:slack, []).url
      pd_url = stub.(:pagerduty, []).url
      configure([slack(slack_url), pagerduty(pd_url)])
      session = "sess-notify-#{n}"
      agent = "agent-notify-#{n}"

      loop(session, agent)

      assert_receive {:sink, :slack,
                      %{"text" => ":rotating_light: Loop alarm: session " <> _ = text}, _},
                     @delivery

      assert text =~ "of agent #{agent}"

      assert_receive {:sink, :pagerduty, trigger, _}, @delivery

      assert %{
               "routing_key" => @routing_key,
               "event_action" => "trigger",
               "dedup_key" => "observatory:loop:" <> ^session,
               "payload" => %{
                 "severity" => "error",
                 "component" => ^agent,
                 "class" => "loop_alarm",
                 "summary" => "Loop alarm: " <> _
               }
             } = trigger

      # More LOOP steps: more EntropyAlertEvents, no more notifications.
      for k <- 10..12,
          do: {:ok, _} = SchemaInterceptor.ingest(step(session, agent, k, "read_file"))

      settled()
      refute_received {:sink, _, _, _}

      recover(session, agent)

      assert_receive {:sink, :pagerduty,
                      %{
                        "event_action" => "resolve",
                        "dedup_key" => "observatory:loop:" <> ^session
                      } = resolve, _},
                     @delivery

      refute Map.has_key?(resolve, "payload")

      assert_receive {:sink, :slack, %{"text" => ":white_check_mark: Recovered: session " <> _},
                      _},
                     @delivery

      settled()
      refute_received {:sink, _, _, _}
    end

    test "a session id cannot ping a Slack channel or forge a link", %{stub: stub, n: n} do
      configure([slack(stub.(:slack, []).url, "team-escape-#{n}")])
      loop("<!channel>-#{n}", "agent-#{n}")
      assert_receive {:sink, :slack, %{"text" => text}, _}, @delivery
      assert text =~ "&lt;!channel&gt;-#{n}"
      refute text =~ "<!channel>"
    end

    test "a session id's bidirectional control reaches Slack as a marker, the webhook's session_id as it is",
         %{stub: stub, n: n} do
      configure([
        slack(stub.(:slack, []).url, "team-bidi-#{n}"),
        [name: "hook-bidi-#{n}", type: :webhook, url: stub.(:webhook, []).url]
      ])

      session = "sess-\u202E#{n}"
      loop(session, "agent-#{n}")
      assert_receive {:sink, :slack, %{"text" => text}, _}, @delivery
      assert text =~ "session sess-⟨U+202E⟩#{n} of agent agent-#{n}"
      refute text =~ "\u202E"

      assert_receive {:sink, :webhook, %{"session_id" => ^session, "summary" => summary}, _},
                     @delivery

      assert summary =~ "session sess-⟨U+202E⟩#{n} of"
    end
  end

  describe "notifications: with :alert_source :verdict, an agent stuck without an identical repeat" do
    setup do
      restore_env_on_exit([:alert_source])
      Observatory.configure(alert_source: :verdict)
      :ok
    end

    # The same query with another LIMIT each time; `answer` says what came back.
    defp near_query(session, agent, k, answer) do
      HTTP.envelope(%{
        "meta" => %{"session_id" => session, "agent_id" => agent, "step_id" => "#{session}-#{k}"},
        "cognition" => %{"intent" => "look the code up"},
        "action" => %{
          "tool_call" => "sql",
          "tool_input" => %{"query" => "SELECT code FROM template LIMIT #{k * 10}"},
          "status" => "failure",
          "result" => answer.(k)
        }
      })
    end

    test "different calls failing with one error raise the alarm once, naming the rule's reason",
         %{stub: stub, n: n} do
      configure([slack(stub.(:slack, []).url, "stuck-#{n}")])
      session = "sess-stuck-#{n}"
      agent = "agent-stuck-#{n}"
      missing = fn _k -> "Error: Table 'docs.template' doesn't exist" end

      for k <- 1..6,
          do: {:ok, _} = SchemaInterceptor.ingest(near_query(session, agent, k, missing))

      assert_receive {:sink, :slack, %{"text" => text}, _}
      assert text =~ "Loop alarm: session"
      assert text =~ "4 calls in a row failed with the same error"
      settled()
      refute_received {:sink, _, _, _}
    end

    test "the near-miss: failures whose figure moves each time notify nobody",
         %{stub: stub, n: n} do
      configure([slack(stub.(:slack, []).url, "moving-#{n}")])
      session = "sess-moving-#{n}"
      agent = "agent-moving-#{n}"
      moving = fn k -> "Error: #{k * 10} rows over the quota" end

      for k <- 1..6,
          do: {:ok, _} = SchemaInterceptor.ingest(near_query(session, agent, k, moving))

      settled()
      refute_received {:sink, _, _, _}
    end
  end

  describe "notifications: kill-switch trips and budget stops" do
    test "a trip is critical, the activation resolves it; a budget stop, its reset", %{
      stub: stub,
      n: n
    } do
      configure([
        pagerduty(stub.(:pagerduty, []).url),
        [
          name: "audit",
          type: :webhook,
          url: stub.(:webhook, []).url <> "/hook",
          secret: "s3cret",
          events: [:budget]
        ]
      ])

      agent = "agent-notify-ks-#{n}"
      HTTP.key_for(agent)

      Events.broadcast(KillSwitch.topic(), %{
        event_type: "kill_switch",
        agent_id: agent,
        details: %{
          score: 7.5,
          threshold: 5.5,
          repeated_tool_calls: 3,
          similar_prompts: 3,
          similar_responses: 0,
          window_len: 5
        }
      })

      assert_receive {:sink, :pagerduty,
                      %{
                        "event_action" => "trigger",
                        "dedup_key" => "observatory:kill_switch:" <> ^agent,
                        "payload" => %{"severity" => "critical", "summary" => summary}
                      }, _},
                     @delivery

      assert summary =~ "Kill switch deactivated agent #{agent}: loop score 7.5 > threshold 5.5"
      settled()
      refute_received {:sink, :webhook, _, _}

      Events.broadcast(KillSwitch.topic(), %{
        event_type: "activation",
        agent_id: agent,
        details: %{}
      })

      assert_receive {:sink, :pagerduty,
                      %{
                        "event_action" => "resolve",
                        "dedup_key" => "observatory:kill_switch:" <> ^agent
                      }, _},
                     @delivery

      # A budget stop (the real path: a session over its request limit).
      {:ok, _} = Budget.configure(agent, %{"session_requests" => 0})
      session = "sess-budget-notify-#{n}"
      assert {:refuse, _} = Budget.check(KillSwitch.agent(agent), session)

      assert_receive {:sink, :webhook,
                      %{
                        "kind" => "budget",
                        "action" => "trigger",
                        "severity" => "error",
                        "session_id" => ^session
                      } = body, headers},
                     @delivery

      assert body["summary"] =~ "Budget exhausted: budget_exhausted: session #{session}"
      # Signed with the sink's secret.
      hmac = :crypto.mac(:hmac, :sha256, "s3cret", headers.raw) |> Base.encode16(case: :lower)
      assert headers["x-observatory-signature"] == "sha256=" <> hmac

      assert_receive {:sink, :pagerduty,
                      %{
                        "event_action" => "trigger",
                        "dedup_key" => "observatory:budget:session:" <> ^session
                      }, _},
                     @delivery

      {:ok, _} = Budget.reset(agent, session_id: session)

      assert_receive {:sink, :pagerduty,
                      %{
                        "event_action" => "resolve",
                        "dedup_key" => "observatory:budget:session:" <> ^session
                      }, _},
                     @delivery

      assert_receive {:sink, :webhook, %{"action" => "resolve", "kind" => "budget"}, _}, @delivery
    end

    test "shadow mode records only: nothing is sent", %{stub: stub, n: n} do
      configure([pagerduty(stub.(:pagerduty, []).url)])
      agent = "agent-notify-shadow-#{n}"
      HTTP.key_for(agent)
      {:ok, _} = Budget.configure(agent, %{"session_requests" => 0, "mode" => "shadow"})
      assert {:ok, [_]} = Budget.check(KillSwitch.agent(agent), "s-#{n}")

      Events.broadcast(KillSwitch.topic(), %{
        event_type: "kill_switch_would_trip",
        agent_id: agent,
        details: %{mode: "shadow"}
      })

      settled()
      refute_received {:sink, _, _, _}
    end
  end

  describe "notifications: retries with backoff, rate limits, secrets never logged" do
    test "a 503 and a 429 are retried; a 400 is not", %{stub: stub, n: n} do
      flaky = stub.(:pagerduty, [{503, []}, {429, [{"retry-after", "0"}]}])
      configure([pagerduty(flaky.url)])

      log =
        capture_log(fn ->
          loop("sess-retry-#{n}", "agent-#{n}")

          for _ <- 1..3,
              do:
                assert_receive({:sink, :pagerduty, %{"event_action" => "trigger"}, _}, @delivery)

          settled()
        end)

      assert log =~ ~s(notification to sink "oncall" answered 503; attempt 2 of 5)
      assert log =~ ~s(notification to sink "oncall" answered 429; attempt 3 of 5)

      refused = stub.(:slack, List.duplicate({400, []}, 5))
      configure([slack(refused.url, "team-refused-#{n}")])

      log =
        capture_log(fn ->
          loop("sess-refused-#{n}", "agent-#{n}")
          assert_receive {:sink, :slack, _, _}, @delivery
          settled()
        end)

      refute_received {:sink, :slack, _, _}

      assert log =~
               ~s[notification to sink "team-refused-#{n}" (slack) not delivered: answered 400]

      # Nothing of the secret URL or key is in the log.
      refute log =~ "XXXXSECRETXXXX"
      refute log =~ @routing_key
    end

    test "past the rate limit alarms are dropped and counted", %{stub: stub, n: n} do
      configure([slack(stub.(:slack, []).url, "team-rate-#{n}")], rate_limit_per_minute: 2)
      dropped = Observatory.Metrics.get(:notifications_dropped)
      for k <- 1..3, do: loop("sess-rate-#{n}-#{k}", "agent-#{n}")
      assert_receive {:sink, :slack, _, _}, @delivery
      assert_receive {:sink, :slack, _, _}, @delivery
      # The third alarm reaches the dispatcher after the ingest returns: await its drop.
      await_dropped(dropped + 1)
      settled()
      refute_received {:sink, :slack, _, _}
      assert Observatory.Metrics.get(:notifications_dropped) == dropped + 1
    end

    test "sinks are shown back redacted" do
      configure([
        [
          name: "team",
          type: :slack,
          url: "https://hooks.slack.com/services/T000/B000/XXXXSECRETXXXX"
        ],
        [name: "oncall", type: :pagerduty, routing_key: @routing_key]
      ])

      shown = Notifications.sinks()
      refute inspect(shown) =~ "XXXXSECRETXXXX"
      refute inspect(shown) =~ @routing_key

      assert [
               %{
                 name: "team",
                 type: "slack",
                 url: "https://hooks.slack.com/…XXXX",
                 source: "config"
               },
               %{
                 name: "oncall",
                 type: "pagerduty",
                 routing_key: "set",
                 url: "https://events.pagerduty.com/…"
               }
             ] = shown
    end
  end

  describe "notifications: bad configuration gets a clear error" do
    test "a webhook to a private address, a missing key, an unknown type, a duplicate name" do
      Application.put_env(
        :observatory,
        :kill_switch,
        Keyword.put(
          Application.get_env(:observatory, :kill_switch),
          :webhook_allow_private_networks,
          false
        )
      )

      bad = [
        {[sinks: [[name: "a", type: :webhook, url: "http://10.1.2.3/hook"]]],
         "sink 1 (\"a\"): url must not point at a loopback, private or link-local address (10.1.2.3 is 10.1.2.3)"},
        {[sinks: [[name: "b", type: :slack, url: "http://127.0.0.1:9/services/XSECRET"]]],
         "url must not point at a loopback"},
        {[sinks: [[name: "c", type: :pagerduty]]], "sink 1 (\"c\"): routing_key is required"},
        {[sinks: [[name: "d", type: :email, url: "https://example.com"]]],
         "type must be webhook, slack or pagerduty, got: \"email\""},
        {[
           sinks: [
             [name: "e", type: :slack, url: "https://hooks.slack.com/x", events: [:everything]]
           ]
         ], "events must list some of loop_alarm, kill_switch, budget"},
        {[
           sinks: [
             [name: "f", type: :pagerduty, routing_key: "k"],
             [name: "f", type: :pagerduty, routing_key: "k"]
           ]
         ], "two sinks are named \"f\""},
        {[sink: []], "unknown key :sink in config :observatory, :notifications"},
        {[rate_limit_per_minute: 0], "rate_limit_per_minute to be a positive integer, got: 0"}
      ]

      for {config, message} <- bad do
        Application.put_env(:observatory, :notifications, config)
        error = assert_raise ArgumentError, fn -> Notifications.check_config!() end
        assert Exception.message(error) =~ message
        refute Exception.message(error) =~ "XSECRET"
      end

      assert {:error, {:invalid, [%{path: "url", reason: "must not point at a loopback" <> _}]}} =
               Notifications.put_sink("team", %{
                 "type" => "slack",
                 "url" => "http://192.168.1.10/hook"
               })
    end
  end

  describe "notifications: sinks added at run time" do
    test "put, listed redacted, used, removed; a configured name is refused", %{stub: stub, n: n} do
      configure([[name: "oncall", type: :pagerduty, routing_key: @routing_key]])
      on_exit(fn -> Notifications.delete_sink("ops") end)
      url = stub.(:webhook, []).url <> "/runtime-hook-secret-path"

      assert {:ok,
              %{name: "ops", type: "webhook", url: "http://127.0.0.1:" <> _, source: "api"} =
                shown} =
               Notifications.put_sink("ops", %{
                 "type" => "webhook",
                 "url" => url,
                 "events" => ["loop_alarm"]
               })

      refute inspect(shown) =~ "runtime-hook-secret-path"

      assert {:error, :configured} =
               Notifications.put_sink("oncall", %{"type" => "webhook", "url" => url})

      assert Enum.map(Notifications.sinks(), & &1.name) == ["oncall", "ops"]
      # The configured PagerDuty URL is not reachable here: only the webhook is checked.
      Application.put_env(:observatory, :notifications, sinks: [], backoff_ms: 5)
      loop("sess-runtime-#{n}", "agent-#{n}")

      assert_receive {:sink, :webhook, %{"kind" => "loop_alarm", "action" => "trigger"}, _},
                     @delivery

      assert Notifications.test_sink("ops") == :ok

      assert_receive {:sink, :webhook,
                      %{"summary" => "Test alert from Observatory to the sink ops"}, _},
                     @delivery

      assert :ok = Notifications.delete_sink("ops")
      assert {:error, :not_found} = Notifications.delete_sink("ops")
    end
  end

  test "Sink.dedup_key: per session, a digest past PagerDuty's 255 characters" do
    alert = %{key: "loop:" <> String.duplicate("s", 300)}
    assert "observatory:" <> digest = Sink.dedup_key(alert)
    assert byte_size(digest) == 64
    assert Sink.dedup_key(%{key: "loop:sess-1"}) == "observatory:loop:sess-1"
  end
end
