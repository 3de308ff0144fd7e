defmodule Observatory.KillSwitch.Upstream do
  @moduledoc """
  The proxy's side towards the LLM providers: where requests go, with which
  credentials, how many may run at once, and what each failure is called.

      config :observatory,
        llm_upstream: "https://api.openai.com/v1",     # Chat Completions: <base>/chat/completions
        llm_upstream_api_key: "sk-...",                # sent as Authorization: Bearer (optional)
        anthropic_upstream: "https://api.anthropic.com", # Messages: <base>/v1/messages
        anthropic_upstream_api_key: "sk-ant-...",      # sent as x-api-key (optional)
        llm_timeout_ms: 120_000,                       # see below
        llm_connect_timeout_ms: 5_000,
        llm_max_response_bytes: 8 * 1024 * 1024,       # an answer's cap, streamed or not
        llm_max_concurrent: 256                        # upstream calls in flight

  Every request has its own connection (`Observatory.Proxy.HTTPClient`), so a fast
  request never waits behind slow ones. At most `:llm_max_concurrent` run at once:
  one more is refused at once (the proxy answers `503`, which the SDKs retry with
  backoff) rather than queued. `:llm_timeout_ms` bounds a whole non-streamed
  request, and each silence of a streamed one.
  """

  alias Observatory.Proxy.HTTPClient

  @type api :: :chat_completions | :messages

  @doc false
  def child_spec(_opts) do
    %{id: __MODULE__, start: {__MODULE__, :start_link, []}, type: :worker}
  end

  @doc """
  Creates the in-flight counter. Returns `:ignore`: there is no process; the counter
  is published with `:persistent_term` once and outlives restarts of the supervisor.
  """
  def start_link do
    unless :persistent_term.get(__MODULE__, nil),
      do: :persistent_term.put(__MODULE__, :atomics.new(1, signed: true))

    :ignore
  end

  @doc "The upstream's URL for `api`, or nil when none is configured."
  @spec url(api()) :: String.t() | nil
  def url(:chat_completions), do: base(:llm_upstream, "/chat/completions")
  def url(:messages), do: base(:anthropic_upstream, "/v1/messages")

  defp base(key, path) do
    case Application.get_env(:observatory, key) do
      base when is_binary(base) and base != "" -> String.trim_trailing(base, "/") <> path
      _ -> nil
    end
  end

  @doc "The configured key for `api`'s upstream, as the header that carries it."
  @spec credentials(api()) :: [{String.t(), String.t()}]
  def credentials(:chat_completions) do
    case Application.get_env(:observatory, :llm_upstream_api_key) do
      key when is_binary(key) and key != "" -> [{"authorization", "Bearer " <> key}]
      _ -> []
    end
  end

  def credentials(:messages) do
    case Application.get_env(:observatory, :anthropic_upstream_api_key) do
      key when is_binary(key) and key != "" -> [{"x-api-key", key}]
      _ -> []
    end
  end

  @doc "`:llm_max_response_bytes`, default 8 MiB."
  def max_response_bytes,
    do: Application.get_env(:observatory, :llm_max_response_bytes, 8 * 1024 * 1024)

  @doc "`:llm_max_concurrent`, default 256."
  def max_concurrent, do: Application.get_env(:observatory, :llm_max_concurrent, 256)

  @doc "Upstream calls in flight now."
  @spec in_flight() :: non_neg_integer()
  def in_flight, do: :atomics.get(counter(), 1)

  @doc """
  Runs `fun` holding one of the `:llm_max_concurrent` upstream slots, or returns
  `{:error, :busy}` at once when they are all taken.
  """
  @spec with_slot((() -> result)) :: result | {:error, :busy} when result: term()
  def with_slot(fun) do
    counter = counter()

    if :atomics.add_get(counter, 1, 1) > max_concurrent() do
      :atomics.sub(counter, 1, 1)
      {:error, :busy}
    else
      try do
        fun.()
      after
        :atomics.sub(counter, 1, 1)
      end
    end
  end

  @doc """
  Sends `body` to `api`'s upstream with `headers` (plus the configured credentials)
  and reads the answer's head. The caller reads the body with `HTTPClient.read/1`
  and closes the connection.

  Options: `:stream` (the timeout bounds each wait, not the whole request), `:watch`
  (the agent's socket; see `HTTPClient`).
  """
  @spec open(api(), binary(), [{String.t(), String.t()}], keyword()) ::
          {:ok, pos_integer(), [{String.t(), String.t()}], HTTPClient.t()}
          | {:error, :no_upstream | HTTPClient.reason()}
  def open(api, body, headers, opts \\ []) do
    timeout = Application.get_env(:observatory, :llm_timeout_ms, 120_000)

    client_opts = [
      connect_timeout: Application.get_env(:observatory, :llm_connect_timeout_ms, 5_000),
      timeout: timeout,
      deadline: if(opts[:stream], do: nil, else: System.monotonic_time(:millisecond) + timeout),
      max_bytes: max_response_bytes(),
      watch: opts[:watch],
      cacertfile: Application.get_env(:observatory, :llm_upstream_cacertfile)
    ]

    headers = [{"content-type", "application/json"} | headers] ++ credentials(api)

    with {:url, url} when is_binary(url) <- {:url, url(api)},
         {:ok, conn} <- HTTPClient.request(url, headers, body, client_opts) do
      case HTTPClient.read_head(conn) do
        {:ok, status, resp_headers, conn} ->
          {:ok, status, resp_headers, conn}

        error ->
          HTTPClient.close(conn)
          error
      end
    else
      {:url, nil} -> {:error, :no_upstream}
      error -> error
    end
  end

  @doc "A sentence for the agent about why the upstream call failed."
  @spec describe(api(), term()) :: String.t()
  def describe(:chat_completions, :no_upstream),
    do: "no LLM upstream is configured (config :observatory, :llm_upstream)"

  def describe(:messages, :no_upstream),
    do: "no Anthropic upstream is configured (config :observatory, :anthropic_upstream)"

  def describe(_api, :timeout), do: "the LLM upstream did not answer in time"

  def describe(_api, :too_large),
    do:
      "the LLM upstream's answer exceeds #{max_response_bytes()} bytes " <>
        "(config :observatory, :llm_max_response_bytes)"

  def describe(_api, {:connect, reason}),
    do: "cannot connect to the LLM upstream (#{format_error(reason)})"

  def describe(_api, :closed), do: "the LLM upstream closed the connection without an answer"
  def describe(_api, {:bad_response, why}), do: "the LLM upstream's answer is broken: #{why}"
  def describe(_api, other), do: "the request to the LLM upstream failed (#{inspect(other)})"

  defp format_error({:tls_alert, {_, description}}), do: "TLS: #{description}"
  defp format_error(reason) when is_atom(reason), do: to_string(:inet.format_error(reason))
  defp format_error(reason), do: inspect(reason)

  defp counter, do: :persistent_term.get(__MODULE__)
end
