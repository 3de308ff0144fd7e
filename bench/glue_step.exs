defmodule Observatory.Bench.GlueStep do
  @moduledoc false
  # The ~600-byte step of the benches that time a step's pieces (a reasoning chain, a
  # file read and a few lines of it). `message/2` is the glue benches' (bench/
  # ingest_glue_cost.exs, bench/ingest_glue_ab.exs): step `i` is session rem(i, 1000)'s
  # k-th step (k = div(i, 1000)), of agent rem(session, 50), with a new step id in
  # every call. `file_read/2` is the same step with the caller's `meta` and a fixed
  # intent, tool and status (bench/store_cost.exs, bench/session_log_cost.exs).
  # `kept_answer/0` is the answer the idempotency pair keeps (bench/ingest_breakdown.exs,
  # bench/ingest_alloc.exs).

  @line "  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\n"
  @tools ~w(read_file write_file list_files run_shell grep http_get sql edit)
  @intents ~w(search plan execute summarize)

  def message(i, tag \\ "g") do
    {s, k} = {rem(i, 1000), div(i, 1000)}

    meta = %{
      "step_id" => "#{tag}#{i}-#{System.unique_integer([:positive])}",
      "session_id" => "glue-#{s}",
      "agent_id" => "agent-#{rem(s, 50)}",
      "parent_step_id" => "step-#{i - 1}",
      "timestamp" => "2026-02-22T10:30:00.123Z"
    }

    step(meta, i,
      intent: Enum.at(@intents, rem(k + s, 4)),
      tool: Enum.at(@tools, rem(k * 3 + s, 8)),
      status: if(rem(k, 5) == 4, do: "failure", else: "success"),
      file: k
    )
  end

  @doc """
  The answer an ingest of a fleet-at-work step keeps for a retry (`Idempotency.complete/2`),
  as the benches that time the idempotency pair give it.
  """
  def kept_answer,
    do:
      {0.8112781244591328, :normal,
       {:loop_verdict, :progress, :progress, nil, "no rule fired", [], 17},
       {:step_verdict, :full_progress, 0, 0, :continue, nil}}

  @doc "Step `i` with `meta` as its meta section: a successful `read_file` of file `i`."
  def file_read(meta, i),
    do: step(meta, i, intent: "search", tool: "read_file", status: "success", file: i)

  defp step(meta, i, intent: intent, tool: tool, status: status, file: file) do
    Observatory.JSON.encode!(%{
      "meta" => meta,
      "cognition" => %{
        "intent" => intent,
        "reasoning_chain" => ["read the failing test", "open the module it names"],
        "confidence" => 0.8,
        "entropy_score" => 0.9
      },
      "action" => %{
        "tool_call" => tool,
        "tool_input" => %{"path" => "/srv/app/lib/app/file_#{file}.ex", "limit" => 200},
        "status" => status,
        "result" => %{"content" => "# #{i}\n" <> String.duplicate(@line, 3), "lines" => 4}
      }
    })
  end
end
