defmodule ObservatoryWeb.API.LLMProxy do
  @moduledoc """
  The request path shared by the LLM proxy's APIs — Chat Completions
  (`ObservatoryWeb.API.ChatCompletions`) and Anthropic Messages
  (`ObservatoryWeb.API.Messages`). Each API is a *dialect* (this module's behaviour):
  how its bodies are fingerprinted, how its errors look, how its streams carry text.

  For each request, in order:

    1. the agent is the agent key's (`ObservatoryWeb.Auth.proxy_agent/1`, shared by
       both APIs; `X-Agent-Id` is optional and must name that agent); an inactive
       agent is answered before its body is read;
    2. the body (`application/json`, at most `:max_body_bytes`) is fingerprinted for
       the kill switch;
    3. the tool calls of the agent's previous turn and their results become steps
       (`Observatory.Proxy.Steps`) — before the pause and kill-switch checks, so a
       refused request still records what the agent did; an `X-Session-Id` naming a
       session the gateway has recorded for another agent is refused (`403`);
    4. a paused session is refused (`403`, the API's error shape);
    5. the kill switch admits or refuses the request;
    6. the request goes upstream holding one of the `:llm_max_concurrent` slots
       (none free: `503`), the answer comes back — streamed as it arrives when the
       agent asked for `"stream": true` — and its text is fingerprinted into the
       agent's kill-switch window.
  """

  require Logger

  alias Observatory.{JSON, KillSwitch, Metrics}
  alias Observatory.KillSwitch.Upstream
  alias Observatory.Gateway.HITL
  alias Observatory.Proxy.{HTTPClient, SSE, Steps}
  alias ObservatoryWeb.{Auth, Conn}

  @type error :: {:error, {pos_integer(), String.t(), String.t(), String.t()}}

  @doc "Which upstream (see `Observatory.KillSwitch.Upstream.url/1`)."
  @callback api() :: Upstream.api()
  @doc "An error body in the API's shape, from the status, OpenAI-style type and code, message."
  @callback error_body(pos_integer(), String.t(), String.t(), String.t()) :: map()
  @doc "The answer to an inactive agent."
  @callback inactive_body(String.t()) :: map()
  @callback fingerprint_request(binary()) :: {:ok, KillSwitch.fingerprint()} | {:error, term()}
  @doc "The fingerprint of a whole (not streamed) 2xx answer; an error when it is not the API's answer."
  @callback fingerprint_response(binary()) :: {:ok, non_neg_integer() | nil} | {:error, term()}
  @doc "The text a decoded stream event adds to the answer, or nil."
  @callback stream_text(SSE.event()) :: String.t() | nil
  @doc "An error event to end a stream with."
  @callback stream_error(String.t()) :: iodata()
  @doc "Request headers passed on to the upstream."
  @callback forward_headers(Conn.t()) :: [{String.t(), String.t()}]

  @doc "Handles one proxied request with `dialect`."
  @spec handle(Conn.t(), module()) :: :ok | :halt
  def handle(conn, dialect) do
    Metrics.inc(:proxy_requests)

    with {:ok, agent_id} <- check(conn, dialect, Auth.proxy_agent(conn)),
         :ok <- still_active(conn, dialect, agent_id),
         :ok <- json_content(conn, dialect),
         {:ok, body} <- body(conn, dialect),
         {:ok, request} <- fingerprint(conn, dialect, body),
         {:ok, session_id} <- record_steps(conn, dialect, agent_id, body),
         :ok <- not_paused(conn, dialect, session_id),
         {:ok, verdict} <- admit(conn, dialect, agent_id, request) do
      forward(conn, dialect, agent_id, verdict, request, body)
    end
  end

  ## Checks

  defp check(_conn, _dialect, {:ok, value}), do: {:ok, value}

  defp check(conn, dialect, {:error, {status, type, code, message}}),
    do: error(conn, dialect, status, type, code, message)

  # Answer an inactive agent before reading its body.
  defp still_active(conn, dialect, agent_id) do
    if KillSwitch.active?(agent_id), do: :ok, else: inactive(conn, dialect, agent_id)
  end

  defp json_content(conn, dialect) do
    case Conn.content_type(conn) do
      "application/json" ->
        :ok

      other ->
        error(
          conn,
          dialect,
          415,
          "invalid_request_error",
          "unsupported_media_type",
          "send application/json, not #{inspect(other)}"
        )
    end
  end

  defp body(conn, dialect) do
    case Conn.read_body(conn) do
      {:ok, body} ->
        {:ok, body}

      {:error, :too_large} ->
        error(
          conn,
          dialect,
          413,
          "invalid_request_error",
          "body_too_large",
          "the body exceeds #{Conn.max_body_bytes()} bytes"
        )
    end
  end

  defp fingerprint(conn, dialect, body) do
    case dialect.fingerprint_request(body) do
      {:ok, request} ->
        {:ok, request}

      {:error, {:invalid_json, message}} ->
        error(conn, dialect, 400, "invalid_request_error", "invalid_json", message)

      {:error, :not_an_object} ->
        error(
          conn,
          dialect,
          400,
          "invalid_request_error",
          "invalid_body",
          "the body must be a JSON object"
        )
    end
  end

  defp record_steps(conn, dialect, agent_id, body) do
    format = if dialect.api() == :messages, do: :anthropic, else: :openai

    with {:ok, decoded} <- decode(conn, dialect, body),
         {:ok, session_id} <- session_id(conn, dialect, agent_id, decoded) do
      Steps.record(format, agent_id, session_id, decoded)
      {:ok, session_id}
    end
  end

  # The fingerprint has read the body already; this decoder also bounds nesting.
  defp decode(conn, dialect, body) do
    case JSON.decode(body) do
      {:ok, decoded} when is_map(decoded) ->
        {:ok, decoded}

      {:error, message} ->
        error(conn, dialect, 400, "invalid_request_error", "invalid_json", message)
    end
  end

  defp session_id(conn, dialect, agent_id, decoded) do
    case Conn.header(conn, "x-session-id") do
      nil ->
        {:ok, Steps.session_id(agent_id, decoded)}

      id ->
        if KillSwitch.valid_agent_id?(id),
          do: own_session(conn, dialect, agent_id, id),
          else:
            error(
              conn,
              dialect,
              400,
              "invalid_request_error",
              "invalid_session_id",
              "X-Session-Id must be 1 to 256 bytes of UTF-8 without control characters"
            )
    end
  end

  # An agent acts only in its own sessions (issue 13): no steps into, and no pause
  # probing of, another agent's session. Whose it is is asked of the session's owner;
  # one that does not answer is a 503, never a yes.
  defp own_session(conn, dialect, agent_id, id) do
    case Auth.session_access(agent_id, id) do
      :ok ->
        {:ok, id}

      {:error, :forbidden} ->
        error(
          conn,
          dialect,
          403,
          "forbidden",
          "forbidden",
          "X-Session-Id names a session of another agent"
        )

      {:error, :owner_unavailable} ->
        error(
          conn,
          dialect,
          503,
          "api_error",
          "owner_unavailable",
          "the session's owner in the gateway cluster did not answer in time; retry"
        )
    end
  end

  # Refused, not held: see the README's "Steps from proxied traffic".
  defp not_paused(conn, dialect, session_id) do
    case HITL.pause_of(session_id) do
      nil ->
        :ok

      pause ->
        Metrics.inc(:proxy_paused)
        reason = if pause[:reason] in [nil, ""], do: "", else: " (#{pause.reason})"

        error(
          conn,
          dialect,
          403,
          "session_paused",
          "session_paused",
          "session #{session_id} is paused by an operator#{reason}; " <>
            "the request was not sent; retry after the operator resumes it"
        )
    end
  end

  defp admit(conn, dialect, agent_id, request) do
    case KillSwitch.check_request(agent_id, request) do
      {:ok, verdict} ->
        {:ok, verdict}

      {:error, {:inactive, _agent}} ->
        inactive(conn, dialect, agent_id)

      {:error, :invalid_agent_id} ->
        error(
          conn,
          dialect,
          400,
          "invalid_request_error",
          "invalid_agent_id",
          "X-Agent-Id must be 1 to 256 bytes of UTF-8 without control characters"
        )

      {:error, :unknown_agent} ->
        error(
          conn,
          dialect,
          403,
          "unknown_agent",
          "unknown_agent",
          "no such agent is registered; an operator registers it by issuing its key"
        )
    end
  end

  ## Forwarding

  defp forward(conn, dialect, agent_id, verdict, request, body) do
    watch = watch_client(conn)

    result =
      Upstream.with_slot(fn ->
        case Upstream.open(dialect.api(), body, dialect.forward_headers(conn),
               stream: request.stream,
               watch: watch
             ) do
          {:ok, status, headers, upstream} ->
            try do
              answer(
                conn,
                dialect,
                {agent_id, verdict, watch},
                request,
                {status, headers, upstream}
              )
            after
              HTTPClient.close(upstream)
            end

          {:error, reason} ->
            {:error, reason}
        end
      end)

    unwatch_client(watch)

    case result do
      :ok -> :ok
      :halt -> :halt
      {:error, :client_closed} -> client_gone()
      {:error, :busy} -> busy(conn, dialect)
      {:error, reason} -> upstream_error(conn, dialect, Upstream.describe(dialect.api(), reason))
    end
  end

  # The agent's socket is unwatched before the answer's last byte goes out: once it
  # has the answer, the agent may send its next request on the same connection.
  defp answer(conn, dialect, {agent_id, verdict, watch}, request, {status, headers, upstream}) do
    if request.stream and status in 200..299 and event_stream?(headers),
      do: stream(conn, dialect, {agent_id, verdict, watch}, status, upstream),
      else: whole(conn, dialect, {agent_id, verdict, watch}, status, upstream)
  end

  defp whole(conn, dialect, {agent_id, verdict, watch}, status, upstream) do
    with {:ok, body, _upstream} <- HTTPClient.read_all(upstream) do
      unwatch_client(watch)
      respond(conn, dialect, agent_id, verdict, status, body)
    end
  end

  defp respond(conn, dialect, agent_id, verdict, status, body) when status in 200..299 do
    case dialect.fingerprint_response(body) do
      {:ok, hash} ->
        if verdict, do: KillSwitch.observe_response(agent_id, hash)
        pass_through(conn, verdict, status, body)

      {:error, {:invalid_json, _}} ->
        {:error, {:bad_response, "HTTP #{status} with a body that is not JSON"}}

      {:error, :not_a_completion} ->
        {:error, {:bad_response, "HTTP #{status} with JSON that is not #{answer_name(dialect)}"}}
    end
  end

  # An upstream error in JSON (a 400 for a bad model name, a 429 rate limit) is the
  # agent's to see; anything else is a broken upstream.
  defp respond(conn, _dialect, _agent_id, verdict, status, body) do
    case JSON.decode(body) do
      {:ok, _} -> pass_through(conn, verdict, status, body)
      {:error, _} -> {:error, {:bad_response, "HTTP #{status} with a body that is not JSON"}}
    end
  end

  defp answer_name(dialect) do
    if dialect.api() == :messages, do: "a message", else: "a chat completion"
  end

  defp pass_through(conn, verdict, status, body) do
    Conn.send_resp(conn, status, "application/json", body, score_header(verdict))
  end

  defp score_header(verdict) do
    [{"Cache-Control", "no-store"}] ++
      if verdict,
        do: [{"X-Observatory-Kill-Switch-Score", Float.to_string(verdict.score)}],
        else: []
  end

  ## Streaming: each piece goes to the agent as it arrives; the text is assembled
  ## for the response fingerprint at the end.

  defp stream(conn, dialect, {agent_id, verdict, watch}, status, upstream) do
    headers = [
      {"Content-Type", "text/event-stream; charset=utf-8"},
      {"X-Accel-Buffering", "no"} | Conn.security_headers() ++ score_header(verdict)
    ]

    resp = :mochiweb_request.respond({status, headers, :chunked}, conn.req)
    state = %{resp: resp, dialect: dialect, sse: SSE.new(), text: []}

    case relay(upstream, state) do
      {:ok, state} ->
        unwatch_client(watch)

        # Into the window before the stream's last chunk: an agent that has read its
        # answer to the end has its next request scored against it.
        if verdict do
          text = IO.iodata_to_binary(state.text)
          KillSwitch.observe_response(agent_id, if(text != "", do: KillSwitch.fingerprint(text)))
        end

        write(resp, "")
        :ok

      {:error, :client_closed} ->
        {:error, :client_closed}

      {:error, reason} ->
        # The status line is gone: end the stream with an error event the SDKs raise.
        message = Upstream.describe(dialect.api(), reason)
        Metrics.inc(:upstream_errors)
        Logger.warning("LLM proxy: #{message} (mid-stream)")
        unwatch_client(watch)
        write(resp, dialect.stream_error(message))
        write(resp, "")
        :ok
    end
  end

  # Passes on whole events only, so that an error event after the cap never lands in
  # the middle of one.
  defp relay(upstream, state) do
    case HTTPClient.read(upstream) do
      {:data, data, upstream} ->
        {events, complete, sse} = SSE.parse(state.sse, data)

        with :ok <- write_some(state.resp, complete) do
          texts = for event <- events, text = state.dialect.stream_text(event), do: text
          relay(upstream, %{state | sse: sse, text: [state.text | texts]})
        end

      {:done, _upstream} ->
        with :ok <- write_some(state.resp, SSE.rest(state.sse)), do: {:ok, state}

      {:error, reason} ->
        {:error, reason}
    end
  end

  defp write_some(_resp, ""), do: :ok
  defp write_some(resp, data), do: write(resp, data)

  # MochiWeb exits the process when a write fails; here that is the agent gone.
  defp write(resp, data) do
    :mochiweb_response.write_chunk(data, resp)
    :ok
  catch
    :exit, {:shutdown, _} -> {:error, :client_closed}
  end

  defp event_stream?(headers) do
    Enum.any?(headers, fn {name, value} ->
      name == "content-type" and String.starts_with?(String.downcase(value), "text/event-stream")
    end)
  end

  ## The agent's socket: watched while the upstream works, so a hang-up cancels it

  defp watch_client(conn) do
    case :mochiweb_request.get(:socket, conn.req) do
      socket when is_port(socket) ->
        :ok = :inet.setopts(socket, active: :once)
        socket

      _ssl ->
        nil
    end
  end

  defp unwatch_client(nil), do: :ok

  defp unwatch_client(socket) do
    :inet.setopts(socket, active: false)

    receive do
      {:tcp, ^socket, _data} ->
        # Bytes of a next request were taken while watching: do not reuse the connection.
        Process.put(:mochiweb_request_force_close, true)
    after
      0 -> :ok
    end
  end

  defp client_gone do
    Metrics.inc(:proxy_client_gone)
    exit(:normal)
  end

  ## Answers

  defp busy(conn, dialect) do
    Metrics.inc(:proxy_busy)

    body =
      dialect.error_body(
        503,
        "server_error",
        "upstream_busy",
        "#{Upstream.max_concurrent()} upstream requests are in flight " <>
          "(config :observatory, :llm_max_concurrent); retry shortly"
      )

    Conn.send_resp(conn, 503, "application/json", JSON.encode!(body), [
      {"Cache-Control", "no-store"},
      {"Retry-After", "1"}
    ])

    :halt
  end

  defp inactive(conn, dialect, agent_id) do
    Metrics.inc(:proxy_inactive)
    Conn.json(conn, 403, dialect.inactive_body(agent_id))
    :halt
  end

  defp upstream_error(conn, dialect, message) do
    Metrics.inc(:upstream_errors)
    Logger.warning("LLM proxy: #{message}")
    error(conn, dialect, 502, "upstream_error", "upstream_error", message)
  end

  defp error(conn, dialect, status, type, code, message) do
    Conn.json(conn, status, dialect.error_body(status, type, code, message))
    :halt
  end
end
