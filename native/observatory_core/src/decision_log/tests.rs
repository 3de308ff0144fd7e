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

/// The borrowed tree against the `Value` implementation it replaced
/// ([`value_path`]), over generated envelope texts: every answer the gateway takes from
/// a step must be the same, bit for bit.
mod borrowed_tree_answers_as_the_value_path {
    use super::*;
    use proptest::prelude::*;

    /// What one step's parse gives: the violations, or the fields and every hash.
    #[derive(Debug, PartialEq)]
    enum Answer {
        Invalid(Vec<Violation>),
        Valid {
            fields: (String, String, String, String, String, u8),
            hashes: Box<StepHashes>,
            fingerprint: [u8; 16],
        },
    }

    fn owned(f: Fields<'_>) -> (String, String, String, String, String, u8) {
        let s = |x: &str| x.to_owned();
        (
            s(f.step_id),
            s(f.session_id),
            s(f.agent_id),
            s(f.intent),
            s(f.tool_call),
            f.status,
        )
    }

    fn old(bytes: &[u8]) -> Answer {
        let rules = Normalization::shared_default();
        let value = match parse(bytes) {
            Ok(value) => value,
            Err(violation) => return Answer::Invalid(vec![violation]),
        };
        match value_path::validate(&value) {
            Ok(fields) => {
                let hashes = value_path::step_hashes(&value, rules);
                Answer::Valid {
                    fields: owned(fields),
                    hashes: Box::new(hashes),
                    fingerprint: value_path::body_fingerprint(&value, &hashes),
                }
            }
            Err(list) => Answer::Invalid(list),
        }
    }

    fn new(bytes: &[u8], parts: Parts) -> Answer {
        let rules = Normalization::shared_default();
        let (tree, canonical) = match read_step(bytes, parts) {
            Ok(read) => read,
            Err(violation) => return Answer::Invalid(vec![violation]),
        };
        match check(&tree) {
            Ok(fields) => {
                let hashes = hashes_with(&tree, canonical, rules);
                Answer::Valid {
                    fields: owned(fields),
                    hashes: Box::new(hashes),
                    fingerprint: fingerprint_with(&tree, &canonical, &hashes),
                }
            }
            Err(list) => Answer::Invalid(list),
        }
    }

    /// Both answers agree, and the tree is the `Value`'s (so the envelope's term is).
    fn assert_same(bytes: &[u8]) -> Result<(), TestCaseError> {
        let old = old(bytes);
        for parts in [Parts::Built, Parts::CanonicalText] {
            prop_assert_eq!(
                &new(bytes, parts),
                &old,
                "{:?}, text: {}",
                parts,
                String::from_utf8_lossy(bytes)
            );
        }
        if let Ok(value) = parse(bytes) {
            prop_assert_eq!(read(bytes).unwrap(), Json::from(&value));
            prop_assert_eq!(Json::read_with_serde(bytes).unwrap(), Json::from(&value));
            prop_assert_eq!(Json::from(value.clone()), Json::from(&value));
        }
        assert_canonical_text_is_written_text(bytes)
    }

    /// The reader's own pass finds the documents serde_json's finds (and gives up on
    /// nothing an agent's SDK writes), and the canonical text it takes from the body is
    /// exactly what would be written: hashing it where it lies is hashing the written
    /// text.
    fn assert_canonical_text_is_written_text(bytes: &[u8]) -> Result<(), TestCaseError> {
        let Some((tree, canonical)) = reader::read(bytes, Parts::Built) else {
            return Ok(());
        };
        // Left unread: exactly the parts whose canonical text the body holds.
        let (unread, again) = reader::read(bytes, Parts::CanonicalText).unwrap();
        prop_assert_eq!(again, canonical);
        let left = |key: &str| match unread.get("action").and_then(|a| a.get(key)) {
            Some(Json::Canonical(text)) => Some(*text),
            _ => None,
        };
        for (found, key) in [
            (canonical.tool_input, "tool_input"),
            (canonical.result, "result"),
        ] {
            let built = matches!(
                tree.get("action").and_then(|a| a.get(key)),
                Some(Json::Object(_) | Json::Array(_) | Json::String(_))
            );
            prop_assert_eq!(left(key), found.filter(|_| built), "{}", key);
        }
        prop_assert!(parse(bytes).is_ok(), "read a text serde_json refuses");
        let action = tree.get("action");
        let written = |key: &str| {
            action.and_then(|a| a.get(key)).map(|v| {
                let mut text = String::new();
                v.write_canonical(&mut text);
                text
            })
        };
        for (found, key) in [
            (canonical.tool_input, "tool_input"),
            (canonical.result, "result"),
        ] {
            if let Some(found) = found {
                prop_assert_eq!(Some(found.to_owned()), written(key), "{}", key);
            }
        }
        // The rest of the envelope, in pieces of the body, is the text written for the
        // fingerprint.
        if let Some(rest) = canonical.rest {
            let mut text = String::new();
            write_rest(&tree, &mut text);
            let pieces: String = rest.pieces().collect();
            prop_assert_eq!(rest.len(), pieces.len());
            prop_assert_eq!(pieces, text);
        }
        Ok(())
    }

    /// Optional whitespace between tokens.
    fn ws() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec!["", "", "", " ", "\n  ", "\t"])
    }

    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| format!("{f:?}")),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| format!("{f:e}")),
            prop::sample::select(vec![
                "0",
                "-0",
                "1.0",
                "-0.0",
                "0.5",
                "1e20",
                "1E+2",
                "2.5e-8",
                "-1.5e300",
                "1e400",
                "18446744073709551615",
                "18446744073709551616",
                "-9223372036854775808",
                "-9223372036854775809",
                "123456789012345678901234567890",
                "0.1",
                "4242",
            ])
            .prop_map(str::to_owned),
        ]
    }

    /// A JSON string's text: plain and non-ASCII characters, every kind of escape,
    /// surrogate pairs, and the ids and timestamps normalization looks for.
    fn string() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            4 => "[a-zA-Z0-9 _./:-]{1,12}",
            1 => any::<char>()
                .prop_filter("no quote, backslash or control", |c| {
                    !matches!(c, '"' | '\\') && !c.is_control()
                })
                .prop_map(String::from),
            2 => prop::sample::select(vec![
                "\\n", "\\t", "\\\"", "\\\\", "\\/", "\\u00e9", "\\u0000", "\\ud83d\\ude00",
                "\\u001f", "\\b", "\\f", "\\r", "é", "日本", "😀", "\u{7f}",
                "2026-02-22T10:30:00Z", "550e8400-e29b-41d4-a716-446655440000",
                "req-42", "pid 4242", "deadbeefcafe1234",
            ])
            .prop_map(str::to_owned),
        ];
        prop::collection::vec(piece, 0..6).prop_map(|pieces| format!("\"{}\"", pieces.concat()))
    }

    /// An object key: few names, so that repeats (duplicate keys) are common.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => prop::sample::select(vec![
                "a", "b", "Z", "é", "\\u0061", "path", "", "request_id", "elapsed_ms", "\\n",
            ])
            .prop_map(|k| format!("\"{k}\"")),
            1 => string(),
        ]
    }

    fn json() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            prop::sample::select(vec!["null", "true", "false"]).prop_map(str::to_owned),
            number(),
            string(),
        ];
        leaf.prop_recursive(4, 24, 5, |inner| {
            prop_oneof![
                (prop::collection::vec((ws(), inner.clone()), 0..5)).prop_map(|items| {
                    let items: Vec<String> =
                        items.into_iter().map(|(w, v)| format!("{w}{v}")).collect();
                    format!("[{}]", items.join(","))
                }),
                prop::collection::vec((key(), ws(), inner), 0..6).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(k, w, v)| format!("{k}{w}:{v}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    /// A field's value: one the check accepts (`ok`); or, in a spoiled envelope, mostly
    /// such one, else one it refuses, any JSON, or no field.
    fn field(
        spoil: bool,
        name: &'static str,
        ok: Vec<&'static str>,
        bad: Vec<&'static str>,
    ) -> BoxedStrategy<String> {
        let member = move |v: &str| format!("\"{name}\":{v}");
        let good = prop::sample::select(ok).prop_map(member);
        if !spoil {
            return good.boxed();
        }
        prop_oneof![
            6 => good,
            1 => prop::sample::select(bad).prop_map(member),
            1 => json().prop_map(move |v| member(&v)),
            1 => Just(String::new()),
        ]
        .boxed()
    }

    fn section(
        spoil: bool,
        name: &'static str,
        fields: Vec<BoxedStrategy<String>>,
    ) -> BoxedStrategy<String> {
        let members = fields.into_iter().fold(Just(Vec::new()).boxed(), |acc, f| {
            (acc, f)
                .prop_map(|(mut v, f)| {
                    v.push(f);
                    v
                })
                .boxed()
        });
        let body = (members, Just(())).prop_shuffle_members();
        let body = if spoil {
            prop_oneof![8 => body, 1 => json().boxed()].boxed()
        } else {
            body
        };
        body.prop_map(move |body| format!("\"{name}\":{body}"))
            .boxed()
    }

    trait ShuffleMembers {
        fn prop_shuffle_members(self) -> BoxedStrategy<String>;
    }

    impl<S: Strategy<Value = (Vec<String>, ())> + 'static> ShuffleMembers for S {
        /// The members in any order, the empty ones (absent fields) left out.
        fn prop_shuffle_members(self) -> BoxedStrategy<String> {
            self.prop_map(|(v, ())| v)
                .prop_shuffle()
                .prop_map(|v| {
                    let v: Vec<String> = v.into_iter().filter(|m| !m.is_empty()).collect();
                    format!("{{{}}}", v.join(","))
                })
                .boxed()
        }
    }

    /// An envelope's text: its three sections (fields valid, or in half of them
    /// anything, in any order, sometimes repeated), unknown members, whitespace.
    fn envelope() -> impl Strategy<Value = String> {
        any::<bool>().prop_flat_map(envelope_spoiled_or_not)
    }

    fn envelope_spoiled_or_not(spoil: bool) -> impl Strategy<Value = String> {
        let id = || vec!["\"step-1\"", "\"s\\u00e9\"", "\"sess-ABC-42\""];
        let f = |name, ok, bad| field(spoil, name, ok, bad);
        let meta = section(
            spoil,
            "meta",
            vec![
                f("step_id", id(), vec!["\"\"", "7"]),
                f("session_id", id(), vec!["\"\"", "[]"]),
                f("agent_id", id(), vec!["null"]),
                f("parent_step_id", vec!["null", "\"step-0\""], vec!["3"]),
                f(
                    "timestamp",
                    vec![
                        "\"2026-02-22T10:30:00Z\"",
                        "\"2026-02-22T10:30:00.123+01:00\"",
                    ],
                    vec!["\"2026-13-22T10:30:00Z\"", "\"yesterday\""],
                ),
            ],
        );
        let cognition = section(
            spoil,
            "cognition",
            vec![
                f("intent", vec!["\"search\"", "\"plan\\n\""], vec!["\"\""]),
                f(
                    "reasoning_chain",
                    vec!["[]", "[\"a\",\"b\"]", "null"],
                    vec!["[1]", "\"a\""],
                ),
                f(
                    "confidence",
                    vec!["0.8", "1", "1.0", "-0.0", "null"],
                    vec!["1.5"],
                ),
                f("entropy_score", vec!["0.9", "0"], vec!["2"]),
            ],
        );
        let action = section(
            spoil,
            "action",
            vec![
                f(
                    "tool_call",
                    vec!["\"read_file\"", "\"run\\tshell\""],
                    vec!["\"\""],
                ),
                json().prop_map(|v| format!("\"tool_input\":{v}")).boxed(),
                f(
                    "status",
                    vec!["\"success\"", "\"failure\"", "\"timeout\"", "\"cancelled\""],
                    vec!["\"ok\""],
                ),
                prop_oneof![
                    4 => json().prop_map(|v| format!("\"result\":{v}")),
                    1 => Just("\"result\":null".to_owned()),
                    1 => Just(String::new()),
                ]
                .boxed(),
            ],
        );
        let extra = prop_oneof![
            2 => Just(String::new()).boxed(),
            1 => (key(), json()).prop_map(|(k, v)| format!("{k}:{v}")).boxed(),
            1 => section(spoil, "meta", vec![f("step_id", vec!["\"again\""], vec!["1"])]),
        ];
        (meta, cognition, action, extra, ws())
            .prop_map(|(m, c, a, e, w)| (vec![m, c, a, e], w))
            .prop_flat_map(|(parts, w)| (Just(parts).prop_shuffle(), Just(w)))
            .prop_map(|(parts, w)| {
                let parts: Vec<String> = parts.into_iter().filter(|p| !p.is_empty()).collect();
                format!("{w}{{{w}{}}}{w}", parts.join(&format!(",{w}")))
            })
    }

    /// Whether `json`'s canonical text has no float, no negative number and no `\u`
    /// escape: the text the reader must find in a canonical body.
    fn plain(json: &Json<'_>) -> bool {
        match json {
            Json::Number(n) => n.is_u64(),
            Json::String(s) => !s
                .chars()
                .any(|c| c < ' ' && !matches!(c, '\n' | '\r' | '\t' | '\u{8}' | '\u{c}')),
            Json::Array(items) => items.iter().all(plain),
            Json::Object(members) => members
                .iter()
                .all(|(k, v)| plain(&Json::String(k.into())) && plain(v)),
            _ => true,
        }
    }

    /// A text spoiled: cut short, an invalid UTF-8 byte put in, or nested too deep.
    fn spoiled(text: String, how: u8, at: usize) -> Vec<u8> {
        let mut bytes = text.into_bytes();
        let at = at % (bytes.len() + 1);
        match how {
            0 => bytes.truncate(at),
            1 => bytes.insert(at, 0xff),
            2 => bytes.splice(at..at, [0xc3]).for_each(drop),
            _ => {
                let deep = format!("{}1{}", "[".repeat(130), "]".repeat(130));
                return format!("{{\"meta\":{deep}}}").into_bytes();
            }
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn on_generated_envelopes(text in envelope()) {
            assert_same(text.as_bytes())?;
        }

        /// The same envelopes written canonically, as most clients send them: the
        /// reader reads every one itself, and takes the input's and the result's
        /// canonical text from the body wherever the text is exactly the written one.
        #[test]
        fn on_canonical_envelopes(text in envelope()) {
            let Ok(value) = parse(text.as_bytes()) else { return Ok(()) };
            let canonical = crate::stable_json::stable_stringify(&value);
            assert_same(canonical.as_bytes())?;
            let read = reader::read(canonical.as_bytes(), Parts::Built);
            prop_assert!(read.is_some(), "gave up on {}", canonical);
            let (tree, found) = read.unwrap();
            let plain = |key: &str| tree.get("action").and_then(|a| a.get(key)).filter(|v| plain(v));
            // Without a float, a negative number or a `\u` escape, the text is found.
            if plain("tool_input").is_some() {
                prop_assert!(found.tool_input.is_some(), "{}", canonical);
            }
            if plain("result").is_some() {
                prop_assert!(found.result.is_some(), "{}", canonical);
            }
            // Without a `\u` escape (the writer's for a control character), the rest of
            // the envelope is found too.
            if value.is_object() && !canonical.contains("\\u") {
                prop_assert!(found.rest.is_some(), "{}", canonical);
            }
        }

        #[test]
        fn on_any_json(text in json()) {
            assert_same(text.as_bytes())?;
        }

        #[test]
        fn on_spoiled_texts(text in envelope(), how in 0u8..4, at in any::<usize>()) {
            assert_same(&spoiled(text, how, at))?;
        }
    }

    #[test]
    fn on_edge_texts() {
        let texts: [&[u8]; 10] = [
            // The raw-value token as an object's first key: `Value` reads the string.
            br#"{"$serde_json::private::RawValue":"[1,2]"}"#,
            br#"{"action":{"$serde_json::private::RawValue":"{\"result\":1}"}}"#,
            br#"{"a":1,"$serde_json::private::RawValue":"x"}"#,
            br#"{"meta":{"step_id":"a","step_id":"b"},"meta":{"step_id":"c"}}"#,
            b"\xef\xbb\xbf{}",
            b"{} {}",
            b"",
            b"[]",
            br#"{"meta":1e400}"#,
            br#"{"meta":{"step_id":"\ud800"}}"#,
        ];
        for text in texts {
            assert_same(text).unwrap();
        }
        let nested = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        for n in [127, 128, 129] {
            let text = format!(
                r#"{{"meta":{{}},"cognition":{{}},"action":{{"result":{}}}}}"#,
                nested(n)
            );
            assert_same(text.as_bytes()).unwrap();
        }
    }

    /// The reader checks UTF-8 only where a byte is not ASCII, as it reads each string
    /// (not the whole body up front): invalid sequences in a key, a value, a skimmed
    /// part, after an escape, cut by the closing quote or the end of the body, and
    /// non-ASCII bytes outside any string, each answered as serde_json answers them;
    /// valid ones (two, three and four bytes, runs of them, next to escapes) read by the
    /// reader itself and taken as the parts' canonical text.
    #[test]
    fn on_utf8_valid_and_invalid_in_every_place() {
        let placed = |bad: &[u8]| -> Vec<Vec<u8>> {
            let wrap = |before: &str, after: &str| {
                let mut text = before.as_bytes().to_vec();
                text.extend_from_slice(bad);
                text.extend_from_slice(after.as_bytes());
                text
            };
            vec![
                wrap(r#"{"meta":{"step_id":""#, r#""}}"#),
                wrap(r#"{"meta":{""#, r#"":1}}"#),
                wrap(
                    r#"{"action":{"result":{"content":"a\n"#,
                    r#"b"},"status":"success"}}"#,
                ),
                wrap(r#"{"action":{"tool_input":[""#, r#""]}}"#),
                wrap(r#"{"action":{"result":""#, r#""}}"#),
                wrap(r#"{"a":"x\""#, r#"\u00e9"}"#),
                wrap(r#"{"a":""#, ""),
                wrap(r#"{"a":1}"#, ""),
                wrap(r#"{"a":"#, "}"),
                wrap(r#"{"#, r#":1}"#),
                wrap("", "{}"),
            ]
        };
        let invalid: [&[u8]; 8] = [
            b"\xff",
            b"\xc3",
            b"\xc3\xa9\xc3",
            b"\xc0\x80",
            b"\xed\xa0\x80",
            b"\xa9",
            b"\xf0\x9f\x98",
            b"\xe2\x82\xac\x80",
        ];
        for bad in invalid {
            for text in placed(bad) {
                assert!(std::str::from_utf8(&text).is_err());
                assert!(reader::read(&text, Parts::CanonicalText).is_none());
                assert_same(&text).unwrap();
            }
        }
        for good in [
            "é",
            "€uro",
            "😀",
            "aé€😀b",
            "\u{7ff}\u{800}\u{ffff}\u{10000}\u{10ffff}",
        ] {
            for text in placed(good.as_bytes()).into_iter().take(6) {
                assert!(reader::read(&text, Parts::Built).is_some(), "{text:?}");
                assert_same(&text).unwrap();
            }
        }
        // A part's canonical text that holds them is taken from the body.
        let body = r#"{"action":{"result":{"content":"é\n€ 😀"},"tool_input":["naïve"]}}"#;
        let (_, canonical) = reader::read(body.as_bytes(), Parts::CanonicalText).unwrap();
        assert_eq!(canonical.result, Some(r#"{"content":"é\n€ 😀"}"#));
        assert_eq!(canonical.tool_input, Some(r#"["naïve"]"#));
        assert!(canonical.rest.is_some());
    }
}

/// What the reader reads itself rather than leave to serde_json. Giving up is always
/// answered right (serde_json then decides), so only these tests see a reader that
/// gives up on what an SDK writes, or reads past what it must leave.
mod the_reader_reads_itself {
    use super::*;

    const COMPACT: &str = r#"{"action":{"result":{"lines":["a","b"],"ok":true},"tool_input":{"path":"x"}},"meta":{"step_id":"s1"}}"#;

    #[test]
    fn a_pretty_printed_envelope_with_its_whitespace() {
        let value: serde_json::Value = serde_json::from_str(COMPACT).unwrap();
        let pretty = serde_json::to_string_pretty(&value)
            .unwrap()
            .replace("  ", "\t ")
            + "\r\n";
        let (tree, canonical) = reader::read(pretty.as_bytes(), Parts::Built)
            .expect("read by the reader, not left to serde_json");
        assert_eq!(tree, Json::read_with_serde(pretty.as_bytes()).unwrap());
        // Spaced inside: neither part's text is its canonical text.
        assert_eq!((canonical.tool_input, canonical.result), (None, None));
        assert!(reader::read(pretty.as_bytes(), Parts::CanonicalText).is_some());
    }

    #[test]
    fn a_hundred_levels_of_nesting_and_not_one_more() {
        for (open, close) in [(r#"{"a":"#, "}"), ("[", "]")] {
            let nested = |n: usize| format!("{}1{}", open.repeat(n), close.repeat(n));
            assert!(
                reader::read(nested(100).as_bytes(), Parts::Built).is_some(),
                "{open} ×100"
            );
            assert!(
                reader::read(nested(101).as_bytes(), Parts::Built).is_none(),
                "{open} ×101"
            );
        }
    }

    #[test]
    fn numbers_escapes_and_keys_it_reads_or_refuses() {
        // Read here, as serde_json reads them.
        for text in [
            r#"{"a":"x\/y"}"#,
            r#"{"a":1.5}"#,
            r#"{"a":-2e3}"#,
            r#"{"a":0}"#,
        ] {
            let (tree, _) = reader::read(text.as_bytes(), Parts::Built)
                .unwrap_or_else(|| panic!("{text} left to serde_json"));
            assert_eq!(
                tree,
                Json::read_with_serde(text.as_bytes()).unwrap(),
                "{text}"
            );
        }
        // Not JSON: never read.
        for text in [r#"{"a":01}"#, r#"{"a":-01}"#, r#"{"a":-}"#, r#"{"a":1.}"#] {
            assert!(
                reader::read(text.as_bytes(), Parts::Built).is_none(),
                "{text}"
            );
        }
        // A part with a key twice is not its canonical text (the writer keeps one).
        let text = r#"{"action":{"tool_input":{"a":1,"a":2}}}"#;
        let (_, canonical) = reader::read(text.as_bytes(), Parts::Built).unwrap();
        assert_eq!(canonical.tool_input, None);
    }

    /// The fingerprint's text taken from the body: the left-out members cut with their
    /// commas wherever they stand, floats and negative numbers written as the writer
    /// writes them counted as canonical, and a body written otherwise left to the
    /// writer.
    #[test]
    fn the_rest_of_a_canonical_body_is_its_text_without_the_left_out_members() {
        let rules = Normalization::shared_default();
        let cases = [
            // Left out first, in the middle, last, alone, two in a row, and none.
            (
                r#"{"action":{"result":1,"status":"success","tool_call":"t","tool_input":{"a":[1,-2,0.5]}},"cognition":{"confidence":0.8,"entropy_score":0.25,"intent":"i"},"meta":{"agent_id":"a","session_id":"s","step_id":"x","timestamp":"2026-02-22T10:30:00Z"}}"#,
                r#"{"action":{"status":"success","tool_call":"t"},"cognition":{"confidence":0.8,"intent":"i"},"meta":{"agent_id":"a","session_id":"s","step_id":"x"}}"#,
            ),
            (
                r#"{"action":{"result":{},"tool_input":[]},"cognition":{"entropy_score":1.0},"meta":{"timestamp":"2026"},"z":-1}"#,
                r#"{"action":{},"cognition":{},"meta":{},"z":-1}"#,
            ),
            (
                r#"{"action":{"status":"x","tool_input":"y\n"},"cognition":{"a":1,"entropy_score":0.90,"z":2},"meta":{"step_id":"q"}}"#,
                r#"{"action":{"status":"x"},"cognition":{"a":1,"z":2},"meta":{"step_id":"q"}}"#,
            ),
            // A member named as a left-out one, outside its section: kept.
            (
                r#"{"extra":{"entropy_score":4,"result":2,"timestamp":1},"meta":{"entropy_score":3}}"#,
                r#"{"extra":{"entropy_score":4,"result":2,"timestamp":1},"meta":{"entropy_score":3}}"#,
            ),
        ];
        for (body, rest) in cases {
            let (tree, canonical) = reader::read(body.as_bytes(), Parts::CanonicalText)
                .unwrap_or_else(|| panic!("not read: {body}"));
            let found = canonical
                .rest
                .unwrap_or_else(|| panic!("no rest in {body}"));
            assert_eq!(found.pieces().collect::<String>(), rest, "{body}");
            let mut written = String::new();
            write_rest(&tree, &mut written);
            assert_eq!(written, rest, "{body}");
            let hashes = hashes_with(&tree, canonical, rules);
            assert_eq!(
                fingerprint_with(&tree, &canonical, &hashes),
                fingerprint_of(&tree, &hashes),
                "{body}"
            );
        }
        // Written otherwise: a space, a float not as the writer writes it (kept), keys
        // out of order, a key twice, a `\u` escape, a `\/`.
        for body in [
            r#"{"meta":{"step_id": "x"}}"#,
            r#"{"cognition":{"confidence":0.80}}"#,
            r#"{"cognition":{"confidence":1e-1}}"#,
            r#"{"meta":{"b":1,"a":2}}"#,
            r#"{"meta":{"a":1},"meta":{"a":1}}"#,
            r#"{"meta":{"step_id":"\u0041"}}"#,
            r#"{"meta":{"step_id":"a\/b"}}"#,
            r#" {}"#,
        ] {
            let (_, canonical) = reader::read(body.as_bytes(), Parts::CanonicalText).unwrap();
            assert_eq!(canonical.rest, None, "{body}");
        }
        // Left out, how it is written does not count.
        let body = r#"{"cognition":{"entropy_score":9e-1},"meta":{"timestamp":"a\/b"}}"#;
        let (_, canonical) = reader::read(body.as_bytes(), Parts::CanonicalText).unwrap();
        assert_eq!(
            canonical.rest.map(|r| r.pieces().collect::<String>()),
            Some(r#"{"cognition":{},"meta":{}}"#.to_owned())
        );
    }

    #[test]
    fn built_parts_are_trees_and_skimmed_parts_their_canonical_text() {
        let (tree, canonical) = reader::read(COMPACT.as_bytes(), Parts::Built).unwrap();
        let action = tree.get("action").unwrap();
        assert!(matches!(action.get("tool_input"), Some(Json::Object(_))));
        assert!(matches!(action.get("result"), Some(Json::Object(_))));
        assert_eq!(canonical.tool_input, Some(r#"{"path":"x"}"#));
        assert_eq!(canonical.result, Some(r#"{"lines":["a","b"],"ok":true}"#));
        let (unread, again) = reader::read(COMPACT.as_bytes(), Parts::CanonicalText).unwrap();
        assert_eq!(again, canonical);
        let action = unread.get("action").unwrap();
        assert_eq!(
            action.get("tool_input"),
            Some(&Json::Canonical(r#"{"path":"x"}"#))
        );
        assert_eq!(
            action.get("result"),
            Some(&Json::Canonical(r#"{"lines":["a","b"],"ok":true}"#))
        );
    }
}

/// The reader counts a number as canonical, without writing it, only where the writer
/// writes it as it stands: the decimals it tells by their digits alone are checked
/// against the writer here.
mod numbers_written_as_they_stand {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Number;

    fn written(text: &str) -> Option<(Number, String)> {
        let number: Number = serde_json::from_str(text).ok()?;
        let mut out = String::new();
        crate::stable_json::write_number(&mut out, &number);
        Some((number, out))
    }

    fn assert_told_right(text: &str) -> Result<(), TestCaseError> {
        if let Some((number, out)) = written(text) {
            prop_assert_eq!(
                reader::written_as_it_stands(text, &number),
                out == text,
                "{} is written {}",
                text,
                out
            );
        }
        Ok(())
    }

    /// Short decimals near and inside the edges of the digits-only rule.
    fn decimal() -> impl Strategy<Value = String> {
        (
            any::<bool>(),
            prop_oneof![
                Just(0u32),
                0u32..10,
                0u32..1_000_000,
                999_990u32..10_000_000
            ],
            0usize..4,
            1u64..1_000_000_000,
            1usize..10,
        )
            .prop_map(|(negative, int, zeros, fraction, len)| {
                let fraction = format!("{}{fraction}", "0".repeat(zeros));
                let fraction = &fraction[..len.min(fraction.len())];
                format!("{}{int}.{fraction}", if negative { "-" } else { "" })
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5000))]

        #[test]
        fn short_decimals(text in decimal()) {
            assert_told_right(&text)?;
        }

        #[test]
        fn any_float(f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
            assert_told_right(&format!("{f:?}"))?;
            assert_told_right(&format!("{f}"))?;
            assert_told_right(&format!("{f:e}"))?;
            assert_told_right(&format!("{f:.3}"))?;
        }

        #[test]
        fn any_integer(n in any::<i64>()) {
            assert_told_right(&n.to_string())?;
        }
    }

    /// The digits-only rule takes the short decimals a step carries, so their check
    /// writes nothing (the writer would answer the same, only slower).
    #[test]
    fn short_decimals_are_told_from_their_digits() {
        for text in [
            "0.8",
            "-0.5",
            "3.14",
            "0.001",
            "999999.99999999",
            "123456.12345678",
        ] {
            assert!(reader::short_decimal(text.as_bytes()), "{text}");
        }
        for text in [
            "0.10",
            "1.0",
            "0.0001",
            "1000000.5",
            "01.5",
            "1.",
            ".5",
            "1e2",
            "-3",
            "0.123456789",
        ] {
            assert!(!reader::short_decimal(text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn edges() {
        for text in [
            "0.001",
            "0.0001",
            "0.5",
            "-0.5",
            "0.10",
            "1.0",
            "999999.99999999",
            "1000000.5",
            "0.00000001",
            "123456.12345678",
            "-0.0",
            "1e2",
            "0.8",
            "0.9",
            "-3",
            "-0",
        ] {
            assert_told_right(text).unwrap();
        }
    }
}
