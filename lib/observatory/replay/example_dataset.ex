defmodule Observatory.Replay.ExampleDataset do
  @moduledoc """
  Generates the example dataset of `mix observatory.replay`: the recorded steps of a
  small simulated fleet, as flat step records (and a few full envelopes) in JSONL.
  `scripts/generate_example_dataset.exs` writes it to `examples/agent_steps.jsonl`;
  the same seed always gives the same bytes.

  Each session's id says what it does:

  | session | steps | what the agent does |
  |---|---|---|
  | `healthy-N` | 20–30 | varied tools, new inputs, new results: never WARNING |
  | `loop-same-failure-N` | 4–6 healthy, then 9–12 | the same tool with the same input, the same failure (FRD-009's stuck agent) |
  | `loop-alternating-N` | 3–5 healthy, then 12–16 | two tools taking turns: the same edit, the same failing build |
  | `loop-stuck-N` | 3–5 healthy, then 10 | a new search query each time, always no result (new approach, same outcome) |
  | `recovers-N` | 7 on a timing-out query, then 15 healthy | loops, then finds its way |
  | `envelope-same-failure-N` | like `loop-same-failure` | the same, sent as full DecisionLog envelopes |

  `healthy-4` has no `agent_id` (it is replayed as `"unknown-agent"`). Sessions run
  side by side: each line is a step of one of up to 8 sessions in flight, picked at
  random. Five bad lines sit at fixed places: text that is not JSON, a truncated
  record, a JSON array, a record with an unknown status and one without an intent.

  ## Options
    * `:seed` — default #{2026}.
    * `:scale` — how many times each kind of session is repeated (default 1: 14
      sessions); the benchmark uses a large scale.
    * `:prefix` — put before every session id (tests use it to stay apart).
    * `:bad_lines` — include the bad lines (default true).
    * `:envelopes` — include the envelope sessions (default true).
  """

  @base_time ~U[2026-02-22 10:00:00Z]

  # {intent, tool_call} pairs a healthy agent moves through.
  @healthy [
    {"plan", "read_file"},
    {"search", "grep"},
    {"edit", "write_file"},
    {"verify", "run_tests"},
    {"fetch", "http_get"},
    {"inspect", "list_files"},
    {"query", "sql"},
    {"summarize", "respond"}
  ]

  @files ~w(lib/app/router.ex lib/app/user.ex lib/app/billing.ex config/runtime.exs
            test/app/user_test.exs mix.exs lib/app/repo.ex priv/schema.sql)

  @doc "The dataset's lines (JSON text, no newlines), in order."
  @spec lines(keyword()) :: [String.t()]
  def lines(opts \\ []) do
    seed = Keyword.get(opts, :seed, 2026)
    scale = Keyword.get(opts, :scale, 1)
    prefix = Keyword.get(opts, :prefix, "")
    rand = :rand.seed_s(:exsss, {seed, seed * 7 + 1, seed * 13 + 2})

    {sessions, rand} = sessions(scale, prefix, Keyword.get(opts, :envelopes, true), rand)
    steps = interleave(sessions, rand)

    lines =
      steps
      |> Enum.with_index()
      |> Enum.map(fn {step, i} -> encode(step, DateTime.add(@base_time, i, :second)) end)

    if Keyword.get(opts, :bad_lines, true), do: insert_bad(lines, prefix), else: lines
  end

  @doc "Writes the dataset to `path` (gzip-compressed when `path` ends in `.gz`)."
  @spec write!(Path.t(), keyword()) :: :ok
  def write!(path, opts \\ []) do
    data = Enum.map(lines(opts), &[&1, ?\n])
    data = if String.ends_with?(path, ".gz"), do: :zlib.gzip(data), else: data
    File.mkdir_p!(Path.dirname(path))
    File.write!(path, data)
  end

  ## Sessions: each a list of steps, built from the seed

  defp sessions(scale, prefix, envelopes?, rand) do
    kinds =
      [
        {"healthy", 4, &healthy/2},
        {"loop-same-failure", 2, &same_failure/2},
        {"loop-alternating", 2, &alternating/2},
        {"loop-stuck", 2, &stuck/2},
        {"recovers", 2, &recovers/2}
      ] ++ if(envelopes?, do: [{"envelope-same-failure", 2, &same_failure/2}], else: [])

    specs =
      for {label, count, fun} <- kinds, i <- 1..(count * scale) do
        {"#{prefix}#{label}-#{i}", label, fun}
      end

    Enum.map_reduce(specs, rand, fn {session_id, label, fun}, rand ->
      {steps, rand} = fun.(session_id, rand)

      agent_id =
        if label == "healthy" and rem(index(session_id), 4) == 0,
          do: nil,
          else: agent_for(session_id)

      format = if String.starts_with?(label, "envelope"), do: :envelope, else: :flat
      {%{session_id: session_id, agent_id: agent_id, format: format, steps: steps}, rand}
    end)
  end

  defp index(session_id),
    do: session_id |> String.split("-") |> List.last() |> String.to_integer()

  defp agent_for(session_id), do: "agent-" <> session_id

  defp healthy(_session_id, rand) do
    {n, rand} = uniform(rand, 11)
    healthy_steps(19 + n, [], rand)
  end

  # Each step picks a pair not among the last four, so a window of 5 never repeats.
  defp healthy_steps(0, acc, rand), do: {Enum.reverse(acc), rand}

  defp healthy_steps(n, acc, rand) do
    recent = acc |> Enum.take(4) |> Enum.map(&{&1.intent, &1.tool_call})
    choices = Enum.reject(@healthy, &(&1 in recent))
    {pick, rand} = uniform(rand, length(choices))
    {intent, tool} = Enum.at(choices, pick - 1)
    {file, rand} = uniform(rand, length(@files))
    {bytes, rand} = uniform(rand, 90_000)
    path = Enum.at(@files, file - 1)

    step = %{
      intent: intent,
      tool_call: tool,
      status: "success",
      tool_input: %{"path" => path, "attempt" => length(acc) + 1},
      result: %{"ok" => true, "bytes" => bytes},
      prompt_text: "#{intent} #{path}",
      response_text: "#{tool} returned #{bytes} bytes"
    }

    healthy_steps(n - 1, [step | acc], rand)
  end

  defp same_failure(_session_id, rand) do
    {h, rand} = uniform(rand, 3)
    {r, rand} = uniform(rand, 4)
    {lead, rand} = healthy_steps(3 + h, [], rand)
    {file, rand} = uniform(rand, length(@files))
    path = Enum.at(@files, file - 1)

    repeat = %{
      intent: "read",
      tool_call: "read_file",
      status: "failure",
      tool_input: %{"path" => path <> ".bak"},
      result: %{"error" => "enoent: no such file #{path}.bak"},
      prompt_text: "The file #{path}.bak is needed; read it.",
      response_text: "I will read #{path}.bak"
    }

    {lead ++ List.duplicate(repeat, 8 + r), rand}
  end

  defp alternating(_session_id, rand) do
    {h, rand} = uniform(rand, 3)
    {r, rand} = uniform(rand, 5)
    {lead, rand} = healthy_steps(2 + h, [], rand)

    edit = %{
      intent: "fix",
      tool_call: "edit_file",
      status: "success",
      tool_input: %{"path" => "lib/app/billing.ex", "patch" => "- amount\n+ amount * 100"},
      result: %{"ok" => true},
      prompt_text: "The build fails in billing.ex; fix it.",
      response_text: "Patching billing.ex"
    }

    build = %{
      intent: "check",
      tool_call: "run_build",
      status: "failure",
      tool_input: %{"cmd" => "mix compile"},
      result: %{"error" => "lib/app/billing.ex:42: undefined function amount/0"},
      prompt_text: "Run the build.",
      response_text: "Building"
    }

    turns = for i <- 1..(11 + r), do: if(rem(i, 2) == 1, do: edit, else: build)
    {lead ++ turns, rand}
  end

  defp stuck(_session_id, rand) do
    {h, rand} = uniform(rand, 3)
    {lead, rand} = healthy_steps(2 + h, [], rand)
    words = ~w(invoice refund ledger payout charge credit tax discount rebate fee)

    searches =
      for word <- words do
        %{
          intent: "search",
          tool_call: "grep",
          status: "failure",
          tool_input: %{"pattern" => "def #{word}_total", "path" => "lib/"},
          result: %{"error" => "no matches"},
          prompt_text: "Find where #{word} totals are computed.",
          response_text: "Searching for #{word}_total"
        }
      end

    {lead ++ searches, rand}
  end

  defp recovers(_session_id, rand) do
    timeout = %{
      intent: "query",
      tool_call: "sql",
      status: "timeout",
      tool_input: %{"sql" => "SELECT * FROM events ORDER BY inserted_at"},
      result: %{"error" => "timeout after 15000 ms"},
      prompt_text: "Count yesterday's events.",
      response_text: "Running the query again"
    }

    {healthy, rand} = healthy_steps(15, [], rand)
    {List.duplicate(timeout, 7) ++ healthy, rand}
  end

  ## Interleaving: up to 8 sessions in flight, the next step from one picked at random

  @in_flight 8

  defp interleave(sessions, rand) do
    {running, waiting} = Enum.split(sessions, @in_flight)
    interleave(running, waiting, 0, [], rand)
  end

  defp interleave([], [], _n, acc, _rand), do: Enum.reverse(acc)

  defp interleave(running, waiting, n, acc, rand) do
    {pick, rand} = uniform(rand, length(running))
    session = Enum.at(running, pick - 1)
    [step | rest] = session.steps
    acc = [{session, step, n} | acc]

    {running, waiting} =
      case {rest, waiting} do
        {[], [next | waiting]} -> {List.replace_at(running, pick - 1, next), waiting}
        {[], []} -> {List.delete_at(running, pick - 1), []}
        {rest, waiting} -> {List.replace_at(running, pick - 1, %{session | steps: rest}), waiting}
      end

    interleave(running, waiting, n + 1, acc, rand)
  end

  ## Lines

  defp encode({%{format: :flat} = session, step, _n}, at) do
    [
      {"session_id", session.session_id},
      {"agent_id", session.agent_id},
      {"timestamp", DateTime.to_iso8601(at)},
      {"intent", step.intent},
      {"tool_call", step.tool_call},
      {"action_status", step.status},
      {"tool_input", step.tool_input},
      {"result", step.result},
      {"prompt_text", step.prompt_text},
      {"response_text", step.response_text}
    ]
    |> Enum.reject(fn {_k, v} -> v == nil end)
    |> ordered_object()
  end

  defp encode({%{format: :envelope} = session, step, n}, at) do
    Observatory.JSON.encode!(%{
      "meta" => %{
        "step_id" => "#{session.session_id}-step-#{n}",
        "session_id" => session.session_id,
        "agent_id" => session.agent_id,
        "timestamp" => DateTime.to_iso8601(at)
      },
      "cognition" => %{
        "intent" => step.intent,
        "reasoning_chain" => [step.prompt_text],
        "confidence" => 0.8
      },
      "action" => %{
        "tool_call" => step.tool_call,
        "tool_input" => step.tool_input,
        "status" => step.status,
        "result" => step.result
      }
    })
  end

  # Flat records keep their fields in reading order (a JSON map would sort them).
  defp ordered_object(pairs) do
    body =
      Enum.map_join(pairs, ",", fn {k, v} ->
        Observatory.JSON.encode!(k) <> ":" <> Observatory.JSON.encode!(v)
      end)

    "{" <> body <> "}"
  end

  defp insert_bad(lines, prefix) do
    bad = [
      {12, "this line is not JSON"},
      {40, ~s({"session_id": "#{prefix}healthy-1", "intent": "plan", "tool_call": )},
      {75, ~s(["a JSON array", "is not a step"])},
      {110,
       ~s({"session_id": "#{prefix}healthy-2", "intent": "plan", "tool_call": "read_file", "action_status": "exploded"})},
      {150,
       ~s({"session_id": "#{prefix}healthy-3", "tool_call": "grep", "action_status": "success"})}
    ]

    Enum.reduce(bad, lines, fn {at, line}, lines ->
      if at <= length(lines), do: List.insert_at(lines, at - 1, line), else: lines
    end)
  end

  defp uniform(rand, n) do
    {x, rand} = :rand.uniform_s(n, rand)
    {x, rand}
  end
end
