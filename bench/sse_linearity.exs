# The proxy's reader of server-sent events on one giant event, sent in 4 KiB writes
# (what a hostile or broken upstream can do) against the same event in one write
# (the baseline, same run): time per byte at 64 KiB, 1 MiB and 2 MiB.
#
#   MIX_ENV=prod mix run --no-start bench/sse_linearity.exs
alias Observatory.Proxy.SSE

event = fn bytes -> "data: {\"x\":\"" <> String.duplicate("a", bytes) <> "\"}\n\n" end

pieces = fn text ->
  whole = for <<piece::binary-size(4096) <- text>>, do: piece
  whole ++ [binary_part(text, div(byte_size(text), 4096) * 4096, rem(byte_size(text), 4096))]
end

# The best of five, in µs.
time = fn fun -> Enum.min(for _ <- 1..5, do: elem(:timer.tc(fun), 0)) end

IO.puts("| event | one write | in 4 KiB writes | ns per byte, 4 KiB writes | × one write |")
IO.puts("|---|---:|---:|---:|---:|")

for size <- [64 * 1024, 1024 * 1024, 2 * 1024 * 1024] do
  text = event.(size)
  split = pieces.(text)
  one = time.(fn -> SSE.parse(SSE.new(), text) end)

  many =
    time.(fn -> Enum.reduce(split, SSE.new(), fn p, sse -> elem(SSE.parse(sse, p), 2) end) end)

  IO.puts(
    "| #{div(size, 1024)} KiB | #{one} µs | #{many} µs | " <>
      "#{Float.round(many * 1000 / byte_size(text), 1)} | #{Float.round(many / max(one, 1), 2)} |"
  )
end
