defmodule Observatory.JSONTest do
  use ExUnit.Case, async: true

  alias Observatory.JSON

  doctest JSON

  test "round-trips JSON values" do
    value = %{"a" => [1, -2, 3.5, true, false, nil, "ü ✓"], "b" => %{"c" => %{}}, "d" => []}
    assert {:ok, ^value} = value |> JSON.encode!() |> JSON.decode()
  end

  test "objects of every size around the no-allocation bound decode whole, arrays in order" do
    for n <- [0, 1, 15, 16, 17, 40] do
      object = Map.new(1..n//1, &{"k#{&1}", [&1, %{"n" => &1}, "v#{&1}"]})
      assert {:ok, ^object} = object |> JSON.encode!() |> JSON.decode()
      assert {:ok, [^object, 1, [2, [3]]]} = JSON.decode(JSON.encode!([object, 1, [2, [3]]]))
    end
  end

  test "atoms become strings, nil null" do
    assert JSON.encode!(%{severity: :loop, x: nil}) == ~s({"severity":"loop","x":null})
  end

  test "large documents go through the dirty scheduler and still decode" do
    big = %{"items" => for(i <- 1..20_000, do: %{"i" => i, "s" => "item #{i}"})}
    json = JSON.encode!(big)
    assert byte_size(json) > 64 * 1024
    assert {:ok, ^big} = JSON.decode(json)
  end

  test "a term holding one big string is encoded on the dirty scheduler (review finding)" do
    # A 1 MiB string is a few words of heap but a millisecond of escaping.
    assert JSON.dirty_encode?(%{"content" => String.duplicate("\"", 1_048_576)})
    refute JSON.dirty_encode?(%{"content" => "short"})
    big = %{"content" => String.duplicate("a\n", 100_000)}
    assert {:ok, ^big} = big |> JSON.encode!() |> JSON.decode()
  end

  test "terms JSON cannot express are refused with a reason" do
    assert {:error, msg} = JSON.encode({:a, 1})
    assert msg =~ "Tuple"
    assert {:error, _} = JSON.encode(self())
    assert {:error, "a string is not valid UTF-8"} = JSON.encode(<<0xFF>>)
    assert {:error, msg} = JSON.encode(DateTime.utc_now())
    assert msg =~ "structs"
    assert {:error, _} = JSON.encode(%{{:tuple} => 1})
    assert {:error, _} = JSON.encode(2 ** 70)
    deep = Enum.reduce(1..200, [], fn _, acc -> [acc] end)
    assert {:error, msg} = JSON.encode(deep)
    assert msg =~ "nesting"
    assert_raise ArgumentError, fn -> JSON.encode!({:a}) end
  end

  test "malformed input is an error, never a crash" do
    for bad <- ["{", "[1,]", "nul", <<"\"", 0xFF, "\"">>, String.duplicate("[", 500)] do
      assert {:error, reason} = JSON.decode(bad)
      assert is_binary(reason)
    end
  end
end
