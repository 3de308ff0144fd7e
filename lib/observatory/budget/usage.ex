defmodule Observatory.Budget.Usage do
  @moduledoc """
  Token counts read from an answer's `usage`, the same whatever the API said:

    * `input` — every input token, cached or not;
    * `cached` — of those, the ones read from the provider's prompt cache;
    * `cache_write` — of those, the ones written to it (Anthropic's cache creation);
    * `output` — the tokens of the answer (reasoning included).

  | API | `usage` fields read |
  |---|---|
  | Chat Completions | `prompt_tokens`, `completion_tokens`, `prompt_tokens_details.cached_tokens` |
  | Responses | `input_tokens`, `output_tokens`, `input_tokens_details.cached_tokens` |
  | Messages | `input_tokens` + `cache_read_input_tokens` + `cache_creation_input_tokens`, `output_tokens` |

  A streamed answer carries its usage in events: a Chat Completions stream in its last
  chunk (the proxy asks for it with `stream_options.include_usage`), a Responses
  stream in `response.completed`, a Messages stream in `message_start` (input) and
  `message_delta` (output, a running total). `merge/2` folds them.

      iex> Observatory.Budget.Usage.read(:messages, %{"input_tokens" => 10,
      ...>   "cache_read_input_tokens" => 90, "output_tokens" => 5})
      %{input: 100, cached: 90, cache_write: 0, output: 5}
  """

  @type t :: %{
          input: non_neg_integer(),
          cached: non_neg_integer(),
          cache_write: non_neg_integer(),
          output: non_neg_integer()
        }

  @doc "No tokens."
  @spec zero() :: t()
  def zero, do: %{input: 0, cached: 0, cache_write: 0, output: 0}

  @doc "Total tokens, input and output: what a token limit counts."
  @spec tokens(t()) :: non_neg_integer()
  def tokens(usage), do: usage.input + usage.output

  @doc "Reads an API's `usage` object; nil when it is not one."
  @spec read(:chat_completions | :responses | :messages, term()) :: t() | nil
  def read(:chat_completions, %{} = usage) do
    details = map(usage["prompt_tokens_details"])

    build(
      count(usage["prompt_tokens"]),
      count(details["cached_tokens"]),
      0,
      count(usage["completion_tokens"])
    )
  end

  def read(:responses, %{} = usage) do
    details = map(usage["input_tokens_details"])

    build(
      count(usage["input_tokens"]),
      count(details["cached_tokens"]),
      0,
      count(usage["output_tokens"])
    )
  end

  def read(:messages, %{} = usage) do
    read = count(usage["cache_read_input_tokens"])
    write = count(usage["cache_creation_input_tokens"])
    build(count(usage["input_tokens"]) + read + write, read, write, count(usage["output_tokens"]))
  end

  def read(_api, _other), do: nil

  @doc """
  Folds the usage objects of a stream's events (raw, as the API sent them) into one:
  a later event's fields replace an earlier one's (Anthropic's `message_delta`
  carries the running output total, and may repeat the input).
  """
  @spec merge(map() | nil, map()) :: map()
  def merge(nil, usage) when is_map(usage), do: usage
  def merge(acc, usage) when is_map(acc) and is_map(usage), do: Map.merge(acc, usage)

  @doc "Adds two usages."
  @spec add(t(), t()) :: t()
  def add(a, b),
    do: %{
      input: a.input + b.input,
      cached: a.cached + b.cached,
      cache_write: a.cache_write + b.cache_write,
      output: a.output + b.output
    }

  defp build(input, cached, write, output),
    do: %{input: input, cached: min(cached, input), cache_write: write, output: output}

  defp count(n) when is_integer(n) and n > 0, do: n
  defp count(_), do: 0

  defp map(%{} = m), do: m
  defp map(_), do: %{}
end
