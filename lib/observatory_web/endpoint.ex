defmodule ObservatoryWeb.Endpoint do
  @moduledoc """
  The HTTP server: Debian's MochiWeb (an acceptor pool, one process per connection)
  with this module's HTTP/1.1 loop — each request head read in one go and parsed
  with `:erlang.decode_packet/3`, keep-alive, pipelining — and
  `ObservatoryWeb.Router` answering each request.

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

  MochiWeb's own loop waited 300 s for a connection's first request line (and for
  the next one on a kept-alive connection), and MochiWeb stops accepting at
  `max_connections`: two thousand sockets that send nothing were enough to keep
  everyone else out. So each connection is given `idle_timeout_ms` to *complete*
  its request's headers (a slow-header client is cut off too), the same again to
  send its whole body once a handler reads it (MochiWeb would wait 300 s for each
  piece), and, between requests, to start the next one; past that it is closed. A request under way —
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
      Keyword.get(config, :port) ||
        raise(
          ArgumentError,
          "no :port for #{inspect(__MODULE__)}: config :observatory, #{inspect(__MODULE__)}, " <>
            "server: true needs port: … (or OBSERVATORY_PORT)"
        )

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

  # The request head — its request line and header lines — read into a buffer in as
  # few reads of the socket as it arrives in (one, for a head that comes in one
  # packet) and parsed there by Erlang's own HTTP parser (`:erlang.decode_packet/3`,
  # the parser behind the socket's `{packet, http}` mode). MochiWeb's loop set that
  # mode and took the head one line at a time, a round trip to the socket driver and
  # a message per header line. Bytes read past the head (a body, a pipelined
  # request) go back to the socket (`:gen_tcp.unrecv/2`), where the body readers and
  # the next request's read find them as if never taken.
  #
  # A line the parser rejects — a request line or a header that is not HTTP, such as
  # `Content-Length : 7` (RFC 9112 forbids the space and requires a 400) — is
  # answered `400` at once and the connection closed, as is a request line longer
  # than @max_request_line (414), a head longer than @max_head or with more than
  # @max_headers headers (431): a client chooses these sizes.
  @max_request_line 8_192
  @max_head 65_536
  @max_headers 100
  # What a 400 answers to when no request line could be read.
  @no_request {:GET, {:abs_path, ~c"/"}, {1, 1}}

  @doc false
  def limits,
    do: %{max_request_line: @max_request_line, max_head: @max_head, max_headers: @max_headers}

  defp serve(socket, opts, handle), do: request_line(socket, opts, handle, "")

  defp request_line(socket, opts, handle, buffer) do
    case :erlang.decode_packet(:http, buffer, packet_size: @max_request_line) do
      {:ok, {:http_request, method, uri, version}, rest} ->
        used = byte_size(buffer) - byte_size(rest)
        request = {method, uri, version}
        headers(socket, opts, handle, request, rest, [], 0, @max_head - used)

      # Blank lines before a request are allowed (RFC 9112 §2.2).
      {:ok, {:http_error, blank}, rest} when blank in [~c"\r\n", ~c"\n"] ->
        request_line(socket, opts, handle, rest)

      {:ok, _not_a_request, _rest} ->
        invalid(socket, opts, @no_request, [], 400, "the request line is not HTTP")

      {:more, _} ->
        buffer = more(socket, buffer, @max_request_line, :request_recv_timeout)
        request_line(socket, opts, handle, buffer)

      {:error, _too_long} ->
        invalid(
          socket,
          opts,
          @no_request,
          [],
          414,
          "the request line is longer than #{@max_request_line} bytes"
        )
    end
  end

  defp headers(socket, opts, _handle, request, _buffer, acc, @max_headers, _left),
    do: invalid(socket, opts, request, acc, 431, "more than #{@max_headers} headers")

  defp headers(socket, opts, _handle, request, _buffer, acc, _count, left) when left <= 0,
    do: invalid(socket, opts, request, acc, 431, "the request head is over #{@max_head} bytes")

  defp headers(socket, opts, handle, request, buffer, acc, count, left) do
    case :erlang.decode_packet(:httph_bin, buffer, packet_size: left) do
      {:ok, :http_eoh, rest} ->
        if rest != "", do: :ok = :gen_tcp.unrecv(socket, rest)
        req = ObservatoryWeb.Conn.MochiWeb.new_request(socket, opts, request, Enum.reverse(acc))
        handle.(req)
        after_response(req, handle)

      {:ok, {:http_header, _, name, _, value}, rest} ->
        left = left - (byte_size(buffer) - byte_size(rest))
        headers(socket, opts, handle, request, rest, [{name, value} | acc], count + 1, left)

      {:ok, {:http_error, _}, _rest} ->
        invalid(socket, opts, request, acc, 400, "a header line is malformed")

      {:more, _} ->
        buffer = more(socket, buffer, left, :headers_recv_timeout)
        headers(socket, opts, handle, request, buffer, acc, count, left)

      {:error, _too_long} ->
        invalid(socket, opts, request, acc, 431, "the request head is over #{@max_head} bytes")
    end
  end

  # `buffer` and what the client sent next, once that holds a line end (until one
  # comes the parser has nothing new to say: a head ends with one) or the buffer is
  # over `limit`: a head sent a byte at a time is parsed once a line, not once a
  # byte. The connection ends when the client is gone. (The idle deadline, not this
  # timeout, is what cuts a slow client off.)
  defp more(socket, buffer, limit, timeout_reason) do
    case :gen_tcp.recv(socket, 0, 300_000) do
      {:ok, data} ->
        buffer = buffer <> data

        if :binary.match(data, "\n") != :nomatch or byte_size(buffer) > limit,
          do: buffer,
          else: more(socket, buffer, limit, timeout_reason)

      {:error, :timeout} ->
        close(socket, timeout_reason)

      {:error, :closed} ->
        close(socket, :tcp_closed)

      {:error, reason} ->
        close(socket, reason)
    end
  end

  # An error with a JSON body saying what was wrong, then the connection is closed:
  # what follows on it cannot be trusted to start a request.
  defp invalid(socket, opts, request, acc, status, reason) do
    alias ObservatoryWeb.Conn.MochiWeb, as: Adapter
    req = Adapter.new_request(socket, opts, request, Enum.reverse(acc))
    body = Observatory.JSON.encode!(%{error: error_code(status), message: reason})
    Adapter.close_after(req)

    Adapter.send_resp(
      req,
      status,
      [{"Content-Type", "application/json"} | ObservatoryWeb.Conn.security_headers()],
      body
    )

    close(socket, :invalid_request)
  end

  defp error_code(400), do: "bad_request"
  defp error_code(414), do: "uri_too_long"
  defp error_code(431), do: "request_header_fields_too_large"

  defp after_response(req, handle) do
    socket = :mochiweb_request.get(:socket, req)
    skip = Process.delete(@skip_key)

    if ObservatoryWeb.Conn.MochiWeb.should_close?(req) do
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
