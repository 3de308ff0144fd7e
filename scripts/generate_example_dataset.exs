# Writes the example dataset of `mix observatory.replay`: healthy and looping agent
# sessions as JSONL, plus a few bad lines (see Observatory.Replay.ExampleDataset).
# Deterministic: the same seed gives the same bytes.
#
#   mix run --no-start scripts/generate_example_dataset.exs                 # examples/agent_steps.jsonl
#   mix run --no-start scripts/generate_example_dataset.exs /tmp/big.jsonl.gz --scale 1000
#
# Options: --seed N (default 2026), --scale N (each kind of session N times, default 1).
# A path ending in .gz is written gzip-compressed.
{opts, args} = OptionParser.parse!(System.argv(), strict: [seed: :integer, scale: :integer])
path = List.first(args) || "examples/agent_steps.jsonl"

Observatory.Replay.ExampleDataset.write!(path, opts)
IO.puts("wrote #{path} (#{File.stat!(path).size} bytes)")
