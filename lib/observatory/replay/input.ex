defmodule Observatory.Replay.Input do
  @moduledoc """
  Reads JSONL input for `Observatory.Replay`, chunk by chunk, so a big file never
  has to fit in memory.

  A source is a file path, `:stdio`, or `{:device, io_device}` (e.g. a `StringIO`).
  Gzip input is recognised by its magic bytes (`0x1f 0x8b`), not by its name, and is
  inflated as it is read with `:zlib` (window bits 31: gzip framing). Concatenated
  gzip members (`cat a.gz b.gz`) are read one after the other, as `zcat` does; a
  truncated or corrupt file ends its source with an error.

  An IO device is read as bytes: one in unicode mode (stdin under `mix`) is switched
  to latin1, which passes bytes through, while it is read.

  Lines end with `\\n` (a trailing `\\r` is dropped) and are numbered from 1 in each
  source. Blank lines keep their number but are not emitted.

      iex> {:ok, io} = StringIO.open(~s({"a": 1}\\n\\n{"b": 2}))
      iex> Observatory.Replay.Input.lines({:device, io}) |> Enum.to_list()
      [{1, ~s({"a": 1})}, {3, ~s({"b": 2})}]
  """

  @chunk_bytes 256 * 1024
  @gzip_magic <<0x1F, 0x8B>>

  @type source :: Path.t() | :stdio | {:device, IO.device()}

  @typedoc """
  One step of reading: the non-blank lines completed by a chunk and the raw (maybe
  compressed) bytes read so far, or an error that ended the source.
  """
  @type chunk :: {:lines, [{pos_integer(), binary()}], non_neg_integer()} | {:error, String.t()}

  @doc "The source's non-blank lines, `{line_number, line}`; raises on a read error."
  @spec lines(source()) :: Enumerable.t()
  def lines(source) do
    source
    |> chunks()
    |> Stream.flat_map(fn
      {:lines, lines, _bytes} -> lines
      {:error, reason} -> raise File.Error, reason: reason, action: "read", path: name(source)
    end)
  end

  @doc """
  The source as a stream of `t:chunk/0`. A read or gzip error is the stream's last
  element, after the lines read before it.
  """
  @spec chunks(source()) :: Enumerable.t()
  def chunks(source) do
    Stream.resource(fn -> open(source) end, &next/1, &close/1)
  end

  @doc "The size of a file source in bytes, or nil (stdin, devices, unreadable files)."
  @spec size(source()) :: non_neg_integer() | nil
  def size(path) when is_binary(path) do
    case File.stat(path) do
      {:ok, %File.Stat{type: :regular, size: size}} -> size
      _ -> nil
    end
  end

  def size(_source), do: nil

  @doc "A name for the source in reports: the path, or `\"-\"` for stdin and devices."
  @spec name(source()) :: String.t()
  def name(path) when is_binary(path), do: path
  def name(_source), do: "-"

  ## Reading

  # The state: the reader, the mode (:undecided until the first chunk, then :plain or
  # {:gzip, zstream}), the partial last line, the last line number, raw bytes read.
  defp open(path) when is_binary(path) do
    case File.open(path, [:read, :binary, :raw]) do
      {:ok, fd} ->
        new({:file, fd})

      {:error, reason} ->
        %{failed: "cannot open #{path}: #{:file.format_error(reason)}", done: false}
    end
  end

  defp open(:stdio), do: open({:device, :standard_io})

  # An IO device in unicode mode refuses bytes that are not latin1 characters
  # ({:error, :collect_chars}) and mangles others: it is switched to latin1, which
  # passes bytes through, while it is read, and switched back when done.
  defp open({:device, device}) do
    encoding =
      case :io.getopts(device) do
        opts when is_list(opts) -> Keyword.get(opts, :encoding)
        _ -> nil
      end

    if encoding not in [nil, :latin1], do: :io.setopts(device, encoding: :latin1)
    Map.put(new({:device, device}), :encoding, encoding)
  end

  defp new(reader),
    do: %{reader: reader, mode: :undecided, carry: [], line: 0, bytes: 0, done: false}

  defp next(%{done: true} = state), do: {:halt, state}
  defp next(%{failed: reason} = state), do: {[{:error, reason}], %{state | done: true}}

  defp next(state) do
    case read(state.reader) do
      {:ok, data} ->
        state = %{state | bytes: state.bytes + byte_size(data)}

        case decompress(state, data) do
          {:ok, text, state} ->
            {lines, state} = split(state, text)
            {[{:lines, lines, state.bytes}], state}

          {:error, reason, state} ->
            {[{:error, reason}], %{state | done: true}}
        end

      :eof ->
        finish(state)

      {:error, reason} ->
        {[{:error, "read error: #{inspect(reason)}"}], %{state | done: true}}
    end
  end

  # A one-byte input never got decided: it is plain text.
  defp finish(%{mode: {:undecided, head}} = state),
    do: finish(%{state | mode: :plain, carry: [state.carry | head]})

  defp finish(state) do
    case finish_inflate(state) do
      :ok ->
        last = IO.iodata_to_binary(state.carry)
        lines = if last == "", do: [], else: number([last], state.line + 1, [])
        {[{:lines, lines, state.bytes}], %{state | line: state.line + 1, carry: [], done: true}}

      {:error, reason} ->
        {[{:error, reason}], %{state | done: true}}
    end
  end

  defp close(%{reader: {:file, fd}} = state) do
    File.close(fd)
    close_inflater(state)
  end

  defp close(%{reader: {:device, device}, encoding: encoding} = state) do
    if encoding not in [nil, :latin1], do: :io.setopts(device, encoding: encoding)
    close_inflater(state)
  end

  defp close(state), do: close_inflater(state)

  defp close_inflater(%{mode: {:gzip, z}}), do: :zlib.close(z)
  defp close_inflater(_state), do: :ok

  defp read({:file, fd}), do: :file.read(fd, @chunk_bytes)

  # The request IO.binread/2 makes, with a binary prompt: StringIO in Elixir 1.14
  # cannot echo the atom prompt `:file.read/2` sends when it captures prompts.
  defp read({:device, device}) do
    case :io.request(device, {:get_chars, :latin1, "", @chunk_bytes}) do
      data when is_binary(data) -> {:ok, data}
      :eof -> :eof
      {:error, reason} -> {:error, reason}
      other -> {:error, other}
    end
  end

  ## Gzip

  # The first two bytes decide: gzip magic or plain text. A first read shorter than
  # that (a slow pipe) is kept until more arrives.
  defp decompress(%{mode: :undecided} = state, data),
    do: decompress(%{state | mode: {:undecided, ""}}, data)

  defp decompress(%{mode: {:undecided, head}} = state, data) do
    case head <> data do
      @gzip_magic <> _ = data ->
        z = :zlib.open()
        :ok = :zlib.inflateInit(z, 31, :reset)
        decompress(%{state | mode: {:gzip, z}}, data)

      data when byte_size(data) < 2 ->
        {:ok, "", %{state | mode: {:undecided, data}}}

      data ->
        {:ok, data, %{state | mode: :plain}}
    end
  end

  defp decompress(%{mode: :plain} = state, data), do: {:ok, data, state}

  defp decompress(%{mode: {:gzip, z}} = state, data) do
    {:ok, IO.iodata_to_binary(:zlib.inflate(z, data)), state}
  rescue
    e in ErlangError -> {:error, "gzip: #{inspect(e.original)}", state}
  end

  defp finish_inflate(%{mode: {:gzip, z}}) do
    :zlib.inflateEnd(z)
  rescue
    ErlangError -> {:error, "gzip: unexpected end of input (truncated file?)"}
  end

  defp finish_inflate(_state), do: :ok

  ## Lines

  # Splits the text after the carried partial line; returns the complete lines (in
  # order) and keeps the new partial line.
  defp split(state, text) do
    if :binary.match(text, "\n") == :nomatch do
      {[], %{state | carry: [state.carry | text]}}
    else
      [last | complete] =
        [state.carry | text]
        |> IO.iodata_to_binary()
        |> :binary.split("\n", [:global])
        |> Enum.reverse()

      # `complete` is last line first: numbering it downwards builds the list in order.
      count = length(complete)
      lines = number(complete, state.line + count, [])
      {lines, %{state | carry: [last], line: state.line + count}}
    end
  end

  defp number([], _n, acc), do: acc

  defp number([text | rest], n, acc) do
    case clean(text) do
      nil -> number(rest, n - 1, acc)
      text -> number(rest, n - 1, [{n, text} | acc])
    end
  end

  # The line without its trailing `\r`, or nil when it is blank. JSON lines start with
  # `{`: only a line that starts with white space is trimmed to check.
  defp clean(""), do: nil

  defp clean(text) do
    text = if :binary.last(text) == ?\r, do: binary_part(text, 0, byte_size(text) - 1), else: text

    case text do
      "" ->
        nil

      <<c, _::binary>> when c in [?\s, ?\t, ?\r] ->
        if String.trim(text) == "", do: nil, else: text

      _ ->
        text
    end
  end
end
