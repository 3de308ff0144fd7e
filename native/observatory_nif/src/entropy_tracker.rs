//! NIFs behind `Observatory.Gateway.EntropyTracker`: the session store resource.

use observatory_core::keyed_store::key_hash;
use observatory_core::session_store::{Detail, Observation, SessionView, Settings, Store, Tuple};
use observatory_core::severity::{Severity, Thresholds};
use rustler::{Atom, Binary, Encoder, Env, NifResult, ResourceArc, Term};

use crate::atoms;
use crate::error::to_nif;
use crate::test_support::LiveId;

/// The store, owned on the Elixir side by the `EntropyTracker` process, and its entry
/// in the tests' count of live stores.
pub struct StoreResource(pub(crate) Store, pub LiveId);

#[rustler::resource_impl]
impl rustler::Resource for StoreResource {}

#[rustler::nif]
fn entropy_store_new(env: Env<'_>, shards: usize, max_sessions: usize) -> Term<'_> {
    ResourceArc::new(StoreResource(
        Store::new(shards, max_sessions),
        LiveId::new(),
    ))
    .encode(env)
}

/// Records one step. Returns `{score, severity, previous | nil, window_len, detail | nil}`
/// with detail `{agent_id | nil, intent, tool_call, status, occurrences}`.
/// Bounded work (fields ≤ 1 KiB, windows ≤ 1024): a normal scheduler.
#[rustler::nif]
#[allow(clippy::too_many_arguments)]
fn entropy_record<'a>(
    env: Env<'a>,
    store: ResourceArc<StoreResource>,
    session_id: Binary<'a>,
    intent: Binary<'a>,
    tool_call: Binary<'a>,
    status: u8,
    agent_id: Option<Binary<'a>>,
    window_size: usize,
    loop_threshold: f64,
    warning_threshold: f64,
) -> NifResult<Term<'a>> {
    let settings = Settings {
        window_size,
        thresholds: Thresholds::new(loop_threshold, warning_threshold).map_err(to_nif)?,
    };
    let obs = Observation {
        session_id: session_id.as_slice(),
        intent: intent.as_slice(),
        tool_call: tool_call.as_slice(),
        status,
        agent_id: agent_id.as_ref().map(Binary::as_slice),
    };
    record(env, &store, &obs, key_hash(obs.session_id), &settings)
        .map(|(term, _)| term)
        .map_err(to_nif)
}

/// Records one step and encodes what `entropy_record` returns, beside the scored
/// step's severity and whether it names an agent (for the fused `score_step`).
/// `hash` is the session id's, as `key_hash` gives it.
pub(crate) fn record<'a>(
    env: Env<'a>,
    store: &StoreResource,
    obs: &Observation<'_>,
    hash: u64,
    settings: &Settings,
) -> Result<(Term<'a>, (Severity, bool)), observatory_core::Error> {
    store.0.record_hashed(obs, hash, settings, |scored| {
        let has_agent = scored.detail.is_some_and(|d| d.agent_id.is_some());
        let term = (
            scored.score,
            severity_atom(scored.severity),
            scored.previous.map(severity_atom),
            scored.window_len,
            scored.detail.map(|d| detail_term(env, d)),
        )
            .encode(env);
        (term, (scored.severity, has_agent))
    })
}

/// Advances the store's clock (called by the owner once per tick).
#[rustler::nif]
fn entropy_tick(store: ResourceArc<StoreResource>, now_ms: i64) -> rustler::Atom {
    store.0.tick(now_ms);
    rustler::types::atom::ok()
}

/// `{window, agent_id | nil, score, severity, last_seen_ms}` or `nil`.
#[rustler::nif]
fn entropy_session<'a>(
    env: Env<'a>,
    store: ResourceArc<StoreResource>,
    session_id: Binary<'a>,
) -> Term<'a> {
    match store.0.session(session_id.as_slice()) {
        None => rustler::types::atom::nil().encode(env),
        Some(SessionView {
            window,
            agent_id,
            score,
            severity,
            last_seen_ms,
        }) => {
            let window: Vec<Term<'a>> = window.iter().map(|t| tuple_term(env, t)).collect();
            (
                window,
                agent_id,
                score,
                severity_atom(severity),
                last_seen_ms,
            )
                .encode(env)
        }
    }
}

/// `[{session_id, agent_id | nil, score, severity, last_seen_ms}]`, most recent first.
/// Visits every session (it keeps only the newest `limit` of each shard): on a dirty
/// scheduler, since it grows with the store.
#[rustler::nif(schedule = "DirtyCpu")]
fn entropy_list(
    store: ResourceArc<StoreResource>,
    limit: usize,
) -> Vec<(String, Option<String>, f64, Atom, i64)> {
    store
        .0
        .list(limit)
        .into_iter()
        .map(|s| {
            (
                s.session_id,
                s.agent_id,
                s.score,
                severity_atom(s.severity),
                s.last_seen_ms,
            )
        })
        .collect()
}

#[rustler::nif]
fn entropy_forget(store: ResourceArc<StoreResource>, session_id: Binary) -> bool {
    store.0.forget(session_id.as_slice())
}

/// Scans every session: on a dirty scheduler, since it grows with the store.
#[rustler::nif(schedule = "DirtyCpu")]
fn entropy_sweep(store: ResourceArc<StoreResource>, now_ms: i64, ttl_ms: u64) -> usize {
    store.0.sweep(now_ms, ttl_ms)
}

/// `{sessions, evicted_over_capacity, expired}`. Sums shard sizes: dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn entropy_stats(store: ResourceArc<StoreResource>) -> (usize, u64, u64) {
    let stats = store.0.stats();
    (stats.sessions, stats.evicted_over_capacity, stats.expired)
}

/// Sessions held: one short lock per shard, on a normal scheduler, so that
/// `/healthz` never waits in the dirty schedulers' queue behind request work.
#[rustler::nif]
fn entropy_count(store: ResourceArc<StoreResource>) -> usize {
    store.0.len()
}

fn severity_atom(severity: Severity) -> Atom {
    match severity {
        Severity::Normal => atoms::normal(),
        Severity::Warning => atoms::warning(),
        Severity::Loop => atoms::loop_(),
    }
}

fn tuple_term<'a>(env: Env<'a>, t: &Tuple) -> Term<'a> {
    (&*t.intent, &*t.tool_call, t.status).encode(env)
}

fn detail_term<'a>(env: Env<'a>, d: Detail<'_>) -> Term<'a> {
    (
        d.agent_id,
        &*d.repeated.intent,
        &*d.repeated.tool_call,
        d.repeated.status,
        d.occurrences,
    )
        .encode(env)
}
