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

  Thresholds and history are read on every step; `max_sessions` when the detector
  starts. Sessions idle for `:entropy_session_ttl_ms` are forgotten.
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{Events, IdleSweep}
  alias Observatory.Native

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

  @doc """
  Classifies one step of a session. `approach` and `outcome` are 32-byte digests (as
  `Observatory.Gateway.DecisionLog.parse/1` gives them).
  """
  @spec analyze(String.t(), binary(), binary()) :: {:ok, verdict()} | {:error, atom()}
  def analyze(session_id, approach, outcome) do
    s = settings()
    thresholds = {s[:stagnation_warn], s[:stagnation_block], s[:stuck_warn], s[:stuck_block]}

    case Native.step_analyze(store(), session_id, approach, outcome, thresholds, s[:history]) do
      {cell, stagnation, stuck, action, guidance} ->
        verdict = %{
          cell: cell,
          stagnation_streak: stagnation,
          stuck_streak: stuck,
          action: action,
          guidance: guidance
        }

        if action != :continue, do: announce(session_id, verdict)
        {:ok, verdict}

      {:error, reason} ->
        Logger.warning("invalid :step_detection thresholds #{inspect(thresholds)}: #{reason}")
        {:error, reason}
    end
  end

  @doc "A session's streaks and block, or nil if it has none."
  @spec state(String.t()) ::
          %{
            stagnation_streak: non_neg_integer(),
            stuck_streak: non_neg_integer(),
            blocked: boolean()
          }
          | nil
  def state(session_id) do
    case Native.step_state(store(), session_id) do
      {stagnation, stuck, blocked} ->
        %{stagnation_streak: stagnation, stuck_streak: stuck, blocked: blocked}

      nil ->
        nil
    end
  end

  @doc "Sessions with a streak or a block (for the dashboard)."
  @spec active(non_neg_integer()) :: [map()]
  def active(limit \\ 500) do
    for {id, stagnation, stuck, blocked} <- Native.step_list(store(), limit) do
      %{session_id: id, stagnation_streak: stagnation, stuck_streak: stuck, blocked: blocked}
    end
  end

  @doc "Lifts a block and clears the session's history (an operator action, logged and broadcast)."
  @spec reset(String.t(), keyword()) :: :ok | {:error, :unknown_session}
  def reset(session_id, opts) do
    if Native.step_reset(store(), session_id) do
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

  defp store, do: :persistent_term.get(__MODULE__)

  @impl true
  def init(_opts) do
    max = settings()[:max_sessions]
    shards = max |> div(1024) |> max(1) |> min(64)
    :persistent_term.put(__MODULE__, Native.step_store_new(shards, max))
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
