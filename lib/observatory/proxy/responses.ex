defmodule Observatory.Proxy.Responses do
  @moduledoc """
  What the proxy reads from the OpenAI Responses API (`POST /v1/responses`), the
  OpenAI Agents SDK's default: the kill switch's fingerprints (in Rust,
  `observatory_core::responses`) and the conversation the steps come from.

  A Responses request carries its conversation as `input` items rather than
  `messages`: messages (`role` user, system, developer or assistant, text in
  `input_text` / `output_text` parts), `function_call` items (`call_id`, `name`,
  `arguments`) and the `function_call_output` items that answer them. `chat_body/1`
  reads them as the Chat Completions conversation they are — an assistant message
  whose `tool_calls` are the turn's `function_call` items, `role: "tool"` messages
  for their outputs — so the steps are taken exactly as from Chat Completions
  (`Observatory.Proxy.Steps`).

  What the kill switch reads (`Observatory.KillSwitch.fingerprint_request/3` and
  `fingerprint_response/2` with `:responses`; in Rust `observatory_core::responses`,
  through the readings every API shares): the newest input from the user side — the
  `function_call_output` items of the newest turn when it answers tool calls, else
  the last user text (or, with the `:kill_switch` `:prompt` setting
  `:last_user_message`, the last user text) — the `function_call` items those outputs
  answer (the same signatures as the equivalent Chat Completions calls), and the
  answer's `output_text`.
  """

  @doc "The text a streamed event adds to the answer (`response.output_text.delta`), or nil."
  @spec stream_text(map()) :: String.t() | nil
  def stream_text(%{data: %{"type" => "response.output_text.delta", "delta" => text}})
      when is_binary(text),
      do: text

  def stream_text(_event), do: nil

  @doc """
  The request's conversation as a Chat Completions body (`%{"messages" => …}`):
  `instructions` as a system message, a string `input` as a user message, and the
  items as described in the module doc. Items the steps do not read (reasoning,
  built-in tool calls, item references) are left out.

      iex> Observatory.Proxy.Responses.chat_body(%{"input" => [
      ...>   %{"role" => "user", "content" => "fix the build"},
      ...>   %{"type" => "function_call", "call_id" => "c1", "name" => "run", "arguments" => ~s({"cmd":"make"})},
      ...>   %{"type" => "function_call_output", "call_id" => "c1", "output" => "ok"}]})
      %{"messages" => [
        %{"role" => "user", "content" => "fix the build"},
        %{"role" => "assistant", "content" => nil, "tool_calls" => [
          %{"id" => "c1", "type" => "function", "function" => %{"name" => "run", "arguments" => ~s({"cmd":"make"})}}]},
        %{"role" => "tool", "tool_call_id" => "c1", "content" => "ok"}]}
  """
  @spec chat_body(map()) :: map()
  def chat_body(body) when is_map(body) do
    instructions =
      case body["instructions"] do
        text when is_binary(text) and text != "" -> [%{"role" => "system", "content" => text}]
        _ -> []
      end

    items =
      case body["input"] do
        text when is_binary(text) -> [%{"role" => "user", "content" => text}]
        items when is_list(items) -> items
        _ -> []
      end

    messages =
      items
      |> Enum.reduce([], &add_item/2)
      |> Enum.reverse()

    %{"messages" => instructions ++ messages}
  end

  # Messages are built newest first; a function call joins the assistant message it
  # follows (its text is the turn's intent), or opens one.
  defp add_item(%{"type" => "function_call", "name" => name} = item, acc) when is_binary(name) do
    call = %{
      "id" => string(item["call_id"]),
      "type" => "function",
      "function" => %{"name" => name, "arguments" => item["arguments"]}
    }

    case acc do
      [%{"role" => "assistant"} = last | older] ->
        [Map.update(last, "tool_calls", [call], &(&1 ++ [call])) | older]

      _ ->
        [%{"role" => "assistant", "content" => nil, "tool_calls" => [call]} | acc]
    end
  end

  defp add_item(%{"type" => "function_call_output", "call_id" => id} = item, acc) do
    [%{"role" => "tool", "tool_call_id" => string(id), "content" => output(item["output"])} | acc]
  end

  defp add_item(%{"role" => role} = item, acc)
       when role in ["user", "system", "developer", "assistant"] do
    if item["type"] in [nil, "message"],
      do: [%{"role" => role, "content" => content(item["content"])} | acc],
      else: acc
  end

  defp add_item(_other, acc), do: acc

  # Text parts (input_text, output_text) as Chat Completions text parts.
  defp content(text) when is_binary(text), do: text

  defp content(parts) when is_list(parts) do
    for %{"type" => type, "text" => text} <- parts,
        type in ["input_text", "output_text", "text"],
        is_binary(text),
        do: %{"type" => "text", "text" => text}
  end

  defp content(_), do: nil

  defp output(text) when is_binary(text), do: text
  defp output(parts) when is_list(parts), do: content(parts)
  defp output(other), do: other

  defp string(value) when is_binary(value), do: value
  defp string(_), do: nil
end
