defmodule ObservatoryWeb.SnapshotCache do
  @moduledoc """
  Fleet-wide listings computed once per refresh for every open dashboard page.

  A page used to take its own snapshot of the fleet each refresh (the tracker's
  newest sessions, the loop verdict's flagged ones, the pauses, the step detector's
  streaks): every scan visits every session, so at a million sessions each open tab
  cost a share of a core, and ten tabs ten shares. `fetch/3` hands every page the
  same value while it is younger than `max_age_ms`; the first page to find it stale
  computes it here, once, while the others wait for that result rather than start
  their own scan. The cost is then one scan per refresh interval whatever the
  number of tabs, and a tab's own cost (copying a bounded top-N listing and
  rendering it) does not grow with the fleet.

  Without this process running (it is started by `Observatory.Application`),
  `fetch/3` computes in the caller.
  """

  use GenServer

  @table __MODULE__

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The cached value of `key` if younger than `max_age_ms`, else `compute.()` (cached)."
  @spec fetch(term(), non_neg_integer(), (() -> value)) :: value when value: term()
  def fetch(key, max_age_ms, compute) do
    case fresh(key, max_age_ms) do
      {:ok, value} -> value
      :stale -> GenServer.call(__MODULE__, {:fetch, key, max_age_ms, compute}, 60_000)
    end
  catch
    :exit, {:noproc, _} -> compute.()
  end

  defp fresh(key, max_age_ms) do
    now = System.monotonic_time(:millisecond)

    case :ets.lookup(@table, key) do
      [{^key, at, value}] when now - at < max_age_ms -> {:ok, value}
      _ -> :stale
    end
  rescue
    ArgumentError -> :stale
  end

  @impl true
  def init(_opts) do
    :ets.new(@table, [:named_table, :protected, read_concurrency: true])
    {:ok, nil}
  end

  @impl true
  def handle_call({:fetch, key, max_age_ms, compute}, _from, state) do
    # Pages that queued behind the one that computed it find it fresh now.
    case fresh(key, max_age_ms) do
      {:ok, value} ->
        {:reply, value, state}

      :stale ->
        value = compute.()
        :ets.insert(@table, {key, System.monotonic_time(:millisecond), value})
        {:reply, value, state}
    end
  end
end
