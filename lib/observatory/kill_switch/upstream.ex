defmodule Observatory.KillSwitch.Upstream do
  @moduledoc """
  The HTTP client of the chat-completions proxy: forwards a request body to the
  configured OpenAI-compatible upstream with OTP's `:httpc`.

      config :observatory,
        llm_upstream: "https://api.openai.com/v1",   # requests go to <base>/chat/completions
        llm_upstream_api_key: "sk-...",              # sent as Authorization: Bearer (optional)
        llm_timeout_ms: 120_000,                     # whole request
        llm_connect_timeout_ms: 5_000

  `:httpc` runs in its own stand-alone profile, started under the kill switch
  supervisor, so the proxy's connection pool is separate from any other `:httpc` use
  in the VM.
  """

  @content_type ~c"application/json"

  @type response :: %{status: pos_integer(), content_type: String.t() | nil, body: binary()}

  @doc false
  def child_spec(_opts) do
    %{id: __MODULE__, start: {__MODULE__, :start_link, []}, type: :worker}
  end

  @doc "Starts the `:httpc` profile, linked to the caller."
  def start_link do
    with {:ok, pid} <- :inets.start(:httpc, [profile: :observatory_llm], :stand_alone) do
      :ok = :httpc.set_options([max_sessions: 64, max_keep_alive_length: 64], pid)
      :persistent_term.put(__MODULE__, pid)
      {:ok, pid}
    end
  end

  @doc "The upstream's chat-completions URL, or nil when none is configured."
  @spec url() :: String.t() | nil
  def url do
    case Application.get_env(:observatory, :llm_upstream) do
      base when is_binary(base) and base != "" ->
        String.trim_trailing(base, "/") <> "/chat/completions"

      _ ->
        nil
    end
  end

  @doc """
  POSTs `body` to the upstream. Any HTTP answer is `{:ok, response}`; the connection
  failing, timing out or no upstream being configured is `{:error, reason}` with a
  sentence for the client.
  """
  @spec post(binary()) :: {:ok, response()} | {:error, String.t()}
  def post(body) when is_binary(body) do
    case url() do
      nil -> {:error, "no LLM upstream is configured (config :observatory, :llm_upstream)"}
      url -> request(url, body)
    end
  end

  defp request(url, body) do
    headers =
      [{~c"accept", ~c"application/json"}] ++
        case Application.get_env(:observatory, :llm_upstream_api_key) do
          key when is_binary(key) and key != "" ->
            [{~c"authorization", String.to_charlist("Bearer " <> key)}]

          _ ->
            []
        end

    http_options = [
      timeout: Application.get_env(:observatory, :llm_timeout_ms, 120_000),
      connect_timeout: Application.get_env(:observatory, :llm_connect_timeout_ms, 5_000),
      autoredirect: false
    ]

    request = {String.to_charlist(url), headers, @content_type, body}

    case :httpc.request(:post, request, http_options, [body_format: :binary], profile()) do
      {:ok, {{_version, status, _reason}, resp_headers, resp_body}} ->
        {:ok, %{status: status, content_type: content_type(resp_headers), body: resp_body}}

      {:error, reason} ->
        {:error, describe(reason)}
    end
  end

  defp profile, do: :persistent_term.get(__MODULE__)

  defp content_type(headers) do
    Enum.find_value(headers, fn {name, value} ->
      if String.downcase(to_string(name)) == "content-type", do: to_string(value)
    end)
  end

  defp describe(:timeout), do: "the LLM upstream did not answer in time"

  defp describe({:failed_connect, details}) do
    reason =
      Enum.find_value(details, :unknown, fn
        {:inet, _, reason} -> reason
        _ -> nil
      end)

    "cannot connect to the LLM upstream (#{:inet.format_error(reason)})"
  end

  defp describe(:socket_closed_remotely),
    do: "the LLM upstream closed the connection without an answer"

  defp describe(other), do: "the request to the LLM upstream failed (#{inspect(other)})"
end
