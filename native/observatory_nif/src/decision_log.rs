//! NIFs behind `Observatory.Gateway.DecisionLog`: parse and validate an envelope.

use observatory_core::decision_log::{self, Fields, Violation, ACTION_STATUSES};
use rustler::{Binary, Encoder, Env, Term};

use crate::atoms;
use crate::json::{binary, value_to_term};

/// `{:ok, envelope, {step_id, session_id, agent_id, intent, tool_call, status_code},
/// {approach_digest, outcome_digest | nil}}` or `{:error, [{path, reason}]}`.
#[rustler::nif]
fn decision_log_parse<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    parse(env, body)
}

/// The same, on a dirty scheduler: the Elixir side picks it for large bodies.
#[rustler::nif(schedule = "DirtyCpu")]
fn decision_log_parse_dirty<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    parse(env, body)
}

/// The status set, in code order (pinned against the Elixir list by a test).
#[rustler::nif]
fn action_statuses() -> Vec<&'static str> {
    ACTION_STATUSES.to_vec()
}

fn parse<'a>(env: Env<'a>, body: Binary<'a>) -> Term<'a> {
    let value = match decision_log::parse(body.as_slice()) {
        Ok(value) => value,
        Err(violation) => return violations(env, &[violation]),
    };
    match decision_log::validate(&value) {
        Ok(Fields {
            step_id,
            session_id,
            agent_id,
            intent,
            tool_call,
            status,
        }) => {
            let (approach, outcome) = decision_log::step_digests(&value);
            (
                atoms::ok(),
                value_to_term(env, &value),
                (step_id, session_id, agent_id, intent, tool_call, status),
                (
                    binary(env, &approach),
                    outcome.map(|digest| binary(env, &digest)),
                ),
            )
                .encode(env)
        }
        Err(list) => violations(env, &list),
    }
}

fn violations<'a>(env: Env<'a>, list: &[Violation]) -> Term<'a> {
    let items: Vec<(&str, &str)> = list
        .iter()
        .map(|v| (v.path.as_str(), v.reason.as_str()))
        .collect();
    (atoms::error(), items).encode(env)
}
