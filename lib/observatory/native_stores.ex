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
  # put), and the stores go when the application stops (from a process that kept one,
  # below, at its next cached lookup or its exit).
  #
  # The stores a step reads every time (get_cached/1, get_row_cached/1) are also kept
  # by each caller in its process dictionary, with the generation they were read
  # under: a step then reads a :persistent_term integer and its dictionary (~20 ns)
  # where the table's lookup, copying the reference out and counting it in and out,
  # cost ~130-270 ns. Every write here (put, put_part, erase) takes a new generation
  # after writing the table, so the next cached lookup of every process reads the
  # table again: a restarted owner's new store, or an erased one, is seen at once.
  # The generation is a small integer, an immediate term, and no NIF is handed it:
  # OTP releases a replaced immediate's copy at once, without the scan of every
  # process (a global garbage collection) that a replaced compound term costs. A replaced store stays alive in a process that cached it until that
  # process's next cached lookup (which drops every row it cached before the change)
  # or its exit: so only stores that live as long as the application, replaced only
  # when their owner crashes, are read cached. When the application stops (or fails
  # to start) the generation goes, and cached lookups answer from the table as the
  # others do (no table: none).

  @table __MODULE__
  # Both keyed by an atom: a tuple key is hashed on every read (~20 ns each for the
  # generation's and the dictionary's), an atom's hash is kept with it.
  @generation __MODULE__.Generation

  @doc false
  # Creates the table; called by Observatory.Application.start/2.
  def setup do
    if :ets.whereis(@table) == :undefined do
      :ets.new(@table, [:named_table, :public, :set, read_concurrency: true])
    end

    new_generation()
  end

  @doc false
  # Called when the application stops or fails to start (before its table goes).
  def forget do
    if :persistent_term.get(@generation, nil) != nil, do: :persistent_term.erase(@generation)
    :ok
  end

  @doc "Publishes `store` under `key`, replacing (and so releasing) the one there."
  def put(key, store) do
    true = :ets.insert(@table, {key, store})
    bump()
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
    bump()
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

  @doc """
  `get/1` of a store that lives as long as the application, read by a step: the
  caller keeps it until anything is published here (see the module's comment).
  """
  def get_cached(key) do
    case cached(key) do
      {_, store} -> store
      nil -> :erlang.error(:badarg)
    end
  end

  @doc "`get_row/1`, kept by the caller as `get_cached/1` keeps a store."
  def get_row_cached(key), do: cached(key)

  @doc "Unpublishes the store under `key` (its last holder releases it)."
  def erase(key) do
    :ets.delete(@table, key)
    bump()
  rescue
    # The application is stopping and its table has gone with it.
    ArgumentError -> :ok
  end

  # The row under `key`, or nil: the one this process kept, when nothing was
  # published since it read it (the same generation), else the table's, then kept.
  # A process keeps its rows in one entry of its dictionary, `{generation, %{key =>
  # row}}`.
  defp cached(key) do
    generation = :persistent_term.get(@generation, nil)

    case Process.get(__MODULE__) do
      {^generation, %{^key => row}} when generation != nil -> row
      kept -> keep(key, generation, kept)
    end
  end

  # Reads `key`'s row from the table and keeps it with the rows read under the same
  # generation. Something published since this process kept its rows (or the
  # application stopped): it drops them all, so that none keeps a replaced store
  # alive (and keeps none while the application is stopped).
  defp keep(key, generation, kept) do
    row = get_row(key)

    case kept do
      _ when generation == nil -> Process.delete(__MODULE__)
      {^generation, rows} -> Process.put(__MODULE__, {generation, Map.put(rows, key, row)})
      _none_or_older -> Process.put(__MODULE__, {generation, %{key => row}})
    end

    row
  end

  # After every write to the table; once forget/0 has run, writes leave caching off.
  defp bump do
    if :persistent_term.get(@generation, nil) != nil, do: new_generation()
    :ok
  end

  defp new_generation do
    :persistent_term.put(@generation, :erlang.unique_integer([:positive, :monotonic]))
    :ok
  end
end
