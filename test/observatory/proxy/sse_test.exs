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

  describe "issue 20 finding 6: one giant server-sent event costs linear work" do
    # Reductions count the work done in this process (BIFs such as :binary.matches/2
    # and binary copies report theirs): unlike time, they do not depend on the load.
    defp reductions(fun) do
      {:reductions, before} = Process.info(self(), :reductions)
      result = fun.()
      {:reductions, later} = Process.info(self(), :reductions)
      {later - before, result}
    end

    defp giant_event(bytes), do: "data: {\"x\":\"" <> String.duplicate("a", bytes) <> "\"}\n\n"

    defp in_pieces(text, size) do
      whole = for <<piece::binary-size(size) <- text>>, do: piece
      whole ++ [binary_part(text, div(byte_size(text), size) * size, rem(byte_size(text), size))]
    end

    test "a 2 MiB event in 4 KiB writes costs about what it costs in one write" do
      event = giant_event(2 * 1024 * 1024)

      {one_write, {[%{data: %{"x" => x}}], ^event, _}} =
        reductions(fn -> SSE.parse(SSE.new(), event) end)

      assert byte_size(x) == 2 * 1024 * 1024

      {pieces, {events, passed, _}} = reductions(fn -> feed(in_pieces(event, 4096)) end)
      assert [%{data: %{"x" => ^x}}] = events
      assert passed == event

      # Before: every piece re-scanned and re-copied the whole buffer — 54 million
      # reductions against 0.5 million for one write (and 1.2 s against 15 ms).
      assert pieces < 3 * one_write,
             "4 KiB writes: #{pieces} reductions; one write: #{one_write}"
    end

    test "an event over the cap is an error, whether it arrives whole or in pieces" do
      event = giant_event(2048)
      assert {:error, :event_too_large} = SSE.parse(SSE.new(1024), event)

      assert {:error, :event_too_large} =
               Enum.reduce_while(in_pieces(event, 100), SSE.new(1024), fn piece, sse ->
                 case SSE.parse(sse, piece) do
                   {:error, _} = error -> {:halt, error}
                   {_events, _passed, sse} -> {:cont, sse}
                 end
               end)

      # Small events past the cap in total are fine: the cap is per event.
      small = String.duplicate("data: {}\n\n", 300)
      assert {events, ^small, _} = SSE.parse(SSE.new(1024), small)
      assert length(events) == 300
    end
  end
end
