defmodule Observatory.Proxy.SSE do
  @moduledoc """
  An incremental reader of server-sent events, for the proxy to follow the text of a
  streamed answer while it passes the bytes on unchanged.

      {[], "", sse} = SSE.parse(SSE.new(), "event: ping\\ndata: {\\"a\\"")
      {[%{event: "ping", data: %{"a" => 1}}], complete, _sse} = SSE.parse(sse, ": 1}\\n\\n")
      # complete == "event: ping\\ndata: {\\"a\\": 1}\\n\\n"

  An event's `data` is its `data:` lines joined with newlines, decoded as JSON when it
  is JSON (else the raw text, e.g. OpenAI's closing `[DONE]`). What waits for the end
  of an event is at most the proxy's answer cap, which bounds the whole stream.
  """

  alias Observatory.JSON

  @type event :: %{event: String.t() | nil, data: term()}
  @type t :: %{buffer: binary()}

  @spec new() :: t()
  def new, do: %{buffer: ""}

  @doc """
  Adds bytes; returns the events they complete, in order, and the raw bytes up to
  the end of the last complete event — what may be passed on without ever handing
  the client half an event. The rest waits in the reader (`rest/1`).
  """
  @spec parse(t(), iodata()) :: {[event()], binary(), t()}
  def parse(%{buffer: buffer}, data) do
    raw = buffer <> IO.iodata_to_binary(data)

    case :binary.matches(raw, ["\n\n", "\r\n\r\n", "\r\r"]) do
      [] ->
        {[], "", %{buffer: raw}}

      matches ->
        {at, length} = List.last(matches)
        <<complete::binary-size(at + length), rest::binary>> = raw
        # Line ends may be CRLF, LF or CR; an empty line ends an event.
        blocks = String.split(String.replace(complete, ["\r\n", "\r"], "\n"), "\n\n")
        {for(block <- blocks, event = event(block), do: event), complete, %{buffer: rest}}
    end
  end

  @doc "The bytes of an event not completed yet."
  @spec rest(t()) :: binary()
  def rest(%{buffer: buffer}), do: buffer

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
