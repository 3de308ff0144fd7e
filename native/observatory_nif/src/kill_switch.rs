//! NIFs behind `Observatory.KillSwitch`: chat-completions and Anthropic Messages
//! fingerprints, and the store of per-agent windows.
//!
//! The store is a `KeyedStore<AgentWindow>` (sharded, a mutex per shard), created and
//! owned on the Elixir side by `Observatory.KillSwitch.Windows`. Every window call is
//! bounded by the window size (≤ 1000 entries) and runs on a normal scheduler; parsing
//! a body and fingerprinting a text scale with their size, so each has a DirtyCpu twin
//! the Elixir side picks for large inputs.

use observatory_core::anthropic_messages;
use observatory_core::conversation::{PromptSource, RequestFingerprint};
use observatory_core::keyed_store::KeyedStore;
use observatory_core::kill_switch::{AgentWindow, Settings, Signals};
use observatory_core::messages::{request_fingerprint, response_fingerprint};
use observatory_core::normalize::normalize;
use observatory_core::simhash::fingerprint;
use observatory_core::Error;
use rustler::{Atom, Binary, Encoder, Env, NifResult, ResourceArc, Term};
use serde_json::Value;

use crate::atoms;
use crate::error::{reason, to_nif};

/// One window per agent with the kill switch enabled.
pub struct WindowStore(KeyedStore<AgentWindow>);

#[rustler::resource_impl]
impl rustler::Resource for WindowStore {}

type SignalCounts = (usize, usize, usize);

#[rustler::nif]
fn kill_switch_new(env: Env<'_>, shards: usize, max_agents: usize) -> Term<'_> {
    ResourceArc::new(WindowStore(KeyedStore::new(shards, max_agents))).encode(env)
}

/// Advances the clock that orders windows for eviction (called by the owner).
#[rustler::nif]
fn kill_switch_tick(store: ResourceArc<WindowStore>, now_ms: i64) -> rustler::Atom {
    store.0.tick(now_ms);
    atoms::ok()
}

/// `{:ok, prompt_hash | nil, tool_signatures, stream?}`, `{:error, {:invalid_json,
/// message}}` or `{:error, :not_an_object}`. `source` is `:newest_input` (the default
/// reading of the prompt) or `:last_user_message` (the seed's letter).
#[rustler::nif]
fn kill_switch_request_fingerprint<'a>(env: Env<'a>, body: Binary<'a>, source: Atom) -> Term<'a> {
    read_request(env, body, source, request_fingerprint)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn kill_switch_request_fingerprint_dirty<'a>(
    env: Env<'a>,
    body: Binary<'a>,
    source: Atom,
) -> Term<'a> {
    read_request(env, body, source, request_fingerprint)
}

/// `{:ok, response_hash | nil}`, `{:error, {:invalid_json, message}}` or
/// `{:error, :not_a_completion}`.
#[rustler::nif]
fn kill_switch_response_fingerprint<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    response(env, body)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn kill_switch_response_fingerprint_dirty<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    response(env, body)
}

/// The same two readings for an Anthropic Messages body.
#[rustler::nif]
fn kill_switch_anthropic_request_fingerprint<'a>(
    env: Env<'a>,
    body: Binary<'a>,
    source: Atom,
) -> Term<'a> {
    read_request(env, body, source, anthropic_messages::request_fingerprint)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn kill_switch_anthropic_request_fingerprint_dirty<'a>(
    env: Env<'a>,
    body: Binary<'a>,
    source: Atom,
) -> Term<'a> {
    read_request(env, body, source, anthropic_messages::request_fingerprint)
}

#[rustler::nif]
fn kill_switch_anthropic_response_fingerprint<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    anthropic_response(env, body)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn kill_switch_anthropic_response_fingerprint_dirty<'a>(
    env: Env<'a>,
    body: Binary<'a>,
) -> Term<'a> {
    anthropic_response(env, body)
}

/// SimHash of the normalized text.
#[rustler::nif]
fn kill_switch_fingerprint(text: &str) -> u64 {
    fingerprint(text)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn kill_switch_fingerprint_dirty(text: &str) -> u64 {
    fingerprint(text)
}

#[rustler::nif]
fn kill_switch_normalize(text: &str) -> String {
    normalize(text)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn kill_switch_normalize_dirty(text: &str) -> String {
    normalize(text)
}

/// Adds a request to the agent's window (created on first use) and scores it:
/// `{score, exceeded?, {similar_prompts, similar_responses, repeated_tool_calls},
/// window_len}`. Settings out of range are refused before anything is stored.
#[rustler::nif]
fn kill_switch_observe_request(
    store: ResourceArc<WindowStore>,
    agent_id: &str,
    prompt_hash: Option<u64>,
    tool_signatures: Vec<u64>,
    window_size: usize,
    threshold: f64,
) -> NifResult<(f64, bool, SignalCounts, usize)> {
    observe_request(
        &store,
        agent_id,
        prompt_hash,
        tool_signatures,
        window_size,
        threshold,
    )
}

/// The same on a dirty scheduler, for a request with many tool calls: comparing its
/// signatures with every entry grows with their number.
#[rustler::nif(schedule = "DirtyCpu")]
fn kill_switch_observe_request_dirty(
    store: ResourceArc<WindowStore>,
    agent_id: &str,
    prompt_hash: Option<u64>,
    tool_signatures: Vec<u64>,
    window_size: usize,
    threshold: f64,
) -> NifResult<(f64, bool, SignalCounts, usize)> {
    observe_request(
        &store,
        agent_id,
        prompt_hash,
        tool_signatures,
        window_size,
        threshold,
    )
}

fn observe_request(
    store: &WindowStore,
    agent_id: &str,
    prompt_hash: Option<u64>,
    tool_signatures: Vec<u64>,
    window_size: usize,
    threshold: f64,
) -> NifResult<(f64, bool, SignalCounts, usize)> {
    let settings = Settings::new(window_size, threshold).map_err(to_nif)?;
    let verdict = store.0.update(
        agent_id,
        || AgentWindow::new(settings.window_size),
        |window| window.check(&settings, prompt_hash, tool_signatures),
    );
    Ok((
        verdict.score,
        verdict.exceeded,
        counts(verdict.signals),
        verdict.window_len,
    ))
}

/// Attaches a response fingerprint to the agent's latest request. `false` when the
/// agent has no window.
#[rustler::nif]
fn kill_switch_observe_response(
    store: ResourceArc<WindowStore>,
    agent_id: &str,
    response_hash: u64,
) -> bool {
    store
        .0
        .modify(agent_id, |window| window.observe_response(response_hash))
        .is_some()
}

/// Applies a new window size now (the oldest entries leave at once when it shrinks).
#[rustler::nif]
fn kill_switch_resize(
    store: ResourceArc<WindowStore>,
    agent_id: &str,
    window_size: usize,
) -> NifResult<bool> {
    // Validated like a request's settings; the threshold plays no part here.
    let settings = Settings::new(window_size, 1.0).map_err(to_nif)?;
    Ok(store
        .0
        .modify(agent_id, |window| window.set_capacity(settings.window_size))
        .is_some())
}

/// Forgets the agent's window. `true` when it had one.
#[rustler::nif]
fn kill_switch_clear(store: ResourceArc<WindowStore>, agent_id: &str) -> bool {
    store.0.remove(agent_id)
}

/// `{score, signals, window_len, window_size}` for the agent's latest request, or `nil`.
#[rustler::nif]
fn kill_switch_status(
    store: ResourceArc<WindowStore>,
    agent_id: &str,
) -> Option<(f64, SignalCounts, usize, usize)> {
    store.0.read(agent_id, |window| {
        let signals = window.signals();
        (
            signals.score(),
            counts(signals),
            window.len(),
            window.capacity(),
        )
    })
}

/// The window's entries, oldest first: `[{prompt_hash | nil, response_hash | nil,
/// tool_signatures}]`, or `nil` when the agent has no window.
#[rustler::nif]
#[allow(clippy::type_complexity)]
fn kill_switch_window(
    store: ResourceArc<WindowStore>,
    agent_id: &str,
) -> Option<Vec<(Option<u64>, Option<u64>, Vec<u64>)>> {
    store.0.read(agent_id, |window| {
        window
            .entries()
            .map(|e| (e.prompt_hash, e.response_hash, e.tool_signatures.clone()))
            .collect()
    })
}

/// Windows held. Sums every shard: dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn kill_switch_len(store: ResourceArc<WindowStore>) -> usize {
    store.0.len()
}

fn response<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    read_response(env, body, response_fingerprint)
}

fn anthropic_response<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    read_response(env, body, anthropic_messages::response_fingerprint)
}

pub(crate) fn read_request<'a>(
    env: Env<'a>,
    body: Binary<'a>,
    source: Atom,
    read: fn(&Value, PromptSource) -> Result<RequestFingerprint, Error>,
) -> Term<'a> {
    let source = if source == atoms::last_user_message() {
        PromptSource::LastUserMessage
    } else {
        PromptSource::NewestInput
    };
    let parsed = match parse(env, body) {
        Ok(value) => value,
        Err(error) => return error,
    };
    match read(&parsed, source) {
        Ok(f) => (atoms::ok(), f.prompt, f.tool_signatures, f.stream).encode(env),
        Err(e) => (atoms::error(), reason(e)).encode(env),
    }
}

pub(crate) fn read_response<'a>(
    env: Env<'a>,
    body: Binary<'a>,
    read: fn(&Value) -> Result<Option<u64>, Error>,
) -> Term<'a> {
    let parsed = match parse(env, body) {
        Ok(value) => value,
        Err(error) => return error,
    };
    match read(&parsed) {
        Ok(hash) => (atoms::ok(), hash).encode(env),
        Err(e) => (atoms::error(), reason(e)).encode(env),
    }
}

fn parse<'a>(env: Env<'a>, body: Binary<'a>) -> Result<Value, Term<'a>> {
    serde_json::from_slice(body.as_slice()).map_err(|e| {
        (
            atoms::error(),
            (atoms::invalid_json(), format!("invalid JSON: {e}")),
        )
            .encode(env)
    })
}

fn counts(signals: Signals) -> SignalCounts {
    (
        signals.similar_prompts,
        signals.similar_responses,
        signals.repeated_tool_calls,
    )
}
