defmodule Observatory.Replay do
  @moduledoc """
  Replays recorded agent steps through the gateway's own ingest path and reports
  which sessions looped, so thresholds can be tuned on real logs before Observatory
  sits in front of a fleet. `mix observatory.replay` is the command-line face of
  this module.

      report = Observatory.Replay.run(["examples/agent_steps.jsonl"])
      report.summary
      #=> %{sessions: 14, steps: 266, sessions_warning: 10, sessions_loop: 8, alerts: 45, ...}

  ## Input

  JSONL, one step per line, plain or gzip (see `Observatory.Replay.Input`), each line
  either a full DecisionLog envelope, a flat step record (see
  `Observatory.Replay.Record`), or a recorded LLM request whose previous assistant
  turn's tool calls are the steps, each ingested once (see
  `Observatory.Replay.ProxyRequest`). A line that is not JSON, not an object, or that the
  gateway rejects is a *bad line*: counted, reported with its source and line number,
  never fatal. A step met again — the same session and `step_id` with the same body, as
  in a log that recorded a client's retry — is answered as a replay by the gateway and
  counted once (`replayed_steps` in the summary); the same `step_id` with another body
  is a bad line. A read or gzip error ends that source only and is reported apart.

  ## The path each step takes

  Every step goes through `Observatory.Gateway.SchemaInterceptor.ingest/2`, exactly as
  a step posted to the HTTP API: validation in Rust, `EntropyTracker.record_and_score/3`,
  the step detector, the session log and the PubSub broadcasts. The window size and
  thresholds are the application's (`Application.get_env/3`, read on every step), so
  `configure/1` — or the task's flags — change them for the replay.

  Sessions are keyed by `session_id` across all sources, in the gateway's live state:
  replay in a VM of its own (the mix task does) so that no other traffic shares it.
  Steps of one session are ingested in input order; different sessions may be spread
  over several workers (`:workers`), each session always on the same one. The
  gateway's bounds hold for a replay too: beyond `:step_detection` `max_sessions`
  (100,000) sessions at once, the least recently seen lose their step-detector state.

  ## Report

  Recorded LLM requests also go through the kill switch and the budgets in a shadow
  run (`Observatory.Replay.WouldTrip`): `would_trip` says which agents the kill
  switch would have stopped and which sessions the budgets would have, at which
  request, and what the refused requests would have saved.

  Per session: its steps, the step number (1-based, counting the session's accepted
  steps) and step_id of its first WARNING and first LOOP, its alerts, its lowest score
  and the step detector's first warn and block. `alerts` counts the steps whose ingest
  result has severity `:loop`: the tracker answers `:loop` only after it has broadcast
  the `EntropyAlertEvent` on `"gateway:entropy_alerts"` (FR-9.4, FR-9.7: one alert on
  every LOOP step), so the two counts are the same.
  """

  alias Observatory.Gateway.{
    AlertSource,
    EntropyConfig,
    LoopVerdict,
    SchemaInterceptor,
    StepDetector
  }

  alias Observatory.Replay.{Input, ProxyRequest, Record, WouldTrip}

  @batch 256
  @in_flight 4
  # Each step leaves ~1000 words of garbage (mostly the parsed envelope): a young heap
  # this big is collected every ~60 steps instead of every ~6.
  @min_heap_words 65_536
  @max_bad_default 1000

  @type source :: Input.source()

  @typedoc "Where a step was first met, and which one it was."
  @type mark :: %{
          step: pos_integer(),
          step_id: String.t(),
          source: String.t(),
          line: pos_integer(),
          score: number() | nil
        }

  @type session :: %{
          session_id: String.t(),
          agent_id: String.t(),
          steps: non_neg_integer(),
          first_warning: mark() | nil,
          first_loop: mark() | nil,
          warnings: non_neg_integer(),
          alerts: non_neg_integer(),
          lowest_score: number() | nil,
          lowest_score_step: pos_integer() | nil,
          last_severity: atom() | nil,
          entropy_errors: non_neg_integer(),
          step_warnings: non_neg_integer(),
          step_blocks: non_neg_integer(),
          first_step_warning: mark() | nil,
          first_step_block: mark() | nil
        }

  @type report :: %{
          sources: [String.t()],
          settings: map(),
          lines: non_neg_integer(),
          steps: non_neg_integer(),
          bad_lines: non_neg_integer(),
          bad: [%{source: String.t(), line: pos_integer(), reason: String.t()}],
          input_errors: [%{source: String.t(), reason: String.t()}],
          sessions: [session()],
          would_trip: map() | nil,
          summary: map(),
          elapsed_us: non_neg_integer()
        }

  @overrides [
    window_size: :entropy_window_size,
    loop_threshold: :entropy_loop_threshold,
    warning_threshold: :entropy_warning_threshold
  ]
  @step_overrides [:stagnation_warn, :stagnation_block, :stuck_warn, :stuck_block]
  @verdict_overrides LoopVerdict.threshold_keys() -- [:entropy_rule]
  @never_keys [:failure_loop, :failure_run_loop, :revisit_loop]
  @max_window EntropyConfig.max_window_size()

  @doc """
  Applies threshold overrides to the application environment, after checking them;
  returns the settings now in force (`settings/0`).

  ## Options
    * `:window_size` — 1..#{EntropyConfig.max_window_size()}
    * `:loop_threshold`, `:warning_threshold` — numbers 0..1
    * `:stagnation_warn`, `:stagnation_block`, `:stuck_warn`, `:stuck_block` — positive
      integers, each block at least its warn
    * `:alert_source` — `:entropy` or `:verdict`: which signal's alarms the report
      counts as `alarmed` (both are always reported)
    * the loop verdict's thresholds: `:history`, `:max_period`, `:repeat_suspect`,
      `:repeat_loop`, `:blank_repeat_loop`, `:cycle_suspect`, `:cycle_loop`,
      `:failure_suspect`, `:failure_loop` (an integer or `:never`), `:near_share`,
      `:near_repeat_suspect`, `:near_repeat_loop`, `:blank_near_repeat_loop`,
      `:failure_run_suspect`, `:failure_run_loop`, `:revisit_window`,
      `:revisit_suspect`, `:revisit_loop` (the last two loops an integer or `:never`);
      checked together with `Observatory.Gateway.LoopVerdict.check_thresholds/1`
    * `:extra_volatile_keys` — words added to the verdict's volatile words (the
      normalization is rebuilt: replay in a fresh VM, as the mix task does)

  Raises `ArgumentError` on a bad value.
  """
  @spec configure(keyword()) :: map()
  def configure(overrides) when is_list(overrides) do
    Enum.each(overrides, fn {key, value} -> validate!(key, value) end)
    verdict = Keyword.take(overrides, @verdict_overrides)

    with {:error, message} <- LoopVerdict.check_thresholds(verdict),
         do: raise(ArgumentError, message)

    step = Keyword.merge(StepDetector.settings(), Keyword.take(overrides, @step_overrides))

    for {warn, block} <- [stagnation_warn: :stagnation_block, stuck_warn: :stuck_block],
        step[warn] > step[block] do
      raise ArgumentError,
            "expected #{block} (#{step[block]}) to be at least #{warn} (#{step[warn]})"
    end

    for {key, env_key} <- @overrides, Keyword.has_key?(overrides, key) do
      Application.put_env(:observatory, env_key, Keyword.fetch!(overrides, key))
    end

    merge_env(:step_detection, Keyword.take(overrides, @step_overrides))
    merge_env(:loop_verdict, verdict)

    if source = overrides[:alert_source],
      do: Application.put_env(:observatory, :alert_source, source)

    if words = overrides[:extra_volatile_keys] do
      known = List.wrap(LoopVerdict.settings()[:extra_volatile_keys])
      merge_env(:loop_verdict, extra_volatile_keys: Enum.uniq(known ++ words))
      if LoopVerdict.running?(), do: LoopVerdict.reload_rules()
    end

    # A running gateway's steps use the settings from now on.
    Observatory.IngestSettings.refresh()
    settings()
  end

  defp merge_env(_key, []), do: :ok

  defp merge_env(key, changes) do
    # Unset, or set to nil by hand: the defaults.
    configured = Application.get_env(:observatory, key) || []
    Application.put_env(:observatory, key, Keyword.merge(configured, changes))
  end

  defp validate!(:window_size, n) when is_integer(n) and n >= 1 and n <= @max_window, do: :ok

  defp validate!(key, t)
       when key in [:loop_threshold, :warning_threshold] and is_number(t) and t >= 0 and t <= 1,
       do: :ok

  defp validate!(key, n) when key in @step_overrides and is_integer(n) and n >= 1, do: :ok
  defp validate!(:alert_source, source) when source in [:entropy, :verdict], do: :ok
  defp validate!(key, :never) when key in @never_keys, do: :ok
  defp validate!(:near_share, n) when is_integer(n) and n in 50..100, do: :ok

  defp validate!(:near_share, value),
    do:
      raise(ArgumentError, "expected near_share to be an integer 50..100, got: #{inspect(value)}")

  defp validate!(key, n) when key in @verdict_overrides and is_integer(n) and n >= 1, do: :ok

  defp validate!(:extra_volatile_keys, words) when is_list(words) and words != [] do
    if Enum.all?(words, &(is_binary(&1) and &1 != "")),
      do: :ok,
      else:
        raise(ArgumentError, "expected extra_volatile_keys to be words, got: #{inspect(words)}")
  end

  defp validate!(:alert_source, value),
    do:
      raise(
        ArgumentError,
        "expected alert_source to be :entropy or :verdict, got: #{inspect(value)}"
      )

  defp validate!(key, value) when key in @verdict_overrides,
    do: raise(ArgumentError, "expected #{key} to be a positive integer, got: #{inspect(value)}")

  defp validate!(:window_size, value),
    do:
      raise(
        ArgumentError,
        "expected window_size to be in 1..#{@max_window}, got: #{inspect(value)}"
      )

  defp validate!(key, value) when key in @step_overrides,
    do: raise(ArgumentError, "expected #{key} to be a positive integer, got: #{inspect(value)}")

  defp validate!(key, value) when key in [:loop_threshold, :warning_threshold],
    do: raise(ArgumentError, "expected #{key} to be a number in 0..1, got: #{inspect(value)}")

  defp validate!(key, _value), do: raise(ArgumentError, "unknown override #{inspect(key)}")

  @doc "The entropy, step-detector and loop-verdict settings in force."
  @spec settings() :: map()
  def settings do
    {window, loop, warning} = EntropyConfig.read()
    step = StepDetector.settings()
    verdict = LoopVerdict.settings()

    %{
      alert_source: AlertSource.current(),
      verdict: Map.new(@verdict_overrides, &{&1, verdict[&1]}),
      extra_volatile_keys: List.wrap(verdict[:extra_volatile_keys]),
      window_size: window,
      loop_threshold: loop,
      warning_threshold: warning,
      stagnation_warn: step[:stagnation_warn],
      stagnation_block: step[:stagnation_block],
      stuck_warn: step[:stuck_warn],
      stuck_block: step[:stuck_block]
    }
  end

  @doc """
  Sets the application up for a replay, before it starts: no HTTP server, no demo
  fleet, one envelope per session in the session log (nothing reads them). With
  `own_data_dir: true` (a VM of its own, as `mix observatory.replay` and
  `bench/real_runs.exs` start) the application also gets a temporary data directory,
  removed when the VM exits: a replay needs no durable state, and a gateway may be
  running on the configured directory, which it holds locked.
  """
  @spec prepare_app(keyword()) :: :ok
  def prepare_app(opts \\ []) do
    endpoint = Application.get_env(:observatory, ObservatoryWeb.Endpoint, [])

    Application.put_env(
      :observatory,
      ObservatoryWeb.Endpoint,
      Keyword.put(endpoint, :server, false)
    )

    Application.put_env(:observatory, :demo, false)
    Application.put_env(:observatory, :session_log_size, 1)

    if Keyword.get(opts, :own_data_dir, false) do
      dir = Path.join(System.tmp_dir!(), "observatory-replay-#{System.pid()}")
      File.rm_rf!(dir)
      Application.put_env(:observatory, :data_dir, dir)
      Application.delete_env(:mnesia, :dir)
      System.at_exit(fn _status -> File.rm_rf(dir) end)
    end

    :ok
  end

  @doc """
  Replays the sources in order and returns the report.

  ## Options
    * `:workers` — processes ingesting steps, default 1; sessions are spread over
      them by a hash of their session_id.
    * `:progress` — a function called after each chunk read with
      `%{bytes: read_so_far, total_bytes: total_or_nil, lines: lines_so_far}`.
    * `:timestamp` — `meta.timestamp` for flat records that have none (default: now).
    * `:max_bad_lines` — bad lines kept in the report with their reason, default
      #{@max_bad_default} (all are counted).
    * `:kill_switch` — `[window_size: n, threshold: x]` for the recorded LLM requests'
      shadow run (`Observatory.Replay.WouldTrip`), default the settings of new agents.
    * `:budget` — budget limits for it (`Observatory.Budget.Settings`' keys), over the
      configured defaults.
  """
  @spec run([source()], keyword()) :: report()
  def run(sources, opts \\ []) when is_list(sources) do
    started = System.monotonic_time(:microsecond)
    workers = Keyword.get(opts, :workers, 1)

    unless is_integer(workers) and workers >= 1 do
      raise ArgumentError, "expected :workers to be a positive integer, got: #{inspect(workers)}"
    end

    timestamp =
      Keyword.get_lazy(opts, :timestamp, fn ->
        DateTime.utc_now() |> DateTime.truncate(:second) |> DateTime.to_iso8601()
      end)

    max_bad = Keyword.get(opts, :max_bad_lines, @max_bad_default)
    names = Enum.map(sources, &Input.name/1)
    totals = Enum.map(sources, &Input.size/1)
    total_bytes = if Enum.all?(totals, & &1), do: Enum.sum(totals)

    heap = Process.flag(:min_heap_size, @min_heap_words)

    try do
      sink = start_sink(workers, max_bad)

      reader = %{
        sink: sink,
        timestamp: timestamp,
        lines: 0,
        bytes_before: 0,
        errors: [],
        bad: new_bad(max_bad),
        progress: Keyword.get(opts, :progress),
        total_bytes: total_bytes,
        # What the kill switch and the budgets would have done to the recorded requests.
        would_trip: WouldTrip.new(kill_switch_settings(opts), budget_settings(opts))
      }

      reader =
        sources
        |> Enum.with_index()
        |> Enum.reduce(reader, fn {source, index}, reader ->
          read_source(reader, source, Enum.at(names, index))
        end)

      states = finish_sink(reader.sink)
      WouldTrip.stop(reader.would_trip)
      report(names, reader, states, max_bad, System.monotonic_time(:microsecond) - started)
    after
      Process.flag(:min_heap_size, heap)
    end
  end

  # The kill switch's settings for the replay's shadow run: the options', else the
  # defaults of new agents.
  defp kill_switch_settings(opts) do
    config = Application.get_env(:observatory, :kill_switch, [])

    Map.merge(
      %{
        window_size: Keyword.get(config, :window_size, 5),
        threshold: Keyword.get(config, :threshold, 5.5) / 1
      },
      Map.new(Keyword.get(opts, :kill_switch, []))
    )
  end

  defp budget_settings(opts),
    do: Map.merge(Observatory.Budget.Settings.defaults(), Map.new(Keyword.get(opts, :budget, [])))

  ## Reading (in the caller)

  defp read_source(reader, source, name) do
    {reader, bytes} =
      source
      |> Input.chunks()
      |> Enum.reduce({reader, 0}, fn
        {:lines, lines, bytes}, {reader, _} ->
          reader = Enum.reduce(lines, reader, &read_line(&1, &2, name))
          reader = flush(reader)
          progress(reader, reader.bytes_before + bytes)
          {reader, bytes}

        {:error, reason}, {reader, bytes} ->
          {%{reader | errors: [%{source: name, reason: reason} | reader.errors]}, bytes}
      end)

    %{reader | bytes_before: reader.bytes_before + bytes}
  end

  defp progress(%{progress: nil}, _bytes), do: :ok

  defp progress(reader, bytes),
    do: reader.progress.(%{bytes: bytes, total_bytes: reader.total_bytes, lines: reader.lines})

  defp read_line({line_no, text}, reader, name) do
    reader = %{reader | lines: reader.lines + 1}

    case ProxyRequest.read(text) do
      :not_request ->
        read_step(text, line_no, reader, name)

      {:ok, session_id, steps, exchange} ->
        reader = %{
          reader
          | would_trip: WouldTrip.observe(reader.would_trip, exchange, name, line_no)
        }

        read_request_steps(reader, session_id, steps, name, line_no)

      {:error, reason} ->
        %{reader | bad: add_bad(reader.bad, name, line_no, reason)}
    end
  end

  # A recorded LLM request: the steps it carries. A conversation is re-sent on every
  # turn; a step an earlier request carried is answered as a replay, not counted.
  defp read_request_steps(reader, session_id, steps, name, line_no) do
    Enum.reduce(steps, reader, fn {_key, json}, reader ->
      dispatch(reader, session_id, {:envelope, name, line_no, json})
    end)
  end

  defp read_step(text, line_no, reader, name) do
    case Record.read(text, reader.timestamp) do
      {:flat, session_id, head, tail} ->
        dispatch(reader, session_id, {:flat, name, line_no, session_id, head, tail})

      {:envelope, session_id} ->
        dispatch(reader, session_id, {:envelope, name, line_no, text})

      {:error, reason} ->
        %{reader | bad: add_bad(reader.bad, name, line_no, reason)}
    end
  end

  ## Where steps are ingested: in the caller (1 worker) or in worker processes

  defp start_sink(1, max_bad), do: {:inline, new_state(max_bad)}

  defp start_sink(workers, max_bad) do
    caller = self()

    pids =
      for index <- 0..(workers - 1) do
        :erlang.spawn_opt(fn -> worker_loop(caller, index, new_state(max_bad)) end, [
          :link,
          min_heap_size: @min_heap_words
        ])
      end

    empty = :erlang.make_tuple(workers, [])
    zeros = :erlang.make_tuple(workers, 0)
    {:workers, %{pids: List.to_tuple(pids), batches: empty, sizes: zeros, in_flight: zeros}}
  end

  defp dispatch(%{sink: {:inline, state}} = reader, _session_id, item),
    do: %{reader | sink: {:inline, ingest(item, state)}}

  defp dispatch(%{sink: {:workers, sink}} = reader, session_id, item) do
    index = :erlang.phash2(session_id, tuple_size(sink.pids))
    size = elem(sink.sizes, index) + 1

    sink = %{
      sink
      | batches: put_elem(sink.batches, index, [item | elem(sink.batches, index)]),
        sizes: put_elem(sink.sizes, index, size)
    }

    sink = if size >= @batch, do: send_batch(sink, index), else: sink
    %{reader | sink: {:workers, sink}}
  end

  defp flush(%{sink: {:inline, _}} = reader), do: reader

  defp flush(%{sink: {:workers, sink}} = reader) do
    sink =
      Enum.reduce(0..(tuple_size(sink.pids) - 1), sink, fn index, sink ->
        if elem(sink.sizes, index) > 0, do: send_batch(sink, index), else: sink
      end)

    %{reader | sink: {:workers, sink}}
  end

  # At most @in_flight batches wait in a worker's mailbox: the reader waits for an
  # acknowledgement before sending more, so memory stays bounded on big inputs.
  defp send_batch(sink, index) do
    sink = await_credit(sink, index)
    send(elem(sink.pids, index), {:batch, Enum.reverse(elem(sink.batches, index))})

    %{
      sink
      | batches: put_elem(sink.batches, index, []),
        sizes: put_elem(sink.sizes, index, 0),
        in_flight: put_elem(sink.in_flight, index, elem(sink.in_flight, index) + 1)
    }
  end

  defp await_credit(sink, index) do
    if elem(sink.in_flight, index) < @in_flight do
      sink
    else
      receive do
        {:ack, i} ->
          await_credit(
            %{sink | in_flight: put_elem(sink.in_flight, i, elem(sink.in_flight, i) - 1)},
            index
          )
      end
    end
  end

  defp finish_sink({:inline, state}), do: [finish_state(state)]

  defp finish_sink({:workers, %{pids: pids}}) do
    for pid <- Tuple.to_list(pids) do
      send(pid, {:finish, self()})

      receive do
        {:finished, ^pid, state} -> state
      end
    end
  end

  defp worker_loop(caller, index, state) do
    receive do
      {:batch, items} ->
        state = Enum.reduce(items, state, &ingest/2)
        send(caller, {:ack, index})
        worker_loop(caller, index, state)

      {:finish, from} ->
        send(from, {:finished, self(), finish_state(state)})
    end
  end

  ## One step

  # A session's figures live in an ETS table of the process that ingests its steps,
  # not on that process's heap: with many sessions a heap-resident map would be
  # copied over and over by the garbage collector.
  defp new_state(max_bad) do
    %{
      sessions: :ets.new(__MODULE__, [:set, :private]),
      steps: 0,
      replayed: 0,
      bad: new_bad(max_bad)
    }
  end

  defp lookup(state, session_id) do
    case :ets.lookup(state.sessions, session_id) do
      [{_, session}] -> session
      [] -> nil
    end
  end

  defp ingest({:flat, name, line_no, session_id, head, tail}, state) do
    session = lookup(state, session_id)
    n = if session, do: session.steps + 1, else: 1
    json = Record.envelope_json(head, tail, n)
    result(SchemaInterceptor.ingest(json, envelope: false), session, name, line_no, :flat, state)
  end

  defp ingest({:envelope, name, line_no, text}, state) do
    case SchemaInterceptor.ingest(text, envelope: false) do
      {:ok, result} = ok ->
        result(ok, lookup(state, result.session_id), name, line_no, :envelope, state)

      error ->
        result(error, nil, name, line_no, :envelope, state)
    end
  end

  # A step met before (its session and step_id, the same body): answered again by the
  # gateway, not counted again.
  defp result({:ok, %{replayed: true}}, _session, _name, _line_no, _kind, state),
    do: %{state | replayed: state.replayed + 1}

  defp result({:ok, result}, session, name, line_no, _kind, state) do
    session = session || new_session(result, name, line_no)
    :ets.insert(state.sessions, {result.session_id, step(session, result, name, line_no)})
    %{state | steps: state.steps + 1}
  end

  defp result({:error, {:invalid, violations}}, _session, name, line_no, kind, state) do
    reason =
      Enum.map_join(violations, "; ", fn %{path: path, reason: reason} ->
        if kind == :flat, do: "#{Record.flat_path(path)} #{reason}", else: "#{path} #{reason}"
      end)

    %{state | bad: add_bad(state.bad, name, line_no, reason)}
  end

  # Refusals other than validation (another agent's session, an owner that did not
  # answer in a cluster) are bad lines too, with their reason.
  defp result(
         {:error, {_kind, %{path: path, reason: reason}}},
         _session,
         name,
         line_no,
         _kind2,
         state
       ),
       do: %{state | bad: add_bad(state.bad, name, line_no, "#{path} #{reason}")}

  defp new_session(result, name, line_no) do
    %{
      session_id: result.session_id,
      agent_id: result.agent_id,
      first_seen: {name, line_no},
      steps: 0,
      first_warning: nil,
      first_loop: nil,
      warnings: 0,
      alerts: 0,
      lowest_score: nil,
      lowest_score_step: nil,
      last_severity: nil,
      entropy_errors: 0,
      step_warnings: 0,
      step_blocks: 0,
      first_step_warning: nil,
      first_step_block: nil,
      first_suspect: nil,
      first_verdict_loop: nil,
      verdict_loops: 0,
      verdict_rule: nil,
      verdict_reason: nil,
      verdict_evidence: []
    }
  end

  # One step's figures, in one update of the session's map.
  defp step(session, result, name, line_no) do
    n = session.steps + 1
    severity = result.severity
    score = result.entropy_score
    action = if result.step, do: result.step.action
    verdict = if result.verdict, do: result.verdict.verdict
    mark = {n, result, name, line_no}

    lower? = severity != nil and (session.lowest_score == nil or score < session.lowest_score)

    %{
      session
      | steps: n,
        agent_id: result.agent_id,
        last_severity: severity,
        alerts: session.alerts + if(severity == :loop, do: 1, else: 0),
        first_loop: first(session.first_loop, severity == :loop, mark),
        warnings: session.warnings + if(severity == :warning, do: 1, else: 0),
        first_warning: first(session.first_warning, severity == :warning, mark),
        entropy_errors: session.entropy_errors + if(severity == nil, do: 1, else: 0),
        lowest_score: if(lower?, do: score, else: session.lowest_score),
        lowest_score_step: if(lower?, do: n, else: session.lowest_score_step),
        step_warnings: session.step_warnings + if(action == :warn, do: 1, else: 0),
        first_step_warning: first(session.first_step_warning, action == :warn, mark),
        step_blocks: session.step_blocks + if(action == :block, do: 1, else: 0),
        first_step_block: first(session.first_step_block, action == :block, mark),
        first_suspect: first(session.first_suspect, verdict == :suspect, mark),
        first_verdict_loop: first(session.first_verdict_loop, verdict == :loop, mark),
        verdict_loops: session.verdict_loops + if(verdict == :loop, do: 1, else: 0)
    }
    |> first_loop_why(result.verdict)
  end

  # The rule, reason and evidence of the session's first verdict LOOP.
  defp first_loop_why(%{verdict_rule: nil} = session, %{verdict: :loop} = verdict),
    do: %{
      session
      | verdict_rule: verdict.rule,
        verdict_reason: verdict.reason,
        verdict_evidence: verdict.evidence
    }

  defp first_loop_why(session, _verdict), do: session

  # The first step something happened at, once it has.
  defp first(nil, true, {n, result, name, line_no}) do
    %{step: n, step_id: result.step_id, source: name, line: line_no, score: result.entropy_score}
  end

  defp first(mark, _happened?, _step), do: mark

  defp finish_state(state) do
    sessions = for {_id, session} <- :ets.tab2list(state.sessions), do: session
    :ets.delete(state.sessions)
    %{state | sessions: sessions}
  end

  ## Bad lines: all counted, the first max kept

  defp new_bad(max), do: %{count: 0, kept: [], max: max}

  defp add_bad(%{count: count, max: max} = bad, name, line_no, reason) when count < max,
    do: %{
      bad
      | count: count + 1,
        kept: [%{source: name, line: line_no, reason: reason} | bad.kept]
    }

  defp add_bad(bad, _name, _line_no, _reason), do: %{bad | count: bad.count + 1}

  ## The report

  defp report(names, reader, states, max_bad, elapsed_us) do
    sessions =
      states
      |> Enum.flat_map(& &1.sessions)
      |> Enum.sort_by(fn s -> {rank(s), source_index(names, s.first_seen), s.first_seen} end)
      |> Enum.map(&Map.delete(&1, :first_seen))

    bads = [reader.bad | Enum.map(states, & &1.bad)]

    bad =
      bads
      |> Enum.flat_map(& &1.kept)
      |> Enum.sort_by(&{Enum.find_index(names, fn n -> n == &1.source end), &1.line})
      |> Enum.take(max_bad)

    steps = states |> Enum.map(& &1.steps) |> Enum.sum()
    replayed = states |> Enum.map(& &1.replayed) |> Enum.sum()
    bad_count = bads |> Enum.map(& &1.count) |> Enum.sum()
    settings = settings()

    {alarmed, alarms} =
      case settings.alert_source do
        :entropy -> {& &1.first_loop, & &1.alerts}
        :verdict -> {& &1.first_verdict_loop, & &1.verdict_loops}
      end

    %{
      sources: names,
      settings: settings,
      lines: reader.lines,
      steps: steps,
      bad_lines: bad_count,
      bad: bad,
      input_errors: Enum.reverse(reader.errors),
      sessions: sessions,
      would_trip: if(reader.would_trip.requests > 0, do: WouldTrip.report(reader.would_trip)),
      summary: %{
        sessions: length(sessions),
        steps: steps,
        replayed_steps: replayed,
        sessions_warning: Enum.count(sessions, & &1.first_warning),
        sessions_loop: Enum.count(sessions, & &1.first_loop),
        alerts: sessions |> Enum.map(& &1.alerts) |> Enum.sum(),
        sessions_step_warning: Enum.count(sessions, & &1.first_step_warning),
        sessions_step_block: Enum.count(sessions, & &1.first_step_block),
        sessions_verdict_suspect: Enum.count(sessions, & &1.first_suspect),
        sessions_verdict_loop: Enum.count(sessions, & &1.first_verdict_loop),
        verdict_loops: sessions |> Enum.map(& &1.verdict_loops) |> Enum.sum(),
        alert_source: settings.alert_source,
        sessions_alarmed: Enum.count(sessions, alarmed),
        alarms: sessions |> Enum.map(alarms) |> Enum.sum(),
        bad_lines: bad_count
      },
      elapsed_us: elapsed_us
    }
  end

  # LOOP first, then WARNING, then the rest; in order of first appearance within each.
  defp rank(%{first_loop: %{}}), do: 0
  defp rank(%{first_warning: %{}}), do: 1
  defp rank(_session), do: 2

  defp source_index(names, {name, _line}), do: Enum.find_index(names, &(&1 == name))
end
