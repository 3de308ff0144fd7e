# What reading a Rust store from Observatory.NativeStores (an ETS table: the reference
# is copied onto the caller's heap) costs against reading it from :persistent_term
# (no copy), which the stores left because a persistent term handed to a dirty NIF
# could be freed under it, and against the caller's cached copy (get_cached/1: a
# :persistent_term integer and a process dictionary read). All in one run, on the
# same store.
#
#   MIX_ENV=prod mix run --no-start bench/native_stores.exs             # ~10 s
#   MIX_ENV=prod mix run --no-start bench/native_stores.exs -- --quick  # smoke test
#
# Reports, for 1 and 2 concurrent callers, the cost of the lookup alone and of a step
# through the step detector's NIF (lookup + Native.step_analyze/6), in ns per call,
# and the ratios ETS / :persistent_term and ETS / cached; then what a new process's
# first three lookups cost, from the table and cached (three misses, the cache made).
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
  "persistent_term" => fn -> :persistent_term.get(:bench_store) end,
  "cached" => fn -> NativeStores.get_cached(:bench_store) end
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
    :io_lib.format(
      "~-6s callers=~b  ets ~7.1f ns  persistent_term ~7.1f ns  cached ~7.1f ns  " <>
        "ets/pt ~.2f  ets/cached ~.2f",
      [
        what,
        callers,
        best["ets"],
        best["persistent_term"],
        best["cached"],
        best["ets"] / best["persistent_term"],
        best["ets"] / best["cached"]
      ]
    )
  )
end

# A process's first lookups: a new process each time (as an :erpc call from another
# node runs), three stores looked up once, less an empty process's own cost.
for k <- [:bench_a, :bench_b, :bench_c], do: NativeStores.put(k, store)
spawns = div(calls, 5)

fresh = fn fun ->
  {micros, _} =
    :timer.tc(fn ->
      for _ <- 1..spawns do
        {_, ref} = spawn_monitor(fun)
        receive(do: ({:DOWN, ^ref, _, _, _} -> :ok))
      end
    end)

  micros * 1000 / spawns
end

firsts = [
  {"empty", fn -> :ok end},
  {"ets", fn -> Enum.each([:bench_a, :bench_b, :bench_c], &NativeStores.get/1) end},
  {"cached", fn -> Enum.each([:bench_a, :bench_b, :bench_c], &NativeStores.get_cached/1) end}
]

best =
  for _ <- 1..3, {name, fun} <- firsts, reduce: %{} do
    acc ->
      ns = fresh.(fun)
      Map.update(acc, name, ns, &min(&1, ns))
  end

IO.puts(
  :io_lib.format("a new process's first 3 lookups: ets ~7.1f ns  cached ~7.1f ns", [
    best["ets"] - best["empty"],
    best["cached"] - best["empty"]
  ])
)
