if Code.ensure_loaded?(Plug.Conn) do
  defmodule ObservatoryWeb.AssetsPlug do
    @moduledoc """
    Serves the LiveView pages' stylesheet in a Phoenix host, at
    `<mount path>/assets/manager-<digest>.css`: `ObservatoryWeb.LiveRouter`'s
    `observatory_dashboard` adds the route, and the pages link the file instead of
    inlining it, so they render under a Content-Security-Policy with
    `style-src 'self'` and the browser caches it (`immutable`, a year: its name
    changes with its content). Compiled only where Plug is loaded.
    """

    @behaviour Plug

    alias ObservatoryWeb.Dashboard.Assets

    @impl true
    def init(opts), do: opts

    @impl true
    def call(%Plug.Conn{path_params: %{"name" => name}} = conn, _opts) do
      case Assets.lookup(name, only: ["manager.css"]) do
        {:ok, body, type, cache} ->
          conn
          |> Plug.Conn.put_resp_header("content-type", type)
          |> Plug.Conn.put_resp_header("cache-control", cache)
          |> Plug.Conn.put_resp_header("x-content-type-options", "nosniff")
          |> Plug.Conn.send_resp(200, body)
          |> Plug.Conn.halt()

        :error ->
          conn |> Plug.Conn.send_resp(404, "no such asset") |> Plug.Conn.halt()
      end
    end
  end
end
