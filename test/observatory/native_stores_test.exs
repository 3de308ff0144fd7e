defmodule Observatory.NativeStoresTest do
  # The Rust stores are published in an ETS table, not in :persistent_term: a NIF on a
  # dirty scheduler was handed a store read from a persistent term, the term was
  # replaced while the call waited for the scheduler, and OTP 25 freed the store (and
  # the term) under it: heap corruption that aborted the VM ("malloc(): unsorted double
  # linked list corrupted") and persistent_term reads that returned another key's value.
  use ExUnit.Case, async: false

  alias Observatory.Gateway.{CallBreaker, EntropyTracker, Idempotency, LoopVerdict, StepDetector}
  alias Observatory.Gateway.StepScore
  alias Observatory.KillSwitch.Windows
  alias Observatory.{Native, NativeStores}

  @digest :crypto.hash(:sha256, "step")

  # A store that only the table holds: made by a process that is gone.
  defp lone_store do
    Task.async(fn -> Native.entropy_store_new(1, 10) end) |> Task.await()
  end

  defp gc_all, do: Enum.each(Process.list(), &:erlang.garbage_collect/1)

  # Until `n` holds are under way, for at most `ms` (a loaded machine may start one
  # late, after another ended: the holder below then just waits less).
  defp await_held(n, ms) do
    if Native.stores_held() < n and ms > 0, do: Process.sleep(1) && await_held(n, ms - 1)
  end

  # A key of the test's own, unpublished when it ends.
  defp own_key(_context) do
    key = {__MODULE__, make_ref()}
    on_exit(fn -> NativeStores.erase(key) end)
    %{key: key}
  end

  # Hands the store under `key` to a dirty NIF that must wait for a scheduler (every
  # dirty CPU scheduler is busy), runs `change` meanwhile, and answers whether the
  # store was still alive when the NIF had it.
  defp alive_through?(key, change) do
    busy = :erlang.system_info(:dirty_cpu_schedulers)
    other = lone_store()
    blockers = for _ <- 1..busy, do: Task.async(fn -> Native.store_hold(other, 300) end)
    await_held(busy, 250)
    holder = Task.async(fn -> Native.store_hold(NativeStores.get(key), 10) end)
    Process.sleep(10)
    change.()
    gc_all()
    Enum.each(blockers, &Task.await/1)
    Task.await(holder)
  end

  describe "a store handed to a dirty NIF (heap corruption fix)" do
    setup :own_key

    test "stays alive while its entry is replaced", %{key: key} do
      NativeStores.put(key, lone_store())

      for _ <- 1..3 do
        assert alive_through?(key, fn -> NativeStores.put(key, lone_store()) end)
      end
    end

    test "stays alive while its entry is erased, and is freed once the NIF is done",
         %{key: key} do
      # Stores other tests left unreferenced are freed first: they would otherwise be
      # freed by the collection below and counted as this store's.
      gc_all()
      before = Native.live_stores()
      NativeStores.put(key, lone_store())
      assert Native.live_stores() == before + 1

      assert alive_through?(key, fn -> NativeStores.erase(key) end)
      gc_all()
      assert Native.live_stores() == before
      assert NativeStores.get(key, :none) == :none
      assert_raise ArgumentError, fn -> NativeStores.get(key) end
    end
  end

  describe "where the stores live" do
    test "no persistent term holds a Rust store, the breaker, the rules or the lock" do
      # The owners have started (the application runs); restart some, as a crash would.
      for name <- [StepDetector, LoopVerdict, Idempotency, CallBreaker] do
        old = Process.whereis(name)
        Process.exit(old, :kill)
        await_restart(name, old)
      end

      assert {:ok, _} = StepDetector.analyze("sess-native-stores", @digest, @digest)
      assert is_map(Idempotency.stats())
      assert Windows.count() >= 0
      assert EntropyTracker.stats().sessions >= 0

      for {key, value} <- :persistent_term.get(), ref <- references(value) do
        refute Native.native_resource?(ref), "#{inspect(key)} holds a NIF resource"
      end
    end

    test "an owner's store stays published while the owner restarts" do
      sid = "sess-native-stores-#{System.unique_integer([:positive])}"
      old = Process.whereis(StepDetector)
      store = NativeStores.get(StepDetector)
      Process.exit(old, :kill)

      # Until the new owner puts its store, callers keep working on the old one.
      new =
        await_restart(StepDetector, old, 200, fn ->
          assert {:ok, %{cell: _}} = StepDetector.analyze(sid, @digest, @digest)
        end)

      assert is_pid(new)
      refute NativeStores.get(StepDetector) == store
    end
  end

  # The ingest's scoring call finds the tracker's, the verdict's and the step
  # detector's stores with one lookup: a row whose parts their owners each put.
  describe "a row of stores used together (put_part/4, get_row/1)" do
    setup :own_key

    test "each part is put on its own, the others nil until theirs are", %{key: key} do
      assert NativeStores.get_row(key) == nil
      {a, b} = {lone_store(), lone_store()}
      :ok = NativeStores.put_part(key, 3, 2, a)
      assert NativeStores.get_row(key) == {key, nil, a, nil}
      :ok = NativeStores.put_part(key, 3, 3, b)
      :ok = NativeStores.put_part(key, 3, 2, b)
      assert NativeStores.get_row(key) == {key, nil, b, b}
      :ok = NativeStores.put_part(key, 3, 3, nil)
      assert NativeStores.get_row(key) == {key, nil, b, nil}
      assert_raise FunctionClauseError, fn -> NativeStores.put_part(key, 3, 4, a) end
    end

    test "a replaced part's store is released once no one holds it", %{key: key} do
      gc_all()
      before = Native.live_stores()
      NativeStores.put_part(key, 3, 1, lone_store())
      assert Native.live_stores() == before + 1
      NativeStores.put_part(key, 3, 1, nil)
      gc_all()
      assert Native.live_stores() == before
    end

    test "the scoring row holds each owner's store, replaced when the owner restarts" do
      row = fn -> NativeStores.get_row(StepScore) end

      assert {StepScore, entropy, verdict, step} = row.()
      assert entropy == NativeStores.get({EntropyTracker, EntropyTracker})
      assert verdict == LoopVerdict.store_or_nil()
      assert step == StepDetector.store_or_nil()

      for {name, part} <- [{LoopVerdict, 2}, {StepDetector, 3}, {EntropyTracker, 1}] do
        old_store = elem(row.(), part)
        old = Process.whereis(name)
        Process.exit(old, :kill)
        await_restart(name, old)
        # The name is registered before init/1 runs: its store is put by then.
        :sys.get_state(name)
        refute elem(row.(), part) == old_store
      end

      assert {StepScore, entropy, verdict, step} = row.()
      assert entropy == NativeStores.get({EntropyTracker, EntropyTracker})
      assert verdict == LoopVerdict.store_or_nil()
      assert step == StepDetector.store_or_nil()
    end
  end

  # A step's stores are read through a cache each caller keeps (get_cached/1,
  # get_row_cached/1), valid while nothing is published: what a lookup answers must
  # be what the table holds.
  describe "cached lookups (get_cached/1, get_row_cached/1)" do
    setup :own_key

    test "a store put by another process is seen by the next lookup", %{key: key} do
      {a, b} = {lone_store(), lone_store()}
      NativeStores.put(key, a)
      assert NativeStores.get_cached(key) == a
      assert NativeStores.get_cached(key) == a
      Task.async(fn -> NativeStores.put(key, b) end) |> Task.await()
      assert NativeStores.get_cached(key) == b
    end

    test "an erased store is seen at once: none, as the table answers", %{key: key} do
      NativeStores.put(key, lone_store())
      assert is_reference(NativeStores.get_cached(key))
      Task.async(fn -> NativeStores.erase(key) end) |> Task.await()
      assert_raise ArgumentError, fn -> NativeStores.get_cached(key) end
      assert NativeStores.get_row_cached(key) == nil
      assert_raise ArgumentError, fn -> NativeStores.get_cached({__MODULE__, make_ref()}) end
    end

    test "a part put into a row is seen by the next row lookup", %{key: key} do
      assert NativeStores.get_row_cached(key) == nil
      a = lone_store()
      Task.async(fn -> NativeStores.put_part(key, 2, 2, a) end) |> Task.await()
      assert NativeStores.get_row_cached(key) == {key, nil, a}
      Task.async(fn -> NativeStores.put_part(key, 2, 2, nil) end) |> Task.await()
      assert NativeStores.get_row_cached(key) == {key, nil, nil}
    end

    test "an owner's restart is seen by the very next lookup of the step's stores" do
      row = NativeStores.get_row_cached(StepScore)
      log = NativeStores.get_cached(Observatory.Gateway.SessionLog)

      for name <- [EntropyTracker, Observatory.Gateway.SessionLog] do
        old = Process.whereis(name)
        Process.exit(old, :kill)
        await_restart(name, old)
      end

      assert NativeStores.get_row_cached(StepScore) == NativeStores.get_row(StepScore)
      refute NativeStores.get_row_cached(StepScore) == row
      refute NativeStores.get_cached(Observatory.Gateway.SessionLog) == log

      assert NativeStores.get_cached(Observatory.Gateway.SessionLog) ==
               NativeStores.get(Observatory.Gateway.SessionLog)
    end

    test "while the application is stopped they answer as the table does: none" do
      log = Observatory.Gateway.SessionLog
      old_log = NativeStores.get_cached(log)
      assert {StepScore, _, _, _} = NativeStores.get_row_cached(StepScore)
      :ok = Application.stop(:observatory)

      try do
        assert NativeStores.get_row(StepScore) == nil
        assert NativeStores.get_row_cached(StepScore) == nil
        assert_raise ArgumentError, fn -> NativeStores.get_cached(log) end
      after
        {:ok, _} = Application.ensure_all_started(:observatory)
      end

      # Started again: the new stores, at once.
      assert NativeStores.get_cached(log) == NativeStores.get(log)
      refute NativeStores.get_cached(log) == old_log
      assert NativeStores.get_row_cached(StepScore) == NativeStores.get_row(StepScore)
    end

    test "after forget/0 (the application stopping) they read the table itself, and let go",
         %{key: key} do
      gc_all()
      before = Native.live_stores()
      NativeStores.put(key, lone_store())
      assert is_reference(NativeStores.get_cached(key))
      NativeStores.forget()

      try do
        # Deleted behind NativeStores' back, as the table goes when the application ends.
        :ets.delete(NativeStores, key)
        assert NativeStores.get_row_cached(key) == nil
        assert_raise ArgumentError, fn -> NativeStores.get_cached(key) end
        gc_all()
        assert Native.live_stores() == before
      after
        NativeStores.setup()
      end
    end

    test "a replaced store is not kept alive by a process's next lookup", %{key: key} do
      other = {__MODULE__, make_ref()}
      on_exit(fn -> NativeStores.erase(other) end)
      NativeStores.put(other, lone_store())
      gc_all()
      before = Native.live_stores()

      # This process keeps both; the first store is then replaced.
      NativeStores.put(key, lone_store())
      NativeStores.get_cached(key)
      NativeStores.get_cached(other)
      NativeStores.put(key, lone_store())
      gc_all()
      assert Native.live_stores() == before + 2

      # A lookup of any key it kept drops what it kept before the change.
      NativeStores.get_cached(other)
      gc_all()
      assert Native.live_stores() == before + 1
    end
  end

  defp references(term) when is_reference(term), do: [term]
  defp references(term) when is_tuple(term), do: references(Tuple.to_list(term))
  defp references(term) when is_map(term), do: references(Map.to_list(term))
  defp references([h | t]), do: references(h) ++ references(t)
  defp references(_), do: []

  # Waits for `name` to run again under a new pid, calling `meanwhile` on each try.
  defp await_restart(name, old, tries \\ 2_000, meanwhile \\ fn -> :ok end) do
    meanwhile.()

    case Process.whereis(name) do
      pid when is_pid(pid) and pid != old ->
        :sys.get_state(pid)
        pid

      _ when tries > 0 ->
        Process.sleep(1)
        await_restart(name, old, tries - 1, meanwhile)

      _ ->
        flunk("#{inspect(name)} did not come back")
    end
  end
end
