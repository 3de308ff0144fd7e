if Code.ensure_loaded?(Plug.Conn) do
  defmodule ObservatoryWeb.Conn.PlugAdapter do
    @moduledoc """
    `ObservatoryWeb.Conn.Adapter` over a `Plug.Conn`: Observatory's APIs served by a
    Phoenix host's endpoint (`ObservatoryWeb.AgentAPIPlug`, `ObservatoryWeb.LLMProxyPlug`).
    Compiled only where Plug is loaded.

    `call/2` hands a request of the mount (`ObservatoryWeb.Mount.match/2`) to the
    shared handlers and returns the conn they answered, halted; any other request is
    returned untouched. A `Plug.Conn` is a value that each read and each send
    replaces, while the handlers answer through `ObservatoryWeb.Conn` and return
    nothing: so the current `Plug.Conn` of the request is kept in the process
    dictionary (the request's own process, which runs the whole request) under the
    key that is this adapter's `req`.

    The body must be unread: mounted after `Plug.Parsers` (in a router), a JSON body
    has been read and decoded already and the request is answered `500` with the
    fix. Streams are chunked answers (`Plug.Conn.send_chunked/2`, `chunk/2`); a
    chunk the client no longer takes ends the stream. The client's socket is not
    handed out by Plug, so a hang-up while the upstream works is noticed at the
    answer's first write rather than at once.
    """

    @behaviour ObservatoryWeb.Conn.Adapter

    require Logger

    alias ObservatoryWeb.Mount

    @doc "Serves `conn` if it is one of `mount`'s requests; passes it on otherwise."
    @spec call(Plug.Conn.t(), Mount.t()) :: Plug.Conn.t()
    def call(%Plug.Conn{} = conn, %Mount{} = mount) do
      case Mount.match(mount, conn.path_info) do
        :pass ->
          conn

        {:ok, segments} ->
          if body_consumed?(conn) do
            conn |> consumed_body(mount) |> Plug.Conn.halt()
          else
            conn |> serve(mount, segments) |> Plug.Conn.halt()
          end
      end
    end

    defp serve(conn, mount, segments) do
      key = {__MODULE__, make_ref()}
      Process.put(key, conn)
      Mount.serve(mount, __MODULE__, key, segments)
      conn = Process.delete(key)

      # Every path through the handlers answers; this is the net under them.
      if conn.state == :unset,
        do: Plug.Conn.send_resp(conn, 500, "the request was not answered"),
        else: conn
    end

    # Plug.Parsers leaves body_params unfetched only when it did not run.
    defp body_consumed?(%Plug.Conn{body_params: %Plug.Conn.Unfetched{}}), do: false

    defp body_consumed?(conn) do
      parsed = conn.body_params != %{}

      type =
        case Plug.Conn.get_req_header(conn, "content-type") do
          [type | _] -> type
          [] -> ""
        end

      parsed or
        String.starts_with?(type, ["application/json", "application/x-www-form", "multipart/"])
    end

    defp consumed_body(conn, mount) do
      plug =
        if mount.api == :llm_proxy,
          do: "ObservatoryWeb.LLMProxyPlug",
          else: "ObservatoryWeb.AgentAPIPlug"

      message =
        "#{plug} got a request whose body Plug.Parsers had read already: " <>
          "put `plug #{plug}` in your endpoint, above `plug Plug.Parsers`"

      Logger.error(message)

      conn
      |> Plug.Conn.put_resp_header("content-type", "application/json")
      |> Plug.Conn.send_resp(
        500,
        Observatory.JSON.encode!(%{error: "misconfigured", message: message})
      )
    end

    defp get(key), do: Process.get(key) || raise("no Plug.Conn for #{inspect(key)}")
    defp put(key, conn), do: Process.put(key, conn)

    @impl true
    def request(key) do
      conn = get(key)

      %{
        method: conn.method,
        path_segments: conn.path_info,
        query_string: conn.query_string,
        headers:
          for({name, value} <- conn.req_headers, do: {ObservatoryWeb.Conn.downcase(name), value}),
        remote_ip: conn.remote_ip && conn.remote_ip |> :inet.ntoa() |> to_string()
      }
    end

    @impl true
    def read_body(key, max), do: read(key, max, [], 0)

    defp read(key, max, acc, size) do
      case Plug.Conn.read_body(get(key), length: max - size + 1, read_length: 1_000_000) do
        {:ok, data, conn} ->
          put(key, conn)
          size = size + byte_size(data)
          if size > max, do: {:error, :too_large}, else: {:ok, IO.iodata_to_binary([acc, data])}

        {:more, data, conn} ->
          put(key, conn)
          size = size + byte_size(data)
          if size > max, do: {:error, :too_large}, else: read(key, max, [acc, data], size)

        {:error, reason} ->
          raise "reading the request body failed: #{inspect(reason)}"
      end
    end

    @impl true
    def discard_body(key, max), do: discard(key, max)

    defp discard(key, left) do
      case Plug.Conn.read_body(get(key), length: 64 * 1024) do
        {:ok, _data, conn} ->
          put(key, conn)
          :ok

        {:more, data, conn} ->
          put(key, conn)
          left = left - byte_size(data)
          if left > 0, do: discard(key, left), else: :ok

        {:error, _} ->
          :ok
      end
    end

    @impl true
    def send_resp(key, status, headers, body) do
      conn = get(key)

      # An answer is sent once: a handler that failed after answering is logged by
      # the router, and its second answer dropped here.
      if conn.state == :unset do
        conn = conn |> merge(headers) |> Plug.Conn.send_resp(status, body)
        put(key, conn)
      end

      :ok
    end

    @impl true
    def send_chunked(key, status, headers) do
      conn = key |> get() |> merge(headers) |> Plug.Conn.send_chunked(status)
      put(key, conn)
      key
    end

    @impl true
    def chunk(key, data) do
      case Plug.Conn.chunk(get(key), data) do
        {:ok, conn} ->
          put(key, conn)
          :ok

        {:error, _closed} ->
          {:error, :closed}
      end
    end

    # The chunked answer ends when the request's process returns from the plug.
    @impl true
    def end_chunked(_key), do: :ok

    @impl true
    def client_socket(_key), do: nil

    @impl true
    def close_after(_key), do: :ok

    @impl true
    def client_gone(_key), do: :ok

    @impl true
    def cookie(key, name) do
      conn = key |> get() |> Plug.Conn.fetch_cookies()
      put(key, conn)
      Map.get(conn.req_cookies, name)
    end

    # Ours replace the defaults of the same names (Plug's cache-control); a name we
    # send twice (an upstream's repeated header) is sent twice.
    defp merge(conn, headers) do
      ours = for {name, value} <- headers, do: {ObservatoryWeb.Conn.downcase(name), value}
      names = MapSet.new(ours, &elem(&1, 0))
      kept = Enum.reject(conn.resp_headers, fn {name, _} -> MapSet.member?(names, name) end)
      %{conn | resp_headers: kept ++ ours}
    end
  end
end
