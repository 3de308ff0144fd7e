defmodule ObservatoryWeb.CSPTest do
  # Every page runs under a Content-Security-Policy with `style-src 'self'` and
  # `script-src 'self'`, in a host too: no page carries an inline <style>, an inline
  # <script>, a style="" or on…="" attribute. Checked on the built-in server's pages
  # over HTTP, and on what the LiveView pages render in a host (their frame and parts,
  # from the page cores), with an agent-supplied session id built to break out.
  use ExUnit.Case, async: false

  alias Observatory.Gateway.SchemaInterceptor
  alias Observatory.Test.DashboardClient, as: Client
  alias Observatory.Test.HTTP
  alias ObservatoryWeb.{AgentDetail, AgentList, LiveParts, SessionClusterManager}
  alias ObservatoryWeb.Dashboard.Assets
  alias ObservatoryWeb.SessionClusterManager.{Socket, View}

  @hostile ~s[x" style="color:red" onmouseover="alert(1)<style>*{}</style><script>alert(2)</script>]

  setup_all do
    n = System.unique_integer([:positive])
    agent = "agent-csp-#{n}"
    session = @hostile <> "-#{n}"
    HTTP.key_for(agent)

    for step <- 1..5 do
      envelope =
        HTTP.envelope(%{
          "meta" => %{"session_id" => session, "agent_id" => agent, "step_id" => "s#{step}"}
        })

      {:ok, _} = SchemaInterceptor.ingest(envelope)
    end

    %{agent: agent, session: session}
  end

  # What a CSP without 'unsafe-inline' refuses, in real markup (escaped agent text
  # cannot match: its quotes and angle brackets are entities).
  defp inline(html) do
    tags = Regex.scan(~r/<[a-zA-Z][^>]*>/, html) |> List.flatten()

    Enum.flat_map(tags, fn tag ->
      cond do
        tag =~ ~r/^<style\b/i -> [tag]
        tag =~ ~r/^<script\b/i and not (tag =~ ~r/\ssrc="/) -> [tag]
        tag =~ ~r/\s(style|on[a-z]+)\s*=\s*"/i -> [tag]
        tag =~ ~r/\s(href|src|action)\s*=\s*"\s*javascript:/i -> [tag]
        true -> []
      end
    end)
  end

  defp live_page(frame, parts) do
    IO.iodata_to_binary([
      ~s(<div class="observatory-dashboard">),
      Keyword.values(frame),
      Keyword.values(parts),
      "</div>"
    ])
  end

  describe "no inline style or script in any page" do
    test "the built-in server's pages: sign-in, manager, agents, Agent Detail", %{agent: agent} do
      assert inline(Client.request(:get, "/login").body) == []
      auth = Client.sign_in()

      for path <- ["/", "/agents", "/agents/#{agent}", "/agents/nobody-csp"] do
        page = Client.request(:get, path, cookie: auth.cookie)
        assert page.status in [200, 404], path
        assert inline(page.body) == [], path
        assert Client.header(page, "content-security-policy") =~ "style-src 'self'; "
        refute Client.header(page, "content-security-policy") =~ "unsafe-inline"
      end
    end

    test "the LiveView pages in a host: manager (alerts, Inspect open), agents list, Agent Detail",
         %{agent: agent, session: session} do
      frame = LiveParts.frame("/ops/observatory", :cluster)

      {:ok, manager} = SessionClusterManager.mount(%{}, %{"operator" => "alice"}, Socket.new())

      {:noreply, manager} =
        SessionClusterManager.handle_event("inspect", %{"session_id" => session}, manager)

      html = live_page(frame, View.parts(manager.assigns))
      assert html =~ "Inspect"
      assert html =~ "&lt;script&gt;"
      assert inline(html) == []

      {:ok, list} =
        AgentList.mount(%{}, %{"agents_path" => "/ops/observatory/agents"}, Socket.new())

      assert inline(live_page(frame, AgentList.parts(list.assigns))) == []

      {:ok, detail} = AgentDetail.mount(%{"agent_id" => agent}, %{}, Socket.new())
      html = live_page(frame, ObservatoryWeb.AgentDetail.View.parts(detail.assigns))
      assert html =~ agent
      assert inline(html) == []
    end

    test "the check finds what it is there to find" do
      for bad <- [
            ~s[<style>.x{}</style>],
            ~s[<script>alert(1)</script>],
            ~s[<div style="color:red">],
            ~s[<button onclick="go()">],
            ~s[<a href="javascript:go()">]
          ] do
        assert inline(bad) != [], bad
      end

      assert inline(~s(<script src="/assets/a.js" defer></script><a href="/x">)) == []
    end
  end

  describe "a host can theme the pages" do
    test "every colour is a --obs-* custom property, defined once at the root with no specificity" do
      css = String.replace(Assets.css(), ~r{/\*.*?\*/}s, "")
      [palette] = Regex.run(~r/:where\(:root\) \{[^}]*\}/, css)
      rules = String.replace(css, palette, "")

      assert Regex.scan(~r/#[0-9a-fA-F]{3,8}\b|rgb\(/, rules) == []
      assert Regex.scan(~r/#[0-9a-fA-F]{3,8}\b/, Assets.lookup("dashboard.css") |> elem(1)) == []
      assert palette =~ "--obs-bg: #0b1020;"
      # Defined nowhere else: a host's rule on any element wins.
      assert length(Regex.scan(~r/--obs-bg:/, css)) == 1
    end

    test "the LiveView pages' wrapper takes the background down the whole layout" do
      assert Assets.css() =~
               ~r/\.observatory-dashboard \{[^}]*background: var\(--obs-bg\);[^}]*min-height: var\(--obs-page-min-height\);/
    end
  end
end
