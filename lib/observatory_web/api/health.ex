defmodule ObservatoryWeb.API.Health do
  @moduledoc """
  `GET /healthz` and `GET /metrics`: no credentials.

    * `/healthz` — `200 {"status": "ok", "checks": {...}, "sessions": n}`, or `503
      {"status": "degraded", "checks": {...}}` when a dependency is down
      (`Observatory.Health`) or a cluster node cannot reach a majority; in a cluster
      the body says how this node sees it: who it runs with, whom it cannot reach,
      and (without a majority) what it refuses;
    * `/metrics` — Prometheus text (`Observatory.Metrics`).
  """

  alias ObservatoryWeb.Conn

  @doc "GET /healthz"
  def show(conn) do
    cluster = Observatory.Health.cluster()

    case Observatory.Health.check() do
      {:ok, checks} ->
        sessions = Observatory.Gateway.EntropyTracker.session_count()

        Conn.json(
          conn,
          200,
          Map.merge(%{status: "ok", checks: checks, sessions: sessions}, cluster)
        )

      {:error, checks} ->
        Conn.json(conn, 503, Map.merge(%{status: "degraded", checks: checks}, cluster))
    end
  end

  @doc "GET /metrics"
  def metrics(conn),
    do: Conn.text(conn, 200, Observatory.Metrics.render(), "text/plain; version=0.0.4")
end
