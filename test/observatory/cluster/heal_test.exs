defmodule Observatory.Cluster.HealTest do
  # Which side of a partition wins, and when the cluster waits instead of healing.
  use ExUnit.Case, async: true

  alias Observatory.Cluster.Heal

  defp view(node, running, connected, mnesia \\ :yes),
    do: %{node: node, mnesia: mnesia, running: running, connected: connected}

  test "one Mnesia partition: nothing to heal" do
    all = [:a, :b, :c]
    views = for n <- all, do: view(n, all, all -- [n])
    assert Heal.decide(views) == :whole
  end

  test "the larger side wins; the smaller side joins it" do
    views = [
      view(:a, [:a], [:b, :c]),
      view(:b, [:b, :c], [:a, :c]),
      view(:c, [:b, :c], [:a, :b])
    ]

    assert Heal.decide(views) == {:split, [:b, :c], [:a]}
  end

  test "one broken link isolates every node (OTP's global): the side holding the first node by name wins" do
    views = for n <- [:a, :b, :c], do: view(n, [n], [:a, :b, :c] -- [n])
    assert Heal.decide(views) == {:split, [:a], [:b, :c]}
  end

  test "a link still broken: the cluster waits (a partition longer than the heal bound is not healed)" do
    views = [
      view(:a, [:a, :b], [:b]),
      view(:b, [:a, :b], [:a, :c]),
      view(:c, [:c], [:b])
    ]

    assert {:wait, reason} = Heal.decide(views)
    assert reason =~ "cannot reach"
  end

  test "views that overlap (Mnesia still telling its nodes about a join): the cluster waits" do
    views = [
      view(:a, [:a, :b], [:b, :c]),
      view(:b, [:a, :b, :c], [:a, :c]),
      view(:c, [:b, :c], [:a, :b])
    ]

    assert {:wait, reason} = Heal.decide(views)
    assert reason =~ "disagree"
  end

  test "a member whose Mnesia does not run: the cluster waits" do
    views = [view(:a, [:a], [:b]), view(:b, [], [:a], :starting)]
    assert {:wait, "Mnesia is starting on b"} = Heal.decide(views)
  end

  describe "one heal at a time (the heal lock)" do
    test "a second caller is refused while the first holds the lock, and let in once it is free" do
      parent = self()

      first =
        spawn(fn ->
          Heal.exclusive([node()], fn ->
            send(parent, :holding)
            receive do: (:done -> :ok)
          end)

          send(parent, :first_done)
        end)

      assert_receive :holding
      assert Heal.exclusive([node()], fn -> :ran end) == :aborted
      assert Heal.lock_holder() =~ "held by #{inspect(first)} on #{node()}"

      send(first, :done)
      assert_receive :first_done
      assert Heal.exclusive([node()], fn -> :ran end) == :ran
    end
  end

  describe "a heal that does not come (HealWatch)" do
    alias Observatory.Cluster.HealWatch

    test "nodes apart longer than the timeout: said once, then once more when it ends" do
      {watch, nil} = HealWatch.see(nil, [:b], 0, 1_000)
      {watch, nil} = HealWatch.see(watch, [:c, :b], 999, 1_000)
      {watch, {:stalled, 1_000}} = HealWatch.see(watch, [:c, :b], 1_000, 1_000)
      assert watch.apart == [:b, :c]
      {watch, nil} = HealWatch.see(watch, [:b, :c], 5_000, 1_000)
      {watch, nil} = HealWatch.see(watch, [:b], 9_000, 1_000)
      assert {nil, {:ended, 9_500}} = HealWatch.see(watch, [], 9_500, 1_000)
    end

    test "a partition healed within the timeout is said neither as a stall nor as its end" do
      {watch, nil} = HealWatch.see(nil, [:b], 0, 1_000)
      {watch, nil} = HealWatch.see(watch, [:b], 900, 1_000)
      assert {nil, nil} = HealWatch.see(watch, [], 950, 1_000)
      assert {nil, nil} = HealWatch.see(nil, [], 5_000, 1_000)
    end

    # Before: the monitor fed a node whose own Mnesia does not run as [] (whole), so a
    # stall was said to be over ("runs whole again") and timed afresh afterwards.
    test "a look without this node's Mnesia (:unknown) neither ends a stall nor restarts its clock" do
      {watch, {:stalled, _}} =
        HealWatch.see(%{since: 0, apart: [:b], warned: false}, [:b], 2_000, 1_000)

      assert {^watch, nil} = HealWatch.see(watch, :unknown, 3_000, 1_000)
      assert {nil, {:ended, 4_000}} = HealWatch.see(watch, [], 4_000, 1_000)

      {young, nil} = HealWatch.see(nil, [:b], 0, 1_000)
      assert {^young, nil} = HealWatch.see(young, :unknown, 500, 1_000)
      assert {_, {:stalled, 1_000}} = HealWatch.see(young, [:b], 1_000, 1_000)
      assert {nil, nil} = HealWatch.see(nil, :unknown, 0, 1_000)
    end

    test "a second stall after one that ended is timed from its own start" do
      {watch, {:stalled, _}} =
        HealWatch.see(%{since: 0, apart: [:b], warned: false}, [:b], 2_000, 1_000)

      {nil, {:ended, _}} = HealWatch.see(watch, [], 3_000, 1_000)
      {watch, nil} = HealWatch.see(nil, [:c], 10_000, 1_000)
      assert {_, {:stalled, 1_200}} = HealWatch.see(watch, [:c], 11_200, 1_000)
    end
  end
end
