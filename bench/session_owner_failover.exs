# How soon a session's owning agent is known on the node the session fails over to
# (Observatory.Gateway.SessionOwners.Failover), and what re-sending every claim costs.
#
#   MIX_ENV=prod mix run --no-start bench/session_owner_failover.exs
#   MIX_ENV=prod mix run --no-start bench/session_owner_failover.exs -- --quick
#
# Three :peer VMs on this machine run Observatory as one cluster (no HTTP server).
# On node a, the first steps of new sessions that a owns are ingested one after
# another (SchemaInterceptor.ingest/1, in-process on a); the node they fail over to
# reports, from a receive trace on its Failover process, the time at which each
# claim reached it (recorded a few µs later). Same machine, same system clock:
#   1. the window: claim received on the failover node minus the step sent on a,
#      next to the step's own ingest time and, as the baseline, a bare claim message
#      from a to that node, timed the same way; new sessions one a millisecond, back
#      to back, and back to back while two callers on a ingest other new sessions;
#   2. a re-send of every claim a node holds (what a membership change does): the
#      time until the others hold all of them, per claim.
alias Observatory.Cluster

quick? = "--quick" in System.argv()
trials = if quick?, do: 200, else: 1_000
held = if quick?, do: 20_000, else: 100_000
Logger.configure(level: :error)

# Defined here, loaded on each peer from its object code.
{:module, probe_mod, probe_bin, _} =
  defmodule Bench.FailoverProbe do
    @moduledoc false
    alias Observatory.Gateway.SchemaInterceptor

    # On the failover node: `collector` gets {:arrived, session_id, µs} for each claim
    # another node sends, stamped by the runtime as its Failover process receives it
    # (a receive trace; Erlang system time, the clock `first_steps/1` reads).
    def attach(collector) do
      tracer = spawn(fn -> forward(collector) end)
      pid = Process.whereis(Observatory.Gateway.SessionOwners.Failover)
      1 = :erlang.trace(pid, true, [:receive, :timestamp, {:tracer, tracer}])
      :ok
    end

    defp forward(collector) do
      receive do
        {:trace_ts, _, :receive, {:session_owners, _from, claims}, {mega, sec, micro}} ->
          t = (mega * 1_000_000 + sec) * 1_000_000 + micro
          for {session_id, _, _} <- claims, do: send(collector, {:arrived, session_id, t})

        _other ->
          :ok
      end

      forward(collector)
    end

    # On the owner: each session's first step, one after another, each in a process
    # of its own as an HTTP request's: [{session_id, sent, answered}] (µs).
    # `gap_ms` apart (0: back to back).
    def first_steps(steps, gap_ms) do
      for {session_id, json} <- steps do
        if gap_ms > 0, do: Process.sleep(gap_ms)
        sent = :erlang.system_time(:microsecond)
        {:ok, _} = Task.await(Task.async(fn -> SchemaInterceptor.ingest(json) end))
        {session_id, sent, :erlang.system_time(:microsecond)}
      end
    end

    # On the owner: a caller ingesting first steps of new sessions until :stop, as
    # fast as it can (with two of them, this node's two schedulers are kept busy).
    # On a node: `count` plain claim messages to `target`'s Failover, as
    # SessionOwners.claim/2 sends them, without any ingest: [{session_id, sent}].
    def plain_sends(target, prefix, count) do
      for i <- 1..count do
        id = "#{prefix}-#{i}"
        sent = :erlang.system_time(:microsecond)
        message = {:session_owners, node(), [{id, "agent-plain", 0}]}

        :ok =
          :erlang.send({Observatory.Gateway.SessionOwners.Failover, target}, message, [
            :noconnect,
            :nosuspend
          ])

        Process.sleep(1)
        {id, sent}
      end
    end

    # `step` is a first step's JSON around its session id, `{before, after}`.
    def load(prefix, step) do
      spawn(fn -> load_loop(prefix, step, 0) end)
    end

    defp load_loop(prefix, {before, rest} = step, i) do
      receive do
        :stop -> :ok
      after
        0 ->
          {:ok, _} = SchemaInterceptor.ingest(before <> "#{prefix}-#{i}" <> rest)
          load_loop(prefix, step, i + 1)
      end
    end

    # On a node: `count` claims of 100 agents, made directly.
    def claim_many(prefix, count) do
      for i <- 1..count,
          do:
            {:ok, _} =
              Observatory.Gateway.SessionOwners.claim("#{prefix}-#{i}", "agent-#{rem(i, 100)}")

      :ok
    end

    # On a node: wait until `count` claims with `prefix` are held here; the wall time.
    def await_held(prefix, count, deadline) do
      held =
        :ets.select_count(Observatory.Gateway.SessionOwners.Owners, [
          {{:"$1", :_, :_, :_}, [],
           [{:"=:=", {:binary_part, :"$1", 0, byte_size(prefix)}, prefix}]}
        ])

      cond do
        held >= count -> :os.system_time(:microsecond)
        :os.system_time(:millisecond) > deadline -> {:timeout, held}
        true -> Process.sleep(5) && await_held(prefix, count, deadline)
      end
    end
  end

unless Node.alive?() do
  {_, 0} = System.cmd("epmd", ["-daemon"])
  {:ok, _} = :net_kernel.start([:"bench_#{System.pid()}@127.0.0.1", :longnames])
end

root = Path.join(System.tmp_dir!(), "observatory-bench-failover-#{System.pid()}")
u = System.unique_integer([:positive])
shorts = for x <- ~w(a b c), do: :"fo#{u}_#{x}"
all = for s <- shorts, do: :"#{s}@127.0.0.1"

start = fn short ->
  {:ok, peer, node} =
    :peer.start_link(%{
      name: short,
      host: ~c"127.0.0.1",
      longnames: true,
      # No scheduler busy-waiting: four VMs share two cores here.
      args:
        [~c"+sbwt", ~c"none", ~c"+sbwtdcpu", ~c"none", ~c"+sbwtdio", ~c"none"] ++
          Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
    })

  env =
    Application.get_all_env(:observatory)
    |> Keyword.merge(
      data_dir: Path.join(root, Atom.to_string(short)),
      demo: false,
      cluster: [nodes: all]
    )
    |> Keyword.put(ObservatoryWeb.Endpoint, server: false)

  :ok = :erpc.call(node, Application, :load, [:observatory])
  for {k, v} <- env, do: :ok = :erpc.call(node, Application, :put_env, [:observatory, k, v])
  {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:observatory], 60_000)
  :ok = :erpc.call(node, Logger, :configure, [[level: :error]])
  {:module, _} = :erpc.call(node, :code, :load_binary, [probe_mod, ~c"bench", probe_bin])
  {peer, node}
end

started = for s <- shorts, do: start.(s)
nodes = [a, _b, _c] = Enum.map(started, &elem(&1, 1))

Stream.repeatedly(fn -> Enum.all?(nodes, &(:erpc.call(&1, Cluster, :members, []) == nodes)) end)
|> Enum.find(fn ok -> ok || (Process.sleep(50) && false) end)

step = fn session ->
  Observatory.JSON.encode!(%{
    "meta" => %{
      "step_id" => "s1",
      "session_id" => session,
      "agent_id" => "agent-bench",
      "timestamp" => "2026-02-22T10:30:00.123Z"
    },
    "cognition" => %{"intent" => "search"},
    "action" => %{"tool_call" => "read_file", "status" => "success", "result" => "ok"}
  })
end

# Sessions a owns, all failing over to the same node.
[failover | _] = Cluster.rendezvous_order("probe", nodes -- [a])

sessions = fn prefix ->
  Stream.iterate(1, &(&1 + 1))
  |> Stream.map(&"#{prefix}-#{&1}")
  |> Stream.filter(&(Enum.take(Cluster.rendezvous_order(&1, nodes), 2) == [a, failover]))
  |> Enum.take(trials)
end

:ok = :erpc.call(failover, probe_mod, :attach, [self()])

pct = fn list, p ->
  list |> Enum.sort() |> Enum.at(min(length(list) - 1, div(length(list) * p, 100)))
end

measure = fn prefix, gap_ms ->
  ids = sessions.(prefix)

  timed =
    :erpc.call(a, probe_mod, :first_steps, [Enum.map(ids, &{&1, step.(&1)}), gap_ms], 600_000)

  for {id, sent, answered} <- timed do
    receive do
      {:arrived, ^id, arrived} -> {arrived - sent, answered - sent, arrived - answered}
    after
      5_000 -> raise "the claim of #{id} never reached #{failover}"
    end
  end
end

report = fn label, rows, baseline ->
  window = Enum.map(rows, &elem(&1, 0))
  ingest = Enum.map(rows, &elem(&1, 1))
  before = Enum.count(rows, &(elem(&1, 2) <= 0))

  IO.puts(
    "| #{label} | #{pct.(window, 50)} µs | #{pct.(window, 99)} µs | #{Enum.max(window)} µs | " <>
      "#{pct.(ingest, 50)} µs | #{Float.round(pct.(window, 50) / baseline, 2)}× | " <>
      "#{Float.round(100 * before / length(rows), 1)} % |"
  )
end

IO.puts("""
Claims from node a to the node its sessions fail over to, #{trials} new sessions each
(wall-clock µs on one machine; window = claim received there − step sent on a).

| new sessions on a | window p50 | p99 | max | the step's ingest p50 | window p50 / bare message p50 | there before the step's answer |
|---|---:|---:|---:|---:|---:|---:|\
""")

_warmup = measure.("warm", 0)

# The baseline: a bare claim message from a to the same node, 1 ms apart.
bare =
  for {id, sent} <- :erpc.call(a, probe_mod, :plain_sends, [failover, "bare", trials]) do
    receive do
      {:arrived, ^id, arrived} -> arrived - sent
    end
  end

baseline = pct.(bare, 50)
report.("one a millisecond", measure.("spaced", 1), baseline)
report.("back to back, one caller", measure.("serial", 0), baseline)

loaders =
  for i <- 1..2,
      do:
        :erpc.call(a, probe_mod, :load, [
          "busy-#{i}",
          step.("@ID@") |> String.split("@ID@") |> List.to_tuple()
        ])

report.("back to back, 2 callers ingesting other new sessions", measure.("loaded", 0), baseline)
for pid <- loaders, do: send(pid, :stop)

IO.puts(
  "\nThe baseline, a bare claim message a → #{failover} (1 ms apart): " <>
    "p50 #{baseline} µs, p99 #{pct.(bare, 99)} µs."
)

# 2. A re-send of everything a holds (a membership change does this on every node).
# Each of a's claims goes to the other node(s) among its session's first two.
others = nodes -- [a]
deadline = :os.system_time(:millisecond) + 120_000

expected =
  for n <- others,
      do:
        {n,
         Enum.count(1..held, &(n in Enum.take(Cluster.rendezvous_order("again-#{&1}", nodes), 2)))}

:ok = :erpc.call(a, probe_mod, :claim_many, ["again", held], 600_000)
# The new claims' own sends arrive; then the others forget them, to be sent again.
for {n, count} <- expected, do: :erpc.call(n, probe_mod, :await_held, ["again", count, deadline])

for n <- others,
    table <- [Owners, LRU, Counts],
    do:
      :erpc.call(n, :ets, :delete_all_objects, [
        Module.concat(Observatory.Gateway.SessionOwners, table)
      ])

started_at = :os.system_time(:microsecond)
:ok = :erpc.call(a, Observatory.Gateway.SessionOwners.Failover, :push_all, [], 600_000)
pushed_at = :os.system_time(:microsecond)

held_at =
  for {n, count} <- expected do
    at = :erpc.call(n, probe_mod, :await_held, ["again", count, deadline], 130_000)
    if is_tuple(at), do: raise("#{n}: #{inspect(at)} of #{count}")
    at
  end

total = Enum.max(held_at) - started_at

IO.puts("""

A re-send of every claim node a holds (#{held}, of 100 agents), as on a membership change:
sent in #{div(pushed_at - started_at, 1000)} ms, held by the others after #{div(total, 1000)} ms
(#{Float.round(total / held, 2)} µs per claim; per node: #{inspect(Enum.map(expected, &elem(&1, 1)))} claims).
""")

for {peer, _} <- started, do: :peer.stop(peer)
File.rm_rf!(root)
