defmodule ObservatoryWeb.LLMProxyTest do
  # The proxy's limits and its connection handling, over real sockets against stub
  # upstreams on loopback. Changes the proxy's configuration: not async.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Observatory.JSON
  alias Observatory.KillSwitch.Upstream, as: Slots
  alias Observatory.Test.{HTTP, Upstream}

  @keys [:llm_upstream, :llm_max_response_bytes, :llm_max_concurrent, :llm_timeout_ms]

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn -> for {key, value} <- saved, do: Application.put_env(:observatory, key, value) end)

    %{agent: "agent-limits-#{System.unique_integer([:positive])}"}
  end

  defp use_upstream(%{url: url}), do: Application.put_env(:observatory, :llm_upstream, url)

  defp chat(agent, body) do
    HTTP.post("/v1/chat/completions", JSON.encode!(body), headers: HTTP.agent_headers(agent))
  end

  # Sends a request on a socket of its own and returns the socket, without waiting.
  defp send_raw(agent, body) do
    json = JSON.encode!(body)

    {:ok, socket} =
      :gen_tcp.connect(~c"127.0.0.1", ObservatoryWeb.Endpoint.port(), [:binary, active: false])

    :ok =
      :gen_tcp.send(socket, [
        "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n",
        "authorization: Bearer #{HTTP.key_for(agent)}\r\n",
        "content-type: application/json\r\ncontent-length: #{byte_size(json)}\r\n\r\n",
        json
      ])

    socket
  end

  defp status_of(socket), do: elem(answer_of(socket), 0)

  # The status, the raw head and the body (the proxy keeps the connection open).
  defp answer_of(socket) do
    {:ok, "HTTP/1.1 " <> <<status::binary-size(3)>> <> _ = data} =
      :gen_tcp.recv(socket, 0, 10_000)

    :gen_tcp.close(socket)
    [head, body] = String.split(data, "\r\n\r\n", parts: 2)
    {String.to_integer(status), String.downcase(head), body}
  end

  # An upstream whose requests for "slow" wait until the test sends :release to them.
  defp gated_upstream do
    test = self()

    Upstream.start(fn body ->
      if body =~ "slow" do
        send(test, {:waiting, self()})

        receive do
          :release -> :ok
        end
      end

      {200, "application/json", Upstream.completion("done")}
    end)
  end

  # A slot is released just after the answer's last byte is written: give it a moment.
  defp settled_in_flight(tries \\ 50) do
    case Slots.in_flight() do
      n when n > 0 and tries > 0 -> Process.sleep(10) && settled_in_flight(tries - 1)
      n -> n
    end
  end

  defp await_waiting(n), do: for(_ <- 1..n, do: assert_receive({:waiting, pid}, 10_000) && pid)

  describe "13.7 proxy: the upstream answer's size is capped" do
    test "an answer over :llm_max_response_bytes is a 502 that names the key", %{agent: agent} do
      Application.put_env(:observatory, :llm_max_response_bytes, 64 * 1024)
      big = Upstream.completion(String.duplicate("x", 200 * 1024))
      use_upstream(Upstream.start(fn _ -> {200, "application/json", big} end))

      capture_log(fn ->
        resp = chat(agent, Upstream.request("hello"))
        assert resp.status == 502
        assert resp.body["error"]["type"] == "upstream_error"

        assert resp.body["error"]["message"] ==
                 "the LLM upstream's answer exceeds 65536 bytes (config :observatory, :llm_max_response_bytes)"
      end)

      # At the cap is fine.
      Application.put_env(:observatory, :llm_max_response_bytes, byte_size(big))
      assert chat(agent, Upstream.request("hello")).status == 200
    end

    test "nothing past the cap is read: the proxy hangs up on an endless answer", %{agent: agent} do
      Application.put_env(:observatory, :llm_max_response_bytes, 64 * 1024)
      test = self()
      piece = String.duplicate("y", 64 * 1024)

      endless = fn resp ->
        # Up to 1 GiB in 64 KiB pieces, until the proxy closes the connection.
        sent =
          Enum.reduce_while(1..16_384, 0, fn _, sent ->
            case Upstream.write_chunk(resp, piece) do
              :ok -> {:cont, sent + byte_size(piece)}
              :closed -> {:halt, sent}
            end
          end)

        send(test, {:upstream_sent, sent})
      end

      use_upstream(Upstream.start(fn _ -> {:chunked, 200, "application/json", endless} end))

      capture_log(fn ->
        resp = chat(agent, Upstream.request("hello"))
        assert resp.status == 502
        assert resp.body["error"]["message"] =~ "exceeds 65536 bytes"
      end)

      assert_receive {:upstream_sent, sent}, 30_000
      # What the upstream got out before the hang-up: the cap plus the sockets' buffers.
      assert sent < 16 * 1024 * 1024, "the upstream wrote #{sent} bytes"
    end
  end

  describe "13.7 proxy: upstream calls never queue behind each other" do
    test "a fast request is answered while 100 slow upstream calls are pending", %{agent: agent} do
      use_upstream(gated_upstream())
      assert settled_in_flight() == 0
      slow = for _ <- 1..100, do: send_raw(agent, Upstream.request("slow"))
      waiting = await_waiting(100)
      assert Slots.in_flight() == 100

      # All 100 are still held upstream, and the fast one gets through.
      fast = chat(agent, Upstream.request("fast"))
      assert fast.status == 200
      assert get_in(fast.body, ["choices", Access.at(0), "message", "content"]) == "done"

      for pid <- waiting, do: send(pid, :release)
      assert Enum.map(slow, &status_of/1) == List.duplicate(200, 100)
    end

    test "past :llm_max_concurrent a request gets 503 upstream_busy at once, not a queue",
         %{agent: agent} do
      Application.put_env(:observatory, :llm_max_concurrent, 2)
      use_upstream(gated_upstream())
      slow = for _ <- 1..2, do: send_raw(agent, Upstream.request("slow"))
      waiting = await_waiting(2)

      # (A raw request: :httpc itself would retry a 503 with Retry-After.)
      {status, head, body} = answer_of(send_raw(agent, Upstream.request("fast")))
      assert status == 503
      assert head =~ "retry-after: 1"

      assert {:ok, %{"error" => %{"code" => "upstream_busy", "message" => message}}} =
               JSON.decode(body)

      assert message =~ ":llm_max_concurrent"

      for pid <- waiting, do: send(pid, :release)
      assert Enum.map(slow, &status_of/1) == [200, 200]
      assert chat(agent, Upstream.request("fast")).status == 200
      assert settled_in_flight() == 0
    end
  end

  describe "issue 15: a client disconnect cancels the upstream request" do
    test "an agent that hangs up while waiting for a whole answer closes the upstream call",
         %{agent: agent} do
      test = self()

      # A slow upstream: JSON whitespace every 50 ms until the proxy hangs up.
      slow = fn resp ->
        send(test, :upstream_started)

        Enum.reduce_while(1..400, :ok, fn _, _ ->
          Process.sleep(50)

          case Upstream.write_chunk(resp, " ") do
            :ok -> {:cont, :ok}
            :closed -> {:halt, send(test, :upstream_cancelled)}
          end
        end)
      end

      use_upstream(Upstream.start(fn _ -> {:chunked, 200, "application/json", slow} end))
      socket = send_raw(agent, Upstream.request("hello"))
      assert_receive :upstream_started, 5_000
      :gen_tcp.close(socket)

      assert_receive :upstream_cancelled, 5_000
      assert settled_in_flight() == 0
    end
  end

  describe "a client's next request sent during the upstream call is not read from its middle" do
    test "bytes the agent sends while the upstream works close the connection after the answer",
         %{agent: agent} do
      use_upstream(gated_upstream())
      socket = send_raw(agent, Upstream.request("slow"))
      [upstream] = await_waiting(1)

      # A pipelined request, taken off the socket by the proxy's watch of the agent.
      :ok = :gen_tcp.send(socket, "GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
      Process.sleep(200)
      send(upstream, :release)

      {data, ending} = recv_until_closed(socket)
      [head, _body] = String.split(data, "\r\n\r\n", parts: 2)
      assert head =~ ~r"^HTTP/1.1 200 "
      assert String.downcase(head) =~ "connection: close"

      # Closed at once, not kept alive to parse what is left of the healthz request.
      assert ending == :closed
      refute data =~ ~r"HTTP/1.1 200 .*HTTP/1.1"s
    end
  end

  # Everything until the server closes (:closed) or 3 s pass without a byte (:timeout).
  defp recv_until_closed(socket, acc \\ "") do
    case :gen_tcp.recv(socket, 0, 3_000) do
      {:ok, data} -> recv_until_closed(socket, acc <> data)
      {:error, reason} -> {acc, reason}
    end
  end
end
