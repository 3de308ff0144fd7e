defmodule Observatory.Cluster do
  @moduledoc """
  Several gateways as one cluster, with OTP's own parts (design.md §8): Erlang
  distribution connects the nodes, a `:pg` group agrees on the live members, and
  every session has one owner among them, chosen by rendezvous hashing of its
  session id (`owner/2`). Agent and operator state is replicated by Mnesia
  (`Observatory.Cluster.Store`); `Observatory.Cluster.Monitor` watches the members,
  disconnects one that stops answering, and heals partitions
  (`Observatory.Cluster.Heal`). The guide is `docs/cluster.md`.

      config :observatory, :cluster,
        nodes: [:"obs@10.0.0.1", :"obs@10.0.0.2"],   # static list (libcluster's Epmd)
        dns: "observatory.internal",                 # A records, polled (DNSPoll)
        dns_basename: "obs",                         # → :"obs@<address>"
        dns_nameservers: [{{10, 0, 0, 2}, 53}],      # optional; default: the system's
        poll_ms: 2_000,             # reconnect, re-read DNS, look for partitions
        rpc_timeout_ms: 5_000,      # a call to a session's owner
        join_timeout_ms: 30_000,    # a new node's wait for the cluster
        heartbeat_ms: 1_000,        # how often each member is pinged
        member_timeout_ms: 3_000,   # a member that does not answer is disconnected
        write_timeout_ms: 5_000,    # a write's wait while replicas are reconciled
        heal_timeout_ms: 15_000,    # the longest a heal holds writes
        load_timeout_ms: 30_000,    # a node's wait for tables it has no copy of
        verify_ms: 300_000          # how often the leader compares the replicas

  Every key has an environment variable (`config/runtime.exs`). Off unless `:nodes`
  or `:dns` is set: a single node starts neither the `:pg` scope nor the monitor,
  and `owner/2` answers `node()` after one `:persistent_term` read.

  Members are the nodes whose `Observatory.Cluster.Member` process is in the `:pg`
  group — gateways, not every connected node (a remote console, a test runner). The
  member list is kept in `:persistent_term` and rewritten only when it changes.
  """

  require Logger

  @scope :observatory_cluster
  @group :gateways
  # An atom: a tuple key costs ~40 ns more a read, and `owner/2` reads it every step.
  @members_key __MODULE__.Members
  @deadline_key {__MODULE__, :deadline}

  @defaults [
    poll_ms: 2_000,
    rpc_timeout_ms: 5_000,
    join_timeout_ms: 30_000,
    heartbeat_ms: 1_000,
    member_timeout_ms: 3_000,
    write_timeout_ms: 5_000,
    heal_timeout_ms: 15_000,
    load_timeout_ms: 30_000,
    verify_ms: 300_000
  ]

  ## Configuration

  @doc """
  Whether clustering is on: `:nodes` or `:dns` set, on a node that runs Erlang
  distribution (a VM started without a name — `mix observatory.replay`, a script —
  stays alone whatever the configuration says).
  """
  @spec enabled?() :: boolean()
  def enabled? do
    config = config()
    Node.alive?() and (config[:nodes] not in [nil, []] or config[:dns] not in [nil, ""])
  end

  @doc false
  def config, do: Application.get_env(:observatory, :cluster, [])

  @doc "A timing setting of `:cluster` (see the module doc), with its default."
  @spec setting(atom()) :: non_neg_integer()
  def setting(key), do: Keyword.get(config(), key, Keyword.fetch!(@defaults, key))

  @doc false
  def rpc_timeout, do: setting(:rpc_timeout_ms)

  @doc """
  The application's children with clustering around them (nothing when it is off):
  the `:pg` scope and the monitor first (Mnesia joins the cluster when the agent
  store starts), `Observatory.Cluster.Member` last — a node becomes a member, and
  gets sessions to own, only once everything that scores them runs, and leaves
  first when it stops.
  """
  @spec wrap([Supervisor.child_spec() | module() | {module(), term()}]) :: list()
  def wrap(children) do
    if enabled?(),
      do:
        [%{id: :pg, start: {:pg, :start_link, [@scope]}}, Observatory.Cluster.Monitor] ++
          children ++ [Observatory.Cluster.Member],
      else: children
  end

  @doc false
  def scope, do: @scope
  @doc false
  def group, do: @group
  @doc false
  def members_key, do: @members_key

  ## Membership and ownership

  @doc "The live members, sorted; `[node()]` when clustering is off."
  @spec members() :: [node()]
  def members, do: :persistent_term.get(@members_key, nil) || [node()]

  @doc """
  The node that owns `session_id`: the member with the highest hash of
  `{session_id, member}` (rendezvous hashing — a join or leave moves only the
  sessions that hash highest to that node). Nodes in `exclude` are skipped (an owner
  that just went down). `node()` when clustering is off.
  """
  @spec owner(String.t(), [node()]) :: node()
  def owner(session_id, exclude \\ []) do
    case :persistent_term.get(@members_key, nil) do
      nil -> node()
      [only] when exclude == [] -> only
      members -> rendezvous(session_id, members -- exclude)
    end
  end

  @doc false
  def rendezvous(_session_id, []), do: node()

  def rendezvous(session_id, members) do
    Enum.max_by(members, &rank(session_id, &1))
  end

  @doc """
  `members` in `session_id`'s rendezvous order: its owner first (`rendezvous/2`), then
  the node it fails over to when the owner is gone, and so on.
  """
  @spec rendezvous_order(String.t(), [node()]) :: [node()]
  def rendezvous_order(session_id, members),
    do: Enum.sort_by(members, &rank(session_id, &1), :desc)

  defp rank(session_id, member), do: {:erlang.phash2({session_id, member}), member}

  @doc false
  # The nodes whose `Observatory.Cluster.Member` is in the `:pg` group now, sorted:
  # what `members/0` reads once `Observatory.Cluster.Monitor` has published it.
  def pg_members do
    @scope
    |> :pg.get_members(@group)
    |> Enum.map(&node/1)
    |> Enum.uniq()
    |> Enum.sort()
  end

  @doc """
  `apply(module, fun, args)` on the owner of `session_id` (as `call_owner/5`: the next
  owner when it is gone), for reads that show a session (the dashboard's Inspect, the
  step detector's state). An owner that does not answer in time gives `default`:
  nothing is run again here.
  """
  @spec on_owner(String.t(), module(), atom(), list(), term()) :: term()
  def on_owner(session_id, module, fun, args, default \\ nil) do
    case call_owner(session_id, module, fun, args) do
      {:ok, result} -> result
      {:error, :owner_unavailable} -> default
    end
  end

  @doc """
  `{:ok, apply(module, fun, args)}` on the owner of `session_id`, and never on a node
  that does not own it: for answers that authorize (whose session is this?) and for
  commands that change the owner's state (a step-detector reset). An owner that is
  gone (distribution says so) hands over to the next owner, as a step does
  (`SchemaInterceptor`); one that does not answer within `:rpc_timeout_ms` is
  `{:error, :owner_unavailable}`, for the caller to answer `503`.

  A call is applied at most once. It carries a deadline: an owner that gets it late
  (a node frozen, then thawed) refuses it instead of running it after its caller was
  told it failed, and the caller never runs it elsewhere after a timeout. A command
  whose write passes `deadline/0` to `Observatory.Storage.transaction/3` (the
  step-detector reset) also gives up when its write would commit after the deadline
  (it waited for the write gate or a lock), so a `503` means it was not applied.
  """
  @spec call_owner(String.t(), module(), atom(), list(), [node()]) ::
          {:ok, term()} | {:error, :owner_unavailable}
  def call_owner(session_id, module, fun, args, down \\ []) do
    case owner(session_id, down) do
      owner when owner == node() ->
        {:ok, apply(module, fun, args)}

      owner ->
        case remote(owner, module, fun, args) do
          {:ok, result} -> {:ok, result}
          {:error, :noconnection} -> call_owner(session_id, module, fun, args, [owner | down])
          {:error, _timeout_or_late} -> {:error, :owner_unavailable}
        end
    end
  end

  @doc """
  `apply(module, fun, args)` on `node` within `:rpc_timeout_ms`, at most once:
  `{:ok, result}`, `{:error, :noconnection}` (it ran nowhere), `{:error, :timeout}`
  or `{:error, :late}` (the node got it after the deadline and did not run it).
  Raises what the call raised there.
  """
  @spec remote(node(), module(), atom(), list()) ::
          {:ok, term()} | {:error, :noconnection | :timeout | :late}
  def remote(node, module, fun, args) do
    timeout = rpc_timeout()
    # The owner finishes by the deadline; the rest of the timeout carries a write's
    # commit and the answer back.
    deadline = System.os_time(:millisecond) + timeout - div(timeout, 5)

    try do
      :erpc.call(node, __MODULE__, :run_before, [deadline, module, fun, args], timeout)
    catch
      :error, {:erpc, :noconnection} -> {:error, :noconnection}
      :error, {:erpc, :timeout} -> {:error, :timeout}
    end
  end

  @doc false
  # Runs on the remote node: only while the caller still waits for the answer.
  # (Wall clocks: the nodes' clocks must agree within a fraction of :rpc_timeout_ms,
  # as NTP keeps them.)
  def run_before(deadline, module, fun, args) do
    if System.os_time(:millisecond) <= deadline do
      Process.put(@deadline_key, deadline)
      {:ok, apply(module, fun, args)}
    else
      {:error, :late}
    end
  rescue
    # A write that would have committed after the deadline: nothing was written.
    error in Observatory.Cluster.Unavailable ->
      if error.reason == :late, do: {:error, :late}, else: reraise(error, __STACKTRACE__)
  end

  @doc """
  The wall-clock deadline (`System.os_time(:millisecond)`) of the owner call this
  process runs for another node (`remote/4`), or `nil`: the caller has been told the
  call failed once it passes. A command passes it to
  `Observatory.Storage.transaction/3` so that its write is not applied after that.
  """
  @spec deadline() :: integer() | nil
  def deadline, do: Process.get(@deadline_key)

  @doc """
  `apply(module, fun, args)` on every member, the lists they return concatenated:
  the fleet as the dashboard shows it. A member that does not answer in time is
  left out (its sessions reappear at the next snapshot).
  """
  @spec gather(module(), atom(), list()) :: list()
  def gather(module, fun, args) do
    case :persistent_term.get(@members_key, nil) do
      nil ->
        apply(module, fun, args)

      members ->
        for {:ok, list} <- :erpc.multicall(members, module, fun, args, rpc_timeout()),
            item <- list,
            do: item
    end
  end

  @doc """
  Configured and discovered nodes (static list and DNS), this node excluded. Used
  to connect, and by `Observatory.Cluster.Store` to find the cluster to join.
  """
  @spec candidates(keyword()) :: [node()]
  def candidates(config \\ config()) do
    static = Keyword.get(config, :nodes, [])
    Enum.uniq(static ++ dns_nodes(config)) -- [node()]
  end

  # The DNS name's A records, each `:"<dns_basename>@<address>"`; none when the name
  # does not resolve (the next poll tries again). `:dns_nameservers` (`[{ip, port}]`)
  # overrides the system's resolvers.
  defp dns_nodes(config) do
    case config[:dns] do
      name when name in [nil, ""] ->
        []

      name ->
        basename = Keyword.get(config, :dns_basename, "observatory")

        opts =
          [timeout: 2_000] ++
            List.wrap(config[:dns_nameservers] && {:nameservers, config[:dns_nameservers]})

        for address <- :inet_res.lookup(to_charlist(name), :in, :a, opts) do
          :"#{basename}@#{:inet.ntoa(address)}"
        end
    end
  end

  @doc "Connects to every candidate not yet connected; returns the connected ones."
  @spec connect() :: [node()]
  def connect do
    connected = Node.list()
    {known, new} = Enum.split_with(candidates(), &(&1 in connected))

    # In parallel: an unreachable host can hold a connection attempt for seconds.
    reached =
      new
      |> Task.async_stream(&{&1, Node.connect(&1)}, timeout: :infinity, max_concurrency: 32)
      |> Enum.flat_map(fn {:ok, {node, up?}} -> if up? == true, do: [node], else: [] end)

    known ++ reached
  end

  ## Partitions and majority

  @lowering [
    "activating an agent",
    "resuming a session",
    "lifting a step-detector block",
    "changing kill-switch settings",
    "changing budgets or guidance notes",
    "resetting a budget",
    "issuing or rotating an agent key"
  ]

  @doc """
  Whether this node's Mnesia runs with more than half of the cluster's nodes
  (`:mnesia.system_info(:db_nodes)`, every node that holds the schema). Always true
  when clustering is off.
  """
  @spec majority?() :: boolean()
  def majority? do
    if enabled?() do
      {db_nodes, running} = mnesia_nodes()
      2 * length(running -- running -- db_nodes) > length(db_nodes)
    else
      true
    end
  end

  @doc """
  `fun.()` when this node can reach a majority; else `{:error, :no_majority}` and a
  warning naming `action`. For the operator actions that lower safety state
  (activating an agent, resuming a session, lifting a block, changing kill-switch
  settings, issuing or rotating a key): a node cut off from the majority cannot
  know what the other side decided about the same agent or session meanwhile, and
  must not let an agent run on its side against it. Actions that raise safety state
  are never refused: they hold here at once and everywhere after the heal.
  """
  @spec with_majority(String.t(), (() -> result)) :: result | {:error, :no_majority}
        when result: term()
  def with_majority(action, fun) do
    if majority?() do
      fun.()
    else
      Logger.warning(
        "cluster: refused #{action}: #{node()} cannot reach a majority of " <>
          "#{inspect(elem(mnesia_nodes(), 0))} (it runs with #{inspect(elem(mnesia_nodes(), 1))})"
      )

      {:error, :no_majority}
    end
  end

  @doc "What a node without a majority refuses, as `with_majority/2` names it."
  @spec refused_without_majority() :: [String.t()]
  def refused_without_majority, do: @lowering

  @doc """
  The cluster as this node sees it, for operators (`/healthz`, the dashboard):

    * `:members` — the live gateways (`members/0`);
    * `:db_nodes` — every node that holds the replicated tables;
    * `:running` — the nodes this node's Mnesia runs with (its side of a partition);
    * `:unreachable` — `db_nodes` outside `running` (stopped, frozen, or across a
      partition); `:inconsistent` — members this node reaches but whose Mnesia runs
      apart (a partition not yet healed);
    * `:majority` — whether `running` holds more than half of `db_nodes`; when
      false, `:refused` names what this node refuses (`with_majority/2`);
    * `:healing` — whether writes are held while replicas are reconciled;
    * `:last_heal`, `:reconciliations` — the latest reports of
      `Observatory.Cluster.Reconcile` (what was merged, and the decisions an
      operator should see).

  With clustering off: `%{members: [node()], inconsistent: [], majority: true}` and
  nothing else.
  """
  @spec status() :: map()
  def status do
    if enabled?() do
      {db_nodes, running} = mnesia_nodes()
      members = members()
      majority = 2 * length(running -- running -- db_nodes) > length(db_nodes)
      history = Observatory.Cluster.Monitor.history()

      %{
        members: members,
        db_nodes: db_nodes,
        running: running,
        unreachable: db_nodes -- running,
        inconsistent: members -- running,
        majority: majority,
        refused: if(majority, do: [], else: @lowering),
        healing: Observatory.Cluster.Gate.closed?(),
        last_heal: Enum.find(history, &(&1[:kind] == :heal)),
        reconciliations: history
      }
    else
      %{members: [node()], inconsistent: [], majority: true}
    end
  end

  defp mnesia_nodes do
    {Enum.sort(:mnesia.system_info(:db_nodes)), Enum.sort(:mnesia.system_info(:running_db_nodes))}
  catch
    :exit, _ -> {[node()], []}
  end
end
