defmodule ObservatoryWeb.API.Notifications do
  @moduledoc """
  The operator API for notification sinks (`Observatory.Notifications`). Operator
  token required on every route.

    * `GET /api/v1/notifications/sinks` — `{"sinks": [sink]}`, configured ones first,
      every secret redacted; `"unreadable": true` for a run-time sink whose secrets
      were sealed under another `:secret_key_base` (it sends nothing: `PUT` it again);
    * `PUT /api/v1/notifications/sinks/:name` — adds or replaces a run-time sink:
      `{"type": "webhook" | "slack" | "pagerduty", "url": …, "routing_key": …,
      "secret": …, "events": [...]}` (`Observatory.Notifications.Sink`); `422` with every
      violation (a URL to a private address among them), `409` for the name of a
      configured sink; the answer is the sink, redacted;
    * `DELETE /api/v1/notifications/sinks/:name` — removes a run-time sink; `404`, `409`;
    * `POST /api/v1/notifications/sinks/:name/test` — sends a test alert now: `200
      {"delivered": true}`, or `502` with why; `404`.
  """

  alias Observatory.{JSON, Notifications}
  alias ObservatoryWeb.{Auth, Conn}

  def index(conn) do
    with {:ok, _} <- authorize(conn), do: Conn.json(conn, 200, %{sinks: Notifications.sinks()})
  end

  def put(conn, name) do
    with {:ok, operator} <- authorize(conn),
         {:ok, spec} <- json_object(conn) do
      case Notifications.put_sink(name, spec, operator: operator) do
        {:ok, sink} ->
          Conn.json(conn, 200, sink)

        {:error, {:invalid, violations}} ->
          Conn.error(
            conn,
            422,
            "invalid_sink",
            Enum.map_join(violations, "; ", &"#{&1.path} #{&1.reason}"),
            %{violations: violations}
          )

        {:error, :configured} ->
          configured(conn)
      end
    end
  end

  def delete(conn, name) do
    with {:ok, operator} <- authorize(conn) do
      case Notifications.delete_sink(name, operator: operator) do
        :ok -> Conn.json(conn, 200, %{name: name, deleted: true})
        {:error, :not_found} -> Conn.error(conn, 404, "not_found", "no such sink")
        {:error, :configured} -> configured(conn)
      end
    end
  end

  def test(conn, name) do
    with {:ok, _} <- authorize(conn) do
      case Notifications.test_sink(name) do
        :ok -> Conn.json(conn, 200, %{name: name, delivered: true})
        {:error, :not_found} -> Conn.error(conn, 404, "not_found", "no such sink")
        {:error, why} -> Conn.error(conn, 502, "not_delivered", "the sink #{why}")
      end
    end
  end

  defp configured(conn),
    do:
      Conn.error(
        conn,
        409,
        "configured_sink",
        "the sink is set in config :observatory, :notifications; change it there"
      )

  defp json_object(conn) do
    with {:ok, body} <- read(conn),
         {:ok, map} when is_map(map) <- JSON.decode(body) do
      {:ok, map}
    else
      :halt -> :halt
      _ -> halt(Conn.error(conn, 400, "bad_request", "send a JSON object"))
    end
  end

  defp read(conn) do
    case Conn.read_body(conn) do
      {:ok, body} ->
        {:ok, body}

      {:error, :too_large} ->
        halt(Conn.error(conn, 413, "body_too_large", "the body is too large"))
    end
  end

  defp authorize(conn) do
    with {:error, :unauthorized} <- Auth.operator(conn) do
      halt(
        Conn.error(
          conn,
          401,
          "unauthorized",
          "send an operator token: Authorization: Bearer <token>"
        )
      )
    end
  end

  defp halt(:ok), do: :halt
end
