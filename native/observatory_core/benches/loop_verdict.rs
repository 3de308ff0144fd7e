//! What the loop verdict adds to a step (issue 8: at most 1 µs at the median), with
//! the work the gateway already does per step measured in the same run:
//!
//! * `baseline_step_digests` — the step detector's canonical JSON of the input and the
//!   result and their SHA-256 (already done for every step, in the parse);
//! * `baseline_entropy_record` — `Store::record` of the step's tuple (FRD-009);
//! * `step_hashes` — the same parse pass with the verdict's keys added: the canonical
//!   text is written once and hashed twice;
//! * `verdict_keys` — what the verdict adds to that pass: normalizing the canonical
//!   text and hashing it to the step's keys (call, outcome, the result's shape, since
//!   issue 26 the input's word pairs and the result word for word);
//! * `verdict_observe` — the store update and the seven rules on a warm session
//!   (history full), in a `KeyedStore` of 1 000 sessions;
//! * `verdict_added` — `verdict_keys` + `verdict_observe`: **what the verdict adds to a
//!   step**.
//!
//! Three envelopes: `small` (a `read_file` step: ~130 B of input, ~130 B of result),
//! `medium` (an `execute_code` step: ~1 KiB of input, ~130 B of result) and `large`
//! (the same input and a log-heavy ~750 B result: timestamps, pids, trace ids and some
//! sixty numbers to examine). The normalizer's cost follows the digits more than the
//! bytes: it jumps from digit to digit. Two session shapes:
//! `varied` (64 different steps round and round, more than a session keeps: every rule
//! scans the full history and finds nothing; sixteen, since issue 26, would be a round
//! of revisits), `looping` (the same failing step: a loop verdict
//! with evidence every time) and `failing` (the 64 varied steps, each failing: every
//! step's error is read for its reply).
//!
//! cargo bench -p observatory_core --bench loop_verdict -- --warm-up-time 1 --measurement-time 3

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use observatory_core::decision_log::{step_digests, step_hashes, verdict_keys};
use observatory_core::keyed_store::KeyedStore;
use observatory_core::loop_verdict::keys::{call_shape, keys_from_canonical, Normalization};
use observatory_core::loop_verdict::shape::{collapse_whitespace, shape, Scratch};
use observatory_core::loop_verdict::{Config, EntropySignal, StepKeys, VerdictState};
use observatory_core::session_store::{Observation, Settings, Store};
use observatory_core::severity::Severity;
use observatory_core::stable_json::stable_stringify;
use serde_json::{json, Value};

const SESSIONS: usize = 1_000;

fn small(i: usize) -> Value {
    json!({
        "meta": {"step_id": format!("s-{i}"), "session_id": "sess-bench", "agent_id": "agent-1",
                 "timestamp": "2026-02-22T10:30:00Z"},
        "cognition": {"intent": "read"},
        "action": {
            "tool_call": "read_file",
            "tool_input": {"path": format!("lib/observatory/gateway/module_{i}.ex"), "encoding": "utf-8",
                           "max_bytes": 65536, "request_id": "550e8400-e29b-41d4-a716-446655440000"},
            "status": "success",
            "result": {"content": format!("defmodule Observatory.Gateway.Module{i} do\n  @moduledoc \"Step {i} of the bench.\"\nend\n"),
                       "bytes": 4211 + i, "elapsed_ms": 3}
        }
    })
}

/// An `execute_code` step with the input of [`large`] and a short result.
fn medium(i: usize) -> Value {
    let mut envelope = large(i);
    envelope["action"]["result"] = json!({
        "value": {"count": 14, "lines": 1073 + i},
        "stdout": format!("8 TypeScript files, {} lines\n", 1073 + i),
        "exit_code": 0, "elapsed_ms": 239
    });
    envelope
}

/// An `execute_code` step as agents send it: code with quotes, newlines and tabs,
/// nested options, a context array; a result with stdout, a log and timings.
fn large(i: usize) -> Value {
    let code = format!(
        "const files = await mcp.call(\"filesystem.list\", {{path: \"/work/src/{i}\"}});\nfor (const f of files) {{\n\tif (f.name.endsWith(\".ts\")) {{\n\t\tconst text = await mcp.call(\"filesystem.read\", {{path: f.path}});\n\t\tconsole.log(f.name, text.split(\"\\n\").length);\n\t}}\n}}\nreturn {{count: files.length, note: \"scan \\\"src\\\" done\"}};"
    );
    json!({
        "meta": {"step_id": format!("s-{i}"), "session_id": "sess-bench", "agent_id": "agent-1",
                 "timestamp": "2026-02-22T10:30:00Z"},
        "cognition": {"intent": "execute"},
        "action": {
            "tool_call": "execute_code",
            "tool_input": {
                "session": {"id": "sess-7f3a9c", "agent": "planner-2", "step": 17},
                "code": code,
                "options": {"timeout_ms": 30000, "sandbox": {"network": false, "memory_mb": 512,
                            "env": {"NODE_ENV": "test", "TZ": "UTC"}}, "retries": 2, "trace": true},
                "context": [
                    {"role": "user", "content": "Count the lines of every TypeScript file under src/ — skip tests.", "ts": 1739870000123u64},
                    {"role": "assistant", "content": "I'll list the directory, then read each .ts file.", "ts": 1739870001456u64},
                    {"role": "tool", "name": "filesystem.list", "status": "ok", "bytes": 2048, "ts": 1739870002789u64}
                ],
                "limits": {"max_calls": 20, "window_ms": 60000, "ratio": 0.75, "tags": ["fs", "read-only", "ünïcödé"]}
            },
            "status": "success",
            "result": {
                "stdout": format!("boot.ts 120\nconfig.ts 88\nmain.ts 341\nrouter.ts 212\nsession.ts 97\nstore.ts 154\nutil.ts 61\nworker.ts {i}\n"),
                "log": [
                    "[2026-02-22T10:30:01.112Z] INFO sandbox started pid 4242 trace 9f86d081884c7d65",
                    "[2026-02-22T10:30:01.187Z] INFO filesystem.list /work/src -> 14 entries (elapsed_ms=4)",
                    "[2026-02-22T10:30:01.342Z] INFO filesystem.read x8, 1,073 lines total",
                    "[2026-02-22T10:30:01.350Z] WARN skipped test files: main.test.ts, router.test.ts",
                    "[2026-02-22T10:30:01.351Z] INFO sandbox exited 0 after 239 ms, peak memory 61 MB"
                ],
                "value": {"count": 14, "note": "scan \"src\" done"},
                "calls": [{"tool": "filesystem.list", "ms": 4}, {"tool": "filesystem.read", "ms": 151}],
                "exit_code": 0, "elapsed_ms": 239, "request_id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
            }
        }
    })
}

fn size(envelope: &Value, key: &str) -> usize {
    stable_stringify(&envelope["action"][key]).len()
}

/// A store with `SESSIONS` sessions whose history is full of `keys` (round and round).
fn warm_store(keys: &[StepKeys], config: &Config) -> KeyedStore<VerdictState> {
    let store = KeyedStore::new(64, 100_000);
    for s in 0..SESSIONS {
        let id = format!("sess-{s:06}");
        for k in 0..config.history * 2 {
            store.update(&id, VerdictState::new, |v| {
                v.observe(keys[k % keys.len()], None, config)
            });
        }
    }
    store
}

fn bench_verdict(c: &mut Criterion) {
    let rules = Normalization::shared_default();
    let config = Config::default();
    let ids: Vec<String> = (0..SESSIONS).map(|s| format!("sess-{s:06}")).collect();
    let signal = Some(EntropySignal {
        severity: Severity::Warning,
        window: 5,
    });

    for (name, make) in [
        ("small", small as fn(usize) -> Value),
        ("medium", medium),
        ("large", large),
    ] {
        let envelopes: Vec<Value> = (0..64).map(make).collect();
        eprintln!(
            "{name}: tool_input {} B, result {} B (canonical JSON)",
            size(&envelopes[0], "tool_input"),
            size(&envelopes[0], "result")
        );
        let mut group = c.benchmark_group(format!("loop_verdict_{name}"));

        let mut i = 0usize;
        group.bench_function("baseline_step_digests", |b| {
            b.iter(|| {
                i = (i + 1) % envelopes.len();
                black_box(step_digests(black_box(&envelopes[i])))
            })
        });

        let entropy = Store::new(64, 100_000);
        let settings = Settings::default();
        let mut i = 0usize;
        group.bench_function("baseline_entropy_record", |b| {
            b.iter(|| {
                i = i.wrapping_add(7919);
                let action = &envelopes[i % envelopes.len()]["action"];
                let obs = Observation {
                    session_id: ids[i % SESSIONS].as_bytes(),
                    intent: b"execute",
                    tool_call: action["tool_call"].as_str().unwrap().as_bytes(),
                    status: 0,
                    agent_id: Some(b"agent-1"),
                };
                black_box(entropy.record(&obs, &settings, |s| s.score).unwrap())
            })
        });

        let mut i = 0usize;
        group.bench_function("step_hashes", |b| {
            b.iter(|| {
                i = (i + 1) % envelopes.len();
                black_box(step_hashes(black_box(&envelopes[i]), rules))
            })
        });

        // The canonical text the parse pass has written anyway.
        let texts: Vec<(String, String)> = envelopes
            .iter()
            .map(|e| {
                let action = &e["action"];
                (
                    stable_stringify(&action["tool_input"]),
                    stable_stringify(&action["result"]),
                )
            })
            .collect();
        let tool = envelopes[0]["action"]["tool_call"].as_str().unwrap();
        let mut i = 0usize;
        group.bench_function("verdict_keys", |b| {
            b.iter(|| {
                i = (i + 1) % texts.len();
                let (input, result) = &texts[i];
                black_box(keys_from_canonical(
                    tool,
                    "success",
                    black_box(input),
                    Some(result),
                    rules,
                ))
            })
        });

        // Its parts (issue 11): the input's whitespace collapsed, the result's shape.
        let mut out = Vec::new();
        let mut i = 0usize;
        group.bench_function("keys_collapse_input", |b| {
            b.iter(|| {
                i = (i + 1) % texts.len();
                out.clear();
                collapse_whitespace(black_box(texts[i].0.as_bytes()), &mut out);
                black_box(out.len())
            })
        });
        // Issue 26: the input's shape (its word pairs), for nearly identical calls.
        let mut i = 0usize;
        group.bench_function("keys_shape_input", |b| {
            b.iter(|| {
                i = (i + 1) % texts.len();
                black_box(call_shape(black_box(texts[i].0.as_bytes())))
            })
        });
        let mut scratch = Scratch::default();
        let mut i = 0usize;
        group.bench_function("keys_shape_result", |b| {
            b.iter(|| {
                i = (i + 1) % texts.len();
                black_box(shape(
                    "success",
                    black_box(texts[i].1.as_bytes()),
                    &mut scratch,
                ))
            })
        });

        let keys: Vec<StepKeys> = envelopes.iter().map(|e| verdict_keys(e, rules)).collect();
        for (shape, shape_keys) in [
            ("varied", keys.clone()),
            (
                "looping",
                vec![StepKeys {
                    failure: true,
                    ..keys[0]
                }],
            ),
            (
                "failing",
                keys.iter()
                    .map(|k| StepKeys {
                        failure: true,
                        ..*k
                    })
                    .collect(),
            ),
        ] {
            let store = warm_store(&shape_keys, &config);
            let mut i = 0usize;
            group.bench_with_input(
                BenchmarkId::new("verdict_observe", shape),
                &shape,
                |b, _| {
                    b.iter(|| {
                        i = i.wrapping_add(7919);
                        let step = shape_keys[i % shape_keys.len()];
                        black_box(store.update(&ids[i % SESSIONS], VerdictState::new, |v| {
                            v.observe(step, signal, &config)
                        }))
                    })
                },
            );

            let mut i = 0usize;
            let status = if shape == "varied" {
                "success"
            } else {
                "failure"
            };
            let n = shape_keys.len();
            group.bench_with_input(BenchmarkId::new("verdict_added", shape), &shape, |b, _| {
                b.iter(|| {
                    i = i.wrapping_add(7919);
                    let (input, result) = &texts[i % n];
                    let step =
                        keys_from_canonical(tool, status, black_box(input), Some(result), rules);
                    black_box(store.update(&ids[i % SESSIONS], VerdictState::new, |v| {
                        v.observe(step, signal, &config)
                    }))
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_verdict);
criterion_main!(benches);
