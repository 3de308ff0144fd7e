defmodule Observatory.Gateway.IdempotencyTest do
  # A retried step is answered again, never counted twice. Changes :idempotency and
  # pauses sessions: not async.
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.{
    DecisionLog,
    Events,
    HITL,
    Idempotency,
    SchemaInterceptor,
    SessionLog
  }

  alias Observatory.{JSON, Metrics}
  alias Observatory.Test.HTTP

  @fingerprint :binary.copy(<<7>>, 16)

  setup do
    restore_env_on_exit([:idempotency])
    :ok = Events.subscribe(Events.decision_logs())
    sid = unique_session("sess-idem")
    %{sid: sid, step: step(sid, "step-1")}
  end

  defp step(sid, step_id, overrides \\ %{}) do
    HTTP.envelope(
      Map.merge(
        %{
          "meta" => %{"session_id" => sid, "step_id" => step_id},
          "action" => %{"tool_input" => %{"path" => "a.txt"}, "result" => "not found"}
        },
        overrides
      )
    )
  end

  # What the agent is told, without the replay mark.
  defp answer({:ok, result}), do: Map.drop(result, [:replayed])

  # A claim of step `step_id` of `sid`, as the parse's fields would make it.
  defp claim_step(sid, step_id) do
    Idempotency.claim(%{
      session_id: sid,
      step_id: step_id,
      agent_id: "agent-idem",
      fingerprint: @fingerprint
    })
  end

  defp broadcasts(sid, step_id) do
    receive do
      %{event_type: "decision_log", session_id: ^sid, step_id: ^step_id} ->
        1 + broadcasts(sid, step_id)
    after
      0 -> 0
    end
  end

  describe "the same step delivered again" do
    test "posted 3 times: one step in the window, three identical answers, one broadcast",
         %{sid: sid, step: step} do
      json = JSON.encode!(step)
      replays = Metrics.get(:step_replays)
      results = for _ <- 1..3, do: SchemaInterceptor.ingest(json)

      assert [false, true, true] = for({:ok, r} <- results, do: r.replayed)
      [first | _] = answers = Enum.map(results, &answer/1)
      assert Enum.uniq(answers) == [first]
      assert first.verdict.step_number == 1

      assert length(EntropyTracker.window(sid)) == 1
      assert SessionLog.count(sid) == 1
      assert broadcasts(sid, "step-1") == 1
      assert Metrics.get(:step_replays) - replays == 2
    end

    test "a looping agent's retries do not make a loop; its real repeats do", %{sid: sid} do
      # The same call three times, each retried twice: three steps, not nine.
      results =
        for n <- 1..3, _ <- 1..3 do
          {:ok, r} = SchemaInterceptor.ingest(step(sid, "step-#{n}"))
          r
        end

      assert length(EntropyTracker.window(sid)) == 3
      assert Enum.map(results, & &1.verdict.step_number) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
      assert List.last(results).verdict.verdict == :loop
    end

    test "a retry re-stamped by the client (timestamp, self-reported score), keys reordered, is the same step",
         %{sid: sid, step: step} do
      {:ok, first} = SchemaInterceptor.ingest(JSON.encode!(step))

      retry =
        step
        |> put_in(["meta", "timestamp"], "2026-02-22T10:31:07Z")
        |> put_in(["cognition", "entropy_score"], 0.1)

      # Another key order and whitespace: the same JSON value.
      text =
        ~s({"action": #{JSON.encode!(retry["action"])}, ) <>
          ~s("cognition": #{JSON.encode!(retry["cognition"])},\n "meta": #{JSON.encode!(retry["meta"])}})

      assert {:ok, %{replayed: true} = again} = SchemaInterceptor.ingest(text)

      assert answer({:ok, again}) |> Map.delete(:envelope) ==
               Map.delete(answer({:ok, first}), :envelope)

      # The gateway's score, not the retry's self-reported one.
      assert again.envelope["cognition"]["entropy_score"] == first.entropy_score
      assert length(EntropyTracker.window(sid)) == 1
    end

    test "the same step_id in another session is another step", %{sid: sid, step: step} do
      {:ok, %{replayed: false}} = SchemaInterceptor.ingest(step)
      other = put_in(step, ["meta", "session_id"], sid <> "-other")
      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(other)
    end

    test "with enabled: false every delivery is a new step (nothing remembered)",
         %{sid: sid, step: step} do
      Observatory.configure(idempotency: [enabled: false])
      for _ <- 1..2, do: {:ok, %{replayed: false}} = SchemaInterceptor.ingest(step)
      assert length(EntropyTracker.window(sid)) == 2
    end
  end

  describe "a different body under a used step id" do
    test "is refused with a conflict naming the step; nothing is recorded",
         %{sid: sid, step: step} do
      {:ok, _} = SchemaInterceptor.ingest(step)
      changed = put_in(step, ["action", "result"], "found it")

      assert {:error, {:conflict, %{path: "meta.step_id", reason: reason}}} =
               SchemaInterceptor.ingest(changed)

      assert reason =~ ~s("step-1" of session "#{sid}" was already recorded with a different body)
      assert length(EntropyTracker.window(sid)) == 1
      assert SessionLog.count(sid) == 1
      assert broadcasts(sid, "step-1") == 1
      # The first body is still answered as before.
      assert {:ok, %{replayed: true}} = SchemaInterceptor.ingest(step)
    end
  end

  describe "a retry of a paused session's step" do
    test "carries the pause as it is now: paused since, the retry says pause; resumed, it does not",
         %{sid: sid, step: step} do
      {:ok, first} = SchemaInterceptor.ingest(step)
      assert first.directives == [] and not first.paused

      {:ok, _} = HITL.pause(sid, operator: "alice", reason: "inspect")
      {:ok, paused} = SchemaInterceptor.ingest(step)
      assert paused.replayed and paused.paused

      assert [%{"type" => "pause", "operator" => "alice", "reason" => "inspect"}] =
               paused.directives

      # Everything else is the first answer.
      same = [:entropy_score, :severity, :verdict, :step]
      assert Map.take(paused, same) == Map.take(first, same)

      {:ok, _} = HITL.resume(sid, operator: "alice")
      {:ok, resumed} = SchemaInterceptor.ingest(step)
      assert resumed.replayed and resumed.directives == [] and not resumed.paused
      assert length(EntropyTracker.window(sid)) == 1
    end

    test "a step sent while paused, retried after the resume, no longer says pause",
         %{sid: sid, step: step} do
      {:ok, _} = HITL.pause(sid, operator: "bob", reason: "look")
      {:ok, %{paused: true, directives: [%{"type" => "pause"}]}} = SchemaInterceptor.ingest(step)
      {:ok, _} = HITL.resume(sid, operator: "bob")

      assert {:ok, %{replayed: true, paused: false, directives: []}} =
               SchemaInterceptor.ingest(step)
    end
  end

  describe "deliveries that race" do
    test "of 20 concurrent deliveries one is scored; the others are replays or told to retry",
         %{sid: sid, step: step} do
      json = JSON.encode!(step)

      results =
        1..20
        |> Task.async_stream(fn _ -> SchemaInterceptor.ingest(json) end, max_concurrency: 20)
        |> Enum.map(fn {:ok, result} -> result end)

      assert Enum.count(results, &match?({:ok, %{replayed: false}}, &1)) == 1

      assert Enum.all?(results, fn
               {:ok, _} -> true
               {:error, {:in_progress, _}} -> true
               _ -> false
             end)

      assert length(EntropyTracker.window(sid)) == 1
    end

    test "while the first delivery is being scored a retry is told to retry; after it, replayed",
         %{sid: sid, step: step} do
      {:ok, _envelope, fields} = DecisionLog.parse(JSON.encode!(step))
      # This process plays the first delivery, mid-way through scoring.
      {:new, ticket} = Idempotency.claim(fields)

      assert {:error, {:in_progress, %{path: "meta.step_id", reason: reason}}} =
               SchemaInterceptor.ingest(step)

      assert reason =~ "is still being scored"

      first = %{entropy_score: 1.0, severity: :normal, verdict: nil, step: nil}

      Idempotency.complete(ticket, first)
      assert {:ok, %{replayed: true, entropy_score: 1.0}} = SchemaInterceptor.ingest(step)
      assert length(EntropyTracker.window(sid)) == 0
    end

    test "a first delivery that died before answering does not block its retry",
         %{sid: sid, step: step} do
      {:ok, _envelope, fields} = DecisionLog.parse(JSON.encode!(step))

      {pid, ref} = spawn_monitor(fn -> {:new, _} = Idempotency.claim(fields) end)

      assert_receive {:DOWN, ^ref, :process, ^pid, :normal}
      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(step)
      assert length(EntropyTracker.window(sid)) == 1
    end

    test "a small answer and a large one are each replayed as completed", %{sid: sid} do
      claim = &claim_step(sid, &1)

      small = {0.5, :warning, nil, nil}
      # Past the size the complete NIF encodes itself: encoded by term_to_binary first.
      large = %{notes: List.duplicate("a line of a long answer", 2_000), score: 0.5}
      assert :erlang.external_size(large) > 16_384

      {:new, first} = claim.("small")
      {:new, second} = claim.("large")
      :ok = Idempotency.complete(first, small)
      :ok = Idempotency.complete(second, large)
      assert claim.("small") == {:replay, small}
      assert claim.("large") == {:replay, large}
    end

    # A small answer is encoded in the complete NIF, a large one by term_to_binary
    # first: either way a retry gets exactly the term completed, whatever it holds.
    test "every kind of term is replayed exactly as completed, encoded in the NIF or not",
         %{sid: sid} do
      <<_::3, unaligned::binary-size(5), _::5>> = "abcdef"
      big_binary = :binary.copy("x", 20_000)

      answers = [
        # The ingest's own answer, as it keeps it.
        {0.8112781244591328, :normal,
         {:loop_verdict, :progress, :progress, nil, "no rule fired", [], 17},
         {:step_verdict, :full_progress, 0, 0, :continue, nil}},
        {nil, nil, nil, nil},
        {-0.0, 0.0, 1.0e300, -2.5e-308, 5.0e-324},
        {0, 1, 255, 256, -1, -128, 2_147_483_647, -2_147_483_648},
        {2_147_483_648, -2_147_483_649, Bitwise.bsl(1, 59), -Bitwise.bsl(1, 59),
         Bitwise.bsl(1, 64), -Bitwise.bsl(1, 100)},
        {true, false, :"with space", :é, :日本, :"#{String.duplicate("a", 255)}"},
        {"", "a string", "ünïcödé", <<0, 255, 128>>, unaligned, <<1::3>>, <<1, 2::4>>},
        {[], [1, 2, 3], [[[]]], [1 | 2], ~c"chars", [{:a, "b"} | []]},
        {{}, {{}}, List.to_tuple(Enum.to_list(1..300))},
        %{a: 1, b: [2, 3]},
        {%{"nested" => %{}}, self(), make_ref(), fn -> :ok end},
        Enum.reduce(1..100, :leaf, &{&1, &2}),
        {big_binary},
        List.duplicate(1, 20_000),
        :an_atom,
        "just a binary",
        3.14
      ]

      for {answer, i} <- Enum.with_index(answers) do
        {:new, ticket} = claim_step(sid, "kind-#{i}")
        :ok = Idempotency.complete(ticket, answer)
        assert {:replay, replayed} = claim_step(sid, "kind-#{i}")
        assert replayed === answer, "answer #{i}: #{inspect(answer, limit: 5)}"
      end
    end

    test "a released claim (the step was not scored) is a new step next time", %{sid: sid} do
      step = %{session_id: sid, step_id: "s", agent_id: "agent-idem"}
      {:new, ticket} = Idempotency.claim(Map.put(step, :fingerprint, @fingerprint))
      :ok = Idempotency.release(ticket)
      assert {:new, _} = Idempotency.claim(Map.put(step, :fingerprint, @fingerprint))
    end
  end

  describe "the ingest's kept answer, stored without being measured" do
    # SchemaInterceptor hands the complete NIF the answer it keeps without measuring
    # it first when its shape bounds its size; the NIF must never encode more than
    # Idempotency.encoded_in_nif_max_bytes/0 (a longer encoding would hold a
    # scheduler).
    @u32 0xFFFF_FFFF

    # The largest of every part the shape check lets through.
    defp largest_kept do
      atom = String.to_atom(String.duplicate("𝔸", 255))
      text = :binary.copy("x", 1_024)

      {-1.7976931348623157e308, atom,
       {:loop_verdict, atom, atom, atom, text, List.duplicate(@u32, 16), @u32},
       {:step_verdict, atom, @u32, @u32, atom, text}}
    end

    test "the largest answer its shape lets through is under the NIF's bound, and replayed",
         %{sid: sid} do
      largest = largest_kept()
      assert SchemaInterceptor.kept_bounded?(largest)
      assert :erlang.external_size(largest) <= Idempotency.encoded_in_nif_max_bytes()

      {:new, ticket} = claim_step(sid, "largest")
      :ok = Idempotency.complete_bounded(ticket, largest)
      assert claim_step(sid, "largest") == {:replay, largest}
    end

    test "one past any cap, or another shape, is measured first" do
      {score, severity, verdict, step} = largest_kept()
      {:loop_verdict, v, p, r, why, evidence, n} = verdict
      {:step_verdict, c, ss, st, a, g} = step
      verdict_with = &{score, severity, &1, step}
      step_with = &{score, severity, verdict, &1}
      long = why <> "x"

      past = [
        {0, severity, verdict, step},
        {Bitwise.bsl(1, 70), severity, verdict, step},
        {score, "normal", verdict, step},
        verdict_with.({:loop_verdict, v, p, r, long, evidence, n}),
        verdict_with.({:loop_verdict, v, p, r, nil, evidence, n}),
        verdict_with.({:loop_verdict, v, p, r, why, [1 | evidence], n}),
        verdict_with.({:loop_verdict, v, p, r, why, [@u32 + 1], n}),
        verdict_with.({:loop_verdict, v, p, r, why, [-1], n}),
        verdict_with.({:loop_verdict, v, p, r, why, [1.0], n}),
        verdict_with.({:loop_verdict, v, p, r, why, [1 | 2], n}),
        verdict_with.({:loop_verdict, v, p, r, why, evidence, @u32 + 1}),
        verdict_with.({:loop_verdict, "v", p, r, why, evidence, n}),
        verdict_with.(%{verdict: v, reason: why}),
        step_with.({:step_verdict, c, ss, st, a, long}),
        step_with.({:step_verdict, c, @u32 + 1, st, a, g}),
        step_with.({:step_verdict, c, ss, -1, a, g}),
        step_with.({:step_verdict, c, ss, st, "a", g}),
        step_with.(%{action: a, guidance: g}),
        {score, severity, verdict},
        %{entropy_score: score}
      ]

      for answer <- past,
          do:
            refute(
              SchemaInterceptor.kept_bounded?(answer),
              inspect(answer, limit: 8, printable_limit: 40)
            )
    end

    test "every answer an ingest keeps, a loop's evidence and a block's guidance too, " <>
           "passes the shape check, and is replayed as it was",
         %{sid: sid} do
      # The same call and result every time: the verdict finds a repeat, the step
      # detector warns, then blocks.
      step = &HTTP.repeated_read(sid, &1)

      results = for n <- 1..10, do: SchemaInterceptor.ingest(step.(n), envelope: false)

      for {:ok, result} <- results,
          do: assert(SchemaInterceptor.kept_bounded?(SchemaInterceptor.kept(result)))

      assert Enum.any?(results, &match?({:ok, %{verdict: %{evidence: [_ | _]}}}, &1))
      assert Enum.any?(results, &match?({:ok, %{step: %{guidance: <<_, _::binary>>}}}, &1))

      for {{:ok, first}, n} <- Enum.with_index(results, 1) do
        assert {:ok, again} = SchemaInterceptor.ingest(step.(n), envelope: false)
        assert again.replayed

        assert Map.take(again, [:entropy_score, :severity, :verdict, :step]) ==
                 Map.take(first, [:entropy_score, :severity, :verdict, :step])
      end
    end
  end

  describe "a ticket acts on its own claim only" do
    # complete/2 and release/1 go straight to the ticket's slot in the store: a step
    # forgotten past a cap frees its slot, which the next claim may take.
    test "a ticket whose step was forgotten answers nothing, not the step in its place",
         %{sid: sid} do
      Observatory.configure(idempotency: [max_steps: 1])
      # Other tests' steps forgotten first: a cap lowered at run time is reached over
      # the next claims (1,024 evictions each), not at once.
      Idempotency.sweep(-1)

      claim = &claim_step(sid, &1)

      {:new, first} = claim.("a")
      {:new, second} = claim.("b")
      {:new, third} = claim.("c")

      :ok = Idempotency.complete(third, :third)
      :ok = Idempotency.complete(first, :first)
      :ok = Idempotency.complete(second, :second)
      :ok = Idempotency.release(first)
      assert claim.("c") == {:replay, :third}
      assert Idempotency.count({:session, sid}) == 1
    end
  end

  describe "the claim's time" do
    test "a claim made at the time its step arrived is stale from that time" do
      store = Observatory.Native.answered_new()
      ids = {"sess-idem-time", "step-1", "agent-idem"}
      limits = {1_000, 100, 100, 1_000}
      arrived = System.monotonic_time(:millisecond) - 10_000

      assert {:new, _, _} =
               Observatory.Native.answered_claim(store, ids, @fingerprint, limits, arrived)

      # Claimed 10 s ago, past the 1 s window: forgotten, so claimed again now (the
      # clock read in the NIF) ...
      assert {:new, _, _} =
               Observatory.Native.answered_claim(store, ids, @fingerprint, limits, nil)

      # ... and that claim, pending and recent, holds.
      assert Observatory.Native.answered_claim(store, ids, @fingerprint, limits, nil) ==
               :in_progress
    end
  end

  describe "bounded memory" do
    test "1M distinct steps: the memory stays under its bounds, per session, per agent and in all" do
      Observatory.configure(
        idempotency: [max_steps: 10_000, max_steps_per_session: 100, max_steps_per_agent: 5_000]
      )

      hot = unique_session("sess-hot")
      prefix = unique_session("sess-cold") <> "-"
      agents = for a <- 0..6, do: "agent-1m-#{a}"
      fingerprint = :crypto.strong_rand_bytes(16)

      # Half the steps in one session, half each in a session of its own; seven agents.
      claim = fn i ->
        n = Integer.to_string(i)
        session = if rem(i, 2) == 0, do: hot, else: prefix <> n
        step = %{session_id: session, step_id: n, agent_id: Enum.at(agents, rem(i, 7))}
        {:new, _} = Idempotency.claim(Map.put(step, :fingerprint, fingerprint))
      end

      peaks =
        for chunk <- 0..9 do
          for i <- (chunk * 100_000 + 1)..(chunk * 100_000 + 100_000), do: claim.(i)
          per_agent = for a <- agents, do: Idempotency.count({:agent, a})
          {Idempotency.stats(), Idempotency.count({:session, hot}), per_agent}
        end

      for {stats, hot_count, per_agent} <- peaks do
        assert stats.steps <= 10_000
        assert stats.sessions <= 10_000
        assert hot_count == 100
        assert Enum.all?(per_agent, &(&1 <= 5_000))
      end

      # Memory stays flat once the cap is reached: the last tenth holds no more than
      # the first (same steps, same sessions).
      [{first, _, _} | _] = peaks
      {last, _, _} = List.last(peaks)
      assert last.bytes <= first.bytes * 1.1

      # The newest steps are remembered (claimed, not yet answered: in progress); the
      # oldest are forgotten.
      newest = %{
        session_id: hot,
        step_id: "1000000",
        agent_id: Enum.at(agents, rem(1_000_000, 7))
      }

      assert {:error, {:in_progress, _}} =
               Idempotency.claim(Map.put(newest, :fingerprint, fingerprint))

      oldest = %{session_id: hot, step_id: "2", agent_id: Enum.at(agents, 2)}
      assert {:new, _} = Idempotency.claim(Map.put(oldest, :fingerprint, fingerprint))
    end

    test "issue 20 finding 7: one agent cannot flush another's remembered steps", %{sid: sid} do
      Observatory.configure(idempotency: [max_steps: 1_000, max_steps_per_agent: 50])
      victim = for n <- 1..20, do: step(sid, "turn-#{n}")
      for s <- victim, do: {:ok, %{replayed: false}} = SchemaInterceptor.ingest(s)
      attacker = "agent-flood-#{System.unique_integer([:positive])}"

      # Twice the cap in all of distinct steps from another agent, over many sessions.
      for n <- 1..2_000 do
        flood =
          HTTP.envelope(%{
            "meta" => %{
              "session_id" => "#{sid}-flood-#{rem(n, 97)}",
              "step_id" => "k#{n}",
              "agent_id" => attacker
            }
          })

        {:ok, _} = SchemaInterceptor.ingest(flood)
      end

      assert Idempotency.count({:agent, attacker}) == 50
      assert Idempotency.count({:agent, "agent-http"}) >= 20
      # Every one of the victim's steps is still remembered: a retry counts nothing again.
      for s <- victim, do: assert({:ok, %{replayed: true}} = SchemaInterceptor.ingest(s))
      assert length(EntropyTracker.window(sid)) == 5
      assert SessionLog.count(sid) == 20
    end

    test "past :max_steps_per_session a session's oldest step is forgotten", %{sid: sid} do
      Observatory.configure(idempotency: [max_steps_per_session: 3])
      for n <- 1..4, do: {:ok, %{replayed: false}} = SchemaInterceptor.ingest(step(sid, "s#{n}"))
      assert Idempotency.count({:session, sid}) == 3
      assert {:ok, %{replayed: true}} = SchemaInterceptor.ingest(step(sid, "s4"))
      # Forgotten: counted as a new step.
      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(step(sid, "s1"))
    end

    test "a step older than :window_ms is forgotten: delivered again, it is a new step",
         %{sid: sid, step: step} do
      Observatory.configure(idempotency: [window_ms: 20])
      {:ok, _} = SchemaInterceptor.ingest(step)
      assert {:ok, %{replayed: true}} = SchemaInterceptor.ingest(step)
      Process.sleep(30)
      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(step)
      assert length(EntropyTracker.window(sid)) == 2
    end

    test "the sweep frees the steps that left the window", %{sid: sid} do
      step = %{session_id: sid, step_id: "old", agent_id: "agent-idem"}
      {:new, _} = Idempotency.claim(Map.put(step, :fingerprint, @fingerprint))
      assert Idempotency.count({:session, sid}) == 1
      # A window that ended a millisecond from now: every step has left it.
      assert Idempotency.sweep(-1) >= 1
      assert Idempotency.count({:session, sid}) == 0
      assert {:new, _} = Idempotency.claim(Map.put(step, :fingerprint, @fingerprint))
    end

    test "invalid settings fall back to their defaults" do
      # Values configure/1 refuses, put as a host's config would put them.
      Application.put_env(:observatory, :idempotency, max_steps: -1, window_ms: "soon", enabled: 1)

      Observatory.IngestSettings.refresh()

      defaults = [
        enabled: true,
        window_ms: 600_000,
        max_steps_per_session: 1_000,
        max_steps_per_agent: 10_000,
        max_steps: 100_000
      ]

      assert Enum.sort(Idempotency.settings()) == Enum.sort(defaults)
    end
  end
end
