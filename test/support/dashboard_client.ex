defmodule Observatory.Test.DashboardClient do
  @moduledoc false
  # A browserless client for the dashboard: requests with cookies and no automatic
  # redirects (:httpc), sign-in, and a raw-socket reader of the Server-Sent Events
  # stream (chunked transfer decoded by hand, so the test sees each event as it lands).

  alias Observatory.Test.HTTP

  @doc "A request; returns status, headers (a list: Set-Cookie may repeat) and body."
  def request(method, path, opts \\ []) do
    headers =
      for {k, v} <- Keyword.get(opts, :headers, []),
          do: {String.to_charlist(k), String.to_charlist(v)}

    headers =
      case Keyword.get(opts, :cookie) do
        nil -> headers
        cookie -> [{~c"cookie", String.to_charlist(cookie)} | headers]
      end

    url = String.to_charlist(HTTP.url(path))

    req =
      case method do
        :get ->
          {url, headers}

        :post ->
          {url, headers, String.to_charlist(opts[:type] || "text/plain"), opts[:body] || ""}
      end

    {:ok, {{_, status, _}, resp_headers, body}} =
      :httpc.request(method, req, [timeout: 10_000, autoredirect: false], body_format: :binary)

    %{
      status: status,
      headers: for({k, v} <- resp_headers, do: {to_string(k), to_string(v)}),
      body: body
    }
  end

  def header(resp, name) do
    Enum.find_value(resp.headers, fn {k, v} -> if k == name, do: v end)
  end

  def set_cookies(resp), do: for({"set-cookie", v} <- resp.headers, do: v)

  @doc "The `name=value` part of the Set-Cookie for `name`, or nil."
  def cookie(resp, name) do
    Enum.find_value(set_cookies(resp), fn set ->
      [pair | _] = String.split(set, ";")
      if String.starts_with?(pair, name <> "="), do: pair
    end)
  end

  def post_form(path, fields, opts \\ []) do
    body = URI.encode_query(fields)

    request(
      :post,
      path,
      Keyword.merge(opts, type: "application/x-www-form-urlencoded", body: body)
    )
  end

  @doc "Signs in with the operator token; returns %{cookie: \"observatory_session=...\", csrf: token}."
  def sign_in(token \\ HTTP.operator_token()) do
    form = request(:get, "/login")
    login_cookie = cookie(form, "observatory_login_csrf")
    "observatory_login_csrf=" <> csrf = login_cookie

    resp = post_form("/login", %{"_csrf_token" => csrf, "token" => token}, cookie: login_cookie)

    303 = resp.status
    session_cookie = cookie(resp, "observatory_session")
    page = request(:get, "/", cookie: session_cookie)
    [_, page_csrf] = Regex.run(~r/<meta name="csrf-token" content="([^"]+)">/, page.body)
    %{cookie: session_cookie, csrf: page_csrf}
  end

  ## The event stream

  @doc "Opens GET /dashboard/events (or `path`); returns the stream after its headers."
  def open_stream(cookie, path \\ "/dashboard/events") do
    {:ok, socket} =
      :gen_tcp.connect(~c"127.0.0.1", ObservatoryWeb.Endpoint.port(), [:binary, active: false])

    :ok =
      :gen_tcp.send(socket, [
        "GET ",
        path,
        " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "Accept: text/event-stream\r\nCookie: ",
        cookie,
        "\r\n\r\n"
      ])

    {head, rest} = read_head(socket, "")
    %{socket: socket, head: head, raw: rest, text: ""}
  end

  def close_stream(%{socket: socket}), do: :gen_tcp.close(socket)

  @doc """
  The next SSE event within `timeout` ms: `{:event, name, data}` (data JSON-decoded),
  `{:comment, text}`, or `{:error, reason}`. Returns it with the updated stream.
  """
  def next_event(stream, timeout \\ 2_000) do
    case String.split(stream.text, "\n\n", parts: 2) do
      [block, rest] ->
        {parse_block(block), %{stream | text: rest}}

      [_incomplete] ->
        case decode_chunks(stream.raw, "") do
          {text, raw} when text != "" ->
            next_event(%{stream | text: stream.text <> text, raw: raw}, timeout)

          {"", raw} ->
            case :gen_tcp.recv(stream.socket, 0, timeout) do
              {:ok, data} -> next_event(%{stream | raw: raw <> data}, timeout)
              {:error, reason} -> {{:error, reason}, stream}
            end
        end
    end
  end

  @doc "Reads events until `fun.(event)` is truthy; returns {event, stream} or fails."
  def await_event(stream, fun, timeout \\ 2_000) do
    deadline = System.monotonic_time(:millisecond) + timeout
    await(stream, fun, deadline)
  end

  defp await(stream, fun, deadline) do
    left = max(deadline - System.monotonic_time(:millisecond), 0)

    case next_event(stream, left) do
      {{:error, reason}, _} -> raise "no matching event: #{inspect(reason)}"
      {event, stream} -> if fun.(event), do: {event, stream}, else: await(stream, fun, deadline)
    end
  end

  defp read_head(socket, acc) do
    case String.split(acc, "\r\n\r\n", parts: 2) do
      [head, rest] ->
        {head, rest}

      [_] ->
        {:ok, data} = :gen_tcp.recv(socket, 0, 5_000)
        read_head(socket, acc <> data)
    end
  end

  # Decodes the complete chunks at the front of `raw`; keeps an incomplete tail.
  defp decode_chunks(raw, acc) do
    with [size_hex, rest] <- String.split(raw, "\r\n", parts: 2),
         {size, ""} <- Integer.parse(size_hex, 16),
         <<chunk::binary-size(size), "\r\n", tail::binary>> <- rest do
      decode_chunks(tail, acc <> chunk)
    else
      _ -> {acc, raw}
    end
  end

  defp parse_block(block) do
    lines = String.split(block, "\n", trim: true)

    case Enum.reject(lines, &String.starts_with?(&1, "retry:")) do
      [": " <> comment] ->
        {:comment, comment}

      fields ->
        name = Enum.find_value(fields, "message", &after_prefix(&1, "event: "))
        data = Enum.join(for("data: " <> d <- fields, do: d), "\n")
        {:ok, decoded} = Observatory.JSON.decode(data)
        {:event, name, decoded}
    end
  end

  defp after_prefix(line, prefix) do
    if String.starts_with?(line, prefix),
      do: binary_part(line, byte_size(prefix), byte_size(line) - byte_size(prefix))
  end
end
