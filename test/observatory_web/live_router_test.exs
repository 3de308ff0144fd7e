defmodule ObservatoryWeb.LiveRouterTest.FakeDSL do
  # Stands in for Phoenix.Router's scope/2,3 and get/4 and Phoenix.LiveView.Router's
  # live_session/3 and live/4 (not available in this Hex-less build): it records what
  # the observatory_dashboard macro asks the router to mount. The router's reflection
  # (where a line sits: scoped_path/2, scoped_alias/2) is FakeReflection's.
  defmacro scope(path, alias_or_opts, do: block) do
    quote do
      @fake_scopes [
        ObservatoryWeb.LiveRouterTest.FakeDSL.__scope__(unquote(path), unquote(alias_or_opts))
        | @fake_scopes
      ]
      unquote(block)
      @fake_scopes tl(@fake_scopes)
    end
  end

  def __scope__(path, opts) when is_list(opts) do
    # Phoenix: `alias: false` starts the alias afresh inside the scope.
    {path, if(opts[:alias] == false, do: :reset, else: nil)}
  end

  def __scope__(path, alias) when is_atom(alias), do: {path, alias}

  defmacro live_session(name, opts, do: block) do
    quote do
      @fake_session {unquote(name), unquote(opts)}
      unquote(block)
    end
  end

  defmacro live(path, module, action, opts) do
    quote do
      @fake_routes {ObservatoryWeb.LiveRouterTest.FakeReflection.route_path(
                      __MODULE__,
                      unquote(path)
                    ), unquote(module), unquote(action), unquote(opts), @fake_session}
    end
  end

  defmacro get(path, plug, action, opts) do
    quote do
      @fake_gets {ObservatoryWeb.LiveRouterTest.FakeReflection.route_path(
                    __MODULE__,
                    unquote(path)
                  ), unquote(plug), unquote(action), unquote(opts)}
    end
  end
end

defmodule ObservatoryWeb.LiveRouterTest.FakeReflection do
  # Phoenix.Router.scoped_path/2 and scoped_alias/2 over the fake scopes.
  def scoped_path(router, path) do
    scopes = Enum.reverse(Module.get_attribute(router, :fake_scopes))
    # Phoenix joins scope and route paths segment by segment.
    String.replace(Enum.map_join(scopes, &elem(&1, 0)) <> path, ~r{/+}, "/")
  end

  # A route's path as the tests compare them: no trailing slash ("" at the root).
  def route_path(router, path), do: router |> scoped_path(path) |> String.trim_trailing("/")

  def scoped_alias(router, alias) do
    aliases =
      router
      |> Module.get_attribute(:fake_scopes)
      |> Enum.reverse()
      |> Enum.reduce([], fn
        {_path, :reset}, _acc -> []
        {_path, nil}, acc -> acc
        {_path, alias}, acc -> acc ++ [alias]
      end)

    Module.concat(aliases ++ [alias])
  end
end

defmodule ObservatoryWeb.LiveRouterTest.Routers do
  # Routers record what they mount; `routes/0`, `gets/0`.
  defmacro __using__(_) do
    quote do
      import ObservatoryWeb.LiveRouterTest.FakeDSL
      import ObservatoryWeb.LiveRouter

      Module.register_attribute(__MODULE__, :fake_routes, accumulate: true)
      Module.register_attribute(__MODULE__, :fake_gets, accumulate: true)
      @observatory_router_reflection ObservatoryWeb.LiveRouterTest.FakeReflection
      @fake_scopes []
      @fake_session nil
      @before_compile ObservatoryWeb.LiveRouterTest.Routers
    end
  end

  defmacro __before_compile__(_env) do
    quote do
      def routes, do: Enum.reverse(@fake_routes)
      def gets, do: Enum.reverse(@fake_gets)
    end
  end
end

defmodule ObservatoryWeb.LiveRouterTest.OperatorAuth do
  def observatory_session(conn, suffix), do: %{"operator" => conn.user <> suffix}
end

defmodule ObservatoryWeb.LiveRouterTest.Router do
  use ObservatoryWeb.LiveRouterTest.Routers

  observatory_dashboard("/observatory",
    session: {ObservatoryWeb.LiveRouterTest.OperatorAuth, :observatory_session, ["@ops"]},
    on_mount: SomeHost.Hook,
    layout: {SomeHost.Layouts, :app}
  )

  observatory_dashboard("/", live_session_name: :observatory_root)
end

defmodule ObservatoryWeb.LiveRouterTest.ScopedRouter do
  # phx.new's router: `scope "/", MyAppWeb do`, the session module named as `live`
  # names its LiveView (OperatorAuth), and in full.
  use ObservatoryWeb.LiveRouterTest.Routers

  scope "/ops", ObservatoryWeb.LiveRouterTest do
    observatory_dashboard("/observatory", session: {OperatorAuth, :observatory_session, ["@s"]})
  end

  scope "/full", ObservatoryWeb.LiveRouterTest do
    observatory_dashboard("/observatory",
      session: {ObservatoryWeb.LiveRouterTest.OperatorAuth, :observatory_session, ["@f"]},
      live_session_name: :observatory_full
    )
  end

  scope "/missing", ObservatoryWeb.LiveRouterTest do
    observatory_dashboard("/observatory",
      session: {NoSuchAuth, :observatory_session, []},
      live_session_name: :observatory_missing
    )
  end
end

defmodule ObservatoryWeb.LiveRouterTest do
  use ExUnit.Case, async: true

  alias ObservatoryWeb.LiveRouter
  alias ObservatoryWeb.LiveRouterTest.{OperatorAuth, Router}

  describe "observatory_dashboard/2 mounts the three pages with one line" do
    test "the manager, the agents list and Agent Detail under the given path" do
      routes =
        for {path, module, action, opts, _} <- Router.routes(), do: {path, module, action, opts}

      assert Enum.take(routes, 3) == [
               {"/observatory", ObservatoryWeb.SessionClusterManagerLive, :index,
                [as: :observatory_manager]},
               {"/observatory/agents", ObservatoryWeb.AgentListLive, :index,
                [as: :observatory_agents]},
               {"/observatory/agents/:agent_id", ObservatoryWeb.AgentDetailLive, :show,
                [as: :observatory_agent]}
             ]
    end

    test "in one live_session whose session callback gives the operator and the paths" do
      [{_, _, _, _, {name, opts}} | _] = Router.routes()
      assert name == :observatory
      assert opts[:on_mount] == SomeHost.Hook
      assert {LiveRouter, :__session__, args} = opts[:session]

      session = apply(LiveRouter, :__session__, [%{user: "alice"} | args])

      assert session == %{
               "operator" => "alice@ops",
               "observatory_path" => "/observatory",
               "agents_path" => "/observatory/agents"
             }
    end

    test "mounted at the root, links still point under it" do
      routes = Router.routes() |> Enum.drop(3)
      assert Enum.map(routes, &elem(&1, 0)) == ["", "/agents", "/agents/:agent_id"]
      {_, _, _, _, {name, opts}} = hd(routes)
      assert name == :observatory_root
      {LiveRouter, :__session__, args} = opts[:session]

      assert apply(LiveRouter, :__session__, [:conn | args]) == %{
               "observatory_path" => "",
               "agents_path" => "/agents"
             }

      assert ObservatoryWeb.LiveParts.nav("", :cluster) |> IO.iodata_to_binary() =~ ~s(href="/")
    end
  end

  describe "observatory_dashboard/2 in an aliased scope, as phx.new writes routers" do
    alias ObservatoryWeb.LiveRouterTest.ScopedRouter

    defp session_of(router, prefix) do
      {_, _, _, _, {_name, opts}} = Enum.find(router.routes(), &(elem(&1, 0) == prefix))
      {LiveRouter, :__session__, args} = opts[:session]
      apply(LiveRouter, :__session__, [%{user: "bob"} | args])
    end

    test "the :session module takes the scope's alias, as a live route's LiveView does" do
      assert session_of(ScopedRouter, "/ops/observatory")["operator"] == "bob@s"

      assert session_of(ScopedRouter, "/ops/observatory")["observatory_path"] ==
               "/ops/observatory"
    end

    test "a :session module named in full inside the aliased scope works too" do
      assert session_of(ScopedRouter, "/full/observatory")["operator"] == "bob@f"
    end

    test "a :session module that exists under neither name is a clear error, not UndefinedFunctionError" do
      error =
        assert_raise ArgumentError, fn -> session_of(ScopedRouter, "/missing/observatory") end

      assert error.message =~ "ObservatoryWeb.LiveRouterTest.NoSuchAuth or NoSuchAuth"
      assert error.message =~ "defines observatory_session/1"
    end
  end

  describe "observatory_dashboard/2 serves the pages' stylesheet as a file (no inline style)" do
    test "a GET route for the assets under the mount path, and the pages link it" do
      assert [{"/observatory/assets/:name", ObservatoryWeb.AssetsPlug, :stylesheet, opts} | _] =
               Router.gets()

      assert opts == [as: :observatory_asset]

      assert [{"/ops/observatory/assets/:name", _, _, _} | _] =
               ObservatoryWeb.LiveRouterTest.ScopedRouter.gets()

      link = "/ops/observatory" |> ObservatoryWeb.LiveParts.stylesheet() |> IO.iodata_to_binary()
      digested = ObservatoryWeb.Dashboard.Assets.path("manager.css")
      assert link == ~s(<link rel="stylesheet" href="/ops/observatory/assets/#{digested}">)
      assert digested =~ ~r/^manager-[0-9a-f]{10}\.css$/
    end

    test ":layout and :root_layout go to the live_session" do
      [{_, _, _, _, {_name, opts}} | _] = Router.routes()
      assert opts[:layout] == {SomeHost.Layouts, :app}
    end
  end

  describe "observatory_dashboard/2 refuses bad options" do
    test "a :session that is not {module, function, args}" do
      assert_raise ArgumentError, ~r/:session must be/, fn ->
        LiveRouter.__live_session__("/o", session: &OperatorAuth.observatory_session/2)
      end
    end

    # Before: a misspelt option was dropped without a word, and the pages ran with no
    # operator session (every action recorded as "dashboard").
    test "an unknown option (a typo of :session) is an error naming the options" do
      assert_raise ArgumentError,
                   ~r/unknown option :sesion \(use :session, :on_mount, :layout, :root_layout, :live_session_name\)/,
                   fn ->
                     LiveRouter.__live_session__("/o",
                       sesion: {OperatorAuth, :observatory_session, []}
                     )
                   end

      assert_raise ArgumentError, ~r/options must be a keyword list, got: "\/ops"/, fn ->
        LiveRouter.__live_session__("/o", "/ops")
      end
    end

    # Before: a host that added LiveView after Observatory was compiled got a router
    # that compiled and an UndefinedFunctionError (…Live.__live__/0) at the first request.
    test "LiveView there but the pages left out of Observatory's build: say how to recompile" do
      assert_raise ArgumentError,
                   ~r/SessionClusterManagerLive \(and the other pages\) is not in this build of Observatory: it was compiled before Phoenix LiveView was available to it. Recompile it once: mix deps.compile observatory --force/,
                   fn -> LiveRouter.__pages_compiled__!(true, false) end

      assert LiveRouter.__pages_compiled__!(true, true) == :ok
      assert LiveRouter.__pages_compiled__!(false, false) == :ok
    end

    test "a session callback that does not return a map" do
      assert_raise ArgumentError, ~r/must return a map/, fn ->
        LiveRouter.__session__(%{}, "/o", {Map, :keys, []})
      end
    end
  end

  describe "links follow the mount point, and navigate live" do
    test "the pages' agent links and navigation are under the prefix, escaped" do
      session = LiveRouter.__session__(:conn, "/ops/observatory", nil)
      assert ObservatoryWeb.AgentDetail.agents_path(session) == "/ops/observatory/agents"

      assert ObservatoryWeb.AgentDetail.View.agent_path(session["agents_path"], "a b/c") ==
               "/ops/observatory/agents/a%20b%2Fc"

      nav = ObservatoryWeb.LiveParts.nav(~s(/x"y), :agents) |> IO.iodata_to_binary()
      assert nav =~ ~s(href="/x&quot;y")

      assert nav =~
               ~s(href="/x&quot;y/agents" data-phx-link="redirect" data-phx-link-state="push" aria-current="page")

      assert ObservatoryWeb.LiveParts.nav(nil, :agents) == ""
    end
  end
end
