defmodule Observatory.Proxy.SSE do
  @moduledoc """
  An incremental reader of server-sent events, for the proxy to follow the text of a
  streamed answer while it passes the bytes on unchanged.

      {[], "", sse} = SSE.parse(SSE.new(), "event: ping\\ndata: {\\"a\\"")
      {[%{event: "ping", data: %{"a" => 1}}], complete, _sse} = SSE.parse(sse, ": 1}\\n\\n")
      # complete == "event: ping\\ndata: {\\"a\\": 1}\\n\\n"

  An event's `data` is its `data:` lines joined with newlines, decoded as JSON when it
  is JSON (else the raw text, e.g. OpenAI's closing `[DONE]`).

  **Linear.** Each byte is scanned for an event's end once (with the last three bytes
  of the piece before it, where a `\\r\\n\\r\\n` may begin) and copied once, when its
  event is complete: an event that arrives in many small pieces costs what it would
  cost in one. (Appending each piece to a buffer and searching the whole buffer again
  made one 2 MiB event sent in 4 KiB writes cost 3 s.)

  **Capped.** An event longer than `:max_event_bytes` (default 4 MiB; the proxy passes
  `:llm_max_event_bytes`) is an error, `{:error, :event_too_large}`: a broken or
  hostile upstream cannot make the proxy hold an unbounded event.
  """

  alias Observatory.JSON

  @type event :: %{event: String.t() | nil, data: term()}
  @opaque t :: %{
            pending: iodata(),
            size: non_neg_integer(),
            tail: binary(),
            max: pos_integer()
          }

  @default_max_event_bytes 4 * 1024 * 1024
  @ends ["\n\n", "\r\n\r\n", "\r\r"]
  # The longest event end is 4 bytes: 3 of them may sit at the end of the last piece.
  @tail_bytes 3

  @doc "A reader; `max_event_bytes` caps one event (default 4 MiB)."
  @spec new(pos_integer()) :: t()
  def new(max_event_bytes \\ @default_max_event_bytes),
    do: %{pending: [], size: 0, tail: "", max: max_event_bytes}

  @doc """
  Adds bytes; returns the events they complete, in order, and the raw bytes up to
  the end of the last complete event — what may be passed on without ever handing
  the client half an event. The rest waits in the reader (`rest/1`).
  """
  @spec parse(t(), iodata()) :: {[event()], binary(), t()} | {:error, :event_too_large}
  def parse(sse, data) do
    data = IO.iodata_to_binary(data)
    tail = sse.tail
    # Positions in `window` are shifted by the tail's length against `data`.
    window = tail <> data
    shift = byte_size(tail)

    case :binary.matches(window, @ends) do
      [] ->
        add_pending(sse, data)

      matches ->
        ends = for {at, length} <- matches, do: at + length - shift

        if longest_event(sse.size, ends) > sse.max do
          {:error, :event_too_large}
        else
          last = List.last(ends)
          <<head::binary-size(last), rest::binary>> = data
          complete = IO.iodata_to_binary([sse.pending, head])
          sse = %{sse | pending: [], size: 0, tail: ""}

          case add_pending(sse, rest) do
            {:error, _} = error -> error
            {[], "", sse} -> {events(complete), complete, sse}
          end
        end
    end
  end

  @doc """
  The complete events of `complete` (as `parse/2` returned them) without those for
  which `fun` is true, each ending with a blank line (line ends made `\\n`).
  """
  @spec reject(binary(), (event() -> boolean())) :: binary()
  def reject(complete, fun) do
    complete
    |> String.replace(["\r\n", "\r"], "\n")
    |> String.split("\n\n")
    |> Enum.reject(fn block ->
      block == "" or
        case event(block) do
          nil -> false
          event -> fun.(event)
        end
    end)
    |> Enum.map_join(&(&1 <> "\n\n"))
  end

  @doc "The bytes of an event not completed yet."
  @spec rest(t()) :: binary()
  def rest(sse), do: IO.iodata_to_binary(sse.pending)

  defp add_pending(sse, ""), do: {[], "", sse}

  defp add_pending(sse, data) do
    size = sse.size + byte_size(data)

    if size > sse.max do
      {:error, :event_too_large}
    else
      tail = last_bytes(sse.tail <> last_bytes(data, @tail_bytes), @tail_bytes)
      {[], "", %{sse | pending: [sse.pending | data], size: size, tail: tail}}
    end
  end

  defp last_bytes(data, n) when byte_size(data) <= n, do: data
  defp last_bytes(data, n), do: binary_part(data, byte_size(data) - n, n)

  # The longest of the events that end at `ends` (offsets in the new piece), the
  # first one including the `pending` bytes before the piece.
  defp longest_event(pending, ends) do
    {longest, _} =
      Enum.reduce(ends, {0, -pending}, fn at, {longest, from} -> {max(longest, at - from), at} end)

    longest
  end

  defp events(complete) do
    # Line ends may be CRLF, LF or CR; an empty line ends an event.
    complete
    |> String.replace(["\r\n", "\r"], "\n")
    |> String.split("\n\n")
    |> Enum.flat_map(fn block -> List.wrap(event(block)) end)
  end

  defp event(block) do
    {name, data} =
      block
      |> String.split("\n")
      |> Enum.reduce({nil, []}, fn
        "event:" <> name, {_, data} -> {String.trim(name), data}
        "data:" <> value, {name, data} -> {name, [strip(value) | data]}
        _comment_or_other, acc -> acc
      end)

    if data != [] do
      data = data |> Enum.reverse() |> Enum.join("\n")

      case JSON.decode(data) do
        {:ok, decoded} -> %{event: name, data: decoded}
        {:error, _} -> %{event: name, data: data}
      end
    end
  end

  defp strip(" " <> value), do: value
  defp strip(value), do: value
end
