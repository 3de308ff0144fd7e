//! The scoring of one ingested step in one NIF call: the entropy window, the loop
//! verdict and the step detector.
//!
//! Each keeps its own store, owned by its own Elixir process (they start, sweep and
//! restart apart, and each is read on its own by the dashboard); what one call saves
//! is the per-call cost the three paid apart: three NIF entries and argument
//! decodings, three result terms and the Elixir glue around each. The work is the
//! three calls' work, bounded as each was (a window ≤ 1024, a history ≤ 64): a
//! normal scheduler.
//!
//! Every part answers on its own, as its own NIF does (`entropy_record`,
//! `verdict_observe`, `step_analyze`): a part that fails — bad input, its store not
//! started — is `{:error, reason}` and the others still run.

use observatory_core::keyed_store::{key_hash, KeyedStore};
use observatory_core::loop_verdict::{EntropySignal, StepKeys, VerdictState};
use observatory_core::session_store::{Observation, Settings};
use observatory_core::severity::{Severity, Thresholds};
use observatory_core::stable_json::Digest;
use observatory_core::step_loop_detector::Thresholds as StepThresholds;
use rustler::{Binary, Encoder, Env, Term};

use crate::atoms;
use crate::entropy_tracker::{self, StoreResource};
use crate::error::reason;
use crate::loop_verdict::{self, VerdictStore};
use crate::step_detector::{self, StepStore};

/// The stores, borrowed for the call: the argument term holds them alive until it
/// returns, so no reference count is taken and given back (an atomic each, on a line
/// every scheduler scoring a step shares).
type Stores<'a> = (
    Option<&'a StoreResource>,
    Option<&'a VerdictStore>,
    Option<&'a StepStore>,
);

/// `{intent, tool_call, status, agent_id | nil, {window_size, loop, warning}, alerts}`:
/// the entropy tuple and FR-9.11's settings as the caller read them for this step;
/// `alerts` whether the tracker raises alerts (a LOOP with no agent then scores
/// nothing for the verdict, as `record_and_score` answers `:missing_agent_id`).
type EntropyArgs<'a> = (
    Binary<'a>,
    Binary<'a>,
    u8,
    Option<Binary<'a>>,
    (usize, f64, f64),
    bool,
);

/// Scores one step of `session_id`. `keys` as `verdict_observe` takes them;
/// `verdict_config` as `verdict_config_pack` packs it; `step` the step's `{approach,
/// outcome}` digests, or nil for a step without a result (not analysed);
/// `step_settings` as `step_settings_pack` packs it (nil: invalid thresholds).
///
/// Returns `{entropy, verdict, step}`: each what its own NIF returns, `{:error,
/// reason}` when that part failed, and `step` nil when not analysed.
#[rustler::nif]
#[allow(clippy::too_many_arguments)]
fn score_step<'a>(
    env: Env<'a>,
    stores: Stores<'a>,
    session_id: Binary<'a>,
    entropy: EntropyArgs<'a>,
    keys: Term<'a>,
    verdict_config: Term<'a>,
    step: Option<(Binary<'a>, Binary<'a>)>,
    step_settings: Term<'a>,
) -> Term<'a> {
    let (entropy_store, verdict_store, step_store) = stores;
    let id = std::str::from_utf8(session_id.as_slice()).ok();
    // Hashed once for the three stores (they hash a session id alike).
    let hash = key_hash(session_id.as_slice());

    // Each part's inputs checked first: a part that cannot run touches no store and
    // answers its error (the step detector's `Err(None)`: no step to analyse, nil).
    let verdict_in = match (verdict_store, id) {
        (None, _) => Err(atoms::not_started()),
        (_, None) => Err(atoms::invalid_session_id()),
        (Some(store), Some(id)) => verdict_inputs(keys, verdict_config)
            .map(|inputs| (&store.0, id, hash, VerdictState::new, inputs)),
    };
    let step_in = match (step, step_store, id) {
        (None, _, _) => Err(None),
        (Some(_), None, _) => Err(Some(atoms::not_started())),
        (Some(_), _, None) => Err(Some(atoms::invalid_session_id())),
        (Some((approach, outcome)), Some(store), Some(id)) => {
            match step_inputs(approach, outcome, step_settings) {
                Ok(inputs @ (_, _, thresholds, history)) => Ok((
                    &store.0,
                    id,
                    hash,
                    move || step_detector::new_detector(thresholds, history),
                    inputs,
                )),
                Err(atom) => Err(Some(atom)),
            }
        }
    };

    // The verdict's and the step detector's states are found first and the loads of
    // their histories started; the entropy window's work then overlaps those loads
    // instead of each part waiting for its own in turn. The parts still run in their
    // order (the verdict reads the entropy's severity), and each state is made as its
    // own NIF makes it. The stores' locks are taken in one order (verdict, step,
    // entropy), and no other call holds two.
    let (entropy_term, verdict_term, step_term) = in_slot(verdict_in, |verdict| {
        in_slot(step_in, |step| {
            if let Ok((state, _)) = &verdict {
                state.prefetch();
            }
            if let Ok((detector, _)) = &step {
                detector.prefetch();
            }
            let (entropy_term, signal) = match entropy_store {
                None => (error(env, atoms::not_started()), None),
                Some(store) => score_entropy(env, store, session_id.as_slice(), hash, &entropy),
            };
            let signal = signal.map(|severity| EntropySignal {
                severity,
                window: entropy.4 .0,
            });
            let verdict_term = match verdict {
                Ok((state, (keys, config))) => {
                    loop_verdict::observed_term(env, &state.observe(keys, signal, &config))
                }
                Err(atom) => error(env, atom),
            };
            let step_term = match step {
                Ok((detector, (approach, outcome, thresholds, _))) => {
                    let verdict =
                        step_detector::analyze_in(detector, approach, outcome, thresholds);
                    step_detector::analyzed_term(env, &verdict)
                }
                Err(None) => rustler::types::atom::nil().encode(env),
                Err(Some(atom)) => error(env, atom),
            };
            (entropy_term, verdict_term, step_term)
        })
    });

    (entropy_term, verdict_term, step_term).encode(env)
}

/// A store, the session's id and its hash (`key_hash`), the function that makes its
/// state when absent, and the part's inputs.
type Slot<'s, T, M, X> = (&'s KeyedStore<T>, &'s str, u64, M, X);

/// Runs `f` on the state of the slot's key in its store (made with the slot's function
/// if absent), under the store's lock, with the slot's inputs; or on the error.
fn in_slot<T, M: FnOnce() -> T, X, E, R>(
    slot: Result<Slot<'_, T, M, X>, E>,
    f: impl FnOnce(Result<(&mut T, X), E>) -> R,
) -> R {
    match slot {
        Ok((store, id, hash, make, inputs)) => {
            store.update_hashed(id, hash, make, |state| f(Ok((state, inputs))))
        }
        Err(e) => f(Err(e)),
    }
}

/// The entropy part's term, and the severity the verdict's entropy rule sees (none
/// when the step was not scored, or a LOOP with no agent to alert when alerts are on).
fn score_entropy<'a>(
    env: Env<'a>,
    store: &StoreResource,
    session_id: &[u8],
    hash: u64,
    args: &EntropyArgs<'a>,
) -> (Term<'a>, Option<Severity>) {
    let (intent, tool_call, status, agent_id, (window_size, loop_t, warning_t), alerts) = args;
    let thresholds = match Thresholds::new(*loop_t, *warning_t) {
        Ok(thresholds) => thresholds,
        Err(e) => return (error(env, reason(e)), None),
    };
    let settings = Settings {
        window_size: *window_size,
        thresholds,
    };
    let obs = Observation {
        session_id,
        intent: intent.as_slice(),
        tool_call: tool_call.as_slice(),
        status: *status,
        agent_id: agent_id.as_ref().map(Binary::as_slice),
    };
    match entropy_tracker::record(env, store, &obs, hash, &settings) {
        Ok((term, (Severity::Loop, false))) if *alerts => (term, None),
        Ok((term, (severity, _))) => (term, Some(severity)),
        Err(e) => (error(env, reason(e)), None),
    }
}

fn verdict_inputs(
    keys: Term<'_>,
    config: Term<'_>,
) -> Result<(StepKeys, observatory_core::loop_verdict::Config), rustler::Atom> {
    let keys = keys
        .decode::<Binary<'_>>()
        .ok()
        .and_then(|k| loop_verdict::keys_from_term(k).ok())
        .ok_or_else(atoms::invalid_verdict_keys)?;
    let config = config
        .decode::<Binary<'_>>()
        .ok()
        .and_then(|c| observatory_core::loop_verdict::Config::unpack(c.as_slice()))
        .ok_or_else(atoms::invalid_verdict_config)?;
    Ok((keys, config))
}

fn step_inputs(
    approach: Binary<'_>,
    outcome: Binary<'_>,
    settings: Term<'_>,
) -> Result<(Digest, Digest, StepThresholds, usize), rustler::Atom> {
    let digest = |b: Binary<'_>| -> Result<Digest, rustler::Atom> {
        b.as_slice()
            .try_into()
            .map_err(|_| atoms::invalid_step_digest())
    };
    let (approach, outcome) = (digest(approach)?, digest(outcome)?);
    let (thresholds, history) = settings
        .decode::<Binary<'_>>()
        .ok()
        .and_then(|b| StepThresholds::unpack(b.as_slice()))
        .ok_or_else(atoms::invalid_step_thresholds)?;
    Ok((
        approach,
        outcome,
        thresholds,
        usize::try_from(history).unwrap_or(usize::MAX),
    ))
}

fn error(env: Env<'_>, reason: rustler::Atom) -> Term<'_> {
    (atoms::error(), reason).encode(env)
}
