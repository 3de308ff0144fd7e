defmodule ObservatoryWeb.Dashboard.Assets do
  @moduledoc """
  The dashboard's static files, from `priv/static/`:

    * `manager.css` — the Session Cluster Manager's styles, all under `.scm`, so a
      Phoenix host can inline them (`css/0`) without restyling its own pages;
    * `dashboard.css` — the page chrome and the sign-in form;
    * `dashboard.js` — the page script (event stream, clicks, DOM patching).

  They are read at compile time (and recompiled when they change), so serving them
  touches no disk, and there is no build step: the script is plain JavaScript with
  no dependencies.
  """

  alias ObservatoryWeb.Conn

  @dir Path.expand("../../../priv/static", __DIR__)
  @files %{
    "dashboard.js" => "text/javascript; charset=utf-8",
    "dashboard.css" => "text/css; charset=utf-8",
    "manager.css" => "text/css; charset=utf-8"
  }

  for {name, _type} <- @files, do: @external_resource(Path.join(@dir, name))
  @contents Map.new(@files, fn {name, _} -> {name, File.read!(Path.join(@dir, name))} end)

  @doc "The manager's CSS (scoped under `.scm`), for hosts that inline it."
  @spec css() :: String.t()
  def css, do: Map.fetch!(@contents, "manager.css")

  @doc "GET /assets/:name"
  @spec serve(Conn.t(), String.t()) :: :ok
  def serve(conn, name) do
    case Map.fetch(@contents, name) do
      {:ok, body} ->
        Conn.send_resp(conn, 200, Map.fetch!(@files, name), body, [
          {"Cache-Control", "no-cache"}
        ])

      :error ->
        Conn.error(conn, 404, "not_found", "no such asset")
    end
  end
end
