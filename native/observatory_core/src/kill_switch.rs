//! The kill switch's loop-detection score (seed 003, "Loop Detection Scoring" and
//! "Kill Switch State Management").
//!
//! Each agent has a FIFO window of its last N requests. A request enters as its prompt
//! fingerprint and tool-call signatures; the fingerprint of the model's answer is
//! attached to it when the response arrives. Each request is scored against the entries
//! before it:
//!
//! ```text
//! score = similar_prompts × 1.0 + similar_responses × 2.0 + repeated_tool_calls × 1.5
//! ```
//!
//! * `similar_prompts` — earlier entries whose prompt fingerprint is fewer than
//!   [`SIMILAR_BELOW`] bits from the current request's;
//! * `similar_responses` — earlier responses fewer than [`SIMILAR_BELOW`] bits from the
//!   latest response in the window. At request time the current entry has no response
//!   yet, so this is how many times the model had already given the answer it gave
//!   last: a model answering the same thing over and over scores even before it
//!   repeats again. An answer that called tools is not compared by its text: when a
//!   request answers tool calls, the previous entry's response is dropped — the calls
//!   were the answer, and they are this request's signatures. Otherwise an agent on
//!   Anthropic's API, whose tool turns say a sentence beside each call, would score on
//!   its wording where the same agent on OpenAI's, whose tool turns have no text,
//!   would not;
//! * `repeated_tool_calls` — earlier entries sharing at least one tool-call signature
//!   with the current request (an entry counts once, however many calls it shares).
//!
//! A window of N therefore scores at most 4.5 × (N − 1): every earlier entry counts once
//! per signal. The agent is stopped when the score [`exceeds`] the threshold.

use std::collections::VecDeque;

use crate::simhash::hamming;
use crate::Error;

/// Fingerprints closer than this many bits are "similar" (the spec's `< 3`).
pub const SIMILAR_BELOW: u32 = 3;

const PROMPT_WEIGHT: f64 = 1.0;
const RESPONSE_WEIGHT: f64 = 2.0;
const TOOL_CALL_WEIGHT: f64 = 1.5;

/// The `window_size`s a user may configure: a window of one has nothing to compare a
/// request with, and every request is compared with the whole window, so its cost and
/// memory (48 bytes an entry, plus its signatures) stay bounded.
pub const WINDOW_SIZES: std::ops::RangeInclusive<usize> = 2..=1000;

/// An agent's kill switch configuration ("Kill Switch Configuration").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub window_size: usize,
    pub threshold: f64,
}

impl Settings {
    /// Refuses a window outside [`WINDOW_SIZES`] and a threshold that is not a finite
    /// number above 0 (a threshold of 0 would stop an agent on its first repetition).
    pub fn new(window_size: usize, threshold: f64) -> Result<Self, Error> {
        if !WINDOW_SIZES.contains(&window_size) {
            return Err(Error::InvalidKillSwitchWindow);
        }
        if !(threshold.is_finite() && threshold > 0.0) {
            return Err(Error::InvalidKillSwitchThreshold);
        }
        Ok(Self {
            window_size,
            threshold,
        })
    }
}

/// The spec deactivates when the score *exceeds* the threshold: reaching it is not
/// enough.
pub fn exceeds(score: f64, threshold: f64) -> bool {
    score > threshold
}

/// One request in the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `None` when the request had no user-side text to fingerprint (see
    /// [`crate::conversation::prompt_text`]): such a request is similar to no other.
    pub prompt_hash: Option<u64>,
    /// Set when the response arrives; `None` until then, or when it had no text.
    pub response_hash: Option<u64>,
    /// Sorted and deduplicated.
    pub tool_signatures: Vec<u64>,
}

/// The three counts behind a score, for the kill switch event's details.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    pub similar_prompts: usize,
    pub similar_responses: usize,
    pub repeated_tool_calls: usize,
}

impl Signals {
    pub fn score(&self) -> f64 {
        self.similar_prompts as f64 * PROMPT_WEIGHT
            + self.similar_responses as f64 * RESPONSE_WEIGHT
            + self.repeated_tool_calls as f64 * TOOL_CALL_WEIGHT
    }
}

/// What [`AgentWindow::check`] found, with the counts for the event's details.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    pub score: f64,
    pub signals: Signals,
    pub exceeded: bool,
    pub window_len: usize,
}

/// One agent's last `capacity` requests, oldest first.
#[derive(Debug, Clone)]
pub struct AgentWindow {
    entries: VecDeque<Entry>,
    capacity: usize,
}

impl AgentWindow {
    /// A capacity of 0 is treated as 1: the current request is always kept.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            entries: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds a request ("Sliding window storage"), evicting the oldest entries beyond
    /// the capacity ("Window overflow"), and returns its score. The signatures are
    /// sorted and deduplicated here, whatever order they come in.
    pub fn observe_request(&mut self, prompt_hash: u64, tool_signatures: Vec<u64>) -> f64 {
        self.observe(Some(prompt_hash), tool_signatures)
    }

    /// Like [`Self::observe_request`], for a request that may have no prompt
    /// fingerprint.
    pub fn observe(&mut self, prompt_hash: Option<u64>, mut tool_signatures: Vec<u64>) -> f64 {
        tool_signatures.sort_unstable();
        tool_signatures.dedup();
        if !tool_signatures.is_empty() {
            // This request answers tool calls: the previous answer was those calls. Its
            // text, if any, was commentary beside them ("Let me look at the next
            // file."); the calls are what it said, and they are compared as this
            // request's signatures.
            if let Some(previous) = self.entries.back_mut() {
                previous.response_hash = None;
            }
        }
        self.entries.push_back(Entry {
            prompt_hash,
            response_hash: None,
            tool_signatures,
        });
        self.trim();
        self.score()
    }

    /// Attaches the response's fingerprint to the latest request ("Response hash
    /// capture"), replacing any earlier one. Ignored when the window is empty: there is
    /// no request to attach it to.
    pub fn observe_response(&mut self, response_hash: u64) {
        if let Some(latest) = self.entries.back_mut() {
            latest.response_hash = Some(response_hash);
        }
    }

    pub fn score(&self) -> f64 {
        self.signals().score()
    }

    /// The counts for the latest request, as defined in the module docs. All zero for
    /// an empty window.
    pub fn signals(&self) -> Signals {
        let Some(current) = self.entries.back() else {
            return Signals::default();
        };
        let earlier = || self.entries.iter().rev().skip(1);
        let similar = |a: u64, b: u64| hamming(a, b) < SIMILAR_BELOW;
        let similar_prompts = match current.prompt_hash {
            Some(prompt) => earlier()
                .filter(|e| e.prompt_hash.is_some_and(|p| similar(p, prompt)))
                .count(),
            None => 0,
        };
        let repeated_tool_calls = earlier()
            .filter(|e| shares_any(&e.tool_signatures, &current.tool_signatures))
            .count();
        let mut responses = self.entries.iter().rev().filter_map(|e| e.response_hash);
        let similar_responses = match responses.next() {
            Some(latest) => responses.filter(|&r| similar(r, latest)).count(),
            None => 0,
        };
        Signals {
            similar_prompts,
            similar_responses,
            repeated_tool_calls,
        }
    }

    /// Forgets every request ("Clear window on activate").
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Changes the window size; a smaller one drops the oldest entries at once.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        self.trim();
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.entries.iter()
    }

    /// One request under `settings`, as the proxy sees it: resizes the window to
    /// `settings.window_size` if it changed, adds the request and tells whether its
    /// score exceeds the threshold.
    pub fn check(
        &mut self,
        settings: &Settings,
        prompt_hash: Option<u64>,
        tool_signatures: Vec<u64>,
    ) -> Verdict {
        if self.capacity != settings.window_size {
            self.set_capacity(settings.window_size);
        }
        let score = self.observe(prompt_hash, tool_signatures);
        Verdict {
            score,
            signals: self.signals(),
            exceeded: exceeds(score, settings.threshold),
            window_len: self.len(),
        }
    }

    fn trim(&mut self) {
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
        }
    }
}

/// Whether two sorted signature lists have an element in common.
fn shares_any(a: &[u64], b: &[u64]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{PromptSource, RequestFingerprint};
    use crate::messages::request_fingerprint;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const P: u64 = 0x0123_4567_89ab_cdef;
    const R: u64 = 0xfedc_ba98_7654_3210;

    fn flip(hash: u64, bits: &[u32]) -> u64 {
        bits.iter().fold(hash, |h, &b| h ^ 1 << b)
    }

    #[test]
    fn score_calculation() {
        let mut w = AgentWindow::new(10);
        w.observe_request(P, vec![10]);
        w.observe_response(R);
        w.observe_request(flip(P, &[0]), vec![]);
        w.observe_response(flip(R, &[6]));
        w.observe_request(!P, vec![]);
        w.observe_response(flip(R, &[5]));
        // Answers tool calls: the answer before it was those calls (see the next test).
        let score = w.observe_request(flip(P, &[0, 1]), vec![30, 10]);
        let expected = Signals {
            similar_prompts: 2,
            similar_responses: 1,
            repeated_tool_calls: 1,
        };
        assert_eq!(w.signals(), expected);
        assert_eq!(score, 2.0 * 1.0 + 1.0 * 2.0 + 1.0 * 1.5);
        assert_eq!(w.score(), score);
    }

    #[test]
    fn a_tool_call_answer_is_not_compared_by_its_text() {
        let mut w = AgentWindow::new(10);
        // A model that says the same sentence beside a different call each turn.
        for k in 0..5u64 {
            w.observe_request(P.rotate_left(8 * k as u32), vec![k]);
            w.observe_response(R);
        }
        assert_eq!(w.signals().similar_responses, 0);
        assert_eq!(
            w.entries().filter(|e| e.response_hash.is_some()).count(),
            1,
            "only the latest answer, whose calls no request has answered yet, keeps its text"
        );
        // The agent moves on with a prompt of its own: that answer's calls were not
        // answered, so its text stays, and a text answer like it counts.
        w.observe_request(!P, vec![]);
        w.observe_response(R);
        w.observe_request(!P, vec![]);
        assert_eq!(w.signals().similar_responses, 1);
    }

    #[test]
    fn prompt_similarity_check() {
        let mut w = AgentWindow::new(10);
        for bits in [&[][..], &[1], &[1, 2], &[1, 2, 3], &[1, 2, 3, 4]] {
            w.observe_request(flip(P, bits), vec![]);
        }
        assert_eq!(
            w.observe_request(P, vec![]),
            3.0,
            "distances 0, 1, 2 count; 3, 4 do not"
        );
        assert_eq!(w.signals().similar_prompts, 3);
    }

    #[test]
    fn response_similarity_check() {
        let mut w = AgentWindow::new(10);
        for (k, bits) in [&[][..], &[1], &[1, 2], &[1, 2, 3]].into_iter().enumerate() {
            w.observe_request(P.rotate_left(8 * k as u32), vec![]);
            w.observe_response(flip(R, bits));
        }
        // The latest response is R^{1,2,3}: R^{1,2} and R^{1} are within 2 bits, R is 3 away.
        w.observe_request(!P, vec![]);
        assert_eq!(w.signals().similar_responses, 2);
        assert_eq!(w.score(), 2.0 * 2.0);
        // A new, different answer becomes the latest one, and nothing is like it.
        w.observe_response(!R);
        assert_eq!(w.signals().similar_responses, 0);
    }

    #[test]
    fn tool_call_repetition_check() {
        let mut w = AgentWindow::new(10);
        // Prompts far apart, so that only the tool calls score.
        let prompt = |k: u32| P.rotate_left(8 * k);
        w.observe_request(prompt(1), vec![7, 8]);
        w.observe_request(prompt(2), vec![9]);
        w.observe_request(prompt(3), vec![]);
        let score = w.observe_request(prompt(4), vec![8, 7]);
        assert_eq!(w.signals().repeated_tool_calls, 1, "an entry counts once");
        assert_eq!(score, 1.5);
        assert_eq!(
            w.observe_request(prompt(5), vec![]),
            0.0,
            "no calls, no repetition"
        );
    }

    #[test]
    fn sliding_window_storage() {
        let mut w = AgentWindow::new(5);
        assert_eq!(w.observe_request(P, vec![3, 1, 3]), 0.0);
        let stored: Vec<_> = w.entries().cloned().collect();
        assert_eq!(
            stored,
            vec![Entry {
                prompt_hash: Some(P),
                response_hash: None,
                tool_signatures: vec![1, 3],
            }]
        );
    }

    #[test]
    fn window_overflow() {
        let mut w = AgentWindow::new(3);
        for prompt in 1..=5u64 {
            w.observe_request(prompt << 32, vec![]);
        }
        let prompts: Vec<u64> = w.entries().map(|e| e.prompt_hash.unwrap() >> 32).collect();
        assert_eq!(prompts, vec![3, 4, 5], "the oldest leave first");
    }

    #[test]
    fn response_hash_capture() {
        let mut w = AgentWindow::new(3);
        w.observe_response(R);
        assert!(w.is_empty(), "no request to attach to");
        w.observe_request(P, vec![]);
        w.observe_request(!P, vec![]);
        w.observe_response(R);
        let responses: Vec<_> = w.entries().map(|e| e.response_hash).collect();
        assert_eq!(responses, vec![None, Some(R)]);
    }

    #[test]
    fn clear_window_on_activate() {
        let mut w = AgentWindow::new(5);
        for _ in 0..5 {
            w.observe_request(P, vec![1]);
            w.observe_response(R);
        }
        assert!(w.score() > 0.0);
        w.clear();
        assert!(w.is_empty());
        assert_eq!(w.score(), 0.0);
        assert_eq!(w.observe_request(P, vec![1]), 0.0, "the loop starts over");
    }

    #[test]
    fn configure_window_size() {
        // A window of N compares each request with the N - 1 before it.
        let mut w = AgentWindow::new(3);
        let scores: Vec<f64> = (0..6).map(|_| w.observe_request(P, vec![1])).collect();
        assert_eq!(scores, vec![0.0, 2.5, 5.0, 5.0, 5.0, 5.0]);
        w.set_capacity(2);
        assert_eq!(
            (w.len(), w.score()),
            (2, 2.5),
            "a smaller window trims at once"
        );
        w.set_capacity(0);
        assert_eq!(w.capacity(), 1);
    }

    #[test]
    fn configure_threshold() {
        assert!(
            !exceeds(5.0, 5.0),
            "reaching the threshold is not exceeding it"
        );
        assert!(exceeds(5.5, 5.0));
        assert_eq!(
            Settings::new(10, 7.5),
            Ok(Settings {
                window_size: 10,
                threshold: 7.5
            })
        );
        assert!(Settings::new(2, f64::MIN_POSITIVE).is_ok());
        assert!(Settings::new(1000, 1e9).is_ok());
        for window in [0, 1, 1001] {
            assert_eq!(
                Settings::new(window, 5.0),
                Err(Error::InvalidKillSwitchWindow)
            );
        }
        for threshold in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(
                Settings::new(10, threshold),
                Err(Error::InvalidKillSwitchThreshold)
            );
        }
    }

    #[test]
    fn a_request_without_prompt_text_is_similar_to_no_prompt() {
        let mut w = AgentWindow::new(5);
        w.observe(None, vec![]);
        w.observe(Some(0), vec![]);
        assert_eq!(w.observe(None, vec![]), 0.0, "None is not like None");
        assert_eq!(w.observe(Some(0), vec![]), 1.0, "nor like 0");
        assert_eq!(w.entries().next().unwrap().prompt_hash, None);
    }

    #[test]
    fn check_resizes_scores_and_decides() {
        let mut w = AgentWindow::new(10);
        let settings = Settings::new(3, 4.0).unwrap();
        let verdicts: Vec<Verdict> = (0..4)
            .map(|_| {
                let verdict = w.check(&settings, Some(P), vec![1]);
                w.observe_response(R);
                verdict
            })
            .collect();
        assert_eq!(w.capacity(), 3, "resized to the settings");
        // Scores 0, 2.5, 2 × 2.5 = 5 (the window holds 3 from then on; each answer
        // was the tool call the next request answers, so no text is compared).
        let scores: Vec<f64> = verdicts.iter().map(|v| v.score).collect();
        assert_eq!(scores, vec![0.0, 2.5, 5.0, 5.0]);
        let exceeded: Vec<bool> = verdicts.iter().map(|v| v.exceeded).collect();
        assert_eq!(exceeded, vec![false, false, true, true]);
        assert_eq!(verdicts[2].window_len, 3);
        assert_eq!(
            verdicts[2].signals,
            Signals {
                similar_prompts: 2,
                similar_responses: 0,
                repeated_tool_calls: 2
            }
        );
        let at_threshold = Settings::new(3, 5.0).unwrap();
        assert!(
            !w.check(&at_threshold, Some(P), vec![1]).exceeded,
            "a score equal to the threshold does not exceed it"
        );
    }

    /// A tool-calling agent's requests as an SDK sends them: the task, then every call
    /// and its result, re-sent on each turn.
    fn tool_conversation(turns: &[(String, String)]) -> Vec<Value> {
        let mut messages =
            vec![json!({"role": "user", "content": "Find where the handlers are registered."})];
        let mut requests = vec![json!({"messages": messages.clone()})];
        for (k, (arguments, result)) in turns.iter().enumerate() {
            let id = format!("call_{k}");
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "grep", "arguments": arguments}}
            ]}));
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
            requests.push(json!({"messages": messages.clone()}));
        }
        requests
    }

    /// The first request (1-based) whose score exceeds the threshold, and the highest
    /// score, for requests read with `source`; the model answers with tool calls only.
    fn replay(
        requests: &[Value],
        settings: &Settings,
        source: PromptSource,
    ) -> (Option<usize>, f64) {
        let mut window = AgentWindow::new(settings.window_size);
        let mut tripped = None;
        let mut highest: f64 = 0.0;
        for (k, body) in requests.iter().enumerate() {
            let RequestFingerprint {
                prompt,
                tool_signatures,
                ..
            } = request_fingerprint(body, source).unwrap();
            let verdict = window.check(settings, prompt, tool_signatures);
            highest = highest.max(verdict.score);
            if verdict.exceeded && tripped.is_none() {
                tripped = Some(k + 1);
            }
        }
        (tripped, highest)
    }

    /// The whole path at the proxy's defaults (window 5, threshold 5.5: `config.exs`):
    /// request bodies → prompt and signatures → score → verdict.
    #[test]
    fn a_looping_tool_agent_trips_the_switch_and_a_healthy_one_does_not() {
        let defaults = Settings::new(5, 5.5).unwrap();
        // A healthy agent: a different search each turn, each with its own answer.
        let healthy: Vec<(String, String)> = (1..=30)
            .map(|k| {
                (
                    format!(r#"{{"pattern": "def handler_{k}", "path": "src"}}"#),
                    format!(
                        "src/handlers/h{k}.py:{}: def handler_{k}(request, context_{k}):",
                        3 * k
                    ),
                )
            })
            .collect();
        let requests = tool_conversation(&healthy);
        let (tripped, highest) = replay(&requests, &defaults, PromptSource::NewestInput);
        assert_eq!(tripped, None, "highest score {highest}");
        // Its results differ only in numbers, so they are similar prompts (4 of 4); the
        // calls are all different. One re-read would add 1.5: 5.5, not above.
        assert_eq!(highest, 4.0);

        // A looping one: the same search, the same answer.
        let looping: Vec<(String, String)> = (1..=30)
            .map(|_| {
                (
                    r#"{"pattern": "def handler_8", "path": "src"}"#.to_string(),
                    "grep: src: No such file or directory".to_string(),
                )
            })
            .collect();
        // The same healthy agent re-reading one of its files: one repeated call.
        let mut reread = healthy.clone();
        reread[11] = healthy[9].clone();
        let (tripped, highest) = replay(
            &tool_conversation(&reread),
            &defaults,
            PromptSource::NewestInput,
        );
        assert_eq!((tripped, highest), (None, 5.5));
        // A third read of the same file within the window (turns 10, 12 and 13), its
        // answers alike, stops it: 4 + 2 × 1.5 = 7.
        reread[12] = healthy[9].clone();
        let (tripped, _) = replay(
            &tool_conversation(&reread),
            &defaults,
            PromptSource::NewestInput,
        );
        assert_eq!(tripped, Some(14));

        let requests = tool_conversation(&looping);
        // Request k + 1 answers the k-th call: (k - 1) earlier entries × (1.0 + 1.5)
        // exceed 5.5 at k = 4.
        assert_eq!(
            replay(&requests, &defaults, PromptSource::NewestInput).0,
            Some(5)
        );

        // The seed's letter reads the task on every turn: every request is a similar
        // prompt, and the healthy agent sits at 4 from its fifth request on.
        let (tripped, highest) = replay(
            &tool_conversation(&healthy),
            &defaults,
            PromptSource::LastUserMessage,
        );
        assert_eq!((tripped, highest), (None, 4.0));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Request(u64, Vec<u64>),
        Response(u64),
        Resize(usize),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u64..4, prop::collection::vec(0u64..4, 0..3)).prop_map(|(p, s)| Op::Request(p, s)),
            3 => (0u64..4).prop_map(Op::Response),
            1 => (0usize..8).prop_map(Op::Resize),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        #[test]
        fn window_never_exceeds_capacity(capacity in 0usize..8, ops in prop::collection::vec(op(), 0..60)) {
            let mut w = AgentWindow::new(capacity);
            for op in ops {
                match op {
                    Op::Request(p, s) => { w.observe_request(p, s); }
                    Op::Response(r) => w.observe_response(r),
                    Op::Resize(c) => w.set_capacity(c),
                    Op::Clear => w.clear(),
                }
                prop_assert!(w.len() <= w.capacity());
                prop_assert!(w.score() <= 4.5 * w.len().saturating_sub(1) as f64);
            }
        }

        #[test]
        fn repeating_a_request_never_lowers_the_score(
            capacity in 2usize..20,
            repeats in 1usize..40,
            prompt in any::<u64>(),
            signatures in prop::collection::vec(any::<u64>(), 0..3),
            response in prop::option::of(any::<u64>()),
        ) {
            let mut w = AgentWindow::new(capacity);
            let mut last = 0.0;
            for k in 1..=repeats {
                let score = w.observe_request(prompt, signatures.clone());
                prop_assert!(score >= last, "score fell from {} to {} at request {}", last, score, k);
                if k >= capacity {
                    prop_assert_eq!(score, last.max(score), "constant once full");
                }
                last = score;
                if let Some(response) = response {
                    w.observe_response(response);
                }
            }
        }
    }
}
