defmodule Observatory.NativeReleaseBuildTest do
  use ExUnit.Case, async: true

  # The counting global allocator (cargo feature `alloc_count`, read by
  # bench/nif_allocs.exs) is a measuring tool: every allocation of every NIF call goes
  # through its bookkeeping, so the library the application loads is built without it.
  test "the NIF library the application loads is built without the counting allocator" do
    assert_raise ErlangError, ~r/nif_not_loaded/, fn -> Observatory.Native.alloc_counts() end
  end
end
