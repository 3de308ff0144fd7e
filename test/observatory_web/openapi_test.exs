defmodule ObservatoryWeb.OpenAPITest do
  # docs/openapi.json, the HTTP API's description, checked against the router (every
  # route served is described, every described route is served) and against real
  # answers of the running gateway (each answer's status is listed for its operation
  # and its body fits the schema given for it). Changes upstream settings: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.JSON
  alias Observatory.Test.{DashboardClient, HTTP, JSONSchema, Upstream}

  @spec_path Path.expand("../../docs/openapi.json", __DIR__)
  @external_resource @spec_path
  @methods ~w(get put post delete patch head options)

  setup_all do
    {:ok, spec} = @spec_path |> File.read!() |> JSON.decode()
    %{spec: spec}
  end

  defp operations(spec) do
    for {path, item} <- spec["paths"], {method, op} <- item, method in @methods do
      {String.upcase(method), path, op}
    end
  end

  # "/api/v1/agents/:id" (the router's) as "/api/v1/agents/{id}" (OpenAPI's).
  defp openapi_path(path), do: String.replace(path, ~r/:(\w+)/, "{\\1}")

  describe "the API description against the router" do
    test "every route the router serves is described, and every described operation is served",
         %{spec: spec} do
      served = MapSet.new(ObservatoryWeb.Router.routes(), fn {m, p} -> {m, openapi_path(p)} end)
      described = MapSet.new(operations(spec), fn {m, p, _} -> {m, p} end)

      assert MapSet.difference(served, described) == MapSet.new(),
             "served but not described in docs/openapi.json"

      assert MapSet.difference(described, served) == MapSet.new(),
             "described in docs/openapi.json but not served"

      assert MapSet.size(served) == length(ObservatoryWeb.Router.routes())
    end

    test "a described operation that is not a route fails the check (the check can fail)" do
      routes = MapSet.new(ObservatoryWeb.Router.routes(), fn {m, p} -> {m, openapi_path(p)} end)
      refute MapSet.member?(routes, {"GET", "/api/v1/agents/{id}/kill_switch"})
      assert MapSet.member?(routes, {"PUT", "/api/v1/agents/{id}/kill_switch"})
    end

    test "it is OpenAPI 3.1; every operation has a summary, its security and its answers; every $ref resolves",
         %{spec: spec} do
      assert spec["openapi"] =~ ~r/^3\.1\./

      for {method, path, op} <- operations(spec) do
        assert is_binary(op["summary"]), "#{method} #{path}: no summary"
        assert is_list(op["security"]), "#{method} #{path}: no security"
        assert map_size(op["responses"]) > 0, "#{method} #{path}: no responses"

        schemes = for requirement <- op["security"], {name, _} <- requirement, do: name
        assert schemes -- Map.keys(spec["components"]["securitySchemes"]) == []

        # Path parameters: each {name} in the path is declared.
        declared =
          for p <- op["parameters"] || [], p = resolve(spec, p), p["in"] == "path", do: p["name"]

        in_path = for [_, name] <- Regex.scan(~r/\{(\w+)\}/, path), do: name
        assert Enum.sort(declared) == Enum.sort(in_path), "#{method} #{path}: path parameters"
      end

      for ref <- refs(spec), do: assert(resolve(spec, %{"$ref" => ref}) != nil, "#{ref} resolves")
    end

    test "every example in the description fits its schema", %{spec: spec} do
      examples = examples(spec)
      assert length(examples) >= 10

      for {where, schema, example} <- examples do
        assert JSONSchema.errors(schema, example, spec) == [], "the example of #{where}"
      end
    end
  end

  describe "the API description against real answers" do
    setup do
      keys = [:llm_upstream, :anthropic_upstream, :kill_switch]
      saved = for key <- keys, do: {key, Application.get_env(:observatory, key)}

      on_exit(fn ->
        for {key, value} <- saved, do: Application.put_env(:observatory, key, value)
      end)

      upstream = Upstream.start(&upstream/3)
      Application.put_env(:observatory, :llm_upstream, upstream.url)
      Application.put_env(:observatory, :anthropic_upstream, "http://127.0.0.1:#{upstream.port}")
      Process.put(:exercised, MapSet.new())
      %{upstream: upstream}
    end

    test "every operation answers as described: statuses listed, bodies fit their schemas",
         %{spec: spec, upstream: upstream} do
      n = System.unique_integer([:positive])
      agent = "agent-openapi-#{n}"
      session = "sess-openapi-#{n}"
      capture_log(fn -> exercise(spec, agent, session, upstream) end)

      missing =
        for {method, path, _} <- operations(spec),
            not MapSet.member?(Process.get(:exercised), {method, path}),
            do: "#{method} #{path}"

      assert missing == [], "operations never exercised: #{inspect(missing)}"
    end

    test "an answer that does not fit its schema is caught (the check can fail)", %{spec: spec} do
      op = spec["paths"]["/api/v1/agents"]["get"]
      schema = op["responses"]["200"]["content"]["application/json"]["schema"]
      assert JSONSchema.errors(schema, %{"agents" => []}, spec) == []
      assert [_ | _] = JSONSchema.errors(schema, %{"agents" => [%{"agent_id" => 7}]}, spec)
      assert [_ | _] = JSONSchema.errors(schema, %{}, spec)
    end
  end

  defp exercise(spec, agent, session, upstream) do
    op = [{"authorization", "Bearer " <> HTTP.operator_token()}]
    enc = &URI.encode(&1, fn c -> URI.char_unreserved?(c) end)
    a = "/api/v1/agents/#{enc.(agent)}"

    # Operations and health.
    call(spec, :get, "/healthz", [], nil, 200)
    call(spec, :get, "/metrics", [], nil, 200)
    call(spec, :get, "/api/v1/agents", [], nil, 401)

    # Agents: register with a key, then every action on it.
    %{body: %{"key" => key}} = call(spec, :post, a <> "/keys", op, "", 201)
    ag = [{"authorization", "Bearer " <> key}]
    call(spec, :get, "/api/v1/agents", op, nil, 200)
    call(spec, :get, a, op, nil, 200)
    call(spec, :get, "/api/v1/agents/nobody-#{agent}", op, nil, 404)
    call(spec, :get, a <> "/keys", op, nil, 200)
    call(spec, :put, a <> "/kill_switch", op, %{enabled: true, window_size: 5, threshold: 8}, 200)
    call(spec, :put, a <> "/kill_switch", op, %{window_size: 1}, 422)
    call(spec, :put, a <> "/guidance", op, %{enabled: true}, 200)
    call(spec, :put, a <> "/guidance", op, %{enabled: "yes"}, 422)
    call(spec, :put, a <> "/budget", op, %{session_tokens: 1_000_000}, 200)
    call(spec, :get, a <> "/budget", op, nil, 200)
    call(spec, :post, a <> "/budget/reset", op, "", 200)

    # Steps and sessions.
    step = fn id, status ->
      %{
        meta: %{
          step_id: id,
          session_id: session,
          agent_id: agent,
          timestamp: "2026-02-22T10:30:00Z"
        },
        cognition: %{intent: "search", entropy_score: 0.9},
        action: %{
          tool_call: "read_file",
          tool_input: %{path: "a.txt"},
          status: status,
          result: "no such file"
        }
      }
    end

    call(spec, :post, "/api/v1/decision_logs", ag, step.("s1", "failure"), 200)
    call(spec, :post, "/api/v1/decision_logs", ag, step.("s1", "failure"), 200)
    call(spec, :post, "/api/v1/decision_logs", ag, step.("s1", "success"), 409)
    call(spec, :post, "/api/v1/decision_logs", ag, %{meta: %{}}, 422)
    call(spec, :post, "/api/v1/decision_logs", ag, "{not json", 400)

    ndjson = Enum.map_join(2..3, "\n", &JSON.encode!(step.("s#{&1}", "failure")))

    call(spec, :post, "/api/v1/decision_logs", ag, {"application/x-ndjson", ndjson}, 200)
    call(spec, :post, "/api/v1/decision_logs", ag, {"text/plain", "x"}, 415)

    check = %{session_id: session, tool: "read_file", arguments: %{path: "a.txt"}}
    call(spec, :post, "/api/v1/tool_calls/check", ag, check, 200)
    call(spec, :post, "/api/v1/tool_calls/check", ag, %{tool: "x"}, 422)

    s = "/api/v1/sessions/#{session}"
    call(spec, :get, "/api/v1/sessions", op, nil, 200)
    call(spec, :get, "/api/v1/sessions?state=nope", op, nil, 400)
    call(spec, :get, s, op, nil, 200)
    call(spec, :get, s, ag, nil, 200)
    call(spec, :get, "/api/v1/sessions/none-#{session}", op, nil, 404)
    call(spec, :get, s <> "/steps/1", op, nil, 200)
    call(spec, :get, s <> "/steps/999", op, nil, 404)
    call(spec, :post, s <> "/pause", op, %{reason: "looping"}, 200)
    call(spec, :post, s <> "/pause", op, "", 409)
    call(spec, :post, "/api/v1/decision_logs", ag, step.("s4", "failure"), 200)
    call(spec, :post, s <> "/resume", op, "", 200)
    call(spec, :post, s <> "/resume", op, "", 409)
    call(spec, :get, "/api/v1/hitl/audit?session_id=#{session}", op, nil, 200)
    call(spec, :post, "/api/v1/sessions/none-#{session}/step_detector/reset", op, "", 404)

    # A step-detector block, lifted.
    for i <- 5..7,
        do: call(spec, :post, "/api/v1/decision_logs", ag, step.("s#{i}", "failure"), 200)

    call(spec, :post, s <> "/step_detector/reset", op, "", 200)

    # The LLM proxy (a stub upstream on loopback).
    chat = %{model: "test-model", messages: [%{role: "user", content: "hi"}]}
    pheaders = ag ++ [{"x-session-id", "proxy-" <> session}]
    call(spec, :post, "/v1/chat/completions", pheaders, chat, 200)
    call(spec, :post, "/v1/chat/completions", [], chat, 401)
    call(spec, :post, "/v1/responses", pheaders, %{model: "test-model", input: "hi"}, 200)
    messages = %{model: "test-model", max_tokens: 16, messages: [%{role: "user", content: "hi"}]}
    call(spec, :post, "/v1/messages", pheaders, messages, 200)
    call(spec, :post, "/v1/messages", [{"x-api-key", "wrong"}], messages, 401)
    call(spec, :post, "/v1/messages/count_tokens", pheaders, messages, 200)
    call(spec, :get, "/v1/models", ag, nil, 200)
    call(spec, :get, "/v1/models/test-model", ag, nil, 200)
    call(spec, :get, "/v1/models", [{"anthropic-version", "2023-06-01"} | ag], nil, 200)

    # Activation and deactivation (the proxy then refuses the agent).
    call(spec, :post, a <> "/deactivate", op, %{reason: "docs"}, 200)
    call(spec, :post, a <> "/deactivate", op, "", 409)
    call(spec, :post, "/v1/chat/completions", pheaders, chat, 403)
    call(spec, :post, "/v1/messages", pheaders, messages, 403)
    call(spec, :post, a <> "/activate", op, "", 200)
    call(spec, :post, a <> "/activate", op, "", 409)

    # Notification sinks (a webhook receiver on loopback).
    sink = "/api/v1/notifications/sinks/openapi-#{System.unique_integer([:positive])}"
    call(spec, :put, sink, op, %{type: "webhook", url: upstream.url <> "/hook"}, 200)
    call(spec, :put, sink, op, %{type: "fax"}, 422)
    call(spec, :get, "/api/v1/notifications/sinks", op, nil, 200)
    call(spec, :post, sink <> "/test", op, "", 200)
    call(spec, :delete, sink, op, nil, 200)
    call(spec, :delete, sink, op, nil, 404)
    call(spec, :post, sink <> "/test", op, "", 404)

    # Keys: rotate, revoke; then the agent goes.
    %{body: %{"key_id" => key_id}} = call(spec, :post, a <> "/keys/rotate", op, "", 201)
    call(spec, :delete, a <> "/keys/#{key_id}", op, nil, 200)
    call(spec, :delete, a <> "/keys/#{key_id}", op, nil, 404)
    call(spec, :delete, a, op, nil, 200)
    call(spec, :delete, a, op, nil, 404)

    dashboard(spec, agent)
  end

  defp dashboard(spec, agent) do
    call(spec, :get, "/", [], nil, 303)
    form = call(spec, :get, "/login", [], nil, 200)
    login_cookie = DashboardClient.cookie(form, "observatory_login_csrf")
    "observatory_login_csrf=" <> csrf = login_cookie
    fields = %{"_csrf_token" => csrf, "token" => HTTP.operator_token()}
    login = [{"cookie", login_cookie}]
    call(spec, :post, "/login", login, {:form, %{fields | "_csrf_token" => "x"}}, 403)
    signed_in = call(spec, :post, "/login", login, {:form, fields}, 303)
    cookie = DashboardClient.cookie(signed_in, "observatory_session")
    me = [{"cookie", cookie}]

    page = call(spec, :get, "/", me, nil, 200)
    [_, page_csrf] = Regex.run(~r/<meta name="csrf-token" content="([^"]+)">/, page.body)
    call(spec, :get, "/agents", me, nil, 200)
    call(spec, :get, "/agents/#{agent}", me, nil, 404)
    call(spec, :get, "/assets/dashboard.js", [], nil, 200)
    call(spec, :get, "/assets/nope.js", [], nil, 404)
    call(spec, :get, "/dashboard/events", [], nil, 401)

    # The event stream: its head, then an event for its page.
    stream = DashboardClient.open_stream(cookie)
    [status_line | _] = String.split(stream.head, "\r\n")
    [_, status] = Regex.run(~r/^HTTP\/1\.1 (\d+)/, status_line)
    [_, type] = Regex.run(~r/content-type: ([^;\r]+)/i, stream.head)
    record(spec, "GET", "/dashboard/events", String.to_integer(status), type, nil)

    {{:event, "mount", %{"page_id" => page_id}}, _} =
      DashboardClient.await_event(stream, &match?({:event, "mount", _}, &1))

    event = %{page_id: page_id, event: "pause_inspect", params: %{session_id: "sess-x"}}
    call(spec, :post, "/dashboard/events", me ++ [{"x-csrf-token", page_csrf}], event, 204)
    call(spec, :post, "/dashboard/events", me, event, 403)
    DashboardClient.close_stream(stream)

    call(spec, :post, "/logout", me, {:form, %{"_csrf_token" => page_csrf}}, 303)
  end

  # A request, its answer checked against the description; `expected` is the status
  # the scenario means to reach (so that every listed answer is really seen).
  defp call(spec, method, path, headers, body, expected) do
    {type, payload} =
      case body do
        nil -> {nil, nil}
        {:form, fields} -> {"application/x-www-form-urlencoded", URI.encode_query(fields)}
        {type, text} when is_binary(type) -> {type, text}
        text when is_binary(text) -> {"application/json", text}
        term -> {"application/json", JSON.encode!(term)}
      end

    resp = request(method, path, headers, type, payload)
    assert resp.status == expected, "#{method} #{path}: #{resp.status} #{inspect(resp.body)}"

    content_type =
      (DashboardClient.header(resp, "content-type") || "") |> String.split(";") |> hd()

    decoded =
      if content_type == "application/json" do
        {:ok, term} = JSON.decode(resp.body)
        term
      end

    record(spec, String.upcase(to_string(method)), path, resp.status, content_type, decoded)
    %{resp | body: decoded || resp.body}
  end

  # Checks one answer against the description and notes the operation as exercised.
  defp record(spec, method, path, status, content_type, decoded) do
    path = path |> String.split("?") |> hd()

    {template, op} =
      Enum.find_value(spec["paths"], fn {template, item} ->
        if matches?(template, path) and item[String.downcase(method)],
          do: {template, item[String.downcase(method)]}
      end) || flunk("#{method} #{path} is not described")

    # `default`: the proxy's pass-through of whatever the upstream answered.
    response =
      resolve(spec, op["responses"][Integer.to_string(status)] || op["responses"]["default"]) ||
        flunk("#{method} #{template}: answered #{status}, which is not described")

    if content = response["content"] do
      assert Map.has_key?(content, content_type),
             "#{method} #{template} #{status}: #{content_type} is not described"

      if decoded != nil do
        schema = content[content_type]["schema"]
        errors = JSONSchema.errors(schema, decoded, spec)
        assert errors == [], "#{method} #{template} #{status}: #{inspect(errors)}"
      end
    end

    Process.put(:exercised, MapSet.put(Process.get(:exercised), {method, template}))
  end

  defp matches?(template, path) do
    t = String.split(template, "/", trim: true)
    p = String.split(path, "/", trim: true)

    length(t) == length(p) and
      Enum.all?(Enum.zip(t, p), fn {a, b} -> a == b or String.starts_with?(a, "{") end)
  end

  defp request(method, path, headers, type, body) do
    url = String.to_charlist(HTTP.url(path))
    headers = for {k, v} <- headers, do: {String.to_charlist(k), String.to_charlist(v)}

    req =
      if type == nil,
        do: {url, headers},
        else: {url, headers, String.to_charlist(type), body}

    {:ok, {{_, status, _}, resp_headers, resp_body}} =
      :httpc.request(method, req, [timeout: 10_000, autoredirect: false], body_format: :binary)

    # Headers as a list (Set-Cookie may repeat), as DashboardClient.cookie/2 reads them.
    %{
      status: status,
      headers: for({k, v} <- resp_headers, do: {to_string(k), to_string(v)}),
      body: resp_body
    }
  end

  # The stub upstream: a chat completion, a response, a message, a token count, models.
  defp upstream(_body, _headers, %{path: path}) do
    json = fn term -> {200, "application/json", JSON.encode!(term)} end

    cond do
      path =~ "/chat/completions" -> {200, "application/json", Upstream.completion("hello")}
      path =~ "/responses" -> {200, "application/json", Upstream.response("hello")}
      path =~ "/count_tokens" -> json.(%{input_tokens: 3})
      path =~ "/messages" -> {200, "application/json", Upstream.message("hello")}
      path =~ "/models/" -> json.(%{id: "test-model", object: "model"})
      path =~ "/models" -> json.(%{object: "list", data: [%{id: "test-model"}]})
      true -> json.(%{ok: true})
    end
  end

  defp resolve(_spec, nil), do: nil
  defp resolve(spec, %{"$ref" => "#/" <> pointer}), do: get_in(spec, String.split(pointer, "/"))
  defp resolve(_spec, other), do: other

  defp refs(term) when is_map(term) do
    Enum.flat_map(term, fn
      {"$ref", ref} -> [ref]
      {_k, v} -> refs(v)
    end)
  end

  defp refs(list) when is_list(list), do: Enum.flat_map(list, &refs/1)
  defp refs(_), do: []

  # {where, schema, example} for every media type that carries both.
  defp examples(spec) do
    for {method, path, op} <- operations(spec),
        {where, holder} <-
          [{"request", op["requestBody"]}] ++
            for({status, r} <- op["responses"], do: {status, resolve(spec, r)}),
        holder != nil,
        {type, media} <- holder["content"] || %{},
        Map.has_key?(media, "example") do
      {"#{method} #{path} #{where} #{type}", media["schema"], media["example"]}
    end ++
      for {name, r} <- spec["components"]["responses"],
          {type, media} <- r["content"] || %{},
          Map.has_key?(media, "example") do
        {"components.responses.#{name} #{type}", media["schema"], media["example"]}
      end
  end
end
