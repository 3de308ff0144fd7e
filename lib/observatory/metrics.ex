defmodule Observatory.Metrics do
  @moduledoc """
  Gateway counters and a latency histogram, rendered in Prometheus text format at
  `GET /metrics`.

  Counters live in one `:counters` array (lock-free, written from any process); the
  array is created once at start and published with `:persistent_term`.
  """

  @counters [
    messages: "observatory_decision_logs_total",
    violations: "observatory_schema_violations_total",
    alerts: "observatory_entropy_alerts_total",
    entropy_errors: "observatory_entropy_errors_total",
    step_warnings: "observatory_step_warnings_total",
    step_blocks: "observatory_step_blocks_total",
    tool_calls_allowed: "observatory_tool_calls_allowed_total",
    tool_calls_denied: "observatory_tool_calls_denied_total",
    proxy_requests: "observatory_proxy_requests_total",
    proxy_inactive: "observatory_proxy_inactive_responses_total",
    upstream_errors: "observatory_proxy_upstream_errors_total",
    proxy_busy: "observatory_proxy_busy_responses_total",
    proxy_client_gone: "observatory_proxy_client_disconnects_total",
    proxy_steps: "observatory_proxy_steps_total",
    proxy_paused: "observatory_proxy_paused_responses_total",
    proxy_blocked: "observatory_proxy_blocked_responses_total",
    proxy_cancelled: "observatory_proxy_cancelled_requests_total",
    kill_switch_trips: "observatory_kill_switch_trips_total",
    kill_switch_would_trips: "observatory_kill_switch_would_trips_total",
    budget_refusals: "observatory_proxy_budget_refusals_total",
    guidance_notes: "observatory_proxy_guidance_notes_total",
    notifications_sent: "observatory_notifications_sent_total",
    notifications_failed: "observatory_notifications_failed_total",
    notifications_dropped: "observatory_notifications_dropped_total",
    verdict_errors: "observatory_verdict_errors_total",
    step_replays: "observatory_step_replays_total",
    step_conflicts: "observatory_step_conflicts_total",
    normal: nil,
    warning: nil,
    loop: nil,
    verdict_progress: nil,
    verdict_suspect: nil,
    verdict_loop: nil
  ]
  # Upper bounds of the ingest latency buckets, in microseconds.
  @buckets [50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000]
  @names Keyword.keys(@counters)
  @size length(@names) + length(@buckets) + 3

  @doc false
  def setup do
    :persistent_term.put(__MODULE__, :counters.new(@size, [:write_concurrency]))
  end

  @doc "Adds one to a counter: #{Enum.map_join(@names, ", ", &"`#{inspect(&1)}`")}."
  for {name, index} <- Enum.with_index(@names, 1) do
    def inc(unquote(name)), do: :counters.add(ref(), unquote(index), 1)
  end

  @doc """
  Adds one to each of three counters, as `inc/1` three times with one read of the
  array: the ingest counts every scored step this way (the step, its severity, its
  verdict).
  """
  def inc(a, b, c) do
    ref = ref()
    :counters.add(ref, index(a), 1)
    :counters.add(ref, index(b), 1)
    :counters.add(ref, index(c), 1)
  end

  for {name, index} <- Enum.with_index(@names, 1) do
    defp index(unquote(name)), do: unquote(index)
  end

  @doc "Records one ingest's latency in microseconds."
  def observe_latency(micros) when is_integer(micros) do
    ref = ref()
    :counters.add(ref, length(@names) + 1 + bucket(micros), 1)
    :counters.add(ref, @size - 1, micros)
    :counters.add(ref, @size, 1)
  end

  # The histogram bucket of a latency: one clause per bound, no list walked per step.
  for {bound, index} <- Enum.with_index(@buckets) do
    defp bucket(micros) when micros <= unquote(bound), do: unquote(index)
  end

  defp bucket(_micros), do: length(@buckets)

  @doc "A counter's current value."
  def get(name) when name in @names do
    :counters.get(ref(), Enum.find_index(@names, &(&1 == name)) + 1)
  end

  @doc "Every metric in Prometheus text exposition format."
  @spec render() :: iodata()
  def render do
    ref = ref()
    value = fn name -> :counters.get(ref, Enum.find_index(@names, &(&1 == name)) + 1) end

    counters =
      for {name, metric} <- @counters, metric != nil do
        ["# TYPE ", metric, " counter\n", metric, " ", Integer.to_string(value.(name)), "\n"]
      end

    severities = [
      "# TYPE observatory_severity_total counter\n"
      | for s <- [:normal, :warning, :loop] do
          [
            "observatory_severity_total{severity=\"",
            Atom.to_string(s),
            "\"} ",
            Integer.to_string(value.(s)),
            "\n"
          ]
        end
    ]

    verdicts = [
      "# TYPE observatory_verdict_total counter\n"
      | for v <- [:progress, :suspect, :loop] do
          [
            "observatory_verdict_total{verdict=\"",
            Atom.to_string(v),
            "\"} ",
            Integer.to_string(value.(:"verdict_#{v}")),
            "\n"
          ]
        end
    ]

    counts = for i <- 0..length(@buckets), do: :counters.get(ref, length(@names) + 1 + i)
    cumulative = Enum.scan(counts, &+/2)
    name = "observatory_ingest_duration_microseconds"

    histogram = [
      "# TYPE ",
      name,
      " histogram\n",
      for {le, total} <-
            Enum.zip(Enum.map(@buckets, &Integer.to_string/1) ++ ["+Inf"], cumulative) do
        [name, "_bucket{le=\"", le, "\"} ", Integer.to_string(total), "\n"]
      end,
      name,
      "_sum ",
      Integer.to_string(:counters.get(ref, @size - 1)),
      "\n",
      name,
      "_count ",
      Integer.to_string(:counters.get(ref, @size)),
      "\n"
    ]

    [counters, severities, verdicts, histogram, remembered()]
  end

  # What the idempotency check holds now (Observatory.Gateway.Idempotency), as gauges.
  defp remembered do
    stats = Observatory.Gateway.Idempotency.stats()

    for {name, value} <- [
          {"observatory_idempotency_steps", stats.steps},
          {"observatory_idempotency_sessions", stats.sessions},
          {"observatory_idempotency_agents", stats.agents},
          {"observatory_idempotency_bytes", stats.bytes}
        ] do
      ["# TYPE ", name, " gauge\n", name, " ", Integer.to_string(value), "\n"]
    end
  end

  defp ref, do: :persistent_term.get(__MODULE__)
end
