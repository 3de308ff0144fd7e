defmodule Observatory.Test.HTTP do
  @moduledoc false
  # A small client for tests against the running server (OTP's :httpc), plus a raw
  # socket sender for requests :httpc cannot make (huge bodies cut short).

  @agent "test-agent-key"
  @operator "test-operator-token"

  @doc "The seeded key of agent-http (config/test.exs)."
  def agent_key, do: @agent

  @doc "A key of `agent_id`, issued (and the agent registered) on first use."
  def key_for(agent_id) do
    case :persistent_term.get({__MODULE__, :key, agent_id}, nil) do
      nil ->
        {:ok, %{key: key}} = Observatory.AgentKeys.issue(agent_id)
        :persistent_term.put({__MODULE__, :key, agent_id}, key)
        key

      key ->
        key
    end
  end

  @doc "Forgets the keys `key_for/1` issued (after `Observatory.Testing.reset!/0` revoked them all)."
  def forget_keys do
    for {{__MODULE__, :key, _} = key, _} <- :persistent_term.get(),
        do: :persistent_term.erase(key)

    :ok
  end

  @doc "Headers that authenticate as `agent_id`."
  def agent_headers(agent_id), do: [{"authorization", "Bearer " <> key_for(agent_id)}]
  def operator_token, do: @operator

  def url(path), do: ObservatoryWeb.Endpoint.url() <> path

  def get(path, headers \\ []), do: request(:get, path, headers, nil, nil)

  def post(path, body, opts \\ []) do
    headers = Keyword.get(opts, :headers, [{"authorization", "Bearer " <> @agent}])
    type = Keyword.get(opts, :content_type, "application/json")
    request(:post, path, headers, type, body)
  end

  def post_json(path, term, opts \\ []), do: post(path, Observatory.JSON.encode!(term), opts)

  def operator_headers, do: [{"authorization", "Bearer " <> @operator}]

  defp request(method, path, headers, type, body) do
    headers = for {k, v} <- headers, do: {String.to_charlist(k), String.to_charlist(v)}

    req =
      if method == :get,
        do: {String.to_charlist(url(path)), headers},
        else: {String.to_charlist(url(path)), headers, String.to_charlist(type), body}

    {:ok, {{_, status, _}, resp_headers, resp_body}} =
      :httpc.request(method, req, [timeout: 10_000], body_format: :binary)

    resp_headers = for {k, v} <- resp_headers, into: %{}, do: {to_string(k), to_string(v)}
    decoded = if resp_headers["content-type"] =~ "json", do: decode(resp_body), else: resp_body
    %{status: status, body: decoded, headers: resp_headers}
  end

  defp decode(body) do
    {:ok, term} = Observatory.JSON.decode(body)
    term
  end

  @doc "Sends raw request bytes and returns the response's status line and body."
  def raw(bytes) do
    {:ok, socket} =
      :gen_tcp.connect(~c"127.0.0.1", ObservatoryWeb.Endpoint.port(), [:binary, active: false])

    :ok = :gen_tcp.send(socket, bytes)
    response = recv_all(socket, "")
    :gen_tcp.close(socket)
    response
  end

  defp recv_all(socket, acc) do
    case :gen_tcp.recv(socket, 0, 5_000) do
      {:ok, data} -> recv_all(socket, acc <> data)
      {:error, _} -> acc
    end
  end

  def envelope(overrides \\ %{}) do
    base = %{
      "meta" => %{
        "step_id" => "step-#{System.unique_integer([:positive])}",
        "session_id" => "sess-http",
        "agent_id" => "agent-http",
        "timestamp" => "2026-02-22T10:30:00Z"
      },
      "cognition" => %{"intent" => "search", "entropy_score" => 0.9},
      "action" => %{"tool_call" => "read_file", "status" => "failure"}
    }

    deep_merge(base, overrides)
  end

  @doc """
  Step `n` of session `sid`: the same failing `read_file` of `input` with the same
  result each time, so the step detector's stagnation grows by one a step.
  """
  def repeated_read(sid, n, input \\ "/same") do
    envelope(%{
      "meta" => %{"session_id" => sid, "step_id" => "#{sid}-#{n}"},
      "action" => %{
        "tool_call" => "read_file",
        "tool_input" => %{"path" => input},
        "status" => "failure",
        "result" => %{"error" => "enoent"}
      }
    })
  end

  defp deep_merge(a, b) when is_map(a) and is_map(b),
    do: Map.merge(a, b, fn _k, x, y -> deep_merge(x, y) end)

  defp deep_merge(_a, b), do: b
end
