//! The loop verdict's keys over one step's canonical input and result, in Rust alone:
//! the three steps of `bench/ingest_breakdown.exs` (small, 600 B, 4 KiB) as the parse
//! hands them to `keys_from_canonical`, and that function's pieces on their own.
//!
//! cargo bench -p observatory_core --bench verdict_keys
//! cargo bench -p observatory_core --bench verdict_keys -- --quick
//!
//! Times are the thread's CPU time per call, the median of many batches.

use std::hint::black_box;

use observatory_core::loop_verdict::keys::{hash64, keys_from_canonical, Normalization};
use observatory_core::loop_verdict::shape::{shape, Scratch};
use observatory_core::normalize::normalize_json_ids_into;

mod breakdown_step;
mod cpu_time;
// The steps' tools; its intents are not read here.
#[allow(dead_code)]
mod fleet;
use breakdown_step::{median, print_head, print_rows, SIZES};
use cpu_time::thread_cpu_ns;

/// The canonical tool, status, input and result of the bench's step `i` of a size (as
/// `decision_log_parse` builds the whole envelope).
fn step(size: &str, i: usize) -> (String, String, String, String) {
    (
        breakdown_step::tool(i).to_string(),
        breakdown_step::status(i).to_string(),
        breakdown_step::input(i),
        breakdown_step::result(size, i),
    )
}

const BATCH: usize = 200;

type Step = (String, String, String, String);
/// A row of the table: its name and what it times on one step.
type Stage<'a> = (&'static str, Box<dyn FnMut(&Step) + 'a>);

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let batches = if quick { 300 } else { 1500 };
    let rules = Normalization::shared_default();
    let only = std::env::var("ONLY").ok();
    let only_stage = std::env::var("STAGE").ok();
    let mut out = Vec::new();
    let mut scratch = Scratch::default();
    let mut stages: Vec<Stage> = vec![
        (
            "keys_from_canonical",
            Box::new(|(t, s, i, r): &Step| {
                black_box(keys_from_canonical(t, s, i, Some(r), rules));
            }),
        ),
        (
            "  result's ids normalized",
            Box::new(move |(_, _, _, r): &Step| {
                out.clear();
                normalize_json_ids_into(r, &rules.result, &mut out);
                black_box(&out);
            }),
        ),
        (
            "  shape of the result",
            Box::new(move |(_, s, _, r): &Step| {
                black_box(shape(s, r.as_bytes(), &mut scratch));
            }),
        ),
        (
            "  hash64 of the result",
            Box::new(|(_, _, _, r): &Step| {
                black_box(hash64(r.as_bytes(), 7));
            }),
        ),
    ];
    println!("CPU ns per call, median of {batches} batches of {BATCH}");
    print_head();
    let mut table = vec![vec![0.0; 3]; stages.len()];
    for (col, size) in SIZES.iter().enumerate() {
        if only.as_deref().is_some_and(|o| o != *size) {
            continue;
        }
        // Few steps, so their text is in the caches as the parse leaves it (it has
        // just read it); thousands would time cache misses instead.
        let steps: Vec<Step> = (0..16).map(|i| step(size, i * 125)).collect();
        let mut times = vec![Vec::new(); stages.len()];
        for b in 0..batches {
            for (row, (name, stage)) in stages.iter_mut().enumerate() {
                if only_stage.as_deref().is_some_and(|o| o != *name) {
                    continue;
                }
                let t0 = thread_cpu_ns();
                for n in 0..BATCH {
                    stage(black_box(&steps[(b * BATCH + n) % steps.len()]));
                }
                times[row].push((thread_cpu_ns() - t0) as f64 / BATCH as f64);
            }
        }
        for (row, t) in times.into_iter().enumerate().filter(|(_, t)| !t.is_empty()) {
            table[row][col] = median(t);
        }
    }
    print_rows(stages.iter().map(|(name, _)| *name), &table);
}
