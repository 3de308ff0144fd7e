//! NIFs behind `Observatory.Replay.Record`: what one line of recorded steps is.

use observatory_core::replay::{self, Line};
use rustler::{Binary, Encoder, Env, Term};

use crate::atoms;

/// `{:envelope, session_id | nil}`, `{:flat, session_id | nil, head, tail | nil}` or
/// `{:error, reason}` (see `observatory_core::replay`).
#[rustler::nif]
fn replay_read_line<'a>(
    env: Env<'a>,
    line: Binary<'a>,
    default_agent: &str,
    default_timestamp: &str,
) -> Term<'a> {
    read_line(env, line, default_agent, default_timestamp)
}

/// The same, on a dirty scheduler: the Elixir side picks it for long lines.
#[rustler::nif(schedule = "DirtyCpu")]
fn replay_read_line_dirty<'a>(
    env: Env<'a>,
    line: Binary<'a>,
    default_agent: &str,
    default_timestamp: &str,
) -> Term<'a> {
    read_line(env, line, default_agent, default_timestamp)
}

fn read_line<'a>(
    env: Env<'a>,
    line: Binary<'a>,
    default_agent: &str,
    default_timestamp: &str,
) -> Term<'a> {
    match replay::read_line(line.as_slice(), default_agent, default_timestamp) {
        Ok(Line::Envelope { session_id }) => (atoms::envelope(), session_id).encode(env),
        Ok(Line::Flat {
            session_id,
            head,
            tail,
        }) => (atoms::flat(), session_id, head, tail).encode(env),
        Err(reason) => (atoms::error(), reason).encode(env),
    }
}
