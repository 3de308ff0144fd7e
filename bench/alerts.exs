# What the alert list, the evidence and the sessions list cost, each against the
# work the gateway already does in the same place, measured in the same run.
#
#   OBSERVATORY_PORT=4110 OBSERVATORY_DATA_DIR=/tmp/obs-bench MIX_ENV=prod mix run bench/alerts.exs
#   ... mix run bench/alerts.exs -- --quick
#
# Section 1 also runs on a checkout without the alert list (it prints the ingest rows
# only), for a before/after of the ingest path.
#
#   1. ingest: a step of a looping session (alerted: the EntropyAlertEvent, the verdict
#      and the alert list's write all run) against a step of a varied session (no
#      alert), both with 2 KB results, through SchemaInterceptor.ingest/1 — and
#      Alerts.alert/4 alone, the part this change adds, against a whole ingest.
#   2. Inspect: Evidence.for_session/1 (20 stored steps with 2 KB results, the
#      explanation of a repeat) against what Inspect read before it
#      (EntropyTracker.session/1 + LoopVerdict.session/1 + SessionLog.count/1).
#   3. GET /api/v1/sessions: one member's rows_here/3 over 10,000 sessions against
#      the dashboard's own listing of the same sessions (EntropyTracker.sessions/1).
alias Observatory.Gateway.{EntropyTracker, LoopVerdict, SchemaInterceptor, SessionLog}

Logger.configure(level: :error)
Application.put_env(:observatory, :alert_log_level, false)
quick? = "--quick" in System.argv()
n = if quick?, do: 20_000, else: 100_000

# Microseconds per call of `fun.(i)`, the median of 5 rounds of `count` calls; `i` runs
# on across rounds (1..5 × count), so no step is sent twice.
per_call = fn count, fun ->
  rounds =
    for round <- 0..4 do
      {us, _} = :timer.tc(fn -> for i <- 1..count, do: fun.(round * count + i) end)
      us / count
    end

  rounds |> Enum.sort() |> Enum.at(2)
end

failure =
  Enum.map_join(1..60, "\n", &"line #{&1}: assert 401 == 200 in test_auth.py")
  |> binary_part(0, 2_000)

step = fn session, i, varied? ->
  Observatory.JSON.encode!(%{
    "meta" => %{
      "step_id" => "b-#{session}-#{i}",
      "session_id" => session,
      "agent_id" => "agent-bench",
      "timestamp" => "2026-02-22T10:30:00.123Z"
    },
    "cognition" => %{"intent" => if(varied?, do: "step #{rem(i, 7)}", else: "run the tests")},
    "action" => %{
      "tool_call" => "bash",
      "tool_input" => %{"command" => if(varied?, do: "cat file_#{i}.txt", else: "pytest -x")},
      "status" => "failure",
      # The same size either way: a varied step's result differs from every other one.
      "result" => %{
        "exit_code" => 1,
        "stdout" => if(varied?, do: "step #{i}\n" <> failure, else: failure)
      }
    }
  })
end

# Pre-encoded; each measured call ingests one, in its own session's order.
looping = for i <- 1..n, into: %{}, do: {i, step.("bench-loop", i, false)}
varied = for i <- 1..n, into: %{}, do: {i, step.("bench-varied", i, true)}

alerted_us = per_call.(div(n, 5), fn i -> {:ok, _} = SchemaInterceptor.ingest(looping[i]) end)
varied_us = per_call.(div(n, 5), fn i -> {:ok, _} = SchemaInterceptor.ingest(varied[i]) end)
alerts? = Code.ensure_loaded?(Observatory.Gateway.Alerts)

IO.write("""
## 1. Ingest (per step, median of 5 rounds)

| step | µs | ratio |
|---|---:|---:|
| varied session (baseline, no alert) | #{Float.round(varied_us, 2)} | 1.00 |
| looping session, alerted every step | #{Float.round(alerted_us, 2)} | #{Float.round(alerted_us / varied_us, 2)} |
""")

unless alerts?, do: System.halt(0)

# The same table: the new work's row.
alias Observatory.Gateway.{Alerts, Evidence}
true = Alerts.get("bench-loop") != nil

alert_us =
  per_call.(n, fn _ ->
    Alerts.alert("bench-loop", "agent-bench", :entropy, %{rule: :entropy, reason: "bench"})
  end)

IO.puts("""
| Alerts.alert/4 alone (what the alert list adds to an alerted step) | #{Float.round(alert_us, 3)} | #{Float.round(alert_us / varied_us, 3)} |
""")

# 2. Inspect: the last 20 steps of the looping session are stored.
before_us =
  per_call.(2_000, fn _ ->
    {EntropyTracker.session("bench-loop"), LoopVerdict.session("bench-loop"),
     SessionLog.count("bench-loop")}
  end)

evidence_us = per_call.(2_000, fn _ -> Evidence.for_session("bench-loop") end)

IO.puts("""
## 2. Inspect's read (per load)

| read | µs | ratio |
|---|---:|---:|
| window + verdict + count (what Inspect read before) | #{Float.round(before_us, 1)} | 1.00 |
| Evidence.for_session/1 (20 steps, 2 KB results, a repeat explained) | #{Float.round(evidence_us, 1)} | #{Float.round(evidence_us / before_us, 1)} |
""")

# 3. The sessions list over 10,000 sessions.
for i <- 1..10_000 do
  {:ok, _} = SchemaInterceptor.ingest(step.("bench-list-#{i}", 1, true))
end

listing_us = per_call.(20, fn _ -> EntropyTracker.sessions(limit: 10_000) end)

rows_us =
  per_call.(20, fn _ ->
    ObservatoryWeb.API.SessionList.rows_here([{"state", "alert"}], nil, 51)
  end)

IO.puts("""
## 3. GET /api/v1/sessions on one member, 10,000 sessions (per request)

| work | ms | ratio |
|---|---:|---:|
| EntropyTracker.sessions(limit: 10_000) (the dashboard's listing) | #{Float.round(listing_us / 1000, 2)} | 1.00 |
| SessionList.rows_here/3, filtered to alerts, a page of 50 | #{Float.round(rows_us / 1000, 2)} | #{Float.round(rows_us / listing_us, 2)} |
""")
