//! NIFs that let the Elixir tests check resource lifetimes and panic handling.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rustler::{Resource, ResourceArc, Term};

use crate::data_dir_lock::DirLock;
use crate::entropy_tracker::StoreResource;
use crate::idempotency::StepsRef;
use crate::kill_switch::WindowStore;
use crate::loop_verdict::{VerdictRules, VerdictStore};
use crate::session_log::SessionLogRef;
use crate::step_detector::{Breaker, StepStore};

/// The ids of the entropy stores alive right now. A leak shows as a count that never
/// returns to its starting value after garbage collection; a store freed while a NIF
/// still holds it shows as an id gone too early (`store_hold/2`).
static LIVE: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// `store_hold/2` calls under way.
static HOLDING: AtomicUsize = AtomicUsize::new(0);

/// A store's entry in `LIVE`, removed when the store is dropped.
pub struct LiveId(u64);

impl LiveId {
    pub fn new() -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LIVE.lock().insert(id);
        Self(id)
    }
}

impl Drop for LiveId {
    fn drop(&mut self) {
        LIVE.lock().remove(&self.0);
    }
}

#[rustler::nif]
fn live_stores() -> usize {
    LIVE.lock().len()
}

/// Holds `store` on a dirty scheduler for `ms` (at most 1 s), as a long listing or
/// sweep does, then answers whether the store is still alive: false means it was
/// freed while a NIF held it (a use-after-free, had the NIF read it). Reads nothing
/// of the store after the wait.
#[rustler::nif(schedule = "DirtyCpu")]
fn store_hold(store: ResourceArc<StoreResource>, ms: u64) -> bool {
    let id = (store.1).0;
    HOLDING.fetch_add(1, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(ms.min(1_000)));
    HOLDING.fetch_sub(1, Ordering::SeqCst);
    LIVE.lock().contains(&id)
}

/// How many `store_hold/2` calls are under way.
#[rustler::nif]
fn stores_held() -> usize {
    HOLDING.load(Ordering::SeqCst)
}

/// Whether `term` is one of this library's resources (a store, the breaker, the
/// verdict rules, the data directory lock).
#[rustler::nif(name = "native_resource?")]
fn native_resource(term: Term) -> bool {
    fn is<T: Resource>(term: Term) -> bool {
        term.decode::<ResourceArc<T>>().is_ok()
    }
    is::<StoreResource>(term)
        || is::<StepStore>(term)
        || is::<Breaker>(term)
        || is::<VerdictStore>(term)
        || is::<VerdictRules>(term)
        || is::<StepsRef>(term)
        || is::<SessionLogRef>(term)
        || is::<WindowStore>(term)
        || is::<DirLock>(term)
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
