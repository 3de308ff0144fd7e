defmodule ObservatoryWeb.Dashboard.Session do
  @moduledoc """
  The operator's sign-in: a signed cookie, and the CSRF token that goes with it.

  An operator signs in with an operator token (`ObservatoryWeb.Auth`); the dashboard
  then keeps a cookie that names the operator, expires after `:dashboard_session_ttl_s`
  (12 hours) and is signed with HMAC-SHA256 under a key derived from
  `:secret_key_base`. The token itself is never stored in the cookie.

      Set-Cookie: observatory_session=<payload>.<mac>; Path=/; HttpOnly; SameSite=Strict

  A session is valid while its signature checks, it has not expired, it has not been
  signed out and its operator is still configured: removing an operator's token signs
  them out everywhere.

  Signing out revokes the session on the server (issue 13, finding 13): each session
  has a random id, and sign-out records it in Mnesia (`:observatory_revoked_sessions`,
  disc copies, until the session would have expired), so a copy of the cookie taken
  before sign-out is refused too, across restarts. Entries past their expiry are
  dropped at the next sign-out; only signed-in operators can add one.

  Every state-changing request from the dashboard also carries a CSRF token, derived
  from a random value stored in the signed cookie; `valid_csrf?/2` compares it in
  constant time. (SameSite=Strict already keeps other sites' requests from carrying
  the cookie; the token is the second lock.)

  ## Configuration

      config :observatory, secret_key_base: "at least 32 bytes of secret"
      config :observatory, dashboard_secure_cookie: true   # add `Secure` behind TLS

  `OBSERVATORY_SECRET_KEY_BASE` sets it at boot (`config/runtime.exs`); when nothing
  sets it, the application generates a random one at start, so sessions do not
  survive a restart.
  """

  alias ObservatoryWeb.Conn

  @cookie "observatory_session"
  @default_ttl_s 12 * 60 * 60
  @revoked :observatory_revoked_sessions

  @type t :: %{operator: String.t(), sid: String.t(), csrf: String.t(), expires: integer()}

  @doc "The session cookie's name."
  def cookie_name, do: @cookie

  @doc "A new session for `operator`."
  @spec new(String.t()) :: t()
  def new(operator) when is_binary(operator) do
    %{
      operator: operator,
      sid: random(),
      csrf: random(),
      expires: System.system_time(:second) + ttl_s()
    }
  end

  @doc false
  def revocations_table, do: @revoked

  @doc "The request's session: `{:ok, session}` or `{:error, :unauthenticated}`."
  @spec fetch(Conn.t()) :: {:ok, t()} | {:error, :unauthenticated}
  def fetch(conn) do
    with value when is_binary(value) <- Conn.cookie(conn, @cookie),
         {:ok, session} <- verify(value),
         true <- valid?(session) do
      {:ok, session}
    else
      _ -> {:error, :unauthenticated}
    end
  end

  @doc "Whether a verified session still holds: not expired, not signed out, operator configured."
  @spec valid?(t()) :: boolean()
  def valid?(session) do
    session.expires > System.system_time(:second) and not revoked?(session.sid) and
      operator_configured?(session.operator)
  end

  @doc "Signs the session out everywhere: its cookie, and every copy of it, stops working."
  @spec revoke(t()) :: :ok
  def revoke(%{sid: sid, expires: expires}) do
    now = System.system_time(:second)

    Observatory.Storage.transaction("sign-out", fn ->
      expired =
        :mnesia.select(@revoked, [{{@revoked, :"$1", :"$2"}, [{:<, :"$2", now}], [:"$1"]}])

      Enum.each(expired, &:mnesia.delete({@revoked, &1}))
      :mnesia.write({@revoked, sid, expires})
    end)
  end

  # Fails closed: when the store cannot be read, the session is not trusted.
  defp revoked?(sid) do
    :mnesia.dirty_read(@revoked, sid) != []
  catch
    :exit, _ -> true
  end

  @doc "The session as a signed cookie value."
  @spec sign(t()) :: String.t()
  def sign(session) do
    payload =
      Observatory.JSON.encode!(%{
        "op" => session.operator,
        "sid" => session.sid,
        "csrf" => session.csrf,
        "exp" => session.expires
      })
      |> Base.url_encode64(padding: false)

    payload <> "." <> mac(payload)
  end

  @doc "Checks a cookie value's signature and expiry."
  @spec verify(String.t()) :: {:ok, t()} | {:error, :invalid | :expired}
  def verify(value) when is_binary(value) do
    with [payload, given] <- String.split(value, ".", parts: 2),
         true <- same?(mac(payload), given),
         {:ok, json} <- Base.url_decode64(payload, padding: false),
         {:ok, %{"op" => op, "sid" => sid, "csrf" => csrf, "exp" => exp}}
         when is_binary(op) and is_binary(sid) and is_binary(csrf) and is_integer(exp) <-
           Observatory.JSON.decode(json) do
      if exp > System.system_time(:second),
        do: {:ok, %{operator: op, sid: sid, csrf: csrf, expires: exp}},
        else: {:error, :expired}
    else
      _ -> {:error, :invalid}
    end
  end

  @doc "The `Set-Cookie` header that stores the session."
  @spec cookie_header(t()) :: {String.t(), String.t()}
  def cookie_header(session) do
    set_cookie(@cookie, sign(session), "/", max(session.expires - System.system_time(:second), 0))
  end

  @doc "The `Set-Cookie` header that removes the session."
  @spec clear_cookie_header() :: {String.t(), String.t()}
  def clear_cookie_header, do: set_cookie(@cookie, "", "/", 0)

  @doc "A `Set-Cookie` header with the dashboard's flags (HttpOnly, SameSite=Strict)."
  @spec set_cookie(String.t(), String.t(), String.t(), non_neg_integer()) ::
          {String.t(), String.t()}
  def set_cookie(name, value, path, max_age) do
    secure = if Application.get_env(:observatory, :dashboard_secure_cookie, false), do: "; Secure"

    {"Set-Cookie",
     "#{name}=#{value}; Path=#{path}; Max-Age=#{max_age}; HttpOnly; SameSite=Strict#{secure}"}
  end

  @doc "The CSRF token of a session (what pages put in forms and the meta tag)."
  @spec csrf_token(t()) :: String.t()
  def csrf_token(%{csrf: seed}), do: hmac("csrf", seed)

  @doc "Whether `token` is the session's CSRF token."
  @spec valid_csrf?(t(), String.t() | nil) :: boolean()
  def valid_csrf?(session, token) when is_binary(token), do: same?(csrf_token(session), token)
  def valid_csrf?(_session, _token), do: false

  @doc "Compares two strings in constant time (for tokens)."
  @spec same?(String.t(), String.t()) :: boolean()
  def same?(a, b) when is_binary(a) and is_binary(b) do
    :crypto.hash_equals(:crypto.hash(:sha256, a), :crypto.hash(:sha256, b))
  end

  @doc "A random URL-safe string with 128 bits of entropy."
  @spec random() :: String.t()
  def random, do: :crypto.strong_rand_bytes(16) |> Base.url_encode64(padding: false)

  defp operator_configured?(operator) do
    :observatory
    |> Application.get_env(:operator_tokens, %{})
    |> Enum.any?(fn {_token, name} -> name == operator end)
  end

  defp mac(payload), do: hmac("session cookie", payload)

  defp hmac(purpose, data) do
    key = :crypto.mac(:hmac, :sha256, secret_key_base(), purpose)
    :crypto.mac(:hmac, :sha256, key, data) |> Base.url_encode64(padding: false)
  end

  defp ttl_s, do: Application.get_env(:observatory, :dashboard_session_ttl_s, @default_ttl_s)

  defp secret_key_base do
    case Application.get_env(:observatory, :secret_key_base) do
      key when is_binary(key) and byte_size(key) >= 32 ->
        key

      other ->
        raise ArgumentError,
              "expected :secret_key_base to be a string of at least 32 bytes, got: " <>
                if(is_binary(other), do: "#{byte_size(other)} bytes", else: inspect(other))
    end
  end
end
