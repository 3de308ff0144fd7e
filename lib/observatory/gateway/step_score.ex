defmodule Observatory.Gateway.StepScore do
  @moduledoc false
  # The scoring of one ingested step in one NIF call: the entropy window
  # (EntropyTracker), the loop verdict (LoopVerdict) and the step detector
  # (StepDetector). Called apart, each paid a NIF entry, an argument decoding and a
  # result term of its own, and Elixir glue around them (~2.4 µs each, most of it not
  # their arithmetic); together a step pays once.
  #
  # The stores stay where they are, one per owner process: each starts, sweeps,
  # forgets and restarts on its own, and the dashboard reads each alone. The call is
  # made by EntropyTracker.score_step/4, so the tracker's store never leaves it (FR-9.1). The answers
  # are the NIF's raw answers, as `Native.entropy_record/9`, `Native.verdict_observe/5`
  # and `Native.step_analyze/6` give them; the caller settles each with its module's
  # `settle` (alerts, broadcasts, the durable block), in the order the ingest acts.
  #
  # The verdict's and the step detector's settings are read on every step, as their
  # modules read them, and handed over packed in a binary (`LoopVerdict.packed_config/0`,
  # `StepDetector.scoring_settings/0`, packed again only when the configuration
  # changes): one argument for the NIF to read where their nested tuples were some
  # thirty.

  alias Observatory.Gateway.{ActionStatus, EntropyTracker, LoopVerdict, StepDetector}
  require Logger

  @typedoc "Each part as its own NIF answers, or `{:error, reason}`; `step` nil: not analysed."
  @type raw :: {entropy :: tuple(), verdict :: tuple(), step :: tuple() | nil}

  @doc """
  Scores `fields` (a parsed step, `DecisionLog.parse/1`) in `tracker`'s window, the
  loop verdict and the step detector. `entropy_config` is FR-9.11's three settings as
  read for this step; `alerts?` whether the tracker raises alerts itself (the
  `:entropy` alert source).

  Returns `{entropy, verdict, step, step_thresholds}`: the parts for
  `EntropyTracker.settle/4`, `LoopVerdict.settle/4` and `StepDetector.settle/3`.
  """
  @spec score(map(), atom(), {pos_integer(), float(), float()}, boolean()) ::
          {tuple(), tuple(), tuple() | nil, tuple()}
  def score(fields, tracker, entropy_config, alerts?) do
    {thresholds, step_settings} = StepDetector.scoring_settings()
    step = if fields.outcome, do: {fields.approach, fields.outcome}

    # A status outside ActionStatus's (the parse never gives one) is not recorded:
    # no tracker for the call, and the tracker's error in its place.
    {tracker, code, entropy_error} =
      case ActionStatus.to_code(fields.status) do
        {:ok, code} -> {tracker, code, nil}
        {:error, reason} -> {nil, 0, {:error, reason}}
      end

    entropy = {fields.intent, fields.tool_call, code, fields.agent_id, entropy_config, alerts?}

    others =
      {LoopVerdict.store_or_nil(), StepDetector.store_or_nil(), fields.verdict_keys,
       LoopVerdict.packed_config(), step, step_settings}

    {e, v, s} =
      try do
        EntropyTracker.score_step(tracker, fields.session_id, entropy, others)
      rescue
        e in [ArgumentError, ErlangError] ->
          Logger.error("StepScore NIF score_step failed: #{Exception.message(e)}")
          error = {:error, :internal_error}
          {error, error, step && error}
      end

    {entropy_error || e, v, s, thresholds}
  end
end
