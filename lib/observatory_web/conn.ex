defmodule ObservatoryWeb.Conn do
  @moduledoc """
  One HTTP request and the functions to answer it, over a MochiWeb request.

  Handlers get a `%Conn{}` with the method, the decoded path segments and the query,
  and answer with `json/3`, `text/4`, `html/4`, `redirect/3` or `no_content/1`. Reading the body is explicit
  (`read_body/1`) and bounded by `:max_body_bytes`.

  Every path segment, query parameter and header value is valid UTF-8, no header
  value holds a control character (tab aside), and a `Content-Length` is a decimal
  number: a request where one is not carries
  `bad_request` (the reason) and the router answers `400` before any handler runs.
  `remote_ip` is the TCP peer's address; `X-Forwarded-For` is not trusted.
  """

  alias Observatory.JSON

  defstruct [:req, :method, :path_info, :query, :remote_ip, :bad_request]

  @type t :: %__MODULE__{
          req: term(),
          method: String.t(),
          path_info: [String.t()],
          query: %{String.t() => String.t()},
          remote_ip: String.t() | nil,
          bad_request: String.t() | nil
        }

  @security_headers [
    {"X-Content-Type-Options", "nosniff"},
    {"X-Frame-Options", "DENY"},
    {"Referrer-Policy", "no-referrer"}
  ]

  @doc false
  def new(req) do
    raw = :mochiweb_request.get(:raw_path, req) |> bytes()
    {path, query} = split_query(raw)
    segments = for seg <- String.split(path, "/", trim: true), do: decode_segment(seg)
    query = decode_query(query)

    %__MODULE__{
      req: req,
      method: req |> then(&:mochiweb_request.get(:method, &1)) |> to_string(),
      path_info: for({:ok, seg} <- segments, do: seg),
      query: if(is_map(query), do: query, else: %{}),
      remote_ip: peer(req)
    }
    |> refuse_unless(Enum.all?(segments, &match?({:ok, _}, &1)), "the path is not valid UTF-8")
    |> refuse_unless(is_map(query), "the query string is not valid UTF-8")
    |> refuse_unless(headers_utf8?(req), "a header is not valid UTF-8")
    |> refuse_unless(header_values_clean?(req), "a header value contains a control character")
    |> refuse_unless(content_length_ok?(req), "Content-Length must be a decimal number")
  end

  defp refuse_unless(%{bad_request: nil} = conn, false, reason), do: %{conn | bad_request: reason}
  defp refuse_unless(conn, _ok, _reason), do: conn

  # MochiWeb hands out paths and header values as lists of bytes: keep the bytes
  # (`to_string/1` would read each byte as a code point and hide invalid UTF-8).
  defp bytes(value) when is_list(value), do: :erlang.list_to_binary(value)
  defp bytes(value) when is_binary(value), do: value
  defp bytes(value) when is_atom(value), do: Atom.to_string(value)

  defp split_query(raw) do
    case String.split(raw, "?", parts: 2) do
      [path, query] -> {path, query}
      [path] -> {path, ""}
    end
  end

  # Strict: a `%` not followed by two hex digits is an error (URI.decode/1 keeps it).
  defp decode_segment(seg) do
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

  defp decode_query(query) do
    decoded = URI.decode_query(query)
    if Enum.all?(decoded, fn {k, v} -> String.valid?(k) and String.valid?(v) end), do: decoded
  rescue
    ArgumentError -> nil
  end

  defp headers_utf8?(req) do
    req
    |> then(&:mochiweb_request.get(:headers, &1))
    |> :mochiweb_headers.to_list()
    |> Enum.all?(fn {name, value} ->
      String.valid?(bytes(name)) and String.valid?(bytes(value))
    end)
  end

  # MochiWeb keeps a folded line's `\r\n ` and a bare `\r` inside a value: passed
  # on (the proxy forwards `anthropic-version`), they would split an upstream head.
  # Tab is the one control character a value may hold (RFC 9110 field-vchar, OWS).
  defp header_values_clean?(req) do
    req
    |> then(&:mochiweb_request.get(:headers, &1))
    |> :mochiweb_headers.to_list()
    |> Enum.all?(fn {_name, value} -> not control_char?(bytes(value)) end)
  end

  defp control_char?(<<c, _::binary>>) when (c < 0x20 and c != ?\t) or c == 0x7F, do: true
  defp control_char?(<<_, rest::binary>>), do: control_char?(rest)
  defp control_char?(<<>>), do: false

  defp content_length_ok?(req) do
    case :mochiweb_request.get_header_value(~c"content-length", req) do
      :undefined -> true
      value -> value |> bytes() |> String.trim() |> decimal?()
    end
  end

  defp decimal?(<<>>), do: false
  defp decimal?(text) when byte_size(text) > 19, do: false
  defp decimal?(text), do: for(<<c <- text>>, reduce: true, do: (ok -> ok and c in ?0..?9))

  # The socket's peer: MochiWeb's own `peer` believes X-Forwarded-For when the peer
  # is on loopback or a private network, which would let a client pick its address.
  defp peer(req) do
    case :mochiweb_socket.peername(:mochiweb_request.get(:socket, req)) do
      {:ok, {address, _port}} -> address |> :inet.ntoa() |> to_string()
      _ -> nil
    end
  end

  @doc "A request header's value, or nil."
  @spec header(t(), String.t()) :: String.t() | nil
  def header(%__MODULE__{req: req}, name) do
    case :mochiweb_request.get_header_value(String.to_charlist(name), req) do
      :undefined -> nil
      value -> bytes(value)
    end
  end

  @doc "A cookie's value, or nil."
  @spec cookie(t(), String.t()) :: String.t() | nil
  def cookie(%__MODULE__{req: req}, name) do
    case :mochiweb_request.get_cookie_value(String.to_charlist(name), req) do
      :undefined -> nil
      value -> bytes(value)
    end
  end

  @doc "The request's media type (`content-type` without parameters), lowercased."
  @spec content_type(t()) :: String.t() | nil
  def content_type(conn) do
    case header(conn, "content-type") do
      nil -> nil
      value -> value |> String.split(";") |> hd() |> String.trim() |> String.downcase()
    end
  end

  @doc """
  Reads the whole body, at most `:max_body_bytes` (default 1 MiB), within the
  endpoint's `idle_timeout_ms` (past it the connection is closed).
  Returns `{:ok, body}` or `{:error, :too_large}`.
  """
  @spec read_body(t()) :: {:ok, binary()} | {:error, :too_large}
  def read_body(%__MODULE__{req: req}) do
    max = max_body_bytes()

    case ObservatoryWeb.Endpoint.with_read_deadline(fn ->
           :mochiweb_request.recv_body(max, req)
         end) do
      :undefined -> {:ok, ""}
      body -> {:ok, IO.iodata_to_binary(body)}
    end
  catch
    :exit, {:body_too_large, _} -> {:error, :too_large}
    :exit, :body_too_large -> {:error, :too_large}
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
  def no_content(%__MODULE__{req: req}) do
    :mochiweb_request.respond({204, @security_headers, ""}, req)
    :ok
  end

  @doc "The common security headers every response carries."
  @spec security_headers() :: [{String.t(), String.t()}]
  def security_headers, do: @security_headers

  @doc "Answers with any content type and extra headers."
  def send_resp(%__MODULE__{req: req}, status, content_type, body, headers) do
    all = [{"Content-Type", content_type} | @security_headers ++ headers]
    :mochiweb_request.respond({status, all, body}, req)
    :ok
  end
end
