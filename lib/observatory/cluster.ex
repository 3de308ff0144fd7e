defmodule Observatory.Cluster do
  @moduledoc """
  Several gateways as one cluster, with OTP's own parts (design.md §8, issue 14):
  Erlang distribution connects the nodes, a `:pg` group agrees on the live members,
  and every session has one owner among them, chosen by rendezvous hashing of its
  session id (`owner/2`). Agent and operator state is replicated by Mnesia
  (`Observatory.Cluster.Store`).

      config :observatory, :cluster,
        nodes: [:"obs@10.0.0.1", :"obs@10.0.0.2"],   # static list (libcluster's Epmd)
        dns: "observatory.internal",                 # A records, polled (DNSPoll)
        dns_basename: "obs",                         # → :"obs@<address>"
        dns_nameservers: [{{10, 0, 0, 2}, 53}],      # optional; default: the system's
        poll_ms: 5_000,
        rpc_timeout_ms: 5_000,
        join_timeout_ms: 30_000

  Off unless `:nodes` or `:dns` is set: a single node starts neither the `:pg` scope
  nor this process, and `owner/2` answers `node()` after one `:persistent_term` read.

  Members are the nodes whose `Observatory.Cluster.Member` process is in the `:pg`
  group — gateways, not every connected node (a remote console, a test runner). The
  member list is kept in `:persistent_term` and rewritten only when it changes.
  """

  use GenServer
  require Logger

  @scope :observatory_cluster
  @group :gateways
  @members_key {__MODULE__, :members}

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

  @doc false
  def rpc_timeout, do: Keyword.get(config(), :rpc_timeout_ms, 5_000)

  @doc """
  The application's children with clustering around them (nothing when it is off):
  the `:pg` scope and this process first (Mnesia joins the cluster when the agent
  store starts), `Observatory.Cluster.Member` last — a node becomes a member, and
  gets sessions to own, only once everything that scores them runs, and leaves
  first when it stops.
  """
  @spec wrap([Supervisor.child_spec() | module() | {module(), term()}]) :: list()
  def wrap(children) do
    if enabled?(),
      do:
        [%{id: :pg, start: {:pg, :start_link, [@scope]}}, __MODULE__] ++
          children ++ [Observatory.Cluster.Member],
      else: children
  end

  @doc false
  def scope, do: @scope
  @doc false
  def group, do: @group

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
    Enum.max_by(members, &{:erlang.phash2({session_id, &1}), &1})
  end

  @doc """
  `apply(module, fun, args)` on the owner of `session_id` (`:erpc.call/5`), for the
  reads and commands that need the session's state there — the session API, the
  dashboard's Inspect, a step-detector reset. Here when clustering is off, when this
  node owns the session, or when the owner does not answer (it holds nothing then
  that another node could give).
  """
  @spec on_owner(String.t(), module(), atom(), list()) :: term()
  def on_owner(session_id, module, fun, args) do
    case owner(session_id) do
      owner when owner == node() ->
        apply(module, fun, args)

      owner ->
        try do
          :erpc.call(owner, module, fun, args, rpc_timeout())
        catch
          :error, {:erpc, _} -> apply(module, fun, args)
        end
    end
  end

  @doc """
  `{:ok, apply(module, fun, args)}` on the owner of `session_id`, and never on a node
  that does not own it: for answers that authorize (whose session is this?), where a
  local read of a session this node does not hold would say "nobody's". An owner that
  is gone (distribution says so) hands over to the next owner, as a step does
  (`SchemaInterceptor`); one that does not answer in time is
  `{:error, :owner_unavailable}`, for the caller to answer `503`.
  """
  @spec call_owner(String.t(), module(), atom(), list(), [node()]) ::
          {:ok, term()} | {:error, :owner_unavailable}
  def call_owner(session_id, module, fun, args, down \\ []) do
    case owner(session_id, down) do
      owner when owner == node() ->
        {:ok, apply(module, fun, args)}

      owner ->
        try do
          {:ok, :erpc.call(owner, module, fun, args, rpc_timeout())}
        catch
          :error, {:erpc, :noconnection} ->
            call_owner(session_id, module, fun, args, [owner | down])

          :error, {:erpc, _timeout_or_other} ->
            {:error, :owner_unavailable}
        end
    end
  end

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

    for candidate <- candidates(),
        candidate in connected or Node.connect(candidate) == true,
        do: candidate
  end

  @doc "Membership, for the dashboard and operators."
  @spec status() :: %{members: [node()], inconsistent: [node()]}
  def status do
    if enabled?(),
      do: GenServer.call(__MODULE__, :status),
      else: %{members: [node()], inconsistent: []}
  end

  ## The process

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @impl true
  def init(_opts) do
    _ = connect()
    {ref, _pids} = :pg.monitor(@scope, @group)
    state = subscribe_mnesia(%{ref: ref, inconsistent: [], mnesia: false})
    publish()
    schedule_poll()
    {:ok, state}
  end

  # Mnesia starts after this process (Observatory.Cluster.Store): subscribe once it runs.
  defp subscribe_mnesia(%{mnesia: true} = state), do: state

  defp subscribe_mnesia(state) do
    case :mnesia.subscribe(:system) do
      {:ok, _} -> %{state | mnesia: true}
      {:error, _} -> state
    end
  end

  @impl true
  def handle_call(:status, _from, state) do
    {:reply, %{members: members(), inconsistent: state.inconsistent}, state}
  end

  @impl true
  def handle_info({ref, action, @group, _pids}, %{ref: ref} = state)
      when action in [:join, :leave] do
    # This node's Member joins once Mnesia runs: subscribe first, then publish.
    state = subscribe_mnesia(state)
    publish()
    {:noreply, state}
  end

  def handle_info(:poll, state) do
    _ = connect()
    publish()
    schedule_poll()
    {:noreply, subscribe_mnesia(state)}
  end

  # A partition healed with writes on both sides: Mnesia does not merge them. The
  # README's "Cluster" section has the operator's action.
  def handle_info({:mnesia_system_event, {:inconsistent_database, context, node}}, state) do
    Logger.error(
      "cluster: Mnesia's tables on #{node} diverged from this node's (#{inspect(context)}) " <>
        "after a network partition; restart the nodes of the side to discard with an empty " <>
        "Mnesia directory (README, \"Cluster\")"
    )

    {:noreply, %{state | inconsistent: Enum.uniq([node | state.inconsistent])}}
  end

  def handle_info({:mnesia_system_event, _}, state), do: {:noreply, state}

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, _state) do
    :persistent_term.erase(@members_key)
    :ok
  end

  defp publish do
    members =
      @scope
      |> :pg.get_members(@group)
      |> Enum.map(&node/1)
      |> Enum.uniq()
      |> Enum.sort()

    if :persistent_term.get(@members_key, nil) != members do
      :persistent_term.put(@members_key, members)
    end
  end

  defp schedule_poll,
    do: Process.send_after(self(), :poll, Keyword.get(config(), :poll_ms, 5_000))
end
