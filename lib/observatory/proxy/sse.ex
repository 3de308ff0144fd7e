defmodule Observatory.Proxy.SSE do
  @moduledoc """
  An incremental reader of server-sent events, for the proxy to follow the text of a
  streamed answer while it passes the bytes on unchanged.

      {events, sse} = SSE.parse(SSE.new(), "event: ping\\ndata: {\\"a\\"")
      # events == []: the event is not complete yet
      {[%{event: "ping", data: %{"a" => 1}}], _sse} = SSE.parse(sse, ": 1}\\n\\n")

  An event's `data` is its `data:` lines joined with newlines, decoded as JSON when it
  is JSON (else the raw text, e.g. OpenAI's closing `[DONE]`). What waits for the end
  of an event is at most the proxy's answer cap, which bounds the whole stream.
  """

  alias Observatory.JSON

  @type event :: %{event: String.t() | nil, data: term()}
  @type t :: %{buffer: binary()}

  @spec new() :: t()
  def new, do: %{buffer: ""}

  @doc "Adds bytes; returns the events they complete, in order."
  @spec parse(t(), iodata()) :: {[event()], t()}
  def parse(%{buffer: buffer}, data) do
    text = buffer <> IO.iodata_to_binary(data)
    # A CR at the end may be the first half of a CRLF: keep it for the next piece.
    {text, held} =
      if String.ends_with?(text, "\r"),
        do: {binary_part(text, 0, byte_size(text) - 1), "\r"},
        else: {text, ""}

    # Line ends may be CRLF, LF or CR; an empty line ends an event.
    blocks = String.split(String.replace(text, ["\r\n", "\r"], "\n"), "\n\n")
    {complete, [rest]} = Enum.split(blocks, -1)
    {for(block <- complete, event = event(block), do: event), %{buffer: rest <> held}}
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
