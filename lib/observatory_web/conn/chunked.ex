defmodule ObservatoryWeb.Conn.Chunked do
  @moduledoc false
  # A chunked request body (RFC 9112 §7.1), read from the connection's socket:
  #
  #     chunked-body = *chunk last-chunk trailer-section CRLF
  #     chunk        = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
  #
  # MochiWeb 3.1.1 reads these itself, but it crashes on any chunk extension (the
  # server answered 500) and takes a bare LF for a line end. Here every line must end
  # in CRLF; a chunk size is 1 to 16 hex digits; an extension is ignored unless it
  # holds a control character (a CR or LF inside it, a NUL...), which makes the body
  # malformed; chunk data must be followed by CRLF; the size line and the trailer
  # section are capped. Each byte is read once.

  @max_line 4_096
  @max_trailers 8_192
  @recv_timeout 300_000

  @doc """
  `{:ok, body}`, `{:error, :too_large}` past `max` bytes of data, or
  `{:error, {:malformed, reason}}`. Marks the body as read for MochiWeb (keep-alive).
  """
  def read(req, max) do
    socket = :mochiweb_request.get(:socket, req)
    continue_if_expected(req)
    result = chunks(socket, max, [], 0)
    :mochiweb_socket.setopts(socket, packet: :raw, packet_size: 0)

    case result do
      {:ok, body} ->
        # What mochiweb_request:recv_body/2 records, so that the connection is kept
        # alive and a second read answers the same body.
        Process.put(:mochiweb_request_recv, true)
        Process.put(:mochiweb_request_body, body)
        {:ok, body}

      {:error, :too_large} = error ->
        Process.put(:mochiweb_request_force_close, true)
        error

      {:error, _} = error ->
        error
    end
  end

  @doc false
  # `100 Continue` before a body is read, when the client waits for it (RFC 9110 §10.1.1).
  def continue_if_expected(req) do
    case ObservatoryWeb.Conn.MochiWeb.header("expect") do
      nil ->
        :ok

      value ->
        if ObservatoryWeb.Conn.downcase(value) == "100-continue",
          do: :mochiweb_request.start_raw_response({100, :gb_trees.empty()}, req)

        :ok
    end
  end

  defp chunks(socket, max, acc, size) do
    with {:ok, line} <- line(socket, @max_line),
         {:ok, length} <- chunk_size(line) do
      cond do
        length == 0 ->
          with :ok <- trailers(socket, 0),
               do: {:ok, acc |> Enum.reverse() |> IO.iodata_to_binary()}

        size + length > max ->
          {:error, :too_large}

        true ->
          with {:ok, data} <- recv(socket, length),
               {:ok, "\r\n"} <- recv(socket, 2) do
            chunks(socket, max, [data | acc], size + length)
          else
            {:ok, _} -> malformed("a chunk's data is not followed by CRLF")
            error -> error
          end
      end
    end
  end

  # `chunk-size [ chunk-ext ] CRLF`
  defp chunk_size(line) do
    with {:ok, content} <- crlf_line(line),
         [size | extension] = String.split(content, ";", parts: 2),
         {:ok, length} <- hex(size),
         :ok <- extension_ok(extension) do
      {:ok, length}
    end
  end

  defp hex(size) do
    size = String.trim_trailing(size, " ")

    if byte_size(size) in 1..16 and size =~ ~r/\A[0-9A-Fa-f]+\z/,
      do: {:ok, String.to_integer(size, 16)},
      else: malformed("a chunk size is not 1 to 16 hex digits")
  end

  # Any well-formed extension is ignored; a control character (tab aside) is not allowed.
  defp extension_ok([]), do: :ok

  defp extension_ok([extension]) do
    if control?(extension),
      do: malformed("a chunk extension holds a control character"),
      else: :ok
  end

  defp control?(<<c, _::binary>>) when (c < 0x20 and c != ?\t) or c == 0x7F, do: true
  defp control?(<<_, rest::binary>>), do: control?(rest)
  defp control?(<<>>), do: false

  # Trailer fields are read and ignored, up to the empty line; at most @max_trailers bytes.
  defp trailers(socket, read) do
    with {:ok, line} <- line(socket, @max_line),
         {:ok, content} <- crlf_line(line) do
      cond do
        content == "" -> :ok
        read + byte_size(line) > @max_trailers -> malformed("the trailer section is too long")
        control?(content) -> malformed("a trailer field holds a control character")
        true -> trailers(socket, read + byte_size(line))
      end
    end
  end

  defp crlf_line(line) do
    size = byte_size(line) - 2

    case line do
      <<content::binary-size(size), "\r\n">> -> {:ok, content}
      _ -> malformed("a line does not end with CRLF")
    end
  end

  defp line(socket, max) do
    :ok = :mochiweb_socket.setopts(socket, packet: :line, packet_size: max)

    case :mochiweb_socket.recv(socket, 0, @recv_timeout) do
      {:ok, line} -> {:ok, IO.iodata_to_binary(line)}
      {:error, :emsgsize} -> malformed("a line is longer than #{max} bytes")
      {:error, reason} -> exit({:shutdown, reason})
    end
  end

  defp recv(socket, length) do
    :ok = :mochiweb_socket.setopts(socket, packet: :raw, packet_size: 0)

    case :mochiweb_socket.recv(socket, length, @recv_timeout) do
      {:ok, data} -> {:ok, IO.iodata_to_binary(data)}
      {:error, reason} -> exit({:shutdown, reason})
    end
  end

  defp malformed(reason), do: {:error, {:malformed, reason}}
end
