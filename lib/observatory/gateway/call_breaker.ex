defmodule Observatory.Gateway.CallBreaker do
  @moduledoc """
  Layer 2 of the two-layer loop detection (seed 002): a sliding-window circuit
  breaker on identical tool calls, for an MCP proxy that asks before forwarding.

  A call is *identical* to another when the agent, the session, the tool and the
  canonical JSON of the arguments (sorted keys) are the same. The agent is the
  authenticated one: an agent's calls never count against another agent's, even
  under the same session id (the tracker may not know the session, or have evicted
  it, so a session id alone proves nothing). At most `max_calls` identical calls are
  allowed in any `window_ms`; the next is denied with the time until one leaves the
  window. Denied calls are not counted, so a caller that backs off gets through again.

  The proxy calls `check/5` (or `POST /api/v1/tool_calls/check`) *after* its own
  policy evaluation, so every call it makes is audited by the policy first; every
  check is counted in `/metrics` and every denial logged and broadcast on
  `"gateway:loop_detection"`.

      config :observatory, :call_breaker, max_calls: 20, window_ms: 60_000, max_keys: 100_000

  Read when the breaker starts.
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{Events, StepDetector}
  alias Observatory.{Native, NativeStores}

  @defaults [max_calls: 20, window_ms: 60_000, max_keys: 100_000]

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  Checks one call of `agent` (an agent id, or `:any_agent` for an insecure shared key)
  in `session_id`. Returns `{:allow, count}` or `{:deny, count, retry_after_ms}`, or
  `{:error, reason}` for arguments JSON cannot express.

  ## Options
    * `:now_ms` — the clock, for tests (default: monotonic milliseconds).
  """
  @spec check(String.t() | :any_agent, String.t(), String.t(), term(), keyword()) ::
          {:allow, pos_integer()}
          | {:deny, pos_integer(), non_neg_integer()}
          | {:error, String.t()}
  def check(agent, session_id, tool, arguments, opts \\ [])
      when (is_binary(agent) or agent == :any_agent) and is_binary(session_id) and
             is_binary(tool) do
    now =
      Keyword.get_lazy(opts, :now_ms, fn -> System.monotonic_time(:millisecond) - origin() end)

    with {:ok, digest} <- Native.json_stable_hash(arguments) do
      case Native.breaker_check(breaker(), counter_key(agent, session_id), tool, digest, now) do
        {:allow, _count} = allow ->
          Observatory.Metrics.inc(:tool_calls_allowed)
          allow

        {:deny, count, retry_after} = deny ->
          Observatory.Metrics.inc(:tool_calls_denied)

          Logger.warning(
            "circuit breaker denied #{tool} for agent #{inspect(agent)} in session " <>
              "#{inspect(session_id)}: #{count} identical calls"
          )

          Events.broadcast(StepDetector.topic(), %{
            event_type: "loop_detection",
            kind: "circuit_breaker",
            agent_id: if(is_binary(agent), do: agent),
            session_id: session_id,
            tool: tool,
            count: count,
            retry_after_ms: retry_after
          })

          deny
      end
    end
  end

  # The agent's length first, so no agent id and session id can spell another pair's key.
  defp counter_key(:any_agent, session_id), do: "*:" <> session_id
  defp counter_key(agent, session_id), do: "#{byte_size(agent)}:#{agent}:#{session_id}"

  @doc "The settings in force."
  def settings, do: Keyword.merge(@defaults, Application.get_env(:observatory, :call_breaker, []))

  defp breaker, do: NativeStores.get({__MODULE__, :breaker})
  # The breaker's clock starts at 0 when the gateway starts (monotonic time may be negative).
  defp origin, do: :persistent_term.get({__MODULE__, :origin})

  @impl true
  def init(_opts) do
    s = settings()

    case Native.breaker_new(s[:max_calls], s[:window_ms], s[:max_keys]) do
      {:error, reason} ->
        {:stop, {:invalid_call_breaker_config, reason}}

      breaker ->
        NativeStores.put({__MODULE__, :breaker}, breaker)
        :persistent_term.put({__MODULE__, :origin}, System.monotonic_time(:millisecond))
        schedule(s)
        {:ok, s}
    end
  end

  @impl true
  def handle_info(:prune, s) do
    Native.breaker_prune(breaker(), System.monotonic_time(:millisecond) - origin())
    schedule(s)
    {:noreply, s}
  end

  defp schedule(s), do: Process.send_after(self(), :prune, s[:window_ms])
end
