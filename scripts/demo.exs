# A small fleet: two healthy agents and two that loop the ways FRD-009 describes.
# Prints each step's score and severity, and every EntropyAlertEvent.
alias Observatory.Gateway.{EntropyTracker, Events}

Events.subscribe(Events.entropy_alerts())

fleet = [
  {"sess-healthy-1", "agent-ok",
   Stream.cycle([
     {"plan", "read_file", :success},
     {"edit", "write_file", :success},
     {"verify", "run_tests", :success},
     {"search", "grep", :success},
     {"summarize", "respond", :success}
   ])},
  {"sess-same-failure", "agent-stuck", Stream.cycle([{"search", "read_file", :failure}])},
  {"sess-alternating", "agent-pingpong",
   Stream.cycle([{"fix", "edit_file", :success}, {"check", "run_build", :failure}])}
]

for step <- 1..8, {session, agent, steps} <- fleet do
  tuple = Enum.at(steps, step - 1)
  result = EntropyTracker.record_and_score(session, tuple, agent_id: agent)

  IO.puts(
    "step #{step}  #{String.pad_trailing(session, 20)} #{inspect(tuple)} -> #{inspect(result)}"
  )
end

receive_alerts = fn loop ->
  receive do
    %{event_type: "entropy_alert"} = alert ->
      IO.puts(
        "ALERT #{alert.session_id} score=#{alert.entropy_score} pattern=#{inspect(alert.repeated_pattern)} x#{alert.occurrence_count}"
      )

      loop.(loop)
  after
    0 -> :ok
  end
end

receive_alerts.(receive_alerts)
