defmodule Observatory.KillSwitch.Upstream do
  @moduledoc """
  The proxy's side towards the LLM providers: where requests go, with which
  credentials, how many may run at once, how long they may take, and what each
  failure is called.

      config :observatory,
        llm_upstream: "https://api.openai.com/v1",     # <base>/chat/completions, /responses, /models
        llm_upstream_api_key: "sk-...",                # sent as Authorization: Bearer (optional)
        anthropic_upstream: "https://api.anthropic.com", # <base>/v1/messages, /v1/messages/count_tokens, /v1/models
        anthropic_upstream_api_key: "sk-ant-...",      # sent as x-api-key (optional)
        llm_timeout_ms: 600_000,                       # see below
        llm_connect_timeout_ms: 5_000,
        llm_max_stream_ms: 1_800_000,                  # a stream's whole duration
        llm_max_response_bytes: 8 * 1024 * 1024,       # an answer's cap, streamed or not
        llm_max_concurrent: 256                        # upstream calls in flight

  Every request has its own connection (`Observatory.Proxy.HTTPClient`), so a fast
  request never waits behind slow ones. At most `:llm_max_concurrent` run at once:
  one more is refused at once (the proxy answers `503`, which the SDKs retry with
  backoff) rather than queued. `:llm_timeout_ms` bounds a whole non-streamed
  request, and each silence of a streamed one; its default, 600 s, is what the
  official OpenAI and Anthropic SDKs wait, so a long reasoning call the SDK would
  have waited for is not cut short by the proxy. `:llm_max_stream_ms` bounds a
  stream's whole duration.
  """

  alias Observatory.Proxy.HTTPClient

  @typedoc """
  An upstream endpoint: `:chat_completions`, `:responses` and `:models` on the
  OpenAI-compatible upstream; `:messages`, `:count_tokens` and `:anthropic_models`
  on the Anthropic one.
  """
  @type api ::
          :chat_completions
          | :responses
          | :models
          | :messages
          | :count_tokens
          | :anthropic_models

  @bytes_key {__MODULE__, :request_bytes}

  @endpoints %{
    chat_completions: {:openai, "/chat/completions"},
    responses: {:openai, "/responses"},
    models: {:openai, "/models"},
    messages: {:anthropic, "/v1/messages"},
    count_tokens: {:anthropic, "/v1/messages/count_tokens"},
    anthropic_models: {:anthropic, "/v1/models"}
  }

  @doc false
  def child_spec(_opts) do
    %{id: __MODULE__, start: {__MODULE__, :start_link, []}, type: :worker}
  end

  @doc """
  Creates the in-flight counters (calls, request bytes). Returns `:ignore`: there is
  no process; the counters are published with `:persistent_term` once and outlive
  restarts of the supervisor.
  """
  def start_link do
    for key <- [__MODULE__, @bytes_key],
        :persistent_term.get(key, nil) == nil,
        do: :persistent_term.put(key, :atomics.new(1, signed: true))

    :ignore
  end

  @doc "The upstream's URL for `api`, or nil when none is configured."
  @spec url(api()) :: String.t() | nil
  def url(api) do
    {provider, path} = Map.fetch!(@endpoints, api)

    case Application.get_env(:observatory, base_key(provider)) do
      base when is_binary(base) and base != "" -> String.trim_trailing(base, "/") <> path
      _ -> nil
    end
  end

  @doc "Which provider serves `api`: `:openai` (OpenAI-compatible) or `:anthropic`."
  @spec provider(api()) :: :openai | :anthropic
  def provider(api), do: @endpoints |> Map.fetch!(api) |> elem(0)

  defp base_key(:openai), do: :llm_upstream
  defp base_key(:anthropic), do: :anthropic_upstream

  @doc "The configured key for `api`'s upstream, as the header that carries it."
  @spec credentials(api()) :: [{String.t(), String.t()}]
  def credentials(api) do
    case {provider(api), configured_key(provider(api))} do
      {_, nil} -> []
      {:openai, key} -> [{"authorization", "Bearer " <> key}]
      {:anthropic, key} -> [{"x-api-key", key}]
    end
  end

  @doc "The configured upstream keys (never sent to an agent; see `ObservatoryWeb.API.LLMProxy`)."
  @spec configured_keys() :: [String.t()]
  def configured_keys, do: for(p <- [:openai, :anthropic], k = configured_key(p), do: k)

  defp configured_key(:openai), do: key(:llm_upstream_api_key)
  defp configured_key(:anthropic), do: key(:anthropic_upstream_api_key)

  defp key(name) do
    case Application.get_env(:observatory, name) do
      key when is_binary(key) and key != "" -> key
      _ -> nil
    end
  end

  @doc "`:llm_max_response_bytes`, default 8 MiB."
  def max_response_bytes,
    do: Application.get_env(:observatory, :llm_max_response_bytes, 8 * 1024 * 1024)

  @doc "`:llm_timeout_ms`, default 600 s (the official SDKs' own timeout)."
  def timeout_ms, do: Application.get_env(:observatory, :llm_timeout_ms, 600_000)

  @doc "`:llm_max_stream_ms`, default 30 minutes: how long one stream may last."
  def max_stream_ms, do: Application.get_env(:observatory, :llm_max_stream_ms, 1_800_000)

  @doc "`:llm_max_event_bytes`, default 4 MiB: one server-sent event's cap."
  def max_event_bytes,
    do: Application.get_env(:observatory, :llm_max_event_bytes, 4 * 1024 * 1024)

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
  `:llm_max_request_bytes_in_flight`, default 256 MiB: the proxied request bodies the
  gateway holds at once.
  """
  def max_request_bytes_in_flight,
    do: Application.get_env(:observatory, :llm_max_request_bytes_in_flight, 256 * 1024 * 1024)

  @doc "Proxied request bytes held now."
  @spec request_bytes_in_flight() :: non_neg_integer()
  def request_bytes_in_flight, do: :atomics.get(:persistent_term.get(@bytes_key), 1)

  @doc """
  Runs `fun` holding `bytes` of the `:llm_max_request_bytes_in_flight` budget, or
  returns `{:error, :busy}` at once when they would exceed it (the proxy answers
  `503`, which the SDKs retry): each body may be up to `:llm_max_request_bytes`, and
  many at once must not exhaust the node's memory. One request alone is always
  admitted.
  """
  @spec with_request_bytes(non_neg_integer(), (() -> result)) :: result | {:error, :busy}
        when result: term()
  def with_request_bytes(bytes, fun) do
    counter = :persistent_term.get(@bytes_key)
    held = :atomics.add_get(counter, 1, bytes)

    if held > max_request_bytes_in_flight() and held > bytes do
      :atomics.sub(counter, 1, bytes)
      {:error, :busy}
    else
      try do
        fun.()
      after
        :atomics.sub(counter, 1, bytes)
      end
    end
  end

  @doc """
  Sends `body` to `api`'s upstream with `headers` (plus the configured credentials)
  and reads the answer's head. The caller reads the body with `HTTPClient.read/1`
  and closes the connection.

  Options: `:stream` (the timeout bounds each wait, and `:llm_max_stream_ms` the
  whole stream), `:watch` (the agent's socket), `:cancel` (see `HTTPClient`),
  `:method` (`"POST"`, or `"GET"` without a body), `:path` (appended to the URL, e.g.
  a model's id).
  """
  @spec open(api(), binary(), [{String.t(), String.t()}], keyword()) ::
          {:ok, pos_integer(), [{String.t(), String.t()}], HTTPClient.t()}
          | {:error, :no_upstream | HTTPClient.reason()}
  def open(api, body, headers, opts \\ []) do
    now = System.monotonic_time(:millisecond)

    client_opts = [
      method: Keyword.get(opts, :method, "POST"),
      connect_timeout: Application.get_env(:observatory, :llm_connect_timeout_ms, 5_000),
      timeout: timeout_ms(),
      deadline: now + if(opts[:stream], do: max_stream_ms(), else: timeout_ms()),
      max_bytes: max_response_bytes(),
      watch: opts[:watch],
      cancel: opts[:cancel],
      cacertfile: Application.get_env(:observatory, :llm_upstream_cacertfile)
    ]

    # identity: the proxy reads the answer (fingerprints, events) as it passes it on.
    headers =
      [{"content-type", "application/json"}, {"accept-encoding", "identity"} | headers] ++
        credentials(api)

    with {:url, url} when is_binary(url) <- {:url, url(api)},
         {:ok, conn} <-
           HTTPClient.request(url <> Keyword.get(opts, :path, ""), headers, body, client_opts) do
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
  def describe(api, :no_upstream) do
    case provider(api) do
      :openai ->
        "no LLM upstream is configured (config :observatory, :llm_upstream)"

      :anthropic ->
        "no Anthropic upstream is configured (config :observatory, :anthropic_upstream)"
    end
  end

  def describe(_api, :timeout), do: "the LLM upstream did not answer in time"

  # A non-streamed request's deadline is its timeout.
  def describe(_api, :deadline), do: describe(nil, :timeout)

  def describe(_api, :stream_deadline),
    do:
      "the stream reached its maximum duration of #{duration(max_stream_ms())} " <>
        "(config :observatory, :llm_max_stream_ms)"

  def describe(_api, :event_too_large),
    do:
      "the LLM upstream sent a server-sent event larger than #{max_event_bytes()} bytes " <>
        "(config :observatory, :llm_max_event_bytes)"

  def describe(_api, :too_large),
    do:
      "the LLM upstream's answer exceeds #{max_response_bytes()} bytes " <>
        "(config :observatory, :llm_max_response_bytes)"

  def describe(_api, {:connect, reason}),
    do: "cannot connect to the LLM upstream (#{format_error(reason)})"

  def describe(_api, :closed), do: "the LLM upstream closed the connection without an answer"
  def describe(_api, {:bad_response, why}), do: "the LLM upstream's answer is broken: #{why}"
  def describe(_api, other), do: "the request to the LLM upstream failed (#{inspect(other)})"

  defp duration(ms) when rem(ms, 1000) == 0, do: "#{div(ms, 1000)} s"
  defp duration(ms), do: "#{ms} ms"

  defp format_error({:tls_alert, {_, description}}), do: "TLS: #{description}"
  defp format_error(reason) when is_atom(reason), do: to_string(:inet.format_error(reason))
  defp format_error(reason), do: inspect(reason)

  defp counter, do: :persistent_term.get(__MODULE__)
end
