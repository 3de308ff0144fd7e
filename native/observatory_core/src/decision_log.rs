//! DecisionLog envelope validation (design.md §3).
//!
//! [`read`] turns bytes into a JSON tree that borrows its text ([`borrowed::Json`]:
//! read by [`reader`], or by serde_json's parser where the reader is not sure: strict
//! UTF-8, nesting limited to 128 levels, serde_json's error messages); [`read_step`]
//! also finds the tool input's and result's canonical text in the body; [`check`]
//! verifies every field the gateway relies on and lists every violation at once, each
//! with its field path, so an agent can fix its message in one round trip. Unknown
//! fields are not checked: they pass through untouched. [`parse`] and [`validate`] do
//! the same for a `serde_json::Value`.

use serde_json::Value;

pub use borrowed::{Json, Object};
pub use reader::{CanonicalText, Parts, RestText, LEFT_OUT};

use crate::loop_verdict::keys::{self, Normalization};
use crate::loop_verdict::StepKeys;
use crate::session_store::{MAX_FIELD_BYTES, MAX_ID_BYTES};
use crate::stable_json::{hash_parts, hash_parts_in_pieces, stable_stringify, Digest};

pub mod borrowed;
pub mod reader;
#[doc(hidden)]
pub mod value_path;

/// The fixed set of `action.status` values; a status's code is its index here.
/// `Observatory.Gateway.ActionStatus` lists the same values in the same order (a test
/// pins the two together).
pub const ACTION_STATUSES: [&str; 7] = [
    "success",
    "failure",
    "error",
    "pending",
    "skipped",
    "timeout",
    "cancelled",
];

/// Most entries a `cognition.reasoning_chain` may hold.
pub const MAX_REASONING_STEPS: usize = 256;
/// Longest single `cognition.reasoning_chain` entry.
pub const MAX_REASONING_BYTES: usize = 8 * 1024;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Dotted path of the field, e.g. `meta.session_id`; `$` for the whole message.
    pub path: String,
    pub reason: String,
}

impl Violation {
    fn new(path: &str, reason: impl Into<String>) -> Self {
        Self {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }
}

/// The fields the gateway acts on, borrowed from a valid envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields<'a> {
    pub step_id: &'a str,
    pub session_id: &'a str,
    pub agent_id: &'a str,
    pub intent: &'a str,
    pub tool_call: &'a str,
    /// Index into [`ACTION_STATUSES`].
    pub status: u8,
}

/// Parses one JSON document. Syntax errors, invalid UTF-8 and nesting deeper than
/// 128 levels are reported as a violation of `$` with serde_json's line and column.
pub fn parse(bytes: &[u8]) -> Result<Value, Violation> {
    serde_json::from_slice(bytes).map_err(invalid_json)
}

/// [`parse`] into a tree that borrows the text: the same document, the same
/// violation.
pub fn read(bytes: &[u8]) -> Result<Json<'_>, Violation> {
    Json::read(bytes).map_err(invalid_json)
}

/// [`read`], and the canonical text of the step's input and result where the body
/// holds it as it is ([`reader`]), for [`hashes_with`]. With [`Parts::CanonicalText`]
/// those two are left as [`Json::Canonical`] where they can be: [`check`],
/// [`hashes_with`] and [`fingerprint_of`] read the tree the same, but the envelope's
/// term must come from a tree read with [`Parts::Built`].
pub fn read_step(bytes: &[u8], parts: Parts) -> Result<(Json<'_>, CanonicalText<'_>), Violation> {
    match reader::read(bytes, parts) {
        Some(read) => Ok(read),
        None => Json::read_with_serde(bytes)
            .map(|json| (json, CanonicalText::default()))
            .map_err(invalid_json),
    }
}

fn invalid_json(e: serde_json::Error) -> Violation {
    Violation::new("$", format!("invalid JSON: {e}"))
}

/// [`check`] of a `Value`.
pub fn validate(envelope: &Value) -> Result<Fields<'_>, Vec<Violation>> {
    let status = check(&Json::from(envelope))?.status;
    let text = |section: &str, key: &str| envelope[section][key].as_str().unwrap_or_default();
    Ok(Fields {
        step_id: text("meta", "step_id"),
        session_id: text("meta", "session_id"),
        agent_id: text("meta", "agent_id"),
        intent: text("cognition", "intent"),
        tool_call: text("action", "tool_call"),
        status,
    })
}

/// Checks an envelope; returns its key fields or every violation found.
pub fn check<'t>(envelope: &'t Json<'_>) -> Result<Fields<'t>, Vec<Violation>> {
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
            None | Some(Json::Null) => {}
            Some(Json::String(s)) if s.len() <= MAX_ID_BYTES => {}
            Some(Json::String(_)) => v.push(Violation::new(
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
            Some(Json::String(s)) if is_iso8601(s) => {}
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
        Some(Json::String(s)) => match status_code(s) {
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

/// The step detector's view of a valid envelope (seed 002): the approach is the tool
/// and its input, the outcome the status and the result. Both hash canonical JSON, so
/// key order does not matter. A step without `action.result` has no outcome: the
/// detector cannot tell a repeated outcome from a missing one, so it skips the step
/// rather than count every result-less step as "Stuck".
pub fn step_digests(envelope: &Value) -> (Digest, Option<Digest>) {
    let action = &envelope["action"];
    let tool = action["tool_call"].as_str().unwrap_or_default();
    let input = stable_stringify(action.get("tool_input").unwrap_or(&Value::Null));
    let approach = hash_parts(&[tool.as_bytes(), input.as_bytes()]);
    let outcome = action.get("result").map(|result| {
        let status = action["status"].as_str().unwrap_or_default();
        hash_parts(&[status.as_bytes(), stable_stringify(result).as_bytes()])
    });
    (approach, outcome)
}

/// The loop verdict's view of a valid envelope: 64-bit call and outcome keys of the
/// tool and its input, the status and its result, with per-call ids normalized away
/// (see [`keys`](crate::loop_verdict::keys)). [`step_hashes`] computes it together
/// with [`step_digests`], from the same canonical text.
pub fn verdict_keys(envelope: &Value, rules: &Normalization) -> StepKeys {
    let action = &envelope["action"];
    keys::step_keys(
        action["tool_call"].as_str().unwrap_or_default(),
        action["status"].as_str().unwrap_or_default(),
        action.get("tool_input"),
        action.get("result"),
        rules,
    )
}

/// Every hash of a step, for the step detector and the loop verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepHashes {
    /// [`step_digests`]' approach.
    pub approach: Digest,
    /// [`step_digests`]' outcome (`None` without `action.result`).
    pub outcome: Option<Digest>,
    /// [`verdict_keys`].
    pub verdict: StepKeys,
}

/// [`step_digests`] and [`verdict_keys`] in one pass: the canonical text of the input
/// and of the result is written once and hashed twice, SHA-256 as it is and the 64-bit
/// keys after normalization.
pub fn step_hashes(envelope: &Value, rules: &Normalization) -> StepHashes {
    hashes_of(&Json::from(envelope), rules)
}

/// [`step_hashes`] of a tree.
pub fn hashes_of(envelope: &Json<'_>, rules: &Normalization) -> StepHashes {
    hashes_with(envelope, CanonicalText::default(), rules)
}

/// [`hashes_of`], the input's and the result's canonical text taken from `canonical`
/// where [`read_step`] found it in the body (the same text: not written again).
pub fn hashes_with(
    envelope: &Json<'_>,
    canonical: CanonicalText<'_>,
    rules: &Normalization,
) -> StepHashes {
    TEXTS.with(|texts| {
        let (input, result_text, _) = &mut *texts.borrow_mut();
        let hashes = step_hashes_with(envelope, canonical, rules, input, result_text);
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
    /// The canonical text of a step's input, of its result and of the rest of its
    /// envelope, kept between steps on this thread: written into memory already
    /// there, not grown and copied anew.
    static TEXTS: std::cell::RefCell<(String, String, String)> =
        const { std::cell::RefCell::new((String::new(), String::new(), String::new())) };
}

fn step_hashes_with(
    envelope: &Json<'_>,
    canonical: CanonicalText<'_>,
    rules: &Normalization,
    input_buffer: &mut String,
    result_buffer: &mut String,
) -> StepHashes {
    let action = envelope.get("action");
    let field = |key: &str| action.and_then(|a| a.get(key));
    let tool = field("tool_call")
        .and_then(Json::as_str)
        .unwrap_or_default();
    let status = field("status").and_then(Json::as_str).unwrap_or_default();
    let input = canonical.tool_input.unwrap_or_else(|| {
        input_buffer.clear();
        field("tool_input")
            .unwrap_or(&Json::Null)
            .write_canonical(input_buffer);
        input_buffer
    });
    let result = field("result");
    let result_text = result.map(|result| {
        canonical.result.unwrap_or_else(|| {
            result_buffer.clear();
            result.write_canonical(result_buffer);
            result_buffer
        })
    });
    let approach = hash_parts(&[tool.as_bytes(), input.as_bytes()]);
    let outcome = result_text.map(|text| hash_parts(&[status.as_bytes(), text.as_bytes()]));
    let verdict_result = result_text.filter(|_| !result.is_some_and(Json::is_null));
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
    fingerprint_of(&Json::from(envelope), hashes)
}

/// [`fingerprint_of`], the rest of the envelope's canonical text taken from the body
/// where [`read_step`] found it written so (the same text: not written again).
pub fn fingerprint_with(
    envelope: &Json<'_>,
    canonical: &CanonicalText<'_>,
    hashes: &StepHashes,
) -> [u8; 16] {
    match &canonical.rest {
        Some(rest) => fingerprint_from(rest.len(), rest.pieces().map(str::as_bytes), hashes),
        None => fingerprint_of(envelope, hashes),
    }
}

/// [`body_fingerprint`] of a tree.
pub fn fingerprint_of(envelope: &Json<'_>, hashes: &StepHashes) -> [u8; 16] {
    TEXTS.with(|texts| {
        let rest = &mut texts.borrow_mut().2;
        rest.clear();
        write_rest(envelope, rest);
        let fingerprint = fingerprint_from(rest.len(), std::iter::once(rest.as_bytes()), hashes);
        if rest.capacity() > KEPT_TEXT_BYTES {
            *rest = String::new();
        }
        fingerprint
    })
}

/// The first 16 bytes of [`hash_parts`] over the rest's canonical text (given as
/// `pieces`, `len` bytes in all), the approach digest and the outcome's (empty
/// without a result).
fn fingerprint_from<'p>(
    len: usize,
    pieces: impl Iterator<Item = &'p [u8]>,
    hashes: &StepHashes,
) -> [u8; 16] {
    let outcome = hashes
        .outcome
        .as_ref()
        .map_or(&[][..], |digest| &digest[..]);
    let digest = hash_parts_in_pieces(len, pieces, &[&hashes.approach, outcome]);
    let mut fingerprint = [0; 16];
    fingerprint.copy_from_slice(&digest[..16]);
    fingerprint
}

/// The canonical text of the envelope without the members the fingerprint leaves out.
fn write_rest(envelope: &Json<'_>, out: &mut String) {
    let Json::Object(root) = envelope else {
        return envelope.write_canonical(out);
    };
    root.write_canonical_with(out, |section, member, out| match member {
        Json::Object(members) if LEFT_OUT.iter().any(|&(s, _)| s == section) => members
            .write_canonical(out, |key| {
                !LEFT_OUT.iter().any(|&(s, k)| s == section && k == key)
            }),
        other => other.write_canonical(out),
    });
}

/// The code of a status string, or `None` when it is not in the fixed set.
pub fn status_code(status: &str) -> Option<u8> {
    ACTION_STATUSES
        .iter()
        .position(|s| *s == status)
        .map(|i| i as u8)
}

fn section<'t, 'a>(
    root: &'t Object<'a>,
    key: &str,
    v: &mut Vec<Violation>,
) -> Option<&'t Object<'a>> {
    match root.get(key) {
        Some(Json::Object(m)) => Some(m),
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

fn string<'t>(
    obj: &'t Object<'_>,
    path: &str,
    key: &str,
    min: usize,
    max: usize,
    v: &mut Vec<Violation>,
) -> Option<&'t str> {
    match obj.get(key) {
        None => v.push(Violation::new(path, "is required")),
        Some(Json::String(s)) if (min..=max).contains(&s.len()) => return Some(s),
        Some(Json::String(_)) => v.push(Violation::new(
            path,
            format!("must be {min} to {max} bytes"),
        )),
        Some(_) => v.push(Violation::new(path, "must be a string")),
    }
    None
}

fn unit_number(obj: &Object<'_>, path: &str, key: &str, v: &mut Vec<Violation>) {
    match obj.get(key) {
        None | Some(Json::Null) => {}
        Some(Json::Number(n)) if n.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x)) => {}
        Some(_) => v.push(Violation::new(path, "must be a number between 0 and 1")),
    }
}

fn reasoning_chain(cognition: &Object<'_>, v: &mut Vec<Violation>) {
    let path = "cognition.reasoning_chain";
    match cognition.get("reasoning_chain") {
        None | Some(Json::Null) => {}
        Some(Json::Array(steps)) if steps.len() > MAX_REASONING_STEPS => v.push(Violation::new(
            path,
            format!("must have at most {MAX_REASONING_STEPS} entries"),
        )),
        Some(Json::Array(steps)) => {
            for (i, step) in steps.iter().enumerate() {
                match step {
                    Json::String(s) if s.len() <= MAX_REASONING_BYTES => {}
                    Json::String(_) => v.push(Violation::new(
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

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, with field ranges checked.
fn is_iso8601(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        b.get(range.clone())
            .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
            .then(|| s[range].parse::<u32>().unwrap_or(u32::MAX))
    };
    let shape = b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && (b[10] == b'T' || b[10] == b't')
        && b[13] == b':'
        && b[16] == b':';
    if !shape {
        return false;
    }
    let (Some(_year), Some(month), Some(day), Some(hour), Some(min), Some(sec)) = (
        digits(0..4),
        digits(5..7),
        digits(8..10),
        digits(11..13),
        digits(14..16),
        digits(17..19),
    ) else {
        return false;
    };
    if !((1..=12).contains(&month) && (1..=31).contains(&day) && hour < 24 && min < 60 && sec <= 60)
    {
        return false;
    }
    let mut rest = &b[19..];
    if rest.first() == Some(&b'.') {
        let frac = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if frac == 0 {
            return false;
        }
        rest = &rest[1 + frac..];
    }
    match rest {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
