//! The `serde_json::Value` implementation of the decision log's checks and hashes
//! that the borrowed tree ([`Json`](super::Json)) replaced, kept word for word as the
//! oracle: the property tests prove the tree's answers are these, and the parse
//! bench measures both in one run. Not for production use.

use serde_json::{Map, Value};

use super::{
    is_iso8601, status_code, Fields, StepHashes, Violation, ACTION_STATUSES, MAX_REASONING_BYTES,
    MAX_REASONING_STEPS,
};
use crate::loop_verdict::keys::{self, Normalization};
use crate::session_store::{MAX_FIELD_BYTES, MAX_ID_BYTES};
use crate::stable_json::{hash_parts, stable_stringify_into, stable_stringify_without};

/// Checks an envelope; returns its key fields or every violation found.
pub fn validate(envelope: &Value) -> Result<Fields<'_>, Vec<Violation>> {
    let mut v = Vec::new();
    let Some(root) = envelope.as_object() else {
        return Err(vec![Violation::new("$", "must be a JSON object")]);
    };
    // Each section, then its fields: violations come out in reading order.
    let meta = section(root, "meta", &mut v);
    let step_id = meta.and_then(|m| string(m, "meta.step_id", "step_id", 1, MAX_ID_BYTES, &mut v));
    let session_id =
        meta.and_then(|m| string(m, "meta.session_id", "session_id", 1, MAX_ID_BYTES, &mut v));
    let agent_id =
        meta.and_then(|m| string(m, "meta.agent_id", "agent_id", 1, MAX_ID_BYTES, &mut v));
    if let Some(m) = meta {
        match m.get("parent_step_id") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.len() <= MAX_ID_BYTES => {}
            Some(Value::String(_)) => v.push(Violation::new(
                "meta.parent_step_id",
                format!("must be at most {MAX_ID_BYTES} bytes"),
            )),
            Some(_) => v.push(Violation::new(
                "meta.parent_step_id",
                "must be a string or null",
            )),
        }
        match m.get("timestamp") {
            None => v.push(Violation::new("meta.timestamp", "is required")),
            Some(Value::String(s)) if is_iso8601(s) => {}
            Some(_) => v.push(Violation::new(
                "meta.timestamp",
                "must be an ISO 8601 date-time string, e.g. 2026-02-22T10:30:00Z",
            )),
        }
    }

    let cognition = section(root, "cognition", &mut v);
    let intent =
        cognition.and_then(|c| string(c, "cognition.intent", "intent", 1, MAX_FIELD_BYTES, &mut v));
    if let Some(c) = cognition {
        reasoning_chain(c, &mut v);
        unit_number(c, "cognition.confidence", "confidence", &mut v);
        unit_number(c, "cognition.entropy_score", "entropy_score", &mut v);
    }

    let action = section(root, "action", &mut v);
    let tool_call = action.and_then(|a| {
        string(
            a,
            "action.tool_call",
            "tool_call",
            1,
            MAX_FIELD_BYTES,
            &mut v,
        )
    });
    let status = action.and_then(|a| match a.get("status") {
        None => {
            v.push(Violation::new("action.status", "is required"));
            None
        }
        Some(Value::String(s)) => match status_code(s) {
            Some(code) => Some(code),
            None => {
                v.push(Violation::new(
                    "action.status",
                    format!("must be one of: {}", ACTION_STATUSES.join(", ")),
                ));
                None
            }
        },
        Some(_) => {
            v.push(Violation::new("action.status", "must be a string"));
            None
        }
    });

    match (step_id, session_id, agent_id, intent, tool_call, status) {
        (
            Some(step_id),
            Some(session_id),
            Some(agent_id),
            Some(intent),
            Some(tool_call),
            Some(status),
        ) if v.is_empty() => Ok(Fields {
            step_id,
            session_id,
            agent_id,
            intent,
            tool_call,
            status,
        }),
        _ => Err(v),
    }
}

/// [`step_digests`](super::step_digests) and [`verdict_keys`](super::verdict_keys) in one pass: the canonical text of the input
/// and of the result is written once and hashed twice, SHA-256 as it is and the 64-bit
/// keys after normalization.
pub fn step_hashes(envelope: &Value, rules: &Normalization) -> StepHashes {
    TEXTS.with(|texts| {
        let (input, result_text) = &mut *texts.borrow_mut();
        let hashes = step_hashes_with(envelope, rules, input, result_text);
        for text in [input, result_text] {
            if text.capacity() > KEPT_TEXT_BYTES {
                *text = String::new();
            }
        }
        hashes
    })
}

/// Largest canonical text buffer kept for the next step (a few large results must not
/// hold memory on every scheduler thread for good).
const KEPT_TEXT_BYTES: usize = 64 * 1024;

thread_local! {
    /// The canonical text of a step's input and of its result, kept between steps on
    /// this thread: written into memory already there, not grown and copied anew.
    static TEXTS: std::cell::RefCell<(String, String)> =
        const { std::cell::RefCell::new((String::new(), String::new())) };
}

fn step_hashes_with(
    envelope: &Value,
    rules: &Normalization,
    input: &mut String,
    result_text: &mut String,
) -> StepHashes {
    let action = &envelope["action"];
    let tool = action["tool_call"].as_str().unwrap_or_default();
    let status = action["status"].as_str().unwrap_or_default();
    stable_stringify_into(input, action.get("tool_input").unwrap_or(&Value::Null));
    let result = action.get("result");
    let result_text = result.map(|result| {
        stable_stringify_into(result_text, result);
        result_text.as_str()
    });
    let approach = hash_parts(&[tool.as_bytes(), input.as_bytes()]);
    let outcome = result_text.map(|text| hash_parts(&[status.as_bytes(), text.as_bytes()]));
    let verdict_result = result_text.filter(|_| !result.is_some_and(Value::is_null));
    StepHashes {
        approach,
        outcome,
        verdict: keys::keys_from_canonical(tool, status, input, verdict_result, rules),
    }
}

/// What a step's body is, for idempotent ingest: two deliveries with the same
/// fingerprint are the same step. The envelope's canonical JSON (key order and
/// whitespace do not count) without the two fields that say nothing about the step —
/// `meta.timestamp`, which a client may stamp again on a retry, and
/// `cognition.entropy_score`, which the gateway overwrites — hashed with SHA-256, of
/// which 16 bytes are kept. The tool's input and result, the parts that can be large,
/// enter through `hashes` (the same canonical text, hashed once already).
pub fn body_fingerprint(envelope: &Value, hashes: &StepHashes) -> [u8; 16] {
    const LEFT_OUT: [(&str, &str); 4] = [
        ("meta", "timestamp"),
        ("cognition", "entropy_score"),
        ("action", "tool_input"),
        ("action", "result"),
    ];
    let rest = stable_stringify_without(envelope, &LEFT_OUT);
    let outcome = hashes
        .outcome
        .as_ref()
        .map_or(&[][..], |digest| &digest[..]);
    let digest = hash_parts(&[rest.as_bytes(), &hashes.approach, outcome]);
    let mut fingerprint = [0; 16];
    fingerprint.copy_from_slice(&digest[..16]);
    fingerprint
}

fn section<'a>(
    root: &'a Map<String, Value>,
    key: &str,
    v: &mut Vec<Violation>,
) -> Option<&'a Map<String, Value>> {
    match root.get(key) {
        Some(Value::Object(m)) => Some(m),
        Some(_) => {
            v.push(Violation::new(key, "must be an object"));
            None
        }
        None => {
            v.push(Violation::new(key, "is required"));
            None
        }
    }
}

fn string<'a>(
    obj: &'a Map<String, Value>,
    path: &str,
    key: &str,
    min: usize,
    max: usize,
    v: &mut Vec<Violation>,
) -> Option<&'a str> {
    match obj.get(key) {
        None => v.push(Violation::new(path, "is required")),
        Some(Value::String(s)) if (min..=max).contains(&s.len()) => return Some(s),
        Some(Value::String(_)) => v.push(Violation::new(
            path,
            format!("must be {min} to {max} bytes"),
        )),
        Some(_) => v.push(Violation::new(path, "must be a string")),
    }
    None
}

fn unit_number(obj: &Map<String, Value>, path: &str, key: &str, v: &mut Vec<Violation>) {
    match obj.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x)) => {}
        Some(_) => v.push(Violation::new(path, "must be a number between 0 and 1")),
    }
}

fn reasoning_chain(cognition: &Map<String, Value>, v: &mut Vec<Violation>) {
    let path = "cognition.reasoning_chain";
    match cognition.get("reasoning_chain") {
        None | Some(Value::Null) => {}
        Some(Value::Array(steps)) if steps.len() > MAX_REASONING_STEPS => v.push(Violation::new(
            path,
            format!("must have at most {MAX_REASONING_STEPS} entries"),
        )),
        Some(Value::Array(steps)) => {
            for (i, step) in steps.iter().enumerate() {
                match step {
                    Value::String(s) if s.len() <= MAX_REASONING_BYTES => {}
                    Value::String(_) => v.push(Violation::new(
                        &format!("{path}.{i}"),
                        format!("must be at most {MAX_REASONING_BYTES} bytes"),
                    )),
                    _ => v.push(Violation::new(&format!("{path}.{i}"), "must be a string")),
                }
            }
        }
        Some(_) => v.push(Violation::new(path, "must be a list of strings")),
    }
}
