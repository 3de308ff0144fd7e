defmodule ObservatoryWeb.API.Messages do
  @moduledoc """
  `POST /v1/messages`: the Anthropic Messages API through the kill switch, forwarded
  to `config :observatory, :anthropic_upstream` with the configured
  `:anthropic_upstream_api_key` as `x-api-key`; the agent's `anthropic-version` and
  `anthropic-beta` headers are passed on (`anthropic-version` defaults to
  `2023-06-01`).

  The same request path as Chat Completions (`ObservatoryWeb.API.LLMProxy`), with
  the same agent authentication (`ObservatoryWeb.Auth.proxy_agent/1`): the agent's
  own key as `X-Api-Key` (the Anthropic SDK's `api_key`), `Authorization: Bearer`
  (its `auth_token`) or `X-Agent-Key`; `X-Agent-Id` is optional and must name the
  key's agent. The agent's key is never sent upstream. What the kill switch reads: the
  newest user message's `tool_result` blocks (else its text), the `tool_use` blocks
  they answer, and the answer's text blocks
  (`Observatory.KillSwitch.fingerprint_request/3`). `"stream": true` streams the
  upstream's events as they arrive.

  Errors are in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`,
  with the type Anthropic uses for the status: `invalid_request_error` (400, 415),
  `authentication_error` (401), `permission_error` (403: the agent is inactive, the
  session is paused, blocked or another agent's, the agent is unknown or not the key's),
  `request_too_large` (413), `api_error` (502), `overloaded_error` (503).
  """

  @behaviour ObservatoryWeb.API.LLMProxy

  alias Observatory.{JSON, KillSwitch}
  alias ObservatoryWeb.API.LLMProxy
  alias ObservatoryWeb.Conn

  @default_version "2023-06-01"

  @doc "POST /v1/messages"
  def create(conn), do: LLMProxy.handle(conn, __MODULE__)

  @impl LLMProxy
  def api, do: :messages

  @impl LLMProxy
  def format, do: :anthropic

  @impl LLMProxy
  def error_body(status, _type, _code, message),
    do: %{type: "error", error: %{type: error_type(status), message: message}}

  @doc "The inactive-agent answer, in Anthropic's shape (`403 permission_error`)."
  @impl LLMProxy
  def inactive_body(agent_id),
    do: error_body(403, "agent_inactive", "agent_inactive", "Agent #{agent_id} is inactive")

  @impl LLMProxy
  def fingerprint_request(body), do: KillSwitch.fingerprint_request(body, :messages)

  @impl LLMProxy
  def fingerprint_response(body), do: KillSwitch.fingerprint_response(body, :messages)

  @impl LLMProxy
  def stream_text(%{
        data: %{
          "type" => "content_block_delta",
          "delta" => %{"type" => "text_delta", "text" => t}
        }
      })
      when is_binary(t),
      do: t

  def stream_text(_event), do: nil

  @doc """
  The usage of a stream: `message_start` carries the input tokens (and the model),
  `message_delta` the output tokens so far.
  """
  @impl LLMProxy
  def stream_usage(%{
        data: %{"type" => "message_start", "message" => %{"usage" => %{} = usage} = message}
      }),
      do: {if(is_binary(message["model"]), do: message["model"]), usage}

  def stream_usage(%{data: %{"type" => "message_delta", "usage" => %{} = usage}}),
    do: {nil, usage}

  def stream_usage(_event), do: nil

  @doc "Anthropic's error event: `event: error`, the error body as its data."
  @impl LLMProxy
  def stream_error(status, type, code, message),
    do: ["event: error\ndata: ", JSON.encode!(error_body(status, type, code, message)), "\n\n"]

  @impl LLMProxy
  def forward_headers(conn) do
    version = Conn.header(conn, "anthropic-version") || @default_version
    beta = Conn.header(conn, "anthropic-beta")

    [{"accept", "application/json, text/event-stream"}, {"anthropic-version", version}] ++
      if(beta, do: [{"anthropic-beta", beta}], else: [])
  end

  defp error_type(400), do: "invalid_request_error"
  defp error_type(401), do: "authentication_error"
  defp error_type(403), do: "permission_error"
  defp error_type(404), do: "not_found_error"
  defp error_type(413), do: "request_too_large"
  defp error_type(415), do: "invalid_request_error"
  defp error_type(429), do: "rate_limit_error"
  defp error_type(503), do: "overloaded_error"
  defp error_type(_status), do: "api_error"
end
