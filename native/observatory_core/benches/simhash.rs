//! Prompt fingerprinting throughput on 4 KiB prompts, with two baselines measured in
//! the same run:
//!
//! * `textbook_simhash` — as many features, voted the textbook way: one `i32` counter
//!   update per bit per feature, against this crate's bit-sliced counters (`simhash`);
//! * `naive_normalize` — a quick `chars()` + `split_whitespace().join(" ")` normalizer
//!   that only handles numbers and whitespace (no timestamps or UUIDs), against the
//!   byte scanner (`normalize`);
//! * `fnv_raw` — one FNV-1a pass over the raw bytes: the floor for anything that reads
//!   the whole prompt once.
//!
//! cargo bench -p observatory_core --bench simhash -- --warm-up-time 1 --measurement-time 3

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use observatory_core::normalize::normalize;
use observatory_core::simhash::{fingerprint, hash_bytes, simhash};

const SIZE: usize = 4096;

/// Repeats `line(k)` for k = 0, 1, … until `SIZE` bytes, cut to exactly `SIZE`.
fn prompt(line: impl Fn(usize) -> String) -> String {
    let mut text = String::with_capacity(SIZE + 256);
    let mut k = 0;
    while text.len() < SIZE {
        text.push_str(&line(k));
        k += 1;
    }
    text.truncate(SIZE);
    text
}

const PROSE: [&str; 6] = [
    "You are a careful assistant working on the billing service. ",
    "Read the failing test output below, find the root cause and propose a minimal patch.\n",
    "Do not change public interfaces; explain every change in one sentence.  ",
    "The customer reported that invoice totals are off by a few cents when discounts apply.\r\n",
    "Keep the answer under three hundred words and cite the files you looked at. ",
    "If you are unsure, say so and list what you would check next.\n\n",
];

fn prompts() -> [(&'static str, String); 3] {
    [
        ("prose", prompt(|k| PROSE[k % PROSE.len()].to_owned())),
        (
            "log",
            prompt(|k| {
                format!(
                    "2024-06-{:02}T{:02}:{:02}:{:02}.{:03}Z worker-{} req={:08x}-1c2d-4e5f-8a9b-{:012x} \
                     status={} took {}.{} ms retry {} of 5\n",
                    1 + k % 28,
                    k % 24,
                    (k * 7) % 60,
                    (k * 13) % 60,
                    k % 1000,
                    k % 16,
                    0x9f86_d081u32.wrapping_mul(k as u32 + 1),
                    k * 7919,
                    [200, 404, 500, 503][k % 4],
                    k % 900,
                    k % 10,
                    k % 5,
                )
            }),
        ),
        (
            "json",
            prompt(|k| {
                format!(
                    "  {{\n    \"id\": {},\n    \"sku\": \"SKU-{:05}\",\n    \"name\": \"Widget {}\",\n    \
                     \"price\": {}.{:02},\n    \"tags\": [\"hardware\", \"blue\"],\n    \
                     \"updated_at\": \"2024-05-{:02}T08:00:00+02:00\"\n  }},\n",
                    1000 + k,
                    k * 37,
                    k,
                    k % 200,
                    k % 100,
                    1 + k % 28,
                )
            }),
        ),
    ]
}

fn words(text: &str) -> impl Iterator<Item = &[u8]> {
    text.as_bytes()
        .split(|&b| !(b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80))
        .filter(|w| !w.is_empty())
}

/// As many features as `simhash` (words and word pairs), hashed at about the same
/// cost, voted one bit at a time.
fn textbook_simhash(text: &str) -> u64 {
    let mut weights = [0i32; 64];
    let mut vote = |feature: u64| {
        for (bit, weight) in weights.iter_mut().enumerate() {
            *weight += if feature >> bit & 1 == 1 { 1 } else { -1 };
        }
    };
    let mut previous: Option<u64> = None;
    for word in words(text) {
        let word = hash_bytes(word);
        vote(word);
        if let Some(previous) = previous {
            vote((previous.rotate_left(32) ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        previous = Some(word);
    }
    weights
        .iter()
        .enumerate()
        .filter(|(_, &w)| w > 0)
        .fold(0, |acc, (bit, _)| acc | 1 << bit)
}

/// Numbers and whitespace only, written the quick way.
fn naive_normalize(text: &str) -> String {
    let mut out = String::new();
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() || (in_number && c == '.') {
            if !in_number {
                out.push_str("<NUM>");
                in_number = true;
            }
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn bench_fingerprint(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint_4KiB");
    group.throughput(Throughput::Bytes(SIZE as u64));
    for (kind, text) in prompts() {
        let normalized = normalize(&text);
        group.bench_with_input(
            BenchmarkId::new("normalize+simhash", kind),
            &text,
            |b, t| b.iter(|| fingerprint(black_box(t))),
        );
        group.bench_with_input(BenchmarkId::new("normalize", kind), &text, |b, t| {
            b.iter(|| normalize(black_box(t)))
        });
        group.bench_with_input(BenchmarkId::new("naive_normalize", kind), &text, |b, t| {
            b.iter(|| naive_normalize(black_box(t)))
        });
        group.bench_with_input(BenchmarkId::new("simhash", kind), &normalized, |b, t| {
            b.iter(|| simhash(black_box(t)))
        });
        group.bench_with_input(
            BenchmarkId::new("textbook_simhash", kind),
            &normalized,
            |b, t| b.iter(|| textbook_simhash(black_box(t))),
        );
        group.bench_with_input(BenchmarkId::new("fnv_raw", kind), &text, |b, t| {
            b.iter(|| hash_bytes(black_box(t.as_bytes())))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_fingerprint);
criterion_main!(benches);
