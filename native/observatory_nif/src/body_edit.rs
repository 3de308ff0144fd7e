//! NIFs behind `Observatory.Proxy.BodyEdit`: edits to a proxied request body that keep
//! every other byte (`observatory_core::json_splice`), and reading a few top-level
//! fields of an answer without decoding the rest. Each scales with the body, so each
//! has a DirtyCpu twin the Elixir side picks for large bodies.

use observatory_core::json_splice::{self, Api};
use rustler::{Atom, Binary, Encoder, Env, Term};

use crate::atoms;
use crate::json::binary;

/// `{:ok, new_body}`, or `nil` when the body's tail answers no tool call.
#[rustler::nif]
fn body_append_note<'a>(env: Env<'a>, body: Binary<'a>, api: Atom, note: &str) -> Term<'a> {
    append_note(env, body, api, note)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn body_append_note_dirty<'a>(env: Env<'a>, body: Binary<'a>, api: Atom, note: &str) -> Term<'a> {
    append_note(env, body, api, note)
}

/// `{:ok, new_body}`, or `nil` when the request is not streamed or asks for usage already.
#[rustler::nif]
fn body_ensure_stream_usage<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    edited(env, json_splice::ensure_stream_usage(body.as_slice()))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn body_ensure_stream_usage_dirty<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    edited(env, json_splice::ensure_stream_usage(body.as_slice()))
}

/// The raw JSON text of each top-level field named (`nil` when absent), or `nil` when
/// the body is not a JSON object.
#[rustler::nif]
fn body_top_level_fields<'a>(env: Env<'a>, body: Binary<'a>, names: Vec<String>) -> Term<'a> {
    fields(env, body, names)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn body_top_level_fields_dirty<'a>(env: Env<'a>, body: Binary<'a>, names: Vec<String>) -> Term<'a> {
    fields(env, body, names)
}

fn append_note<'a>(env: Env<'a>, body: Binary<'a>, api: Atom, note: &str) -> Term<'a> {
    let api = if api == atoms::messages() {
        Api::Messages
    } else if api == atoms::responses() {
        Api::Responses
    } else {
        Api::ChatCompletions
    };
    edited(
        env,
        json_splice::append_to_newest_tool_result(body.as_slice(), api, note),
    )
}

fn edited(env: Env<'_>, body: Option<Vec<u8>>) -> Term<'_> {
    match body {
        Some(bytes) => (atoms::ok(), binary(env, &bytes)).encode(env),
        None => rustler::types::atom::nil().encode(env),
    }
}

fn fields<'a>(env: Env<'a>, body: Binary<'a>, names: Vec<String>) -> Term<'a> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    match json_splice::top_level_fields(body.as_slice(), &names) {
        Some(found) => found
            .into_iter()
            .map(|raw| match raw {
                Some(text) => binary(env, text.as_bytes()),
                None => rustler::types::atom::nil().encode(env),
            })
            .collect::<Vec<_>>()
            .encode(env),
        None => rustler::types::atom::nil().encode(env),
    }
}
