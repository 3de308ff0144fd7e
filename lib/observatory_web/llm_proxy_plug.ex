if Code.ensure_loaded?(Plug.Conn) do
  defmodule ObservatoryWeb.LLMProxyPlug do
    @moduledoc """
    Observatory's LLM proxy, served by a Phoenix host's endpoint: one line in
    `lib/my_app_web/endpoint.ex`, above `plug Plug.Parsers`:

        plug ObservatoryWeb.LLMProxyPlug, at: "/llm"

    Agents point their SDK at it — `OpenAI(base_url: "https://my-app.example/llm/v1")`,
    `Anthropic(base_url: "https://my-app.example/llm")` — with their agent key, and get
    Chat Completions, Responses, Messages, `count_tokens` and the models list, with
    the kill switch, pauses and step-detector blocks enforced: a deactivation or a
    pause ends the agent's open requests and streams. Every answer, cap and header is
    that of Observatory's own server (`ObservatoryWeb.API.LLMProxy`); streams are
    chunked answers. Requests for other paths pass through.

    It sits in the endpoint, not the router, because it reads the request body itself:
    `Plug.Parsers` would have read and decoded it already (and capped it below the
    proxy's 32 MiB). Options: `:at` (default `"/"`). Compiled only where Plug is
    loaded.
    """

    @behaviour Plug

    @impl true
    def init(opts), do: ObservatoryWeb.Mount.new(:llm_proxy, opts)

    @impl true
    def call(conn, mount), do: ObservatoryWeb.Conn.PlugAdapter.call(conn, mount)
  end
else
  defmodule ObservatoryWeb.LLMProxyPlug do
    @moduledoc false
    # Compiled without Plug: the host that plugs it in is told how to fix its build
    # (Plug.Builder calls init/1 when it compiles the endpoint).
    def init(_opts),
      do: raise(ArgumentError, ObservatoryWeb.Mount.left_out(inspect(__MODULE__), "Plug"))

    def call(_conn, _opts),
      do: raise(ArgumentError, ObservatoryWeb.Mount.left_out(inspect(__MODULE__), "Plug"))
  end
end
