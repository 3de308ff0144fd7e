//! The steps the gateway has answered recently, so that a step delivered again is
//! answered with its first answer and never counted twice (idempotent ingest).
//!
//! A step is `(session, step id)`. Each carries the fingerprint of its body, so a
//! retry (same fingerprint) is told apart from another step sent under a used id
//! (another fingerprint). Between its claim and its answer a step is *pending*: the
//! claimant is scoring it, and a retry arriving meanwhile is told so.
//!
//! Memory is bounded four ways: per session (`max_steps_per_session`), per agent
//! (`max_steps_per_agent`: an agent's new steps push out only its own old ones, so no
//! agent can flush another's), in all (`max_steps`), each time the oldest first; and
//! in time (a step older than `window_ms` is never answered from memory, and
//! [`AnsweredSteps::sweep`] frees it). The steps live in a slab threaded by three
//! doubly linked lists — every step's age order, its session's and its agent's — so
//! a claim, an answer and each eviction are O(1): no scan, no compaction, however the
//! caps are set. The slab grows by fixed chunks, never by copying what it holds.
//!
//! One lock guards the store: a claim holds it for well under a microsecond, and the
//! three orders cross any sharding (an agent's sessions, a session's steps). The
//! pending claimant is generic (`P`): the NIF stores the caller's pid and decides
//! through a callback whether it is still alive. Keys come from clients: they are
//! hashed with keyed SipHash.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use hashbrown::hash_table::{AbsentEntry, OccupiedEntry};
use hashbrown::HashTable;
use parking_lot::Mutex;

/// A step body's identity (a truncated SHA-256, computed by the caller).
pub type Fingerprint = [u8; 16];

/// The caps, read by the caller on every claim (they may change at run time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub window_ms: i64,
    pub max_steps_per_session: usize,
    pub max_steps_per_agent: usize,
    pub max_steps: usize,
}

/// A claim held: where its step is in the store, and the claim's own number (never
/// reused), so that its answer or its release finds the step without looking it up —
/// and finds nothing once that claim is no longer held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub slot: u32,
    pub seq: u64,
}

/// What a claim finds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Not remembered: the caller scores it, then [`AnsweredSteps::complete`]s this claim.
    New(Ticket),
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
    pub agents: usize,
    /// The slab and tables' capacity plus the ids and answers they point to, in bytes.
    pub bytes: usize,
}

/// Which step `(session, step)` of an agent is being claimed.
#[derive(Clone, Copy, Debug)]
pub struct StepId<'a> {
    pub session: &'a str,
    pub step: &'a str,
    pub agent: &'a str,
}

const NIL: u32 = u32::MAX;
const CHUNK: usize = 1024;

/// At most this many steps go in one claim (per cap): a cap lowered at run time is
/// reached over the next claims, never in one long call.
const MAX_EVICTIONS_PER_CLAIM: usize = 1024;

enum State<P> {
    Pending(P),
    Answered(Box<[u8]>),
}

#[derive(Clone, Copy)]
struct Links {
    older: u32,
    newer: u32,
}

const UNLINKED: Links = Links {
    older: NIL,
    newer: NIL,
};

/// The three orders a step is in.
#[derive(Clone, Copy)]
enum Order {
    All,
    Session,
    Agent,
}

struct Node<P> {
    session: Arc<str>,
    session_hash: u64,
    agent: Arc<str>,
    agent_hash: u64,
    step: Box<str>,
    hash: u64,
    fingerprint: Fingerprint,
    seq: u64,
    at_ms: i64,
    state: State<P>,
    links: [Links; 3],
}

impl<P> Node<P> {
    fn links(&mut self, order: Order) -> &mut Links {
        &mut self.links[order as usize]
    }
}

/// Oldest and newest of an order, and its length.
#[derive(Clone, Copy)]
struct List {
    oldest: u32,
    newest: u32,
    len: usize,
}

const EMPTY: List = List {
    oldest: NIL,
    newest: NIL,
    len: 0,
};

/// A session's or an agent's own order.
struct Named {
    name: Arc<str>,
    hash: u64,
    list: List,
}

/// A slot holds a step, or the next free slot.
enum Slot<P> {
    Used(Node<P>),
    Free(u32),
}

/// Fixed-size chunks of slots, free ones chained: growing never moves a step.
struct Slab<P> {
    chunks: Vec<Box<[Slot<P>]>>,
    free: u32,
}

impl<P> Slab<P> {
    fn slot(&mut self, at: u32) -> &mut Slot<P> {
        &mut self.chunks[at as usize / CHUNK][at as usize % CHUNK]
    }

    fn get(&self, at: u32) -> &Node<P> {
        match &self.chunks[at as usize / CHUNK][at as usize % CHUNK] {
            Slot::Used(node) => node,
            Slot::Free(_) => unreachable!("linked slots are occupied"),
        }
    }

    /// The step in slot `at`, if the slot exists and holds one (a ticket's slot comes
    /// from the caller).
    fn held_mut(&mut self, at: u32) -> Option<&mut Node<P>> {
        let chunk = self.chunks.get_mut(at as usize / CHUNK)?;
        match &mut chunk[at as usize % CHUNK] {
            Slot::Used(node) => Some(node),
            Slot::Free(_) => None,
        }
    }

    fn get_mut(&mut self, at: u32) -> &mut Node<P> {
        match self.slot(at) {
            Slot::Used(node) => node,
            Slot::Free(_) => unreachable!("linked slots are occupied"),
        }
    }

    fn insert(&mut self, node: Node<P>) -> u32 {
        if self.free == NIL {
            // A new chunk, its slots chained to the free list in order.
            let base = u32::try_from(self.chunks.len() * CHUNK).expect("fewer than 2^32 steps");
            let next = |i: usize| match i + 1 {
                CHUNK => NIL,
                n => base + n as u32,
            };
            self.chunks
                .push((0..CHUNK).map(|i| Slot::Free(next(i))).collect());
            self.free = base;
        }
        let at = self.free;
        match std::mem::replace(self.slot(at), Slot::Used(node)) {
            Slot::Free(next) => self.free = next,
            Slot::Used(_) => unreachable!("free slots are free"),
        }
        at
    }

    fn take(&mut self, at: u32) -> Node<P> {
        let free = self.free;
        self.free = at;
        match std::mem::replace(self.slot(at), Slot::Free(free)) {
            Slot::Used(node) => node,
            Slot::Free(_) => unreachable!("linked slots are occupied"),
        }
    }

    /// Appends `at` as the newest of `list` in `order`.
    fn link(&mut self, list: &mut List, at: u32, order: Order) {
        *self.get_mut(at).links(order) = Links {
            older: list.newest,
            newer: NIL,
        };
        match list.newest {
            NIL => list.oldest = at,
            newest => self.get_mut(newest).links(order).newer = at,
        }
        list.newest = at;
        list.len += 1;
    }

    /// Closes the gap a removed step (its `links` in `order`) leaves in `list`.
    fn unlink(&mut self, list: &mut List, links: Links, order: Order) {
        match links.older {
            NIL => list.oldest = links.newer,
            older => self.get_mut(older).links(order).newer = links.newer,
        }
        match links.newer {
            NIL => list.newest = links.older,
            newer => self.get_mut(newer).links(order).older = links.older,
        }
        list.len -= 1;
    }
}

/// A hash table in parts, picked by bits of the hash that the table itself does not
/// use much: a part that grows rehashes its share only, so no call waits for a
/// million entries to move.
struct Tables<T>(Box<[HashTable<T>]>);

const PARTS: usize = 64;

impl<T> Tables<T> {
    fn new() -> Self {
        Self((0..PARTS).map(|_| HashTable::new()).collect())
    }

    fn part(&self, hash: u64) -> &HashTable<T> {
        &self.0[(hash >> 32) as usize % PARTS]
    }

    fn part_mut(&mut self, hash: u64) -> &mut HashTable<T> {
        &mut self.0[(hash >> 32) as usize % PARTS]
    }

    fn find(&self, hash: u64, eq: impl FnMut(&T) -> bool) -> Option<&T> {
        self.part(hash).find(hash, eq)
    }

    fn find_entry(
        &mut self,
        hash: u64,
        eq: impl FnMut(&T) -> bool,
    ) -> Result<OccupiedEntry<'_, T>, AbsentEntry<'_, T>> {
        self.part_mut(hash).find_entry(hash, eq)
    }

    fn insert_unique(&mut self, hash: u64, value: T, hasher: impl Fn(&T) -> u64) {
        self.part_mut(hash).insert_unique(hash, value, hasher);
    }

    fn len(&self) -> usize {
        self.0.iter().map(HashTable::len).sum()
    }

    fn capacity(&self) -> usize {
        self.0.iter().map(HashTable::capacity).sum()
    }
}

struct Store<P> {
    slab: Slab<P>,
    /// `(hash, slot)` of every step, found by the hash of `(session, step)`.
    index: Tables<(u64, u32)>,
    sessions: Tables<Named>,
    agents: Tables<Named>,
    all: List,
    /// Bytes of ids and answers held.
    heap_bytes: usize,
    next_seq: u64,
}

/// See the module documentation.
pub struct AnsweredSteps<P> {
    store: Mutex<Store<P>>,
    hasher: RandomState,
}

impl<P> Default for AnsweredSteps<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> AnsweredSteps<P> {
    pub fn new() -> Self {
        Self {
            store: Mutex::new(Store {
                slab: Slab {
                    chunks: Vec::new(),
                    free: NIL,
                },
                index: Tables::new(),
                sessions: Tables::new(),
                agents: Tables::new(),
                all: EMPTY,
                heap_bytes: 0,
                next_seq: 0,
            }),
            hasher: RandomState::new(),
        }
    }

    /// Claims a step for scoring, or says why it is not scored again. A remembered
    /// step older than the window, or whose pending claimant is `abandoned`, is
    /// forgotten and claimed afresh.
    pub fn claim(
        &self,
        id: StepId,
        fingerprint: Fingerprint,
        claimant: P,
        now_ms: i64,
        limits: Limits,
        abandoned: impl Fn(&P) -> bool,
    ) -> Claim {
        // The session's hash and the step's (the session's, then the step id: what
        // `hash_one((session, step))` writes) in one pass over the session.
        let mut hasher = self.hasher.build_hasher();
        id.session.hash(&mut hasher);
        let session_hash = hasher.clone().finish();
        id.step.hash(&mut hasher);
        let hash = hasher.finish();
        let mut store = self.store.lock();
        if let Some(at) = store.find(hash, id.session, id.step) {
            let node = store.slab.get(at);
            let stale = node.at_ms < now_ms.saturating_sub(limits.window_ms)
                || matches!(&node.state, State::Pending(p) if abandoned(p));
            if !stale {
                return match &node.state {
                    _ if node.fingerprint != fingerprint => Claim::Conflict,
                    State::Answered(answer) => Claim::Replay(answer.to_vec()),
                    State::Pending(_) => Claim::InProgress,
                };
            }
            store.remove(at);
        }
        store.next_seq += 1;
        let seq = store.next_seq;
        let agent_hash = self.hasher.hash_one(id.agent);
        let (slot, session_len, agent_len) =
            store.insert(id, hash, session_hash, agent_hash, |named| Node {
                session: named.0.clone(),
                session_hash,
                agent: named.1.clone(),
                agent_hash,
                step: id.step.into(),
                hash,
                fingerprint,
                seq,
                at_ms: now_ms,
                state: State::Pending(claimant),
                links: [UNLINKED; 3],
            });
        // A cap is looked up again only when it is passed (removing a session's
        // steps only shortens its agent's order, and every order's).
        if session_len > limits.max_steps_per_session.max(1) {
            store.trim(
                Order::Session,
                session_hash,
                id.session,
                limits.max_steps_per_session,
            );
        }
        if agent_len > limits.max_steps_per_agent.max(1) {
            store.trim(
                Order::Agent,
                agent_hash,
                id.agent,
                limits.max_steps_per_agent,
            );
        }
        store.trim(Order::All, 0, "", limits.max_steps);
        Claim::New(Ticket { slot, seq })
    }

    /// Stores the answer of a claim; false if that claim is no longer held.
    pub fn complete(&self, ticket: Ticket, answer: &[u8]) -> bool {
        self.with_claim(ticket, |store, at| {
            let node = store.slab.get_mut(at);
            let replaced = match &node.state {
                State::Answered(old) => old.len(),
                State::Pending(_) => 0,
            };
            node.state = State::Answered(answer.into());
            store.heap_bytes = store.heap_bytes + answer.len() - replaced;
        })
    }

    /// Forgets a claim (its step was not scored); false if it is no longer held.
    pub fn release(&self, ticket: Ticket) -> bool {
        self.with_claim(ticket, |store, at| store.remove(at))
    }

    /// Forgets every step older than `window_ms`; returns how many.
    pub fn sweep(&self, now_ms: i64, window_ms: i64) -> usize {
        let cutoff = now_ms.saturating_sub(window_ms);
        let mut store = self.store.lock();
        let mut swept = 0;
        while store.all.oldest != NIL && store.slab.get(store.all.oldest).at_ms < cutoff {
            let oldest = store.all.oldest;
            store.remove(oldest);
            swept += 1;
        }
        swept
    }

    /// Steps remembered for a session.
    pub fn session_len(&self, session: &str) -> usize {
        let hash = self.hasher.hash_one(session);
        let store = self.store.lock();
        store
            .sessions
            .find(hash, |s| &*s.name == session)
            .map_or(0, |s| s.list.len)
    }

    /// Steps remembered for an agent.
    pub fn agent_len(&self, agent: &str) -> usize {
        let hash = self.hasher.hash_one(agent);
        let store = self.store.lock();
        store
            .agents
            .find(hash, |a| &*a.name == agent)
            .map_or(0, |a| a.list.len)
    }

    pub fn stats(&self) -> Stats {
        let store = self.store.lock();
        Stats {
            steps: store.all.len,
            sessions: store.sessions.len(),
            agents: store.agents.len(),
            bytes: store.heap_bytes
                + store.slab.chunks.len() * CHUNK * std::mem::size_of::<Slot<P>>()
                + store.index.capacity() * std::mem::size_of::<(u64, u32)>()
                + (store.sessions.capacity() + store.agents.capacity())
                    * std::mem::size_of::<Named>(),
        }
    }

    /// Runs `f` on the ticket's step if the ticket's claim still holds it: the slot
    /// holds a step of that claim's number (numbers are never reused, so a slot
    /// freed and taken again by another claim does not match).
    fn with_claim(&self, ticket: Ticket, f: impl FnOnce(&mut Store<P>, u32)) -> bool {
        let mut store = self.store.lock();
        match store.slab.held_mut(ticket.slot) {
            Some(node) if node.seq == ticket.seq => {
                f(&mut store, ticket.slot);
                true
            }
            _ => false,
        }
    }
}

impl<P> Store<P> {
    fn find(&self, hash: u64, session: &str, step: &str) -> Option<u32> {
        self.index
            .find(hash, |&(h, at)| {
                let node = self.slab.get(at);
                h == hash && &*node.session == session && &*node.step == step
            })
            .map(|&(_, at)| at)
    }

    /// The session's or agent's entry, made (with an empty order) if new.
    fn named<'t>(
        table: &'t mut Tables<Named>,
        heap_bytes: &mut usize,
        name: &str,
        hash: u64,
    ) -> &'t mut Named {
        match table.find_entry(hash, |n| &*n.name == name) {
            Ok(entry) => entry.into_mut(),
            Err(absent) => {
                *heap_bytes += name.len();
                absent
                    .into_table()
                    .insert_unique(
                        hash,
                        Named {
                            name: name.into(),
                            hash,
                            list: EMPTY,
                        },
                        |n| n.hash,
                    )
                    .into_mut()
            }
        }
    }

    /// Adds a step, made by `node` from its session's and agent's shared names, as
    /// the newest of all, of its session and of its agent: its slot, and the lengths
    /// of its session's and agent's orders. Each name is looked up once, and its
    /// entry linked in place (no reference count moves but the node's own).
    fn insert(
        &mut self,
        id: StepId,
        hash: u64,
        session_hash: u64,
        agent_hash: u64,
        node: impl FnOnce((&Arc<str>, &Arc<str>)) -> Node<P>,
    ) -> (u32, usize, usize) {
        let Store {
            slab,
            index,
            sessions,
            agents,
            all,
            heap_bytes,
            ..
        } = self;
        let session = Self::named(sessions, heap_bytes, id.session, session_hash);
        let agent = Self::named(agents, heap_bytes, id.agent, agent_hash);
        *heap_bytes += id.step.len();
        let at = slab.insert(node((&session.name, &agent.name)));
        slab.link(all, at, Order::All);
        slab.link(&mut session.list, at, Order::Session);
        slab.link(&mut agent.list, at, Order::Agent);
        index.insert_unique(hash, (hash, at), |&(h, _)| h);
        (at, session.list.len, agent.list.len)
    }

    /// Forgets the oldest steps of an order while it holds more than `max`.
    fn trim(&mut self, order: Order, hash: u64, name: &str, max: usize) {
        for _ in 0..MAX_EVICTIONS_PER_CLAIM {
            let list = match order {
                Order::All => Some(self.all),
                Order::Session => self
                    .sessions
                    .find(hash, |s| &*s.name == name)
                    .map(|s| s.list),
                Order::Agent => self.agents.find(hash, |a| &*a.name == name).map(|a| a.list),
            };
            match list {
                Some(list) if list.len > max.max(1) => self.remove(list.oldest),
                _ => return,
            }
        }
    }

    /// Unlinks a step from its three orders and frees its slot (and its session's and
    /// agent's, when it was their last).
    fn remove(&mut self, at: u32) {
        let node = self.slab.take(at);
        self.heap_bytes -= node.step.len();
        if let State::Answered(answer) = &node.state {
            self.heap_bytes -= answer.len();
        }
        self.slab
            .unlink(&mut self.all, node.links[Order::All as usize], Order::All);
        for (table, hash, name, order) in [
            (
                &mut self.sessions,
                node.session_hash,
                &node.session,
                Order::Session,
            ),
            (&mut self.agents, node.agent_hash, &node.agent, Order::Agent),
        ] {
            if let Ok(mut entry) = table.find_entry(hash, |n| Arc::ptr_eq(&n.name, name)) {
                self.slab
                    .unlink(&mut entry.get_mut().list, node.links[order as usize], order);
                if entry.get().list.len == 0 {
                    self.heap_bytes -= name.len();
                    entry.remove();
                }
            }
        }
        if let Ok(entry) = self.index.find_entry(node.hash, |&(_, i)| i == at) {
            entry.remove();
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
        max_steps_per_agent: 1_000,
        max_steps: 1_000,
    };

    const WIDE_OPEN: Limits = Limits {
        window_ms: i64::MAX,
        max_steps_per_session: usize::MAX,
        max_steps_per_agent: usize::MAX,
        max_steps: usize::MAX,
    };

    fn fp(n: u8) -> Fingerprint {
        [n; 16]
    }

    fn id<'a>(session: &'a str, step: &'a str) -> StepId<'a> {
        StepId {
            session,
            step,
            agent: "agent",
        }
    }

    fn claim(store: &AnsweredSteps<u32>, id: StepId, f: u8, now: i64, limits: Limits) -> Claim {
        store.claim(id, fp(f), 7, now, limits, |_| false)
    }

    #[test]
    fn a_step_is_claimed_once_then_replayed_refused_or_in_progress() {
        let store = AnsweredSteps::new();
        let Claim::New(seq) = claim(&store, id("s", "1"), 1, 0, WIDE) else {
            panic!("a new step is claimed")
        };
        assert_eq!(claim(&store, id("s", "1"), 1, 1, WIDE), Claim::InProgress);
        assert_eq!(claim(&store, id("s", "1"), 2, 1, WIDE), Claim::Conflict);
        assert!(store.complete(seq, b"answer"));
        assert_eq!(
            claim(&store, id("s", "1"), 1, 2, WIDE),
            Claim::Replay(b"answer".to_vec())
        );
        assert_eq!(claim(&store, id("s", "1"), 2, 2, WIDE), Claim::Conflict);
        // Another session, or another step id, is another step.
        assert!(matches!(
            claim(&store, id("t", "1"), 1, 2, WIDE),
            Claim::New(_)
        ));
        assert!(matches!(
            claim(&store, id("s", "2"), 1, 2, WIDE),
            Claim::New(_)
        ));
        let stats = store.stats();
        assert_eq!((stats.steps, stats.sessions, stats.agents), (3, 2, 1));
    }

    #[test]
    fn an_abandoned_claim_is_taken_over() {
        let store: AnsweredSteps<u32> = AnsweredSteps::new();
        store.claim(id("s", "1"), fp(1), 1, 0, WIDE, |_| false);
        let taken = store.claim(id("s", "1"), fp(1), 2, 0, WIDE, |&p| p == 1);
        assert!(matches!(taken, Claim::New(_)));
        assert_eq!(store.stats().steps, 1);
    }

    #[test]
    fn release_and_complete_act_only_on_their_own_claim() {
        let store = AnsweredSteps::new();
        let Claim::New(first) = claim(&store, id("s", "1"), 1, 0, WIDE) else {
            panic!()
        };
        assert!(store.release(first));
        assert!(!store.release(first));
        let Claim::New(second) = claim(&store, id("s", "1"), 1, 0, WIDE) else {
            panic!()
        };
        assert!(!store.complete(first, b"stale"));
        assert!(store.complete(second, b"mine"));
        assert_eq!(
            claim(&store, id("s", "1"), 1, 0, WIDE),
            Claim::Replay(b"mine".to_vec())
        );
    }

    #[test]
    fn a_ticket_acts_only_while_its_claim_holds_the_slot_it_names() {
        // The answer and the release go straight to the ticket's slot: a slot freed
        // (released, evicted) and taken by another claim is not the ticket's.
        let store = AnsweredSteps::new();
        let Claim::New(first) = claim(&store, id("s", "1"), 1, 0, WIDE) else {
            panic!()
        };
        assert!(store.release(first));
        let Claim::New(second) = claim(&store, id("s", "2"), 1, 0, WIDE) else {
            panic!()
        };
        assert_eq!(second.slot, first.slot, "the freed slot is taken again");
        assert!(!store.complete(first, b"stale"));
        assert!(!store.release(first));
        assert_eq!(claim(&store, id("s", "2"), 1, 0, WIDE), Claim::InProgress);

        // Evicted past a cap, then its slot reused: the same.
        let one = Limits {
            max_steps: 1,
            ..WIDE
        };
        let Claim::New(third) = claim(&store, id("t", "1"), 1, 0, one) else {
            panic!()
        };
        let Claim::New(fourth) = claim(&store, id("t", "2"), 1, 0, one) else {
            panic!()
        };
        assert!(!store.complete(second, b"evicted"));
        assert!(!store.complete(third, b"evicted"));
        assert!(store.complete(fourth, b"kept"));
        assert_eq!(
            claim(&store, id("t", "2"), 1, 0, one),
            Claim::Replay(b"kept".to_vec())
        );
    }

    #[test]
    fn a_ticket_naming_no_slot_or_an_empty_one_is_refused_without_a_panic() {
        // Tickets come back from the caller: any slot number is answered, never indexed
        // blindly.
        let store = AnsweredSteps::new();
        let Claim::New(held) = claim(&store, id("s", "1"), 1, 0, WIDE) else {
            panic!()
        };
        for slot in [held.slot + 1, CHUNK as u32, u32::MAX - 1, u32::MAX] {
            let ticket = Ticket {
                slot,
                seq: held.seq,
            };
            assert!(!store.complete(ticket, b"x"), "slot {slot}");
            assert!(!store.release(ticket), "slot {slot}");
        }
        assert_eq!(store.stats().steps, 1);
        assert!(store.complete(held, b"answer"));
    }

    #[test]
    fn a_step_older_than_the_window_is_a_new_step_and_the_sweep_frees_it() {
        let store = AnsweredSteps::new();
        let Claim::New(seq) = claim(&store, id("s", "1"), 1, 0, WIDE) else {
            panic!()
        };
        store.complete(seq, b"a");
        claim(&store, id("s", "2"), 1, 600, WIDE);
        assert_eq!(
            claim(&store, id("s", "1"), 1, 1_000, WIDE),
            Claim::Replay(b"a".to_vec())
        );
        // 1 001 ms later: forgotten, whatever its body.
        assert!(matches!(
            claim(&store, id("s", "1"), 9, 1_001, WIDE),
            Claim::New(_)
        ));
        assert_eq!(store.sweep(1_700, 1_000), 1, "step 2 (at 600) is swept");
        assert_eq!(store.session_len("s"), 1);
        assert_eq!(store.sweep(2_002, 1_000), 1);
        let stats = store.stats();
        assert_eq!((stats.steps, stats.sessions, stats.agents), (0, 0, 0));
    }

    #[test]
    fn past_the_session_cap_the_sessions_oldest_go() {
        let store = AnsweredSteps::new();
        let limits = Limits {
            max_steps_per_session: 3,
            ..WIDE
        };
        for step in ["1", "2", "3", "4"] {
            claim(&store, id("s", step), 1, 0, limits);
            claim(&store, id("other", step), 1, 0, limits);
        }
        assert_eq!(store.session_len("s"), 3);
        assert_eq!(store.session_len("other"), 3);
        assert!(
            matches!(claim(&store, id("s", "1"), 1, 0, limits), Claim::New(_)),
            "1 was forgotten"
        );
        assert_eq!(claim(&store, id("s", "4"), 1, 0, limits), Claim::InProgress);
    }

    #[test]
    fn each_cap_is_kept_by_the_claim_that_passes_it() {
        // The caps are checked on the lengths the claim's insert saw.
        let store = AnsweredSteps::new();
        let limits = Limits {
            window_ms: i64::MAX,
            max_steps_per_session: 2,
            max_steps_per_agent: 2,
            max_steps: 3,
        };
        let claim = |session: &str, step: &str, agent: &str| {
            let id = StepId {
                session,
                step,
                agent,
            };
            assert!(matches!(
                store.claim(id, fp(1), 7, 0, limits, |_| false),
                Claim::New(_)
            ));
        };
        claim("a", "1", "x");
        claim("b", "1", "y");
        claim("a", "2", "x");
        // Past its session's cap: a/1 goes.
        claim("a", "3", "x");
        assert_eq!((store.session_len("a"), store.agent_len("x")), (2, 2));
        assert_eq!(store.stats().steps, 3);
        // Past its agent's cap in a new session: x's oldest (a/2) goes.
        claim("d", "1", "x");
        assert_eq!((store.session_len("a"), store.agent_len("x")), (1, 2));
        assert_eq!(store.stats().steps, 3);
        // Past the cap in all: the oldest (b/1, agent y's only step) goes.
        claim("e", "1", "z");
        let stats = store.stats();
        assert_eq!((stats.steps, stats.sessions, stats.agents), (3, 3, 2));
        assert_eq!((store.session_len("b"), store.agent_len("y")), (0, 0));
    }

    #[test]
    fn past_its_quota_an_agent_forgets_only_its_own_oldest() {
        let store = AnsweredSteps::new();
        let limits = Limits {
            max_steps_per_agent: 50,
            max_steps: 1_000,
            ..WIDE
        };
        let victim = |step: &'static str| StepId {
            session: "victim-session",
            step,
            agent: "victim",
        };
        for step in ["1", "2", "3"] {
            claim(&store, victim(step), 1, 0, limits);
        }
        // Ten times the cap in all, from another agent, over many sessions.
        for n in 0..10_000 {
            let (session, step) = (format!("flood-{}", n % 97), n.to_string());
            store.claim(
                StepId {
                    session: &session,
                    step: &step,
                    agent: "attacker",
                },
                fp(1),
                7,
                0,
                limits,
                |_| false,
            );
        }
        assert_eq!(store.agent_len("attacker"), 50);
        assert_eq!(store.agent_len("victim"), 3);
        for step in ["1", "2", "3"] {
            assert_eq!(claim(&store, victim(step), 1, 0, limits), Claim::InProgress);
        }
    }

    #[test]
    fn past_the_cap_in_all_the_oldest_go_whatever_their_session() {
        let store = AnsweredSteps::new();
        let limits = Limits {
            max_steps: 4,
            ..WIDE
        };
        for n in 0..10 {
            claim(&store, id(&format!("s{n}"), "x"), 1, n, limits);
        }
        assert_eq!(store.stats().steps, 4);
        assert_eq!(store.stats().sessions, 4);
        assert_eq!(store.session_len("s5"), 0);
        assert_eq!(store.session_len("s6"), 1);
    }

    #[test]
    fn a_cap_lowered_at_run_time_is_reached_over_the_next_claims() {
        let store = AnsweredSteps::new();
        for n in 0..3_000 {
            claim(&store, id("s", &n.to_string()), 1, 0, WIDE_OPEN);
        }
        let low = Limits {
            max_steps: 10,
            ..WIDE_OPEN
        };
        claim(&store, id("t", "a"), 1, 0, low);
        assert_eq!(store.stats().steps, 3_001 - MAX_EVICTIONS_PER_CLAIM);
        for step in ["b", "c", "d"] {
            claim(&store, id("t", step), 1, 0, low);
        }
        assert_eq!(store.stats().steps, 10);
    }

    #[test]
    fn the_byte_count_covers_the_tables_entries_of_every_step_session_and_agent() {
        let store = AnsweredSteps::new();
        let names: Vec<String> = (0..100).map(|n| format!("n{n}")).collect();
        for name in &names {
            let id = StepId {
                session: name,
                step: "1",
                agent: name,
            };
            assert!(matches!(
                store.claim(id, fp(1), 7, 0, WIDE_OPEN, |_| false),
                Claim::New(_)
            ));
        }
        let bytes = store.stats().bytes;
        // As `Stats::bytes` says: the ids and answers held, the slab, and the index and
        // the session and agent tables at their capacity.
        let inner = store.store.lock();
        fn capacity<T>(t: &Tables<T>) -> usize {
            t.0.iter().map(HashTable::capacity).sum()
        }
        let index = capacity(&inner.index);
        let names = capacity(&inner.sessions) + capacity(&inner.agents);
        assert!(index >= 100 && names >= 200, "{index} {names}");
        let slab = inner.slab.chunks.len() * CHUNK * std::mem::size_of::<Slot<u32>>();
        assert_eq!(
            bytes,
            inner.heap_bytes
                + slab
                + index * std::mem::size_of::<(u64, u32)>()
                + names * std::mem::size_of::<Named>()
        );
    }

    #[test]
    fn one_step_id_in_many_sessions_is_a_different_step_in_each() {
        // Enough sessions in the index that some share a step's hash bits in a probe:
        // only the session and the step together find a claim.
        let store = AnsweredSteps::new();
        let sessions: Vec<String> = (0..3_000).map(|n| format!("s{n}")).collect();
        for session in &sessions {
            let Claim::New(seq) = claim(&store, id(session, "1"), 1, 0, WIDE_OPEN) else {
                panic!("step 1 of {session} is new")
            };
            assert!(store.complete(seq, session.as_bytes()));
        }
        for session in &sessions {
            assert_eq!(
                claim(&store, id(session, "1"), 1, 1, WIDE_OPEN),
                Claim::Replay(session.as_bytes().into())
            );
        }
        assert_eq!(store.stats().steps, 3_000);
    }

    #[test]
    fn every_step_forgotten_no_id_or_answer_bytes_are_counted() {
        let store = AnsweredSteps::new();
        for (session, step, agent) in [("s", "1", "agent"), ("session", "2", "a"), ("s", "3", "a")]
        {
            let id = StepId {
                session,
                step,
                agent,
            };
            let Claim::New(seq) = store.claim(id, fp(1), 7, 0, WIDE_OPEN, |_| false) else {
                panic!("a new step is claimed")
            };
            assert!(store.complete(seq, &[0; 40]));
        }
        assert!(store.store.lock().heap_bytes > 0);
        let Claim::New(seq) = claim(&store, id("t", "4"), 1, 5, WIDE_OPEN) else {
            panic!("a new step is claimed")
        };
        assert!(store.release(seq));
        assert_eq!(store.sweep(10, 1), 3);
        assert_eq!(store.stats().steps, 0);
        assert_eq!(store.store.lock().heap_bytes, 0);
    }

    #[test]
    fn an_answer_stored_again_replaces_the_first_in_the_byte_count() {
        let twice = AnsweredSteps::new();
        let Claim::New(seq) = claim(&twice, id("s", "1"), 1, 0, WIDE) else {
            panic!("a new step is claimed")
        };
        assert!(twice.complete(seq, &[0; 300]));
        assert!(twice.complete(seq, &[0; 10]));
        let once = AnsweredSteps::new();
        let Claim::New(seq) = claim(&once, id("s", "1"), 1, 0, WIDE) else {
            panic!("a new step is claimed")
        };
        assert!(once.complete(seq, &[0; 10]));
        assert_eq!(twice.stats(), once.stats());
    }

    #[test]
    fn many_distinct_steps_stay_within_the_caps_and_the_bytes_stay_flat() {
        // 200 000 here (debug builds are slow); the Elixir suite runs a million through
        // the NIF.
        let store = AnsweredSteps::new();
        let limits = Limits {
            window_ms: i64::MAX,
            max_steps_per_session: 100,
            max_steps_per_agent: 5_000,
            max_steps: 10_000,
        };
        let mut peak = 0;
        let mut at_cap = None;
        for n in 0..200_000u32 {
            let (session, step) = if n % 2 == 0 {
                ("hot".to_string(), n.to_string())
            } else {
                (format!("cold-{n}"), n.to_string())
            };
            let agent = format!("agent-{}", n % 7);
            let id = StepId {
                session: &session,
                step: &step,
                agent: &agent,
            };
            let Claim::New(seq) = store.claim(id, fp(1), 7, 0, limits, |_| false) else {
                panic!("every step is new")
            };
            store.complete(seq, &[0; 200]);
            if n % 20_000 == 19_999 {
                let stats = store.stats();
                assert!(stats.steps <= 10_000, "{stats:?}");
                assert_eq!(store.session_len("hot"), 100);
                for a in 0..7 {
                    assert!(store.agent_len(&format!("agent-{a}")) <= 5_000);
                }
                peak = peak.max(stats.bytes);
                at_cap.get_or_insert(stats.bytes);
            }
        }
        // Flat: once at the caps, more steps add nothing but the tables' slack (a hash
        // table churned by 100 000 sessions may grow its capacity once).
        assert!(
            peak as f64 <= at_cap.unwrap() as f64 * 1.5,
            "{peak} vs {at_cap:?}"
        );
    }

    // Against a plain model: a list of steps in claim order.
    #[derive(Clone, Debug)]
    enum Op {
        Claim(u8, u8, u8, u8),
        Complete(u8, u8),
        Release(u8, u8),
        Sweep,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..4u8, 0..6u8, 0..2u8, 0..3u8).prop_map(|(s, t, f, a)| Op::Claim(s, t, f, a)),
            2 => (0..4u8, 0..6u8).prop_map(|(s, t)| Op::Complete(s, t)),
            1 => (0..4u8, 0..6u8).prop_map(|(s, t)| Op::Release(s, t)),
            1 => Just(Op::Sweep),
        ]
    }

    #[derive(Clone, Copy, Debug)]
    struct Held {
        session: u8,
        step: u8,
        fingerprint: u8,
        agent: u8,
        ticket: Ticket,
        at: i64,
        answered: bool,
    }

    proptest! {
        #[test]
        fn behaves_like_a_plain_list(ops in proptest::collection::vec(op(), 1..200)) {
            let limits = Limits {
                window_ms: 5,
                max_steps_per_session: 3,
                max_steps_per_agent: 5,
                max_steps: 7,
            };
            let store: AnsweredSteps<u32> = AnsweredSteps::new();
            let mut model: Vec<Held> = Vec::new();
            for (now, op) in ops.into_iter().enumerate() {
                let now = now as i64;
                match op {
                    Op::Claim(s, t, f, a) => {
                        let (session, step, agent) = (s.to_string(), t.to_string(), a.to_string());
                        let id = StepId { session: &session, step: &step, agent: &agent };
                        let got = store.claim(id, fp(f), 7, now, limits, |_| false);
                        let held = model
                            .iter()
                            .find(|m| m.session == s && m.step == t && m.at >= now - limits.window_ms)
                            .copied();
                        let expected = match held {
                            Some(m) if m.fingerprint != f => Claim::Conflict,
                            Some(m) if m.answered => Claim::Replay(vec![m.fingerprint]),
                            Some(_) => Claim::InProgress,
                            None => {
                                model.retain(|m| !(m.session == s && m.step == t));
                                let Claim::New(ticket) = got else {
                                    panic!("expected a new claim, got {got:?}")
                                };
                                model.push(Held { session: s, step: t, fingerprint: f, agent: a, ticket, at: now, answered: false });
                                let trim = |model: &mut Vec<Held>, of: &dyn Fn(&Held) -> bool, max: usize| {
                                    while model.iter().filter(|m| of(m)).count() > max {
                                        let i = model.iter().position(of).unwrap();
                                        model.remove(i);
                                    }
                                };
                                trim(&mut model, &|m| m.session == s, limits.max_steps_per_session);
                                trim(&mut model, &|m| m.agent == a, limits.max_steps_per_agent);
                                trim(&mut model, &|_| true, limits.max_steps);
                                got.clone()
                            }
                        };
                        prop_assert_eq!(got, expected);
                    }
                    Op::Complete(s, t) => {
                        if let Some(m) = model.iter_mut().find(|m| m.session == s && m.step == t) {
                            prop_assert!(store.complete(m.ticket, &[m.fingerprint]));
                            m.answered = true;
                        }
                    }
                    Op::Release(s, t) => {
                        if let Some(i) = model.iter().position(|m| m.session == s && m.step == t) {
                            prop_assert!(store.release(model[i].ticket));
                            model.remove(i);
                        }
                    }
                    Op::Sweep => {
                        let before = model.len();
                        model.retain(|m| m.at >= now - limits.window_ms);
                        prop_assert_eq!(store.sweep(now, limits.window_ms), before - model.len());
                    }
                }
                prop_assert_eq!(store.stats().steps, model.len());
                for n in 0..4u8 {
                    prop_assert_eq!(store.session_len(&n.to_string()), model.iter().filter(|m| m.session == n).count());
                    prop_assert_eq!(store.agent_len(&n.to_string()), model.iter().filter(|m| m.agent == n).count());
                }
            }
        }
    }
}
