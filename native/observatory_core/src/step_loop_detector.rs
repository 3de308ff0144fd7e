//! Agent-level loop detection over whole steps (seed 002, layer 1): the 2×2 progress
//! matrix.
//!
//! The agent acts by running code, so the unit of analysis is the step: the code it
//! ran (the *approach*) and what came back (the *outcome*), each reduced to a SHA-256
//! digest by the caller, normally [`stable_hash`](crate::stable_json::stable_hash).
//! Full digests rather than 64-bit ones: a false "repeated" would push a working agent
//! towards a block, and at 2 × 32 bytes per remembered step the memory is negligible.
//!
//! |                   | new outcome   | repeated outcome |
//! |-------------------|---------------|------------------|
//! | new approach      | FullProgress  | Stuck            |
//! | repeated approach | WorldChanged  | FullStagnation   |
//!
//! **Repeated** means equal to the approach (or, separately, the outcome) of any of the
//! last `history` steps (default [`DEFAULT_HISTORY`]), not only the previous one: an
//! agent alternating between two outcomes is going round in circles too. The two axes
//! are independent, as in the TypeScript original: the repeated approach and the
//! repeated outcome need not come from the same earlier step. The bound keeps memory
//! fixed per session and lets an old outcome count as new again once it is far enough
//! in the past.
//!
//! FullProgress and WorldChanged reset both streaks; Stuck adds one to the stuck streak
//! and resets stagnation; FullStagnation does the reverse. Since each streak resets the
//! other, at most one is non-zero at a time. Reaching a warn threshold returns guidance
//! for the LLM to read beside the real result; reaching a block threshold blocks the
//! detector until [`StepLoopDetector::reset`].

use std::collections::VecDeque;
use std::num::NonZeroUsize;

use crate::stable_json::Digest;
use crate::Error;

/// How many past steps count as "seen" by default.
pub const DEFAULT_HISTORY: NonZeroUsize = NonZeroUsize::new(64).unwrap();

/// Streak lengths at which the detector warns and blocks. A streak counts the steps in
/// a row that fell in the same loop cell, so the defaults warn on the third repeat in a
/// row, not the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub stagnation_warn: u32,
    pub stagnation_block: u32,
    pub stuck_warn: u32,
    pub stuck_block: u32,
}

/// Bytes of packed thresholds and history: four little-endian `u32`s and a `u64`.
pub const PACKED_SETTINGS: usize = 4 * 4 + 8;

impl Thresholds {
    /// The thresholds and a history length as [`PACKED_SETTINGS`] bytes: how the
    /// gateway hands them to its per-step NIF.
    pub fn pack(self, history: u64) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(PACKED_SETTINGS);
        for n in [
            self.stagnation_warn,
            self.stagnation_block,
            self.stuck_warn,
            self.stuck_block,
        ] {
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        bytes.extend_from_slice(&history.to_le_bytes());
        bytes
    }

    /// What [`pack`](Self::pack) packed, the thresholds validated again; `None` for
    /// anything else.
    pub fn unpack(bytes: &[u8]) -> Option<(Self, u64)> {
        if bytes.len() != PACKED_SETTINGS {
            return None;
        }
        let n = |i: usize| u32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        let thresholds = Self {
            stagnation_warn: n(0),
            stagnation_block: n(1),
            stuck_warn: n(2),
            stuck_block: n(3),
        };
        thresholds.validate().ok()?;
        let history = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        Some((thresholds, history))
    }
}

impl Default for Thresholds {
    /// The seed's table: stagnation warns at 3 and blocks at 5, stuck at 5 and 8. Stuck
    /// is given more room because trying new code is what a working agent does.
    fn default() -> Self {
        Self {
            stagnation_warn: 3,
            stagnation_block: 5,
            stuck_warn: 5,
            stuck_block: 8,
        }
    }
}

impl Thresholds {
    /// Warn must be at least 1 (a streak of 0 is no loop) and block at least warn
    /// (block = warn blocks without a warning first, which is allowed).
    pub fn validate(&self) -> Result<(), Error> {
        let pair_ok = |warn: u32, block: u32| warn >= 1 && block >= warn;
        if pair_ok(self.stagnation_warn, self.stagnation_block)
            && pair_ok(self.stuck_warn, self.stuck_block)
        {
            Ok(())
        } else {
            Err(Error::InvalidStepThresholds)
        }
    }
}

/// Where a step falls in the progress matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cell {
    /// New approach, new outcome.
    FullProgress,
    /// Repeated approach, new outcome: the same code now does something else.
    WorldChanged,
    /// New approach, repeated outcome: different code, a result already seen.
    Stuck,
    /// Repeated approach, repeated outcome.
    FullStagnation,
}

impl Cell {
    fn classify(approach_seen: bool, outcome_seen: bool) -> Self {
        match (approach_seen, outcome_seen) {
            (false, false) => Cell::FullProgress,
            (true, false) => Cell::WorldChanged,
            (false, true) => Cell::Stuck,
            (true, true) => Cell::FullStagnation,
        }
    }
}

/// What the caller should do with the step's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Return the result as it is.
    Continue,
    /// Append `guidance` to the result, where the LLM will read it.
    Warn { guidance: String },
    /// Append `guidance` and run no more code until the detector is reset.
    Block { guidance: String },
}

impl Action {
    /// The text to append to the result, if any.
    pub fn guidance(&self) -> Option<&str> {
        match self {
            Action::Continue => None,
            Action::Warn { guidance } | Action::Block { guidance } => Some(guidance),
        }
    }
}

/// The outcome of [`StepLoopDetector::analyze`]: the step's cell, the streaks after it,
/// and the action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub cell: Cell,
    pub stagnation_streak: u32,
    pub stuck_streak: u32,
    pub action: Action,
}

/// One session's step history, streaks and block flag. Not shared: the owner of the
/// session calls it with `&mut`.
#[derive(Debug, Clone)]
pub struct StepLoopDetector {
    thresholds: Thresholds,
    /// The approaches and outcomes of the last `history` steps.
    recent: Recent,
    stagnation_streak: u32,
    stuck_streak: u32,
    /// The guidance of the step that blocked; `Some` means blocked.
    block: Option<String>,
}

impl StepLoopDetector {
    /// A detector remembering the last [`DEFAULT_HISTORY`] steps.
    pub fn new(thresholds: Thresholds) -> Result<Self, Error> {
        Self::with_history(thresholds, DEFAULT_HISTORY)
    }

    /// A detector remembering the last `history` steps.
    pub fn with_history(thresholds: Thresholds, history: NonZeroUsize) -> Result<Self, Error> {
        thresholds.validate()?;
        Ok(Self {
            thresholds,
            recent: Recent::new(history.get()),
            stagnation_streak: 0,
            stuck_streak: 0,
            block: None,
        })
    }

    /// Classifies a finished step, updates the streaks and says what to do.
    ///
    /// Once blocked, every call returns the blocking step's guidance as `Block` and
    /// changes nothing, neither streaks nor history: the cell is still reported, against
    /// the history as it was when the block fell.
    pub fn analyze(&mut self, approach: Digest, outcome: Digest) -> Verdict {
        let (approach_seen, outcome_seen) = self.recent.seen(&approach, &outcome);
        let cell = Cell::classify(approach_seen, outcome_seen);
        if let Some(guidance) = &self.block {
            let action = Action::Block {
                guidance: guidance.clone(),
            };
            return self.verdict(cell, action);
        }

        self.recent.push(&approach, &outcome);
        match cell {
            Cell::FullProgress | Cell::WorldChanged => {
                self.stagnation_streak = 0;
                self.stuck_streak = 0;
            }
            Cell::Stuck => {
                self.stuck_streak = self.stuck_streak.saturating_add(1);
                self.stagnation_streak = 0;
            }
            Cell::FullStagnation => {
                self.stagnation_streak = self.stagnation_streak.saturating_add(1);
                self.stuck_streak = 0;
            }
        }

        let action = self.action();
        if let Action::Block { guidance } = &action {
            self.block = Some(guidance.clone());
        }
        self.verdict(cell, action)
    }

    /// Starts loading what the next [`analyze`](Self::analyze) scans (the digests'
    /// heads, allocations of their own), so that the loads overlap other work.
    pub fn prefetch(&self) {
        self.recent.prefetch();
    }

    /// True from the step that reached a block threshold until [`reset`](Self::reset).
    /// Check it before running the agent's code.
    pub fn is_blocked(&self) -> bool {
        self.block.is_some()
    }

    /// Forgets history and streaks and lifts the block; thresholds stay.
    pub fn reset(&mut self) {
        self.recent.clear();
        self.stagnation_streak = 0;
        self.stuck_streak = 0;
        self.block = None;
    }

    pub fn thresholds(&self) -> Thresholds {
        self.thresholds
    }

    /// Replaces the thresholds (configuration changed at run time); streaks stay.
    pub fn set_thresholds(&mut self, thresholds: Thresholds) -> Result<(), Error> {
        thresholds.validate()?;
        self.thresholds = thresholds;
        Ok(())
    }

    pub fn stagnation_streak(&self) -> u32 {
        self.stagnation_streak
    }

    pub fn stuck_streak(&self) -> u32 {
        self.stuck_streak
    }

    fn verdict(&self, cell: Cell, action: Action) -> Verdict {
        Verdict {
            cell,
            stagnation_streak: self.stagnation_streak,
            stuck_streak: self.stuck_streak,
            action,
        }
    }

    /// Block before warn; only one streak is ever non-zero, so the order between the
    /// stagnation and stuck checks does not matter.
    fn action(&self) -> Action {
        let t = &self.thresholds;
        let (stagnation, stuck) = (self.stagnation_streak, self.stuck_streak);
        if stagnation >= t.stagnation_block {
            Action::Block {
                guidance: format!(
                    "Loop blocked: {stagnation} steps in a row re-ran code you had already run \
                     and got a result you had already seen. Code execution is now disabled. \
                     Summarize what you did, what is blocking you, and stop."
                ),
            }
        } else if stuck >= t.stuck_block {
            Action::Block {
                guidance: format!(
                    "Loop blocked: {stuck} different approaches in a row all produced a result \
                     you had already seen. Code execution is now disabled. Summarize what you \
                     tried, what is blocking you, and stop."
                ),
            }
        } else if stagnation >= t.stagnation_warn {
            Action::Warn {
                guidance: format!(
                    "Loop warning: {stagnation} steps in a row re-ran code you had already run \
                     and got a result you had already seen. Repeating it will not change the \
                     result: change the approach, or summarize what is blocking you. \
                     (Execution is blocked at {}.)",
                    t.stagnation_block
                ),
            }
        } else if stuck >= t.stuck_warn {
            Action::Warn {
                guidance: format!(
                    "Loop warning: your last {stuck} approaches were different but all produced \
                     a result you had already seen. Re-examine your assumptions about the cause, \
                     or summarize what is blocking you. (Execution is blocked at {}.)",
                    t.stuck_block
                ),
            }
        } else {
            Action::Continue
        }
    }
}

/// The approach and outcome digests of the last `capacity` steps, oldest first.
/// Membership is a scan: at the gateway's history (16) cheaper than a hash map is to
/// hash into (keyed SipHash over 32 bytes, several lookups a step, each session's map
/// a separate allocation). Each digest is kept in two rings: its first 8 bytes, which
/// tell nearly every other digest apart and are all a scan reads (a step's two heads
/// side by side: at 16 steps one pass over 256 contiguous bytes, four cache lines,
/// where the two rings of whole digests took sixteen), and its other 24, read only to
/// confirm a match. The same memory as whole digests. At the largest history (1024) a
/// scan is 16 KiB.
#[derive(Debug, Clone)]
struct Recent {
    heads: VecDeque<[u64; 2]>,
    tails: VecDeque<[[u8; 24]; 2]>,
    capacity: usize,
}

fn split(digest: &Digest) -> (u64, [u8; 24]) {
    let (head, tail) = digest.split_at(8);
    (
        u64::from_ne_bytes(head.try_into().expect("8 bytes")),
        tail.try_into().expect("24 bytes"),
    )
}

impl Recent {
    fn new(capacity: usize) -> Self {
        Self {
            heads: VecDeque::new(),
            tails: VecDeque::new(),
            capacity,
        }
    }

    /// Whether `approach` is among the remembered approaches, and `outcome` among the
    /// outcomes (each on its own axis).
    fn seen(&self, approach: &Digest, outcome: &Digest) -> (bool, bool) {
        let (approach_head, approach_tail) = split(approach);
        let (outcome_head, outcome_tail) = split(outcome);
        let (mut approach_seen, mut outcome_seen) = (false, false);
        for (i, [a, o]) in self.heads.iter().enumerate() {
            approach_seen |= *a == approach_head && self.tails[i][0] == approach_tail;
            outcome_seen |= *o == outcome_head && self.tails[i][1] == outcome_tail;
            if approach_seen && outcome_seen {
                break;
            }
        }
        (approach_seen, outcome_seen)
    }

    fn prefetch(&self) {
        let (older, newer) = self.heads.as_slices();
        crate::prefetch::slice(newer);
        crate::prefetch::slice(older);
    }

    fn push(&mut self, approach: &Digest, outcome: &Digest) {
        if self.heads.len() == self.capacity {
            self.heads.pop_front();
            self.tails.pop_front();
        }
        let (approach_head, approach_tail) = split(approach);
        let (outcome_head, outcome_tail) = split(outcome);
        self.heads.push_back([approach_head, outcome_head]);
        self.tails.push_back([approach_tail, outcome_tail]);
    }

    fn clear(&mut self) {
        self.heads.clear();
        self.tails.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> Digest {
        [n; 32]
    }

    fn detector() -> StepLoopDetector {
        StepLoopDetector::new(Thresholds::default()).unwrap()
    }

    fn is_warn(v: &Verdict) -> bool {
        matches!(v.action, Action::Warn { .. })
    }

    fn is_block(v: &Verdict) -> bool {
        matches!(v.action, Action::Block { .. })
    }

    /// Runs the same (approach, outcome) `times` times and returns the verdicts.
    fn repeat(det: &mut StepLoopDetector, a: u8, o: u8, times: usize) -> Vec<Verdict> {
        (0..times).map(|_| det.analyze(d(a), d(o))).collect()
    }

    #[test]
    fn first_step_is_full_progress() {
        let v = detector().analyze(d(1), d(2));
        assert_eq!(v.cell, Cell::FullProgress);
        assert_eq!((v.stagnation_streak, v.stuck_streak), (0, 0));
        assert_eq!(v.action, Action::Continue);
    }

    #[test]
    fn every_cell_of_the_matrix() {
        let mut det = detector();
        assert_eq!(det.analyze(d(1), d(10)).cell, Cell::FullProgress);
        assert_eq!(det.analyze(d(1), d(11)).cell, Cell::WorldChanged);
        assert_eq!(det.analyze(d(2), d(11)).cell, Cell::Stuck);
        assert_eq!(det.analyze(d(2), d(11)).cell, Cell::FullStagnation);
        assert_eq!(det.analyze(d(3), d(12)).cell, Cell::FullProgress);
    }

    #[test]
    fn repeated_means_anywhere_in_history_on_each_axis_independently() {
        let mut det = detector();
        det.analyze(d(1), d(10));
        det.analyze(d(2), d(20));
        // Outcome 10 was seen two steps back, not in the previous step.
        assert_eq!(det.analyze(d(3), d(10)).cell, Cell::Stuck);
        // Approach 1 once gave 10; 20 came from approach 2. Both seen: stagnation.
        assert_eq!(det.analyze(d(1), d(20)).cell, Cell::FullStagnation);
    }

    #[test]
    fn history_is_bounded() {
        let history = NonZeroUsize::new(2).unwrap();
        let mut det = StepLoopDetector::with_history(Thresholds::default(), history).unwrap();
        det.analyze(d(1), d(10));
        det.analyze(d(2), d(20));
        assert_eq!(det.analyze(d(1), d(10)).cell, Cell::FullStagnation);
        det.analyze(d(3), d(30));
        det.analyze(d(4), d(40));
        // Step (1, 10) has left the last two steps.
        assert_eq!(det.analyze(d(1), d(10)).cell, Cell::FullProgress);
    }

    #[test]
    fn packed_thresholds_read_back_the_same() {
        let t = Thresholds {
            stagnation_warn: 2,
            stagnation_block: 4,
            stuck_warn: 6,
            stuck_block: 9,
        };
        assert_eq!(Thresholds::unpack(&t.pack(16)), Some((t, 16)));
        let big = u64::from(u32::MAX) + 1;
        let default = Thresholds::default();
        assert_eq!(Thresholds::unpack(&default.pack(big)), Some((default, big)));
    }

    #[test]
    fn packed_thresholds_that_are_not_valid_are_refused() {
        let packed = Thresholds::default().pack(16);
        assert_eq!(Thresholds::unpack(&packed[1..]), None);
        // warn above block: checked again when read.
        let mut bad = packed;
        bad[..4].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(Thresholds::unpack(&bad), None);
    }

    #[test]
    fn digests_alike_in_their_first_bytes_are_told_apart() {
        let mut det = detector();
        let (mut a, mut b) = (d(7), d(7));
        a[31] = 1;
        b[31] = 2;
        assert_eq!(det.analyze(a, a).cell, Cell::FullProgress);
        assert_eq!(det.analyze(b, b).cell, Cell::FullProgress);
        assert_eq!(det.analyze(a, b).cell, Cell::FullStagnation);
    }

    #[test]
    fn digest_seen_twice_stays_until_both_leave_history() {
        let history = NonZeroUsize::new(3).unwrap();
        let mut det = StepLoopDetector::with_history(Thresholds::default(), history).unwrap();
        det.analyze(d(1), d(10));
        det.analyze(d(2), d(10));
        det.analyze(d(3), d(30)); // evicts nothing yet
        det.analyze(d(4), d(40)); // evicts the first 10, the second remains
        assert_eq!(det.analyze(d(5), d(10)).cell, Cell::Stuck);
    }

    #[test]
    fn stagnation_warns_at_3_not_2_and_blocks_at_5() {
        let mut det = detector();
        det.analyze(d(1), d(1)); // progress
        let v = repeat(&mut det, 1, 1, 5);
        let streaks: Vec<_> = v.iter().map(|v| v.stagnation_streak).collect();
        assert_eq!(streaks, [1, 2, 3, 4, 5]);
        assert!(v.iter().all(|v| v.cell == Cell::FullStagnation));
        assert_eq!(v[1].action, Action::Continue);
        assert!(is_warn(&v[2]) && is_warn(&v[3]));
        assert!(is_block(&v[4]));
        assert!(det.is_blocked());
    }

    #[test]
    fn stuck_warns_at_5_and_blocks_at_8() {
        let mut det = detector();
        det.analyze(d(0), d(99));
        let v: Vec<_> = (1..=8).map(|a| det.analyze(d(a), d(99))).collect();
        assert!(v.iter().all(|v| v.cell == Cell::Stuck));
        assert_eq!(v.last().unwrap().stuck_streak, 8);
        assert_eq!(v[3].action, Action::Continue); // streak 4
        assert!(is_warn(&v[4]) && is_warn(&v[5]) && is_warn(&v[6])); // 5, 6, 7
        assert!(is_block(&v[7])); // 8
        assert!(det.is_blocked());
    }

    #[test]
    fn guidance_names_the_streak_and_the_block_point() {
        let mut det = detector();
        det.analyze(d(1), d(1));
        let v = repeat(&mut det, 1, 1, 3);
        let text = v[2].action.guidance().unwrap();
        assert!(
            text.contains('3') && text.contains("blocked at 5"),
            "{text}"
        );
        assert_eq!(v[0].action.guidance(), None);
    }

    #[test]
    fn progress_and_world_changed_reset_both_streaks() {
        let mut det = detector();
        det.analyze(d(1), d(1));
        repeat(&mut det, 1, 1, 4);
        assert_eq!(det.stagnation_streak(), 4);
        let v = det.analyze(d(1), d(2));
        assert_eq!(v.cell, Cell::WorldChanged);
        assert_eq!((v.stagnation_streak, v.stuck_streak), (0, 0));

        det.analyze(d(3), d(2));
        det.analyze(d(4), d(2));
        assert_eq!(det.stuck_streak(), 2);
        let v = det.analyze(d(5), d(5));
        assert_eq!(v.cell, Cell::FullProgress);
        assert_eq!((v.stagnation_streak, v.stuck_streak), (0, 0));
    }

    #[test]
    fn stuck_and_stagnation_reset_each_other() {
        let mut det = detector();
        det.analyze(d(1), d(1));
        repeat(&mut det, 1, 1, 2);
        let v = det.analyze(d(2), d(1));
        assert_eq!(
            (v.cell, v.stagnation_streak, v.stuck_streak),
            (Cell::Stuck, 0, 1)
        );
        let v = det.analyze(d(2), d(1));
        assert_eq!(
            (v.cell, v.stagnation_streak, v.stuck_streak),
            (Cell::FullStagnation, 1, 0)
        );
    }

    #[test]
    fn interrupted_streak_starts_over() {
        let mut det = detector();
        det.analyze(d(1), d(1));
        repeat(&mut det, 1, 1, 2);
        det.analyze(d(7), d(7));
        let v = repeat(&mut det, 1, 1, 3);
        assert_eq!(v[1].action, Action::Continue);
        assert!(is_warn(&v[2]));
    }

    #[test]
    fn block_persists_without_changing_streaks_until_reset() {
        let mut det = detector();
        det.analyze(d(1), d(1));
        let blocking = repeat(&mut det, 1, 1, 5).pop().unwrap();
        assert!(is_block(&blocking));

        // Fresh progress is still blocked, and the streaks are frozen.
        let v = det.analyze(d(50), d(50));
        assert_eq!(v.cell, Cell::FullProgress);
        assert_eq!(v.action, blocking.action);
        assert_eq!((v.stagnation_streak, v.stuck_streak), (5, 0));
        // Nothing was recorded while blocked.
        assert_eq!(det.analyze(d(50), d(50)).cell, Cell::FullProgress);
        assert!(det.is_blocked());

        det.reset();
        assert!(!det.is_blocked());
        assert_eq!((det.stagnation_streak(), det.stuck_streak()), (0, 0));
        let v = det.analyze(d(1), d(1));
        assert_eq!((v.cell, v.action), (Cell::FullProgress, Action::Continue));
    }

    #[test]
    fn custom_thresholds() {
        let t = Thresholds {
            stagnation_warn: 1,
            stagnation_block: 2,
            stuck_warn: 2,
            stuck_block: 2,
        };
        let mut det = StepLoopDetector::new(t).unwrap();
        assert_eq!(det.thresholds(), t);
        det.analyze(d(1), d(1));
        let v = repeat(&mut det, 1, 1, 2);
        assert!(is_warn(&v[0]) && is_block(&v[1]));

        let mut det = StepLoopDetector::new(t).unwrap();
        det.analyze(d(0), d(9));
        assert_eq!(det.analyze(d(1), d(9)).action, Action::Continue);
        // warn == block: the block comes without a warning first.
        assert!(is_block(&det.analyze(d(2), d(9))));
    }

    #[test]
    fn invalid_thresholds_are_refused() {
        let ok = Thresholds::default();
        let bad = [
            Thresholds {
                stagnation_warn: 0,
                ..ok
            },
            Thresholds {
                stuck_warn: 0,
                ..ok
            },
            Thresholds {
                stagnation_block: 2,
                ..ok
            },
            Thresholds {
                stuck_block: 4,
                ..ok
            },
        ];
        for t in bad {
            assert_eq!(t.validate(), Err(Error::InvalidStepThresholds));
            assert_eq!(
                StepLoopDetector::new(t).unwrap_err(),
                Error::InvalidStepThresholds
            );
        }
        assert_eq!(ok.validate(), Ok(()));
    }
}

/// The history's scan against the layout it replaced (each digest whole, in one ring):
/// the same answer for every history length, sequence and probe.
#[cfg(test)]
mod split_ring_tests {
    use super::*;
    use proptest::prelude::*;

    /// The rings before their digests were split into heads and tails, one an axis:
    /// the oracle.
    struct Whole {
        order: VecDeque<Digest>,
        capacity: usize,
    }

    impl Whole {
        fn contains(&self, digest: &Digest) -> bool {
            self.order.iter().any(|d| d == digest)
        }

        fn push(&mut self, digest: Digest) {
            if self.order.len() == self.capacity {
                self.order.pop_front();
            }
            self.order.push_back(digest);
        }
    }

    /// Digests from a small pool, so that repeats are common, several of them alike
    /// in their first 8 bytes and different after (the head matches, the tail not).
    fn digest() -> impl Strategy<Value = Digest> {
        (0u8..4, 0u8..3, 0usize..32).prop_map(|(head, tail, at)| {
            let mut d = [head; 32];
            if tail > 0 {
                d[8 + at % 24] = tail;
            }
            d
        })
    }

    proptest! {
        #[test]
        fn recent_answers_as_the_whole_digest_rings_did(
            capacity in 1usize..20,
            ops in proptest::collection::vec((any::<bool>(), digest(), digest()), 0..80),
        ) {
            let mut recent = Recent::new(capacity);
            let whole = || Whole { order: VecDeque::new(), capacity };
            let (mut approaches, mut outcomes) = (whole(), whole());
            for (push, a, o) in ops {
                prop_assert_eq!(
                    recent.seen(&a, &o),
                    (approaches.contains(&a), outcomes.contains(&o))
                );
                // The same digest on the other axis is not seen on this one.
                prop_assert_eq!(
                    recent.seen(&o, &a),
                    (approaches.contains(&o), outcomes.contains(&a))
                );
                if push {
                    recent.push(&a, &o);
                    approaches.push(a);
                    outcomes.push(o);
                }
            }
        }
    }
}
