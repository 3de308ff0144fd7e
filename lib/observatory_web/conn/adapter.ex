defmodule ObservatoryWeb.Conn.Adapter do
  @moduledoc """
  What `ObservatoryWeb.Conn` needs from an HTTP server: the request as it arrived,
  its body, and ways to answer — whole or in chunks.

  Every handler of the agents' API and the LLM proxy speaks only `ObservatoryWeb.Conn`,
  so one code path serves both servers Observatory runs on:

    * `ObservatoryWeb.Conn.MochiWeb` — Observatory's own server (`ObservatoryWeb.Endpoint`);
    * `ObservatoryWeb.Conn.PlugAdapter` — a Phoenix host's endpoint, through
      `ObservatoryWeb.AgentAPIPlug` and `ObservatoryWeb.LLMProxyPlug` (compiled only
      where Plug is loaded).

  `req` is the adapter's own handle on the request; a chunked answer's `stream` is the
  handle `send_chunked/3` returned.
  """

  @typedoc "The adapter's handle on one request."
  @type req :: term()
  @typedoc "The handle of a chunked answer under way."
  @type stream :: term()
  @type headers :: [{String.t(), String.t()}]

  @typedoc """
  The request as it arrived: the method, the path's segments still percent-encoded,
  the raw query string, every header (names lowercased, values as sent) and the
  client's address. `ObservatoryWeb.Conn.new/3` decodes and checks them.
  """
  @type request :: %{
          method: String.t(),
          path_segments: [binary()],
          query_string: binary(),
          headers: [{binary(), binary()}],
          remote_ip: String.t() | nil
        }

  @callback request(req()) :: request()

  @doc """
  The whole body, at most `max` bytes. `{:error, {:malformed, reason}}` for a chunked
  body whose framing is broken: `ObservatoryWeb.Conn` answers `400` and closes the
  connection.
  """
  @callback read_body(req(), max :: pos_integer()) ::
              {:ok, binary()} | {:error, :too_large | {:malformed, String.t()}}

  @doc "Reads and drops the body (at most `max` bytes), so the client sees the answer."
  @callback discard_body(req(), max :: pos_integer()) :: :ok

  @callback send_resp(req(), status :: pos_integer(), headers(), body :: iodata()) :: :ok

  @doc "Sends the status and headers of an answer whose body follows in chunks."
  @callback send_chunked(req(), status :: pos_integer(), headers()) :: stream()

  @doc "Sends one chunk; `{:error, :closed}` when the client has gone."
  @callback chunk(stream(), iodata()) :: :ok | {:error, :closed}

  @doc "Ends a chunked answer."
  @callback end_chunked(stream()) :: :ok

  @doc """
  The client's TCP socket while it may be watched for a hang-up (`active: :once`),
  or nil where the server does not hand it out.
  """
  @callback client_socket(req()) :: port() | nil

  @doc "Closes the connection after this answer instead of keeping it alive."
  @callback close_after(req()) :: :ok

  @doc "The client hung up while the request was under way: end the request."
  @callback client_gone(req()) :: :ok

  @doc "A cookie's value (the built-in dashboard's sign-in), or nil."
  @callback cookie(req(), name :: String.t()) :: String.t() | nil
end
