defmodule Observatory.Replay.ProxyRequest do
  @moduledoc """
  A recorded LLM request as a replay line: the steps an agent that only talks to the
  proxy takes, read the way the proxy reads them (`Observatory.Proxy.Steps`).

      {"api": "chat_completions", "agent_id": "agent-7", "session_id": "s-1",
       "request": {"model": "gpt-4o", "messages": [...]}}

  `request` is the body the agent sent: OpenAI Chat Completions (`"api":
  "chat_completions"`, the default) or Anthropic Messages (`"api": "messages"`).
  `agent_id` defaults to `"unknown-agent"`; `session_id` to an id derived from the
  agent and the conversation's start as the proxy derives it
  (`Observatory.Proxy.SessionId`), keyed with a fixed key rather than the gateway's
  secret, so that it is the same on every run of the replay. The tool calls of the request's
  previous assistant turn, with the results that answer them, are its steps. A
  conversation is re-sent on every turn: the replay ingests each step once, as the
  proxy does (the caller keeps the keys seen, `read/2`).
  """

  alias Observatory.JSON
  alias Observatory.Proxy.{SessionId, Steps}
  alias Observatory.Replay.Record

  @formats %{"chat_completions" => :openai, "messages" => :anthropic}
  # Not a secret: replayed sessions need stable ids, not unguessable ones.
  @replay_key "observatory replay session id"

  @doc """
  Reads a line: `:not_request` when it is no recorded request (an envelope or a flat
  step record), `{:ok, session_id, [{key, envelope_json}]}` with its steps, or
  `{:error, reason}`. Only an object with a `"request"` that has `"messages"`, and
  neither `"meta"` (an envelope) nor `"tool_call"` (a flat record), is a request.
  """
  @spec read(binary()) ::
          :not_request | {:ok, String.t(), [{String.t(), binary()}]} | {:error, String.t()}
  def read(line) when is_binary(line) do
    with true <- :binary.match(line, "\"request\"") != :nomatch,
         {:ok, %{"request" => %{"messages" => _} = request} = record} <- JSON.decode(line),
         false <- Map.has_key?(record, "meta") or Map.has_key?(record, "tool_call") do
      steps(record, request)
    else
      _ -> :not_request
    end
  end

  defp steps(record, request) do
    agent_id = Map.get(record, "agent_id", Record.default_agent_id())

    with {:ok, format} <- format(Map.get(record, "api", "chat_completions")),
         :ok <- messages(request),
         :ok <- string(agent_id, "agent_id"),
         session_id = Map.get(record, "session_id") || session_id(agent_id, request),
         :ok <- string(session_id, "session_id") do
      steps =
        for {key, envelope} <- Steps.envelopes(format, agent_id, session_id, request),
            do: {key, JSON.encode!(envelope)}

      {:ok, session_id, steps}
    end
  end

  @doc "The session of a recorded request that names none (see the module doc)."
  @spec session_id(String.t(), map()) :: String.t()
  def session_id(agent_id, request), do: SessionId.derive(agent_id, request, @replay_key)

  defp format(api) do
    case Map.fetch(@formats, api) do
      {:ok, format} -> {:ok, format}
      :error -> {:error, "api must be chat_completions or messages, got: #{inspect(api)}"}
    end
  end

  defp messages(%{"messages" => list}) when is_list(list), do: :ok
  defp messages(_request), do: {:error, "request.messages must be a list"}

  defp string(value, _name) when is_binary(value) and value != "", do: :ok
  defp string(_value, name), do: {:error, "#{name} must be a non-empty string"}
end
