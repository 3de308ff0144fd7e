//! NIFs behind `Observatory.Gateway.Idempotency`: the steps answered recently.

use observatory_core::answered_steps::{AnsweredSteps, Claim, Fingerprint, Limits, StepId, Ticket};
use rustler::{Binary, Encoder, Env, LocalPid, NifResult, ResourceArc, Term};

use crate::{atoms, json};

/// The store; a pending step's claimant is the pid of the process scoring it.
pub struct StepsRef(AnsweredSteps<LocalPid>);

#[rustler::resource_impl]
impl rustler::Resource for StepsRef {}

#[rustler::nif]
fn answered_new(env: Env<'_>) -> Term<'_> {
    ResourceArc::new(StepsRef(AnsweredSteps::new())).encode(env)
}

/// Claims `{session, step, agent}` at `now_ms` (the VM's monotonic clock, in ms: the
/// one the sweep's `System.monotonic_time/1` reads; nil: read here, else as the caller
/// read it when the step arrived): `{:new, slot, seq}` (the ticket
/// for `answered_complete` or `answered_release`), `{:replay, answer}`, `:conflict`
/// or `:in_progress`. The caller is the claimant; a claim whose claimant has died is
/// taken over.
#[rustler::nif]
fn answered_claim<'a>(
    env: Env<'a>,
    store: ResourceArc<StepsRef>,
    step: (&str, &str, &str),
    fingerprint: Binary<'a>,
    limits: (i64, usize, usize, usize),
    now_ms: Option<i64>,
) -> NifResult<Term<'a>> {
    let fingerprint: Fingerprint = fingerprint
        .as_slice()
        .try_into()
        .map_err(|_| rustler::Error::BadArg)?;
    let limits = Limits {
        window_ms: limits.0,
        max_steps_per_session: limits.1,
        max_steps_per_agent: limits.2,
        max_steps: limits.3,
    };
    let (session, step, agent) = step;
    // SAFETY: a plain read of the VM's clock, callable from any scheduler thread.
    let now_ms = now_ms.unwrap_or_else(|| unsafe {
        rustler::sys::enif_monotonic_time(rustler::sys::ErlNifTimeUnit::ERL_NIF_MSEC)
    });
    let claim = store.0.claim(
        StepId {
            session,
            step,
            agent,
        },
        fingerprint,
        env.pid(),
        now_ms,
        limits,
        |pid| !env.is_process_alive(*pid),
    );
    Ok(match claim {
        Claim::New(Ticket { slot, seq }) => (atoms::new(), slot, seq).encode(env),
        Claim::Replay(answer) => (atoms::replay(), json::binary(env, &answer)).encode(env),
        Claim::Conflict => atoms::conflict().encode(env),
        Claim::InProgress => atoms::in_progress().encode(env),
    })
}

/// Stores the answer of the claim `slot`, `seq`, in the external term format (encoded
/// here: no binary made on the caller's heap to be copied once more); false if that
/// claim is no longer held. The caller sends only small answers this way
/// (`Idempotency.complete/2`), so the encoding keeps the call short.
#[rustler::nif]
fn answered_complete(store: ResourceArc<StepsRef>, slot: u32, seq: u64, answer: Term) -> bool {
    store
        .0
        .complete(Ticket { slot, seq }, answer.to_binary().as_slice())
}

/// As `answered_complete`, with the answer already encoded (`term_to_binary`, which
/// yields): a large answer is copied here, never encoded inside a NIF call.
#[rustler::nif]
fn answered_complete_encoded(
    store: ResourceArc<StepsRef>,
    slot: u32,
    seq: u64,
    answer: Binary,
) -> bool {
    store.0.complete(Ticket { slot, seq }, answer.as_slice())
}

#[rustler::nif]
fn answered_release(store: ResourceArc<StepsRef>, slot: u32, seq: u64) -> bool {
    store.0.release(Ticket { slot, seq })
}

/// Frees the steps older than the window: as many as there are, so a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn answered_sweep(store: ResourceArc<StepsRef>, now_ms: i64, window_ms: i64) -> usize {
    store.0.sweep(now_ms, window_ms)
}

#[rustler::nif]
fn answered_session_len(store: ResourceArc<StepsRef>, session: &str) -> usize {
    store.0.session_len(session)
}

#[rustler::nif]
fn answered_agent_len(store: ResourceArc<StepsRef>, agent: &str) -> usize {
    store.0.agent_len(agent)
}

/// `{steps, sessions, agents, bytes}`.
#[rustler::nif]
fn answered_stats(store: ResourceArc<StepsRef>) -> (usize, usize, usize, usize) {
    let stats = store.0.stats();
    (stats.steps, stats.sessions, stats.agents, stats.bytes)
}
