defmodule ObservatoryWeb.API.SessionList do
  @moduledoc """
  `GET /api/v1/sessions` (operator token): the sessions the gateway holds, newest
  activity first, a page at a time — "which sessions are looping now?" for a script
  or an on-call bot.

      GET /api/v1/sessions?state=alert&limit=50
      {"sessions": [{"session_id": "sess-7", "agent_id": "agent-7", "state": "alert",
                     "alerted": true, "entropy_score": 0.2, "severity": "loop",
                     "verdict": "loop", "rule": "repeat", "paused": false, "blocked": false,
                     "last_step_at": "2026-02-22T10:30:04.120Z", "steps": 7,
                     "node": "obs@10.0.0.1"}, ...],
       "next_cursor": "MTc3…"}

  ## Parameters

  | parameter | values |
  |---|---|
  | `state` | `alert`, `warning`, `paused`, `active`, `idle` (the dashboard's words) |
  | `severity` | `loop`, `warning`, `normal` (the entropy ratio's) |
  | `verdict` | `progress`, `suspect`, `loop` (the loop verdict's) |
  | `agent_id` | one agent's sessions |
  | `limit` | 1..#{200}, default 50 |
  | `cursor` | the previous page's `next_cursor` |

  A bad value is a `400` naming the parameter and the values it takes. `next_cursor`
  is null on the last page. The cursor is the last row's activity time and session
  id: a session that sends a step between two pages moves to the front and is not
  listed twice.

  ## Where the rows come from

  Each member of a cluster lists the sessions it owns (`rows_here/3`): the entropy
  tracker's most recently seen #{10_000} (`:session_list_scan`), and the paused
  sessions it no longer holds. A row's `state` is what the dashboard shows: `paused`
  while paused, else the alert source's level (`alert`, `warning`), else `active` (a
  step in the last 30 s) or `idle`. `alerted` says whether the session is in the
  alert list (`Observatory.Gateway.Alerts`); `blocked` whether the step detector
  blocked it.
  """

  alias Observatory.Cluster
  alias Observatory.Gateway.{Alerts, AlertSource, EntropyTracker, HITL, LoopVerdict, SessionLog}
  alias Observatory.Gateway.StepDetector
  alias ObservatoryWeb.{Auth, Conn}
  alias ObservatoryWeb.SessionClusterManager.{Fleet, View}

  @max_limit 200
  @default_limit 50
  @states ~w(alert warning paused active idle)
  @filters %{
    "state" => @states,
    "severity" => ~w(loop warning normal),
    "verdict" => ~w(progress suspect loop)
  }

  @doc "GET /api/v1/sessions"
  def index(conn) do
    with {:ok, _operator} <- Auth.require_operator(conn),
         {:ok, query} <- parse(conn) do
      rows =
        Cluster.gather(__MODULE__, :rows_here, [query.filters, query.cursor, query.limit + 1])
        |> Enum.sort_by(&sort_key/1, :desc)
        |> Enum.uniq_by(& &1.session_id)

      page = Enum.take(rows, query.limit)

      next =
        if length(rows) > query.limit,
          do: page |> List.last() |> encode_cursor()

      Conn.json(conn, 200, %{sessions: Enum.map(page, &json/1), next_cursor: next})
    end
  end

  @doc false
  # Runs on every member: the sessions it owns that match, newest activity first,
  # after `cursor`, at most `limit`.
  def rows_here(filters, cursor, limit) do
    now = System.system_time(:millisecond)
    source = AlertSource.current()
    scan = Application.get_env(:observatory, :session_list_scan, 10_000)
    verdicts = Map.new(LoopVerdict.flagged(scan), &{&1.session_id, &1})
    pauses = Map.new(HITL.paused_sessions(), &{&1.session_id, &1})
    me = node()

    tracked =
      for s <- EntropyTracker.sessions(limit: scan), Cluster.owner(s.session_id) == me do
        base(s.session_id, s.agent_id, s.score, s.severity, s.idle_ms, now)
      end

    held = MapSet.new(tracked, & &1.session_id)

    # A paused session the tracker no longer holds is still listed (as the fleet does).
    evicted =
      for {id, _pause} <- pauses, not MapSet.member?(held, id), Cluster.owner(id) == me do
        base(id, nil, nil, nil, nil, now)
      end

    (tracked ++ evicted)
    |> Enum.map(&classify(&1, verdicts, pauses, source))
    |> Enum.filter(&matches?(&1, filters))
    |> Enum.filter(&after_cursor?(&1, cursor))
    |> Enum.sort_by(&sort_key/1, :desc)
    |> Enum.take(limit)
    |> Enum.map(&details/1)
  end

  defp base(id, agent_id, score, severity, idle_ms, now) do
    %{
      session_id: id,
      agent_id: agent_id,
      entropy_score: score,
      severity: severity,
      idle_ms: idle_ms,
      last_at: SessionLog.last_at(id) || (idle_ms && now - idle_ms) || 0
    }
  end

  defp classify(row, verdicts, pauses, source) do
    verdict = verdicts[row.session_id]
    level = if verdict, do: verdict.verdict, else: :progress
    paused = Map.has_key?(pauses, row.session_id)

    # The node state the alert source gives (Fleet.derive/2), in the dashboard's words.
    by_source =
      case source do
        :entropy -> row.severity
        :verdict -> %{loop: :loop, suspect: :warning, progress: :normal}[level]
      end

    state =
      cond do
        paused -> "paused"
        row.idle_ms == nil -> "idle"
        true -> View.label(Fleet.derive(by_source, row.idle_ms))
      end

    Map.merge(row, %{state: state, paused: paused, verdict: level})
  end

  defp matches?(row, filters) do
    Enum.all?(filters, fn
      {"state", value} -> row.state == value
      {"severity", value} -> to_string(row.severity) == value
      {"verdict", value} -> to_string(row.verdict) == value
      {"agent_id", value} -> row.agent_id == value
    end)
  end

  defp after_cursor?(_row, nil), do: true
  defp after_cursor?(row, cursor), do: sort_key(row) < cursor

  defp sort_key(row), do: {row.last_at, row.session_id}

  # What only a page's rows need: the verdict's rule, the alert, the block, the count.
  defp details(row) do
    verdict = LoopVerdict.session(row.session_id)
    step = StepDetector.state(row.session_id)

    Map.merge(row, %{
      verdict: verdict && verdict.verdict,
      rule: verdict && verdict.rule,
      alerted: Alerts.get(row.session_id) != nil,
      blocked: match?(%{blocked: true}, step),
      steps: SessionLog.count(row.session_id),
      node: node()
    })
  end

  defp json(row) do
    %{
      session_id: row.session_id,
      agent_id: row.agent_id,
      state: row.state,
      alerted: row.alerted,
      entropy_score: row.entropy_score,
      severity: row.severity,
      verdict: row.verdict,
      rule: row.rule,
      paused: row.paused,
      blocked: row.blocked,
      last_step_at:
        if(row.last_at > 0,
          do: row.last_at |> DateTime.from_unix!(:millisecond) |> DateTime.to_iso8601()
        ),
      steps: row.steps,
      node: row.node
    }
  end

  ## The query

  defp parse(conn) do
    q = conn.query

    with {:ok, filters} <- filters(q),
         {:ok, limit} <- limit(q["limit"]),
         {:ok, cursor} <- decode_cursor(q["cursor"]) do
      {:ok, %{filters: filters, limit: limit, cursor: cursor}}
    else
      {:error, message} -> halt(Conn.error(conn, 400, "bad_request", message))
    end
  end

  defp filters(q) do
    Enum.reduce_while(["state", "severity", "verdict", "agent_id"], {:ok, []}, fn name,
                                                                                  {:ok, acc} ->
      case {q[name], @filters[name]} do
        {nil, _} ->
          {:cont, {:ok, acc}}

        {value, nil} ->
          {:cont, {:ok, [{name, value} | acc]}}

        {value, allowed} ->
          if value in allowed,
            do: {:cont, {:ok, [{name, value} | acc]}},
            else: {:halt, {:error, "#{name} must be one of #{Enum.join(allowed, ", ")}"}}
      end
    end)
  end

  defp limit(nil), do: {:ok, @default_limit}

  defp limit(text) do
    case Integer.parse(text) do
      {n, ""} when n in 1..@max_limit -> {:ok, n}
      _ -> {:error, "limit must be an integer from 1 to #{@max_limit}"}
    end
  end

  defp encode_cursor(row),
    do: Base.url_encode64("#{row.last_at}:#{row.session_id}", padding: false)

  defp decode_cursor(nil), do: {:ok, nil}

  defp decode_cursor(text) do
    with {:ok, raw} <- Base.url_decode64(text, padding: false),
         [at, id] <- String.split(raw, ":", parts: 2),
         {at, ""} <- Integer.parse(at) do
      {:ok, {at, id}}
    else
      _ -> {:error, "cursor is not one this API gave (use next_cursor as it is)"}
    end
  end

  defp halt(:ok), do: :halt
end
