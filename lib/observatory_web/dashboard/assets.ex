defmodule ObservatoryWeb.Dashboard.Assets do
  @moduledoc """
  The dashboard's static files, from `priv/static/`:

    * `manager.css` — the styles of the Session Cluster Manager and the agent pages,
      all under `.scm` (and the LiveView pages' `.observatory-dashboard`,
      `.scm-nav`), colours as `--obs-*` custom properties a host can override;
    * `dashboard.css` — the built-in server's page chrome and the sign-in form;
    * `dashboard.js` — the built-in server's page script (event stream, clicks, DOM
      patching).

  They are read at compile time (and recompiled when they change), so serving them
  touches no disk, and there is no build step: the script is plain JavaScript with
  no dependencies. Pages link them by a name that carries a digest of the content
  (`path/1`: `manager-3f9a0c1d2b.css`), served with a year's `immutable` caching;
  the plain name is served too, revalidated each time. No page carries an inline
  style or script, so every page works under `style-src 'self'; script-src 'self'`.
  In a Phoenix host the LiveView pages link `manager.css` under the path they are
  mounted at (`ObservatoryWeb.LiveRouter`, served by `ObservatoryWeb.AssetsPlug`).
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

  @digests Map.new(@contents, fn {name, body} ->
             {name,
              :crypto.hash(:sha256, body) |> Base.encode16(case: :lower) |> binary_part(0, 10)}
           end)

  # "manager-3f9a0c1d2b.css" => "manager.css", for every file.
  @digested Map.new(@digests, fn {name, digest} ->
              {Path.rootname(name) <> "-" <> digest <> Path.extname(name), name}
            end)

  @immutable "public, max-age=31536000, immutable"

  @doc "The manager's CSS (scoped under `.scm`)."
  @spec css() :: String.t()
  def css, do: Map.fetch!(@contents, "manager.css")

  @doc """
  The name a page links `name` by: with a digest of its content, so it can be cached
  for good (`"manager.css"` → `"manager-3f9a0c1d2b.css"`).
  """
  @spec path(String.t()) :: String.t()
  def path(name) do
    digest = Map.fetch!(@digests, name)
    Path.rootname(name) <> "-" <> digest <> Path.extname(name)
  end

  @doc """
  The file a requested name serves: `{:ok, body, content_type, cache_control}` for a
  digested name (cached for a year, immutable) or a plain one (revalidated), `:error`
  for anything else. Options: `:only`, the files that may be served.
  """
  @spec lookup(String.t(), keyword()) :: {:ok, binary(), String.t(), String.t()} | :error
  def lookup(requested, opts \\ []) do
    {name, cache} =
      case Map.fetch(@digested, requested) do
        {:ok, name} -> {name, @immutable}
        :error -> {requested, "no-cache"}
      end

    only = Keyword.get(opts, :only, Map.keys(@files))

    case {name in only, Map.fetch(@contents, name)} do
      {true, {:ok, body}} -> {:ok, body, Map.fetch!(@files, name), cache}
      _ -> :error
    end
  end

  @doc "GET /assets/:name"
  @spec serve(Conn.t(), String.t()) :: :ok
  def serve(conn, requested) do
    case lookup(requested) do
      {:ok, body, type, cache} ->
        Conn.send_resp(conn, 200, type, body, [{"Cache-Control", cache}])

      :error ->
        Conn.error(conn, 404, "not_found", "no such asset")
    end
  end
end
