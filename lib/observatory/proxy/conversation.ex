defmodule Observatory.Proxy.Conversation do
  @moduledoc """
  What the proxy reads from the conversation an agent sends on every turn: the tool
  calls of its previous assistant turn with the results that answer them (the agent's
  latest steps) and the text that turn said beside them. Where a conversation starts,
  which names its session, is `Observatory.Proxy.SessionId`'s.

  Both request shapes are read: OpenAI Chat Completions (`tool_calls` on the assistant
  message, `role: "tool"` messages with `tool_call_id`) and Anthropic Messages
  (`tool_use` blocks in the assistant message, `tool_result` blocks with
  `tool_use_id` and `is_error` in the next user message).

      iex> body = %{"messages" => [
      ...>   %{"role" => "user", "content" => "fix the build"},
      ...>   %{"role" => "assistant", "tool_calls" => [%{"id" => "c1",
      ...>     "function" => %{"name" => "run", "arguments" => ~s({"cmd":"make"})}}]},
      ...>   %{"role" => "tool", "tool_call_id" => "c1", "content" => "ok"}]}
      iex> turn = Observatory.Proxy.Conversation.last_turn(:openai, body)
      iex> {turn.position, turn.text, turn.calls}
      {1, nil, [%{id: "c1", name: "run", input: %{"cmd" => "make"}, result: "ok", status: "success"}]}
  """

  # Tool calls read from one assistant turn: a body of a few KiB can hold thousands of
  # calls, each a synchronous ingest and a remembered step.
  @max_calls 128

  @type format :: :openai | :anthropic
  @type call :: %{
          id: String.t() | nil,
          name: String.t(),
          input: term(),
          result: term(),
          status: String.t()
        }
  @type turn :: %{position: non_neg_integer(), text: String.t() | nil, calls: [call()]}

  @doc """
  The previous assistant turn: its index in `messages`, its own text (`nil` when it
  has none, as OpenAI tool turns usually do) and its tool calls (the first #{@max_calls}), each with its result
  (`"success"`, `"failure"` for an Anthropic `is_error` result, `"pending"` while
  unanswered). `nil` when the last assistant message called no tool.
  """
  @spec last_turn(format(), map()) :: turn() | nil
  def last_turn(format, body) do
    messages = messages(body)

    with {message, position} when is_map(message) <- last_assistant(messages),
         [_ | _] = calls <- Enum.take(calls(format, message), @max_calls) do
      answers = results(format, Enum.drop(messages, position + 1))

      %{
        position: position,
        text: text(message["content"]),
        calls:
          for call <- calls do
            case Map.fetch(answers, call.id) do
              {:ok, {result, status}} -> Map.merge(call, %{result: result, status: status})
              :error -> Map.merge(call, %{result: nil, status: "pending"})
            end
          end
      }
    else
      _ -> nil
    end
  end

  @doc "The messages up to and including `position`: the same on a retry of one turn."
  @spec prefix(map(), non_neg_integer()) :: [term()]
  def prefix(body, position), do: Enum.take(messages(body), position + 1)

  defp messages(%{"messages" => messages}) when is_list(messages), do: messages
  defp messages(_body), do: []

  defp last_assistant(messages) do
    messages
    |> Enum.with_index()
    |> Enum.reverse()
    |> Enum.find(fn {m, _} -> is_map(m) and m["role"] == "assistant" end)
  end

  defp calls(:openai, message) do
    for %{"function" => %{"name" => name} = function} = call <- list(message["tool_calls"]),
        is_binary(name) do
      %{id: string(call["id"]), name: name, input: arguments(function["arguments"])}
    end
  end

  defp calls(:anthropic, message) do
    for %{"type" => "tool_use", "name" => name} = block <- list(message["content"]),
        is_binary(name) do
      %{id: string(block["id"]), name: name, input: block["input"]}
    end
  end

  # Results by call id.
  defp results(:openai, later) do
    for %{"role" => "tool", "tool_call_id" => id} = m <- later, is_binary(id), into: %{} do
      {id, {text(m["content"]) || m["content"], "success"}}
    end
  end

  defp results(:anthropic, later) do
    for %{"role" => "user", "content" => blocks} <- later,
        %{"type" => "tool_result", "tool_use_id" => id} = block <- list(blocks),
        is_binary(id),
        into: %{} do
      status = if block["is_error"] == true, do: "failure", else: "success"
      {id, {text(block["content"]) || block["content"], status}}
    end
  end

  # A string, or the text parts of a content array joined with newlines.
  defp text(content) when is_binary(content) and content != "", do: content

  defp text(parts) when is_list(parts) do
    case for(%{"type" => "text", "text" => t} <- parts, is_binary(t), t != "", do: t) do
      [] -> nil
      texts -> Enum.join(texts, "\n")
    end
  end

  defp text(_), do: nil

  # OpenAI sends arguments as a JSON string: kept as the object when it parses.
  defp arguments(text) when is_binary(text) do
    case Observatory.JSON.decode(text) do
      {:ok, value} -> value
      {:error, _} -> text
    end
  end

  defp arguments(other), do: other

  defp list(value) when is_list(value), do: value
  defp list(_), do: []

  defp string(value) when is_binary(value), do: value
  defp string(_), do: nil
end
