defmodule Observatory.Gateway.StepScoreTest do
  # The ingest scores a step's entropy, loop verdict and step detector in one NIF call
  # (StepScore). It must answer exactly what the three separate calls answer
  # (EntropyTracker.record_and_score/3, LoopVerdict.observe/4, StepDetector.analyze/3)
  # on any sequence of steps, keep the forget paths, and give each part its own clear
  # error for bad input without failing the others.
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.{DecisionLog, EntropyConfig, LoopVerdict, StepDetector, StepScore}
  alias Observatory.Native
  alias Observatory.Test.HTTP

  setup do
    restore_env_on_exit([:step_detection, :loop_verdict])
    name = :"step_score_tracker_#{System.unique_integer([:positive])}"
    start_supervised!({EntropyTracker, name: name})
    %{tracker: name}
  end

  # A parsed step of `sid`: tool, input and result picked from small sets so that
  # sequences repeat, cycle and fail; `result: nil` leaves the result out.
  defp fields(sid, n, {tool, input, result, status}) do
    action = %{
      "tool_call" => "tool-#{tool}",
      "tool_input" => %{"q" => "in-#{input}"},
      "status" => status
    }

    action = if result, do: Map.put(action, "result", %{"out" => "r-#{result}"}), else: action

    {:ok, _envelope, fields} =
      %{"meta" => %{"session_id" => sid, "step_id" => "#{sid}-#{n}"}, "action" => action}
      |> HTTP.envelope()
      |> DecisionLog.from_map()

    fields
  end

  # The step as the three separate calls score it, settled as the ingest settles them.
  defp separately(f, tracker, alerts?) do
    {window_size, _, _} = config = EntropyConfig.read()

    entropy =
      EntropyTracker.record_and_score(f.session_id, {f.intent, f.tool_call, f.status},
        agent_id: f.agent_id,
        tracker: tracker,
        alerts: alerts?,
        config: config
      )

    severity = with {:ok, _, severity} <- entropy, do: severity, else: (_ -> nil)

    verdict =
      LoopVerdict.observe(f.session_id, f.verdict_keys, severity,
        agent_id: f.agent_id,
        step_id: f.step_id,
        window_size: window_size
      )

    step = if f.outcome, do: StepDetector.analyze(f.session_id, f.approach, f.outcome)
    {entropy, verdict, step}
  end

  # The same step through StepScore, settled as SchemaInterceptor.accept/3 does.
  defp fused(f, tracker, alerts?) do
    {e, v, s, thresholds} = StepScore.score(f, tracker, EntropyConfig.read(), alerts?)

    {EntropyTracker.settle(e, f.session_id, f.agent_id, alerts?),
     LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id),
     s && StepDetector.settle(s, f.session_id, thresholds)}
  end

  # Feeds `steps` to two fresh sessions, one per path; the answers of each step.
  defp both_paths(steps, tracker, alerts? \\ true) do
    {a, b} = {unique_session("fused"), unique_session("apart")}

    steps
    |> Enum.with_index(1)
    |> Enum.map(fn {step, n} ->
      fa = fields(a, n, step)
      fb = %{fields(b, n, step) | session_id: b}
      {fused(fa, tracker, alerts?), separately(fb, tracker, alerts?)}
    end)
  end

  @statuses ~w(success failure error)

  describe "one call answers as the three calls did" do
    test "a fixed sequence that warns, blocks and loops: every answer the same", %{tracker: t} do
      Observatory.configure(step_detection: [stagnation_warn: 2, stagnation_block: 4])
      # Varied work, then the same failing call again and again.
      steps =
        for(i <- 1..4, do: {i, i, i, "success"}) ++
          for(_ <- 1..6, do: {9, 9, 9, "failure"}) ++ [{1, 1, nil, "success"}]

      answers = both_paths(steps, t)
      for {fused, apart} <- answers, do: assert(fused == apart)

      # The sequence reached the states worth comparing.
      {{:ok, _, severity}, {:ok, verdict}, {:ok, step}} = answers |> Enum.at(-2) |> elem(0)
      assert severity == :loop
      assert verdict.verdict == :loop
      assert step.action == :block
      # The step without a result is not analysed.
      assert {_, _, nil} = answers |> List.last() |> elem(0)
    end

    test "one session scored by the one call and the three calls in turn: one state",
         %{tracker: t} do
      # The one call hashes the session id once for its three stores, the three calls
      # each in its own store: alternating them on one session, each must find what
      # the other recorded, and answer as a session scored apart all along.
      Observatory.configure(step_detection: [stagnation_warn: 2, stagnation_block: 4])

      steps = for(i <- 1..4, do: {i, i, i, "success"}) ++ for(_ <- 1..6, do: {9, 9, 9, "failure"})

      {a, b} = {unique_session("in_turn"), unique_session("apart")}

      answers =
        for {step, n} <- Enum.with_index(steps, 1) do
          fa = fields(a, n, step)
          mine = if rem(n, 2) == 1, do: fused(fa, t, true), else: separately(fa, t, true)
          assert mine == separately(fields(b, n, step), t, true)
          mine
        end

      {{:ok, _, :loop}, {:ok, %{verdict: :loop, step_number: 10}}, {:ok, %{action: :block}}} =
        List.last(answers)

      assert length(EntropyTracker.window(a, tracker: t)) == 5
    end

    @tag :property
    test "any sequence of steps: the same scores, verdicts and step verdicts", %{tracker: t} do
      step =
        :proper_types.tuple([
          :proper_types.range(0, 2),
          :proper_types.range(0, 2),
          :proper_types.oneof([:proper_types.range(0, 2), nil]),
          :proper_types.oneof(@statuses)
        ])

      property =
        :proper.forall(:proper_types.list(step), fn steps ->
          Enum.all?(both_paths(steps, t), fn {fused, apart} -> fused == apart end)
        end)

      assert :proper.quickcheck(property, [:quiet, {:numtests, 150}, {:to_file, :user}]) == true
    end

    test "with alerts on, a LOOP of a session with no agent gives the verdict no entropy signal",
         %{tracker: t} do
      # Same {intent, tool, status}, a new call and result each time: entropy LOOP,
      # and the verdict's entropy rule is what speaks, unless the signal is withheld.
      steps = for i <- 1..6, do: {1, i, i, "success"}
      sid = unique_session("no-agent")

      {verdicts, log} =
        ExUnit.CaptureLog.with_log(fn ->
          for {step, n} <- Enum.with_index(steps, 1) do
            f = %{fields(sid, n, step) | agent_id: nil}
            {entropy, {:ok, verdict}, _} = fused(f, t, true)
            {entropy, verdict.rule}
          end
        end)

      assert log =~ "with no known agent_id: alert not sent"

      assert {{:error, :missing_agent_id}, :none} = List.last(verdicts)

      # The same steps with the agent known: the entropy rule explains the LOOP.
      with_agent = both_paths(steps, t)
      {{{:ok, _, :loop}, {:ok, %{rule: :entropy}}, _}, _} = List.last(with_agent)
    end
  end

  # LoopVerdict.packed_config/0 and StepDetector.scoring_settings/0 hand the NIF its
  # per-step settings as binaries packed once per change of the configuration.
  describe "settings packed for the one call" do
    test "Application.put_env of :loop_verdict applies on the next step, as apart",
         %{tracker: t} do
      # The same call and result again and again: a repeat.
      steps = for _ <- 1..6, do: {1, 1, 1, "success"}
      levels = fn answers -> for {{_, {:ok, v}, _}, _} <- answers, do: v.verdict end

      default = both_paths(steps, t)
      for {fused, apart} <- default, do: assert(fused == apart)
      assert levels.(default) == [:progress, :suspect, :loop, :loop, :loop, :loop]

      Observatory.configure(loop_verdict: [repeat_suspect: 3, repeat_loop: 5])
      changed = both_paths(steps, t)
      for {fused, apart} <- changed, do: assert(fused == apart)
      # Two in a row are no longer suspect, three are; the rest as the rules say.
      assert [:progress, :progress, :suspect | _] = levels.(changed)
    end

    test "every :loop_verdict threshold changed at once: the one call answers as apart",
         %{tracker: t} do
      Observatory.configure(
        loop_verdict: [
          history: 24,
          max_period: 3,
          repeat_suspect: 3,
          repeat_loop: 4,
          blank_repeat_loop: 5,
          cycle_suspect: 3,
          cycle_loop: 4,
          failure_suspect: 2,
          failure_loop: 3,
          entropy_rule: false,
          near_share: 90,
          near_repeat_suspect: 4,
          near_repeat_loop: 5,
          blank_near_repeat_loop: 7,
          failure_run_suspect: 2,
          failure_run_loop: :never,
          revisit_window: 8,
          revisit_suspect: 3,
          revisit_loop: 4
        ]
      )

      assert LoopVerdict.packed_config() == Native.verdict_config_pack(LoopVerdict.config())

      steps =
        for i <- 1..30, do: {rem(i, 3), rem(i * 7, 4), rem(i, 2), Enum.at(@statuses, rem(i, 3))}

      for {fused, apart} <- both_paths(steps, t), do: assert(fused == apart)
    end

    test "an invalid :loop_verdict: the defaults, packed", %{tracker: t} do
      Application.put_env(:observatory, :loop_verdict, repeat_suspect: 9, repeat_loop: 2)

      ExUnit.CaptureLog.capture_log(fn ->
        assert LoopVerdict.packed_config() == Native.verdict_config_pack(LoopVerdict.config())
      end)

      Application.delete_env(:observatory, :loop_verdict)
      defaults = LoopVerdict.packed_config()
      Application.put_env(:observatory, :loop_verdict, repeat_suspect: 9, repeat_loop: 2)

      ExUnit.CaptureLog.capture_log(fn ->
        assert LoopVerdict.packed_config() == defaults
        # The steps' snapshot too: put_env with a value configure/1 refuses.
        Observatory.IngestSettings.refresh()
      end)

      f = fields(unique_session("invalid-config"), 1, {1, 1, 1, "success"})
      ExUnit.CaptureLog.capture_log(fn -> assert {_, {:ok, _}, {:ok, _}} = fused(f, t, true) end)
    end

    test "Application.put_env of :step_detection applies on the next step", %{tracker: t} do
      sid = unique_session("step-env")
      step = fn n -> fused(fields(sid, n, {1, 1, 1, "failure"}), t, true) end
      actions = for n <- 1..2, do: elem(elem(step.(n), 2), 1).action
      assert actions == [:continue, :continue]

      # Stagnation streak 2 from the third step: warn now, at 2.
      Observatory.configure(step_detection: [stagnation_warn: 2, stagnation_block: 6])
      assert {_, _, {:ok, %{action: :warn, stagnation_streak: 2}}} = step.(3)
    end

    test "invalid :step_detection thresholds are packed as nil: the detector's error",
         %{tracker: t} do
      Application.put_env(:observatory, :step_detection, stuck_warn: "five")
      Observatory.IngestSettings.refresh()
      assert {{3, 5, "five", 8}, nil} = scoring = StepDetector.scoring_settings()
      assert scoring == {elem(StepDetector.step_settings(), 0), nil}

      f = fields(unique_session("bad-step-env"), 1, {1, 1, 1, "success"})

      assert {{_, _, _, _, _}, {_, _, _, _, _, 1}, {:error, :invalid_step_thresholds}, _} =
               StepScore.score(f, t, EntropyConfig.read(), true)
    end

    test "packed settings that are not the NIF's: that part's error, the others scored" do
      f = fields(unique_session("forged"), 1, {1, 1, 1, "success"})
      # No tracker: the entropy part says so, the verdict and step parts are scored.
      {_, packed_settings} = StepDetector.scoring_settings()
      config = LoopVerdict.packed_config()
      stores = {nil, LoopVerdict.store_or_nil(), StepDetector.store_or_nil()}
      step = {f.approach, f.outcome}
      entropy = {f.intent, f.tool_call, 0, f.agent_id, EntropyConfig.read(), true}
      score = &Native.score_step(stores, f.session_id, entropy, f.verdict_keys, &1, step, &2)

      assert {{:error, :not_started}, {:error, :invalid_verdict_config}, {_, _, _, _, _}} =
               score.(binary_part(config, 0, 8), packed_settings)

      assert {_, {:error, :invalid_verdict_config}, _} =
               score.(LoopVerdict.config(), packed_settings)

      assert {_, {_, _, _, _, _, _}, {:error, :invalid_step_thresholds}} =
               score.(config, <<0::8*24>>)

      assert {_, {_, _, _, _, _, _}, {:error, :invalid_step_thresholds}} =
               score.(config, StepDetector.step_settings())
    end
  end

  # StepScore.score/3, as the ingest calls it: the five settings a step needs read on
  # every call (FR-9.11's three among them), what they come to derived again only when
  # one of them changed.
  describe "the settings read by the one call (score/3)" do
    defp fused_reading(f, tracker) do
      {e, v, s, thresholds} = StepScore.score(f, tracker, true)

      {EntropyTracker.settle(e, f.session_id, f.agent_id, true),
       LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id),
       s && StepDetector.settle(s, f.session_id, thresholds)}
    end

    test "FR-9.11: each entropy setting put with Application.put_env applies to the next step",
         %{tracker: t} do
      sid = unique_session("fr-9-11")
      step = fn n, tool -> fused_reading(fields(sid, n, {tool, n, n, "success"}), t) end

      # Four steps, two tools: 2 distinct of 4 is 0.5, normal at the defaults.
      for n <- 1..3, do: step.(n, rem(n, 2))
      assert {{:ok, 0.5, :normal}, _, _} = step.(4, 0)

      Application.put_env(:observatory, :entropy_warning_threshold, 0.6)
      assert {{:ok, 0.4, :warning}, _, _} = step.(5, 1)

      Application.put_env(:observatory, :entropy_loop_threshold, 0.45)
      assert {{:ok, 0.4, :loop}, _, _} = step.(6, 0)

      # A window of 2: the last two steps, two tools.
      Application.put_env(:observatory, :entropy_window_size, 2)
      assert {{:ok, 1.0, :normal}, _, _} = step.(7, 1)
      assert length(EntropyTracker.window(sid, tracker: t)) == 2
    end

    test "answers as score/4 with EntropyConfig.read/0, every setting changed between steps",
         %{tracker: t} do
      {a, b} = {unique_session("read-here"), unique_session("read-by-caller")}

      changes = %{
        3 => {:entropy_window_size, 3},
        5 => {:loop_verdict, repeat_suspect: 3, repeat_loop: 4},
        7 => {:step_detection, stagnation_warn: 2, stagnation_block: 4},
        9 => {:entropy_loop_threshold, 0.4},
        11 => {:entropy_warning_threshold, 0.7}
      }

      for n <- 1..14 do
        with {key, value} <- changes[n], do: Observatory.configure([{key, value}])
        step = {rem(n, 2), 1, 1, "failure"}
        fa = fields(a, n, step)
        fb = %{fields(b, n, step) | session_id: b}
        assert fused_reading(fa, t) == fused(fb, t, true)
      end

      # The changes took effect: the window is 3, the step detector blocked.
      assert length(EntropyTracker.window(a, tracker: t)) == 3

      assert {_, _, {:ok, %{action: :block}}} =
               fused_reading(fields(a, 15, {1, 1, 1, "failure"}), t)
    end

    test "an invalid entropy setting: its default, and one warning per invalid value",
         %{tracker: t} do
      sid = unique_session("invalid-entropy")
      Application.put_env(:observatory, :entropy_window_size, 0)

      log =
        ExUnit.CaptureLog.capture_log(fn ->
          for n <- 1..7, do: fused_reading(fields(sid, n, {n, n, n, "success"}), t)
        end)

      # The default window of 5, warned about once over the seven steps.
      assert length(EntropyTracker.window(sid, tracker: t)) == 5
      assert length(String.split(log, ":entropy_window_size: 0")) == 2

      Application.put_env(:observatory, :entropy_window_size, -1)

      assert ExUnit.CaptureLog.capture_log(fn ->
               fused_reading(fields(sid, 8, {1, 1, 1, "success"}), t)
             end) =~ ":entropy_window_size: -1"
    end
  end

  describe "the verdict's reason, written on the stack by the one call" do
    test "is the sentence the session's stored verdict gives, rule by rule", %{tracker: t} do
      sid = unique_session("reasons")
      # Varied work, a repeat, a cycle, then failures: progress, repeat, cycle, failure rules.
      steps =
        for(i <- 1..3, do: {i, i, i, "success"}) ++
          for(_ <- 1..3, do: {4, 4, 4, "success"}) ++
          for(_ <- 1..3, i <- 1..2, do: {i, i, i, "success"}) ++
          for(_ <- 1..4, do: {0, 5, 5, "failure"})

      reasons =
        for {step, n} <- Enum.with_index(steps, 1) do
          {_, {:ok, verdict}, _} = fused(fields(sid, n, step), t, true)
          # LoopVerdict.session/1 formats the same verdict apart (Rust's to_string).
          assert verdict.reason == LoopVerdict.session(sid).reason
          {verdict.rule, verdict.reason}
        end

      assert {:none, "the session's first step: nothing to compare yet"} = hd(reasons)
      assert {:none, "no repeated call pattern in the last 2 steps"} = Enum.at(reasons, 1)
      assert {:repeat, "the same call 3 times in a row, its result saying nothing new"} in reasons
      assert Enum.uniq(Enum.map(reasons, &elem(&1, 0))) |> length() >= 3
    end
  end

  describe "forget and reset paths" do
    test "a forgotten session starts a fresh window and history", %{tracker: t} do
      sid = unique_session("forget")
      for n <- 1..3, do: fused(fields(sid, n, {n, n, n, "success"}), t, true)

      assert {{:ok, _, _}, {:ok, %{step_number: 4}}, _} =
               fused(fields(sid, 4, {4, 4, 4, "success"}), t, true)

      assert EntropyTracker.forget(sid, tracker: t)
      assert LoopVerdict.forget(sid)

      assert {{:ok, 1.0, :normal}, {:ok, %{step_number: 1, previous: nil}}, _} =
               fused(fields(sid, 5, {4, 4, 4, "success"}), t, true)

      assert [_one] = EntropyTracker.window(sid, tracker: t)
    end

    test "a step detector reset clears the streaks the fused call built", %{tracker: t} do
      Observatory.configure(step_detection: [stagnation_warn: 2, stagnation_block: 3])
      sid = unique_session("reset")

      actions =
        for n <- 1..4 do
          {_, _, {:ok, step}} = fused(fields(sid, n, {1, 1, 1, "failure"}), t, true)
          step.action
        end

      assert actions == [:continue, :continue, :warn, :block]
      :ok = StepDetector.reset(sid, operator: "alice")

      assert {_, _, {:ok, %{action: :continue, stagnation_streak: 0}}} =
               fused(fields(sid, 5, {1, 1, 1, "failure"}), t, true)
    end
  end

  describe "bad input: a clear error for the part it concerns, the others still scored" do
    setup %{tracker: t} do
      f = fields(unique_session("bad"), 1, {1, 1, 1, "success"})
      %{f: f, t: t}
    end

    test "keys that are not the parse's: the verdict refuses them", %{f: f, t: t} do
      assert {{1.0, :normal, nil, 1, nil}, {:error, :invalid_verdict_keys}, {_, _, _, _, _}, _} =
               StepScore.score(%{f | verdict_keys: {:not, :keys}}, t, EntropyConfig.read(), true)
    end

    test "a digest of the wrong size: the step detector refuses it", %{f: f, t: t} do
      assert {{_, _, _, _, _}, {_, _, _, _, _, 1}, {:error, :invalid_step_digest}, _} =
               StepScore.score(%{f | outcome: "short"}, t, EntropyConfig.read(), true)
    end

    test "invalid step thresholds: the step detector's error, logged", %{f: f, t: t} do
      Application.put_env(:observatory, :step_detection, stagnation_warn: 5, stagnation_block: 2)
      Observatory.IngestSettings.refresh()

      {_, {_, _, _, _, _, 1}, analysed, thresholds} =
        StepScore.score(f, t, EntropyConfig.read(), true)

      assert analysed == {:error, :invalid_step_thresholds}

      assert ExUnit.CaptureLog.capture_log(fn ->
               assert {:error, :invalid_step_thresholds} =
                        StepDetector.settle(analysed, f.session_id, thresholds)
             end) =~ "invalid :step_detection thresholds"
    end

    test "a tracker that is not running: entropy not started, verdict and step scored",
         %{f: f} do
      assert {{:error, :not_started}, {_, _, _, _, _, 1}, {_, _, _, _, _}, _} =
               StepScore.score(f, :no_such_tracker, EntropyConfig.read(), true)
    end

    test "a status outside the set: entropy refuses it and records nothing", %{f: f, t: t} do
      assert {{:error, :invalid_status}, {_, _, _, _, _, 1}, _, _} =
               StepScore.score(%{f | status: :exploded}, t, EntropyConfig.read(), true)

      assert EntropyTracker.window(f.session_id, tracker: t) == []
    end

    test "entropy fields past their caps: the tracker's error, nothing recorded", %{f: f, t: t} do
      long = String.duplicate("x", 2000)

      assert {{:error, :field_too_long}, {_, _, _, _, _, 1}, _, _} =
               StepScore.score(%{f | intent: long}, t, EntropyConfig.read(), true)

      assert EntropyTracker.window(f.session_id, tracker: t) == []
    end

    test "a session id that is not UTF-8: the verdict and step refuse it", %{f: f, t: t} do
      assert {_, {:error, :invalid_session_id}, {:error, :invalid_session_id}, _} =
               StepScore.score(%{f | session_id: <<0xFF, 0xFE>>}, t, EntropyConfig.read(), true)
    end

    test "arguments of the wrong shape raise ArgumentError; the VM is fine" do
      assert_raise ArgumentError, fn ->
        Native.score_step(:not_stores, "s", {}, {}, {}, nil, {})
      end
    end
  end
end
