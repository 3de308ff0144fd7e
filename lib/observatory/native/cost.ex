defmodule Observatory.Native.Cost do
  @moduledoc false
  # Where a NIF call on a client's bytes moves to a dirty scheduler.
  #
  # Every parser is linear in its input (native/observatory_core/benches/linearity.rs),
  # so a call's cost is its size times a cost per byte. The costliest shape measured
  # (a JSON result of many tiny objects, with the terms built for it) costs about 50 ns
  # per byte (bench/linearity.exs prints the figure at this size), so a call on at most
  # 8 KiB holds a normal scheduler about 0.4 ms, with room to spare under the ~1 ms it
  # may on a slower or busier machine; larger ones run on a dirty scheduler.

  @dirty_bytes 8 * 1024

  @doc "Inputs larger than this many bytes are parsed on a dirty scheduler."
  def dirty_bytes, do: @dirty_bytes
end
