# What the Rust NIF calls of one ingest allocate through Rust's global allocator:
# allocations, frees, reallocations and bytes asked for, per call, for the parse (as
# the HTTP API calls it: no envelope term), the scoring call, the idempotency claim
# and complete, and the session log's put, at bench/ingest_breakdown.exs's three step
# sizes, on sessions warmed as that bench warms them. Counts, not times.
#
# It needs the NIF built with the counting allocator (cargo feature `alloc_count`,
# never in the release library) and one scheduler, so that a call's two readings are
# made on one thread:
#
#   cargo build --release -p observatory_nif --features alloc_count
#   cp target/release/libobservatory_nif.so priv/native/observatory_nif.so
#   MIX_ENV=prod elixir --erl "+S 1" -S mix run bench/nif_allocs.exs
#   touch native/observatory_nif/src/lib.rs && MIX_ENV=prod mix compile   # the release library back
Code.require_file("glue_step.exs", __DIR__)
Code.require_file("breakdown_steps.exs", __DIR__)

alias Observatory.Bench.BreakdownSteps
alias Observatory.Gateway.{DecisionLog, Idempotency, SchemaInterceptor, SessionLog}
alias Observatory.Native

Logger.configure(level: :error)

try do
  Native.alloc_counts()
rescue
  ErlangError ->
    IO.puts(:stderr, "the NIF has no counting allocator: build it as this file's header says")
    System.halt(1)
end

System.schedulers_online() == 1 ||
  IO.puts(:stderr, "warning: #{System.schedulers_online()} schedulers; run with +S 1")

calls = 2_000
:ok = BreakdownSteps.publish(:bench_nif_allocs)
message = &BreakdownSteps.message(:bench_nif_allocs, &1, &2, &3)
kept = Observatory.Bench.GlueStep.kept_answer()
counter = :atomics.new(1, [])
next = fn -> :atomics.add_get(counter, 1, 1) end
fresh = fn -> "r#{System.unique_integer([:positive])}-" end

for a <- 0..49, do: {:ok, _} = Observatory.KillSwitch.Agents.fetch_or_register("agent-#{a}")

# Warmed as bench/ingest_breakdown.exs warms its sessions: windows full, rings written.
for {size, _} <- BreakdownSteps.sizes(),
    n <- 0..(BreakdownSteps.templates() * 2),
    do: SchemaInterceptor.ingest(message.(size, n, "warm-"))

parsed = fn size ->
  json = message.(size, next.(), fresh.())
  {:ok, _, fields} = DecisionLog.parse(json, envelope: false)
  {json, fields}
end

# {label, input made outside the count, the counted call}
steps = [
  {"parse, no envelope term", &message.(&1, next.(), fresh.()),
   &DecisionLog.parse(&1, envelope: false)},
  {"scoring (one NIF call) + settles", parsed,
   fn {_, f} -> BreakdownSteps.score_and_settle(f) end},
  {"idempotency claim", parsed, fn {_, f} -> {:new, _} = Idempotency.claim(f) end},
  {"idempotency complete",
   fn size ->
     {:new, ticket} = Idempotency.claim(elem(parsed.(size), 1))
     ticket
   end, &Idempotency.complete(&1, kept)},
  {"session log put", parsed, fn {json, f} -> SessionLog.put_json(f.session_id, json, 0.5) end},
  {"whole ingest, no envelope term", &message.(&1, next.(), fresh.()),
   &SchemaInterceptor.ingest(&1, envelope: false)}
]

count = fn input, fun ->
  for _ <- 1..calls do
    x = input.()
    {a0, f0, r0, b0} = Native.alloc_counts()
    fun.(x)
    {a1, f1, r1, b1} = Native.alloc_counts()
    {a1 - a0, f1 - f0, r1 - r0, b1 - b0}
  end
end

r = fn x -> :erlang.float_to_binary(x / 1, decimals: 2) end

IO.puts(
  "Rust heap calls per NIF call (mean of #{calls}; allocs min–max; bytes asked for): " <>
    "allocs / frees / reallocs\n"
)

IO.puts("| step | " <> Enum.map_join(BreakdownSteps.sizes(), " | ", &elem(&1, 1)) <> " |")

IO.puts("|---|" <> String.duplicate("---|", length(BreakdownSteps.sizes())))

for {label, input, fun} <- steps do
  cells =
    Enum.map_join(BreakdownSteps.sizes(), " | ", fn {size, _} ->
      counts = count.(fn -> input.(size) end, fun)

      [as, fs, rs, bs] = for k <- 0..3, do: Enum.map(counts, &elem(&1, k))

      mean = fn xs -> Enum.sum(xs) / calls end

      "#{r.(mean.(as))} / #{r.(mean.(fs))} / #{r.(mean.(rs))} " <>
        "(#{Enum.min(as)}–#{Enum.max(as)}; #{round(mean.(bs))} B)"
    end)

  IO.puts("| #{label} | #{cells} |")
end
