defmodule Observatory.NotificationsTextTest do
  # The text of a notification is read by people (in Slack, PagerDuty, an e-mail a
  # webhook becomes): an agent's id, intent, tool or reason must not reorder it with a
  # bidirectional control, nor ping a Slack channel or forge a link. The fields a
  # program matches on keep the exact bytes. The payloads are built (Dispatcher.alerts/1,
  # Sink.request/2) and read back; nothing is sent.
  use ExUnit.Case, async: true

  alias Observatory.{Bidi, Budget, JSON}
  alias Observatory.Notifications.{Dispatcher, Sink}

  doctest Observatory.Bidi

  @controls Enum.map(Bidi.controls(), &<<&1::utf8>>)
  @session "sess-\u202Egnp"
  @agent "agent-\u2066x\u2069"

  defp sink(type),
    do: %{
      name: "t-#{type}",
      type: type,
      url: "https://hooks.example.com/x",
      routing_key: if(type == :pagerduty, do: "R0UTINGKEY"),
      secret: nil,
      events: Sink.kinds()
    }

  # {human-readable text, decoded body} of the alert at each kind of sink.
  defp built(alert) do
    for type <- [:slack, :webhook, :pagerduty] do
      {_url, _headers, body} = Sink.request(sink(type), alert)
      {:ok, decoded} = JSON.decode(body)

      text =
        case type do
          :slack -> decoded["text"]
          :webhook -> decoded["summary"]
          :pagerduty -> get_in(decoded, ["payload", "summary"]) || ""
        end

      {type, text, decoded}
    end
  end

  defp loop_alarm(session, agent, reason) do
    [alert] =
      Dispatcher.alerts(%{
        event_type: "alert_raised",
        session_id: session,
        agent_id: agent,
        reason: reason,
        rule: "repeat",
        source: "verdict",
        since: ~U[2026-02-22 10:04:00Z]
      })

    alert
  end

  describe "notifications: bidirectional controls in agents' strings show as markers in the text people read" do
    test "a loop alarm's Slack text, webhook summary and PagerDuty summary" do
      alert = loop_alarm(@session, @agent, "the same call to search\u200F 3 times")

      for {type, text, _body} <- built(alert) do
        assert text =~ "session sess-⟨U+202E⟩gnp of agent agent-⟨U+2066⟩x⟨U+2069⟩",
               "#{type}: #{inspect(text)}"

        assert text =~ "search⟨U+200F⟩ 3 times", "#{type}: #{inspect(text)}"
        refute String.contains?(text, @controls), "#{type}: #{inspect(text)}"
      end
    end

    test "every control, in every kind of alert and its resolution" do
      every = Enum.join(@controls)
      session = "s" <> every
      agent = "a" <> every
      ks = %{score: 0.9, threshold: 0.8, repeated_tool_calls: 5, similar_prompts: 4}
      breach = %{scope: :session, limit: :session_tokens, used: 120, max: 100}
      scope = %{kind: "session", session_id: session}

      events = [
        %{
          event_type: "alert_cleared",
          session_id: session,
          agent_id: agent,
          why: "evicted " <> every
        },
        %{event_type: "alert_cleared", session_id: session, agent_id: agent, why: "recovered"},
        %{event_type: "kill_switch", agent_id: agent, details: ks},
        %{
          event_type: "kill_switch_would_trip",
          agent_id: agent,
          details: Map.put(ks, :mode, "warn")
        },
        %{event_type: "activation", agent_id: agent},
        %{event_type: "kill_switch_recovered", agent_id: agent, details: %{}},
        %{
          event_type: "budget_exhausted",
          agent_id: agent,
          details: %{scope: scope, message: Budget.refusal_message([breach], agent, session)}
        },
        %{event_type: "budget_recovered", agent_id: agent, details: %{scope: scope}}
      ]

      alerts = Enum.flat_map(events, &Dispatcher.alerts/1)
      assert length(alerts) == length(events)

      for alert <- alerts, {type, text, _body} <- built(alert), text != "" do
        refute String.contains?(text, @controls), "#{type}: #{inspect(text)}"
        assert text =~ "⟨U+202E⟩", "#{type}: #{inspect(text)}"
      end
    end

    test "the fields a program matches on keep the exact bytes" do
      alert = loop_alarm(@session, @agent, "stuck \u202E")
      [{:slack, _, _}, {:webhook, _, webhook}, {:pagerduty, _, pagerduty}] = built(alert)

      assert webhook["session_id"] == @session
      assert webhook["agent_id"] == @agent
      assert webhook["dedup_key"] == "observatory:loop:" <> @session
      assert webhook["details"]["reason"] == "stuck \u202E"

      assert pagerduty["dedup_key"] == "observatory:loop:" <> @session
      assert pagerduty["payload"]["component"] == @agent
      assert pagerduty["payload"]["custom_details"]["session_id"] == @session
    end

    test "text without controls is sent as it was" do
      alert = loop_alarm("sess-1", "agent-7", "it’s → \u0627")

      for {_type, text, _body} <- built(alert),
          do: assert(text =~ "Loop alarm: session sess-1 of agent agent-7: it’s → \u0627")
    end
  end

  describe "notifications: Slack's mrkdwn escaping of agents' strings" do
    test "<, > and & are escaped: no <!channel>, no <!here>, no forged link" do
      alert =
        loop_alarm("<!channel>", "<https://evil.example/login|agent-7>", "a & b <!here>\u202E")

      [{:slack, text, _} | _] = built(alert)

      assert text =~
               "session &lt;!channel&gt; of agent &lt;https://evil.example/login|agent-7&gt;"

      assert text =~ "a &amp; b &lt;!here&gt;⟨U+202E⟩"
      refute text =~ "<"
      refute text =~ ">"
      # Every & left is one of the escapes.
      assert Regex.scan(~r/&(?!amp;|lt;|gt;)/, text) == []
    end

    test "the webhook and PagerDuty get the summary unescaped (their JSON is not mrkdwn)" do
      alert = loop_alarm("<s>", "a&b", "x")
      [_slack, {:webhook, summary, _}, {:pagerduty, pd_summary, _}] = built(alert)
      assert summary == "Loop alarm: session <s> of agent a&b: x"
      assert pd_summary == summary
    end
  end
end
