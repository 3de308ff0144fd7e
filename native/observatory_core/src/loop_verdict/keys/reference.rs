//! [`keys_from_canonical`](super::keys_from_canonical) as it was before its result was
//! read in fewer passes: the oracle the tests hold the fast version to, key for key.
//! No buffers kept, no replies remembered, the result's shape read by
//! [`shape::reference`](crate::loop_verdict::shape::reference).

use super::{
    call_shape, is_failure, mix, r4, r8, reply, wording, Normalization, WordSet, ABSENT, CALL_SEED,
    EXACT_BYTES, EXACT_SEED, OUTCOME_SEED, S0, S1, S2, S3, SEPARATOR, TOOL_SEED,
};
use crate::loop_verdict::shape::{collapse_whitespace, reference::shape};
use crate::loop_verdict::StepKeys;
use crate::normalize::normalize_json_ids_into;

pub fn keys_from_canonical(
    tool: &str,
    status: &str,
    input: &str,
    result: Option<&str>,
    rules: &Normalization,
) -> StepKeys {
    let mut buf = Vec::new();
    buf.extend_from_slice(tool.as_bytes());
    buf.push(SEPARATOR);
    let mut text = Vec::new();
    normalize_json_ids_into(input, &rules.input, &mut text);
    collapse_whitespace(&text, &mut buf);
    let call = hash64(&buf, CALL_SEED);
    let input = tool.len() + 1..buf.len();
    let shape_of_call = call_shape(&buf[input.clone()]);
    let wording = wording(&buf[input.clone()], call);
    let failure = is_failure(status);
    buf.extend_from_slice(status.as_bytes());
    buf.push(SEPARATOR);
    let result_start = buf.len();
    let result_shape = match result {
        Some(result) => {
            normalize_json_ids_into(result, &rules.result, &mut buf);
            Some(shape(status, &buf[result_start..]))
        }
        None => {
            buf.push(ABSENT);
            None
        }
    };
    let outcome = hash64(&buf[input.end..], OUTCOME_SEED);
    let exact = match result {
        None => outcome,
        Some(_) if failure => reply(status, &buf[result_start..], &WordSet::of(&buf[input])),
        Some(r) => hash64(
            &r.as_bytes()[..r.len().min(EXACT_BYTES)],
            EXACT_SEED ^ r.len() as u64,
        ),
    };
    StepKeys {
        call,
        tool: hash64(tool.as_bytes(), TOOL_SEED),
        shape: shape_of_call,
        wording,
        outcome,
        exact,
        gist: result_shape.map_or(outcome, |s| s.gist),
        skeleton: result_shape.map_or(outcome, |s| s.skeleton),
        lines: result_shape.map(|s| s.lines).unwrap_or_default(),
        has_result: result.is_some(),
        failure,
        blank: result_shape.is_none_or(|s| s.blank),
        numbers: result_shape.map(|s| s.numbers).unwrap_or_default(),
        opening: result_shape.map_or(0, |s| s.opening),
    }
}

/// [`hash64`](super::hash64) as it was first written, all in one: a 64-bit hash of `data` (wyhash's structure: three lanes of 16 bytes per round
/// over long inputs, the first and last bytes for short ones). Fixed constants: the
/// same bytes and seed give the same hash on every machine and run (a golden value in
/// the tests pins it).
pub fn hash64(data: &[u8], seed: u64) -> u64 {
    let len = data.len();
    let mut seed = seed ^ mix(seed ^ S0, S1);
    let (a, b) = if len <= 16 {
        if len >= 4 {
            let q = (len >> 3) << 2;
            (
                (r4(data, 0) << 32) | r4(data, q),
                (r4(data, len - 4) << 32) | r4(data, len - 4 - q),
            )
        } else if len > 0 {
            let wide = (u64::from(data[0]) << 16)
                | (u64::from(data[len >> 1]) << 8)
                | u64::from(data[len - 1]);
            (wide, 0)
        } else {
            (0, 0)
        }
    } else {
        let mut p = data;
        if p.len() > 48 {
            let (mut s1, mut s2) = (seed, seed);
            while p.len() > 48 {
                seed = mix(r8(p, 0) ^ S1, r8(p, 8) ^ seed);
                s1 = mix(r8(p, 16) ^ S2, r8(p, 24) ^ s1);
                s2 = mix(r8(p, 32) ^ S3, r8(p, 40) ^ s2);
                p = &p[48..];
            }
            seed ^= s1 ^ s2;
        }
        while p.len() > 16 {
            seed = mix(r8(p, 0) ^ S1, r8(p, 8) ^ seed);
            p = &p[16..];
        }
        (r8(data, len - 16), r8(data, len - 8))
    };
    let r = u128::from(a ^ S1) * u128::from(b ^ seed);
    mix((r as u64) ^ S0 ^ len as u64, ((r >> 64) as u64) ^ S1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stable_json::stable_stringify;
    use proptest::prelude::*;
    use serde_json::Value;

    /// Pieces of text where the readers take decisions: escapes, quotes, digit runs,
    /// ids of every kind, volatile words, runs of spaces, non-ASCII, JSON punctuation.
    const PIECES: &[&str] = &[
        "a",
        "Zq",
        "an",
        "or",
        "Xr",
        "word",
        "handle_call",
        " ",
        "  ",
        "   ",
        "\\n",
        "\\r",
        "\\t",
        "\\\\",
        "\\\"",
        "\\u00e9",
        "\\u12",
        "\\",
        "\"",
        "\":\"",
        "\":",
        ",\"",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "0",
        "7",
        "42",
        "3.14",
        "-",
        "_",
        ".",
        "/",
        "#",
        "é",
        "中文",
        "🦀",
        "\u{a0}",
        "2026-02-22T10:30:01Z",
        "2026-02-22",
        "1739870000123",
        "1739870000",
        "550e8400-e29b-41d4-a716-446655440000",
        "9f86d081884c7d65",
        "deadbeef",
        "abc123def",
        "pid",
        "\"pid\":",
        "\"request_id\":\"req-",
        "elapsed_ms",
        "pid 4242",
        "null",
        "true",
    ];

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            // Pieces in any order: not JSON at all, often.
            prop::collection::vec(prop::sample::select(PIECES), 0..120).prop_map(|p| p.concat()),
            // Any characters.
            ".{0,200}",
            // A long line, no line break: one piece repeated past every bound.
            (prop::sample::select(PIECES), 1usize..700).prop_map(|(p, n)| p.repeat(n)),
        ]
    }

    /// Canonical JSON as the gateway hands it over: a value from arbitrary pieces.
    fn canonical() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            text().prop_map(Value::String),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<bool>().prop_map(Value::Bool),
            Just(Value::Null),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![text(), prop::sample::select(PIECES).prop_map(String::from)],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
        .prop_map(|v| stable_stringify(&v))
    }

    fn status() -> impl Strategy<Value = &'static str> {
        prop::sample::select(&["success", "failure", "error", "timeout", "", "pending"][..])
    }

    fn same_keys(tool: &str, status: &str, input: &str, result: Option<&str>) {
        for rules in [
            Normalization::default(),
            Normalization {
                input: crate::normalize::IdRules {
                    numbers: true,
                    ..Default::default()
                },
                result: crate::normalize::IdRules {
                    numbers: true,
                    hex_ids: false,
                    volatile: crate::normalize::VolatileWords::new(Vec::<&str>::new()),
                    ..Default::default()
                },
            },
        ] {
            assert_eq!(
                super::super::keys_from_canonical(tool, status, input, result, &rules),
                keys_from_canonical(tool, status, input, result, &rules),
                "{tool:?} {status:?} {input:?} {result:?}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn hash64_is_the_reference_s(
            data in prop::collection::vec(any::<u8>(), 0..300),
            seed in any::<u64>(),
        ) {
            prop_assert_eq!(super::super::hash64(&data, seed), hash64(&data, seed));
        }

        #[test]
        fn keys_of_canonical_json_are_the_reference_s(
            tool in "[a-z_]{0,12}",
            status in status(),
            input in canonical(),
            result in prop::option::of(canonical()),
        ) {
            same_keys(&tool, status, &input, result.as_deref());
        }

        #[test]
        fn keys_of_any_text_are_the_reference_s(
            status in status(),
            input in text(),
            result in text(),
        ) {
            same_keys("sh", status, &input, Some(&result));
        }

        /// A string value of any text, as the gateway's results mostly are, in an
        /// object, with as many lines and as long ones as the bounds.
        #[test]
        fn keys_of_a_string_result_are_the_reference_s(
            status in status(),
            body in text(),
            lines in 0usize..600,
            numbered in any::<bool>(),
            indent in 0usize..4,
        ) {
            let line: String = body.chars().take(40).collect();
            let mut content = body.clone();
            for k in 0..lines {
                content.push('\n');
                // Indented as code is: spaces before the line's first run.
                content.push_str(&" ".repeat(indent));
                content.push_str(&line);
                if numbered {
                    content.push_str(&k.to_string());
                }
            }
            let result = stable_stringify(&serde_json::json!({"content": content, "lines": lines}));
            same_keys("read_file", status, r#"{"path":"/srv/a.ex"}"#, Some(&result));
        }
    }
}
