defmodule ObservatoryWeb.ProxyTLSTest do
  # The proxy's HTTPS upstream over a real TLS socket on loopback: the certificate
  # chain is made by OTP (`:public_key.pkix_test_data/1`), for the name "localhost".
  use ExUnit.Case, async: false

  alias Observatory.JSON
  alias Observatory.Test.{HTTP, TLSServer}

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

    dir = Path.join(System.tmp_dir!(), "observatory-tls-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)

    %{port: port, ca_file: ca_file, listen: listen} =
      TLSServer.start(%{answer: {200, "application/json", @completion}, notify: self(), dir: dir})

    on_exit(fn -> :ssl.close(listen) end)

    %{port: port, ca_file: ca_file, agent: "agent-tls-#{System.unique_integer([:positive])}"}
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
