//! NIFs behind `Observatory.Proxy.Responses`: the kill switch's readings of an OpenAI
//! Responses API request and answer (`observatory_core::responses`). Parsing scales
//! with the body, so each has a DirtyCpu twin the Elixir side picks for large bodies.

use observatory_core::responses::{request_fingerprint, response_fingerprint};
use rustler::{Atom, Binary, Env, Term};

use crate::kill_switch::{read_request, read_response};

/// `{:ok, prompt_hash | nil, tool_signatures, stream?}`, `{:error, {:invalid_json,
/// message}}` or `{:error, :not_an_object}`. `source` as for the kill switch's other
/// readings (`:newest_input` or `:last_user_message`).
#[rustler::nif]
fn responses_request_fingerprint<'a>(env: Env<'a>, body: Binary<'a>, source: Atom) -> Term<'a> {
    read_request(env, body, source, request_fingerprint)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn responses_request_fingerprint_dirty<'a>(
    env: Env<'a>,
    body: Binary<'a>,
    source: Atom,
) -> Term<'a> {
    read_request(env, body, source, request_fingerprint)
}

/// `{:ok, response_hash | nil}`, `{:error, {:invalid_json, message}}` or
/// `{:error, :not_a_completion}`.
#[rustler::nif]
fn responses_response_fingerprint<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    read_response(env, body, response_fingerprint)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn responses_response_fingerprint_dirty<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    read_response(env, body, response_fingerprint)
}
