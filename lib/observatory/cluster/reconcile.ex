defmodule Observatory.Cluster.Reconcile do
  @moduledoc """
  Makes every replica of Observatory's Mnesia tables equal again, by the rules of
  `Observatory.Cluster.Merge`.

  Replicas disagree after a node joins the running cluster with a copy of its own:
  a node restarted (every node loads its own copy from disc, whatever order the
  cluster is started in) or the heal of a partition (`Observatory.Cluster.Heal`: the
  sides are joined with `:mnesia.change_config(:extra_db_nodes, …)`, which keeps
  each side's contents). Mnesia does not compare them; this module does.

  For each `observatory_*` table with more than one active replica, in
  `Merge.order/1`: every replica answers a hash per key (`summary/1`, run on that
  node over `:erpc`); where all agree nothing more moves. Otherwise, in one
  transaction that holds the table's write lock on every node, the keys that differ
  are fetched from every replica (`fetch/2`), decided, and written or deleted: a
  transaction's writes reach every replica, so they agree afterwards. Writes of the
  gateway's own wait at `Observatory.Cluster.Gate`, closed by the caller.

  `run/1` returns a report: per table, how many keys were copied, replaced or
  deleted, and the decisions an operator should see (`notes`).
  """

  require Logger

  alias Observatory.Cluster.{Merge, Tombstones}

  @prefix "observatory_"

  @type report :: %{
          at: DateTime.t(),
          base: [node()],
          nodes: [node()],
          duration_ms: non_neg_integer(),
          changed: non_neg_integer(),
          tables: %{atom() => non_neg_integer()},
          notes: [String.t()]
        }

  @doc """
  Reconciles every Observatory table across the running replicas; the versions of
  `base` win where `Merge` has no safer choice. Returns the report.
  """
  @spec run([node()]) :: report()
  def run(base) do
    started = System.monotonic_time(:millisecond)

    results =
      for table <- Merge.order(tables()), result = table(table, base), result != nil do
        result
      end

    %{
      at: DateTime.utc_now(),
      base: Enum.sort(base),
      nodes: Enum.sort(:mnesia.system_info(:running_db_nodes)),
      duration_ms: System.monotonic_time(:millisecond) - started,
      changed: results |> Enum.map(& &1.changed) |> Enum.sum(),
      tables: Map.new(results, &{&1.table, &1.changed}),
      notes: Enum.flat_map(results, & &1.notes)
    }
  end

  @doc "Observatory's tables in this node's Mnesia (`observatory_*`)."
  @spec tables() :: [atom()]
  def tables do
    for table <- :mnesia.system_info(:tables),
        String.starts_with?(Atom.to_string(table), @prefix),
        do: table
  end

  defp table(table, base) do
    holders = :mnesia.table_info(table, :active_replicas)

    if length(holders) > 1 and differing(table, holders) != [] do
      case :mnesia.sync_transaction(fn -> merge(table, holders, base) end) do
        {:atomic, result} ->
          _ = :mnesia.sync_log()
          if result.changed > 0, do: result

        {:aborted, reason} ->
          raise "reconciling #{table} aborted: #{inspect(reason)}"
      end
    end
  end

  # The keys whose records are not the same on every replica.
  defp differing(table, holders) do
    summaries =
      for node <- holders do
        case :erpc.call(node, __MODULE__, :summary, [table], timeout()) do
          summary when is_map(summary) -> summary
        end
      end

    keys = summaries |> Enum.flat_map(&Map.keys/1) |> Enum.uniq()

    for key <- keys,
        summaries |> Enum.map(&Map.get(&1, key)) |> Enum.uniq() |> length() > 1,
        do: key
  end

  defp merge(table, holders, base) do
    :mnesia.lock({:table, table}, :write)
    # Under the lock no write lands in between: decide from what each replica holds now.
    keys = differing(table, holders)

    replicas =
      for node <- holders,
          do: {node, Map.new(:erpc.call(node, __MODULE__, :fetch, [table, keys], timeout()))}

    ctx = context(holders)

    Enum.reduce(keys, %{table: table, changed: 0, notes: []}, fn key, acc ->
      versions = for {node, records} <- replicas, do: {node, Map.get(records, key)}

      case Merge.decide(table, key, versions, base, ctx) do
        {:keep, record, note} ->
          :ok = :mnesia.write(record)
          note(acc, note)

        {:delete, note} ->
          :ok = :mnesia.delete({table, key})
          note(acc, note)
      end
    end)
    |> Map.update!(:notes, &Enum.reverse/1)
  end

  defp note(acc, nil), do: %{acc | changed: acc.changed + 1}
  defp note(acc, note), do: %{acc | changed: acc.changed + 1, notes: [note | acc.notes]}

  # Tombstones and agents are reconciled first (Merge.order/1): read agents as they are
  # now. Tombstones are read from every replica merged here, not only this node's: a
  # replica can become active between the tombstones' turn and this table's (a node
  # restarting while the leader compares the replicas), and its deletions must still
  # hold — without them a resume or a revocation made only there would be undone.
  defp context(holders) do
    agents = :observatory_agents

    buried =
      holders
      |> Enum.flat_map(&:erpc.call(&1, Tombstones, :keys, [], timeout()))
      |> MapSet.new()

    buried_agents = for {^agents, id, _} <- buried, into: MapSet.new(), do: id

    %{
      buried?: fn table, key, identity -> MapSet.member?(buried, {table, key, identity}) end,
      agent_gone?: fn id ->
        :mnesia.read(agents, id) == [] and MapSet.member?(buried_agents, id)
      end
    }
  end

  @doc false
  # Runs on each replica's node: a hash of every record, by key.
  def summary(table) do
    table
    |> :mnesia.dirty_match_object(:mnesia.table_info(table, :wild_pattern))
    |> Map.new(&{elem(&1, 1), :erlang.phash2(&1, 4_294_967_296)})
  end

  @doc false
  # Runs on each replica's node: its records of `keys`.
  def fetch(table, keys) do
    for key <- keys, record <- :mnesia.dirty_read(table, key), do: {key, record}
  end

  defp timeout, do: Observatory.Cluster.rpc_timeout()
end
