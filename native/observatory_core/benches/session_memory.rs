//! Heap bytes per session, counted by a global allocator wrapper.
//!
//! cargo bench -p observatory_core --bench session_memory
//!
//! Two workloads of 5-tuple windows:
//! * `fleet`: 1M sessions whose tuples come from a fleet's vocabulary (4 intents ×
//!   8 tools × 3 statuses), the shape of real traffic; target ≤ 300 bytes/session.
//! * `all_distinct`: 100k sessions whose 5 tuples are unique to each session, the
//!   worst case, where every tuple's strings are stored once.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use observatory_core::session_store::{Observation, Settings, Store};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

mod fleet;
use fleet::{INTENTS, TOOLS};

fn measure(name: &str, sessions: usize, tuple: impl Fn(usize, usize) -> (String, String, u8)) {
    let before = LIVE.load(Ordering::Relaxed);
    // Room to spare: the per-shard cap is not what this measures.
    let store = Store::new(64, sessions * 2);
    let settings = Settings::default();
    for s in 0..sessions {
        let session_id = format!("sess-{s:08}");
        let agent_id = format!("agent-{:04}", s % 1000);
        for k in 0..5 {
            let (intent, tool, status) = tuple(s, k);
            let o = Observation {
                session_id: session_id.as_bytes(),
                intent: intent.as_bytes(),
                tool_call: tool.as_bytes(),
                status,
                agent_id: Some(agent_id.as_bytes()),
            };
            store.record(&o, &settings, |s| s.score).unwrap();
        }
    }
    assert_eq!(store.len(), sessions);
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    println!(
        "{name}: {sessions} sessions, {bytes} heap bytes, {:.1} bytes/session",
        bytes as f64 / sessions as f64
    );
    drop(store);
}

fn main() {
    // `cargo test --benches` passes `--bench`-less flags; only measure when benchmarking.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    measure("fleet", 1_000_000, |s, k| {
        let i = s * 5 + k;
        (
            INTENTS[i % 4].into(),
            TOOLS[(i / 4) % 8].into(),
            (i % 3) as u8,
        )
    });
    measure("all_distinct", 100_000, |s, k| {
        (format!("intent-{s}-{k}"), format!("tool-{s}"), 0)
    });
}
