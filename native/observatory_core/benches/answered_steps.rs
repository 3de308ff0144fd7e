//! The idempotency check's costs in the core (the ingest benchmark measures it whole,
//! `bench/ingest.exs`):
//!
//! * the body's fingerprint, which the parse computes for every step: parsing,
//!   validating and hashing a ~390-byte envelope with and without it, in the same run,
//!   so its price is the ratio;
//! * a claim and its answer in a store at its cap (100 000 steps: each claim also
//!   evicts the oldest), against a `HashMap` insert and remove of the same keys.
//!
//! cargo bench -p observatory_core --bench answered_steps -- --warm-up-time 1 --measurement-time 3

use std::collections::{HashMap, VecDeque};
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use observatory_core::answered_steps::{AnsweredSteps, Claim, Limits, StepId};
use observatory_core::decision_log::{check, fingerprint_of, hashes_of, read};
use observatory_core::loop_verdict::keys::Normalization;

const ENVELOPE: &[u8] = br#"{"meta":{"step_id":"step-1","session_id":"sess-1","agent_id":"agent-1","parent_step_id":"step-0","timestamp":"2026-02-22T10:30:00.123Z"},"cognition":{"intent":"search","reasoning_chain":["read the task","pick a tool"],"confidence":0.8,"entropy_score":0.9},"action":{"tool_call":"read_file","tool_input":{"path":"/srv/app/file-1.ex","limit":200},"status":"success","result":{"bytes":1025}}}"#;

fn bench_fingerprint(c: &mut Criterion) {
    let rules = Normalization::shared_default();
    let mut group = c.benchmark_group("parse_envelope");
    group.bench_function("baseline_parse_validate_hash", |b| {
        b.iter(|| {
            let tree = read(black_box(ENVELOPE)).unwrap();
            check(&tree).unwrap();
            hashes_of(&tree, rules).approach[0]
        })
    });
    group.bench_function("with_body_fingerprint", |b| {
        b.iter(|| {
            let tree = read(black_box(ENVELOPE)).unwrap();
            check(&tree).unwrap();
            let hashes = hashes_of(&tree, rules);
            fingerprint_of(&tree, &hashes)[0]
        })
    });
    group.finish();
}

const HELD: usize = 100_000;
const LIMITS: Limits = Limits {
    window_ms: i64::MAX,
    max_steps_per_session: 1_000,
    max_steps_per_agent: 10_000,
    max_steps: HELD,
};

fn ids(n: usize) -> (String, String, String) {
    (
        format!("sess-{}", n % 1_000),
        format!("step-{n}"),
        format!("agent-{}", n % 50),
    )
}

fn bench_store(c: &mut Criterion) {
    let answer = vec![7u8; 520];
    let mut group = c.benchmark_group("claim_at_cap");

    let store: AnsweredSteps<u32> = AnsweredSteps::new();
    let mut n = 0;
    let claim_and_answer = |n: usize| {
        let (session, step, agent) = ids(n);
        let id = StepId {
            session: &session,
            step: &step,
            agent: &agent,
        };
        let Claim::New(seq) = store.claim(id, [1; 16], 0, 0, LIMITS, |_| false) else {
            panic!("every step is new")
        };
        store.complete(seq, &answer);
    };
    while n < HELD {
        claim_and_answer(n);
        n += 1;
    }
    group.bench_function("answered_steps_claim_complete", |b| {
        b.iter(|| {
            claim_and_answer(n);
            n += 1;
        })
    });

    // The floor: a map insert of the same keys and answer, and a FIFO eviction.
    let mut map: HashMap<(String, String), Vec<u8>> = HashMap::new();
    let mut order = VecDeque::new();
    let mut m = 0;
    let mut insert = |m: usize| {
        let (session, step, _) = ids(m);
        map.insert((session.clone(), step.clone()), answer.clone());
        order.push_back((session, step));
        if order.len() > HELD {
            let oldest = order.pop_front().unwrap();
            map.remove(&oldest);
        }
    };
    while m < HELD {
        insert(m);
        m += 1;
    }
    group.bench_function("baseline_hashmap_fifo", |b| {
        b.iter(|| {
            insert(m);
            m += 1;
        })
    });
    group.finish();
}

criterion_group!(benches, bench_fingerprint, bench_store);
criterion_main!(benches);
