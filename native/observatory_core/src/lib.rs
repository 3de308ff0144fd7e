//! Observatory's loop-detection core, in plain Rust.
//!
//! Nothing here knows about the BEAM: the `observatory_nif` crate converts terms and
//! maps errors; this crate holds the algorithms and their tests.
//!
//! * [`window`] — the per-session ring buffer and its uniqueness ratio (FR-9.2, FR-9.3).
//! * [`severity`] — score rounding and the LOOP / WARNING / Normal bands (FR-9.4–9.6).
//! * [`session_store`] — the sharded, bounded store of windows behind `EntropyTracker`.
//! * [`interner`] — reference-counted interning, so a window holds 4-byte ids.

pub mod decision_log;
pub mod error;
pub mod interner;
pub mod session_store;
pub mod severity;
pub mod window;

pub use error::Error;
