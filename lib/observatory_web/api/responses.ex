defmodule ObservatoryWeb.API.Responses do
  @moduledoc """
  `POST /v1/responses`: the OpenAI Responses API — the OpenAI Agents SDK's default —
  through the kill switch, forwarded to `config :observatory, :llm_upstream`
  (`<base>/responses`) with the configured `:llm_upstream_api_key`.

  The same request path as Chat Completions (`ObservatoryWeb.API.LLMProxy`), with the
  same agent authentication and the same answers and errors, in OpenAI's shape
  `{"error": {"message", "type", "code", "param"}}`. What is read from the body
  (`Observatory.Proxy.Responses`): for the kill switch, the newest input from the
  user side (the `function_call_output` items of a turn that answers tool calls,
  else the last user text), the current turn's `function_call` items and the
  answer's `output_text`; for the steps, each `function_call` with the
  `function_call_output` that answers it, as a Chat Completions tool call would be.

  With `"stream": true` the upstream's events pass on as they arrive; the text of the
  `response.output_text.delta` events is fingerprinted once the stream ends. A stream
  that has to end early (a deactivation, a revoked key, a pause, the cap, a broken
  upstream) ends with the API's `error` event, which also carries an `error` object
  so that the SDK raises it rather than waiting for a `response.completed` that never
  comes.
  """

  @behaviour ObservatoryWeb.API.LLMProxy

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.Proxy.Responses
  alias ObservatoryWeb.API.{ChatCompletions, LLMProxy}

  @doc "POST /v1/responses"
  def create(conn), do: LLMProxy.handle(conn, __MODULE__)

  @impl LLMProxy
  def api, do: :responses

  @impl LLMProxy
  def format, do: :responses

  @impl LLMProxy
  defdelegate error_body(status, type, code, message), to: ChatCompletions

  @impl LLMProxy
  defdelegate inactive_body(agent_id), to: ChatCompletions

  @impl LLMProxy
  def fingerprint_request(body), do: KillSwitch.fingerprint_request(body, :responses)

  @impl LLMProxy
  def fingerprint_response(body), do: KillSwitch.fingerprint_response(body, :responses)

  @impl LLMProxy
  defdelegate stream_text(event), to: Responses

  @doc "The usage of a stream: in its last event, `response.completed` (or `.incomplete`, `.failed`)."
  @impl LLMProxy
  def stream_usage(%{data: %{"type" => type, "response" => %{"usage" => %{} = usage} = response}})
      when type in ["response.completed", "response.incomplete", "response.failed"],
      do: {if(is_binary(response["model"]), do: response["model"]), usage}

  def stream_usage(_event), do: nil

  @impl LLMProxy
  def stream_error(status, type, code, message) do
    %{error: error} = error_body(status, type, code, message)
    event = %{type: "error", code: code, message: message, param: nil, error: error}
    ["event: error\ndata: ", JSON.encode!(event), "\n\n"]
  end

  @impl LLMProxy
  defdelegate forward_headers(conn), to: ChatCompletions
end
