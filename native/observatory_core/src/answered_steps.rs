//! The steps the gateway has answered recently, so that a step delivered again is
//! answered with its first answer and never counted twice (idempotent ingest).
//!
//! A step is `(session, step id)`. Each carries the fingerprint of its body, so a
//! retry (same fingerprint) is told apart from another step sent under a used id
//! (another fingerprint). Between its claim and its answer a step is *pending*: the
//! claimant is scoring it, and a retry arriving meanwhile is told so.
//!
//! Memory is bounded three ways: per session (`max_steps_per_session`, the session's
//! oldest go first), in all (`max_steps`, split over the shards, at least one step
//! each; the shard's oldest go first) and in time (a step older than `window_ms` is never answered from
//! memory, and [`AnsweredSteps::sweep`] frees it). Each shard keeps its steps in a slab
//! threaded by two doubly linked lists — the shard's age order and each session's — so
//! every claim, answer and eviction is O(1): no scan, no compaction, however the caps
//! are set. A session's steps live in one shard (the shard is picked by the session's
//! hash), so its own order and count need no cross-shard work.
//!
//! The pending claimant is generic (`P`): the NIF stores the caller's pid and decides
//! through a callback whether it is still alive. Keys come from clients: they are
//! hashed with keyed SipHash.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;
use parking_lot::Mutex;

/// A step body's identity (a truncated SHA-256, computed by the caller).
pub type Fingerprint = [u8; 16];

/// The caps, read by the caller on every claim (they may change at run time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub window_ms: i64,
    pub max_steps_per_session: usize,
    pub max_steps: usize,
}

/// What a claim finds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Not remembered: the caller scores it, then [`AnsweredSteps::complete`]s this claim.
    New(u64),
    /// Answered before with the same body: the first answer.
    Replay(Vec<u8>),
    /// Remembered with another body.
    Conflict,
    /// Its first delivery is still being scored.
    InProgress,
}

/// What is held, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub steps: usize,
    pub sessions: usize,
    /// The slabs' capacity plus the ids and answers they point to, in bytes.
    pub bytes: usize,
}

const NIL: u32 = u32::MAX;

/// At most this many steps go in one claim (per cap): a cap lowered at run time is
/// reached over the next claims, never in one long call.
const MAX_EVICTIONS_PER_CLAIM: usize = 1024;

enum State<P> {
    Pending(P),
    Answered(Box<[u8]>),
}

struct Node<P> {
    session: Arc<str>,
    session_hash: u64,
    step: Box<str>,
    hash: u64,
    fingerprint: Fingerprint,
    seq: u64,
    at_ms: i64,
    state: State<P>,
    /// The shard's age order.
    older: u32,
    newer: u32,
    /// The session's order.
    session_older: u32,
    session_newer: u32,
}

struct SessionList {
    name: Arc<str>,
    hash: u64,
    oldest: u32,
    newest: u32,
    len: usize,
}

struct Shard<P> {
    slab: Vec<Option<Node<P>>>,
    free: Vec<u32>,
    /// Slab indices, found by the step's hash.
    index: HashTable<u32>,
    sessions: HashTable<SessionList>,
    oldest: u32,
    newest: u32,
    len: usize,
    /// Bytes of ids and answers held.
    heap_bytes: usize,
    next_seq: u64,
}

/// See the module documentation.
pub struct AnsweredSteps<P> {
    shards: Box<[Mutex<Shard<P>>]>,
    hasher: RandomState,
}

impl<P> AnsweredSteps<P> {
    pub fn new(shards: usize) -> Self {
        Self {
            shards: (0..shards.max(1))
                .map(|_| Mutex::new(Shard::new()))
                .collect(),
            hasher: RandomState::new(),
        }
    }

    /// Claims `(session, step)` for scoring, or says why it is not scored again. A
    /// remembered step older than the window, or whose pending claimant is
    /// `abandoned`, is forgotten and claimed afresh.
    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &self,
        session: &str,
        step: &str,
        fingerprint: Fingerprint,
        claimant: P,
        now_ms: i64,
        limits: Limits,
        abandoned: impl Fn(&P) -> bool,
    ) -> Claim {
        let session_hash = self.hasher.hash_one(session);
        let hash = self.hasher.hash_one((session, step));
        let index = self.shard_index(session_hash);
        let mut shard = self.shards[index].lock();
        if let Some(at) = shard.find(hash, session, step) {
            let node = shard.node(at);
            let stale = node.at_ms < now_ms.saturating_sub(limits.window_ms)
                || matches!(&node.state, State::Pending(p) if abandoned(p));
            if !stale {
                return match &node.state {
                    _ if node.fingerprint != fingerprint => Claim::Conflict,
                    State::Answered(answer) => Claim::Replay(answer.to_vec()),
                    State::Pending(_) => Claim::InProgress,
                };
            }
            shard.remove(at);
        }
        // The shard's share of `max_steps`: the shares add up to it exactly (but each
        // shard holds at least the step just claimed).
        let n = self.shards.len();
        let max_in_shard =
            (limits.max_steps / n + usize::from(index < limits.max_steps % n)).max(1);
        let seq = shard.insert(
            session,
            session_hash,
            step,
            hash,
            fingerprint,
            claimant,
            now_ms,
        );
        shard.trim_session(session, session_hash, limits.max_steps_per_session.max(1));
        for _ in 0..MAX_EVICTIONS_PER_CLAIM {
            if shard.len <= max_in_shard {
                break;
            }
            let oldest = shard.oldest;
            shard.remove(oldest);
        }
        Claim::New(seq)
    }

    /// Stores the answer of claim `seq`; false if that claim is no longer held.
    pub fn complete(&self, session: &str, step: &str, seq: u64, answer: &[u8]) -> bool {
        self.with_claim(session, step, seq, |shard, at| {
            let node = shard.node_mut(at);
            let replaced = match &node.state {
                State::Answered(old) => old.len(),
                State::Pending(_) => 0,
            };
            node.state = State::Answered(answer.into());
            shard.heap_bytes = shard.heap_bytes + answer.len() - replaced;
        })
    }

    /// Forgets claim `seq` (its step was not scored); false if it is no longer held.
    pub fn release(&self, session: &str, step: &str, seq: u64) -> bool {
        self.with_claim(session, step, seq, |shard, at| shard.remove(at))
    }

    /// Forgets every step older than `window_ms`; returns how many.
    pub fn sweep(&self, now_ms: i64, window_ms: i64) -> usize {
        let cutoff = now_ms.saturating_sub(window_ms);
        let mut swept = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            while shard.oldest != NIL && shard.node(shard.oldest).at_ms < cutoff {
                let oldest = shard.oldest;
                shard.remove(oldest);
                swept += 1;
            }
        }
        swept
    }

    /// Steps remembered for `session`.
    pub fn session_len(&self, session: &str) -> usize {
        let session_hash = self.hasher.hash_one(session);
        let shard = self.shard(session_hash).lock();
        shard
            .sessions
            .find(session_hash, |s| &*s.name == session)
            .map_or(0, |s| s.len)
    }

    pub fn stats(&self) -> Stats {
        self.shards.iter().fold(Stats::default(), |acc, shard| {
            let shard = shard.lock();
            Stats {
                steps: acc.steps + shard.len,
                sessions: acc.sessions + shard.sessions.len(),
                bytes: acc.bytes
                    + shard.heap_bytes
                    + shard.slab.capacity() * std::mem::size_of::<Option<Node<P>>>()
                    + shard.index.capacity() * std::mem::size_of::<u32>()
                    + shard.sessions.capacity() * std::mem::size_of::<SessionList>(),
            }
        })
    }

    fn with_claim(
        &self,
        session: &str,
        step: &str,
        seq: u64,
        f: impl FnOnce(&mut Shard<P>, u32),
    ) -> bool {
        let hash = self.hasher.hash_one((session, step));
        let mut shard = self.shard(self.hasher.hash_one(session)).lock();
        match shard.find(hash, session, step) {
            Some(at) if shard.node(at).seq == seq => {
                f(&mut shard, at);
                true
            }
            _ => false,
        }
    }

    fn shard(&self, session_hash: u64) -> &Mutex<Shard<P>> {
        &self.shards[self.shard_index(session_hash)]
    }

    fn shard_index(&self, session_hash: u64) -> usize {
        (session_hash >> 32) as usize % self.shards.len()
    }
}

impl<P> Shard<P> {
    fn new() -> Self {
        Self {
            slab: Vec::new(),
            free: Vec::new(),
            index: HashTable::new(),
            sessions: HashTable::new(),
            oldest: NIL,
            newest: NIL,
            len: 0,
            heap_bytes: 0,
            next_seq: 0,
        }
    }

    fn node(&self, at: u32) -> &Node<P> {
        self.slab[at as usize]
            .as_ref()
            .expect("linked slots are occupied")
    }

    fn node_mut(&mut self, at: u32) -> &mut Node<P> {
        self.slab[at as usize]
            .as_mut()
            .expect("linked slots are occupied")
    }

    fn find(&self, hash: u64, session: &str, step: &str) -> Option<u32> {
        self.index
            .find(hash, |&at| {
                let node = self.node(at);
                &*node.session == session && &*node.step == step
            })
            .copied()
    }

    /// Adds a step as the newest of the shard and of its session; returns its seq.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        session: &str,
        session_hash: u64,
        step: &str,
        hash: u64,
        fingerprint: Fingerprint,
        claimant: P,
        now_ms: i64,
    ) -> u64 {
        self.next_seq += 1;
        let seq = self.next_seq;
        let (name, session_newest) = self.session_tail(session, session_hash);
        let node = Node {
            session: name,
            session_hash,
            step: step.into(),
            hash,
            fingerprint,
            seq,
            at_ms: now_ms,
            state: State::Pending(claimant),
            older: self.newest,
            newer: NIL,
            session_older: session_newest,
            session_newer: NIL,
        };
        self.heap_bytes += step.len();
        let at = match self.free.pop() {
            Some(at) => {
                self.slab[at as usize] = Some(node);
                at
            }
            None => {
                self.slab.push(Some(node));
                u32::try_from(self.slab.len() - 1).expect("fewer than 2^32 steps per shard")
            }
        };
        match self.newest {
            NIL => self.oldest = at,
            newest => self.node_mut(newest).newer = at,
        }
        self.newest = at;
        if session_newest != NIL {
            self.node_mut(session_newest).session_newer = at;
        }
        let list = self
            .sessions
            .find_mut(session_hash, |s| &*s.name == session)
            .expect("session_tail made it");
        if list.oldest == NIL {
            list.oldest = at;
        }
        list.newest = at;
        list.len += 1;
        let slab = &self.slab;
        self.index.insert_unique(hash, at, |&i| {
            slab[i as usize]
                .as_ref()
                .expect("indexed slots are occupied")
                .hash
        });
        self.len += 1;
        seq
    }

    /// The session's shared name and its newest step, making the session if new.
    fn session_tail(&mut self, session: &str, session_hash: u64) -> (Arc<str>, u32) {
        if let Some(list) = self.sessions.find(session_hash, |s| &*s.name == session) {
            return (list.name.clone(), list.newest);
        }
        let name: Arc<str> = session.into();
        self.heap_bytes += session.len();
        self.sessions.insert_unique(
            session_hash,
            SessionList {
                name: name.clone(),
                hash: session_hash,
                oldest: NIL,
                newest: NIL,
                len: 0,
            },
            |s| s.hash,
        );
        (name, NIL)
    }

    fn trim_session(&mut self, session: &str, session_hash: u64, max: usize) {
        for _ in 0..MAX_EVICTIONS_PER_CLAIM {
            let oldest = match self.sessions.find(session_hash, |s| &*s.name == session) {
                Some(list) if list.len > max => list.oldest,
                _ => return,
            };
            self.remove(oldest);
        }
    }

    /// Unlinks a step from both orders and frees its slot (and its session's, if last).
    fn remove(&mut self, at: u32) {
        let node = self.slab[at as usize]
            .take()
            .expect("linked slots are occupied");
        self.free.push(at);
        self.len -= 1;
        self.heap_bytes -= node.step.len();
        if let State::Answered(answer) = &node.state {
            self.heap_bytes -= answer.len();
        }
        match node.older {
            NIL => self.oldest = node.newer,
            older => self.node_mut(older).newer = node.newer,
        }
        match node.newer {
            NIL => self.newest = node.older,
            newer => self.node_mut(newer).older = node.older,
        }
        if node.session_older != NIL {
            self.node_mut(node.session_older).session_newer = node.session_newer;
        }
        if node.session_newer != NIL {
            self.node_mut(node.session_newer).session_older = node.session_older;
        }
        if let Ok(entry) = self.index.find_entry(node.hash, |&i| i == at) {
            entry.remove();
        }
        if let Ok(mut entry) = self
            .sessions
            .find_entry(node.session_hash, |s| Arc::ptr_eq(&s.name, &node.session))
        {
            let list = entry.get_mut();
            list.len -= 1;
            if list.oldest == at {
                list.oldest = node.session_newer;
            }
            if list.newest == at {
                list.newest = node.session_older;
            }
            if list.len == 0 {
                self.heap_bytes -= list.name.len();
                entry.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WIDE: Limits = Limits {
        window_ms: 1_000,
        max_steps_per_session: 1_000,
        max_steps: 1_000,
    };

    const WIDE_OPEN: Limits = Limits {
        window_ms: i64::MAX,
        max_steps_per_session: usize::MAX,
        max_steps: usize::MAX,
    };

    fn fp(n: u8) -> Fingerprint {
        [n; 16]
    }

    fn claim(
        store: &AnsweredSteps<u32>,
        session: &str,
        step: &str,
        f: u8,
        now: i64,
        limits: Limits,
    ) -> Claim {
        store.claim(session, step, fp(f), 7, now, limits, |_| false)
    }

    #[test]
    fn a_step_is_claimed_once_then_replayed_refused_or_in_progress() {
        let store = AnsweredSteps::new(4);
        let Claim::New(seq) = claim(&store, "s", "1", 1, 0, WIDE) else {
            panic!("a new step is claimed")
        };
        assert_eq!(claim(&store, "s", "1", 1, 1, WIDE), Claim::InProgress);
        assert_eq!(claim(&store, "s", "1", 2, 1, WIDE), Claim::Conflict);
        assert!(store.complete("s", "1", seq, b"answer"));
        assert_eq!(
            claim(&store, "s", "1", 1, 2, WIDE),
            Claim::Replay(b"answer".to_vec())
        );
        assert_eq!(claim(&store, "s", "1", 2, 2, WIDE), Claim::Conflict);
        // Another session, or another step id, is another step.
        assert!(matches!(claim(&store, "t", "1", 1, 2, WIDE), Claim::New(_)));
        assert!(matches!(claim(&store, "s", "2", 1, 2, WIDE), Claim::New(_)));
        assert_eq!(store.stats().steps, 3);
        assert_eq!(store.stats().sessions, 2);
    }

    #[test]
    fn an_abandoned_claim_is_taken_over() {
        let store: AnsweredSteps<u32> = AnsweredSteps::new(1);
        store.claim("s", "1", fp(1), 1, 0, WIDE, |_| false);
        let taken = store.claim("s", "1", fp(1), 2, 0, WIDE, |&p| p == 1);
        assert!(matches!(taken, Claim::New(_)));
        assert_eq!(store.stats().steps, 1);
    }

    #[test]
    fn release_and_complete_act_only_on_their_own_claim() {
        let store = AnsweredSteps::new(1);
        let Claim::New(first) = claim(&store, "s", "1", 1, 0, WIDE) else {
            panic!()
        };
        assert!(store.release("s", "1", first));
        assert!(!store.release("s", "1", first));
        let Claim::New(second) = claim(&store, "s", "1", 1, 0, WIDE) else {
            panic!()
        };
        assert!(!store.complete("s", "1", first, b"stale"));
        assert!(store.complete("s", "1", second, b"mine"));
        assert_eq!(
            claim(&store, "s", "1", 1, 0, WIDE),
            Claim::Replay(b"mine".to_vec())
        );
    }

    #[test]
    fn a_step_older_than_the_window_is_a_new_step_and_the_sweep_frees_it() {
        let store = AnsweredSteps::new(2);
        let Claim::New(seq) = claim(&store, "s", "1", 1, 0, WIDE) else {
            panic!()
        };
        store.complete("s", "1", seq, b"a");
        claim(&store, "s", "2", 1, 600, WIDE);
        assert_eq!(
            claim(&store, "s", "1", 1, 1_000, WIDE),
            Claim::Replay(b"a".to_vec())
        );
        // 1 001 ms later: forgotten, whatever its body.
        assert!(matches!(
            claim(&store, "s", "1", 9, 1_001, WIDE),
            Claim::New(_)
        ));
        assert_eq!(store.sweep(1_700, 1_000), 1, "step 2 (at 600) is swept");
        assert_eq!(store.session_len("s"), 1);
        assert_eq!(store.sweep(2_002, 1_000), 1);
        assert_eq!(
            store.stats(),
            Stats {
                steps: 0,
                sessions: 0,
                bytes: store.stats().bytes
            }
        );
    }

    #[test]
    fn past_the_session_cap_the_sessions_oldest_go() {
        let store = AnsweredSteps::new(1);
        let limits = Limits {
            max_steps_per_session: 3,
            ..WIDE
        };
        for step in ["1", "2", "3", "4"] {
            claim(&store, "s", step, 1, 0, limits);
            claim(&store, "other", step, 1, 0, limits);
        }
        assert_eq!(store.session_len("s"), 3);
        assert_eq!(store.session_len("other"), 3);
        assert!(
            matches!(claim(&store, "s", "1", 1, 0, limits), Claim::New(_)),
            "1 was forgotten"
        );
        assert_eq!(claim(&store, "s", "4", 1, 0, limits), Claim::InProgress);
    }

    #[test]
    fn past_the_cap_in_all_the_oldest_go_whatever_their_session() {
        let store = AnsweredSteps::new(1);
        let limits = Limits {
            max_steps: 4,
            ..WIDE
        };
        for n in 0..10 {
            claim(&store, &format!("s{n}"), "x", 1, n, limits);
        }
        assert_eq!(store.stats().steps, 4);
        assert_eq!(store.stats().sessions, 4);
        assert_eq!(store.session_len("s5"), 0);
        assert_eq!(store.session_len("s6"), 1);
    }

    #[test]
    fn a_cap_lowered_at_run_time_is_reached_over_the_next_claims() {
        let store = AnsweredSteps::new(1);
        for n in 0..3_000 {
            claim(&store, "s", &n.to_string(), 1, 0, WIDE_OPEN);
        }
        let low = Limits {
            max_steps: 10,
            ..WIDE_OPEN
        };
        claim(&store, "t", "a", 1, 0, low);
        assert_eq!(store.stats().steps, 3_001 - MAX_EVICTIONS_PER_CLAIM);
        for step in ["b", "c", "d"] {
            claim(&store, "t", step, 1, 0, low);
        }
        assert_eq!(store.stats().steps, 10);
    }

    #[test]
    fn many_distinct_steps_stay_within_the_caps_and_the_bytes_stay_flat() {
        // 200 000 here (debug builds are slow); the Elixir suite runs a million through
        // the NIF.
        let store = AnsweredSteps::new(16);
        let limits = Limits {
            window_ms: i64::MAX,
            max_steps_per_session: 100,
            max_steps: 10_000,
        };
        let mut peak = 0;
        let mut at_cap = None;
        for n in 0..200_000u32 {
            let session = if n % 2 == 0 {
                "hot".to_string()
            } else {
                format!("cold-{n}")
            };
            let Claim::New(seq) = claim(&store, &session, &n.to_string(), 1, 0, limits) else {
                panic!("every step is new")
            };
            store.complete(&session, &n.to_string(), seq, &[0; 200]);
            if n % 20_000 == 19_999 {
                let stats = store.stats();
                assert!(
                    stats.steps <= 10_000 && stats.sessions <= 10_000,
                    "{stats:?}"
                );
                assert_eq!(store.session_len("hot"), 100);
                peak = peak.max(stats.bytes);
                at_cap.get_or_insert(stats.bytes);
            }
        }
        // Flat: once at the caps, more steps add nothing but the tables' slack (a hash
        // table churned by half a million sessions may grow its capacity once).
        assert!(
            peak as f64 <= at_cap.unwrap() as f64 * 1.5,
            "{peak} vs {at_cap:?}"
        );
    }

    // Against a plain model: a list of (session, step, seq) in claim order.
    #[derive(Clone, Debug)]
    enum Op {
        Claim(u8, u8, u8),
        Complete(u8, u8),
        Release(u8, u8),
        Sweep,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..4u8, 0..6u8, 0..2u8).prop_map(|(s, t, f)| Op::Claim(s, t, f)),
            2 => (0..4u8, 0..6u8).prop_map(|(s, t)| Op::Complete(s, t)),
            1 => (0..4u8, 0..6u8).prop_map(|(s, t)| Op::Release(s, t)),
            1 => Just(Op::Sweep),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_plain_list(ops in proptest::collection::vec(op(), 1..200)) {
            let limits = Limits { window_ms: 5, max_steps_per_session: 3, max_steps: 7 };
            let store: AnsweredSteps<u32> = AnsweredSteps::new(1);
            // (session, step, fingerprint, seq, at, answered)
            let mut model: Vec<(u8, u8, u8, u64, i64, bool)> = Vec::new();
            for (now, op) in ops.into_iter().enumerate() {
                let now = now as i64;
                match op {
                    Op::Claim(s, t, f) => {
                        let got = claim(&store, &s.to_string(), &t.to_string(), f, now, limits);
                        let held = model.iter().position(|m| m.0 == s && m.1 == t && m.4 >= now - limits.window_ms);
                        let expected = match held.map(|i| model[i]) {
                            Some(m) if m.2 != f => Claim::Conflict,
                            Some(m) if m.5 => Claim::Replay(vec![m.2]),
                            Some(_) => Claim::InProgress,
                            None => {
                                model.retain(|m| !(m.0 == s && m.1 == t));
                                let Claim::New(seq) = got else { panic!("expected a new claim, got {got:?}") };
                                model.push((s, t, f, seq, now, false));
                                while model.iter().filter(|m| m.0 == s).count() > limits.max_steps_per_session {
                                    let i = model.iter().position(|m| m.0 == s).unwrap();
                                    model.remove(i);
                                }
                                while model.len() > limits.max_steps {
                                    model.remove(0);
                                }
                                got.clone()
                            }
                        };
                        prop_assert_eq!(got, expected);
                    }
                    Op::Complete(s, t) => {
                        if let Some(m) = model.iter_mut().find(|m| m.0 == s && m.1 == t) {
                            prop_assert!(store.complete(&s.to_string(), &t.to_string(), m.3, &[m.2]));
                            m.5 = true;
                        }
                    }
                    Op::Release(s, t) => {
                        if let Some(i) = model.iter().position(|m| m.0 == s && m.1 == t) {
                            prop_assert!(store.release(&s.to_string(), &t.to_string(), model[i].3));
                            model.remove(i);
                        }
                    }
                    Op::Sweep => {
                        let before = model.len();
                        model.retain(|m| m.4 >= now - limits.window_ms);
                        prop_assert_eq!(store.sweep(now, limits.window_ms), before - model.len());
                    }
                }
                prop_assert_eq!(store.stats().steps, model.len());
                for s in 0..4u8 {
                    prop_assert_eq!(store.session_len(&s.to_string()), model.iter().filter(|m| m.0 == s).count());
                }
            }
        }
    }
}
