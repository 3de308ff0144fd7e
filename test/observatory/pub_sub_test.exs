defmodule Observatory.PubSubTest do
  use ExUnit.Case, async: true

  alias Observatory.PubSub

  setup do
    name = :"pubsub_#{System.unique_integer([:positive])}"
    start_supervised!({PubSub, name: name})
    %{ps: name}
  end

  test "subscribe/2 and broadcast/3 deliver to every subscriber", %{ps: ps} do
    :ok = PubSub.subscribe(ps, "t")
    parent = self()

    other =
      spawn_link(fn ->
        :ok = PubSub.subscribe(ps, "t")
        send(parent, :ready)
        receive do: (msg -> send(parent, {:other, msg}))
      end)

    assert_receive :ready
    :ok = PubSub.broadcast(ps, "t", :hello)
    assert_receive :hello
    assert_receive {:other, :hello}
    refute_received :hello
    Process.exit(other, :kill)
  end

  test "topics are separate and unsubscribe stops delivery", %{ps: ps} do
    :ok = PubSub.subscribe(ps, "a")
    :ok = PubSub.broadcast(ps, "b", :for_b)
    refute_receive :for_b, 20
    :ok = PubSub.unsubscribe(ps, "a")
    :ok = PubSub.broadcast(ps, "a", :after)
    refute_receive :after, 20
  end

  test "broadcast_from/4 and local_broadcast_from/4 skip the sender", %{ps: ps} do
    :ok = PubSub.subscribe(ps, "t")
    :ok = PubSub.broadcast_from(ps, self(), "t", :skip_me)
    :ok = PubSub.local_broadcast_from(ps, self(), "t", :skip_me_too)
    refute_receive _, 20
    :ok = PubSub.local_broadcast(ps, "t", :local)
    assert_receive :local
  end

  test "metadata reaches a custom dispatcher", %{ps: ps} do
    :ok = PubSub.subscribe(ps, "t", metadata: :tagged)
    :ok = PubSub.broadcast(ps, "t", :msg, __MODULE__.TagDispatcher)
    assert_receive {:tagged, :msg}
  end

  describe "a broadcast nobody subscribes to costs one lookup" do
    test "subscribed?/2 follows subscribe, unsubscribe and a subscriber's exit", %{ps: ps} do
      refute PubSub.Peer.subscribed?(ps, "t")
      :ok = PubSub.subscribe(ps, "t")
      assert PubSub.Peer.subscribed?(ps, "t")
      refute PubSub.Peer.subscribed?(ps, "other")
      :ok = PubSub.unsubscribe(ps, "t")
      refute PubSub.Peer.subscribed?(ps, "t")

      parent = self()

      pid =
        spawn(fn ->
          :ok = PubSub.subscribe(ps, "t")
          send(parent, :subscribed)
          receive do: (:stop -> :ok)
        end)

      assert_receive :subscribed
      assert PubSub.Peer.subscribed?(ps, "t")
      ref = Process.monitor(pid)
      send(pid, :stop)
      assert_receive {:DOWN, ^ref, _, _, _}
      # :pg removes a member when it sees the exit: it has once this call answers.
      _ = :sys.get_state(PubSub.Peer.scope(ps))
      refute PubSub.Peer.subscribed?(ps, "t")
      assert :pg.get_members(PubSub.Peer.scope(ps), {:topic, "t"}) == []
    end

    test "subscribed?/2 is false, not an error, for an instance whose :pg scope does not run" do
      refute PubSub.Peer.subscribed?(:"no_such_pubsub_#{System.unique_integer([:positive])}", "t")
    end

    test "subscribers still get broadcasts after the :pg scope restarts", %{ps: ps} do
      :ok = PubSub.subscribe(ps, "t")
      :ok = PubSub.subscribe(ps, "t")
      scope = PubSub.Peer.scope(ps)
      old = Process.whereis(scope)
      ref = Process.monitor(old)
      Process.exit(old, :kill)
      assert_receive {:DOWN, ^ref, _, _, _}
      # The supervisor restarts the scope, then the peer, which rejoins the subscribers.
      await(fn -> Process.whereis(scope) not in [nil, old] end)
      # Answered once the supervisor has restarted the peer too (it restarts both in one go).
      children = Supervisor.which_children(Module.concat(ps, Supervisor))
      assert Enum.all?(children, &is_pid(elem(&1, 1)))
      :ok = PubSub.broadcast(ps, "t", :after_restart)
      assert_receive :after_restart
      assert_receive :after_restart, 0, "subscribed twice, received twice"
    end
  end

  # Polls a condition a supervisor makes true shortly (no event to await here).
  defp await(check, tries \\ 200) do
    cond do
      check.() ->
        :ok

      tries == 0 ->
        flunk("condition not met")

      true ->
        Process.sleep(5)
        await(check, tries - 1)
    end
  end

  test "options are validated up front" do
    assert_raise ArgumentError, ~r/:name option is required/, fn -> PubSub.child_spec([]) end
    assert_raise ArgumentError, ~r/got: "x"/, fn -> PubSub.child_spec(name: "x") end
  end

  defmodule TagDispatcher do
    def dispatch(entries, _from, message) do
      for {pid, meta} <- entries, do: send(pid, {meta, message})
      :ok
    end
  end
end

defmodule Observatory.PubSubDistributedTest do
  # A second BEAM node started with :peer: broadcasts cross nodes over :pg.
  use ExUnit.Case, async: false

  alias Observatory.PubSub

  @moduletag :distributed
  @ps Observatory.PubSub

  setup_all do
    unless Node.alive?() do
      {_, 0} = System.cmd("epmd", ["-daemon"])
      # A name per OS process: back-to-back runs never collide on epmd.
      {:ok, _} = :net_kernel.start([:"observatory_test_#{System.pid()}@127.0.0.1", :longnames])
    end

    {:ok, peer, node} =
      :peer.start_link(%{
        name: :"peer_#{System.unique_integer([:positive])}",
        host: ~c"127.0.0.1",
        longnames: true,
        args: Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
      })

    :ok = :erpc.call(node, Observatory.Test.Remote, :start_pubsub, [@ps])

    # The peer is linked to the setup_all process and stops with it.
    _ = peer
    %{node: node}
  end

  test "a broadcast on this node reaches a subscriber on the peer", %{node: node} do
    :ok =
      :erpc.call(node, Observatory.Test.Remote, :subscribe_and_forward, [@ps, "cross", self()])

    assert_receive :subscribed
    wait_for_peers(2)
    wait_for_listener(node, "cross")
    :ok = PubSub.broadcast(@ps, "cross", {:hi, node()})
    assert_receive {:remote_got, {:hi, _}}, 2_000
  end

  test "a broadcast goes only to the nodes with a subscriber to its topic (issue 14)",
       %{node: node} do
    wait_for_peers(2)
    # Nobody on the peer listens to "quiet": nothing crosses.
    assert Observatory.PubSub.Peer.forward(@ps, "quiet", :x, :none, PubSub) == []

    :ok =
      :erpc.call(node, Observatory.Test.Remote, :subscribe_and_forward, [@ps, "quiet", self()])

    assert_receive :subscribed
    wait_for_listener(node, "quiet")
    assert Observatory.PubSub.Peer.forward(@ps, "quiet", :first, :none, PubSub) == [node]
    assert_receive {:remote_got, :first}, 2_000

    # The subscriber has exited (it forwards one message): :pg forgets it.
    wait_for_listener(node, "quiet", false)
    assert Observatory.PubSub.Peer.forward(@ps, "quiet", :y, :none, PubSub) == []
  end

  test "a broadcast on the peer reaches a subscriber here", %{node: node} do
    :ok = PubSub.subscribe(@ps, "back")
    wait_for_peers(2)
    # A node learns of another's subscriber when :pg tells it, a moment after
    # `subscribe/3` returns (the module's doc says so): wait for the peer to know.
    wait_for_remote_view(node, "back", self())
    :erpc.call(node, PubSub, :broadcast, [@ps, "back", :from_peer])
    assert_receive :from_peer, 2_000
  end

  test "local_broadcast stays on its node", %{node: node} do
    :ok = PubSub.subscribe(@ps, "local-only")
    wait_for_peers(2)
    :erpc.call(node, PubSub, :local_broadcast, [@ps, "local-only", :nope])
    refute_receive :nope, 200
  end

  defp wait_for_listener(node, topic, present? \\ true, tries \\ 200) do
    scope = Observatory.PubSub.Peer.scope(@ps)
    listening? = Enum.any?(:pg.get_members(scope, {:topic, topic}), &(node(&1) == node))

    cond do
      listening? == present? -> :ok
      tries == 0 -> flunk("#{node} listening to #{topic}: never #{present?}")
      true -> Process.sleep(10) && wait_for_listener(node, topic, present?, tries - 1)
    end
  end

  defp wait_for_remote_view(node, topic, pid, tries \\ 200) do
    scope = Observatory.PubSub.Peer.scope(@ps)

    cond do
      pid in :erpc.call(node, :pg, :get_members, [scope, {:topic, topic}]) -> :ok
      tries == 0 -> flunk("#{node} never saw #{inspect(pid)} listening to #{topic}")
      true -> Process.sleep(10) && wait_for_remote_view(node, topic, pid, tries - 1)
    end
  end

  defp wait_for_peers(n, tries \\ 200) do
    members = :pg.get_members(Observatory.PubSub.Peer.scope(@ps), :peers)

    cond do
      length(members) >= n -> :ok
      tries == 0 -> flunk("pg never saw #{n} peers: #{inspect(members)}")
      true -> Process.sleep(10) && wait_for_peers(n, tries - 1)
    end
  end
end
