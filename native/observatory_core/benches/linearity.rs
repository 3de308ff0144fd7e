//! Every parser and normalizer a step goes through runs in time linear in its input.
//!
//! For each parser and each input shape, the bench times the parser on 64 KiB and on
//! 1 MiB of that shape and prints the cost per byte at both sizes. Linear work costs
//! the same per byte at both (a ratio near 1×); quadratic work costs 16× more per byte
//! at 1 MiB. Each shape is also compared with plain prose of the same size, timed in
//! the same run: the `vs text` column is how much more a byte of that shape costs
//! than a byte of prose.
//!
//! The shapes are what tool output really holds (CSV, number lists, logs full of
//! timestamps and ids, JSON arrays) and the worst cases of each recognizer: long
//! chains of separators, dates, UUID and hex fragments that almost match, escapes,
//! backslash runs, whitespace runs. `tests/linearity.rs` generates the same shapes
//! with proptest.
//!
//! cargo bench -p observatory_core --bench linearity                 # 64 KiB vs 1 MiB
//! cargo bench -p observatory_core --bench linearity -- --quick      # 16 KiB vs 256 KiB
//! cargo bench -p observatory_core --bench linearity -- --every-shape # a row per shape
//!
//! Times are the thread's CPU time (best of several runs), so a loaded machine does not
//! inflate them; cache effects remain (a 1 MiB input and its copies do not fit in L2).
//!
//! The exit status is non-zero when some parser costs more than 4× per byte at the
//! large size (so CI could run `--quick` as a gate), but the figure that matters is
//! the table.

use std::hint::black_box;
use std::time::{Duration, Instant};

use observatory_core::conversation::PromptSource;
use observatory_core::decision_log::{check, hashes_of, read};
use observatory_core::loop_verdict::keys::{keys_from_canonical, Normalization};
use observatory_core::messages::request_fingerprint;
use observatory_core::normalize::{normalize, normalize_hex_ids, normalize_ids, IdRules};
use observatory_core::replay::{read_line, Line};
use observatory_core::simhash::fingerprint;
use observatory_core::stable_json::stable_stringify;
use serde_json::{json, Value};

mod cpu_time;
use cpu_time::thread_cpu_ns;

/// A named input shape: `make(n)` gives about `n` bytes of it.
struct Shape {
    name: &'static str,
    make: fn(usize) -> String,
}

/// Whole copies of `unit`, about `n` bytes in all.
fn repeat_to(unit: &str, n: usize) -> String {
    unit.repeat((n / unit.len()).max(1))
}

const PROSE: &str = "The agent read the configuration file and found that the \
    service listens on the loopback interface only; it then asked the operator \
    whether to open the port, and waited for an answer before going on. ";

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "prose (baseline)",
            make: |n| repeat_to(PROSE, n),
        },
        Shape {
            name: "csv 1,1,1",
            make: |n| repeat_to("1,", n),
        },
        Shape {
            name: "decimals 1.2.3",
            make: |n| repeat_to("1.2.", n),
        },
        Shape {
            name: "csv rows 10,200,3.5\\n",
            make: |n| repeat_to("10,200,3.5,4000\n", n),
        },
        Shape {
            name: "one digit run",
            make: |n| repeat_to("7", n),
        },
        Shape {
            name: "digit-dash 1-1-1",
            make: |n| repeat_to("1-", n),
        },
        Shape {
            name: "dates 2024-01-15,",
            make: |n| repeat_to("2024-01-15,", n),
        },
        Shape {
            name: "near dates 2024-01-",
            make: |n| repeat_to("2024-01-", n),
        },
        Shape {
            name: "timestamp fraction",
            make: |n| format!("2024-01-15T10:30:00.{}", repeat_to("1", n)),
        },
        Shape {
            name: "epochs 1739870000,",
            make: |n| repeat_to("1739870000,", n),
        },
        Shape {
            name: "uuids",
            make: |n| repeat_to("550e8400-e29b-41d4-a716-446655440000 ", n),
        },
        Shape {
            name: "uuid groups a1b2c3d4-",
            make: |n| repeat_to("a1b2c3d4-", n),
        },
        Shape {
            name: "hex word",
            make: |n| repeat_to("a1", n),
        },
        Shape {
            name: "hex ids a1b2c3d4e5 ",
            make: |n| repeat_to("a1b2c3d4e5 ", n),
        },
        Shape {
            name: "volatile pid 1 ",
            make: |n| repeat_to("pid 1 ", n),
        },
        Shape {
            name: "volatile pid=1,1,1",
            make: |n| format!("pid={}", repeat_to("1,", n)),
        },
        Shape {
            name: "spaces",
            make: |n| repeat_to("  ", n),
        },
        Shape {
            name: "lines 1\\n",
            make: |n| repeat_to("1\n", n),
        },
        Shape {
            name: "unicode spaces",
            make: |n| repeat_to("\u{3000}\u{a0}1", n),
        },
        Shape {
            name: "backslashes \\\\\\\"1",
            make: |n| repeat_to("\\\\\\\\\\\\\\\\\"1 ", n),
        },
        Shape {
            name: "quotes \"1\"",
            make: |n| repeat_to("\"1\",", n),
        },
        Shape {
            name: "objects {\"k\":[0]},",
            make: |n| repeat_to("{\"k\":[0]},", n),
        },
        Shape {
            name: "empty lists [],",
            make: |n| repeat_to("[],", n),
        },
    ]
}

/// A parser: `prepare` makes its input from a text of the shape (outside the timing;
/// `None` when the shape is not an input it takes), `run` parses it.
struct Parser {
    name: &'static str,
    prepare: fn(&str) -> Option<Vec<u8>>,
    run: fn(&[u8]) -> usize,
}

fn envelope(result: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "meta": {"step_id": "s-1", "session_id": "sess-1", "agent_id": "agent-1",
                 "timestamp": "2026-02-22T10:30:00Z"},
        "cognition": {"intent": "run"},
        "action": {"tool_call": "run_shell", "tool_input": {"cmd": "cat data.csv"},
                   "status": "success", "result": result}
    }))
    .unwrap()
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

fn as_is(t: &str) -> Option<Vec<u8>> {
    Some(t.as_bytes().to_vec())
}

fn parsers() -> Vec<Parser> {
    vec![
        Parser {
            name: "normalize (kill switch)",
            prepare: as_is,
            run: |b| normalize(text(b)).len(),
        },
        Parser {
            name: "normalize_hex_ids",
            prepare: as_is,
            run: |b| normalize_hex_ids(text(b)).len(),
        },
        Parser {
            name: "normalize_ids (verdict)",
            prepare: as_is,
            run: |b| normalize_ids(text(b), &IdRules::default()).len(),
        },
        Parser {
            name: "fingerprint (SimHash)",
            prepare: as_is,
            run: |b| fingerprint(text(b)) as usize,
        },
        Parser {
            name: "verdict keys of a result",
            // The result as the gateway holds it: the canonical JSON of the string.
            prepare: |t| Some(stable_stringify(&Value::String(t.to_owned())).into_bytes()),
            run: |b| {
                let keys = keys_from_canonical(
                    "run_shell",
                    "success",
                    "null",
                    Some(text(b)),
                    Normalization::shared_default(),
                );
                keys.outcome as usize
            },
        },
        Parser {
            name: "step, text result",
            // What a step costs in Rust (decision_log_parse without the terms): parse,
            // validate, canonical JSON, SHA-256 and verdict keys.
            prepare: |t| Some(envelope(Value::String(t.to_owned()))),
            run: ingest,
        },
        Parser {
            name: "step, JSON result",
            // The shape as JSON itself where it is (`1,1,1` → `[1,1,1,0]`), else a
            // list of the text as a string (prose: `["The agent…"]`).
            prepare: |t| {
                let value = serde_json::from_str::<Value>(&format!("[{t}0]"))
                    .unwrap_or_else(|_| json!([t]));
                Some(envelope(value))
            },
            run: ingest,
        },
        Parser {
            name: "proxy request fingerprint",
            prepare: |t| {
                serde_json::to_vec(&json!({"model": "m", "messages": [
                    {"role": "user", "content": t},
                    {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                        "function": {"name": "f", "arguments": t}}]}]}))
                .ok()
            },
            run: |b| {
                let request: Value = serde_json::from_slice(b).unwrap();
                request_fingerprint(&request, PromptSource::default())
                    .unwrap()
                    .tool_signatures
                    .len()
            },
        },
        Parser {
            name: "replay line",
            prepare: |t| {
                serde_json::to_vec(&json!({"session_id": "s", "tool_call": "t",
                    "status": "success", "result": t}))
                .ok()
            },
            run: |b| match read_line(b, "agent", "2026-02-22T10:30:00Z").unwrap() {
                Line::Flat { head, .. } => head.len(),
                Line::Envelope { .. } => 0,
            },
        },
    ]
}

fn ingest(body: &[u8]) -> usize {
    let tree = read(body).unwrap();
    check(&tree).unwrap();
    let hashes = hashes_of(&tree, Normalization::shared_default());
    hashes.verdict.outcome as usize
}

/// Best CPU time of enough runs to fill about `budget`, in nanoseconds per byte. The
/// thread's CPU clock, not the wall clock: on a shared machine a run preempted half way
/// would otherwise count the other processes' time as its own.
fn ns_per_byte(run: fn(&[u8]) -> usize, input: &[u8], budget: Duration) -> f64 {
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut runs = 0;
    while runs < 5 || (start.elapsed() < budget && runs < 1000) {
        let t = thread_cpu_ns();
        black_box(run(black_box(input)));
        best = best.min((thread_cpu_ns() - t) as f64);
        runs += 1;
    }
    best / input.len() as f64
}

/// One parser on one shape: cost per byte at both sizes.
struct Row {
    shape: &'static str,
    small: f64,
    large: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let every_shape = args.iter().any(|a| a == "--every-shape");
    let (small, large) = if quick {
        (16 << 10, 256 << 10)
    } else {
        (64 << 10, 1 << 20)
    };
    let budget = Duration::from_millis(if quick { 40 } else { 150 });
    let label = |n: usize| {
        if n >= 1 << 20 {
            format!("{} MiB", n >> 20)
        } else {
            format!("{} KiB", n >> 10)
        }
    };
    let (small_label, large_label) = (label(small), label(large));
    let mut summary = Vec::new();
    if every_shape {
        println!("| parser | input | ns/B at {small_label} | ns/B at {large_label} | growth | vs prose |");
        println!("|---|---|---:|---:|---:|---:|");
    }
    for parser in parsers() {
        let mut rows = Vec::new();
        for shape in shapes() {
            let (Some(at_small), Some(at_large)) = (
                (parser.prepare)(&(shape.make)(small)),
                (parser.prepare)(&(shape.make)(large)),
            ) else {
                continue;
            };
            rows.push(Row {
                shape: shape.name,
                small: ns_per_byte(parser.run, &at_small, budget),
                large: ns_per_byte(parser.run, &at_large, budget),
            });
        }
        // The first shape every parser takes is prose: the baseline.
        let prose = rows[0].large;
        if every_shape {
            for row in &rows {
                println!(
                    "| {} | {} | {:.2} | {:.2} | {:.2}× | {:.1}× |",
                    parser.name,
                    row.shape,
                    row.small,
                    row.large,
                    row.large / row.small,
                    row.large / prose
                );
            }
        }
        summary.push((parser.name, rows));
    }
    println!(
        "\n| parser | prose, ns/B at {large_label} | costliest shape | its ns/B at {small_label} → {large_label} | × prose | most growth per byte, {small_label} → {large_label} |"
    );
    println!("|---|---:|---|---:|---:|---:|");
    let mut worst: f64 = 0.0;
    for (name, rows) in &summary {
        let prose = rows[0].large;
        let costliest = rows
            .iter()
            .max_by(|a, b| a.large.total_cmp(&b.large))
            .unwrap();
        let growth = rows
            .iter()
            .map(|r| (r.large / r.small, r.shape))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap();
        worst = worst.max(growth.0);
        println!(
            "| {name} | {prose:.2} | {} | {:.2} → {:.2} | {:.1}× | {:.2}× ({}) |",
            costliest.shape,
            costliest.small,
            costliest.large,
            costliest.large / prose,
            growth.0,
            growth.1
        );
    }
    println!("\nworst growth of the cost per byte: {worst:.2}× (linear: 1×; quadratic: 16×)");
    if worst > 4.0 {
        eprintln!("some parser is not linear: its cost per byte grew {worst:.1}×");
        std::process::exit(1);
    }
}
