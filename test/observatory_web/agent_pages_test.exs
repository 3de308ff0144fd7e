defmodule ObservatoryWeb.AgentPagesTest do
  # The agents pages over real sockets: the sign-in guard, CSP, CSRF on their actions,
  # escaping of agent ids that arrive through the proxy's X-Agent-Id header, and a
  # kill switch trip reaching an open Agent Detail page over the event stream.
  # Changes :llm_upstream: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.KillSwitch.Agents
  alias Observatory.Test.DashboardClient, as: Client
  alias Observatory.Test.{HTTP, Upstream}
  alias ObservatoryWeb.Dashboard.{Assets, EventStream}
  alias ObservatoryWeb.HTML

  @hostile "<img src=x onerror=alert(1)>"

  setup do
    saved = Application.get_env(:observatory, :llm_upstream)
    on_exit(fn -> Application.put_env(:observatory, :llm_upstream, saved) end)
    %{agent: "agent-page-#{System.unique_integer([:positive])}"}
  end

  defp encode(id), do: URI.encode(id, &URI.char_unreserved?/1)

  defp stream_path(id), do: EventStream.stream_path("agent", %{"agent_id" => id})

  defp chat(agent, k) do
    body = JSON.encode!(Upstream.request("Attempt #{k}: deploy build 4821"))

    HTTP.post("/v1/chat/completions", body,
      headers: [{"authorization", "Bearer " <> HTTP.key_for(agent)}, {"x-agent-id", agent}]
    )
  end

  defp use_upstream(content) do
    Application.put_env(:observatory, :llm_upstream, Upstream.answering(content).url)
  end

  defp mount_event(stream) do
    {{:event, "mount", %{"page_id" => page_id, "html" => html}}, stream} =
      Client.next_event(stream)

    {page_id, html, stream}
  end

  defp post_event(auth, page_id, event, params, opts \\ []) do
    Client.request(:post, "/dashboard/events",
      cookie: auth.cookie,
      type: "application/json",
      headers: [{"x-csrf-token", Keyword.get(opts, :csrf, auth.csrf)}],
      body: JSON.encode!(%{page_id: page_id, event: event, params: params})
    )
  end

  describe "guards" do
    test "the agents pages redirect to /login without a sign-in; their streams are 401",
         %{agent: agent} do
      {:ok, _} = Agents.fetch_or_register(agent)

      for path <- ["/agents", "/agents/#{agent}"] do
        resp = Client.request(:get, path)
        assert resp.status == 303, path
        assert Client.header(resp, "location") == "/login"
      end

      assert Client.request(:get, stream_path(agent)).status == 401
      assert Client.request(:get, "/dashboard/events?view=agents").status == 401
    end

    test "an unknown view is a 404; other methods on the pages are 405" do
      auth = Client.sign_in()

      assert Client.request(:get, "/dashboard/events?view=nope", cookie: auth.cookie).status ==
               404

      assert Client.request(:post, "/agents", cookie: auth.cookie).status == 405
      assert Client.request(:post, "/agents/x", cookie: auth.cookie).status == 405
      assert Client.request(:get, "/agents/x/y", cookie: auth.cookie).status == 404
    end

    test "an action needs the CSRF token: without it nothing changes", %{agent: agent} do
      {:ok, _} = Agents.fetch_or_register(agent)
      auth = Client.sign_in()
      stream = Client.open_stream(auth.cookie, stream_path(agent))
      {page_id, _html, _stream} = mount_event(stream)

      params = %{enabled: "true"}
      assert post_event(auth, page_id, "toggle_kill_switch", params, csrf: "").status == 403
      other = Client.sign_in()

      assert post_event(auth, page_id, "toggle_kill_switch", params, csrf: other.csrf).status ==
               403

      assert %{kill_switch: %{enabled: false}} = Agents.get(agent)

      # Another page's events are refused: the page's core module decides.
      assert post_event(auth, page_id, "pause_inspect", %{session_id: "s"}).status == 400
      Client.close_stream(stream)
    end
  end

  describe "pages" do
    test "GET /agents lists the agents under the dashboard's CSP, linked from the nav",
         %{agent: agent} do
      {:ok, _} = Agents.fetch_or_register(agent)
      auth = Client.sign_in()

      home = Client.request(:get, "/", cookie: auth.cookie)
      assert home.body =~ ~s(<a href="/agents">Agents</a>)

      resp = Client.request(:get, "/agents", cookie: auth.cookie)
      assert resp.status == 200
      csp = Client.header(resp, "content-security-policy")
      assert csp =~ "script-src 'self'"
      refute csp =~ "unsafe-inline"
      assert resp.body =~ "<title>Agents · Observatory</title>"
      assert resp.body =~ ~s(data-stream="/dashboard/events?view=agents")
      assert resp.body =~ ~s(<a href="/agents" aria-current="page">Agents</a>)
      assert resp.body =~ ~s(href="/agents/#{agent}"#{HTML.navigate()}>#{agent}</a>)
      assert resp.body =~ ~s(<script src="/assets/#{Assets.path("dashboard.js")}" defer></script>)
    end

    test "GET /agents/:id is the Agent Detail page; an unknown agent is a 404 page",
         %{agent: agent} do
      {:ok, _} = Agents.fetch_or_register(agent)
      auth = Client.sign_in()

      resp = Client.request(:get, "/agents/#{agent}", cookie: auth.cookie)
      assert resp.status == 200
      assert Client.header(resp, "content-security-policy") =~ "default-src 'none'"
      assert resp.body =~ ~s(id="kill-switch-toggle")
      assert resp.body =~ ~s(<span id="agent-status" class="ad-status ad-status-active")
      assert resp.body =~ ~s(data-stream="/dashboard/events?agent_id=#{agent}&amp;view=agent")
      assert resp.body =~ ~s(<meta name="csrf-token")

      missing = Client.request(:get, "/agents/#{agent}-nope", cookie: auth.cookie)
      assert missing.status == 404
      assert missing.body =~ ~s(id="agent-missing")
      assert missing.body =~ ~s(data-stream=), "still live: it shows the agent once registered"
    end

    test "a hostile agent id from X-Agent-Id is escaped on both pages", %{agent: agent} do
      use_upstream("Done.")
      hostile = @hostile <> agent
      assert chat(hostile, 1).status == 200
      assert %{id: ^hostile} = Agents.get(hostile)
      auth = Client.sign_in()

      list = Client.request(:get, "/agents", cookie: auth.cookie).body
      refute list =~ "<img"

      assert list =~
               ~s{href="/agents/#{encode(hostile)}"#{HTML.navigate()}>&lt;img src=x onerror=alert(1)&gt;}

      detail = Client.request(:get, "/agents/#{encode(hostile)}", cookie: auth.cookie)
      assert detail.status == 200
      refute detail.body =~ "<img"

      assert detail.body =~
               "<title>Agent &lt;img src=x onerror=alert(1)&gt;#{agent} · Observatory"

      assert detail.body =~ ~s{class="mono">&lt;img src=x onerror=alert(1)&gt;#{agent}</h1>}

      # Its live page acts on the same agent: the id round-trips intact.
      stream = Client.open_stream(auth.cookie, stream_path(hostile))
      {page_id, html, _stream} = mount_event(stream)
      refute html =~ "<img"
      assert post_event(auth, page_id, "toggle_kill_switch", %{enabled: "true"}).status == 204
      assert %{kill_switch: %{enabled: true}} = Agents.get(hostile)
      Client.close_stream(stream)
    end
  end

  describe "the live Agent Detail page" do
    test "a trip through the proxy shows \"Deactivated by Kill Switch\" within 1 s; Activate brings it back",
         %{agent: agent} do
      use_upstream("Deployment failed: timeout.")
      assert chat(agent, 0).status == 200
      auth = Client.sign_in()
      stream = Client.open_stream(auth.cookie, stream_path(agent))
      {page_id, html, stream} = mount_event(stream)
      assert html =~ ~s(aria-checked="false")

      # The operator turns the switch on and sets the window and threshold on the page.
      assert post_event(auth, page_id, "toggle_kill_switch", %{enabled: "true"}).status == 204

      assert post_event(auth, page_id, "save_settings", %{window_size: "5", threshold: "8"}).status ==
               204

      assert %{kill_switch: %{enabled: true, window_size: 5, threshold: 8.0}} = Agents.get(agent)

      # Scores 0, 1, 4, 7, then 10 > 8: the fifth request is refused.
      {statuses, _log} = with_log(fn -> for k <- 1..5, do: chat(agent, k).status end)
      assert statuses == [200, 200, 200, 200, 403]
      started = System.monotonic_time(:millisecond)

      {{:event, "render", %{"html" => html}}, stream} =
        Client.await_event(
          stream,
          fn
            {:event, "render", %{"html" => h}} ->
              h =~ ~s(data-status="deactivated_by_kill_switch")

            _ ->
              false
          end,
          1_000
        )

      assert System.monotonic_time(:millisecond) - started < 1_000
      assert html =~ "Deactivated by Kill Switch"
      assert html =~ "Score 10.00 exceeded the threshold 8.00"

      assert post_event(auth, page_id, "activate", %{}).status == 204
      assert %{active: true, deactivated_by: nil} = Agents.get(agent)

      {{:event, "render", %{"html" => html}}, stream} =
        Client.await_event(stream, fn
          {:event, "render", %{"html" => h}} ->
            h =~ ~s(id="agent-status" class="ad-status ad-status-active")

          _ ->
            false
        end)

      assert html =~ "Activated: its window starts empty."
      assert [%{event_type: "activation"} | _] = KillSwitch.events(agent_id: agent)
      Client.close_stream(stream)
    end
  end
end
