//! The per-step and per-call costs of seed 002's loop detection:
//!
//! * hashing a ~1 KiB `tool_input`: `stable_hash` against `serde_json::to_string` +
//!   SHA-256 in the same run, so the price of the canonical form is the ratio;
//! * `CallCircuitBreaker::check` on one warm key (allow and deny paths) and over 10 000
//!   distinct keys;
//! * `StepLoopDetector::analyze` with the history full.
//!
//! cargo bench -p observatory_core --bench step_detection -- --warm-up-time 1 --measurement-time 3

use std::hint::black_box;
use std::num::NonZeroUsize;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use observatory_core::call_circuit_breaker::{CallCircuitBreaker, Config};
use observatory_core::stable_json::{stable_hash, stable_stringify, Digest};
use observatory_core::step_loop_detector::{StepLoopDetector, Thresholds};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// An `execute_code` step's input as an agent sends it: code with quotes, newlines and
/// tabs, nested options, an array of objects. Keys deliberately out of order.
const TOOL_INPUT: &str = r#"{
  "tool": "execute_code",
  "session": {"id": "sess-7f3a9c", "agent": "planner-2", "step": 17},
  "code": "const files = await mcp.call(\"filesystem.list\", {path: \"/work/src\"});\nfor (const f of files) {\n\tif (f.name.endsWith(\".ts\")) {\n\t\tconst text = await mcp.call(\"filesystem.read\", {path: f.path});\n\t\tconsole.log(f.name, text.split(\"\\n\").length);\n\t}\n}\nreturn {count: files.length, note: \"scan \\\"src\\\" done\"};",
  "options": {
    "timeout_ms": 30000,
    "sandbox": {"network": false, "memory_mb": 512, "env": {"NODE_ENV": "test", "TZ": "UTC"}},
    "retries": 2,
    "trace": true
  },
  "context": [
    {"role": "user", "content": "Count the lines of every TypeScript file under src/ — skip tests.", "ts": 1739870000123},
    {"role": "assistant", "content": "I'll list the directory, then read each .ts file.", "ts": 1739870001456},
    {"role": "tool", "name": "filesystem.list", "status": "ok", "bytes": 2048, "ts": 1739870002789}
  ],
  "limits": {"max_calls": 20, "window_ms": 60000, "ratio": 0.75, "tags": ["fs", "read-only", "ünïcödé"]}
}"#;

fn sha256(text: &str) -> Digest {
    Sha256::digest(text.as_bytes()).into()
}

fn digest(i: u64) -> Digest {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&i.to_le_bytes());
    d[8..16].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
    d
}

fn bench_hash(c: &mut Criterion) {
    let value: Value = serde_json::from_str(TOOL_INPUT).unwrap();
    let bytes = stable_stringify(&value).len() as u64;
    let mut group = c.benchmark_group("hash_tool_input");
    group.throughput(Throughput::Bytes(bytes));
    group.bench_function("baseline_to_string_sha256", |b| {
        b.iter(|| sha256(&serde_json::to_string(black_box(&value)).unwrap()))
    });
    group.bench_function("stable_hash", |b| b.iter(|| stable_hash(black_box(&value))));
    group.bench_function("baseline_to_string", |b| {
        b.iter(|| serde_json::to_string(black_box(&value)).unwrap())
    });
    group.bench_function("stable_stringify", |b| {
        b.iter(|| stable_stringify(black_box(&value)))
    });
    group.finish();
}

fn bench_breaker(c: &mut Criterion) {
    let mut group = c.benchmark_group("breaker_check");
    group.throughput(Throughput::Elements(1));
    let args = digest(42);

    // One call every 3.001 s keeps 20 in the window: each check expires one and allows one.
    let mut cb = CallCircuitBreaker::new(Config::default()).unwrap();
    let mut now = 0u64;
    group.bench_function("warm_key_allow", |b| {
        b.iter(|| {
            now += 3_001;
            cb.check(black_box("filesystem.read"), black_box(args), now)
        })
    });

    let mut cb = CallCircuitBreaker::new(Config::default()).unwrap();
    for _ in 0..20 {
        cb.check("filesystem.read", args, 0);
    }
    group.bench_function("warm_key_deny", |b| {
        b.iter(|| cb.check(black_box("filesystem.read"), black_box(args), black_box(1)))
    });

    let keys = 10_000u64;
    let digests: Vec<Digest> = (0..keys).map(digest).collect();
    let mut cb = CallCircuitBreaker::new(Config::default()).unwrap();
    let mut i = 0usize;
    let mut now = 0u64;
    group.bench_with_input(BenchmarkId::new("distinct_keys", keys), &keys, |b, _| {
        b.iter(|| {
            // 1 ms per call: each key comes round every 10 s, 6 calls in its window.
            now += 1;
            i = (i + 1) % digests.len();
            cb.check(black_box("filesystem.read"), digests[i], now)
        })
    });
    group.finish();
}

fn bench_analyze(c: &mut Criterion) {
    let mut group = c.benchmark_group("step_analyze");
    group.throughput(Throughput::Elements(1));
    let history = NonZeroUsize::new(64).unwrap();

    // Every step new: FullProgress, and each push evicts the oldest of 64.
    let mut det = StepLoopDetector::with_history(Thresholds::default(), history).unwrap();
    let mut i = 0u64;
    group.bench_function("full_progress", |b| {
        b.iter(|| {
            i += 2;
            det.analyze(digest(i), digest(i + 1))
        })
    });

    // 32 approaches round and round, each step a new outcome: WorldChanged.
    let mut det = StepLoopDetector::with_history(Thresholds::default(), history).unwrap();
    let mut i = 0u64;
    group.bench_function("world_changed", |b| {
        b.iter(|| {
            i += 1;
            det.analyze(digest(i % 32), digest(1_000_000 + i))
        })
    });
    group.finish();
}

criterion_group!(benches, bench_hash, bench_breaker, bench_analyze);
criterion_main!(benches);
