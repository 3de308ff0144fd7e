defmodule Observatory.Bench.GlueStep do
  @moduledoc false
  # The ~600-byte step of bench/ingest_glue_cost.exs and bench/ingest_glue_ab.exs (a
  # reasoning chain, a file read and a few lines of it): step `i` is session
  # rem(i, 1000)'s k-th step (k = div(i, 1000)), of agent rem(session, 50), with a new
  # step id in every call.

  @line "  def handle_call({:fetch, key}, _from, state), do: {:reply, Map.get(state, key), state}\n"
  @tools ~w(read_file write_file list_files run_shell grep http_get sql edit)
  @intents ~w(search plan execute summarize)

  def message(i, tag \\ "g") do
    {s, k} = {rem(i, 1000), div(i, 1000)}

    Observatory.JSON.encode!(%{
      "meta" => %{
        "step_id" => "#{tag}#{i}-#{System.unique_integer([:positive])}",
        "session_id" => "glue-#{s}",
        "agent_id" => "agent-#{rem(s, 50)}",
        "parent_step_id" => "step-#{i - 1}",
        "timestamp" => "2026-02-22T10:30:00.123Z"
      },
      "cognition" => %{
        "intent" => Enum.at(@intents, rem(k + s, 4)),
        "reasoning_chain" => ["read the failing test", "open the module it names"],
        "confidence" => 0.8,
        "entropy_score" => 0.9
      },
      "action" => %{
        "tool_call" => Enum.at(@tools, rem(k * 3 + s, 8)),
        "tool_input" => %{"path" => "/srv/app/lib/app/file_#{k}.ex", "limit" => 200},
        "status" => if(rem(k, 5) == 4, do: "failure", else: "success"),
        "result" => %{"content" => "# #{i}\n" <> String.duplicate(@line, 3), "lines" => 4}
      }
    })
  end
end
