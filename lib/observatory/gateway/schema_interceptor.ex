defmodule Observatory.Gateway.SchemaInterceptor do
  @moduledoc """
  The gateway's ingest path for one DecisionLog (ADR-015, FR-9.8, FR-9.9):

    1. validate the envelope (`Observatory.Gateway.DecisionLog`); an invalid message is
       rejected with every violation, logged as a `schema_violation`, and never reaches
       the tracker;
    2. call `EntropyTracker.record_and_score/3` synchronously, in the caller's process;
    3. overwrite `cognition.entropy_score` with the gateway's score (the agent's value
       is kept nowhere in the outbound message); if the tracker returns an error, keep
       the agent's value and log a `schema_violation` noting the failed computation;
    4. judge the step with `Observatory.Gateway.LoopVerdict` (issue 8), also in the
       caller's process;
    5. store the envelope (`SessionLog`) and broadcast it on `"gateway:decision_logs"`;
    6. feed the step detector (seed 002) when the step has a result;
    7. answer with the score, the severity, the loop verdict, the step verdict and the
       directives for the agent — `pause` when an operator has paused the session
       (design.md §5), `stop` when the agent is inactive (the kill switch or an
       operator deactivated it: its steps are still kept), `warn` or `block` with
       guidance from the step detector.

  Steps 2, 4 and 6 are scored by one NIF call, in the caller's process (the entropy
  window, the verdict's history and the step detector's streaks each in its own
  store); their results are then acted on in the order above, as
  `EntropyTracker.record_and_score/3`, `LoopVerdict.observe/4` and
  `StepDetector.analyze/3` act on them.

  Before step 2, on the session's owner, one check makes ingest idempotent
  (`Observatory.Gateway.Idempotency`): a step (session and `meta.step_id`) already
  answered with the same body is answered again — the first answer, `replayed: true`
  — and steps 2–6 do not run for it: nothing is counted, stored or broadcast twice.
  Its `pause` and `stop` directives say the session's and the agent's state now, not
  then: a retry is the agent asking what to do next. The same step id with a
  different body is refused.

  Who raises `EntropyAlertEvent`s and topology states is `config :observatory,
  :alert_source`: the tracker itself with `:entropy` (FRD-009, the default), or
  `Observatory.Gateway.AlertSource` from the verdict with `:verdict` (the tracker then
  scores without broadcasting). Either way the answer carries both signals.

      {:ok, result} = SchemaInterceptor.ingest(json)
      result.entropy_score  #=> 0.2
      result.verdict        #=> %{verdict: :loop, rule: :repeat, reason: "…", evidence: [3, 4, 5], …}
      result.directives     #=> [%{"type" => "pause", ...}] when paused
  """

  require Logger

  alias Observatory.Gateway.{
    AlertSource,
    DecisionLog,
    EntropyTracker,
    Events,
    HITL,
    Idempotency,
    LoopVerdict,
    SessionLog,
    SessionOwners,
    StepDetector,
    StepScore
  }

  alias Observatory.{Cluster, KillSwitch, Metrics}

  @type result :: %{
          step_id: String.t(),
          session_id: String.t(),
          agent_id: String.t(),
          entropy_score: number() | nil,
          severity: EntropyTracker.severity() | nil,
          paused: boolean(),
          verdict: LoopVerdict.verdict() | nil,
          step: StepDetector.verdict() | nil,
          directives: [map()],
          envelope: map() | nil,
          replayed: boolean()
        }

  @doc """
  Ingests one envelope, given as JSON text or as a map.

  Returns `{:ok, result}` or `{:error, {:invalid, violations}}`. A step delivered
  again (same session, `meta.step_id` and body) gets the first delivery's result with
  `replayed: true` and is not counted again; under a step id already used for another
  body it gets `{:error, {:conflict, violation}}`, and while its first delivery is
  still being scored `{:error, {:in_progress, violation}}` (retry it).

  ## Options
    * `:tracker` — the `EntropyTracker` to score with (default: the application's).
    * `:log_violations` — log a rejected message as a `schema_violation` (default
      `true`); a batch caller that logs a capped summary itself turns it off.
    * `:agent` — the authenticated agent sending it: its `meta.agent_id` must be this
      agent, and its session must not be owned by another agent
      (`Observatory.Gateway.SessionOwners`); otherwise `{:error, {:forbidden,
      violation}}` and nothing is touched. Unset (in-process callers, `:any_agent`):
      no check, but a new session is still claimed for the envelope's agent.
    * `:envelope` — `false`: the result's `envelope` is nil, and the envelope's term is
      never built unless a subscriber of `"gateway:decision_logs"` needs it (the
      session log keeps the JSON text and decodes it when read). For a caller that
      does not read `result.envelope` (the HTTP API, a replay) it saves about a third
      of the parse. Default `true`.

  ## In a cluster (issue 14)

  The envelope is validated where it arrives, then scored on the session's owner
  (`Observatory.Cluster.owner/1`) with `:erpc.call/5`; the caller waits, as it waits
  for a local score, and gets the owner's answer. When the owner is down, the next
  owner scores the step in a fresh window. When it is connected but does not answer
  within `:rpc_timeout_ms`, the answer is `{:error, {:unavailable, violation}}` and
  no other node scores the step (the owner may have): the caller retries it.
  """
  @spec ingest(term(), keyword()) ::
          {:ok, result()}
          | {:error,
             {:invalid, [DecisionLog.violation()]}
             | {:forbidden, DecisionLog.violation()}
             | {:conflict, DecisionLog.violation()}
             | {:in_progress, DecisionLog.violation()}
             | {:unavailable, DecisionLog.violation()}}
  def ingest(message, opts \\ []) do
    Observatory.Storage.require!()
    started = :erlang.monotonic_time()
    # The caller's options, read once for the step (`step_opts/2`), and each setting
    # once and handed down (the PubSub server: here when the parse needs it, else by
    # the broadcast).
    step_opts = step_opts(opts, started)
    pubsub = if step_opts.envelope?, do: nil, else: Events.pubsub()

    parsed =
      with {:ok, json} <- json(message),
           {:ok, envelope, fields} <-
             DecisionLog.parse(json, envelope: build_envelope?(pubsub)),
           do: {:ok, {json, envelope}, fields}

    result =
      case parsed do
        {:ok, step, fields} ->
          score_on_owner(step, fields, opts, step_opts, pubsub, [])

        {:error, violations} ->
          reject(violations, Keyword.get(opts, :log_violations, true))
      end

    elapsed = :erlang.monotonic_time() - started
    Metrics.observe_latency(:erlang.convert_time_unit(elapsed, :native, :microsecond))
    emit_ingest(result, elapsed)
    result
  end

  # The monotonic clock in milliseconds, from a native reading: as
  # `:erlang.convert_time_unit(native, :native, :millisecond)`, rounded down (the clock
  # may be negative), without its product past 60 bits (a bignum, ~35 ns of its ~70).
  # The native units per millisecond are fixed while the VM runs: worked out once. A
  # native unit that is not a whole number of them (no known OS) is converted as before.
  @clock_key __MODULE__.NativePerMs

  @doc false
  def native_to_ms(native) do
    case :persistent_term.get(@clock_key, nil) do
      per_ms when is_integer(per_ms) -> floor_div(native, per_ms)
      :inexact -> :erlang.convert_time_unit(native, :native, :millisecond)
      nil -> native_per_ms() && native_to_ms(native)
    end
  end

  defp native_per_ms do
    per_second = :erlang.convert_time_unit(1, :second, :native)
    per_ms = if rem(per_second, 1_000) == 0, do: div(per_second, 1_000), else: :inexact
    :persistent_term.put(@clock_key, per_ms)
    per_ms
  end

  defp floor_div(a, b) when a >= 0, do: div(a, b)
  defp floor_div(a, b), do: div(a - b + 1, b)

  # The envelope's term is built in the parse when the caller wants it, or when a
  # host's PubSub server is configured: whether anyone follows "gateway:decision_logs"
  # cannot be known there, so its broadcast always carries the term.
  defp build_envelope?(nil), do: true
  defp build_envelope?(pubsub), do: not Events.own?(pubsub)

  # What the step needs of the caller's options, read once: the authenticated agent,
  # the caller's own tracker (nil: the application's, on the session's owner),
  # whether it reads `result.envelope` (`envelope:`, default true; nil is false), and
  # `now_ms`, this node's monotonic clock when the step arrived (nil: read it when
  # needed; a step scored on another node reads that node's clock).
  defp step_opts(opts, started) do
    %{
      agent: Keyword.get(opts, :agent, nil),
      tracker: Keyword.get(opts, :tracker, nil),
      envelope?: Keyword.get(opts, :envelope, true),
      now_ms: started && native_to_ms(started)
    }
  end

  defp json(message) when is_binary(message), do: {:ok, message}
  defp json(message), do: DecisionLog.to_json(message)

  # Issue 14: a session's state lives on one node of the cluster, its owner. A step
  # that arrives elsewhere is scored there, synchronously, and answered here as the
  # owner answered it. With clustering off `Cluster.owner/2` is `node()` after one
  # :persistent_term read. A caller's own `:tracker` is a local process: scored here.
  # `step` is `{json, envelope}`: the envelope's JSON text, and its term unless the
  # caller asked for none (`envelope: false`).
  # `pubsub` is the step's PubSub setting if read already (nil: not yet); the owner
  # reads its own.
  defp score_on_owner(step, fields, opts, step_opts, pubsub, down) do
    owner =
      if step_opts.tracker,
        do: node(),
        else: Cluster.owner(fields.session_id, down)

    if owner == node() do
      score_local(step, fields, step_opts, pubsub)
    else
      # At most once: an owner that gets the step after the caller gave up (a node
      # frozen, then thawed) refuses it (Observatory.Cluster.remote/4).
      case Cluster.remote(owner, __MODULE__, :score_here, [step, fields, opts]) do
        {:ok, result} ->
          result

        # The owner is gone (distribution says so): the next owner scores the step,
        # in a fresh window (F1). Nothing was scored on the lost node.
        {:error, :noconnection} ->
          score_on_owner(step, fields, opts, step_opts, pubsub, [owner | down])

        # The owner is there but did not answer in time: it may have scored the step,
        # so another node must not score it again. The caller gets an error to retry.
        {:error, _timeout_or_late} ->
          Metrics.inc(:violations)

          {:error,
           {:unavailable,
            %{
              path: "meta.session_id",
              reason:
                "the session's owner #{owner} did not answer within " <>
                  "#{Cluster.rpc_timeout()} ms; retry the step"
            }}}
      end
    end
  end

  @doc false
  # Runs on the session's owner when it is another node (`score_on_owner/6`, over
  # :erpc): the owner reads the caller's options, its own clock and its own PubSub
  # setting (`pubsub` nil).
  def score_here(step, fields, opts, pubsub \\ nil),
    do: score_local(step, fields, step_opts(opts, nil), pubsub)

  defp score_local(step, fields, step_opts, pubsub) do
    with :ok <- authorize(fields, step_opts.agent, step_opts),
         do: once(step, fields, step_opts, pubsub)
  end

  # A step is scored once; its retries get the first answer (Idempotency).
  defp once({_json, envelope} = step, fields, step_opts, pubsub) do
    case Idempotency.claim(fields, step_opts.now_ms) do
      {:new, ticket} ->
        result =
          try do
            accept(step, fields, step_opts, pubsub || Events.pubsub())
          catch
            kind, reason ->
              Idempotency.release(ticket)
              :erlang.raise(kind, reason, __STACKTRACE__)
          end

        complete_kept(ticket, kept(result))
        {:ok, result}

      {:replay, kept} ->
        {:ok, replay(unkept(kept), if(step_opts.envelope?, do: envelope), fields)}

      {:error, _refusal} = error ->
        error
    end
  end

  # What a retry is answered from: the score, the severity, the verdict and the step
  # detector's verdict; the rest is its own (ids, envelope) or current (the pause).
  # Kept as tuples of values (the two verdicts' too, when they have their usual
  # keys): the store encodes no key names, about half the bytes to write and keep.
  @doc false
  def kept(result),
    do: {result.entropy_score, result.severity, pack(result.verdict), pack(result.step)}

  defp unkept({score, severity, verdict, step}),
    do: %{entropy_score: score, severity: severity, verdict: unpack(verdict), step: unpack(step)}

  # An answer completed as a map (`Idempotency.complete/2` takes any term).
  defp unkept(%{} = first), do: first

  defp pack(%{verdict: v, previous: p, rule: r, reason: why, evidence: e, step_number: n} = m)
       when map_size(m) == 6,
       do: {:loop_verdict, v, p, r, why, e, n}

  defp pack(%{cell: c, stagnation_streak: ss, stuck_streak: st, action: a, guidance: g} = m)
       when map_size(m) == 5,
       do: {:step_verdict, c, ss, st, a, g}

  # nil, or a verdict of another shape: kept as it is.
  defp pack(other), do: other

  @doc false
  # A kept answer whose shape bounds its size is stored without being measured (also
  # what bench/ingest_breakdown.exs times as the ingest's complete).
  def complete_kept(ticket, kept) do
    if kept_bounded?(kept),
      do: Idempotency.complete_bounded(ticket, kept),
      else: Idempotency.complete(ticket, kept)
  end

  # Each part of a kept answer that can grow, capped: the two texts (a verdict's
  # reason, the step detector's guidance: sentences of the Rust core, under 300
  # bytes), the evidence (at most 16 step numbers, `MAX_EVIDENCE` of
  # observatory_core::loop_verdict) and the integers (u32 in the core: step numbers
  # and streaks). Atoms are at most 255 characters. The largest answer these let
  # through is ~8.4 KB in the external format, under the complete NIF's bound
  # (`Idempotency.encoded_in_nif_max_bytes/0`; its test builds it).
  @kept_text_max_bytes 1_024
  @kept_evidence_max 16

  defguardp kept_text(t) when t == nil or (is_binary(t) and byte_size(t) <= @kept_text_max_bytes)
  defguardp kept_int(n) when is_integer(n) and n >= 0 and n <= 0xFFFF_FFFF

  @doc false
  # Whether `kept`'s size is bounded by its shape (the ingest's kept answer with its
  # usual parts, each within its cap); any other answer is measured first.
  def kept_bounded?({score, severity, verdict, step})
      when (is_float(score) or score == nil) and is_atom(severity),
      do: kept_verdict_bounded?(verdict) and kept_step_bounded?(step)

  def kept_bounded?(_other), do: false

  defp kept_verdict_bounded?(nil), do: true

  defp kept_verdict_bounded?({:loop_verdict, v, p, r, why, e, n})
       when is_atom(v) and is_atom(p) and is_atom(r) and is_binary(why) and kept_text(why) and
              kept_int(n),
       do: kept_evidence_bounded?(e, @kept_evidence_max)

  defp kept_verdict_bounded?(_other), do: false

  defp kept_evidence_bounded?([], _left), do: true

  defp kept_evidence_bounded?([n | rest], left) when left > 0 and kept_int(n),
    do: kept_evidence_bounded?(rest, left - 1)

  defp kept_evidence_bounded?(_other, _left), do: false

  defp kept_step_bounded?(nil), do: true

  defp kept_step_bounded?({:step_verdict, c, ss, st, a, g})
       when is_atom(c) and kept_int(ss) and kept_int(st) and is_atom(a) and kept_text(g),
       do: true

  defp kept_step_bounded?(_other), do: false

  defp unpack({:loop_verdict, v, p, r, why, e, n}),
    do: %{verdict: v, previous: p, rule: r, reason: why, evidence: e, step_number: n}

  defp unpack({:step_verdict, c, ss, st, a, g}),
    do: %{cell: c, stagnation_streak: ss, stuck_streak: st, action: a, guidance: g}

  defp unpack(other), do: other

  # The first answer again, with the session's pause as it is now.
  defp replay(first, envelope, fields) do
    pause = HITL.pause_of(fields.session_id)

    envelope =
      if first.severity && envelope,
        do: DecisionLog.with_score(envelope, first.entropy_score),
        else: envelope

    Map.merge(first, %{
      step_id: fields.step_id,
      session_id: fields.session_id,
      agent_id: fields.agent_id,
      paused: pause != nil,
      directives: directives(pause, KillSwitch.active?(fields.agent_id), fields, first.step),
      envelope: envelope,
      replayed: true
    })
  end

  # An agent acts only as itself, and only in its own sessions: the first agent to
  # write a session owns it (SessionOwners), whatever the detectors evicted since.
  # A trusted caller (in-process, a shared key) is not checked, but the session
  # it writes is still claimed for the envelope's agent.
  defp authorize(fields, agent, step_opts) when agent in [nil, :any_agent] do
    _ = claim(fields, step_opts)
    :ok
  end

  defp authorize(%{agent_id: agent} = fields, agent, step_opts) when is_binary(agent) do
    case claim(fields, step_opts) do
      :ok ->
        :ok

      :owned_by_other ->
        forbidden(%{path: "meta.session_id", reason: "is a session of another agent"})
    end
  end

  defp authorize(_fields, agent, _step_opts) do
    forbidden(%{path: "meta.agent_id", reason: "is not #{inspect(agent)}, the agent of this key"})
  end

  # Past its quota the agent gives up its own least recently used sessions: their
  # windows go too, so one agent cannot crowd the others out of the stores.
  defp claim(%{session_id: session_id, agent_id: agent_id}, step_opts) do
    claimed =
      case step_opts.now_ms do
        nil -> SessionOwners.claim(session_id, agent_id)
        now_ms -> SessionOwners.claim(session_id, agent_id, now_ms)
      end

    case claimed do
      {:ok, []} ->
        :ok

      {:ok, released} ->
        for id <- released do
          EntropyTracker.forget(id, tracker: tracker(step_opts))
          LoopVerdict.forget(id)
        end

        :ok

      {:error, {:owned_by, _other}} ->
        :owned_by_other
    end
  end

  defp forbidden(violation) do
    Metrics.inc(:violations)
    {:error, {:forbidden, violation}}
  end

  defp tracker(%{tracker: nil}), do: EntropyTracker
  defp tracker(%{tracker: tracker}), do: tracker

  defp accept({json, envelope}, fields, step_opts, pubsub) do
    alert_source = AlertSource.current()
    tracker = tracker(step_opts)
    alerts? = alert_source == :entropy

    # The entropy window, the loop verdict and the step detector in one NIF call
    # (StepScore); each answer is then acted on as its own module acts on it, in the
    # order the stages ran apart: entropy alerts, the verdict, its alert, the step.
    # It reads FR-9.11's three settings for the step (the verdict's entropy rule looks
    # at the same window).
    {recorded, observed, analysed, step_thresholds} = StepScore.score(fields, tracker, alerts?)

    {score, severity} =
      case EntropyTracker.settle(recorded, fields.session_id, fields.agent_id, alerts?) do
        {:ok, score, severity} ->
          {score, severity}

        {:error, reason} ->
          Logger.warning(
            "schema_violation: entropy computation failed for session #{inspect(fields.session_id)} " <>
              "step #{inspect(fields.step_id)}: #{inspect(reason)}; the agent's entropy_score is kept",
            event: :schema_violation
          )

          {agent_score(envelope, json), nil}
      end

    # The gateway's score only: after a tracker error `score` is the agent's own.
    gateway_score = if severity, do: score
    envelope = envelope && DecisionLog.with_score(envelope, gateway_score)

    verdict = judge(fields, observed)
    # The step, its severity and its verdict counted at once (one read of the array).
    Metrics.inc(:messages, severity_counter(severity), verdict_counter(verdict))

    if alert_source == :verdict and verdict != nil do
      AlertSource.act(fields.session_id, fields.agent_id, verdict, gateway_score, tracker: tracker)
    end

    step = analyze_step(analysed, fields.session_id, step_thresholds)
    count_step_action(step)
    pause = HITL.pause_of(fields.session_id)
    active? = KillSwitch.active?(fields.agent_id)
    # Stored as its text, under the verdict's step number, which its evidence names,
    # received when the step arrived (the clock read once a step).
    SessionLog.put_json(
      fields.session_id,
      json,
      gateway_score,
      verdict && verdict.step_number,
      step_opts.now_ms
    )

    # The envelope's term is made for a subscriber only when there is one.
    Events.broadcast_lazy(
      Events.decision_logs(),
      fn ->
        %{
          event_type: "decision_log",
          session_id: fields.session_id,
          agent_id: fields.agent_id,
          step_id: fields.step_id,
          severity: severity,
          verdict: verdict && verdict.verdict,
          envelope: envelope || DecisionLog.decode(json, gateway_score)
        }
      end,
      pubsub
    )

    %{
      step_id: fields.step_id,
      session_id: fields.session_id,
      agent_id: fields.agent_id,
      entropy_score: score,
      severity: severity,
      paused: pause != nil,
      verdict: verdict,
      step: step,
      directives: directives(pause, active?, fields, step),
      envelope: if(step_opts.envelope?, do: envelope),
      replayed: false
    }
  end

  # The agent's own `cognition.entropy_score` (kept when the tracker failed).
  defp agent_score(nil, json),
    do: get_in(DecisionLog.decode(json, nil), ["cognition", "entropy_score"])

  defp agent_score(envelope, _json), do: get_in(envelope, ["cognition", "entropy_score"])

  # Issue 8: every valid step gets a verdict, result or not.
  defp judge(fields, observed) do
    case LoopVerdict.settle(observed, fields.session_id, fields.agent_id, fields.step_id) do
      {:ok, verdict} ->
        verdict

      {:error, reason} ->
        Logger.warning(
          "loop verdict failed for session #{inspect(fields.session_id)} " <>
            "step #{inspect(fields.step_id)}: #{inspect(reason)}"
        )

        nil
    end
  end

  # The counters of a step's severity (nil: the tracker failed) and verdict (nil: the
  # verdict failed).
  defp severity_counter(nil), do: :entropy_errors
  defp severity_counter(severity), do: severity

  defp verdict_counter(%{verdict: :progress}), do: :verdict_progress
  defp verdict_counter(%{verdict: :suspect}), do: :verdict_suspect
  defp verdict_counter(%{verdict: :loop}), do: :verdict_loop
  defp verdict_counter(nil), do: :verdict_errors

  # Layer 1 of seed 002; a step without a result has no outcome and is not analysed.
  defp analyze_step(nil, _session_id, _thresholds), do: nil

  defp analyze_step(analysed, session_id, thresholds) do
    case StepDetector.settle(analysed, session_id, thresholds) do
      {:ok, verdict} -> verdict
      {:error, _} -> nil
    end
  end

  # What the agent is told to do, in this order: pause (an operator paused the
  # session), stop (its agent is inactive), warn or block (the step detector). A step
  # with none of them — nearly every step — builds no list.
  defp directives(nil, true, _fields, nil), do: []
  defp directives(nil, true, _fields, %{action: :continue}), do: []

  defp directives(pause, active?, fields, step),
    do: pause_directives(pause) ++ stop_directives(active?, fields) ++ step_directives(step)

  defp step_directives(%{action: action} = step) when action in [:warn, :block],
    do: [
      %{
        "type" => Atom.to_string(action),
        "source" => "step_detector",
        "guidance" => step.guidance
      }
    ]

  defp step_directives(_), do: []

  defp count_step_action(%{action: :warn}), do: Metrics.inc(:step_warnings)
  defp count_step_action(%{action: :block}), do: Metrics.inc(:step_blocks)
  defp count_step_action(_), do: :ok

  defp reject(violations, log?) do
    Metrics.inc(:violations)

    if log? do
      Logger.warning(
        "schema_violation: DecisionLog rejected: " <>
          Enum.map_join(Enum.take(violations, 20), "; ", &"#{&1.path} #{&1.reason}"),
        event: :schema_violation
      )
    end

    {:error, {:invalid, violations}}
  end

  # An inactive agent (the kill switch, or an operator, deactivated it) is told to stop
  # on every step it still sends; the step is kept, as a paused session's are.
  defp stop_directives(true = _active?, _fields), do: []

  defp stop_directives(false, %{agent_id: agent_id}) do
    [
      %{
        "type" => "stop",
        "code" => "agent_inactive",
        "message" => "Agent #{agent_id} is inactive; an operator activates it again"
      }
    ]
  end

  defp pause_directives(nil), do: []

  defp pause_directives(pause) do
    [
      %{
        "type" => "pause",
        "reason" => pause.reason,
        "operator" => pause.operator,
        "since" => DateTime.to_iso8601(pause.at)
      }
    ]
  end

  # The [:observatory, :ingest, :stop] telemetry event (Observatory.Telemetry); its
  # metadata is built only when events go somewhere.
  defp emit_ingest(result, duration) do
    case Observatory.Telemetry.dispatcher() do
      nil ->
        :ok

      dispatcher ->
        dispatcher.execute(
          [:observatory, :ingest, :stop],
          %{duration: duration},
          ingest_metadata(result)
        )

        :ok
    end
  end

  defp ingest_metadata({:ok, result}) do
    %{
      result: :ok,
      session_id: result.session_id,
      agent_id: result.agent_id,
      violations: 0,
      replayed: result.replayed
    }
  end

  # `result` is the error's kind (`:invalid`, or any other a refusal may name).
  defp ingest_metadata({:error, {kind, details}}) when is_atom(kind) do
    %{
      result: kind,
      session_id: nil,
      agent_id: nil,
      violations: if(is_list(details), do: length(details), else: 1),
      replayed: false
    }
  end
end
