defmodule Observatory.Gateway.SessionLog do
  @moduledoc """
  The most recent accepted DecisionLogs of each session, for inspection.

  Each session keeps its last `:session_log_size` envelopes (default 20) in a ring
  of ETS slots: a writer takes the next sequence number with an atomic
  `:ets.update_counter/4` and overwrites the oldest slot, so concurrent writers never
  lose each other's messages and no process is in the write path.

  Each envelope is kept with its **step number** — the number the loop verdict gave
  the step (its `evidence` names steps by it), or the log's own count when there was
  no verdict — and the time the gateway received it, so the Inspect panel and
  `GET /api/v1/sessions/:id` list the steps under the numbers the verdict and the
  entropy window use (`steps/1`).

  The ingest stores each step as the JSON text it arrived as, with the gateway's
  entropy score beside it (`put_json/4`): no term is copied into the table, and a
  reader gets the envelope decoded, the score in `cognition.entropy_score` — what
  `put/3` of the ingest's envelope would have kept, except that the size cap below
  is measured on the text.

  ## Bounds

  Every size here is set by clients, so each is capped:

  | key | default | what |
  |---|---|---|
  | `:session_log_max_sessions` | `100_000` | sessions kept; past it the least recently seen go |
  | `:session_log_max_envelope_bytes` | `16_384` | an envelope larger than this (its JSON text's size; a map's external term size) is kept as a stub: `%{"truncated" => true, "bytes" => n}` (`n` that size) plus its `meta` when small |
  | `:session_log_max_bytes` | `268_435_456` | envelope bytes kept in all; past it the least recently seen sessions go |

  A writer that takes the log over a cap asks this process to trim, and it drops
  the least recently seen sessions down to 90 % of the cap, so memory stays within
  about the caps however fast new sessions come. Sessions idle for
  `:entropy_session_ttl_ms` are swept as before.
  """

  use GenServer
  require Logger

  alias Observatory.Gateway.{DecisionLog, IdleSweep}

  @slots __MODULE__.Slots
  @heads __MODULE__.Heads
  @small_meta_bytes 1_024

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc """
  Stores an accepted envelope. `number` is the step's number in the session (the
  loop verdict's `step_number`); nil numbers it by the log's own count.
  """
  @spec put(String.t(), map(), pos_integer() | nil) :: :ok
  def put(session_id, envelope, number \\ nil) when is_map(envelope) do
    {envelope, bytes} = bounded(envelope)
    store(session_id, envelope, bytes, number)
  end

  @doc """
  Stores an accepted envelope as its JSON text, as `put/3` stores its term: the text
  is kept as it is (a reference-counted binary: no copy of a term into the table) and
  decoded when a reader asks for it, with `score` — the gateway's entropy score, nil
  to keep the agent's — as its `cognition.entropy_score`. Readers get what `put/3`
  of the decoded envelope would give them, but a text over
  `:session_log_max_envelope_bytes` is a stub whose `"bytes"` is the text's size,
  whatever the size of its term. `json` must be a valid DecisionLog's text.
  """
  @spec put_json(String.t(), binary(), number() | nil, pos_integer() | nil) :: :ok
  def put_json(session_id, json, score, number \\ nil) when is_binary(json) do
    bytes = byte_size(json)

    if bytes <= max_envelope_bytes() do
      store(session_id, {:json, own(json), score}, bytes, number)
    else
      # Over the cap by its text: the stub, whatever size its term would be.
      {stub, stub_bytes} = stub(DecisionLog.decode(json, nil), bytes)
      store(session_id, stub, stub_bytes, number)
    end
  end

  # A part of a larger binary (a line of an NDJSON body, a body read with its head)
  # would keep the whole of it alive in the table: that part is copied.
  defp own(json) do
    if :binary.referenced_byte_size(json) > byte_size(json), do: :binary.copy(json), else: json
  end

  defp store(session_id, envelope, bytes, number) do
    size = size()
    now = System.system_time(:millisecond)
    # `order` breaks ties between sessions seen in the same millisecond.
    order = System.unique_integer([:monotonic, :positive])

    # One update: the next sequence number, and the time and order of this write (an
    # increment of 0 past a threshold of -1 sets the value: neither is ever negative).
    [seq, _, _] =
      :ets.update_counter(
        @heads,
        session_id,
        [{2, 1}, {3, 0, -1, now}, {4, 0, -1, order}],
        {session_id, 0, now, order}
      )

    key = {session_id, rem(seq, size)}
    row = {key, seq, envelope, bytes, number || seq, now}

    # The size of the envelope this write replaces, if any. A session's first `size`
    # steps go to slots not yet written: `insert_new` says so without a lookup (whose
    # miss raises: an exception a step cost more than the rest of the write). Past
    # them — or when the slot was written after all, the ring's size having changed —
    # the slot's size is read (only the size: a lookup would copy the old envelope
    # out of the table) before it is overwritten.
    replaced =
      if seq <= size and :ets.insert_new(@slots, row) do
        0
      else
        replaced = slot_bytes(key)
        :ets.insert(@slots, row)
        replaced
      end

    counter = counter()
    :counters.add(counter, 1, bytes - replaced)

    if (seq == 1 and :ets.info(@heads, :size) > max_sessions()) or
         :counters.get(counter, 1) > max_bytes(),
       do: request_trim()

    :ok
  end

  defp slot_bytes(key) do
    :ets.lookup_element(@slots, key, 4)
  rescue
    # Not written (a concurrent writer of the same session is still on its way).
    ArgumentError -> 0
  end

  defp request_trim do
    case Process.whereis(__MODULE__) do
      nil -> :ok
      pid -> send(pid, :trim)
    end
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
    session_id
    |> rows()
    |> Enum.sort_by(fn {_, seq, _, _, _, _} -> seq end)
    |> Enum.map(&step/1)
  end

  defp rows(session_id),
    do: Enum.flat_map(0..(size() - 1), &:ets.lookup(@slots, {session_id, &1}))

  defp step({_, _, envelope, _, number, at}),
    do: %{number: number, at: at, envelope: envelope(envelope)}

  # A stored text is decoded when read (put_json/4).
  defp envelope({:json, json, score}), do: DecisionLog.decode(json, score)

  defp envelope(envelope), do: envelope

  @doc "The stored step numbered `number`, or nil (not stored, or no longer)."
  @spec step(String.t(), pos_integer()) ::
          %{number: pos_integer(), at: integer(), envelope: map()} | nil
  def step(session_id, number) do
    # The oldest kept step with that number, as steps/1 would find it; only its
    # envelope is decoded.
    session_id
    |> rows()
    |> Enum.filter(fn {_, _, _, _, n, _} -> n == number end)
    |> Enum.min_by(fn {_, seq, _, _, _, _} -> seq end, fn -> nil end)
    |> then(&(&1 && step(&1)))
  end

  @doc "When the gateway last received a step of the session (Unix ms), or nil."
  @spec last_at(String.t()) :: integer() | nil
  def last_at(session_id) do
    case :ets.lookup(@heads, session_id) do
      [{_, _, at, _}] -> at
      [] -> nil
    end
  end

  @doc "How many messages the session has sent since it was first seen."
  @spec count(String.t()) :: non_neg_integer()
  def count(session_id) do
    case :ets.lookup(@heads, session_id) do
      [{_, seq, _, _}] -> seq
      [] -> 0
    end
  end

  @doc "Sessions held and envelope bytes kept."
  @spec stats() :: %{sessions: non_neg_integer(), bytes: non_neg_integer()}
  def stats, do: %{sessions: :ets.info(@heads, :size), bytes: :counters.get(counter(), 1)}

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

  defp size, do: Application.get_env(:observatory, :session_log_size, 20)
  defp max_sessions, do: Application.get_env(:observatory, :session_log_max_sessions, 100_000)

  defp max_envelope_bytes,
    do: Application.get_env(:observatory, :session_log_max_envelope_bytes, 16_384)

  defp max_bytes, do: Application.get_env(:observatory, :session_log_max_bytes, 268_435_456)

  defp counter, do: :persistent_term.get(__MODULE__)

  @impl true
  def init(_opts) do
    # Written on every step, read when someone looks: no `read_concurrency` (it makes
    # every write take each scheduler's reader lock), and the number of write locks
    # left to the VM (`:auto`), which one caller pays least for and concurrent callers
    # still spread over (docs/ingest-cost.md, the glue's second round).
    :ets.new(@slots, [:named_table, :public, :set, write_concurrency: :auto])
    # The heads' count is read on a session's first step (the sessions cap): one
    # counter, not one per scheduler summed on each read (~0.1 µs against ~0.8 µs
    # here). It changes only when a session comes or goes; a step of a known session
    # updates its head in place and leaves it alone.
    :ets.new(@heads, [
      :named_table,
      :public,
      :set,
      write_concurrency: :auto,
      decentralized_counters: false
    ])

    # Envelope bytes kept, updated by the writers.
    :persistent_term.put(__MODULE__, :counters.new(1, [:write_concurrency]))
    IdleSweep.schedule()
    {:ok, %{}}
  end

  @impl true
  def handle_info(:sweep, state) do
    cutoff = System.system_time(:millisecond) - IdleSweep.ttl_ms()
    drop(for {session_id, _, seen, _} <- :ets.tab2list(@heads), seen < cutoff, do: session_id)
    IdleSweep.schedule()
    {:noreply, state}
  end

  def handle_info(:trim, state) do
    drain(:trim)
    sessions = :ets.info(@heads, :size)
    bytes = :counters.get(counter(), 1)

    if sessions > max_sessions() or bytes > max_bytes() do
      trim(sessions, bytes)
    end

    {:noreply, state}
  end

  # Least recently seen first, until both are at 90 % of their caps.
  defp trim(sessions, bytes) do
    keep_sessions = div(max_sessions() * 9, 10)
    keep_bytes = div(max_bytes() * 9, 10)
    by_age = :ets.tab2list(@heads) |> Enum.sort_by(fn {_, _, _, order} -> order end)

    {victims, _, _} =
      Enum.reduce_while(by_age, {[], sessions, bytes}, fn {id, _, _, _}, {acc, n, b} ->
        if n <= keep_sessions and b <= keep_bytes,
          do: {:halt, {acc, n, b}},
          else: {:cont, {[id | acc], n - 1, b - session_bytes(id)}}
      end)

    drop(victims)

    Logger.warning(
      "session log over its caps (#{sessions} sessions, #{bytes} bytes): " <>
        "dropped the #{length(victims)} least recently seen sessions"
    )
  end

  defp session_bytes(id) do
    Enum.sum(
      for slot <- 0..(size() - 1), {_, _, _, b, _, _} <- :ets.lookup(@slots, {id, slot}), do: b
    )
  end

  defp drop(session_ids) do
    for session_id <- session_ids do
      :ets.delete(@heads, session_id)

      for slot <- 0..(size() - 1),
          {_, _, _, bytes, _, _} <- :ets.take(@slots, {session_id, slot}) do
        :counters.sub(counter(), 1, bytes)
      end
    end

    :ok
  end

  defp drain(message) do
    receive do
      ^message -> drain(message)
    after
      0 -> :ok
    end
  end
end
