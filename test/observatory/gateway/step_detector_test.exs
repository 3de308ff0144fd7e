defmodule Observatory.Gateway.StepDetectorTest do
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.{Events, SchemaInterceptor, StepDetector}
  alias Observatory.Test.HTTP

  setup do
    restore_env_on_exit([:step_detection])
    :ok = Events.subscribe(StepDetector.topic())
    %{sid: unique_session("sess-step")}
  end

  defp d(x), do: :crypto.hash(:sha256, to_string(x))

  defp step(sid, approach, outcome),
    do: elem(StepDetector.analyze(sid, d(approach), d(outcome)), 1)

  describe "the 2x2 progress matrix" do
    test "new approach + new outcome is full progress and resets streaks", %{sid: sid} do
      assert %{cell: :full_progress, action: :continue} = step(sid, :a, :x)
      step(sid, :a, :x)
      assert %{stagnation_streak: 1} = StepDetector.state(sid)
      assert %{cell: :full_progress, stagnation_streak: 0, stuck_streak: 0} = step(sid, :b, :y)
    end

    test "repeated approach + new outcome is world changed and resets streaks", %{sid: sid} do
      step(sid, :a, :x)
      step(sid, :b, :x)
      assert %{stuck_streak: 1} = StepDetector.state(sid)
      assert %{cell: :world_changed, stuck_streak: 0, stagnation_streak: 0} = step(sid, :a, :z)
    end

    test "new approach + repeated outcome is stuck", %{sid: sid} do
      step(sid, :a, :x)
      assert %{cell: :stuck, stuck_streak: 1, stagnation_streak: 0} = step(sid, :b, :x)
    end

    test "repeated approach + repeated outcome is full stagnation", %{sid: sid} do
      step(sid, :a, :x)
      assert %{cell: :full_stagnation, stagnation_streak: 1, stuck_streak: 0} = step(sid, :a, :x)
    end
  end

  describe "thresholds" do
    test "stagnation warns at 3 (not 2) and blocks at 5", %{sid: sid} do
      step(sid, :a, :x)
      assert %{stagnation_streak: 2, action: :continue} = step(sid, :a, :x) && step(sid, :a, :x)
      assert %{stagnation_streak: 3, action: :warn, guidance: guidance} = step(sid, :a, :x)
      assert guidance =~ "already run"
      assert_receive %{event_type: "loop_detection", kind: "warn", session_id: ^sid}
      assert %{action: :warn} = step(sid, :a, :x)
      assert %{stagnation_streak: 5, action: :block} = step(sid, :a, :x)
      assert_receive %{event_type: "loop_detection", kind: "block", session_id: ^sid}
    end

    test "stuck warns at 5 (not 4) and blocks at 8", %{sid: sid} do
      step(sid, :a0, :x)
      for i <- 1..4, do: assert(%{stuck_streak: ^i, action: :continue} = step(sid, :"a#{i}", :x))
      assert %{stuck_streak: 5, action: :warn} = step(sid, :a5, :x)
      assert %{stuck_streak: 7, action: :warn} = step(sid, :a6, :x) && step(sid, :a7, :x)
      assert %{stuck_streak: 8, action: :block} = step(sid, :a8, :x)
    end

    test "a block stays until an operator resets it", %{sid: sid} do
      for _ <- 1..6, do: step(sid, :a, :x)
      assert %{blocked: true} = StepDetector.state(sid)
      assert %{action: :block} = step(sid, :brand_new, :progress)
      assert :ok = StepDetector.reset(sid, operator: "alice")
      assert_receive %{event_type: "loop_detection", kind: "reset", operator: "alice"}
      assert %{blocked: false, stagnation_streak: 0} = StepDetector.state(sid)
      assert %{action: :continue, cell: :full_progress} = step(sid, :a, :x)
      assert {:error, :unknown_session} = StepDetector.reset("never-#{sid}", operator: "alice")
    end

    test "thresholds are configurable at run time", %{sid: sid} do
      Observatory.configure(step_detection: [stagnation_warn: 1, stagnation_block: 2])
      step(sid, :a, :x)
      assert %{action: :warn} = step(sid, :a, :x)
      assert %{action: :block} = step(sid, :a, :x)
    end

    test "invalid thresholds are an error, not a crash", %{sid: sid} do
      # Thresholds configure/1 refuses, put as a host's config would put them.
      Application.put_env(:observatory, :step_detection, stagnation_warn: 5, stagnation_block: 2)
      Observatory.IngestSettings.refresh()

      ExUnit.CaptureLog.capture_log(fn ->
        assert {:error, :invalid_step_thresholds} = StepDetector.analyze(sid, d(:a), d(:x))
      end)
    end
  end

  describe "on the gateway stream" do
    defp msg(sid, input, result) do
      HTTP.envelope(%{
        "meta" => %{"session_id" => sid},
        "action" => %{"tool_call" => "run_code", "tool_input" => input, "result" => result}
      })
    end

    test "tool_input key order does not matter: the same code is stagnation", %{sid: sid} do
      inputs = [
        %{"code" => "print(1)", "opts" => %{"a" => 1, "b" => 2}},
        %{"opts" => %{"b" => 2, "a" => 1}, "code" => "print(1)"}
      ]

      results =
        for i <- 0..3 do
          {:ok, r} =
            SchemaInterceptor.ingest(msg(sid, Enum.at(inputs, rem(i, 2)), %{"error" => "boom"}))

          r
        end

      assert Enum.map(results, & &1.step.cell) == [
               :full_progress,
               :full_stagnation,
               :full_stagnation,
               :full_stagnation
             ]

      assert [%{"type" => "warn", "source" => "step_detector", "guidance" => _}] =
               List.last(results).directives
    end

    test "the ingest answer carries the block", %{sid: sid} do
      for _ <- 1..6, do: SchemaInterceptor.ingest(msg(sid, %{"c" => 1}, "same"))
      {:ok, r} = SchemaInterceptor.ingest(msg(sid, %{"c" => 2}, "different"))
      assert r.step.action == :block, "the block stays even after a step that makes progress"
      assert Enum.any?(r.directives, &(&1["type"] == "block"))
    end

    test "a step without a result is not analysed", %{sid: sid} do
      {:ok, r} = SchemaInterceptor.ingest(HTTP.envelope(%{"meta" => %{"session_id" => sid}}))
      assert r.step == nil
      assert StepDetector.state(sid) == nil
    end

    test "reset is an operator action over HTTP", %{sid: sid} do
      for _ <- 1..5, do: SchemaInterceptor.ingest(msg(sid, %{"c" => 1}, "same"))
      path = "/api/v1/sessions/#{sid}/step_detector/reset"
      assert HTTP.post(path, "").status == 401
      resp = HTTP.post(path, "", headers: HTTP.operator_headers())
      assert resp.status == 200
      assert %{"step_detector" => %{"blocked" => false}} = resp.body
      shown = HTTP.get("/api/v1/sessions/#{sid}", HTTP.operator_headers()).body

      assert shown["step_detector"] == %{
               "blocked" => false,
               "stagnation_streak" => 0,
               "stuck_streak" => 0
             }
    end
  end

  describe "finding 9: a block survives a crash of the step detector and a node restart" do
    defp block!(sid) do
      for _ <- 1..5, do: step(sid, :a, :x)
      assert %{action: :block} = step(sid, :a, :x)
      assert StepDetector.state(sid).blocked
    end

    test "the step detector killed: the session is still blocked until reset", %{sid: sid} do
      block!(sid)
      old = Process.whereis(StepDetector)
      Process.exit(old, :kill)
      await_restart(old)

      # A new approach with a new outcome would be full progress; the block holds.
      assert %{action: :block, guidance: guidance} = step(sid, :b, :y)
      assert is_binary(guidance)
      assert %{blocked: true} = StepDetector.state(sid)
      assert sid in for(s <- StepDetector.active(), s.blocked, do: s.session_id)

      assert :ok = StepDetector.reset(sid, operator: "alice")
      assert %{action: :continue} = step(sid, :c, :z)
      refute StepDetector.state(sid).blocked
    end

    test "a block is lifted by reset only, not by a new step", %{sid: sid} do
      block!(sid)
      assert %{action: :block} = step(sid, :b, :y)
      assert :ok = StepDetector.reset(sid, operator: "alice")
      assert {:error, :unknown_session} = StepDetector.reset(unique_session(), operator: "a")
    end

    test "a restart of the application and of Mnesia keeps the block", %{sid: sid} do
      block!(sid)
      # This process subscribed (setup): the PubSub registry's partition is linked to it.
      Process.flag(:trap_exit, true)
      :ok = Application.stop(:observatory)
      :stopped = :mnesia.stop()
      {:ok, _} = Application.ensure_all_started(:observatory)

      assert %{blocked: true} = StepDetector.state(sid)
      assert %{action: :block} = step(sid, :b, :y)
    end
  end

  # The new process's name is registered before its init/1 has put its store: a call
  # to it returns only once init/1 is done.
  defp await_restart(old, tries \\ 200) do
    case Process.whereis(StepDetector) do
      pid when is_pid(pid) and pid != old -> :sys.get_state(pid) && pid
      _ when tries > 0 -> Process.sleep(10) && await_restart(old, tries - 1)
      _ -> flunk("the step detector did not come back")
    end
  end

  # A reset asked by another node runs on the session's owner under the caller's
  # deadline (Observatory.Cluster.call_owner/4): once it passes, the caller has
  # answered its operator 503, so the reset must not be applied after that.
  describe "an owner's deadline is checked while its reset's transaction waits" do
    test "a reset whose write would commit after the caller's deadline is not applied, and is answered late",
         %{sid: sid} do
      for _ <- 1..6, do: step(sid, :a, :x)
      assert [_] = :mnesia.dirty_read(:observatory_step_blocks, sid)
      holder = hold_write_lock(sid)

      deadline = System.os_time(:millisecond) + 500
      reset = Task.async(fn -> run_before(deadline, sid) end)
      # The reset started in time, and its transaction waits for the lock...
      await(fn -> in_transaction?(reset.pid) end)
      # ... until after its deadline (a wall-clock time: nothing else to await).
      Process.sleep(max(deadline - System.os_time(:millisecond) + 1, 0))
      send(holder, :release)

      assert {:error, :late} = Task.await(reset)
      assert [_] = :mnesia.dirty_read(:observatory_step_blocks, sid)
      assert %{blocked: true} = StepDetector.state(sid)
      refute_received %{event_type: "loop_detection", kind: "reset"}
    end

    test "a reset that commits before the caller's deadline is applied", %{sid: sid} do
      for _ <- 1..6, do: step(sid, :a, :x)
      assert {:ok, :ok} = run_before(System.os_time(:millisecond) + 5_000, sid)
      assert [] = :mnesia.dirty_read(:observatory_step_blocks, sid)
      assert %{blocked: false} = StepDetector.state(sid)
      assert_received %{event_type: "loop_detection", kind: "reset", operator: "alice"}
    end
  end

  defp run_before(deadline, sid),
    do: Observatory.Cluster.run_before(deadline, StepDetector, :reset, [sid, [operator: "alice"]])

  # A process holding the write lock of `sid`'s durable block until sent `:release`.
  defp hold_write_lock(sid) do
    test = self()

    holder =
      spawn_link(fn ->
        {:atomic, :ok} =
          :mnesia.transaction(fn ->
            :mnesia.lock({:record, :observatory_step_blocks, sid}, :write)
            send(test, {:locked, self()})
            receive do: (:release -> :ok)
          end)
      end)

    assert_receive {:locked, ^holder}
    holder
  end

  defp in_transaction?(pid),
    do: Enum.any?(:mnesia.system_info(:transactions), &match?({_tid, ^pid, _}, &1))

  defp await(fun, tries \\ 200) do
    cond do
      fun.() -> :ok
      tries == 0 -> flunk("condition not met in time")
      true -> Process.sleep(10) && await(fun, tries - 1)
    end
  end
end
