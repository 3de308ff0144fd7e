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

  import ObservatoryWeb.HTML, only: [escape: 1, escape_exact: 1, spend: 1]

  alias Observatory.Gateway.{AlertSource, SessionLog}
  alias ObservatoryWeb.SessionClusterManager.{Alerts, Fleet}

  # The words the page uses for the topology's states (the broadcast keeps FR-9.5's
  # values: `blocked` is the amber WARNING state, not the step detector's block).
  @labels %{
    "active" => "active",
    "idle" => "idle",
    "blocked" => "warning",
    "alert_entropy" => "alert",
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
    source = Map.get(assigns, :alert_source, :entropy)

    [
      html_notice: [~s(<div id="scm" class="scm" data-live-root>), notice(assigns.notice)],
      html_summary: summary(fleet, source, Map.get(assigns, :held, 0)),
      html_alerts: [~s(<div class="scm-grid">), alerts_panel(assigns.alerts, fleet, source)],
      html_inspect: [
        inspector(assigns.inspect, fleet, Map.get(assigns, :expanded, []), source),
        "</div>"
      ],
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

  @doc "The alerts panel's title under an alert source."
  @spec alerts_title(:entropy | :verdict) :: String.t()
  def alerts_title(:entropy), do: "Entropy Alerts"
  def alerts_title(:verdict), do: "Verdict Alerts"

  ## Notice

  defp notice(notice), do: ObservatoryWeb.HTML.notice("scm-notice", notice)

  ## Summary

  # `held`: the sessions the gateway holds, of which the fleet shows the most recently
  # active (and every alerted or paused one); the state counts are of those shown.
  defp summary(fleet, source, held) do
    counts = Fleet.counts(fleet)
    shown = map_size(fleet)

    [
      ~s(<section id="scm-summary" class="summary" aria-label="Fleet summary" data-alert-source="),
      escape(source),
      ~s(">),
      ~s(<div class="stat stat-total"><span class="stat-n">),
      escape(max(held, shown)),
      ~s(</span><span class="stat-label">sessions),
      if(held > shown, do: [" · ", escape(shown), " shown"], else: ""),
      "</span></div>",
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

  ## Alerts

  defp alerts_panel(alerts, fleet, source) do
    rows = Alerts.rows(alerts)

    [
      ~s(<section id="alerts-panel" class="panel alerts" aria-labelledby="alerts-title" data-alert-source="),
      escape(source),
      ~s(">),
      ~s(<header class="panel-head"><h2 id="alerts-title">),
      alerts_title(source),
      ~s(</h2><span class="pill" data-count="),
      escape(length(rows)),
      ~s(">),
      escape(length(rows)),
      if(length(rows) == 1, do: " session", else: " sessions"),
      "</span></header>",
      ~s(<p class="panel-note">),
      source_note(source),
      "</p>",
      unalerted_loops(alerts, fleet, source),
      alerts_body(rows, fleet, source),
      "</section>"
    ]
  end

  defp source_note(:entropy) do
    "Sessions the <strong>entropy ratio</strong> calls a loop now (score below the LOOP " <>
      "threshold), newest first, once each."
  end

  defp source_note(:verdict) do
    "Sessions the <strong>loop verdict</strong> calls a loop now (verdict <code>loop</code>), " <>
      "newest first, once each."
  end

  # Under the entropy ratio, the sessions the loop verdict calls a loop that are not
  # alerted (free-text intents keep the ratio high): said, so the operator knows.
  defp unalerted_loops(alerts, fleet, :entropy) do
    missed =
      for node <- Fleet.nodes(fleet),
          node.verdict == :loop,
          Alerts.get(alerts, node.session_id) == nil,
          do: node.session_id

    case missed do
      [] ->
        ""

      ids ->
        [
          ~s(<p class="panel-note source-hint" data-count="),
          escape(length(ids)),
          ~s(">The loop verdict calls ),
          escape(length(ids)),
          if(length(ids) == 1, do: " more session", else: " more sessions"),
          " a loop (",
          ids
          |> Enum.take(3)
          |> Enum.map(&[~s(<span class="mono">), escape(&1), "</span>"])
          |> Enum.intersperse(", "),
          if(length(ids) > 3, do: ", …", else: ""),
          "); the entropy ratio does not. <code>OBSERVATORY_ALERT_SOURCE=verdict</code> ",
          if(length(ids) == 1, do: "would alert on it.", else: "would alert on them."),
          "</p>"
        ]
    end
  end

  defp unalerted_loops(_alerts, _fleet, :verdict), do: ""

  defp alerts_body([], _fleet, source) do
    [
      ~s(<p class="empty">No session is alerted now. A session shows here as soon as the ),
      escape(AlertSource.describe(source)),
      ~s( calls it a loop, and stays until it recovers.</p>)
    ]
  end

  defp alerts_body(rows, fleet, _source) do
    [
      ~s(<div class="table-wrap"><table class="alerts-table"><thead><tr>),
      ~s(<th scope="col">Session · agent</th><th scope="col" class="num">Score</th>),
      ~s(<th scope="col">Rule · why</th><th scope="col">Since · last alert</th>),
      ~s(<th scope="col"><span class="sr-only">Actions</span></th>),
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
      escape_exact(row.session_id),
      ~s(" data-alerts="),
      escape(row.alerts),
      ~s(" data-rule="),
      escape(row.rule),
      ~s(">),
      ~s(<td class="who"><span class="mono sid" title="),
      sid,
      ~s(">),
      sid,
      ~s(</span><span class="agent">),
      escape(row.agent_id || "unknown agent"),
      ~s(</span><span class="state">),
      badge(state),
      "</span></td>",
      ~s(<td class="num score"><span class="cell-label">Score </span>),
      score(row.score),
      "</td>",
      ~s(<td class="pattern"><span class="rule">),
      escape(row.rule),
      "</span>",
      why(row),
      "</td>",
      ~s(<td class="when"><span class="since">since ),
      time(row.since),
      ~s(</span><span class="last">last ),
      time(row.at),
      alert_times(row.alerts),
      "</span>",
      spent_since(Map.get(row, :usage)),
      "</td>",
      ~s(<td class="action">),
      row_actions(row.session_id, state == "paused"),
      "</td></tr>"
    ]
  end

  # Entropy: the repeated tuple and its count (FR-9.7); verdict: its reason.
  defp why(%{pattern: %{} = pattern, occurrence_count: count, window_size: size})
       when is_integer(count) and is_integer(size) do
    [
      ~s(<span class="steps">),
      pattern(pattern),
      ~s(</span><span class="count">),
      escape(count),
      " of ",
      escape(size),
      " steps in the window</span>"
    ]
  end

  defp why(row), do: [~s(<span class="reason">), escape(row.reason), "</span>"]

  # A paused session is inspected and resumed; a running one paused (FR-9.10) or
  # looked at first.
  defp row_actions(session_id, true = _paused?) do
    sid = escape_exact(session_id)

    [
      ~s(<button type="button" class="btn btn-ghost" phx-click="inspect" phx-value-session_id="),
      sid,
      ~s(">Inspect</button>),
      ~s(<button type="button" class="btn btn-resume" phx-click="resume" phx-value-session_id="),
      sid,
      ~s(">Resume</button>)
    ]
  end

  defp row_actions(session_id, false) do
    sid = escape_exact(session_id)

    [
      ~s(<button type="button" class="btn btn-ghost" phx-click="inspect" phx-value-session_id="),
      sid,
      ~s(">Inspect</button>),
      ~s(<button type="button" class="btn btn-pause" phx-click="pause_inspect" phx-value-session_id="),
      sid,
      ~s(">Pause and Inspect</button>)
    ]
  end

  defp alert_times(n) when n <= 1, do: ""

  defp alert_times(n),
    do: [~s(<span class="muted" title="alerts received"> ×), escape(n), "</span>"]

  defp pattern(%{intent: intent, tool_call: tool, action_status: status}) do
    [
      shown_code(intent),
      ~s(<span class="arrow">→</span>),
      shown_code(tool),
      ~s(<span class="arrow">→</span>),
      status_tag(status)
    ]
  end

  # An intent or a tool name can be 1 KiB (a proxied call's arguments are its intent):
  # the row shows its start, with the whole in its title and in Inspect's steps.
  @shown_chars 160
  defp shown_code(text) do
    if String.length(text) <= @shown_chars do
      [~s(<code>), escape(text), ~s(</code>)]
    else
      [
        ~s(<code class="cut" title="),
        escape(text),
        ~s(">),
        escape(String.slice(text, 0, @shown_chars)),
        "…</code>"
      ]
    end
  end

  defp status_tag(status) do
    s = escape(status)
    [~s(<span class="status status-), s, ~s(">), s, "</span>"]
  end

  ## Inspect

  defp inspector(nil, _fleet, _expanded, _source) do
    [
      ~s(<aside id="inspector" class="panel inspector" aria-labelledby="inspector-title">),
      ~s(<header class="panel-head"><h2 id="inspector-title">Inspect</h2></header>),
      ~s(<p class="empty">Choose <strong>Inspect</strong> on an alert or a fleet node to see the ),
      ~s(session's recent steps and why it alerted; <strong>Pause and Inspect</strong> pauses it ),
      ~s(first.</p>),
      "</aside>"
    ]
  end

  defp inspector(info, fleet, expanded, source) do
    sid = escape_exact(info.session_id)
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
      fact("Session", [~s(<span class="mono">), escape(info.session_id), "</span>"]),
      fact("Agent", escape(info.agent_id || "unknown")),
      fact("Node", badge(Fleet.state_of(fleet, info.session_id) || state_of_info(info))),
      fact("Alert", alert_fact(Map.get(info, :alert))),
      fact("Entropy", [score(info.score), " ", severity(info.severity)]),
      fact("Verdict", verdict_fact(Map.get(info, :verdict))),
      fact("Steps received", escape(info.messages)),
      spend_facts(Map.get(info, :usage)),
      "</dl>",
      pause_box(info),
      why_section(info, source),
      steps_list(info, expanded),
      "</aside>"
    ]
  end

  # What a proxied session spent (Observatory.Budget): nothing for a session that
  # spent nothing through the proxy.
  defp spend_facts(%{requests: n} = usage) when n > 0 do
    [
      fact("Spent", [~s(<span id="inspect-spent">), spend(usage), "</span>"]),
      fact("Since the loop began", since_loop(usage.since_loop))
    ]
  end

  defp spend_facts(_usage), do: ""

  defp since_loop(nil), do: ~s(<span class="muted">no loop alarm yet</span>)

  defp since_loop(since) do
    {:ok, at, _} = DateTime.from_iso8601(since.loop_at)

    [
      ~s(<span id="inspect-since-loop">),
      spend(since),
      ~s( <span class="muted">since ),
      time(at),
      "</span></span>"
    ]
  end

  defp spent_since(%{since_loop: %{} = since}),
    do: [
      ~s(<span class="spent" title="spent through the proxy since the loop began">spent since: ),
      spend(since),
      "</span>"
    ]

  defp spent_since(_usage), do: ""

  defp state_of_info(%{pause: pause}) when pause != nil, do: "paused"
  defp state_of_info(_), do: nil

  defp fact(term, value), do: ["<div><dt>", term, "</dt><dd>", value, "</dd></div>"]

  defp alert_fact(nil), do: ~s(<span class="muted">none</span>)

  defp alert_fact(alert) do
    [
      ~s(<span class="alert-on">since ),
      time(alert.since),
      ~s(</span> <span class="rule">),
      escape(alert.rule),
      "</span>"
    ]
  end

  defp verdict_fact(nil), do: ~s(<span class="muted">–</span>)

  defp verdict_fact(v) do
    [
      verdict_tag(v.verdict, v.reason),
      ~s( <span class="rule">),
      escape(v.rule),
      ~s(</span> <span class="muted">at step ),
      escape(v.step_number),
      "</span>"
    ]
  end

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
      escape_exact(info.session_id),
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
      escape_exact(info.session_id),
      ~s(">Resume</button></div>)
    ]
  end

  defp reason(""), do: ""
  defp reason(text), do: [" (", escape(text), ")"]

  ## Why: the verdict's and the window's explanations (Observatory.Gateway.Evidence)

  defp why_section(info, source) do
    explained = Map.get(info, :explained, %{verdict: nil, window: nil})
    verdict = Map.get(info, :verdict)

    [
      ~s(<section class="why" aria-label="Why">),
      ~s(<h3>Why</h3>),
      source_hint(info, verdict, source),
      verdict_why(verdict, explained.verdict),
      window_why(info, explained.window),
      "</section>"
    ]
  end

  # A loop the alert source does not alert on.
  defp source_hint(%{alert: nil}, %{verdict: :loop}, :entropy) do
    ~s(<p class="source-hint">Not alerted: the alert source is the entropy ratio, and this ) <>
      ~s(session's score is not below the LOOP threshold. ) <>
      ~s(With <code>OBSERVATORY_ALERT_SOURCE=verdict</code> it would be alerted.</p>)
  end

  defp source_hint(_info, _verdict, _source), do: ""

  defp verdict_why(nil, _explained),
    do: ~s(<p class="muted">The loop verdict has not judged this session.</p>)

  defp verdict_why(verdict, nil) do
    [
      ~s(<div class="why-verdict"><p class="why-head">),
      verdict_tag(verdict.verdict, verdict.reason),
      ~s( <span class="verdict-reason">),
      escape(verdict.reason),
      "</span></p></div>"
    ]
  end

  defp verdict_why(verdict, ex) do
    [
      ~s(<div class="why-verdict" data-rule="),
      escape(ex.rule),
      ~s("><p class="why-head">),
      verdict_tag(verdict.verdict, verdict.reason),
      ~s( <span class="rule">),
      escape(ex.rule),
      ~s(</span> <span class="verdict-reason">),
      escape(verdict.reason),
      "</span></p>",
      ~s(<p class="why-what">),
      what_repeats(ex),
      ~s( <span class="muted">· ),
      step_range(ex.steps),
      "</span></p>",
      excerpt(ex.excerpt),
      ~s(<ul class="changes">),
      change_item("Arguments", ex.arguments),
      change_item(
        if(ex.status in ["failure", "error", "timeout"], do: "Failure", else: "Result"),
        ex.result
      ),
      missing(ex.missing),
      "</ul></div>"
    ]
  end

  defp what_repeats(%{rule: :cycle, calls: calls} = ex) do
    [
      ~s(a cycle of ),
      escape(length(calls)),
      " calls, ",
      Enum.intersperse(Enum.map(calls, &call_code/1), ~s(<span class="arrow">→</span>)),
      ", ",
      escape(ex.times),
      " times, ",
      escape(ex.outcome)
    ]
  end

  defp what_repeats(%{rule: :same_failure, calls: calls} = ex) do
    [
      escape(length(calls)),
      " different calls, ",
      escape(ex.outcome),
      ": ",
      Enum.intersperse(Enum.map(calls, &call_code/1), ", ")
    ]
  end

  defp what_repeats(%{calls: [call]} = ex) do
    [
      call_code(call),
      ", ",
      escape(ex.times),
      if(ex.times == 1, do: " time, ", else: " times, "),
      escape(ex.outcome)
    ]
  end

  defp what_repeats(%{calls: calls} = ex) do
    [
      Enum.intersperse(Enum.map(calls, &call_code/1), ", "),
      ": ",
      escape(ex.times),
      " steps, ",
      escape(ex.outcome)
    ]
  end

  defp call_code(%{tool: tool, call: call}) when tool == call or tool == "",
    do: [~s(<code class="call">), escape(call), "</code>"]

  defp call_code(%{tool: tool, call: call}) do
    [
      ~s(<code class="call">),
      escape(call),
      ~s(</code> <span class="muted">\(),
      escape(tool),
      ")</span>"
    ]
  end

  defp excerpt(""), do: ""
  defp excerpt(text), do: [~s(<pre class="excerpt">), escape(text), "</pre>"]

  defp change_item(label, change) do
    [
      ~s(<li data-change="),
      escape(change.kind),
      ~s("><strong>),
      label,
      ":</strong> ",
      change_text(change),
      "</li>"
    ]
  end

  defp change_text(%{kind: :same}), do: "the same each time"
  defp change_text(%{kind: :whitespace}), do: "the same apart from whitespace"
  defp change_text(%{kind: :reordered}), do: "the same lines, in another order or number"

  defp change_text(%{kind: :numbers, changes: changes}) do
    [
      "the same apart from numbers",
      ~s(<ul class="numbers">),
      for c <- changes do
        [
          ~s(<li><code>),
          escape(c.line),
          ~s(</code> <span class="muted"># = </span>),
          escape(Enum.join(c.values, " → ")),
          "</li>"
        ]
      end,
      "</ul>"
    ]
  end

  defp change_text(%{kind: :lines, changes: changes}) do
    [
      "lines differ",
      ~s(<ul class="numbers">),
      for c <- changes do
        [
          ~s(<li><span class="muted">step ),
          escape(c.step),
          ":</span> ",
          for(l <- c.added, do: [~s(<code class="added">+ ), escape(l), "</code> "]),
          for(l <- c.removed, do: [~s(<code class="removed">− ), escape(l), "</code> "]),
          "</li>"
        ]
      end,
      "</ul>"
    ]
  end

  defp missing([]), do: ""

  defp missing(numbers) do
    [
      ~s(<li class="muted">Steps ),
      escape(Enum.join(numbers, ", ")),
      " are no longer stored (the gateway keeps the last ",
      escape(SessionLog.size()),
      ").</li>"
    ]
  end

  defp window_why(_info, nil), do: ""

  defp window_why(info, ex) do
    [
      ~s(<div class="why-window"><p><strong>Entropy window</strong> <span class="muted">),
      step_range(ex.window_steps),
      ~s(</span> · score ),
      score(info.score),
      " ",
      severity(info.severity),
      ": ",
      pattern(ex.pattern),
      " in ",
      escape(ex.count),
      " of ",
      escape(ex.size),
      " steps",
      if(ex.count > 1, do: [" (", step_range(ex.steps), ")"], else: ""),
      "</p>",
      if(ex.count > 1,
        do: [
          ~s(<ul class="changes">),
          change_item("Their arguments", ex.arguments),
          change_item("Their results", ex.result),
          "</ul>"
        ],
        else: ""
      ),
      "</div>"
    ]
  end

  # "steps 3–6" for a run, "steps 3, 5, 7" otherwise.
  defp step_range([]), do: "no steps"
  defp step_range([n]), do: ["step ", escape(n)]

  defp step_range(numbers) do
    first = hd(numbers)
    last = List.last(numbers)

    if numbers == Enum.to_list(first..last),
      do: ["steps ", escape(first), "–", escape(last)],
      else: ["steps ", escape(Enum.join(numbers, ", "))]
  end

  ## Recent steps

  defp steps_list(%{steps: []}, _expanded) do
    ~s(<h3>Recent steps</h3><p class="empty">The gateway holds no steps for this session.</p>)
  end

  defp steps_list(info, expanded) do
    evidence = MapSet.new((info.verdict && info.verdict.evidence) || [])
    window = MapSet.new((info.explained.window && info.explained.window.window_steps) || [])

    [
      ~s(<h3>Recent steps <span class="muted">oldest first, numbered as the verdict and the window count them</span></h3>),
      ~s(<ol class="steplist">),
      info.steps
      |> with_same_as()
      |> Enum.map(fn {step, same_as} ->
        step_item(info.session_id, step, same_as, %{
          evidence?: MapSet.member?(evidence, step.number),
          window?: MapSet.member?(window, step.number),
          expanded?: step.number in expanded
        })
      end),
      "</ol>"
    ]
  end

  # Each step with the number of the first earlier step identical to it (same tool,
  # arguments, status and result), or nil: a repeat is shown in one line.
  defp with_same_as(steps) do
    {pairs, _seen} =
      Enum.map_reduce(steps, %{}, fn step, seen ->
        key = {step.tool_call, step.arguments, step.status, step.result, step.truncated}

        case seen do
          %{^key => first} -> {{step, first}, seen}
          _ -> {{step, nil}, Map.put(seen, key, step.number)}
        end
      end)

    pairs
  end

  defp step_item(session_id, step, same_as, flags) do
    %{evidence?: evidence?, window?: window?, expanded?: expanded?} = flags
    n = escape(step.number)
    repeat? = same_as != nil and not expanded?

    [
      ~s(<li id="),
      dom_id("step", session_id),
      "-",
      n,
      ~s(" class="step),
      if(evidence?, do: " evidence", else: ""),
      ~s(" data-step="),
      n,
      ~s(" data-evidence="),
      to_string(evidence?),
      ~s(" data-window="),
      to_string(window?),
      ~s(">),
      ~s(<div class="step-head"><span class="step-n">#),
      n,
      "</span>",
      time(step.at),
      ~s(<code class="tool">),
      escape(step.tool_call),
      "</code>",
      status_tag(step.status),
      if(evidence?, do: ~s(<span class="tag tag-evidence">evidence</span>), else: ""),
      if(window?, do: ~s(<span class="tag tag-window">window</span>), else: ""),
      "</div>",
      if(repeat?,
        do: [
          ~s(<p class="step-same">The same call, arguments and result as #),
          escape(same_as),
          ".</p>"
        ],
        else: step_body(step)
      ),
      cond do
        expanded? -> toggle(session_id, step.number, "Show less")
        step.truncated and not repeat? -> toggle(session_id, step.number, "Show all")
        true -> ""
      end,
      if(step.stored_whole,
        do: "",
        else: ~s(<p class="muted">Too large to keep whole: only its metadata is stored.</p>)
      ),
      "</li>"
    ]
  end

  defp step_body(step) do
    [
      ~s(<div class="step-intent">),
      escape(step.intent),
      "</div>",
      if(step.arguments == "",
        do: "",
        else: [~s(<pre class="step-args">), escape(step.arguments), "</pre>"]
      ),
      if(step.result == "",
        do: ~s(<p class="step-none muted">no result</p>),
        else: [~s(<pre class="step-result">), escape(step.result), "</pre>"]
      )
    ]
  end

  defp toggle(session_id, number, label) do
    [
      ~s(<button type="button" class="btn btn-link" phx-click="toggle_step" phx-value-session_id="),
      escape_exact(session_id),
      ~s(" phx-value-step="),
      escape(number),
      ~s(">),
      label,
      "</button>"
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
          escape_exact(step.session_id),
          ~s(" data-blocked="),
          to_string(step.blocked),
          ~s("><td class="mono sid" title="),
          sid,
          ~s(">),
          sid,
          ~s(</td><td><span class="cell-label">Stagnation </span>),
          escape(step.stagnation_streak),
          ~s(</td><td><span class="cell-label">Stuck </span>),
          escape(step.stuck_streak),
          "</td><td>",
          if(step.blocked,
            do:
              ~s(<span class="badge state-alert_entropy"><span class="dot"></span>blocked</span>),
            else: ~s(<span class="badge state-blocked"><span class="dot"></span>streak</span>)
          ),
          ~s(</td><td class="action"><button type="button" class="btn btn-resume" phx-click="reset_step" phx-value-session_id="),
          escape_exact(step.session_id),
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
      escape_exact(node.session_id),
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
      "</span></span></span>",
      ~s(<span class="node-actions"><button type="button" class="btn btn-ghost btn-node" phx-click="inspect" phx-value-session_id="),
      escape_exact(node.session_id),
      ~s(">Inspect</button></span></li>)
    ]
  end

  # The agent's name links to its Agent Detail page (which says so when the agent
  # has not used the kill switch proxy).
  defp node_agent(nil, _agents_path), do: ~s(<span class="node-agent">unknown agent</span>)

  defp node_agent(agent_id, agents_path) do
    [
      ~s(<a class="node-agent" href="),
      escape(ObservatoryWeb.AgentDetail.View.agent_path(agents_path, agent_id)),
      ~s(" title="Agent detail"),
      ObservatoryWeb.HTML.navigate(),
      ">",
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
