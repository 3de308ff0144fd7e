//! NIFs behind `Observatory.Gateway.SessionLog`: each session's last envelopes.
//!
//! Thin wrappers over `observatory_core::session_log::SessionLog`: a put is one call
//! (find the session, keep the text, overwrite its oldest slot, count the bytes), so
//! that a later caller — the scoring NIF — can call the store's `put` itself.

use observatory_core::session_log::{copy_into, Dropped, Envelope, Kind, Score, SessionLog, Step};
use rustler::{Binary, Encoder, Env, NifResult, ResourceArc, Term, TermType};

use crate::{atoms, json};

/// The store, owned by the SessionLog process (which creates it again on a restart).
pub struct SessionLogRef(SessionLog<Vec<u8>>);

#[rustler::resource_impl]
impl rustler::Resource for SessionLogRef {}

#[rustler::nif]
fn session_log_new(env: Env<'_>) -> Term<'_> {
    ResourceArc::new(SessionLogRef(SessionLog::new())).encode(env)
}

/// Keeps `json` (copied) as the session's next step, to be read with `score` as its
/// entropy score (nil: the agent's own), in a ring of `caps`' `ring` slots, received
/// at `at_ms` (the VM's monotonic clock in ms, as the caller read it; nil: now).
/// `:ok`, `:over_bytes` (the bytes kept are now over `caps`' `max_bytes`) or `{:new_session, sessions}` (the session was new: the caller
/// checks the sessions cap).
#[rustler::nif]
#[allow(clippy::too_many_arguments)]
fn session_log_put_json<'a>(
    env: Env<'a>,
    store: ResourceArc<SessionLogRef>,
    session: &str,
    json: Term<'a>,
    score: Term<'a>,
    number: Option<u64>,
    caps: (usize, u64),
    at_ms: Option<i64>,
) -> NifResult<Term<'a>> {
    let score = match score.get_type() {
        TermType::Float => Score::Float(score.decode()?),
        TermType::Integer => Score::Int(score.decode()?),
        _ if score == atoms::nil().to_term(env) => Score::Agent,
        _ => return Err(rustler::Error::BadArg),
    };
    let text = json.decode::<Binary>()?.as_slice();
    let envelope = |replaced: &mut Option<Vec<u8>>| Envelope {
        kind: Kind::Json,
        score,
        data: copy_into(replaced, text),
        bytes: text.len(),
    };
    Ok(put(env, &store.0, session, envelope, number, caps, at_ms))
}

/// As `session_log_put_json`, for an envelope kept as a term: `etf` its external
/// format, `bytes` the size the caps count for it.
#[rustler::nif]
fn session_log_put_term<'a>(
    env: Env<'a>,
    store: ResourceArc<SessionLogRef>,
    session: &str,
    etf: Binary<'a>,
    bytes: usize,
    number: Option<u64>,
    caps: (usize, u64),
) -> Term<'a> {
    let envelope = |replaced: &mut Option<Vec<u8>>| Envelope {
        kind: Kind::Term,
        score: Score::Agent,
        data: copy_into(replaced, etf.as_slice()),
        bytes,
    };
    put(env, &store.0, session, envelope, number, caps, None)
}

fn put<'a>(
    env: Env<'a>,
    store: &SessionLog<Vec<u8>>,
    session: &str,
    envelope: impl FnOnce(&mut Option<Vec<u8>>) -> Envelope<Vec<u8>>,
    number: Option<u64>,
    (ring, max_bytes): (usize, u64),
    at_ms: Option<i64>,
) -> Term<'a> {
    // A time the caller read already spares the clock's read here (~0.1 µs).
    let now_ms = || at_ms.map_or_else(system_time_ms, system_ms);
    let put = store.put_with(session, envelope, number, ring, max_bytes, now_ms);
    if put.over_bytes {
        atoms::over_bytes().encode(env)
    } else if put.new_session {
        (atoms::new_session(), put.sessions).encode(env)
    } else {
        atoms::ok().encode(env)
    }
}

/// The VM's system time in ms at the monotonic time `monotonic_ms`: its time offset
/// added (both in ms: within a millisecond of the sum in nanoseconds).
fn system_ms(monotonic_ms: i64) -> i64 {
    use rustler::sys::{enif_time_offset, ErlNifTimeUnit};
    // SAFETY: a plain read of the VM's time offset, callable from any scheduler thread.
    monotonic_ms + unsafe { enif_time_offset(ErlNifTimeUnit::ERL_NIF_MSEC) }
}

/// The VM's system time (`System.system_time(:millisecond)`), read in nanoseconds
/// (the native unit here) so the sum is the VM's own.
fn system_time_ms() -> i64 {
    use rustler::sys::{enif_monotonic_time, enif_time_offset, ErlNifTimeUnit};
    // SAFETY: plain reads of the VM's clocks, callable from any scheduler thread.
    let ns = unsafe {
        enif_monotonic_time(ErlNifTimeUnit::ERL_NIF_NSEC)
            + enif_time_offset(ErlNifTimeUnit::ERL_NIF_NSEC)
    };
    ns.div_euclid(1_000_000)
}

/// `[{number, at, kind, data, score}]`, oldest first, in a ring of `ring` slots.
#[rustler::nif]
fn session_log_steps<'a>(
    env: Env<'a>,
    store: ResourceArc<SessionLogRef>,
    session: &str,
    ring: usize,
) -> Term<'a> {
    store.0.steps(session, ring, |steps| {
        steps
            .iter()
            .map(|step| step_term(env, step))
            .collect::<Vec<_>>()
            .encode(env)
    })
}

/// The oldest kept step numbered `number` (as `session_log_steps` gives it), or nil.
#[rustler::nif]
fn session_log_step<'a>(
    env: Env<'a>,
    store: ResourceArc<SessionLogRef>,
    session: &str,
    number: u64,
    ring: usize,
) -> Term<'a> {
    store.0.step(session, number, ring, |step| match step {
        Some(step) => step_term(env, &step),
        None => atoms::nil().encode(env),
    })
}

fn step_term<'a>(env: Env<'a>, step: &Step<'_>) -> Term<'a> {
    let kind = match step.kind {
        Kind::Json => atoms::json(),
        Kind::Term => atoms::term(),
    };
    let score = match step.score {
        Score::Agent => atoms::nil().encode(env),
        Score::Float(f) => f.encode(env),
        Score::Int(i) => i.encode(env),
    };
    (
        step.number,
        step.at_ms,
        kind,
        json::binary(env, step.data),
        score,
    )
        .encode(env)
}

/// `{count, last_at}` of the session, or nil.
#[rustler::nif]
fn session_log_head(store: ResourceArc<SessionLogRef>, session: &str) -> Option<(u64, i64)> {
    store.0.head(session)
}

/// `{sessions, bytes}`.
#[rustler::nif]
fn session_log_stats(store: ResourceArc<SessionLogRef>) -> (usize, u64) {
    store.0.stats()
}

/// Drops least recently seen sessions until at most `keep_sessions` and `keep_bytes`
/// remain, within `budget` (a session costs 1 plus its envelopes: the call's time is
/// bounded): `{dropped, done}`. On a dirty scheduler: freeing many megabytes can
/// make the allocator hand memory back to the OS, which took 5–25 ms measured
/// (bench/session_log_cost.exs); the shards' locks are held only while the sessions are
/// unlinked, within the budget, so writers wait a fraction of a millisecond.
#[rustler::nif(schedule = "DirtyCpu")]
fn session_log_trim(
    store: ResourceArc<SessionLogRef>,
    keep_sessions: usize,
    keep_bytes: u64,
    budget: usize,
) -> (usize, bool) {
    dropped(store.0.trim(keep_sessions, keep_bytes, budget))
}

/// Drops sessions last seen before `cutoff_ms`, within `budget` (as the trim):
/// `{dropped, done}`. On a dirty scheduler, as the trim.
#[rustler::nif(schedule = "DirtyCpu")]
fn session_log_sweep(
    store: ResourceArc<SessionLogRef>,
    cutoff_ms: i64,
    budget: usize,
) -> (usize, bool) {
    dropped(store.0.sweep(cutoff_ms, budget))
}

fn dropped(dropped: Dropped) -> (usize, bool) {
    (dropped.sessions, dropped.done)
}
