defmodule Observatory.NativeStores do
  @moduledoc false
  # Where the Rust stores (NIF resources) shared by many processes are published: an
  # ETS table, read by every caller, written by the process that owns each store.
  #
  # Not :persistent_term. A lookup here copies the reference onto the caller's heap,
  # so a store lives as long as any process holds it. A persistent term is not copied:
  # the caller gets a pointer into the term's literal area. When a process waits for a
  # dirty scheduler with such a term among a NIF's arguments and the term is replaced
  # or erased meanwhile (an owner restarting), OTP 25 frees the literal area anyway:
  # the store is dropped and the NIF then runs on freed memory, or on whatever term
  # took its place. That corrupted the heap (glibc aborted the VM) and made a
  # persistent_term read return another key's value.
  #
  # The table belongs to the process that runs Observatory.Application.start/2, which
  # lives as long as the application: owners restarting under it keep their stores
  # published in between (callers keep working on the old one until the new one is
  # put), and the stores go when the application stops.

  @table __MODULE__

  @doc false
  # Creates the table; called by Observatory.Application.start/2.
  def setup do
    if :ets.whereis(@table) == :undefined do
      :ets.new(@table, [:named_table, :public, :set, read_concurrency: true])
    end

    :ok
  end

  @doc "Publishes `store` under `key`, replacing (and so releasing) the one there."
  def put(key, store) do
    true = :ets.insert(@table, {key, store})
    :ok
  end

  @doc "The store under `key`; raises `ArgumentError` when there is none."
  def get(key), do: :ets.lookup_element(@table, key, 2)

  @doc "The store under `key`, or `default` when there is none (or no table)."
  def get(key, default) do
    case :ets.lookup(@table, key) do
      [{_, store}] -> store
      [] -> default
    end
  rescue
    ArgumentError -> default
  end

  @doc """
  Publishes `store` as part `index` (1-based) of the row `key`, a tuple of `size`
  parts (nil until their owners put them): stores used together, so that a caller
  finds them all with one lookup (`get_row/1`). Each part is written on its own,
  by its own owner. A nil `store` unpublishes the part.
  """
  def put_part(key, size, index, store) when index in 1..size//1 do
    :ets.insert_new(@table, List.to_tuple([key | List.duplicate(nil, size)]))
    true = :ets.update_element(@table, key, {index + 1, store})
    :ok
  rescue
    # Unpublishing while the application stops: its table has gone with it.
    e in ArgumentError -> if store == nil, do: :ok, else: reraise(e, __STACKTRACE__)
  end

  @doc "The row `{key, part1, part2, …}` under `key` (`put_part/4`), or nil."
  def get_row(key) do
    case :ets.lookup(@table, key) do
      [row] -> row
      [] -> nil
    end
  rescue
    ArgumentError -> nil
  end

  @doc "Unpublishes the store under `key` (its last holder releases it)."
  def erase(key) do
    :ets.delete(@table, key)
    :ok
  rescue
    # The application is stopping and its table has gone with it.
    ArgumentError -> :ok
  end
end
