defmodule Observatory.KillSwitch.WebhookURL do
  @moduledoc """
  Which webhook URLs the kill switch may POST to: the guard against server-side
  request forgery through `notification_webhook`.

  A webhook URL must be `http://` or `https://`, have a host, carry no user
  information (`https://user:pass@host/` is refused: credentials do not belong in a
  setting that the dashboard shows), and its host must not be — or resolve to — a
  loopback, private, link-local, carrier-grade NAT, multicast or reserved address
  (`127.0.0.0/8`, `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`, `169.254.0.0/16`,
  `100.64.0.0/10`, `0.0.0.0/8`, `::1`, `fc00::/7`, `fe80::/10`, ...), unless the
  operator allows private networks:

      config :observatory, :kill_switch, webhook_allow_private_networks: true

  It is checked twice: when an operator sets it (`check/1`; a host that does not
  resolve now is let through to the second check) and before each delivery
  (`resolve/1`: the host is resolved and *every* address checked, and an `http://`
  delivery connects to the address that was checked, so DNS cannot change the
  answer in between). The notifier never follows redirects.
  """

  import Bitwise

  @type reason :: String.t()

  @doc "Checks a URL as a setting; `{:ok, url}` or `{:error, sentence}`."
  @spec check(String.t()) :: {:ok, String.t()} | {:error, reason()}
  def check(url) when is_binary(url) do
    with {:ok, uri} <- parse(url),
         :ok <- check_if_resolvable(uri.host) do
      {:ok, url}
    end
  end

  # A host that does not resolve now is not refused: resolve/1 checks before each
  # delivery.
  defp check_if_resolvable(host) do
    case addresses(host) do
      {:ok, ips} -> check_addresses(host, ips)
      {:error, _} -> :ok
    end
  end

  @doc """
  Resolves a URL's host for a delivery: `{:ok, uri, ip}` with the address to connect
  to, or `{:error, sentence}` when the URL or any of its addresses is not allowed.
  """
  @spec resolve(String.t()) :: {:ok, URI.t(), :inet.ip_address()} | {:error, reason()}
  def resolve(url) when is_binary(url) do
    with {:ok, uri} <- parse(url),
         {:ok, [ip | _] = ips} <- addresses(uri.host),
         :ok <- check_addresses(uri.host, ips) do
      {:ok, uri, ip}
    end
  end

  @doc """
  A webhook URL as it may be shown back: its scheme, host and port, and of the rest
  only the last four characters. A Slack-style URL is its own credential, so the
  gateway never shows one back in full (and stores it sealed: `Observatory.AtRest`).

      iex> Observatory.KillSwitch.WebhookURL.redact("https://hooks.slack.com/services/T0/B0/x9Abc7")
      "https://hooks.slack.com/…Abc7"
      iex> Observatory.KillSwitch.WebhookURL.redact("http://alerts.internal:8080/")
      "http://alerts.internal:8080/"
  """
  @spec redact(String.t() | nil) :: String.t() | nil
  def redact(nil), do: nil

  def redact(url) when is_binary(url) do
    uri = URI.parse(url)
    rest = (uri.path || "") <> if(uri.query, do: "?" <> uri.query, else: "")

    port =
      if uri.port && uri.port != URI.default_port(uri.scheme || ""), do: ":#{uri.port}", else: ""

    origin = "#{uri.scheme}://#{uri.host}#{port}/"

    cond do
      rest in ["", "/"] -> origin
      String.length(rest) >= 16 -> origin <> "…" <> String.slice(rest, -4, 4)
      true -> origin <> "…"
    end
  end

  @doc "Whether `ip` is in a range a webhook may not reach (loopback, private, ...)."
  @spec private?(:inet.ip_address()) :: boolean()
  def private?({a, b, _, _}) do
    a in [0, 10, 127] or a >= 224 or (a == 100 and (b &&& 0xC0) == 64) or
      (a == 169 and b == 254) or (a == 172 and (b &&& 0xF0) == 16) or
      (a == 192 and b == 168) or (a == 192 and b == 0) or (a == 198 and b in [18, 19])
  end

  def private?({0, 0, 0, 0, 0, 0xFFFF, hi, lo}),
    do: private?({hi >>> 8, hi &&& 0xFF, lo >>> 8, lo &&& 0xFF})

  def private?({0, 0, 0, 0, 0, 0, 0, last}) when last in [0, 1], do: true
  def private?({first, _, _, _, _, _, _, _}) when (first &&& 0xFE00) == 0xFC00, do: true
  def private?({first, _, _, _, _, _, _, _}) when (first &&& 0xFFC0) == 0xFE80, do: true
  def private?({first, _, _, _, _, _, _, _}) when (first &&& 0xFF00) == 0xFF00, do: true
  def private?({_, _, _, _, _, _, _, _}), do: false

  defp parse(url) do
    uri = URI.parse(url)

    cond do
      uri.scheme not in ["http", "https"] or not is_binary(uri.host) or uri.host == "" ->
        {:error, "must be an http:// or https:// URL with a host"}

      uri.userinfo != nil ->
        {:error, "must not carry a user name or password (user:pass@)"}

      true ->
        {:ok, uri}
    end
  end

  defp addresses(host) do
    # An IPv6 literal comes bracketed in a URL.
    host = host |> String.trim_leading("[") |> String.trim_trailing("]") |> String.to_charlist()

    case :inet.parse_address(host) do
      {:ok, ip} ->
        {:ok, [ip]}

      {:error, _} ->
        v4 = with({:ok, ips} <- :inet.getaddrs(host, :inet), do: ips, else: (_ -> []))
        v6 = with({:ok, ips} <- :inet.getaddrs(host, :inet6), do: ips, else: (_ -> []))

        case v4 ++ v6 do
          [] -> {:error, "its host #{host} does not resolve"}
          ips -> {:ok, ips}
        end
    end
  end

  defp check_addresses(host, ips) do
    if allow_private?() do
      :ok
    else
      case Enum.find(ips, &private?/1) do
        nil ->
          :ok

        ip ->
          {:error,
           "must not point at a loopback, private or link-local address (#{host} is " <>
             "#{:inet.ntoa(ip)}); an operator allows those with " <>
             "config :observatory, :kill_switch, webhook_allow_private_networks: true"}
      end
    end
  end

  defp allow_private? do
    Application.get_env(:observatory, :kill_switch, [])
    |> Keyword.get(:webhook_allow_private_networks, false)
  end
end
