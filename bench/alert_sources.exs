# Which alert source catches loops without crying wolf? Replays, through the gateway's
# own ingest path (mix observatory.replay's engine), two labelled inputs:
#
#   * examples/agent_steps.jsonl — the project's example dataset; sessions named
#     healthy-* are clean, loop-*, envelope-same-failure-* and recovers-* loop;
#   * test/fixtures/loop_verdict_scenarios.json — the labelled scenario suite
#     (must-flag / must-not-flag; the one "suspect" case is left out of the counts),
#     written out as flat step records.
#
# and counts, per source (:entropy = FRD-009's uniqueness ratio, :verdict = the loop
# verdict), the looping sessions it alarmed on and the clean ones it alarmed on.
#
#   MIX_ENV=prod mix run bench/alert_sources.exs
alias Observatory.JSON

Logger.configure(level: :error)

{:ok, %{"scenarios" => scenarios}} =
  JSON.decode(File.read!("test/fixtures/loop_verdict_scenarios.json"))

dir =
  Path.join(System.tmp_dir!(), "observatory_alert_sources_#{System.unique_integer([:positive])}")

File.mkdir_p!(dir)
scenario_file = Path.join(dir, "scenarios.jsonl")

lines =
  for {scenario, i} <- Enum.with_index(scenarios, 1), step <- scenario["steps"] do
    JSON.encode!(%{
      "session_id" => "scenario-#{i}",
      "agent_id" => "agent-scenario-#{i}",
      "intent" => step["intent"],
      "tool_call" => step["tool"],
      "tool_input" => step["input"],
      "status" => step["status"],
      "result" => step["result"]
    })
  end

File.write!(scenario_file, Enum.join(lines, "\n") <> "\n")

label = fn
  "scenario-" <> i -> Enum.at(scenarios, String.to_integer(i) - 1)["label"]
  "healthy-" <> _ -> "must-not-flag"
  _looping -> "must-flag"
end

# One pass judges both sources: every ingest result carries the entropy severity and
# the verdict, whatever :alert_source is; a session alarmed under :entropy when one of
# its steps was LOOP (an EntropyAlertEvent), under :verdict when its verdict was loop.
report = Observatory.Replay.run(["examples/agent_steps.jsonl", scenario_file])
File.rm_rf!(dir)

by_id = Map.new(report.sessions, &{&1.session_id, &1})
sessions = for s <- report.sessions, do: {s.session_id, label.(s.session_id)}
looping = for {id, "must-flag"} <- sessions, do: id
clean = for {id, "must-not-flag"} <- sessions, do: id

alarmed? = fn
  id, :entropy -> by_id[id].first_loop != nil
  id, :verdict -> by_id[id].first_verdict_loop != nil
end

IO.puts("#{length(sessions)} sessions: #{length(looping)} looping, #{length(clean)} clean\n")

missed = fn source -> for id <- looping, not alarmed?.(id, source), do: id end
wolf = fn source -> for id <- clean, alarmed?.(id, source), do: id end
IO.puts("| alert source | loops caught | clean sessions falsely alarmed |")
IO.puts("|---|---:|---:|")

for source <- [:entropy, :verdict] do
  caught = Enum.count(looping, &alarmed?.(&1, source))
  false_alarms = Enum.count(clean, &alarmed?.(&1, source))
  IO.puts("| `#{source}` | #{caught} / #{length(looping)} | #{false_alarms} / #{length(clean)} |")
end

for source <- [:entropy, :verdict] do
  describe = fn ids ->
    Enum.map_join(ids, "; ", fn
      "scenario-" <> i = id -> "#{id} (#{Enum.at(scenarios, String.to_integer(i) - 1)["name"]})"
      id -> id
    end)
  end

  IO.puts("\n#{source}: missed #{describe.(missed.(source))}")
  IO.puts("#{source}: false alarms #{describe.(wolf.(source))}")
end
