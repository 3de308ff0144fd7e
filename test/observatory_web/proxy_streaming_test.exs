defmodule ObservatoryWeb.ProxyStreamingTest do
  # Issue 15 item 1: "stream": true through the proxy, against stub upstreams on
  # loopback. The agent side is Observatory.Proxy.HTTPClient, so the test sees each
  # piece when it arrives. Changes the proxy's configuration: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.{JSON, KillSwitch}
  alias Observatory.KillSwitch.Upstream, as: Slots
  alias Observatory.KillSwitch.Windows
  alias Observatory.Proxy.{HTTPClient, SSE}
  alias Observatory.Test.{HTTP, Upstream}

  @keys [:llm_upstream, :llm_max_response_bytes]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn -> for {key, value} <- saved, do: Application.put_env(:observatory, key, value) end)

    %{agent: "agent-stream-#{System.unique_integer([:positive])}"}
  end

  defp use_upstream(%{url: url}), do: Application.put_env(:observatory, :llm_upstream, url)

  # Sends a streamed chat request; returns the status, headers and the open connection.
  defp open_stream(agent, prompt) do
    body = JSON.encode!(Map.put(Upstream.request(prompt), :stream, true))

    headers = [
      {"authorization", "Bearer " <> HTTP.key_for(agent)},
      {"content-type", "application/json"}
    ]

    {:ok, conn} =
      HTTPClient.request(HTTP.url("/v1/chat/completions"), headers, body, timeout: 10_000)

    {:ok, status, headers, conn} = HTTPClient.read_head(conn)
    {status, Map.new(headers), conn}
  end

  # Reads pieces until `n` events have arrived.
  defp read_events(conn, n, sse \\ SSE.new(), acc \\ []) do
    if length(acc) >= n do
      {acc, conn}
    else
      {:data, data, conn} = HTTPClient.read(conn)
      {events, _complete, sse} = SSE.parse(sse, data)
      read_events(conn, n, sse, acc ++ events)
    end
  end

  defp read_rest(conn) do
    {:ok, rest, _conn} = HTTPClient.read_all(conn)
    {events, _complete, _sse} = SSE.parse(SSE.new(), rest)
    events
  end

  defp texts(events),
    do: for(%{data: %{"choices" => [%{"delta" => d}]}} <- events, do: d["content"])

  # An upstream that streams "Hello", then waits for the test's :go (writing keep-alive
  # comments meanwhile, so it notices a hang-up), then streams " world" and ends.
  defp gated_stream do
    test = self()

    Upstream.start(fn _ ->
      {:chunked, 200, "text/event-stream",
       fn resp ->
         Upstream.write_chunk(resp, Upstream.chunk_event("Hello"))
         send(test, {:streaming, self()})

         case wait_for_go(resp) do
           :go ->
             Upstream.write_chunk(resp, Upstream.chunk_event(" world"))
             Upstream.write_chunk(resp, "data: [DONE]\n\n")

           :closed ->
             send(test, :upstream_cancelled)
         end
       end}
    end)
  end

  defp wait_for_go(resp) do
    receive do
      :go -> :go
    after
      50 ->
        case Upstream.write_chunk(resp, ": keep-alive\n\n") do
          :ok -> wait_for_go(resp)
          :closed -> :closed
        end
    end
  end

  describe "issue 15: streaming Chat Completions" do
    test "events arrive in pieces as the upstream sends them, not at the end", %{agent: agent} do
      use_upstream(gated_stream())
      {:ok, _} = KillSwitch.configure(agent, %{"enabled" => true, "threshold" => 100})

      {status, headers, conn} = open_stream(agent, "say hello")
      assert status == 200
      assert headers["content-type"] =~ "text/event-stream"
      assert headers["x-observatory-kill-switch-score"] == "0.0"

      # The first event is here while the upstream still holds the rest.
      {first, conn} = read_events(conn, 1)
      assert texts(first) == ["Hello"]
      assert_receive {:streaming, upstream}
      send(upstream, :go)

      rest = read_rest(conn)
      assert texts(rest) == [" world"]
      assert List.last(rest).data == "[DONE]"

      # The kill switch fingerprinted the assembled answer.
      assert [%{response_hash: hash}] = Windows.entries(agent)
      assert hash == KillSwitch.fingerprint("Hello world")
    end

    test "an agent that hangs up cancels the upstream request", %{agent: agent} do
      use_upstream(gated_stream())
      {200, _headers, conn} = open_stream(agent, "say hello")
      {_first, conn} = read_events(conn, 1)
      assert_receive {:streaming, _upstream}

      HTTPClient.close(conn)
      assert_receive :upstream_cancelled, 5_000
      wait_until(fn -> Slots.in_flight() == 0 end)
    end

    test "the size cap applies to streams: an error event ends the stream", %{agent: agent} do
      Application.put_env(:observatory, :llm_max_response_bytes, 16 * 1024)
      test = self()

      endless = fn resp ->
        sent =
          Enum.reduce_while(1..100_000, 0, fn k, sent ->
            case Upstream.write_chunk(resp, Upstream.chunk_event("token #{k} ")) do
              :ok -> {:cont, sent + 1}
              :closed -> {:halt, sent}
            end
          end)

        send(test, {:upstream_events, sent})
      end

      use_upstream(Upstream.start(fn _ -> {:chunked, 200, "text/event-stream", endless} end))

      capture_log(fn ->
        {200, _headers, conn} = open_stream(agent, "count forever")
        events = read_rest(conn)
        assert [_ | _] = texts(Enum.drop(events, -1))

        assert %{data: %{"error" => %{"type" => "upstream_error", "message" => message}}} =
                 List.last(events)

        assert message =~ "exceeds 16384 bytes"
      end)

      assert_receive {:upstream_events, sent}, 10_000
      assert sent < 100_000, "the proxy hung up on the upstream"
    end

    test "an upstream error answer to a streamed request comes back as JSON", %{agent: agent} do
      limited = JSON.encode!(%{error: %{message: "Rate limit reached", type: "requests"}})
      use_upstream(Upstream.start(fn _ -> {429, "application/json", limited} end))
      {status, headers, conn} = open_stream(agent, "hello")
      assert status == 429
      assert headers["content-type"] == "application/json"
      {:ok, body, _} = HTTPClient.read_all(conn)
      assert {:ok, %{"error" => %{"message" => "Rate limit reached"}}} = JSON.decode(body)
    end
  end

  defp wait_until(fun, tries \\ 100) do
    cond do
      fun.() -> :ok
      tries == 0 -> flunk("condition never held")
      true -> Process.sleep(20) && wait_until(fun, tries - 1)
    end
  end
end
