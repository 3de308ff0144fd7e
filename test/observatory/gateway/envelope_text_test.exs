defmodule Observatory.Gateway.EnvelopeTextTest do
  # The ingest keeps a step's envelope as its JSON text (SessionLog.put_json/4) and
  # builds its term only when something reads it: a session log reader, a subscriber
  # of "gateway:decision_logs", or a caller that asks for `result.envelope`. What
  # every reader gets must be what the eager term was, with the gateway's score.
  use Observatory.TrackerCase, async: false

  import Bitwise

  alias Observatory.Gateway.{DecisionLog, Events, SchemaInterceptor, SessionLog}
  alias Observatory.Test.HTTP

  setup do
    restore_env_on_exit([:session_log_max_envelope_bytes, :pubsub])
  end

  defmodule HostBus do
    # A host's PubSub server, as Phoenix.PubSub's API: every broadcast comes back to
    # the broadcasting process (the ingest runs in the test's).
    def broadcast(_server, topic, message) do
      send(self(), {:host_bus, topic, message})
      :ok
    end

    def subscribe(_server, _topic), do: :ok
    def unsubscribe(_server, _topic), do: :ok
  end

  # A random JSON value: nested objects and arrays, strings with escapes and
  # multi-byte characters, integers of every size, floats, booleans, null.
  defp value(0), do: scalar()

  defp value(depth) do
    case :rand.uniform(6) do
      1 -> Map.new(1..:rand.uniform(5), fn _ -> {text(), value(depth - 1)} end)
      2 -> for _ <- 1..:rand.uniform(4), do: value(depth - 1)
      _ -> scalar()
    end
  end

  defp scalar do
    case :rand.uniform(8) do
      1 -> text()
      2 -> :rand.uniform(1_000_000) - 500_000
      3 -> :rand.uniform(1 <<< 62) * 3
      4 -> (:rand.uniform() - 0.5) * :math.pow(10, :rand.uniform(40) - 20)
      5 -> :rand.uniform(2) == 1
      6 -> nil
      7 -> ""
      8 -> -(1 <<< 63)
    end
  end

  @alphabet ~c"ab \"\\/\n\t\u0001é€😀<>&'"
  defp text, do: for(_ <- 1..:rand.uniform(12), into: "", do: <<Enum.random(@alphabet)::utf8>>)

  defp envelope(sid, n) do
    HTTP.envelope(%{
      "meta" => %{"session_id" => sid, "step_id" => "s#{n}", "extra" => value(2)},
      "cognition" => %{"intent" => text(), "entropy_score" => :rand.uniform(), "x" => value(2)},
      "action" => %{
        "tool_call" => "tool-#{rem(n, 3)}",
        "tool_input" => %{"q" => value(3)},
        "result" => value(3)
      },
      "extra" => value(3)
    })
  end

  # The same value as other text than the encoder's: spaces between tokens.
  defp spaced(json),
    do: json |> String.replace(",\"", ", \"") |> String.replace(":", " : ", global: false)

  describe "the envelope kept as text reads back as the eager term" do
    test "parse/2 with envelope: false gives the same fields and no term" do
      :rand.seed(:exsss, {24, 1, 1})

      for n <- 1..200 do
        json = Observatory.JSON.encode!(envelope("s", n))
        assert {:ok, eager, fields} = DecisionLog.parse(json)
        assert is_map(eager)
        assert {:ok, nil, ^fields} = DecisionLog.parse(json, envelope: false)
      end
    end

    test "put_json/4 then steps/1 equals the eager envelope with the score, over generated envelopes" do
      :rand.seed(:exsss, {24, 2, 2})
      sid = unique_session("text")

      for n <- 1..300 do
        json = envelope(sid, n) |> Observatory.JSON.encode!()
        json = if rem(n, 2) == 0, do: spaced(json), else: json
        {:ok, eager, _fields} = DecisionLog.parse(json)
        score = if rem(n, 5) == 0, do: nil, else: :rand.uniform()

        SessionLog.put_json(sid, json, score, n)

        assert %{number: ^n, envelope: read} = SessionLog.step(sid, n)
        assert read == DecisionLog.with_score(eager, score)

        if score == nil,
          do: assert(read == eager, "nil keeps the agent's own score")
      end
    end

    test "duplicate keys and escapes decode as the parse decodes them" do
      sid = unique_session("dups")

      json =
        ~s({"meta":{"step_id":"d1","session_id":"#{sid}","agent_id":"agent-1","timestamp":"2026-02-22T10:30:00Z","step_id":"d2"},) <>
          ~s("cognition":{"intent":"caf\\u00e9 \\ud83d\\ude00","entropy_score":1e-3},) <>
          ~s("action":{"tool_call":"t","status":"success","result":{"n":1.0,"n":2}}})

      {:ok, eager, %{step_id: "d2"}} = DecisionLog.parse(json)
      SessionLog.put_json(sid, json, 0.5, 1)
      assert [%{envelope: read}] = SessionLog.steps(sid)
      assert read == DecisionLog.with_score(eager, 0.5)
      assert read["cognition"]["intent"] == "café 😀"
      assert read["action"]["result"] == %{"n" => 2}
    end

    test "a part of a larger binary is stored as its own copy, not the whole" do
      sid = unique_session("sub")
      line = Observatory.JSON.encode!(HTTP.envelope(%{"meta" => %{"session_id" => sid}}))
      body = line <> "\n" <> String.duplicate("x", 100_000)
      part = binary_part(body, 0, byte_size(line))
      assert :binary.referenced_byte_size(part) > 100_000
      before = SessionLog.stats().bytes

      SessionLog.put_json(sid, part, 0.1, 1)

      # The log copies the text into its own memory: only the line is kept and counted.
      assert SessionLog.stats().bytes - before == byte_size(line)
      {:ok, eager, _} = DecisionLog.parse(line)
      assert [%{number: 1, envelope: read}] = SessionLog.steps(sid)
      assert read == DecisionLog.with_score(eager, 0.1)
    end

    test "a text over :session_log_max_envelope_bytes is kept as a stub that gives the text's size" do
      Observatory.configure(session_log_max_envelope_bytes: 4_096)
      sid = unique_session("big")

      json =
        Observatory.JSON.encode!(
          HTTP.envelope(%{
            "meta" => %{"session_id" => sid},
            "action" => %{"result" => String.duplicate("a", 50_000)}
          })
        )

      SessionLog.put_json(sid, json, 0.2, 1)

      assert [%{"truncated" => true, "bytes" => bytes, "meta" => %{"session_id" => ^sid}}] =
               SessionLog.recent(sid)

      assert bytes == byte_size(json)
    end

    test "a text over the cap is a stub even when its term would be under it (the cap is on the text)" do
      Observatory.configure(session_log_max_envelope_bytes: 4_096)
      sid = unique_session("padded")
      json = Observatory.JSON.encode!(HTTP.envelope(%{"meta" => %{"session_id" => sid}}))
      # The same envelope with 8 KB of spaces before its closing brace.
      padded = binary_part(json, 0, byte_size(json) - 1) <> String.duplicate(" ", 8_192) <> "}"
      {:ok, term} = Observatory.JSON.decode(padded)
      assert :erlang.external_size(term) < 4_096

      SessionLog.put_json(sid, padded, 0.2, 1)

      assert [%{"truncated" => true, "bytes" => bytes, "meta" => %{"session_id" => ^sid}}] =
               SessionLog.recent(sid)

      assert bytes == byte_size(padded)
    end
  end

  describe "the ingest builds the envelope's term only for who reads it" do
    test "the result's envelope, the stored step and a subscriber's message are the same term" do
      :rand.seed(:exsss, {24, 3, 3})
      sid = unique_session("ingest")
      :ok = Events.subscribe(Events.decision_logs())

      for n <- 1..40 do
        json = Observatory.JSON.encode!(envelope(sid, n))
        {:ok, eager, _} = DecisionLog.parse(json)
        lazy? = rem(n, 2) == 0

        {:ok, result} = SchemaInterceptor.ingest(json, envelope: not lazy?)
        expected = DecisionLog.with_score(eager, result.entropy_score)

        if lazy?,
          do: assert(result.envelope == nil),
          else: assert(result.envelope == expected)

        step_id = "s#{n}"
        assert_receive %{event_type: "decision_log", step_id: ^step_id, envelope: ^expected}
        assert List.last(SessionLog.recent(sid)) == expected
      end
    after
      Events.unsubscribe(Events.decision_logs())
    end

    test "with a host's PubSub server the broadcast carries the envelope, envelope: false or not" do
      Observatory.configure(pubsub: {__MODULE__.HostBus, :host_bus})
      sid = unique_session("host-bus")

      for lazy? <- [true, false] do
        json = Observatory.JSON.encode!(HTTP.envelope(%{"meta" => %{"session_id" => sid}}))
        {:ok, eager, %{step_id: step_id}} = DecisionLog.parse(json)
        {:ok, result} = SchemaInterceptor.ingest(json, envelope: not lazy?)
        expected = DecisionLog.with_score(eager, result.entropy_score)
        assert result.envelope == if(lazy?, do: nil, else: expected)

        assert_receive {:host_bus, "gateway:decision_logs",
                        %{step_id: ^step_id, envelope: ^expected}}
      end
    end

    # The ingest reads :pubsub once per step and hands it down: a change must reach the
    # next step's broadcast, to a host's server and back, whichever way it is called.
    test "Application.put_env of :pubsub applies on the next step, to a host's server and back" do
      sid = unique_session("pubsub-switch")
      :ok = Events.subscribe(Events.decision_logs())

      ingest = fn opts ->
        json = Observatory.JSON.encode!(HTTP.envelope(%{"meta" => %{"session_id" => sid}}))
        {:ok, %{step_id: step_id}} = SchemaInterceptor.ingest(json, opts)
        step_id
      end

      try do
        for opts <- [[envelope: false], []] do
          step_id = ingest.(opts)
          assert_receive %{event_type: "decision_log", step_id: ^step_id}
          refute_received {:host_bus, "gateway:decision_logs", _}

          Observatory.configure(pubsub: {__MODULE__.HostBus, :host_bus})
          step_id = ingest.(opts)
          assert_receive {:host_bus, "gateway:decision_logs", %{step_id: ^step_id}}
          refute_received %{event_type: "decision_log", step_id: ^step_id}

          Application.delete_env(:observatory, :pubsub)
          Observatory.IngestSettings.refresh()
          step_id = ingest.(opts)
          assert_receive %{event_type: "decision_log", step_id: ^step_id}
          refute_received {:host_bus, "gateway:decision_logs", _}
        end
      after
        Events.unsubscribe(Events.decision_logs())
      end
    end

    # The ingest reads :pubsub once for the step and hands it to broadcast_lazy/3, which
    # decided with it whether to make the message but then sent it through a second
    # read of the setting: a change between the two went to a server not asked.
    test "Events.broadcast_lazy/3 sends through the server it is given, not a second read" do
      topic = "test:given:#{System.unique_integer([:positive])}"
      host = {__MODULE__.HostBus, :host_bus}

      # Configured: Observatory's own. Given: the host's.
      assert Events.broadcast_lazy(topic, fn -> %{n: 1} end, host) == :ok
      assert_received {:host_bus, ^topic, %{n: 1}}

      # Configured: the host's. Given: Observatory's own, which a subscriber follows.
      :ok = Events.subscribe(topic)

      try do
        Observatory.configure(pubsub: host)
        own = {Observatory.PubSub, Observatory.PubSub}
        assert Events.broadcast_lazy(topic, fn -> %{n: 2} end, own) == :ok
        assert_received %{n: 2}
        refute_received {:host_bus, _, _}
      after
        Application.delete_env(:observatory, :pubsub)
        Observatory.IngestSettings.refresh()
        Events.unsubscribe(topic)
      end
    end

    test "Events.broadcast_lazy/2 makes the message only for a topic someone follows" do
      topic = "test:lazy:#{System.unique_integer([:positive])}"
      me = self()
      make = fn -> send(me, :made) && %{hello: 1} end

      assert Events.broadcast_lazy(topic, make) == :ok
      refute_received :made

      :ok = Events.subscribe(topic)

      try do
        assert Events.broadcast_lazy(topic, make) == :ok
        assert_received :made
        assert_received %{hello: 1}
      after
        Events.unsubscribe(topic)
      end
    end

    test "envelope: nil is taken as false, as for the result (it raised BadBooleanError)" do
      sid = unique_session("nil-opt")
      envelope = HTTP.envelope(%{"meta" => %{"session_id" => sid}})
      json = Observatory.JSON.encode!(envelope)
      assert {:ok, %{envelope: nil} = result} = SchemaInterceptor.ingest(json, envelope: nil)
      assert SessionLog.recent(sid) == [DecisionLog.with_score(envelope, result.entropy_score)]
    end

    test "an envelope given as a map is stored and answered as before" do
      sid = unique_session("map")
      envelope = HTTP.envelope(%{"meta" => %{"session_id" => sid}})
      {:ok, result} = SchemaInterceptor.ingest(envelope)
      assert result.envelope == DecisionLog.with_score(envelope, result.entropy_score)
      assert SessionLog.recent(sid) == [result.envelope]
    end
  end
end
