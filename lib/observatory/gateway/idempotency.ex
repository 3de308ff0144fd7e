defmodule Observatory.Gateway.Idempotency do
  @moduledoc """
  The steps the gateway has answered recently, so that a step delivered again — a
  client's retry after a timeout, an NDJSON batch re-sent whole, a conversation the
  LLM proxy sees twice, a retry after a cluster owner's `503` — is answered with its
  first answer and never counted twice.

  A step is identified by its session and `meta.step_id`. `claim/1` is the one check,
  made on the session's owner before anything is scored:

    * `{:new, ticket}` — not seen (or no longer remembered): score it, then
      `complete/2` the ticket with the answer (or `release/1` it if scoring failed);
    * `{:replay, answer}` — seen with the same body: answer this, record nothing;
    * `{:error, {:conflict, violation}}` — seen with a different body: refuse it;
    * `{:error, {:in_progress, violation}}` — its first delivery is still being
      scored: retry shortly. (A first delivery whose process died is taken over.)

  A claim is atomic: of identical deliveries racing, one is scored.

  ## The same body

  Two deliveries are the same step when their envelopes are the same JSON value —
  key order and whitespace do not count — apart from the two fields that say nothing
  about the step itself: `cognition.entropy_score`, which the gateway overwrites, and
  `meta.timestamp`, which a client may stamp again when it retries (the proxy does).
  The parse computes that identity with the step's other hashes, in Rust: the
  `fingerprint` of `Observatory.Gateway.DecisionLog.parse/1`.

  ## Bounds

  Every step a client sends is remembered, so memory is capped
  (`config :observatory, :idempotency`, read on every step from the settings snapshot:
  `Observatory.configure/1` applies a change to the next step, `Application.put_env/3`
  within `:settings_refresh_ms`):

  | key | default | what |
  |---|---|---|
  | `:window_ms` | 10 minutes | a step older than this is forgotten: delivered again, it is a new step |
  | `:max_steps_per_session` | `1_000` | steps remembered per session; past it the session's oldest go |
  | `:max_steps_per_agent` | `10_000` | steps remembered per agent; past it the agent's own oldest go, so no agent can flush another's |
  | `:max_steps` | `100_000` | steps remembered in all; past it the oldest go, whatever their session |
  | `:enabled` | `true` | `false`: every delivery is a new step, nothing is remembered |

  The store is Rust (`observatory_core::answered_steps`), every check O(1) under one
  short lock: a hash lookup, and evictions from the heads of linked lists (every
  step's age order, its session's, its agent's). Steps past a cap go at once; steps
  that left the window are never answered from memory and are freed at the idle
  sweep (`:entropy_sweep_interval_ms`). `stats/0` and `count/1` count what is held. The memory lives on the node that scores the session's steps: when a
  cluster moves a session to a new owner, its remembered steps stay behind, as its
  window does.
  """

  use GenServer

  alias Observatory.Gateway.{DecisionLog, IdleSweep}
  alias Observatory.{Metrics, Native, NativeStores}

  @defaults [
    enabled: true,
    window_ms: :timer.minutes(10),
    max_steps_per_session: 1_000,
    max_steps_per_agent: 10_000,
    max_steps: 100_000
  ]

  # An answer up to this size is encoded inside the complete NIF (a few µs at most).
  @encoded_in_nif_max_bytes 16_384

  @typedoc "What `claim/1` hands the first delivery, for `complete/2` or `release/1`."
  # The store travels with the claim, and the step's place in it: `complete/2` does
  # not look either up again.
  @opaque ticket :: {reference(), non_neg_integer(), non_neg_integer()} | nil

  @typedoc "Why a delivery is not scored: its step's violation, path `meta.step_id`."
  @type refusal :: {:conflict | :in_progress, %{path: String.t(), reason: String.t()}}

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  The settings in force: each configured value that is valid, else its default
  (`#{inspect(@defaults)}`).
  """
  @spec settings() :: keyword()
  def settings do
    env = env()
    for {key, _default} <- @defaults, do: {key, setting(env, key)}
  end

  defp env do
    case Observatory.IngestSettings.get(:idempotency) do
      env when is_list(env) -> env
      _other -> []
    end
  end

  defp setting(env, key) do
    case :lists.keyfind(key, 1, env) do
      {^key, value} -> if valid_setting?(key, value), do: value, else: default(key)
      _absent_or_not_a_pair -> default(key)
    end
  end

  defp default(key), do: Keyword.fetch!(@defaults, key)

  @doc false
  # Whether `value` is one `key` of the setting takes: `:enabled` a boolean, each
  # limit a positive integer (also what `Observatory.configure/1` checks).
  def valid_setting?(:enabled, value), do: is_boolean(value)
  def valid_setting?(_limit, value), do: is_integer(value) and value > 0

  @doc """
  Claims a step for scoring, or says why it is not scored again (see the module doc).
  `step` is a parsed step's fields (`Observatory.Gateway.DecisionLog.parse/1`), or any
  map with its `:session_id`, `:step_id`, `:agent_id` and `:fingerprint` (16 bytes).
  `now_ms` is when it arrived, on the VM's monotonic clock in ms, if the caller read
  it already (nil: the claim reads the clock).
  """
  @spec claim(DecisionLog.fields() | map(), integer() | nil) ::
          {:new, ticket()} | {:replay, term()} | {:error, refusal()}
  def claim(%{fingerprint: fingerprint} = step, now_ms \\ nil)
      when byte_size(fingerprint) == 16 do
    case limits() do
      nil -> {:new, nil}
      limits -> claim(step, fingerprint, limits, now_ms)
    end
  end

  # `{window_ms, max_steps_per_session, max_steps_per_agent, max_steps}`, or nil when
  # the check is off: worked out once per change of the setting, kept with the
  # settings snapshot (Observatory.IngestSettings).
  defp limits, do: Observatory.IngestSettings.get(:idempotency_limits)

  @doc false
  def limits(env) do
    if setting(env, :enabled),
      do:
        {setting(env, :window_ms), setting(env, :max_steps_per_session),
         setting(env, :max_steps_per_agent), setting(env, :max_steps)}
  end

  # The claim's time is the VM's monotonic clock in ms (read in the NIF when not
  # given), as the sweep's.
  defp claim(step, fingerprint, limits, now_ms) do
    %{session_id: session_id, step_id: step_id, agent_id: agent_id} = step
    store = store()
    ids = {session_id, step_id, agent_id}

    case Native.answered_claim(store, ids, fingerprint, limits, now_ms) do
      {:new, slot, seq} ->
        {:new, {store, slot, seq}}

      {:replay, answer} ->
        Metrics.inc(:step_replays)
        {:replay, :erlang.binary_to_term(answer)}

      :conflict ->
        Metrics.inc(:step_conflicts)
        refuse(:conflict, session_id, step_id)

      :in_progress ->
        refuse(:in_progress, session_id, step_id)
    end
  end

  defp refuse(:conflict, session_id, step_id) do
    {:error,
     {:conflict,
      %{
        path: "meta.step_id",
        reason:
          "#{inspect(step_id)} of session #{inspect(session_id)} was already recorded " <>
            "with a different body; a new step needs a new step_id"
      }}}
  end

  defp refuse(:in_progress, session_id, step_id) do
    {:error,
     {:in_progress,
      %{
        path: "meta.step_id",
        reason:
          "#{inspect(step_id)} of session #{inspect(session_id)} is still being scored " <>
            "(an earlier delivery); retry it"
      }}}
  end

  @doc """
  Stores the first delivery's answer: the one every retry of the step gets. Any term;
  the ingest's (a small tuple of score, severity and verdicts) is encoded in the
  store's NIF call, a larger one by `:erlang.term_to_binary/1` first, which yields, so
  no NIF call encodes a large term.
  """
  @spec complete(ticket(), term()) :: :ok
  def complete(nil, _answer), do: :ok

  def complete({store, slot, seq}, answer) do
    if :erlang.external_size(answer) <= @encoded_in_nif_max_bytes,
      do: Native.answered_complete(store, slot, seq, answer),
      else: Native.answered_complete_encoded(store, slot, seq, :erlang.term_to_binary(answer))

    :ok
  end

  @doc """
  As `complete/2`, for an answer its caller has bounded: its external term format is
  at most `encoded_in_nif_max_bytes/0` bytes, so it is not measured first (a walk of
  the whole term, ~60-70 ns for the ingest's). The ingest's kept answer is bounded by
  its shape (`Observatory.Gateway.SchemaInterceptor`).
  """
  @spec complete_bounded(ticket(), term()) :: :ok
  def complete_bounded(nil, _answer), do: :ok

  def complete_bounded({store, slot, seq}, answer) do
    Native.answered_complete(store, slot, seq, answer)
    :ok
  end

  @doc "The largest answer (external term format, bytes) the complete NIF encodes itself."
  @spec encoded_in_nif_max_bytes() :: pos_integer()
  def encoded_in_nif_max_bytes, do: @encoded_in_nif_max_bytes

  @doc "Forgets a claim whose step was not scored: a retry of it is a new step."
  @spec release(ticket()) :: :ok
  def release(nil), do: :ok

  def release({store, slot, seq}) do
    Native.answered_release(store, slot, seq)
    :ok
  end

  @doc "How many steps of a session (`{:session, id}`) or an agent (`{:agent, id}`) are remembered."
  @spec count({:session | :agent, String.t()}) :: non_neg_integer()
  def count({:session, session_id}), do: Native.answered_session_len(store(), session_id)
  def count({:agent, agent_id}), do: Native.answered_agent_len(store(), agent_id)

  @doc """
  What is held: steps, the sessions and agents they belong to, and bytes (the store's
  capacity plus the ids and answers it holds).
  """
  @spec stats() :: %{
          steps: non_neg_integer(),
          sessions: non_neg_integer(),
          agents: non_neg_integer(),
          bytes: non_neg_integer()
        }
  def stats do
    {steps, sessions, agents, bytes} = Native.answered_stats(store())
    %{steps: steps, sessions: sessions, agents: agents, bytes: bytes}
  end

  @doc false
  # Forgets the steps older than `window_ms` now; the sweep's work, and tests'.
  def sweep(window_ms \\ setting(env(), :window_ms)),
    do: Native.answered_sweep(store(), System.monotonic_time(:millisecond), window_ms)

  defp store, do: NativeStores.get_cached(__MODULE__)

  ## The process: owns the store, forgets steps that left the window

  @impl true
  def init(_opts) do
    # A restart keeps the memory: the store is the NIF resource, not this process's.
    if NativeStores.get(__MODULE__, nil) == nil,
      do: NativeStores.put(__MODULE__, Native.answered_new())

    IdleSweep.schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_info(:sweep, state) do
    sweep()
    IdleSweep.schedule()
    {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}
end
