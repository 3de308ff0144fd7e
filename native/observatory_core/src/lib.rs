//! Observatory's loop-detection core, in plain Rust.
//!
//! Nothing here knows about the BEAM: the `observatory_nif` crate converts terms and
//! maps errors; this crate holds the algorithms and their tests.
//!
//! * [`answered_steps`] — the steps answered recently, so a retried step is answered again.
//! * [`window`] — the per-session ring buffer and its uniqueness ratio (FR-9.2, FR-9.3).
//! * [`severity`] — score rounding and the LOOP / WARNING / Normal bands (FR-9.4–9.6).
//! * [`session_store`] — the sharded, bounded store of windows behind `EntropyTracker`.
//! * [`interner`] — reference-counted interning, so a window holds 4-byte ids.
//! * [`keyed_store`] — a sharded, bounded per-session map (step detectors).
//! * [`decision_log`] — DecisionLog envelope parsing and validation (design.md §3).
//! * [`replay`] — a line of recorded steps: an envelope, or a flat record made into one.
//! * [`normalize`] — prompt normalization: timestamps, ids, numbers, whitespace (seed 003),
//!   and the per-call-id mode the loop verdict hashes with.
//! * [`prefetch`] — starting loads of a session's cold state early, so that their waits overlap.
//! * [`simhash`] — 64-bit SimHash fingerprints and Hamming distance (seed 003).
//! * [`conversation`] — a request's conversation in any API's shape: its newest user-side
//!   input, the tool calls it answers and their signatures (seed 003).
//! * [`messages`] — a chat-completions request read as such a conversation.
//! * [`anthropic_messages`] — the same for an Anthropic Messages request and answer.
//! * [`responses`] — the same for an OpenAI Responses API request and answer.
//! * [`json_splice`] — edits to a request body that keep every other byte (guidance notes, usage).
//! * [`kill_switch`] — the per-agent window and loop-detection score (seed 003).
//! * [`stable_json`] — canonical JSON and SHA-256 for step and call hashing (seed 002 §5).
//! * [`step_loop_detector`] — the 2×2 progress matrix over agent steps (seed 002, layer 1).
//! * [`call_circuit_breaker`] — sliding-window limit on identical tool calls (seed 002, layer 2).
//! * [`loop_verdict`] — progress / suspect / loop per step from calls, results and entropy (issue 8).

pub mod answered_steps;
pub mod anthropic_messages;
pub mod call_circuit_breaker;
pub mod conversation;
pub mod decision_log;
pub mod error;
pub mod interner;
pub mod json_splice;
pub mod keyed_store;
pub mod kill_switch;
pub mod loop_verdict;
pub mod messages;
pub mod normalize;
pub mod prefetch;
pub mod replay;
pub mod responses;
pub mod session_log;
pub mod session_store;
pub mod severity;
pub mod simhash;
pub mod stable_json;
pub mod step_loop_detector;
pub mod window;

pub use error::Error;
