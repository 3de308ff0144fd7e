defmodule Observatory.Notifications.Dispatcher do
  @moduledoc """
  Turns the gateway's events into alerts and delivers them to the sinks
  (`Observatory.Notifications` says what, when and how often).

  It subscribes to `"gateway:alerts"` (a session's alarm raised and cleared:
  `Observatory.Gateway.Alerts`) and `"gateway:kill_switch"` (agent events);
  `alerts/1` maps an event to alerts (pure). Its state is the
  alarms raised and not resolved (by key: `loop:<session>`, `kill_switch:<agent>`,
  `budget:session:<session>`, `budget:agent:<agent>`) with the sinks each reached, a
  token bucket per sink, and the deliveries in flight: each runs in a task, at most
  one at a time per sink and key (the others wait in order), and a failed one is
  retried after a backoff. At most `:max_open` (10,000) alarms are held; past that the
  oldest are forgotten (a later alarm of that key is sent again).
  """

  use GenServer
  require Logger

  alias Observatory.{Metrics, Notifications}
  alias Observatory.Gateway.Events
  alias Observatory.Notifications.Sink

  @tasks Observatory.Notifications.TaskSupervisor

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  The alerts an event raises or resolves, each for the sinks that take its kind.
  Shadow-mode records raise nothing.
  """
  @spec alerts(map()) :: [Sink.alert()]
  def alerts(%{event_type: "alert_raised", session_id: session, agent_id: agent} = event) do
    [
      alert(
        :loop_alarm,
        :trigger,
        "loop:" <> session,
        "error",
        "Loop alarm: session #{session} of agent #{agent}: #{event.reason}",
        agent: agent,
        session: session,
        details: %{
          rule: event.rule,
          reason: event.reason,
          source: event.source,
          since: DateTime.to_iso8601(event.since)
        }
      )
    ]
  end

  def alerts(%{event_type: "alert_cleared", session_id: session} = event) do
    summary =
      if event.why == "recovered",
        do: "Recovered: session #{session} of agent #{event.agent_id} is making progress again",
        else: "Alarm cleared: session #{session} of agent #{event.agent_id}: #{event.why}"

    [
      alert(:loop_alarm, :resolve, "loop:" <> session, "info", summary,
        agent: event.agent_id,
        session: session,
        details: %{why: event.why}
      )
    ]
  end

  def alerts(%{event_type: "kill_switch", agent_id: agent, details: d}) do
    [
      alert(
        :kill_switch,
        :trigger,
        "kill_switch:" <> agent,
        "critical",
        "Kill switch deactivated agent #{agent}: loop score #{d[:score]} > threshold #{d[:threshold]} " <>
          "(#{d[:repeated_tool_calls]} repeated tool calls, #{d[:similar_prompts]} similar prompts, " <>
          "#{d[:similar_responses]} similar responses in its last #{d[:window_len]} requests)",
        agent: agent,
        details: d
      )
    ]
  end

  def alerts(%{
        event_type: "kill_switch_would_trip",
        agent_id: agent,
        details: %{mode: "warn"} = d
      }) do
    [
      alert(
        :kill_switch,
        :trigger,
        "kill_switch:" <> agent,
        "warning",
        "Kill switch (warn mode) would have deactivated agent #{agent}: loop score #{d[:score]} > " <>
          "threshold #{d[:threshold]}",
        agent: agent,
        details: d
      )
    ]
  end

  def alerts(%{event_type: type, agent_id: agent} = event)
      when type in ["activation", "kill_switch_recovered"] do
    [
      alert(
        :kill_switch,
        :resolve,
        "kill_switch:" <> agent,
        "info",
        if(type == "activation",
          do: "Agent #{agent} was activated again",
          else: "Agent #{agent}'s requests score under the kill switch's threshold again"
        ),
        agent: agent,
        details: Map.get(event, :details, %{})
      )
    ]
  end

  def alerts(%{event_type: "budget_exhausted", agent_id: agent, details: d}),
    do: [budget_alert(:trigger, "error", agent, d, "Budget exhausted: " <> d.message)]

  def alerts(%{event_type: "budget_would_exhaust", agent_id: agent, details: %{mode: "warn"} = d}),
    do: [budget_alert(:trigger, "warning", agent, d, "Budget (warn mode): " <> d.message)]

  def alerts(%{event_type: "budget_recovered", agent_id: agent, details: d}) do
    where =
      if d.scope[:kind] == "session",
        do: "session #{d.scope.session_id}",
        else: "agent #{agent}'s window"

    [budget_alert(:resolve, "info", agent, d, "Budget: #{where} is under its limits again")]
  end

  def alerts(_event), do: []

  defp budget_alert(action, severity, agent, details, summary) do
    {key, session} =
      case details.scope do
        %{kind: "session", session_id: session} -> {"budget:session:" <> session, session}
        _window -> {"budget:agent:" <> agent, nil}
      end

    alert(:budget, action, key, severity, summary,
      agent: agent,
      session: session,
      details: details
    )
  end

  defp alert(kind, action, key, severity, summary, opts) do
    %{
      kind: kind,
      action: action,
      key: key,
      severity: severity,
      summary: summary,
      agent_id: opts[:agent],
      session_id: opts[:session],
      at: DateTime.utc_now(),
      details: Keyword.get(opts, :details, %{})
    }
  end

  @doc """
  Delivers one alert to one sink, now, in the caller: `:ok`, `{:retry, after_ms | nil,
  why}` (a 429, a 5xx, a network error) or `{:error, why}`. `why` names no secret.
  """
  @spec deliver(Sink.t(), Sink.alert()) ::
          :ok | {:retry, non_neg_integer() | nil, String.t()} | {:error, String.t()}
  def deliver(sink, alert) do
    {url, headers, body} = Sink.request(sink, alert)
    timeout = Keyword.get(Notifications.config(), :timeout_ms, 5_000)

    case Observatory.Webhook.post(url, body, headers, timeout: timeout) do
      {:ok, status, _headers} when status in 200..299 ->
        :ok

      {:ok, 429, headers} ->
        {:retry, retry_after(headers), "answered 429"}

      {:ok, status, _headers} when status >= 500 ->
        {:retry, nil, "answered #{status}"}

      {:ok, status, _headers} ->
        {:error, "answered #{status}"}

      {:error, {:refused, sentence}} ->
        {:error, "its URL #{sentence}"}

      {:error, reason} ->
        {:retry, nil, "failed: #{describe(reason)}"}
    end
  end

  defp retry_after(headers) do
    with {_, value} <- List.keyfind(headers, "retry-after", 0),
         {seconds, ""} <- Integer.parse(value) do
      seconds * 1000
    else
      _ -> nil
    end
  end

  # The error's kind, never the URL (it can be a credential).
  defp describe({:failed_connect, _}), do: "could not connect"
  defp describe(:timeout), do: "timed out"
  defp describe({reason, _}) when is_atom(reason), do: Atom.to_string(reason)
  defp describe(reason) when is_atom(reason), do: Atom.to_string(reason)
  defp describe(_reason), do: "error"

  ## Server

  @impl true
  def init(_opts) do
    Events.subscribe_when_up([Observatory.Gateway.Alerts.topic(), Observatory.KillSwitch.topic()])

    {:ok, %{open: %{}, buckets: %{}, busy: %{}, tasks: %{}}}
  end

  @impl true
  def handle_info({ref, result}, %{tasks: tasks} = state) when is_map_key(tasks, ref) do
    Process.demonitor(ref, [:flush])
    {job, tasks} = Map.pop(tasks, ref)
    {:noreply, finished(%{state | tasks: tasks}, job, result)}
  end

  def handle_info({:DOWN, ref, :process, _pid, _reason}, %{tasks: tasks} = state)
      when is_map_key(tasks, ref) do
    {job, tasks} = Map.pop(tasks, ref)
    {:noreply, finished(%{state | tasks: tasks}, job, {:retry, nil, "crashed"})}
  end

  def handle_info({:retry, job}, state), do: {:noreply, run(state, job)}

  def handle_info({Events, :subscribe, topics}, state) do
    Events.subscribe_when_up(topics)
    {:noreply, state}
  end

  def handle_info(%{event_type: _} = event, state) do
    state =
      event
      |> alerts()
      |> Enum.filter(&(Observatory.Cluster.owner(owner_key(&1)) == node()))
      |> Enum.reduce(state, &handle_alert/2)

    {:noreply, state}
  rescue
    # One odd event must not take the alarms held (and their resolutions) with it.
    error ->
      Logger.error("notifications: an event could not be handled: #{Exception.message(error)}")
      {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  # A session's alerts are sent by the session's owner; an agent's by the agent's.
  defp owner_key(%{session_id: session}) when is_binary(session), do: session
  defp owner_key(%{agent_id: agent}) when is_binary(agent), do: agent
  defp owner_key(alert), do: alert.key

  defp handle_alert(%{action: :trigger} = alert, state) do
    if Map.has_key?(state.open, alert.key) do
      state
    else
      now = System.monotonic_time(:millisecond)

      {state, reached} =
        Notifications.all_sinks()
        |> Enum.map(&elem(&1, 1))
        |> Enum.filter(&(alert.kind in &1.events))
        |> Enum.reduce({state, []}, fn sink, {state, reached} ->
          case take_token(state, sink.name, now) do
            {:ok, state} ->
              {enqueue(state, sink, alert), [sink.name | reached]}

            {:empty, state} ->
              Metrics.inc(:notifications_dropped)

              Logger.warning(
                "notification to sink #{inspect(sink.name)} dropped: over its rate limit " <>
                  "(#{per_minute()} a minute): #{alert.key}"
              )

              {state, reached}
          end
        end)

      open = Map.put(state.open, alert.key, %{at: now, sinks: reached})
      %{state | open: cap(open)}
    end
  end

  defp handle_alert(%{action: :resolve} = alert, state) do
    case Map.pop(state.open, alert.key) do
      {nil, _open} ->
        state

      {%{sinks: names}, open} ->
        sinks = for {_source, sink} <- Notifications.all_sinks(), sink.name in names, do: sink
        Enum.reduce(sinks, %{state | open: open}, &enqueue(&2, &1, alert))
    end
  end

  # At most :max_open alarms held: the oldest are forgotten.
  defp cap(open) do
    max = Keyword.get(Notifications.config(), :max_open, 10_000)

    if map_size(open) > max,
      do:
        open
        |> Enum.sort_by(fn {_k, v} -> v.at end)
        |> Enum.drop(map_size(open) - max)
        |> Map.new(),
      else: open
  end

  # A token bucket per sink: per_minute tokens, refilled continuously.
  defp take_token(state, name, now) do
    per_minute = per_minute()
    {tokens, last} = Map.get(state.buckets, name, {per_minute * 1.0, now})
    tokens = min(per_minute * 1.0, tokens + (now - last) * per_minute / 60_000)

    if tokens >= 1,
      do: {:ok, %{state | buckets: Map.put(state.buckets, name, {tokens - 1, now})}},
      else: {:empty, %{state | buckets: Map.put(state.buckets, name, {tokens, now})}}
  end

  defp per_minute, do: Keyword.get(Notifications.config(), :rate_limit_per_minute, 30)

  # One delivery at a time per sink and key, the others waiting in order.
  defp enqueue(state, sink, alert) do
    job = %{sink: sink, alert: alert, attempt: 1}
    slot = {sink.name, alert.key}

    case Map.fetch(state.busy, slot) do
      {:ok, queue} -> %{state | busy: Map.put(state.busy, slot, :queue.in(job, queue))}
      :error -> run(%{state | busy: Map.put(state.busy, slot, :queue.new())}, job)
    end
  end

  defp run(state, job) do
    task = Task.Supervisor.async_nolink(@tasks, fn -> deliver(job.sink, job.alert) end)
    %{state | tasks: Map.put(state.tasks, task.ref, job)}
  end

  defp finished(state, job, :ok) do
    Metrics.inc(:notifications_sent)
    next(state, job)
  end

  defp finished(state, job, {:retry, after_ms, why}) do
    config = Notifications.config()
    max_attempts = Keyword.get(config, :max_attempts, 5)

    if job.attempt < max_attempts do
      delay = backoff(job.attempt, after_ms, config)

      Logger.warning(
        "notification to sink #{inspect(job.sink.name)} #{why}; attempt #{job.attempt + 1} " <>
          "of #{max_attempts} in #{delay} ms"
      )

      Process.send_after(self(), {:retry, %{job | attempt: job.attempt + 1}}, delay)
      state
    else
      give_up(state, job, why)
    end
  end

  defp finished(state, job, {:error, why}), do: give_up(state, job, why)

  defp give_up(state, job, why) do
    Metrics.inc(:notifications_failed)

    Logger.warning(
      "notification to sink #{inspect(job.sink.name)} (#{job.sink.type}) not delivered: #{why} " <>
        "(#{job.alert.action} #{job.alert.key}, attempt #{job.attempt})"
    )

    next(state, job)
  end

  defp next(state, job) do
    slot = {job.sink.name, job.alert.key}

    case :queue.out(Map.get(state.busy, slot, :queue.new())) do
      {{:value, waiting}, queue} ->
        run(%{state | busy: Map.put(state.busy, slot, queue)}, waiting)

      {:empty, _} ->
        %{state | busy: Map.delete(state.busy, slot)}
    end
  end

  # backoff_ms doubled per attempt, ±20 %, at most max_backoff_ms; a Retry-After wins
  # (up to the same cap).
  defp backoff(attempt, after_ms, config) do
    base = Keyword.get(config, :backoff_ms, 1_000)
    cap = Keyword.get(config, :max_backoff_ms, 60_000)

    case after_ms do
      nil ->
        delay = base * Integer.pow(2, attempt - 1)
        jitter = :rand.uniform(max(div(delay, 5), 1) * 2) - max(div(delay, 5), 1)
        min(delay + jitter, cap) |> max(0)

      ms ->
        min(ms, cap)
    end
  end
end
