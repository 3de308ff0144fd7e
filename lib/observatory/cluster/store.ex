defmodule Observatory.Cluster.Store do
  @moduledoc """
  Replicated agent and operator state: every Observatory Mnesia table has a
  `disc_copies` replica on every member. Reads stay local ETS lookups; a write is a
  transaction committed on every running replica, so a deactivation, a pause or a
  settings change made on one node is enforced on all of them.

  **A new node** (an empty Mnesia directory while clustering is on) joins the
  cluster instead of creating a schema of its own: it connects Mnesia to the running
  members (`:mnesia.change_config(:extra_db_nodes, …)`), keeps the schema on disc and
  adds a copy of every table (`:mnesia.add_table_copy/3`). When no member answers,
  the first candidate by name founds the cluster; any other node keeps trying for
  `:join_timeout_ms`, then refuses to start (two nodes founding two clusters would
  never merge).

  **A restarted node** loads its own copy from disc, whatever the other nodes do:
  every Observatory table has this node as its only Mnesia master node
  (`:mnesia.set_master_nodes/2`), so Mnesia never waits for "the node that stopped
  last". If other nodes run, Mnesia joins them and `settle/0` merges this node's copy
  with theirs (`Observatory.Cluster.Reconcile`), holding writes meanwhile
  (`Observatory.Cluster.Gate`). A cluster therefore comes back in any order, one
  node at a time or all at once, with everything each node had.
  """

  require Logger

  alias Observatory.Cluster
  alias Observatory.Cluster.{Gate, Reconcile}

  @doc """
  Starts Mnesia in `dir` when clustering is on: joins the cluster when `dir` holds no
  schema yet, else starts on this node's own copy (`settle/0` merges it once every
  table is loaded). Returns `:joined`, `:founded`, `:restarted` or `:local` (clustering
  off: the caller starts Mnesia).
  """
  @spec start(String.t()) :: :joined | :founded | :restarted | :local
  def start(dir) do
    cond do
      not Cluster.enabled?() ->
        :local

      not File.exists?(Path.join(dir, "schema.DAT")) ->
        start_mnesia(dir)
        join(deadline())

      true ->
        restart(dir)
    end
    |> tap(&Process.put({__MODULE__, :started}, &1))
  end

  # Observatory's tables, by name, before Mnesia has read its schema: the master
  # nodes of a node upgraded from a release without them (later ones persist them).
  @known [
    :observatory_agents,
    :observatory_agent_events,
    :observatory_agent_keys,
    :observatory_revoked_sessions,
    :observatory_hitl_pauses,
    :observatory_hitl_audit,
    :observatory_step_blocks,
    :observatory_proxy_secrets,
    :observatory_tombstones
  ]

  defp restart(dir) do
    _ = Application.load(:mnesia)
    Application.put_env(:mnesia, :dir, String.to_charlist(dir))
    for table <- @known, do: :mnesia.set_master_nodes(table, [node()])
    # The running nodes hold their writes until this node's copy is merged (settle/0).
    hold_writes(Cluster.connect())
    start_mnesia(dir)
    :restarted
  end

  @doc """
  Once every table is loaded: makes this node the master of its copies (so that its
  next start loads them from its own disc), and, if other nodes run, merges its copy
  with theirs and lets them write again. A merge that fails is logged and left to
  the leader's next comparison of the replicas (`:verify_ms`).
  """
  @spec settle() :: :ok
  def settle do
    if Cluster.enabled?() do
      for table <- Reconcile.tables(),
          node() in :mnesia.table_info(table, :disc_copies),
          do: :ok = :mnesia.set_master_nodes(table, [node()])

      others = :mnesia.system_info(:running_db_nodes) -- [node()]

      # Only a node that started on its own copy has anything to merge (one that
      # just joined copied the cluster's). Set by start/1, in this same process.
      restarted? = Process.delete({__MODULE__, :started}) in [:restarted, nil]

      try do
        if others != [] and restarted?, do: reconcile(others)
      catch
        kind, reason ->
          Logger.error(
            "cluster: could not merge this node's copy with #{inspect(others)} now " <>
              "(#{Exception.format_banner(kind, reason)}); the leader retries"
          )
      after
        release_writes(Enum.uniq(others ++ Node.list()))
      end
    end

    :ok
  end

  defp reconcile(others) do
    report = Reconcile.run(others)
    report = Map.merge(report, %{kind: :restart, joined: node()})

    if report.changed > 0,
      do: Observatory.Cluster.Monitor.announce(report),
      else: Logger.info("cluster: #{node()} rejoined #{inspect(others)}; the copies were equal")
  end

  defp hold_writes([]), do: :ok

  defp hold_writes(nodes) do
    _ = :erpc.multicall(nodes, Gate, :close, [Cluster.setting(:heal_timeout_ms)], 2_000)
    :ok
  end

  defp release_writes(nodes) do
    _ = :erpc.multicall(nodes, Gate, :open, [], 2_000)
    :ok
  end

  @doc """
  Waits for `tables` to load, at most the cluster's `:load_timeout_ms` (30 s; on a
  single node too), logging which ones wait every 5 s; raises, saying why and what
  to do, when they do not load.
  """
  @spec await_tables([atom()]) :: :ok
  def await_tables(tables) do
    deadline = System.monotonic_time(:millisecond) + Cluster.setting(:load_timeout_ms)
    await_tables(tables, deadline)
  end

  defp await_tables(tables, deadline) do
    wait = min(5_000, max(deadline - System.monotonic_time(:millisecond), 0))

    case :mnesia.wait_for_tables(tables, wait) do
      :ok ->
        :ok

      {:timeout, waiting} ->
        if System.monotonic_time(:millisecond) >= deadline,
          do: raise(load_error(waiting)),
          else: Logger.warning("Mnesia: still loading #{inspect(waiting)}: #{holders(waiting)}")

        await_tables(tables, deadline)

      {:error, reason} ->
        raise load_error(tables, reason)
    end
  end

  defp load_error(waiting, reason \\ :timeout) do
    dir = :mnesia.system_info(:directory)

    "Mnesia tables #{inspect(waiting)} did not load on #{node()} (#{inspect(reason)}): " <>
      "#{holders(waiting)}. If this node has no copy of them, start a node that has one " <>
      "(clustering: the other members). If its copy is damaged, stop it, move #{dir} " <>
      "aside and start it again: with clustering on it joins the running members and " <>
      "copies every table (anything only it held is in the moved directory)."
  end

  defp holders(tables) do
    Enum.map_join(tables, "; ", fn table ->
      copies =
        try do
          :mnesia.table_info(table, :disc_copies)
        catch
          :exit, _ -> []
        end

      local = if node() in copies, do: "a copy here, ", else: "no copy here, "
      "#{table}: #{local}copies on #{inspect(copies)}"
    end)
  end

  defp deadline do
    System.monotonic_time(:millisecond) +
      Cluster.setting(:join_timeout_ms)
  end

  defp join(deadline) do
    peers = Cluster.connect()

    case peers != [] && :mnesia.change_config(:extra_db_nodes, peers) do
      {:ok, [_ | _] = joined} ->
        disc_schema!()
        copy_tables!()
        Logger.info("cluster: joined Mnesia on #{inspect(joined)}")
        :joined

      _ ->
        cond do
          founder?() ->
            disc_schema!()
            Logger.info("cluster: no member answered; #{node()} founds the cluster")
            :founded

          System.monotonic_time(:millisecond) < deadline ->
            Process.sleep(500)
            join(deadline)

          true ->
            raise "cluster: no member of #{inspect(Cluster.candidates())} answered within " <>
                    ":join_timeout_ms; only #{inspect(Enum.min(Cluster.candidates()))} may found it"
        end
    end
  end

  defp founder?, do: Cluster.candidates() == [] or node() < Enum.min(Cluster.candidates())

  defp start_mnesia(dir) do
    File.mkdir_p!(dir)
    _ = Application.load(:mnesia)
    Application.put_env(:mnesia, :dir, String.to_charlist(dir))

    case Application.ensure_all_started(:mnesia) do
      {:ok, _} -> :ok
      {:error, reason} -> raise "cannot start Mnesia in #{dir}: #{inspect(reason)}"
    end
  end

  defp disc_schema! do
    case :mnesia.change_table_copy_type(:schema, node(), :disc_copies) do
      {:atomic, :ok} -> :ok
      {:aborted, {:already_exists, :schema, _, :disc_copies}} -> :ok
      {:aborted, reason} -> raise "cannot keep the Mnesia schema on disc: #{inspect(reason)}"
    end
  end

  # Every table the cluster has, whoever created it.
  defp copy_tables! do
    for table <- :mnesia.system_info(:tables), table != :schema, do: add_copy!(table)
    :ok
  end

  @doc """
  Creates the table with `disc_copies` on every running Mnesia node, or, when it
  exists, adds a copy on this node. Used for every Observatory table, clustered or
  not (a single node is a cluster of one).
  """
  @spec ensure_table(atom(), keyword()) :: :ok
  def ensure_table(name, opts) do
    # A host's own Mnesia cluster is not Observatory's to replicate onto.
    nodes = if Cluster.enabled?(), do: :mnesia.system_info(:running_db_nodes), else: [node()]

    case :mnesia.create_table(name, [{:disc_copies, nodes} | opts]) do
      {:atomic, :ok} -> :ok
      {:aborted, {:already_exists, ^name}} -> add_copy!(name)
      {:aborted, reason} -> raise "cannot create Mnesia table #{name}: #{inspect(reason)}"
    end
  end

  defp add_copy!(table) do
    case :mnesia.add_table_copy(table, node(), :disc_copies) do
      {:atomic, :ok} -> :ok
      {:aborted, {:already_exists, ^table, _}} -> :ok
      {:aborted, reason} -> raise "cannot copy Mnesia table #{table} here: #{inspect(reason)}"
    end
  end
end
