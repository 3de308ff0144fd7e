defmodule Observatory.IngestSettings do
  @moduledoc false
  # The settings every ingested step reads — all but FR-9.11's three entropy
  # settings, which the specification has read from the application environment on
  # every call — and what they come to (the verdict's and the step detector's
  # thresholds packed for the scoring NIF, the idempotency limits), kept as one
  # `:persistent_term` under one atom: a step reads that term where it made eight
  # application-env reads of ~150-190 ns each, and derives nothing.
  #
  # `Observatory.configure/1` checks settings, puts them in the application
  # environment and refreshes the snapshot before it returns: the next step uses
  # them. `Application.put_env/3` alone is picked up by this process, which reads the
  # settings again every `:settings_refresh_ms` (default 1 s) and writes the snapshot
  # only when one of them differs (each `:persistent_term.put/2` of a replaced term
  # makes the VM scan every process: not once a second for nothing). It is the only
  # writer, so a refresh asked for and a tick never interleave. Its crash loses
  # nothing (the term outlives it) and its restart reads the settings again.
  #
  # An invalid value put with `Application.put_env/3` does what it did when every
  # step read it: each module's own derivation below warns and uses its defaults, or
  # the reader acts on the raw value as before (`AlertSource.current/0`,
  # `Events.pubsub/0`, the session log's caps). Each node keeps its own snapshot, as
  # each has its own environment. Without this process (the application not started,
  # or running with storage off) the settings are read from the environment on every
  # call, as before.

  use GenServer
  require Logger

  alias Observatory.Gateway.{EntropyConfig, Idempotency, LoopVerdict, StepDetector}

  # An atom key: a tuple key costs more a read.
  @key __MODULE__
  @app :observatory

  # Each setting kept, with its default.
  @settings [
    alert_source: :entropy,
    pubsub: {Observatory.PubSub, Observatory.PubSub},
    idempotency: [],
    loop_verdict: [],
    step_detection: [],
    session_log_size: 20,
    session_log_max_sessions: 100_000,
    session_log_max_envelope_bytes: 16_384,
    session_log_max_bytes: 268_435_456
  ]

  @refresh_ms 1_000
  @entropy [:entropy_window_size, :entropy_loop_threshold, :entropy_warning_threshold]
  @configurable Keyword.keys(@settings) ++ @entropy ++ [:settings_refresh_ms]

  @doc """
  What steps use of a setting kept here: one of `@settings`' keys (its value as
  configured), `:idempotency_limits` (`Idempotency`'s limits, nil when off),
  `:step_score` (`{packed verdict config, {step thresholds, packed step settings}}`) or
  `:session_log_put` (`{max envelope bytes, {ring size, max bytes}}`: what a put reads).
  """
  @spec get(atom()) :: term()
  def get(key) do
    case :persistent_term.get(@key, nil) do
      {_read, snapshot} -> :erlang.map_get(key, snapshot)
      nil -> unkept(key)
    end
  end

  # No snapshot: the one setting read from the environment, as every call did.
  defp unkept(:idempotency_limits), do: idempotency_limits(env(:idempotency))
  defp unkept(:step_score), do: step_score(env(:loop_verdict), env(:step_detection))

  defp unkept(:session_log_put),
    do:
      session_log_put(
        env(:session_log_max_envelope_bytes),
        env(:session_log_size),
        env(:session_log_max_bytes)
      )

  defp unkept(key), do: env(key)

  defp env(key), do: Application.get_env(@app, key, Keyword.fetch!(@settings, key))

  @doc """
  Brings the snapshot up to the application environment now (a no-op when nothing
  differs, or when this process does not run: then every call reads the
  environment).
  """
  @spec refresh() :: :ok
  def refresh do
    GenServer.call(__MODULE__, :refresh)
  catch
    :exit, {:noproc, _} -> :ok
  end

  @doc "See `Observatory.configure/1`."
  @spec configure(keyword()) :: :ok
  def configure(settings) do
    unless is_list(settings) and Keyword.keyword?(settings) do
      raise ArgumentError,
            "Observatory.configure/1 takes a keyword list of settings, got: #{inspect(settings)}"
    end

    Enum.each(settings, fn {key, value} -> check!(key, value) end)
    rules_before = normalization()
    for {key, value} <- settings, do: Application.put_env(@app, key, value)
    :ok = refresh()

    # The verdict's normalization is built when it starts: rebuilt here when changed.
    if normalization() != rules_before and LoopVerdict.running?(),
      do: LoopVerdict.reload_rules()

    :ok
  end

  @doc false
  # Drops the snapshot (the application's start and stop): calls read the
  # environment until this process makes one again.
  def forget do
    if :persistent_term.get(@key, nil) != nil, do: :persistent_term.erase(@key)
    :ok
  end

  def start_link(opts \\ []), do: GenServer.start_link(__MODULE__, opts, name: __MODULE__)

  @impl true
  def init(_opts) do
    refresh_now()
    {:ok, schedule(nil)}
  end

  @impl true
  def handle_call(:refresh, _from, timer) do
    refresh_now()
    # `:settings_refresh_ms` may have changed: the next tick at the new interval.
    {:reply, :ok, schedule(timer)}
  end

  @impl true
  def handle_info(:tick, _timer) do
    refresh_now()
    {:noreply, schedule(nil)}
  end

  defp schedule(timer) do
    if timer, do: Process.cancel_timer(timer)
    Process.send_after(self(), :tick, interval())
  end

  defp interval do
    case Application.get_env(@app, :settings_refresh_ms, @refresh_ms) do
      ms when is_integer(ms) and ms > 0 ->
        ms

      other ->
        warn_once(
          {:settings_refresh_ms, other},
          "invalid :observatory :settings_refresh_ms: #{inspect(other)}; using the default #{@refresh_ms}"
        )

        @refresh_ms
    end
  end

  # Written only when a setting differs from the ones the snapshot was made of.
  defp refresh_now do
    read = read()

    case :persistent_term.get(@key, nil) do
      {^read, _snapshot} -> :ok
      _changed_or_none -> put(read)
    end

    :ok
  end

  # Each module's derivation takes any value it may be given; should one still raise,
  # the snapshot stays as it was (said once): a setting put by hand must not restart
  # this process until its supervisor gives up.
  defp put(read) do
    :persistent_term.put(@key, {read, derive(read)})
  rescue
    exception ->
      warn_once(
        {:derive, read},
        "the settings put with Application.put_env/3 could not be applied " <>
          "(#{Exception.message(exception)}); steps keep the settings they had"
      )
  end

  defp read, do: for({key, _default} <- @settings, do: {key, env(key)})

  # What steps read: each setting as configured, and what the scoring and the
  # idempotency check make of theirs (their own derivations, with their warnings).
  defp derive(read) do
    snapshot = Map.new(read)

    Map.merge(snapshot, %{
      idempotency_limits: idempotency_limits(snapshot.idempotency),
      step_score: step_score(snapshot.loop_verdict, snapshot.step_detection),
      session_log_put:
        session_log_put(
          snapshot.session_log_max_envelope_bytes,
          snapshot.session_log_size,
          snapshot.session_log_max_bytes
        )
    })
  end

  # The session log's three put settings as one value: a put reads one key, not three
  # (~0.1 µs a step). Raw, as each was read alone.
  defp session_log_put(max_envelope_bytes, size, max_bytes),
    do: {max_envelope_bytes, {size, max_bytes}}

  # Not a list: the defaults, as `Idempotency.settings/0` takes it.
  defp idempotency_limits(setting) when is_list(setting), do: Idempotency.limits(setting)
  defp idempotency_limits(_other), do: Idempotency.limits([])

  defp step_score(verdict, step), do: {LoopVerdict.packed_config(verdict), step(step)}

  # Not a keyword list: packed as invalid thresholds are (nil), so the detector
  # answers `:invalid_step_thresholds` and warns naming it, and the other parts are
  # scored.
  defp step(setting) do
    if is_list(setting) and Keyword.keyword?(setting),
      do: StepDetector.scoring_settings(setting),
      else: {setting, nil}
  end

  defp normalization, do: Keyword.drop(LoopVerdict.settings(), LoopVerdict.threshold_keys())

  defp warn_once(what, message) do
    if :persistent_term.get({__MODULE__, :warned}, nil) != what do
      :persistent_term.put({__MODULE__, :warned}, what)
      Logger.warning(message)
    end
  end

  ## The checks of configure/1: each raises an ArgumentError that names the key and
  ## what it takes, before anything is put.

  defp check!(:alert_source, value) do
    value in [:entropy, :verdict] or refuse!(:alert_source, ":entropy or :verdict", value)
  end

  defp check!(:pubsub, {module, server} = value) when is_atom(module) and is_atom(server) do
    exported? =
      Code.ensure_loaded?(module) and
        Enum.all?([broadcast: 3, subscribe: 2, unsubscribe: 2], fn {f, a} ->
          function_exported?(module, f, a)
        end)

    exported? or
      refuse!(
        :pubsub,
        "{module, server} with a module that has broadcast/3, subscribe/2 " <>
          "and unsubscribe/2 (Phoenix.PubSub, Observatory.PubSub)",
        value
      )
  end

  defp check!(:pubsub, value), do: refuse!(:pubsub, "{module, server}", value)

  defp check!(:idempotency, value) do
    keys = Keyword.keys(Idempotency.settings())
    keyword!(:idempotency, value, keys)

    for {key, v} <- value, not Idempotency.valid_setting?(key, v) do
      refuse!(:idempotency, idempotency_rule(key), value)
    end
  end

  defp check!(:loop_verdict, value) do
    keyword!(:loop_verdict, value, Keyword.keys(LoopVerdict.defaults()))

    for {key, v} <- value, key not in LoopVerdict.threshold_keys(), not normalization?(key, v) do
      refuse!(:loop_verdict, normalization_rule(key), value)
    end

    with {:error, message} <-
           LoopVerdict.check_thresholds(Keyword.merge(LoopVerdict.defaults(), value)) do
      raise ArgumentError, "Observatory.configure/1: #{message}, got: #{inspect(value)}"
    end
  end

  defp check!(:step_detection, value) do
    keyword!(:step_detection, value, Keyword.keys(StepDetector.settings()))

    for {key, v} <- value,
        not positive?(v),
        do: refuse!(:step_detection, "#{key}: a positive integer", value)

    {_thresholds, packed} = StepDetector.scoring_settings(value)

    packed != nil or
      refuse!(:step_detection, "warn thresholds at most their block thresholds", value)
  end

  defp check!(:entropy_window_size, value) do
    EntropyConfig.valid_size?(value) or
      refuse!(:entropy_window_size, "an integer 1..#{EntropyConfig.max_window_size()}", value)
  end

  defp check!(key, value) when key in [:entropy_loop_threshold, :entropy_warning_threshold] do
    EntropyConfig.valid_threshold?(value) or refuse!(key, "a number 0..1", value)
  end

  defp check!(key, value)
       when key in [
              :session_log_size,
              :session_log_max_sessions,
              :session_log_max_envelope_bytes,
              :session_log_max_bytes,
              :settings_refresh_ms
            ] do
    positive?(value) or refuse!(key, "a positive integer", value)
  end

  defp check!(key, _value) do
    raise ArgumentError,
          "Observatory.configure/1: unknown setting #{inspect(key)} " <>
            "(it takes #{Enum.map_join(@configurable, ", ", &inspect/1)})"
  end

  defp keyword!(key, value, allowed) do
    (is_list(value) and Keyword.keyword?(value)) or refuse!(key, "a keyword list", value)

    for {k, _} <- value, k not in allowed do
      refuse!(key, "a keyword list of #{Enum.map_join(allowed, ", ", &inspect/1)}", value)
    end
  end

  defp positive?(value), do: is_integer(value) and value > 0

  defp idempotency_rule(:enabled), do: "enabled: true or false"
  defp idempotency_rule(limit), do: "#{limit}: a positive integer"

  defp normalization?(:volatile_keys, v), do: v == :default or strings?(v)
  defp normalization?(:extra_volatile_keys, v), do: strings?(v)
  defp normalization?(:max_sessions, v), do: positive?(v)
  defp normalization?(_flag, v), do: is_boolean(v)

  defp normalization_rule(:volatile_keys), do: "volatile_keys: :default or a list of strings"
  defp normalization_rule(:extra_volatile_keys), do: "extra_volatile_keys: a list of strings"
  defp normalization_rule(:max_sessions), do: "max_sessions: a positive integer"
  defp normalization_rule(flag), do: "#{flag}: true or false"

  defp strings?(v), do: is_list(v) and Enum.all?(v, &is_binary/1)

  defp refuse!(key, allowed, value) do
    raise ArgumentError,
          "Observatory.configure/1: #{inspect(key)} must be #{allowed}, got: #{inspect(value)}"
  end
end
