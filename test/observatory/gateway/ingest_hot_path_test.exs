defmodule Observatory.Gateway.IngestHotPathTest do
  # What the cheaper ingest must still do exactly: safety state read fresh on every
  # step, settings read on every step, broadcasts to whoever subscribes, the session
  # log's byte count (bench/ingest_breakdown.exs measures what it costs).
  use Observatory.TrackerCase, async: false
  import Bitwise

  alias Observatory.Gateway.{Events, HITL, SchemaInterceptor, SessionLog, StepDetector}
  alias Observatory.Storage
  alias Observatory.Test.HTTP

  setup do
    restore_env_on_exit([:step_detection, :session_log_size, :idempotency])
    %{sid: unique_session("hot")}
  end

  defp step(sid, n, input \\ "/same"), do: HTTP.repeated_read(sid, n, input)

  describe "safety state is read on every step, nothing cached" do
    test "a pause acknowledged is enforced on the very next step, a resume too", %{sid: sid} do
      assert {:ok, %{paused: false, directives: []}} =
               SchemaInterceptor.ingest(step(sid, 1, "/a"))

      {:ok, _} = HITL.pause(sid, operator: "alice", reason: "look")

      assert {:ok, %{paused: true, directives: [%{"type" => "pause", "operator" => "alice"}]}} =
               SchemaInterceptor.ingest(step(sid, 2, "/b"))

      {:ok, _} = HITL.resume(sid, operator: "alice")

      assert {:ok, %{paused: false, directives: []}} =
               SchemaInterceptor.ingest(step(sid, 3, "/c"))
    end

    test "a step-detector block holds from the step that set it; a reset lifts it on the next",
         %{sid: sid} do
      Observatory.configure(step_detection: [stagnation_warn: 2, stagnation_block: 3])

      actions =
        for n <- 1..5 do
          {:ok, %{step: %{action: action}}} = SchemaInterceptor.ingest(step(sid, n))
          action
        end

      # The first step is new; each repeat adds one to the stagnation streak.
      assert actions == [:continue, :continue, :warn, :block, :block]
      assert %{guidance: guidance} = StepDetector.block(sid)
      assert is_binary(guidance)

      :ok = StepDetector.reset(sid, operator: "alice")
      assert {:ok, %{step: %{action: :continue}}} = SchemaInterceptor.ingest(step(sid, 6, "/new"))
    end

    test "Storage.read/2 answers what a dirty read answers, errors included", %{sid: sid} do
      table = HITL.pauses_table()
      assert Storage.read(table, sid) == [] and :mnesia.dirty_read(table, sid) == []
      {:ok, _} = HITL.pause(sid, operator: "alice")
      assert [{^table, ^sid, %{operator: "alice"}}] = Storage.read(table, sid)
      assert Storage.read(table, sid) == :mnesia.dirty_read(table, sid)
      {:ok, _} = HITL.resume(sid, operator: "alice")

      assert catch_exit(Storage.read(:no_such_table, sid)) ==
               catch_exit(:mnesia.dirty_read(:no_such_table, sid))
    end
  end

  describe "Storage.read/2 remembers which table holds this node's copy, not what it holds" do
    setup do
      table = :"hot_path_probe_#{System.unique_integer([:positive])}"
      create = fn -> {:atomic, :ok} = :mnesia.create_table(table, attributes: [:k, :v]) end
      create.()
      on_exit(fn -> :mnesia.delete_table(table) end)
      %{table: table, create: create}
    end

    test "a copy deleted and made again is read anew: each answer a dirty read's",
         %{sid: sid, table: table, create: create} do
      :ok = :mnesia.dirty_write({table, sid, :first})
      assert Storage.read(table, sid) == [{table, sid, :first}]
      # The loaded copy's table is remembered, and each read still looks in it.
      assert Storage.remembered_copy(table) == :ets.whereis(table)
      :ok = :mnesia.dirty_write({table, sid, :again})
      assert Storage.read(table, sid) == [{table, sid, :again}]

      {:atomic, :ok} = :mnesia.delete_table(table)

      assert catch_exit(Storage.read(table, sid)) ==
               catch_exit(:mnesia.dirty_read(table, sid))

      create.()
      assert Storage.read(table, sid) == [] and :mnesia.dirty_read(table, sid) == []
      :ok = :mnesia.dirty_write({table, sid, :second})
      assert Storage.read(table, sid) == [{table, sid, :second}]
      assert Storage.remembered_copy(table) == :ets.whereis(table)
    end
  end

  describe "Storage.read/2's remembered copies, every table's under one key" do
    test "a table's copy forgotten leaves the others' remembered, and each read exact",
         %{sid: sid} do
      [a, b] =
        for name <- [:a, :b] do
          table = :"hot_path_#{name}_#{System.unique_integer([:positive])}"
          {:atomic, :ok} = :mnesia.create_table(table, attributes: [:k, :v])
          on_exit(fn -> :mnesia.delete_table(table) end)
          :ok = :mnesia.dirty_write({table, sid, name})
          table
        end

      assert Storage.read(a, sid) == [{a, sid, :a}]
      assert Storage.read(b, sid) == [{b, sid, :b}]
      assert Storage.remembered_copy(a) == :ets.whereis(a)
      assert Storage.remembered_copy(b) == :ets.whereis(b)

      {:atomic, :ok} = :mnesia.delete_table(a)
      assert catch_exit(Storage.read(a, sid)) == catch_exit(:mnesia.dirty_read(a, sid))
      assert Storage.remembered_copy(a) == nil
      assert Storage.remembered_copy(b) == :ets.whereis(b)
      assert Storage.read(b, sid) == [{b, sid, :b}]
    end
  end

  describe "settings are read on every step" do
    test "a changed :step_detection threshold applies to the next step", %{sid: sid} do
      Observatory.configure(step_detection: [stagnation_warn: 5, stagnation_block: 8])

      for n <- 1..3,
          do: {:ok, %{step: %{action: :continue}}} = SchemaInterceptor.ingest(step(sid, n))

      Observatory.configure(step_detection: [stagnation_warn: 2, stagnation_block: 8])
      assert {:ok, %{step: %{action: :warn}}} = SchemaInterceptor.ingest(step(sid, 4))
    end

    test "FR-9.11: a changed entropy window size applies to the next step", %{sid: sid} do
      Application.put_env(:observatory, :entropy_window_size, 3)
      for n <- 1..4, do: {:ok, _} = SchemaInterceptor.ingest(step(sid, n, "/p#{n}"))
      assert length(EntropyTracker.window(sid)) == 3
      Application.put_env(:observatory, :entropy_window_size, 4)
      {:ok, _} = SchemaInterceptor.ingest(step(sid, 5, "/p5"))
      assert length(EntropyTracker.window(sid)) == 4
    end
  end

  describe "the idempotency setting is read on every step (its limits kept only while it is unchanged)" do
    test "a changed :idempotency applies to the next step: off, back on, a smaller cap",
         %{sid: sid} do
      json = Observatory.JSON.encode!(step(sid, 1, "/a"))
      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(json)
      assert {:ok, %{replayed: true}} = SchemaInterceptor.ingest(json)

      # Off: the same delivery is scored again, nothing is remembered.
      Observatory.configure(idempotency: [enabled: false])
      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(json)

      # On again, one step per session: step 2 pushes step 1 out on the next claim.
      Observatory.configure(idempotency: [max_steps_per_session: 1])
      json2 = Observatory.JSON.encode!(step(sid, 2, "/b"))
      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(json2)
      assert {:ok, %{replayed: true}} = SchemaInterceptor.ingest(json2)
      assert {:ok, %{replayed: false}} = SchemaInterceptor.ingest(json)
    end
  end

  describe "a retry gets the first answer, as it was" do
    test "the loop verdict and the step detector's verdict come back field for field",
         %{sid: sid} do
      Observatory.configure(step_detection: [stagnation_warn: 2, stagnation_block: 3])
      for n <- 1..4, do: {:ok, _} = SchemaInterceptor.ingest(step(sid, n))
      json = Observatory.JSON.encode!(step(sid, 5))
      {:ok, first} = SchemaInterceptor.ingest(json)
      assert %{step: %{action: :block, guidance: guidance}, verdict: %{evidence: [_ | _]}} = first
      assert is_binary(guidance)

      {:ok, again} = SchemaInterceptor.ingest(json)
      assert again.replayed

      kept = [:entropy_score, :severity, :verdict, :step, :directives, :paused]
      assert Map.take(again, kept) == Map.take(first, kept)
    end
  end

  describe "broadcasts go to whoever subscribes" do
    test "a subscriber that joins after earlier steps gets the next ones", %{sid: sid} do
      {:ok, _} = SchemaInterceptor.ingest(step(sid, 1, "/a"))
      parent = self()

      spawn_link(fn ->
        :ok = Events.subscribe(Events.decision_logs())
        send(parent, :subscribed)
        receive do: (%{session_id: ^sid} = event -> send(parent, {:late, event}))
      end)

      assert_receive :subscribed
      {:ok, _} = SchemaInterceptor.ingest(step(sid, 2, "/b"))
      assert_receive {:late, %{event_type: "decision_log", step_id: step_id}}
      assert step_id == "#{sid}-2"
    end
  end

  describe "the step's clock in milliseconds, worked out without convert_time_unit/3" do
    test "is :erlang.convert_time_unit/3's answer, rounded down, negative readings included" do
      now = :erlang.monotonic_time()
      per_ms = :erlang.convert_time_unit(1, :millisecond, :native)
      edges = for base <- [0, now, -now], d <- -2..2, k <- [0, per_ms], do: base + k * d + d
      random = for _ <- 1..2_000, do: :rand.uniform(1 <<< 62) - (1 <<< 61)

      for t <- edges ++ random do
        assert SchemaInterceptor.native_to_ms(t) ==
                 :erlang.convert_time_unit(t, :native, :millisecond),
               "at #{t}"
      end
    end
  end

  describe "the session log counts the bytes it holds" do
    test "replacing the oldest envelope takes its size off", %{sid: sid} do
      Observatory.configure(session_log_size: 2)
      envelopes = for n <- 1..3, do: %{"n" => n, "pad" => String.duplicate("x", n * 100)}
      before = SessionLog.stats().bytes
      for e <- envelopes, do: :ok = SessionLog.put(sid, e)
      kept = Enum.drop(envelopes, 1)
      assert SessionLog.recent(sid) == kept

      assert SessionLog.stats().bytes - before ==
               Enum.sum(Enum.map(kept, &:erlang.external_size/1))
    end
  end
end
