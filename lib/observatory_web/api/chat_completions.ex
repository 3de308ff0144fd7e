defmodule ObservatoryWeb.API.ChatCompletions do
  @moduledoc """
  `POST /v1/chat/completions`: an OpenAI-compatible proxy that enforces the kill
  switch (`Observatory.KillSwitch`) and forwards to `config :observatory,
  :llm_upstream`.

  The agent authenticates with its own agent key (`Authorization: Bearer <key>` or
  `X-Agent-Key` or `X-Api-Key`), which names it: `X-Agent-Id` is optional and, if sent, must be the
  key's agent (`403 agent_id_mismatch` otherwise). Agents are registered by operators
  (issuing a key), never by a request. Point an OpenAI SDK at
  `http://<observatory>/v1` with the agent key as its API key.

  Answers, all errors in OpenAI's shape `{"error": {"message", "type", "code"}}`:

  | status | when |
  |---|---|
  | upstream's | the upstream answered (its status and JSON body, unchanged; with `"stream": true`, its server-sent events as they arrive) |
  | 400 `invalid_request_error` | body not a JSON object; with an insecure shared key, no or bad `X-Agent-Id` |
  | 401 `invalid_request_error` | no valid agent key |
  | 403 `agent_inactive` | the agent is inactive — deactivated by an operator or by the kill switch, the same answer for both; also the request that tripped the switch |
  | 403 `agent_id_mismatch` | `X-Agent-Id` names another agent than the key's |
  | 403 `unknown_agent` | the agent is not registered (deleted) |
  | 413, 415 | body over `:llm_max_request_bytes` (32 MiB); not `application/json` |
  | 403 `session_paused` | an operator paused the session (see `Observatory.Proxy.Steps`) |
  | 403 `session_blocked` | the step detector blocked the session (the message carries its guidance) |
  | 403 `forbidden` | `X-Session-Id` names a session the gateway has recorded for another agent |
  | 502 `upstream_error` | upstream down, timing out, answering more than `:llm_max_response_bytes`, or something that is not JSON (or, on success, not a chat completion) |
  | 503 `upstream_busy` | `:llm_max_concurrent` upstream requests are in flight (with `Retry-After: 1`) |

  The request path is `ObservatoryWeb.API.LLMProxy`'s; this module is its Chat
  Completions dialect; the agent authentication is `ObservatoryWeb.Auth.proxy_agent/1`,
  the same for every proxied API.

  Every answer names its session in `X-Observatory-Session-Id` and carries the
  upstream's own headers (`retry-after`, `x-request-id`, `x-ratelimit-*` …); when the
  kill switch is on, it carries `X-Observatory-Kill-Switch-Score`.
  """

  @behaviour ObservatoryWeb.API.LLMProxy

  alias Observatory.KillSwitch
  alias ObservatoryWeb.API.LLMProxy

  @doc "POST /v1/chat/completions"
  def create(conn), do: LLMProxy.handle(conn, __MODULE__)

  @doc """
  The standard inactive-agent answer: the same whatever deactivated the agent
  (seed 003, "Use standard inactive response"), and not a 429.
  """
  @impl LLMProxy
  @spec inactive_body(String.t()) :: map()
  def inactive_body(agent_id) do
    %{
      error: %{
        message: "Agent #{agent_id} is inactive",
        type: "agent_inactive",
        code: "agent_inactive",
        param: nil
      }
    }
  end

  ## The dialect (see ObservatoryWeb.API.LLMProxy)

  @impl LLMProxy
  def api, do: :chat_completions

  @impl LLMProxy
  def format, do: :openai

  @impl LLMProxy
  def error_body(_status, type, code, message),
    do: %{error: %{message: message, type: type, code: code, param: nil}}

  @impl LLMProxy
  defdelegate fingerprint_request(body), to: KillSwitch

  @impl LLMProxy
  defdelegate fingerprint_response(body), to: KillSwitch

  @impl LLMProxy
  def stream_text(%{data: %{"choices" => [%{"delta" => %{"content" => text}} | _]}})
      when is_binary(text),
      do: text

  def stream_text(_event), do: nil

  @doc "The usage chunk (`stream_options.include_usage`): the last one, with `usage` set."
  @impl LLMProxy
  def stream_usage(%{data: %{"usage" => %{} = usage} = chunk}),
    do: {string(chunk["model"]), usage}

  def stream_usage(_event), do: nil

  defp string(value) when is_binary(value), do: value
  defp string(_), do: nil

  @doc "OpenAI's error in a stream: `data: {\"error\": …}`, which the SDK raises."
  @impl LLMProxy
  def stream_error(status, type, code, message),
    do: ["data: ", Observatory.JSON.encode!(error_body(status, type, code, message)), "\n\n"]

  @impl LLMProxy
  def forward_headers(_conn), do: [{"accept", "application/json, text/event-stream"}]
end
