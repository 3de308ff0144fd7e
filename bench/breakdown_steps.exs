# The steps bench/ingest_breakdown.exs times, shared with the benches that take one of
# its stages apart (bench/scoring_cold.exs, bench/scoring_parts.exs): three sizes,
# "small" (~300 bytes: a tool call and a one-number result), "600 B" (a reasoning
# chain, a file read and a few lines of its content), "4 KiB" (the same with a 3.6 KiB
# file read back). Template i is step k = div(i, 1000) of session rem(i, 1000), 50
# agents: a session's steps vary their intent, tool, input and status, as a working
# agent's do (its entropy window is mostly normal, and no rule of the loop verdict
# fires).
defmodule Observatory.Bench.BreakdownSteps do
  @intents ~w(search plan execute summarize)
  @tools ~w(read_file write_file list_files run_shell grep http_get sql edit)
  @templates 10_000

  @line "  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\n"

  def intents, do: @intents
  def tools, do: @tools
  def sizes, do: [small: "small", medium: "600 B", large: "4 KiB"]
  def templates, do: @templates

  @doc """
  Makes every size's templates under `key`: each message a template around its
  step_id (also in the result of the larger ones: no two results are the same, as
  when an agent works), kept off the callers' heaps.
  """
  def publish(key) do
    for {size, _} <- sizes() do
      parts =
        for i <- 0..(@templates - 1) do
          envelope(size, i)
          |> Observatory.JSON.encode!()
          |> String.split("@STEP@")
        end

      :persistent_term.put({key, size}, List.to_tuple(parts))
    end

    :ok
  end

  @doc "Message `i` of `size` published under `key`, its step_id `tag` followed by `i`."
  def message(key, size, i, tag) do
    parts = elem(:persistent_term.get({key, size}), rem(i, @templates))
    Enum.join(parts, tag <> Integer.to_string(i))
  end

  defp result(:small, i), do: %{"bytes" => 1024 + i, "etag" => "@STEP@"}

  defp result(:medium, _),
    do: %{"content" => "# @STEP@\n" <> String.duplicate(@line, 3), "lines" => 4}

  defp result(:large, _),
    do: %{"content" => "# @STEP@\n" <> String.duplicate(@line, 42), "lines" => 43}

  defp envelope(size, i) do
    {s, k} = {rem(i, 1000), div(i, 1000)}
    intent = Enum.at(@intents, rem(k + s, 4))

    cognition =
      if size == :small,
        do: %{"intent" => intent, "entropy_score" => 0.9},
        else: %{
          "intent" => intent,
          "reasoning_chain" => ["read the failing test", "open the module it names"],
          "confidence" => 0.8,
          "entropy_score" => 0.9
        }

    %{
      "meta" => %{
        "step_id" => "@STEP@",
        # Each size its own sessions.
        "session_id" => "sess-#{size}-#{s}",
        "agent_id" => "agent-#{rem(s, 50)}",
        "parent_step_id" => "step-#{i - 1}",
        "timestamp" => "2026-02-22T10:30:00.123Z"
      },
      "cognition" => cognition,
      "action" => %{
        "tool_call" => Enum.at(@tools, rem(k * 3 + s, 8)),
        "tool_input" => %{"path" => "/srv/app/lib/app/file_#{k}.ex", "limit" => 200},
        "status" => if(rem(k, 5) == 4, do: "failure", else: "success"),
        "result" => result(size, i)
      }
    }
  end

  @doc """
  The scoring NIF's arguments for parsed step `fields`, as `StepScore.score/3` and
  `EntropyTracker.score_step/4` build them for the default tracker, with `stores`
  (`{entropy, verdict, step}`; default: the application's three) as its stores.
  """
  def score_step_args(fields, stores \\ score_stores()) do
    {entropy_config, verdict_config, {_, packed_step_settings}} =
      Observatory.Gateway.StepScore.settings()

    {:ok, code} = Observatory.Gateway.ActionStatus.to_code(fields.status)

    [
      stores,
      fields.session_id,
      {fields.intent, fields.tool_call, code, fields.agent_id, entropy_config, true},
      fields.verdict_keys,
      verdict_config,
      fields.outcome && {fields.approach, fields.outcome},
      packed_step_settings
    ]
  end

  @doc "The scoring stage's three stores: `{entropy, verdict, step}`."
  def score_stores do
    {_, entropy, verdict, step} = Observatory.NativeStores.get_row(Observatory.Gateway.StepScore)

    {entropy, verdict, step}
  end

  @doc """
  A parsed step scored as the ingest scores it: the one scoring NIF call, its three
  answers settled (the breakdown's scoring row).
  """
  def score_and_settle(f) do
    alias Observatory.Gateway.{EntropyTracker, LoopVerdict, StepDetector, StepScore}
    {e, v, s, thresholds} = StepScore.score(f, EntropyTracker, true)
    EntropyTracker.settle(e, f.session_id, f.agent_id, true)
    LoopVerdict.settle(v, f.session_id, f.agent_id, f.step_id)
    s && StepDetector.settle(s, f.session_id, thresholds)
  end
end
