//! A CI-sized fuzz run of every parser a client's bytes reach: arbitrary bytes, JSON
//! values built from adversarial strings and numbers, and valid envelopes with bytes
//! flipped, inserted and cut. Each parser must answer (a value or an error) without
//! panicking, and what it answers must be stable (the same input, the same keys).
//!
//! `cargo test -p observatory_core --test parsers_fuzz` runs 256 cases per property;
//! `PROPTEST_CASES=100000` runs a longer campaign.

use observatory_core::conversation::PromptSource;
use observatory_core::decision_log::{parse, step_hashes, validate};
use observatory_core::loop_verdict::keys::Normalization;
use observatory_core::loop_verdict::shape::{collapse_whitespace, shape, Scratch};
use observatory_core::normalize::{normalize_json_ids_into, IdRules};
use observatory_core::stable_json::stable_stringify;
use observatory_core::{anthropic_messages, messages, replay, responses};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Strings made of what the normalizers look for, in long runs.
fn nasty_string() -> impl Strategy<Value = String> {
    let unit = prop_oneof![
        Just("1,".to_owned()),
        Just("1739870000,".to_owned()),
        Just("2024-01-15T10:30:00.".to_owned()),
        Just("a1b2c3d4-".to_owned()),
        Just("pid=1 ".to_owned()),
        Just("\\\"\n\t ".to_owned()),
        Just("\u{3000}\u{0}\u{7f}é".to_owned()),
        "[ -~]{0,8}",
        any::<String>(),
    ];
    (prop::collection::vec(unit, 0..4), 1usize..200).prop_map(|(units, n)| units.concat().repeat(n))
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    nasty_string(),
                    Just("pid".to_owned()),
                    Just("request_id".to_owned())
                ],
                inner,
                0..8
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn envelope(input: Value, result: Value) -> Value {
    json!({
        "meta": {"step_id": "s-1", "session_id": "sess-1", "agent_id": "agent-1",
                 "timestamp": "2026-02-22T10:30:00Z"},
        "cognition": {"intent": "run"},
        "action": {"tool_call": "run", "tool_input": input, "status": "failure", "result": result}
    })
}

#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, u8),
    Cut(usize, usize),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Flip(at, b)),
        (
            any::<usize>(),
            prop::sample::select(&b"\"\\{}[],:0e-.\n\xff"[..])
        )
            .prop_map(|(at, b)| Edit::Insert(at, b)),
        (any::<usize>(), 0usize..16).prop_map(|(at, n)| Edit::Cut(at, n)),
    ];
    prop::collection::vec(edit, 1..6)
}

fn mutate(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for edit in edits {
        let len = bytes.len().max(1);
        match *edit {
            Edit::Flip(at, b) if !bytes.is_empty() => bytes[at % len] ^= b,
            Edit::Insert(at, b) => bytes.insert(at % (bytes.len() + 1), b),
            Edit::Cut(at, n) if !bytes.is_empty() => {
                let at = at % len;
                let end = (at + n).min(bytes.len());
                bytes.drain(at..end);
            }
            _ => {}
        }
    }
    bytes
}

/// Everything the gateway does with a step's body, as the NIF does it.
fn ingest(body: &[u8]) {
    let Ok(value) = parse(body) else { return };
    if validate(&value).is_ok() {
        let rules = Normalization::shared_default();
        assert_eq!(step_hashes(&value, rules), step_hashes(&value, rules));
    }
    let line = replay::read_line(body, "agent", "2026-02-22T10:30:00Z");
    assert_eq!(
        line,
        replay::read_line(body, "agent", "2026-02-22T10:30:00Z")
    );
    for source in [PromptSource::NewestInput, PromptSource::LastUserMessage] {
        let _ = messages::request_fingerprint(&value, source);
        let _ = anthropic_messages::request_fingerprint(&value, source);
        let _ = responses::request_fingerprint(&value, source);
    }
    let _ = messages::response_fingerprint(&value);
    let _ = anthropic_messages::response_fingerprint(&value);
    let _ = responses::response_fingerprint(&value);
}

/// The loop verdict's readers on any text, canonical or not.
fn read_text(text: &[u8]) {
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let mut normalized = Vec::new();
    normalize_json_ids_into(text, &IdRules::default(), &mut normalized);
    let mut collapsed = Vec::new();
    collapse_whitespace(&normalized, &mut collapsed);
    shape("failure", &normalized, &mut Scratch::default());
}

// Proptest's default configuration: 256 cases, or `PROPTEST_CASES`.
proptest! {
    #[test]
    fn any_bytes_are_parsed_or_refused(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        ingest(&bytes);
        read_text(&bytes);
    }

    #[test]
    fn any_json_value_is_hashed_and_read(input in json_value(), result in json_value()) {
        let body = serde_json::to_vec(&envelope(input, result.clone())).unwrap();
        ingest(&body);
        let canonical = stable_stringify(&result);
        // Canonical text parses back to a value with the same canonical text.
        let again: Value = serde_json::from_str(&canonical).unwrap();
        prop_assert_eq!(stable_stringify(&again), canonical.clone());
        read_text(canonical.as_bytes());
    }

    #[test]
    fn damaged_envelopes_are_parsed_or_refused(
        input in json_value(),
        result in json_value(),
        edits in edits(),
    ) {
        let body = serde_json::to_vec(&envelope(input, result)).unwrap();
        let damaged = mutate(body, &edits);
        ingest(&damaged);
        read_text(&damaged);
    }

    #[test]
    fn proxy_bodies_with_adversarial_text_are_fingerprinted(text in nasty_string(), args in json_value()) {
        let arguments = serde_json::to_string(&args).unwrap();
        let request = json!({"model": "m", "stream": true, "messages": [
            {"role": "user", "content": [{"type": "text", "text": text}]},
            {"role": "assistant", "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": arguments}},
                {"id": "2", "type": "function", "function": {"name": "g", "arguments": text}}]}]});
        let source = PromptSource::default();
        let first = messages::request_fingerprint(&request, source).unwrap();
        prop_assert_eq!(messages::request_fingerprint(&request, source).unwrap(), first);
        let anthropic = json!({"model": "m", "messages": [
            {"role": "user", "content": text},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "1", "name": "f", "input": args}]}]});
        prop_assert!(anthropic_messages::request_fingerprint(&anthropic, source).is_ok());
    }
}
