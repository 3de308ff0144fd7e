defmodule ObservatoryWeb.LiveParts do
  @moduledoc """
  How the dashboard's LiveViews send only what changed.

  Each page's view cuts the page into parts that change independently
  (`ObservatoryWeb.SessionClusterManager.View.parts/1`,
  `ObservatoryWeb.AgentDetail.View.parts/1`, `ObservatoryWeb.AgentList.parts/1`):
  a keyword list of `{assign_name, iodata}` whose concatenation is the page. The
  LiveView modules put every part in its own assign after each callback (`assign/2`)
  and their `~H` template is those assigns in order, with the stylesheet in one more
  assign set at mount.

  `Phoenix.Component.assign/3` marks an assign changed only when its value differs,
  and LiveView's change tracking sends a template's expression only when an assign it
  reads changed: an update resends the parts that changed and nothing else, the
  stylesheet goes once per page join, and a refresh that changes nothing sends
  nothing. `changed_bytes/2` is what an update costs, by the same rule; the tests and
  `bench/live_updates.exs` measure with it.
  """

  alias ObservatoryWeb.SessionClusterManager.Socket

  @type parts :: [{atom(), iodata()}]

  @doc "Puts each part, as a binary, in the socket's assigns under its name."
  @spec assign(socket, parts()) :: socket when socket: var
  def assign(socket, parts) do
    Enum.reduce(parts, socket, fn {name, html}, socket ->
      Socket.assign(socket, name, IO.iodata_to_binary(html))
    end)
  end

  @doc "The parts as binaries, by name."
  @spec snapshot(parts()) :: %{atom() => binary()}
  def snapshot(parts),
    do: Map.new(parts, fn {name, html} -> {name, IO.iodata_to_binary(html)} end)

  @doc """
  The bytes of the parts that differ between two snapshots: what an update resends
  (LiveView adds a few bytes of framing per part).
  """
  @spec changed_bytes(%{atom() => binary()}, %{atom() => binary()}) :: non_neg_integer()
  def changed_bytes(old, new) do
    Enum.reduce(new, 0, fn {name, html}, sum ->
      if Map.get(old, name) == html, do: sum, else: sum + byte_size(html)
    end)
  end

  @doc """
  What every LiveView page puts above its parts, set once at mount: the link to the
  stylesheet and the navigation, for pages mounted at `prefix`
  (`ObservatoryWeb.LiveRouter`); `current` is `:cluster` or `:agents`.
  """
  @spec frame(String.t() | nil, :cluster | :agents) :: [{atom(), String.t()}]
  def frame(prefix, current) do
    [
      observatory_css: IO.iodata_to_binary(stylesheet(prefix)),
      observatory_nav: IO.iodata_to_binary(nav(prefix, current))
    ]
  end

  @doc """
  The stylesheet's `<link>` for pages mounted at `prefix`: the file the router macro
  serves under the mount path (`ObservatoryWeb.AssetsPlug`), cached for good; never
  an inline `<style>`, so a Content-Security-Policy with `style-src 'self'` holds.
  Empty when the pages were mounted by hand (no prefix in the session).
  """
  @spec stylesheet(String.t() | nil) :: iodata()
  def stylesheet(nil), do: ""

  def stylesheet(prefix) do
    href = prefix <> "/assets/" <> ObservatoryWeb.Dashboard.Assets.path("manager.css")
    [~s(<link rel="stylesheet" href="), ObservatoryWeb.HTML.escape(href), ~s(">)]
  end

  @doc "The names of the parts that differ between two snapshots."
  @spec changed(%{atom() => binary()}, %{atom() => binary()}) :: [atom()]
  def changed(old, new) do
    for {name, html} <- new, Map.get(old, name) != html, do: name
  end

  @doc """
  The navigation between the mounted pages (`ObservatoryWeb.LiveRouter`): links to
  the manager and to the agents list under `prefix`, and the alert source in force
  (as the standalone pages' header shows it); `current` is `:cluster` or `:agents`.
  Empty when the pages were mounted by hand (no prefix in the session).
  """
  @spec nav(String.t() | nil, :cluster | :agents) :: iodata()
  def nav(nil, _current), do: ""

  def nav(prefix, current) do
    source = Observatory.Gateway.AlertSource.current()

    links = [
      {:cluster, home(prefix), "Session Cluster Manager"},
      {:agents, prefix <> "/agents", "Agents"}
    ]

    [
      ~s(<nav class="scm-nav" aria-label="Observatory">),
      for {name, href, label} <- links do
        [
          ~s(<a href="),
          ObservatoryWeb.HTML.escape(href),
          ~s("),
          ObservatoryWeb.HTML.navigate(),
          if(name == current, do: ~s( aria-current="page"), else: ""),
          ">",
          label,
          "</a> "
        ]
      end,
      ~s(<span class="scm-source" data-source="),
      Atom.to_string(source),
      ~s(">Alerts from <strong>),
      Observatory.Gateway.AlertSource.describe(source),
      "</strong></span></nav>"
    ]
  end

  defp home(""), do: "/"
  defp home(prefix), do: prefix
end
