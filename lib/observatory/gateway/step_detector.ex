defmodule Observatory.Gateway.StepDetector do
  @moduledoc """
  Layer 1 of the two-layer loop detection (seed 002): a `StepLoopDetector` per
  session, fed by every validated DecisionLog that carries an `action.result`.

  Each step has an *approach* (the tool and its input) and an *outcome* (the status
  and the result), both hashed over canonical JSON so key order never matters:

  |                    | new outcome   | repeated outcome |
  |--------------------|---------------|------------------|
  | new approach       | full progress | stuck            |
  | repeated approach  | world changed | full stagnation  |

  Progress resets both streaks; *stuck* and *full stagnation* each grow their own
  streak. At a warn threshold the ingest answer carries a `warn` directive with
  guidance for the LLM; at a block threshold a `block` directive, and the session
  stays blocked until an operator resets it (`reset/2`). Warnings and blocks go out
  as `loop_detection` events on `"gateway:loop_detection"`.

      config :observatory, :step_detection,
        stagnation_warn: 3, stagnation_block: 5,   # repeated approach, same outcome
        stuck_warn: 5, stuck_block: 8,             # new approaches, same outcome
        history: 16,                               # steps remembered per session
        max_sessions: 100_000                      # read at start

  Thresholds and history are read on every step from the settings snapshot
  (`Observatory.configure/1` applies a change to the next step,
  `Application.put_env/3` within `:settings_refresh_ms`); `max_sessions` when the
  detector starts. Sessions idle for `:entropy_session_ttl_ms` are forgotten, unless blocked.

  ## Durable blocks

  Streaks live in the Rust store and start afresh if this process crashes; blocks do
  not. The step that blocks a session also writes the block to a Mnesia
  `disc_copies` table (on disk before the answer goes out), and every step checks it:
  a session stays blocked across a crash of this process, a restart of the node and
  the idle sweep, until `reset/2`. At most `max_sessions` blocks are kept on disc;
  past that a new block holds in memory only and a warning is logged.
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{Events, IdleSweep}
  alias Observatory.{Native, NativeStores}
  alias Observatory.Storage

  @blocks :observatory_step_blocks

  @defaults [
    stagnation_warn: 3,
    stagnation_block: 5,
    stuck_warn: 5,
    stuck_block: 8,
    history: 16,
    max_sessions: 100_000
  ]

  @type verdict :: %{
          cell: :full_progress | :world_changed | :stuck | :full_stagnation,
          stagnation_streak: non_neg_integer(),
          stuck_streak: non_neg_integer(),
          action: :continue | :warn | :block,
          guidance: String.t() | nil
        }

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The topic of `loop_detection` events."
  def topic, do: "gateway:loop_detection"

  @doc "The settings in force (defaults merged with `config :observatory, :step_detection`)."
  def settings,
    do: Keyword.merge(@defaults, Application.get_env(:observatory, :step_detection, []))

  @doc false
  # What a step needs of the settings, `{thresholds, history}`, read on every step;
  # derived again only when the configuration changed (one read and a compare, not a
  # merge, per step).
  def step_settings, do: elem(settings_per_step(), 0)

  @doc false
  # `{thresholds, packed}` for `Observatory.Gateway.StepScore`: the thresholds (for
  # `settle/3`) and the settings packed as the `score_step` NIF takes them (nil when
  # they are not valid thresholds: the NIF then answers `:invalid_step_thresholds`).
  def scoring_settings, do: elem(settings_per_step(), 1)

  @doc false
  # The same for the setting `env` as the caller read it (`StepScore`).
  def scoring_settings(env), do: elem(settings_per_step(env), 1)

  defp settings_per_step,
    do: settings_per_step(Application.get_env(:observatory, :step_detection, []))

  defp settings_per_step(env) do
    Observatory.DerivedSetting.get({__MODULE__, :step_settings}, env, fn env ->
      s = Keyword.merge(@defaults, env)
      thresholds = {s[:stagnation_warn], s[:stagnation_block], s[:stuck_warn], s[:stuck_block]}
      settings = {thresholds, s[:history]}
      {settings, {thresholds, Native.step_settings_pack(settings)}}
    end)
  end

  @doc """
  Classifies one step of a session. `approach` and `outcome` are 32-byte digests (as
  `Observatory.Gateway.DecisionLog.parse/1` gives them).
  """
  @spec analyze(String.t(), binary(), binary()) :: {:ok, verdict()} | {:error, atom()}
  def analyze(session_id, approach, outcome) do
    {thresholds, history} = step_settings()

    store()
    |> Native.step_analyze(session_id, approach, outcome, thresholds, history)
    |> settle(session_id, thresholds)
  end

  @doc false
  # What `analyze/3` makes of the NIF's answer (`step_analyze`'s tuple or `{:error,
  # reason}`): the verdict, made durable when it blocks, broadcast unless it is
  # `:continue`. Also for the ingest, which analyses through `StepScore`.
  @spec settle(tuple(), String.t(), tuple()) :: {:ok, verdict()} | {:error, atom()}
  def settle({cell, stagnation, stuck, action, guidance}, session_id, _thresholds) do
    verdict =
      durable(session_id, %{
        cell: cell,
        stagnation_streak: stagnation,
        stuck_streak: stuck,
        action: action,
        guidance: guidance
      })

    if verdict.action != :continue, do: announce(session_id, verdict)
    {:ok, verdict}
  end

  def settle({:error, :invalid_step_thresholds = reason}, _session_id, thresholds) do
    Logger.warning("invalid :step_detection thresholds #{inspect(thresholds)}: #{reason}")
    {:error, reason}
  end

  def settle({:error, reason}, session_id, _thresholds) do
    Logger.warning("step detector failed for session #{inspect(session_id)}: #{inspect(reason)}")
    {:error, reason}
  end

  @doc false
  # The detector's store, or nil when it is not running (for `StepScore`).
  def store_or_nil, do: NativeStores.get(__MODULE__, nil)

  @doc "A session's streaks and block, or nil if it has none."
  @spec state(String.t()) ::
          %{
            stagnation_streak: non_neg_integer(),
            stuck_streak: non_neg_integer(),
            blocked: boolean()
          }
          | nil
  def state(session_id) do
    case {Native.step_state(store(), session_id), block_of(session_id)} do
      {{stagnation, stuck, blocked}, block} ->
        %{stagnation_streak: stagnation, stuck_streak: stuck, blocked: blocked or block != nil}

      {nil, nil} ->
        nil

      {nil, block} ->
        %{
          stagnation_streak: block.stagnation_streak,
          stuck_streak: block.stuck_streak,
          blocked: true
        }
    end
  end

  @doc """
  The block in force for a session — `%{guidance: text, …}` as it fell — or nil. A
  block past `max_sessions`, held in memory only, has no guidance kept.
  """
  @spec block(String.t()) :: map() | nil
  def block(session_id) do
    case block_of(session_id) do
      nil ->
        case Native.step_state(store(), session_id) do
          {_stagnation, _stuck, true} -> %{guidance: nil}
          _ -> nil
        end

      block ->
        block
    end
  end

  @doc "Sessions with a streak or a block (for the dashboard)."
  @spec active(non_neg_integer()) :: [map()]
  def active(limit \\ 500) do
    live =
      for {id, stagnation, stuck, blocked} <- Native.step_list(store(), limit) do
        %{session_id: id, stagnation_streak: stagnation, stuck_streak: stuck, blocked: blocked}
      end

    known = MapSet.new(live, & &1.session_id)

    # Durable blocks of sessions the store no longer holds (swept, or a crash).
    rebuilt =
      for {id, block} <- blocks(limit), not MapSet.member?(known, id) do
        %{
          session_id: id,
          stagnation_streak: block.stagnation_streak,
          stuck_streak: block.stuck_streak,
          blocked: true
        }
      end

    Enum.take(live ++ rebuilt, limit)
  end

  @doc """
  Lifts a block and clears the session's history (an operator action, logged and
  broadcast). In a cluster, `{:error, :no_majority}` on a node cut off from the
  majority (`Observatory.Cluster.with_majority/2`).
  """
  @spec reset(String.t(), keyword()) :: :ok | {:error, :unknown_session | :no_majority}
  def reset(session_id, opts) do
    Observatory.Cluster.with_majority(
      "lifting the step-detector block of session #{inspect(session_id)}",
      fn -> lift(session_id, opts) end
    )
  end

  defp lift(session_id, opts) do
    block = block_of(session_id)
    durable? = block != nil

    if durable? do
      # Run for another node (`Cluster.call_owner/4`), the reset is not applied after
      # that node answered its operator 503.
      Storage.transaction(
        "step detector block",
        fn ->
          :mnesia.delete({@blocks, session_id})
          # A replica that missed this reset must not bring the block back.
          Observatory.Cluster.Tombstones.bury(@blocks, session_id, block.at)
        end,
        deadline: Observatory.Cluster.deadline()
      )
    end

    if Native.step_reset(store(), session_id) or durable? do
      operator = Keyword.get(opts, :operator, "operator")

      Logger.info(
        "step detector reset session=#{inspect(session_id)} operator=#{inspect(operator)}"
      )

      Events.broadcast(topic(), %{
        event_type: "loop_detection",
        kind: "reset",
        session_id: session_id,
        operator: operator
      })

      :ok
    else
      {:error, :unknown_session}
    end
  end

  defp announce(session_id, verdict) do
    Events.broadcast(
      topic(),
      Map.merge(verdict, %{
        event_type: "loop_detection",
        kind: Atom.to_string(verdict.action),
        session_id: session_id
      })
    )
  end

  # A block falls once, durably; after that the table, not the store, says blocked.
  defp durable(session_id, %{action: :block} = verdict) do
    if block_of(session_id) == nil, do: keep_block(session_id, verdict)
    verdict
  end

  defp durable(session_id, verdict) do
    case block_of(session_id) do
      nil -> verdict
      block -> %{verdict | action: :block, guidance: block.guidance}
    end
  end

  defp keep_block(session_id, verdict) do
    if :mnesia.table_info(@blocks, :size) < settings()[:max_sessions] do
      block = Map.put(verdict, :at, DateTime.utc_now())

      Storage.transaction("step detector block", fn ->
        :mnesia.write({@blocks, session_id, block})
      end)
    else
      Logger.warning(
        "step detector: #{settings()[:max_sessions]} durable blocks kept already; " <>
          "the block of session #{inspect(session_id)} holds in memory only"
      )
    end
  end

  defp block_of(session_id) do
    case Storage.read(@blocks, session_id) do
      [{@blocks, _, block}] -> block
      [] -> nil
    end
  end

  defp blocks(limit) do
    spec = [{{@blocks, :"$1", :"$2"}, [], [{{:"$1", :"$2"}}]}]

    case :mnesia.async_dirty(fn -> :mnesia.select(@blocks, spec, max(limit, 1), :read) end) do
      {found, _continuation} -> found
      :"$end_of_table" -> []
    end
  end

  @doc false
  # The durable tables (cleared by Observatory.Testing.reset!/0).
  def tables, do: [@blocks]

  @doc false
  # Called by Observatory.Storage before this process starts; returns the tables.
  def create_tables do
    Observatory.Storage.create_table(@blocks, attributes: [:session_id, :block], type: :set)
    [@blocks]
  end

  defp store, do: NativeStores.get(__MODULE__)

  @impl true
  def init(_opts) do
    max = settings()[:max_sessions]
    shards = max |> div(1024) |> max(1) |> min(64)
    store = Native.step_store_new(shards, max)
    NativeStores.put(__MODULE__, store)
    Observatory.Gateway.StepScore.publish(:step, store)
    IdleSweep.schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_info(:sweep, state) do
    ttl = IdleSweep.ttl_ms()
    Native.step_sweep(store(), System.monotonic_time(:millisecond), ttl)
    IdleSweep.schedule()
    {:noreply, state}
  end
end
