defmodule Observatory.KillSwitch.Windows do
  @moduledoc """
  The owner of the per-agent sliding windows (seed 003, "Kill Switch State
  Management").

  The windows live in a Rust store (a NIF resource: shards of
  `Mutex<HashMap<agent_id, AgentWindow>>`) that this GenServer creates and publishes
  in an ETS table. Callers do not queue behind the process: each call runs the
  NIF in the caller, under the lock of one shard. The process only ticks the store's
  clock (used to evict the least recently seen window if more than `max_agents`
  windows exist).

  Only agents with the kill switch enabled have a window. Windows are kept in memory:
  a restart of the application starts every window empty, as if each agent had just
  been activated; the agents' records and events are durable
  (`Observatory.KillSwitch.Agents`).
  """

  use GenServer

  alias Observatory.{Native, NativeStores}

  @type verdict :: %{
          score: float(),
          exceeded: boolean(),
          signals: signals(),
          window_len: non_neg_integer()
        }
  @type signals :: %{
          similar_prompts: non_neg_integer(),
          similar_responses: non_neg_integer(),
          repeated_tool_calls: non_neg_integer()
        }
  @type entry :: %{
          prompt_hash: non_neg_integer() | nil,
          response_hash: non_neg_integer() | nil,
          tool_signatures: [non_neg_integer()]
        }

  # Comparing a request's signatures with every entry grows with their number.
  @dirty_signatures 32

  @doc """
  Starts the owner.

  ## Options
    * `:name` — default `#{inspect(__MODULE__)}`.
    * `:max_agents` — windows kept at most, default the `:kill_switch` `:max_agents`
      setting (10 000).
    * `:tick_ms` — clock resolution for eviction order, default 1 000.
  """
  def start_link(opts \\ []) do
    name = Keyword.get(opts, :name, __MODULE__)

    unless is_atom(name) do
      raise ArgumentError, "expected :name to be an atom, got: #{inspect(name)}"
    end

    GenServer.start_link(__MODULE__, Keyword.put(opts, :name, name), name: name)
  end

  @doc """
  Adds a request to the agent's window (creating it), resized to `window_size`, and
  scores it against `threshold`. Settings out of range give
  `{:error, :invalid_kill_switch_window | :invalid_kill_switch_threshold}` and store
  nothing.
  """
  @spec observe_request(
          String.t(),
          non_neg_integer() | nil,
          [non_neg_integer()],
          pos_integer(),
          number(),
          atom()
        ) :: {:ok, verdict()} | {:error, atom()}
  def observe_request(agent_id, prompt_hash, signatures, size, threshold, name \\ __MODULE__)

  def observe_request(agent_id, prompt_hash, signatures, size, threshold, name)
      when is_binary(agent_id) and is_list(signatures) and is_integer(size) and size >= 0 and
             is_number(threshold) do
    nif =
      if length(signatures) > @dirty_signatures,
        do: &Native.kill_switch_observe_request_dirty/6,
        else: &Native.kill_switch_observe_request/6

    case nif.(store(name), agent_id, prompt_hash, signatures, size, threshold / 1) do
      {score, exceeded, signals, len} ->
        {:ok, %{score: score, exceeded: exceeded, signals: signals(signals), window_len: len}}

      {:error, _} = error ->
        error
    end
  end

  def observe_request(_agent_id, _prompt, _signatures, size, _threshold, _name)
      when not (is_integer(size) and size >= 0),
      do: {:error, :invalid_kill_switch_window}

  def observe_request(_agent_id, _prompt, _signatures, _size, threshold, _name)
      when not is_number(threshold),
      do: {:error, :invalid_kill_switch_threshold}

  @doc "Attaches a response fingerprint to the agent's latest request; false without a window."
  @spec observe_response(String.t(), non_neg_integer(), atom()) :: boolean()
  def observe_response(agent_id, response_hash, name \\ __MODULE__),
    do: Native.kill_switch_observe_response(store(name), agent_id, response_hash)

  @doc "Applies a new window size at once; false when the agent has no window."
  @spec resize(String.t(), pos_integer(), atom()) :: boolean() | {:error, atom()}
  def resize(agent_id, window_size, name \\ __MODULE__)

  def resize(agent_id, size, name) when is_integer(size) and size >= 0,
    do: Native.kill_switch_resize(store(name), agent_id, size)

  def resize(_agent_id, _size, _name), do: {:error, :invalid_kill_switch_window}

  @doc "Forgets the agent's window (and its run over the threshold); true when it had one."
  @spec clear(String.t(), atom()) :: boolean()
  def clear(agent_id, name \\ __MODULE__) do
    :ets.delete(would_trip_table(name), agent_id)
    Native.kill_switch_clear(store(name), agent_id)
  end

  @doc """
  Marks the start of a run of requests over the threshold that did not stop the agent
  (shadow and warn modes); true when the run is new.
  """
  @spec start_would_trip(String.t(), atom()) :: boolean()
  def start_would_trip(agent_id, name \\ __MODULE__),
    do: :ets.insert_new(would_trip_table(name), {agent_id})

  @doc "Ends the agent's run over the threshold; true when there was one."
  @spec end_would_trip(String.t(), atom()) :: boolean()
  def end_would_trip(agent_id, name \\ __MODULE__),
    do: :ets.take(would_trip_table(name), agent_id) != []

  defp would_trip_table(name), do: Module.concat(name, WouldTrip)

  @doc "The score of the agent's latest request and the window's fill, or nil."
  @spec status(String.t(), atom()) ::
          %{
            score: float(),
            signals: signals(),
            window_len: non_neg_integer(),
            window_size: pos_integer()
          }
          | nil
  def status(agent_id, name \\ __MODULE__) do
    case Native.kill_switch_status(store(name), agent_id) do
      {score, signals, len, size} ->
        %{score: score, signals: signals(signals), window_len: len, window_size: size}

      nil ->
        nil
    end
  end

  @doc "The window's entries, oldest first, or nil when the agent has none."
  @spec entries(String.t(), atom()) :: [entry()] | nil
  def entries(agent_id, name \\ __MODULE__) do
    case Native.kill_switch_window(store(name), agent_id) do
      nil ->
        nil

      entries ->
        for {prompt, response, signatures} <- entries do
          %{prompt_hash: prompt, response_hash: response, tool_signatures: signatures}
        end
    end
  end

  @doc "How many windows are held."
  @spec count(atom()) :: non_neg_integer()
  def count(name \\ __MODULE__), do: Native.kill_switch_len(store(name))

  defp store(name), do: NativeStores.get({__MODULE__, name})

  defp signals({prompts, responses, tools}),
    do: %{similar_prompts: prompts, similar_responses: responses, repeated_tool_calls: tools}

  ## Server

  @impl true
  def init(opts) do
    Process.flag(:trap_exit, true)
    name = Keyword.fetch!(opts, :name)

    max =
      Keyword.get_lazy(opts, :max_agents, fn ->
        Application.get_env(:observatory, :kill_switch, []) |> Keyword.get(:max_agents, 10_000)
      end)

    tick = Keyword.get(opts, :tick_ms, 1_000)

    for {key, value} <- [max_agents: max, tick_ms: tick], not (is_integer(value) and value > 0) do
      raise ArgumentError,
            "expected #{inspect(key)} to be a positive integer, got: #{inspect(value)}"
    end

    shards = max |> div(256) |> max(1) |> min(64)
    store = Native.kill_switch_new(shards, max)
    :ets.new(would_trip_table(name), [:named_table, :public, :set])
    NativeStores.put({__MODULE__, name}, store)
    state = %{name: name, store: store, tick: tick}
    tick_now(state)
    {:ok, state}
  end

  @impl true
  def handle_info(:tick, state) do
    tick_now(state)
    {:noreply, state}
  end

  @impl true
  def terminate(_reason, %{name: name}), do: NativeStores.erase({__MODULE__, name})

  defp tick_now(%{store: store, tick: tick}) do
    Native.kill_switch_tick(store, System.monotonic_time(:millisecond))
    Process.send_after(self(), :tick, tick)
  end
end
