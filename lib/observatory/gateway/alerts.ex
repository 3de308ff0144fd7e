defmodule Observatory.Gateway.Alerts do
  @moduledoc """
  The sessions alerted now: the gateway's answer to "which sessions are looping?",
  kept on the server so that every page, every tab and every API client sees the same
  list, on its first load as after a reload.

  A session is **alerted** while the configured alert source
  (`Observatory.Gateway.AlertSource`) calls its latest step a loop: an entropy LOOP
  (score below `:entropy_loop_threshold`, the default source, FRD-009) or a `loop`
  verdict (`:verdict`). Whoever sends the `EntropyAlertEvent` records it here —
  `EntropyTracker` for `:entropy`, `AlertSource` for `:verdict` — so a session is
  listed once (FR-9.10's dedup) however many alerts it sends, and leaves the list when
  its source stops calling it a loop.

      Alerts.list()
      #=> [%{session_id: "sess-7", agent_id: "agent-7", source: :verdict, rule: :repeat,
      #      reason: "the same call 3 times in a row, …", evidence: [4, 5, 6],
      #      since: ~U[…], last_at: ~U[…], alerts: 3, entropy_score: 0.4, node: :nonode@nohost, …}]

  Each change of state — a session entering the list, and leaving it — is logged once
  (`LOOP session=… agent=… rule=…`, at `:alert_log_level`, default `:info`; `false`
  turns the lines off) and broadcast on `"gateway:alerts"`:

      %{event_type: "alert_raised", session_id, agent_id, source, rule, reason, since}
      %{event_type: "alert_cleared", session_id, agent_id, source, why}

  ## Bounds

  A row goes with its session: when its source forgets the session (idle for
  `:entropy_session_ttl_ms`, or evicted over capacity) the next sweep drops the row.
  At most `:alerts_max_sessions` rows are kept (default 10,000; past it the least
  recently alerted go). In a cluster each session's row is on its owner
  (`Observatory.Cluster`), where its steps are scored; `list/1` is per node and the
  dashboard and the API gather every member's.

  Writers are the callers' own processes: one ETS write per alerted step, one lookup
  when a session leaves LOOP, nothing for the other steps. This process owns the
  table and sweeps it.
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{AlertSource, EntropyTracker, Events, IdleSweep, LoopVerdict}

  @table __MODULE__

  @type row :: %{
          session_id: String.t(),
          agent_id: String.t() | nil,
          source: AlertSource.t(),
          rule: atom(),
          reason: String.t(),
          evidence: [pos_integer()],
          entropy_score: float() | nil,
          pattern: %{intent: String.t(), tool_call: String.t(), action_status: String.t()} | nil,
          occurrence_count: pos_integer() | nil,
          window_size: pos_integer() | nil,
          since: DateTime.t(),
          last_at: DateTime.t(),
          alerts: pos_integer(),
          node: node()
        }

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The topic of alert state changes."
  def topic, do: "gateway:alerts"

  @doc """
  Records that the session's latest step alerted under `source`. `details` has the
  alert's `:rule`, `:reason` and, when known, `:evidence`, `:entropy_score`,
  `:pattern`, `:occurrence_count` and `:window_size`. The first alert of a session
  (not alerted before) is logged and broadcast as `alert_raised`; later ones update
  the row.
  """
  @spec alert(String.t(), String.t() | nil, AlertSource.t(), map()) :: :ok
  def alert(session_id, agent_id, source, details) when is_binary(session_id) do
    now = System.system_time(:millisecond)

    row =
      Map.merge(
        %{
          evidence: [],
          entropy_score: nil,
          pattern: nil,
          occurrence_count: nil,
          window_size: nil
        },
        Map.take(details, [
          :rule,
          :reason,
          :evidence,
          :entropy_score,
          :pattern,
          :occurrence_count,
          :window_size
        ])
      )
      |> Map.merge(%{session_id: session_id, agent_id: agent_id, source: source})

    # Orders rows alerted in the same millisecond.
    order = System.unique_integer([:monotonic])

    if :ets.insert_new(@table, {session_id, now, now, 1, row, order, order}) do
      raised(row, now)
    else
      case :ets.lookup(@table, session_id) do
        [{_, since, _, count, %{source: ^source}, raised_order, _}] ->
          :ets.insert(@table, {session_id, since, now, count + 1, row, raised_order, order})

        # Alerted under the other source (the setting changed): a new alert.
        [_] ->
          :ets.insert(@table, {session_id, now, now, 1, row, order, order})
          raised(row, now)

        [] ->
          :ets.insert(@table, {session_id, now, now, 1, row, order, order})
      end
    end

    :ok
  rescue
    # No table (the process is restarting): the next alerted step records it.
    ArgumentError -> :ok
  end

  @doc "Records that the session's latest step no longer alerts under `source`."
  @spec clear(String.t(), AlertSource.t(), String.t()) :: :ok
  def clear(session_id, source, why \\ "recovered") do
    case :ets.lookup(@table, session_id) do
      [{_, _, _, _, %{source: ^source} = row, _, _}] ->
        :ets.delete(@table, session_id)
        cleared(row, why)

      _ ->
        :ok
    end
  rescue
    ArgumentError -> :ok
  end

  @doc """
  The sessions alerted under the alert source in force, on this node, most recently
  raised first.

  ## Options
    * `:limit` — at most this many (default 500).
    * `:source` — under this source instead of the one in force.
  """
  @spec list(keyword()) :: [row()]
  def list(opts \\ []) do
    source = Keyword.get_lazy(opts, :source, &AlertSource.current/0)
    me = node()

    :ets.tab2list(@table)
    |> Enum.filter(fn {id, _, _, _, row, _, _} ->
      row.source == source and Observatory.Cluster.owner(id) == me
    end)
    |> Enum.sort_by(fn {_, _, _, _, _, raised_order, _} -> raised_order end, :desc)
    |> Enum.take(Keyword.get(opts, :limit, 500))
    |> Enum.map(&to_row/1)
  rescue
    ArgumentError -> []
  end

  @doc "The session's alert under the source in force, or nil."
  @spec get(String.t()) :: row() | nil
  def get(session_id) do
    source = AlertSource.current()

    case :ets.lookup(@table, session_id) do
      [{_, _, _, _, %{source: ^source}, _, _} = entry] -> to_row(entry)
      _ -> nil
    end
  rescue
    ArgumentError -> nil
  end

  @doc """
  The reason of an entropy alert, from its `EntropyAlertEvent` (FR-9.7 fields):

      "5 of the last 5 steps are search → read_file → failure (entropy 0.2)"
  """
  @spec entropy_reason(map()) :: String.t()
  def entropy_reason(%{repeated_pattern: p, occurrence_count: count, window_size: size} = event) do
    "#{count} of the last #{size} steps are #{p.intent} → #{p.tool_call} → " <>
      "#{p.action_status} (entropy #{event.entropy_score})"
  end

  @doc "Every member's alerted sessions, most recently raised first (one row per session)."
  @spec gather(keyword()) :: [row()]
  def gather(opts \\ []) do
    __MODULE__
    |> Observatory.Cluster.gather(:list, [opts])
    |> Enum.sort_by(&DateTime.to_unix(&1.last_at, :millisecond), :desc)
    |> Enum.uniq_by(& &1.session_id)
    |> Enum.sort_by(&DateTime.to_unix(&1.since, :millisecond), :desc)
  end

  defp to_row({_id, since, last_at, count, row, _raised_order, _last_order}) do
    Map.merge(row, %{
      since: DateTime.from_unix!(since, :millisecond),
      last_at: DateTime.from_unix!(last_at, :millisecond),
      alerts: count,
      node: node()
    })
  end

  defp raised(row, now) do
    log(
      "LOOP session=#{inspect(row.session_id)} agent=#{inspect(row.agent_id)} " <>
        "rule=#{row.rule} source=#{row.source}: #{row.reason}",
      row
    )

    Events.broadcast(topic(), %{
      event_type: "alert_raised",
      session_id: row.session_id,
      agent_id: row.agent_id,
      source: row.source,
      rule: row.rule,
      reason: row.reason,
      since: DateTime.from_unix!(now, :millisecond)
    })

    if :ets.info(@table, :size) > max_rows(), do: send(__MODULE__, :trim)
  end

  defp cleared(row, why) do
    log(
      "no longer alerted: session=#{inspect(row.session_id)} agent=#{inspect(row.agent_id)} " <>
        "source=#{row.source} (#{why})",
      row
    )

    Events.broadcast(topic(), %{
      event_type: "alert_cleared",
      session_id: row.session_id,
      agent_id: row.agent_id,
      source: row.source,
      why: why
    })
  end

  defp log(message, row) do
    case Application.get_env(:observatory, :alert_log_level, :info) do
      level when level in [:debug, :info, :notice, :warning, :error] ->
        Logger.log(level, message,
          event: :alert,
          session_id: row.session_id,
          agent_id: row.agent_id,
          rule: row.rule
        )

      _off ->
        :ok
    end
  end

  defp max_rows, do: Application.get_env(:observatory, :alerts_max_sessions, 10_000)

  ## Server

  @impl true
  def init(_opts) do
    :ets.new(@table, [
      :named_table,
      :public,
      :set,
      read_concurrency: true,
      write_concurrency: true
    ])

    IdleSweep.schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_info(:sweep, state) do
    sweep()
    IdleSweep.schedule()
    {:noreply, state}
  end

  def handle_info(:trim, state) do
    drain(:trim)
    size = :ets.info(@table, :size)

    if size > max_rows() do
      keep = div(max_rows() * 9, 10)

      victims =
        :ets.tab2list(@table)
        |> Enum.sort_by(fn {_, _, _, _, _, _, last_order} -> last_order end)
        |> Enum.take(size - keep)

      for {id, _, _, _, row, _, _} <- victims do
        :ets.delete(@table, id)
        cleared(row, "too many alerted sessions: the least recently alerted go")
      end

      Logger.warning(
        "#{size} sessions alerted, over :alerts_max_sessions (#{max_rows()}): " <>
          "dropped the #{length(victims)} least recently alerted"
      )
    end

    {:noreply, state}
  end

  def handle_info(msg, state) do
    Logger.debug("Alerts ignored an unexpected message: #{inspect(msg)}")
    {:noreply, state}
  end

  @doc false
  # Drops the rows of sessions their source no longer holds or idle past the TTL, and
  # those of a source no longer in force (nothing clears them any more).
  def sweep do
    cutoff = System.system_time(:millisecond) - IdleSweep.ttl_ms()
    source = AlertSource.current()

    for {id, _, last_at, _, row, _, _} <- :ets.tab2list(@table) do
      cond do
        row.source != source ->
          :ets.delete(@table, id)
          cleared(row, "the alert source is now #{source}")

        last_at < cutoff or not held?(id, row.source) ->
          :ets.delete(@table, id)
          cleared(row, "the session was evicted")

        true ->
          :ok
      end
    end

    :ok
  end

  defp held?(id, :entropy), do: EntropyTracker.session(id) != nil
  defp held?(id, :verdict), do: LoopVerdict.session(id) != nil

  defp drain(message) do
    receive do
      ^message -> drain(message)
    after
      0 -> :ok
    end
  end
end
