defmodule Observatory.Gateway.SessionOwners.Failover do
  @moduledoc """
  Keeps each session's owning agent on the node the session fails over to, so that
  losing the owner node does not hand the session id to whichever agent writes it
  next (`Observatory.Gateway.SessionOwners`).

  A session is owned by the first node of its rendezvous order
  (`Observatory.Cluster.rendezvous_order/2`) and fails over to the second. Each
  node sends the claims it holds to those two nodes (itself excluded):

    * a new claim at once, by the process that made it, with a send that never
      waits (`:noconnect`, `:nosuspend`): when the connection is busy, the claim is
      handed to this process, which waits for it instead of the step;
    * every claim it holds when the members change (a node lost, back or new: the
      sessions' first two nodes change with them) and every quarter of
      `:session_owner_ttl_ms`, which keeps their idle time current elsewhere.

  The receiver records a claim with `SessionOwners.adopt/3`: only where it has none
  (the first claim wins, never overwritten), within the agent's quota there.

  Messages go with `:noconnect`: a node that is not connected gets them when it
  (re)joins, as every member then sends it its claims. Until a new claim has arrived
  the failover node does not know it: the owner node would have to be lost within
  that window for another agent to take the session. Measured between two nodes on
  one busy machine (`bench/session_owner_failover.exs`): 0.2 ms median (0.7 ms p99)
  after the step was sent, mostly before its answer; 2–3 ms median (up to 19 ms)
  with new sessions back to back on a saturated node.
  """

  use GenServer
  require Logger

  alias Observatory.Cluster
  alias Observatory.Gateway.SessionOwners

  # Claims per message to one node.
  @chunk 1_000

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  A new claim, from `SessionOwners.claim/2`: sent to the session's failover node.
  Never waits; does nothing unless other members run.
  """
  @spec claimed(String.t(), String.t()) :: :ok
  def claimed(session_id, agent_id) do
    with [_, _ | _] = members <- Cluster.members() do
      claims = [{session_id, agent_id, 0}]

      for target <- targets(session_id, members),
          :erlang.send({__MODULE__, target}, message(claims), [:noconnect, :nosuspend]) ==
            :nosuspend,
          do: GenServer.cast(__MODULE__, {:send, target, claims})
    end

    :ok
  end

  @doc "Sends every claim held here to its sessions' first two nodes now."
  @spec push_all() :: :ok
  def push_all, do: GenServer.call(__MODULE__, :push_all, :infinity)

  ## The process

  @impl true
  def init(_opts) do
    # The :pg scope runs only with clustering on (Observatory.Cluster.wrap/1).
    ref =
      if Cluster.enabled?(),
        do: elem(:pg.monitor(Cluster.scope(), Cluster.group()), 0)

    schedule_refresh()
    {:ok, %{ref: ref}}
  end

  @impl true
  # A claim whose connection was busy: this process waits for it.
  def handle_cast({:send, target, claims}, state) do
    :erlang.send({__MODULE__, target}, message(claims), [:noconnect])
    {:noreply, state}
  end

  @impl true
  def handle_call(:push_all, _from, state), do: {:reply, push_all(members(state)), state}

  @impl true
  # Another node's claims.
  def handle_info({:session_owners, from, claims}, state) do
    conflicts =
      Enum.count(claims, fn {session_id, agent_id, idle_ms} ->
        match?({:owned_by, _}, SessionOwners.adopt(session_id, agent_id, idle_ms))
      end)

    if conflicts > 0 do
      Logger.warning(
        "cluster: #{conflicts} session(s) claimed by one agent on #{from} are another " <>
          "agent's here; kept this node's claim (the first claim wins)"
      )
    end

    {:noreply, state}
  end

  # A member joined or left: the sessions' first two nodes changed.
  def handle_info({ref, action, _group, _pids}, %{ref: ref} = state)
      when action in [:join, :leave] do
    drain_membership_changes(ref)
    push_all(members(state))
    {:noreply, state}
  end

  def handle_info(:refresh, state) do
    push_all(members(state))
    schedule_refresh()
    {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  ## Sending

  # The live members now (Observatory.Cluster.members/0 may not have caught up yet).
  defp members(%{ref: nil}), do: []
  defp members(_state), do: Cluster.pg_members()

  defp push_all([_, _ | _] = members) do
    SessionOwners.each_chunk(@chunk, &send_claims(&1, members))
  end

  defp push_all(_alone), do: :ok

  # Each claim to its session's first two members other than this node.
  defp send_claims(claims, [_, _ | _] = members) do
    claims
    |> Enum.flat_map(fn {session_id, _, _} = claim ->
      for target <- targets(session_id, members), do: {target, claim}
    end)
    |> Enum.group_by(&elem(&1, 0), &elem(&1, 1))
    |> Enum.each(fn {target, claims} ->
      for chunk <- Enum.chunk_every(claims, @chunk) do
        :erlang.send({__MODULE__, target}, message(chunk), [:noconnect])
      end
    end)
  end

  defp send_claims(_claims, _alone), do: :ok

  defp message(claims), do: {:session_owners, node(), claims}

  defp targets(session_id, members) do
    session_id |> Cluster.rendezvous_order(members) |> Enum.take(2) |> List.delete(node())
  end

  # A node lost or started moves many members at once: push once for all of them.
  defp drain_membership_changes(ref) do
    receive do
      {^ref, action, _group, _pids} when action in [:join, :leave] ->
        drain_membership_changes(ref)
    after
      0 -> :ok
    end
  end

  defp schedule_refresh do
    Process.send_after(self(), :refresh, max(div(SessionOwners.settings().ttl_ms, 4), 1_000))
  end
end
