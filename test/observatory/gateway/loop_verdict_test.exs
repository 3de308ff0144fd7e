defmodule Observatory.Gateway.LoopVerdictTest do
  use Observatory.TrackerCase, async: false

  import ExUnit.CaptureLog

  alias Observatory.Gateway.{DecisionLog, Events, LoopVerdict, SchemaInterceptor}
  alias Observatory.Test.HTTP

  doctest LoopVerdict

  setup do
    # on_exit runs last first: the settings are put back, then the rules rebuilt.
    on_exit(&LoopVerdict.reload_rules/0)
    restore_env_on_exit([:loop_verdict])

    :ok = Events.subscribe(LoopVerdict.topic())
    %{sid: unique_session("sess-verdict")}
  end

  defp envelope(sid, action) do
    HTTP.envelope(%{
      "meta" => %{"session_id" => sid},
      "action" => Map.merge(%{"tool_call" => "read_file", "status" => "failure"}, action)
    })
  end

  defp keys(action), do: unpack(packed_keys(action))

  defp packed_keys(action),
    do: elem(DecisionLog.from_map(envelope("sess-keys", action)), 2).verdict_keys

  # The keys the parse packs in one binary (opaque to callers: little-endian words as
  # `StepKeys::to_bytes` writes them), as a tuple the tests read by position:
  # `{call, outcome, gist, skeleton, sketches, flags, {tool, shape, exact, wording}}`,
  # `sketches` the line sketch, the number sketch's words and count, the opening's hash.
  defp unpack(
         <<call::little-64, outcome::little-64, gist::little-64, skeleton::little-64,
           tool::little-64, shape::little-64, exact::little-64, wording::little-64,
           opening::binary-size(8), numbers::binary-size(36), flags, lines::binary-size(128)>>
       ),
       do:
         {call, outcome, gist, skeleton, lines <> numbers <> opening, flags,
          {tool, shape, exact, wording}}

  # The keys but the result word for word (before normalization, so ids stay in it).
  defp normalized_keys(action) do
    {call, outcome, gist, skeleton, sketches, flags, {tool, shape, _exact, wording}} =
      keys(action)

    {call, outcome, gist, skeleton, sketches, flags, {tool, shape, wording}}
  end

  defp ingest(sid, action) do
    {:ok, result} = SchemaInterceptor.ingest(envelope(sid, action))
    result.verdict
  end

  defp put_config(overrides),
    do: Observatory.configure(loop_verdict: Keyword.merge(LoopVerdict.defaults(), overrides))

  defp put_env_config(overrides),
    do:
      Application.put_env(
        :observatory,
        :loop_verdict,
        Keyword.merge(LoopVerdict.defaults(), overrides)
      )

  @fail %{
    "tool_input" => %{"path" => "config/prod.secret.exs"},
    "result" => %{"error" => "ENOENT"}
  }

  describe "the verdict on each step" do
    test "the same call and result: progress, suspect, loop, with the rule, reason and evidence",
         %{sid: sid} do
      assert %{verdict: :progress, previous: nil, rule: :none, step_number: 1} =
               ingest(sid, @fail)

      assert %{verdict: :suspect, previous: :progress, rule: :repeat} = ingest(sid, @fail)

      assert %{verdict: :loop, rule: :repeat, evidence: [1, 2, 3], reason: reason} =
               ingest(sid, @fail)

      assert reason == "the same call 3 times in a row, its result saying nothing new"
      assert %{verdict: :loop, step_number: 3} = LoopVerdict.session(sid)
      assert Enum.any?(LoopVerdict.flagged(), &(&1.session_id == sid and &1.verdict == :loop))
    end

    test "changes are broadcast on gateway:loop_verdict, once each", %{sid: sid} do
      for _ <- 1..4, do: ingest(sid, @fail)
      assert_receive %{event_type: "loop_verdict", session_id: ^sid, verdict: :suspect}
      assert_receive %{event_type: "loop_verdict", session_id: ^sid, verdict: :loop} = event

      assert %{agent_id: "agent-http", previous: :suspect, rule: :repeat, evidence: [1, 2, 3]} =
               event

      refute_receive %{event_type: "loop_verdict", session_id: ^sid}, 50

      # A new call ends the run, but the entropy window still holds the four repeats.
      ingest(sid, %{"tool_call" => "write_file", "status" => "success"})

      assert_receive %{
        event_type: "loop_verdict",
        session_id: ^sid,
        verdict: :suspect,
        previous: :loop,
        rule: :entropy
      }
    end

    test "a step without a result is judged on its status, as a blank result", %{sid: sid} do
      # Nothing to show progress or its absence: blank_repeat_loop (4) repeats, not 3.
      for _ <- 1..2, do: ingest(sid, %{})
      assert %{verdict: :suspect} = ingest(sid, %{})
      assert %{verdict: :loop, reason: reason} = ingest(sid, %{})
      assert reason == "the same call 4 times in a row, each time with an empty result"
    end

    test "forget starts the session over", %{sid: sid} do
      for _ <- 1..3, do: ingest(sid, @fail)
      assert LoopVerdict.forget(sid)
      assert %{verdict: :progress, step_number: 1} = ingest(sid, @fail)
      refute LoopVerdict.forget("nope-#{sid}")
      assert LoopVerdict.session("nope-#{sid}") == nil
    end
  end

  describe "stuck, not only repeating: rules (e) near repeat, (f) failure run, (g) revisit" do
    # An SQL agent re-sending a query with a changed LIMIT: each time the same error.
    defp near_query(n) do
      %{
        "tool_call" => "sql",
        "tool_input" => %{
          "query" => "SELECT code FROM template WHERE description = 'Book' LIMIT #{n}"
        },
        "result" => "Error: Table 'docs.template' doesn't exist"
      }
    end

    test "(e) nearly identical calls with the same answer: suspect at 3, loop at 4", %{sid: sid} do
      assert %{verdict: :progress} = ingest(sid, near_query(1))
      assert %{verdict: :progress} = ingest(sid, near_query(10))
      assert %{verdict: :suspect, rule: :near_repeat} = ingest(sid, near_query(100))

      assert %{verdict: :loop, rule: :near_repeat, evidence: [1, 2, 3, 4], reason: reason} =
               ingest(sid, near_query(1000))

      assert reason =~ "4 nearly identical calls in a row"
      assert_receive %{event_type: "loop_verdict", session_id: ^sid, rule: :near_repeat}
    end

    test "(e) near_share: 100 compares identical calls only", %{sid: sid} do
      put_config(near_share: 100, failure_run_loop: :never)
      for n <- [1, 10, 100], do: ingest(sid, near_query(n))
      refute match?(%{verdict: :loop}, ingest(sid, near_query(1000)))
    end

    test "(e) nearly identical pipelines whose checksums differ are progress", %{sid: sid} do
      pipeline = fn stage, sum ->
        %{
          "tool_call" => "bash",
          "status" => "success",
          "tool_input" => %{
            "command" =>
              "find /testbed/dir1 -maxdepth 3 -name '*.py' -type f -exec md5sum {} + | #{stage} | md5sum"
          },
          "result" => "#{sum}  -\n"
        }
      end

      sums = ["df3b03a223a32744829fe026fa679cbb", "909665ab1e8bb4ddfa3f64bb5383af55"]
      sums = sums ++ ["534c0016a34e49982f00b9e35a700eba", "abd1db025ea1e9dbef827b574c500bdb"]
      # One more sort option each time.
      stages = ["sort -k 2", "sort -k 2 -r", "sort -k 2 -r -u", "sort -k 2 -r -u -s"]

      for {stage, sum} <- Enum.zip(stages, sums),
          do: assert(%{verdict: :progress} = ingest(sid, pipeline.(stage, sum)))

      # The same checksum each time: the same answer, a loop at the fourth.
      other = sid <> "-same"
      for stage <- Enum.take(stages, 3), do: ingest(other, pipeline.(stage, hd(sums)))

      assert %{verdict: :loop, rule: :near_repeat} =
               ingest(other, pipeline.(List.last(stages), hd(sums)))
    end

    test "(g) the identical call with an empty answer again, only failures between", %{sid: sid} do
      copy = %{
        "tool_input" => %{"command" => "cp -r src/* dst/"},
        "status" => "success",
        "result" => ""
      }

      miss = fn n ->
        %{"tool_input" => %{"command" => "cp f#{n} dst/"}, "result" => "no f#{n}"}
      end

      for step <- [copy, miss.(1), copy, miss.(2), copy, miss.(3)], do: ingest(sid, step)
      assert %{verdict: :loop, rule: :revisit, evidence: [1, 3, 5, 7]} = ingest(sid, copy)

      # `sleep` between polls that move: an answer came between.
      other = sid <> "-poll"
      sleep = %{"tool_input" => %{"command" => "sleep 5"}, "status" => "success", "result" => ""}

      poll = fn p ->
        %{"tool_input" => %{"job" => 7}, "status" => "success", "result" => "#{p} %"}
      end

      for step <- [sleep, poll.(10), sleep, poll.(40), sleep, poll.(70), sleep] do
        refute match?(%{verdict: :loop}, ingest(other, step))
        refute match?(%{rule: :revisit}, LoopVerdict.session(other))
      end
    end

    test "(g) a revisit's evidence names stored steps the Inspect view explains", %{sid: sid} do
      look = fn what ->
        %{
          "tool_call" => "get_#{what}",
          "tool_input" => %{"id" => "#{what}-7"},
          "status" => "success",
          "result" => %{"#{what}" => "the same #{what} details"}
        }
      end

      for what <- ["user", "order", "invoice", "user", "shipment", "order", "invoice"],
          do: ingest(sid, look.(what))

      assert %{rule: :revisit, evidence: [1, 2, 3, 4, 6, 7] = numbers} = LoopVerdict.session(sid)
      explained = Observatory.Gateway.Evidence.for_session(sid).verdict
      assert %{rule: :revisit, steps: ^numbers, missing: []} = explained
      assert Enum.map(explained.calls, & &1.tool) == ["get_user", "get_order", "get_invoice"]
    end

    test "(f) different calls failing with the same error in a row: loop at 4", %{sid: sid} do
      call = fn args ->
        %{
          "tool_call" => "search_api",
          "tool_input" => args,
          "result" => %{"error" => "invalid arguments: expected {\"term\": string}"}
        }
      end

      ingest(sid, call.(%{"q" => "refund policy"}))
      ingest(sid, call.(%{"query" => "refund policy for cancelled flights"}))
      assert %{verdict: :suspect, rule: :failure_run} = ingest(sid, call.(%{"text" => "refund"}))

      assert %{verdict: :loop, rule: :failure_run, reason: reason} =
               ingest(sid, call.(%{"search" => %{"words" => ["refund", "policy"]}}))

      assert reason == "4 calls in a row failed with the same error"
    end

    # A pipeline grown by one stage each time, the shell's quoting error quoting it.
    defp grown_pipeline(stages) do
      tail = Enum.map_join(stages, fn stage -> " | " <> stage end)
      echoed = "$1t$2}'" <> tail

      %{
        "tool_call" => "bash",
        "status" => "failure",
        "tool_input" => %{
          "command" =>
            "find /data -name '*.log' -exec du -h {} + | awk '{print \"size: \"$1\"\\t\"$2}'" <>
              tail
        },
        "result" =>
          "#{echoed}: -c: line 1: unexpected EOF while looking for matching `''\n" <>
            "#{echoed}: -c: line 2: syntax error: unexpected end of file\n"
      }
    end

    test "(f) an error echoing its grown call is the same error: loop at 4", %{sid: sid} do
      stages = ["sort -h", "tail -n 5", "cut -f 2"]

      for n <- 0..2,
          do: refute(match?(%{verdict: :loop}, ingest(sid, grown_pipeline(Enum.take(stages, n)))))

      assert %{verdict: :loop, rule: :failure_run, evidence: [1, 2, 3, 4]} =
               ingest(sid, grown_pipeline(stages))
    end

    test "(f) the near-miss: a path walked up, each error quoting the path it was given", %{
      sid: sid
    } do
      for path <-
            ["/srv/app/releases/current/config/", "/srv/app/releases/current/"] ++
              ["/srv/app/releases/", "/srv/app/"] do
        assert %{verdict: :progress} =
                 ingest(sid, %{
                   "tool_call" => "bash",
                   "status" => "failure",
                   "tool_input" => %{"command" => "ls #{path}"},
                   "result" => "ls: cannot access '#{path}': No such file or directory\n"
                 })
      end
    end

    test "(f) empty answers between the failures neither count nor break the run", %{sid: sid} do
      test_run = %{
        "tool_call" => "bash",
        "status" => "failure",
        "tool_input" => %{"command" => "mix test test/cart_test.exs"},
        "result" => "1 test, 1 failure: expected total 30, got 27"
      }

      edit = fn n ->
        %{
          "tool_call" => "edit_file",
          "status" => "success",
          "tool_input" => %{"path" => "lib/cart.ex", "line" => n, "text" => "discount #{n}"},
          "result" => ""
        }
      end

      for n <- 1..3, do: [ingest(sid, test_run), ingest(sid, edit.(n))]

      assert %{verdict: :loop, evidence: evidence} = ingest(sid, test_run)
      assert [1, 3, 5, 7] = Enum.take(evidence, -4)
    end

    test "(f) answers opening with the same line, failed or not: loop at 4", %{sid: sid} do
      # Every command in a fence the shell cannot run: the rejection first, then the
      # command's own output, the status following that output.
      fenced = fn command, status, rest ->
        %{
          "tool_call" => "bash",
          "status" => status,
          "tool_input" => %{"command" => "```sh\n#{command}\n```"},
          "result" => "sh: 3: sh: not found\n#{rest}"
        }
      end

      assert %{verdict: :progress} =
               ingest(sid, fenced.("ls /srv/app", "failure", "sh: 3: config.yaml: not found"))

      assert %{verdict: :progress} =
               ingest(sid, fenced.("find /srv/app -name '*.yaml'", "success", ""))

      assert %{verdict: :suspect, rule: :failure_run} =
               ingest(
                 sid,
                 fenced.(
                   "grep -n port /srv/app/config.yaml",
                   "failure",
                   "sh: 3: 4:port:: not found"
                 )
               )

      assert %{verdict: :loop, rule: :failure_run, evidence: [1, 2, 3, 4], reason: reason} =
               ingest(
                 sid,
                 fenced.("wc -l /srv/app/config.yaml", "failure", "sh: 3: 12: not found")
               )

      assert reason ==
               "4 calls in a row got answers opening with the same line, 3 failed and 1 succeeded: " <>
                 "something in front of every call rejects it"
    end

    test "(f) the near-miss: a test runner's banner, failing three times, then passing", %{
      sid: sid
    } do
      banner =
        "============================= test session starts ==============================\n"

      run = fn n, status, tail ->
        %{
          "tool_call" => "bash",
          "status" => status,
          "tool_input" => %{"command" => "pytest -q tests/test_parse.py -k case#{n}"},
          "result" => banner <> tail
        }
      end

      for {n, tail} <- [
            {1, "1 failed: expected 3"},
            {2, "1 failed: expected 4"},
            {3, "1 failed: got None"}
          ],
          do: assert(%{verdict: :progress} = ingest(sid, run.(n, "failure", tail)))

      # Three failures then a pass, all opening with the banner: the call that worked.
      assert %{verdict: :progress} = ingest(sid, run.(4, "success", "4 passed"))
    end

    test "(f) failure_run_loop: :never keeps it amber", %{sid: sid} do
      put_config(failure_run_loop: :never)

      for n <- 1..3,
          do: ingest(sid, %{"tool_input" => %{"path" => "f#{n}"}, "result" => "EACCES"})

      assert %{verdict: :suspect, rule: :failure_run} =
               ingest(sid, %{"tool_input" => %{"path" => "f4"}, "result" => "EACCES"})
    end

    test "(g) earlier lookups re-run with unchanged results: loop at the third revisit", %{
      sid: sid
    } do
      look = fn what ->
        %{
          "tool_call" => "get_#{what}",
          "tool_input" => %{"id" => "#{what}-7"},
          "status" => "success",
          "result" => %{"#{what}" => "the same #{what} details"}
        }
      end

      for what <- ["user", "order", "invoice", "user", "shipment"], do: ingest(sid, look.(what))
      assert %{verdict: :suspect, rule: :revisit} = ingest(sid, look.("order"))

      assert %{verdict: :loop, rule: :revisit, evidence: evidence, reason: reason} =
               ingest(sid, look.("invoice"))

      # The revisits (4, 6, 7) and the steps they repeat (1, 2, 3).
      assert evidence == [1, 2, 3, 4, 6, 7]
      assert reason =~ "3 of the last 6 steps repeated an earlier call"
    end

    test "(g) revisit_loop: :never and an invalid window", %{sid: sid} do
      put_config(revisit_loop: :never)

      look = fn n ->
        %{"tool_input" => %{"path" => "f#{n}"}, "status" => "success", "result" => "#{n}"}
      end

      for n <- [1, 2, 3, 1, 4, 2, 3], do: ingest(sid, look.(n))
      assert %{verdict: :suspect, rule: :revisit} = LoopVerdict.session(sid)

      assert {:error, _} = LoopVerdict.check_thresholds(revisit_window: 1)
      assert {:error, _} = LoopVerdict.check_thresholds(near_share: 49)
      assert {:error, _} = LoopVerdict.check_thresholds(failure_run_suspect: 5)
      assert :ok = LoopVerdict.check_thresholds(revisit_loop: :never, near_share: 100)
    end
  end

  describe "thresholds are read on every step" do
    test "a raised loop threshold takes effect on the next step", %{sid: sid} do
      put_config(repeat_loop: 5)
      for _ <- 1..3, do: ingest(sid, @fail)
      assert %{verdict: :suspect} = LoopVerdict.session(sid)
      ingest(sid, @fail)
      assert %{verdict: :loop} = ingest(sid, @fail)
    end

    test "entropy_rule: false leaves the ratio out", %{sid: sid} do
      read = fn n ->
        %{"tool_input" => %{"path" => "f#{n}"}, "status" => "success", "result" => "#{n}"}
      end

      for n <- 1..5, do: ingest(sid, read.(n))
      assert %{rule: :entropy, verdict: :progress} = LoopVerdict.session(sid)
      put_config(entropy_rule: false)
      assert %{rule: :none, verdict: :progress} = ingest(sid, read.(6))
    end

    test "an invalid set is logged once and replaced by the defaults", %{sid: sid} do
      log =
        capture_log(fn ->
          # A set configure/1 refuses, put as a host's config would put it.
          put_env_config(repeat_suspect: 4, repeat_loop: 3)
          Observatory.IngestSettings.refresh()
          for _ <- 1..3, do: ingest(sid, @fail)
        end)

      assert %{verdict: :loop} = LoopVerdict.session(sid)
      assert length(String.split(log, "invalid :loop_verdict thresholds")) == 2
    end
  end

  describe "normalization (the parse computes the keys)" do
    test "per-call ids go, plain numbers stay" do
      run = fn pid, at, ms ->
        normalized_keys(%{
          "tool_call" => "run_server",
          "tool_input" => %{"cmd" => "npm start", "request_id" => "req-#{pid}"},
          "result" => %{
            "pid" => pid,
            "elapsed_ms" => ms,
            "stderr" => "[#{at}] pid #{pid}: EADDRINUSE"
          }
        })
      end

      assert run.(4242, "2026-02-22T10:30:01Z", 812) == run.(5151, "2026-02-23T08:00:00Z", 790)

      poll = fn p -> keys(%{"result" => %{"progress" => p}}) end
      assert elem(poll.(10), 1) != elem(poll.(80), 1)
      file = fn n -> keys(%{"tool_input" => %{"path" => "file#{n}.txt"}}) end
      assert elem(file.(1), 0) != elem(file.(2), 0)
    end

    test "the keys are four 64-bit hashes, the sketches, flags, the tool, the input's shape and wording and the exact result, packed in one binary" do
      assert byte_size(packed_keys(@fail)) == 13 * 8 + 4 + 1 + 128

      assert {call, outcome, gist, skeleton, sketches, flags, {tool, shape, exact, wording}} =
               keys(@fail)

      for hash <- [call, outcome, gist, skeleton, tool, shape, exact, wording],
          do: assert(hash in 0..0xFFFF_FFFF_FFFF_FFFF)

      # 1024 bits of lines, 256 bits and a count of numbers, the opening line's hash
      assert byte_size(sketches) == 128 + 32 + 4 + 8
      # has a result (1) and failed (2), not blank (4)
      assert flags == 3
      assert {_, _, _, _, _, 4, _} = keys(%{"status" => "success"})
    end

    test "near-identical inputs share most of their word pairs, different ones few" do
      shape = fn input -> keys(%{"tool_input" => input}) |> elem(6) |> elem(1) end
      bits = fn n -> n |> Integer.digits(2) |> Enum.sum() end
      # the share of set bits two shapes have in common, in percent
      share = fn a, b ->
        div(100 * bits.(Bitwise.band(a, b)), max(bits.(Bitwise.bor(a, b)), 1))
      end

      query = "SELECT name FROM users WHERE city = 'Paris' ORDER BY name"
      near = shape.(%{"sql" => query <> " LIMIT 10"})
      assert share.(shape.(%{"sql" => query <> " LIMIT 1"}), near) >= 75
      assert share.(shape.(%{"sql" => "DESCRIBE orders"}), near) < 50
      # The tool is part of the call, not of its shape.
      assert elem(elem(keys(%{"tool_call" => "a"}), 6), 0) !=
               elem(elem(keys(%{"tool_call" => "b"}), 6), 0)
    end

    test "issue 26: the exact result keeps what normalization hides (a checksum, an id)" do
      step = fn result -> %{"status" => "success", "result" => result} end
      exact = fn result -> keys(step.(result)) |> elem(6) |> elem(2) end
      outcome = fn result -> keys(step.(result)) |> elem(1) end
      a = "df3b03a223a32744829fe026fa679cbb  -\n"
      b = "909665ab1e8bb4ddfa3f64bb5383af55  -\n"
      assert outcome.(a) == outcome.(b)
      assert exact.(a) != exact.(b)
      assert exact.(a) == exact.(a)
    end

    test "a failure's exact key is its reply: the error without the words of its call" do
      reply = fn command, result ->
        keys(%{"tool_input" => %{"command" => command}, "result" => result})
        |> elem(6)
        |> elem(2)
      end

      # The error quotes the file it was given: the reply is the same.
      assert reply.("cat notes.txt", "cat: notes.txt: No such file or directory") ==
               reply.("cat todo.md", "cat: todo.md: No such file or directory")

      # A count the call does not hold is kept; an id is masked.
      assert reply.("pytest", "3 failed") != reply.("pytest", "2 failed")

      assert reply.("sh x", "sh: 0d1e201ac67b5a979c52f42eb8dd3702: not found") ==
               reply.("sh x", "sh: 3a2e45dcead29bb7dbd132e72fab5e35: not found")
    end

    test "whitespace inside the input's strings does not make a new call" do
      cmd = fn c -> elem(keys(%{"tool_input" => %{"command" => c}}), 0) end
      assert cmd.("python run.py") == cmd.("python  run.py ")
      assert cmd.("python run.py") == cmd.("python\trun.py\n")
      assert cmd.("python run.py") != cmd.("python run2.py")
    end

    test "reload_rules/0 applies new volatile keys and number rules" do
      token = fn t -> keys(%{"tool_input" => %{"job_token" => "tok-#{t}"}}) end
      assert token.(1) != token.(2)
      poll = fn p -> normalized_keys(%{"result" => %{"progress" => p}}) end

      # Put without configure/1, which reloads the rules itself.
      put_env_config(extra_volatile_keys: ["job_token"], normalize_result_numbers: true)
      assert token.(1) != token.(2)
      :ok = LoopVerdict.reload_rules()
      assert token.(1) == token.(2)
      assert poll.(10) == poll.(80)
    end

    test "keys that are not the parse's binary are refused: cut short, an unknown flag, a tuple",
         %{sid: sid} do
      keys = packed_keys(@fail)
      # The flags byte follows the thirteen words and the number count.
      <<head::binary-size(13 * 8 + 4), _flags, lines::binary>> = keys
      assert {:ok, %{step_number: 1}} = LoopVerdict.observe(sid, keys, :normal)

      for bad <- [binary_part(keys, 0, byte_size(keys) - 1), head <> <<8>> <> lines, {1, 2}] do
        log =
          capture_log(fn ->
            assert {:error, :internal_error} = LoopVerdict.observe(sid, bad, :normal)
          end)

        assert log =~ "verdict_observe failed"
      end

      # Nothing refused was counted as a step.
      assert {:ok, %{step_number: 2}} = LoopVerdict.observe(sid, keys, :normal)
    end

    test "a restarted verdict's rules apply to the next parse of a process that parsed before" do
      token = fn t -> keys(%{"tool_input" => %{"job_token" => "tok-#{t}"}}) end
      # This process has read (and keeps) the rules in force.
      assert token.(1) != token.(2)

      # Put without configure/1, which reloads the rules itself.
      put_env_config(extra_volatile_keys: ["job_token"])
      pid = Process.whereis(LoopVerdict)
      ref = Process.monitor(pid)
      Process.exit(pid, :kill)
      assert_receive {:DOWN, ^ref, :process, ^pid, :killed}
      # Its supervisor starts it again; once its init has run, the new rules are in.
      new = Observatory.Test.Remote.await_new(LoopVerdict, [pid], 2_000)
      :sys.get_state(new)

      assert token.(1) == token.(2)
    end

    test "the default volatile words come from the core" do
      words = LoopVerdict.default_volatile_keys()
      assert "pid" in words and "request_id" in words and "elapsed_ms" in words
      refute "id" in words
    end
  end
end
