defmodule Observatory.Proxy.Steps do
  @moduledoc """
  Steps from proxied traffic: an agent that only talks to the LLM proxy still sends
  every step it takes through the gateway, because each request carries the
  conversation — the tool calls of the previous assistant turn and the results that
  answer them (`Observatory.Proxy.Conversation`). Each such call becomes a DecisionLog
  and goes through `Observatory.Gateway.SchemaInterceptor.ingest/2` like any other
  step, as the request's agent (`agent:`, so a session of another agent gets none): the entropy tracker, the loop verdict, the step detector, the session log and
  the dashboard see it.

  | DecisionLog field | from |
  |---|---|
  | `meta.session_id` | the `X-Session-Id` header, else `"proxy-"` + a keyed hash of the agent id and the conversation's start (`session_id/2`) |
  | `meta.agent_id` | the proxy's agent id |
  | `meta.step_id` | `"proxy-"` + the step's key (below) |
  | `cognition.intent` | the call itself: `"<tool> <arguments as JSON>"` (`intent/2`) |
  | `cognition.reasoning_chain` | the assistant turn's text, when it has any (at most 8 KiB) |
  | `action.tool_call`, `action.tool_input` | the call's name and arguments (parsed when they are JSON) |
  | `action.status`, `action.result` | `success` with the tool result; `failure` for an Anthropic `is_error` result; `pending` while unanswered |
  | `proxy` | `{"api", "tool_call_id"}` (`api`: `chat_completions`, `messages` or `responses`), kept as an unknown field |

  **What the entropy ratio compares.** FRD-009 scores the `{intent, tool_call,
  status}` tuples of a session's window. In a hand-written DecisionLog the intent says
  what the step is for, so different steps differ and a step taken again repeats. A
  proxied step has no such statement: OpenAI tool turns carry no text, and the task
  is the same on every turn, so either would make every step of a healthy agent the
  same tuple (a LOOP after five). The call itself is what the agent chose to do: two
  different calls are two tuples, the same call again (and its same status) is the
  same tuple. The assistant's text, when there is any, is kept in the reasoning chain
  rather than the intent: a stuck model rewords it ("let me try again", "once more")
  while it makes the same call.

  **Once each.** A step's key hashes the conversation up to its assistant turn and
  the call's place in it: the same on every later turn and on a retry, different
  for the next turn even when the model repeats the same call with the same id. The
  gateway's own idempotency (`Observatory.Gateway.Idempotency`) answers a step id it
  has seen with the first answer and counts it once, as for every entry point; a
  call first seen unanswered (`pending`) keeps that first record.

  The Responses API's `function_call` and `function_call_output` items are read as
  the Chat Completions tool calls and `role: "tool"` messages they are
  (`Observatory.Proxy.Responses.chat_body/1`).
  """

  require Logger

  alias Observatory.Gateway.SchemaInterceptor
  alias Observatory.Metrics
  alias Observatory.Proxy.{Conversation, Responses, SessionId}

  @max_field_bytes 1024
  @max_reasoning_bytes 8 * 1024
  # Bytes of an intent kept before a digest of the whole call replaces the rest.
  @intent_prefix_bytes @max_field_bytes - 20

  @doc """
  The session of a request that names none: a stable id derived from the agent and
  the start of the conversation, the same on every turn, keyed with a server secret
  (`Observatory.Proxy.SessionId`).
  """
  @spec session_id(String.t(), map()) :: String.t()
  defdelegate session_id(agent_id, body), to: SessionId, as: :derive

  @doc """
  Ingests the steps of the request's previous assistant turn. Returns how many were
  new: a step ingested before is answered as a replay and not counted again.
  """
  @spec record(Conversation.format() | :responses, String.t(), String.t(), map()) ::
          non_neg_integer()
  def record(format, agent_id, session_id, body),
    do: Enum.count(take(format, agent_id, session_id, body).results, &(not &1.replayed))

  @doc """
  Like `record/4`, returning what the proxy acts on: the ingest results of the
  request's steps (`Observatory.Gateway.SchemaInterceptor.ingest/2`'s, in order) —
  a step ingested before is answered with its first result, `replayed: true`, so a
  retried request reads as the request did.
  """
  @spec take(Conversation.format() | :responses, String.t(), String.t(), map()) ::
          %{results: [map()]}
  def take(format, agent_id, session_id, body) do
    results =
      for {_key, envelope} <- envelopes(format, agent_id, session_id, body),
          result = ingest(envelope, agent_id, session_id),
          do: result

    %{results: results}
  end

  @doc """
  The steps of the request's previous assistant turn as DecisionLog envelopes, each
  with its key (see the module doc: the same on every later turn that carries it).
  Nothing is ingested; `mix observatory.replay` reads recorded requests with it.
  """
  @spec envelopes(Conversation.format() | :responses, String.t(), String.t(), map()) ::
          [{String.t(), map()}]
  # The Responses API's items, read as the Chat Completions conversation they are.
  def envelopes(:responses, agent_id, session_id, body) do
    for {key, envelope} <- envelopes(:openai, agent_id, session_id, Responses.chat_body(body)),
        do: {key, put_in(envelope, ["proxy", "api"], "responses")}
  end

  def envelopes(format, agent_id, session_id, body) do
    case Conversation.last_turn(format, body) do
      nil ->
        []

      turn ->
        prefix = hash(Conversation.prefix(body, turn.position), 16)

        for {call, index} <- Enum.with_index(turn.calls) do
          key = prefix <> "-" <> Integer.to_string(index)
          {key, envelope(format, agent_id, session_id, key, turn.text, call)}
        end
    end
  end

  @doc """
  A proxied step's intent: the call, as `"<tool> <arguments>"` with the arguments as
  JSON (as parsed from the request, so their layout does not matter), or as the text
  they were when they are not JSON. At most 1 KiB: a longer one keeps its first bytes
  and ends with `" #"` and a digest of the whole call, so that two long calls stay
  distinct exactly when they differ.

      iex> Observatory.Proxy.Steps.intent("read_file", %{"path" => "src/a.py"})
      ~s(read_file {"path":"src/a.py"})
      iex> Observatory.Proxy.Steps.intent("ls", nil)
      "ls"
  """
  @spec intent(String.t(), term()) :: String.t()
  def intent(name, input) do
    text =
      case input do
        nil -> name
        text when is_binary(text) -> name <> " " <> text
        other -> name <> " " <> Observatory.JSON.encode_lossy!(other)
      end

    if byte_size(text) <= @max_field_bytes,
      do: text,
      else: valid_prefix(binary_part(text, 0, @intent_prefix_bytes)) <> " #" <> hash(text, 8)
  end

  defp envelope(format, agent_id, session_id, key, text, call) do
    %{
      "meta" => %{
        "step_id" => "proxy-" <> key,
        "session_id" => session_id,
        "agent_id" => agent_id,
        "timestamp" => DateTime.utc_now() |> DateTime.to_iso8601()
      },
      "cognition" => cognition(call, text),
      "action" => %{
        "tool_call" => truncate(call.name),
        "tool_input" => call.input,
        "status" => call.status,
        "result" => call.result
      },
      "proxy" => %{"api" => api_name(format), "tool_call_id" => call.id}
    }
  end

  defp cognition(call, nil), do: %{"intent" => intent(call.name, call.input)}

  defp cognition(call, text) do
    %{
      "intent" => intent(call.name, call.input),
      "reasoning_chain" => [truncate(text, @max_reasoning_bytes)]
    }
  end

  defp ingest(envelope, agent_id, session_id) do
    # As the key's agent (issue 13): a session another agent took meanwhile is refused.
    case SchemaInterceptor.ingest(envelope, agent: agent_id) do
      {:ok, %{replayed: false} = result} ->
        Metrics.inc(:proxy_steps)
        result

      # Seen before, on a retry of the turn: its first answer.
      {:ok, %{replayed: true} = result} ->
        result

      # Seen unanswered (pending) first, answered since: the first record stands.
      {:error, {:conflict, _violation}} ->
        nil

      {:error, {:invalid, violations}} ->
        Logger.warning(
          "LLM proxy: a step of session #{inspect(session_id)} was refused: #{inspect(violations)}"
        )

        nil

      {:error, {:forbidden, violation}} ->
        Logger.warning(
          "LLM proxy: a step of session #{inspect(session_id)} was refused: #{inspect(violation)}"
        )

        nil

      # In a cluster, the session's owner did not answer in time (issue 14), or the
      # step's first delivery is still being scored: a retry of the request carries it
      # again.
      {:error, {kind, violation}} when kind in [:unavailable, :in_progress] ->
        Logger.warning(
          "LLM proxy: a step of session #{inspect(session_id)} was not scored: #{violation.reason}"
        )

        nil
    end
  end

  defp api_name(:openai), do: "chat_completions"
  defp api_name(:anthropic), do: "messages"

  defp hash(term, bytes) do
    digest = :crypto.hash(:sha256, :erlang.term_to_binary(term, [:deterministic]))
    digest |> binary_part(0, bytes) |> Base.encode16(case: :lower)
  end

  # At most `max` bytes, cut on a character boundary.
  defp truncate(text, max \\ @max_field_bytes)
  defp truncate(text, max) when byte_size(text) <= max, do: text
  defp truncate(text, max), do: valid_prefix(binary_part(text, 0, max))

  defp valid_prefix(text) do
    if String.valid?(text),
      do: text,
      else: valid_prefix(binary_part(text, 0, byte_size(text) - 1))
  end
end
