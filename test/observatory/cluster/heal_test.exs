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
end
