defmodule Observatory.ReplayTest do
  # The gateway's state and config are global: not async.
  use Observatory.TrackerCase, async: false

  # Bad lines are logged as schema_violation warnings by the gateway, as any rejected message.
  @moduletag :capture_log

  alias Observatory.Gateway.{EntropyTracker, Events}
  alias Observatory.Replay
  alias Observatory.Replay.{ExampleDataset, Input, Record, Report}

  doctest Observatory.Replay.Input
  doctest Observatory.Replay.Record
  doctest Observatory.Replay.Report

  setup do
    restore_env_on_exit([:step_detection, :session_log_size, :loop_verdict])

    %{sid: unique_session("replay")}
  end

  defp flat(sid, overrides \\ %{}) do
    %{
      "session_id" => sid,
      "agent_id" => "agent-replay",
      "intent" => "search",
      "tool_call" => "read_file",
      "action_status" => "failure",
      "tool_input" => %{"path" => "/srv/missing.txt"},
      "result" => %{"error" => "enoent"}
    }
    |> Map.merge(overrides)
    |> Observatory.JSON.encode!()
  end

  defp envelope(sid, n, overrides \\ %{}) do
    Observatory.JSON.encode!(
      Map.merge(
        %{
          "meta" => %{
            "step_id" => "#{sid}-env-#{n}",
            "session_id" => sid,
            "agent_id" => "agent-env",
            "timestamp" => "2026-02-22T10:30:00Z"
          },
          "cognition" => %{"intent" => "search", "entropy_score" => 0.9},
          "action" => %{"tool_call" => "read_file", "status" => "failure"}
        },
        overrides
      )
    )
  end

  defp device(text, opts \\ []) do
    {:ok, io} = StringIO.open(text, opts)
    {:device, io}
  end

  defp run_lines(lines, opts \\ []),
    do: Replay.run([device(Enum.join(lines, "\n") <> "\n")], opts)

  defp session(report, sid), do: Enum.find(report.sessions, &(&1.session_id == sid))

  defp distinct(sid, n),
    do: for(i <- 1..n, do: flat(sid, %{"intent" => "intent-#{i}", "tool_call" => "tool-#{i}"}))

  describe "the report on known sequences" do
    test "5 identical failures: WARNING at step 3, LOOP at step 5, one alert, lowest 0.2", %{
      sid: sid
    } do
      report = run_lines(List.duplicate(flat(sid), 5))
      s = session(report, sid)

      assert s.steps == 5
      assert %{step: 3, step_id: step3, score: 0.3333, line: 3} = s.first_warning
      assert step3 == "#{sid}-3"
      assert %{step: 5, score: 0.2, line: 5} = s.first_loop
      assert s.warnings == 2
      assert s.alerts == 1
      assert s.lowest_score == 0.2 and s.lowest_score_step == 5
      assert s.last_severity == :loop
      assert s.agent_id == "agent-replay"
      assert report.summary.sessions == 1
      assert report.summary.sessions_warning == 1 and report.summary.sessions_loop == 1
      assert report.steps == 5 and report.lines == 5 and report.bad_lines == 0
    end

    test "issue 8: the loop verdict is in the report beside the entropy figures", %{sid: sid} do
      other = sid <> "-files"

      files =
        for i <- 1..8 do
          flat(other, %{
            "tool_call" => "read_file",
            "action_status" => "success",
            "tool_input" => %{"path" => "lib/file_#{i}.ex"},
            "result" => %{"content" => "module #{i}"}
          })
        end

      report = run_lines(List.duplicate(flat(sid), 5) ++ files)
      looping = session(report, sid)
      assert %{step: 3} = looping.first_verdict_loop
      assert looping.verdict_rule == :repeat
      assert looping.verdict_loops == 3

      reading = session(report, other)
      assert reading.first_loop != nil, "entropy alarms on eight reads of different files"
      assert reading.first_verdict_loop == nil, "the verdict sees different work"
      assert report.summary.sessions_verdict_loop == 1

      text = IO.iodata_to_binary(Observatory.Replay.Report.text(report, []))
      assert text =~ "loop at 3 (repeat)"
      assert text =~ ~r/verdict LOOP\s+1/
    end

    test "every LOOP step is one alert: 8 identical steps give 4", %{sid: sid} do
      s = session(run_lines(List.duplicate(flat(sid), 8)), sid)
      assert s.alerts == 4
      assert s.first_loop.step == 5
    end

    test "varied steps stay Normal with a lowest score of 1.0", %{sid: sid} do
      s = session(run_lines(distinct(sid, 7)), sid)
      assert s.first_warning == nil and s.first_loop == nil
      assert s.lowest_score == 1.0 and s.alerts == 0 and s.last_severity == :normal
    end

    test "the step detector: stagnation warns at step 4 and blocks at step 6", %{sid: sid} do
      s = session(run_lines(List.duplicate(flat(sid), 6)), sid)
      assert s.first_step_warning.step == 4
      assert s.first_step_block.step == 6
      assert s.step_warnings == 2 and s.step_blocks == 1
    end

    test "a record without a result is not analysed by the step detector", %{sid: sid} do
      line = flat(sid) |> decode!() |> Map.delete("result")
      s = session(run_lines(List.duplicate(Observatory.JSON.encode!(line), 8)), sid)
      assert s.first_loop.step == 5
      assert s.first_step_warning == nil and s.first_step_block == nil
    end

    test "sessions are interleaved, each keeps its own count; loops are listed first", %{sid: sid} do
      other = sid <> "-healthy"

      lines =
        Enum.zip(distinct(other, 5), List.duplicate(flat(sid), 5))
        |> Enum.flat_map(fn {a, b} -> [a, b] end)

      report = run_lines(lines)
      assert [%{session_id: ^sid}, %{session_id: ^other}] = report.sessions

      assert session(report, sid).first_loop == %{
               step: 5,
               step_id: "#{sid}-5",
               source: "-",
               line: 10,
               score: 0.2
             }

      assert session(report, other).steps == 5
    end
  end

  describe "input formats" do
    test "envelopes pass through, and mix with flat records of the same session", %{sid: sid} do
      report =
        run_lines([
          envelope(sid, 1),
          envelope(sid, 2),
          flat(sid, %{"agent_id" => "agent-env"}),
          envelope(sid, 4)
        ])

      s = session(report, sid)
      assert s.steps == 4
      assert s.first_warning.step == 3
      assert s.first_warning.step_id == "#{sid}-3"
      assert EntropyTracker.window(sid) |> length() == 4
    end

    test "status stands for action_status; a missing agent_id is \"unknown-agent\"", %{sid: sid} do
      line = flat(sid) |> decode!() |> Map.drop(["agent_id", "action_status"])
      line = Observatory.JSON.encode!(Map.put(line, "status", "timeout"))
      s = session(run_lines([line]), sid)
      assert s.agent_id == "unknown-agent" and s.agent_id == Record.default_agent_id()
      assert EntropyTracker.window(sid) == [{"search", "read_file", :timeout}]
    end

    test "a record's own step_id and timestamp are kept", %{sid: sid} do
      :ok = Events.subscribe(Events.decision_logs())

      line =
        flat(sid, %{
          "step_id" => "mine-1",
          "timestamp" => "2025-01-02T03:04:05Z",
          "prompt_text" => "p"
        })

      run_lines([line])
      assert_receive %{event_type: "decision_log", session_id: ^sid, envelope: envelope}
      assert envelope["meta"]["step_id"] == "mine-1"
      assert envelope["meta"]["timestamp"] == "2025-01-02T03:04:05Z"
      assert envelope["cognition"]["prompt_text"] == "p"
      assert envelope["action"]["result"] == %{"error" => "enoent"}
    end

    test "gzip is recognised by its magic bytes, whatever the file's name", %{sid: sid} = ctx do
      dir = tmp(ctx)
      text = Enum.join(List.duplicate(flat(sid), 5), "\n")
      File.write!(Path.join(dir, "steps.jsonl"), :zlib.gzip(text))
      report = Replay.run([Path.join(dir, "steps.jsonl")])
      assert session(report, sid).first_loop.step == 5
    end

    test "concatenated gzip members are read one after the other", %{sid: sid} = ctx do
      path = Path.join(tmp(ctx), "cat.jsonl.gz")
      member = :zlib.gzip(Enum.map_join(1..3, fn _ -> flat(sid) <> "\n" end))
      File.write!(path, [member, member])
      report = Replay.run([path])
      assert session(report, sid).steps == 6
      assert report.input_errors == []
    end

    test "a plain file, then a gzip file: sessions continue across sources", %{sid: sid} = ctx do
      dir = tmp(ctx)
      File.write!(Path.join(dir, "a.jsonl"), Enum.join(List.duplicate(flat(sid), 3), "\n"))

      File.write!(
        Path.join(dir, "b.jsonl.gz"),
        :zlib.gzip(Enum.join(List.duplicate(flat(sid), 2), "\n"))
      )

      report = Replay.run([Path.join(dir, "a.jsonl"), Path.join(dir, "b.jsonl.gz")])
      assert %{step: 5, line: 2, source: source} = session(report, sid).first_loop
      assert source == Path.join(dir, "b.jsonl.gz")
      assert report.sources == [Path.join(dir, "a.jsonl"), Path.join(dir, "b.jsonl.gz")]
    end

    test "stdin or any IO device, plain or gzip", %{sid: sid} do
      text = Enum.join(List.duplicate(flat(sid), 5), "\n")
      assert session(Replay.run([device(text)]), sid).first_loop.step == 5

      gz = :zlib.gzip(Enum.join(List.duplicate(flat(sid <> "-gz"), 5), "\n"))
      report = Replay.run([device(gz)])
      assert session(report, sid <> "-gz").first_loop.step == 5
    end

    test "CRLF line endings and blank lines", %{sid: sid} do
      text = Enum.join([flat(sid), "", "   ", flat(sid), flat(sid)], "\r\n")
      report = Replay.run([device(text)])
      assert report.lines == 3 and report.bad_lines == 0
      assert session(report, sid).first_warning.line == 5
    end
  end

  describe "a step met again (a log that recorded a client's retry)" do
    test "the same envelope twice is one step; the same step_id with another body is a bad line",
         %{sid: sid} do
      retried = envelope(sid, 1)
      changed = envelope(sid, 1, %{"action" => %{"tool_call" => "grep", "status" => "failure"}})
      report = run_lines([retried, retried, envelope(sid, 2), changed])

      assert %{steps: 2} = session(report, sid)
      assert report.summary.replayed_steps == 1
      assert [%{line: 4, reason: reason}] = report.bad
      assert reason =~ ~s(meta.step_id "#{sid}-env-1" of session "#{sid}" was already recorded)
      assert IO.iodata_to_binary(Report.text(report)) =~ ~r/steps met again\s+1/
    end

    test "flat records with their own step_id, repeated, count once", %{sid: sid} do
      line = flat(sid, %{"step_id" => "own-1"})
      report = run_lines([line, line, line])
      assert %{steps: 1} = session(report, sid)
      assert report.summary.replayed_steps == 2
    end
  end

  describe "issue 15: a recorded proxy log (LLM requests)" do
    # The OpenAI conversation an agent re-sends on every turn: turn k carries k answered
    # tool calls, the same failing build each time.
    defp openai_request(turns) do
      calls =
        Enum.flat_map(1..turns//1, fn k ->
          [
            %{
              "role" => "assistant",
              "tool_calls" => [
                %{
                  "id" => "call-#{k}",
                  "type" => "function",
                  "function" => %{"name" => "run", "arguments" => ~s({"cmd":"make"})}
                }
              ]
            },
            %{
              "role" => "tool",
              "tool_call_id" => "call-#{k}",
              "content" => "error: x.c:3 missing ;"
            }
          ]
        end)

      %{
        "model" => "gpt-4o",
        "messages" => [%{"role" => "user", "content" => "fix the build"} | calls]
      }
    end

    defp recorded(sid, request, extra \\ %{}) do
      Observatory.JSON.encode!(
        Map.merge(
          %{"agent_id" => "agent-proxied", "session_id" => sid, "request" => request},
          extra
        )
      )
    end

    test "each request's previous turn is a step, each once; the loop is found", %{sid: sid} do
      # Turns 0..4, and turn 3 re-sent (a retry): four steps, not seven.
      lines = for turns <- [0, 1, 2, 3, 3, 4], do: recorded(sid, openai_request(turns))
      report = run_lines(lines)

      assert %{steps: 4, agent_id: "agent-proxied"} = s = session(report, sid)
      assert %{step: 3} = s.first_verdict_loop
      assert s.verdict_rule == :repeat
      assert report.bad_lines == 0
      # The re-sent request's step: answered again by the gateway, not counted again.
      assert report.summary.replayed_steps == 1
    end

    test "Anthropic Messages requests, and a session derived from the conversation" do
      request = fn turns ->
        blocks =
          Enum.flat_map(1..turns//1, fn k ->
            [
              %{
                "role" => "assistant",
                "content" => [
                  %{
                    "type" => "tool_use",
                    "id" => "tu-#{k}",
                    "name" => "grep",
                    "input" => %{"q" => "x#{k}"}
                  }
                ]
              },
              %{
                "role" => "user",
                "content" => [
                  %{"type" => "tool_result", "tool_use_id" => "tu-#{k}", "content" => "hit #{k}"}
                ]
              }
            ]
          end)

        %{
          "messages" => [
            %{"role" => "user", "content" => "find x #{System.unique_integer()}"} | blocks
          ]
        }
      end

      body = request.(2)

      line =
        Observatory.JSON.encode!(%{
          "api" => "messages",
          "agent_id" => "agent-a",
          "request" => body
        })

      report = run_lines([line])
      derived = Observatory.Replay.ProxyRequest.session_id("agent-a", body)
      # Stable across runs: keyed with a fixed key, not this gateway's secret.
      refute derived == Observatory.Proxy.SessionId.derive("agent-a", body)
      assert %{steps: 1, first_verdict_loop: nil} = session(report, derived)
    end

    test "a bad recorded request is a bad line; envelopes and flat records still read", %{
      sid: sid
    } do
      lines = [
        recorded(sid, %{"messages" => "not a list"}),
        recorded(sid, openai_request(1), %{"api" => "completions"}),
        flat(sid),
        envelope(sid <> "-env", 1, %{"request" => %{"messages" => []}})
      ]

      report = run_lines(lines)

      assert [%{line: 1, reason: "request.messages must be a list"}, %{line: 2, reason: reason}] =
               report.bad

      assert reason =~ "api must be chat_completions, messages or responses"
      assert %{steps: 1} = session(report, sid)
      assert %{steps: 1} = session(report, sid <> "-env")
    end
  end

  describe "bad lines" do
    test "are counted and reported with their line numbers, never fatal", %{sid: sid} do
      lines = [
        flat(sid),
        "not json",
        ~s({"session_id": "#{sid}", "intent": ),
        "[1, 2]",
        "",
        flat(sid, %{"action_status" => "exploded"}),
        flat(sid) |> decode!() |> Map.delete("intent") |> Observatory.JSON.encode!(),
        envelope(sid, 8, %{"action" => %{"tool_call" => "read_file"}}),
        flat(sid)
      ]

      report = run_lines(lines)
      assert report.bad_lines == 6
      assert report.summary.bad_lines == 6

      assert [
               %{line: 2, reason: "invalid JSON: " <> _},
               %{line: 3, reason: "invalid JSON: EOF" <> _},
               %{line: 4, reason: "not a JSON object"},
               %{line: 6, reason: "action_status must be one of: " <> _},
               %{line: 7, reason: "intent is required"},
               %{line: 8, reason: "action.status is required"}
             ] = report.bad

      assert Enum.all?(report.bad, &(&1.source == "-"))
      assert session(report, sid).steps == 2
      assert EntropyTracker.window(sid) |> length() == 2, "rejected lines never reach the tracker"
    end

    test "all are counted, the first :max_bad_lines are kept", %{sid: sid} do
      report = run_lines(List.duplicate("nope", 10) ++ [flat(sid)], max_bad_lines: 3)
      assert report.bad_lines == 10
      assert Enum.map(report.bad, & &1.line) == [1, 2, 3]
      assert report.steps == 1
    end

    test "a truncated gzip file is an input error; the lines before the cut are replayed",
         %{sid: sid} = ctx do
      path = Path.join(tmp(ctx), "cut.jsonl.gz")
      gz = :zlib.gzip(Enum.join(distinct(sid, 3000), "\n"))
      File.write!(path, binary_part(gz, 0, div(byte_size(gz), 2)))
      report = Replay.run([path])

      assert [%{source: ^path, reason: "gzip: unexpected end of input" <> _}] =
               report.input_errors

      assert session(report, sid).steps > 0
    end

    test "a file that cannot be opened is an input error", %{sid: sid} do
      report = Replay.run(["/nonexistent/steps.jsonl", device(flat(sid))])

      assert [%{source: "/nonexistent/steps.jsonl", reason: "cannot open" <> _}] =
               report.input_errors

      assert report.steps == 1
    end
  end

  describe "same path as the gateway" do
    test "alerts are the EntropyAlertEvents broadcast on gateway:entropy_alerts", %{sid: sid} do
      :ok = Events.subscribe(Events.entropy_alerts())
      report = run_lines(List.duplicate(flat(sid), 9), workers: 2)
      received = collect_alerts(sid, [])
      assert length(received) == session(report, sid).alerts
      assert length(received) == 5
      assert hd(received).agent_id == "agent-replay"
    end

    test "the gateway's authoritative score replaces the envelope's own", %{sid: sid} do
      :ok = Events.subscribe(Events.decision_logs())
      run_lines([envelope(sid, 1)])
      assert_receive %{session_id: ^sid, envelope: %{"cognition" => %{"entropy_score" => 1.0}}}
    end
  end

  describe "overrides" do
    test "window size and thresholds take effect on the next step", %{sid: sid} do
      settings = Replay.configure(window_size: 3, loop_threshold: 0.4, warning_threshold: 0.6)
      assert %{window_size: 3, loop_threshold: 0.4, warning_threshold: 0.6} = settings
      s = session(run_lines(List.duplicate(flat(sid), 3)), sid)
      # 1.0, 0.5 (WARNING below 0.6), 0.3333 (LOOP below 0.4)
      assert s.first_warning.step == 2
      assert s.first_loop.step == 3
      assert run_lines([]).settings.window_size == 3
    end

    test "step detector thresholds", %{sid: sid} do
      Replay.configure(stagnation_warn: 2, stagnation_block: 3)
      s = session(run_lines(List.duplicate(flat(sid), 4)), sid)
      assert s.first_step_warning.step == 3
      assert s.first_step_block.step == 4
    end

    test "bad values are refused with the value in the message" do
      assert_raise ArgumentError, ~r/window_size .* got: 0/, fn ->
        Replay.configure(window_size: 0)
      end

      assert_raise ArgumentError, ~r/window_size to be in 1..1024/, fn ->
        Replay.configure(window_size: 2000)
      end

      assert_raise ArgumentError, ~r/loop_threshold .* got: 1.5/, fn ->
        Replay.configure(loop_threshold: 1.5)
      end

      assert_raise ArgumentError, ~r/stuck_block \(2\) to be at least stuck_warn \(3\)/, fn ->
        Replay.configure(stuck_warn: 3, stuck_block: 2)
      end

      assert Replay.settings().stuck_warn == 5, "nothing is applied when a value is refused"
    end

    test "issue 26: near_share is a percent 50..100, the run lengths may be :never" do
      assert_raise ArgumentError, ~r/near_share to be an integer 50..100, got: 40/, fn ->
        Replay.configure(near_share: 40)
      end

      Replay.configure(near_share: 100, failure_run_loop: :never, revisit_loop: :never)
      assert %{near_share: 100, revisit_loop: :never} = Replay.settings().verdict
    end
  end

  describe "workers" do
    test "two workers give the same report as one" do
      one = Replay.run([device(dataset("w1-"))], workers: 1)
      two = Replay.run([device(dataset("w2-"))], workers: 2)
      assert comparable(one, "w1-") == comparable(two, "w2-")
      assert one.summary.sessions == 14
    end
  end

  describe "the example dataset" do
    test "examples/agent_steps.jsonl is what the generator writes" do
      committed = File.read!(Path.expand("../../examples/agent_steps.jsonl", __DIR__))
      assert committed == dataset("")
    end

    test "the report tells healthy sessions from looping ones (gzip copy)", ctx do
      path = Path.join(tmp(ctx), "agent_steps.jsonl.gz")
      ExampleDataset.write!(path, prefix: "ex-")
      assert <<0x1F, 0x8B, _::binary>> = File.read!(path)
      report = Replay.run([path], workers: 2)
      by_kind = Enum.group_by(report.sessions, &kind/1)

      for s <- by_kind["healthy"] do
        assert s.first_warning == nil and s.first_loop == nil and s.lowest_score == 1.0
        assert s.first_step_warning == nil
      end

      for kind <- ["loop-same-failure", "loop-stuck", "recovers", "envelope-same-failure"],
          s <- by_kind[kind] do
        assert s.first_loop.step > s.first_warning.step, "#{s.session_id} warns before it loops"
        assert s.lowest_score == 0.2
        assert s.first_step_block
      end

      for s <- by_kind["loop-alternating"] do
        assert s.first_warning && s.first_loop == nil && s.lowest_score == 0.4
        assert s.first_step_block
      end

      for s <- by_kind["recovers"] do
        assert %{first_warning: %{step: 3}, first_loop: %{step: 5}, last_severity: :normal} = s
      end

      assert %{agent_id: "unknown-agent"} =
               Enum.find(report.sessions, &(&1.session_id == "ex-healthy-4"))

      assert Enum.map(report.bad, & &1.line) == [12, 40, 75, 110, 150]

      assert report.summary == %{
               sessions: 14,
               steps: 266,
               replayed_steps: 0,
               sessions_warning: 10,
               sessions_loop: 8,
               alerts: 45,
               sessions_step_warning: 10,
               sessions_step_block: 10,
               sessions_verdict_suspect: 10,
               # loop-stuck-*: new searches, the same miss: a loop since issue 26 (four
               # failures in a row with the same error, rule (f)); healthy ones stay clean
               sessions_verdict_loop: 10,
               verdict_loops: 80,
               # under the default alert source (entropy): LOOP steps
               alert_source: :entropy,
               sessions_alarmed: 8,
               alarms: 45,
               bad_lines: 5
             }
    end
  end

  describe "Report" do
    test "text: settings, a row per session, bad lines and the summary; --flagged", %{sid: sid} do
      report = run_lines(List.duplicate(flat(sid), 5) ++ distinct(sid <> "-ok", 2) ++ ["oops"])
      text = IO.iodata_to_binary(Report.text(report))
      assert text =~ "entropy: window 5, LOOP below 0.25, WARNING below 0.5"
      assert text =~ ~r/#{sid}\s+agent-replay\s+5\s+3\s+5\s+1\s+0.2\s+warn at 4/
      assert text =~ ~r/#{sid}-ok\s+agent-replay\s+2\s+-\s+-\s+0\s+1.0\s+-/
      assert text =~ "-:8  invalid JSON"
      assert text =~ ~r/sessions with LOOP\s+1/
      flagged = IO.iodata_to_binary(Report.text(report, flagged: true))
      refute flagged =~ "#{sid}-ok"
      assert flagged =~ ~r/sessions\s+2/
    end

    test "json parses with Observatory.JSON and carries the same numbers", %{sid: sid} do
      report = run_lines(List.duplicate(flat(sid), 5) ++ ["oops"])
      assert {:ok, json} = Observatory.JSON.decode(Report.json(report))
      assert %{"summary" => %{"sessions_loop" => 1, "alerts" => 1, "steps" => 5}} = json

      assert %{"bad_lines" => %{"count" => 1, "lines" => [%{"line" => 6, "source" => "-"}]}} =
               json

      assert [%{"session_id" => ^sid, "first_loop" => %{"step" => 5}, "last_severity" => "loop"}] =
               json["sessions"]

      assert json["settings"]["window_size"] == 5
    end
  end

  describe "Input" do
    test "a line longer than a read chunk, and a last line without a newline", ctx do
      path = Path.join(tmp(ctx), "long.jsonl")
      long = ~s({"x": ") <> String.duplicate("a", 600_000) <> ~s("})
      File.write!(path, ["first\n", long, "\nlast"])
      assert [{1, "first"}, {2, ^long}, {3, "last"}] = Enum.to_list(Input.lines(path))
    end

    test "a one-byte input, and an empty one" do
      assert Enum.to_list(Input.lines(device("x"))) == [{1, "x"}]
      assert Enum.to_list(Input.lines(device(""))) == []
    end
  end

  defp decode!(json) do
    {:ok, term} = Observatory.JSON.decode(json)
    term
  end

  defp collect_alerts(sid, acc) do
    receive do
      %{event_type: "entropy_alert", session_id: ^sid} = alert ->
        collect_alerts(sid, [alert | acc])
    after
      100 -> Enum.reverse(acc)
    end
  end

  defp dataset(prefix), do: ExampleDataset.lines(prefix: prefix) |> Enum.map_join(&(&1 <> "\n"))

  defp kind(%{session_id: "ex-" <> id}), do: String.replace(id, ~r/-\d+$/, "")

  defp comparable(report, prefix) do
    strip = fn
      %{} = mark when is_map(mark) -> Map.drop(mark, [:step_id])
      nil -> nil
    end

    sessions =
      for s <- report.sessions do
        %{
          s
          | session_id: String.replace_prefix(s.session_id, prefix, ""),
            agent_id: String.replace(s.agent_id, prefix, "")
        }
        |> Map.update!(:first_warning, strip)
        |> Map.update!(:first_loop, strip)
        |> Map.update!(:first_step_warning, strip)
        |> Map.update!(:first_step_block, strip)
        |> Map.update!(:first_suspect, strip)
        |> Map.update!(:first_verdict_loop, strip)
      end

    {sessions, report.summary, Enum.map(report.bad, &Map.drop(&1, [:reason]))}
  end

  defp tmp(ctx) do
    dir =
      Path.join(
        System.tmp_dir!(),
        "observatory_replay_test_#{ctx.test |> :erlang.phash2()}_#{System.unique_integer([:positive])}"
      )

    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    dir
  end
end
