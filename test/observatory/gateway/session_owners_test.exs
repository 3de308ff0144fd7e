defmodule Observatory.Gateway.SessionOwnersTest do
  use Observatory.TrackerCase, async: false

  alias Observatory.Gateway.{Idempotency, LoopVerdict, SchemaInterceptor, SessionOwners}

  setup do
    restore_env_on_exit([:max_sessions_per_agent, :session_owner_ttl_ms, :idempotency])
    n = System.unique_integer([:positive])
    %{victim: "victim-#{n}", attacker: "attacker-#{n}"}
  end

  defp step(session_id, agent_id) do
    Observatory.JSON.encode!(%{
      "meta" => %{
        "step_id" => "s-#{System.unique_integer([:positive])}",
        "session_id" => session_id,
        "agent_id" => agent_id,
        "timestamp" => "2026-02-22T10:30:00Z"
      },
      "cognition" => %{"intent" => "read"},
      "action" => %{"tool_call" => "read_file", "status" => "success", "result" => "ok"}
    })
  end

  defp ingest(session_id, agent_id, opts),
    do: SchemaInterceptor.ingest(step(session_id, agent_id), [agent: agent_id] ++ opts)

  describe "finding 5: session takeover by eviction" do
    test "an agent that writes as many sessions as the tracker holds does not get the victim's",
         %{victim: victim, attacker: attacker} do
      tracker = :"tracker_#{attacker}"
      start_supervised!({EntropyTracker, name: tracker, max_sessions: 64})
      opts = [tracker: tracker]
      sid = unique_session("sess-victim")
      assert {:ok, _} = ingest(sid, victim, opts)

      for n <- 1..200, do: {:ok, _} = ingest("#{attacker}-own-#{n}", attacker, opts)
      # The attack worked on the tracker: the victim's window is gone...
      assert EntropyTracker.session(sid, tracker: tracker) == nil

      # ...and yet its session is still the victim's.
      assert {:error, {:forbidden, %{path: "meta.session_id"}}} = ingest(sid, attacker, opts)
      assert {:ok, _} = ingest(sid, victim, opts)
      assert SessionOwners.owner(sid) == victim
      assert ObservatoryWeb.Auth.session_access(attacker, sid) == {:error, :forbidden}
    end
  end

  describe "finding 5: quotas per agent for sessions" do
    test "past its quota an agent gives up its own least recently used sessions, windows too",
         %{victim: victim, attacker: attacker} do
      Application.put_env(:observatory, :max_sessions_per_agent, 5)
      victims = for n <- 1..3, do: unique_session("sess-v#{n}")
      for sid <- victims, do: {:ok, _} = ingest(sid, victim, [])

      own = for n <- 1..8, do: "#{attacker}-q-#{n}"
      for sid <- own, do: {:ok, _} = ingest(sid, attacker, [])

      assert SessionOwners.count(attacker) == 5
      {released, kept} = Enum.split(own, 3)

      for sid <- released do
        assert SessionOwners.owner(sid) == nil
        assert EntropyTracker.session(sid) == nil
        assert LoopVerdict.session(sid) == nil
      end

      for sid <- kept, do: assert(SessionOwners.owner(sid) == attacker)
      # Nothing of another agent is given up.
      for sid <- victims, do: assert(SessionOwners.owner(sid) == victim)
      assert SessionOwners.count(victim) == 3
    end

    test "a session in use is not the least recently used one", %{attacker: attacker} do
      Application.put_env(:observatory, :max_sessions_per_agent, 2)
      assert {:ok, []} = SessionOwners.claim("#{attacker}-a", attacker)
      assert {:ok, []} = SessionOwners.claim("#{attacker}-b", attacker)
      # Touching `a` (more than a minute later, as the LRU order is kept to the minute)
      # makes `b` the oldest.
      age("#{attacker}-a", 120_000)
      assert {:ok, []} = SessionOwners.claim("#{attacker}-a", attacker)
      b = "#{attacker}-b"
      assert {:ok, [^b]} = SessionOwners.claim("#{attacker}-c", attacker)
    end

    test "each owner row names its session's LRU entry, through claims, moves, " <>
           "adoptions, quota releases and sweeps",
         %{attacker: agent} do
      Application.put_env(:observatory, :max_sessions_per_agent, 3)

      same = fn ->
        {lru, named} = lru_entries(agent)
        assert lru == named
        lru
      end

      for s <- ~w(a b c), do: assert({:ok, []} = SessionOwners.claim("#{agent}-#{s}", agent))
      assert length(same.()) == 3

      # Moved in the LRU order (its place more than a minute old).
      age("#{agent}-a", 120_000)
      before = same.()
      assert {:ok, []} = SessionOwners.claim("#{agent}-a", agent)
      assert same.() != before

      # Past the quota: `b`, now the oldest, is given up with its entry.
      b = "#{agent}-b"
      assert {:ok, [^b]} = SessionOwners.claim("#{agent}-d", agent)
      assert length(same.()) == 3

      # A claim from another node, for a session held here, made later: moved too.
      age("#{agent}-c", 120_000)
      assert SessionOwners.adopt("#{agent}-c", agent, 0) == :kept
      assert length(same.()) == 3

      # The sweep forgets an idle one, its entry with it.
      :ets.update_element(SessionOwners.Owners, "#{agent}-d", {3, now_ms() - 10_000})
      idle = Enum.filter(SessionOwners.idle_since(now_ms() - 5_000), &(elem(&1, 1) == agent))
      assert SessionOwners.forget_idle(idle, now_ms() - 5_000) == 1
      assert [_, _] = same.()
      assert SessionOwners.count(agent) == 2
    end

    test "a step within the minute moves the session's last-seen time, not its LRU place",
         %{attacker: attacker} do
      Application.put_env(:observatory, :max_sessions_per_agent, 2)
      {a, b} = {"#{attacker}-a1", "#{attacker}-b1"}
      assert {:ok, []} = SessionOwners.claim(a, attacker)
      assert {:ok, []} = SessionOwners.claim(b, attacker)
      [{^a, ^attacker, _, keyed, seq}] = :ets.lookup(SessionOwners.Owners, a)
      # Last seen 10 s ago, its LRU place made just now.
      :ets.update_element(SessionOwners.Owners, a, {3, now_ms() - 10_000})

      assert {:ok, []} = SessionOwners.claim(a, attacker)
      # The TTL and failover go by the time just set (to the second), the key is kept.
      assert [{^a, ^attacker, seen, ^keyed, ^seq}] = :ets.lookup(SessionOwners.Owners, a)
      assert now_ms() - seen < 1_000
      # So `a` is still the older of the two.
      assert {:ok, [^a]} = SessionOwners.claim("#{attacker}-c1", attacker)
    end
  end

  describe "findings 5 and 7: both per-agent quotas hold on one ingest path" do
    test "an agent flooding sessions and steps takes no session and flushes no remembered step",
         %{victim: victim, attacker: attacker} do
      Application.put_env(:observatory, :max_sessions_per_agent, 5)
      # Without the per-agent quota the flood would fill the store (100) and flush the
      # victim's steps.
      Observatory.configure(idempotency: [max_steps: 100, max_steps_per_agent: 20])
      sid = unique_session("sess-both")
      victim_steps = for _ <- 1..10, do: step(sid, victim)

      for body <- victim_steps,
          do: {:ok, %{replayed: false}} = SchemaInterceptor.ingest(body, agent: victim)

      # 300 distinct steps over 60 sessions of its own.
      for n <- 1..300, do: {:ok, _} = ingest("#{attacker}-flood-#{rem(n, 60)}", attacker, [])

      assert SessionOwners.count(attacker) == 5
      assert Idempotency.count({:agent, attacker}) == 20
      assert SessionOwners.owner(sid) == victim
      assert {:error, {:forbidden, _}} = ingest(sid, attacker, [])

      # Every retry of the victim's is still answered from memory, counted once.
      for body <- victim_steps,
          do: assert({:ok, %{replayed: true}} = SchemaInterceptor.ingest(body, agent: victim))
    end
  end

  describe "ownership's own lifetime" do
    test "it outlives a window evicted or expired, and is forgotten after its TTL",
         %{victim: victim} do
      sid = unique_session("sess-ttl")
      assert {:ok, []} = SessionOwners.claim(sid, victim)
      assert SessionOwners.claim(sid, "someone-else") == {:error, {:owned_by, victim}}

      Application.put_env(:observatory, :session_owner_ttl_ms, 60_000)
      SessionOwners.sweep()
      assert SessionOwners.owner(sid) == victim

      Application.put_env(:observatory, :session_owner_ttl_ms, 0)

      :ets.update_element(
        SessionOwners.Owners,
        sid,
        {3, System.monotonic_time(:millisecond) - 10_000}
      )

      assert SessionOwners.sweep() >= 1
      assert SessionOwners.owner(sid) == nil
      assert SessionOwners.count(victim) == 0
    end

    test "a step that lands after the sweep chose its session idle keeps the session",
         %{victim: victim} do
      sid = unique_session("sess-swept-late")
      assert {:ok, []} = SessionOwners.claim(sid, victim)
      # Idle for 10 s, its LRU key a few seconds old: the sweep with a 5 s TTL picks it.
      now = System.monotonic_time(:millisecond)
      :ets.update_element(SessionOwners.Owners, sid, {3, now - 10_000})
      cutoff = now - 5_000
      idle = Enum.filter(SessionOwners.idle_since(cutoff), &(elem(&1, 0) == sid))
      assert [{^sid, ^victim, _key}] = idle

      # Its next step arrives before the sweep forgets it (within the minute, only the
      # last-seen time moves): the session stays the agent's, counted once.
      assert {:ok, []} = SessionOwners.claim(sid, victim)
      assert SessionOwners.forget_idle(idle, cutoff) == 0
      assert SessionOwners.owner(sid) == victim
      assert SessionOwners.claim(sid, "someone-else") == {:error, {:owned_by, victim}}

      # Still idle when the sweep comes to it: forgotten, its count and LRU entry too.
      :ets.update_element(SessionOwners.Owners, sid, {3, now - 10_000})
      count = SessionOwners.count(victim)
      assert SessionOwners.forget_idle(idle, cutoff) == 1
      assert SessionOwners.owner(sid) == nil
      assert SessionOwners.count(victim) == count - 1
      assert :ets.match(SessionOwners.LRU, {:_, sid}) == []
    end

    test "the owners' table takes one plain lock: a lookup takes no frequent-read lock" do
      # Each step's claim reads it: `write_concurrency` or `read_concurrency` would add
      # a frequent-read table lock (a memory fence) to every lookup.
      assert :ets.info(SessionOwners.Owners, :write_concurrency) == false
      assert :ets.info(SessionOwners.Owners, :read_concurrency) == false
    end

    test "concurrent first steps of one session: exactly one agent owns it" do
      sid = unique_session("sess-race")

      results =
        1..16
        |> Task.async_stream(&SessionOwners.claim(sid, "racer-#{&1}"), max_concurrency: 16)
        |> Enum.map(fn {:ok, result} -> result end)

      assert Enum.count(results, &match?({:ok, _}, &1)) == 1
      owner = SessionOwners.owner(sid)
      assert Enum.all?(results, &(&1 == {:ok, []} or &1 == {:error, {:owned_by, owner}}))
    end
  end

  describe "after failover the session stays its agent's: a claim from the owner node" do
    test "is added where there is none, and then refuses another agent's steps",
         %{victim: victim, attacker: attacker} do
      sid = unique_session("sess-adopt")
      assert SessionOwners.adopt(sid, victim, 0) == :added
      assert SessionOwners.owner(sid) == victim
      assert SessionOwners.count(victim) == 1
      assert {:error, {:forbidden, _}} = ingest(sid, attacker, [])
      assert {:ok, _} = ingest(sid, victim, [])
    end

    test "never overwrites a claim held here: the first claim wins",
         %{victim: victim, attacker: attacker} do
      sid = unique_session("sess-adopt-first")
      assert {:ok, []} = SessionOwners.claim(sid, victim)
      assert SessionOwners.adopt(sid, attacker, 0) == {:owned_by, victim}
      assert SessionOwners.owner(sid) == victim
      assert SessionOwners.count(attacker) == 0
      # The same agent's claim again: kept, nothing counted twice.
      assert SessionOwners.adopt(sid, victim, 0) == :kept
      assert SessionOwners.count(victim) == 1
    end

    test "carries the session's idle time: expired with the owner's, never after it",
         %{victim: victim} do
      Application.put_env(:observatory, :session_owner_ttl_ms, 60_000)
      sid = unique_session("sess-adopt-idle")
      # Idle for the TTL on the sending node: not brought back here.
      assert SessionOwners.adopt(sid, victim, 60_000) == :skipped
      assert SessionOwners.owner(sid) == nil

      # Idle 50 s there: here too, so a 45 s TTL forgets it at the next sweep...
      assert SessionOwners.adopt(sid, victim, 50_000) == :added
      Application.put_env(:observatory, :session_owner_ttl_ms, 45_000)
      assert SessionOwners.sweep() >= 1
      assert SessionOwners.owner(sid) == nil

      # ...unless a later step on the owner node moved its last step up here.
      assert SessionOwners.adopt(sid, victim, 40_000) == :added
      assert SessionOwners.adopt(sid, victim, 0) == :kept
      Application.put_env(:observatory, :session_owner_ttl_ms, 30_000)
      SessionOwners.sweep()
      assert SessionOwners.owner(sid) == victim
    end

    test "stays within the agent's quota here and never makes it give up a session",
         %{attacker: attacker} do
      Application.put_env(:observatory, :max_sessions_per_agent, 3)
      own = for n <- 1..3, do: "#{attacker}-own-#{n}"
      for sid <- own, do: assert({:ok, []} = SessionOwners.claim(sid, attacker))

      assert SessionOwners.adopt("#{attacker}-elsewhere", attacker, 0) == :skipped
      assert SessionOwners.owner("#{attacker}-elsewhere") == nil
      assert SessionOwners.count(attacker) == 3
      for sid <- own, do: assert(SessionOwners.owner(sid) == attacker)
    end
  end

  defp now_ms, do: System.monotonic_time(:millisecond)

  # As if the session's last step and its LRU place were `ms` old.
  defp age(sid, ms) do
    [{^sid, agent, _seen, keyed, seq}] = :ets.lookup(SessionOwners.Owners, sid)

    at = now_ms() - ms
    :ets.delete(SessionOwners.LRU, {agent, {keyed, seq}})
    :ets.insert(SessionOwners.LRU, {{agent, {at, seq}}, sid})
    :ets.update_element(SessionOwners.Owners, sid, [{3, at}, {4, at}])
  end

  # The agent's LRU entries, and the ones its owner rows name ({agent, {keyed, seq}}).
  defp lru_entries(agent) do
    rows = :ets.match_object(SessionOwners.Owners, {:_, agent, :_, :_, :_})

    {Enum.sort(:ets.match_object(SessionOwners.LRU, {{agent, :_}, :_})),
     Enum.sort(for {sid, ^agent, _seen, keyed, seq} <- rows, do: {{agent, {keyed, seq}}, sid})}
  end
end
