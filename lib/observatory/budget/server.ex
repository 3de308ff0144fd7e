defmodule Observatory.Budget.Server do
  @moduledoc """
  The budgets' housekeeping (the counting itself runs in the proxy's request
  processes: `Observatory.Budget`):

    * it marks each counted session's first loop alarm — `"alert_raised"` on
      `"gateway:alerts"` (`Observatory.Gateway.Alerts`), on the session's owner in a
      cluster — so that what was spent since the loop began can be shown
      (`Observatory.Budget.Store.mark_loop/2`);
    * every `:sweep_interval_ms` (one minute) the first member of the cluster drops
      expired window buckets and idle sessions (`Observatory.Budget.Store.sweep/3`);
    * it remembers the models that had no price, so each is logged once.
  """

  use GenServer
  require Logger

  alias Observatory.Budget.Store
  alias Observatory.Gateway.Events

  @unpriced __MODULE__.Unpriced
  # Distinct unpriced model names remembered (and logged) at most.
  @max_unpriced 1_000

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  Logs, once per model, that answers of `model` have no price: their tokens are
  counted, their cost is not. At most #{@max_unpriced} names are remembered (names come from requests).
  """
  @spec unpriced(String.t() | nil) :: :ok
  def unpriced(model) do
    if :ets.info(@unpriced, :size) < @max_unpriced and :ets.insert_new(@unpriced, {model}) do
      Logger.warning(
        "budget: model #{inspect(model)} has no price (config :observatory, :budgets, :prices): " <>
          "its tokens are counted, its cost is not"
      )
    end

    :ok
  catch
    :error, :badarg -> :ok
  end

  @impl true
  def init(_opts) do
    :ets.new(@unpriced, [:named_table, :public, :set])
    Events.subscribe_when_up([Observatory.Gateway.Alerts.topic()])
    schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_info(%{event_type: "alert_raised", session_id: session_id, since: since}, state) do
    if Observatory.Cluster.owner(session_id) == node() and Store.session_meta(session_id) != nil do
      Store.mark_loop(session_id, since)
    end

    {:noreply, state}
  end

  def handle_info({Events, :subscribe, topics}, state) do
    Events.subscribe_when_up(topics)
    {:noreply, state}
  end

  def handle_info(:sweep, state) do
    if hd(Observatory.Cluster.members()) == node() do
      config = Observatory.Budget.config()

      Store.sweep(
        System.system_time(:second),
        Keyword.get(config, :session_ttl_ms, :timer.hours(24 * 7)),
        Keyword.get(config, :max_sessions, 100_000)
      )
    end

    schedule()
    {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  defp schedule do
    interval = Keyword.get(Observatory.Budget.config(), :sweep_interval_ms, :timer.minutes(1))
    Process.send_after(self(), :sweep, interval)
  end
end
