# What Observatory.Testing.reset!/0 costs a host's test suite (docs/phoenix.md, step 7),
# against one ingested step measured in the same run.
#
#   OBSERVATORY_PORT=4941 OBSERVATORY_DATA_DIR=/tmp/obs-bench-reset OBSERVATORY_DEMO=0 \
#     mix run bench/testing_reset.exs
#
# Each round first fills what a test leaves behind: 5 agents, each with a key, a
# looping session of 5 steps and a pause. Printed: the median of 30 resets, the median
# of 30 ingested steps (SchemaInterceptor.ingest/1, a new session each), their ratio.
alias Observatory.Gateway.{HITL, SchemaInterceptor}

Logger.configure(level: :error)
Application.put_env(:observatory, :alert_log_level, false)

step = fn session, agent, n ->
  %{
    "meta" => %{
      "step_id" => "#{session}-#{n}",
      "session_id" => session,
      "agent_id" => agent,
      "timestamp" => "2026-02-22T10:30:00Z"
    },
    "cognition" => %{"intent" => "search"},
    "action" => %{"tool_call" => "read_file", "status" => "failure"}
  }
end

fill = fn round ->
  for i <- 1..5 do
    agent = "bench-#{round}-#{i}"
    {:ok, _} = Observatory.AgentKeys.issue(agent)
    for n <- 1..5, do: {:ok, _} = SchemaInterceptor.ingest(step.("s-#{agent}", agent, n))
    {:ok, _} = HITL.pause("s-#{agent}", operator: "bench")
  end
end

median = fn samples -> Enum.at(Enum.sort(samples), div(length(samples), 2)) end

resets =
  for round <- 1..30 do
    fill.(round)
    {us, :ok} = :timer.tc(&Observatory.Testing.reset!/0)
    us
  end

ingests =
  for i <- 1..30 do
    {us, {:ok, _}} =
      :timer.tc(fn -> SchemaInterceptor.ingest(step.("one-#{i}", "bench-one", 1)) end)

    us
  end

Observatory.Testing.reset!()
reset = median.(resets)
ingest = median.(ingests)

IO.puts("reset!/0 after a test's state: #{Float.round(reset / 1000, 2)} ms (median of 30)")
IO.puts("one ingested step:             #{Float.round(ingest / 1000, 3)} ms (median of 30)")
IO.puts("a reset costs #{round(reset / max(ingest, 1))} ingested steps")
