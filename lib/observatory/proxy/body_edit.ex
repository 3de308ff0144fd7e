defmodule Observatory.Proxy.BodyEdit do
  @moduledoc """
  The proxy's edits to a request body, and its reading of an answer's top-level
  fields, done in Rust (`observatory_core::json_splice`) on the bytes as they are:
  every byte the edit does not touch goes upstream as the agent sent it (no key
  reordered, no string re-escaped, no number reformatted).

      iex> body = ~s({"messages":[{"role":"tool","tool_call_id":"c1","content":"no such file"}]})
      iex> {:ok, edited} = Observatory.Proxy.BodyEdit.append_note(body, :chat_completions, "Stop.")
      iex> edited
      ~s({"messages":[{"role":"tool","tool_call_id":"c1","content":"no such file\\\\n\\\\nStop."}]})
  """

  alias Observatory.{JSON, Native}

  @dirty_bytes Observatory.Native.Cost.dirty_bytes()

  @typedoc "A proxied API, as the dialects name it."
  @type api :: :chat_completions | :messages | :responses

  @doc """
  The body with `note` appended to the newest tool result (the last one after the
  model's last turn: a `role: "tool"` message, a `tool_result` block, a
  `function_call_output` item), as text after a blank line or as one more text block;
  `:none` when the body's tail answers no tool call.
  """
  @spec append_note(binary(), api(), String.t()) :: {:ok, binary()} | :none
  def append_note(body, api, note) when is_binary(body) and is_binary(note) do
    result =
      if byte_size(body) > @dirty_bytes,
        do: Native.body_append_note_dirty(body, api, note),
        else: Native.body_append_note(body, api, note)

    result || :none
  end

  @doc """
  A streamed Chat Completions body asking for `stream_options.include_usage`, so that
  the stream's last chunk carries the usage; `:none` when it asks already or is not
  streamed.
  """
  @spec ensure_stream_usage(binary()) :: {:ok, binary()} | :none
  def ensure_stream_usage(body) when is_binary(body) do
    result =
      if byte_size(body) > @dirty_bytes,
        do: Native.body_ensure_stream_usage_dirty(body),
        else: Native.body_ensure_stream_usage(body)

    result || :none
  end

  @doc """
  The top-level `names` of a JSON object, decoded (nil when absent), without decoding
  the rest of it; `:error` when the body is not a JSON object.

      iex> Observatory.Proxy.BodyEdit.top_level_fields(~s({"model":"m","usage":{"input_tokens":3},"output":[]}), ["model", "usage", "id"])
      {:ok, ["m", %{"input_tokens" => 3}, nil]}
  """
  @spec top_level_fields(binary(), [String.t()]) :: {:ok, [term()]} | :error
  def top_level_fields(body, names) when is_binary(body) and is_list(names) do
    raw =
      if byte_size(body) > @dirty_bytes,
        do: Native.body_top_level_fields_dirty(body, names),
        else: Native.body_top_level_fields(body, names)

    case raw do
      nil ->
        :error

      values ->
        {:ok,
         Enum.map(values, fn
           nil -> nil
           text -> with({:ok, value} <- JSON.decode(text), do: value, else: (_ -> nil))
         end)}
    end
  end
end
