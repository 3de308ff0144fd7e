defmodule ObservatoryWeb.LivePartsTest do
  # The LiveViews put each part of a page in its own assign, so LiveView resends only
  # the parts that changed (ObservatoryWeb.LiveParts). These tests drive the page
  # cores with Observatory's own socket and check what would be resent.
  use ExUnit.Case, async: true

  alias ObservatoryWeb.{AgentDetail, AgentList, LiveParts, SessionClusterManager}
  alias ObservatoryWeb.SessionClusterManager.{Socket, View}

  defp manager do
    {:ok, socket} = SessionClusterManager.mount(%{}, %{"operator" => "alice"}, Socket.new())
    socket
  end

  defp alert(sid) do
    %{
      event_type: "entropy_alert",
      session_id: sid,
      agent_id: "agent-parts",
      entropy_score: 0.2,
      window_size: 5,
      repeated_pattern: %{intent: "search", tool_call: "read_file", action_status: "failure"},
      occurrence_count: 5
    }
  end

  defp snapshot(socket, parts_fun), do: LiveParts.snapshot(parts_fun.(socket.assigns))

  describe "the pages are their parts" do
    test "each page's render/1 is its parts in order" do
      socket = manager()

      assert IO.iodata_to_binary(View.render(socket.assigns)) ==
               socket.assigns |> View.parts() |> Keyword.values() |> IO.iodata_to_binary()

      {:ok, detail} = AgentDetail.mount(%{"agent_id" => "nobody-parts"}, %{}, Socket.new())

      assert IO.iodata_to_binary(AgentDetail.render(detail.assigns)) ==
               detail.assigns
               |> ObservatoryWeb.AgentDetail.View.parts()
               |> Keyword.values()
               |> IO.iodata_to_binary()

      {:ok, list} = AgentList.mount(%{}, %{}, Socket.new())
      assert [html_list: _] = AgentList.parts(list.assigns)
    end

    test "the same assigns give the same parts (nothing is resent for nothing)" do
      socket = manager()
      assert snapshot(socket, &View.parts/1) == snapshot(socket, &View.parts/1)

      assert LiveParts.changed_bytes(
               snapshot(socket, &View.parts/1),
               snapshot(socket, &View.parts/1)
             ) == 0
    end
  end

  describe "an update resends only what changed" do
    test "an entropy alert changes the alerts, the summary and the topology, not the rest" do
      socket = manager()
      before = snapshot(socket, &View.parts/1)

      {:noreply, socket} =
        SessionClusterManager.handle_info(
          alert("sess-parts-#{System.unique_integer([:positive])}"),
          socket
        )

      after_alert = snapshot(socket, &View.parts/1)

      changed = LiveParts.changed(before, after_alert)
      assert :html_alerts in changed
      # The new node shows under its state: the summary counts it, the list gets it.
      assert Enum.all?(
               changed,
               &(&1 in [:html_alerts, :html_summary, :html_topology, :html_topology_end] or
                   String.starts_with?(to_string(&1), "html_nodes_"))
             )

      refute Enum.any?(changed, &(&1 in [:html_notice, :html_inspect, :html_steps]))
      refute :html_nodes_idle in changed

      full = after_alert |> Map.values() |> Enum.map(&byte_size/1) |> Enum.sum()
      assert LiveParts.changed_bytes(before, after_alert) < full
    end

    test "the same alert again changes only the alert's row (its count and time)" do
      sid = "sess-parts-#{System.unique_integer([:positive])}"
      {:noreply, socket} = SessionClusterManager.handle_info(alert(sid), manager())
      before = snapshot(socket, &View.parts/1)
      {:noreply, socket} = SessionClusterManager.handle_info(alert(sid), socket)
      assert LiveParts.changed(before, snapshot(socket, &View.parts/1)) == [:html_alerts]
    end

    test "a notice changes the notice part only" do
      socket = manager()
      before = snapshot(socket, &View.parts/1)
      {:noreply, socket} = SessionClusterManager.handle_event("no_such_event", %{}, socket)
      assert LiveParts.changed(before, snapshot(socket, &View.parts/1)) == [:html_notice]
    end

    test "issue 18: Inspect, and a step shown whole, resend the Inspect panel only" do
      sid = "sess-parts-inspect-#{System.unique_integer([:positive])}"
      long = Enum.map_join(1..30, "\n", &"line #{&1}")

      {:ok, _} =
        Observatory.Gateway.SchemaInterceptor.ingest(
          Observatory.Test.HTTP.envelope(%{
            "meta" => %{"session_id" => sid},
            "action" => %{"tool_input" => %{"command" => "make"}, "result" => long}
          })
        )

      socket = manager()
      before = snapshot(socket, &View.parts/1)

      {:noreply, socket} =
        SessionClusterManager.handle_event("inspect", %{"session_id" => sid}, socket)

      inspected = snapshot(socket, &View.parts/1)
      assert LiveParts.changed(before, inspected) == [:html_inspect]

      {:noreply, socket} =
        SessionClusterManager.handle_event(
          "toggle_step",
          %{"session_id" => sid, "step" => "1"},
          socket
        )

      assert LiveParts.changed(inspected, snapshot(socket, &View.parts/1)) == [:html_inspect]
    end

    test "changed_bytes counts a part that is new or different, never an equal one" do
      assert LiveParts.changed_bytes(%{a: "xx", b: "y"}, %{a: "xx", b: "zz", c: "123"}) == 5
      assert LiveParts.changed(%{a: "xx"}, %{a: "xx"}) == []
    end
  end

  describe "the topology is cut by state" do
    test "a node changing state resends its old and new state's nodes only" do
      socket = manager()

      socket =
        Enum.reduce(1..3, socket, fn n, socket ->
          update = %{
            event_type: "topology_update",
            session_id: "sess-parts-idle-#{n}",
            agent_id: "a",
            state: "idle",
            color: "x"
          }

          {:noreply, socket} = SessionClusterManager.handle_info(update, socket)
          socket
        end)

      {:noreply, socket} =
        SessionClusterManager.handle_info(
          %{
            event_type: "topology_update",
            session_id: "sess-parts-moving",
            agent_id: "a",
            state: "active",
            color: "x"
          },
          socket
        )

      before = snapshot(socket, &View.parts/1)
      assert before.html_nodes_idle =~ "sess-parts-idle-1"

      {:noreply, socket} =
        SessionClusterManager.handle_info(
          %{
            event_type: "topology_update",
            session_id: "sess-parts-moving",
            agent_id: "a",
            state: "blocked",
            color: "x"
          },
          socket
        )

      changed = LiveParts.changed(before, snapshot(socket, &View.parts/1))
      assert Enum.sort(changed) == [:html_nodes_active, :html_nodes_blocked, :html_summary]
    end
  end

  describe "the stylesheet and the navigation" do
    test "are a <link> to the stylesheet file and the nav, set once at mount in their own assigns" do
      frame = LiveParts.frame("/ops/observatory", :cluster)
      assert Keyword.keys(frame) == [:observatory_css, :observatory_nav]

      assert frame[:observatory_css] ==
               ~s(<link rel="stylesheet" href="/ops/observatory/assets/#{ObservatoryWeb.Dashboard.Assets.path("manager.css")}">)

      assert frame[:observatory_nav] =~ ~s(<nav class="scm-nav")
      refute IO.iodata_to_binary(View.render(manager().assigns)) =~ "<style>"
      # Mounted by hand (no path in the session): nothing to link, no nav.
      assert LiveParts.frame(nil, :agents) == [observatory_css: "", observatory_nav: ""]
    end
  end

  describe "assign/2" do
    test "puts every part as a binary under its name" do
      socket = LiveParts.assign(Socket.new(), html_a: ["<p>", "x", "</p>"], html_b: "y")
      assert socket.assigns == %{html_a: "<p>x</p>", html_b: "y"}
    end
  end
end
