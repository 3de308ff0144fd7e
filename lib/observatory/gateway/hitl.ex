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
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{EntropyTracker, Events, Topology}

  @paused __MODULE__.Paused
  @audit __MODULE__.Audit
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
  def topic, do: "gateway:hitl"

  @doc """
  Pauses a session. Returns `{:ok, entry}` or `{:error, :already_paused}`.

  ## Options
    * `:operator` — who (required, a non-empty string).
    * `:reason` — why (a string, may be empty).
  """
  @spec pause(String.t(), keyword()) :: {:ok, audit_entry()} | {:error, atom()}
  def pause(session_id, opts), do: command(:pause, session_id, opts)

  @doc "Resumes a paused session. Returns `{:ok, entry}` or `{:error, :not_paused}`."
  @spec resume(String.t(), keyword()) :: {:ok, audit_entry()} | {:error, atom()}
  def resume(session_id, opts), do: command(:resume, session_id, opts)

  @doc "Whether the session is paused."
  @spec paused?(String.t()) :: boolean()
  def paused?(session_id) when is_binary(session_id) do
    :ets.member(@paused, session_id)
  rescue
    # The table is missing only while HITL is not running: nothing is paused then.
    ArgumentError -> false
  end

  @doc "The pause in force for a session, or nil."
  @spec pause_of(String.t()) :: audit_entry() | nil
  def pause_of(session_id) do
    case :ets.lookup(@paused, session_id) do
      [{_, entry}] -> entry
      [] -> nil
    end
  end

  @doc "Every paused session's pause entry."
  @spec paused_sessions() :: [audit_entry()]
  def paused_sessions, do: for({_, entry} <- :ets.tab2list(@paused), do: entry)

  @doc "The audit log, newest first; `:session_id` filters, `:limit` caps (default 100)."
  @spec audit_log(keyword()) :: [audit_entry()]
  def audit_log(opts \\ []) do
    limit = Keyword.get(opts, :limit, 100)
    session = Keyword.get(opts, :session_id)

    @audit
    |> :ets.tab2list()
    |> Enum.sort_by(fn {seq, _} -> -seq end)
    |> Stream.map(fn {_, entry} -> entry end)
    |> Stream.filter(&(session == nil or &1.session_id == session))
    |> Enum.take(limit)
  end

  defp command(action, session_id, opts) do
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

  @impl true
  def init(_opts) do
    :ets.new(@paused, [:named_table, :protected, read_concurrency: true])
    :ets.new(@audit, [:named_table, :protected, :ordered_set])
    {:ok, %{seq: 0}}
  end

  @impl true
  def handle_call({:pause, session_id, operator, reason}, _from, state) do
    if :ets.member(@paused, session_id) do
      {:reply, {:error, :already_paused}, state}
    else
      entry = entry(:pause, session_id, operator, reason)
      :ets.insert(@paused, {session_id, entry})
      {:reply, {:ok, entry}, audit(entry, state)}
    end
  end

  def handle_call({:resume, session_id, operator, reason}, _from, state) do
    if :ets.member(@paused, session_id) do
      entry = entry(:resume, session_id, operator, reason)
      :ets.delete(@paused, session_id)
      {:reply, {:ok, entry}, audit(entry, state)}
    else
      {:reply, {:error, :not_paused}, state}
    end
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

  defp audit(entry, %{seq: seq} = state) do
    seq = seq + 1
    :ets.insert(@audit, {seq, entry})
    if seq > @max_audit, do: :ets.delete(@audit, seq - @max_audit)

    Logger.info(
      "hitl #{entry.action} session=#{inspect(entry.session_id)} operator=#{inspect(entry.operator)} reason=#{inspect(entry.reason)}"
    )

    Events.broadcast(topic(), Map.put(entry, :event_type, "hitl_#{entry.action}"))

    Observatory.Telemetry.execute(
      [:observatory, :hitl, entry.action],
      %{system_time: System.system_time()},
      Map.take(entry, [:session_id, :operator, :reason])
    )

    {agent_id, state_name} = node_state(entry)
    Topology.broadcast(entry.session_id, agent_id, state_name, force: true)
    %{state | seq: seq}
  end

  # A resumed node shows its entropy state again: a session still looping flashes
  # red at once rather than showing `active` until its next step.
  defp node_state(%{action: :pause}), do: {nil, "paused"}

  defp node_state(%{action: :resume, session_id: session_id}) do
    case EntropyTracker.session(session_id) do
      %{severity: :loop, agent_id: agent_id} -> {agent_id, "alert_entropy"}
      %{severity: :warning, agent_id: agent_id} -> {agent_id, "blocked"}
      %{agent_id: agent_id} -> {agent_id, "active"}
      nil -> {nil, "active"}
    end
  end
end
