//! `Store::record` against a naive baseline measured in the same run: one mutex over a
//! `HashMap<String, VecDeque<(String, String, u8)>>`, uniqueness by a `HashSet`.
//!
//! cargo bench -p observatory_core --bench entropy_store

use std::collections::{HashMap, HashSet, VecDeque};
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use observatory_core::session_store::{Observation, Settings, Store};

mod fleet;
use fleet::{INTENTS, TOOLS};

type OwnedTuple = (String, String, u8);

#[derive(Default)]
struct Naive(Mutex<HashMap<String, VecDeque<OwnedTuple>>>);

impl Naive {
    fn record(&self, session: &str, intent: &str, tool: &str, status: u8) -> f64 {
        let mut map = self.0.lock().unwrap();
        let w = map.entry(session.to_owned()).or_default();
        w.push_back((intent.to_owned(), tool.to_owned(), status));
        if w.len() > 5 {
            w.pop_front();
        }
        let distinct: HashSet<_> = w.iter().collect();
        distinct.len() as f64 / w.len() as f64
    }
}

fn session_ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("sess-{i:08}")).collect()
}

fn step(i: usize) -> (&'static str, &'static str, u8) {
    (INTENTS[i % 4], TOOLS[(i / 4) % 8], (i % 3) as u8)
}

fn bench_record(c: &mut Criterion) {
    let mut group = c.benchmark_group("record_one_thread");
    group.throughput(Throughput::Elements(1));
    for &sessions in &[1_000usize, 100_000] {
        let ids = session_ids(sessions);
        let store = Store::new(64, 1_000_000);
        let settings = Settings::default();
        let mut i = 0usize;
        group.bench_with_input(BenchmarkId::new("store", sessions), &sessions, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(7919);
                let (intent, tool, status) = step(i);
                let o = Observation {
                    session_id: ids[i % sessions].as_bytes(),
                    intent: intent.as_bytes(),
                    tool_call: tool.as_bytes(),
                    status,
                    agent_id: Some(b"agent-1"),
                };
                black_box(store.record(&o, &settings, |s| s.score).unwrap())
            })
        });
        let naive = Naive::default();
        group.bench_with_input(BenchmarkId::new("naive", sessions), &sessions, |b, _| {
            b.iter(|| {
                i = i.wrapping_add(7919);
                let (intent, tool, status) = step(i);
                black_box(naive.record(&ids[i % sessions], intent, tool, status))
            })
        });
    }
    group.finish();
}

/// Two threads recording into one store: total time for `iters` calls on each.
fn two_threads<F>(iters: u64, f: Arc<F>) -> Duration
where
    F: Fn(usize) + Send + Sync + 'static,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in 0..iters as usize {
                    f(i * 2 + t);
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    start.elapsed() / 2
}

fn bench_two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("record_two_threads_100k_sessions");
    group.throughput(Throughput::Elements(1));
    let ids = Arc::new(session_ids(100_000));
    let store = Arc::new(Store::new(64, 1_000_000));
    let record_store = {
        let (ids, store) = (ids.clone(), store.clone());
        Arc::new(move |i: usize| {
            let (intent, tool, status) = step(i);
            let o = Observation {
                session_id: ids[(i * 7919) % ids.len()].as_bytes(),
                intent: intent.as_bytes(),
                tool_call: tool.as_bytes(),
                status,
                agent_id: Some(b"agent-1"),
            };
            black_box(store.record(&o, &Settings::default(), |s| s.score).unwrap());
        })
    };
    group.bench_function("store", |b| {
        b.iter_custom(|iters| two_threads(iters, record_store.clone()))
    });
    let naive = Arc::new(Naive::default());
    let record_naive = {
        let ids = ids.clone();
        Arc::new(move |i: usize| {
            let (intent, tool, status) = step(i);
            black_box(naive.record(&ids[(i * 7919) % ids.len()], intent, tool, status));
        })
    };
    group.bench_function("naive", |b| {
        b.iter_custom(|iters| two_threads(iters, record_naive.clone()))
    });
    group.finish();
}

criterion_group!(benches, bench_record, bench_two_threads);
criterion_main!(benches);
