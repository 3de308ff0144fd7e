defmodule Observatory.Gateway.SessionOwners do
  @moduledoc """
  Which agent owns each session, kept apart from the detectors' windows so that no
  eviction elsewhere can hand a session to another agent.

  The first agent whose step opens a session owns it; the gateway refuses every
  other agent's steps in it (`403`) for as long as the owner is remembered. Before,
  ownership was the entropy window's agent: an agent that wrote as many sessions of
  its own as the tracker holds got the victim's window evicted, and then its id.

  Ownership is bounded **per agent**, so only an agent's own activity ever makes the
  gateway forget one of its sessions:

    * an agent owns at most `:max_sessions_per_agent` sessions (default 10,000); a
      new one past the quota makes it give up its own least recently used session
      (used to the minute: sessions used within the same minute may go in either
      order), whose windows are dropped too (`claim/2` returns it), so one agent can
      neither grow memory nor crowd other agents' windows out of the stores;
    * a session with no step for `:session_owner_ttl_ms` (default 24 h, well past the
      detectors' idle TTL) is forgotten by the periodic sweep.

  ## API

  `claim/2` on every accepted step, `owner/1` for reads; both run in the caller
  (ETS), this process only owns the tables and sweeps them. In a cluster each
  session is claimed on its owner node (`Observatory.Cluster.owner/1`), where its
  step is scored: ask that node (`Observatory.Cluster.call_owner/4`), as
  `ObservatoryWeb.Auth.session_owner/1` does.

  ## Failover

  A new claim is also sent, asynchronously, to the node the session fails over to
  (`Observatory.Gateway.SessionOwners.Failover`), which records it with `adopt/3`
  unless it holds a claim for the session already (the first claim wins, never
  overwritten). So when the owner node is lost, the next owner already knows whose
  session it is. A claim held on another agent's behalf counts against that agent's
  quota here, and expires with the owner's (it carries how long the session has been
  idle).

  The tables live as long as this process: a restart forgets ownership, like the
  windows it guards (in a cluster the other nodes send it back, as above).
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.SessionOwners.Failover

  # {session_id, agent_id, last_seen_ms, keyed_at_ms, seq}: the session's LRU key is
  # {agent_id, {keyed_at_ms, seq}}, kept flat so that a step's lookup copies out no
  # nested terms and not the agent's id twice (~78 ns a lookup nested, ~64 flat)
  @owners __MODULE__.Owners
  # ordered_set: {lru_key, session_id}, lru_key = {agent_id, {keyed_at_ms, seq}} — each
  # agent's sessions, least recent first
  @lru __MODULE__.LRU
  # {agent_id, sessions owned}
  @counts __MODULE__.Counts

  @default_quota 10_000
  @default_ttl_ms :timer.hours(24)

  # A session's place in its agent's LRU order is moved at most once a minute: moving
  # it (an atomic swap of the row, an insert and a delete in the ordered LRU table)
  # costs ~2 µs, and agents send a session's steps seconds apart. Its last-seen time,
  # which the TTL and failover go by, is kept to the second with one cheap update.
  @lru_precision_ms 60_000

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  Claims `session_id` for `agent_id`, or touches it when the agent owns it already.

  `{:ok, released}` with the agent's own sessions it gave up to stay within its
  quota (their windows should be dropped), or `{:error, {:owned_by, other}}`.

  `now` is this node's `System.monotonic_time(:millisecond)`, for a caller that has
  read the clock for the same step already (the ingest has: a clock read costs about
  as much as the claim's lookup).
  """
  @spec claim(String.t(), String.t(), integer()) ::
          {:ok, [String.t()]} | {:error, {:owned_by, String.t()}}
  def claim(session_id, agent_id, now \\ now_ms())
      when is_binary(session_id) and is_binary(agent_id) and is_integer(now) do
    case :ets.lookup(@owners, session_id) do
      # Seen within the last second: recent enough for the LRU order and the TTL.
      [{_, ^agent_id, seen, _, _}] when now - seen < 1_000 ->
        {:ok, []}

      # Its LRU place moved within the last minute: only the last-seen time moves.
      [{_, ^agent_id, _, keyed, _}] when now - keyed < @lru_precision_ms ->
        :ets.update_element(@owners, session_id, {3, now})
        {:ok, []}

      [{_, ^agent_id, _, _, _} = row] ->
        touch(row, now)
        {:ok, []}

      [{_, other, _, _, _}] ->
        {:error, {:owned_by, other}}

      [] ->
        open(session_id, agent_id, now)
    end
  end

  @doc """
  Records a claim another node holds (`Failover`), as `claim/2` would but never
  against an existing one: the first claim wins.

    * `:added` — no claim here: now `agent_id`'s, last seen `idle_ms` ago;
    * `:kept` — `agent_id`'s already (its last step moved up to the sender's, if later);
    * `{:owned_by, other}` — another agent's claim here, left as it is;
    * `:skipped` — idle for the TTL already, or the agent owns its quota here (a
      claim from elsewhere never makes an agent give up one of its sessions).
  """
  @spec adopt(String.t(), String.t(), non_neg_integer()) ::
          :added | :kept | :skipped | {:owned_by, String.t()}
  def adopt(session_id, agent_id, idle_ms)
      when is_binary(session_id) and is_binary(agent_id) and is_integer(idle_ms) and idle_ms >= 0 do
    now = now_ms()
    seen = now - idle_ms
    %{max_sessions_per_agent: quota, ttl_ms: ttl} = settings()

    case :ets.lookup(@owners, session_id) do
      [{_, ^agent_id, last, _, _}] when last >= seen ->
        :kept

      [{_, ^agent_id, _, _, _} = row] ->
        touch(row, seen)
        :kept

      [{_, other, _, _, _}] ->
        {:owned_by, other}

      [] ->
        cond do
          idle_ms >= ttl -> :skipped
          count(agent_id) >= quota -> :skipped
          insert(session_id, agent_id, seen) -> :added
          # Claimed here meanwhile: judge again against that claim.
          true -> adopt(session_id, agent_id, idle_ms)
        end
    end
  end

  @doc false
  # Every claim held, as `{session_id, agent_id, idle_ms}`, handed to `fun` `size` at a
  # time (`Failover` sends them to other nodes).
  def each_chunk(size, fun) do
    now = now_ms()
    spec = [{{:"$1", :"$2", :"$3", :_, :_}, [], [{{:"$1", :"$2", {:-, now, :"$3"}}}]}]
    # Fixed: a traversal that writers change meanwhile sees each row at most once.
    :ets.safe_fixtable(@owners, true)

    try do
      each_chunk_from(:ets.select(@owners, spec, size), fun)
    after
      :ets.safe_fixtable(@owners, false)
    end
  end

  defp each_chunk_from(:"$end_of_table", _fun), do: :ok

  defp each_chunk_from({chunk, continuation}, fun) do
    fun.(chunk)
    each_chunk_from(:ets.select(continuation), fun)
  end

  @doc "The agent that owns `session_id`, or nil."
  @spec owner(String.t()) :: String.t() | nil
  def owner(session_id) when is_binary(session_id) do
    case :ets.lookup(@owners, session_id) do
      [{_, agent_id, _, _, _}] -> agent_id
      [] -> nil
    end
  end

  @doc "How many sessions `agent_id` owns."
  @spec count(String.t()) :: non_neg_integer()
  def count(agent_id) do
    case :ets.lookup(@counts, agent_id) do
      [{_, n}] -> n
      [] -> 0
    end
  end

  @doc "Sessions remembered, all agents together."
  @spec size() :: non_neg_integer()
  def size, do: :ets.info(@owners, :size)

  @doc "The quota and the TTL in force."
  @spec settings() :: %{max_sessions_per_agent: pos_integer(), ttl_ms: pos_integer()}
  def settings do
    %{
      max_sessions_per_agent:
        Application.get_env(:observatory, :max_sessions_per_agent, @default_quota),
      ttl_ms: Application.get_env(:observatory, :session_owner_ttl_ms, @default_ttl_ms)
    }
  end

  @doc "Forgets sessions idle for the TTL now (the periodic sweep does it too)."
  @spec sweep() :: non_neg_integer()
  def sweep, do: GenServer.call(__MODULE__, :sweep)

  ## Claiming

  defp touch({session_id, agent_id, _seen, keyed, seq} = row, now) do
    {_, {_, new_seq}} = new_key = lru_key(agent_id, now)
    new_row = {session_id, agent_id, now, now, new_seq}

    # Only the writer that replaces the row it read moves the LRU entry.
    if :ets.select_replace(@owners, [{row, [], [{:const, new_row}]}]) == 1 do
      :ets.insert(@lru, {new_key, session_id})
      :ets.delete(@lru, {agent_id, {keyed, seq}})
    end
  end

  defp open(session_id, agent_id, now) do
    if owned = insert(session_id, agent_id, now) do
      Failover.claimed(session_id, agent_id)
      quota = settings().max_sessions_per_agent
      {:ok, release_oldest(agent_id, owned - quota, [])}
    else
      # Another step opened it first: judge again against its owner.
      claim(session_id, agent_id, now)
    end
  end

  # A new row, unless the session has one already: the agent's sessions then, or nil.
  defp insert(session_id, agent_id, seen) do
    {_, {_, seq}} = key = lru_key(agent_id, seen)

    if :ets.insert_new(@owners, {session_id, agent_id, seen, seen, seq}) do
      :ets.insert(@lru, {key, session_id})
      :ets.update_counter(@counts, agent_id, 1, {agent_id, 0})
    end
  end

  # Sorted by the time it was made, then made unique.
  defp lru_key(agent_id, at_ms),
    do: {agent_id, {at_ms, System.unique_integer([:monotonic, :positive])}}

  # Gives up the agent's `n` least recently used sessions.
  defp release_oldest(_agent_id, n, released) when n <= 0, do: released

  defp release_oldest(agent_id, n, released) do
    case oldest(agent_id) do
      nil ->
        released

      {key, session_id} ->
        if forget(session_id, agent_id, key),
          do: release_oldest(agent_id, n - 1, [session_id | released]),
          else: release_oldest(agent_id, n, released)
    end
  end

  # The agent's least recently used session: its smallest LRU key (a number sorts
  # before every tuple, so `{agent_id, 0}` sorts just before all of them).
  defp oldest(agent_id) do
    with {^agent_id, _} = key <- :ets.next(@lru, {agent_id, 0}),
         [{^key, session_id}] <- :ets.lookup(@lru, key) do
      {key, session_id}
    else
      {_other_agent, _} -> nil
      :"$end_of_table" -> nil
      # Taken by a concurrent writer between the two reads: look again.
      [] -> oldest(agent_id)
    end
  end

  # Drops the session if it is still the agent's, under this LRU key.
  defp forget(session_id, agent_id, {_, {keyed, seq}} = key) do
    :ets.delete(@lru, key)

    case :ets.select_delete(@owners, [{{session_id, agent_id, :_, keyed, seq}, [], [true]}]) do
      1 ->
        :ets.update_counter(@counts, agent_id, -1, {agent_id, 0})
        true

      0 ->
        false
    end
  end

  ## The owner of the tables

  @impl true
  def init(_opts) do
    # Read on every step, written at most once a second per session (so on most
    # steps of a fleet whose agents think for seconds): one plain table lock.
    # `write_concurrency` (or `read_concurrency`) makes every lookup take a
    # frequent-read table lock too, a memory fence (~45 ns of a lookup's ~80-125);
    # each write is one short single-row update, so at a gateway's step rates the
    # table lock is held a tiny fraction of the time.
    :ets.new(@owners, [:named_table, :public, :set])

    :ets.new(@lru, [:named_table, :public, :ordered_set, write_concurrency: true])
    :ets.new(@counts, [:named_table, :public, :set, write_concurrency: true])
    schedule_sweep()
    {:ok, nil}
  end

  @impl true
  def handle_call(:sweep, _from, state), do: {:reply, sweep_idle(), state}

  @impl true
  def handle_info(:sweep, state) do
    sweep_idle()
    schedule_sweep()
    {:noreply, state}
  end

  def handle_info(message, state) do
    Logger.debug("SessionOwners ignored #{inspect(message)}")
    {:noreply, state}
  end

  defp sweep_idle do
    cutoff = now_ms() - settings().ttl_ms
    forget_idle(idle_since(cutoff), cutoff)
  end

  @doc false
  # The sessions last seen before `cutoff`, as `{session_id, agent_id, lru_key}`.
  def idle_since(cutoff) do
    :ets.select(@owners, [
      {{:"$1", :"$2", :"$3", :"$4", :"$5"}, [{:<, :"$3", cutoff}],
       [{{:"$1", :"$2", {{:"$2", {{:"$4", :"$5"}}}}}}]}
    ])
  end

  @doc false
  # Forgets each of `idle` that is still idle since `cutoff`: a step that came after
  # the sweep chose it (within the minute only its last-seen time moves, not its LRU
  # key) keeps it. Returns how many were forgotten.
  def forget_idle(idle, cutoff) do
    Enum.count(idle, fn {session_id, agent_id, {_, {keyed, seq}} = key} ->
      spec = [{{session_id, agent_id, :"$1", keyed, seq}, [{:<, :"$1", cutoff}], [true]}]

      if :ets.select_delete(@owners, spec) == 1 do
        :ets.delete(@lru, key)
        :ets.update_counter(@counts, agent_id, -1, {agent_id, 0})
        true
      end
    end)
  end

  defp schedule_sweep do
    interval = min(settings().ttl_ms, :timer.minutes(10))
    Process.send_after(self(), :sweep, interval)
  end

  # The same clock as `System.monotonic_time(:millisecond)`, without its unit's
  # normalization (~60 ns of a claim's ~300).
  defp now_ms, do: :erlang.monotonic_time(:millisecond)
end
