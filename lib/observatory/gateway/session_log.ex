defmodule Observatory.Gateway.SessionLog do
  @moduledoc """
  The most recent accepted DecisionLogs of each session, for inspection.

  Each session keeps its last `:session_log_size` envelopes (default 20) in a ring
  of ETS slots: a writer takes the next sequence number with an atomic
  `:ets.update_counter/4` and overwrites the oldest slot, so concurrent writers never
  lose each other's messages and no process is in the write path. Sessions idle for
  `:entropy_session_ttl_ms` are swept, so memory stays bounded.
  """

  use GenServer

  alias Observatory.Gateway.IdleSweep

  @slots __MODULE__.Slots
  @heads __MODULE__.Heads

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "Stores an accepted envelope."
  @spec put(String.t(), map()) :: :ok
  def put(session_id, envelope) do
    size = size()
    now = System.system_time(:millisecond)
    seq = :ets.update_counter(@heads, session_id, {2, 1}, {session_id, 0, now})
    :ets.update_element(@heads, session_id, {3, now})
    :ets.insert(@slots, {{session_id, rem(seq, size)}, seq, envelope})
    :ok
  end

  @doc "The session's stored envelopes, oldest first."
  @spec recent(String.t()) :: [map()]
  def recent(session_id) do
    0..(size() - 1)
    |> Enum.flat_map(&:ets.lookup(@slots, {session_id, &1}))
    |> Enum.sort_by(fn {_, seq, _} -> seq end)
    |> Enum.map(fn {_, _, envelope} -> envelope end)
  end

  @doc "How many messages the session has sent since it was first seen."
  @spec count(String.t()) :: non_neg_integer()
  def count(session_id) do
    case :ets.lookup(@heads, session_id) do
      [{_, seq, _}] -> seq
      [] -> 0
    end
  end

  defp size, do: Application.get_env(:observatory, :session_log_size, 20)

  @impl true
  def init(_opts) do
    :ets.new(@slots, [
      :named_table,
      :public,
      :set,
      write_concurrency: true,
      read_concurrency: true
    ])

    :ets.new(@heads, [:named_table, :public, :set, write_concurrency: true])
    IdleSweep.schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_info(:sweep, state) do
    ttl = IdleSweep.ttl_ms()
    cutoff = System.system_time(:millisecond) - ttl

    for {session_id, _, seen} <- :ets.tab2list(@heads), seen < cutoff do
      :ets.delete(@heads, session_id)
      for slot <- 0..(size() - 1), do: :ets.delete(@slots, {session_id, slot})
    end

    IdleSweep.schedule()
    {:noreply, state}
  end
end
