defmodule Observatory.Bench.ReferenceTracker do
  @moduledoc false
  # The plain-Elixir design ADR-018 sketches: a GenServer owning a private ETS table,
  # one `:queue` window per session, uniqueness by `MapSet`. Every call goes through
  # the GenServer's mailbox. Used as the baseline in bench/entropy_tracker.exs.
  use GenServer

  def start_link(window_size), do: GenServer.start_link(__MODULE__, window_size)

  def record_and_score(pid, session_id, tuple),
    do: GenServer.call(pid, {:record, session_id, tuple})

  def memory_bytes(pid), do: GenServer.call(pid, :memory)

  @impl true
  def init(window_size) do
    {:ok, %{table: :ets.new(:reference_windows, [:set, :private]), size: window_size}}
  end

  @impl true
  def handle_call({:record, session_id, tuple}, _from, %{table: table, size: size} = state) do
    queue =
      case :ets.lookup(table, session_id) do
        [{_, q}] -> q
        [] -> :queue.new()
      end

    queue = :queue.in(tuple, queue)
    queue = if :queue.len(queue) > size, do: :queue.drop(queue), else: queue
    :ets.insert(table, {session_id, queue})
    list = :queue.to_list(queue)
    score = Float.round(MapSet.size(MapSet.new(list)) / length(list), 4)
    {:reply, {:ok, score, severity(score)}, state}
  end

  def handle_call(:memory, _from, state) do
    {:reply, :ets.info(state.table, :memory) * :erlang.system_info(:wordsize), state}
  end

  defp severity(s) when s < 0.25, do: :loop
  defp severity(s) when s < 0.5, do: :warning
  defp severity(_), do: :normal
end
