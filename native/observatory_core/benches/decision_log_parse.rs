//! The parse stage of one ingest, in Rust alone: the three steps of
//! `bench/ingest_breakdown.exs` (small, 600 B, 4 KiB) through parse, validate, the
//! step's hashes and its body fingerprint, batches of each way alternated in the same
//! run: the `serde_json::Value` path of two rounds ago (`decision_log::value_path`), the
//! borrowed tree read by serde_json's parser (the last round's), and the reader of our
//! own that the gateway takes now (`decision_log::read_step`: the same tree, and the
//! input's and result's canonical text taken from the body), each stage added in turn.
//! The last rows are the whole's speed-ups.
//!
//! cargo bench -p observatory_core --bench decision_log_parse
//! cargo bench -p observatory_core --bench decision_log_parse -- --quick
//!
//! Times are the thread's CPU time per call, the median of many batches, so a loaded
//! machine's preemptions do not count.

use std::hint::black_box;

use observatory_core::decision_log::value_path::{body_fingerprint, step_hashes, validate};
use observatory_core::decision_log::{
    check, fingerprint_of, fingerprint_with, hashes_of, hashes_with, parse, read_step, Json, Parts,
};
use observatory_core::loop_verdict::keys::Normalization;

mod breakdown_step;
mod cpu_time;
mod fleet;
use breakdown_step::{median, print_head, print_rows, SIZES};
use cpu_time::thread_cpu_ns;
use fleet::INTENTS;

/// The bench's step `i` of a size, as `Observatory.JSON.encode!` writes it (keys sorted).
fn step(size: &str, i: usize) -> String {
    let (s, k) = breakdown_step::session_and_round(i);
    let step_id = format!("r1-{i}");
    let intent = INTENTS[(k + s) % 4];
    let cognition = if size == "small" {
        format!(r#"{{"entropy_score":0.9,"intent":"{intent}"}}"#)
    } else {
        format!(
            r#"{{"confidence":0.8,"entropy_score":0.9,"intent":"{intent}","reasoning_chain":["read the failing test","open the module it names"]}}"#
        )
    };
    format!(
        r#"{{"action":{{"result":{result},"status":"{status}","tool_call":"{tool}","tool_input":{input}}},"cognition":{cognition},"meta":{{"agent_id":"agent-{agent}","parent_step_id":"step-{prev}","session_id":"sess-{size}-{s}","step_id":"{step_id}","timestamp":"2026-02-22T10:30:00.123Z"}}}}"#,
        result = breakdown_step::result(size, i),
        status = breakdown_step::status(i),
        tool = breakdown_step::tool(i),
        input = breakdown_step::input(i),
        agent = s % 50,
        prev = i as i64 - 1,
    )
}

const BATCH: usize = 200;

/// One batch of `BATCH` calls of `stage` over `steps`: CPU ns per call.
fn batch(steps: &[String], from: usize, stage: &dyn Fn(&[u8])) -> f64 {
    let t0 = thread_cpu_ns();
    for n in 0..BATCH {
        stage(black_box(steps[(from + n) % steps.len()].as_bytes()));
    }
    (thread_cpu_ns() - t0) as f64 / BATCH as f64
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let batches = if quick { 200 } else { 1000 };
    let rules = Normalization::shared_default();
    type Stage<'r> = (&'static str, Box<dyn Fn(&[u8]) + 'r>);
    let stages: Vec<Stage> = vec![
        (
            "Value: whole",
            Box::new(|b| {
                let v = parse(b).unwrap();
                black_box(validate(&v).unwrap());
                let h = step_hashes(&v, rules);
                black_box(body_fingerprint(&v, &h));
            }),
        ),
        (
            "serde tree: read",
            Box::new(|b| {
                black_box(Json::read_with_serde(b).unwrap());
            }),
        ),
        (
            "serde tree: whole",
            Box::new(|b| {
                let v = Json::read_with_serde(b).unwrap();
                black_box(check(&v).unwrap());
                let h = hashes_of(&v, rules);
                black_box(fingerprint_of(&v, &h));
            }),
        ),
        (
            "reader: read",
            Box::new(|b| {
                black_box(read_step(b, Parts::CanonicalText).unwrap());
            }),
        ),
        (
            "reader: + check",
            Box::new(|b| {
                let (v, _) = read_step(b, Parts::CanonicalText).unwrap();
                black_box(check(&v).unwrap());
            }),
        ),
        (
            "reader: + step hashes",
            Box::new(|b| {
                let (v, text) = read_step(b, Parts::CanonicalText).unwrap();
                black_box(check(&v).unwrap());
                black_box(hashes_with(&v, text, rules));
            }),
        ),
        (
            "reader: whole (+ fingerprint)",
            Box::new(|b| {
                let (v, text) = read_step(b, Parts::CanonicalText).unwrap();
                black_box(check(&v).unwrap());
                let h = hashes_with(&v, text, rules);
                black_box(fingerprint_with(&v, &text, &h));
            }),
        ),
        (
            "  its fingerprint written",
            Box::new(|b| {
                let (v, text) = read_step(b, Parts::CanonicalText).unwrap();
                black_box(check(&v).unwrap());
                let h = hashes_with(&v, text, rules);
                black_box(fingerprint_of(&v, &h));
            }),
        ),
    ];
    println!("CPU ns per call, median of {batches} batches of {BATCH}");
    print_head();
    let mut table = vec![vec![0.0; 3]; stages.len()];
    // For profiling: ONLY="600 B" STAGE="borrowed: read" runs that one alone.
    let only = std::env::var("ONLY").ok();
    let only_stage = std::env::var("STAGE").ok();
    for (col, size) in SIZES.iter().enumerate() {
        if only.as_deref().is_some_and(|o| o != *size) {
            continue;
        }
        let steps: Vec<String> = (0..2000).map(|i| step(size, i)).collect();
        let mut times = vec![Vec::new(); stages.len()];
        for b in 0..batches {
            for (row, (name, stage)) in stages.iter().enumerate() {
                if only_stage.as_deref().is_some_and(|o| o != *name) {
                    continue;
                }
                times[row].push(batch(&steps, b * BATCH, stage.as_ref()));
            }
        }
        for (row, t) in times.into_iter().enumerate().filter(|(_, t)| !t.is_empty()) {
            table[row][col] = median(t);
        }
    }
    print_rows(stages.iter().map(|(name, _)| *name), &table);
    for (label, old) in [
        ("whole: Value / reader", 0),
        ("whole: serde tree / reader", 2),
    ] {
        print!("{label:<32}");
        for (o, n) in table[old].iter().zip(&table[6]) {
            print!("{:>9.2}x", o / n);
        }
        println!();
    }
}
