# What reading a Rust store from Observatory.NativeStores (an ETS table: the reference
# is copied onto the caller's heap) costs against reading it from :persistent_term
# (no copy), which the stores left because a persistent term handed to a dirty NIF
# could be freed under it. Both in one run, on the same store.
#
#   MIX_ENV=prod mix run --no-start bench/native_stores.exs             # ~10 s
#   MIX_ENV=prod mix run --no-start bench/native_stores.exs -- --quick  # smoke test
#
# Reports, for 1 and 2 concurrent callers, the cost of the lookup alone and of a step
# through the step detector's NIF (lookup + Native.step_analyze/6), in ns per call,
# and the ratio ETS / :persistent_term.
alias Observatory.{Native, NativeStores}

quick? = "--quick" in System.argv()
calls = if quick?, do: 100_000, else: 1_000_000

NativeStores.setup()
store = Native.step_store_new(4, 10_000)
NativeStores.put(:bench_store, store)
:persistent_term.put(:bench_store, store)

digests = for i <- 0..2, do: :crypto.hash(:sha256, <<i>>)
digests = List.to_tuple(digests)
ids = for(i <- 0..999, do: "sess-#{i}") |> List.to_tuple()
thresholds = {3, 5, 5, 8}

lookups = %{
  "ets" => fn -> NativeStores.get(:bench_store) end,
  "persistent_term" => fn -> :persistent_term.get(:bench_store) end
}

work = %{
  "lookup" => fn get, _i -> get.() end,
  "step" => fn get, i ->
    d = elem(digests, rem(i, 3))
    Native.step_analyze(get.(), elem(ids, rem(i, 1000)), d, d, thresholds, 16)
  end
}

# ns per call with `callers` processes each making `calls` calls.
measure = fn callers, fun ->
  parent = self()

  {micros, _} =
    :timer.tc(fn ->
      for _ <- 1..callers do
        spawn_link(fn ->
          for i <- 1..calls, do: fun.(i)
          send(parent, :done)
        end)
      end

      for _ <- 1..callers, do: receive(do: (:done -> :ok))
    end)

  micros * 1000 / (calls * callers)
end

IO.puts("calls per caller: #{calls}")

for {what, op} <- work, callers <- [1, 2] do
  # Warm up, then measure both lookups alternately, twice, keeping each one's best.
  Enum.each(lookups, fn {_, get} -> measure.(callers, &op.(get, &1)) end)

  best =
    for _ <- 1..2, {name, get} <- lookups, reduce: %{} do
      acc ->
        ns = measure.(callers, &op.(get, &1))
        Map.update(acc, name, ns, &min(&1, ns))
    end

  IO.puts(
    :io_lib.format("~-6s callers=~b  ets ~7.1f ns  persistent_term ~7.1f ns  ratio ~.2f", [
      what,
      callers,
      best["ets"],
      best["persistent_term"],
      best["ets"] / best["persistent_term"]
    ])
  )
end
