defmodule Observatory.Test.ClusterPeers do
  require ExUnit.Assertions

  @moduledoc false
  # Starts Observatory on :peer nodes that form one cluster (issue 14): each node its
  # own Mnesia directory and HTTP port (0: the OS picks), the test node's
  # configuration otherwise, and `config :observatory, :cluster, nodes: names`.

  @doc "Node names for `count` peers, sorted (the first founds the cluster)."
  def names(count) do
    u = System.unique_integer([:positive])
    for i <- 1..count, do: {:"clu#{u}_#{<<?a + i - 1>>}", :"clu#{u}_#{<<?a + i - 1>>}@127.0.0.1"}
  end

  @doc """
  Starts one peer named `short`, linked to the caller, with Observatory running in a
  cluster of `all` (full node names). Returns `{peer, node}`.
  """
  def start(short, all, root, env \\ []) do
    # The peer is controlled over a TCP connection of its own, not distribution, and
    # this node reaches it over a hidden connection: the test runner is never a
    # member of the peers' `global` group, so a partition staged between peers
    # neither involves it nor cuts it from a peer (a peer whose controlling
    # connection drops stops).
    {:ok, peer, node} =
      :peer.start_link(%{
        name: short,
        host: ~c"127.0.0.1",
        longnames: true,
        connection: 0,
        args: Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
      })

    true = :net_kernel.hidden_connect_node(node)

    config =
      Application.get_all_env(:observatory)
      |> Keyword.merge(
        data_dir: Path.join(root, Atom.to_string(short)),
        cluster: Keyword.merge(cluster_config(all), Keyword.get(env, :cluster, []))
      )
      |> Keyword.put(ObservatoryWeb.Endpoint, server: true, ip: {127, 0, 0, 1}, port: 0)
      |> Keyword.merge(Keyword.delete(env, :cluster))

    :ok = :erpc.call(node, Application, :put_env, [:logger, :level, :warning])
    :ok = :erpc.call(node, Application, :load, [:observatory])
    for {k, v} <- config, do: :ok = :erpc.call(node, Application, :put_env, [:observatory, k, v])
    {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:observatory], 30_000)
    {peer, node}
  end

  @doc """
  The peers' `:cluster` configuration: short timings, so that the tests of frozen
  members and partitions run in seconds (the defaults are in `Observatory.Cluster`).
  """
  def cluster_config(all) do
    [
      nodes: all,
      poll_ms: 200,
      rpc_timeout_ms: 5_000,
      join_timeout_ms: 10_000,
      heartbeat_ms: 500,
      member_timeout_ms: 3_000,
      write_timeout_ms: 5_000,
      heal_timeout_ms: 10_000,
      load_timeout_ms: 10_000,
      verify_ms: 60_000
    ]
  end

  @doc "Waits until every node in `nodes` sees exactly `members` as the live members."
  def await_members(nodes, members, tries \\ 100) do
    members = Enum.sort(members)
    seen = for n <- nodes, do: :erpc.call(n, Observatory.Cluster, :members, [])

    cond do
      Enum.all?(seen, &(&1 == members)) ->
        :ok

      tries == 0 ->
        raise "members never agreed on #{inspect(members)}: #{inspect(seen)}"

      true ->
        Process.sleep(50)
        await_members(nodes, members, tries - 1)
    end
  end

  @doc """
  Runs `fun` with `node` frozen (SIGSTOP: connected, a member, silent) and thaws it
  afterwards; asserts that `observer` still counts it a member when `fun` is done,
  so that what `fun` saw came from its silence, not from its being cut off.
  """
  def frozen(node, observer, fun) do
    pid = to_string(:erpc.call(node, :os, :getpid, []))
    {_, 0} = System.cmd("kill", ["-STOP", pid])

    try do
      result = fun.()
      ExUnit.Assertions.assert(node in :erpc.call(observer, Observatory.Cluster, :members, []))
      result
    after
      System.cmd("kill", ["-CONT", pid])
    end
  end
end
