defmodule ObservatoryWeb.Endpoint do
  @moduledoc """
  The HTTP server: Debian's MochiWeb (an acceptor pool, one process per connection)
  with `ObservatoryWeb.Router` as its request loop.

      config :observatory, ObservatoryWeb.Endpoint,
        server: true,              # default false: a host app gets no second HTTP server
        ip: {127, 0, 0, 1},        # loopback unless you say otherwise
        port: 4000,                # required with server: true; 0 picks a free port (tests)
        max_connections: 8_192,    # open connections at most; more wait in the backlog
        idle_timeout_ms: 10_000    # time for a request's headers, for its body, and between requests

  Observatory's own config (`config/config.exs`) sets `server: true, port: 4000`; a
  Phoenix host, which does not load that file, gets no server, so no port of its own
  to clash with and no need for MochiWeb, which is started here, with the server.

  ## Idle connections

  MochiWeb waits 300 s for a connection's first request line (and for the next one
  on a kept-alive connection), and stops accepting at `max_connections`: two
  thousand sockets that send nothing were enough to keep everyone else out. So each
  connection is given `idle_timeout_ms` to *complete* its request's headers (a
  slow-header client is cut off too), the same again to send its whole body once a
  handler reads it (MochiWeb would wait 300 s for each piece), and, between
  requests, to start the next one; past that it is closed. A request under way —
  a handler's work, a dashboard's event stream — is not cut.

  The deadline costs no process and no message per request: a BIF timer that each
  request cancels and re-arms, aimed at `ObservatoryWeb.Endpoint.IdleReaper`, which
  closes a connection whose timer fired while it was still idle.
  """

  require Logger

  @state_key {__MODULE__, :idle}
  @idle_ms_key {__MODULE__, :idle_ms}
  @skip_key {__MODULE__, :skip_body}

  @doc false
  def child_spec(_opts) do
    %{id: __MODULE__, start: {__MODULE__, :start_link, []}, type: :worker}
  end

  @doc "Whether the server is configured on (`server: true`); default false."
  @spec server?() :: boolean()
  def server? do
    Application.get_env(:observatory, __MODULE__, []) |> Keyword.get(:server, false) == true
  end

  @doc "Starts the server with the application's configuration."
  def start_link do
    config = Application.get_env(:observatory, __MODULE__, [])
    ip = Keyword.get(config, :ip, {127, 0, 0, 1})

    port =
      Keyword.get(config, :port) || raise(ArgumentError, "no :port for #{inspect(__MODULE__)}")

    idle_ms = Keyword.get(config, :idle_timeout_ms, 10_000)
    start_mochiweb!()

    # What :mochiweb_http.start_link/1 does, with this module's loop around its own.
    case :mochiweb_clock.start() do
      {:ok, _} -> :ok
      {:error, {:already_started, _}} -> :ok
    end

    options = [
      name: __MODULE__,
      ip: ip,
      port: port,
      loop: {__MODULE__, :connection, [idle_ms]},
      acceptor_pool_size: Keyword.get(config, :acceptors, 32),
      # An answer goes out as soon as it is written (no Nagle wait behind a packet the
      # client has not acknowledged yet): measured, HTTP ingest ~24 % → ~30 % of the
      # cheapest route's rate (bench/ingest.exs -- --http).
      nodelay: true,
      max: Keyword.get(config, :max_connections, 8_192)
    ]

    case :mochiweb_socket_server.start_link(options) do
      {:ok, pid} ->
        Logger.info("Observatory API and dashboard listening on #{url()}")
        {:ok, pid}

      {:error, reason} ->
        {:error, {:cannot_listen, :inet.ntoa(ip) |> to_string(), port, reason}}
    end
  end

  # MochiWeb is an optional application (mix.exs): only the server needs it.
  defp start_mochiweb! do
    case Application.ensure_all_started(:mochiweb) do
      {:ok, _} -> :ok
      {:error, reason} -> raise "Observatory's HTTP server needs MochiWeb: #{inspect(reason)}"
    end
  end

  @doc false
  # One connection, in its acceptor process: MochiWeb's HTTP loop, with the idle
  # deadline armed while no request is under way.
  def connection(socket, opts, idle_ms) do
    Process.put(@idle_ms_key, idle_ms)
    arm(idle_ms)

    serve(socket, opts, fn req ->
      disarm()

      try do
        ObservatoryWeb.Router.call(req)
      after
        arm(idle_ms)
      end
    end)
  end

  # MochiWeb's HTTP/1.1 loop (`mochiweb_http:loop/3` of 3.1.1: request line, headers,
  # keep-alive), with one difference: a line its parser rejects — a request line or a
  # header that is not HTTP, such as `Content-Length : 7` (RFC 9112 forbids the space
  # and requires a 400) — is answered `400` at once and the connection closed, where
  # MochiWeb's loop left the parser's error unread and waited for its timeout.
  defp serve(socket, opts, handle) do
    setopts(socket, packet: :http)
    request_line(socket, opts, handle)
  end

  defp request_line(socket, opts, handle) do
    setopts(socket, active: :once)

    receive do
      {proto, _, {:http_request, method, path, version}} when proto in [:http, :ssl] ->
        setopts(socket, packet: :httph)
        headers(socket, opts, {method, path, version}, [], handle, 0)

      # Blank lines before a request are allowed (RFC 9112 §2.2).
      {proto, _, {:http_error, blank}} when proto in [:http, :ssl] and blank in [~c"\r\n", ~c"\n"] ->
        request_line(socket, opts, handle)

      {proto, _, {:http_error, _}} when proto in [:http, :ssl] ->
        invalid(
          socket,
          opts,
          {:GET, {:abs_path, ~c"/"}, {1, 1}},
          [],
          "the request line is not HTTP"
        )

      {:tcp_error, _, :emsgsize} ->
        invalid(
          socket,
          opts,
          {:GET, {:abs_path, ~c"/"}, {1, 1}},
          [],
          "the request line is too long"
        )

      {closed, _} when closed in [:tcp_closed, :ssl_closed] ->
        close(socket, closed)

      {error, _, reason} when error in [:tcp_error, :ssl_error] ->
        close(socket, reason)
    after
      300_000 -> close(socket, :request_recv_timeout)
    end
  end

  @max_headers 1_000

  defp headers(socket, opts, request, acc, _handle, @max_headers),
    do: invalid(socket, opts, request, acc, "too many headers")

  defp headers(socket, opts, request, acc, handle, count) do
    setopts(socket, active: :once)

    receive do
      {proto, _, :http_eoh} when proto in [:http, :ssl] ->
        req = new_request(socket, opts, request, acc)
        handle.(req)
        after_response(req, handle)

      {proto, _, {:http_header, _, name, _, value}} when proto in [:http, :ssl] ->
        headers(socket, opts, request, [{name, value} | acc], handle, count + 1)

      {proto, _, {:http_error, _}} when proto in [:http, :ssl] ->
        invalid(socket, opts, request, acc, "a header line is malformed")

      {:tcp_error, _, :emsgsize} ->
        invalid(socket, opts, request, acc, "a header line is too long")

      {closed, _} when closed in [:tcp_closed, :ssl_closed] ->
        close(socket, closed)

      {error, _, reason} when error in [:tcp_error, :ssl_error] ->
        close(socket, reason)
    after
      30_000 -> close(socket, :headers_recv_timeout)
    end
  end

  defp new_request(socket, opts, request, acc) do
    setopts(socket, packet: :raw)
    :mochiweb.new_request({socket, opts, request, Enum.reverse(acc)})
  end

  # 400 with a JSON body saying what was wrong, then the connection is closed: what
  # follows on it cannot be trusted to start a request.
  defp invalid(socket, opts, request, acc, reason) do
    req = new_request(socket, opts, request, acc)
    body = Observatory.JSON.encode!(%{error: "bad_request", message: reason})
    headers = [{"Content-Type", "application/json"}, {"Connection", "close"}]
    :mochiweb_request.respond({400, headers ++ ObservatoryWeb.Conn.security_headers(), body}, req)
    close(socket, :invalid_request)
  end

  defp after_response(req, handle) do
    socket = :mochiweb_request.get(:socket, req)
    skip = Process.delete(@skip_key)

    if :mochiweb_request.should_close(req) do
      close(socket, :should_close)
    else
      if skip, do: skip_body(socket, skip)
      :mochiweb_request.cleanup(req)
      :erlang.garbage_collect()
      serve(socket, :mochiweb_request.get(:opts, req), handle)
    end
  end

  @doc false
  # Called by ObservatoryWeb.Conn.MochiWeb as it answers a request whose small body
  # (`bytes`, from its Content-Length) no handler read: MochiWeb is told the body was
  # read, so it keeps the connection, and the body is skipped once the answer is out.
  def skip_body_after_response(bytes) do
    Process.put(:mochiweb_request_recv, true)
    Process.put(@skip_key, bytes)
  end

  # Exactly the announced bytes, within the idle deadline, or the connection closes:
  # what follows them is the next request.
  defp skip_body(socket, bytes) do
    case :mochiweb_socket.recv(socket, bytes, Process.get(@idle_ms_key, 10_000)) do
      {:ok, _body} -> :ok
      {:error, reason} -> close(socket, {:unread_body, reason})
    end
  end

  # `{:shutdown, _}`: MochiWeb counts the connection closed and logs nothing.
  defp close(socket, why) do
    :mochiweb_socket.close(socket)
    exit({:shutdown, why})
  end

  defp setopts(socket, options),
    do: :ok = :mochiweb_socket.exit_if_closed(:mochiweb_socket.setopts(socket, options))

  @doc """
  Runs `fun` (a read of the request body) under the same `idle_timeout_ms`
  deadline as the headers: MochiWeb waits 300 s for each piece of a body, so a
  client that announces a body and never sends it would otherwise hold the
  connection. Outside an endpoint connection (a test calling the router) it
  just runs `fun`.
  """
  @spec with_read_deadline((() -> result)) :: result when result: term()
  def with_read_deadline(fun) do
    case {Process.get(@state_key), Process.get(@idle_ms_key)} do
      {:busy, idle_ms} when is_integer(idle_ms) ->
        arm(idle_ms)

        try do
          fun.()
        after
          disarm()
        end

      _ ->
        fun.()
    end
  end

  # Each timer carries a fresh id, so a timer that fired just before being
  # cancelled cannot close the connection during a later deadline.
  defp arm(idle_ms) do
    id = :erlang.unique_integer()
    timer = :erlang.start_timer(idle_ms, __MODULE__.IdleReaper, {:idle, self(), id})
    Process.put(@state_key, {timer, id})
  end

  defp disarm do
    {timer, _id} = Process.put(@state_key, :busy)
    :erlang.cancel_timer(timer, async: true, info: false)
  end

  @doc false
  # Called by the reaper: whether the connection is still waiting on timer `seq`.
  def idle?(pid, seq) do
    case Process.info(pid, :dictionary) do
      {:dictionary, dict} ->
        match?({_, {ref, ^seq}} when is_reference(ref), List.keyfind(dict, @state_key, 0))

      nil ->
        false
    end
  end

  @doc "The port the server listens on."
  @spec port() :: :inet.port_number()
  def port, do: :mochiweb_socket_server.get(__MODULE__, :port)

  @doc "How many connections are open."
  @spec connections() :: non_neg_integer()
  def connections, do: :mochiweb_socket_server.get(__MODULE__, :active_sockets)

  @doc "The base URL of the running server."
  @spec url() :: String.t()
  def url do
    ip = Application.get_env(:observatory, __MODULE__, []) |> Keyword.get(:ip, {127, 0, 0, 1})
    "http://#{:inet.ntoa(ip)}:#{port()}"
  end
end

defmodule ObservatoryWeb.Endpoint.IdleReaper do
  @moduledoc false
  # Receives the idle timers of the endpoint's connections (ObservatoryWeb.Endpoint)
  # and closes each connection still idle when its timer fires.
  use GenServer

  def start_link(_opts \\ []), do: GenServer.start_link(__MODULE__, nil, name: __MODULE__)

  @impl true
  def init(nil), do: {:ok, nil}

  @impl true
  def handle_info({:timeout, _ref, {:idle, pid, seq}}, state) do
    # {:shutdown, _}: MochiWeb counts the connection closed and logs nothing.
    if ObservatoryWeb.Endpoint.idle?(pid, seq), do: Process.exit(pid, {:shutdown, :idle_timeout})
    {:noreply, state}
  end
end
