defmodule ObservatoryWeb.LiveRouterTest.FakeDSL do
  # Stands in for Phoenix.Router's scope/3 and Phoenix.LiveView.Router's
  # live_session/3 and live/4 (not available in this Hex-less build): it records what
  # the observatory_dashboard macro asks the router to mount.
  defmacro scope(path, opts, do: block) do
    quote do
      @fake_scopes [{unquote(path), unquote(opts)} | @fake_scopes]
      unquote(block)
      @fake_scopes tl(@fake_scopes)
    end
  end

  defmacro live_session(name, opts, do: block) do
    quote do
      @fake_session {unquote(name), unquote(opts)}
      unquote(block)
    end
  end

  defmacro live(path, module, action, opts) do
    quote do
      # Phoenix joins scope and route paths segment by segment.
      scoped = Enum.map_join(Enum.reverse(@fake_scopes), &elem(&1, 0)) <> unquote(path)
      scoped = String.replace(scoped, ~r{/+}, "/")

      @fake_routes {String.trim_trailing(scoped, "/"), unquote(module), unquote(action),
                    unquote(opts), @fake_session}
    end
  end
end

defmodule ObservatoryWeb.LiveRouterTest.OperatorAuth do
  def observatory_session(conn, suffix), do: %{"operator" => conn.user <> suffix}
end

defmodule ObservatoryWeb.LiveRouterTest.Router do
  import ObservatoryWeb.LiveRouterTest.FakeDSL
  import ObservatoryWeb.LiveRouter

  Module.register_attribute(__MODULE__, :fake_routes, accumulate: true)
  @fake_scopes []
  @fake_session nil

  observatory_dashboard("/observatory",
    session: {ObservatoryWeb.LiveRouterTest.OperatorAuth, :observatory_session, ["@ops"]},
    on_mount: SomeHost.Hook
  )

  observatory_dashboard("/", live_session_name: :observatory_root)

  def routes, do: Enum.reverse(@fake_routes)
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

  describe "observatory_dashboard/2 refuses bad options" do
    test "a :session that is not {module, function, args}" do
      assert_raise ArgumentError, ~r/:session must be/, fn ->
        LiveRouter.__live_session__("/o", session: &OperatorAuth.observatory_session/2)
      end
    end

    test "a session callback that does not return a map" do
      assert_raise ArgumentError, ~r/must return a map/, fn ->
        LiveRouter.__session__(%{}, "/o", {Map, :keys, []})
      end
    end
  end

  describe "links follow the mount point" do
    test "the pages' agent links and navigation are under the prefix, escaped" do
      session = LiveRouter.__session__(:conn, "/ops/observatory", nil)
      assert ObservatoryWeb.AgentDetail.agents_path(session) == "/ops/observatory/agents"

      assert ObservatoryWeb.AgentDetail.View.agent_path(session["agents_path"], "a b/c") ==
               "/ops/observatory/agents/a%20b%2Fc"

      nav = ObservatoryWeb.LiveParts.nav(~s(/x"y), :agents) |> IO.iodata_to_binary()
      assert nav =~ ~s(href="/x&quot;y")
      assert nav =~ ~s(href="/x&quot;y/agents" aria-current="page")
      assert ObservatoryWeb.LiveParts.nav(nil, :agents) == ""
    end
  end
end
