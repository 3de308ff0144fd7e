defmodule Observatory.DerivedSettingTest do
  use ExUnit.Case, async: true

  alias Observatory.DerivedSetting

  setup do
    key = {__MODULE__, make_ref()}
    on_exit(fn -> :persistent_term.erase(key) end)
    %{key: key}
  end

  test "a setting worked out once is returned again without deriving it again", %{key: key} do
    counter = :counters.new(1, [])
    derive = fn setting -> :counters.add(counter, 1, 1) && {:derived, setting} end

    assert DerivedSetting.get(key, [a: 1], derive) == {:derived, [a: 1]}
    assert DerivedSetting.get(key, [a: 1], derive) == {:derived, [a: 1]}
    assert :counters.get(counter, 1) == 1
  end

  test "a changed setting is worked out again, and so is a change back", %{key: key} do
    counter = :counters.new(1, [])
    derive = fn setting -> :counters.add(counter, 1, 1) && {:derived, setting} end

    assert DerivedSetting.get(key, [a: 1], derive) == {:derived, [a: 1]}
    assert DerivedSetting.get(key, [a: 2], derive) == {:derived, [a: 2]}
    assert DerivedSetting.get(key, [a: 1], derive) == {:derived, [a: 1]}
    assert :counters.get(counter, 1) == 3
  end
end
