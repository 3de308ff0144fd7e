if Code.ensure_loaded?(Plug.Conn) do
  defmodule ObservatoryWeb.AgentAPIPlug do
    @moduledoc """
    Observatory's agents' API, served by a Phoenix host's endpoint: one line in
    `lib/my_app_web/endpoint.ex`, above `plug Plug.Parsers`:

        plug ObservatoryWeb.AgentAPIPlug, at: "/observatory"

    Agents then post their steps to `/observatory/api/v1/decision_logs` (one envelope,
    or NDJSON), check tool calls at `/observatory/api/v1/tool_calls/check` and read
    their sessions; operators use the sessions, HITL, agents (keys, kill switch,
    guidance, budgets) and notification-sink routes
    (`/observatory/api/v1/sessions/:id/pause`, `/observatory/api/v1/agents/:id/keys` …)
    with their operator tokens. Every route, answer, cap and credential is that of
    Observatory's own server (`ObservatoryWeb.Router`), through the same handlers
    (`ObservatoryWeb.Mount`, `ObservatoryWeb.Conn.PlugAdapter`). Requests for other
    paths pass through to the rest of the endpoint.

    It sits in the endpoint, not the router, because it reads the request body itself:
    `Plug.Parsers` would have read and decoded it already (and capped it at its own
    limit). Options: `:at` (default `"/"`). Compiled only where Plug is loaded.
    """

    @behaviour Plug

    @impl true
    def init(opts), do: ObservatoryWeb.Mount.new(:agents_api, opts)

    @impl true
    def call(conn, mount), do: ObservatoryWeb.Conn.PlugAdapter.call(conn, mount)
  end
else
  defmodule ObservatoryWeb.AgentAPIPlug do
    @moduledoc false
    # Compiled without Plug: the host that plugs it in is told how to fix its build
    # (Plug.Builder calls init/1 when it compiles the endpoint).
    def init(_opts),
      do: raise(ArgumentError, ObservatoryWeb.Mount.left_out(inspect(__MODULE__), "Plug"))

    def call(_conn, _opts),
      do: raise(ArgumentError, ObservatoryWeb.Mount.left_out(inspect(__MODULE__), "Plug"))
  end
end
