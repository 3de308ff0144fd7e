defmodule Observatory.Gateway.SessionLog do
  @moduledoc """
  The most recent accepted DecisionLogs of each session, for inspection.

  Each session keeps its last `:session_log_size` envelopes (default 20) in a ring
  held by a Rust store (`observatory_core::session_log`, a NIF resource this process
  owns): a write is one NIF call in the caller's process that finds the session,
  takes its next message number, copies the envelope into the store and overwrites
  the oldest slot under the lock of the session's shard (64 shards), so concurrent
  writers never lose each other's
  messages and no process is in the write path. The `n`-th message of a session goes
  to slot `n` modulo the ring's size; a ring made smaller frees its slots past the
  end on the session's next message.

  Each envelope is kept with its **step number** — the number the loop verdict gave
  the step (its `evidence` names steps by it), or the log's own count when there was
  no verdict — and the time the gateway received it, so the Inspect panel and
  `GET /api/v1/sessions/:id` list the steps under the numbers the verdict and the
  entropy window use (`steps/1`).

  The ingest stores each step as the JSON text it arrived as, with the gateway's
  entropy score beside it (`put_json/4`): no term is built; the store copies the
  text in (into the buffer of the slot it replaces when that one holds it, else a
  new one with 1/16 to spare, so a full ring of like-sized texts allocates
  nothing), and a reader gets the envelope decoded, the score in `cognition.entropy_score` — what
  `put/3` of the ingest's envelope would have kept, except that the size cap below
  is measured on the text.

  ## Bounds

  Every size here is set by clients, so each is capped:

  | key | default | what |
  |---|---|---|
  | `:session_log_max_sessions` | `100_000` | sessions kept; past it the least recently seen go |
  | `:session_log_max_envelope_bytes` | `16_384` | an envelope larger than this (its JSON text's size; a map's external term size) is kept as a stub: `%{"truncated" => true, "bytes" => n}` (`n` that size) plus its `meta` when small |
  | `:session_log_max_bytes` | `268_435_456` | envelope bytes kept in all; past it the least recently seen sessions go |

  The settings are read on every message from the settings snapshot
  (`Observatory.configure/1` applies a change to the next, `Application.put_env/3`
  within `:settings_refresh_ms`), the sessions cap when a session arrives. A writer that takes the log over a cap asks
  this process to trim, and it drops the least recently seen sessions down to 90 %
  of the cap, so memory stays within about the caps however fast new sessions come.
  Sessions idle for `:entropy_session_ttl_ms` are swept. Both take sessions off the
  front of the store's least-recently-seen order, a bounded number per NIF call, so
  no call holds the store long however many sessions go; what goes is freed.

  The log is for inspection, not safety state: a crash of this process restarts it
  with an empty log.
  """

  use GenServer
  require Logger

  alias Observatory.{Native, NativeStores}
  alias Observatory.Gateway.{DecisionLog, IdleSweep}

  @small_meta_bytes 1_024
  # What one trim or sweep call may drop: each session costs 1 plus the envelopes it
  # held, so a call frees at most ~2,000 envelopes whatever the sessions and the
  # ring's size. The calls run on a dirty scheduler (freeing megabytes may return
  # memory to the OS) and hold the store's locks only while unlinking what they drop.
  @budget 2_048

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  Stores an accepted envelope. `number` is the step's number in the session (the
  loop verdict's `step_number`); nil numbers it by the log's own count.
  """
  @spec put(String.t(), map(), pos_integer() | nil) :: :ok
  def put(session_id, envelope, number \\ nil) when is_map(envelope) do
    {envelope, bytes} = bounded(envelope)
    put_term(session_id, envelope, bytes, number)
  end

  @doc """
  Stores an accepted envelope as its JSON text, as `put/3` stores its term: the text
  is kept as it is (no term is built) and decoded when a reader asks for it, with `score` — the gateway's entropy score, nil to keep the agent's — as
  its `cognition.entropy_score`. Readers get what `put/3` of the decoded envelope
  would give them, but a text over `:session_log_max_envelope_bytes` is a stub whose
  `"bytes"` is the text's size, whatever the size of its term. `json` must be a
  valid DecisionLog's text. `received_ms` is when the step arrived, on the VM's
  monotonic clock in ms, if the caller read it already (nil: the put reads the clock);
  the step's `at` is that time.
  """
  @spec put_json(String.t(), binary(), number() | nil, pos_integer() | nil, integer() | nil) ::
          :ok
  def put_json(session_id, json, score, number \\ nil, received_ms \\ nil)
      when is_binary(json) do
    bytes = byte_size(json)

    {max_envelope_bytes, caps} = put_settings()

    if bytes <= max_envelope_bytes do
      Native.session_log_put_json(store(), session_id, json, score, number, caps, received_ms)
      |> handle_put()
    else
      # Over the cap by its text: the stub, whatever size its term would be.
      {stub, stub_bytes} = stub(DecisionLog.decode(json, nil), bytes)
      put_term(session_id, stub, stub_bytes, number)
    end
  end

  # An envelope kept as a term, in the external format (decoded by readers).
  defp put_term(session_id, envelope, bytes, number) do
    store()
    |> Native.session_log_put_term(
      session_id,
      :erlang.term_to_binary(envelope),
      bytes,
      number,
      caps()
    )
    |> handle_put()
  end

  # The ring's size and the byte cap, read on every message (a changed setting
  # applies to the next); the sessions cap only when a session arrives.
  defp caps, do: elem(put_settings(), 1)

  # `{max_envelope_bytes, {size, max_bytes}}`, read as one setting.
  defp put_settings, do: Observatory.IngestSettings.get(:session_log_put)

  defp handle_put(:ok), do: :ok
  defp handle_put(:over_bytes), do: request_trim()

  defp handle_put({:new_session, sessions}),
    do: if(sessions > max_sessions(), do: request_trim(), else: :ok)

  defp request_trim do
    case Process.whereis(__MODULE__) do
      nil -> :ok
      pid -> send(pid, :trim)
    end

    :ok
  end

  @doc "The session's stored envelopes, oldest first."
  @spec recent(String.t()) :: [map()]
  def recent(session_id), do: Enum.map(steps(session_id), & &1.envelope)

  @doc """
  The session's stored steps, oldest first: `%{number, at, envelope}`, `number` the
  step's number in the session and `at` when the gateway received it (Unix ms).
  """
  @spec steps(String.t()) :: [
          %{number: pos_integer(), at: integer(), envelope: map()}
        ]
  def steps(session_id) do
    for step <- Native.session_log_steps(store(), session_id, size()), do: step(step)
  end

  defp step({number, at, kind, data, score}),
    do: %{number: number, at: at, envelope: envelope(kind, data, score)}

  # A stored text is decoded when read (put_json/4); a term from its external format.
  defp envelope(:json, json, score), do: DecisionLog.decode(json, score)
  defp envelope(:term, etf, nil), do: :erlang.binary_to_term(etf)

  @doc "The stored step numbered `number`, or nil (not stored, or no longer)."
  @spec step(String.t(), pos_integer()) ::
          %{number: pos_integer(), at: integer(), envelope: map()} | nil
  def step(session_id, number) do
    # The oldest kept step with that number, as steps/1 would find it; only its
    # envelope is decoded.
    case Native.session_log_step(store(), session_id, number, size()) do
      nil -> nil
      step -> step(step)
    end
  end

  @doc "When the gateway last received a step of the session (Unix ms), or nil."
  @spec last_at(String.t()) :: integer() | nil
  def last_at(session_id) do
    case Native.session_log_head(store(), session_id) do
      {_, at} -> at
      nil -> nil
    end
  end

  @doc "How many messages the session has sent since it was first seen."
  @spec count(String.t()) :: non_neg_integer()
  def count(session_id) do
    case Native.session_log_head(store(), session_id) do
      {seq, _} -> seq
      nil -> 0
    end
  end

  @doc "Sessions held and envelope bytes kept."
  @spec stats() :: %{sessions: non_neg_integer(), bytes: non_neg_integer()}
  def stats do
    {sessions, bytes} = Native.session_log_stats(store())
    %{sessions: sessions, bytes: bytes}
  end

  # An envelope over the byte cap is kept as a stub that says so.
  defp bounded(envelope) do
    bytes = :erlang.external_size(envelope)

    if bytes <= max_envelope_bytes(),
      do: {envelope, bytes},
      else: stub(envelope, bytes)
  end

  # The stub of an envelope of `bytes` bytes, and its own size.
  defp stub(envelope, bytes) do
    meta = Map.get(envelope, "meta")
    stub = %{"truncated" => true, "bytes" => bytes}

    stub =
      if :erlang.external_size(meta) <= @small_meta_bytes,
        do: Map.put(stub, "meta", meta),
        else: stub

    {stub, :erlang.external_size(stub)}
  end

  @doc "How many envelopes each session keeps (`:session_log_size`, as the log applies it)."
  @spec size() :: pos_integer()
  # From the settings snapshot (Observatory.IngestSettings), read on every message.
  def size, do: Observatory.IngestSettings.get(:session_log_size)

  defp max_sessions, do: Observatory.IngestSettings.get(:session_log_max_sessions)

  defp max_envelope_bytes, do: Observatory.IngestSettings.get(:session_log_max_envelope_bytes)

  defp max_bytes, do: Observatory.IngestSettings.get(:session_log_max_bytes)

  defp store, do: NativeStores.get_cached(__MODULE__)

  @impl true
  def init(_opts) do
    # A restart starts an empty log, as the process's own tables did: the log is for
    # inspection, not safety state. Callers keep writing to the old store until this
    # one is published; the old one is freed when the last of them lets go.
    NativeStores.put(__MODULE__, Native.session_log_new())
    IdleSweep.schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_info(:sweep, state) do
    cutoff = System.system_time(:millisecond) - IdleSweep.ttl_ms()
    in_chunks(fn -> Native.session_log_sweep(store(), cutoff, @budget) end)
    IdleSweep.schedule()
    {:noreply, state}
  end

  def handle_info(:trim, state) do
    drain(:trim)
    %{sessions: sessions, bytes: bytes} = stats()

    if sessions > max_sessions() or bytes > max_bytes() do
      trim(sessions, bytes)
    end

    {:noreply, state}
  end

  # Least recently seen first, until both are at 90 % of their caps.
  defp trim(sessions, bytes) do
    keep_sessions = div(max_sessions() * 9, 10)
    keep_bytes = div(max_bytes() * 9, 10)

    dropped =
      in_chunks(fn -> Native.session_log_trim(store(), keep_sessions, keep_bytes, @budget) end)

    Logger.warning(
      "session log over its caps (#{sessions} sessions, #{bytes} bytes): " <>
        "dropped the #{dropped} least recently seen sessions"
    )
  end

  # Calls `drop` (a trim or a sweep within @budget) until it is done;
  # the sessions dropped in all.
  defp in_chunks(drop, dropped \\ 0) do
    case drop.() do
      {n, true} -> dropped + n
      {n, false} -> in_chunks(drop, dropped + n)
    end
  end

  defp drain(message) do
    receive do
      ^message -> drain(message)
    after
      0 -> :ok
    end
  end
end
