defmodule ObservatoryWeb.AgentIdentityTest do
  # Issue 13, findings 1 and 2: every agent key is bound to one agent, which acts only
  # as itself; agents exist because an operator issued them a key, and can be deleted.
  use Observatory.TrackerCase, async: false

  alias Observatory.{AgentKeys, JSON, KillSwitch}
  alias Observatory.Gateway.EntropyTracker
  alias Observatory.KillSwitch.Agents
  alias Observatory.Test.{HTTP, Upstream}
  alias ObservatoryWeb.{AgentDetail, Auth}

  setup do
    restore_env_on_exit([:llm_upstream, :agent_keys, :insecure_shared_agent_keys])
    n = System.unique_integer([:positive])
    %{victim: "victim-#{n}", attacker: "attacker-#{n}"}
  end

  defp step(sid, agent),
    do: HTTP.envelope(%{"meta" => %{"session_id" => sid, "agent_id" => agent}})

  defp post_step(sid, agent, as),
    do: HTTP.post_json("/api/v1/decision_logs", step(sid, agent), headers: HTTP.agent_headers(as))

  defp chat(headers) do
    body = JSON.encode!(Upstream.request("Attempt 1: deploy build 4821"))
    HTTP.post("/v1/chat/completions", body, headers: headers)
  end

  defp bearer(key), do: [{"authorization", "Bearer " <> key}]

  describe "finding 1: impersonation — an agent acts only as itself" do
    test "a decision log whose meta.agent_id is another agent is refused and touches nothing",
         %{victim: victim, attacker: attacker} do
      sid = unique_session("sess-forged")
      resp = post_step(sid, victim, attacker)

      assert resp.status == 403
      assert resp.body["error"] == "forbidden"
      assert [%{"path" => "meta.agent_id"}] = resp.body["violations"]
      assert EntropyTracker.session(sid) == nil
    end

    test "a decision log into another agent's session is refused; the victim's window is unchanged",
         %{victim: victim, attacker: attacker} do
      sid = unique_session("sess-victim")
      for _ <- 1..2, do: assert(post_step(sid, victim, victim).status == 200)
      before = EntropyTracker.session(sid)

      resp = post_step(sid, attacker, attacker)
      assert resp.status == 403
      assert [%{"path" => "meta.session_id"}] = resp.body["violations"]
      assert EntropyTracker.session(sid) == before

      # In a batch, the same lines are rejected and the agent's own ones accepted.
      own = unique_session("sess-own")

      body =
        [step(sid, attacker), step(own, attacker), step(own, victim)]
        |> Enum.map_join("\n", &JSON.encode!/1)

      batch =
        HTTP.post("/api/v1/decision_logs", body,
          content_type: "application/x-ndjson",
          headers: HTTP.agent_headers(attacker)
        )

      assert %{"accepted" => 1, "rejected" => 2} = batch.body
      assert EntropyTracker.session(sid) == before
    end

    test "session reads are scoped to the key's agent; operators read every session",
         %{victim: victim, attacker: attacker} do
      sid = unique_session("sess-read")
      assert post_step(sid, victim, victim).status == 200

      assert HTTP.get("/api/v1/sessions/#{sid}", HTTP.agent_headers(victim)).status == 200
      assert HTTP.get("/api/v1/sessions/#{sid}", HTTP.agent_headers(attacker)).status == 404
      assert HTTP.get("/api/v1/sessions/#{sid}", HTTP.operator_headers()).status == 200
    end

    test "tool_calls/check in another agent's session is refused",
         %{victim: victim, attacker: attacker} do
      sid = unique_session("sess-breaker")
      assert post_step(sid, victim, victim).status == 200
      call = %{"session_id" => sid, "tool" => "read_file", "arguments" => %{"path" => "/x"}}

      denied =
        HTTP.post_json("/api/v1/tool_calls/check", call, headers: HTTP.agent_headers(attacker))

      assert denied.status == 403

      allowed =
        HTTP.post_json("/api/v1/tool_calls/check", call, headers: HTTP.agent_headers(victim))

      assert %{"decision" => "allow", "count" => 1} = allowed.body
    end

    test "the proxy takes the agent from the key; a different X-Agent-Id is refused",
         %{victim: victim, attacker: attacker} do
      Application.put_env(:observatory, :llm_upstream, Upstream.answering("ok").url)
      {:ok, _} = KillSwitch.configure(victim, %{"enabled" => true, "threshold" => 100})
      _ = HTTP.key_for(victim)

      forged = chat(HTTP.agent_headers(attacker) ++ [{"x-agent-id", victim}])
      assert forged.status == 403
      assert forged.body["error"]["code"] == "agent_id_mismatch"
      assert KillSwitch.window(victim) in [nil, []]

      # Without X-Agent-Id the key says who it is; the same id is accepted too.
      {:ok, _} = KillSwitch.configure(attacker, %{"enabled" => true, "threshold" => 100})
      assert chat(HTTP.agent_headers(attacker)).status == 200
      assert chat(HTTP.agent_headers(attacker) ++ [{"x-agent-id", attacker}]).status == 200
      assert length(KillSwitch.window(attacker)) == 2
      assert KillSwitch.window(victim) in [nil, []]
    end

    test "operators issue, list, rotate and revoke keys; a key is shown once and stored as a hash",
         %{victim: agent} do
      path = "/api/v1/agents/#{agent}/keys"
      assert HTTP.post(path, "", headers: HTTP.agent_headers("agent-other")).status == 401

      issued = HTTP.post(path, "", headers: HTTP.operator_headers())
      assert issued.status == 201
      assert %{"agent_id" => ^agent, "key" => "oak_" <> _ = key, "key_id" => key_id} = issued.body
      assert %{id: ^agent} = Agents.get(agent)
      assert Auth.agent_for_key(key) == {:ok, agent}

      listed = HTTP.get(path, HTTP.operator_headers())
      assert [%{"key_id" => ^key_id, "seeded" => false}] = listed.body["keys"]
      refute inspect(listed.body) =~ key
      refute inspect(:ets.tab2list(AgentKeys.table())) =~ key
      refute inspect(:mnesia.dirty_match_object({AgentKeys.table(), :_, :_, :_})) =~ key

      rotated = HTTP.post(path <> "/rotate", "", headers: HTTP.operator_headers())
      assert rotated.status == 201
      assert %{"key" => new_key, "key_id" => new_id, "revoked" => [^key_id]} = rotated.body
      assert Auth.agent_for_key(key) == {:error, :unauthorized}
      assert Auth.agent_for_key(new_key) == {:ok, agent}

      sid = unique_session("sess-rotated")

      assert HTTP.post_json("/api/v1/decision_logs", step(sid, agent), headers: bearer(key)).status ==
               401

      assert HTTP.post_json("/api/v1/decision_logs", step(sid, agent), headers: bearer(new_key)).status ==
               200

      assert :ok = AgentKeys.revoke(agent, new_id, operator: "test")

      assert HTTP.post_json("/api/v1/decision_logs", step(sid, agent), headers: bearer(new_key)).status ==
               401

      assert AgentKeys.revoke(agent, new_id) == {:error, :not_found}
    end

    test "an agent holds at most 10 keys" do
      agent = "agent-many-keys-#{System.unique_integer([:positive])}"
      for _ <- 1..AgentKeys.max_keys_per_agent(), do: {:ok, _} = AgentKeys.issue(agent)
      assert AgentKeys.issue(agent) == {:error, :too_many_keys}

      resp = HTTP.post("/api/v1/agents/#{agent}/keys", "", headers: HTTP.operator_headers())
      assert resp.status == 409
      assert resp.body["error"] == "too_many_keys"
    end

    test "the seeded development key is bound to its agent and stored as a hash" do
      assert Auth.agent_for_key(HTTP.agent_key()) == {:ok, "agent-http"}
      assert [%{seeded: true}] = AgentKeys.list("agent-http")
      refute inspect(:ets.tab2list(AgentKeys.table())) =~ HTTP.agent_key()
      # Re-seeding (a restart) is idempotent.
      assert :ok = AgentKeys.setup()
      assert [%{seeded: true}] = AgentKeys.list("agent-http")
    end

    test "shared :agent_keys are refused at start unless insecure_shared_agent_keys is set" do
      Application.put_env(:observatory, :agent_keys, ["shared-key"])
      Application.delete_env(:observatory, :insecure_shared_agent_keys)
      assert_raise ArgumentError, ~r/shared agent keys/, fn -> AgentKeys.setup() end
      assert Auth.agent_for_key("shared-key") == {:error, :unauthorized}

      Application.put_env(:observatory, :insecure_shared_agent_keys, true)
      assert :ok = AgentKeys.setup()
      assert Auth.agent_for_key("shared-key") == {:ok, :any_agent}
      assert Auth.acts_as?(:any_agent, "whoever")
    end
  end

  describe "agent key headers: Authorization Bearer, X-Agent-Key, X-Api-Key (the Anthropic SDK's api_key)" do
    test "each header carries the agent's key and authenticates as its agent; a wrong key is a 401",
         %{victim: agent} do
      key = HTTP.key_for(agent)

      for header <- [
            {"authorization", "Bearer " <> key},
            {"x-agent-key", key},
            {"x-api-key", key}
          ] do
        sid = unique_session("sess-header")
        resp = HTTP.post_json("/api/v1/decision_logs", step(sid, agent), headers: [header])
        assert resp.status == 200, "#{elem(header, 0)}: #{resp.status}"
        assert EntropyTracker.session(sid).agent_id == agent
      end

      sid = unique_session("sess-header")
      wrong = [{"x-api-key", "oak_not-a-key"}]

      assert HTTP.post_json("/api/v1/decision_logs", step(sid, agent), headers: wrong).status ==
               401

      assert EntropyTracker.session(sid) == nil
    end
  end

  describe "finding 2: registry flood — requests never register agents" do
    test "no request, with any key, registers an agent", %{attacker: attacker} do
      Application.put_env(:observatory, :llm_upstream, Upstream.answering("ok").url)
      _ = HTTP.key_for(attacker)
      before = Agents.count()

      for n <- 1..20 do
        resp = chat(HTTP.agent_headers(attacker) ++ [{"x-agent-id", "#{attacker}-stranger-#{n}"}])
        assert resp.status == 403
      end

      # Even an insecure shared key, which may name any agent, registers none.
      Application.put_env(:observatory, :agent_keys, ["shared-key"])
      Application.put_env(:observatory, :insecure_shared_agent_keys, true)
      stranger = "#{attacker}-shared-stranger"
      resp = chat(bearer("shared-key") ++ [{"x-agent-id", stranger}])
      assert resp.status == 403
      assert resp.body["error"]["code"] == "unknown_agent"
      # A shared key names no agent: it must say which one.
      assert chat(bearer("shared-key")).body["error"]["code"] == "missing_agent_id"

      assert Agents.count() == before
      assert Agents.get(stranger) == nil
    end

    test "operators delete agents over the API; deleting revokes their keys", %{victim: agent} do
      key = HTTP.key_for(agent)
      {:ok, _} = KillSwitch.deactivate(agent, operator: "test")
      assert KillSwitch.events(agent_id: agent) != []

      assert HTTP.post("/api/v1/agents/#{agent}", "", headers: HTTP.operator_headers()).status ==
               405

      resp = delete("/api/v1/agents/#{agent}", HTTP.operator_headers())
      assert resp.status == 200
      assert %{"deleted" => true, "revoked_keys" => [_]} = resp.body

      assert Agents.get(agent) == nil
      assert KillSwitch.events(agent_id: agent) == []
      assert AgentKeys.list(agent) == []
      assert Auth.agent_for_key(key) == {:error, :unauthorized}
      assert delete("/api/v1/agents/#{agent}", HTTP.operator_headers()).status == 404
      assert delete("/api/v1/agents/#{agent}", bearer(key)).status == 401

      # An operator can register it again, with a new key.
      assert {:ok, %{key: again}} = AgentKeys.issue(agent)
      assert %{active: true} = Agents.get(agent)
      assert Auth.agent_for_key(again) == {:ok, agent}
    end

    test "KillSwitch.delete/2 from Elixir", %{victim: agent} do
      {:ok, _} = AgentKeys.issue(agent)
      :ok = Observatory.Gateway.Events.subscribe(KillSwitch.topic())
      assert {:ok, [_key_id]} = KillSwitch.delete(agent, operator: "alice")

      assert_receive %{
        event_type: "agent_deleted",
        agent_id: ^agent,
        details: %{operator: "alice"}
      }

      assert KillSwitch.delete(agent) == {:error, :not_found}
    end

    test "an open Agent Detail page shows a deleted agent as gone", %{victim: agent} do
      {:ok, _} = AgentKeys.issue(agent)
      socket = ObservatoryWeb.SessionClusterManager.Socket.new(connected?: true)
      {:ok, socket} = AgentDetail.mount(%{"agent_id" => agent}, %{"operator" => "alice"}, socket)
      assert socket.assigns.agent.id == agent

      {:ok, _} = KillSwitch.delete(agent, operator: "alice")
      assert_receive %{event_type: "agent_deleted", agent_id: ^agent} = deleted
      {:noreply, socket} = AgentDetail.handle_info(deleted, socket)
      assert socket.assigns.agent == nil
      assert IO.iodata_to_binary(AgentDetail.render(socket.assigns)) =~ "No such agent"
    end
  end

  defp delete(path, headers) do
    headers = for {k, v} <- headers, do: {String.to_charlist(k), String.to_charlist(v)}

    {:ok, {{_, status, _}, _, body}} =
      :httpc.request(:delete, {String.to_charlist(HTTP.url(path)), headers}, [],
        body_format: :binary
      )

    %{status: status, body: JSON.decode(body) |> elem(1)}
  end
end
