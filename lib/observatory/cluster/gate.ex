defmodule Observatory.Cluster.Gate do
  @moduledoc """
  Holds this node's durable writes while the cluster reconciles its replicas.

  When a node joins Mnesia with a copy of the tables that may differ from the
  cluster's (a restart, the heal of a partition), the replicas disagree until
  `Observatory.Cluster.Reconcile` has merged them. A transaction that ran in between
  would read one replica and write every replica: it could overwrite a record the
  merge has not seen yet. So every durable write (`Observatory.Storage.transaction/2`)
  passes this gate, and the node that reconciles closes it on every member first:
  `close/1` waits until the writes already under way have finished, later writes wait
  until `open/0` (or until the close expires, so a reconciler that dies never holds
  writes for long).

  The state is two `:atomics` counters (writes under way, and the monotonic time the
  gate is closed until), created once per VM: passing the gate costs two atomic
  operations and takes no lock, owns no process and survives any crash.
  """

  @inflight 1
  @closed_until 2
  @poll_ms 10
  # Monotonic time is negative on many systems: "open" is a time before any.
  @open -4_611_686_018_427_387_904

  @doc """
  Runs `fun` once the gate is open, waiting at most `timeout_ms`; `{:error, :closed}`
  when it stayed closed that long (`fun` did not run).
  """
  @spec pass(non_neg_integer(), (() -> result)) :: result | {:error, :closed} when result: term()
  def pass(timeout_ms, fun) do
    deadline = now() + timeout_ms
    ref = ref()

    if enter(ref, deadline) do
      try do
        fun.()
      after
        :atomics.sub(ref, @inflight, 1)
      end
    else
      {:error, :closed}
    end
  end

  # Counted first, then checked: a closer that set the flag after our check sees us
  # in the count and waits for us; one that set it before is seen by our check.
  defp enter(ref, deadline) do
    :atomics.add(ref, @inflight, 1)

    cond do
      :atomics.get(ref, @closed_until) <= now() ->
        true

      now() >= deadline ->
        :atomics.sub(ref, @inflight, 1)
        false

      true ->
        :atomics.sub(ref, @inflight, 1)
        Process.sleep(@poll_ms)
        enter(ref, deadline)
    end
  end

  @doc """
  Closes the gate for at most `ms` and waits (as long) for the writes under way to
  finish. Returns `:ok`, or `{:error, :busy}` when some were still running.
  """
  @spec close(pos_integer()) :: :ok | {:error, :busy}
  def close(ms) do
    ref = ref()
    deadline = now() + ms
    :atomics.put(ref, @closed_until, deadline)
    drain(ref, deadline)
  end

  defp drain(ref, deadline) do
    cond do
      :atomics.get(ref, @inflight) <= 0 -> :ok
      now() >= deadline -> {:error, :busy}
      true -> Process.sleep(1) && drain(ref, deadline)
    end
  end

  @doc "Opens the gate."
  @spec open() :: :ok
  def open, do: :atomics.put(ref(), @closed_until, @open)

  @doc "Whether the gate is closed now."
  @spec closed?() :: boolean()
  def closed?, do: :atomics.get(ref(), @closed_until) > now()

  @doc false
  # Called once at application start, before any write can run (a later call keeps
  # the counters it finds).
  def setup do
    if :persistent_term.get(__MODULE__, nil) == nil do
      ref = :atomics.new(2, signed: true)
      :atomics.put(ref, @closed_until, @open)
      :persistent_term.put(__MODULE__, ref)
    end

    :ok
  end

  defp ref do
    case :persistent_term.get(__MODULE__, nil) do
      nil -> setup() && :persistent_term.get(__MODULE__)
      ref -> ref
    end
  end

  defp now, do: System.monotonic_time(:millisecond)
end
