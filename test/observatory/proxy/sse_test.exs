defmodule Observatory.Proxy.SSETest do
  use ExUnit.Case, async: true

  alias Observatory.Proxy.SSE

  # Feeds `pieces` one by one; returns the events and the bytes passed on.
  defp feed(pieces) do
    {events, passed, sse} =
      Enum.reduce(pieces, {[], "", SSE.new()}, fn piece, {events, passed, sse} ->
        {new, complete, sse} = SSE.parse(sse, piece)
        {events ++ new, passed <> complete, sse}
      end)

    {events, passed, SSE.rest(sse)}
  end

  describe "issue 15: server-sent events read as they arrive" do
    test "events split anywhere, in any line-end style, come out whole and in order" do
      text =
        "event: message_start\r\ndata: {\"n\": 1}\r\n\r\n: comment\n\n" <>
          "data: line one\ndata: line two\n\ndata: [DONE]\r\rdata: {\"half\""

      for size <- [1, 2, 3, 7, 64] do
        pieces = for <<piece::binary-size(size) <- text>>, do: piece
        tail = binary_part(text, div(byte_size(text), size) * size, rem(byte_size(text), size))
        {events, passed, rest} = feed(pieces ++ [tail])

        assert events == [
                 %{event: "message_start", data: %{"n" => 1}},
                 %{event: nil, data: "line one\nline two"},
                 %{event: nil, data: "[DONE]"}
               ],
               "pieces of #{size}"

        # Only whole events are passed on; the unfinished one waits.
        assert passed <> rest == text
        assert rest == "data: {\"half\""
      end
    end
  end
end
