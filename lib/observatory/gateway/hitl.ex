defmodule Observatory.Gateway.HITL do
  @moduledoc """
  Human-in-the-loop Pause and Resume per session (design.md §5, ADR-021).

  An operator pauses a session from the dashboard or the API; every command is
  audited (who, when, why). A paused session's DecisionLogs are still validated,
  scored and stored, but the gateway's answer to the agent carries a `pause`
  directive, and the session's topology node shows `paused` until an operator resumes
  it; on resume the node shows the session's entropy state again (`alert_entropy`,
  `blocked` or `active`). Events go out on `"gateway:hitl"`.

      HITL.pause("sess-abc", operator: "alice", reason: "looping on read_file")
      HITL.paused?("sess-abc")  #=> true
      HITL.resume("sess-abc", operator: "alice", reason: "fixed the path")

  Writes go through this process, so the audit log's order is the order of effect;
  `paused?/1` reads the table directly and costs one ETS lookup.

  ## Durability

  Pauses and the audit log (its last 10,000 entries, in time order) are Mnesia `disc_copies`
  tables, created by `Observatory.Storage` before this process starts; each command
  is a `sync_transaction` followed by `:mnesia.sync_log/0`, so when `pause/2`
  returns the pause is on disk. A crash of this process, or of anything else, loses
  no pause: its restart reads the tables, and a restart of the node loads them from
  disc. Without Mnesia, `paused?/1` raises rather than answer "not paused".
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{EntropyTracker, Events, Topology}

  @paused :observatory_hitl_pauses
  @audit :observatory_hitl_audit
  @max_audit 10_000

  @type audit_entry :: %{
          action: :pause | :resume,
          session_id: String.t(),
          operator: String.t(),
          reason: String.t(),
          at: DateTime.t()
        }

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The topic of pause and resume events."
  @spec topic() :: String.t()
  def topic, do: "gateway:hitl"

  @doc """
  Pauses a session. Returns `{:ok, entry}` or `{:error, :already_paused}`.

  ## Options
    * `:operator` — who (required, a non-empty string).
    * `:reason` — why (a string, may be empty).
  """
  @spec pause(String.t(), keyword()) :: {:ok, audit_entry()} | {:error, atom()}
  def pause(session_id, opts), do: command(:pause, session_id, opts)

  @doc """
  Resumes a paused session. Returns `{:ok, entry}` or `{:error, :not_paused}`; in a
  cluster, `{:error, :no_majority}` on a node cut off from the majority (a resume
  lowers safety state: `Observatory.Cluster.with_majority/2`).
  """
  @spec resume(String.t(), keyword()) :: {:ok, audit_entry()} | {:error, atom()}
  def resume(session_id, opts) do
    Observatory.Cluster.with_majority("resuming session #{inspect(session_id)}", fn ->
      command(:resume, session_id, opts)
    end)
  end

  @doc "Whether the session is paused."
  @spec paused?(String.t()) :: boolean()
  def paused?(session_id) when is_binary(session_id), do: pause_of(session_id) != nil

  @doc false
  # The pauses table (the proxy follows new pauses in it: Observatory.Proxy.OpenRequests).
  def pauses_table, do: @paused

  @doc "The pause in force for a session, or nil."
  @spec pause_of(String.t()) :: audit_entry() | nil
  def pause_of(session_id) do
    case Observatory.Storage.read(@paused, session_id) do
      [{@paused, _, entry}] -> entry
      [] -> nil
    end
  end

  @doc "Every paused session's pause entry."
  @spec paused_sessions() :: [audit_entry()]
  def paused_sessions do
    Observatory.Storage.reading(fn ->
      :mnesia.dirty_select(@paused, [{{@paused, :_, :"$1"}, [], [:"$1"]}])
    end)
  end

  @doc "The audit log, newest first; `:session_id` filters, `:limit` caps (default 100)."
  @spec audit_log(keyword()) :: [audit_entry()]
  def audit_log(opts \\ []) do
    limit = Keyword.get(opts, :limit, 100)
    session = Keyword.get(opts, :session_id)

    # An ordered set: the select answers oldest first.
    Observatory.Storage.reading(fn ->
      :mnesia.dirty_select(@audit, [{{@audit, :_, :"$1"}, [], [:"$1"]}])
    end)
    |> Enum.reverse()
    |> Stream.filter(&(session == nil or &1.session_id == session))
    |> Enum.take(limit)
  end

  defp command(action, session_id, opts) do
    Observatory.Storage.require!()

    with :ok <- check_session(session_id),
         {:ok, operator} <- check_string(opts, :operator, 1),
         {:ok, reason} <- check_string(opts, :reason, 0) do
      GenServer.call(__MODULE__, {action, session_id, operator, reason})
    end
  end

  defp check_session(id) when is_binary(id) and byte_size(id) in 1..256, do: :ok
  defp check_session(_), do: {:error, :invalid_session_id}

  defp check_string(opts, key, min) do
    case Keyword.get(opts, key, "") do
      s when is_binary(s) and byte_size(s) >= min and byte_size(s) <= 1024 -> {:ok, s}
      _ -> {:error, :"invalid_#{key}"}
    end
  end

  @doc false
  # The durable tables (cleared by Observatory.Testing.reset!/0).
  def tables, do: [@paused, @audit]

  @doc false
  # Called by Observatory.Storage before this process starts; returns the tables.
  def create_tables do
    Observatory.Storage.create_table(@paused, attributes: [:session_id, :entry], type: :set)
    Observatory.Storage.create_table(@audit, attributes: [:seq, :entry], type: :ordered_set)
    [@paused, @audit]
  end

  @impl true
  def init(_opts) do
    # The audit log goes on where the durable one ends.
    seq =
      case :mnesia.dirty_last(@audit) do
        :"$end_of_table" -> 0
        last -> last
      end

    {:ok, %{seq: seq}}
  end

  @impl true
  def handle_call({:pause, session_id, operator, reason}, _from, state) do
    if paused?(session_id) do
      {:reply, {:error, :already_paused}, state}
    else
      entry = entry(:pause, session_id, operator, reason)
      state = write(state, entry, fn -> :mnesia.write({@paused, session_id, entry}) end)
      {:reply, {:ok, entry}, announce(entry, state)}
    end
  end

  def handle_call({:resume, session_id, operator, reason}, _from, state) do
    case pause_of(session_id) do
      nil ->
        {:reply, {:error, :not_paused}, state}

      pause ->
        entry = entry(:resume, session_id, operator, reason)

        state =
          write(state, entry, fn ->
            :mnesia.delete({@paused, session_id})
            # A replica that missed this resume must not bring the pause back.
            Observatory.Cluster.Tombstones.bury(@paused, session_id, pause.at)
          end)

        {:reply, {:ok, entry}, announce(entry, state)}
    end
  end

  # The change and its audit entry in one transaction, on disk when this returns.
  # The entry's key is an integer made of its time (µs), this node and a counter:
  # nodes of a cluster never take each other's keys (during a partition either), and
  # the log stays in time order. Earlier releases numbered entries 1, 2, 3…: theirs
  # sort first, and one of them still running during a rolling upgrade goes on from
  # the largest key without meeting ours.
  defp write(state, entry, change) do
    key =
      System.os_time(:microsecond) * 1_000_000 + :erlang.phash2(node(), 1_000) * 1_000 +
        rem(System.unique_integer([:positive, :monotonic]), 1_000)

    Observatory.Storage.transaction("HITL", fn ->
      change.()
      :mnesia.write({@audit, key, entry})

      if :mnesia.table_info(@audit, :size) > @max_audit,
        do: :mnesia.delete({@audit, :mnesia.first(@audit)})
    end)

    %{state | seq: key}
  end

  defp entry(action, session_id, operator, reason) do
    %{
      action: action,
      session_id: session_id,
      operator: operator,
      reason: reason,
      at: DateTime.utc_now()
    }
  end

  defp announce(entry, state) do
    Logger.info(
      "hitl #{entry.action} session=#{inspect(entry.session_id)} operator=#{inspect(entry.operator)} reason=#{inspect(entry.reason)}"
    )

    Events.broadcast(topic(), Map.put(entry, :event_type, "hitl_#{entry.action}"))

    Observatory.Telemetry.execute(
      [:observatory, :hitl, entry.action],
      %{system_time: System.system_time()},
      Map.take(entry, [:session_id, :operator, :reason])
    )

    if entry.action == :pause or Observatory.Cluster.owner(entry.session_id) == node() do
      topology(entry)
    else
      # The session's state is on its owner (a cluster): asked from another process,
      # so a slow owner never holds this one's commands.
      Task.start(fn -> topology(entry) end)
    end

    state
  end

  defp topology(entry) do
    {agent_id, state_name} = node_state(entry)
    Topology.broadcast(entry.session_id, agent_id, state_name, force: true)
  end

  # A resumed node shows its entropy state again: a session still looping flashes
  # red at once rather than showing `active` until its next step.
  defp node_state(%{action: :pause}), do: {nil, "paused"}

  defp node_state(%{action: :resume, session_id: id}) do
    case Observatory.Cluster.on_owner(id, EntropyTracker, :session, [id]) do
      %{severity: :loop, agent_id: agent_id} -> {agent_id, "alert_entropy"}
      %{severity: :warning, agent_id: agent_id} -> {agent_id, "blocked"}
      %{agent_id: agent_id} -> {agent_id, "active"}
      nil -> {nil, "active"}
    end
  end
end
