defmodule ObservatoryWeb.ProxyTLSTest do
  # The proxy's HTTPS upstream over a real TLS socket on loopback: the certificate
  # chain is made by OTP (`:public_key.pkix_test_data/1`), for the name "localhost".
  use ExUnit.Case, async: false

  alias Observatory.JSON
  alias Observatory.Test.HTTP

  @keys [:llm_upstream, :llm_upstream_cacertfile]
  @completion %{
    "id" => "chatcmpl-tls",
    "object" => "chat.completion",
    "model" => "gpt-4o-mini",
    "choices" => [
      %{
        "index" => 0,
        "message" => %{"role" => "assistant", "content" => "over TLS"},
        "finish_reason" => "stop"
      }
    ]
  }

  setup do
    saved = for key <- @keys, do: {key, Application.get_env(:observatory, key)}

    on_exit(fn -> for {key, value} <- saved, do: Application.put_env(:observatory, key, value) end)

    {:ok, _} = Application.ensure_all_started(:ssl)
    san = {:Extension, {2, 5, 29, 17}, false, [dNSName: ~c"localhost"]}
    rsa = [key: {:rsa, 2048, 65_537}, digest: :sha256]

    %{server_config: server, client_config: client} =
      :public_key.pkix_test_data(%{
        server_chain: %{root: rsa, intermediates: [], peer: [{:extensions, [san]} | rsa]},
        client_chain: %{root: rsa, intermediates: [], peer: rsa}
      })

    {:ok, listen} =
      :ssl.listen(0, [:binary, active: false, reuseaddr: true, ip: {127, 0, 0, 1}] ++ server)

    {:ok, {_, port}} = :ssl.sockname(listen)
    serve(listen)
    on_exit(fn -> :ssl.close(listen) end)

    dir = Path.join(System.tmp_dir!(), "observatory-tls-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    ca_file = Path.join(dir, "ca.pem")

    pem =
      :public_key.pem_encode(for der <- client[:cacerts], do: {:Certificate, der, :not_encrypted})

    File.write!(ca_file, pem)

    %{port: port, ca_file: ca_file, agent: "agent-tls-#{System.unique_integer([:positive])}"}
  end

  # Answers every connection with the same chat completion.
  defp serve(listen) do
    spawn_link(fn -> accept(listen) end)
  end

  defp accept(listen) do
    with {:ok, socket} <- :ssl.transport_accept(listen),
         {:ok, socket} <- :ssl.handshake(socket, 5_000) do
      spawn(fn -> answer(socket, "") end)
      accept(listen)
    end
  end

  defp answer(socket, acc) do
    with [head, body] <- String.split(acc, "\r\n\r\n", parts: 2),
         [_, length] <- Regex.run(~r/content-length: (\d+)/i, head),
         true <- byte_size(body) >= String.to_integer(length) do
      json = JSON.encode!(@completion)

      :ssl.send(socket, [
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n",
        "content-length: #{byte_size(json)}\r\nconnection: close\r\n\r\n",
        json
      ])

      :ssl.close(socket)
    else
      _ ->
        case :ssl.recv(socket, 0, 5_000) do
          {:ok, data} -> answer(socket, acc <> data)
          _ -> :ssl.close(socket)
        end
    end
  end

  defp chat(agent) do
    body = %{"model" => "gpt-4o-mini", "messages" => [%{"role" => "user", "content" => "hi"}]}
    HTTP.post("/v1/chat/completions", JSON.encode!(body), headers: HTTP.agent_headers(agent))
  end

  describe "an HTTPS upstream" do
    test "with its CA trusted (:llm_upstream_cacertfile), the answer comes through", ctx do
      Application.put_env(:observatory, :llm_upstream, "https://localhost:#{ctx.port}/v1")
      Application.put_env(:observatory, :llm_upstream_cacertfile, ctx.ca_file)

      resp = chat(ctx.agent)
      assert resp.status == 200
      assert %{"choices" => [%{"message" => %{"content" => "over TLS"}}]} = resp.body
    end

    test "a certificate the system does not trust is refused: 502, nothing sent", ctx do
      Application.put_env(:observatory, :llm_upstream, "https://localhost:#{ctx.port}/v1")
      Application.delete_env(:observatory, :llm_upstream_cacertfile)

      resp = chat(ctx.agent)
      assert resp.status == 502
      assert resp.body["error"]["message"] =~ "cannot connect to the LLM upstream"
    end

    test "a certificate for another name is refused, even from a trusted CA", ctx do
      Application.put_env(:observatory, :llm_upstream, "https://127.0.0.1:#{ctx.port}/v1")
      Application.put_env(:observatory, :llm_upstream_cacertfile, ctx.ca_file)

      resp = chat(ctx.agent)
      assert resp.status == 502
      assert resp.body["error"]["message"] =~ "cannot connect to the LLM upstream"
    end

    test "an unreadable CA file is a 502 that says so, not a crash", ctx do
      Application.put_env(:observatory, :llm_upstream, "https://localhost:#{ctx.port}/v1")
      Application.put_env(:observatory, :llm_upstream_cacertfile, ctx.ca_file <> ".missing")

      resp = chat(ctx.agent)
      assert resp.status == 502
      assert resp.body["error"]["message"] =~ "cacertfile"
    end
  end
end
