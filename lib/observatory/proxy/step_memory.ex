defmodule Observatory.Proxy.StepMemory do
  @moduledoc """
  The proxy's memory of the steps it has already ingested, so that a step is counted
  once although the agent re-sends its whole conversation on every turn (and retries
  a turn after an error).

  `claim/3` is atomic (`:ets.insert_new/2`): of two identical requests racing, one
  ingests the step. Keys are remembered per agent and session.

  **Bounded, and per agent.** Each agent holds at most `:proxy_step_memory_per_agent`
  keys (default 10 000; past it *its own* oldest are forgotten first), all agents
  together at most `:proxy_step_memory` (default 100 000, the oldest first), and
  none older than the idle-session TTL (`:entropy_session_ttl_ms`). The per-agent
  quota is below the total, so no agent can flush another's memory by sending many
  turns: only its own keys make room for its new ones. A forgotten key could only
  matter for a turn re-sent after that long.
  """

  use GenServer

  alias Observatory.Gateway.IdleSweep

  # {{agent_id, session_id, key}, age}
  @keys __MODULE__.Keys
  # {age, {agent_id, session_id, key}}: every key, oldest first
  @ages __MODULE__.Ages
  # {{agent_id, age}, {agent_id, session_id, key}}: each agent's keys, oldest first
  @agent_ages __MODULE__.AgentAges
  # {agent_id, count}
  @counts __MODULE__.Counts

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "`true` the first time `key` is claimed in the agent's session, `false` after."
  @spec claim(String.t(), String.t(), binary()) :: boolean()
  def claim(agent_id, session_id, key) do
    age = {System.monotonic_time(:millisecond), :erlang.unique_integer([:positive])}
    id = {agent_id, session_id, key}

    if :ets.insert_new(@keys, {id, age}) do
      :ets.insert(@ages, {age, id})
      :ets.insert(@agent_ages, {{agent_id, age}, id})
      held = :ets.update_counter(@counts, agent_id, 1, {agent_id, 0})
      if held > max_per_agent(), do: forget_oldest_of(agent_id)
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
  @spec release(String.t(), String.t(), binary()) :: :ok
  def release(agent_id, session_id, key) do
    case :ets.lookup(@keys, {agent_id, session_id, key}) do
      [{_, age}] -> forget(age)
      [] -> :ok
    end
  end

  @doc "How many keys are remembered, in all or for one agent."
  @spec size() :: non_neg_integer()
  def size, do: :ets.info(@keys, :size)

  @spec size(String.t()) :: non_neg_integer()
  def size(agent_id) do
    case :ets.lookup(@counts, agent_id) do
      [{_, n}] -> n
      [] -> 0
    end
  end

  defp max_keys, do: Application.get_env(:observatory, :proxy_step_memory, 100_000)

  defp max_per_agent,
    do: Application.get_env(:observatory, :proxy_step_memory_per_agent, 10_000)

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

  # The agent's keys sort after {agent_id, 0}: an age is a tuple, and numbers sort
  # before tuples.
  defp forget_oldest_of(agent_id) do
    case :ets.next(@agent_ages, {agent_id, 0}) do
      {^agent_id, age} -> forget(age)
      _other_agent_or_end -> :ok
    end
  end

  # Whoever takes the age's entry forgets the key, once, even when two processes race.
  defp forget(age) do
    case :ets.take(@ages, age) do
      [{^age, {agent_id, _, _} = id}] ->
        :ets.delete(@keys, id)
        :ets.delete(@agent_ages, {agent_id, age})

        if :ets.update_counter(@counts, agent_id, -1, {agent_id, 0}) <= 0,
          do: :ets.delete_object(@counts, {agent_id, 0})

        :ok

      [] ->
        :ok
    end
  end

  @impl true
  def init(_opts) do
    for {name, type} <- [{@keys, :set}, {@ages, :ordered_set}, {@agent_ages, :ordered_set}] do
      :ets.new(name, [:named_table, :public, type, write_concurrency: true])
    end

    :ets.new(@counts, [:named_table, :public, :set, write_concurrency: true])
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
