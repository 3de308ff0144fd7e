defmodule Observatory.Budget.Store do
  @moduledoc """
  Where budgets count: Mnesia tables with `disc_copies` on every member, so a
  session's spend survives a restart and an agent's requests count against one window
  whichever gateway of a cluster they reach.

    * `:observatory_budget_counters` — integer counters, one per key, changed with
      `:mnesia.dirty_update_counter/3` (an increment, applied on every replica in any
      order): per session `{:s, session_id, field}`, per agent `{:a, agent_id, field}`
      (since the agent was registered or reset), and the agent's rolling window as 60
      buckets of `window_seconds / 60` each, `{:w, agent_id, bucket_seconds, index, field}`.
    * `:observatory_budget_sessions` — per session: its agent, when it started, and
      when its first loop alarm fell with what it had spent by then.
    * `:observatory_budget_marks` — the limits a session or an agent is past, so that
      each stop is recorded and alerted once, not on every refused request.

  Counters are dirty writes: no transaction, no wait for the disk (Mnesia's log is
  flushed within a second). A crash may lose the last second of counts; a partition's
  two sides count apart, and when it heals the winning side's count of a key both
  counted is kept (`Observatory.Cluster.Merge`: another table's rule). Idle sessions are swept after `:session_ttl_ms` (7 days), and past
  `:max_sessions` (100,000) the least recently used go first.
  """

  alias Observatory.Budget.Usage

  @counters :observatory_budget_counters
  @sessions :observatory_budget_sessions
  @marks :observatory_budget_marks
  @buckets 60

  @session_fields [:requests, :input, :cached, :cache_write, :output, :cost, :unpriced]
  @window_fields [:requests, :tokens, :cost]

  @type spend :: %{
          requests: non_neg_integer(),
          input: non_neg_integer(),
          cached: non_neg_integer(),
          cache_write: non_neg_integer(),
          output: non_neg_integer(),
          cost: non_neg_integer(),
          unpriced: non_neg_integer()
        }

  @doc false
  # The durable tables (cleared by Observatory.Testing.reset!/0).
  def tables, do: [@counters, @sessions, @marks]

  @doc false
  # Called by Observatory.Storage before anything counts; returns the tables.
  def create_tables do
    # Ordered: an agent's window buckets are one range of keys, read with one select.
    Observatory.Storage.create_table(@counters, attributes: [:key, :value], type: :ordered_set)
    Observatory.Storage.create_table(@sessions, attributes: [:session_id, :meta], type: :set)
    Observatory.Storage.create_table(@marks, attributes: [:key, :mark], type: :set)
    [@counters, @sessions, @marks]
  end

  @doc "How many buckets a rolling window has."
  def buckets, do: @buckets

  ## Counting

  @doc "Counts one request of `agent_id` in `session_id`, at `now_s` (Unix seconds)."
  @spec count_request(String.t(), String.t(), pos_integer(), integer()) :: :ok
  def count_request(agent_id, session_id, window_seconds, now_s) do
    touch(agent_id, session_id, now_s)
    bump({:s, session_id, :requests}, 1)
    bump({:a, agent_id, :requests}, 1)
    bump(bucket(agent_id, window_seconds, now_s, :requests), 1)
    :ok
  end

  @doc """
  Adds an answer's tokens and cost (nano-USD; nil when the model has no price, which
  counts the answer as `unpriced`).
  """
  @spec add_usage(
          String.t(),
          String.t(),
          Usage.t(),
          non_neg_integer() | nil,
          pos_integer(),
          integer()
        ) ::
          :ok
  def add_usage(agent_id, session_id, usage, cost, window_seconds, now_s) do
    for {field, n} <- [
          input: usage.input,
          cached: usage.cached,
          cache_write: usage.cache_write,
          output: usage.output
        ],
        n > 0 do
      bump({:s, session_id, field}, n)
      bump({:a, agent_id, field}, n)
    end

    tokens = Usage.tokens(usage)
    if tokens > 0, do: bump(bucket(agent_id, window_seconds, now_s, :tokens), tokens)

    case cost do
      nil ->
        bump({:s, session_id, :unpriced}, 1)
        bump({:a, agent_id, :unpriced}, 1)

      0 ->
        :ok

      cost ->
        bump({:s, session_id, :cost}, cost)
        bump({:a, agent_id, :cost}, cost)
        bump(bucket(agent_id, window_seconds, now_s, :cost), cost)
    end

    :ok
  end

  ## Reading

  @doc "What the session has spent; zeros for a session never counted."
  @spec session(String.t()) :: spend()
  def session(session_id), do: Map.new(@session_fields, &{&1, read({:s, session_id, &1})})

  @doc "What the agent has spent since it was registered (or reset)."
  @spec agent(String.t()) :: spend()
  def agent(agent_id), do: Map.new(@session_fields, &{&1, read({:a, agent_id, &1})})

  @doc """
  What the agent spent within its rolling window of `window_seconds` ending at
  `now_s`: `%{requests, tokens, cost}` (`fields` of them). One select over the range
  of the agent's buckets (the table is ordered by key).
  """
  @spec window(String.t(), pos_integer(), integer(), [atom()]) :: map()
  def window(agent_id, window_seconds, now_s, fields \\ @window_fields) do
    size = bucket_seconds(window_seconds)
    oldest = div(now_s, size) - @buckets + 1

    spec = [
      {{@counters, {:w, agent_id, size, :"$1", :"$2"}, :"$3"}, [{:>=, :"$1", oldest}],
       [{{:"$2", :"$3"}}]}
    ]

    sums =
      Enum.reduce(:mnesia.dirty_select(@counters, spec), %{}, fn {field, n}, acc ->
        Map.update(acc, field, n, &(&1 + n))
      end)

    Map.new(fields, &{&1, Map.get(sums, &1, 0)})
  end

  @doc "The session's record (agent, start, loop mark), or nil."
  @spec session_meta(String.t()) :: map() | nil
  def session_meta(session_id) do
    case :mnesia.dirty_read(@sessions, session_id) do
      [{@sessions, _, meta}] -> meta
      [] -> nil
    end
  end

  @doc "The sessions counted for `agent_id`, most recently active first, at most `limit`."
  @spec agent_sessions(String.t(), pos_integer()) :: [{String.t(), map()}]
  def agent_sessions(agent_id, limit) do
    @sessions
    |> :mnesia.dirty_select([
      {{@sessions, :"$1", :"$2"}, [{:==, {:map_get, :agent_id, :"$2"}, agent_id}],
       [{{:"$1", :"$2"}}]}
    ])
    |> Enum.map(fn {id, meta} -> {id, Map.put(meta, :last_at, read({:s, id, :last_at}))} end)
    |> Enum.sort_by(fn {_id, meta} -> -meta.last_at end)
    |> Enum.take(limit)
  end

  ## The loop mark

  @doc """
  Marks the session's first loop alarm: when, and what it had spent by then (once;
  later alarms change nothing). `false` when the session has no spend counted.
  """
  @spec mark_loop(String.t(), DateTime.t()) :: boolean()
  def mark_loop(session_id, at) do
    {:atomic, marked?} =
      :mnesia.transaction(fn ->
        case :mnesia.read(@sessions, session_id, :write) do
          [{@sessions, _, %{loop_at: nil} = meta}] ->
            :mnesia.write(
              {@sessions, session_id, %{meta | loop_at: at, loop_spent: session(session_id)}}
            )

            true

          _ ->
            false
        end
      end)

    marked?
  end

  ## Marks: the limits a scope is past

  @doc "The mark of `scope` (`{:session, id}` or `{:window, agent_id}`), or nil."
  @spec mark(tuple()) :: map() | nil
  def mark(scope) do
    case :mnesia.dirty_read(@marks, scope) do
      [{@marks, _, mark}] -> mark
      [] -> nil
    end
  end

  @doc "Sets the mark unless one is set; true when this call set it (the stop is new)."
  @spec put_mark(tuple(), map()) :: boolean()
  def put_mark(scope, mark) do
    {:atomic, new?} =
      :mnesia.transaction(fn ->
        case :mnesia.read(@marks, scope, :write) do
          [] -> :mnesia.write({@marks, scope, mark}) == :ok
          _ -> false
        end
      end)

    new?
  end

  @doc "Removes the mark; true when there was one."
  @spec clear_mark(tuple()) :: boolean()
  def clear_mark(scope) do
    {:atomic, had?} =
      :mnesia.transaction(fn ->
        had? = :mnesia.read(@marks, scope, :write) != []
        if had?, do: :mnesia.delete({@marks, scope})
        had?
      end)

    had?
  end

  ## Resets and sweeps

  @doc "Forgets what the session spent, and its loop mark (not its stop mark: `clear_mark/1`)."
  @spec reset_session(String.t()) :: :ok
  def reset_session(session_id) do
    for field <- @session_fields, do: :mnesia.dirty_delete(@counters, {:s, session_id, field})

    case session_meta(session_id) do
      nil ->
        :ok

      meta ->
        :mnesia.dirty_write({@sessions, session_id, %{meta | loop_at: nil, loop_spent: nil}})
    end

    :ok
  end

  @doc "Empties the agent's rolling window (not its stop mark: `clear_mark/1`)."
  @spec reset_window(String.t()) :: :ok
  def reset_window(agent_id) do
    keys =
      :mnesia.dirty_select(@counters, [
        {{@counters, {:w, agent_id, :_, :_, :_}, :_}, [], [{:element, 2, :"$_"}]}
      ])

    for key <- keys, do: :mnesia.dirty_delete(@counters, key)
    :ok
  end

  @doc "Forgets everything counted for the agent: its totals, window, sessions and marks."
  @spec delete_agent(String.t()) :: :ok
  def delete_agent(agent_id) do
    reset_window(agent_id)
    :mnesia.dirty_delete(@marks, {:window, agent_id})
    for field <- @session_fields, do: :mnesia.dirty_delete(@counters, {:a, agent_id, field})
    for {id, _meta} <- agent_sessions(agent_id, 1_000_000), do: delete_session(id)
    :ok
  end

  @doc """
  Deletes buckets older than their window, sessions idle for more than `ttl_ms` and,
  past `max_sessions`, the least recently active. Returns how many sessions went.
  """
  @spec sweep(integer(), pos_integer(), pos_integer()) :: non_neg_integer()
  def sweep(now_s, ttl_ms, max_sessions) do
    old_buckets =
      :mnesia.dirty_select(@counters, [
        {{@counters, {:w, :_, :"$1", :"$2", :_}, :_}, [],
         [{{{:element, 2, :"$_"}, :"$1", :"$2"}}]}
      ])

    for {key, size, index} <- old_buckets, index <= div(now_s, size) - @buckets do
      :mnesia.dirty_delete(@counters, key)
    end

    sessions =
      for {id, _meta} <-
            :mnesia.dirty_select(@sessions, [{{@sessions, :"$1", :"$2"}, [], [{{:"$1", :"$2"}}]}]),
          do: {id, read({:s, id, :last_at})}

    idle_before = now_s - div(ttl_ms, 1000)
    {idle, live} = Enum.split_with(sessions, fn {_id, last} -> last < idle_before end)
    over = max(length(live) - max_sessions, 0)
    crowded = live |> Enum.sort_by(&elem(&1, 1)) |> Enum.take(over)
    gone = idle ++ crowded
    for {id, _} <- gone, do: delete_session(id)
    length(gone)
  end

  defp delete_session(session_id) do
    for field <- [:last_at | @session_fields],
        do: :mnesia.dirty_delete(@counters, {:s, session_id, field})

    :mnesia.dirty_delete(@sessions, session_id)
    :mnesia.dirty_delete(@marks, {:session, session_id})
  end

  ## Internals

  defp touch(agent_id, session_id, now_s) do
    if :mnesia.dirty_read(@sessions, session_id) == [] do
      meta = %{agent_id: agent_id, started_at: now_s, loop_at: nil, loop_spent: nil}
      :mnesia.dirty_write({@sessions, session_id, meta})
    end

    :mnesia.dirty_write({@counters, {:s, session_id, :last_at}, now_s})
  end

  defp bucket(agent_id, window_seconds, now_s, field) do
    size = bucket_seconds(window_seconds)
    {:w, agent_id, size, div(now_s, size), field}
  end

  defp bucket_seconds(window_seconds), do: max(div(window_seconds + @buckets - 1, @buckets), 1)

  defp bump(key, n), do: :mnesia.dirty_update_counter(@counters, key, n)

  defp read(key) do
    case :mnesia.dirty_read(@counters, key) do
      [{@counters, _, n}] -> n
      [] -> 0
    end
  end
end
