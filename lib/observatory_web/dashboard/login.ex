defmodule ObservatoryWeb.Dashboard.Login do
  @moduledoc """
  Operator sign-in and sign-out for the dashboard.

    * `GET /login` — the form: one field, the operator token. It sets a short-lived
      `observatory_login_csrf` cookie and puts the same random value in a hidden field
      (a double-submit CSRF token: another site can neither read the cookie nor, with
      SameSite=Strict, make the browser send it).
    * `POST /login` — `403` when the two do not match; `401` and the form again for a
      wrong token (counted by `ObservatoryWeb.AuthThrottle`: `429` with `Retry-After`
      and the form once a client has failed too often); for the right token, however
      often its address failed, the signed session cookie
      (`ObservatoryWeb.Dashboard.Session`) and `303` to `/`.
    * `POST /logout` — needs the session's CSRF token; revokes the session on the server
      (a copy of the cookie no longer signs in), clears the cookie, `303` to `/login`.
  """

  import ObservatoryWeb.HTML, only: [escape: 1]

  alias ObservatoryWeb.{Auth, Conn}
  alias ObservatoryWeb.Dashboard.{Layout, Session}

  @csrf_cookie "observatory_login_csrf"

  @doc "GET /login"
  @spec new(Conn.t()) :: :ok
  def new(conn) do
    case Session.fetch(conn) do
      {:ok, _session} -> Conn.redirect(conn, "/")
      {:error, _} -> form(conn, 200, nil)
    end
  end

  @doc "POST /login"
  @spec create(Conn.t()) :: :ok
  def create(conn) do
    with {:ok, fields} <- form_fields(conn),
         true <- csrf_ok?(Conn.cookie(conn, @csrf_cookie), fields["_csrf_token"]) do
      # As for the API: a client locked out before this attempt gets 429 for a wrong
      # token, and the right token signs in whatever its address's failures.
      locked = ObservatoryWeb.AuthThrottle.check(conn.remote_ip)

      case Auth.sign_in(conn, blank_to_nil(fields["token"])) do
        {:ok, operator} ->
          Conn.redirect(conn, "/", [
            Session.cookie_header(Session.new(operator)),
            Session.set_cookie(@csrf_cookie, "", "/login", 0)
          ])

        {:error, :unauthorized} ->
          case locked do
            :ok -> form(conn, 401, "That token is not an operator token.")
            {:error, retry_after_s} -> throttled(conn, retry_after_s)
          end
      end
    else
      false -> forbidden(conn)
      {:error, :too_large} -> Conn.text(conn, 413, "request too large")
    end
  end

  # A wrong token while the client is locked out (`ObservatoryWeb.AuthThrottle`).
  defp throttled(conn, retry_after_s) do
    form(
      conn,
      429,
      "Too many failed sign-ins from this address. Try again in #{retry_after_s} s.",
      [{"Retry-After", Integer.to_string(retry_after_s)}]
    )
  end

  @doc "POST /logout"
  @spec delete(Conn.t()) :: :ok
  def delete(conn) do
    with {:ok, session} <- Session.fetch(conn),
         {:ok, fields} <- form_fields(conn),
         true <- Session.valid_csrf?(session, fields["_csrf_token"]) do
      :ok = Session.revoke(session)
      Conn.redirect(conn, "/login", [Session.clear_cookie_header()])
    else
      {:error, :unauthenticated} -> Conn.redirect(conn, "/login")
      _ -> forbidden(conn)
    end
  end

  @doc "The fields of a form-encoded body."
  @spec form_fields(Conn.t()) :: {:ok, %{String.t() => String.t()}} | {:error, :too_large}
  def form_fields(conn) do
    with {:ok, body} <- Conn.read_body(conn) do
      {:ok, URI.decode_query(body)}
    end
  rescue
    # A malformed percent-escape: no field is trusted.
    ArgumentError -> {:ok, %{}}
  end

  defp form(conn, status, error, headers \\ []) do
    token = Session.random()

    body = [
      ~s(<main class="login"><form class="login-card" method="post" action="/login">),
      ~s(<div class="brand"><span class="brand-mark"></span>Observatory</div>),
      ~s(<h1>Operator sign-in</h1>),
      ~s(<p class="muted">Sign in with your operator token to watch the fleet and pause agents.</p>),
      if(error, do: [~s(<p class="form-error" role="alert">), escape(error), "</p>"], else: ""),
      ~s(<input type="hidden" name="_csrf_token" value="),
      escape(token),
      ~s(">),
      ~s(<label for="token">Operator token</label>),
      ~s(<input id="token" name="token" type="password" autocomplete="off" required autofocus>),
      ~s(<button type="submit" class="btn btn-primary">Sign in</button>),
      "</form></main>"
    ]

    Conn.html(
      conn,
      status,
      Layout.page("Sign in · Observatory", body, body_class: "login-page"),
      [
        Session.set_cookie(@csrf_cookie, token, "/login", 3600) | headers ++ Layout.headers()
      ]
    )
  end

  defp forbidden(conn) do
    body = [
      ~s(<main class="login"><div class="login-card"><h1>Form expired</h1>),
      ~s(<p class="muted">The security token of that form did not match. ),
      ~s(<a href="/login">Open the sign-in form again</a>.</p></div></main>)
    ]

    Conn.html(conn, 403, Layout.page("Forbidden · Observatory", body), Layout.headers())
  end

  defp csrf_ok?(cookie, field) when is_binary(cookie) and is_binary(field) and cookie != "",
    do: Session.same?(cookie, field)

  defp csrf_ok?(_cookie, _field), do: false

  defp blank_to_nil(""), do: nil
  defp blank_to_nil(value), do: value
end
