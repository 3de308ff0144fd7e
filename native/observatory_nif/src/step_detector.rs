//! NIFs behind `Observatory.Gateway.StepDetector` and `Observatory.Gateway.CallBreaker`.

use std::num::NonZeroUsize;

use observatory_core::call_circuit_breaker::{CallCircuitBreaker, Config, Decision};
use observatory_core::keyed_store::KeyedStore;
use observatory_core::stable_json::Digest;
use observatory_core::step_loop_detector::{Action, Cell, StepLoopDetector, Thresholds, Verdict};
use parking_lot::Mutex;
use rustler::{Atom, Binary, Encoder, Env, NifResult, ResourceArc, Term};

use crate::atoms;
use crate::error::to_nif;

/// One `StepLoopDetector` per session.
pub struct StepStore(pub(crate) KeyedStore<StepLoopDetector>);

#[rustler::resource_impl]
impl rustler::Resource for StepStore {}

/// One breaker for the gateway; keys are `(session, tool, args hash)`.
pub struct Breaker(Mutex<CallCircuitBreaker>);

#[rustler::resource_impl]
impl rustler::Resource for Breaker {}

#[rustler::nif]
fn step_store_new(env: Env<'_>, shards: usize, max_sessions: usize) -> Term<'_> {
    ResourceArc::new(StepStore(KeyedStore::new(shards, max_sessions))).encode(env)
}

/// `{cell, stagnation_streak, stuck_streak, action, guidance | nil}`.
#[rustler::nif]
fn step_analyze<'a>(
    env: Env<'a>,
    store: ResourceArc<StepStore>,
    session_id: &str,
    approach: Binary<'a>,
    outcome: Binary<'a>,
    thresholds: (u32, u32, u32, u32),
    history: usize,
) -> NifResult<Term<'a>> {
    let thresholds = Thresholds {
        stagnation_warn: thresholds.0,
        stagnation_block: thresholds.1,
        stuck_warn: thresholds.2,
        stuck_block: thresholds.3,
    };
    thresholds.validate().map_err(to_nif)?;
    let (approach, outcome) = (digest(approach)?, digest(outcome)?);
    Ok(analyze(
        env, &store, session_id, approach, outcome, thresholds, history,
    ))
}

/// Classifies one step (`thresholds` validated) and encodes what `step_analyze` returns.
pub(crate) fn analyze<'a>(
    env: Env<'a>,
    store: &StepStore,
    session_id: &str,
    approach: Digest,
    outcome: Digest,
    thresholds: Thresholds,
    history: usize,
) -> Term<'a> {
    let verdict = store.0.update(
        session_id,
        || new_detector(thresholds, history),
        |detector| analyze_in(detector, approach, outcome, thresholds),
    );
    analyzed_term(env, &verdict)
}

/// A session's detector, as its first step makes it (`thresholds` validated).
pub(crate) fn new_detector(thresholds: Thresholds, history: usize) -> StepLoopDetector {
    let history = NonZeroUsize::new(history.clamp(1, 1024)).expect("clamped to at least 1");
    StepLoopDetector::with_history(thresholds, history).expect("validated by the caller")
}

/// Classifies one step with the thresholds read for it (`thresholds` validated).
pub(crate) fn analyze_in(
    detector: &mut StepLoopDetector,
    approach: Digest,
    outcome: Digest,
    thresholds: Thresholds,
) -> Verdict {
    if detector.thresholds() != thresholds {
        detector
            .set_thresholds(thresholds)
            .expect("validated by the caller");
    }
    detector.analyze(approach, outcome)
}

/// What `step_analyze` returns for a step's verdict.
pub(crate) fn analyzed_term<'a>(env: Env<'a>, verdict: &Verdict) -> Term<'a> {
    let (action, guidance) = match &verdict.action {
        Action::Continue => (atoms::continue_(), None),
        Action::Warn { guidance } => (atoms::warn(), Some(guidance.as_str())),
        Action::Block { guidance } => (atoms::block(), Some(guidance.as_str())),
    };
    (
        cell_atom(verdict.cell),
        verdict.stagnation_streak,
        verdict.stuck_streak,
        action,
        guidance,
    )
        .encode(env)
}

/// `{{stagnation_warn, stagnation_block, stuck_warn, stuck_block}, history}` packed as
/// `score_step` takes it ([`Thresholds::pack`]; the caller packs once per change of
/// the configuration), or nil when they are not valid thresholds: `score_step` then
/// answers `{:error, :invalid_step_thresholds}`, as it did for the tuple.
#[rustler::nif]
fn step_settings_pack<'a>(env: Env<'a>, settings: Term<'a>) -> Term<'a> {
    let packed = settings
        .decode::<((u32, u32, u32, u32), u64)>()
        .ok()
        .and_then(
            |((stagnation_warn, stagnation_block, stuck_warn, stuck_block), history)| {
                let thresholds = Thresholds {
                    stagnation_warn,
                    stagnation_block,
                    stuck_warn,
                    stuck_block,
                };
                thresholds.validate().ok()?;
                Some(thresholds.pack(history))
            },
        );
    match packed {
        Some(bytes) => crate::json::binary(env, &bytes),
        None => rustler::types::atom::nil().encode(env),
    }
}

/// `{stagnation_streak, stuck_streak, blocked}` or `nil`.
#[rustler::nif]
fn step_state(store: ResourceArc<StepStore>, session_id: &str) -> Option<(u32, u32, bool)> {
    store.0.read(session_id, |d| {
        (d.stagnation_streak(), d.stuck_streak(), d.is_blocked())
    })
}

/// Sessions with a streak or a block: `[{session_id, stagnation, stuck, blocked}]`.
#[rustler::nif(schedule = "DirtyCpu")]
fn step_list(store: ResourceArc<StepStore>, limit: usize) -> Vec<(String, u32, u32, bool)> {
    store
        .0
        .collect(limit, |d| {
            let state = (d.stagnation_streak(), d.stuck_streak(), d.is_blocked());
            (state != (0, 0, false)).then_some(state)
        })
        .into_iter()
        .map(|(id, (stagnation, stuck, blocked))| (id, stagnation, stuck, blocked))
        .collect()
}

#[rustler::nif]
fn step_reset(store: ResourceArc<StepStore>, session_id: &str) -> bool {
    store.0.read(session_id, |_| ()).is_some() && {
        store
            .0
            .update(session_id, || unreachable!(), StepLoopDetector::reset);
        true
    }
}

#[rustler::nif(schedule = "DirtyCpu")]
fn step_sweep(store: ResourceArc<StepStore>, now_ms: i64, ttl_ms: u64) -> usize {
    store.0.sweep(now_ms, ttl_ms)
}

#[rustler::nif]
fn breaker_new(
    env: Env<'_>,
    max_calls: u32,
    window_ms: u64,
    max_keys: usize,
) -> NifResult<Term<'_>> {
    let breaker = CallCircuitBreaker::new(Config {
        max_calls,
        window_ms,
        max_keys,
    })
    .map_err(to_nif)?;
    Ok(ResourceArc::new(Breaker(Mutex::new(breaker))).encode(env))
}

/// `{:allow, count}` or `{:deny, count, retry_after_ms}`.
#[rustler::nif]
fn breaker_check<'a>(
    env: Env<'a>,
    breaker: ResourceArc<Breaker>,
    session_id: &str,
    tool: &str,
    args_hash: Binary<'a>,
    now_ms: u64,
) -> NifResult<Term<'a>> {
    // The session is part of the key: one agent's runaway loop never throttles another.
    let key = format!("{session_id}\u{0}{tool}");
    let decision = breaker.0.lock().check(&key, digest(args_hash)?, now_ms);
    Ok(match decision {
        Decision::Allow { count } => (atoms::allow(), count).encode(env),
        Decision::Deny {
            count,
            retry_after_ms,
        } => (atoms::deny(), count, retry_after_ms).encode(env),
    })
}

#[rustler::nif(schedule = "DirtyCpu")]
fn breaker_prune(breaker: ResourceArc<Breaker>, now_ms: u64) -> usize {
    breaker.0.lock().prune(now_ms)
}

fn digest(bytes: Binary) -> NifResult<Digest> {
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| rustler::Error::BadArg)
}

fn cell_atom(cell: Cell) -> Atom {
    match cell {
        Cell::FullProgress => atoms::full_progress(),
        Cell::WorldChanged => atoms::world_changed(),
        Cell::Stuck => atoms::stuck(),
        Cell::FullStagnation => atoms::full_stagnation(),
    }
}
