defmodule ObservatoryWeb.SessionClusterManager.View do
  @moduledoc """
  Renders the Session Cluster Manager's assigns as HTML iodata.

  Layout: a summary strip (sessions per state), the Entropy Alerts table beside the
  Inspect panel, and the fleet topology below. Every value that came from an agent
  (session and agent ids, intents, tool names, statuses) goes through
  `ObservatoryWeb.HTML.escape/1`; element ids are derived from a hash of the session
  id, never from the id itself. Buttons use LiveView's bindings (`phx-click`,
  `phx-value-session_id`), which Observatory's own page script understands too.

  Styles live in `priv/static/dashboard.css`, keyed on the classes used here
  (`state-alert_entropy` flashes red, `state-blocked` is amber `#f59e0b`).
  """

  import ObservatoryWeb.HTML, only: [escape: 1]

  alias ObservatoryWeb.SessionClusterManager.{Alerts, Fleet}

  @labels %{
    "active" => "active",
    "idle" => "idle",
    "blocked" => "blocked",
    "alert_entropy" => "entropy alert",
    "paused" => "paused"
  }

  @doc "The whole manager: its `parts/1`, in order."
  @spec render(map()) :: iodata()
  def render(assigns), do: Keyword.values(parts(assigns))

  @doc """
  The manager in the parts that change independently (`ObservatoryWeb.LiveParts`):
  the notice, the summary, the alerts, the Inspect panel, the topology, the step
  detector's blocks. Their concatenation is the page.
  """
  @spec parts(map()) :: [{atom(), iodata()}]
  def parts(assigns) do
    fleet = assigns.fleet

    [
      html_notice: [~s(<div id="scm" class="scm" data-live-root>), notice(assigns.notice)],
      html_summary: summary(fleet),
      html_alerts: [~s(<div class="scm-grid">), alerts_panel(assigns.alerts, fleet)],
      html_inspect: [inspector(assigns.inspect, fleet), "</div>"],
      html_steps: [steps_panel(Map.get(assigns, :steps, [])), "</div>"]
    ]
    |> List.insert_at(4, topology(fleet, Map.get(assigns, :agents_path, "/agents")))
    |> List.flatten()
  end

  @doc "The label shown for a node state."
  @spec label(String.t()) :: String.t()
  def label(state), do: Map.get(@labels, state, state)

  @doc "A DOM id for a session: a prefix and a short hash, never the raw id."
  @spec dom_id(String.t(), String.t()) :: String.t()
  def dom_id(prefix, session_id) do
    hash = :crypto.hash(:sha256, session_id) |> binary_part(0, 8) |> Base.encode16(case: :lower)
    prefix <> "-" <> hash
  end

  ## Notice

  defp notice(notice), do: ObservatoryWeb.HTML.notice("scm-notice", notice)

  ## Summary

  defp summary(fleet) do
    counts = Fleet.counts(fleet)

    [
      ~s(<section id="scm-summary" class="summary" aria-label="Fleet summary">),
      ~s(<div class="stat stat-total"><span class="stat-n">),
      escape(map_size(fleet)),
      ~s(</span><span class="stat-label">sessions</span></div>),
      for state <- Fleet.states() do
        [
          ~s(<div class="stat state-),
          state,
          ~s(" data-state="),
          state,
          ~s("><span class="stat-n">),
          escape(Map.fetch!(counts, state)),
          ~s(</span><span class="stat-label"><span class="dot"></span>),
          label(state),
          "</span></div>"
        ]
      end,
      "</section>"
    ]
  end

  ## Entropy Alerts

  defp alerts_panel(alerts, fleet) do
    rows = Alerts.rows(alerts)

    [
      ~s(<section id="alerts-panel" class="panel alerts" aria-labelledby="alerts-title">),
      ~s(<header class="panel-head"><h2 id="alerts-title">Entropy Alerts</h2>),
      ~s(<span class="pill" data-count="),
      escape(length(rows)),
      ~s(">),
      escape(length(rows)),
      if(length(rows) == 1, do: " session", else: " sessions"),
      "</span></header>",
      alerts_body(rows, fleet),
      "</section>"
    ]
  end

  defp alerts_body([], _fleet) do
    ~s(<p class="empty">No entropy alerts. A session whose score falls below 0.25 ) <>
      ~s(shows here once, however many alerts it sends.</p>)
  end

  defp alerts_body(rows, fleet) do
    [
      ~s(<div class="table-wrap"><table class="alerts-table"><thead><tr>),
      ~s(<th scope="col">Session · agent</th><th scope="col" class="num">Score</th>),
      ~s(<th scope="col">Repeated pattern · count</th><th scope="col">Last alert</th>),
      ~s(<th scope="col">State</th><th scope="col"><span class="sr-only">Action</span></th>),
      "</tr></thead><tbody>",
      Enum.map(rows, &alert_row(&1, Fleet.state_of(fleet, &1.session_id))),
      "</tbody></table></div>"
    ]
  end

  defp alert_row(row, state) do
    sid = escape(row.session_id)

    [
      ~s(<tr id="),
      dom_id("alert", row.session_id),
      ~s(" class="alert-row" data-session-id="),
      sid,
      ~s(" data-alerts="),
      escape(row.alerts),
      ~s(">),
      ~s(<td class="who"><span class="mono sid" title="),
      sid,
      ~s(">),
      sid,
      ~s(</span><span class="agent">),
      escape(row.agent_id),
      "</span></td>",
      ~s(<td class="num score">),
      score(row.score),
      "</td>",
      ~s(<td class="pattern"><span class="steps">),
      pattern(row.pattern),
      ~s(</span><span class="count">),
      escape(row.occurrence_count),
      " of ",
      escape(row.window_size),
      " steps in the window</span></td>",
      ~s(<td class="when">),
      time(row.at),
      alert_times(row.alerts),
      "</td>",
      "<td>",
      badge(state),
      "</td>",
      ~s(<td class="action"><button type="button" class="btn btn-pause" phx-click="pause_inspect" phx-value-session_id="),
      sid,
      ~s(">Pause and Inspect</button></td>),
      "</tr>"
    ]
  end

  defp alert_times(1), do: ""

  defp alert_times(n),
    do: [~s(<span class="muted" title="alerts received"> ×), escape(n), "</span>"]

  defp pattern(%{intent: intent, tool_call: tool, action_status: status}) do
    [
      ~s(<code>),
      escape(intent),
      ~s(</code><span class="arrow">→</span><code>),
      escape(tool),
      ~s(</code><span class="arrow">→</span>),
      status_tag(status)
    ]
  end

  defp status_tag(status) do
    s = escape(status)
    [~s(<span class="status status-), s, ~s(">), s, "</span>"]
  end

  ## Inspect

  defp inspector(nil, _fleet) do
    [
      ~s(<aside id="inspector" class="panel inspector" aria-labelledby="inspector-title">),
      ~s(<header class="panel-head"><h2 id="inspector-title">Inspect</h2></header>),
      ~s(<p class="empty">Choose <strong>Pause and Inspect</strong> on an alert: the session ),
      ~s(is paused and its current window shows here.</p>),
      "</aside>"
    ]
  end

  defp inspector(info, fleet) do
    sid = escape(info.session_id)
    paused? = info.pause != nil

    [
      ~s(<aside id="inspector" class="panel inspector" aria-labelledby="inspector-title" data-session-id="),
      sid,
      ~s(" data-paused="),
      to_string(paused?),
      ~s(">),
      ~s(<header class="panel-head"><h2 id="inspector-title">Inspect</h2>),
      ~s(<button type="button" class="btn btn-ghost" phx-click="close_inspect" phx-value-session_id="),
      sid,
      ~s(" aria-label="Close the Inspect panel">Close</button></header>),
      ~s(<dl class="facts">),
      fact("Session", [~s(<span class="mono">), sid, "</span>"]),
      fact("Agent", escape(info.agent_id || "unknown")),
      fact("Node", badge(Fleet.state_of(fleet, info.session_id) || state_of_info(info))),
      fact("Score", [score(info.score), " ", severity(info.severity)]),
      fact("Verdict", verdict_fact(Map.get(info, :verdict))),
      fact("Messages", escape(info.messages)),
      "</dl>",
      pause_box(info),
      window(info.window),
      "</aside>"
    ]
  end

  defp state_of_info(%{pause: pause}) when pause != nil, do: "paused"
  defp state_of_info(_), do: nil

  defp fact(term, value), do: ["<div><dt>", term, "</dt><dd>", value, "</dd></div>"]

  defp verdict_fact(nil), do: ~s(<span class="muted">–</span>)

  defp verdict_fact(v) do
    [
      verdict_tag(v.verdict, v.reason),
      ~s(<span class="verdict-reason">),
      escape(v.reason),
      evidence(v.evidence),
      "</span>"
    ]
  end

  defp evidence([]), do: ""
  defp evidence(steps), do: [" (steps ", escape(Enum.join(steps, ", ")), ")"]

  # The loop verdict next to the entropy score (issue 8).
  defp verdict_tag(nil, _reason), do: ""

  defp verdict_tag(verdict, reason) do
    v = escape(verdict)

    [
      ~s(<span class="verdict verdict-),
      v,
      ~s(" data-verdict="),
      v,
      ~s(" title="),
      escape(reason || "loop verdict: #{verdict}"),
      ~s(">),
      v,
      "</span>"
    ]
  end

  defp severity(nil), do: ""
  defp severity(sev), do: [~s(<span class="muted">), escape(sev), "</span>"]

  defp pause_box(%{pause: nil} = info) do
    [
      ~s(<div class="pause-box running"><p><strong>Running.</strong> The agent is not paused.</p>),
      ~s(<button type="button" class="btn btn-pause" phx-click="pause_inspect" phx-value-session_id="),
      escape(info.session_id),
      ~s(">Pause</button></div>)
    ]
  end

  defp pause_box(%{pause: pause} = info) do
    [
      ~s(<div class="pause-box paused"><p><strong>Paused</strong> by ),
      escape(pause.operator),
      " at ",
      time(pause.at),
      reason(pause.reason),
      ~s(. Its next steps are stored and answered with a pause directive.</p>),
      ~s(<button type="button" class="btn btn-resume" phx-click="resume" phx-value-session_id="),
      escape(info.session_id),
      ~s(">Resume</button></div>)
    ]
  end

  defp reason(""), do: ""
  defp reason(text), do: [" (", escape(text), ")"]

  defp window([]) do
    ~s(<h3>Current window</h3><p class="empty">The gateway holds no window for this session.</p>)
  end

  defp window(steps) do
    [
      ~s(<h3>Current window <span class="muted">oldest first, ),
      escape(length(steps)),
      if(length(steps) == 1, do: " step", else: " steps"),
      ~s(</span></h3><ol class="window">),
      for {intent, tool, status} <- steps do
        [
          ~s(<li><code>),
          escape(intent),
          ~s(</code><span class="arrow">→</span><code>),
          escape(tool),
          ~s(</code><span class="arrow">→</span>),
          status_tag(status),
          "</li>"
        ]
      end,
      "</ol>"
    ]
  end

  ## Topology

  # The topology in parts: its head, one part per state (the nodes are sorted by
  # state, so each state's nodes are a run of `<li>`s in the one list), its end. A
  # node that changes state resends its old and new state's nodes, not the fleet's.
  defp topology(fleet, agents_path) do
    nodes = Fleet.nodes(fleet)
    by_state = Enum.group_by(nodes, &Fleet.state/1)

    [
      html_topology: [
        ~s(<section id="topology-panel" class="panel topology" aria-labelledby="topology-title">),
        ~s(<header class="panel-head"><h2 id="topology-title">Fleet topology</h2>),
        ~s(<ul class="legend" aria-label="Legend">),
        for state <- Fleet.states() do
          [~s(<li class="state-), state, ~s("><span class="dot"></span>), label(state), "</li>"]
        end,
        "</ul></header>",
        if(nodes == [], do: empty_fleet(), else: ~s(<ul class="nodes">))
      ]
    ] ++
      for state <- Fleet.states() do
        {:"html_nodes_#{state}",
         Enum.map(Map.get(by_state, state, []), &fleet_node(&1, agents_path))}
      end ++
      [html_topology_end: [if(nodes == [], do: "", else: "</ul>"), "</section>"]]
  end

  ## Step detector (seed 002)

  defp steps_panel(steps) do
    [
      ~s(<section id="steps-panel" class="panel steps" aria-labelledby="steps-title">),
      ~s(<header class="panel-head"><h2 id="steps-title">Step detector</h2>),
      ~s(<span class="pill">stagnation: same code, same result · stuck: new code, same result</span></header>),
      steps_body(steps),
      "</section>"
    ]
  end

  defp steps_body([]) do
    ~s(<p class="empty">No session is repeating itself. Streaks show here as they grow; ) <>
      ~s(a blocked session waits for Reset.</p>)
  end

  defp steps_body(steps) do
    [
      ~s(<div class="table-wrap"><table><thead><tr><th>Session</th><th>Stagnation</th>),
      ~s(<th>Stuck</th><th>State</th><th></th></tr></thead><tbody>),
      for step <-
            Enum.sort_by(steps, &{not &1.blocked, -max(&1.stagnation_streak, &1.stuck_streak)}) do
        sid = escape(step.session_id)

        [
          ~s(<tr id="),
          dom_id("step", step.session_id),
          ~s(" data-session-id="),
          sid,
          ~s(" data-blocked="),
          to_string(step.blocked),
          ~s("><td class="mono">),
          sid,
          "</td><td>",
          escape(step.stagnation_streak),
          "</td><td>",
          escape(step.stuck_streak),
          "</td><td>",
          if(step.blocked,
            do:
              ~s(<span class="badge state-alert_entropy"><span class="dot"></span>blocked</span>),
            else: ~s(<span class="badge state-blocked"><span class="dot"></span>streak</span>)
          ),
          ~s(</td><td class="action"><button type="button" class="btn btn-resume" phx-click="reset_step" phx-value-session_id="),
          sid,
          ~s(">Reset</button></td></tr>)
        ]
      end,
      "</tbody></table></div>"
    ]
  end

  defp empty_fleet do
    ~s(<p class="empty">No sessions yet. An agent shows here once it sends a DecisionLog.</p>)
  end

  defp fleet_node(node, agents_path) do
    state = Fleet.state(node)
    sid = escape(node.session_id)

    [
      ~s(<li id="),
      dom_id("node", node.session_id),
      ~s(" class="node state-),
      state,
      ~s(" data-session-id="),
      sid,
      ~s(" data-state="),
      state,
      ~s(" title="),
      sid,
      ~s(">),
      ~s(<span class="node-head"><span class="dot"></span><span class="node-sid mono">),
      sid,
      "</span></span>",
      node_agent(node.agent_id, agents_path),
      ~s(<span class="node-foot"><span class="node-state">),
      label(state),
      ~s(</span><span class="node-signals">),
      verdict_tag(Map.get(node, :verdict), Map.get(node, :verdict_reason)),
      ~s(<span class="node-score" title="entropy score">),
      score(node.score),
      "</span></span></span></li>"
    ]
  end

  # The agent's name links to its Agent Detail page (which says so when the agent
  # has not used the kill switch proxy).
  defp node_agent(nil, _agents_path), do: ~s(<span class="node-agent">unknown agent</span>)

  defp node_agent(agent_id, agents_path) do
    [
      ~s(<a class="node-agent" href="),
      escape(ObservatoryWeb.AgentDetail.View.agent_path(agents_path, agent_id)),
      ~s(" title="Agent detail">),
      escape(agent_id),
      "</a>"
    ]
  end

  ## Small pieces

  defp badge(nil), do: ~s(<span class="badge">unknown</span>)

  defp badge(state) do
    [~s(<span class="badge state-), state, ~s(" data-state="), state, ~s(">)] ++
      [~s(<span class="dot"></span>), label(state), "</span>"]
  end

  defp score(nil), do: ~s(<span class="muted">–</span>)
  defp score(value) when is_float(value), do: :erlang.float_to_binary(value, decimals: 2)
  defp score(value) when is_integer(value), do: score(value / 1)

  defp time(%DateTime{} = at) do
    [
      ~s(<time datetime="),
      DateTime.to_iso8601(at),
      ~s(">),
      Calendar.strftime(at, "%H:%M:%S"),
      " UTC</time>"
    ]
  end
end
