defmodule Observatory.Cluster.Merge do
  @moduledoc """
  The rules that decide one record when replicas disagree (`Observatory.Cluster.Reconcile`).

  Each rule sees every replica's version of one key (`nil` where a replica has none)
  and returns the record to keep everywhere, or a deletion. The rules follow one
  principle: **a deletion made on purpose holds** (its tombstone covers the version
  it removed, `Observatory.Cluster.Tombstones`), and otherwise **the safer state
  wins**:

  | table | rule |
  |---|---|
  | agents | deleted if its tombstone covers every version; else inactive if any version is inactive by a deactivation no other version's activation undid; settings from the latest version |
  | agent keys | revoked (deleted) if revoked anywhere or its agent was deleted; else kept |
  | agent events, HITL audit log, tombstones, signed-out dashboard sessions | union (nothing is lost; an agent's events go with the agent) |
  | HITL pauses, step-detector blocks | kept unless a tombstone covers that very pause or block (a resume or a reset of it); a pause or block made on one side holds |
  | any other `observatory_*` table | union; where versions differ, the base's (the side that won the partition, or the running cluster a restarted node joins) |

  Rules are pure functions of the versions and of `ctx`, a map of lookups:
  `:buried?` (`fn table, key, identity -> boolean end`), `:agent_gone?`
  (`fn agent_id -> boolean end`: deleted on purpose and absent once reconciled).
  A decision is `{:keep, record, note}` or `{:delete, note}`; `note` is `nil` for a
  routine copy (counted in the report) and a sentence for a decision an operator
  should see (listed in the report and the log).
  """

  @agents :observatory_agents
  @events :observatory_agent_events
  @keys :observatory_agent_keys
  @revoked_sessions :observatory_revoked_sessions
  @pauses :observatory_hitl_pauses
  @blocks :observatory_step_blocks
  @tombstones :observatory_tombstones

  @type version :: {node(), tuple() | nil}
  @type decision :: {:keep, tuple(), String.t() | nil} | {:delete, String.t() | nil}

  @doc """
  The order tables are reconciled in: tombstones first (every rule reads them), then
  agents (keys and events depend on whether their agent survived), then the rest.
  """
  @spec order([atom()]) :: [atom()]
  def order(tables) do
    first = [@tombstones, @agents]
    Enum.filter(first, &(&1 in tables)) ++ Enum.sort(tables -- first)
  end

  @doc "Decides `key` of `table` from the replicas' `versions`; `base` is the nodes whose version wins a tie."
  @spec decide(atom(), term(), [version()], [node()], map()) :: decision()
  def decide(table, key, versions, base, ctx)

  def decide(@agents, id, versions, base, ctx) do
    live =
      for {node, {@agents, ^id, agent}} <- versions,
          not covered?(ctx, @agents, id, agent),
          do: {node, agent}

    cond do
      live == [] -> {:delete, "agent #{inspect(id)}: deleted (its deletion holds)"}
      true -> merge_agent(id, live, versions, base)
    end
  end

  def decide(@keys, hash, versions, _base, ctx) do
    record = present(versions) |> List.first()
    {@keys, ^hash, agent_id, info} = record

    cond do
      ctx.buried?.(@keys, hash, :revoked) ->
        {:delete,
         "agent key #{info.key_id} of #{inspect(agent_id)}: revoked (its revocation holds)"}

      ctx.agent_gone?.(agent_id) ->
        {:delete, "agent key #{info.key_id} of #{inspect(agent_id)}: its agent was deleted"}

      true ->
        {:keep, record, routine_or("agent key #{info.key_id} of #{inspect(agent_id)}", versions)}
    end
  end

  def decide(@events, {agent_id, _, _} = _key, versions, _base, ctx) do
    if ctx.agent_gone?.(agent_id),
      do: {:delete, nil},
      else: {:keep, List.first(present(versions)), nil}
  end

  def decide(@revoked_sessions, _sid, versions, _base, _ctx) do
    {:keep, Enum.max_by(present(versions), &elem(&1, 2)), nil}
  end

  def decide(table, key, versions, base, ctx) when table in [@pauses, @blocks] do
    what = if table == @pauses, do: "paused", else: "blocked by the step detector"

    live =
      for {node, {^table, ^key, entry} = r} <- versions,
          not covered?(ctx, table, key, entry),
          do: {node, r}

    case live do
      [] ->
        {:delete, "session #{inspect(key)}: no longer #{what} (resumed or reset, which holds)"}

      live ->
        {_node, record} = Enum.find(live, &(elem(&1, 0) in base)) || Enum.min_by(live, &at_of/1)
        missing = for {node, nil} <- versions, do: node

        note =
          if missing == [],
            do: nil,
            else:
              "session #{inspect(key)}: #{what} on #{nodes(Enum.map(live, &elem(&1, 0)))}, not on #{nodes(missing)}: #{what} everywhere"

        {:keep, record, note}
    end
  end

  # Union: the audit log (keys never collide across nodes), tombstones and any
  # other table; where two versions of one key differ, the base's.
  def decide(_table, _key, versions, base, _ctx) do
    present = for {node, r} <- versions, r != nil, do: {node, r}
    {_node, record} = Enum.find(present, &(elem(&1, 0) in base)) || hd(present)
    {:keep, record, nil}
  end

  ## Agents

  defp merge_agent(id, live, versions, base) do
    agents = Enum.map(live, &elem(&1, 1))
    latest = Enum.max_by(agents, &{unix(&1[:updated_at]), &1 in base_agents(live, base)})

    undone =
      for %{active: true} = a <- agents, a[:reactivated_from] != nil, do: a.reactivated_from

    # A deactivation holds unless an activation that came after it (and says so) undid it.
    holding =
      for %{active: false} = a <- agents,
          not Enum.any?(undone, &same_time?(&1, a[:deactivated_at])),
          do: a

    merged =
      case holding do
        [] ->
          latest

        holding ->
          deactivation = Enum.min_by(holding, &unix(&1[:deactivated_at]))

          Map.merge(latest, %{
            active: false,
            deactivated_by: deactivation.deactivated_by,
            deactivated_at: deactivation.deactivated_at
          })
      end

    merged = Map.put(merged, :created_at, Enum.min_by(agents, &unix(&1[:created_at])).created_at)
    {:keep, {@agents, id, merged}, agent_note(id, merged, live, versions)}
  end

  defp base_agents(live, base), do: for({node, a} <- live, node in base, do: a)

  defp agent_note(id, merged, live, versions) do
    states = for {node, a} <- live, do: {node, a.active}
    missing = for {node, nil} <- versions, do: node

    cond do
      Enum.uniq_by(states, &elem(&1, 1)) |> length() > 1 and merged.active == false ->
        active_on = for {node, true} <- states, do: node

        "agent #{inspect(id)}: inactive on #{nodes(for {n, false} <- states, do: n)}, active on " <>
          "#{nodes(active_on)}: kept inactive (#{merged.deactivated_by}, #{format_time(merged.deactivated_at)}), the safer state"

      Enum.uniq_by(states, &elem(&1, 1)) |> length() > 1 ->
        "agent #{inspect(id)}: its activation came after the deactivation it undid: active"

      missing != [] ->
        "agent #{inspect(id)}: registered on #{nodes(Enum.map(live, &elem(&1, 0)))} only: copied everywhere"

      true ->
        nil
    end
  end

  ## Helpers

  defp covered?(ctx, table, key, version), do: ctx.buried?.(table, key, identity(table, version))

  @doc "The identity a tombstone records for a version of a record (see `Observatory.Cluster.Tombstones`)."
  @spec identity(atom(), term()) :: term()
  def identity(@agents, agent), do: agent[:created_at]
  def identity(@pauses, entry), do: entry[:at]
  def identity(@blocks, block), do: block[:at]
  def identity(@keys, _info), do: :revoked

  defp present(versions), do: for({_node, r} <- versions, r != nil, do: r)

  defp routine_or(what, versions) do
    missing = for {node, nil} <- versions, do: node

    if missing == [],
      do: nil,
      else: "#{what}: issued while #{nodes(missing)} could not see it: copied everywhere"
  end

  defp at_of({_node, {_table, _key, entry}}), do: unix(entry[:at])

  defp unix(%DateTime{} = t), do: DateTime.to_unix(t, :microsecond)
  defp unix(_), do: 0

  defp same_time?(%DateTime{} = a, %DateTime{} = b), do: DateTime.compare(a, b) == :eq
  defp same_time?(_, _), do: false

  defp format_time(%DateTime{} = t), do: DateTime.to_iso8601(t)
  defp format_time(other), do: inspect(other)

  defp nodes(list), do: list |> Enum.sort() |> Enum.map_join(", ", &to_string/1)
end
