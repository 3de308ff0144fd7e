# The dashboard's cost per open tab, against the size of the fleet.
#
#   MIX_ENV=test mix run bench/dashboard.exs              # 1k and 1M sessions
#   MIX_ENV=test mix run bench/dashboard.exs -- --quick   # 1k and 100k
#
# A manager page (ObservatoryWeb.SessionClusterManager) refreshes every
# :dashboard_refresh_ms (2 s). For each fleet size it measures, per refresh:
#
#   * per tab, scanning: what every tab did before issue 13 — its own snapshot (the
#     tracker's newest 500 sessions, the loop verdict's flagged ones, the pauses, the
#     step detector's streaks) and a render;
#   * shared scan: that snapshot, computed once per refresh for all tabs
#     (ObservatoryWeb.SnapshotCache);
#   * per tab, now: a tab's own refresh now (the shared listing, copied, and a
#     render); the shared scan comes on top once per refresh, whatever the tabs.
#
# Figures are medians of repeated runs, reported as ratios against the smallest
# fleet measured in the same run (the baseline), and as a share of one core per tab
# at one refresh every 2 s. Only the entropy tracker is filled (it holds every
# session; the loop verdict and the step detector hold none here).
alias Observatory.Gateway.{EntropyTracker, HITL, LoopVerdict, StepDetector}
alias ObservatoryWeb.SessionClusterManager, as: Manager
alias ObservatoryWeb.SessionClusterManager.{Fleet, Socket}

Logger.configure(level: :error)
quick? = "--quick" in System.argv()
sizes = if quick?, do: [1_000, 100_000], else: [1_000, 1_000_000]
tabs = 10
interval_ms = 2_000
runs = 15

fill = fn from, to ->
  statuses = [:success, :failure]

  for i <- from..(to - 1) do
    tuple = {"intent-#{rem(i, 7)}", "tool-#{rem(i, 11)}", Enum.at(statuses, rem(i, 2))}

    {:ok, _, _} =
      EntropyTracker.record_and_score("s-#{i}", tuple, agent_id: "agent-#{rem(i, 97)}")
  end
end

median_us = fn fun ->
  for(_ <- 1..runs, do: fun |> :timer.tc() |> elem(0)) |> Enum.sort() |> Enum.at(div(runs, 2))
end

flush = fn flush ->
  receive do
    _ -> flush.(flush)
  after
    0 -> :ok
  end
end

render = fn socket -> socket.assigns |> Manager.render() |> IO.iodata_to_binary() end

# What a tab computed on each refresh before the shared snapshot.
own_snapshot = fn ->
  flagged = LoopVerdict.flagged(500)

  EntropyTracker.sessions(limit: 500)
  |> Fleet.snapshot(HITL.paused_sessions())
  |> Fleet.put_verdicts(flagged)
  |> then(&{&1, StepDetector.active()})
end

measure = fn size ->
  {:ok, socket} = Manager.mount(%{}, %{"operator" => "bench"}, Socket.new(connected?: false))

  scanning =
    median_us.(fn ->
      {fleet, steps} = own_snapshot.()
      render.(Socket.assign(Socket.assign(socket, :fleet, fleet), :steps, steps))
    end)

  shared_scan = median_us.(own_snapshot)

  # A refresh as a tab runs it now; the shared listing is fresh for all but the first.
  {:noreply, _} = Manager.handle_info({Manager, :refresh}, socket)

  tab =
    median_us.(fn ->
      {:noreply, s} = Manager.handle_info({Manager, :refresh}, socket)
      render.(s)
    end)

  flush.(flush)
  %{size: size, scanning: scanning, shared_scan: shared_scan, tab: tab}
end

{results, _} =
  Enum.map_reduce(sizes, 0, fn size, filled ->
    fill.(filled, size)
    IO.puts(:stderr, "filled #{EntropyTracker.stats().sessions} sessions")
    {measure.(size), size}
  end)

[base | _] = results
share = fn us -> :erlang.float_to_binary(us / (interval_ms * 1000) * 100, decimals: 2) <> " %" end
ratio = fn a, b -> :erlang.float_to_binary(a / max(b, 1), decimals: 2) end

rows =
  Enum.map_join(results, "\n", fn r ->
    total = r.shared_scan + tabs * r.tab

    "| #{r.size} | #{r.scanning} µs (#{share.(r.scanning)}) | #{ratio.(r.scanning, base.scanning)} " <>
      "| #{r.tab} µs (#{share.(r.tab)}) | #{ratio.(r.tab, base.tab)} " <>
      "| #{r.shared_scan} µs (#{share.(r.shared_scan)}) | #{ratio.(r.shared_scan, base.shared_scan)} " <>
      "| #{share.(total)} (before: #{share.(tabs * r.scanning)}) |"
  end)

IO.puts("""

Dashboard cost per refresh (one every #{interval_ms} ms; medians of #{runs}; % = share of one core)

| sessions | per tab, before | ratio | per tab, now | ratio | shared scan, once for all tabs | ratio | #{tabs} tabs, now |
|---|---|---|---|---|---|---|---|
#{rows}

ratios: against #{base.size} sessions, measured in the same run
""")
