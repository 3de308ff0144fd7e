defmodule Observatory.Proxy.StepMemory do
  @moduledoc """
  The proxy's memory of the steps it has already ingested, so that a step is counted
  once although the agent re-sends its whole conversation on every turn (and retries
  a turn after an error).

  `claim/2` is atomic (`:ets.insert_new/2`): of two identical requests racing, one
  ingests the step. Memory is bounded: at most `:proxy_step_memory` keys (default
  100 000; past it the oldest are forgotten first) and none older than the idle-session
  TTL (`:entropy_session_ttl_ms`). A forgotten key could only matter for a turn re-sent
  after that long.
  """

  use GenServer

  alias Observatory.Gateway.IdleSweep

  @keys __MODULE__.Keys
  @ages __MODULE__.Ages

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "`true` the first time `{session_id, key}` is claimed, `false` after."
  @spec claim(String.t(), binary()) :: boolean()
  def claim(session_id, key) do
    age = {System.monotonic_time(:millisecond), :erlang.unique_integer([:positive])}

    if :ets.insert_new(@keys, {{session_id, key}, age}) do
      :ets.insert(@ages, {age, {session_id, key}})
      trim(max_keys())
      true
    else
      false
    end
  end

  @doc """
  Forgets a claimed key: its step was not ingested (refused, or its session's owner
  did not answer in a cluster), so the turn re-sent later must try it again.
  """
  @spec release(String.t(), binary()) :: :ok
  def release(session_id, key) do
    case :ets.take(@keys, {session_id, key}) do
      [{_, age}] -> :ets.delete(@ages, age)
      [] -> :ok
    end

    :ok
  end

  @doc "How many keys are remembered."
  @spec size() :: non_neg_integer()
  def size, do: :ets.info(@keys, :size)

  defp max_keys, do: Application.get_env(:observatory, :proxy_step_memory, 100_000)

  # Forgets the oldest keys while over the cap (concurrent trims may forget one more).
  defp trim(max) do
    if :ets.info(@keys, :size) > max do
      case :ets.first(@ages) do
        :"$end_of_table" ->
          :ok

        age ->
          forget(age)
          trim(max)
      end
    else
      :ok
    end
  end

  defp forget(age) do
    case :ets.take(@ages, age) do
      [{^age, key}] -> :ets.delete(@keys, key)
      [] -> :ok
    end
  end

  @impl true
  def init(_opts) do
    :ets.new(@keys, [:named_table, :public, :set, write_concurrency: true])
    :ets.new(@ages, [:named_table, :public, :ordered_set, write_concurrency: true])
    IdleSweep.schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_info(:sweep, state) do
    cutoff = System.monotonic_time(:millisecond) - IdleSweep.ttl_ms()
    sweep(:ets.first(@ages), cutoff)
    IdleSweep.schedule()
    {:noreply, state}
  end

  defp sweep({at, _} = age, cutoff) when at < cutoff do
    next = :ets.next(@ages, age)
    forget(age)
    sweep(next, cutoff)
  end

  defp sweep(_age, _cutoff), do: :ok
end
