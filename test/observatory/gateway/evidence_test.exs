defmodule Observatory.Gateway.EvidenceTest do
  use Observatory.TrackerCase, async: true

  alias Observatory.Gateway.{Evidence, LoopVerdict, SchemaInterceptor, SessionLog}

  defp stored(number, tool, input, status, result) do
    %{
      number: number,
      at: 1_771_756_200_000 + number * 1_000,
      envelope: %{
        "meta" => %{"step_id" => "s-#{number}", "timestamp" => "2026-02-22T10:30:00Z"},
        "cognition" => %{"intent" => "run the tests"},
        "action" => %{
          "tool_call" => tool,
          "tool_input" => input,
          "status" => status,
          "result" => result
        }
      }
    }
  end

  defp pytest(number, out \\ "E   assert 401 == 200\n1 failed in 0.42s"),
    do:
      stored(number, "bash", %{"command" => "pytest tests/test_auth.py -x"}, "failure", %{
        "exit_code" => 1,
        "stdout" => out
      })

  describe "issue 18: steps as text" do
    test "the call, its arguments and its result, numbered and timed as stored" do
      [step] = Evidence.steps([pytest(7)])

      assert %{
               number: 7,
               step_id: "s-7",
               tool_call: "bash",
               status: "failure",
               intent: "run the tests",
               call: "pytest tests/test_auth.py -x",
               arguments: ~s({"command":"pytest tests/test_auth.py -x"}),
               result: "exit_code: 1\nstdout:\nE   assert 401 == 200\n1 failed in 0.42s",
               truncated: false,
               stored_whole: true
             } = step

      assert step.at == ~U[2026-02-22 10:30:07.000Z]
    end

    test "a call is its input string, its one string value, or its JSON" do
      texts = fn input ->
        Evidence.texts(%{"action" => %{"tool_call" => "t", "tool_input" => input}})
      end

      assert texts.("ls -la").call == "ls -la"
      assert texts.(%{"path" => "a.txt", "limit" => 10}).call == "a.txt"
      assert texts.(%{"a" => "x", "b" => "y"}).call == ~s({"a":"x","b":"y"})
      assert texts.(nil).call == "t"
      assert texts.(nil).arguments == ""
    end

    test "a long result keeps its head and its tail; :full gives it whole" do
      long = Enum.map_join(1..30, "\n", &"line #{&1}")
      s = stored(1, "bash", "make", "failure", long)

      [cut] = Evidence.steps([s])
      assert cut.truncated
      assert cut.result =~ "line 1\nline 2\n…\n"
      assert cut.result =~ "line 30"
      refute cut.result =~ "line 15"

      [whole] = Evidence.steps([s], full: [1])
      refute whole.truncated
      assert whole.result == long
    end

    test "one long line is cut too, on a character boundary" do
      long = String.duplicate("é", 1_000)
      [cut] = Evidence.steps([stored(1, "bash", "x", "failure", long)])
      assert cut.truncated
      assert String.valid?(cut.result)
      assert byte_size(cut.result) <= 600 + byte_size("…")
      assert String.ends_with?(cut.result, "…")
    end

    test "an envelope kept as a stub (too large) says so" do
      [step] =
        Evidence.steps([
          %{number: 1, at: 0, envelope: %{"truncated" => true, "bytes" => 99_999, "meta" => %{}}}
        ])

      refute step.stored_whole
      assert step.result == ""
    end
  end

  describe "issue 18: what changed between repeats" do
    test "same, whitespace, numbers, reordered lines, different lines" do
      assert Evidence.compare(["a b", "a b"], [1, 2]) == %{kind: :same}
      assert Evidence.compare(["a  b\n", "a b"], [1, 2]) == %{kind: :whitespace}

      assert Evidence.compare(["took 12 ms\nok", "took 15 ms\nok", "took 9 ms\nok"], [1, 2, 3]) ==
               %{kind: :numbers, changes: [%{line: "took # ms", values: ["12", "15", "9"]}]}

      assert Evidence.compare(["err\nout", "out\nerr"], [1, 2]) == %{kind: :reordered}

      assert Evidence.compare(["a\nb", "a\nc", "a\nb"], [4, 5, 6]) ==
               %{kind: :lines, changes: [%{step: 5, added: ["c"], removed: ["b"]}]}
    end

    test "a decimal number is one number" do
      assert %{kind: :numbers, changes: [%{line: "1 failed in #s", values: ["0.42", "0.51"]}]} =
               Evidence.compare(["1 failed in 0.42s", "1 failed in 0.51s"], [1, 2])
    end
  end

  describe "issue 18: explaining a verdict" do
    test "repeat: names the call, how often, the outcome, and that nothing changed" do
      steps = for n <- 3..6, do: pytest(n)

      assert %{
               rule: :repeat,
               steps: [3, 4, 5, 6],
               calls: [%{tool: "bash", call: "pytest tests/test_auth.py -x"}],
               times: 4,
               outcome: "the same failure",
               excerpt: "exit_code: 1\nstdout:\nE   assert 401 == 200\n1 failed in 0.42s",
               arguments: %{kind: :same},
               result: %{kind: :same},
               missing: []
             } = Evidence.explain_verdict(%{rule: :repeat, evidence: [3, 4, 5, 6]}, steps)
    end

    test "repeat whose failure differs only in numbers; evidence no longer stored is named" do
      steps = for {n, t} <- [{5, "0.42"}, {6, "0.47"}], do: pytest(n, "1 failed in #{t}s")

      assert %{
               outcome: "the same failure, apart from numbers",
               result: %{kind: :numbers, changes: [%{values: ["0.42", "0.47"]}]},
               missing: [4]
             } = Evidence.explain_verdict(%{rule: :repeat, evidence: [4, 5, 6]}, steps)
    end

    test "cycle: the block of calls, rounds, position by position" do
      edit = fn n ->
        stored(n, "edit_file", %{"path" => "app.ts", "new" => "x"}, "success", "applied")
      end

      build = fn n -> stored(n, "bash", %{"command" => "npm run build"}, "failure", "TS2307") end
      steps = [edit.(1), build.(2), edit.(3), build.(4), edit.(5), build.(6)]

      assert %{
               rule: :cycle,
               period: 2,
               times: 3,
               calls: [%{tool: "edit_file"}, %{call: "npm run build"}],
               outcome: "the same results each round",
               excerpt: "TS2307",
               result: %{kind: :same}
             } = Evidence.explain_verdict(%{rule: :cycle, evidence: [1, 2, 3, 4, 5, 6]}, steps)
    end

    test "same failure: the different calls and the failure they share" do
      steps =
        for {n, cmd} <- [{1, "grep -r foo"}, {2, "rg foo"}, {3, "ack foo"}],
            do: stored(n, "bash", %{"command" => cmd}, "failure", "permission denied")

      assert %{
               rule: :same_failure,
               calls: [%{call: "grep -r foo"}, %{call: "rg foo"}, %{call: "ack foo"}],
               outcome: "the same failure",
               arguments: %{kind: :lines}
             } = Evidence.explain_verdict(%{rule: :same_failure, evidence: [1, 2, 3]}, steps)
    end

    test "no rule, no stored step, no verdict: nothing to explain" do
      assert Evidence.explain_verdict(nil, []) == nil
      assert Evidence.explain_verdict(%{rule: :none, evidence: []}, [pytest(1)]) == nil
      assert Evidence.explain_verdict(%{rule: :repeat, evidence: [9]}, [pytest(1)]) == nil
    end
  end

  describe "issue 18: explaining the entropy window" do
    test "its most frequent tuple, on which steps, and whether their arguments differ" do
      read = fn n, path ->
        stored(n, "read_file", %{"path" => path}, "success", "contents")
        |> put_in([:envelope, "cognition", "intent"], "read")
      end

      steps = [read.(8, "a.txt"), read.(9, "b.txt"), read.(10, "c.txt")]
      window = List.duplicate({"read", "read_file", :success}, 3)

      assert %{
               pattern: %{intent: "read", tool_call: "read_file", action_status: "success"},
               count: 3,
               size: 3,
               window_steps: [8, 9, 10],
               steps: [8, 9, 10],
               arguments: %{kind: :lines},
               result: %{kind: :same}
             } = Evidence.explain_window(window, steps)
    end

    test "the window is numbered back from the newest stored step" do
      window = [{"a", "t", :success}, {"b", "t", :success}]

      assert Evidence.window_numbers(window, [pytest(4), pytest(5)]) == [
               {4, hd(window)},
               {5, List.last(window)}
             ]

      assert Evidence.window_numbers(window, []) == [{1, hd(window)}, {2, List.last(window)}]
      assert Evidence.explain_window([], []) == nil
    end
  end

  describe "issue 18: one numbering through the real ingest path" do
    test "the stored steps, the verdict's evidence and the entropy window name the same steps" do
      sid = unique_session("ev-numbers")

      for i <- 1..7 do
        # Two different calls, then the same failing call five times.
        {tool, result} = if i <= 2, do: {"tool_#{i}", "ok #{i}"}, else: {"bash", "boom"}

        {:ok, _} =
          SchemaInterceptor.ingest(
            Observatory.Test.HTTP.envelope(%{
              "meta" => %{"session_id" => sid},
              "action" => %{
                "tool_call" => tool,
                "tool_input" => %{"command" => "x"},
                "result" => result
              }
            })
          )
      end

      numbers = Enum.map(SessionLog.steps(sid), & &1.number)
      assert numbers == Enum.to_list(1..7)
      verdict = LoopVerdict.session(sid)
      assert verdict.step_number == 7
      assert Enum.all?(verdict.evidence, &(&1 in numbers))
      assert verdict.evidence == [3, 4, 5, 6, 7]

      evidence = Evidence.for_session(sid)
      assert evidence.window.window_steps == [3, 4, 5, 6, 7]
      assert evidence.verdict.steps == verdict.evidence
      assert evidence.verdict.times == 5
    end
  end
end
