defmodule ObservatoryWeb.AgentDetail.View do
  @moduledoc """
  Renders the Agent Detail page's assigns as HTML iodata.

  Layout: the agent's id and status indicator; the kill switch (toggle, the prompt
  to configure alert notifications, `window_size`, `threshold` and mode) and its
  guidance notes beside its status and actions (Deactivate, Activate) and its current
  loop score; its alert notifications; its budget (mode, limits, what it spent in all,
  within its window and per recent session, with resets); its recent events.

  The status indicator follows seed 003: "Active"; "Deactivated by Kill Switch" for
  an inactive agent whose `deactivated_by` is `:kill_switch`; the standard "Inactive"
  for `:manual` or nil (`ObservatoryWeb.API.Agents.status_label/1`, the label the
  API returns too).

  Every value that came from an agent or an operator (the agent id, webhook URLs,
  reasons, values typed into the forms, validation messages that quote them) goes
  through `ObservatoryWeb.HTML.escape/1`; links carry the id URL-encoded. The page
  uses no inline style or script (the dashboard's CSP forbids both): the score bar is
  a `<meter>`. Styles are in `priv/static/manager.css`, under `.scm`.
  """

  import ObservatoryWeb.HTML, only: [escape: 1, escape_exact: 1, spend: 1]

  alias Observatory.KillSwitch.{Settings, WebhookURL}
  alias ObservatoryWeb.API.Agents, as: AgentJSON

  # The kill switch's modes, as the settings form offers them.
  @modes [
    {"enforce", "Enforce — stop the agent"},
    {"warn", "Warn — alert, refuse nothing"},
    {"shadow", "Shadow — record only"}
  ]

  @doc "The whole page: its `parts/1`, in order."
  @spec render(map()) :: iodata()
  def render(assigns), do: Keyword.values(parts(assigns))

  @doc """
  The page in the parts that change independently (`ObservatoryWeb.LiveParts`): the
  notice, the header, the panels, the events. Their concatenation is the page.
  """
  @spec parts(map()) :: [{atom(), iodata()}]
  def parts(assigns) do
    events = if assigns.agent == nil, do: "", else: events_panel(assigns.events)

    [
      html_notice: [
        ~s(<div id="agent-detail" class="scm agent-detail" data-live-root data-agent-id="),
        escape_exact(assigns.agent_id),
        ~s(">),
        notice(assigns.notice)
      ],
      html_header: header(assigns),
      html_panels: body(assigns),
      html_events: [events, "</div>"]
    ]
  end

  @doc "The path of an agent's page: `agents_path` and the id, URL-encoded."
  @spec agent_path(String.t(), String.t()) :: String.t()
  def agent_path(agents_path, id),
    do: agents_path <> "/" <> URI.encode(id, &URI.char_unreserved?/1)

  @doc "The status indicator: a badge with the seed's label and a `data-status`."
  @spec status_badge(map(), String.t()) :: iodata()
  def status_badge(agent, id_attr \\ "") do
    status = AgentJSON.status(agent)

    [
      ~s(<span ),
      if(id_attr == "", do: "", else: [~s(id="), id_attr, ~s(" )]),
      ~s(class="ad-status ad-status-),
      status,
      ~s(" data-status="),
      status,
      ~s("><span class="dot"></span>),
      AgentJSON.status_label(agent),
      "</span>"
    ]
  end

  ## Notice and header

  defp notice(notice), do: ObservatoryWeb.HTML.notice("ad-notice", notice)

  defp header(assigns) do
    [
      ~s(<header class="ad-head"><nav class="crumbs" aria-label="Breadcrumb"><a href="),
      escape(assigns.agents_path),
      ~s("),
      ObservatoryWeb.HTML.navigate(),
      ~s(>← All agents</a></nav>),
      ~s(<div class="ad-title"><h1 id="agent-title" class="mono">),
      escape(assigns.agent_id),
      "</h1>",
      case assigns.agent do
        nil ->
          ~s(<span id="agent-status" class="ad-status" data-status="unknown">Not registered</span>)

        agent ->
          [status_badge(agent, "agent-status"), since(agent)]
      end,
      "</div></header>"
    ]
  end

  defp since(%{active: false, deactivated_at: %DateTime{} = at}),
    do: [~s(<span class="muted ad-since">since ), time(at), "</span>"]

  defp since(_agent), do: ""

  ## Body

  defp body(%{agent: nil} = assigns) do
    [
      ~s(<section id="agent-missing" class="panel" aria-labelledby="missing-title">),
      ~s(<header class="panel-head"><h2 id="missing-title">No such agent</h2></header>),
      ~s(<p>No agent is registered as <code>),
      escape(assigns.agent_id),
      ~s(</code>. ),
      ObservatoryWeb.AgentList.how_to_register(),
      ~s( This page shows it as soon as that happens.</p><p><a href="),
      escape(assigns.agents_path),
      ~s("),
      ObservatoryWeb.HTML.navigate(),
      ~s(>All agents</a></p></section>)
    ]
  end

  defp body(assigns) do
    [
      ~s(<div class="ad-grid"><div class="ad-col">),
      kill_switch_panel(assigns),
      guidance_panel(assigns.agent),
      notifications_panel(assigns),
      ~s(</div><div class="ad-col">),
      status_panel(assigns.agent),
      score_panel(assigns.agent, assigns.score),
      "</div></div>",
      budget_panel(assigns)
    ]
  end

  ## Kill switch: toggle, prompt, settings

  defp kill_switch_panel(%{agent: agent} = assigns) do
    %{enabled: on?, window_size: size, threshold: threshold} = agent.kill_switch

    mode = agent.kill_switch |> Map.get(:mode, :enforce) |> Atom.to_string()

    values =
      form_values(assigns.settings_form, %{
        "window_size" => size,
        "threshold" => threshold,
        "mode" => mode
      })

    errors = form_errors(assigns.settings_form)

    [
      ~s(<section id="kill-switch-panel" class="panel ad-switch" aria-labelledby="ks-title" data-enabled="),
      to_string(on?),
      ~s(">),
      ~s(<header class="panel-head"><h2 id="ks-title">Kill switch</h2>),
      toggle(on?),
      "</header>",
      if(on?,
        do: mode_sentence(mode),
        else:
          ~s(<p class="muted">Off: nothing is scored or stopped. The settings below apply ) <>
            ~s(once it is on.</p>)
      ),
      if(assigns.prompt, do: prompt(assigns), else: ""),
      ~s(<form id="kill-switch-settings" class="ad-form" phx-submit="save_settings" novalidate>),
      ~s(<div class="ad-fields">),
      field(
        "window_size",
        "Window size",
        values["window_size"],
        errors["window_size"],
        ~s(type="number" inputmode="numeric" min="2" max="1000" step="1"),
        "How many recent requests each request is scored against (2–1000)."
      ),
      field(
        "threshold",
        "Threshold",
        values["threshold"],
        errors["threshold"],
        ~s(type="number" inputmode="decimal" min="0" step="any"),
        "Stop the agent when its score exceeds this. A window of #{size} scores at most " <>
          "#{number(Settings.max_score(size))}."
      ),
      select_field(
        "ks-mode",
        "mode",
        "Mode",
        values["mode"],
        errors["mode"],
        @modes,
        "Enforce stops the agent; warn alerts and warns the model; shadow only records."
      ),
      "</div>",
      ~s(<div class="ad-actions"><button type="submit" class="btn btn-primary-sm">Save settings</button></div>),
      "</form>",
      unreachable(size, threshold),
      "</section>"
    ]
  end

  defp mode_sentence("enforce"),
    do:
      ~s(<p class="muted">On: each request through the proxy is scored against the agent's last ) <>
        ~s(requests, and the agent is stopped when its score exceeds the threshold.</p>)

  defp mode_sentence("warn"),
    do:
      ~s(<p class="muted" id="ks-mode-note">On, in <strong>warn</strong> mode: a score over the threshold ) <>
        ~s[is recorded and alerted, and the model is warned (with guidance notes on); nothing is refused.</p>]

  defp mode_sentence(_shadow),
    do:
      ~s(<p class="muted" id="ks-mode-note">On, in <strong>shadow</strong> mode: a score over the threshold ) <>
        ~s(is recorded as "would have stopped the agent"; nothing is refused or alerted.</p>)

  ## Guidance notes

  defp guidance_panel(agent) do
    setting =
      case Map.get(agent, :guidance) do
        true -> "on"
        false -> "off"
        nil -> "default"
      end

    on? = Observatory.Proxy.Guidance.enabled?(agent)

    [
      ~s(<section id="guidance-panel" class="panel" aria-labelledby="guidance-title" data-setting="),
      setting,
      ~s(" data-enabled="),
      to_string(on?),
      ~s(">),
      ~s(<header class="panel-head"><h2 id="guidance-title">Guidance notes</h2>),
      if(on?, do: ~s(<span class="pill ad-ok">on</span>), else: ~s(<span class="pill">off</span>)),
      "</header>",
      ~s(<p class="muted">When a proxied session of this agent repeats itself, its next request ),
      ~s(tells the model so, in the newest tool result: what repeats, and to change approach or ),
      ~s(stop. Every note is in the events below.</p>),
      ~s(<div class="ad-segmented" role="group" aria-label="Guidance notes">),
      for {value, label} <- [
            {"on", "On"},
            {"off", "Off"},
            {"default",
             "Default (#{if Observatory.Proxy.Guidance.default(), do: "on", else: "off"})"}
          ] do
        [
          ~s(<button type="button" class="btn ),
          if(value == setting, do: "btn-primary-sm", else: "btn-ghost"),
          ~s(" phx-click="set_guidance" phx-value-setting="),
          value,
          ~s(" aria-pressed="),
          to_string(value == setting),
          ~s(">),
          label,
          "</button>"
        ]
      end,
      "</div></section>"
    ]
  end

  ## Budget

  @budget_limits [
    {"session_requests", "Requests per session", ~s(inputmode="numeric" min="0" step="1")},
    {"session_tokens", "Tokens per session", ~s(inputmode="numeric" min="0" step="1")},
    {"session_cost_usd", "Cost per session (USD)", ~s(inputmode="decimal" min="0" step="any")},
    {"window_requests", "Requests per window", ~s(inputmode="numeric" min="0" step="1")},
    {"window_tokens", "Tokens per window", ~s(inputmode="numeric" min="0" step="1")},
    {"window_cost_usd", "Cost per window (USD)", ~s(inputmode="decimal" min="0" step="any")},
    {"window_seconds", "Window (seconds)", ~s(inputmode="numeric" min="60" step="1")}
  ]

  # Without a budget or its usage (a record written before budgets, rendered as it
  # was stored): no panel.
  defp budget_panel(%{agent: %{budget: _}, usage: %{}} = assigns),
    do: budget_panel(assigns, assigns.usage)

  defp budget_panel(_assigns), do: ""

  defp budget_panel(%{agent: agent} = assigns, usage) do
    b = agent.budget
    stored = Map.new(b, fn {k, v} -> {Atom.to_string(k), if(v == nil, do: "", else: show(v))} end)
    values = form_values(Map.get(assigns, :budget_form), stored)
    errors = form_errors(Map.get(assigns, :budget_form))

    [
      ~s(<section id="budget-panel" class="panel ad-budget" aria-labelledby="budget-title" data-mode="),
      escape(b.mode),
      ~s(">),
      ~s(<header class="panel-head"><h2 id="budget-title">Budget</h2>),
      budget_pill(usage),
      "</header>",
      ~s(<dl class="facts ad-spent">),
      spent_fact("Spent in all", "budget-total", usage.total),
      spent_fact("Within its window (#{b.window_seconds} s)", "budget-window", usage.window),
      "</dl>",
      ~s(<form id="budget-form" class="ad-form" phx-submit="save_budget" novalidate><div class="ad-fields ad-fields-wide">),
      select_field(
        "budget-mode",
        "mode",
        "Past a limit",
        values["mode"],
        errors["mode"],
        [
          {"enforce", "Enforce — refuse (budget_exhausted)"},
          {"warn", "Warn — alert, refuse nothing"},
          {"shadow", "Shadow — record only"}
        ],
        nil
      ),
      for {name, label, attrs} <- @budget_limits do
        field(
          "budget-" <> name,
          name,
          label,
          values[name],
          errors[name],
          ~s(type="number" ) <> attrs,
          if(name == "window_seconds", do: nil, else: "Blank: no limit.")
        )
      end,
      ~s(</div><div class="ad-actions"><button type="submit" class="btn btn-primary-sm">Save budget</button>),
      ~s(<button type="button" class="btn btn-ghost" id="budget-reset-window" phx-click="reset_budget">Reset the window</button></div></form>),
      budget_sessions(usage.sessions),
      "</section>"
    ]
  end

  defp budget_pill(%{window: %{exhausted: true}}),
    do: ~s(<span class="pill ad-missing" id="budget-state">window exhausted</span>)

  defp budget_pill(%{sessions: sessions}) do
    case Enum.count(sessions, & &1.exhausted) do
      0 ->
        ~s(<span class="pill" id="budget-state">within limits</span>)

      n ->
        [
          ~s(<span class="pill ad-missing" id="budget-state">),
          escape(n),
          " session(s) exhausted</span>"
        ]
    end
  end

  defp spent_fact(label, id, spent) do
    [
      "<div><dt>",
      escape(label),
      ~s(</dt><dd id="),
      id,
      ~s(">),
      spend(spent),
      "</dd></div>"
    ]
  end

  defp budget_sessions([]),
    do: ~s(<p class="empty">No proxied session yet: what each session spends shows here.</p>)

  defp budget_sessions(sessions) do
    [
      ~s(<div class="table-wrap"><table class="ad-sessions"><thead><tr>),
      ~s(<th scope="col">Session</th><th scope="col" class="num">Requests</th>),
      ~s(<th scope="col" class="num">Tokens</th><th scope="col" class="num">Cost</th>),
      ~s(<th scope="col">Since the loop began</th><th scope="col"><span class="sr-only">Actions</span></th>),
      "</tr></thead><tbody>",
      Enum.map(sessions, fn s ->
        [
          ~s(<tr class="ad-session),
          if(s.exhausted, do: " exhausted", else: ""),
          ~s(" data-session-id="),
          escape_exact(s.session_id),
          ~s("><td class="mono">),
          escape(s.session_id),
          if(s.exhausted, do: ~s( <span class="pill ad-missing">exhausted</span>), else: ""),
          ~s(</td><td class="num">),
          ObservatoryWeb.HTML.delimit(s.requests),
          ~s(</td><td class="num">),
          ObservatoryWeb.HTML.delimit(s.tokens),
          ~s(</td><td class="num">),
          if(s.cost_usd > 0,
            do: ["$", :erlang.float_to_binary(s.cost_usd / 1, decimals: 4)],
            else: "–"
          ),
          "</td><td>",
          case s.since_loop do
            nil -> ~s(<span class="muted">no loop alarm</span>)
            since -> spend(since)
          end,
          ~s(</td><td><button type="button" class="btn btn-ghost" phx-click="reset_budget" phx-value-session_id="),
          escape_exact(s.session_id),
          ~s(">Reset</button></td></tr>)
        ]
      end),
      "</tbody></table></div>"
    ]
  end

  defp toggle(on?) do
    [
      ~s(<button type="button" id="kill-switch-toggle" class="switch" role="switch" aria-checked="),
      to_string(on?),
      ~s(" aria-labelledby="ks-title" phx-click="toggle_kill_switch" phx-value-enabled="),
      to_string(not on?),
      ~s("><span class="switch-track"><span class="switch-thumb"></span></span>),
      ~s(<span class="switch-label">),
      if(on?, do: "On", else: "Off"),
      "</span></button>"
    ]
  end

  defp prompt(assigns) do
    form = source_form(assigns.webhook_form, "prompt")

    [
      ~s(<section id="notification-prompt" class="ad-prompt" role="alertdialog" aria-modal="false" ),
      ~s(aria-labelledby="prompt-title" aria-describedby="prompt-text">),
      ~s(<h3 id="prompt-title">Configure alert notifications</h3>),
      ~s(<p id="prompt-text">The kill switch is on, but no alert notification is configured: ),
      ~s(when it stops this agent, nobody will be told. Give a webhook URL and the ),
      ~s(<code>kill_switch</code> event is POSTed to it as JSON.</p>),
      ~s(<form id="prompt-webhook" class="ad-form" phx-submit="save_webhook" novalidate>),
      ~s(<input type="hidden" name="form" value="prompt">),
      field(
        "prompt-webhook-url",
        "notification_webhook",
        "Webhook URL",
        form_values(form, %{"notification_webhook" => ""})["notification_webhook"],
        form_errors(form)["notification_webhook"],
        ~s(type="text" inputmode="url" autocomplete="off" placeholder="https://hooks.example.com/observatory"),
        nil
      ),
      ~s(<div class="ad-actions"><button type="submit" class="btn btn-resume">Save webhook</button>),
      ~s(<button type="button" class="btn btn-ghost" phx-click="dismiss_prompt">Not now</button></div>),
      "</form></section>"
    ]
  end

  defp unreachable(size, threshold) do
    max = Settings.max_score(size)

    if threshold >= max do
      [
        ~s(<p id="threshold-unreachable" class="ad-warning" role="note">A window of ),
        escape(size),
        " scores at most ",
        number(max),
        ": a threshold of ",
        number(threshold),
        " is never exceeded, so this agent is never stopped.</p>"
      ]
    else
      ""
    end
  end

  ## Notifications

  defp notifications_panel(%{agent: agent} = assigns) do
    configured? = assigns.notifications_configured
    form = source_form(assigns.webhook_form, "panel")
    # The URL set is a secret: never put back in the page, only its redaction.
    value = form_values(form, %{"notification_webhook" => ""})

    [
      ~s(<section id="notifications-panel" class="panel" aria-labelledby="notif-title" data-configured="),
      to_string(configured?),
      ~s(">),
      ~s(<header class="panel-head"><h2 id="notif-title">Alert notifications</h2>),
      if(configured?,
        do: ~s(<span class="pill ad-ok">configured</span>),
        else: ~s(<span class="pill ad-missing">not configured</span>)
      ),
      "</header>",
      cond do
        agent.notification_webhook ->
          [
            ~s(<p>When the kill switch stops this agent, the event is POSTed to <code class="ad-url">),
            escape(WebhookURL.redact(agent.notification_webhook)),
            "</code> (the rest of the URL is kept secret). Enter a new URL to replace it.</p>"
          ]

        agent[:notification_webhook_unreadable] ->
          ~s(<p class="ad-warning">This agent's webhook URL was stored under another secret ) <>
            ~s{key (<code>secret_key_base</code> changed) and cannot be read: enter it again.</p>}

        configured? ->
          ~s(<p>When the kill switch stops this agent, the event is POSTed to the global webhook ) <>
            ~s{<span class="muted">(<code>:kill_switch</code> <code>notification_webhook</code>)</span>. } <>
            ~s(Set one for this agent to send its alerts elsewhere.</p>)

        true ->
          ~s(<p class="ad-warning">None: when the kill switch stops this agent, nobody is told.</p>)
      end,
      ~s(<form id="webhook-form" class="ad-form" phx-submit="save_webhook" novalidate>),
      ~s(<input type="hidden" name="form" value="panel">),
      field(
        "webhook-url",
        "notification_webhook",
        "Agent webhook URL",
        value["notification_webhook"],
        form_errors(form)["notification_webhook"],
        ~s(type="text" inputmode="url" autocomplete="off" placeholder="https://hooks.example.com/observatory"),
        "An http:// or https:// URL. The one set is never shown back: enter a new one " <>
          "to replace it, or save this blank to remove it."
      ),
      ~s(<div class="ad-actions"><button type="submit" class="btn btn-primary-sm">Save webhook</button></div>),
      "</form></section>"
    ]
  end

  ## Status and actions

  defp status_panel(agent) do
    [
      ~s(<section id="status-panel" class="panel" aria-labelledby="status-title">),
      ~s(<header class="panel-head"><h2 id="status-title">Status</h2>),
      status_badge(agent),
      "</header>",
      status_body(agent),
      "</section>"
    ]
  end

  defp status_body(%{active: true} = agent) do
    [
      ~s(<p>Its requests are forwarded),
      if(agent.kill_switch.enabled, do: " and scored", else: ""),
      ~s(. Deactivate it to refuse them with the standard inactive-agent answer.</p>),
      ~s(<form id="deactivate-form" class="ad-form ad-inline" phx-submit="deactivate" novalidate>),
      ~s{<label for="deactivate-reason">Reason <span class="muted">(optional)</span></label>},
      ~s(<input id="deactivate-reason" name="reason" type="text" maxlength="500" autocomplete="off">),
      ~s(<button type="submit" class="btn btn-pause">Deactivate</button></form>)
    ]
  end

  @inactive_steps ~s{the steps it still sends are kept and answered with a <code>stop</code> } <>
                    ~s{directive, its tool-call checks denied.</p>}

  defp status_body(%{deactivated_by: :kill_switch}) do
    [
      ~s(<p>The kill switch stopped this agent: its loop score exceeded the threshold ),
      ~s{(the event below has the figures). Every request gets the standard inactive-agent },
      ~s{answer, <code>403 agent_inactive</code>; },
      @inactive_steps,
      activate_button()
    ]
  end

  defp status_body(_inactive) do
    [
      ~s{<p>Deactivated by an operator: every request gets the standard inactive-agent },
      ~s{answer, <code>403 agent_inactive</code>; },
      @inactive_steps,
      activate_button()
    ]
  end

  defp activate_button do
    ~s(<div class="ad-actions"><button type="button" class="btn btn-resume" phx-click="activate">Activate</button>) <>
      ~s(<span class="muted">Its window starts empty.</span></div>)
  end

  ## Score

  defp score_panel(agent, score) do
    [
      ~s(<section id="score-panel" class="panel" aria-labelledby="score-title">),
      ~s(<header class="panel-head"><h2 id="score-title">Loop score</h2>),
      ~s(<span class="pill">prompts × 1.0 + responses × 2.0 + tool calls × 1.5</span></header>),
      score_body(agent, score),
      "</section>"
    ]
  end

  defp score_body(%{kill_switch: %{enabled: false}}, _score),
    do: ~s(<p class="empty">The switch is off: no window, no score.</p>)

  defp score_body(_agent, nil) do
    ~s(<p class="empty">No request scored yet: the window starts empty when the switch is ) <>
      ~s(turned on, when the agent is activated and when the gateway restarts.</p>)
  end

  defp score_body(agent, score) do
    %{threshold: threshold, window_size: size} = agent.kill_switch
    s = score.signals
    over? = score.score > threshold

    [
      ~s(<div class="ad-score"><span id="score-value" class="ad-score-n),
      if(over?, do: " over", else: ""),
      ~s(">),
      number2(score.score),
      ~s(</span><span class="muted"> latest request · threshold ),
      number2(threshold),
      "</span></div>",
      ~s(<meter id="score-meter" min="0" max="),
      number(Settings.max_score(size)),
      # Green below half the threshold, amber up to it, red past it.
      ~s(" low="),
      number(threshold / 2),
      ~s(" high="),
      number(threshold),
      ~s(" optimum="0" value="),
      number(score.score),
      ~s(">),
      number2(score.score),
      "</meter>",
      ~s(<dl class="facts ad-parts">),
      part("Similar prompts", s.similar_prompts, 1.0),
      part("Similar responses", s.similar_responses, 2.0),
      part("Repeated tool calls", s.repeated_tool_calls, 1.5),
      ~s(<div><dt>Window</dt><dd id="score-window">),
      escape(score.window_len),
      " of ",
      escape(score.window_size),
      " requests</dd></div></dl>"
    ]
  end

  defp part(label, count, weight) do
    [
      "<div><dt>",
      label,
      "</dt><dd>",
      escape(count),
      ~s( <span class="muted">× ),
      number(weight),
      " = ",
      number(count * weight),
      "</span></dd></div>"
    ]
  end

  ## Events

  defp events_panel(events) do
    [
      ~s(<section id="events-panel" class="panel" aria-labelledby="events-title">),
      ~s(<header class="panel-head"><h2 id="events-title">Recent events</h2>),
      ~s(<span class="pill">newest first</span></header>),
      case events do
        [] ->
          ~s{<p class="empty">No events yet: trips, (de)activations and settings changes show here.</p>}

        events ->
          [~s(<ol class="ad-events">), Enum.map(events, &event/1), "</ol>"]
      end,
      "</section>"
    ]
  end

  defp event(event) do
    type = escape(event.event_type)

    [
      ~s(<li id="ev-),
      escape(event.id),
      ~s(" class="ad-event ad-event-),
      type,
      ~s(" data-event-type="),
      type,
      ~s("><div class="ad-event-head"><span class="ad-event-type">),
      event_title(event.event_type),
      "</span>",
      time(event.at),
      "</div>",
      ~s(<p class="ad-event-text">),
      event_text(event.event_type, event.details),
      "</p></li>"
    ]
  end

  defp event_title("kill_switch"), do: "Kill switch"
  defp event_title("manual_deactivation"), do: "Deactivated"
  defp event_title("activation"), do: "Activated"
  defp event_title("settings_changed"), do: "Settings changed"
  defp event_title("kill_switch_would_trip"), do: "Kill switch would have stopped it"
  defp event_title("guidance_injected"), do: "Guidance note"
  defp event_title("budget_exhausted"), do: "Budget exhausted"
  defp event_title("budget_would_exhaust"), do: "Budget would have stopped it"
  defp event_title("budget_reset"), do: "Budget reset"
  defp event_title(other), do: escape(other)

  defp event_text("kill_switch", d) do
    [
      "Score ",
      number2(d[:score]),
      " exceeded the threshold ",
      number2(d[:threshold]),
      ": ",
      escape(d[:similar_prompts]),
      " similar prompts × 1.0 + ",
      escape(d[:similar_responses]),
      " similar responses × 2.0 + ",
      escape(d[:repeated_tool_calls]),
      " repeated tool calls × 1.5, over ",
      escape(d[:window_len]),
      " of ",
      escape(d[:window_size]),
      " requests.",
      case d[:prompt_hash] do
        nil ->
          ""

        hash ->
          [~s( <span class="muted">Prompt fingerprint <code>), escape(hash), "</code>.</span>"]
      end
    ]
  end

  defp event_text("kill_switch_would_trip", d) do
    [
      "In ",
      escape(d[:mode]),
      " mode: score ",
      number2(d[:score]),
      " exceeded the threshold ",
      number2(d[:threshold]),
      " (",
      escape(d[:repeated_tool_calls]),
      " repeated tool calls, ",
      escape(d[:similar_prompts]),
      " similar prompts, ",
      escape(d[:similar_responses]),
      " similar responses). Nothing was refused."
    ]
  end

  defp event_text("guidance_injected", d) do
    [
      "Session <code>",
      escape(d[:session_id]),
      "</code> (",
      escape(d[:source]),
      "): ",
      ~s(<span class="ad-note">),
      escape(d[:note]),
      "</span>"
    ]
  end

  defp event_text(type, d) when type in ["budget_exhausted", "budget_would_exhaust"] do
    [
      if(type == "budget_exhausted",
        do: "",
        else: ["In ", escape(d[:mode]), " mode, nothing refused: "]
      ),
      escape(d[:message])
    ]
  end

  defp event_text("budget_reset", d) do
    scope =
      case d[:scope] do
        %{kind: "session", session_id: id} -> ["session <code>", escape(id), "</code>"]
        _ -> "the rolling window"
      end

    spent = d[:spent] || %{}

    [
      "By ",
      who(d),
      ": ",
      scope,
      " (it had spent ",
      escape(spent[:requests] || 0),
      " requests, ",
      escape(spent[:tokens] || 0),
      " tokens)."
    ]
  end

  defp event_text("manual_deactivation", d), do: ["By ", who(d), reason(d[:reason]), "."]

  defp event_text("activation", d) do
    was =
      case d[:previously_deactivated_by] do
        :kill_switch -> "; it had been deactivated by the kill switch"
        :manual -> "; it had been deactivated by an operator"
        _ -> ""
      end

    ["By ", who(d), reason(d[:reason]), was, "."]
  end

  defp event_text("settings_changed", d) do
    changes =
      d
      |> Map.get(:changes, %{})
      |> Enum.sort_by(fn {key, _} -> to_string(key) end)
      |> Enum.map_intersperse(", ", fn {key, value} ->
        [~s(<code>), escape(key), "</code> ", escape(show(value))]
      end)

    ["By ", who(d), ": ", changes, "."]
  end

  defp event_text(_other, d) when is_map(d) do
    d
    |> Enum.sort_by(fn {key, _} -> to_string(key) end)
    |> Enum.map_intersperse(", ", fn {key, value} -> [escape(key), " ", escape(show(value))] end)
  end

  defp event_text(_other, _d), do: ""

  defp who(d), do: [~s(<span class="ad-who">), escape(d[:operator] || "unknown"), "</span>"]

  defp reason(nil), do: ""
  defp reason(""), do: ""
  defp reason(text), do: [" (", escape(text), ")"]

  # A section's changes (the budget's): "mode enforce, session_tokens 20000", the
  # limits left unset said once.
  defp show(%{} = changes) when not is_struct(changes) do
    {set, unset} =
      changes
      |> Enum.sort_by(fn {k, _} -> to_string(k) end)
      |> Enum.split_with(fn {_, v} -> v != nil end)

    Enum.map_join(set, ", ", fn {k, v} -> "#{k} #{show(v)}" end) <>
      case unset do
        [] -> ""
        _ -> "; no limit on " <> Enum.map_join(unset, ", ", fn {k, _} -> to_string(k) end)
      end
  end

  defp show(nil), do: "null"
  defp show(value) when is_binary(value) or is_number(value) or is_atom(value), do: value
  defp show(value), do: inspect(value)

  ## Forms

  # A field: label, input, hint and, when the last submit was refused, the backend's
  # message next to it.
  defp field(name, label, value, error, attrs, hint),
    do: field("ks-" <> name, name, label, value, error, attrs, hint)

  defp field(id, name, label, value, error, attrs, hint) do
    described =
      [if(hint, do: id <> "-hint"), if(error, do: id <> "-error")]
      |> Enum.reject(&is_nil/1)
      |> Enum.join(" ")

    [
      ~s(<div class="field),
      if(error, do: " has-error", else: ""),
      ~s("><label for="),
      id,
      ~s(">),
      label,
      ~s(</label><input id="),
      id,
      ~s(" name="),
      name,
      ~s(" ),
      attrs,
      ~s( value="),
      escape_exact(value),
      ~s("),
      if(described == "", do: "", else: [~s( aria-describedby="), described, ~s(")]),
      if(error, do: ~s( aria-invalid="true"), else: ""),
      ">",
      if(hint, do: [~s(<p id="), id, ~s(-hint" class="hint">), escape(hint), "</p>"], else: ""),
      if(error,
        do: [~s(<p id="), id, ~s(-error" class="field-error">), label, " ", escape(error), "</p>"],
        else: ""
      ),
      "</div>"
    ]
  end

  defp select_field(id, name, label, value, error, options, hint) do
    [
      ~s(<div class="field),
      if(error, do: " has-error", else: ""),
      ~s("><label for="),
      id,
      ~s(">),
      label,
      ~s(</label><select id="),
      id,
      ~s(" name="),
      name,
      ~s(">),
      for {option, text} <- options do
        [
          ~s(<option value="),
          option,
          ~s("),
          if(to_string(value) == option, do: " selected", else: ""),
          ">",
          text,
          "</option>"
        ]
      end,
      "</select>",
      if(hint, do: [~s(<p class="hint">), escape(hint), "</p>"], else: ""),
      if(error, do: [~s(<p class="field-error">), label, " ", escape(error), "</p>"], else: ""),
      "</div>"
    ]
  end

  defp form_values(nil, defaults), do: defaults
  defp form_values(%{values: values}, defaults), do: Map.merge(defaults, values)

  defp form_errors(nil), do: %{}
  defp form_errors(%{errors: errors}), do: errors

  # The webhook form's state belongs to the form it came from (the prompt or the panel).
  defp source_form(%{values: %{"form" => source}} = form, source), do: form
  defp source_form(_form, _source), do: nil

  ## Small pieces

  defp number(value) when is_float(value), do: Float.to_string(value)
  defp number(value) when is_integer(value), do: Integer.to_string(value)

  defp number2(value) when is_number(value), do: :erlang.float_to_binary(value / 1, decimals: 2)
  defp number2(_), do: ~s(<span class="muted">–</span>)

  defp time(%DateTime{} = at) do
    [
      ~s(<time datetime="),
      DateTime.to_iso8601(at),
      ~s(">),
      Calendar.strftime(at, "%Y-%m-%d %H:%M:%S"),
      " UTC</time>"
    ]
  end
end
