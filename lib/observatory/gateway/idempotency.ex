defmodule Observatory.Gateway.Idempotency do
  @moduledoc """
  The steps the gateway has answered recently, so that a step delivered again — a
  client's retry after a timeout, an NDJSON batch re-sent whole, a conversation the
  LLM proxy sees twice, a retry after a cluster owner's `503` — is answered with its
  first answer and never counted twice.

  A step is identified by its session and `meta.step_id`. `claim/3` is the one check,
  made on the session's owner before anything is scored:

    * `{:new, ticket}` — not seen (or no longer remembered): score it, then
      `complete/2` the ticket with the answer (or `release/1` it if scoring failed);
    * `{:replay, answer}` — seen with the same body: answer this, record nothing;
    * `{:error, {:conflict, violation}}` — seen with a different body: refuse it;
    * `{:error, {:in_progress, violation}}` — the first delivery is still being
      scored: retry shortly.

  The first delivery's claim is atomic (`:ets.insert_new/2`): of identical deliveries
  racing, one is scored.

  ## The same body

  Two deliveries are the same step when their envelopes are the same JSON value —
  key order and whitespace do not count — apart from the two fields that say nothing
  about the step itself: `cognition.entropy_score`, which the gateway overwrites, and
  `meta.timestamp`, which a client may stamp again when it retries (the proxy does).
  `fingerprint/1` is the SHA-256 of that value (its first 16 bytes).

  ## Bounds

  Every step a client sends takes a slot, so memory is capped three ways
  (`config :observatory, :idempotency`, read on every step):

  | key | default | what |
  |---|---|---|
  | `:window_ms` | 10 minutes | a step older than this is forgotten: delivered again, it is a new step |
  | `:max_steps_per_session` | `1_000` | steps remembered per session; past it the session's oldest go |
  | `:max_steps` | `100_000` | steps remembered in all; past it the oldest go, whatever their session |
  | `:enabled` | `true` | `false`: every delivery is a new step, nothing is remembered |

  Forgotten steps are removed at once when a cap is passed, and at the idle sweep
  (`:entropy_sweep_interval_ms`) when they leave the window; an expired step is never
  replayed meanwhile. `stats/0` counts what is held. The memory lives on the node that
  scores the session's steps: when a cluster moves a session to a new owner, its
  remembered steps stay behind, as its window does.
  """

  use GenServer

  alias Observatory.Gateway.IdleSweep
  alias Observatory.Metrics

  # {{session_id, step_id}, fingerprint, seq, at_ms, {:pending, pid} | {:answer, answer}}
  @steps __MODULE__.Steps
  # {{session_id, seq}, step_id}: each session's steps, oldest first
  @by_session __MODULE__.BySession
  # {seq, session_id, step_id, at_ms}: every step, oldest first
  @by_age __MODULE__.ByAge
  # {session_id, steps remembered}
  @counts __MODULE__.Counts

  @defaults [
    enabled: true,
    window_ms: :timer.minutes(10),
    max_steps_per_session: 1_000,
    max_steps: 100_000
  ]

  @typedoc "What `claim/3` hands the first delivery, for `complete/2` or `release/1`."
  @opaque ticket :: {{String.t(), String.t()}, pos_integer()} | nil

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The settings in force: `#{inspect(@defaults)}` merged with the configured ones."
  @spec settings() :: keyword()
  def settings do
    case Application.get_env(:observatory, :idempotency, []) do
      env when is_list(env) -> Keyword.merge(@defaults, Keyword.filter(env, &valid?/1))
      _other -> @defaults
    end
  end

  defp valid?({:enabled, value}), do: is_boolean(value)

  defp valid?({key, n}) when key in [:window_ms, :max_steps_per_session, :max_steps],
    do: is_integer(n) and n > 0

  defp valid?(_other), do: false

  @doc """
  The body's identity: SHA-256 (16 bytes) of the envelope without
  `cognition.entropy_score` and `meta.timestamp`.
  """
  @spec fingerprint(map()) :: binary()
  def fingerprint(envelope) when is_map(envelope) do
    envelope
    |> drop_in("meta", "timestamp")
    |> drop_in("cognition", "entropy_score")
    |> :erlang.term_to_binary([:deterministic])
    |> then(&:crypto.hash(:sha256, &1))
    |> binary_part(0, 16)
  end

  defp drop_in(envelope, outer, inner) do
    case envelope do
      %{^outer => %{} = map} -> %{envelope | outer => Map.delete(map, inner)}
      _ -> envelope
    end
  end

  @doc """
  Claims a step for scoring, or says why it is not scored again (see the module doc).
  """
  @spec claim(String.t(), String.t(), binary()) ::
          {:new, ticket()}
          | {:replay, term()}
          | {:error, {:conflict | :in_progress, %{path: String.t(), reason: String.t()}}}
  def claim(session_id, step_id, fingerprint) do
    settings = settings()

    outcome =
      if settings[:enabled],
        do: claim(session_id, step_id, fingerprint, settings, 3),
        else: {:new, nil}

    case outcome do
      {:replay, _} -> Metrics.inc(:step_replays)
      :conflict -> Metrics.inc(:step_conflicts)
      _ -> :ok
    end

    refusal(outcome, session_id, step_id)
  rescue
    # The tables are gone while this process restarts: score the step, remember nothing.
    ArgumentError -> {:new, nil}
  end

  defp refusal(:conflict, session_id, step_id),
    do:
      {:error,
       {:conflict,
        %{
          path: "meta.step_id",
          reason:
            "#{inspect(step_id)} of session #{inspect(session_id)} was already recorded " <>
              "with a different body; a new step needs a new step_id"
        }}}

  defp refusal(:in_progress, session_id, step_id),
    do:
      {:error,
       {:in_progress,
        %{
          path: "meta.step_id",
          reason:
            "#{inspect(step_id)} of session #{inspect(session_id)} is still being scored " <>
              "(an earlier delivery); retry it"
        }}}

  defp refusal(outcome, _session_id, _step_id), do: outcome

  defp claim(_session_id, _step_id, _fingerprint, _settings, 0), do: :in_progress

  defp claim(session_id, step_id, fingerprint, settings, tries) do
    key = {session_id, step_id}
    seq = :erlang.unique_integer([:monotonic, :positive])
    now = System.monotonic_time(:millisecond)

    if :ets.insert_new(@steps, {key, fingerprint, seq, now, {:pending, self()}}) do
      index(session_id, step_id, seq, now, settings)
      {:new, {key, seq}}
    else
      case :ets.lookup(@steps, key) do
        [{_, held, held_seq, at, state}] ->
          cond do
            at < now - settings[:window_ms] or abandoned?(state) ->
              forget(session_id, step_id, held_seq)
              claim(session_id, step_id, fingerprint, settings, tries - 1)

            held != fingerprint ->
              :conflict

            match?({:answer, _}, state) ->
              {:replay, elem(state, 1)}

            true ->
              :in_progress
          end

        [] ->
          claim(session_id, step_id, fingerprint, settings, tries - 1)
      end
    end
  end

  # A first delivery whose process died before it answered will never answer.
  defp abandoned?({:pending, pid}), do: node(pid) == node() and not Process.alive?(pid)
  defp abandoned?(_answered), do: false

  @doc "Stores the first delivery's answer: the one every retry of the step gets."
  @spec complete(ticket(), term()) :: :ok
  def complete(nil, _answer), do: :ok

  def complete({key, seq}, answer) do
    # Still this delivery's claim (not forgotten under a cap meanwhile).
    with [{_, _, ^seq, _, _}] <- :ets.lookup(@steps, key),
         do: :ets.update_element(@steps, key, {5, {:answer, answer}})

    :ok
  rescue
    ArgumentError -> :ok
  end

  @doc "Forgets a claim whose step was not scored: a retry of it is a new step."
  @spec release(ticket()) :: :ok
  def release(nil), do: :ok

  def release({{session_id, step_id}, seq}) do
    forget(session_id, step_id, seq)
  rescue
    ArgumentError -> :ok
  end

  @doc "What is held: steps, sessions, and the tables' memory in bytes."
  @spec stats() :: %{
          steps: non_neg_integer(),
          sessions: non_neg_integer(),
          bytes: non_neg_integer()
        }
  def stats do
    words = Enum.sum(for t <- [@steps, @by_session, @by_age, @counts], do: :ets.info(t, :memory))

    %{
      steps: :ets.info(@steps, :size),
      sessions: :ets.info(@counts, :size),
      bytes: words * :erlang.system_info(:wordsize)
    }
  end

  ## Bounds

  defp index(session_id, step_id, seq, now, settings) do
    :ets.insert(@by_age, {seq, session_id, step_id, now})
    total = :atomics.add_get(total(), 1, 1)
    :ets.insert(@by_session, {{session_id, seq}, step_id})
    count = :ets.update_counter(@counts, session_id, {2, 1}, {session_id, 0})

    if count > settings[:max_steps_per_session], do: forget_oldest_of(session_id)
    if total > settings[:max_steps], do: forget_oldest(total - settings[:max_steps])
    :ok
  end

  defp forget_oldest_of(session_id) do
    with {^session_id, seq} = key <- :ets.next(@by_session, {session_id, 0}),
         [{_, step_id}] <- :ets.lookup(@by_session, key),
         do: forget(session_id, step_id, seq)
  end

  defp forget_oldest(0), do: :ok

  defp forget_oldest(n) do
    with seq when is_integer(seq) <- :ets.first(@by_age),
         [{_, session_id, step_id, _}] <- :ets.lookup(@by_age, seq) do
      forget(session_id, step_id, seq)
      forget_oldest(n - 1)
    end
  end

  # Idempotent, and safe against a racing forget: each row is taken by one process,
  # which alone adjusts the count that row stands for.
  defp forget(session_id, step_id, seq) do
    if :ets.take(@by_age, seq) != [], do: :atomics.sub(total(), 1, 1)
    if :ets.take(@by_session, {session_id, seq}) != [], do: uncount(session_id)
    :ets.select_delete(@steps, [{{{session_id, step_id}, :_, seq, :_, :_}, [], [true]}])
    :ok
  end

  defp uncount(session_id) do
    if :ets.update_counter(@counts, session_id, {2, -1}) <= 0,
      do: :ets.select_delete(@counts, [{{session_id, :"$1"}, [{:"=<", :"$1", 0}], [true]}])
  end

  defp total, do: :persistent_term.get(__MODULE__)

  ## The process: owns the tables, forgets steps that left the window

  @impl true
  def init(_opts) do
    for {name, type} <- [
          {@steps, :set},
          {@by_session, :ordered_set},
          {@by_age, :ordered_set},
          {@counts, :set}
        ] do
      :ets.new(name, [
        :named_table,
        :public,
        type,
        write_concurrency: true,
        read_concurrency: true
      ])
    end

    :persistent_term.put(__MODULE__, :atomics.new(1, signed: true))
    IdleSweep.schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_info(:sweep, state) do
    sweep(System.monotonic_time(:millisecond) - settings()[:window_ms])
    IdleSweep.schedule()
    {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  @doc false
  # Forgets every step older than `cutoff` (monotonic ms); the sweep's work, and tests'.
  def sweep(cutoff) do
    with seq when is_integer(seq) <- :ets.first(@by_age),
         [{_, session_id, step_id, at}] when at < cutoff <- :ets.lookup(@by_age, seq) do
      forget(session_id, step_id, seq)
      sweep(cutoff)
    else
      _ -> :ok
    end
  end
end
