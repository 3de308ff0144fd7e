defmodule Observatory.Gateway.StepScore do
  @moduledoc false
  # The scoring of one ingested step in one NIF call: the entropy window
  # (EntropyTracker), the loop verdict (LoopVerdict) and the step detector
  # (StepDetector). Called apart, each paid a NIF entry, an argument decoding and a
  # result term of its own, and Elixir glue around them (~2.4 µs each, most of it not
  # their arithmetic); together a step pays once.
  #
  # The stores stay where they are, one per owner process: each starts, sweeps,
  # forgets and restarts on its own, and the dashboard reads each alone. Each owner
  # also publishes its store as one part of a row of NativeStores (`publish/2`), so
  # that the call finds the three with one lookup. The call is made by
  # EntropyTracker.score_step/4, so the tracker's store never leaves it (FR-9.1). The
  # answers are the NIF's raw answers, as `Native.entropy_record/9`,
  # `Native.verdict_observe/5` and `Native.step_analyze/6` give them; the caller settles
  # each with its module's `settle` (alerts, broadcasts, the durable block), in the
  # order the ingest acts.
  #
  # The five settings a step needs: FR-9.11's three entropy settings, read from the
  # application environment on every step (`Application.put_env/3` applies to the
  # next one), and the verdict's and the step detector's, packed in binaries as the
  # NIF reads them, from the settings snapshot (Observatory.IngestSettings).

  alias Observatory.Gateway.{ActionStatus, EntropyConfig, EntropyTracker}
  require Logger

  @parts [entropy: 1, verdict: 2, step: 3]

  @typedoc "Each part as its own NIF answers, or `{:error, reason}`; `step` nil: not analysed."
  @type raw :: {entropy :: tuple(), verdict :: tuple(), step :: tuple() | nil}

  @doc """
  Scores `fields` (a parsed step, `DecisionLog.parse/1`) in `tracker`'s window, the
  loop verdict and the step detector, with the settings read now; `alerts?` whether
  the tracker raises alerts itself (the `:entropy` alert source).

  Returns `{entropy, verdict, step, step_thresholds}`: the parts for
  `EntropyTracker.settle/4`, `LoopVerdict.settle/4` and `StepDetector.settle/3`.
  """
  @spec score(map(), atom(), boolean()) :: {tuple(), tuple(), tuple() | nil, tuple()}
  def score(fields, tracker, alerts?) do
    {entropy_config, verdict_config, step_settings} = settings()
    score(fields, tracker, alerts?, entropy_config, verdict_config, step_settings)
  end

  @doc """
  The same with FR-9.11's three settings as the caller read them for this step
  (`EntropyConfig.read/0`); the verdict's and the step detector's are read now.
  """
  @spec score(map(), atom(), {pos_integer(), float(), float()}, boolean()) ::
          {tuple(), tuple(), tuple() | nil, tuple()}
  def score(fields, tracker, entropy_config, alerts?) do
    {_, verdict_config, step_settings} = settings()
    score(fields, tracker, alerts?, entropy_config, verdict_config, step_settings)
  end

  # The step's fields taken in one match (one pass over the map, where each
  # `fields.key` was a lookup of its own).
  defp score(fields, tracker, alerts?, entropy_config, verdict_config, step_settings) do
    %{
      session_id: session_id,
      agent_id: agent_id,
      intent: intent,
      tool_call: tool_call,
      status: status,
      verdict_keys: keys,
      approach: approach,
      outcome: outcome
    } = fields

    {thresholds, packed_step_settings} = step_settings
    step = if outcome, do: {approach, outcome}

    # A status outside ActionStatus's (the parse never gives one) is not recorded:
    # no tracker for the call, and the tracker's error in its place.
    {tracker, code, entropy_error} =
      case ActionStatus.to_code(status) do
        {:ok, code} -> {tracker, code, nil}
        {:error, reason} -> {nil, 0, {:error, reason}}
      end

    entropy = {intent, tool_call, code, agent_id, entropy_config, alerts?}
    others = {keys, verdict_config, step, packed_step_settings}

    {e, v, s} =
      try do
        EntropyTracker.score_step(tracker, session_id, entropy, others)
      rescue
        e in [ArgumentError, ErlangError] ->
          Logger.error("StepScore NIF score_step failed: #{Exception.message(e)}")
          error = {:error, :internal_error}
          {error, error, step && error}
      end

    {entropy_error || e, v, s, thresholds}
  end

  @doc false
  # `{entropy_config, packed_verdict_config, {step_thresholds, packed_step_settings}}`:
  # FR-9.11's three settings read from the application environment on every call
  # and checked, the verdict's and the step detector's taken from the settings
  # snapshot, packed there once per change (Observatory.IngestSettings).
  def settings do
    {verdict, step} = Observatory.IngestSettings.get(:step_score)

    {EntropyConfig.validate(
       :application.get_env(:observatory, :entropy_window_size, 5),
       :application.get_env(:observatory, :entropy_loop_threshold, 0.25),
       :application.get_env(:observatory, :entropy_warning_threshold, 0.50)
     ), verdict, step}
  end

  @doc false
  # Publishes one of the three stores the call uses (`:entropy`, the default tracker's;
  # `:verdict`; `:step`) as its part of the row `EntropyTracker.score_step/4` reads
  # with one lookup; called by each store's owner when it makes its store (and with
  # nil when the tracker stops).
  def publish(part, store),
    do: Observatory.NativeStores.put_part(__MODULE__, 3, Keyword.fetch!(@parts, part), store)
end
