//! A global allocator that counts the calling thread's allocations, for measuring
//! what a NIF call allocates (`bench/nif_allocs.exs`). Built only with the cargo
//! feature `alloc_count`, off by default: the release library keeps the system
//! allocator, uncounted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, each call counted in its thread's `COUNTS`.
struct Counting;

/// Allocations, frees, reallocations and bytes asked for (allocations and the new
/// size of reallocations) on this thread. A `const` thread local of a `Copy` value:
/// reading it neither allocates nor registers a destructor.
#[derive(Clone, Copy)]
struct Counts {
    allocs: u64,
    frees: u64,
    reallocs: u64,
    bytes: u64,
}

thread_local! {
    static COUNTS: Cell<Counts> = const {
        Cell::new(Counts { allocs: 0, frees: 0, reallocs: 0, bytes: 0 })
    };
}

fn count(f: impl FnOnce(&mut Counts)) {
    // A thread being torn down has no counts left to read: skip it.
    let _ = COUNTS.try_with(|c| {
        let mut counts = c.get();
        f(&mut counts);
        c.set(counts);
    });
}

// SAFETY: every call is passed to `System` unchanged; counting touches only a thread
// local that never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(|c| {
            c.allocs += 1;
            c.bytes += layout.size() as u64;
        });
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(|c| {
            c.allocs += 1;
            c.bytes += layout.size() as u64;
        });
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(|c| c.frees += 1);
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(|c| {
            c.reallocs += 1;
            c.bytes += new_size as u64;
        });
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `{allocs, frees, reallocs, bytes}` made so far on the calling scheduler's thread.
/// Two readings around a call on one scheduler (`+S 1`) count that call.
#[rustler::nif]
fn alloc_counts() -> (u64, u64, u64, u64) {
    let c = COUNTS.with(Cell::get);
    (c.allocs, c.frees, c.reallocs, c.bytes)
}
