defmodule Observatory.Storage do
  @moduledoc """
  Mnesia, started and watched. On start it runs `Observatory.KillSwitch.Agents.setup/0`
  (Mnesia started in `<:data_dir>/mnesia/<node>`, agent tables loaded) and creates the
  gateway's durable tables (`Observatory.Gateway.HITL`'s pauses and audit log,
  `Observatory.Gateway.StepDetector`'s blocks, the proxy's session-id secret:
  `Observatory.Proxy.SessionId`, the budgets' counters: `Observatory.Budget.Store`); it comes before every process that reads them.

  Then it watches Mnesia's supervisor. Mnesia is a temporary application: when it
  dies (`:mnesia_sup` killed, a disc error) nothing restarts it, and every read of
  an agent, a pause or a block fails with `node_not_running`. This process exits
  with `{:mnesia_down, reason}` instead, its supervisor starts it again, and its
  `init/1` starts Mnesia again, which loads the tables from disc. Until then
  `Observatory.Health` reports `mnesia` down and `/healthz` answers 503.

  Whether a VM runs storage at all is decided as the application starts
  (`decide/0`): a task beside a running server runs with it off.
  """

  use GenServer
  require Logger

  # `:persistent_term` keys read on every step are atoms: a tuple key costs ~40–50 ns
  # more a read (hashed and compared term by term).
  @mode_key __MODULE__.Mode
  # %{table => tid}: the ETS table holding this node's loaded copy of each table read
  # with `read/2` (see there).
  @copies_key __MODULE__.LocalCopies

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @typedoc "Whether this VM runs Observatory's storage, and if not why."
  @type mode :: :on | {:off, String.t()}

  @doc """
  Decides, as the application starts, whether this VM runs Observatory's storage
  (its data-directory lock, Mnesia and everything that reads them):

    * `config :observatory, storage: false` or `OBSERVATORY_STORAGE=off` — off;
    * Observatory's own server configured on — on (the lock refuses a second gateway);
    * otherwise (a host app) on, unless another OS process holds the data directory's
      lock — a `mix run` or `mix test` beside `mix phx.server`: then off, with a
      warning that says so, rather than refusing to start (which would stop the task,
      and every other application with it).

  With storage off nothing of Observatory runs in the VM; a call that needs it raises
  `Observatory.StorageOffError` (`require!/0`) and the host's mounted APIs answer
  `503 storage_off`.
  """
  @spec decide() :: mode()
  def decide do
    cond do
      Application.get_env(:observatory, :storage, true) == false ->
        {:off, "config :observatory, storage: false"}

      System.get_env("OBSERVATORY_STORAGE") in ["off", "false", "0"] ->
        {:off, "OBSERVATORY_STORAGE=off"}

      ObservatoryWeb.Endpoint.server?() ->
        :on

      true ->
        dir = Observatory.DataDirLock.dir()

        case Observatory.DataDirLock.probe(dir) do
          :free ->
            :on

          {:locked, who} ->
            reason = "its data directory #{dir} is in use by another VM (#{who})"

            Logger.warning(
              "Observatory runs with its storage off in this VM: #{reason} — your " <>
                "`mix phx.server`, most likely. Nothing of Observatory runs here, and calls " <>
                "that need it (ingest, agent keys, pauses) raise Observatory.StorageOffError. " <>
                "To use Observatory in this VM, stop the other one or give this one another " <>
                ":data_dir; to skip this check, set OBSERVATORY_STORAGE=off."
            )

            {:off, reason}
        end
    end
  end

  @doc false
  def put_mode(mode), do: :persistent_term.put(@mode_key, mode)

  @doc "This VM's storage mode (see `decide/0`); `:on` before the application decided."
  @spec mode() :: mode()
  def mode, do: :persistent_term.get(@mode_key, :on)

  @doc "Whether this VM runs Observatory's storage."
  @spec on?() :: boolean()
  def on?, do: mode() == :on

  @doc "Raises `Observatory.StorageOffError` when this VM runs with storage off."
  @spec require!() :: :ok
  def require! do
    case mode() do
      :on ->
        :ok

      {:off, reason} ->
        raise Observatory.StorageOffError,
              "Observatory's storage is off in this VM (#{reason}): run this where " <>
                "Observatory runs (e.g. in `iex -S mix phx.server`), or stop that VM first"
    end
  end

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

  In a cluster the write first passes `Observatory.Cluster.Gate`: while the replicas
  are being reconciled (a node rejoining, a partition healing) it waits, at most the
  cluster's `:write_timeout_ms`, then raises `Observatory.Cluster.Unavailable`
  (answered `503 cluster_unavailable`) without having written anything.

  `opts`:

    * `:deadline` — a `System.os_time(:millisecond)` (`Observatory.Cluster.deadline/0`)
      after which the write must not commit: the gate is awaited until then at most,
      and a transaction whose locks were granted later aborts and raises
      `Observatory.Cluster.Unavailable` with reason `:late`. Nothing was written.
      `nil` (the default): no deadline.
  """
  @spec transaction(String.t(), (() -> result), keyword()) :: result when result: term()
  def transaction(what, fun, opts \\ []) do
    require!()
    fun = before_deadline(fun, opts[:deadline])

    if Observatory.Cluster.enabled?() do
      timeout = gate_timeout(opts[:deadline])

      case Observatory.Cluster.Gate.pass(timeout, fn -> {:done, commit(what, fun)} end) do
        {:done, result} ->
          result

        {:error, :closed} ->
          raise Observatory.Cluster.Unavailable,
            reason: :healing,
            message:
              "#{what}: the cluster is reconciling its replicas and did not take writes " <>
                "within #{timeout} ms; nothing was written, retry"
      end
    else
      commit(what, fun)
    end
  end

  defp commit(what, fun) do
    case :mnesia.sync_transaction(fun) do
      {:atomic, result} ->
        _ = :mnesia.sync_log()
        result

      {:aborted, {:deadline_passed, late_ms}} ->
        raise Observatory.Cluster.Unavailable,
          reason: :late,
          message:
            "#{what}: would have committed #{late_ms} ms after its caller's deadline; " <>
              "nothing was written"

      {:aborted, reason} ->
        raise "#{what} transaction aborted: #{inspect(reason)}"
    end
  end

  # The check runs last in the transaction, once every lock it waited for is held:
  # only the commit itself comes after it.
  defp before_deadline(fun, nil), do: fun

  defp before_deadline(fun, deadline) do
    fn ->
      result = fun.()
      late_ms = System.os_time(:millisecond) - deadline
      if late_ms > 0, do: :mnesia.abort({:deadline_passed, late_ms})
      result
    end
  end

  defp gate_timeout(deadline) do
    timeout = Observatory.Cluster.setting(:write_timeout_ms)
    if deadline, do: min(timeout, max(deadline - System.os_time(:millisecond), 0)), else: timeout
  end

  @doc """
  `:mnesia.dirty_read/2`, in one lookup when this node reads the table from its own
  copy (every table here is a `disc_copies` table on every member): the same ETS
  lookup a dirty read ends in, without its way there. Otherwise — the copy not
  loaded yet, a node without one, Mnesia down — a dirty read, with its answers and
  errors. Exact either way: what a dirty read returns, no record cached. Ingest
  checks a session's pause, its block and its agent with it on every step.

  Which ETS table holds this node's loaded copy is asked of Mnesia once and then
  remembered by the table's identity (its tid): Mnesia says a copy is the one to
  read only once it is loaded, and a loaded copy stays a replica that every commit
  writes until Mnesia deletes it — Mnesia stopped, the copy removed or turned into
  a `disc_only_copies` one — which ends that tid. A lookup in a remembered table
  that is gone raises, and the read asks Mnesia again; a copy loaded again is a new
  table, remembered once Mnesia says it is loaded.
  """
  @spec read(atom(), term()) :: [tuple()]
  def read(table, key) do
    case :persistent_term.get(@copies_key, nil) do
      %{^table => tid} -> read_remembered(tid, table, key)
      _ -> read_asking(table, key)
    end
  end

  defp read_remembered(tid, table, key) do
    :ets.lookup(tid, key)
  rescue
    ArgumentError ->
      forget_copy(table, tid)
      read_asking(table, key)
  end

  @doc false
  # The table remembered as this node's copy of `table`, or nil (for tests).
  def remembered_copy(table), do: Map.get(:persistent_term.get(@copies_key, %{}), table)

  # Each write replaces the map, which makes the VM check every process for the old
  # one (as erasing a key did): once per table after start, and when a copy is
  # loaded again. Two processes remembering or forgetting copies at once may each
  # write the map without the other's change: a copy left out is asked of Mnesia
  # again at its next read, and a tid of a deleted table put back raises at its next
  # lookup (a tid is never reused), which forgets it again.
  defp remember_copy(table, tid) do
    copies = :persistent_term.get(@copies_key, %{})
    :persistent_term.put(@copies_key, Map.put(copies, table, tid))
  end

  defp forget_copy(table, tid) do
    copies = :persistent_term.get(@copies_key, %{})

    if Map.get(copies, table) == tid,
      do: :persistent_term.put(@copies_key, Map.delete(copies, table))
  end

  defp read_asking(table, key) do
    tid = :ets.whereis(table)

    # Mnesia's own record of where a dirty read of `table` goes (what it reads first),
    # and the same table before and after it: not one deleted and made again between.
    if tid != :undefined and
         :ets.lookup_element(:mnesia_gvar, {table, :where_to_read}, 2) == node() and
         :ets.whereis(table) == tid do
      remember_copy(table, tid)
      :ets.lookup(tid, key)
    else
      reading(fn -> :mnesia.dirty_read(table, key) end)
    end
  rescue
    ArgumentError -> reading(fn -> :mnesia.dirty_read(table, key) end)
  end

  @doc """
  Runs `fun`, a read of Observatory's state, and says why when it cannot run: with
  storage off in this VM (its tables and stores do not exist here), raises
  `Observatory.StorageOffError` instead of Mnesia's `{:aborted, {:no_exists, _}}` exit
  or a missing store's `ArgumentError`. Costs nothing when the read succeeds.
  """
  @spec reading((() -> result)) :: result when result: term()
  def reading(fun) do
    fun.()
  rescue
    error in ArgumentError ->
      require!()
      reraise error, __STACKTRACE__
  catch
    :exit, {:aborted, {:no_exists, _}} = reason ->
      require!()
      exit(reason)
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
        Observatory.Proxy.SessionId.create_tables() ++
        Observatory.Budget.Store.create_tables() ++
        Observatory.Notifications.create_tables() ++
        Observatory.Cluster.Tombstones.create_table()

    :ok = Observatory.Cluster.Store.await_tables(tables)
    # In a cluster: this node's copy merged with the running nodes' (a restart).
    :ok = Observatory.Cluster.Store.settle()
    seal_plain_secrets()
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

  # Secrets an older release stored in plain are sealed now. A cluster that takes no
  # writes yet (healing) leaves them for the next start rather than fail this one.
  defp seal_plain_secrets do
    Observatory.Notifications.seal_plain_sinks()
  rescue
    error in Observatory.Cluster.Unavailable ->
      require Logger

      Logger.warning(
        "notification sinks stay unsealed until the next start: #{Exception.message(error)}"
      )
  end
end
