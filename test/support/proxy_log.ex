defmodule Observatory.Test.ProxyLog do
  @moduledoc """
  Recorded proxy traffic as `mix observatory.replay` reads it
  (`Observatory.Replay.ProxyRequest`): one line per LLM request of a tool-calling
  agent on Chat Completions, with the answer (a tool call and its `usage`) and the
  time it was sent. `examples/proxy_log.jsonl` is made with it.
  """

  alias Observatory.JSON
  alias Observatory.Test.ToolConversation

  @doc """
  The lines of one agent's session: `turns` requests, one a minute from `start`, the
  call of turn k given by `call.(k)` as `{name, args, result}`; each answer costs
  `input` tokens (growing with the conversation) and 50 output tokens.
  """
  @spec session(String.t(), String.t(), pos_integer(), (pos_integer() -> tuple()), DateTime.t()) ::
          [binary()]
  def session(agent, session, turns, call, start) do
    for n <- 1..turns do
      done = for k <- 1..(n - 1)//1, do: call.(k)
      {name, args, _result} = call.(n)

      JSON.encode!(%{
        api: "chat_completions",
        agent_id: agent,
        session_id: session,
        timestamp: start |> DateTime.add(60 * (n - 1), :second) |> DateTime.to_iso8601(),
        request: ToolConversation.body(:chat_completions, "Fix the build of #{session}.", done),
        response: %{
          id: "chatcmpl-#{session}-#{n}",
          object: "chat.completion",
          model: "gpt-4.1",
          choices: [
            %{
              index: 0,
              finish_reason: "tool_calls",
              message: %{
                role: "assistant",
                content: nil,
                tool_calls: [
                  %{
                    id: "call_#{n}",
                    type: "function",
                    function: %{name: name, arguments: JSON.encode!(args)}
                  }
                ]
              }
            }
          ],
          usage: %{prompt_tokens: 1_000 + 400 * n, completion_tokens: 50}
        }
      })
    end
  end

  @doc """
  A looping agent (the same call, the same error) and a healthy one (different
  files), their ids and sessions prefixed with `prefix`.
  """
  @spec example(String.t(), DateTime.t()) :: [binary()]
  def example(prefix \\ "", start \\ ~U[2026-02-22 10:00:00Z]) do
    loop = fn _k -> {"read_file", %{"path" => "build.log"}, "error: no such file: build.log"} end

    healthy = fn k ->
      {"read_file", %{"path" => "src/handler_#{k}.py"}, "def handler_#{k}(): ..."}
    end

    session("#{prefix}agent-looping", "#{prefix}sess-looping", 12, loop, start) ++
      session("#{prefix}agent-healthy", "#{prefix}sess-healthy", 12, healthy, start)
  end
end
