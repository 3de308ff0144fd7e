//! The loop verdict: one judgement per step of a session — [`Level::Progress`],
//! [`Level::Suspect`] or [`Level::Loop`] — with the rule that decided it, a reason in
//! words and the step numbers that are its evidence.
//!
//! FRD-009's uniqueness ratio looks at `{intent, tool_call, status}` only: it cannot
//! tell reading eight different files from reading one file eight times, and it never
//! sees an agent that alternates edit/build. The verdict looks at what the gateway also
//! has: each step's **call** (the tool and its input, whitespace in strings collapsed)
//! and its **outcome** (the status and the result), hashed from canonical JSON with
//! per-call ids normalized away ([`keys`]), and read loosely ([`shape`]): the result's
//! lines with digits masked, as a set and as a sketch, and its numbers.
//!
//! Real agents repeat themselves with incidental differences (issue 11): an error line
//! that counts up (`bash: line 12`, `line 13`), stderr and stdout interleaved in
//! another order, a file echo that grows by the same lines, a long log whose timing
//! or size changed. The rules below treat those as the same answer.
//!
//! # Rules
//!
//! Each session keeps its last `history` steps (default 16). On every step:
//!
//! * **(a) repeat** — the newest steps are the same call, `n` times in a row. A repeat
//!   *says nothing new* when its result is the previous one, or when it holds no line
//!   the run of that call has not shown (a new line counts when it is at least a tenth
//!   of the result's lines) and it failed (numbers in an error are counters), or its
//!   lines came in another order or number, or only a third or less of its numbers
//!   changed (a timing, a speed, a size). When the last `repeat_suspect` (2) calls in a
//!   row said nothing new: suspect; `repeat_loop` (3): loop — or `blank_repeat_loop`
//!   (4) when every one of those results was blank (`cd ..`, an empty `grep`: an empty
//!   result can show neither progress nor its absence). When the newest call said
//!   something new: **progress** — polling a job that moves 10 % → 80 % is work.
//! * **(b) cycle** — the newest calls are a block of `p` different calls
//!   (2 ≤ p ≤ `max_period`, default 5) repeated: A B A B, A B C A B C, edit/build.
//!   When the outcomes at every position of the block also repeat (a failure compared
//!   by its masked lines, a success exactly), over the last `cycle_suspect` (2) blocks:
//!   suspect; `cycle_loop` (3) blocks: loop. When an outcome in the cycle changed since
//!   the previous block (the build gets further each time): **progress**.
//! * **(c) same failure** — the step failed with a non-blank result, and that same
//!   outcome ended `failure_suspect` (3) *different* calls among the last `history`
//!   steps: suspect; loop only with a `failure_loop` threshold (none by default: an
//!   agent trying different calls that fail alike is struggling, and on real runs the
//!   rule raised more false alarms than it caught loops). A blank failure (a `grep`
//!   that found nothing) is an answer, not a cause: not counted.
//! * **(e) near repeat** — the newest steps are nearly identical calls (the same tool,
//!   at least `near_share` (75 %) of their input's word pairs the same: [`keys`]), each
//!   with the same answer as the one before (the identical call counts when it said
//!   nothing new; two different calls' answers must be the same word for word), at
//!   least one of them not identical: suspect at `near_repeat_suspect` (3), loop at
//!   `near_repeat_loop` (4), or `blank_near_repeat_loop` (6) when every answer was
//!   blank. The same edit re-applied with a character changed, the same query with
//!   another `LIMIT`, each time the same error. For empty answers the rule has a second
//!   half: the newest `blank_near_repeat_loop` (6) steps were all answered with nothing,
//!   and each is a *rework* of another of them — the identical call re-sent, a nearly
//!   identical one, or the same tool's call keeping every word pair of the other (at
//!   least four) and adding words: loop. A pipeline that printed nothing, a filter
//!   appended each time; files deleted six ways. Calls that differ only in their digits,
//!   or that lose a pair to name another target (`mkdir -p /srv/app/logs`, then
//!   `…/cache`), are the same command on other targets, not reworks.
//! * **(f) failure run** — the newest non-blank answers all failed, each with the same
//!   error as the failure after it (word for word, numbers kept: "3 tests failed", then
//!   "2", is progress), whatever their calls: suspect at `failure_run_suspect` (3), loop
//!   at `failure_run_loop` (4). New argument names, new wording, one identical
//!   rejection. Steps with a blank answer between the failures neither count nor break
//!   the run. An error that echoes its own call (a quoting error quoting the grown
//!   pipeline) is the same error when its *reply* — the error without the words of its
//!   call ([`StepKeys::exact`]) — is the same and the later call is the earlier one
//!   with words added (nearly identical, every word pair kept): a call that dropped or
//!   changed words changed its target, and a "not found" for the new target is news.
//!   The rule has a second half: the newest answers all *open* with the same line
//!   (digits masked: [`StepKeys::opening`]), some of them failures and some successes —
//!   the newest a failure, or two of them successes — and none has more than one line
//!   besides (a blank answer or a longer one ends the run). A line that comes first
//!   whether the call failed or not is something in front of every call (a Markdown
//!   fence the shell runs as a command, a wrapper that is not installed, a broken
//!   environment): the calls never ran. A runner's banner followed by its own report,
//!   or a pass after failures with the same banner, does not count.
//! * **(g) revisit** — a step *revisits* when an earlier step of the history had the
//!   same or a nearly identical call and the same non-blank answer (a different call
//!   whose input differs only in its digits, [`StepKeys::wording`], has a new target:
//!   the next order, `file4` after `file3`, is work, not a revisit), or the identical
//!   call and a blank answer again with nothing but failures and blank answers since
//!   (`cp` that prints nothing, a failing variant, the same `cp`); when the newest step
//!   revisits and `revisit_suspect` (2) / `revisit_loop` (3) of the last
//!   `revisit_window` (6) steps do: suspect / loop. Lookups re-run between other
//!   steps, files re-read with no edit between, and cycles of any length up to the
//!   history, past `max_period`.
//!
//!   Rules (e)–(g) compare answers exactly (ids normalized, numbers kept: across
//!   different calls or steps apart, a number that changed in an error is news), and any
//!   blank answer is the same as any other.
//! * **(d) entropy** — only when (a)–(c) and (e)–(g) say nothing: the entropy tracker's severity is
//!   WARNING or LOOP. If every `(call, outcome)` pair in the entropy window is distinct,
//!   the repetition the ratio saw is explained by different arguments or different
//!   results: **progress**. Otherwise: suspect. The entropy window alone never makes a
//!   loop — that is exactly its false-alarm case (eight different files, a moving
//!   poll, ten different writes).
//!
//! No rule: progress. Otherwise the strongest rule wins (loop > suspect > progress);
//! among equals, the first of (a), (b), (e), (f), (g), (c), (d). The reason names the rule; the
//! evidence is the step numbers involved (at most [`MAX_EVIDENCE`], the most recent).
//!
//! A step without `action.result` has the status as its only outcome: it is blank.
//!
//! # Cost
//!
//! A session is a ring of 40-byte entries and their outcomes folded to 4 bytes (about
//! 0.7 KiB at the default history of 16) plus two sketches (the run's lines, the newest
//! result's numbers: 160 bytes); a step
//! is one push and scans of at most `history` entries per rule (the cycle scan
//! compares at most `max_period × history` hashes, the revisit scan `history` entries
//! once, when the step is recorded). `benches/loop_verdict.rs` measures it with the
//! hashing.

use std::collections::VecDeque;
use std::fmt;
use std::sync::OnceLock;

use crate::severity::Severity;
use crate::Error;

pub mod keys;
pub mod shape;

use shape::{LineSketch, NumberSketch};

/// Longest history a session may keep.
pub const MAX_HISTORY: usize = 64;
/// Longest cycle period looked for.
pub const MAX_PERIOD: usize = 8;
/// Most step numbers returned as evidence (the most recent ones).
pub const MAX_EVIDENCE: usize = 16;

/// How a session is doing. Ordered from healthy to looping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Progress,
    Suspect,
    Loop,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Progress => "progress",
            Level::Suspect => "suspect",
            Level::Loop => "loop",
        }
    }
}

/// The rule that decided a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// No rule had anything to say.
    None,
    /// (a) the same call in a row.
    Repeat,
    /// (b) a cycle of 2..=max_period calls.
    Cycle,
    /// (e) nearly identical calls in a row, the same result.
    NearRepeat,
    /// (f) calls in a row failing with the same error.
    FailureRun,
    /// (g) earlier calls re-run, their results unchanged.
    Revisit,
    /// (c) the same failure under different calls.
    SameFailure,
    /// (d) the entropy tracker's severity.
    Entropy,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::None => "none",
            Rule::Repeat => "repeat",
            Rule::Cycle => "cycle",
            Rule::NearRepeat => "near_repeat",
            Rule::FailureRun => "failure_run",
            Rule::Revisit => "revisit",
            Rule::SameFailure => "same_failure",
            Rule::Entropy => "entropy",
        }
    }
}

/// Why: the rule's finding with its numbers. `Display` gives the sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Nothing repeats.
    NoRepetition { steps: usize },
    /// (a) the same call `times` times in a row, its result saying nothing new (each
    /// time blank: `blank`).
    Repeated { times: u32, blank: bool },
    /// (a) the same call `times` times in a row, the result saying something new.
    Polling { times: u32 },
    /// (b) a cycle of `period` calls, `blocks` times with the same outcomes.
    Cycle { period: u32, blocks: u32 },
    /// (b) a cycle of `period` calls, `blocks` times, an outcome changed.
    CycleProgress { period: u32, blocks: u32 },
    /// (e) `times` nearly identical calls in a row with the same result (each time
    /// blank: `blank`).
    NearRepeat { times: u32, blank: bool },
    /// (e) `times` calls in a row answered with nothing, each a rework of another of
    /// them.
    BlankRework { times: u32 },
    /// (f) `times` calls in a row failed with the same error, `quiet` steps with an
    /// empty answer between them.
    FailureRun { times: u32, quiet: u32 },
    /// (f) `times` answers in a row opened with the same line, `failed` of them failures
    /// and the others successes.
    SameOpening { times: u32, failed: u32 },
    /// (g) `revisits` of the last `window` steps repeated an earlier call with the same
    /// result.
    Revisit { revisits: u32, window: u32 },
    /// (c) `calls` different calls ended in the same failure.
    SameFailure { calls: u32 },
    /// (d) low entropy, but every call or outcome differs.
    EntropyExplained { window: usize },
    /// (d) low entropy and repeated `(call, outcome)` pairs.
    EntropyRepeats { window: usize },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Reason::NoRepetition { steps: 1 } => {
                write!(f, "the session's first step: nothing to compare yet")
            }
            Reason::NoRepetition { steps } => {
                write!(f, "no repeated call pattern in the last {steps} steps")
            }
            Reason::Repeated {
                times,
                blank: false,
            } => write!(
                f,
                "the same call {times} times in a row, its result saying nothing new"
            ),
            Reason::Repeated { times, blank: true } => write!(
                f,
                "the same call {times} times in a row, each time with an empty result"
            ),
            Reason::Polling { times } => write!(
                f,
                "the same call {times} times in a row, and its result showed something new: progress"
            ),
            Reason::Cycle { period, blocks } => write!(
                f,
                "a cycle of {period} calls repeated {blocks} times with the same results"
            ),
            Reason::CycleProgress { period, blocks } => write!(
                f,
                "a cycle of {period} calls repeated {blocks} times, but a result changed: progress"
            ),
            Reason::NearRepeat {
                times,
                blank: false,
            } => write!(
                f,
                "{times} nearly identical calls in a row (the same tool, most of the input the same), each with the same result"
            ),
            Reason::NearRepeat { times, blank: true } => write!(
                f,
                "{times} nearly identical calls in a row, each with an empty result"
            ),
            Reason::BlankRework { times } => write!(
                f,
                "{times} calls in a row got an empty answer, each a rework of another of them (the same command reworded, re-sent or with words added): nothing the agent tries brings anything back"
            ),
            Reason::FailureRun { times, quiet: 0 } => {
                write!(f, "{times} calls in a row failed with the same error")
            }
            Reason::FailureRun { times, quiet } => write!(
                f,
                "{times} calls failed with the same error, with only {quiet} empty answers between them"
            ),
            Reason::SameOpening { times, failed } => write!(
                f,
                "{times} calls in a row got answers opening with the same line, {failed} failed and {} succeeded: something in front of every call rejects it",
                times - failed
            ),
            Reason::Revisit { revisits, window } => write!(
                f,
                "{revisits} of the last {window} steps repeated an earlier call (or a nearly identical one) and got the same result as before"
            ),
            Reason::SameFailure { calls } => {
                write!(f, "{calls} different calls failed with the same result")
            }
            Reason::EntropyExplained { window } => write!(
                f,
                "low entropy over the last {window} steps, but every call or result differs: progress"
            ),
            Reason::EntropyRepeats { window } => write!(
                f,
                "low entropy over the last {window} steps, with repeated call and result pairs"
            ),
        }
    }
}

impl Reason {
    /// The sentence as [`Display`](fmt::Display) writes it, kept once written, for the
    /// reason of a step that repeats nothing in a history of at most [`MAX_HISTORY`]
    /// steps: nearly every step of a working session has it, and the scoring call
    /// formatted it on every step (~35 ns). `None` for every other reason (a finding,
    /// written when it is found).
    pub fn kept_sentence(&self) -> Option<&'static str> {
        static KEPT: OnceLock<Vec<String>> = OnceLock::new();
        match *self {
            Reason::NoRepetition { steps } => KEPT
                .get_or_init(|| {
                    (0..=MAX_HISTORY)
                        .map(|steps| Reason::NoRepetition { steps }.to_string())
                        .collect()
                })
                .get(steps)
                .map(String::as_str),
            _ => None,
        }
    }
}

/// Step numbers, oldest first; at most [`MAX_EVIDENCE`] without allocating.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Evidence {
    steps: [u32; MAX_EVIDENCE],
    len: u8,
}

impl Evidence {
    pub fn as_slice(&self) -> &[u32] {
        &self.steps[..usize::from(self.len)]
    }

    /// Keeps the last `MAX_EVIDENCE` of `steps` (given oldest first).
    fn from_iter(steps: impl DoubleEndedIterator<Item = u32>) -> Self {
        let mut newest_first = [0u32; MAX_EVIDENCE];
        let mut len = 0;
        for step in steps.rev().take(MAX_EVIDENCE) {
            newest_first[len] = step;
            len += 1;
        }
        let mut out = Self::default();
        for (i, step) in newest_first[..len].iter().rev().enumerate() {
            out.steps[i] = *step;
        }
        out.len = len as u8;
        out
    }
}

impl fmt::Debug for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// The verdict on one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub level: Level,
    pub rule: Rule,
    pub reason: Reason,
    pub evidence: Evidence,
    /// This step's number in the session (1-based).
    pub step: u32,
    /// The level after the session's previous step; `None` on its first.
    pub previous: Option<Level>,
}

/// What the verdict knows of one step: see [`keys`] and [`shape`] for how they are
/// computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepKeys {
    /// Tool name and normalized canonical input, whitespace in strings collapsed.
    pub call: u64,
    /// The tool name alone.
    pub tool: u64,
    /// The word pairs of the collapsed input, one bit of 64 each ([`keys::call_shape`]):
    /// nearly identical inputs share most of their bits.
    pub shape: u64,
    /// The input with its digits zeroed, hashed ([`keys::wording`]):
    /// two different calls with the same wording differ only in numbers, a new target.
    pub wording: u64,
    /// Status and normalized canonical result (the status alone without a result).
    pub outcome: u64,
    /// The canonical result word for word, before normalization (its first
    /// [`keys::EXACT_BYTES`] bytes and its length; the outcome without a result): two
    /// different calls whose answers differ only in a checksum or an id got different
    /// answers. For a failure with a result, its *reply* instead: the status and the
    /// normalized error's words that are not words of the call's input
    /// ([`keys::keys_from_canonical`]), so that an error echoing its call compares
    /// across calls.
    pub exact: u64,
    /// Status and the set of the result's lines, digits masked ([`shape`]).
    pub gist: u64,
    /// Status and the result's text, digits masked, in order ([`shape`]).
    pub skeleton: u64,
    /// The result's lines, for "did this say anything new?".
    pub lines: LineSketch,
    pub has_result: bool,
    /// Status `failure`, `error` or `timeout`.
    pub failure: bool,
    /// No result, or one whose strings hold only whitespace.
    pub blank: bool,
    /// The result's numbers, for "did most of them change?".
    pub numbers: NumberSketch,
    /// The first line of the result's text that holds a letter, digits masked, hashed
    /// without the status ([`shape`]); 0 when there is none.
    pub opening: u64,
}

impl StepKeys {
    /// Keys from a call and an outcome hash alone, as if the result were one line:
    /// every view of the outcome is the outcome itself.
    /// The tool is the call itself and so is the shape: no two different calls are
    /// near-identical (set `tool` and `shape` for that).
    pub fn exact(call: u64, outcome: u64, has_result: bool, failure: bool) -> Self {
        Self {
            call,
            tool: call,
            shape: call,
            wording: call,
            outcome,
            exact: outcome,
            gist: outcome,
            skeleton: outcome,
            lines: if has_result {
                LineSketch::single(outcome)
            } else {
                LineSketch::default()
            },
            has_result,
            failure,
            blank: !has_result,
            numbers: NumberSketch::default(),
            opening: if has_result { outcome } else { 0 },
        }
    }

    /// The keys as one binary, as the DecisionLog parse hands them to Elixir and the
    /// scoring NIF reads them back ([`from_bytes`](Self::from_bytes)): one term where a
    /// tuple of eight 64-bit integers (most of them bignums on the heap), a nested tuple
    /// and a sketch binary cost ~0.2 µs a step to build. Little-endian: `call`,
    /// `outcome`, `gist`, `skeleton`, `tool`, `shape`, `exact`, `wording`, `opening`,
    /// the number sketch's four words and its count, the flags (has a result 1, failed
    /// 2, blank 4), then the line sketch. Never stored nor compared as bytes: it lives
    /// from a step's parse to its scoring.
    pub fn to_bytes(&self) -> [u8; KEYS_BYTES] {
        let mut out = [0u8; KEYS_BYTES];
        let words = [
            self.call,
            self.outcome,
            self.gist,
            self.skeleton,
            self.tool,
            self.shape,
            self.exact,
            self.wording,
            self.opening,
            self.numbers.bits[0],
            self.numbers.bits[1],
            self.numbers.bits[2],
            self.numbers.bits[3],
        ];
        for (i, word) in words.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        out[KEY_WORDS * 8..KEY_WORDS * 8 + 4].copy_from_slice(&self.numbers.count.to_le_bytes());
        out[KEY_WORDS * 8 + 4] =
            u8::from(self.has_result) | u8::from(self.failure) << 1 | u8::from(self.blank) << 2;
        out[KEY_WORDS * 8 + 5..].copy_from_slice(&self.lines.to_bytes());
        out
    }

    /// The keys from [`to_bytes`](Self::to_bytes)' form; `None` for another length or
    /// an unknown flag.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != KEYS_BYTES || bytes[KEY_WORDS * 8 + 4] > 7 {
            return None;
        }
        let word =
            |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        let flags = bytes[KEY_WORDS * 8 + 4];
        Some(Self {
            call: word(0),
            outcome: word(1),
            gist: word(2),
            skeleton: word(3),
            tool: word(4),
            shape: word(5),
            exact: word(6),
            wording: word(7),
            opening: word(8),
            numbers: NumberSketch {
                bits: [word(9), word(10), word(11), word(12)],
                count: u32::from_le_bytes(
                    bytes[KEY_WORDS * 8..KEY_WORDS * 8 + 4]
                        .try_into()
                        .unwrap_or_default(),
                ),
            },
            has_result: flags & 1 != 0,
            failure: flags & 2 != 0,
            blank: flags & 4 != 0,
            lines: LineSketch::from_bytes(&bytes[KEY_WORDS * 8 + 5..])?,
        })
    }
}

/// The 64-bit words of [`StepKeys::to_bytes`]: eight hashes, the opening's, the number
/// sketch's four.
const KEY_WORDS: usize = 13;
/// Bytes of [`StepKeys::to_bytes`]: the words, the number count (4), the flags (1) and
/// the line sketch.
pub const KEYS_BYTES: usize = KEY_WORDS * 8 + 4 + 1 + shape::SKETCH_BITS / 8;

/// The entropy tracker's view of the same step, for rule (d).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntropySignal {
    pub severity: Severity,
    /// Steps in the entropy window (its configured size, or fewer at a session's start).
    pub window: usize,
}

/// Every threshold of the rules. Read by the caller on every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Steps remembered per session, 2..=[`MAX_HISTORY`].
    pub history: usize,
    /// (a) same call, same outcome this many times in a row: suspect / loop.
    pub repeat_suspect: u32,
    pub repeat_loop: u32,
    /// (a) the same, when every one of those results is blank (`cd ..`, `sleep 5`):
    /// a blank result can show neither progress nor its absence. Never below
    /// `repeat_loop`.
    pub blank_repeat_loop: u32,
    /// (b) longest cycle looked for, 1..=[`MAX_PERIOD`] (1: cycles off, only repeats).
    pub max_period: usize,
    /// (b) blocks of a cycle with the same outcomes: suspect / loop.
    pub cycle_suspect: u32,
    pub cycle_loop: u32,
    /// (c) different calls ending in the same failure: suspect / loop.
    pub failure_suspect: u32,
    /// `None`: a same failure is never more than suspect (the default: an agent
    /// trying different calls that fail alike is struggling, and on real runs
    /// it raised more false alarms than loops caught).
    pub failure_loop: Option<u32>,
    /// (d) on or off.
    pub entropy: bool,
    /// Two inputs of the same tool are nearly identical when at least this share (in
    /// percent) of their word pairs are the same ([`keys::call_shape`]); 100: only identical
    /// calls compare, rules (e)–(g) see identical calls alone.
    pub near_share: u32,
    /// (e) nearly identical calls in a row with the same result: suspect / loop.
    pub near_repeat_suspect: u32,
    pub near_repeat_loop: u32,
    /// (e) the same, every result blank (an empty answer says little): loop.
    pub blank_near_repeat_loop: u32,
    /// (f) calls in a row failing with the same non-blank error: suspect / loop
    /// (`None`: never loop).
    pub failure_run_suspect: u32,
    pub failure_run_loop: Option<u32>,
    /// (g) revisits among the last `revisit_window` steps (at most `history`): suspect /
    /// loop (`None`: never loop).
    pub revisit_window: usize,
    pub revisit_suspect: u32,
    pub revisit_loop: Option<u32>,
}

/// Bytes of a packed [`Config`]: its 19 numbers, each a little-endian `u32`.
pub const PACKED_CONFIG: usize = 19 * 4;

impl Config {
    /// The thresholds as 19 little-endian `u32`s (`None` as 0, `entropy` as 0 or 1):
    /// how the gateway hands them to its per-step NIF, read in one call where a nested
    /// tuple took some thirty. For a validated config (its sizes fit a `u32`).
    pub fn pack(&self) -> Vec<u8> {
        let opt = |n: Option<u32>| n.unwrap_or(0);
        let numbers = [
            self.history as u32,
            self.max_period as u32,
            self.repeat_suspect,
            self.repeat_loop,
            self.blank_repeat_loop,
            self.cycle_suspect,
            self.cycle_loop,
            self.failure_suspect,
            opt(self.failure_loop),
            u32::from(self.entropy),
            self.near_share,
            self.near_repeat_suspect,
            self.near_repeat_loop,
            self.blank_near_repeat_loop,
            self.failure_run_suspect,
            opt(self.failure_run_loop),
            self.revisit_window as u32,
            self.revisit_suspect,
            opt(self.revisit_loop),
        ];
        numbers.iter().flat_map(|n| n.to_le_bytes()).collect()
    }

    /// What [`pack`](Self::pack) packed, validated again; `None` for anything else.
    pub fn unpack(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != PACKED_CONFIG {
            return None;
        }
        let n = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        let never_as_zero = |v: u32| (v > 0).then_some(v);
        let config = Self {
            history: n(0) as usize,
            max_period: n(1) as usize,
            repeat_suspect: n(2),
            repeat_loop: n(3),
            blank_repeat_loop: n(4),
            cycle_suspect: n(5),
            cycle_loop: n(6),
            failure_suspect: n(7),
            failure_loop: never_as_zero(n(8)),
            entropy: match n(9) {
                0 => false,
                1 => true,
                _ => return None,
            },
            near_share: n(10),
            near_repeat_suspect: n(11),
            near_repeat_loop: n(12),
            blank_near_repeat_loop: n(13),
            failure_run_suspect: n(14),
            failure_run_loop: never_as_zero(n(15)),
            revisit_window: n(16) as usize,
            revisit_suspect: n(17),
            revisit_loop: never_as_zero(n(18)),
        };
        config.validate().ok().map(|_| config)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            history: 16,
            repeat_suspect: 2,
            repeat_loop: 3,
            blank_repeat_loop: 4,
            max_period: 5,
            cycle_suspect: 2,
            cycle_loop: 3,
            failure_suspect: 3,
            failure_loop: None,
            entropy: true,
            near_share: 75,
            near_repeat_suspect: 3,
            near_repeat_loop: 4,
            blank_near_repeat_loop: 6,
            failure_run_suspect: 3,
            failure_run_loop: Some(4),
            revisit_window: 6,
            revisit_suspect: 2,
            revisit_loop: Some(3),
        }
    }
}

impl Config {
    /// Each suspect threshold at least 2 (once is not a repetition) and at most its
    /// loop threshold (equal: no suspect stage), the blank thresholds at least 2
    /// (below their loop threshold they have no effect); history, period, near bits
    /// (50..=100) and revisit window (2..=[`MAX_HISTORY`], at most the history in use) in
    /// range.
    pub fn validate(&self) -> Result<(), Error> {
        let pair = |suspect: u32, lp: u32| suspect >= 2 && lp >= suspect;
        let optional =
            |suspect: u32, lp: Option<u32>| suspect >= 2 && lp.is_none_or(|l| l >= suspect);
        let ok = (2..=MAX_HISTORY).contains(&self.history)
            && (1..=MAX_PERIOD).contains(&self.max_period)
            && pair(self.repeat_suspect, self.repeat_loop)
            && self.blank_repeat_loop >= 2
            && pair(self.cycle_suspect, self.cycle_loop)
            && optional(self.failure_suspect, self.failure_loop)
            && (50..=100).contains(&self.near_share)
            && pair(self.near_repeat_suspect, self.near_repeat_loop)
            && self.blank_near_repeat_loop >= 2
            && optional(self.failure_run_suspect, self.failure_run_loop)
            && (2..=MAX_HISTORY).contains(&self.revisit_window)
            && optional(self.revisit_suspect, self.revisit_loop);
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidVerdictConfig)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    call: u64,
    shape: u64,
    /// The call's wording ([`StepKeys::wording`]) folded to 8 bits, to keep an entry at
    /// 40 bytes: a collision (one chance in 256, between two nearly identical calls with
    /// the same answer) lets a revisit pass for a new target; it never makes one.
    wording: u8,
    outcome: u64,
    /// The result word for word ([`StepKeys::exact`]), folded: different calls compare
    /// by it.
    exact: u32,
    /// What cycles compare: the gist of a failure (its numbers are counters), the exact
    /// outcome of a success; folded (that two of the 16 steps a session keeps
    /// collide is about one chance in 36 million).
    fuzzy: u32,
    /// The tool's hash, folded to 16 bits (a collision only lets two calls of different
    /// tools compare by shape).
    tool: u16,
    /// How many steps back the earlier step this one repeats is (the same or a nearly
    /// identical call, the same non-blank answer), 0 if none. A step's number is not
    /// kept: the ring holds consecutive steps, the newest being `steps`.
    revisit_back: u8,
    has_result: bool,
    failure: bool,
    blank: bool,
    /// The same call as the step before, and its result said nothing new.
    stale: bool,
}

/// Fewest word-pair bits a call must have for another call that keeps them all to be
/// its rework: `ls` or `cd ..` is kept in any longer command.
const REWORK_PAIRS: u32 = 4;

/// Most different lines an answer may have to count in a run of answers opening with
/// the same line: the rejection and one line more (what the shell made of the rest).
const OPENING_LINES: u32 = 2;

/// The level a rule's `count` reaches: loop at `loop_at` (never when `None`), suspect
/// at `suspect`, none below.
fn level_reached(count: u32, suspect: u32, loop_at: Option<u32>) -> Option<Level> {
    if loop_at.is_some_and(|l| count >= l) {
        Some(Level::Loop)
    } else if count >= suspect {
        Some(Level::Suspect)
    } else {
        None
    }
}

/// A 64-bit hash folded to 32 bits, for compact scans (a match is confirmed in full).
fn fold(hash: u64) -> u32 {
    (hash ^ (hash >> 32)) as u32
}

fn fold16(hash: u64) -> u16 {
    let h = fold(hash);
    (h ^ (h >> 16)) as u16
}

impl Entry {
    /// The same tool, and inputs sharing at least `near_share` percent of their word
    /// pairs (of the pairs in either shape; identical calls too).
    fn near(&self, other: &Entry, near_share: u32) -> bool {
        if self.call == other.call {
            return true;
        }
        let either = (self.shape | other.shape).count_ones();
        let one_only = (self.shape ^ other.shape).count_ones();
        near_share < 100
            && self.tool == other.tool
            && either > 0
            && 100 * (either - one_only) >= near_share * either
    }

    /// The same answer, compared exactly (ids normalized, numbers kept: across different
    /// calls or steps apart, a number that changed in an error is news, "limit 10 is too
    /// small" then "limit 20"); any blank answer is the same as any other blank answer,
    /// whatever the status (an empty `grep` fails, an empty `find` succeeds).
    fn same_answer(&self, other: &Entry) -> bool {
        (self.blank && other.blank) || (self.outcome == other.outcome && self.blank == other.blank)
    }

    /// Whether `later`, a failure after this one, failed with the same error: the same
    /// outcome; or the same reply (the error without the words it echoes of its call:
    /// [`StepKeys::exact`]) from a nearly identical call that keeps all of this one's
    /// word pairs and adds to them (a pipeline grown by a stage, a flag added). A call
    /// that dropped or changed words changed its target, and an error quoting the new
    /// target is news: `ls a/b/`, then `ls a/`, each "cannot access", is a search.
    fn same_error(&self, later: &Entry, near_share: u32) -> bool {
        self.outcome == later.outcome
            || (self.exact == later.exact
                && self.shape & !later.shape == 0
                && self.near(later, near_share))
    }

    /// Whether one of two calls is a rework of the other: the identical call; or, the
    /// same tool, not differing only in digits (a new target), and nearly identical, or
    /// one keeping every word pair of the other (at least [`REWORK_PAIRS`] bits) and
    /// adding words.
    fn reworks(&self, other: &Entry, near_share: u32) -> bool {
        if self.call == other.call {
            return true;
        }
        if self.tool != other.tool || self.wording == other.wording {
            return false;
        }
        let kept = |a: u64, b: u64| a & !b == 0 && a.count_ones() >= REWORK_PAIRS;
        self.near(other, near_share)
            || kept(self.shape, other.shape)
            || kept(other.shape, self.shape)
    }

    /// The same or a nearly identical call with the same answer. Between different calls
    /// the answer must also be the same word for word: normalization hides the ids and
    /// checksums that are noise when a call is re-sent, but news when the call changed
    /// (`sort | md5sum` then `sort -k 2 | md5sum`).
    fn alike(&self, other: &Entry, near_share: u32) -> bool {
        self.near(other, near_share)
            && self.same_answer(other)
            && (self.call == other.call || self.blank || self.exact == other.exact)
    }
}

/// A rule's finding.
#[derive(Debug, Clone, Copy)]
struct Finding {
    level: Level,
    rule: Rule,
    reason: Reason,
    evidence: Evidence,
}

/// One session's recent steps and its last verdict. The owner calls it with `&mut`.
#[derive(Debug, Clone, Default)]
pub struct VerdictState {
    ring: VecDeque<Entry>,
    /// The ring's outcomes folded to 32 bits, in the same order: rule (g) scans them on
    /// every step (one cache line at a history of 16), and confirms a match in the ring.
    outcomes: VecDeque<u32>,
    steps: u32,
    last: Option<Verdict>,
    /// The lines every result of the current run of the same call has shown.
    run_lines: LineSketch,
    /// The numbers of the newest step's result, and its skeleton.
    newest_numbers: NumberSketch,
    newest_skeleton: u64,
    /// Rule (e)'s chain ending at the newest step: its length, whether a link in it is
    /// nearly identical (not identical), whether every answer in it was blank.
    near_run: u32,
    near_run_near: bool,
    near_run_blank: bool,
    /// The newest steps answered with nothing, in a row (rule (e)'s reworks).
    blank_run: u32,
    /// Rule (a): the newest step's run of the same call, the stale steps ending it, and
    /// whether those (and the call before them) were all blank.
    same_run: u32,
    stale_run: u32,
    stale_blank: bool,
    /// Rule (f)'s other run: the newest steps whose answers open with the same line
    /// (`opening`), how many of them, and how many of those failed.
    opening: u64,
    opening_run: u32,
    opening_failed: u32,
}

impl VerdictState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a step and judges the session. `config` should be valid
    /// ([`Config::validate`]); out-of-range values are clamped.
    pub fn observe(
        &mut self,
        keys: StepKeys,
        entropy: Option<EntropySignal>,
        config: &Config,
    ) -> Verdict {
        self.steps = self.steps.saturating_add(1);
        let history = config.history.clamp(2, MAX_HISTORY);
        while self.ring.len() >= history {
            self.ring.pop_front();
            self.outcomes.pop_front();
        }
        let same_call = self.ring.back().is_some_and(|prev| prev.call == keys.call);
        let stale = same_call && self.says_nothing_new(&keys);
        if same_call {
            self.run_lines.union_with(&keys.lines);
        } else {
            self.run_lines = keys.lines;
        }
        self.newest_numbers = keys.numbers;
        self.newest_skeleton = keys.skeleton;
        let mut entry = Entry {
            call: keys.call,
            tool: fold16(keys.tool),
            shape: keys.shape,
            wording: fold16(keys.wording) as u8,
            outcome: keys.outcome,
            exact: fold(keys.exact),
            fuzzy: fold(if keys.failure {
                keys.gist
            } else {
                keys.outcome
            }),
            has_result: keys.has_result,
            failure: keys.failure,
            blank: keys.blank,
            stale,
            revisit_back: 0,
        };
        entry.revisit_back = self.revisit_back(&entry, config);
        self.extend_runs(&entry, config);
        self.extend_opening_run(&keys);
        self.blank_run = if entry.blank { self.blank_run + 1 } else { 0 };
        self.outcomes.push_back(fold(entry.outcome));
        self.ring.push_back(entry);

        let specific = [
            self.repeat(config),
            self.cycle(config),
            self.near_repeat(config),
            self.blank_rework(config),
            self.failure_run(config),
            self.opening_run(config),
            self.revisit(config),
            self.same_failure(config),
        ]
        .into_iter()
        .flatten()
        .reduce(|best, next| if next.level > best.level { next } else { best });
        let finding = specific
            .or_else(|| self.entropy(entropy, config))
            .unwrap_or(Finding {
                level: Level::Progress,
                rule: Rule::None,
                reason: Reason::NoRepetition {
                    steps: self.ring.len(),
                },
                evidence: Evidence::default(),
            });

        let verdict = Verdict {
            level: finding.level,
            rule: finding.rule,
            reason: finding.reason,
            evidence: finding.evidence,
            step: self.steps,
            previous: self.last.map(|v| v.level),
        };
        self.last = Some(verdict);
        verdict
    }

    /// Starts loading the history the next [`observe`](Self::observe) reads (its
    /// ring and outcomes, allocations of their own): called before other work, their
    /// loads overlap it rather than wait one after the other.
    pub fn prefetch(&self) {
        let (older, newer) = self.ring.as_slices();
        crate::prefetch::slice(newer);
        crate::prefetch::slice(older);
        let (older, newer) = self.outcomes.as_slices();
        crate::prefetch::slice(newer);
        crate::prefetch::slice(older);
    }

    /// The verdict on the session's latest step.
    pub fn last(&self) -> Option<&Verdict> {
        self.last.as_ref()
    }

    /// Steps observed so far.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// Forgets the history, the step count and the last verdict.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    fn at(&self, back: usize) -> &Entry {
        &self.ring[self.ring.len() - 1 - back]
    }

    /// Whether `keys`, the same call as the newest step, says nothing the run of that
    /// call has not said: the same result; or no new line (a new line is progress when
    /// it is at least a tenth of the result's lines) and either a failure (numbers in
    /// an error are counters: `line 12`, `line 13`), the same lines in another order
    /// or number, or the same text with at most a third of its numbers changed (a
    /// timing, a speed, a size in a long log). A successful result whose numbers
    /// mostly changed (`{"progress": 40}`, then 60) is the answer moving: progress.
    fn says_nothing_new(&self, keys: &StepKeys) -> bool {
        let prev = self.ring.back().expect("the newest step");
        if keys.outcome == prev.outcome {
            return true;
        }
        let new = keys.lines.new_against(&self.run_lines);
        if new > 0 && new * 10 >= keys.lines.len() {
            return false;
        }
        keys.failure
            || keys.skeleton != self.newest_skeleton
            || keys.numbers.mostly_same_as(&self.newest_numbers)
    }

    /// Rule (a): the same call several times in a row, the last of them saying
    /// nothing new.
    fn repeat(&self, config: &Config) -> Option<Finding> {
        // Kept as the steps come (`extend_runs`); a history shrunk at run time keeps
        // what it still holds.
        let run = (self.same_run as usize).min(self.ring.len());
        if run < 2 {
            return None;
        }
        let stale = (self.stale_run as usize).min(run - 1);
        let times = (stale + 1) as u32;
        let blank = if stale == self.stale_run as usize {
            self.stale_blank
        } else {
            (0..=stale).all(|k| self.at(k).blank)
        };
        let loop_at = if blank {
            config.blank_repeat_loop.max(config.repeat_loop)
        } else {
            config.repeat_loop
        };
        let (level, reason, shown) = if stale == 0 {
            let times = run as u32;
            (Level::Progress, Reason::Polling { times }, run)
        } else if times >= loop_at {
            (Level::Loop, Reason::Repeated { times, blank }, stale + 1)
        } else if times >= config.repeat_suspect {
            (Level::Suspect, Reason::Repeated { times, blank }, stale + 1)
        } else {
            // Said nothing new, but not yet as often as `repeat_suspect` asks.
            (
                Level::Progress,
                Reason::Repeated { times, blank },
                stale + 1,
            )
        };
        Some(Finding {
            level,
            rule: Rule::Repeat,
            reason,
            evidence: self.newest(shown),
        })
    }

    /// Rule (b): the smallest period of 2..=max_period whose block of calls repeats at
    /// least twice at the end of the history, judged by its outcomes (compared as
    /// `fuzzy`: see [`Entry`]).
    fn cycle(&self, config: &Config) -> Option<Finding> {
        let n = self.ring.len();
        let max_period = config.max_period.clamp(1, MAX_PERIOD).min(n / 2);
        for p in 2..=max_period {
            // A block of one call repeated is rule (a)'s.
            if (0..p).all(|k| self.at(k).call == self.at(0).call) {
                continue;
            }
            let calls = (0..n - p)
                .take_while(|&k| self.at(k).call == self.at(k + p).call)
                .count();
            let blocks = ((calls + p) / p) as u32;
            if blocks < 2 {
                continue;
            }
            let outcomes = (0..calls)
                .take_while(|&k| self.at(k).fuzzy == self.at(k + p).fuzzy)
                .count();
            let stable = ((outcomes + p) / p) as u32;
            let level = level_reached(stable, config.cycle_suspect, Some(config.cycle_loop))
                .unwrap_or(Level::Progress);
            let period = p as u32;
            let (shown, reason) = if level == Level::Progress {
                (blocks, Reason::CycleProgress { period, blocks })
            } else {
                (
                    stable,
                    Reason::Cycle {
                        period,
                        blocks: stable,
                    },
                )
            };
            return Some(Finding {
                level,
                rule: Rule::Cycle,
                reason,
                evidence: self.newest(shown as usize * p),
            });
        }
        None
    }

    /// Rule (e): the newest steps, each a nearly identical call of the step before with
    /// the same answer (or the same call saying nothing new), at least one of them not
    /// identical (identical calls alone are rule (a)'s).
    fn near_repeat(&self, config: &Config) -> Option<Finding> {
        if !self.near_run_near {
            return None;
        }
        // A history shrunk at run time keeps what it still holds.
        let times = self.near_run.min(self.ring.len() as u32);
        let blank = self.near_run_blank;
        let loop_at = if blank {
            config.blank_near_repeat_loop.max(config.near_repeat_loop)
        } else {
            config.near_repeat_loop
        };
        let level = level_reached(times, config.near_repeat_suspect, Some(loop_at))?;
        Some(Finding {
            level,
            rule: Rule::NearRepeat,
            reason: Reason::NearRepeat { times, blank },
            evidence: self.newest(times as usize),
        })
    }

    /// Rule (e), for empty answers: the newest `blank_near_repeat_loop` steps were all
    /// answered with nothing, and each is a *rework* of another of them — the identical
    /// call re-sent, a nearly identical one, or the same tool's call with every word pair
    /// of the other kept and words added (a stage appended to a pipeline that printed
    /// nothing). An empty answer tells the agent nothing; six in a row, all variations of
    /// one another, are one command worked over and over. Calls that differ only in their
    /// digits (`file3`, `file4`) or in their target (`mkdir -p /srv/app/logs`, then
    /// `…/cache`: a pair lost) are not reworks: the same command on other targets.
    /// Only judged once the run of empty answers is long enough: other steps cost one
    /// counter.
    fn blank_rework(&self, config: &Config) -> Option<Finding> {
        let n = config
            .blank_near_repeat_loop
            .max(config.near_repeat_loop)
            .max(2) as usize;
        // near_share 100: only identical calls compare, and those are rule (a)'s.
        if (self.blank_run as usize) < n || self.ring.len() < n || config.near_share >= 100 {
            return None;
        }
        // Identical calls alone are rule (a)'s, a chain of near repeats rule (e)'s own.
        if (1..n).all(|k| self.at(k).call == self.at(0).call) {
            return None;
        }
        let reworked =
            |k: usize| (0..n).any(|j| j != k && self.at(j).reworks(self.at(k), config.near_share));
        if !(0..n).all(reworked) {
            return None;
        }
        Some(Finding {
            level: Level::Loop,
            rule: Rule::NearRepeat,
            reason: Reason::BlankRework { times: n as u32 },
            evidence: self.newest(n),
        })
    }

    /// Extends or restarts rules (e)'s and (f)'s runs with `entry`, before it is pushed:
    /// a step costs the same whatever the runs' length.
    fn extend_runs(&mut self, entry: &Entry, config: &Config) {
        let prev = self.ring.back();
        let linked = prev.is_some_and(|p| {
            if p.call == entry.call {
                entry.stale
            } else {
                p.alike(entry, config.near_share)
            }
        });
        if linked {
            self.near_run += 1;
            self.near_run_near |= prev.is_some_and(|p| p.call != entry.call);
            self.near_run_blank &= entry.blank;
        } else {
            self.near_run = 1;
            self.near_run_near = false;
            self.near_run_blank = entry.blank;
        }
        let same_call = prev.is_some_and(|p| p.call == entry.call);
        self.same_run = if same_call { self.same_run + 1 } else { 1 };
        if entry.stale {
            // A stale step follows the same call: the run's head counts too.
            self.stale_blank = if self.stale_run == 0 {
                prev.is_some_and(|p| p.blank) && entry.blank
            } else {
                self.stale_blank && entry.blank
            };
            self.stale_run += 1;
        } else {
            self.stale_run = 0;
            self.stale_blank = entry.blank;
        }
    }

    /// Extends or restarts the run of answers opening with the same line with `keys`.
    /// A blank answer, or one without a line of text, ends it: an edit that prints
    /// nothing between two runs of a test is work between them. So does an answer of
    /// more than [`OPENING_LINES`] different lines: the call ran and said something of
    /// its own (a test runner's banner, then its report).
    fn extend_opening_run(&mut self, keys: &StepKeys) {
        if keys.blank || keys.opening == 0 || keys.lines.len() > OPENING_LINES {
            self.opening = 0;
            self.opening_run = 0;
            self.opening_failed = 0;
            return;
        }
        if keys.opening != self.opening {
            self.opening = keys.opening;
            self.opening_run = 0;
            self.opening_failed = 0;
        }
        self.opening_run += 1;
        self.opening_failed += u32::from(keys.failure);
    }

    /// Rule (f), its other half: the newest answers all open with the same line, some
    /// of them failures and some successes — the newest a failure, or two of them
    /// successes. A line that comes first whether the call failed or not is not the
    /// command's answer but something in front of every call (a wrapper the shell
    /// cannot run, a broken environment): the calls never ran.
    fn opening_run(&self, config: &Config) -> Option<Finding> {
        let times = self.opening_run.min(self.ring.len() as u32);
        let failed = self.opening_failed.min(times);
        // All failures (a traceback's header) or all successes (a listing's header)
        // are rule (f)'s or nobody's; one success after failures that open alike may
        // be the call that finally worked (a test runner's banner, then a pass).
        let succeeded = times - failed;
        if failed == 0 || succeeded == 0 || (!self.at(0).failure && succeeded < 2) {
            return None;
        }
        let level = level_reached(times, config.failure_run_suspect, config.failure_run_loop)?;
        Some(Finding {
            level,
            rule: Rule::FailureRun,
            reason: Reason::SameOpening { times, failed },
            evidence: self.newest(times as usize),
        })
    }

    /// Rule (f): the newest steps failed, each with the same error as the failure after
    /// it, whatever their calls; steps with an empty answer between them neither count
    /// nor break the run (an edit that prints nothing between two runs of a test that
    /// fails alike, an empty `grep` between two rejected reads).
    fn failure_run(&self, config: &Config) -> Option<Finding> {
        let newest = self.at(0);
        if !newest.failure || newest.blank {
            return None;
        }
        let mut failed = [0u32; MAX_HISTORY];
        failed[0] = self.steps;
        let mut count = 1;
        let mut later = newest;
        let (mut quiet, mut skipped) = (0, 0);
        for k in 1..self.ring.len() {
            let entry = self.at(k);
            if entry.blank {
                skipped += 1;
                continue;
            }
            if !(entry.failure && entry.same_error(later, config.near_share)) {
                break;
            }
            failed[count] = self.step_at(k);
            count += 1;
            later = entry;
            quiet = skipped;
        }
        let times = count as u32;
        let level = level_reached(times, config.failure_run_suspect, config.failure_run_loop)?;
        Some(Finding {
            level,
            rule: Rule::FailureRun,
            reason: Reason::FailureRun {
                times,
                quiet: quiet as u32,
            },
            evidence: Evidence::from_iter(failed[..count].iter().rev().copied()),
        })
    }

    /// How many steps back the newest earlier step `entry` repeats is: the same or a
    /// nearly identical call with the same non-blank answer, anywhere in the history
    /// (`entry` is not in the ring yet). 0 if none.
    fn revisit_back(&self, entry: &Entry, config: &Config) -> u8 {
        let n = self.outcomes.len();
        if entry.blank {
            // An empty answer says little: only the identical call counts, with nothing
            // but failures and empty answers since.
            let quiet = |e: &Entry| e.failure || e.blank;
            return self
                .with_outcome(entry.outcome)
                .find(|&i| i + 1 < n && self.ring[i].blank && self.ring[i].call == entry.call)
                .filter(|&i| (i + 1..n).all(|j| quiet(&self.ring[j])))
                .map_or(0, |i| (n - i) as u8);
        }
        // A different call in the same words with other numbers (the next order, the
        // next file) has a new target: the same answer is not knowledge re-discovered.
        self.with_outcome(entry.outcome)
            .find(|&i| {
                let e = &self.ring[i];
                e.alike(entry, config.near_share)
                    && (e.call == entry.call || e.wording != entry.wording)
            })
            .map_or(0, |i| (n - i) as u8)
    }

    /// The ring indexes of the steps whose outcome may be `outcome` (its 32-bit fold
    /// matches; confirm in the ring), newest first. The folded outcomes are contiguous:
    /// most steps share none of them.
    fn with_outcome(&self, outcome: u64) -> impl Iterator<Item = usize> + '_ {
        let folded = fold(outcome);
        let (older, newer) = self.outcomes.as_slices();
        let newer = newer
            .iter()
            .enumerate()
            .rev()
            .map(move |(i, &o)| (older.len() + i, o));
        newer
            .chain(older.iter().copied().enumerate().rev())
            .filter(move |&(_, o)| o == folded)
            .map(|(i, _)| i)
    }

    /// The number of the step `back` steps before the newest (0: the newest).
    fn step_at(&self, back: usize) -> u32 {
        self.steps - back as u32
    }

    /// Rule (g): the newest step repeats an earlier one, and so do others among the last
    /// `revisit_window` steps.
    fn revisit(&self, config: &Config) -> Option<Finding> {
        if self.at(0).revisit_back == 0 {
            return None;
        }
        let window = config.revisit_window.min(self.ring.len());
        let revisits = (0..window)
            .filter(|&k| self.at(k).revisit_back != 0)
            .count() as u32;
        let level = level_reached(revisits, config.revisit_suspect, config.revisit_loop)?;
        // The latest revisiting steps and the steps they repeat, oldest first: at most
        // MAX_EVIDENCE steps, as evidence holds.
        let mut steps = [0u32; MAX_EVIDENCE];
        let mut count = 0;
        for k in 0..window {
            let back = self.at(k).revisit_back;
            if back != 0 && count + 2 <= MAX_EVIDENCE {
                steps[count] = self.step_at(k);
                steps[count + 1] = self.step_at(k) - u32::from(back);
                count += 2;
            }
        }
        let steps = &mut steps[..count];
        steps.sort_unstable();
        let mut unique = [0u32; MAX_EVIDENCE];
        let mut n = 0;
        for &step in steps.iter() {
            if n == 0 || unique[n - 1] != step {
                unique[n] = step;
                n += 1;
            }
        }
        Some(Finding {
            level,
            rule: Rule::Revisit,
            reason: Reason::Revisit {
                revisits,
                window: window as u32,
            },
            evidence: Evidence::from_iter(unique[..n].iter().copied()),
        })
    }

    /// Rule (c): distinct calls among the recent steps that failed with this step's
    /// outcome.
    fn same_failure(&self, config: &Config) -> Option<Finding> {
        let current = self.at(0);
        if !(current.failure && current.has_result) || current.blank {
            return None;
        }
        // Newest first: the latest step of each distinct call is the evidence.
        let mut calls = [0u64; MAX_HISTORY];
        let mut steps = [0u32; MAX_HISTORY];
        let mut count = 0;
        // The contiguous outcomes first: most steps do not share this one.
        let n = self.outcomes.len();
        for i in self.with_outcome(current.outcome) {
            let entry = &self.ring[i];
            if entry.failure
                && entry.outcome == current.outcome
                && !calls[..count].contains(&entry.call)
            {
                calls[count] = entry.call;
                steps[count] = self.step_at(n - 1 - i);
                count += 1;
            }
        }
        let distinct = count as u32;
        let level = level_reached(distinct, config.failure_suspect, config.failure_loop)?;
        Some(Finding {
            level,
            rule: Rule::SameFailure,
            reason: Reason::SameFailure { calls: distinct },
            evidence: Evidence::from_iter(steps[..count].iter().rev().copied()),
        })
    }

    /// Rule (d): the entropy severity, explained away when every `(call, outcome)` pair
    /// in its window differs.
    fn entropy(&self, signal: Option<EntropySignal>, config: &Config) -> Option<Finding> {
        let signal = signal.filter(|s| config.entropy && s.severity != Severity::Normal)?;
        let window = signal.window.clamp(1, self.ring.len());
        let pair = |k: usize| (self.at(k).call, self.at(k).outcome);
        let repeated = |k: usize| (0..window).any(|j| j != k && pair(j) == pair(k));
        let evidence = Evidence::from_iter(
            (0..window)
                .rev()
                .filter(|&k| repeated(k))
                .map(|k| self.step_at(k)),
        );
        let (level, reason) = if evidence.as_slice().is_empty() {
            (Level::Progress, Reason::EntropyExplained { window })
        } else {
            (Level::Suspect, Reason::EntropyRepeats { window })
        };
        Some(Finding {
            level,
            rule: Rule::Entropy,
            reason,
            evidence,
        })
    }

    /// The step numbers of the newest `count` steps, oldest first.
    fn newest(&self, count: usize) -> Evidence {
        let count = count.min(self.ring.len());
        Evidence::from_iter((0..count).rev().map(|k| self.step_at(k)))
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod scenarios;

#[cfg(test)]
mod packing_tests {
    use super::*;

    #[test]
    fn a_packed_config_reads_back_the_same() {
        let default = Config::default();
        let every_field = Config {
            history: 40,
            max_period: 7,
            repeat_suspect: 3,
            repeat_loop: 5,
            blank_repeat_loop: 6,
            cycle_suspect: 2,
            cycle_loop: 4,
            failure_suspect: 3,
            failure_loop: Some(9),
            entropy: false,
            near_share: 80,
            near_repeat_suspect: 4,
            near_repeat_loop: 7,
            blank_near_repeat_loop: 8,
            failure_run_suspect: 3,
            failure_run_loop: None,
            revisit_window: 12,
            revisit_suspect: 2,
            revisit_loop: Some(5),
        };
        for config in [default, every_field] {
            config.validate().expect("a valid config");
            assert_eq!(Config::unpack(&config.pack()), Some(config));
        }
    }

    #[test]
    fn a_packed_config_that_is_not_one_is_refused() {
        let packed = Config::default().pack();
        assert_eq!(Config::unpack(&packed[..packed.len() - 1]), None);
        assert_eq!(Config::unpack(&[]), None);
        // history 1 is outside 2..=64: checked again when read.
        let mut bad = packed.clone();
        bad[..4].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(Config::unpack(&bad), None);
        // entropy is 0 or 1.
        let mut bad = packed;
        bad[36..40].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(Config::unpack(&bad), None);
    }

    /// Keys whose every field differs from every other's, and each flag on its own.
    fn distinct_keys(seed: u64, flags: u8) -> StepKeys {
        let h = |i: u64| keys::hash64(&i.to_le_bytes(), seed);
        let mut lines = LineSketch::default();
        for (i, word) in lines.0.iter_mut().enumerate() {
            *word = h(100 + i as u64);
        }
        StepKeys {
            call: h(1),
            tool: h(2),
            shape: h(3),
            wording: h(4),
            outcome: h(5),
            exact: h(6),
            gist: h(7),
            skeleton: h(8),
            lines,
            has_result: flags & 1 != 0,
            failure: flags & 2 != 0,
            blank: flags & 4 != 0,
            numbers: NumberSketch {
                bits: [h(9), h(10), h(11), h(12)],
                count: h(13) as u32,
            },
            opening: h(14),
        }
    }

    #[test]
    fn packed_keys_read_back_the_same() {
        for seed in 0..64 {
            for flags in 0..8 {
                let keys = distinct_keys(seed, flags);
                assert_eq!(StepKeys::from_bytes(&keys.to_bytes()), Some(keys));
            }
        }
        for keys in [
            StepKeys::exact(u64::MAX, 0, true, true),
            StepKeys::exact(0, u64::MAX, false, false),
        ] {
            assert_eq!(StepKeys::from_bytes(&keys.to_bytes()), Some(keys));
        }
    }

    #[test]
    fn packed_keys_that_are_not_keys_are_refused() {
        let packed = distinct_keys(1, 3).to_bytes();
        assert_eq!(StepKeys::from_bytes(&packed[..KEYS_BYTES - 1]), None);
        assert_eq!(
            StepKeys::from_bytes(&[packed.as_slice(), &[0]].concat()),
            None
        );
        assert_eq!(StepKeys::from_bytes(&[]), None);
        let mut bad = packed;
        bad[KEY_WORDS * 8 + 4] = 8;
        assert_eq!(StepKeys::from_bytes(&bad), None);
    }
}
