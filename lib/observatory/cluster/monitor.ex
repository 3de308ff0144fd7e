defmodule Observatory.Cluster.Monitor do
  @moduledoc """
  Watches the cluster from this node (started by `Observatory.Cluster.wrap/1`):

    * **Membership.** Connects to the configured and discovered nodes at start and
      every `:poll_ms` (in a separate process: a connection attempt to an unreachable
      host may take seconds), and publishes the `:pg` group's members
      (`Observatory.Cluster.members/0`) whenever they change.
    * **Frozen members.** Every `:heartbeat_ms` it asks each member for its name; a
      member that does not answer within `:member_timeout_ms` (a stopped or swamped
      VM, whose TCP connection stays open) is disconnected. Its Mnesia replica then
      leaves the running set, so writes that waited for it complete: an operator
      write is answered within `:member_timeout_ms` + `:heartbeat_ms`, instead of the
      distribution tick's 45–75 s. The member comes back like a partition heals.
    * **Partitions.** When this node reaches a member whose Mnesia runs apart
      (Mnesia's `inconsistent_database`, or a member outside its running set at a
      poll), it tells the leader — the node whose name sorts first among the
      cluster's nodes it reaches — which runs `Observatory.Cluster.Heal.run/1`, one
      heal at a time. Every `:verify_ms`, and soon after a node joins its Mnesia, the
      leader also compares the replicas (`Observatory.Cluster.Reconcile`) and merges
      any difference.
    * **Reports.** Each heal or reconcile that changed something is logged on every
      member (every decision an operator should see, one line each), broadcast to
      the member's own subscribers of `"gateway:cluster"`
      (`%{event_type: "cluster_reconciled", report: report}`) and
      kept (the last 20) for `Observatory.Cluster.status/0`.
    * **Stalls.** Nodes it reaches whose Mnesia still runs apart after
      `:heal_timeout_ms`, or a heal still running after it, are logged once per stall
      (`cluster: heal stalled: …`, naming the nodes, how long, and what the latest heal
      came to) and emitted as `[:observatory, :cluster, :heal_stalled]`
      (`Observatory.Cluster.HealWatch`).

  Nothing here blocks: every remote call runs in a process of its own.
  """

  use GenServer
  require Logger

  alias Observatory.Cluster
  alias Observatory.Cluster.{Heal, HealWatch, Reconcile, Tombstones}

  @history 20

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The topic of cluster events."
  def topic, do: "gateway:cluster"

  @doc "The latest reconcile reports, newest first (empty when the monitor does not run)."
  @spec history() :: [map()]
  def history do
    GenServer.call(__MODULE__, :history, 1_000)
  catch
    :exit, _ -> []
  end

  @doc false
  # A member suspects a partition: the leader looks (cast to the leader's monitor).
  def suspect(leader), do: GenServer.cast({__MODULE__, leader}, :check)

  @doc false
  # A report to keep and log here (sent by the node that reconciled).
  def record(node, report), do: GenServer.cast({__MODULE__, node}, {:record, report})

  @doc """
  Records and logs `report` on every member (the caller's own node included):
  what `Observatory.Cluster.Store` does after a restarted node's reconcile.
  """
  @spec announce(map()) :: :ok
  def announce(report) do
    for node <- audience(report), do: record(node, report)
    :ok
  end

  # Every node the report's reconcile ran on, and every member.
  defp audience(report),
    do: Enum.uniq([node() | Map.get(report, :nodes, [])] ++ Cluster.members())

  ## The process

  @impl true
  def init(_opts) do
    Process.flag(:trap_exit, true)
    _ = Cluster.connect()
    {ref, _pids} = :pg.monitor(Cluster.scope(), Cluster.group())
    :ok = :net_kernel.monitor_nodes(true)
    publish()

    state = %{
      ref: ref,
      mnesia: false,
      pings: %{},
      heal: nil,
      history: [],
      connector: nil,
      verify_soon: false,
      heal_watch: nil,
      last_outcome: nil
    }

    schedule(:poll, :poll_ms)
    schedule(:heartbeat, :heartbeat_ms)
    schedule(:verify, :verify_ms)
    {:ok, subscribe_mnesia(state)}
  end

  # Mnesia starts after this process (Observatory.Storage): subscribe once it runs.
  defp subscribe_mnesia(%{mnesia: true} = state), do: state

  defp subscribe_mnesia(state) do
    case :mnesia.subscribe(:system) do
      {:ok, _} -> %{state | mnesia: true}
      {:error, _} -> state
    end
  end

  @impl true
  def handle_call(:history, _from, state), do: {:reply, state.history, state}

  @impl true
  def handle_cast(:check, state), do: {:noreply, maybe_heal(state, :check)}

  def handle_cast({:record, report}, state) do
    log(report)
    broadcast(report)
    {:noreply, %{state | history: Enum.take([report | state.history], @history)}}
  end

  @impl true
  def handle_info({ref, action, _group, _pids}, %{ref: ref} = state)
      when action in [:join, :leave] do
    publish()
    {:noreply, state |> subscribe_mnesia() |> check_partition()}
  end

  def handle_info(:poll, state) do
    schedule(:poll, :poll_ms)
    publish()
    {:noreply, state |> connect() |> subscribe_mnesia() |> check_partition()}
  end

  def handle_info(:heartbeat, state) do
    schedule(:heartbeat, :heartbeat_ms)
    {:noreply, ping_members(state)}
  end

  def handle_info(:verify, state) do
    schedule(:verify, :verify_ms)
    {:noreply, maybe_heal(state, :verify)}
  end

  def handle_info({:pong, node, result}, state) do
    state = %{state | pings: Map.delete(state.pings, node)}
    if result == :timeout, do: disconnect(node)
    {:noreply, state}
  end

  def handle_info({:nodeup, _node}, state), do: {:noreply, check_partition(state)}
  def handle_info({:nodedown, _node}, state), do: {:noreply, state}

  # Mnesia found a member it had lost running on its own: a partition to heal.
  def handle_info({:mnesia_system_event, {:inconsistent_database, context, node}}, state) do
    Logger.warning(
      "cluster: Mnesia on #{node} ran apart from this node (#{inspect(context)}); " <>
        "the cluster heals it (Observatory.Cluster.Heal)"
    )

    {:noreply, check_partition(state)}
  end

  # A node joined this node's Mnesia: the leader compares the replicas soon, whoever
  # joined it (a restarted node merges its own copy; this catches any other way in).
  def handle_info({:mnesia_system_event, {:mnesia_up, _node}}, state) do
    unless state.verify_soon, do: Process.send_after(self(), :verify_soon, 1_000)
    {:noreply, %{state | verify_soon: true}}
  end

  def handle_info({:mnesia_system_event, _}, state), do: {:noreply, state}

  def handle_info(:verify_soon, state) do
    {:noreply, maybe_heal(%{state | verify_soon: false}, :verify)}
  end

  def handle_info({:heal_done, kind, result}, state) do
    {:noreply, finish(%{state | heal: nil}, kind, result)}
  end

  # The heal started `heal_timeout_ms` ago still runs: its write gates have expired.
  def handle_info({:heal_overdue, pid, kind, peers, started}, %{heal: pid} = state) do
    ms = now() - started
    where = with {:current_function, mfa} <- Process.info(pid, :current_function), do: mfa

    Logger.warning(
      "cluster: heal stalled: the heal (#{kind}) among #{inspect(peers)} has run for #{ms} ms, longer " <>
        "than heal_timeout_ms (#{Cluster.setting(:heal_timeout_ms)} ms); it is in " <>
        "#{inspect(where)}"
    )

    stalled(ms, %{reason: :overdue, nodes: peers, kind: kind})
    {:noreply, state}
  end

  def handle_info({:heal_overdue, _pid, _kind, _peers, _started}, state), do: {:noreply, state}

  def handle_info({:EXIT, pid, reason}, %{heal: pid} = state) do
    Logger.error("cluster: the heal failed: #{inspect(reason)}")
    {:noreply, %{state | heal: nil}}
  end

  def handle_info({:EXIT, pid, _reason}, %{connector: pid} = state),
    do: {:noreply, %{state | connector: nil}}

  def handle_info({:EXIT, _pid, _reason}, state), do: {:noreply, state}

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, _state) do
    :persistent_term.erase(Cluster.members_key())
    :ok
  end

  ## Membership

  defp publish do
    members = Cluster.pg_members()

    if :persistent_term.get(Cluster.members_key(), nil) != members do
      :persistent_term.put(Cluster.members_key(), members)
    end
  end

  defp connect(%{connector: nil} = state),
    do: %{state | connector: spawn_link(fn -> Cluster.connect() end)}

  defp connect(state), do: state

  ## Frozen members

  defp ping_members(state) do
    me = self()
    timeout = Cluster.setting(:member_timeout_ms)

    pings =
      for node <- Cluster.members(),
          node != node(),
          not Map.has_key?(state.pings, node),
          into: state.pings do
        {node, spawn(fn -> send(me, {:pong, node, ping(node, timeout)}) end)}
      end

    %{state | pings: pings}
  end

  defp ping(node, timeout) do
    _ = :erpc.call(node, :erlang, :node, [], timeout)
    :ok
  catch
    :error, {:erpc, :timeout} -> :timeout
    _, _ -> :down
  end

  defp disconnect(node) do
    timeout = Cluster.setting(:member_timeout_ms)

    Logger.error(
      "cluster: #{node} did not answer for #{timeout} ms (stopped, frozen or swamped); " <>
        "disconnected it so that writes do not wait for it. It rejoins and is " <>
        "reconciled once it answers again"
    )

    :erlang.disconnect_node(node)
  end

  ## Partitions

  # A node of the cluster this node reaches but whose Mnesia runs apart: tell the
  # leader. The cluster's nodes are Mnesia's (`db_nodes`) that distribution reaches —
  # known at once after a reconnection, where `:pg` membership catches up later.
  defp check_partition(state) do
    {peers, running} = reachable()
    leader = Enum.min(peers)
    # Mnesia not running here: not "whole again", just not known.
    state = watch_heal(state, if(running == [], do: :unknown, else: peers -- running), leader)

    cond do
      running == [] or peers -- running == [] -> state
      leader == node() -> maybe_heal(state, :check)
      true -> suspect(leader) && state
    end
  end

  defp reachable do
    db_nodes = :mnesia.system_info(:db_nodes)
    peers = Enum.sort([node() | Enum.filter(Node.list(), &(&1 in db_nodes))])
    {peers, :mnesia.system_info(:running_db_nodes)}
  catch
    :exit, _ -> {[node()], []}
  end

  defp maybe_heal(%{heal: nil} = state, kind) do
    {peers, running} = reachable()

    if running != [] and Enum.min(peers) == node() do
      me = self()

      pid =
        spawn_link(fn ->
          result = Heal.exclusive(peers, fn -> heal(kind, peers) end)
          send(me, {:heal_done, kind, result})
        end)

      overdue = {:heal_overdue, pid, kind, peers, now()}
      Process.send_after(self(), overdue, Cluster.setting(:heal_timeout_ms))
      %{state | heal: pid}
    else
      state
    end
  end

  defp maybe_heal(state, _kind), do: state

  defp heal(:check, members), do: Heal.run(members)

  defp heal(:verify, members) do
    _ = Tombstones.prune()

    case Heal.run(members) do
      :whole -> {:verified, Map.put(Reconcile.run(members), :kind, :verify)}
      other -> other
    end
  end

  defp finish(state, kind, result) do
    state = %{state | last_outcome: outcome(result)}
    act_on(state, kind, result)
  end

  defp act_on(state, _kind, {:healed, report}), do: share(state, report)
  defp act_on(state, _kind, {:verified, %{changed: 0}}), do: state
  defp act_on(state, _kind, {:verified, report}), do: share(state, report)

  defp act_on(state, kind, {:wait, reason}) do
    if kind == :check, do: Logger.info("cluster: not healing yet: #{reason}")
    state
  end

  defp act_on(state, _kind, {:error, reason}) do
    Logger.error("cluster: heal failed: #{reason}; retrying at the next poll")
    state
  end

  defp act_on(state, _kind, _whole_or_aborted), do: state

  # What the latest heal came to, for a stall's warning (nil: none finished yet). A heal
  # that found or made the cluster whole says so: a stall after it is news.
  defp outcome({:wait, reason}), do: "waiting: " <> reason
  defp outcome({:error, reason}), do: "failed: " <> reason
  defp outcome(:aborted), do: "not run: " <> Heal.lock_holder()
  defp outcome(:whole), do: "found every member's Mnesia running as one"
  defp outcome({:healed, _report}), do: "healed"
  defp outcome({:verified, _report}), do: "compared the replicas (nothing apart)"

  ## Stalls

  # Reached nodes still apart after `heal_timeout_ms`: said once per stall, with what
  # the latest heal on this node came to (only the leader runs heals).
  defp watch_heal(state, apart, leader) do
    timeout = Cluster.setting(:heal_timeout_ms)

    case HealWatch.see(state.heal_watch, apart, now(), timeout) do
      {watch, nil} ->
        %{state | heal_watch: watch}

      {watch, {:stalled, ms}} ->
        latest =
          if leader == node(),
            do: "this node leads; its latest heal: #{state.last_outcome || "none finished"}",
            else: "the leader, #{leader}, runs the heal"

        Logger.warning(
          "cluster: heal stalled: Mnesia on #{inspect(watch.apart)} has run apart from " <>
            "#{node()} for #{ms} ms, longer than heal_timeout_ms (#{timeout} ms), although " <>
            "they reach each other; #{latest}"
        )

        stalled(ms, %{reason: :apart, nodes: watch.apart, leader: leader, latest: latest})
        %{state | heal_watch: watch}

      {nil, {:ended, ms}} ->
        Logger.info(
          "cluster: the stalled heal is over: #{node()} runs whole again after #{ms} ms"
        )

        %{state | heal_watch: nil}
    end
  end

  defp stalled(ms, metadata) do
    Observatory.Telemetry.execute(
      [:observatory, :cluster, :heal_stalled],
      %{duration_ms: ms},
      Map.put(metadata, :node, node())
    )
  end

  defp now, do: System.monotonic_time(:millisecond)

  defp share(state, report) do
    for node <- audience(report), node != node(), do: record(node, report)
    handle_cast({:record, report}, state) |> elem(1)
  end

  defp log(%{changed: 0} = report) do
    Logger.info("cluster: #{describe(report)}: the replicas were already equal")
  end

  defp log(report) do
    Logger.warning(
      "cluster: #{describe(report)}: #{report.changed} record(s) reconciled " <>
        "#{inspect(report.tables)} in #{report.duration_ms} ms"
    )

    for note <- report.notes, do: Logger.warning("cluster: reconciled #{note}")
  end

  defp describe(%{kind: :heal} = r),
    do: "healed the partition of #{inspect(r.losers)} from #{inspect(r.winner)}"

  defp describe(%{kind: :restart} = r),
    do: "#{r.joined} rejoined #{inspect(r.base)} with its own copy"

  defp describe(%{kind: :verify}), do: "the replicas differed"
  defp describe(_), do: "reconciled"

  # To this node's subscribers only: every node records the report and tells its
  # own (a cluster-wide broadcast would reach each page once per node). A report
  # recorded while this node starts comes before the event bus runs.
  defp broadcast(report) do
    {module, server} = Observatory.Gateway.Events.pubsub()
    module.local_broadcast(server, topic(), %{event_type: "cluster_reconciled", report: report})
  rescue
    ArgumentError -> :ok
  end

  defp schedule(message, key), do: Process.send_after(self(), message, Cluster.setting(key))
end
