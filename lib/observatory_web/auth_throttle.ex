defmodule ObservatoryWeb.AuthThrottle do
  @moduledoc """
  Slows credential guessing without ever turning against the clients it protects.

  A wrong credential — one that is valid for no agent and no operator — counts
  against the client that presented it. A client with `max_failures` distinct wrong
  credentials within `window_s` is locked out for `lockout_s`: its wrong credentials
  are answered `429` with `Retry-After` instead of `401`.

  What a lockout never does:

    * **deny a valid credential.** Every credential is still checked, and a valid
      agent key or operator token is accepted whatever its address's failure count:
      the agents and operators behind one address (every local agent is 127.0.0.1)
      are not locked out by a stranger's guesses there. Guessing stays hopeless
      because of what it would have to guess, not because of the lock: agent keys
      carry 256 random bits, and operator tokens should too (`openssl rand -base64
      32`). The lockout tells a misconfigured or guessing client to back off, and logs
      it.
    * **count a credential that is valid for someone else.** An agent key sent to an
      operator route (or an operator token to an agent route) is refused there, but it
      is not a guess: ten agents trying an operator route lock nobody out.
    * **pool clients.** Each client has its own entry; the table holds at most
      `max_clients` of them, and a newcomer to a full table evicts the entry of
      another client (forgetting failures, never locking anyone), so a flood of
      addresses bounds memory without locking out everyone else.

  Distinct, because one agent retrying a stale key (a rotation) is one failed
  credential however often it retries. The entry keeps the SHA-256 digests of the
  client's failed credentials of the window, at most `max_failures + 1` of them.

      config :observatory, :auth_throttle,
        max_failures: 10, window_s: 60, lockout_s: 60, max_clients: 10_000

  A client is its TCP peer address (`ObservatoryWeb.Conn`'s `remote_ip`; proxies'
  `X-Forwarded-For` is not trusted), an IPv6 address its /64 (what one host or
  subscriber is given). Entries whose window and lockout are over are swept every
  `window_s`.

  Counting and checking are ETS operations in the caller; this process only owns the
  table and sweeps it. Settings are read on every call.
  """

  use GenServer
  require Logger

  @table __MODULE__
  @defaults [max_failures: 10, window_s: 60, lockout_s: 60, max_clients: 10_000]

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @doc "The settings in force."
  @spec settings() :: keyword()
  def settings,
    do: Keyword.merge(@defaults, Application.get_env(:observatory, :auth_throttle, []))

  @doc """
  `:ok`, or `{:error, retry_after_s}` while the client is locked out: then answer its
  wrong credentials `429` — and still accept its valid ones.
  """
  @spec check(String.t() | nil) :: :ok | {:error, pos_integer()}
  def check(client) do
    now = now_ms()

    case lookup(key(client)) do
      {_, _failures, _started, locked_until} when locked_until > now ->
        {:error, max(div(locked_until - now + 999, 1000), 1)}

      _ ->
        :ok
    end
  end

  @doc """
  Counts a failed `credential` of the client, unless it already failed in this
  window; locks the client out at `max_failures` distinct failed credentials. Only
  call it for a credential that is valid for nobody (`ObservatoryWeb.Auth` does).
  """
  @spec failure(String.t() | nil, String.t()) :: :ok
  def failure(client, credential) when is_binary(credential) do
    settings = settings()
    key = admit(key(client), settings[:max_clients])
    count(key, :crypto.hash(:sha256, credential), settings)
  rescue
    # No table (the web server is off): nothing to count.
    ArgumentError -> :ok
  end

  # Read, add the digest, write back only if the entry is still the one read
  # (compare-and-swap): concurrent guesses of one client are each counted.
  defp count(key, digest, settings) do
    now = now_ms()
    old = lookup(key)

    case next_entry(old, key, digest, now, settings) do
      :known ->
        :ok

      new ->
        if swap(old, new) do
          lock_if_due(new, now, settings)
        else
          count(key, digest, settings)
        end
    end
  end

  defp next_entry({_, digests, started, locked_until}, key, digest, now, settings) do
    current? = now - started < settings[:window_s] * 1000 or locked_until > now

    cond do
      # A new window. Not locked: `locked_until` is now (monotonic time may be negative).
      not current? -> {key, [digest], now, now}
      digest in digests -> :known
      length(digests) > settings[:max_failures] -> {key, digests, started, locked_until}
      true -> {key, [digest | digests], started, locked_until}
    end
  end

  defp next_entry(nil, key, digest, now, _settings), do: {key, [digest], now, now}

  defp swap(nil, new), do: :ets.insert_new(@table, new)
  defp swap(old, new), do: :ets.select_replace(@table, [{old, [], [{:const, new}]}]) == 1

  # At the limit and beyond (a new credential after a short lockout), lock (again);
  # logged when a lockout starts, not for every guess during one.
  defp lock_if_due({key, digests, _started, locked_until}, now, settings) do
    failures = length(digests)

    if failures >= settings[:max_failures] do
      :ets.update_element(@table, key, {4, now + settings[:lockout_s] * 1000})

      if locked_until <= now,
        do:
          Logger.warning(
            "#{failures} distinct failed credentials from #{inspect(key)} within " <>
              "#{settings[:window_s]} s: locked out for #{settings[:lockout_s]} s"
          )
    end

    :ok
  end

  @doc "How many clients the table holds (for tests and metrics)."
  @spec size() :: non_neg_integer()
  def size, do: :ets.info(@table, :size)

  @doc "Forgets every client (tests)."
  def reset, do: :ets.delete_all_objects(@table)

  @doc false
  def sweep, do: GenServer.call(__MODULE__, :sweep)

  ## The owner

  @impl true
  def init(_opts) do
    :ets.new(@table, [:named_table, :public, :set, write_concurrency: true])
    schedule_sweep()
    {:ok, nil}
  end

  @impl true
  def handle_call(:sweep, _from, state) do
    sweep_expired()
    {:reply, :ok, state}
  end

  @impl true
  def handle_info(:sweep, state) do
    sweep_expired()
    schedule_sweep()
    {:noreply, state}
  end

  def handle_info(message, state) do
    Logger.debug("AuthThrottle ignored #{inspect(message)}")
    {:noreply, state}
  end

  defp sweep_expired do
    now = now_ms()
    window_start = now - settings()[:window_s] * 1000

    :ets.select_delete(@table, [
      {{:_, :_, :"$1", :"$2"}, [{:<, :"$1", window_start}, {:"=<", :"$2", now}], [true]}
    ])
  end

  defp schedule_sweep,
    do: Process.send_after(self(), :sweep, settings()[:window_s] * 1000)

  ## Internals

  defp key(nil), do: "unknown"

  # An IPv6 client is its /64: one host or subscriber is given a whole /64, and would
  # otherwise have 2^64 entries (IPv4-mapped addresses are their IPv4 address).
  defp key(client) do
    # An IPv4 address (no ":") is its own key: nothing to parse on every request.
    if :binary.match(client, ":") == :nomatch, do: client, else: ipv6_key(client)
  end

  defp ipv6_key(client) do
    case :inet.parse_address(String.to_charlist(client)) do
      {:ok, {0, 0, 0, 0, 0, 0xFFFF, ab, cd}} ->
        :inet.ntoa({div(ab, 256), rem(ab, 256), div(cd, 256), rem(cd, 256)}) |> to_string()

      {:ok, {a, b, c, d, _, _, _, _}} ->
        (:inet.ntoa({a, b, c, d, 0, 0, 0, 0}) |> to_string()) <> "/64"

      _ ->
        client
    end
  end

  # A newcomer to a full table takes the place of another client: that client's
  # failures are forgotten (which only ever lets it be refused less). Evicting beats
  # sharing one entry among newcomers, which a flood of addresses would lock for all.
  defp admit(key, max_clients) do
    if lookup(key) == nil and :ets.info(@table, :size) >= max_clients, do: evict_one()
    key
  end

  defp evict_one do
    case :ets.first(@table) do
      :"$end_of_table" -> :ok
      victim -> :ets.delete(@table, victim)
    end
  end

  defp lookup(key) do
    case :ets.lookup(@table, key) do
      [entry] -> entry
      [] -> nil
    end
  rescue
    ArgumentError -> nil
  end

  defp now_ms, do: System.monotonic_time(:millisecond)
end
