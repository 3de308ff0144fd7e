defmodule Observatory.ClusterTest do
  use ExUnit.Case, async: true

  alias Observatory.Cluster

  describe "issue 14: one owner per session (rendezvous hashing)" do
    test "every session has one owner among the members" do
      members = [:a@h, :b@h, :c@h]
      owners = for i <- 1..3_000, do: Cluster.rendezvous("s#{i}", members)
      counts = Enum.frequencies(owners)
      assert Map.keys(counts) |> Enum.sort() == members
      # Spread: each member owns about a third.
      assert Enum.all?(Map.values(counts), &(&1 in 800..1_200)), inspect(counts)
    end

    test "a leave moves only the leaving member's sessions, a join only the joiner's" do
      three = [:a@h, :b@h, :c@h]
      two = [:a@h, :b@h]
      ids = for i <- 1..2_000, do: "s#{i}"

      moved = Enum.filter(ids, &(Cluster.rendezvous(&1, two) != Cluster.rendezvous(&1, three)))
      on_c = Enum.filter(ids, &(Cluster.rendezvous(&1, three) == :c@h))

      # c leaving (three → two) or joining (two → three) moves exactly c's sessions.
      assert moved == on_c
      assert length(on_c) in 500..830
    end

    test "a DNS name's A records are the candidate nodes; a name that does not resolve gives none" do
      {:ok, socket} = :gen_udp.open(0, [:binary, active: false, ip: {127, 0, 0, 1}])
      {:ok, port} = :inet.port(socket)

      server =
        spawn_link(fn -> serve_dns(socket, %{~c"gw.test" => [{10, 0, 0, 7}, {10, 0, 0, 8}]}) end)

      :ok = :gen_udp.controlling_process(socket, server)
      config = [dns_basename: "obs", dns_nameservers: [{{127, 0, 0, 1}, port}]]

      assert Cluster.candidates([dns: "gw.test"] ++ config) |> Enum.sort() ==
               [:"obs@10.0.0.7", :"obs@10.0.0.8"]

      assert Cluster.candidates([nodes: [:x@h], dns: "nothing.test"] ++ config) == [:x@h]
    end

    @tag :distributed
    test "a VM without distribution never clusters, whatever the configuration says" do
      {:ok, peer, :nonode@nohost} =
        :peer.start_link(%{
          connection: :standard_io,
          args: Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
        })

      :ok = :peer.call(peer, Application, :put_env, [:observatory, :cluster, [nodes: [:x@h]]])
      refute :peer.call(peer, Node, :alive?, [])
      refute :peer.call(peer, Cluster, :enabled?, [])
      assert :peer.call(peer, Cluster, :wrap, [[:a]]) == [:a]
      :peer.stop(peer)
    end

    test "with clustering off the owner is this node" do
      refute Cluster.enabled?()
      assert Cluster.owner("any") == node()
      assert Cluster.members() == [node()]
      assert Cluster.wrap([:a]) == [:a]
    end

    test "with clustering off a node is its own majority: nothing is refused, /healthz has no cluster section" do
      assert Cluster.majority?()
      assert Cluster.with_majority("anything", fn -> :done end) == :done
      assert Cluster.status() == %{members: [node()], inconsistent: [], majority: true}
      assert Observatory.Health.cluster() == %{}
      refute Map.has_key?(elem(Observatory.Health.check(), 1), "cluster")
    end
  end

  # A one-zone DNS server: A records for the names in `zone`, NXDOMAIN for others.
  defp serve_dns(socket, zone) do
    {:ok, {ip, port, packet}} = :gen_udp.recv(socket, 0)
    {:ok, query} = :inet_dns.decode(packet)
    [question] = :inet_dns.msg(query, :qdlist)
    name = :inet_dns.dns_query(question, :domain)
    header = :inet_dns.msg(query, :header)

    answers =
      for address <- Map.get(zone, name, []),
          do: :inet_dns.make_rr(domain: name, type: :a, class: :in, ttl: 60, data: address)

    rcode = if Map.has_key?(zone, name), do: 0, else: 3
    header = :inet_dns.make_header(header, qr: true, aa: true, rcode: rcode)
    reply = :inet_dns.make_msg(query, header: header, anlist: answers)
    :ok = :gen_udp.send(socket, ip, port, :inet_dns.encode(reply))
    serve_dns(socket, zone)
  end
end

defmodule Observatory.ClusterDistributedTest do
  # Three :peer nodes running Observatory as one cluster (issue 14).
  use ExUnit.Case, async: false

  alias Observatory.Cluster
  alias Observatory.Gateway.SchemaInterceptor
  alias Observatory.JSON
  alias Observatory.Test.ClusterPeers

  @moduletag :distributed
  @moduletag timeout: 120_000

  setup context do
    root =
      Path.join(System.tmp_dir!(), "observatory-cluster-#{System.unique_integer([:positive])}")

    names = ClusterPeers.names(4)
    {shorts, all} = Enum.unzip(names)
    # A test may tune the peers' cluster timings (`@tag cluster: [...]`).
    env = [cluster: Map.get(context, :cluster, [])]
    # The fourth name joins later in some tests; it is in everyone's static list.
    started = for short <- Enum.take(shorts, 3), do: ClusterPeers.start(short, all, root, env)
    nodes = Enum.map(started, &elem(&1, 1))
    pids = for n <- nodes, do: :erpc.call(n, :os, :getpid, [])

    on_exit(fn ->
      # A test that froze a node (`ClusterPeers.frozen/3`) thaws it, whatever happened.
      for pid <- pids, do: System.cmd("kill", ["-CONT", to_string(pid)])
      File.rm_rf!(root)
    end)

    :ok = ClusterPeers.await_members(nodes, nodes)
    %{root: root, all: all, shorts: shorts, peers: Enum.map(started, &elem(&1, 0)), nodes: nodes}
  end

  defp steps(session_id, count) do
    # A few different calls, then one failing call repeated: a loop.
    for i <- 1..count do
      tool = if i <= 3, do: "tool_#{i}", else: "read_file"

      %{
        "meta" => %{
          "step_id" => "step-#{i}",
          "session_id" => session_id,
          "agent_id" => "agent-cluster",
          "timestamp" => "2026-02-22T10:30:00Z"
        },
        "cognition" => %{"intent" => "search", "entropy_score" => 0.9},
        "action" => %{
          "tool_call" => tool,
          "tool_input" => %{"path" => "/etc/x"},
          "status" => "failure",
          "result" => "no such file"
        }
      }
    end
  end

  # What the caller is told about the step (the envelope and ids are its own).
  defp answer({:ok, r}), do: answer(r)
  defp answer(r), do: Map.take(r, [:entropy_score, :severity, :verdict, :step, :directives])

  defp owned_by(node, members, prefix) do
    Stream.iterate(1, &(&1 + 1))
    |> Stream.map(&"#{prefix}-#{&1}")
    |> Enum.find(&(Cluster.rendezvous(&1, members) == node))
  end

  describe "issue 14: a session scored on its owner" do
    test "steps sent round-robin to three nodes get the answers one node gives", %{nodes: nodes} do
      session = "sess-rr-#{System.unique_integer([:positive])}"
      envelopes = steps(session, 9)

      # This test node runs Observatory alone (clustering off): the reference.
      expected = for e <- envelopes, do: answer(SchemaInterceptor.ingest(e))

      got =
        envelopes
        |> Enum.zip(Stream.cycle(nodes))
        |> Enum.map(fn {e, n} -> answer(:erpc.call(n, SchemaInterceptor, :ingest, [e])) end)

      assert got == expected
      # The run reached a loop (the comparison is not of nine empty answers).
      assert Enum.any?(got, &(&1.verdict.verdict == :loop))
      assert Enum.any?(got, &(&1.severity == :loop))

      # The window lives on the owner only.
      [owner] = Enum.uniq(for n <- nodes, do: :erpc.call(n, Cluster, :owner, [session]))

      for n <- nodes do
        state = :erpc.call(n, Observatory.Gateway.EntropyTracker, :session, [session])
        if n == owner, do: assert(state), else: assert(state == nil)
      end
    end

    # The owner frozen (connected, a member, silent) for the two calls: it cannot
    # answer within 200 ms. (A 0 ms timeout instead raced: a busy caller could find
    # the owner's answer already in its mailbox.) No member cuts a silent one off
    # within this test: the usual 3 s could pass on a loaded machine, and the step
    # would then go, rightly, to the next owner.
    @tag cluster: [member_timeout_ms: 120_000]
    test "an owner that does not answer in time: the step is refused with 503, not scored elsewhere",
         %{nodes: [a, b, c]} do
      session = owned_by(b, [a, b, c], "sess-slow")
      [step] = steps(session, 1)
      step = put_in(step, ["meta", "agent_id"], "agent-http")
      config = Keyword.put(:erpc.call(a, Cluster, :config, []), :rpc_timeout_ms, 200)
      :ok = :erpc.call(a, Application, :put_env, [:observatory, :cluster, config])
      port = :erpc.call(a, ObservatoryWeb.Endpoint, :port, [])
      body = Observatory.JSON.encode!(step)

      {in_process, over_http} =
        ClusterPeers.frozen(b, a, fn ->
          {:erpc.call(a, SchemaInterceptor, :ingest, [step]),
           http(:post, port, "/api/v1/decision_logs", body, "test-agent-key")}
        end)

      assert {:error, {:unavailable, %{path: "meta.session_id", reason: reason}}} = in_process
      assert reason =~ "#{b} did not answer"
      assert %{status: 503, body: answer} = over_http
      assert answer =~ "owner_unavailable"
      # Neither a nor c scored the step in b's place.
      for n <- [a, c],
          do:
            assert(:erpc.call(n, Observatory.Gateway.EntropyTracker, :session, [session]) == nil)
    end

    test "an invalid step is refused by the node it reached, as on one node", %{nodes: [a | _]} do
      assert {:error, {:invalid, [_ | _]}} =
               :erpc.call(a, SchemaInterceptor, :ingest, [
                 ~s({"meta": {}}),
                 [log_violations: false]
               ])
    end

    test "killing a node loses only its windows: later steps are answered and re-scored on the new owner",
         %{nodes: [a, b, c], peers: [_, _, peer_c]} do
      members = [a, b, c]
      on_c = owned_by(c, members, "sess-c")
      on_a = owned_by(a, members, "sess-a")
      [c1, c2, c3, c4] = steps(on_c, 4)
      [a1, a2, a3, a4] = steps(on_a, 4)

      # Both sessions' first three steps, sent to b.
      for e <- [c1, c2, c3, a1, a2, a3],
          do: {:ok, _} = :erpc.call(b, SchemaInterceptor, :ingest, [e])

      :ok = :peer.stop(peer_c)

      # At once, before membership has caught up: answered, no error.
      assert {:ok, after_loss} = :erpc.call(b, SchemaInterceptor, :ingest, [c4])
      assert {:ok, kept} = :erpc.call(a, SchemaInterceptor, :ingest, [a4])

      # c's session starts a fresh window (F1): its answer is a first step's.
      fresh = "sess-fresh-#{System.unique_integer([:positive])}"

      first = answer(SchemaInterceptor.ingest(put_in(c4, ["meta", "session_id"], fresh)))
      assert answer(after_loss) == first
      assert after_loss.verdict.step_number == 1

      # a's session kept its window: its answer is the fourth step's.
      for e <- [a1, a2, a3], do: {:ok, _} = SchemaInterceptor.ingest(e)
      assert answer(kept) == answer(SchemaInterceptor.ingest(a4))

      :ok = ClusterPeers.await_members([a, b], [a, b])
      new_owner = Cluster.rendezvous(on_c, [a, b])
      assert :erpc.call(new_owner, Observatory.Gateway.EntropyTracker, :session, [on_c])
    end
  end

  describe "after failover the session stays its agent's" do
    # The session's owner b is lost; `next`, the node it fails over to, scores it
    # from then on and must already know whose session it is.
    test "the owner node stopped: another agent gets 403 on every node, the agent writes on (200), also once the owner is back",
         %{nodes: [a, b, c], peers: [_, peer_b, _], all: all, shorts: shorts, root: root} do
      {owner, key, intruder, intruder_key} = two_agents(a)
      session = owned_by(b, [a, b, c], "sess-failover")
      [next, other] = Cluster.rendezvous_order(session, [a, c])
      [s1, s2, s3] = for e <- steps(session, 3), do: as_agent(e, owner)
      stolen = s1 |> as_agent(intruder) |> put_in(["meta", "step_id"], "stolen")

      # Scored and claimed on b, which sends the claim to `next` at once.
      assert %{status: 200} = post_step(a, s1, key)
      await(fn -> owner_on(next, session) == owner end)
      # Nowhere else: a claim goes to the session's first two nodes only.
      assert owner_on(other, session) == nil

      :ok = :peer.stop(peer_b)
      :ok = ClusterPeers.await_members([a, c], [a, c])

      for n <- [a, c] do
        assert %{status: 403, body: body} = post_step(n, stolen, intruder_key)
        assert body =~ "another agent"
        # Asking whose session it is (a tool-call check) gets the same answer.
        call = ~s({"session_id": "#{session}", "tool": "read_file", "arguments": {}})

        assert %{status: 403} =
                 http(:post, port(n), "/api/v1/tool_calls/check", call, intruder_key)
      end

      assert %{status: 200} = post_step(c, s2, key)
      assert :erpc.call(next, Observatory.Gateway.EntropyTracker, :session, [session])
      # `next` owns it now, and sent the claim on to the node it fails over to next.
      await(fn -> owner_on(other, session) == owner end)

      # b starts again with an empty table and owns the session again: the others
      # send it the claim when it joins.
      {_peer_b, ^b} = ClusterPeers.start(Enum.at(shorts, 1), all, root)
      :ok = ClusterPeers.await_members([a, b, c], [a, b, c])
      await(fn -> owner_on(b, session) == owner end)
      assert %{status: 403} = post_step(a, stolen, intruder_key)
      assert %{status: 200} = post_step(a, s3, key)
    end

    test "the owner node killed: its claims hold; a session never claimed still goes to the first agent that writes it",
         %{nodes: [a, b, c], peers: [_, peer_b, _]} do
      {owner, key, intruder, intruder_key} = two_agents(a)
      claimed = owned_by(b, [a, b, c], "sess-killed")
      unclaimed = owned_by(b, [a, b, c], "sess-unclaimed-#{System.unique_integer([:positive])}")
      [next | _] = Cluster.rendezvous_order(claimed, [a, c])

      assert %{status: 200} = post_step(a, as_agent(hd(steps(claimed, 1)), owner), key)
      await(fn -> owner_on(next, claimed) == owner end)

      pid_b = :erpc.call(b, :os, :getpid, [])
      Process.unlink(peer_b)
      {_, 0} = System.cmd("kill", ["-KILL", to_string(pid_b)])
      :ok = ClusterPeers.await_members([a, c], [a, c])

      [c1, c2] = steps(claimed, 2)
      assert %{status: 403} = post_step(c, as_agent(c1, intruder), intruder_key)
      assert %{status: 200} = post_step(c, as_agent(c2, owner), key)

      # No claim anywhere: the first agent to write the session owns it, as before.
      [u1, u2] = steps(unclaimed, 2)
      assert %{status: 200} = post_step(a, as_agent(u1, intruder), intruder_key)
      assert %{status: 403} = post_step(c, as_agent(u2, owner), key)
      for n <- [a, c], do: assert(owner_on(n, unclaimed) == intruder)
    end
  end

  # Two agents with keys of their own: {agent, key, other agent, its key}.
  defp two_agents(node) do
    u = System.unique_integer([:positive])
    {:ok, %{key: key}} = :erpc.call(node, Observatory.AgentKeys, :issue, ["agent-own-#{u}"])
    {:ok, %{key: other}} = :erpc.call(node, Observatory.AgentKeys, :issue, ["agent-other-#{u}"])
    {"agent-own-#{u}", key, "agent-other-#{u}", other}
  end

  defp as_agent(envelope, agent), do: put_in(envelope, ["meta", "agent_id"], agent)

  defp post_step(node, envelope, key),
    do: http(:post, port(node), "/api/v1/decision_logs", JSON.encode!(envelope), key)

  defp port(node), do: :erpc.call(node, ObservatoryWeb.Endpoint, :port, [])

  defp owner_on(node, session),
    do: :erpc.call(node, Observatory.Gateway.SessionOwners, :owner, [session])

  defp await(fun, deadline \\ System.monotonic_time(:millisecond) + 10_000) do
    cond do
      fun.() -> :ok
      System.monotonic_time(:millisecond) > deadline -> flunk("never happened")
      true -> Process.sleep(20) && await(fun, deadline)
    end
  end

  describe "idempotent ingest: the owner decides" do
    test "a retry after the owner's 503 is counted once, whichever node it reaches",
         %{nodes: [a, b, c]} do
      session = owned_by(b, [a, b, c], "sess-retry")
      [step] = steps(session, 1)
      step = put_in(step, ["meta", "agent_id"], "agent-http")
      body = JSON.encode!(step)
      window = fn -> :erpc.call(b, Observatory.Gateway.EntropyTracker, :window, [session]) end

      # b is slow: it starts scoring the step in time, then takes longer than a waits.
      previous = :erpc.call(b, Observatory.Test.HeldStep, :hold, [session])
      config = :erpc.call(a, Cluster, :config, [])

      :ok =
        :erpc.call(a, Application, :put_env, [
          :observatory,
          :cluster,
          Keyword.put(config, :rpc_timeout_ms, 300)
        ])

      port_a = :erpc.call(a, ObservatoryWeb.Endpoint, :port, [])

      assert %{status: 503, body: refused} =
               http(:post, port_a, "/api/v1/decision_logs", body, "test-agent-key")

      assert refused =~ "owner_unavailable"
      :ok = :erpc.call(a, Application, :put_env, [:observatory, :cluster, config])
      # b did take the step: its window has it, and it is still scoring it.
      assert length(window.()) == 1

      # A retry meanwhile, through c: told to retry, not scored a second time.
      assert {:error, {:in_progress, %{path: "meta.step_id"}}} =
               :erpc.call(c, SchemaInterceptor, :ingest, [step, [agent: "agent-http"]])

      :erpc.call(b, Observatory.Test.HeldStep, :release, [])

      # The client retries, through c, then through a: the owner's first answer twice.
      answers =
        for node <- [c, a] do
          port = :erpc.call(node, ObservatoryWeb.Endpoint, :port, [])

          assert %{status: 200, body: answer} =
                   http(:post, port, "/api/v1/decision_logs", body, "test-agent-key")

          {:ok, answer} = JSON.decode(answer)
          answer
        end

      :erpc.call(b, Observatory.Telemetry, :put_dispatcher, [previous])
      assert [%{"replayed" => true} = first, %{"replayed" => true} = second] = answers
      assert first == second
      assert first["verdict"]["step_number"] == 1
      assert length(window.()) == 1
      assert :erpc.call(b, Observatory.Gateway.SessionLog, :count, [session]) == 1
      assert :erpc.call(b, Observatory.Gateway.Idempotency, :count, [{:session, session}]) == 1
      # Nothing scored or remembered anywhere else.
      for n <- [a, c] do
        assert :erpc.call(n, Observatory.Gateway.EntropyTracker, :session, [session]) == nil
        assert :erpc.call(n, Observatory.Gateway.Idempotency, :count, [{:session, session}]) == 0
      end
    end
  end

  describe "issue 14: the whole fleet on every node" do
    test "the session API, Inspect and Pause work on a node that does not own the session",
         %{nodes: [a, b, c]} do
      session = owned_by(b, [a, b, c], "sess-api")
      for e <- steps(session, 3), do: {:ok, _} = :erpc.call(a, SchemaInterceptor, :ingest, [e])

      port = :erpc.call(c, ObservatoryWeb.Endpoint, :port, [])
      assert %{status: 200, body: body} = http(:get, port, "/api/v1/sessions/#{session}")
      assert %{"window" => [_, _, _], "agent_id" => "agent-cluster"} = elem(JSON.decode(body), 1)

      inspected = :erpc.call(c, ObservatoryWeb.SessionClusterManager.Inspector, :load, [session])
      assert length(inspected.window) == 3

      assert %{status: 200} = http(:post, port, "/api/v1/sessions/#{session}/pause")
      # Enforced on the owner, whichever node the next step reaches.
      [next] = steps(session, 4) |> Enum.drop(3)

      assert {:ok, %{paused: true, directives: [%{"type" => "pause"} | _]}} =
               :erpc.call(a, SchemaInterceptor, :ingest, [next])
    end

    test "the circuit breaker counts a session's calls on its owner, whichever node is asked",
         %{nodes: nodes} do
      session = "sess-breaker-#{System.unique_integer([:positive])}"
      ports = for n <- nodes, do: :erpc.call(n, ObservatoryWeb.Endpoint, :port, [])
      body = ~s({"session_id": "#{session}", "tool": "read_file", "arguments": {"path": "/x"}})

      counts =
        for {port, _} <- Enum.zip(Stream.cycle(ports), 1..6) do
          %{status: 200, body: answer} =
            http(:post, port, "/api/v1/tool_calls/check", body, "test-agent-key")

          {:ok, %{"decision" => "allow", "count" => count}} = JSON.decode(answer)
          count
        end

      assert counts == [1, 2, 3, 4, 5, 6]
    end

    # The owner frozen, not cut off, is the case under test (see the step's test above).
    @tag cluster: [member_timeout_ms: 120_000]
    test "the session-owner check fails closed: an owner that does not answer in time is a 503, never a yes",
         %{nodes: [a, b, c]} do
      # agent-cluster's session, on b; the key below is agent-http's.
      session = owned_by(b, [a, b, c], "sess-owner-check")
      for e <- steps(session, 1), do: {:ok, _} = :erpc.call(a, SchemaInterceptor, :ingest, [e])
      port = :erpc.call(a, ObservatoryWeb.Endpoint, :port, [])
      call = ~s({"session_id": "#{session}", "tool": "read_file", "arguments": {"path": "/x"}})
      check = fn -> http(:post, port, "/api/v1/tool_calls/check", call, "test-agent-key") end
      # Answered by the owner: another agent's session.
      assert %{status: 403} = check.()

      # The owner frozen: it cannot answer within 200 ms, and neither a's own (empty)
      # tracker nor the failover node's copy of the claim may answer in its place. (A
      # 0 ms timeout raced: the owner may answer within the deadline's millisecond,
      # and a caller descheduled after sending then finds the answer in its mailbox.)
      config = :erpc.call(a, Cluster, :config, [])
      short = Keyword.put(config, :rpc_timeout_ms, 200)
      :ok = :erpc.call(a, Application, :put_env, [:observatory, :cluster, short])
      headers = [{~c"x-session-id", String.to_charlist(session)}]

      {checked, read, proxied} =
        ClusterPeers.frozen(b, a, fn ->
          {check.(), http(:get, port, "/api/v1/sessions/#{session}", "", "test-agent-key"),
           chat(port, "test-agent-key", headers)}
        end)

      assert %{status: 503, body: answer} = checked
      assert answer =~ "owner_unavailable"
      assert %{status: 503, body: answer} = read
      assert answer =~ "owner_unavailable"
      # The LLM proxy answers in the API's shape, before anything goes upstream.
      assert %{status: 503, body: answer} = proxied
      assert {:ok, %{"error" => %{"code" => "owner_unavailable"}}} = JSON.decode(answer)

      # Thawed, the owner answers again: the 503s were its silence.
      :ok = :erpc.call(a, Application, :put_env, [:observatory, :cluster, config])
      assert %{status: 403} = check.()
    end

    test "the fleet snapshot gathers every member's sessions", %{nodes: [a, b, c] = nodes} do
      ids = for n <- nodes, do: owned_by(n, nodes, "sess-fleet-#{n}")

      for id <- ids,
          [e] = steps(id, 1),
          do: {:ok, _} = :erpc.call(a, SchemaInterceptor, :ingest, [e])

      for n <- [a, b, c] do
        listed =
          :erpc.call(n, Cluster, :gather, [
            Observatory.Gateway.EntropyTracker,
            :sessions,
            [[limit: 1000]]
          ])

        assert Enum.all?(ids, fn id -> Enum.any?(listed, &(&1.session_id == id)) end)
      end
    end
  end

  describe "issue 18: alerts and the sessions list from every member" do
    test "every node lists every member's alerted sessions, once, and the sessions API names their node",
         %{nodes: [a, b, c] = nodes} do
      ids = for n <- nodes, do: owned_by(n, nodes, "sess-alert-#{n}")
      # Three different calls, then the same failing call five times: an entropy LOOP.
      for id <- ids,
          e <- steps(id, 8),
          do: {:ok, _} = :erpc.call(a, SchemaInterceptor, :ingest, [e])

      for n <- nodes do
        listed = :erpc.call(n, Observatory.Gateway.Alerts, :gather, [[]])
        mine = Enum.filter(listed, &(&1.session_id in ids))
        assert Enum.sort(Enum.map(mine, & &1.session_id)) == Enum.sort(ids)
        assert Enum.all?(mine, &(&1.node == Cluster.rendezvous(&1.session_id, nodes)))
      end

      # A page opened on c lists them all (the Session Cluster Manager's mount).
      {:ok, socket} =
        :erpc.call(c, ObservatoryWeb.SessionClusterManager, :mount, [
          %{},
          %{"operator" => "ops"},
          ObservatoryWeb.SessionClusterManager.Socket.new()
        ])

      for id <- ids,
          do: assert(ObservatoryWeb.SessionClusterManager.Alerts.get(socket.assigns.alerts, id))

      port = :erpc.call(c, ObservatoryWeb.Endpoint, :port, [])

      assert %{status: 200, body: body} =
               http(:get, port, "/api/v1/sessions?state=alert&limit=200")

      {:ok, %{"sessions" => rows}} = JSON.decode(body)

      for id <- ids do
        assert %{"node" => node, "alerted" => true} = Enum.find(rows, &(&1["session_id"] == id))
        assert node == Atom.to_string(Cluster.rendezvous(id, [a, b, c]))
      end
    end
  end

  describe "issue 14: replicated agent state" do
    test "agent records, events, keys, pauses and the audit log survive a node's loss and reach a node that joins later",
         %{nodes: [a, b, c], peers: [peer_a | _], all: all, shorts: shorts, root: root} do
      agent = "agent-repl-#{System.unique_integer([:positive])}"
      {:ok, %{key: key}} = :erpc.call(a, Observatory.AgentKeys, :issue, [agent])
      {:ok, _} = :erpc.call(b, Observatory.KillSwitch, :deactivate, [agent, [operator: "alice"]])
      paused = "sess-paused-#{System.unique_integer([:positive])}"
      pause = [operator: "alice", reason: "look"]
      {:ok, _} = :erpc.call(a, Observatory.Gateway.HITL, :pause, [paused, pause])
      # Two nodes writing the audit log never take the same entry's place.
      {:ok, _} = :erpc.call(c, Observatory.Gateway.HITL, :pause, [paused <> "-c", pause])

      :ok = :peer.stop(peer_a)
      :ok = ClusterPeers.await_members([b, c], [b, c])

      for n <- [b, c], do: assert_replicated(n, agent, key, paused)

      # A fourth node with an empty directory joins and gets every table.
      {_peer_d, d} = ClusterPeers.start(List.last(shorts), all, root)
      :ok = ClusterPeers.await_members([b, c, d], [b, c, d])
      assert_replicated(d, agent, key, paused)
      tables = :erpc.call(d, :mnesia, :system_info, [:local_tables])
      assert :observatory_agents in tables and :observatory_agent_events in tables
      # Every table the cluster has, a joining node has too.
      assert Enum.sort(tables) == Enum.sort(:erpc.call(b, :mnesia, :system_info, [:local_tables]))

      assert :erpc.call(d, :mnesia, :table_info, [:observatory_agents, :storage_type]) ==
               :disc_copies
    end

    test "a kill-switch deactivation on node A refuses the agent's next proxy request on node C",
         %{nodes: [a, _b, c]} do
      agent = "agent-ks-#{System.unique_integer([:positive])}"
      {:ok, %{key: key}} = :erpc.call(a, Observatory.AgentKeys, :issue, [agent])
      port = :erpc.call(c, ObservatoryWeb.Endpoint, :port, [])

      # Before: C lets the request through to the proxy (no upstream configured here).
      assert %{status: before} = chat(port, key)
      refute before == 403

      {:ok, _} = :erpc.call(a, Observatory.KillSwitch, :deactivate, [agent, [operator: "alice"]])

      assert %{status: 403, body: body} = chat(port, key)
      assert body =~ "agent_inactive"
    end
  end

  describe "issue 19 item 6 / issue 20 findings 4 and 9 in a cluster" do
    test "a deactivation on node A ends the agent's open stream on node C at once",
         %{nodes: [a, _b, c]} do
      agent = "agent-stream-#{System.unique_integer([:positive])}"
      {:ok, %{key: key}} = :erpc.call(a, Observatory.AgentKeys, :issue, [agent])
      test = self()

      upstream =
        Observatory.Test.Upstream.start(fn _ ->
          {:chunked, 200, "text/event-stream",
           fn resp ->
             Observatory.Test.Upstream.write_chunk(
               resp,
               Observatory.Test.Upstream.chunk_event("Hel")
             )

             send(test, :streaming)

             receive do
               :go -> :ok
             after
               10_000 -> :ok
             end
           end}
        end)

      :ok = :erpc.call(c, Application, :put_env, [:observatory, :llm_upstream, upstream.url])
      port = :erpc.call(c, ObservatoryWeb.Endpoint, :port, [])
      body = ~s({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})

      headers = [
        {"authorization", "Bearer " <> key},
        {"content-type", "application/json"}
      ]

      alias Observatory.Proxy.{HTTPClient, SSE}
      url = "http://127.0.0.1:#{port}/v1/chat/completions"
      {:ok, conn} = HTTPClient.request(url, headers, body, timeout: 5_000)
      {:ok, 200, _, conn} = HTTPClient.read_head(conn)
      assert_receive :streaming, 5_000

      {:ok, _} = :erpc.call(a, Observatory.KillSwitch, :deactivate, [agent, [operator: "alice"]])
      {:ok, raw, _} = HTTPClient.read_all(conn)
      {events, _, _} = SSE.parse(SSE.new(), raw)
      assert %{data: %{"error" => %{"code" => "agent_inactive"}}} = List.last(events)
    end

    test "a derived session id is the same on every node (one secret, replicated)",
         %{nodes: nodes} do
      body = %{"messages" => [%{"role" => "user", "content" => "fix the build"}]}

      ids =
        for node <- nodes,
            do: :erpc.call(node, Observatory.Proxy.SessionId, :derive, ["agent-x", body])

      assert [id] = Enum.uniq(ids)
      assert "proxy-" <> _ = id
    end
  end

  defp assert_replicated(node, agent, key, paused) do
    assert %{operator: "alice", reason: "look"} =
             :erpc.call(node, Observatory.Gateway.HITL, :pause_of, [paused])

    audit = :erpc.call(node, Observatory.Gateway.HITL, :audit_log, [[limit: 1000]])
    assert Enum.count(audit, &(&1.session_id in [paused, paused <> "-c"])) == 2

    assert %{active: false, deactivated_by: :manual} =
             :erpc.call(node, Observatory.KillSwitch.Agents, :get, [agent])

    events = :erpc.call(node, Observatory.KillSwitch.Agents, :events, [[agent_id: agent]])
    assert Enum.map(events, & &1.event_type) == ["manual_deactivation"]
    assert {:ok, ^agent} = :erpc.call(node, Observatory.AgentKeys, :authenticate, [key])
  end

  defp http(method, port, path, body \\ "", token \\ "test-operator-token") do
    url = ~c"http://127.0.0.1:#{port}#{path}"
    headers = [{~c"authorization", String.to_charlist("Bearer " <> token)}]

    request =
      if method == :get, do: {url, headers}, else: {url, headers, ~c"application/json", body}

    {:ok, {{_, status, _}, _, body}} = :httpc.request(method, request, [], body_format: :binary)
    %{status: status, body: body}
  end

  defp chat(port, key, headers \\ []) do
    body = ~s({"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    {:ok, {{_, status, _}, _headers, resp}} =
      :httpc.request(
        :post,
        {~c"http://127.0.0.1:#{port}/v1/chat/completions",
         [{~c"authorization", String.to_charlist("Bearer " <> key)} | headers],
         ~c"application/json", body},
        [timeout: 10_000],
        body_format: :binary
      )

    %{status: status, body: resp}
  end
end
