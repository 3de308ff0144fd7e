defmodule Observatory.Cluster.Store do
  @moduledoc """
  Replicated agent and operator state: every Observatory Mnesia table has a
  `disc_copies` replica on every member (issue 14). Reads stay local ETS lookups;
  a write is a transaction committed on every running replica, so a deactivation,
  a pause or a settings change made on one node is enforced on all of them.

  A node that starts with an empty Mnesia directory while clustering is on joins
  the cluster instead of creating a schema of its own: it connects Mnesia to the
  running members (`:mnesia.change_config(:extra_db_nodes, …)`), keeps the schema
  on disc and adds a copy of every table (`:mnesia.add_table_copy/3`). When no
  member answers, the first candidate by name founds the cluster; any other node
  keeps trying for `:join_timeout_ms`, then refuses to start (two nodes founding
  two clusters would never merge). A node restarted with its directory finds its
  cluster in its own schema.
  """

  require Logger

  alias Observatory.Cluster

  @doc """
  Starts Mnesia in `dir`, joining the cluster when clustering is on and `dir` holds
  no schema yet. Returns `:joined`, `:founded` or `:local`.
  """
  @spec start(String.t()) :: :joined | :founded | :local
  def start(dir) do
    if Cluster.enabled?() and not File.exists?(Path.join(dir, "schema.DAT")) do
      start_mnesia(dir)
      join(deadline())
    else
      :local
    end
  end

  defp deadline do
    System.monotonic_time(:millisecond) +
      Keyword.get(Cluster.config(), :join_timeout_ms, 30_000)
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
