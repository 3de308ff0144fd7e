defmodule Observatory.Proxy.OpenRequests do
  @moduledoc """
  The proxied requests under way on this node, so that one whose credential, agent
  or session stops being valid ends at once — a stream mid-answer included — rather
  than running on for as long as the upstream keeps writing.

  A request registers itself (`register/1`) with its agent, the hash of the key it
  presented and its session, then checks once more that all three are still valid
  (`check/1`): a change between its first checks and its registration is not missed.
  From then on this process ends it: it follows the Mnesia tables that say what is
  valid — agents (a deactivation, by an operator or the kill switch, or a deletion),
  agent keys (a revocation, a rotation) and HITL pauses — and sends each affected
  request `{:cancel, ref, reason}` (reason `:inactive`, `:revoked` or
  `{:paused, pause}`),
  which `Observatory.Proxy.HTTPClient` turns into the end of its wait (what changed
  is read from the table event itself, never re-read: a subscriber may hear of a
  commit before a read on this node sees it). Those tables
  are replicated to every node of a cluster, so a change made on any node ends the
  requests on all of them.

  When Mnesia restarts, the subscriptions are made again and every open request is
  checked, so a change made meanwhile is not missed either.
  """

  use GenServer
  require Logger

  alias Observatory.AgentKeys
  alias Observatory.Gateway.HITL
  alias Observatory.KillSwitch

  @registry __MODULE__.Registry
  @retry_ms 500

  @type entry :: %{
          ref: reference(),
          agent_id: String.t(),
          key_hash: binary() | nil,
          session_id: String.t() | nil
        }

  @doc false
  def child_spec(opts) do
    %{
      id: __MODULE__,
      start: {Supervisor, :start_link, [children(opts), [strategy: :rest_for_one]]},
      type: :supervisor
    }
  end

  defp children(opts) do
    [
      {Registry, keys: :duplicate, name: @registry},
      %{
        id: __MODULE__.Watcher,
        start: {GenServer, :start_link, [__MODULE__, opts, [name: __MODULE__]]}
      }
    ]
  end

  @doc """
  Registers the calling process's request and returns its entry; its `ref` is the
  `:cancel` reference to give `HTTPClient`. `key_hash` is nil for a key the agent
  store does not hold (an insecure shared key).
  """
  @spec register(%{agent_id: String.t(), key_hash: binary() | nil, session_id: String.t() | nil}) ::
          entry()
  def register(%{agent_id: agent_id} = request) do
    entry = Map.put(request, :ref, make_ref())
    {:ok, _} = Registry.register(@registry, {:agent, agent_id}, entry)
    entry
  end

  @doc "Unregisters the calling process's request, and drops a cancel that came too late."
  @spec unregister(entry()) :: :ok
  def unregister(%{agent_id: agent_id, ref: ref}) do
    Registry.unregister_match(@registry, {:agent, agent_id}, %{ref: ref})

    receive do
      {:cancel, ^ref, _reason} -> :ok
    after
      0 -> :ok
    end
  end

  @doc "`:ok` while the request's agent, key and session are valid, else why not."
  @spec check(entry()) :: :ok | {:error, :inactive | :revoked | {:paused, map()}}
  def check(entry) do
    pause = entry.session_id && HITL.pause_of(entry.session_id)

    cond do
      not KillSwitch.Agents.exists?(entry.agent_id) -> {:error, :revoked}
      entry.key_hash != nil and not key_held?(entry.key_hash) -> {:error, :revoked}
      not KillSwitch.active?(entry.agent_id) -> {:error, :inactive}
      pause != nil -> {:error, {:paused, pause}}
      true -> :ok
    end
  end

  defp key_held?(hash), do: :mnesia.dirty_read(AgentKeys.table(), hash) != []

  @doc "How many requests are registered on this node."
  @spec count() :: non_neg_integer()
  def count, do: Registry.count(@registry)

  ## The watcher

  @impl true
  def init(_opts) do
    send(self(), :subscribe)
    {:ok, %{mnesia: nil}}
  end

  @impl true
  def handle_info(:subscribe, state) do
    tables = [KillSwitch.Agents.table(), AgentKeys.table(), HITL.pauses_table()]

    with sup when is_pid(sup) <- Process.whereis(:mnesia_sup),
         true <- Enum.all?(tables, &subscribe/1) do
      # Whatever changed while nothing was subscribed.
      check_all()
      {:noreply, %{state | mnesia: Process.monitor(sup)}}
    else
      _ ->
        Process.send_after(self(), :subscribe, @retry_ms)
        {:noreply, state}
    end
  end

  def handle_info({:DOWN, ref, :process, _, _}, %{mnesia: ref} = state) do
    Process.send_after(self(), :subscribe, @retry_ms)
    {:noreply, %{state | mnesia: nil}}
  end

  def handle_info({:mnesia_table_event, event}, state) do
    changed(event)
    {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  defp subscribe(table) do
    case :mnesia.subscribe({:table, table, :simple}) do
      {:ok, _node} ->
        true

      {:error, {:already_exists, _}} ->
        true

      {:error, reason} ->
        Logger.debug("open requests: cannot follow #{table} yet: #{inspect(reason)}")
        false
    end
  catch
    :exit, _ -> false
  end

  # {:write, record, activity} | {:delete, {table, key}, activity} |
  # {:delete_object, record, activity}. What changed is read from the event itself:
  # a subscriber may hear of a commit before a dirty read on this node sees it.
  defp changed({op, record, _activity}) when is_tuple(record) and tuple_size(record) >= 2 do
    table = elem(record, 0)
    key = elem(record, 1)

    cond do
      table == KillSwitch.Agents.table() ->
        agent_changed(op, key, record)

      table == AgentKeys.table() and op != :write ->
        cancel(key_entries(key), :revoked)

      table == HITL.pauses_table() and op == :write ->
        cancel(session_entries(key), {:paused, elem(record, 2)})

      true ->
        :ok
    end
  end

  defp changed(_event), do: :ok

  defp agent_changed(:write, agent_id, {_table, _id, stored}) when is_map(stored) do
    if Map.get(stored, :active, true) == false,
      do: cancel(Registry.lookup(@registry, {:agent, agent_id}), :inactive)
  end

  defp agent_changed(:write, _agent_id, _record), do: :ok

  # Deleted: its keys go with it.
  defp agent_changed(_delete, agent_id, _record),
    do: cancel(Registry.lookup(@registry, {:agent, agent_id}), :revoked)

  defp key_entries(hash), do: Enum.filter(all(), fn {_pid, entry} -> entry.key_hash == hash end)

  defp session_entries(session_id),
    do: Enum.filter(all(), fn {_pid, entry} -> entry.session_id == session_id end)

  defp all, do: Registry.select(@registry, [{{:_, :"$1", :"$2"}, [], [{{:"$1", :"$2"}}]}])

  defp cancel(entries, reason) do
    for {pid, entry} <- entries, do: send(pid, {:cancel, entry.ref, reason})
    :ok
  end

  defp check_all, do: check_entries(all())

  defp check_entries(entries) do
    for {pid, entry} <- entries do
      case check(entry) do
        :ok -> :ok
        {:error, reason} -> send(pid, {:cancel, entry.ref, reason})
      end
    end

    :ok
  end
end
