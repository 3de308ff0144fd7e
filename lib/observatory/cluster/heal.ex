defmodule Observatory.Cluster.Heal do
  @moduledoc """
  Joins the sides of a partition again, with nothing but the network coming back.

  During a partition each side's Mnesia runs on its own (Erlang/OTP's `global`
  turns even one broken link into a full partition: every node it isolates is a side
  of its own). When the nodes can reach each other again, Mnesia reports
  `inconsistent_database` and keeps the sides apart: they stay apart until
  something joins them. `Observatory.Cluster.Monitor` runs `run/1` on the leader (the
  node whose name sorts first among the cluster's nodes that reach each other)
  whenever a node reaches another whose Mnesia runs apart:

    1. Every member tells its view (`view/0`): whether its Mnesia runs, which
       nodes it is connected to, which nodes its Mnesia runs with. Nothing happens
       until every member answers and every member reaches every other (a link still
       broken is a partition still under way).
    2. `decide/1` picks the winner: the largest side; between sides of one size,
       the one holding the node whose name sorts first. The others lose.
    3. Every member's write gate closes (`Observatory.Cluster.Gate`), each losing
       node joins the winner's Mnesia (`:mnesia.change_config(:extra_db_nodes, …)`,
       which keeps both sides' contents), then `Observatory.Cluster.Reconcile` merges
       the replicas, the winner's versions breaking ties, and the gates open.

  Unlike RabbitMQ's `autoheal`, no node restarts and nothing written on the losing
  side is thrown away: the merge rules (`Observatory.Cluster.Merge`) keep every
  pause, deactivation, revocation and block made on either side.
  """

  require Logger

  alias Observatory.Cluster
  alias Observatory.Cluster.{Gate, Reconcile}

  @type view :: %{
          node: node(),
          mnesia: atom(),
          running: [node()],
          connected: [node()]
        }

  @doc "This node's view of the cluster, for the leader."
  @spec view() :: view()
  def view do
    mnesia = :mnesia.system_info(:is_running)

    %{
      node: node(),
      mnesia: mnesia,
      running:
        if(mnesia == :yes, do: Enum.sort(:mnesia.system_info(:running_db_nodes)), else: []),
      connected: Enum.sort(Node.list())
    }
  end

  @doc """
  What to do about the members' `views` (one per member): `:whole` (one Mnesia
  partition), `{:wait, reason}` (a member's Mnesia does not run, or a link is still
  broken), or `{:split, winner, losers}`.
  """
  @spec decide([view()]) :: :whole | {:wait, String.t()} | {:split, [node()], [node()]}
  def decide(views) do
    members = views |> Enum.map(& &1.node) |> Enum.sort()

    cond do
      not_running = Enum.find(views, &(&1.mnesia != :yes)) ->
        {:wait, "Mnesia is #{not_running.mnesia} on #{not_running.node}"}

      cut = broken_link(views, members) ->
        {a, b} = cut
        {:wait, "#{a} cannot reach #{b}"}

      true ->
        sides =
          views
          |> Enum.map(fn view -> Enum.sort(Enum.filter(view.running, &(&1 in members))) end)
          |> Enum.uniq()

        cond do
          sides == [members] ->
            :whole

          # Views taken while Mnesia was still telling its nodes about a join or a
          # loss: look again at the next poll.
          Enum.sum(Enum.map(sides, &length/1)) != length(members) ->
            {:wait, "the members' views of their Mnesia partitions disagree"}

          true ->
            winner = Enum.min_by(sides, &{-length(&1), Enum.min(&1, fn -> nil end)})
            {:split, winner, members -- winner}
        end
    end
  end

  defp broken_link(views, members) do
    Enum.find_value(views, fn view ->
      case (members -- [view.node]) -- view.connected do
        [] -> nil
        [other | _] -> {view.node, other}
      end
    end)
  end

  @doc """
  Runs `fun` holding the cluster's heal lock on `nodes` (`:global`), or returns
  `:aborted` at once when another process holds it: one heal at a time. The lock is
  taken for the calling process (a lock requester shared by every caller would let
  them all in).
  """
  @spec exclusive([node()], (() -> result)) :: result | :aborted when result: term()
  def exclusive(nodes, fun), do: :global.trans({__MODULE__, self()}, fun, nodes, 0)

  @doc "Who holds the heal lock as this node's `:global` knows, for a warning."
  @spec lock_holder() :: String.t()
  def lock_holder do
    case :ets.lookup(:global_locks, __MODULE__) do
      [{_, _requester, [{pid, _} | _]}] ->
        "the heal lock is held by #{inspect(pid)} on #{node(pid)}"

      _ ->
        "the heal lock was held elsewhere"
    end
  rescue
    ArgumentError -> "the heal lock was held elsewhere"
  end

  @doc """
  Asks every member for its view and heals when the cluster is split (see the
  module doc). Returns `:whole`, `{:wait, reason}`, `{:healed, report}` or
  `{:error, reason}`.
  """
  @spec run([node()]) ::
          :whole | {:wait, String.t()} | {:healed, map()} | {:error, String.t()}
  def run(members) do
    case gather(members) do
      {:ok, views} ->
        case decide(views) do
          {:split, winner, losers} -> heal(members, winner, losers)
          other -> other
        end

      {:error, _} = error ->
        error
    end
  end

  defp gather(members) do
    results = :erpc.multicall(members, __MODULE__, :view, [], Cluster.rpc_timeout())

    case Enum.find(Enum.zip(members, results), &(not match?({_, {:ok, _}}, &1))) do
      nil -> {:ok, for({:ok, view} <- results, do: view)}
      {member, {_, reason}} -> {:error, "#{member} did not tell its view: #{inspect(reason)}"}
    end
  end

  defp heal(members, winner, losers) do
    started = System.monotonic_time(:millisecond)

    Logger.warning(
      "cluster: partition detected: #{inspect(losers)} run apart from #{inspect(winner)}; " <>
        "joining them to #{inspect(winner)} and reconciling"
    )

    hold = Cluster.setting(:heal_timeout_ms)
    _ = :erpc.multicall(members, Gate, :close, [hold], Cluster.rpc_timeout())

    try do
      for loser <- losers do
        case :erpc.call(loser, :mnesia, :change_config, [:extra_db_nodes, winner], hold) do
          {:ok, _} -> :ok
          other -> throw({:join, loser, other})
        end
      end

      :ok = await_whole(members, System.monotonic_time(:millisecond) + min(hold, 5_000))
      report = Reconcile.run(winner)

      {:healed,
       Map.merge(report, %{
         kind: :heal,
         winner: winner,
         losers: losers,
         duration_ms: System.monotonic_time(:millisecond) - started
       })}
    catch
      {:join, loser, other} ->
        {:error, "#{loser} could not join #{inspect(winner)}: #{inspect(other)}"}

      :timeout ->
        {:error, "the members did not agree on one Mnesia partition in time"}

      # A link broke again while healing (a member does not answer, a reconcile's
      # transaction aborts): the next poll starts over.
      kind, reason ->
        {:error, "healing stopped: #{Exception.format_banner(kind, reason)}"}
    after
      _ = :erpc.multicall(members, Gate, :open, [], Cluster.rpc_timeout())
    end
  end

  # Mnesia tells the other nodes about a join asynchronously.
  defp await_whole(members, deadline) do
    running =
      for {:ok, nodes} <-
            :erpc.multicall(
              members,
              :mnesia,
              :system_info,
              [:running_db_nodes],
              Cluster.rpc_timeout()
            ),
          do: Enum.sort(nodes)

    cond do
      length(running) == length(members) and Enum.all?(running, &(members -- &1 == [])) -> :ok
      System.monotonic_time(:millisecond) > deadline -> throw(:timeout)
      true -> Process.sleep(20) && await_whole(members, deadline)
    end
  end
end
