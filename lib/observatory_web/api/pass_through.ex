defmodule ObservatoryWeb.API.PassThrough do
  @moduledoc """
  The requests the SDKs make beside the model calls, passed to the upstream as they
  are (`ObservatoryWeb.API.LLMProxy.pass/4`): the agent authenticates as for a model
  call and must be active; nothing is fingerprinted or recorded as a step; the
  answer — status, body, headers — is the upstream's.

  | request | upstream |
  |---|---|
  | `GET /v1/models`, `GET /v1/models/:id` | the Anthropic upstream when the request carries `anthropic-version` (the Anthropic SDK always sends it; `<base>/v1/models`), else the OpenAI-compatible one (`<base>/models`) |
  | `POST /v1/messages/count_tokens` | the Anthropic upstream (`<base>/v1/messages/count_tokens`) |
  """

  alias ObservatoryWeb.API.{ChatCompletions, LLMProxy, Messages}
  alias ObservatoryWeb.Conn

  @doc "GET /v1/models, GET /v1/models/:id"
  def models(conn, id \\ nil) do
    path = if id, do: "/" <> URI.encode(id, &URI.char_unreserved?/1), else: ""

    if Conn.header(conn, "anthropic-version"),
      do: LLMProxy.pass(conn, Messages, :anthropic_models, method: "GET", path: path),
      else: LLMProxy.pass(conn, ChatCompletions, :models, method: "GET", path: path)
  end

  @doc "POST /v1/messages/count_tokens"
  def count_tokens(conn), do: LLMProxy.pass(conn, Messages, :count_tokens, method: "POST")
end
