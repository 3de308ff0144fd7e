defmodule Observatory.Storage do
  @moduledoc """
  Mnesia, started and watched. On start it runs `Observatory.KillSwitch.Agents.setup/0`
  (Mnesia started in `<:data_dir>/mnesia/<node>`, agent tables loaded) and creates the
  gateway's durable tables (`Observatory.Gateway.HITL`'s pauses and audit log,
  `Observatory.Gateway.StepDetector`'s blocks, the proxy's session-id secret:
  `Observatory.Proxy.SessionId`); it comes before every process that reads them.

  Then it watches Mnesia's supervisor. Mnesia is a temporary application: when it
  dies (`:mnesia_sup` killed, a disc error) nothing restarts it, and every read of
  an agent, a pause or a block fails with `node_not_running`. This process exits
  with `{:mnesia_down, reason}` instead, its supervisor starts it again, and its
  `init/1` starts Mnesia again, which loads the tables from disc. Until then
  `Observatory.Health` reports `mnesia` down and `/healthz` answers 503.
  """

  use GenServer
  require Logger

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  Creates a `disc_copies` table unless it exists (on every member in a cluster; `opts` as for
  `:mnesia.create_table/2`). Raises when Mnesia refuses.
  """
  @spec create_table(atom(), keyword()) :: :ok
  def create_table(name, opts) do
    # With clustering on (issue 14), on every member: Observatory.Cluster.Store.
    Observatory.Cluster.Store.ensure_table(name, opts)
  end

  @doc """
  Runs `fun` in a Mnesia transaction that is on disk when this returns (a
  `sync_transaction`, then `:mnesia.sync_log/0`) and returns `fun`'s result. An aborted
  transaction raises, naming `what`: callers never carry on as if it had happened.
  """
  @spec transaction(String.t(), (() -> result)) :: result when result: term()
  def transaction(what, fun) do
    case :mnesia.sync_transaction(fun) do
      {:atomic, result} ->
        _ = :mnesia.sync_log()
        result

      {:aborted, reason} ->
        raise "#{what} transaction aborted: #{inspect(reason)}"
    end
  end

  @doc "Whether Mnesia runs and `tables` can be read here."
  @spec available?([atom()]) :: boolean()
  def available?(tables) do
    :mnesia.system_info(:is_running) == :yes and
      Enum.all?(tables, &(:mnesia.table_info(&1, :where_to_read) == node()))
  catch
    :exit, _ -> false
  end

  @impl true
  def init(_opts) do
    await_stopped()
    :ok = Observatory.KillSwitch.Agents.setup()

    tables =
      Observatory.Gateway.HITL.create_tables() ++
        Observatory.Gateway.StepDetector.create_tables() ++
        Observatory.Proxy.SessionId.create_tables()

    case :mnesia.wait_for_tables(tables, 30_000) do
      :ok -> :ok
      other -> raise "Mnesia tables #{inspect(tables)} did not load: #{inspect(other)}"
    end

    sup = Process.whereis(:mnesia_sup) || raise "Mnesia is not running"
    {:ok, %{mnesia: Process.monitor(sup)}}
  end

  @impl true
  def handle_info({:DOWN, ref, :process, _, reason}, %{mnesia: ref} = state) do
    Logger.error("Mnesia stopped (#{inspect(reason)}); starting it again")
    {:stop, {:mnesia_down, reason}, state}
  end

  # Mnesia that is stopping (its supervisor just died) cannot be started until the
  # application controller has seen it go.
  defp await_stopped(tries \\ 100) do
    stopping? =
      :mnesia.system_info(:is_running) == :stopping or
        (Process.whereis(:mnesia_sup) == nil and
           List.keymember?(Application.started_applications(), :mnesia, 0))

    if stopping? and tries > 0 do
      Process.sleep(50)
      await_stopped(tries - 1)
    end
  end
end
