defmodule Observatory.Webhook do
  @moduledoc """
  POSTs JSON to a URL an operator configured — the kill switch's webhook, a
  notification sink — under the rules against server-side request forgery
  (`Observatory.KillSwitch.WebhookURL`): the host is resolved and every address
  checked just before the request, the request goes to the address that was checked
  (naming the host in `Host` and, for `https://`, checking its certificate and sending
  it as SNI), and redirects are not followed.

  Nothing here logs: a URL may be its own credential (a Slack webhook), so callers
  log what they sent where by a name of their own.
  """

  alias Observatory.KillSwitch.WebhookURL

  @doc """
  Posts `body` (JSON text) with `headers` (`[{name, value}]`, strings). Returns
  `{:ok, status, headers}` with the response's headers in lower case, `{:error,
  {:refused, sentence}}` when the URL may not be reached, or `{:error, reason}` when
  the request failed (`reason` names no part of the URL beyond its host).

  ## Options
    * `:timeout` — milliseconds for connecting and for the answer, default 5 000.
  """
  @spec post(String.t(), binary(), [{String.t(), String.t()}], keyword()) ::
          {:ok, pos_integer(), [{String.t(), String.t()}]}
          | {:error, {:refused, String.t()} | term()}
  def post(url, body, headers \\ [], opts \\ []) do
    timeout = Keyword.get(opts, :timeout, 5_000)
    options = [timeout: timeout, connect_timeout: timeout, autoredirect: false]

    case WebhookURL.resolve(url) do
      {:ok, uri, ip} ->
        {target, host, tls} = target(uri, ip)

        headers = [
          host | for({k, v} <- headers, do: {String.to_charlist(k), String.to_charlist(v)})
        ]

        request = {target, headers, ~c"application/json", body}

        case :httpc.request(:post, request, options ++ tls, body_format: :binary) do
          {:ok, {{_, status, _}, resp_headers, _body}} ->
            {:ok, status,
             for({k, v} <- resp_headers, do: {String.downcase(to_string(k)), to_string(v)})}

          {:error, reason} ->
            {:error, reason}
        end

      {:error, sentence} ->
        {:error, {:refused, sentence}}
    end
  end

  # Both schemes connect to the address that was checked (no second DNS answer can
  # send the POST elsewhere), naming the host in `Host`; https:// also checks the
  # certificate against the system's CAs and the host name (sent as SNI).
  defp target(uri, ip) do
    address = if tuple_size(ip) == 8, do: "[#{:inet.ntoa(ip)}]", else: to_string(:inet.ntoa(ip))
    default_port = if uri.scheme == "https", do: 443, else: 80
    host_header = if uri.port == default_port, do: uri.host, else: "#{uri.host}:#{uri.port}"
    url = String.to_charlist(URI.to_string(%{uri | host: address}))
    {url, {~c"host", String.to_charlist(host_header)}, tls(uri)}
  end

  defp tls(%URI{scheme: "https", host: host}) do
    [
      ssl: [
        verify: :verify_peer,
        cacerts: :public_key.cacerts_get(),
        server_name_indication: String.to_charlist(host),
        customize_hostname_check: [
          match_fun: :public_key.pkix_verify_hostname_match_fun(:https)
        ]
      ]
    ]
  end

  defp tls(_uri), do: []
end
