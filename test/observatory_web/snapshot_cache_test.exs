defmodule ObservatoryWeb.SnapshotCacheTest do
  use ExUnit.Case, async: true

  alias ObservatoryWeb.SnapshotCache

  defp counting do
    counter = :counters.new(1, [])
    {counter, fn -> :counters.add(counter, 1, 1) && :counters.get(counter, 1) end}
  end

  describe "finding 5: one fleet snapshot per refresh for every open tab" do
    test "pages that refresh within max_age share one computation" do
      key = {__MODULE__, make_ref()}
      {counter, compute} = counting()

      results =
        1..20
        |> Enum.map(fn _ -> Task.async(fn -> SnapshotCache.fetch(key, 60_000, compute) end) end)
        |> Enum.map(&Task.await/1)

      assert :counters.get(counter, 1) == 1
      assert Enum.uniq(results) == [1]
    end

    test "a value older than max_age is computed again" do
      key = {__MODULE__, make_ref()}
      {counter, compute} = counting()
      assert SnapshotCache.fetch(key, 0, compute) == 1
      assert SnapshotCache.fetch(key, 0, compute) == 2
      assert SnapshotCache.fetch(key, 60_000, compute) == 2
      assert :counters.get(counter, 1) == 2
    end
  end
end
