defmodule Observatory.Test.ToolConversation do
  @moduledoc """
  The request bodies a tool-calling agent on an SDK sends: the task, then each tool
  call of the model with the result the agent sent back, the whole conversation
  re-sent on every turn. In the OpenAI Chat Completions shape (`tool_calls` and
  `role: "tool"` messages), the Anthropic Messages shape (`tool_use` and
  `tool_result` blocks) or the OpenAI Responses shape (`function_call` and
  `function_call_output` items in `input`).
  """

  alias Observatory.JSON

  @type api :: :chat_completions | :messages | :responses
  @type turn :: {name :: String.t(), arguments :: map(), result :: String.t()}

  @doc "The body of the request sent after `turns`, as a map."
  @spec body(api(), String.t(), [turn()]) :: map()
  def body(:responses, task, turns) do
    items =
      turns
      |> Enum.with_index(1)
      |> Enum.flat_map(fn {{name, args, result}, k} ->
        [
          %{
            "type" => "function_call",
            "call_id" => "call_#{k}",
            "name" => name,
            "arguments" => JSON.encode!(args)
          },
          %{"type" => "function_call_output", "call_id" => "call_#{k}", "output" => result}
        ]
      end)

    %{"model" => "test-model", "input" => [user(task) | items]}
  end

  def body(api, task, turns) do
    history =
      turns
      |> Enum.with_index(1)
      |> Enum.flat_map(fn {{name, args, result}, k} -> turn(api, k, name, args, result) end)

    %{"model" => "test-model", "max_tokens" => 100, "messages" => [user(task) | history]}
  end

  @doc "The same, encoded."
  @spec json(api(), String.t(), [turn()]) :: binary()
  def json(api, task, turns), do: JSON.encode!(body(api, task, turns))

  defp user(task), do: %{"role" => "user", "content" => task}

  defp turn(:chat_completions, k, name, args, result) do
    id = "call_#{k}"

    [
      %{
        "role" => "assistant",
        "content" => nil,
        "tool_calls" => [
          %{
            "id" => id,
            "type" => "function",
            "function" => %{"name" => name, "arguments" => JSON.encode!(args)}
          }
        ]
      },
      %{"role" => "tool", "tool_call_id" => id, "content" => result}
    ]
  end

  defp turn(:messages, k, name, args, result) do
    id = "toolu_#{k}"

    [
      %{
        "role" => "assistant",
        "content" => [%{"type" => "tool_use", "id" => id, "name" => name, "input" => args}]
      },
      %{
        "role" => "user",
        "content" => [%{"type" => "tool_result", "tool_use_id" => id, "content" => result}]
      }
    ]
  end
end
