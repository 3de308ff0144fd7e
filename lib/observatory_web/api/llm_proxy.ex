defmodule ObservatoryWeb.API.LLMProxy do
  @moduledoc """
  The request path shared by the LLM proxy's APIs — Chat Completions
  (`ObservatoryWeb.API.ChatCompletions`), the Responses API
  (`ObservatoryWeb.API.Responses`) and Anthropic Messages
  (`ObservatoryWeb.API.Messages`). Each API is a *dialect* (this module's behaviour):
  how its bodies are fingerprinted, how its errors look, how its streams carry text.

  For each request, in order:

    1. the agent is the agent key's (`ObservatoryWeb.Auth.proxy_agent/1`, shared by
       every API; `X-Agent-Id` is optional and must name that agent); an inactive
       agent is answered before its body is read;
    2. the body (`application/json`, at most `:llm_max_request_bytes`, default
       32 MiB — proxied conversations are far larger than the API's other bodies) is
       fingerprinted for the kill switch;
    3. the session is `X-Session-Id`, else derived from the conversation
       (`Observatory.Proxy.SessionId`); the tool calls of the agent's previous turn
       and their results become steps (`Observatory.Proxy.Steps`) — before the
       checks below, so a refused request still records what the agent did; an
       `X-Session-Id` naming a session the gateway has recorded for another agent is
       refused (`403`);
    4. a paused session is refused (`403 session_paused`), and so is a session the
       step detector has blocked (`403 session_blocked`, with its guidance);
    5. the agent's budget (`Observatory.Budget`) admits the request or, past a limit
       in `enforce` mode, refuses it (`429 budget_exhausted`, with `x-should-retry:
       false` so that the SDKs do not retry it);
    6. the kill switch admits or refuses the request; an admitted request is counted
       against the budget;
    7. the body that goes upstream is the agent's, with at most two edits that keep
       every other byte (`Observatory.Proxy.BodyEdit`): a guidance note appended to
       the newest tool result when the steps just recorded show a loop
       (`Observatory.Proxy.Guidance`), and, for a streamed chat completion,
       `stream_options.include_usage` (the usage chunk it adds is not passed on
       unless the agent asked for it). Everything above read the agent's own body;
    8. the request goes upstream holding one of the `:llm_max_concurrent` slots
       (none free: `503`), the answer comes back — streamed as it arrives when the
       agent asked for `"stream": true` — its text is fingerprinted into the
       agent's kill-switch window, and its `usage` is counted against the budget.

  Every answer names its session in `X-Observatory-Session-Id` once it is known, and
  carries the upstream's own headers (`retry-after`, `x-request-id`,
  `x-ratelimit-*` …; see `upstream_headers/1`), error or not.

  While the upstream works, the request is registered in
  `Observatory.Proxy.OpenRequests`: a deactivation, a revoked key or a pause ends it
  at once — before its answer with the refusal the next request would get, during a
  stream with an error event in the API's shape. A stream ends, the same way, after
  `:llm_max_stream_ms`.
  """

  require Logger

  alias Observatory.{Budget, JSON, KillSwitch, Metrics}
  alias Observatory.Budget.Usage
  alias Observatory.KillSwitch.{Agents, Upstream}
  alias Observatory.Gateway.{AlertSource, HITL, StepDetector}
  alias Observatory.Proxy.{BodyEdit, Guidance, HTTPClient, OpenRequests, SSE, SessionId, Steps}
  alias ObservatoryWeb.{Auth, Conn}

  @session_header "X-Observatory-Session-Id"

  @doc "Which upstream (see `Observatory.KillSwitch.Upstream.url/1`)."
  @callback api() :: Upstream.api()
  @doc "How the conversation is read for steps (`Observatory.Proxy.Steps.record/4`)."
  @callback format() :: :openai | :anthropic | :responses
  @doc "An error body in the API's shape, from the status, OpenAI-style type and code, message."
  @callback error_body(pos_integer(), String.t(), String.t(), String.t()) :: map()
  @doc "The answer to an inactive agent."
  @callback inactive_body(String.t()) :: map()
  @callback fingerprint_request(binary()) :: {:ok, KillSwitch.fingerprint()} | {:error, term()}
  @doc "The fingerprint of a whole (not streamed) 2xx answer; an error when it is not the API's answer."
  @callback fingerprint_response(binary()) :: {:ok, non_neg_integer() | nil} | {:error, term()}
  @doc "The text a decoded stream event adds to the answer, or nil."
  @callback stream_text(SSE.event()) :: String.t() | nil
  @doc "An error event to end a stream with (status, OpenAI-style type and code, message)."
  @callback stream_error(pos_integer(), String.t(), String.t(), String.t()) :: iodata()
  @doc """
  The usage a decoded stream event reports — `{model | nil, usage}`, `usage` the
  API's own object (`Observatory.Budget.Usage.read/2`) — or nil.
  """
  @callback stream_usage(SSE.event()) :: {String.t() | nil, map()} | nil
  @doc "Request headers passed on to the upstream."
  @callback forward_headers(Conn.t()) :: [{String.t(), String.t()}]

  @doc "Handles one proxied request with `dialect`."
  @spec handle(Conn.t(), module()) :: :ok | :halt
  def handle(conn, dialect) do
    Metrics.inc(:proxy_requests)
    ctx = new_ctx(conn, dialect)

    with {:ok, agent_id} <- check(ctx, Auth.proxy_agent(conn)),
         ctx = %{ctx | agent_id: agent_id},
         :ok <- still_active(ctx),
         :ok <- json_content(ctx),
         {:forward, ctx, verdict, request, body} <- holding_body(ctx, &admitted/1) do
      forward(ctx, verdict, request, body)
    end
  end

  # `agent`: the agent's record once read; `model`: the request's; `strip_usage`: the
  # proxy asked a stream for its usage, which the agent did not ask for.
  defp new_ctx(conn, dialect) do
    %{
      conn: conn,
      dialect: dialect,
      agent_id: nil,
      session_id: nil,
      upstream: [],
      agent: nil,
      model: nil,
      strip_usage: false
    }
  end

  # Steps 2 to 7: the body read, fingerprinted, decoded, its steps recorded, the
  # request admitted or refused, and the body that goes upstream.
  defp admitted(ctx) do
    with {:ok, body} <- body(ctx),
         {:ok, request} <- fingerprint(ctx, body),
         {:ok, decoded} <- decode(ctx, body),
         {:ok, session_id} <- session_id(ctx, decoded),
         ctx = %{ctx | session_id: session_id, model: string(decoded["model"])},
         steps = Steps.take(ctx.dialect.format(), ctx.agent_id, session_id, decoded),
         :ok <- loop_began(ctx, steps.results),
         :ok <- not_paused(ctx),
         :ok <- not_blocked(ctx),
         {:ok, ctx} <- within_budget(ctx),
         {:ok, verdict} <- admit(ctx, request) do
      if ctx.agent, do: Budget.count_request(ctx.agent, session_id)
      {ctx, body} = upstream_body(ctx, body, steps, verdict)
      {:forward, ctx, verdict, request, body}
    end
  end

  # A step of this request raised the session's loop alarm: what the session spent
  # from here on is "since the loop began" (alarms raised elsewhere are marked by
  # Observatory.Budget.Server).
  defp loop_began(ctx, results) do
    source = AlertSource.current()
    if Enum.any?(results, &AlertSource.alert?(&1, source)), do: Budget.loop_began(ctx.session_id)
    :ok
  end

  defp string(value) when is_binary(value), do: value
  defp string(_), do: nil

  # The agent's own body, read by everything above, with the proxy's edits for the
  # upstream: the usage of a streamed chat completion asked for, a guidance note.
  defp upstream_body(%{agent: nil} = ctx, body, _steps, _verdict), do: {ctx, body}

  defp upstream_body(ctx, body, steps, verdict) do
    {ctx, body} =
      with :chat_completions <- ctx.dialect.api(),
           true <- Budget.stream_usage?(),
           {:ok, edited} <- BodyEdit.ensure_stream_usage(body) do
        {%{ctx | strip_usage: true}, edited}
      else
        _ -> {ctx, body}
      end

    request = %{agent: ctx.agent, session_id: ctx.session_id}

    {body, _note} =
      Guidance.apply(body, ctx.dialect.api(), request, Guidance.note(steps.results, verdict))

    {ctx, body}
  end

  @doc """
  Passes a request the SDKs make beside the model calls (`GET /v1/models`, `POST
  /v1/messages/count_tokens`) to `api`'s upstream: the agent authenticated and active
  as for a model call, the body (if any) and the query as they are, the answer's
  status, body and headers (`upstream_headers/1`) back, errors in `dialect`'s shape.
  Nothing is fingerprinted and no step is recorded. Options: `:method` (`"GET"` or
  `"POST"`), `:path` (appended to the upstream URL).
  """
  @spec pass(Conn.t(), module(), Upstream.api(), keyword()) :: :ok | :halt
  def pass(conn, dialect, api, opts) do
    Metrics.inc(:proxy_requests)
    ctx = new_ctx(conn, dialect)

    with {:ok, agent_id} <- check(ctx, Auth.proxy_agent(conn)),
         ctx = %{ctx | agent_id: agent_id},
         :ok <- still_active(ctx) do
      if Keyword.fetch!(opts, :method) == "GET" do
        pass_upstream(ctx, api, opts, "")
      else
        with :ok <- json_content(ctx) do
          holding_body(ctx, fn ctx ->
            with {:ok, body} <- body(ctx), do: pass_upstream(ctx, api, opts, body)
          end)
        end
      end
    end
  end

  defp pass_upstream(ctx, api, opts, body) do
    path = Keyword.get(opts, :path, "") <> query(ctx.conn)
    upstream_opts = [method: Keyword.fetch!(opts, :method), path: path]

    result =
      Upstream.with_slot(fn ->
        with {:ok, status, headers, upstream} <-
               Upstream.open(api, body, ctx.dialect.forward_headers(ctx.conn), upstream_opts) do
          try do
            case HTTPClient.read_all(upstream) do
              {:ok, answer, _} -> {:ok, status, headers, answer}
              {:error, :deadline} -> {:error, :timeout}
              error -> error
            end
          after
            HTTPClient.close(upstream)
          end
        end
      end)

    case result do
      {:ok, status, headers, answer} ->
        ctx = %{ctx | upstream: upstream_headers(headers)}
        type = content_type(headers) || "application/json"
        Conn.send_resp(ctx.conn, status, type, answer, answer_headers(ctx))

      {:error, :busy} ->
        busy(ctx)

      {:error, reason} ->
        upstream_error(ctx, Upstream.describe(api, reason))
    end
  end

  # The query string as the agent sent it (`?limit=20`), for the upstream.
  defp query(%Conn{query_string: ""}), do: ""
  defp query(%Conn{query_string: query}), do: "?" <> query

  # The body's bytes count against the gateway's budget of request bytes in flight
  # (its Content-Length, or the cap when it is chunked) while it is read, decoded and
  # taken apart — the part of a request that holds several copies of it — not while
  # the upstream answers (a stream may last many minutes).
  defp holding_body(ctx, fun) do
    bytes =
      with value when is_binary(value) <- Conn.header(ctx.conn, "content-length"),
           n when is_integer(n) <- Conn.parse_content_length(value) do
        min(n, max_request_bytes())
      else
        _chunked -> max_request_bytes()
      end

    case Upstream.with_request_bytes(bytes, fn -> fun.(ctx) end) do
      {:error, :busy} ->
        Conn.discard_body(ctx.conn, max_request_bytes())
        busy(ctx, :request_bytes)

      result ->
        result
    end
  end

  @doc """
  `:llm_max_request_bytes`, default 32 MiB: a proxied request body's cap (a long
  conversation with large tool results is far larger than the API's other bodies,
  which `:max_body_bytes` caps).
  """
  @spec max_request_bytes() :: pos_integer()
  def max_request_bytes,
    do: Application.get_env(:observatory, :llm_max_request_bytes, 32 * 1024 * 1024)

  ## Checks

  defp check(_ctx, {:ok, value}), do: {:ok, value}

  defp check(ctx, {:error, {status, type, code, message}}),
    do: error(ctx, status, type, code, message)

  # Answer an inactive agent before reading its body.
  defp still_active(ctx) do
    if KillSwitch.active?(ctx.agent_id), do: :ok, else: refuse(ctx, :inactive)
  end

  defp json_content(ctx) do
    case Conn.content_type(ctx.conn) do
      "application/json" ->
        :ok

      other ->
        error(
          ctx,
          415,
          "invalid_request_error",
          "unsupported_media_type",
          "send application/json, not #{inspect(other)}"
        )
    end
  end

  defp body(ctx) do
    max = max_request_bytes()

    case Conn.read_body(ctx.conn, max) do
      {:ok, body} ->
        {:ok, body}

      {:error, :too_large} ->
        error(
          ctx,
          413,
          "invalid_request_error",
          "body_too_large",
          "the body exceeds #{max} bytes (config :observatory, :llm_max_request_bytes)"
        )
    end
  end

  defp fingerprint(ctx, body) do
    case ctx.dialect.fingerprint_request(body) do
      {:ok, request} ->
        {:ok, request}

      {:error, {:invalid_json, message}} ->
        error(ctx, 400, "invalid_request_error", "invalid_json", message)

      {:error, :not_an_object} ->
        error(ctx, 400, "invalid_request_error", "invalid_body", "the body must be a JSON object")
    end
  end

  # The fingerprint has read the body already; this decoder also bounds nesting.
  defp decode(ctx, body) do
    case JSON.decode(body) do
      {:ok, decoded} when is_map(decoded) -> {:ok, decoded}
      {:error, message} -> error(ctx, 400, "invalid_request_error", "invalid_json", message)
    end
  end

  defp session_id(ctx, decoded) do
    case Conn.header(ctx.conn, "x-session-id") do
      nil ->
        {:ok, SessionId.derive(ctx.agent_id, decoded)}

      id ->
        if KillSwitch.valid_agent_id?(id),
          do: own_session(ctx, id),
          else:
            error(
              ctx,
              400,
              "invalid_request_error",
              "invalid_session_id",
              "X-Session-Id must be 1 to 256 bytes of UTF-8 without control characters"
            )
    end
  end

  # An agent acts only in its own sessions: no steps into, and no pause probing of,
  # another agent's session. Whose it is is asked of the session's owner; one that
  # does not answer is a 503, never a yes.
  defp own_session(ctx, id) do
    case Auth.session_access(ctx.agent_id, id) do
      :ok ->
        {:ok, id}

      {:error, :forbidden} ->
        error(ctx, 403, "forbidden", "forbidden", "X-Session-Id names a session of another agent")

      {:error, :owner_unavailable} ->
        error(
          ctx,
          503,
          "api_error",
          "owner_unavailable",
          "the session's owner in the gateway cluster did not answer in time; retry"
        )
    end
  end

  # Refused, not held: see docs/llm_proxy.md, "Steps from proxied traffic".
  defp not_paused(ctx) do
    case HITL.pause_of(ctx.session_id) do
      nil -> :ok
      pause -> refuse(ctx, {:paused, pause})
    end
  end

  # A block means "run no more code": the request that would run more is refused, the
  # way a pause refuses it, and the block's guidance is its message.
  defp not_blocked(ctx) do
    case StepDetector.block(ctx.session_id) do
      nil -> :ok
      block -> refuse(ctx, {:blocked, block[:guidance]})
    end
  end

  # The agent's budget; an unknown or inactive agent is left to the kill switch's check.
  defp within_budget(ctx) do
    case Agents.get(ctx.agent_id) do
      %{active: true} = agent ->
        ctx = %{ctx | agent: agent}

        case Budget.check(agent, ctx.session_id) do
          {:refuse, breaches} -> refuse(ctx, {:budget, breaches})
          _admitted -> {:ok, ctx}
        end

      _other ->
        {:ok, ctx}
    end
  end

  defp admit(ctx, request) do
    case KillSwitch.check_request(ctx.agent_id, request) do
      {:ok, verdict} ->
        {:ok, verdict}

      {:error, {:inactive, _agent}} ->
        refuse(ctx, :inactive)

      {:error, :invalid_agent_id} ->
        error(
          ctx,
          400,
          "invalid_request_error",
          "invalid_agent_id",
          "X-Agent-Id must be 1 to 256 bytes of UTF-8 without control characters"
        )

      {:error, :unknown_agent} ->
        error(
          ctx,
          403,
          "unknown_agent",
          "unknown_agent",
          "no such agent is registered; an operator registers it by issuing its key"
        )
    end
  end

  ## Refusals: why a request is not (or no longer) served

  @typep refusal ::
           :inactive
           | :revoked
           | {:paused, map()}
           | {:blocked, String.t() | nil}
           | {:budget, [Budget.breach()]}

  # `what` says what became of the request: refused before it went upstream ("the
  # request was not sent"), or its stream ended ("the answer was cut short").
  @spec refusal(map(), refusal(), String.t()) ::
          {pos_integer(), String.t(), String.t(), String.t()}
  defp refusal(ctx, :inactive, _what),
    do: {403, "agent_inactive", "agent_inactive", "Agent #{ctx.agent_id} is inactive"}

  defp refusal(ctx, {:paused, pause}, what) do
    reason = if pause[:reason] in [nil, ""], do: "", else: " (#{pause.reason})"

    {403, "session_paused", "session_paused",
     "session #{ctx.session_id} is paused by an operator#{reason}; " <>
       "#{what}; retry after the operator resumes it"}
  end

  defp refusal(ctx, {:blocked, guidance}, what) do
    {403, "session_blocked", "session_blocked",
     "session #{ctx.session_id} is blocked by the step detector" <>
       if(guidance, do: ": #{guidance}", else: ".") <>
       " #{String.capitalize(what)}; an operator lifts the block " <>
       "(POST /api/v1/sessions/:id/step_detector/reset)."}
  end

  defp refusal(ctx, {:budget, breaches}, _what),
    do:
      {429, "budget_exhausted", "budget_exhausted",
       Budget.refusal_message(breaches, ctx.agent_id, ctx.session_id)}

  defp refusal(_ctx, :revoked, what),
    do:
      {401, "invalid_request_error", "invalid_api_key",
       "the agent key is no longer valid; #{what}"}

  defp refuse(ctx, :inactive) do
    Metrics.inc(:proxy_inactive)
    send_json(ctx, 403, ctx.dialect.inactive_body(ctx.agent_id))
  end

  # A budget stop is final until an operator acts: `x-should-retry: false` keeps the
  # SDKs from retrying the 429.
  defp refuse(ctx, {:budget, _} = reason) do
    {status, type, code, message} = refusal(ctx, reason, "the request was not sent")
    body = ctx.dialect.error_body(status, type, code, message)

    Conn.send_resp(
      ctx.conn,
      status,
      "application/json",
      JSON.encode_lossy!(body),
      answer_headers(ctx) ++ [{"x-should-retry", "false"}]
    )

    :halt
  end

  defp refuse(ctx, reason) do
    case reason do
      {:paused, _} -> Metrics.inc(:proxy_paused)
      {:blocked, _} -> Metrics.inc(:proxy_blocked)
      _ -> :ok
    end

    {status, type, code, message} = refusal(ctx, reason, "the request was not sent")
    error(ctx, status, type, code, message)
  end

  ## Forwarding

  # The request is registered while the upstream works, so that it ends when its
  # agent, key or session stops being valid; checked once more after registering, so
  # a change since the checks above is not missed.
  defp forward(ctx, verdict, request, body) do
    case registration(ctx) do
      {:ok, entry} ->
        try do
          case OpenRequests.check(entry) do
            :ok -> forward(ctx, entry, verdict, request, body)
            {:error, reason} -> refuse(ctx, reason)
          end
        after
          OpenRequests.unregister(entry)
        end

      {:error, reason} ->
        refuse(ctx, reason)
    end
  end

  # The key is followed by its hash; an insecure shared key is not in the agent store,
  # so there is nothing to revoke. A key revoked since authentication is refused here.
  defp registration(ctx) do
    key = Auth.presented_key(ctx.conn)

    key_hash =
      case Auth.agent_for_key(key) do
        {:ok, :any_agent} -> {:ok, nil}
        {:ok, _agent} -> {:ok, Observatory.AgentKeys.hash(key)}
        {:error, :unauthorized} -> {:error, :revoked}
      end

    with {:ok, hash} <- key_hash do
      request = %{agent_id: ctx.agent_id, key_hash: hash, session_id: ctx.session_id}
      {:ok, OpenRequests.register(request)}
    end
  end

  defp forward(ctx, entry, verdict, request, body) do
    dialect = ctx.dialect
    watch = watch_client(ctx.conn)

    result =
      Upstream.with_slot(fn ->
        case Upstream.open(dialect.api(), body, dialect.forward_headers(ctx.conn),
               stream: request.stream,
               watch: watch,
               cancel: entry.ref
             ) do
          {:ok, status, headers, upstream} ->
            try do
              ctx = %{ctx | upstream: upstream_headers(headers)}
              answer(ctx, {verdict, watch}, request, {status, headers, upstream})
            after
              HTTPClient.close(upstream)
            end

          {:error, reason} ->
            {:error, reason}
        end
      end)

    unwatch_client(ctx.conn, watch)

    case result do
      :ok -> :ok
      :halt -> :halt
      {:error, :client_closed} -> client_gone(ctx)
      {:error, :busy} -> busy(ctx)
      {:error, {:cancelled, reason}} -> cancelled(ctx, reason)
      {:failed, reason, ctx} -> upstream_error(ctx, Upstream.describe(dialect.api(), reason))
      {:error, reason} -> upstream_error(ctx, Upstream.describe(dialect.api(), reason))
    end
  end

  defp cancelled(ctx, reason) do
    Metrics.inc(:proxy_cancelled)
    refuse(ctx, reason)
  end

  # The agent's socket is unwatched before the answer's last byte goes out: once it
  # has the answer, the agent may send its next request on the same connection.
  defp answer(ctx, {verdict, watch}, request, {status, headers, upstream}) do
    if request.stream and status in 200..299 and event_stream?(headers),
      do: stream(ctx, {verdict, watch}, status, upstream),
      else: whole(ctx, {verdict, watch}, status, content_type(headers), upstream)
  end

  defp whole(ctx, {verdict, watch}, status, type, upstream) do
    case HTTPClient.read_all(upstream) do
      {:ok, body, _upstream} ->
        unwatch_client(ctx.conn, watch)
        respond(ctx, verdict, status, type, body)

      {:error, reason} = error when reason == :client_closed or elem(reason, 0) == :cancelled ->
        error

      # The non-streamed deadline is the timeout's. A failure after the head keeps the
      # upstream's headers (a 503's retry-after).
      {:error, :deadline} ->
        {:failed, :timeout, ctx}

      {:error, reason} ->
        {:failed, reason, ctx}
    end
  end

  defp respond(ctx, verdict, status, type, body) when status in 200..299 do
    case ctx.dialect.fingerprint_response(body) do
      {:ok, hash} ->
        if verdict, do: KillSwitch.observe_response(ctx.agent_id, hash)
        meter(ctx, body)
        pass_through(ctx, verdict, status, type, body)

      {:error, {:invalid_json, _}} ->
        {:failed, {:bad_response, "HTTP #{status} with a body that is not JSON"}, ctx}

      {:error, :not_a_completion} ->
        {:failed,
         {:bad_response, "HTTP #{status} with JSON that is not #{answer_name(ctx.dialect)}"}, ctx}
    end
  end

  # An upstream error in JSON (a 400 for a bad model name, a 429 rate limit) is the
  # agent's to see, with its headers; anything else is a broken upstream.
  defp respond(ctx, verdict, status, type, body) do
    case JSON.decode(body) do
      {:ok, _} ->
        pass_through(ctx, verdict, status, type, body)

      {:error, _} ->
        {:failed, {:bad_response, "HTTP #{status} with a body that is not JSON"}, ctx}
    end
  end

  # A whole answer's tokens, from its top-level `model` and `usage` (nothing else of
  # it is decoded).
  defp meter(%{agent: nil}, _body), do: :ok

  defp meter(ctx, body) do
    case BodyEdit.top_level_fields(body, ["model", "usage"]) do
      {:ok, [model, usage]} ->
        Budget.record(
          ctx.agent,
          ctx.session_id,
          ctx.dialect.api(),
          string(model) || ctx.model,
          usage
        )

      :error ->
        :ok
    end
  end

  defp answer_name(dialect) do
    case dialect.api() do
      :messages -> "a message"
      :responses -> "a response"
      _ -> "a chat completion"
    end
  end

  defp pass_through(ctx, verdict, status, type, body) do
    Conn.send_resp(
      ctx.conn,
      status,
      type || "application/json",
      body,
      answer_headers(ctx, verdict)
    )
  end

  # What every answer carries: no caching, its session, the kill switch's score, and
  # the upstream's own headers.
  defp answer_headers(ctx, verdict \\ nil) do
    [{"Cache-Control", "no-store"}] ++
      if(ctx.session_id, do: [{@session_header, ctx.session_id}], else: []) ++
      if(verdict,
        do: [{"X-Observatory-Kill-Switch-Score", Float.to_string(verdict.score)}],
        else: []
      ) ++ ctx.upstream
  end

  # Not passed on: hop-by-hop headers and the ones naming them; the framing and the
  # headers this gateway sets itself; cookies (they would be set on the gateway's own
  # origin, which the dashboard shares); HTTP/3 and HSTS advertisements for the
  # upstream's host; and anything that holds a configured upstream key.
  @dropped ~w(connection keep-alive proxy-connection proxy-authenticate proxy-authorization
              te trailer transfer-encoding upgrade content-length content-type
              cache-control date server x-content-type-options x-frame-options
              referrer-policy x-accel-buffering set-cookie set-cookie2 alt-svc
              strict-transport-security)

  @doc """
  The upstream's answer headers passed on to the agent — `retry-after`,
  `retry-after-ms`, `x-request-id`, `request-id`, `x-ratelimit-*`,
  `anthropic-ratelimit-*`, `openai-processing-ms` and any other — except hop-by-hop
  ones (and those a `Connection` header names), framing, the headers the gateway
  sets itself, cookies, `alt-svc` and `strict-transport-security`, the gateway's own
  `x-observatory-*`, and any whose value holds a configured upstream key.
  """
  @spec upstream_headers([{String.t(), String.t()}]) :: [{String.t(), String.t()}]
  def upstream_headers(headers) do
    named =
      for {"connection", value} <- headers,
          token <- String.split(value, ","),
          do: token |> String.trim() |> String.downcase()

    keys = Upstream.configured_keys()

    for {name, value} <- headers,
        name not in @dropped,
        name not in named,
        not String.starts_with?(name, "x-observatory-"),
        not Enum.any?(keys, &String.contains?(value, &1)),
        do: {name, value}
  end

  ## Streaming: each piece goes to the agent as it arrives; the text is assembled
  ## for the response fingerprint at the end.

  defp stream(ctx, {verdict, watch}, status, upstream) do
    headers = [
      {"Content-Type", "text/event-stream; charset=utf-8"},
      {"X-Accel-Buffering", "no"} | answer_headers(ctx, verdict)
    ]

    resp = Conn.send_chunked(ctx.conn, status, headers)

    state = %{
      resp: resp,
      dialect: ctx.dialect,
      sse: SSE.new(Upstream.max_event_bytes()),
      text: [],
      strip_usage: ctx.strip_usage,
      model: nil,
      usage: nil
    }

    result = relay(upstream, state)
    # What the stream reported of its usage is counted however it ended.
    state = elem(result, tuple_size(result) - 1)

    if ctx.agent,
      do:
        Budget.record(
          ctx.agent,
          ctx.session_id,
          ctx.dialect.api(),
          state.model || ctx.model,
          state.usage
        )

    case result do
      {:ok, state} ->
        # Fingerprinted before the stream's end goes out: once the agent has it, its
        # next request may arrive and is scored against this answer.
        if verdict do
          text = IO.iodata_to_binary(state.text)

          KillSwitch.observe_response(
            ctx.agent_id,
            if(text != "", do: KillSwitch.fingerprint(text))
          )
        end

        unwatch_client(ctx.conn, watch)
        Conn.end_chunked(resp)
        :ok

      {:error, :client_closed, _state} ->
        {:error, :client_closed}

      {:error, reason, _state} ->
        # The status line is gone: end the stream with an error event the SDKs raise.
        {status, type, code, message} = stream_failure(ctx, reason)
        unwatch_client(ctx.conn, watch)
        _ = write(resp, ctx.dialect.stream_error(status, type, code, message))
        Conn.end_chunked(resp)
        :ok
    end
  end

  defp stream_failure(ctx, {:cancelled, reason}) do
    Metrics.inc(:proxy_cancelled)
    refusal(ctx, reason, "the answer was cut short")
  end

  defp stream_failure(ctx, reason) do
    reason = if reason == :deadline, do: :stream_deadline, else: reason
    message = Upstream.describe(ctx.dialect.api(), reason)
    Metrics.inc(:upstream_errors)
    Logger.warning("LLM proxy: #{message} (mid-stream)")
    {502, "upstream_error", "upstream_error", message}
  end

  # Passes on whole events only, so that an error event never lands in the middle of
  # one. Returns the state (its text and usage) with the outcome.
  defp relay(upstream, state) do
    case HTTPClient.read(upstream) do
      {:data, data, upstream} ->
        case SSE.parse(state.sse, data) do
          {events, complete, sse} ->
            state = meter_events(%{state | sse: sse}, events)

            case write_some(state.resp, strip_usage(state, events, complete)) do
              :ok ->
                texts = for event <- events, text = state.dialect.stream_text(event), do: text
                relay(upstream, %{state | text: [state.text | texts]})

              {:error, reason} ->
                {:error, reason, state}
            end

          {:error, reason} ->
            {:error, reason, state}
        end

      {:done, _upstream} ->
        case write_some(state.resp, SSE.rest(state.sse)) do
          :ok -> {:ok, state}
          {:error, reason} -> {:error, reason, state}
        end

      {:error, reason} ->
        {:error, reason, state}
    end
  end

  defp meter_events(state, events) do
    Enum.reduce(events, state, fn event, state ->
      case state.dialect.stream_usage(event) do
        nil ->
          state

        {model, usage} ->
          %{state | model: model || state.model, usage: Usage.merge(state.usage, usage)}
      end
    end)
  end

  # The chunk that only carries the usage (`"choices": []`), when the agent did not ask
  # for it: an agent that reads `chunk.choices[0]` would fail on it.
  defp strip_usage(%{strip_usage: true}, events, complete) do
    if Enum.any?(events, &usage_only?/1),
      do: SSE.reject(complete, &usage_only?/1),
      else: complete
  end

  defp strip_usage(_state, _events, complete), do: complete

  defp usage_only?(%{data: %{"choices" => [], "usage" => %{}}}), do: true
  defp usage_only?(_event), do: false

  defp write_some(_resp, ""), do: :ok
  defp write_some(resp, data), do: write(resp, data)

  defp write(resp, data) do
    case Conn.chunk(resp, data) do
      :ok -> :ok
      {:error, :closed} -> {:error, :client_closed}
    end
  end

  defp event_stream?(headers) do
    String.starts_with?(String.downcase(content_type(headers) || ""), "text/event-stream")
  end

  defp content_type(headers) do
    Enum.find_value(headers, fn {name, value} -> if name == "content-type", do: value end)
  end

  ## The agent's socket: watched while the upstream works, so a hang-up cancels it
  ## (where the server hands it out: Observatory's own; a host's endpoint does not)

  defp watch_client(conn) do
    case Conn.client_socket(conn) do
      nil ->
        nil

      socket ->
        :ok = :inet.setopts(socket, active: :once)
        socket
    end
  end

  defp unwatch_client(_conn, nil), do: :ok

  defp unwatch_client(conn, socket) do
    :inet.setopts(socket, active: false)

    receive do
      {:tcp, ^socket, _data} ->
        # Bytes of a next request were taken while watching: do not reuse the connection.
        Conn.close_after(conn)
    after
      0 -> :ok
    end
  end

  defp client_gone(ctx) do
    Metrics.inc(:proxy_client_gone)
    Conn.client_gone(ctx.conn)
    :halt
  end

  ## Answers

  defp busy(ctx, what \\ :calls) do
    Metrics.inc(:proxy_busy)

    {code, message} =
      case what do
        :calls ->
          {"upstream_busy",
           "#{Upstream.max_concurrent()} upstream requests are in flight " <>
             "(config :observatory, :llm_max_concurrent); retry shortly"}

        :request_bytes ->
          {"gateway_busy",
           "the gateway holds #{Upstream.max_request_bytes_in_flight()} bytes of request " <>
             "bodies already (config :observatory, :llm_max_request_bytes_in_flight); retry shortly"}
      end

    body = ctx.dialect.error_body(503, "server_error", code, message)

    Conn.send_resp(
      ctx.conn,
      503,
      "application/json",
      JSON.encode!(body),
      answer_headers(ctx) ++ [{"Retry-After", "1"}]
    )

    :halt
  end

  defp upstream_error(ctx, message) do
    Metrics.inc(:upstream_errors)
    Logger.warning("LLM proxy: #{message}")
    error(ctx, 502, "upstream_error", "upstream_error", message)
  end

  defp error(ctx, status, type, code, message),
    do: send_json(ctx, status, ctx.dialect.error_body(status, type, code, message))

  defp send_json(ctx, status, body) do
    Conn.send_resp(
      ctx.conn,
      status,
      "application/json",
      JSON.encode_lossy!(body),
      answer_headers(ctx)
    )

    :halt
  end
end
