defmodule ObservatoryWeb.HostMountTest do
  # The agents' API and the LLM proxy served by a host's endpoint
  # (ObservatoryWeb.AgentAPIPlug, LLMProxyPlug): their Plug-free part, ObservatoryWeb.Mount,
  # driven by a request-building adapter (Observatory.Test.ConnAdapter) as a host's
  # endpoint drives it through ObservatoryWeb.Conn.PlugAdapter. Answers are compared
  # with Observatory's own server's for the same requests. Changes the proxy's and
  # the throttle's configuration: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.Gateway.HITL
  alias Observatory.Proxy.SSE
  alias Observatory.Test.{ConnAdapter, HTTP, Upstream}
  alias ObservatoryWeb.{AuthThrottle, Mount}

  @agents Mount.new(:agents_api, at: "/observatory")
  @proxy Mount.new(:llm_proxy, at: "/llm")

  setup do
    saved =
      for key <- [:llm_upstream, :auth_throttle],
          do: {key, Application.get_env(:observatory, key)}

    on_exit(fn -> for {key, value} <- saved, do: Application.put_env(:observatory, key, value) end)

    n = System.unique_integer([:positive])
    %{agent: "agent-mount-#{n}", n: n}
  end

  defp json(headers), do: [{"content-type", "application/json"} | headers]
  defp decode(%{body: body}), do: elem(JSON.decode(body), 1)

  defp post_step(agent, envelope, opts \\ []) do
    ConnAdapter.request(@agents, "POST", "/observatory/api/v1/decision_logs",
      headers: json(Keyword.get(opts, :auth, HTTP.agent_headers(agent))),
      body: JSON.encode!(envelope)
    )
  end

  describe "where a host mounts them: paths under :at, everything else passes through" do
    test "the agents' API answers its routes under /observatory, and passes the rest on" do
      assert %{status: 401} = ConnAdapter.request(@agents, "GET", "/observatory/api/v1/agents")

      # The LiveView pages at the same prefix, the proxy's routes, other paths: not ours.
      for path <- [
            "/observatory",
            "/observatory/agents",
            "/observatory/agents/a-1",
            "/observatory/v1/chat/completions",
            "/api/v1/agents",
            "/observatory/api/v1/nope",
            "/observatory/healthz",
            "/"
          ] do
        assert ConnAdapter.request(@agents, "GET", path) == :pass, path
      end
    end

    test "the proxy answers its routes under /llm (every API, and the models list)" do
      for {method, path} <- [
            {"POST", "/llm/v1/chat/completions"},
            {"POST", "/llm/v1/responses"},
            {"POST", "/llm/v1/messages"},
            {"POST", "/llm/v1/messages/count_tokens"},
            {"GET", "/llm/v1/models"},
            {"GET", "/llm/v1/models/gpt-x"}
          ] do
        assert %{status: 401} = ConnAdapter.request(@proxy, method, path), path
      end

      assert ConnAdapter.request(@proxy, "POST", "/llm/api/v1/decision_logs") == :pass
      assert ConnAdapter.request(@proxy, "POST", "/v1/chat/completions") == :pass
    end

    test "a route of the API with another method is 405, as on the built-in server" do
      resp = ConnAdapter.request(@agents, "GET", "/observatory/api/v1/decision_logs")
      assert resp.status == 405
      assert decode(resp)["error"] == "method_not_allowed"
      assert HTTP.get("/api/v1/decision_logs").status == 405
    end

    test "at: defaults to the built-in server's paths; bad options are refused" do
      root = Mount.new(:agents_api, [])
      assert %{status: 401} = ConnAdapter.request(root, "GET", "/api/v1/agents")

      assert_raise ArgumentError, ~r/expected :at to be a path/, fn ->
        Mount.new(:llm_proxy, at: "llm")
      end

      assert_raise ArgumentError, ~r/unknown options \[:path\]/, fn ->
        Mount.new(:llm_proxy, path: "/x")
      end
    end
  end

  # This build has no Plug, as a host's build of Observatory made before it added Plug
  # (Mix does not recompile a dependency when its optional one arrives later). Before:
  # `plug ObservatoryWeb.AgentAPIPlug` failed with "module … is not available".
  describe "a build of Observatory made without Plug" do
    test "the plugs say, where the endpoint plugs them in, how to recompile" do
      for plug <- [ObservatoryWeb.AgentAPIPlug, ObservatoryWeb.LLMProxyPlug] do
        error = assert_raise ArgumentError, fn -> plug.init(at: "/observatory") end

        assert error.message ==
                 "#{inspect(plug)} is not in this build of Observatory: it was compiled before " <>
                   "Plug was available to it. Recompile it once: mix deps.compile observatory --force"
      end
    end
  end

  describe "the same authentication, caps and answers as Observatory's own server" do
    test "a step is scored and answered as the built-in server answers it", %{agent: agent, n: n} do
      envelope = fn session ->
        HTTP.envelope(%{"meta" => %{"agent_id" => agent, "session_id" => session}})
      end

      mounted = post_step(agent, envelope.("sess-mount-#{n}"))

      own =
        HTTP.post_json("/api/v1/decision_logs", envelope.("sess-own-#{n}"),
          headers: HTTP.agent_headers(agent)
        )

      assert mounted.status == 200 and own.status == 200
      body = decode(mounted)
      assert Map.keys(body) == Map.keys(own.body)

      assert Map.drop(body, ["session_id", "step_id"]) ==
               Map.drop(own.body, ["session_id", "step_id"])

      assert mounted.headers["content-type"] == "application/json"
      assert mounted.headers["cache-control"] == "no-store"
      assert mounted.headers["x-content-type-options"] == "nosniff"
    end

    test "NDJSON batches, and another agent's steps refused (403), as on the built-in server", %{
      agent: agent,
      n: n
    } do
      lines =
        for i <- 1..3 do
          JSON.encode!(
            HTTP.envelope(%{"meta" => %{"agent_id" => agent, "session_id" => "sess-nd-#{n}-#{i}"}})
          )
        end

      resp =
        ConnAdapter.request(@agents, "POST", "/observatory/api/v1/decision_logs",
          headers: [{"content-type", "application/x-ndjson"} | HTTP.agent_headers(agent)],
          body: Enum.join(lines, "\n")
        )

      assert resp.status == 200 and decode(resp)["accepted"] == 3

      forged =
        HTTP.envelope(%{"meta" => %{"agent_id" => "someone-else", "session_id" => "s-#{n}"}})

      assert %{status: 403} = forged_resp = post_step(agent, forged)
      assert decode(forged_resp)["error"] == "forbidden"
    end

    test "no key, a wrong key: 401 with the built-in server's body", %{agent: agent} do
      none = post_step(agent, HTTP.envelope(), auth: [])
      wrong = post_step(agent, HTTP.envelope(), auth: [{"authorization", "Bearer nope"}])
      own = HTTP.post_json("/api/v1/decision_logs", HTTP.envelope(), headers: [])

      assert none.status == 401 and wrong.status == 401
      assert decode(none) == own.body
    end

    test "body caps: 413 over :max_body_bytes; 415 for another type; 400 for bad UTF-8 in the path",
         %{agent: agent} do
      big = String.duplicate("x", ObservatoryWeb.Conn.max_body_bytes() + 1)

      assert %{status: 413} =
               ConnAdapter.request(@agents, "POST", "/observatory/api/v1/decision_logs",
                 headers: json(HTTP.agent_headers(agent)),
                 body: big
               )

      assert %{status: 415} =
               ConnAdapter.request(@agents, "POST", "/observatory/api/v1/decision_logs",
                 headers: [{"content-type", "text/plain"} | HTTP.agent_headers(agent)],
                 body: "{}"
               )

      bad =
        ConnAdapter.request(@agents, "GET", "/observatory/api/v1/sessions/bad%FF",
          headers: HTTP.operator_headers()
        )

      assert bad.status == 400
      assert decode(bad)["message"] == "the path is not valid UTF-8"
      assert bad.close_after
    end

    test "operator routes take operator tokens: issue a key, pause a session, read the audit", %{
      agent: agent,
      n: n
    } do
      issued =
        ConnAdapter.request(@agents, "POST", "/observatory/api/v1/agents/#{agent}/keys",
          headers: HTTP.operator_headers()
        )

      assert issued.status == 201
      key = decode(issued)["key"]
      session = "sess-op-#{n}"

      envelope = HTTP.envelope(%{"meta" => %{"agent_id" => agent, "session_id" => session}})

      assert %{status: 200} =
               post_step(agent, envelope, auth: [{"authorization", "Bearer " <> key}])

      paused =
        ConnAdapter.request(@agents, "POST", "/observatory/api/v1/sessions/#{session}/pause",
          headers: json(HTTP.operator_headers()),
          body: JSON.encode!(%{reason: "look"})
        )

      assert paused.status == 200
      on_exit(fn -> HITL.paused?(session) && HITL.resume(session, operator: "test") end)

      again = post_step(agent, envelope, auth: [{"authorization", "Bearer " <> key}])
      assert [%{"type" => "pause"}] = decode(again)["directives"]

      assert %{status: 401} =
               ConnAdapter.request(
                 @agents,
                 "POST",
                 "/observatory/api/v1/sessions/#{session}/resume",
                 headers: [{"authorization", "Bearer " <> key}]
               )
    end

    # Each operator route of the built-in server, on fresh ids: budgets, guidance,
    # notification sinks and the sessions list included.
    defp operator_routes(agent, session, sink) do
      [
        {"GET", "/api/v1/sessions", nil},
        {"GET", "/api/v1/sessions?state=bogus", nil},
        {"GET", "/api/v1/sessions/#{session}", nil},
        {"GET", "/api/v1/sessions/#{session}/steps/1", nil},
        {"POST", "/api/v1/sessions/#{session}/step_detector/reset", nil},
        {"GET", "/api/v1/hitl/audit?session_id=#{session}", nil},
        {"GET", "/api/v1/agents", nil},
        {"GET", "/api/v1/agents/#{agent}", nil},
        {"PUT", "/api/v1/agents/#{agent}/kill_switch", %{enabled: true, threshold: 9}},
        {"PUT", "/api/v1/agents/#{agent}/guidance", %{enabled: false}},
        {"PUT", "/api/v1/agents/#{agent}/budget", %{session_requests: 100}},
        {"GET", "/api/v1/agents/#{agent}/budget", nil},
        {"POST", "/api/v1/agents/#{agent}/budget/reset", nil},
        {"GET", "/api/v1/notifications/sinks", nil},
        {"PUT", "/api/v1/notifications/sinks/#{sink}", %{kind: "nope"}},
        {"POST", "/api/v1/notifications/sinks/#{sink}/test", nil},
        {"DELETE", "/api/v1/notifications/sinks/#{sink}", nil},
        {"POST", "/api/v1/agents/#{agent}/deactivate", %{reason: "test"}},
        {"POST", "/api/v1/agents/#{agent}/activate", nil},
        {"GET", "/api/v1/agents/#{agent}/keys", nil},
        {"POST", "/api/v1/agents/#{agent}/keys/rotate", nil},
        {"DELETE", "/api/v1/agents/#{agent}/keys/no-such-key", nil},
        {"DELETE", "/api/v1/agents/#{agent}", nil}
      ]
    end

    defp own_server(method, path, body) do
      url = String.to_charlist(HTTP.url(path))
      headers = for {k, v} <- HTTP.operator_headers(), do: {~c"#{k}", ~c"#{v}"}

      request =
        if method in ["GET", "DELETE"],
          do: {url, headers},
          else: {url, headers, ~c"application/json", JSON.encode!(body || %{})}

      method = method |> String.downcase() |> String.to_existing_atom()
      {:ok, {{_, status, _}, _, resp}} = :httpc.request(method, request, [], body_format: :binary)
      {status, elem(JSON.decode(resp), 1)}
    end

    defp mounted(method, path, body) do
      opts = [headers: json(HTTP.operator_headers())]

      opts =
        if method in ["GET", "DELETE"],
          do: opts,
          else: [{:body, JSON.encode!(body || %{})} | opts]

      resp = ConnAdapter.request(@agents, method, "/observatory" <> path, opts)
      assert resp != :pass, "#{method} #{path} passed through the mount"
      {resp.status, decode(resp)}
    end

    test "every operator route of the built-in server, new ones included, answers the same through the mount",
         %{n: n} do
      answers = fn serve, side ->
        agent = "agent-routes-#{side}-#{n}"
        HTTP.key_for(agent)
        session = "sess-routes-#{side}-#{n}"

        assert %{status: 200} =
                 post_step(
                   agent,
                   HTTP.envelope(%{"meta" => %{"agent_id" => agent, "session_id" => session}})
                 )

        for {method, path, body} <- operator_routes(agent, session, "sink-#{side}-#{n}") do
          {status, answer} = serve.(method, path, body)
          # The answer's shape: its keys, and an error's code.
          {method, String.replace(path, "-#{side}-", "-"), status,
           is_map(answer) && Enum.sort(Map.keys(answer)), is_map(answer) && answer["error"]}
        end
      end

      {mount_answers, own_answers} =
        with_log(fn -> {answers.(&mounted/3, "m"), answers.(&own_server/3, "o")} end) |> elem(0)

      assert mount_answers == own_answers
      statuses = Enum.map(own_answers, &elem(&1, 2))
      # Not all refusals: the routes did their work.
      assert Enum.count(statuses, &(&1 in 200..299)) >= 17, inspect(own_answers)
    end

    test "a locked-out client's wrong credentials get 429 through the mount too, its valid ones are served" do
      Application.put_env(:observatory, :auth_throttle,
        max_failures: 2,
        window_s: 60,
        lockout_s: 30
      )

      AuthThrottle.reset()
      on_exit(&AuthThrottle.reset/0)
      ip = "10.23.0.1"

      for n <- 1..2 do
        assert %{status: 401} =
                 ConnAdapter.request(@agents, "GET", "/observatory/api/v1/agents",
                   headers: [{"authorization", "Bearer guess-#{n}"}],
                   remote_ip: ip
                 )
      end

      locked =
        ConnAdapter.request(@agents, "GET", "/observatory/api/v1/agents",
          headers: [{"authorization", "Bearer guess-3"}],
          remote_ip: ip
        )

      assert locked.status == 429
      assert locked.headers["retry-after"]

      # Strangers' failures never deny a valid credential: the same client's operator
      # token is served, and so is another client.
      assert %{status: 200} =
               ConnAdapter.request(@agents, "GET", "/observatory/api/v1/agents",
                 headers: HTTP.operator_headers(),
                 remote_ip: ip
               )

      assert %{status: 200} =
               ConnAdapter.request(@agents, "GET", "/observatory/api/v1/agents",
                 headers: HTTP.operator_headers()
               )
    end
  end

  describe "the kill switch and pauses are enforced by the proxy in a host" do
    defp chat(agent, body, headers \\ []) do
      ConnAdapter.request(@proxy, "POST", "/llm/v1/chat/completions",
        headers: json(HTTP.agent_headers(agent) ++ headers),
        body: JSON.encode!(body)
      )
    end

    test "a proxied call goes upstream and back, with the gateway's headers", %{agent: agent} do
      Application.put_env(:observatory, :llm_upstream, Upstream.answering("hi there").url)
      resp = chat(agent, Upstream.request("hello"))

      assert resp.status == 200
      assert decode(resp)["choices"] |> hd() |> get_in(["message", "content"]) == "hi there"
      assert resp.headers["x-observatory-session-id"] =~ "proxy-"
      assert_receive {:upstream_request, _body, _auth}
    end

    test "a deactivated agent gets the inactive-agent answer, not the upstream", %{agent: agent} do
      Application.put_env(:observatory, :llm_upstream, Upstream.answering("never").url)
      HTTP.key_for(agent)
      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice", reason: "test")

      resp = chat(agent, Upstream.request("hello"))
      assert resp.status == 403
      assert decode(resp)["error"]["code"] == "agent_inactive"
      refute_receive {:upstream_request, _, _}, 100
    end

    test "the kill switch trips on a repeated request through the mount", %{agent: agent} do
      Application.put_env(:observatory, :llm_upstream, Upstream.answering("same answer").url)
      HTTP.key_for(agent)

      {:ok, _} =
        KillSwitch.configure(agent, %{"enabled" => true, "window_size" => 3, "threshold" => 3.0})

      request = Upstream.request("deploy again", tool_calls: [{"deploy", %{"env" => "prod"}}])

      {statuses, _log} = with_log(fn -> for _ <- 1..6, do: chat(agent, request).status end)

      assert 403 in statuses
      refute KillSwitch.active?(agent)
    end

    test "a paused session is refused", %{agent: agent, n: n} do
      Application.put_env(:observatory, :llm_upstream, Upstream.answering("never").url)
      session = "sess-proxy-paused-#{n}"
      {:ok, _} = HITL.pause(session, operator: "alice", reason: "inspect")
      on_exit(fn -> HITL.paused?(session) && HITL.resume(session, operator: "test") end)

      resp = chat(agent, Upstream.request("hello"), [{"x-session-id", session}])
      assert resp.status == 403
      assert decode(resp)["error"]["code"] == "session_paused"
    end
  end

  describe "the kill switch holds for agents that post steps and check calls through the host's endpoint" do
    defp check_call(agent, session) do
      ConnAdapter.request(@agents, "POST", "/observatory/api/v1/tool_calls/check",
        headers: json(HTTP.agent_headers(agent)),
        body: JSON.encode!(%{session_id: session, tool: "deploy", arguments: %{env: "prod"}})
      )
    end

    defp step(agent, session) do
      HTTP.envelope(%{"meta" => %{"agent_id" => agent, "session_id" => session}})
    end

    test "tripped by the mounted proxy: the agent's next step is kept and told to stop, its calls denied",
         %{agent: agent, n: n} do
      Application.put_env(:observatory, :llm_upstream, Upstream.answering("same answer").url)
      HTTP.key_for(agent)
      session = "sess-ks-steps-#{n}"

      {:ok, _} =
        KillSwitch.configure(agent, %{"enabled" => true, "window_size" => 3, "threshold" => 3.0})

      before = post_step(agent, step(agent, session))
      assert before.status == 200 and decode(before)["directives"] == []
      assert %{"decision" => "allow"} = decode(check_call(agent, session))

      request = Upstream.request("deploy again", tool_calls: [{"deploy", %{"env" => "prod"}}])
      with_log(fn -> for _ <- 1..6, do: chat(agent, request) end)
      refute KillSwitch.active?(agent)

      stopped = post_step(agent, step(agent, session))
      assert stopped.status == 200
      assert [%{"type" => "stop", "code" => "agent_inactive"}] = decode(stopped)["directives"]
      # Kept, as a paused session's steps are: the operator sees what it still did.
      assert decode(stopped)["accepted"] == true
      assert Observatory.Gateway.SessionLog.count(session) == 2

      denied = decode(check_call(agent, session))
      assert denied["decision"] == "deny" and denied["code"] == "agent_inactive"
      refute Map.has_key?(denied, "retry_after_ms")
    end

    test "deactivated by an operator: the same; activated again, no stop and calls allowed", %{
      agent: agent,
      n: n
    } do
      HTTP.key_for(agent)
      session = "sess-ks-manual-#{n}"
      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice", reason: "maintenance")

      assert [%{"type" => "stop"}] = decode(post_step(agent, step(agent, session)))["directives"]
      assert decode(check_call(agent, session))["decision"] == "deny"

      {:ok, _} = KillSwitch.activate(agent, operator: "alice")

      assert decode(post_step(agent, step(agent, session)))["directives"] == []
      # The denied checks were not counted: the first allowed one counts 1.
      assert %{"decision" => "allow", "count" => 1} = decode(check_call(agent, session))
    end

    test "a step sent again after the deactivation is answered with the agent's state now", %{
      agent: agent,
      n: n
    } do
      HTTP.key_for(agent)
      envelope = step(agent, "sess-ks-replay-#{n}")
      assert decode(post_step(agent, envelope))["directives"] == []

      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice", reason: "maintenance")

      replayed = decode(post_step(agent, envelope))
      assert replayed["replayed"] == true
      assert [%{"type" => "stop"}] = replayed["directives"]
    end
  end

  describe "streams through the host's endpoint are chunked answers" do
    # An upstream that streams "Hel", then waits for :go (or for the proxy to hang up).
    defp held_stream do
      test = self()

      Upstream.start(fn _ ->
        {:chunked, 200, "text/event-stream",
         fn resp ->
           Upstream.write_chunk(resp, Upstream.chunk_event("Hel"))
           send(test, {:streaming, self()})
           hold(resp, test)
         end}
      end)
    end

    defp hold(resp, test) do
      receive do
        :go ->
          Upstream.write_chunk(resp, Upstream.chunk_event("lo"))
          Upstream.write_chunk(resp, "data: [DONE]\n\n")
      after
        50 ->
          case Upstream.write_chunk(resp, ": keep-alive\n\n") do
            :ok -> hold(resp, test)
            :closed -> send(test, :upstream_hung_up)
          end
      end
    end

    defp stream_async(agent, opts \\ []) do
      body = JSON.encode!(Map.put(Upstream.request("stream #{agent}"), :stream, true))

      defaults = [headers: json(HTTP.agent_headers(agent)), body: body, notify: self()]
      opts = Keyword.merge(defaults, opts)
      Task.async(fn -> ConnAdapter.request(@proxy, "POST", "/llm/v1/chat/completions", opts) end)
    end

    defp events(body) do
      {events, _, _} = SSE.parse(SSE.new(), body)
      Enum.reject(events, &(&1.data == ""))
    end

    test "events go out as chunks as they arrive, then the stream ends", %{agent: agent} do
      Application.put_env(:observatory, :llm_upstream, held_stream().url)
      task = stream_async(agent)

      assert_receive {:chunk, first}, 5_000
      assert first =~ "Hel"
      assert_receive {:streaming, upstream}
      send(upstream, :go)

      resp = Task.await(task)
      assert resp.status == 200 and resp.chunked
      assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
      assert resp.headers["x-content-type-options"] == "nosniff"

      texts =
        for %{data: %{"choices" => [%{"delta" => d}]}} <- events(resp.body), do: d["content"]

      assert texts == ["Hel", "lo"]
    end

    test "a deactivation ends an open stream at once, with the API's error event", %{agent: agent} do
      Application.put_env(:observatory, :llm_upstream, held_stream().url)
      task = stream_async(agent)
      assert_receive {:chunk, _first}, 5_000

      {:ok, _} = KillSwitch.deactivate(agent, operator: "alice", reason: "runaway")

      resp = Task.await(task)
      assert %{data: %{"error" => %{"code" => "agent_inactive"}}} = List.last(events(resp.body))
      assert_receive :upstream_hung_up, 2_000
    end

    test "a client that stops taking chunks ends the request and the upstream call", %{
      agent: agent
    } do
      Application.put_env(:observatory, :llm_upstream, held_stream().url)
      task = stream_async(agent, chunks_taken: 1)
      # The next piece after the first chunk went out: the client no longer takes it.
      assert_receive {:chunk, _first}, 5_000
      assert_receive {:streaming, upstream}
      send(upstream, :go)

      resp = Task.await(task)
      assert resp.client_gone
      assert length(resp.chunks) == 1
    end
  end

  describe "with Observatory's storage off in this VM" do
    test "the mounted APIs answer 503 storage_off and touch nothing" do
      Observatory.Storage.put_mode({:off, "a test"})
      on_exit(fn -> Observatory.Storage.put_mode(:on) end)

      resp =
        ConnAdapter.request(@agents, "GET", "/observatory/api/v1/agents",
          headers: HTTP.operator_headers()
        )

      assert resp.status == 503

      assert decode(resp) == %{
               "error" => "storage_off",
               "message" => "Observatory does not run in this VM: a test"
             }

      assert %{status: 503} = ConnAdapter.request(@proxy, "GET", "/llm/v1/models")
    end
  end
end
