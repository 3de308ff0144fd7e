# How long a cluster takes to heal a partition, to refuse on a minority, to answer a
# write past a frozen member, and to come back from a whole-cluster restart, with the
# default timings of Observatory.Cluster (poll 2 s, heartbeat 1 s, member timeout 3 s)
# or, with --quick, the test suite's (poll 0.2 s, heartbeat 0.5 s, member timeout 3 s).
#
#   MIX_ENV=prod mix run --no-start bench/cluster_partitions.exs
#   MIX_ENV=prod mix run --no-start bench/cluster_partitions.exs -- --quick
#
# Three :peer VMs on this machine run Observatory as one cluster. This VM controls
# them over TCP and reaches them over hidden connections, so it takes no part in the
# partitions it stages: a link is cut by giving each side a wrong cookie for the
# other and disconnecting it, a member is frozen with SIGSTOP. Each figure is the
# median of several trials, next to the same run's baseline (the timing setting that
# bounds it, or the same operation on a whole cluster).
alias Observatory.{AgentKeys, Cluster, KillSwitch}
alias Observatory.Gateway.HITL

quick? = "--quick" in System.argv()
trials = if quick?, do: 3, else: 5
Logger.configure(level: :error)

unless Node.alive?() do
  {_, 0} = System.cmd("epmd", ["-daemon"])
  {:ok, _} = :net_kernel.start([:"bench_#{System.pid()}@127.0.0.1", :longnames])
end

{:ok, _} = Application.ensure_all_started(:inets)
root = Path.join(System.tmp_dir!(), "observatory-bench-partitions-#{System.pid()}")
u = System.unique_integer([:positive])
shorts = for x <- ~w(a b c), do: :"part#{u}_#{x}"
all = for s <- shorts, do: :"#{s}@127.0.0.1"

timings =
  if quick?,
    do: [poll_ms: 200, heartbeat_ms: 500, member_timeout_ms: 3_000],
    else: []

cluster = [nodes: all] ++ timings

start = fn short ->
  {:ok, peer, node} =
    :peer.start(%{
      name: short,
      host: ~c"127.0.0.1",
      longnames: true,
      connection: 0,
      args:
        [~c"+sbwt", ~c"none", ~c"+sbwtdcpu", ~c"none", ~c"+sbwtdio", ~c"none"] ++
          Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
    })

  true = :net_kernel.hidden_connect_node(node)

  env =
    Application.get_all_env(:observatory)
    |> Keyword.merge(
      data_dir: Path.join(root, Atom.to_string(short)),
      demo: false,
      cluster: cluster
    )
    |> Keyword.put(ObservatoryWeb.Endpoint, server: true, ip: {127, 0, 0, 1}, port: 0)

  :ok = :erpc.call(node, Application, :load, [:observatory])
  :ok = :erpc.call(node, Application, :put_env, [:logger, :level, :error])
  for {k, v} <- env, do: :ok = :erpc.call(node, Application, :put_env, [:observatory, k, v])

  {us, {:ok, _}} =
    :timer.tc(fn ->
      :erpc.call(node, Application, :ensure_all_started, [:observatory], 120_000)
    end)

  {peer, node, div(us, 1000)}
end

now = fn -> System.monotonic_time(:millisecond) end

await = fn check, timeout ->
  deadline = now.() + timeout

  Stream.repeatedly(fn ->
    ok =
      try do
        check.()
      catch
        _, _ -> false
      end

    cond do
      ok -> :ok
      now.() > deadline -> raise "not reached in #{timeout} ms"
      true -> Process.sleep(20) && nil
    end
  end)
  |> Enum.find(& &1)
end

running = fn n -> Enum.sort(:erpc.call(n, :mnesia, :system_info, [:running_db_nodes], 2_000)) end
whole? = fn nodes -> Enum.all?(nodes, &(running.(&1) == Enum.sort(nodes))) end

cut = fn x, y ->
  true = :erpc.call(x, :erlang, :set_cookie, [y, :bench_cut_x])
  true = :erpc.call(y, :erlang, :set_cookie, [x, :bench_cut_y])
  :erpc.call(x, :erlang, :disconnect_node, [y])
end

mend = fn x, y ->
  true = :erpc.call(x, :erlang, :set_cookie, [y, :erlang.get_cookie()])
  true = :erpc.call(y, :erlang, :set_cookie, [x, :erlang.get_cookie()])
end

health = fn n ->
  port = :erpc.call(n, ObservatoryWeb.Endpoint, :port, [])

  {:ok, {{_, status, _}, _, _}} =
    :httpc.request(:get, {~c"http://127.0.0.1:#{port}/healthz", []}, [timeout: 5_000], [])

  status
end

median = fn list -> list |> Enum.sort() |> Enum.at(div(length(list), 2)) end
# "median (max)"
spread = fn list -> "#{median.(list)} (#{Enum.max(list)})" end

started = for s <- shorts, do: start.(s)
[a, b, c] = nodes = for {_, n, _} <- started, do: n
await.(fn -> Enum.all?(nodes, &(:erpc.call(&1, Cluster, :members, []) == all)) end, 30_000)
setting = fn key -> :erpc.call(a, Cluster, :setting, [key]) end
poll = setting.(:poll_ms)
bound = setting.(:heartbeat_ms) + setting.(:member_timeout_ms)

IO.puts(
  "timings: poll #{poll} ms, heartbeat #{setting.(:heartbeat_ms)} ms, member timeout #{setting.(:member_timeout_ms)} ms; #{trials} trials each\n"
)

# 1. A one-link disconnect, nothing written: until every node runs one Mnesia again.
heal_quiet =
  for _ <- 1..trials do
    :erpc.call(a, :erlang, :disconnect_node, [b])
    t0 = now.()
    await.(fn -> not whole?.(nodes) end, 5_000)
    await.(fn -> whole?.(nodes) end, 60_000)
    now.() - t0
  end

# 2. c cut off from a and b, writes on both sides, then the links back: until every
#    node holds both sides' writes. Also: how soon c says it has no majority.
{heal_writes, refuse} =
  Enum.unzip(
    for i <- 1..trials do
      agent = "bench-agent-#{u}-#{i}"
      {:ok, _} = :erpc.call(a, AgentKeys, :issue, [agent])
      cut.(c, a)
      cut.(c, b)
      t0 = now.()
      await.(fn -> health.(c) == 503 end, 60_000)
      refused = now.() - t0
      {:error, :no_majority} = :erpc.call(c, KillSwitch, :activate, [agent, []])
      {:ok, _} = :erpc.call(a, HITL, :pause, ["bench-sess-#{u}-#{i}", [operator: "bench"]])
      {:ok, _} = :erpc.call(c, KillSwitch, :deactivate, [agent, [operator: "bench"]])
      t1 = now.()
      mend.(c, a)
      mend.(c, b)

      await.(
        fn ->
          whole?.(nodes) and :erpc.call(c, HITL, :paused?, ["bench-sess-#{u}-#{i}"]) and
            :erpc.call(a, KillSwitch.Agents, :get, [agent]).active == false
        end,
        60_000
      )

      {now.() - t1, refused}
    end
  )

# 3. A frozen member: a deactivation on a, all members well, then with c stopped.
agent = "bench-frozen-#{u}"
{:ok, _} = :erpc.call(a, AgentKeys, :issue, [agent])

well =
  for _ <- 1..trials do
    {us, {:ok, _}} = :timer.tc(fn -> :erpc.call(a, KillSwitch, :deactivate, [agent, []]) end)
    {:ok, _} = :erpc.call(a, KillSwitch, :activate, [agent, []])
    us / 1000
  end

pid_c = :erpc.call(c, :os, :getpid, [])

frozen =
  for _ <- 1..trials do
    await.(fn -> whole?.(nodes) end, 60_000)
    System.cmd("kill", ["-STOP", to_string(pid_c)])

    {us, {:ok, _}} =
      :timer.tc(fn -> :erpc.call(a, KillSwitch, :deactivate, [agent, []], 60_000) end)

    System.cmd("kill", ["-CONT", to_string(pid_c)])
    await.(fn -> whole?.(nodes) end, 60_000)
    {:ok, _} = :erpc.call(a, KillSwitch, :activate, [agent, []])
    us / 1000
  end

# 4. The whole cluster stopped node by node, started again one at a time (each serving
#    before the next starts), in bin/cluster's order and in reverse.
restart = fn order ->
  for {peer, _, _} <- Process.get(:peers), do: :peer.stop(peer)
  by_node = Map.new(Enum.zip(all, shorts))

  started =
    for n <- order.(all) do
      {peer, ^n, ms} = start.(Map.fetch!(by_node, n))
      {peer, n, ms}
    end

  Process.put(:peers, started)
  t0 = now.()
  await.(fn -> whole?.(all) end, 60_000)
  {Enum.map(started, &elem(&1, 2)), now.() - t0}
end

first_start = started |> Enum.map(&elem(&1, 2))
Process.put(:peers, started)
{forward, forward_settle} = restart.(& &1)
{reverse, reverse_settle} = restart.(&Enum.reverse/1)
for {peer, _, _} <- Process.get(:peers), do: :peer.stop(peer)
File.rm_rf!(root)

r = fn x, base -> Float.round(x / base, 2) end
f = fn x -> :erlang.float_to_binary(x / 1, decimals: 1) end

IO.puts("""
| case | median (max), ms | baseline (same run) | median / baseline |
|---|---:|---:|---:|
| one-link disconnect, no writes: until one Mnesia again | #{spread.(heal_quiet)} | poll_ms #{poll} ms | #{r.(median.(heal_quiet), poll)} |
| partition with writes on both sides: from the links back until every node holds both | #{spread.(heal_writes)} | poll_ms #{poll} ms | #{r.(median.(heal_writes), poll)} |
| minority cut off: until its /healthz says 503 degraded (and it refuses) | #{spread.(refuse)} | heartbeat + member timeout #{bound} ms | #{r.(median.(refuse), bound)} |
| a deactivation with a member frozen (SIGSTOP) | #{f.(median.(frozen))} (#{f.(Enum.max(frozen))}) | the same, all members well: #{f.(median.(well))} ms; bound #{bound} ms | #{r.(median.(frozen), bound)} of the bound |

Restarts (ms until each node served, in start order; then until one Mnesia):
| | node 1 | node 2 | node 3 | settled after |
|---|---:|---:|---:|---:|
| first start (a founds, b and c join empty) | #{Enum.join(first_start, " | ")} | |
| all stopped a, b, c; started a, b, c (bin/cluster's order) | #{Enum.join(forward, " | ")} | #{forward_settle} |
| all stopped a, b, c; started c, b, a (reverse) | #{Enum.join(reverse, " | ")} | #{reverse_settle} |
""")
