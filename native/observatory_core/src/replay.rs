//! One line of recorded agent steps, as `mix observatory.replay` reads it: a full
//! DecisionLog envelope, or a flat step record turned into one.
//!
//! A flat record becomes envelope *text*: each field's JSON is copied byte for byte
//! from the line (no value is decoded and re-encoded), so the gateway validates
//! exactly what the record holds. The mapping (`Observatory.Replay.Record` documents
//! it for users):
//!
//! | flat | envelope | if absent |
//! |---|---|---|
//! | `step_id` | `meta.step_id` | `"<session_id>-<n>"`: see [`Line::Flat`] |
//! | `session_id` | `meta.session_id` | left out (the gateway rejects the step) |
//! | `agent_id` | `meta.agent_id` | the default agent (also for `null`) |
//! | `timestamp` | `meta.timestamp` | the default timestamp |
//! | `intent`, `prompt_text`, `response_text` | `cognition.*` | left out |
//! | `tool_call`, `tool_input`, `result` | `action.*` | left out |
//! | `action_status`, else `status` | `action.status` | left out |
//!
//! Other fields are dropped. An object whose `meta` is an object is an envelope and
//! is passed through untouched.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use serde_json::value::RawValue;

/// What a line is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A full envelope, with its `meta.session_id` when that is a string.
    Envelope { session_id: Option<String> },
    /// A flat record as an envelope. Without a `step_id` in the record the text is
    /// `head`, the step's number, `tail`: the step id is `"<session_id>-<n>"`
    /// (`"step-<n>"` when the session_id is not a string) and only the caller knows
    /// `n`. With one, `tail` is `None` and `head` is the whole envelope.
    Flat {
        session_id: Option<String>,
        head: String,
        tail: Option<String>,
    },
}

/// A JSON object's members, each value left as JSON text.
type Object<'a, K> = BTreeMap<K, &'a RawValue>;

/// Reads one line. The error is a reason for the report: `invalid JSON: …` or
/// `not a JSON object`.
pub fn read_line(
    line: &[u8],
    default_agent: &str,
    default_timestamp: &str,
) -> Result<Line, String> {
    // Keys borrow from the line unless one has an escape (`"session\u005fid"`): then
    // the line is read again with keys of their own.
    if let Ok(object) = serde_json::from_slice::<Object<&str>>(line) {
        return Ok(classify(&object, default_agent, default_timestamp));
    }
    match serde_json::from_slice::<Object<String>>(line) {
        Ok(object) => Ok(classify(&object, default_agent, default_timestamp)),
        Err(e) => Err(not_an_object(line, e)),
    }
}

fn classify<K: Borrow<str> + Ord>(
    object: &Object<K>,
    default_agent: &str,
    default_timestamp: &str,
) -> Line {
    match object.get("meta") {
        Some(meta) if is_object(meta) => Line::Envelope {
            session_id: serde_json::from_str::<Object<String>>(meta.get())
                .ok()
                .and_then(|meta| meta.get("session_id").and_then(|id| string(id))),
        },
        _ => flat(object, default_agent, default_timestamp),
    }
}

fn flat<K: Borrow<str> + Ord>(
    record: &Object<K>,
    default_agent: &str,
    default_timestamp: &str,
) -> Line {
    let session_id = record.get("session_id").and_then(|id| string(id));
    let step_id = record.get("step_id");
    let mut head = String::with_capacity(64);
    let mut out = String::with_capacity(256);
    head.push_str(r#"{"meta":{"step_id":"#);
    match step_id {
        Some(step_id) => head.push_str(step_id.get()),
        None => {
            head.push('"');
            match &session_id {
                Some(id) => {
                    let quoted = json_string(id);
                    head.push_str(&quoted[1..quoted.len() - 1]);
                    head.push('-');
                }
                None => head.push_str("step-"),
            }
            out.push('"');
        }
    }

    field(&mut out, ",", "session_id", record.get("session_id"));
    match record.get("agent_id") {
        Some(agent) if agent.get() != "null" => field(&mut out, ",", "agent_id", Some(agent)),
        _ => text(&mut out, ",", "agent_id", default_agent),
    }
    match record.get("timestamp") {
        Some(at) => field(&mut out, ",", "timestamp", Some(at)),
        None => text(&mut out, ",", "timestamp", default_timestamp),
    }

    out.push_str(r#"},"cognition":{"#);
    let mut sep = "";
    for key in ["intent", "prompt_text", "response_text"] {
        if let Some(value) = record.get(key) {
            field(&mut out, sep, key, Some(value));
            sep = ",";
        }
    }

    out.push_str(r#"},"action":{"#);
    let status = record.get("action_status").or_else(|| record.get("status"));
    let mut sep = "";
    for (key, value) in [
        ("tool_call", record.get("tool_call")),
        ("status", status),
        ("tool_input", record.get("tool_input")),
        ("result", record.get("result")),
    ] {
        if value.is_some() {
            field(&mut out, sep, key, value);
            sep = ",";
        }
    }
    out.push_str("}}");

    if step_id.is_some() {
        head.push_str(&out);
        Line::Flat {
            session_id,
            head,
            tail: None,
        }
    } else {
        Line::Flat {
            session_id,
            head,
            tail: Some(out),
        }
    }
}

/// `sep"key":raw` when there is a value.
fn field(out: &mut String, sep: &str, key: &str, value: Option<&&RawValue>) {
    if let Some(value) = value {
        out.push_str(sep);
        out.push('"');
        out.push_str(key);
        out.push_str("\":");
        out.push_str(value.get());
    }
}

/// `sep"key":"value"`, the value escaped.
fn text(out: &mut String, sep: &str, key: &str, value: &str) {
    out.push_str(sep);
    out.push('"');
    out.push_str(key);
    out.push_str("\":");
    out.push_str(&json_string(value));
}

fn json_string(value: &str) -> String {
    // Serializing a &str cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

fn string(raw: &RawValue) -> Option<String> {
    serde_json::from_str::<String>(raw.get()).ok()
}

fn is_object(raw: &RawValue) -> bool {
    raw.get().trim_start().starts_with('{')
}

/// Why a line that is not an object failed: bad JSON, or JSON of another kind.
fn not_an_object(line: &[u8], error: serde_json::Error) -> String {
    if serde_json::from_slice::<&RawValue>(line).is_ok() {
        "not a JSON object".to_owned()
    } else {
        format!("invalid JSON: {error}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const AGENT: &str = "unknown-agent";
    const AT: &str = "2026-02-22T10:30:00Z";

    fn read(line: &str) -> Result<Line, String> {
        read_line(line.as_bytes(), AGENT, AT)
    }

    /// The envelope a flat line becomes as step `n`.
    fn envelope(line: &str, n: u32) -> Value {
        match read(line).unwrap() {
            Line::Flat {
                head,
                tail: Some(tail),
                ..
            } => serde_json::from_str(&format!("{head}{n}{tail}")).unwrap(),
            Line::Flat {
                head, tail: None, ..
            } => serde_json::from_str(&head).unwrap(),
            other => panic!("not flat: {other:?}"),
        }
    }

    #[test]
    fn a_flat_record_becomes_an_envelope() {
        let line = r#"{"session_id":"s1","agent_id":"a1","intent":"search","tool_call":"grep",
            "action_status":"failure","tool_input":{"q": [1, 2.5]},"result":{"error":"none"},
            "prompt_text":"find it","response_text":"searching","extra":true}"#;
        assert_eq!(
            envelope(line, 3),
            json!({
                "meta": {"step_id": "s1-3", "session_id": "s1", "agent_id": "a1", "timestamp": AT},
                "cognition": {"intent": "search", "prompt_text": "find it", "response_text": "searching"},
                "action": {"tool_call": "grep", "status": "failure",
                           "tool_input": {"q": [1, 2.5]}, "result": {"error": "none"}}
            })
        );
        assert!(matches!(read(line), Ok(Line::Flat { session_id: Some(id), .. }) if id == "s1"));
    }

    #[test]
    fn defaults_for_agent_and_timestamp_and_status_as_an_alias() {
        let value = envelope(
            r#"{"session_id":"s","intent":"i","tool_call":"t","status":"success"}"#,
            1,
        );
        assert_eq!(value["meta"]["agent_id"], AGENT);
        assert_eq!(value["meta"]["timestamp"], AT);
        assert_eq!(value["action"]["status"], "success");
        let null_agent = envelope(
            r#"{"session_id":"s","agent_id":null,"timestamp":"2020-01-01T00:00:00Z"}"#,
            1,
        );
        assert_eq!(null_agent["meta"]["agent_id"], AGENT);
        assert_eq!(null_agent["meta"]["timestamp"], "2020-01-01T00:00:00Z");
    }

    #[test]
    fn action_status_wins_over_status() {
        let value = envelope(
            r#"{"session_id":"s","status":"success","action_status":"failure"}"#,
            1,
        );
        assert_eq!(value["action"]["status"], "failure");
    }

    #[test]
    fn absent_required_fields_stay_absent_for_the_validator_to_report() {
        let value = envelope(r#"{"agent_id":"a"}"#, 7);
        assert_eq!(value["meta"]["step_id"], "step-7");
        assert!(value["meta"].get("session_id").is_none());
        assert_eq!(value["cognition"], json!({}));
        assert_eq!(value["action"], json!({}));
    }

    #[test]
    fn values_are_copied_as_they_are_even_when_invalid() {
        let value = envelope(r#"{"session_id":42,"intent":null,"tool_call":["x"]}"#, 1);
        assert_eq!(value["meta"]["session_id"], 42);
        assert_eq!(value["meta"]["step_id"], "step-1");
        assert_eq!(value["cognition"]["intent"], Value::Null);
        assert_eq!(value["action"]["tool_call"], json!(["x"]));
    }

    #[test]
    fn a_step_id_in_the_record_is_kept_and_needs_no_number() {
        match read(r#"{"session_id":"s","step_id":"mine"}"#).unwrap() {
            Line::Flat {
                head, tail: None, ..
            } => {
                let value: Value = serde_json::from_str(&head).unwrap();
                assert_eq!(value["meta"]["step_id"], "mine");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn session_ids_that_need_escaping_make_valid_step_ids() {
        let value = envelope(r#"{"session_id":"a\"b\\c\u00e9\n"}"#, 2);
        assert_eq!(value["meta"]["step_id"], "a\"b\\c\u{e9}\n-2");
        assert_eq!(value["meta"]["session_id"], "a\"b\\c\u{e9}\n");
    }

    #[test]
    fn escaped_keys_are_read_as_their_text() {
        let value = envelope(r#"{"session\u005fid":"s"}"#, 1);
        assert_eq!(value["meta"]["session_id"], "s");
    }

    #[test]
    fn envelopes_are_recognised_by_a_meta_object() {
        assert_eq!(
            read(r#"{"meta":{"session_id":"s9","step_id":"x"},"cognition":{}}"#),
            Ok(Line::Envelope {
                session_id: Some("s9".into())
            })
        );
        assert_eq!(
            read(r#"{"meta":{"session_id":5}}"#),
            Ok(Line::Envelope { session_id: None })
        );
        // A `meta` that is not an object does not make an envelope.
        assert!(matches!(
            read(r#"{"meta":"x","session_id":"s"}"#),
            Ok(Line::Flat { .. })
        ));
    }

    #[test]
    fn bad_lines_say_why() {
        assert_eq!(read(r#"[1, 2]"#), Err("not a JSON object".to_owned()));
        assert_eq!(read(r#""text""#), Err("not a JSON object".to_owned()));
        let err = read(r#"{"session_id": "#).unwrap_err();
        assert!(err.starts_with("invalid JSON: EOF"), "{err}");
        assert!(read("not json").unwrap_err().starts_with("invalid JSON"));
        assert!(read_line(b"{\"a\":\"\xff\"}", AGENT, AT)
            .unwrap_err()
            .starts_with("invalid JSON"));
    }

    #[test]
    fn duplicate_keys_take_the_last_value_like_a_json_value_does() {
        let value = envelope(r#"{"session_id":"first","session_id":"last"}"#, 1);
        assert_eq!(value["meta"]["session_id"], "last");
    }
}
