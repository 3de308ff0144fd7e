defmodule ObservatoryWeb.Conn do
  @moduledoc """
  One HTTP request and the functions to answer it, over any server: Observatory's own
  (MochiWeb, `ObservatoryWeb.Conn.MochiWeb`) or a Phoenix host's endpoint (Plug,
  `ObservatoryWeb.Conn.PlugAdapter`) — each an `ObservatoryWeb.Conn.Adapter`, so every
  handler has one code path whichever server runs it.

  Handlers get a `%Conn{}` with the method, the decoded path segments and the query,
  and answer with `json/3`, `text/4`, `html/4`, `redirect/3` or `no_content/1`, or in
  chunks (`send_chunked/3`, `chunk/2`). Reading the body is explicit (`read_body/1`)
  and bounded by `:max_body_bytes`.

  Every path segment, query parameter and header value is valid UTF-8, no header
  value holds a control character (tab aside), and a `Content-Length` is a decimal
  number: a request where one is not carries
  `bad_request` (the reason) and the router answers `400` before any handler runs.
  `remote_ip` is the TCP peer's address (over MochiWeb; a host's endpoint gives its
  `Plug.Conn` `remote_ip`); `X-Forwarded-For` is not trusted.
  """

  alias Observatory.JSON

  defstruct [
    :adapter,
    :req,
    :method,
    :path_info,
    :query,
    :query_string,
    :headers,
    :remote_ip,
    :bad_request,
    :not_implemented
  ]

  @type t :: %__MODULE__{
          adapter: module(),
          req: term(),
          method: String.t(),
          path_info: [String.t()],
          query: %{String.t() => String.t()},
          query_string: String.t(),
          headers: [{String.t(), String.t()}],
          remote_ip: String.t() | nil,
          bad_request: String.t() | nil,
          not_implemented: String.t() | nil
        }

  @security_headers [
    {"X-Content-Type-Options", "nosniff"},
    {"X-Frame-Options", "DENY"},
    {"Referrer-Policy", "no-referrer"}
  ]

  @doc """
  The request `req` of `adapter` (an `ObservatoryWeb.Conn.Adapter`), decoded and
  checked. Option `:path_segments` replaces the request's own (a mount point's prefix
  taken off).
  """
  @spec new(module(), term(), keyword()) :: t()
  def new(adapter, req, opts \\ []) do
    request = adapter.request(req)

    segments =
      for seg <- Keyword.get(opts, :path_segments, request.path_segments), do: decode_segment(seg)

    query = decode_query(request.query_string)
    headers = merge_repeated(request.headers)

    %__MODULE__{
      adapter: adapter,
      req: req,
      method: request.method,
      path_info: for({:ok, seg} <- segments, do: seg),
      query: if(is_map(query), do: query, else: %{}),
      query_string: request.query_string,
      headers: headers,
      remote_ip: request.remote_ip
    }
    |> refuse_unless(Enum.all?(segments, &match?({:ok, _}, &1)), "the path is not valid UTF-8")
    |> refuse_unless(is_map(query), "the query string is not valid UTF-8")
    |> check_headers(headers)
    |> refuse_unless(content_length_ok?(headers), "Content-Length must be a decimal number")
    |> refuse_unless(
      not (chunked?(headers) and header_value(headers, "content-length") != nil),
      "a request has Transfer-Encoding or Content-Length, not both"
    )
    |> transfer_encoding(header_value(headers, "transfer-encoding"))
  end

  defp refuse_unless(%{bad_request: nil} = conn, false, reason), do: %{conn | bad_request: reason}
  defp refuse_unless(conn, _ok, _reason), do: conn

  # Chunked is the one transfer coding a server must know (RFC 9112 §7): any other
  # (gzip, or chunked after another) is answered 501 before its body is read.
  defp transfer_encoding(conn, nil), do: conn

  defp transfer_encoding(conn, value) do
    if chunked_value?(value),
      do: conn,
      else: %{
        conn
        | not_implemented:
            "Transfer-Encoding #{inspect(value)} is not supported: send chunked or a Content-Length"
      }
  end

  defp chunked?(headers), do: chunked_value?(header_value(headers, "transfer-encoding"))

  @doc false
  # Whether a Transfer-Encoding value is `chunked` alone (the adapters read such a body).
  def chunked_value?(nil), do: false
  def chunked_value?(value), do: value |> String.trim() |> downcase() == "chunked"

  defp header_value(headers, name) do
    case List.keyfind(headers, name, 0) do
      {_, value} -> value
      nil -> nil
    end
  end

  @doc false
  # ASCII lowercase: header names are compared byte for byte, whatever their bytes.
  def downcase(name), do: String.downcase(name, :ascii)

  # One value per name, a repeated header's values joined with ", " (RFC 9110 §5.3),
  # as MochiWeb gives them: two Authorization headers make one value no key matches.
  defp merge_repeated(headers) do
    headers
    |> Enum.reduce({[], %{}}, fn {name, value}, {order, values} ->
      case values do
        %{^name => previous} -> {order, %{values | name => previous <> ", " <> value}}
        _ -> {[name | order], Map.put(values, name, value)}
      end
    end)
    |> then(fn {order, values} -> for name <- Enum.reverse(order), do: {name, values[name]} end)
  end

  # Strict: a `%` not followed by two hex digits is an error (URI.decode/1 keeps it).
  # A segment without a `%` is itself (most are).
  defp decode_segment(seg) do
    if :binary.match(seg, "%") == :nomatch,
      do: if(String.valid?(seg), do: {:ok, seg}, else: :error),
      else: percent_decode_segment(seg)
  end

  defp percent_decode_segment(seg) do
    with {:ok, decoded} <- percent_decode(seg, []),
         true <- String.valid?(decoded) do
      {:ok, decoded}
    else
      _ -> :error
    end
  end

  defp percent_decode(<<"%", hi, lo, rest::binary>>, acc)
       when hi in ~c"0123456789abcdefABCDEF" and lo in ~c"0123456789abcdefABCDEF",
       do: percent_decode(rest, [acc, List.to_integer([hi, lo], 16)])

  defp percent_decode(<<"%", _::binary>>, _acc), do: :error
  defp percent_decode(<<byte, rest::binary>>, acc), do: percent_decode(rest, [acc, byte])
  defp percent_decode(<<>>, acc), do: {:ok, IO.iodata_to_binary(acc)}

  defp decode_query(""), do: %{}

  defp decode_query(query) do
    decoded = URI.decode_query(query)
    if Enum.all?(decoded, fn {k, v} -> String.valid?(k) and String.valid?(v) end), do: decoded
  rescue
    ArgumentError -> nil
  end

  # Every name and value valid UTF-8, and no value holding a control character: a
  # folded line's `\r\n ` and a bare `\r` kept inside a value (MochiWeb keeps them),
  # passed on (the proxy forwards `anthropic-version`), would split an upstream head.
  # Tab is the one control character a value may hold (RFC 9110 field-vchar, OWS).
  # One pass over each (`clean?/1`); only a header that fails it is looked at again,
  # to say which rule it broke.
  defp check_headers(conn, headers) do
    if Enum.all?(headers, fn {name, value} -> clean?(name) and clean?(value) end) do
      conn
    else
      conn
      |> refuse_unless(headers_utf8?(headers), "a header is not valid UTF-8")
      |> refuse_unless(
        header_values_clean?(headers),
        "a header value contains a control character"
      )
    end
  end

  # Printable ASCII, tab, or a valid multi-byte UTF-8 character, to the end.
  defp clean?(<<c, rest::binary>>) when c in 0x20..0x7E or c == ?\t, do: clean?(rest)
  defp clean?(<<c::utf8, rest::binary>>) when c >= 0x80, do: clean?(rest)
  defp clean?(<<>>), do: true
  defp clean?(_other), do: false

  defp headers_utf8?(headers),
    do: Enum.all?(headers, fn {name, value} -> String.valid?(name) and String.valid?(value) end)

  defp header_values_clean?(headers),
    do: Enum.all?(headers, fn {_name, value} -> not control_char?(value) end)

  defp control_char?(<<c, _::binary>>) when (c < 0x20 and c != ?\t) or c == 0x7F, do: true
  defp control_char?(<<_, rest::binary>>), do: control_char?(rest)
  defp control_char?(<<>>), do: false

  defp content_length_ok?(headers) do
    case List.keyfind(headers, "content-length", 0) do
      nil -> true
      {_, value} -> parse_content_length(value) != :invalid
    end
  end

  @doc false
  # The one reading of a Content-Length value, for this module's 400 and for the
  # adapters' body reads alike: 1 to 19 decimal digits, with optional whitespace
  # around them (not part of a field's value, RFC 9110 §5.5), else `:invalid`.
  @spec parse_content_length(binary()) :: non_neg_integer() | :invalid
  def parse_content_length(value) do
    cond do
      decimal?(value) -> String.to_integer(value)
      decimal?(digits = String.trim(value)) -> String.to_integer(digits)
      true -> :invalid
    end
  end

  defp decimal?(<<>>), do: false
  defp decimal?(text) when byte_size(text) > 19, do: false
  defp decimal?(text), do: for(<<c <- text>>, reduce: true, do: (ok -> ok and c in ?0..?9))

  @doc "A request header's value (`name` lowercase), or nil."
  @spec header(t(), String.t()) :: String.t() | nil
  def header(%__MODULE__{headers: headers}, name) do
    case List.keyfind(headers, name, 0) do
      {_, value} -> value
      nil -> nil
    end
  end

  @doc "A cookie's value, or nil."
  @spec cookie(t(), String.t()) :: String.t() | nil
  def cookie(%__MODULE__{adapter: adapter, req: req}, name), do: adapter.cookie(req, name)

  @doc "The request's media type (`content-type` without parameters), lowercased (ASCII: media types are ASCII tokens)."
  @spec content_type(t()) :: String.t() | nil
  def content_type(conn) do
    case header(conn, "content-type") do
      nil -> nil
      value -> value |> String.split(";") |> hd() |> String.trim() |> downcase()
    end
  end

  @doc """
  Reads the whole body, at most `max` bytes (default `:max_body_bytes`, 1 MiB);
  on Observatory's own server within the endpoint's `idle_timeout_ms` (past it the
  connection is closed). Returns `{:ok, body}` or `{:error, :too_large}`.

  A chunked body whose framing is broken (a chunk size that is not hex, a chunk
  extension holding a control character such as CR, a chunk not ended by CRLF) is
  answered `400` here and its connection closed: nothing after it can be trusted to
  start the next request. Well-formed chunk extensions are ignored (RFC 9112 §7.1.1).
  """
  @spec read_body(t(), pos_integer() | nil) :: {:ok, binary()} | {:error, :too_large}
  def read_body(%__MODULE__{adapter: adapter, req: req} = conn, max \\ nil) do
    case adapter.read_body(req, max || max_body_bytes()) do
      {:error, {:malformed, reason}} -> malformed(conn, reason)
      other -> other
    end
  end

  @doc "Reads and drops the body, at most `max` bytes: the client then sees the answer."
  @spec discard_body(t(), pos_integer()) :: :ok
  def discard_body(%__MODULE__{adapter: adapter, req: req}, max),
    do: adapter.discard_body(req, max)

  # Answered, then the connection is closed and the request ended.
  defp malformed(conn, reason) do
    conn.adapter.close_after(conn.req)
    error(conn, 400, "bad_request", "the body is malformed: #{reason}")
    conn.adapter.client_gone(conn.req)
  end

  @doc "The configured body limit in bytes."
  def max_body_bytes, do: Application.get_env(:observatory, :max_body_bytes, 1024 * 1024)

  @doc "Answers with `data` as JSON, and any extra headers."
  @spec json(t(), pos_integer(), term(), [{String.t(), String.t()}]) :: :ok
  def json(conn, status, data, headers \\ []) do
    send_resp(conn, status, "application/json", JSON.encode_lossy!(data), [
      {"Cache-Control", "no-store"} | headers
    ])
  end

  @doc "Answers with a JSON error body `%{error: code, message: message, ...extra}`."
  @spec error(t(), pos_integer(), String.t(), String.t(), map(), [{String.t(), String.t()}]) ::
          :ok
  def error(conn, status, code, message, extra \\ %{}, headers \\ []) do
    json(conn, status, Map.merge(%{error: code, message: message}, extra), headers)
  end

  @doc """
  `422` with `code`: every violation (`%{path: ..., reason: ...}`) in the message, and
  the list as `violations`.
  """
  @spec invalid(t(), String.t(), [%{path: String.t(), reason: String.t()}]) :: :ok
  def invalid(conn, code, violations) do
    error(
      conn,
      422,
      code,
      Enum.map_join(violations, "; ", &"#{&1.path} #{&1.reason}"),
      %{violations: violations}
    )
  end

  @doc """
  `503 no_majority`: this node of a cluster cannot reach a majority and refuses an
  action that lowers safety state (`Observatory.Cluster.with_majority/2`); the body
  names the nodes it cannot reach and everything it refuses until the partition heals.
  """
  @spec no_majority(t()) :: :ok
  def no_majority(conn) do
    status = Observatory.Cluster.status()

    body = %{
      error: "no_majority",
      message:
        "this gateway cannot reach a majority of its cluster (unreachable: " <>
          "#{Enum.join(Map.get(status, :unreachable, []), ", ")}); until the partition heals it " <>
          "refuses #{Enum.join(Observatory.Cluster.refused_without_majority(), ", ")}. " <>
          "Retry on a node of the majority, or after the heal.",
      unreachable: Map.get(status, :unreachable, []),
      refused: Observatory.Cluster.refused_without_majority()
    }

    # No Retry-After: a partition may last, and some clients (OTP's httpc) retry a 503
    # that carries one without end. The message says where to go instead.
    json(conn, 503, body)
  end

  @doc "Answers with plain text."
  def text(conn, status, body, content_type \\ "text/plain; charset=utf-8") do
    send_resp(conn, status, content_type, body, [])
  end

  @doc "Answers with an HTML page."
  def html(conn, status, body, headers \\ []) do
    send_resp(conn, status, "text/html; charset=utf-8", body, headers)
  end

  @doc "Redirects with `303 See Other` to a path on this server."
  @spec redirect(t(), String.t(), [{String.t(), String.t()}]) :: :ok
  def redirect(conn, "/" <> _ = path, headers \\ []) do
    send_resp(conn, 303, "text/plain; charset=utf-8", "", [{"Location", path} | headers])
  end

  @doc "Answers `204 No Content`."
  @spec no_content(t()) :: :ok
  def no_content(%__MODULE__{adapter: adapter, req: req}),
    do: adapter.send_resp(req, 204, @security_headers, "")

  @doc "The common security headers every response carries."
  @spec security_headers() :: [{String.t(), String.t()}]
  def security_headers, do: @security_headers

  @doc "Answers with any content type and extra headers."
  def send_resp(%__MODULE__{adapter: adapter, req: req}, status, content_type, body, headers) do
    adapter.send_resp(
      req,
      status,
      [{"Content-Type", content_type} | @security_headers ++ headers],
      body
    )
  end

  @typedoc "A chunked answer under way: its adapter and the adapter's handle."
  @opaque stream :: {module(), term()}

  @doc """
  Starts a chunked answer: the status and `headers` (the security headers added) go
  now, the body in `chunk/2`s, and `end_chunked/1` ends it.
  """
  @spec send_chunked(t(), pos_integer(), [{String.t(), String.t()}]) :: stream()
  def send_chunked(%__MODULE__{adapter: adapter, req: req}, status, headers),
    do: {adapter, adapter.send_chunked(req, status, headers ++ @security_headers)}

  @doc "Sends a chunk; `{:error, :closed}` when the client has gone."
  @spec chunk(stream(), iodata()) :: :ok | {:error, :closed}
  def chunk({adapter, stream}, data), do: adapter.chunk(stream, data)

  @doc "Ends a chunked answer."
  @spec end_chunked(stream()) :: :ok
  def end_chunked({adapter, stream}), do: adapter.end_chunked(stream)

  @doc """
  The client's socket, to watch for a hang-up while the request waits on something
  else (`active: :once`); nil where the server does not hand it out (a host's endpoint).
  """
  @spec client_socket(t()) :: port() | nil
  def client_socket(%__MODULE__{adapter: adapter, req: req}), do: adapter.client_socket(req)

  @doc "Closes the connection after this answer (bytes of a next request were taken)."
  @spec close_after(t()) :: :ok
  def close_after(%__MODULE__{adapter: adapter, req: req}), do: adapter.close_after(req)

  @doc "Ends a request whose client hung up."
  @spec client_gone(t()) :: :ok
  def client_gone(%__MODULE__{adapter: adapter, req: req}), do: adapter.client_gone(req)
end
