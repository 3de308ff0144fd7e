# The cluster's cost (issue 14): the forwarding hop per step, and ingest throughput
# with 1 and 3 nodes on this machine.
#
#   MIX_ENV=prod mix run --no-start bench/cluster.exs
#   MIX_ENV=prod mix run --no-start bench/cluster.exs -- --quick
#
# Every node is a :peer VM on this machine running Observatory (no HTTP server), fed
# in-process by SchemaInterceptor.ingest/1 from caller processes on that node:
#   1. routing with clustering off: `Cluster.owner/2` against one ingest;
#   2. the hop: one caller on node A ingesting steps of sessions A owns, then of
#      sessions B owns (validated on A, scored on B over :erpc), µs per step;
#   3. throughput: one node alone (clustering off), then three clustered nodes, two
#      callers per node, steps of sessions spread over all three owners.
# Figures are ratios against a baseline measured in the same run.
alias Observatory.Cluster

quick? = "--quick" in System.argv()
hop_steps = if quick?, do: 5_000, else: 30_000
load_steps = if quick?, do: 10_000, else: 60_000

Logger.configure(level: :error)

# Defined here, loaded on each peer from its object code.
{:module, load_mod, load_bin, _} =
  defmodule Bench.ClusterLoad do
    @moduledoc false
    alias Observatory.Gateway.SchemaInterceptor

    # On a peer: `callers` processes each ingest `count` of `messages` (JSON text
    # around its step_id, `{before, after}`), each with a step_id of its own: a step
    # sent twice is answered from memory (idempotent ingest), not scored.
    # Returns the wall time in µs.
    def run(messages, count, callers) do
      parent = self()
      started = System.monotonic_time(:microsecond)

      pids =
        for c <- 1..callers do
          spawn_link(fn ->
            n = tuple_size(messages)
            tag = "#{System.unique_integer([:positive])}-"

            for i <- 1..count do
              {before, rest} = elem(messages, rem(i * 7 + c, n))
              json = before <> tag <> Integer.to_string(i) <> rest
              {:ok, _} = SchemaInterceptor.ingest(json)
            end

            send(parent, {:done, self()})
          end)
        end

      for pid <- pids, do: receive(do: ({:done, ^pid} -> :ok))
      System.monotonic_time(:microsecond) - started
    end

    # On a peer: µs per bare `:erpc.call(node, :erlang, :node, [])` round trip.
    def erpc_us(node, count) do
      {us, _} = :timer.tc(fn -> for _ <- 1..count, do: :erpc.call(node, :erlang, :node, []) end)
      us / count
    end

    # On a peer: µs per the same call made at most once (`Cluster.remote/4`: a
    # deadline sent along and checked there).
    def remote_us(node, count) do
      {us, _} =
        :timer.tc(fn ->
          for _ <- 1..count, do: {:ok, _} = Observatory.Cluster.remote(node, :erlang, :node, [])
        end)

      us / count
    end

    # On a peer: ns per `Observatory.Cluster.owner/2` call.
    def owner_ns do
      ids = List.to_tuple(for i <- 0..63, do: "sess-#{i}")

      {us, _} =
        :timer.tc(fn ->
          for i <- 1..1_000_000, do: Observatory.Cluster.owner(elem(ids, rem(i, 64)))
        end)

      us * 1_000 / 1_000_000
    end
  end

# Named after the module is compiled: Elixir's compiler does not survive a rename.
unless Node.alive?() do
  {_, 0} = System.cmd("epmd", ["-daemon"])
  {:ok, _} = :net_kernel.start([:"bench_#{System.pid()}@127.0.0.1", :longnames])
end

root = Path.join(System.tmp_dir!(), "observatory-bench-cluster-#{System.pid()}")
u = System.unique_integer([:positive])

start = fn short, cluster ->
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
      cluster: cluster
    )
    |> Keyword.put(ObservatoryWeb.Endpoint, server: false)

  :ok = :erpc.call(node, Application, :load, [:observatory])
  for {k, v} <- env, do: :ok = :erpc.call(node, Application, :put_env, [:observatory, k, v])
  {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:observatory], 60_000)
  :ok = :erpc.call(node, Logger, :configure, [[level: :error]])
  {:module, _} = :erpc.call(node, :code, :load_binary, [load_mod, ~c"bench", load_bin])
  {peer, node}
end

message = fn session, i ->
  Observatory.JSON.encode!(%{
    "meta" => %{
      "step_id" => "@STEP@",
      "session_id" => session,
      "agent_id" => "agent-#{rem(i, 50)}",
      "timestamp" => "2026-02-22T10:30:00.123Z"
    },
    "cognition" => %{"intent" => "search", "entropy_score" => 0.9},
    "action" => %{
      "tool_call" => Enum.at(~w(read_file write_file list_files run_shell), rem(i, 4)),
      "tool_input" => %{"path" => "/srv/app/file-#{rem(i, 37)}.ex", "limit" => 200},
      "status" => Enum.at(~w(success failure), rem(i, 2)),
      "result" => %{"bytes" => 1024 + i}
    }
  })
  |> String.split("@STEP@")
  |> List.to_tuple()
end

# Steps of sessions among `ids`, as a tuple for the callers.
messages = fn ids ->
  ids |> Enum.with_index() |> Enum.map(fn {s, i} -> message.(s, i) end) |> List.to_tuple()
end

sessions = for i <- 1..3_000, do: "sess-#{i}"

IO.puts(
  "schedulers per node: #{System.schedulers_online()}; cores: #{:erlang.system_info(:logical_processors_available)}\n"
)

# 1 and 3: one node alone, clustering off.
{solo_peer, solo} = start.(:"bench#{u}_solo", [])

owner_ns = :erpc.call(solo, load_mod, :owner_ns, [])

all = messages.(sessions)
solo_hop_us = :erpc.call(solo, load_mod, :run, [all, hop_steps, 1], :infinity) / hop_steps
solo_us = :erpc.call(solo, load_mod, :run, [all, load_steps, 2], :infinity)
solo_rate = 2 * load_steps / (solo_us / 1_000_000)
:peer.stop(solo_peer)

# 2 and 3: three nodes clustered.
names = for x <- ~w(a b c), do: :"bench#{u}_#{x}"
full = for n <- names, do: :"#{n}@127.0.0.1"
cluster = [nodes: full, poll_ms: 200, rpc_timeout_ms: 5_000]
[{_, a}, {_, b}, {_, c}] = nodes = for n <- names, do: start.(n, cluster)

Enum.find_value(1..200, fn _ ->
  Enum.all?([a, b, c], &(:erpc.call(&1, Cluster, :members, []) == Enum.sort(full))) ||
    (Process.sleep(50) && nil)
end) || raise "the three nodes never agreed on their members"

on = fn node -> Enum.filter(sessions, &(Cluster.rendezvous(&1, Enum.sort(full)) == node)) end
local_us = :erpc.call(a, load_mod, :run, [messages.(on.(a)), hop_steps, 1], :infinity) / hop_steps

remote_us =
  :erpc.call(a, load_mod, :run, [messages.(on.(b)), hop_steps, 1], :infinity) / hop_steps

own_us = :erpc.call(a, load_mod, :run, [messages.(on.(a)), load_steps, 2], :infinity)
own_rate = 2 * load_steps / (own_us / 1_000_000)

bare_us = :erpc.call(a, load_mod, :erpc_us, [b, hop_steps], :infinity)
once_us = :erpc.call(a, load_mod, :remote_us, [b, hop_steps], :infinity)

per_node = div(load_steps, 3)

tasks =
  for n <- [a, b, c] do
    Task.async(fn -> :erpc.call(n, load_mod, :run, [all, per_node, 2], :infinity) end)
  end

cluster_us = tasks |> Enum.map(&Task.await(&1, :infinity)) |> Enum.max()
cluster_rate = 3 * 2 * per_node / (cluster_us / 1_000_000)
for {peer, _} <- nodes, do: :peer.stop(peer)
File.rm_rf!(root)

f = fn x -> :erlang.float_to_binary(x / 1, decimals: 1) end

IO.puts("""
Routing with clustering off (one node)
| | per step |
|---|---:|
| one ingest (1 caller) | #{f.(solo_hop_us)} µs |
| `Cluster.owner/2` | #{f.(owner_ns)} ns (#{Float.round(owner_ns / 1000 / solo_hop_us * 100, 2)} % of an ingest) |

The forwarding hop (node a of three, 1 caller, #{hop_steps} steps)
| steps of sessions owned by | µs per step | ratio |
|---|---:|---:|
| a (scored in the caller's process) | #{f.(local_us)} | 1.00 |
| b (validated on a, scored on b over :erpc) | #{f.(remote_us)} | #{Float.round(remote_us / local_us, 2)} |
| (a bare `:erpc.call` from a to b, nothing scored) | #{f.(bare_us)} | #{Float.round(bare_us / local_us, 2)} |
| (the same call at most once: `Cluster.remote/4`, a deadline checked on b) | #{f.(once_us)} | #{Float.round(once_us / local_us, 2)} |

Ingest throughput (2 callers per node, steps of sessions spread over every owner)
| nodes | messages/s | ratio |
|---:|---:|---:|
| 1 (clustering off) | #{round(solo_rate)} | 1.00 |
| 3 (clustered), callers on a only, sessions a owns (no hop) | #{round(own_rate)} | #{Float.round(own_rate / solo_rate, 2)} |
| 3 (clustered), callers on every node, every owner | #{round(cluster_rate)} | #{Float.round(cluster_rate / solo_rate, 2)} |
""")
