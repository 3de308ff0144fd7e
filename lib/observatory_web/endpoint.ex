defmodule ObservatoryWeb.Endpoint do
  @moduledoc """
  The HTTP server: Debian's MochiWeb (an acceptor pool, one process per connection)
  with `ObservatoryWeb.Router` as its request loop.

      config :observatory, ObservatoryWeb.Endpoint,
        server: true,         # default false: a host app gets no second HTTP server
        ip: {127, 0, 0, 1},   # loopback unless you say otherwise
        port: 4000            # required with server: true; 0 picks a free port (tests)

  Observatory's own config (`config/config.exs`) sets `server: true, port: 4000`; a
  Phoenix host, which does not load that file, gets no server, so no port of its own
  to clash with and no need for MochiWeb, which is started here, with the server.
  """

  require Logger

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

    start_mochiweb!()

    options = [
      name: __MODULE__,
      ip: ip,
      port: port,
      loop: &ObservatoryWeb.Router.call/1,
      acceptor_pool_size: Keyword.get(config, :acceptors, 32)
    ]

    case :mochiweb_http.start_link(options) do
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

  @doc "The port the server listens on."
  @spec port() :: :inet.port_number()
  def port, do: :mochiweb_socket_server.get(__MODULE__, :port)

  @doc "The base URL of the running server."
  @spec url() :: String.t()
  def url do
    ip = Application.get_env(:observatory, __MODULE__, []) |> Keyword.get(:ip, {127, 0, 0, 1})
    "http://#{:inet.ntoa(ip)}:#{port()}"
  end
end
