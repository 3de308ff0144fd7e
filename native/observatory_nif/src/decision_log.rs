//! NIFs behind `Observatory.Gateway.DecisionLog`: parse and validate an envelope.

use observatory_core::decision_log::{self, Fields, Parts, StepHashes, Violation, ACTION_STATUSES};
use observatory_core::loop_verdict::keys::Normalization;
use rustler::{Binary, Encoder, Env, Term};

use crate::atoms;
use crate::json::{binary, tree_to_term};
use crate::loop_verdict::VerdictRules;

/// `{:ok, envelope, {step_id, session_id, agent_id, intent, tool_call, status_code},
/// {approach_digest, outcome_digest | nil, body_fingerprint}, verdict_keys}` or
/// `{:error, [{path, reason}]}`, `verdict_keys` one binary
/// ([`StepKeys::to_bytes`](observatory_core::loop_verdict::StepKeys::to_bytes)). The
/// verdict keys are normalized with `rules` (nil: the defaults). `envelope` is the
/// decoded envelope's term when `with_envelope`, else nil: building it is about a third
/// of the call at 600 bytes, and a caller that keeps the JSON text decodes it only when
/// something reads it. The rules are borrowed for the call (the argument holds them
/// alive), not counted in and out.
#[rustler::nif]
fn decision_log_parse<'a>(
    env: Env<'a>,
    body: Binary<'a>,
    rules: Option<&'a VerdictRules>,
    with_envelope: bool,
) -> Term<'a> {
    parse(env, body, rules, with_envelope)
}

/// The same, on a dirty scheduler: the Elixir side picks it for large bodies.
#[rustler::nif(schedule = "DirtyCpu")]
fn decision_log_parse_dirty<'a>(
    env: Env<'a>,
    body: Binary<'a>,
    rules: Option<&'a VerdictRules>,
    with_envelope: bool,
) -> Term<'a> {
    parse(env, body, rules, with_envelope)
}

/// The status set, in code order (pinned against the Elixir list by a test).
#[rustler::nif]
fn action_statuses() -> Vec<&'static str> {
    ACTION_STATUSES.to_vec()
}

fn parse<'a>(
    env: Env<'a>,
    body: Binary<'a>,
    rules: Option<&'a VerdictRules>,
    with_envelope: bool,
) -> Term<'a> {
    // Without the envelope's term, the input and result are only hashed: their trees
    // need not be built where the body holds their canonical text.
    let parts = if with_envelope {
        Parts::Built
    } else {
        Parts::CanonicalText
    };
    let (value, canonical) = match decision_log::read_step(body.as_slice(), parts) {
        Ok(read) => read,
        Err(violation) => return violations(env, &[violation]),
    };
    match decision_log::check(&value) {
        Ok(Fields {
            step_id,
            session_id,
            agent_id,
            intent,
            tool_call,
            status,
        }) => {
            let rules = rules.map_or(Normalization::shared_default(), |r| &r.0);
            let hashes = decision_log::hashes_with(&value, canonical, rules);
            let fingerprint = decision_log::fingerprint_with(&value, &canonical, &hashes);
            let StepHashes {
                approach,
                outcome,
                verdict,
            } = hashes;
            (
                atoms::ok(),
                if with_envelope {
                    tree_to_term(env, &value)
                } else {
                    rustler::types::atom::nil().encode(env)
                },
                (step_id, session_id, agent_id, intent, tool_call, status),
                (
                    binary(env, &approach),
                    outcome.map(|digest| binary(env, &digest)),
                    binary(env, &fingerprint),
                ),
                crate::loop_verdict::keys_term(env, &verdict),
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
