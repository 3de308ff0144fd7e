//! NIFs that let the Elixir tests check resource lifetimes and panic handling.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Stores alive right now; `Drop` decrements it, so a leak shows as a count that
/// never returns to its starting value after garbage collection.
pub static LIVE_STORES: AtomicUsize = AtomicUsize::new(0);

#[rustler::nif]
fn live_stores() -> usize {
    LIVE_STORES.load(Ordering::Relaxed)
}

/// Panics on purpose: proves a Rust panic reaches Elixir as an exception, not a crash.
#[rustler::nif]
fn panic_probe() -> usize {
    panic!("panic_probe: deliberate panic for the test suite")
}

/// Holds a dirty CPU scheduler for `ms` milliseconds, as a long step's parse would:
/// lets a test prove that a call (`/healthz`) never waits in the dirty queue.
#[rustler::nif(schedule = "DirtyCpu")]
fn dirty_cpu_hold(ms: u64) -> rustler::Atom {
    std::thread::sleep(std::time::Duration::from_millis(ms));
    rustler::types::atom::ok()
}
