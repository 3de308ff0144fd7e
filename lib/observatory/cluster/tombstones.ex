defmodule Observatory.Cluster.Tombstones do
  @moduledoc """
  What was deleted on purpose, so that a replica that missed the deletion cannot
  bring it back when the cluster reconciles (`Observatory.Cluster.Reconcile`).

  A resume removes a pause, a step-detector reset removes a block, a revocation
  removes a key, a deletion removes an agent. A node that was down or on the other
  side of a partition still holds the old record; without a trace of the deletion a
  merge could not tell "deleted here" from "written there". Each deletion therefore
  leaves a tombstone, `{table, key, identity}`, written in the same transaction: the
  identity says which version was deleted (a pause's or a block's time, an agent's
  creation time), so a newer record under the same key (a new pause of the session,
  an agent registered again) is not covered by an old tombstone.

  Tombstones are kept only while clustering is on (a single node has no replica to
  reconcile), in a replicated `disc_copies` table, and at most `@max` of them: past
  that the oldest go (`prune/0`, run by `Observatory.Cluster`). A node away for
  more deletions than that can bring back a pause or a block (the safer direction);
  keys and agents are deleted far more rarely than that.
  """

  @table :observatory_tombstones
  @max 100_000

  @doc false
  def table, do: @table

  @doc "The table's cap (the oldest tombstones beyond it are pruned)."
  def max, do: @max

  @doc false
  # Called by Observatory.Storage with the gateway's other tables.
  def create_table do
    Observatory.Storage.create_table(@table, attributes: [:key, :at], type: :set)
    [@table]
  end

  @doc """
  Inside a transaction: records that `identity` of `key` in `table` was deleted on
  purpose. Does nothing while clustering is off.
  """
  @spec bury(atom(), term(), term()) :: :ok
  def bury(table, key, identity) do
    if Observatory.Cluster.enabled?(),
      do: :mnesia.write({@table, {table, key, identity}, System.os_time(:microsecond)}),
      else: :ok
  end

  @doc "Whether `identity` of `key` in `table` was deleted on purpose (a local read)."
  @spec buried?(atom(), term(), term()) :: boolean()
  def buried?(table, key, identity),
    do: :mnesia.dirty_read(@table, {table, key, identity}) != []

  @doc "Whether any version of `key` in `table` was deleted on purpose (a local read)."
  @spec any_buried?(atom(), term()) :: boolean()
  def any_buried?(table, key),
    do: :mnesia.dirty_match_object({@table, {table, key, :_}, :_}) != []

  @doc false
  # Every tombstone on this node, `{table, key, identity}` (a local read): what
  # `Observatory.Cluster.Reconcile` gathers from each replica it merges.
  @spec keys() :: [{atom(), term(), term()}]
  def keys, do: :mnesia.dirty_all_keys(@table)

  @doc "Deletes the oldest tombstones beyond the cap; returns how many went."
  @spec prune(pos_integer()) :: non_neg_integer()
  def prune(max \\ @max) do
    if :mnesia.table_info(@table, :size) <= max do
      0
    else
      Observatory.Storage.transaction("tombstone prune", fn ->
        all = :mnesia.select(@table, [{{@table, :"$1", :"$2"}, [], [{{:"$2", :"$1"}}]}], :write)
        excess = all |> Enum.sort() |> Enum.take(length(all) - max)
        Enum.each(excess, fn {_at, key} -> :mnesia.delete({@table, key}) end)
        length(excess)
      end)
    end
  end
end
