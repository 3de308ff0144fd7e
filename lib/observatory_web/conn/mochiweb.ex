defmodule ObservatoryWeb.Conn.MochiWeb do
  @moduledoc """
  `ObservatoryWeb.Conn.Adapter` over a MochiWeb request: Observatory's own server
  (`ObservatoryWeb.Endpoint`). Body reads run under the endpoint's idle deadline
  (`ObservatoryWeb.Endpoint.with_read_deadline/1`).
  """

  @behaviour ObservatoryWeb.Conn.Adapter

  # The largest unread body skipped to keep a connection (send_resp/4).
  @max_skipped_body 64 * 1024
  @body_touched {__MODULE__, :body_touched}

  @headers_key {__MODULE__, :headers}

  @doc false
  # The request the endpoint has read: MochiWeb's (its responses, cookies and chunked
  # bodies need it) and, beside it in the connection's process, its headers as this
  # adapter gives them (`{lowercase name, value}` binaries, in the order sent), made
  # once from the parser's binaries rather than back out of MochiWeb's lists.
  def new_request(socket, opts, request_line, headers) do
    headers = for {name, value} <- headers, do: {name, trim_trailing(value)}
    Process.put(@headers_key, for({name, value} <- headers, do: {header_name(name), value}))
    :mochiweb.new_request({socket, opts, request_line, headers})
  end

  # The parser drops the whitespace before a value, not the whitespace after it,
  # which is no part of the value either (RFC 9110 §5.5).
  defp trim_trailing(""), do: ""

  defp trim_trailing(value) do
    size = byte_size(value) - 1

    case value do
      <<rest::binary-size(size), c>> when c in [?\s, ?\t] -> trim_trailing(rest)
      _ -> value
    end
  end

  @impl true
  def request(req) do
    Process.delete(@body_touched)
    raw = :mochiweb_request.get(:raw_path, req) |> bytes()

    {path, query} =
      case String.split(raw, "?", parts: 2) do
        [path, query] -> {path, query}
        [path] -> {path, ""}
      end

    %{
      method: req |> then(&:mochiweb_request.get(:method, &1)) |> to_string(),
      path_segments: String.split(path, "/", trim: true),
      query_string: query,
      # Repeated headers as sent: Conn.new/3 joins their values.
      headers: Process.get(@headers_key, []),
      remote_ip: peer(req)
    }
  end

  @doc false
  # A request header's value (`name` lowercase), a repeated one's values joined with
  # ", " (as Conn.new/3 and MochiWeb join them), or nil.
  def header(name) do
    case for {^name, value} <- Process.get(@headers_key, []), do: value do
      [] -> nil
      [value] -> value
      values -> Enum.join(values, ", ")
    end
  end

  # Erlang's HTTP parser gives the header names it knows as atoms (`:"Content-Type"`):
  # their lowercase names are written here once, at compile time.
  for name <- ~w(Accept Accept-Charset Accept-Encoding Accept-Language Authorization
                 Cache-Control Connection Content-Encoding Content-Length Content-Type
                 Cookie Host If-Modified-Since If-None-Match Keep-Alive
                 Proxy-Authorization Range Referer Transfer-Encoding Upgrade User-Agent
                 X-Forwarded-For)a do
    defp header_name(unquote(name)), do: unquote(String.downcase(Atom.to_string(name)))
  end

  defp header_name(name), do: ObservatoryWeb.Conn.downcase(bytes(name))

  # MochiWeb hands out paths and header values as lists of bytes: keep the bytes
  # (`to_string/1` would read each byte as a code point and hide invalid UTF-8).
  defp bytes(value) when is_list(value), do: :erlang.list_to_binary(value)
  defp bytes(value) when is_binary(value), do: value
  defp bytes(value) when is_atom(value), do: Atom.to_string(value)

  # The socket's peer: MochiWeb's own `peer` believes X-Forwarded-For when the peer
  # is on loopback or a private network, which would let a client pick its address.
  # Asked once per connection (a system call), not once per request.
  @peer_key {__MODULE__, :peer}

  defp peer(req) do
    socket = :mochiweb_request.get(:socket, req)

    case Process.get(@peer_key) do
      {^socket, address} ->
        address

      _ ->
        case :mochiweb_socket.peername(socket) do
          {:ok, {address, _port}} ->
            address = address |> :inet.ntoa() |> to_string()
            Process.put(@peer_key, {socket, address})
            address

          _ ->
            nil
        end
    end
  end

  # A chunked body is read by ObservatoryWeb.Conn.Chunked: MochiWeb's own reader
  # crashes on a chunk extension and takes a bare LF for a line end.
  @impl true
  def read_body(req, max) do
    body_touched()

    ObservatoryWeb.Endpoint.with_read_deadline(fn ->
      if chunked?(),
        do: ObservatoryWeb.Conn.Chunked.read(req, max),
        else: recv_body(req, max)
    end)
  end

  # A Content-Length body: refused before a byte is read when it announces more than
  # `max`, else read whole, in pieces of up to @max_piece bytes. (MochiWeb's
  # `recv_body` reads in pieces of its 8 KiB receive buffer: a 1 MiB body took 128
  # round trips to the socket driver, and a 600-byte step went through its
  # streaming machinery for one `recv`.) What it records is what MochiWeb's reader
  # records: the body was read (the connection is kept) and what it was (a second
  # read answers the same body).
  defp recv_body(req, max) do
    case Process.get(:mochiweb_request_body) do
      nil -> recv_body(req, max, content_length())
      body -> {:ok, body}
    end
  end

  defp recv_body(_req, _max, nil), do: {:ok, ""}

  defp recv_body(_req, _max, :invalid),
    do: {:error, {:malformed, "its Content-Length is not a decimal number"}}

  defp recv_body(_req, max, length) when length > max, do: {:error, :too_large}

  defp recv_body(req, _max, length) do
    ObservatoryWeb.Conn.Chunked.continue_if_expected(req)
    body = recv_exactly(:mochiweb_request.get(:socket, req), length, [])
    Process.put(:mochiweb_request_recv, true)
    Process.put(:mochiweb_request_body, body)
    {:ok, body}
  end

  @max_piece 1024 * 1024
  @recv_timeout 300_000

  defp recv_exactly(_socket, 0, acc), do: acc |> Enum.reverse() |> IO.iodata_to_binary()

  defp recv_exactly(socket, left, acc) do
    piece = min(left, @max_piece)

    case :mochiweb_socket.recv(socket, piece, @recv_timeout) do
      {:ok, data} -> recv_exactly(socket, left - piece, [data | acc])
      # As MochiWeb's reader: the client is gone, the connection's process ends.
      {:error, _} -> exit({:shutdown, :recv_error})
    end
  end

  # The request's Content-Length: nil when it has none, else what
  # `ObservatoryWeb.Conn.parse_content_length/1` reads in it (a number or `:invalid`,
  # which Conn.new/3 has answered 400). Both the body read and the skip of an unread
  # body ask here, so they cannot disagree on a value such as ` 12 `.
  defp content_length do
    case header("content-length") do
      nil -> nil
      value -> ObservatoryWeb.Conn.parse_content_length(value)
    end
  end

  defp chunked? do
    ObservatoryWeb.Conn.chunked_value?(header("transfer-encoding"))
  end

  # Piece by piece, keeping none of it: a client whose body is left unread when the
  # connection closes may see a reset instead of the answer (and retry blind). A
  # Content-Length body over `max` (or not a number) is not read: the connection
  # closes after the answer.
  @impl true
  def discard_body(req, max) do
    body_touched()

    ObservatoryWeb.Endpoint.with_read_deadline(fn ->
      case chunked?() || content_length() do
        true ->
          :mochiweb_request.stream_body(64 * 1024, fn _piece, acc -> acc end, nil, max, req)

        length when is_integer(length) and length <= max ->
          drop(:mochiweb_request.get(:socket, req), length)

        _none_or_too_large ->
          :ok
      end
    end)

    :ok
  catch
    :exit, _ -> :ok
  end

  # What MochiWeb records once a body is read: the connection can be kept.
  defp drop(_socket, 0), do: Process.put(:mochiweb_request_recv, true)

  defp drop(socket, left) do
    piece = min(left, 64 * 1024)

    case :mochiweb_socket.recv(socket, piece, @recv_timeout) do
      {:ok, _data} -> drop(socket, left - piece)
      {:error, _} -> exit({:shutdown, :recv_error})
    end
  end

  # The answer's head is written here, not by MochiWeb's `respond`, which builds a
  # header table (each name lowercased a character at a time, sorted, joined) for
  # every answer: the headers go out as given, then Content-Length, Date and, when
  # the connection is to close, `Connection: close`.
  @impl true
  def send_resp(req, status, headers, body) do
    case untouched_body_bytes() do
      bytes when bytes in 1..@max_skipped_body ->
        ObservatoryWeb.Endpoint.skip_body_after_response(bytes)

      _ ->
        :ok
    end

    head = [
      status_line(:mochiweb_request.get(:version, req), status),
      for({name, value} <- headers, do: [name, ": ", header_text(value), "\r\n"]),
      "Content-Length: ",
      Integer.to_string(IO.iodata_length(body)),
      "\r\nDate: ",
      :mochiweb_clock.rfc1123(),
      if(should_close?(req), do: "\r\nConnection: close\r\n\r\n", else: "\r\n\r\n")
    ]

    data = if :mochiweb_request.get(:method, req) == :HEAD, do: head, else: [head, body]

    # As MochiWeb's `send`: the client is gone, the connection's process ends.
    case :mochiweb_socket.send(:mochiweb_request.get(:socket, req), data) do
      :ok -> :ok
      _ -> exit({:shutdown, :send_error})
    end
  end

  defp status_line({1, 0}, status), do: ["HTTP/1.0 ", status_text(status), "\r\n"]
  defp status_line(_version, status), do: ["HTTP/1.1 ", status_text(status), "\r\n"]

  # RFC 9110's reason phrases for the statuses the gateway answers (OTP's table,
  # which MochiWeb used, has older ones: "Object Not Found"), else OTP's.
  for {status, reason} <- [
        {200, "OK"},
        {201, "Created"},
        {202, "Accepted"},
        {204, "No Content"},
        {301, "Moved Permanently"},
        {302, "Found"},
        {303, "See Other"},
        {304, "Not Modified"},
        {307, "Temporary Redirect"},
        {400, "Bad Request"},
        {401, "Unauthorized"},
        {403, "Forbidden"},
        {404, "Not Found"},
        {405, "Method Not Allowed"},
        {406, "Not Acceptable"},
        {408, "Request Timeout"},
        {409, "Conflict"},
        {410, "Gone"},
        {411, "Length Required"},
        {413, "Content Too Large"},
        {414, "URI Too Long"},
        {415, "Unsupported Media Type"},
        {422, "Unprocessable Content"},
        {429, "Too Many Requests"},
        {431, "Request Header Fields Too Large"},
        {500, "Internal Server Error"},
        {501, "Not Implemented"},
        {502, "Bad Gateway"},
        {503, "Service Unavailable"},
        {504, "Gateway Timeout"}
      ] do
    defp status_text(unquote(status)), do: unquote("#{status} #{reason}")
  end

  defp status_text(status),
    do: [Integer.to_string(status), " ", :httpd_util.reason_phrase(status)]

  defp header_text(value) when is_binary(value), do: value
  defp header_text(value), do: to_string(value)

  @doc false
  # Whether the connection closes after this answer: MochiWeb's rule
  # (`mochiweb_request:should_close/1`) on the headers as parsed — the request or
  # a handler asked for it, HTTP/1.0 without keep-alive, or a body is left unread
  # (the next request could not be told from it). `Connection` is read as the
  # list of options it is (RFC 9112 §9.6), where MochiWeb matched the whole value.
  def should_close?(req) do
    version = :mochiweb_request.get(:version, req)

    Process.get(:mochiweb_request_force_close) != nil or version < {1, 0} or
      connection_option?("close") or
      (version == {1, 0} and not connection_option?("keep-alive")) or
      (Process.get(:mochiweb_request_recv) == nil and unread_body?())
  end

  defp connection_option?(option) do
    case header("connection") do
      nil ->
        false

      value ->
        value
        |> ObservatoryWeb.Conn.downcase()
        |> String.split(",")
        |> Enum.any?(&(String.trim(&1) == option))
    end
  end

  defp unread_body?, do: chunked?() or content_length() not in [nil, 0]

  # A small body the handler never asked for (a 404, a 401 to a POST): skipped after
  # the answer (ObservatoryWeb.Endpoint), so the connection is kept, where MochiWeb
  # would close it (it cannot tell the next request from the unread body). A client
  # hitting an error would otherwise pay a new connection per request. Not for a body
  # a handler tried to read (a 413 closes), a chunked one, one behind
  # `Expect: 100-continue` (not sent yet) or a request already marked to close.
  defp body_touched, do: Process.put(@body_touched, true)

  defp untouched_body_bytes() do
    with nil <- Process.get(@body_touched),
         nil <- Process.get(:mochiweb_request_recv),
         nil <- Process.get(:mochiweb_request_force_close),
         nil <- header("transfer-encoding"),
         nil <- header("expect"),
         bytes when is_integer(bytes) <- content_length() do
      bytes
    else
      _ -> 0
    end
  end

  # MochiWeb writes a chunked answer's head; it is told to announce the close this
  # adapter will make (MochiWeb's own rule misses `Connection: TE, close`).
  @impl true
  def send_chunked(req, status, headers) do
    headers = if should_close?(req), do: [{"Connection", "close"} | headers], else: headers
    :mochiweb_request.respond({status, headers, :chunked}, req)
  end

  # MochiWeb exits the process when a write fails; here that is the client gone.
  @impl true
  def chunk(resp, data) do
    :mochiweb_response.write_chunk(data, resp)
    :ok
  catch
    :exit, {:shutdown, _} -> {:error, :closed}
  end

  @impl true
  def end_chunked(resp) do
    _ = chunk(resp, "")
    :ok
  end

  @impl true
  def client_socket(req) do
    case :mochiweb_request.get(:socket, req) do
      socket when is_port(socket) -> socket
      _ssl -> nil
    end
  end

  @impl true
  def close_after(_req) do
    Process.put(:mochiweb_request_force_close, true)
    :ok
  end

  # The connection's process ends: MochiWeb closes the socket.
  @impl true
  def client_gone(_req), do: exit(:normal)

  @impl true
  def cookie(req, name) do
    case :mochiweb_request.get_cookie_value(String.to_charlist(name), req) do
      :undefined -> nil
      value -> bytes(value)
    end
  end
end
