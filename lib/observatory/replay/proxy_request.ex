defmodule Observatory.Replay.ProxyRequest do
  @moduledoc """
  A recorded LLM request as a replay line: the steps an agent that only talks to the
  proxy takes, read the way the proxy reads them (`Observatory.Proxy.Steps`).

      {"api": "chat_completions", "agent_id": "agent-7", "session_id": "s-1",
       "timestamp": "2026-02-22T10:30:00Z",
       "request": {"model": "gpt-4o", "messages": [...]},
       "response": {"id": "chatcmpl-…", "choices": [...], "usage": {...}}}

  `request` is the body the agent sent: OpenAI Chat Completions (`"api":
  "chat_completions"`, the default), Anthropic Messages (`"api": "messages"`) or the
  OpenAI Responses API (`"api": "responses"`, its `input` items). The optional
  fields are what the kill switch and the budgets read of the exchange
  (`Observatory.Replay.WouldTrip`): `timestamp` (when it was sent: rolling windows),
  `response` (the whole answer: its text and `usage`), or, for a streamed answer,
  `usage` (the API's usage object) and `response_text`.
  `agent_id` defaults to `"unknown-agent"`; `session_id` to an id derived from the
  agent and the conversation's start as the proxy derives it
  (`Observatory.Proxy.SessionId`), keyed with a fixed key rather than the gateway's
  secret, so that it is the same on every run of the replay. The tool calls of the request's
  previous assistant turn, with the results that answer them, are its steps. A
  conversation is re-sent on every turn: each step keeps its step_id from request to
  request, as the proxy's do, so the gateway counts it once.
  """

  alias Observatory.JSON
  alias Observatory.Proxy.{SessionId, Steps}
  alias Observatory.Replay.Record

  @formats %{"chat_completions" => :openai, "messages" => :anthropic, "responses" => :responses}
  @apis %{openai: :chat_completions, anthropic: :messages, responses: :responses}
  # Not a secret: replayed sessions need stable ids, not unguessable ones.
  @replay_key "observatory replay session id"

  @doc """
  Reads a line: `:not_request` when it is no recorded request (an envelope or a flat
  step record), `{:ok, session_id, [{key, envelope_json}], exchange}` with its steps
  and the exchange (`api`, `agent_id`, `session_id`, `timestamp`, `request`,
  `response`, `usage`, `response_text`), or `{:error, reason}`. Only an object with a
  `"request"` that has `"messages"` or `"input"`, and neither `"meta"` (an envelope)
  nor `"tool_call"` (a flat record), is a request.
  """
  @spec read(binary()) ::
          :not_request
          | {:ok, String.t(), [{String.t(), binary()}], map()}
          | {:error, String.t()}
  def read(line) when is_binary(line) do
    with true <- :binary.match(line, "\"request\"") != :nomatch,
         {:ok, %{"request" => %{} = request} = record} <- JSON.decode(line),
         true <- Map.has_key?(request, "messages") or Map.has_key?(request, "input"),
         false <- Map.has_key?(record, "meta") or Map.has_key?(record, "tool_call") do
      steps(record, request)
    else
      _ -> :not_request
    end
  end

  defp steps(record, request) do
    agent_id = Map.get(record, "agent_id", Record.default_agent_id())

    with {:ok, format} <- format(Map.get(record, "api", "chat_completions")),
         :ok <- conversation(format, request),
         :ok <- string(agent_id, "agent_id"),
         session_id = Map.get(record, "session_id") || session_id(agent_id, request),
         :ok <- string(session_id, "session_id"),
         {:ok, timestamp} <- timestamp(record["timestamp"]) do
      steps =
        for {key, envelope} <- Steps.envelopes(format, agent_id, session_id, request),
            do: {key, JSON.encode!(envelope)}

      exchange = %{
        api: Map.fetch!(@apis, format),
        agent_id: agent_id,
        session_id: session_id,
        timestamp: timestamp,
        request: request,
        response: map(record["response"]),
        usage: map(record["usage"]),
        response_text: if(is_binary(record["response_text"]), do: record["response_text"])
      }

      {:ok, session_id, steps, exchange}
    end
  end

  defp timestamp(nil), do: {:ok, nil}

  defp timestamp(text) when is_binary(text) do
    case DateTime.from_iso8601(text) do
      {:ok, at, _offset} -> {:ok, at}
      {:error, _} -> {:error, "timestamp must be an ISO 8601 time, got: #{inspect(text)}"}
    end
  end

  defp timestamp(other),
    do: {:error, "timestamp must be an ISO 8601 time, got: #{inspect(other)}"}

  defp map(%{} = value), do: value
  defp map(_), do: nil

  @doc "The session of a recorded request that names none (see the module doc)."
  @spec session_id(String.t(), map()) :: String.t()
  def session_id(agent_id, request), do: SessionId.derive(agent_id, request, @replay_key)

  defp format(api) do
    case Map.fetch(@formats, api) do
      {:ok, format} ->
        {:ok, format}

      :error ->
        {:error, "api must be chat_completions, messages or responses, got: #{inspect(api)}"}
    end
  end

  defp conversation(:responses, %{"input" => input}) when is_list(input) or is_binary(input),
    do: :ok

  defp conversation(:responses, _request),
    do: {:error, "request.input must be a list or a string"}

  defp conversation(_format, %{"messages" => list}) when is_list(list), do: :ok
  defp conversation(_format, _request), do: {:error, "request.messages must be a list"}

  defp string(value, _name) when is_binary(value) and value != "", do: :ok
  defp string(_value, name), do: {:error, "#{name} must be a non-empty string"}
end
