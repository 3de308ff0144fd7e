defmodule ObservatoryWeb.Mount do
  @moduledoc """
  Where a host serves one of Observatory's HTTP APIs, and which requests are its.

  The Plug-free part of `ObservatoryWeb.AgentAPIPlug` and `ObservatoryWeb.LLMProxyPlug`
  (whose Plug side is `ObservatoryWeb.Conn.PlugAdapter`): a mount is an API and the
  path it sits at. A request whose path is under `at` and is one of the API's routes
  (any method) is the mount's: it is answered by `ObservatoryWeb.Router.serve/2`,
  exactly as Observatory's own server answers it — the same authentication,
  throttle, caps, errors and streams. Every other request passes through untouched,
  so the mount can share a prefix with the host's own routes (the dashboard pages).
  In a VM that runs with Observatory's storage off (`Observatory.Storage.decide/0`)
  the mount's requests are answered `503 storage_off`.

  | API | its routes (under `at`) |
  |---|---|
  | `:agents_api` | `/api/v1/decision_logs`, `/api/v1/tool_calls/check`, `/api/v1/sessions…`, `/api/v1/hitl/audit`, `/api/v1/agents…`, `/api/v1/notifications/sinks…` |
  | `:llm_proxy` | `/v1/chat/completions`, `/v1/responses`, `/v1/messages`, `/v1/messages/count_tokens`, `/v1/models…` |
  """

  alias ObservatoryWeb.{Conn, Router}

  @doc false
  # What a host meets when Observatory was compiled before `dependency` was there (Mix
  # does not recompile a dependency when an optional one of its own is added later):
  # `module` was left out of the build. Said where the host uses it.
  @spec left_out(String.t(), String.t()) :: String.t()
  def left_out(module, dependency) do
    "#{module} is not in this build of Observatory: it was compiled before " <>
      "#{dependency} was available to it. Recompile it once: mix deps.compile observatory --force"
  end

  @enforce_keys [:api, :at]
  defstruct [:api, :at]

  @type api :: :agents_api | :llm_proxy
  @type t :: %__MODULE__{api: api(), at: [String.t()]}

  @doc """
  A mount of `api`. Options: `:at` — the path the API's routes sit under
  (default `"/"`: the same paths as Observatory's own server).
  """
  @spec new(api(), keyword()) :: t()
  def new(api, opts) when api in [:agents_api, :llm_proxy] and is_list(opts) do
    case Keyword.keys(opts) -- [:at] do
      [] -> :ok
      unknown -> raise ArgumentError, "unknown options #{inspect(unknown)}; the only one is :at"
    end

    at =
      case Keyword.get(opts, :at, "/") do
        "/" <> _ = at ->
          String.split(at, "/", trim: true)

        other ->
          raise ArgumentError,
                ~s(expected :at to be a path such as "/observatory", got: #{inspect(other)})
      end

    %__MODULE__{api: api, at: at}
  end

  def new(api, opts),
    do: raise(ArgumentError, "expected an API and options, got: #{inspect({api, opts})}")

  @doc """
  `{:ok, segments}` — the request's path segments (still percent-encoded) below the
  mount point — when the request is one of the mount's routes; `:pass` otherwise.
  """
  @spec match(t(), [binary()]) :: {:ok, [binary()]} | :pass
  def match(%__MODULE__{at: at, api: api}, path_segments) do
    with {:ok, rest} <- strip(at, path_segments),
         true <- Router.route?(api, Enum.map(rest, &decode/1)) do
      {:ok, rest}
    else
      _ -> :pass
    end
  end

  defp strip([], rest), do: {:ok, rest}
  defp strip([seg | at], [seg | rest]), do: strip(at, rest)
  defp strip(_at, _path), do: :error

  # Only to recognise the route: Conn.new/3 decodes strictly and refuses what is bad.
  defp decode(seg) do
    URI.decode(seg)
  rescue
    ArgumentError -> seg
  end

  @doc """
  Answers a request of the mount (`segments` from `match/2`) through `adapter` (an
  `ObservatoryWeb.Conn.Adapter`).
  """
  @spec serve(t(), module(), term(), [binary()]) :: :ok | :halt
  def serve(%__MODULE__{api: api}, adapter, req, segments) do
    conn = Conn.new(adapter, req, path_segments: segments)

    case Observatory.Storage.mode() do
      :on ->
        Router.serve(conn, api)

      {:off, reason} ->
        Conn.error(conn, 503, "storage_off", "Observatory does not run in this VM: #{reason}")
    end
  end
end
