use super::*;
use serde_json::json;

fn valid() -> Value {
    json!({
        "meta": {
            "step_id": "step-1",
            "session_id": "sess-abc",
            "agent_id": "agent-7",
            "parent_step_id": null,
            "timestamp": "2026-02-22T10:30:00Z"
        },
        "cognition": {
            "intent": "search",
            "reasoning_chain": ["look for the file"],
            "confidence": 0.8,
            "entropy_score": 0.9
        },
        "action": {
            "tool_call": "read_file",
            "tool_input": {"path": "/tmp/x"},
            "status": "failure",
            "result": {"error": "ENOENT"}
        },
        "extra": {"kept": true}
    })
}

fn paths(result: Result<Fields<'_>, Vec<Violation>>) -> Vec<String> {
    result.unwrap_err().into_iter().map(|v| v.path).collect()
}

#[test]
fn a_valid_envelope_yields_its_key_fields() {
    let envelope = valid();
    let fields = validate(&envelope).unwrap();
    assert_eq!(
        fields,
        Fields {
            step_id: "step-1",
            session_id: "sess-abc",
            agent_id: "agent-7",
            intent: "search",
            tool_call: "read_file",
            status: 1,
        }
    );
}

#[test]
fn every_violation_is_listed_at_once() {
    let envelope = json!({
        "meta": {"session_id": "", "agent_id": 7, "timestamp": "yesterday"},
        "cognition": {"confidence": 2, "reasoning_chain": ["ok", 3]},
        "action": {"tool_call": "t", "status": "exploded"}
    });
    assert_eq!(
        paths(validate(&envelope)),
        vec![
            "meta.step_id",
            "meta.session_id",
            "meta.agent_id",
            "meta.timestamp",
            "cognition.intent",
            "cognition.reasoning_chain.1",
            "cognition.confidence",
            "action.status",
        ]
    );
}

#[test]
fn missing_sections_and_non_objects() {
    assert_eq!(
        paths(validate(&json!({}))),
        vec!["meta", "cognition", "action"]
    );
    assert_eq!(paths(validate(&json!([1, 2]))), vec!["$"]);
    let mut e = valid();
    e["action"] = json!("read_file");
    assert_eq!(paths(validate(&e)), vec!["action"]);
}

#[test]
fn sizes_are_capped() {
    let mut e = valid();
    e["meta"]["session_id"] = json!("s".repeat(MAX_ID_BYTES + 1));
    e["cognition"]["intent"] = json!("i".repeat(MAX_FIELD_BYTES + 1));
    e["action"]["tool_call"] = json!("t".repeat(MAX_FIELD_BYTES));
    assert_eq!(
        paths(validate(&e)),
        vec!["meta.session_id", "cognition.intent"]
    );
}

#[test]
fn every_status_in_the_set_is_accepted_and_others_are_not() {
    for (code, status) in ACTION_STATUSES.iter().enumerate() {
        let mut e = valid();
        e["action"]["status"] = json!(status);
        assert_eq!(validate(&e).unwrap().status as usize, code);
    }
    for bad in [json!("FAILURE"), json!("ok"), json!(1), json!(null)] {
        let mut e = valid();
        e["action"]["status"] = bad;
        assert_eq!(paths(validate(&e)), vec!["action.status"]);
    }
}

#[test]
fn timestamps() {
    for ok in [
        "2026-02-22T10:30:00Z",
        "2026-02-22T10:30:00.123456Z",
        "2026-02-22T10:30:00+02:00",
        "2026-02-22T10:30:00.5-05:30",
    ] {
        assert!(is_iso8601(ok), "{ok}");
    }
    for bad in [
        "2026-02-22",
        "2026-13-22T10:30:00Z",
        "2026-02-22T25:30:00Z",
        "2026-02-22T10:30:00",
        "2026-02-22T10:30:00.Z",
        "2026-02-22T10:30:00+0200",
        "two thousand",
    ] {
        assert!(!is_iso8601(bad), "{bad}");
    }
}

#[test]
fn parse_reports_syntax_utf8_and_depth() {
    assert!(parse(br#"{"a": 1"#)
        .unwrap_err()
        .reason
        .contains("invalid JSON"));
    assert!(parse(b"{\"a\": \"\xff\"}").is_err());
    let deep = "[".repeat(1000) + &"]".repeat(1000);
    assert!(parse(deep.as_bytes())
        .unwrap_err()
        .reason
        .contains("recursion"));
    assert!(parse(br#"{"a": [1, {"b": null}]}"#).is_ok());
}

#[test]
fn optional_fields_may_be_null_or_absent() {
    let mut e = valid();
    e["cognition"].as_object_mut().unwrap().remove("confidence");
    e["cognition"]["entropy_score"] = Value::Null;
    e["meta"]["parent_step_id"] = json!("step-0");
    assert!(validate(&e).is_ok());
    e["meta"]["parent_step_id"] = json!(5);
    assert_eq!(paths(validate(&e)), vec!["meta.parent_step_id"]);
}

#[test]
fn step_digests_ignore_key_order_and_need_a_result() {
    let a = json!({"action": {"tool_call": "grep", "tool_input": {"a": 1, "b": [2, {"c": 3, "d": 4}]}, "status": "failure", "result": {"x": 1, "y": 2}}});
    let b = json!({"action": {"tool_call": "grep", "tool_input": {"b": [2, {"d": 4, "c": 3}], "a": 1}, "status": "failure", "result": {"y": 2, "x": 1}}});
    assert_eq!(step_digests(&a), step_digests(&b));
    assert!(step_digests(&a).1.is_some());

    let other_tool = json!({"action": {"tool_call": "rg", "tool_input": {"a": 1, "b": [2, {"c": 3, "d": 4}]}, "status": "failure", "result": {"x": 1, "y": 2}}});
    assert_ne!(step_digests(&a).0, step_digests(&other_tool).0);
    assert_eq!(step_digests(&a).1, step_digests(&other_tool).1);

    let other_status = json!({"action": {"tool_call": "grep", "tool_input": {"a": 1}, "status": "success", "result": {"x": 1, "y": 2}}});
    assert_ne!(step_digests(&a).1, step_digests(&other_status).1);

    let no_result = json!({"action": {"tool_call": "grep", "status": "failure"}});
    assert_eq!(step_digests(&no_result).1, None);
}

#[test]
fn step_hashes_agree_with_step_digests_and_verdict_keys() {
    use crate::loop_verdict::keys::Normalization;
    let rules = Normalization::shared_default();
    let mut no_result = valid();
    no_result["action"]
        .as_object_mut()
        .unwrap()
        .remove("result");
    let mut null_result = valid();
    null_result["action"]["result"] = Value::Null;
    let mut no_input = valid();
    no_input["action"]
        .as_object_mut()
        .unwrap()
        .remove("tool_input");
    for envelope in [valid(), no_result, null_result, no_input] {
        let hashes = step_hashes(&envelope, rules);
        assert_eq!((hashes.approach, hashes.outcome), step_digests(&envelope));
        assert_eq!(hashes.verdict, verdict_keys(&envelope, rules));
    }
}

fn fingerprint(envelope: &Value) -> [u8; 16] {
    body_fingerprint(
        envelope,
        &step_hashes(envelope, Normalization::shared_default()),
    )
}

#[test]
fn the_body_fingerprint_leaves_out_the_timestamp_and_the_self_reported_score() {
    let first = valid();
    let mut retry = valid();
    retry["meta"]["timestamp"] = json!("2026-02-22T10:31:07Z");
    retry["cognition"]["entropy_score"] = json!(0.1);
    assert_eq!(fingerprint(&first), fingerprint(&retry));
    // Key order and whitespace are not in a parsed value; 1 and 1.0 are one number.
    let reordered = parse(
        br#"{"extra": {"kept": true}, "action": {"result": {"error": "ENOENT"}, "status": "failure",
            "tool_input": {"path": "/tmp/x"}, "tool_call": "read_file"},
            "cognition": {"confidence": 0.8, "reasoning_chain": ["look for the file"], "intent": "search"},
            "meta": {"timestamp": "2026-02-22T10:30:00Z", "parent_step_id": null, "agent_id": "agent-7",
            "session_id": "sess-abc", "step_id": "step-1"}}"#,
    )
    .unwrap();
    assert_eq!(fingerprint(&first), fingerprint(&reordered));
}

#[test]
fn the_body_fingerprint_changes_with_anything_else() {
    let first = fingerprint(&valid());
    let changes: [(&str, &str, Value); 7] = [
        ("action", "result", json!({"error": "EACCES"})),
        ("action", "tool_input", json!({"path": "/tmp/y"})),
        ("action", "status", json!("success")),
        ("cognition", "intent", json!("plan")),
        ("cognition", "reasoning_chain", json!([])),
        ("meta", "agent_id", json!("agent-8")),
        ("extra", "kept", json!(false)),
    ];
    for (section, key, value) in changes {
        let mut changed = valid();
        changed[section][key] = value;
        assert_ne!(fingerprint(&changed), first, "{section}.{key}");
    }
    // A result present (even null) is not a result absent.
    let mut without = valid();
    without["action"].as_object_mut().unwrap().remove("result");
    let mut null = valid();
    null["action"]["result"] = Value::Null;
    assert_ne!(fingerprint(&without), fingerprint(&null));
}
