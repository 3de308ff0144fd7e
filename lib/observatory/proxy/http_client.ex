defmodule Observatory.Proxy.HTTPClient do
  @moduledoc """
  One HTTP/1.1 request to an LLM upstream, over a connection of its own, read piece
  by piece in the caller's process.

      {:ok, conn} = HTTPClient.request("https://api.openai.com/v1/chat/completions", headers, body)
      # or a GET: HTTPClient.request(url, headers, "", method: "GET")
      {:ok, status, headers, conn} = HTTPClient.read_head(conn)
      {:data, piece, conn} = HTTPClient.read(conn)   # … until {:done, conn}
      :ok = HTTPClient.close(conn)

  Why not `:httpc`: it shares connections between requests (a fast request waited
  behind slow ones on a busy keep-alive connection), it buffers a whole answer before
  the caller sees any of it (no cap, no streaming for non-2xx answers), and a request
  cannot be tied to the client that asked for it. Here each request has its own
  socket (`Connection: close`), so requests never queue behind each other; the body
  is handed over as it arrives and counted against `:max_bytes` (nothing beyond the
  cap is ever buffered); and with `:watch` set to the agent's socket, the agent
  hanging up ends the wait at once with `{:error, :client_closed}` — the caller then
  closes the upstream connection, which cancels the upstream request.

  HTTPS verifies the upstream's certificate against the OS's CA store and its host
  name. Bodies are read by `Content-Length`, chunked transfer coding, or until the
  upstream closes.

  ## Options (of `request/4`)
    * `:method` — `"POST"` (default) or `"GET"` (sent without a body)
    * `:connect_timeout` — ms to connect (default 5 000)
    * `:timeout` — ms any one wait for the upstream may take (default 600 000); past
      it the wait ends with `{:error, :timeout}`
    * `:deadline` — a `System.monotonic_time(:millisecond)` after which every wait
      ends with `{:error, :deadline}` (default: none)
    * `:cancel` — a reference: a message `{:cancel, ref, reason}` sent to the reading
      process ends its wait at once with `{:error, {:cancelled, reason}}` (the caller
      then closes the connection, which cancels the upstream request)
    * `:max_bytes` — the body's byte cap; past it `read/1` gives `{:error, :too_large}`
    * `:watch` — the agent's socket (`:gen_tcp`), already in `active: :once` mode;
      bytes from it while waiting (the agent's next request) end the watching and
      mark the agent's MochiWeb connection to close after this answer
  """

  defstruct [
    :socket,
    :transport,
    :watch,
    :timeout,
    :deadline,
    :cancel,
    :max_bytes,
    buffer: "",
    body: nil,
    received: 0
  ]

  @type t :: %__MODULE__{}
  @type reason ::
          :timeout
          | :closed
          | :client_closed
          | :too_large
          | {:connect, term()}
          | {:bad_response, String.t()}

  @max_head_bytes 64 * 1024
  @max_chunk_line 1024

  @doc """
  Connects to `url` and sends the request (a POST of `body` unless `method: "GET"`)
  with `headers` (name/value strings).
  """
  @spec request(String.t(), [{String.t(), String.t()}], iodata(), keyword()) ::
          {:ok, t()} | {:error, reason()}
  def request(url, headers, body, opts \\ []) do
    uri = URI.parse(url)
    transport = if uri.scheme == "https", do: :ssl, else: :gen_tcp
    host = String.to_charlist(uri.host || "")
    path = (uri.path || "/") <> if(uri.query, do: "?" <> uri.query, else: "")

    with {:ok, socket} <- connect(transport, host, uri.port, opts) do
      conn = %__MODULE__{
        socket: socket,
        transport: transport,
        watch: opts[:watch],
        timeout: Keyword.get(opts, :timeout, 600_000),
        deadline: opts[:deadline],
        cancel: opts[:cancel],
        max_bytes: Keyword.get(opts, :max_bytes, :infinity)
      }

      method = Keyword.get(opts, :method, "POST")

      length =
        if method == "GET",
          do: [],
          else: ["content-length: ", Integer.to_string(IO.iodata_length(body)), "\r\n"]

      head = [
        method,
        " ",
        path,
        " HTTP/1.1\r\nhost: ",
        host_header(uri),
        "\r\nconnection: close\r\n",
        length,
        for({name, value} <- headers, do: [name, ": ", value, "\r\n"]),
        "\r\n"
      ]

      body = if method == "GET", do: [], else: body

      case transport.send(socket, [head, body]) do
        :ok ->
          {:ok, conn}

        {:error, _} ->
          close(conn)
          {:error, :closed}
      end
    end
  end

  @doc """
  Reads the status line and headers (an interim `1xx` answer is skipped). Header
  names are lowercased.
  """
  @spec read_head(t()) ::
          {:ok, pos_integer(), [{String.t(), String.t()}], t()} | {:error, reason()}
  def read_head(conn) do
    case parse_head(conn.buffer) do
      {:ok, status, _headers, rest} when status in 100..199 ->
        read_head(%{conn | buffer: rest})

      {:ok, status, headers, rest} ->
        {:ok, status, headers, %{conn | buffer: rest, body: body_mode(headers)}}

      :more when byte_size(conn.buffer) > @max_head_bytes ->
        {:error, {:bad_response, "its headers exceed #{@max_head_bytes} bytes"}}

      :more ->
        with {:ok, conn} <- receive_more(conn), do: read_head(conn)

      {:error, message} ->
        {:error, {:bad_response, message}}
    end
  end

  @doc """
  The next piece of the body: `{:data, iodata, conn}`, `{:done, conn}` at its end, or
  an error — `{:error, :too_large}` as soon as the body exceeds `:max_bytes`.
  """
  @spec read(t()) :: {:data, iodata(), t()} | {:done, t()} | {:error, reason()}
  def read(%{body: :done} = conn), do: {:done, conn}

  def read(conn) do
    case take(conn.buffer, conn.body) do
      {:ok, data, rest, mode} ->
        size = IO.iodata_length(data)
        conn = %{conn | buffer: rest, body: mode, received: conn.received + size}

        cond do
          over?(conn.received, conn.max_bytes) -> {:error, :too_large}
          size > 0 -> {:data, data, conn}
          mode == :done -> {:done, conn}
          true -> read_more(conn)
        end

      {:error, message} ->
        {:error, {:bad_response, message}}
    end
  end

  defp read_more(conn) do
    case receive_more(conn) do
      {:ok, conn} -> read(conn)
      {:error, :closed} when conn.body == :until_close -> {:done, %{conn | body: :done}}
      {:error, :closed} -> {:error, {:bad_response, "it closed the connection mid-answer"}}
      error -> error
    end
  end

  @doc "Reads the whole body (at most `:max_bytes`) as one binary."
  @spec read_all(t()) :: {:ok, binary(), t()} | {:error, reason()}
  def read_all(conn, acc \\ []) do
    case read(conn) do
      {:data, data, conn} -> read_all(conn, [acc | data])
      {:done, conn} -> {:ok, IO.iodata_to_binary(acc), conn}
      error -> error
    end
  end

  @doc "Closes the connection (which cancels the request if it is still running)."
  @spec close(t()) :: :ok
  def close(%{transport: transport, socket: socket}) do
    transport.close(socket)
    :ok
  end

  ## Connecting

  defp connect(:gen_tcp, host, port, opts) do
    options = [:binary, active: false, packet: :raw, nodelay: true]

    case :gen_tcp.connect(host, port || 80, options, connect_timeout(opts)) do
      {:ok, socket} -> {:ok, socket}
      {:error, reason} -> {:error, {:connect, reason}}
    end
  end

  defp connect(:ssl, host, port, opts) do
    with :ok <- ensure_ssl(),
         {:ok, cas} <- trusted_cas(opts[:cacertfile]),
         options = [
           :binary,
           active: false,
           packet: :raw,
           verify: :verify_peer,
           cacerts: cas,
           server_name_indication: host,
           customize_hostname_check: [
             match_fun: :public_key.pkix_verify_hostname_match_fun(:https)
           ]
         ],
         {:ok, socket} <- :ssl.connect(host, port || 443, options, connect_timeout(opts)) do
      {:ok, socket}
    else
      {:error, reason} -> {:error, {:connect, reason}}
    end
  end

  # The system's CA store, or the certificates of a PEM file an operator configured
  # (`:llm_upstream_cacertfile`: an upstream behind a private CA).
  defp trusted_cas(nil), do: {:ok, :public_key.cacerts_get()}

  defp trusted_cas(path) do
    case File.read(path) do
      {:ok, pem} ->
        {:ok, for({:Certificate, der, :not_encrypted} <- :public_key.pem_decode(pem), do: der)}

      {:error, reason} ->
        {:error, {:cacertfile, reason}}
    end
  end

  defp ensure_ssl do
    case :application.ensure_all_started(:ssl) do
      {:ok, _} -> :ok
      error -> error
    end
  end

  defp connect_timeout(opts), do: Keyword.get(opts, :connect_timeout, 5_000)

  defp host_header(%URI{host: host, port: port, scheme: scheme}) do
    default = if scheme == "https", do: 443, else: 80
    if port in [nil, default], do: host, else: "#{host}:#{port}"
  end

  ## Receiving: the upstream socket and the agent's, in one receive

  defp receive_more(%{transport: transport, socket: socket, watch: watch, cancel: cancel} = conn) do
    :ok = setopts(transport, socket, active: :once)
    {tag, closed, error} = tags(transport)
    {wait_ms, expired} = wait(conn)

    receive do
      {^tag, ^socket, data} ->
        {:ok, %{conn | buffer: conn.buffer <> data}}

      {^closed, ^socket} ->
        {:error, :closed}

      {^error, ^socket, _reason} ->
        {:error, :closed}

      {closed_tag, ^watch} when closed_tag in [:tcp_closed, :ssl_closed] ->
        {:error, :client_closed}

      {error_tag, ^watch, _} when error_tag in [:tcp_error, :ssl_error] ->
        {:error, :client_closed}

      {data_tag, ^watch, _} when data_tag in [:tcp, :ssl] ->
        # The agent sent (the start of) its next request, and these bytes are gone
        # from its socket: MochiWeb must close the connection after this answer
        # rather than read a request from the middle. Watching stops here.
        Process.put(:mochiweb_request_force_close, true)
        receive_more(%{conn | watch: nil})

      {:cancel, ^cancel, reason} when cancel != nil ->
        {:error, {:cancelled, reason}}
    after
      wait_ms -> {:error, expired}
    end
  end

  defp tags(:gen_tcp), do: {:tcp, :tcp_closed, :tcp_error}
  defp tags(:ssl), do: {:ssl, :ssl_closed, :ssl_error}

  defp setopts(:gen_tcp, socket, opts), do: :inet.setopts(socket, opts)
  defp setopts(:ssl, socket, opts), do: :ssl.setopts(socket, opts)

  # How long the next wait may take, and what it is called when it runs out.
  defp wait(%{timeout: timeout, deadline: nil}), do: {timeout, :timeout}

  defp wait(%{timeout: timeout, deadline: deadline}) do
    left = max(0, deadline - System.monotonic_time(:millisecond))
    if left < timeout, do: {left, :deadline}, else: {timeout, :timeout}
  end

  defp over?(_received, :infinity), do: false
  defp over?(received, max), do: received > max

  ## Parsing the head

  defp parse_head(buffer) do
    case :erlang.decode_packet(:http_bin, buffer, []) do
      {:ok, {:http_response, _version, status, _reason}, rest} -> parse_headers(rest, status, [])
      {:ok, _other, _} -> {:error, "it did not answer with an HTTP status line"}
      {:more, _} -> :more
      {:error, _} -> {:error, "it did not answer with an HTTP status line"}
    end
  end

  defp parse_headers(buffer, status, acc) do
    case :erlang.decode_packet(:httph_bin, buffer, []) do
      {:ok, {:http_header, _, name, _, value}, rest} ->
        parse_headers(rest, status, [{name |> to_string() |> String.downcase(), value} | acc])

      {:ok, :http_eoh, rest} ->
        {:ok, status, Enum.reverse(acc), rest}

      {:more, _} ->
        :more

      _ ->
        {:error, "it answered with malformed headers"}
    end
  end

  defp body_mode(headers) do
    header = fn name -> for({^name, value} <- headers, do: value) |> List.first() end

    cond do
      header.("transfer-encoding") |> to_string() |> String.downcase() =~ "chunked" ->
        :size

      length = header.("content-length") ->
        case Integer.parse(String.trim(length)) do
          {n, ""} when n >= 0 -> {:length, n}
          _ -> :until_close
        end

      true ->
        :until_close
    end
  end

  ## Taking body bytes out of the buffer: {:ok, data, rest, mode} | {:error, message}

  defp take(buffer, :until_close), do: {:ok, buffer, "", :until_close}
  defp take(_buffer, {:length, 0}), do: {:ok, [], "", :done}

  defp take(buffer, {:length, n}) when byte_size(buffer) >= n,
    do: {:ok, binary_part(buffer, 0, n), "", :done}

  defp take(buffer, {:length, n}), do: {:ok, buffer, "", {:length, n - byte_size(buffer)}}
  defp take(buffer, mode), do: dechunk(buffer, mode, [])

  # Chunked transfer coding, incrementally: mode is :size (a size line is next),
  # {:chunk, n} (n data bytes left), :crlf (the CRLF after a chunk) or :trailers.
  defp dechunk(buffer, :size, out) do
    case :binary.split(buffer, "\r\n") do
      [line, rest] ->
        case chunk_size(line) do
          {:ok, 0} -> dechunk(rest, :trailers, out)
          {:ok, n} -> dechunk(rest, {:chunk, n}, out)
          :error -> {:error, "it sent a malformed chunk size"}
        end

      [_] when byte_size(buffer) > @max_chunk_line ->
        {:error, "it sent a malformed chunk size"}

      [_] ->
        {:ok, out, buffer, :size}
    end
  end

  defp dechunk(buffer, {:chunk, n}, out) when byte_size(buffer) >= n do
    <<data::binary-size(n), rest::binary>> = buffer
    dechunk(rest, :crlf, [out | data])
  end

  defp dechunk(buffer, {:chunk, n}, out),
    do: {:ok, [out | buffer], "", {:chunk, n - byte_size(buffer)}}

  defp dechunk("\r\n" <> rest, :crlf, out), do: dechunk(rest, :size, out)
  defp dechunk(buffer, :crlf, out) when byte_size(buffer) < 2, do: {:ok, out, buffer, :crlf}
  defp dechunk(_buffer, :crlf, _out), do: {:error, "it sent a chunk without its CRLF"}

  defp dechunk(buffer, :trailers, out) do
    case :binary.split(buffer, "\r\n") do
      ["", _rest] -> {:ok, out, "", :done}
      [_trailer, rest] -> dechunk(rest, :trailers, out)
      [_] when byte_size(buffer) > @max_head_bytes -> {:error, "its trailers are too large"}
      [_] -> {:ok, out, buffer, :trailers}
    end
  end

  defp chunk_size(line) do
    hex = line |> :binary.split(";") |> hd() |> String.trim()

    case Integer.parse(hex, 16) do
      {n, ""} when n >= 0 and byte_size(hex) <= 16 -> {:ok, n}
      _ -> :error
    end
  end
end
