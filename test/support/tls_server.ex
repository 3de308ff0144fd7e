defmodule Observatory.Test.TLSServer do
  @moduledoc """
  An HTTPS server on loopback for tests, with a certificate chain made by OTP
  (`:public_key.pkix_test_data/1`) for the name "localhost". It answers every request
  with `answer` (status, content type, body) and tells `notify` `{:tls_request, body}`.

  Returns `%{port: port, ca_file: pem_path}`: the CA to trust, written as PEM.
  """

  alias Observatory.JSON

  def start(%{answer: {status, type, body}, notify: notify, dir: dir}) do
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
    answer = {status, type, if(is_binary(body), do: body, else: JSON.encode!(body))}
    spawn_link(fn -> accept(listen, answer, notify) end)

    ca_file = Path.join(dir, "ca-#{port}.pem")

    pem =
      :public_key.pem_encode(for der <- client[:cacerts], do: {:Certificate, der, :not_encrypted})

    File.write!(ca_file, pem)
    %{port: port, ca_file: ca_file, listen: listen}
  end

  defp accept(listen, answer, notify) do
    with {:ok, socket} <- :ssl.transport_accept(listen) do
      spawn(fn ->
        with {:ok, socket} <- :ssl.handshake(socket, 5_000), do: serve(socket, "", answer, notify)
      end)

      accept(listen, answer, notify)
    end
  end

  defp serve(socket, acc, {status, type, body} = answer, notify) do
    with [head, request_body] <- String.split(acc, "\r\n\r\n", parts: 2),
         [_, length] <- Regex.run(~r/content-length: (\d+)/i, head),
         true <- byte_size(request_body) >= String.to_integer(length) do
      send(notify, {:tls_request, request_body})

      :ssl.send(socket, [
        "HTTP/1.1 #{status} OK\r\ncontent-type: #{type}\r\n",
        "content-length: #{byte_size(body)}\r\nconnection: close\r\n\r\n",
        body
      ])

      :ssl.close(socket)
    else
      _ ->
        case :ssl.recv(socket, 0, 5_000) do
          {:ok, data} -> serve(socket, acc <> data, answer, notify)
          _ -> :ssl.close(socket)
        end
    end
  end
end
