defmodule ObservatoryWeb.LiveRouter do
  @moduledoc """
  Mounts Observatory's pages in a Phoenix router with one line, the way
  `live_dashboard "/dashboard"` mounts Phoenix LiveDashboard:

      # lib/my_app_web/router.ex
      import ObservatoryWeb.LiveRouter

      scope "/ops" do
        pipe_through [:browser, :require_operator]

        observatory_dashboard "/observatory",
          session: {MyAppWeb.OperatorAuth, :observatory_session, []}
      end

  mounts, in one `live_session`:

  | path | LiveView | action |
  |---|---|---|
  | `/ops/observatory` | `ObservatoryWeb.SessionClusterManagerLive` | `:index` |
  | `/ops/observatory/agents` | `ObservatoryWeb.AgentListLive` | `:index` |
  | `/ops/observatory/agents/:agent_id` | `ObservatoryWeb.AgentDetailLive` | `:show` |

  and their stylesheet at `/ops/observatory/assets/manager-<digest>.css`
  (`ObservatoryWeb.AssetsPlug`: no inline style, cached for good). Links between the
  pages (fleet nodes to agents, the agents list to an agent, an agent back to the
  list, the navigation) point under the path they are mounted at, whatever scopes
  surround the line, and change page over the open socket (live navigation).

  ## Options

    * `:session` — `{module, function, args}`: `apply(module, function, [conn | args])`
      returns a map; its `"operator"` is the name the HITL audit log and the agents'
      events record for actions taken on these pages (default `"dashboard"`). Your own
      pipeline does the sign-in: Observatory trusts this name. The module is resolved
      as Phoenix resolves a `live` route's: within `scope "/", MyAppWeb`,
      `OperatorAuth` is `MyAppWeb.OperatorAuth` (a module named in full works too).
    * `:on_mount`, `:layout`, `:root_layout` — passed to `live_session` (your LiveView
      auth hooks, your layouts).
    * `:live_session_name` — default `:observatory`; set it to mount twice.

  The router needs `Phoenix.LiveView.Router`'s `live/4` and `live_session/3`, which
  this macro imports when LiveView is there.
  """

  @doc "Mounts the pages under `path`; see the module doc."
  defmacro observatory_dashboard(path, opts \\ []) do
    opts =
      if Macro.quoted_literal?(opts),
        do: Macro.prewalk(opts, &expand_alias(&1, __CALLER__)),
        else: opts

    __pages_compiled__!(
      Code.ensure_loaded?(Phoenix.LiveView),
      Code.ensure_loaded?(ObservatoryWeb.SessionClusterManagerLive)
    )

    imports =
      if Code.ensure_loaded?(Phoenix.LiveView.Router) do
        quote do: import(Phoenix.LiveView.Router, only: [live: 4, live_session: 3])
      end

    quote do
      prefix = ObservatoryWeb.LiveRouter.__prefix__(__MODULE__, unquote(path))
      opts = ObservatoryWeb.LiveRouter.__scoped__(__MODULE__, unquote(opts))

      scope unquote(path), alias: false, as: false do
        unquote(imports)

        {name, session_opts} = ObservatoryWeb.LiveRouter.__live_session__(prefix, opts)

        get("/assets/:name", ObservatoryWeb.AssetsPlug, :stylesheet, as: :observatory_asset)

        live_session name, session_opts do
          live("/", ObservatoryWeb.SessionClusterManagerLive, :index, as: :observatory_manager)
          live("/agents", ObservatoryWeb.AgentListLive, :index, as: :observatory_agents)
          live("/agents/:agent_id", ObservatoryWeb.AgentDetailLive, :show, as: :observatory_agent)
        end
      end
    end
  end

  @doc false
  # A router that has LiveView mounting pages this build of Observatory left out
  # (compiled before LiveView was there): a compile error that says how to fix it,
  # not an UndefinedFunctionError at the first request.
  @spec __pages_compiled__!(boolean(), boolean()) :: :ok
  def __pages_compiled__!(live_view_loaded?, pages_loaded?) do
    if live_view_loaded? and not pages_loaded? do
      raise ArgumentError,
            ObservatoryWeb.Mount.left_out(
              "ObservatoryWeb.SessionClusterManagerLive (and the other pages)",
              "Phoenix LiveView"
            )
    end

    :ok
  end

  # How the router answers where it is: Phoenix.Router's reflection, or (in
  # Observatory's own tests, which have no Phoenix) the module the test router names
  # in @observatory_router_reflection.
  defp reflection(router) do
    Module.get_attribute(router, :observatory_router_reflection) ||
      if Code.ensure_loaded?(Phoenix.Router), do: Phoenix.Router
  end

  defp expand_alias({:__aliases__, _, _} = alias, env),
    do: Macro.expand(alias, %{env | function: {:observatory_dashboard, 2}})

  defp expand_alias(other, _env), do: other

  @doc false
  # The full path of `path` in `router`, scopes included (Phoenix's scoped_path/2).
  @spec __prefix__(module(), String.t()) :: String.t()
  def __prefix__(router, path) do
    full =
      case reflection(router) do
        nil -> path
        reflection -> reflection.scoped_path(router, path)
      end

    String.trim_trailing(full, "/")
  end

  @doc false
  # The :session module with the scope's alias, as Phoenix's `live` takes its
  # LiveView's: `{OperatorAuth, …}` in `scope "/", MyAppWeb` is MyAppWeb.OperatorAuth.
  # The name as written is kept second, for a module named in full inside an aliased
  # scope; `__session__/3` calls the first that defines the function.
  @spec __scoped__(module(), keyword()) :: keyword()
  def __scoped__(router, opts) do
    check_options!(opts)

    case {Keyword.get(opts, :session), reflection(router)} do
      {{module, function, args}, reflection} when is_atom(module) and reflection != nil ->
        scoped = reflection.scoped_alias(router, module)
        candidates = Enum.uniq([scoped, module])
        Keyword.put(opts, :session, {candidates, function, args})

      _ ->
        opts
    end
  end

  @doc false
  # The live_session's name and options: the session MFA that gives every page its
  # operator and where the pages are.
  @spec __live_session__(String.t(), keyword()) :: {atom(), keyword()}
  def __live_session__(prefix, opts) do
    check_options!(opts)
    host_session = Keyword.get(opts, :session)

    unless host_session == nil or valid_session?(host_session) do
      raise ArgumentError,
            "observatory_dashboard :session must be {module, function, args}, got: #{inspect(host_session)}"
    end

    session_opts =
      [session: {__MODULE__, :__session__, [prefix, host_session]}] ++
        Keyword.take(opts, [:on_mount, :layout, :root_layout])

    {Keyword.get(opts, :live_session_name, :observatory), session_opts}
  end

  @doc false
  # Called by LiveView for each page: the host's session map, and where the pages are.
  @spec __session__(term(), String.t(), {module(), atom(), list()} | nil) :: map()
  def __session__(conn, prefix, host_session) do
    host =
      case host_session do
        nil ->
          %{}

        {modules, function, args} ->
          apply(resolve(modules, function, args), function, [conn | args])
      end

    unless is_map(host) do
      raise ArgumentError,
            "observatory_dashboard's :session function must return a map, got: #{inspect(host)}"
    end

    Map.merge(host, %{"observatory_path" => prefix, "agents_path" => prefix <> "/agents"})
  end

  @options [:session, :on_mount, :layout, :root_layout, :live_session_name]

  defp check_options!(opts) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError,
            "observatory_dashboard options must be a keyword list, got: #{inspect(opts)}"
    end

    for {key, _} <- opts, key not in @options do
      raise ArgumentError,
            "observatory_dashboard: unknown option #{inspect(key)} " <>
              "(use #{Enum.map_join(@options, ", ", &inspect/1)})"
    end
  end

  defp valid_session?({m, f, a}) when is_atom(f) and is_list(a),
    do: is_atom(m) or (is_list(m) and m != [] and Enum.all?(m, &is_atom/1))

  defp valid_session?(_other), do: false

  defp resolve(module, _function, _args) when is_atom(module), do: module

  defp resolve(modules, function, args) do
    arity = length(args) + 1

    Enum.find(modules, &(Code.ensure_loaded?(&1) and function_exported?(&1, function, arity))) ||
      raise ArgumentError,
            "observatory_dashboard :session: no #{Enum.map_join(modules, " or ", &inspect/1)} " <>
              "defines #{function}/#{arity}"
  end
end
