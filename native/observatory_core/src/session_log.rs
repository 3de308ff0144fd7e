//! The most recent envelopes of each session, for inspection (the store behind
//! `Observatory.Gateway.SessionLog`).
//!
//! Each session keeps a ring of its last `ring` envelopes: the `n`-th message goes to
//! slot `n mod ring`, replacing what was there, so a step's write is one lookup of the
//! session and one slot overwritten, under its shard's lock. An envelope's bytes come in
//! ready (`put`), or are written under the lock into the buffer of the slot they
//! replace (`put_with`: a full ring allocates nothing), and are kept with the step's
//! number, the time it was received and the score to read it with.
//!
//! Sessions are sharded (64 locks: writers of different sessions rarely meet) and,
//! in each shard, threaded least recently seen first by a doubly linked list through
//! the slab that holds them: a step moves its session to the end, and the trim and
//! the idle sweep take sessions off the front, within a budget per call, so no call
//! holds a lock long whatever the number of sessions. The store counts the
//! envelope bytes it keeps and each put says whether a cap is now exceeded; the owner
//! then trims. Everything a put, a trim or a sweep replaces or drops is freed after
//! the lock is released.
//!
//! The ring's size and the caps are arguments of each call: they are settings that
//! may change at run time. When the ring is made smaller, the slots past its end are
//! freed by the session's next put (and readers, given the size, never look at them);
//! when it is made larger, new slots are used as numbers reach them — what the ETS
//! layout this replaces did, so readers see the same steps.
//!
//! Keys come from clients: they are hashed with keyed SipHash.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::keyed_store::Key;

/// How an envelope is kept: its JSON text (read with [`Score`] as its entropy score),
/// or an encoded term (an envelope given as a map, or the stub of one too large).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Json,
    Term,
}

/// The score a text is read back with: the agent's own (`Agent`), or the gateway's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Score {
    Agent,
    Float(f64),
    Int(i64),
}

/// An envelope to keep: its bytes, and the size the byte caps count for it (the
/// text's size; for a term, the size the caller measured). `D` holds the bytes (the
/// NIF's store: a `Vec<u8>` it reuses slot by slot).
#[derive(Debug)]
pub struct Envelope<D = Box<[u8]>> {
    pub kind: Kind,
    pub score: Score,
    pub data: D,
    pub bytes: usize,
}

/// A kept step, as readers see it.
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    /// The session's message count when it came (1 for its first).
    pub seq: u64,
    /// Its number in the session (the loop verdict's, or `seq`).
    pub number: u64,
    /// When it was received (Unix ms).
    pub at_ms: i64,
    pub kind: Kind,
    pub score: Score,
    pub data: &'a [u8],
}

/// What a put found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Put {
    /// The session's message count, this one included.
    pub seq: u64,
    /// The session was not held before this put: `sessions` is how many are now
    /// (0 when it was held: not read).
    pub new_session: bool,
    pub sessions: usize,
    /// Envelope bytes kept in all, and whether that is over the `max_bytes` given.
    pub bytes: u64,
    pub over_bytes: bool,
}

/// What a trim or a sweep did: sessions dropped, and whether it is finished (false:
/// it stopped at the number it was allowed; call again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub sessions: usize,
    pub done: bool,
}

const NIL: u32 = u32::MAX;

struct Slot<D> {
    seq: u64,
    number: u64,
    at_ms: i64,
    envelope: Envelope<D>,
}

struct Session<D> {
    /// In the slab entry when short: the lookup compares it without another miss.
    key: Key,
    hash: u64,
    seq: u64,
    at_ms: i64,
    /// The log-wide number of its latest put: the order of the sessions.
    order: u64,
    /// Slot `i` holds the message whose `seq mod ring` is `i`; grown as needed.
    slots: Vec<Option<Slot<D>>>,
}

/// A session's neighbours in the order, `[prev, next]`, kept apart from the slab in
/// a dense array: moving a session to the end touches its neighbours' links, and
/// those are more often in the caches here than in their sessions' entries.
type Links = [u32; 2];

/// One shard: the sessions whose hash falls in it, in a slab found by an index, and
/// threaded least recently seen first.
struct Inner<D> {
    /// Slab indices, found by the session's hash.
    index: HashTable<u32>,
    slab: Vec<Option<Session<D>>>,
    /// Indexed as the slab.
    links: Vec<Links>,
    free: Vec<u32>,
    /// Least recently seen first.
    head: u32,
    tail: u32,
}

/// Shards, each its own lock: concurrent writers of different sessions rarely meet.
const SHARDS: usize = 64;

/// The log. `Sync` when `D: Send`.
///
/// Sessions are sharded by a keyed hash of their id; the totals the caps are checked
/// against (sessions, bytes) are atomics. Each put stamps its session with a number
/// from one counter, taken under the shard's lock, so each shard's list is in that
/// order and the trim, which holds every shard's lock, drops the least recently seen
/// sessions of the whole log first.
pub struct SessionLog<D = Box<[u8]>> {
    shards: Box<[Mutex<Inner<D>>]>,
    hasher: RandomState,
    order: AtomicU64,
    sessions: AtomicUsize,
    bytes: AtomicU64,
}

impl<D: AsRef<[u8]>> Default for SessionLog<D> {
    fn default() -> Self {
        Self::new()
    }
}

impl<D: AsRef<[u8]>> SessionLog<D> {
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Inner {
                        index: HashTable::new(),
                        slab: Vec::new(),
                        links: Vec::new(),
                        free: Vec::new(),
                        head: NIL,
                        tail: NIL,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            order: AtomicU64::new(0),
            sessions: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// The shard of a hash: bits the index's buckets and tags do not use first.
    fn shard(&self, hash: u64) -> &Mutex<Inner<D>> {
        &self.shards[(hash >> 40) as usize % SHARDS]
    }

    /// Keeps `envelope` as the session's next message, numbered `number` (its
    /// `seq` when None), in a ring of `ring` slots (at least 1). `now_ms` is called
    /// under the shard's lock, and a time it gives that is earlier than the shard's
    /// latest (a time the caller read before the lock) is raised to that one, so the
    /// sessions' order and their times agree.
    pub fn put(
        &self,
        session: &str,
        envelope: Envelope<D>,
        number: Option<u64>,
        ring: usize,
        max_bytes: u64,
        now_ms: impl FnOnce() -> i64,
    ) -> Put {
        self.put_with(session, |_| envelope, number, ring, max_bytes, now_ms)
    }

    /// As `put`, with the envelope made under the shard's lock by `make`, from the
    /// data of the slot it replaces (None: no slot replaced), so that a copy can
    /// reuse that slot's buffer. What `make` leaves in it is freed after the lock.
    pub fn put_with(
        &self,
        session: &str,
        make: impl FnOnce(&mut Option<D>) -> Envelope<D>,
        number: Option<u64>,
        ring: usize,
        max_bytes: u64,
        now_ms: impl FnOnce() -> i64,
    ) -> Put {
        let ring = ring.max(1);
        let hash = self.hasher.hash_one(session);
        // Freed after the lock is released: the slot this put replaces, and the slots
        // past the ring's end when it was made smaller (rare: only then a Vec).
        let mut cut: Vec<Slot<D>> = Vec::new();
        let (put, replaced) = {
            let mut inner = self.shard(hash).lock();
            let inner = &mut *inner;
            let latest = match inner.tail {
                NIL => i64::MIN,
                tail => inner.session_at(tail).at_ms,
            };
            let (at, new_session) = inner.find_or_insert(session, hash);
            inner.touch(at);
            let order = self.order.fetch_add(1, Ordering::Relaxed);
            let now = now_ms().max(latest);
            let session = inner.slab[at as usize].as_mut().expect("indexed");
            session.seq += 1;
            session.at_ms = now;
            session.order = order;
            let seq = session.seq;
            let mut released = 0u64;
            if session.slots.len() > ring {
                cut.extend(session.slots.drain(ring..).flatten());
                released += cut.iter().map(|s| s.envelope.bytes as u64).sum::<u64>();
            }
            let i = (seq % ring as u64) as usize;
            if i >= session.slots.len() {
                session.slots.resize_with(i + 1, || None);
            }
            let replaced = session.slots[i].take();
            released += replaced.as_ref().map_or(0, |old| old.envelope.bytes as u64);
            let mut replaced = replaced.map(|old| old.envelope.data);
            let envelope = make(&mut replaced);
            let added = envelope.bytes as u64;
            session.slots[i] = Some(Slot {
                seq,
                number: number.unwrap_or(seq),
                at_ms: now,
                envelope,
            });
            // Wrapping: a put that frees more than it adds lowers the total.
            let delta = added.wrapping_sub(released);
            let bytes = self
                .bytes
                .fetch_add(delta, Ordering::Relaxed)
                .wrapping_add(delta);
            let sessions = if new_session {
                self.sessions.fetch_add(1, Ordering::Relaxed) + 1
            } else {
                0
            };
            let put = Put {
                seq,
                new_session,
                sessions,
                bytes,
                over_bytes: bytes > max_bytes,
            };
            (put, replaced)
        };
        drop((replaced, cut));
        put
    }

    /// The session's kept steps in a ring of `ring` slots, oldest first, given to
    /// `f` under its shard's lock (so the caller copies out only what it needs).
    pub fn steps<R>(&self, session: &str, ring: usize, f: impl FnOnce(&[Step<'_>]) -> R) -> R {
        let hash = self.hasher.hash_one(session);
        let inner = self.shard(hash).lock();
        let mut steps: Vec<Step<'_>> = match inner.find(session, hash) {
            Some(at) => inner.session(at).kept(ring).map(Slot::view).collect(),
            None => Vec::new(),
        };
        steps.sort_unstable_by_key(|step| step.seq);
        f(&steps)
    }

    /// The oldest kept step numbered `number`, given to `f` under its shard's lock.
    pub fn step<R>(
        &self,
        session: &str,
        number: u64,
        ring: usize,
        f: impl FnOnce(Option<Step<'_>>) -> R,
    ) -> R {
        let hash = self.hasher.hash_one(session);
        let inner = self.shard(hash).lock();
        let step = inner.find(session, hash).and_then(|at| {
            inner
                .session(at)
                .kept(ring)
                .filter(|slot| slot.number == number)
                .min_by_key(|slot| slot.seq)
                .map(Slot::view)
        });
        f(step)
    }

    /// The session's message count and when it last sent one (Unix ms).
    pub fn head(&self, session: &str) -> Option<(u64, i64)> {
        let hash = self.hasher.hash_one(session);
        let inner = self.shard(hash).lock();
        inner.find(session, hash).map(|at| {
            let session = inner.slab[at as usize].as_ref().expect("indexed");
            (session.seq, session.at_ms)
        })
    }

    /// Sessions held and envelope bytes kept.
    pub fn stats(&self) -> (usize, u64) {
        (
            self.sessions.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// Drops the least recently seen sessions until at most `keep_sessions` are held
    /// and at most `keep_bytes` kept, within `budget` (see [`Self::sweep`]). Holds
    /// every shard's lock while it unlinks them (the budget bounds how long).
    pub fn trim(&self, keep_sessions: usize, keep_bytes: u64, budget: usize) -> Dropped {
        let mut dropped: Vec<Session<D>> = Vec::new();
        let mut spent = 0;
        let done = {
            let mut shards: Vec<_> = self.shards.iter().map(|shard| shard.lock()).collect();
            loop {
                let (sessions, bytes) = self.stats();
                if sessions <= keep_sessions && bytes <= keep_bytes {
                    break true;
                }
                // The shard whose least recently seen session is the oldest.
                let oldest = shards
                    .iter()
                    .enumerate()
                    .filter(|(_, inner)| inner.head != NIL)
                    .min_by_key(|(_, inner)| inner.session_at(inner.head).order)
                    .map(|(i, _)| i);
                let Some(i) = oldest else { break true };
                if spent >= budget {
                    break false;
                }
                let head = shards[i].head;
                let session = self.remove_at(&mut shards[i], head);
                spent += 1 + session.slots.iter().flatten().count();
                dropped.push(session);
            }
        };
        let sessions = dropped.len();
        drop(dropped);
        Dropped { sessions, done }
    }

    /// Drops the sessions last seen before `cutoff_ms`, oldest first in each shard,
    /// within `budget`: each session dropped costs 1 plus the envelopes it held
    /// (what freeing it costs), and the call stops once the budget is spent — so its
    /// time is bounded whatever the sessions and the ring's size.
    pub fn sweep(&self, cutoff_ms: i64, budget: usize) -> Dropped {
        let mut dropped: Vec<Session<D>> = Vec::new();
        let mut spent = 0;
        let mut done = true;
        for shard in self.shards.iter() {
            let mut inner = shard.lock();
            while inner.head != NIL && inner.session_at(inner.head).at_ms < cutoff_ms {
                if spent >= budget {
                    done = false;
                    break;
                }
                let head = inner.head;
                let session = self.remove_at(&mut inner, head);
                spent += 1 + session.slots.iter().flatten().count();
                dropped.push(session);
            }
            drop(inner);
            if !done {
                break;
            }
        }
        let sessions = dropped.len();
        drop(dropped);
        Dropped { sessions, done }
    }

    /// Drops the session, if held; true if it was.
    pub fn remove(&self, session: &str) -> bool {
        let hash = self.hasher.hash_one(session);
        let removed = {
            let mut inner = self.shard(hash).lock();
            inner
                .find(session, hash)
                .map(|at| self.remove_at(&mut inner, at))
        };
        removed.is_some()
    }

    /// Unlinks the session from its shard and takes it off the totals.
    fn remove_at(&self, inner: &mut Inner<D>, at: u32) -> Session<D> {
        let session = inner.remove(at);
        let bytes: u64 = session
            .slots
            .iter()
            .flatten()
            .map(|slot| slot.envelope.bytes as u64)
            .sum();
        self.sessions.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        session
    }
}

impl<D: AsRef<[u8]>> Slot<D> {
    fn view(&self) -> Step<'_> {
        Step {
            seq: self.seq,
            number: self.number,
            at_ms: self.at_ms,
            kind: self.envelope.kind,
            score: self.envelope.score,
            data: self.envelope.data.as_ref(),
        }
    }
}

impl<D> Session<D> {
    /// The slots a ring of `ring` shows, in slot order.
    fn kept(&self, ring: usize) -> impl Iterator<Item = &Slot<D>> {
        self.slots.iter().take(ring.max(1)).flatten()
    }
}

impl<D> Inner<D> {
    /// The session at slab index `at` (found by `find`).
    fn session(&self, at: u32) -> &Session<D> {
        self.slab[at as usize].as_ref().expect("indexed")
    }

    fn find(&self, key: &str, hash: u64) -> Option<u32> {
        self.index
            .find(hash, |&at| {
                self.slab[at as usize]
                    .as_ref()
                    .expect("indexed")
                    .key
                    .as_bytes()
                    == key.as_bytes()
            })
            .copied()
    }

    /// The session's slab index, inserting it (at the end of the order) if new.
    fn find_or_insert(&mut self, key: &str, hash: u64) -> (u32, bool) {
        if let Some(at) = self.find(key, hash) {
            return (at, false);
        }
        let session = Session {
            key: Key::new(key),
            hash,
            seq: 0,
            at_ms: 0,
            order: 0,
            slots: Vec::new(),
        };
        let at = match self.free.pop() {
            Some(at) => {
                self.slab[at as usize] = Some(session);
                at
            }
            None => {
                self.slab.push(Some(session));
                self.links.push([NIL, NIL]);
                (self.slab.len() - 1) as u32
            }
        };
        let slab = &self.slab;
        self.index.insert_unique(hash, at, |&i| {
            slab[i as usize].as_ref().expect("indexed").hash
        });
        self.link_last(at);
        (at, true)
    }

    /// Moves the session to the end of the order (the most recently seen).
    fn touch(&mut self, at: u32) {
        if self.tail != at {
            self.unlink(at);
            self.link_last(at);
        }
    }

    fn remove(&mut self, at: u32) -> Session<D> {
        self.unlink(at);
        let session = self.slab[at as usize].take().expect("held");
        if let Ok(entry) = self.index.find_entry(session.hash, |&i| i == at) {
            entry.remove();
        }
        self.free.push(at);
        session
    }

    fn session_at(&self, at: u32) -> &Session<D> {
        self.slab[at as usize].as_ref().expect("linked")
    }

    fn unlink(&mut self, at: u32) {
        let [prev, next] = std::mem::replace(&mut self.links[at as usize], [NIL, NIL]);
        match prev {
            NIL => {
                if self.head == at {
                    self.head = next;
                }
            }
            prev => self.links[prev as usize][1] = next,
        }
        match next {
            NIL => {
                if self.tail == at {
                    self.tail = prev;
                }
            }
            next => self.links[next as usize][0] = prev,
        }
    }

    fn link_last(&mut self, at: u32) {
        let tail = self.tail;
        self.links[at as usize] = [tail, NIL];
        match tail {
            NIL => self.head = at,
            tail => self.links[tail as usize][1] = at,
        }
        self.tail = at;
    }
}

/// A kept text's bytes for `put_with`: copied into the buffer of the slot it
/// replaces when that one holds it and is not much larger, so a session's full ring
/// allocates nothing. Else a new buffer, with room for a text up to 1/16 longer
/// ([`HEADROOM`]): a slot's next text is often a few bytes longer than its last (an
/// id or a count with one more digit), and growing an exact-size buffer in place
/// reallocated it, copying the dead text over from memory the caches no longer held
/// (~1–2 µs a 4 KiB step in `bench/ingest_breakdown.exs`). The replaced buffer, when
/// not reused, is left in `replaced` to be freed after the lock. (Holding the
/// caller's Erlang binary instead takes a process-independent environment per text:
/// ~2.5 KiB of memory besides, and slower than the copy; see docs/ingest-cost.md.)
pub fn copy_into(replaced: &mut Option<Vec<u8>>, text: &[u8]) -> Vec<u8> {
    let mut buf = match replaced.take() {
        Some(buf) if (text.len()..=2 * text.len()).contains(&buf.capacity()) => buf,
        other => {
            *replaced = other;
            Vec::with_capacity(text.len() + text.len() / HEADROOM)
        }
    };
    buf.clear();
    buf.extend_from_slice(text);
    buf
}

/// A new buffer has room for its text and 1/HEADROOM more.
pub const HEADROOM: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(s: &str) -> Envelope {
        Envelope {
            kind: Kind::Json,
            score: Score::Agent,
            data: s.as_bytes().into(),
            bytes: s.len(),
        }
    }

    fn texts(log: &SessionLog, session: &str, ring: usize) -> Vec<String> {
        log.steps(session, ring, |steps| {
            steps
                .iter()
                .map(|s| String::from_utf8(s.data.to_vec()).unwrap())
                .collect()
        })
    }

    #[test]
    fn a_ring_keeps_the_last_messages_oldest_first_with_their_numbers_and_times() {
        let log = SessionLog::new();
        for (i, t) in ["a", "bb", "ccc", "dddd"].iter().enumerate() {
            let put = log.put("s", text(t), Some(10 + i as u64), 3, u64::MAX, || {
                100 + i as i64
            });
            assert_eq!(put.seq, i as u64 + 1);
            assert_eq!(put.new_session, i == 0);
        }
        assert_eq!(texts(&log, "s", 3), ["bb", "ccc", "dddd"]);
        assert_eq!(log.stats(), (1, 9));
        assert_eq!(log.head("s"), Some((4, 103)));
        assert_eq!(log.head("t"), None);
        let numbers = log.steps("s", 3, |s| {
            s.iter().map(|s| (s.number, s.at_ms)).collect::<Vec<_>>()
        });
        assert_eq!(numbers, [(11, 101), (12, 102), (13, 103)]);
        assert_eq!(
            log.step("s", 12, 3, |s| s.map(|s| s.data.to_vec())),
            Some(b"ccc".to_vec())
        );
        assert!(!log.step("s", 10, 3, |s| s.is_some()));
        // No number: the session's count.
        log.put("s", text("e"), None, 3, u64::MAX, || 200);
        assert_eq!(log.step("s", 5, 3, |s| s.map(|s| s.seq)), Some(5));
    }

    #[test]
    fn a_time_earlier_than_its_shards_latest_is_raised_to_it_so_the_order_and_times_agree() {
        let log = SessionLog::new();
        let shard = |id: &str| (log.hasher.hash_one(id) >> 40) as usize % SHARDS;
        // Two sessions of one shard, and one of another.
        let first = "s0".to_string();
        let ids: Vec<String> = (1..10_000).map(|i| format!("s{i}")).collect();
        let same = ids.iter().find(|id| shard(id) == shard(&first)).unwrap();
        let other = ids.iter().find(|id| shard(id) != shard(&first)).unwrap();
        log.put(&first, text("a"), None, 3, u64::MAX, || 100);
        // Times read before the lock: the later put carries the earlier time.
        log.put(same, text("b"), None, 3, u64::MAX, || 90);
        assert_eq!(log.head(same), Some((1, 100)));
        log.put(same, text("c"), None, 3, u64::MAX, || 120);
        assert_eq!(log.head(same), Some((2, 120)));
        // Another shard's times are its own.
        log.put(other, text("d"), None, 3, u64::MAX, || 50);
        assert_eq!(log.head(other), Some((1, 50)));
        // The sweep, which reads each shard's sessions oldest first, drops by them.
        assert_eq!(log.sweep(101, usize::MAX).sessions, 2);
        assert_eq!(log.head(same), Some((2, 120)));
    }

    #[test]
    fn put_with_is_given_the_data_of_the_slot_it_replaces_and_frees_what_it_leaves() {
        let log: SessionLog<Vec<u8>> = SessionLog::new();
        let mut given = Vec::new();
        for t in ["a", "bb", "ccc"] {
            log.put_with(
                "s",
                |replaced| {
                    given.push(replaced.clone());
                    let mut buf = replaced.take().unwrap_or_default();
                    buf.clear();
                    buf.extend_from_slice(t.as_bytes());
                    Envelope {
                        kind: Kind::Json,
                        score: Score::Agent,
                        data: buf,
                        bytes: t.len(),
                    }
                },
                None,
                2,
                u64::MAX,
                || 0,
            );
        }
        // Slots 1, 0, then 1 again: the third put gets the first's bytes to write over.
        assert_eq!(given, [None, None, Some(b"a".to_vec())]);
        let kept = log.steps("s", 2, |steps| {
            steps.iter().map(|s| s.data.to_vec()).collect::<Vec<_>>()
        });
        assert_eq!(kept, [b"bb".to_vec(), b"ccc".to_vec()]);
        assert_eq!(log.stats(), (1, 5));
    }

    #[test]
    fn a_copy_reuses_the_replaced_buffer_unless_it_is_over_twice_the_text() {
        let mut replaced = Some(Vec::with_capacity(64));
        let at = replaced.as_ref().map(|b| b.as_ptr());
        let kept = copy_into(&mut replaced, &[7; 40]);
        assert_eq!(kept, vec![7; 40]);
        assert_eq!(
            Some(kept.as_ptr()),
            at,
            "the replaced buffer is written over"
        );
        assert!(replaced.is_none());

        let mut replaced = Some(Vec::with_capacity(4096));
        let kept = copy_into(&mut replaced, b"short");
        assert_eq!(kept, b"short");
        assert_eq!(
            kept.capacity(),
            5 + 5 / HEADROOM,
            "a buffer of the text's size and its headroom"
        );
        assert_eq!(
            replaced.map(|b| b.capacity()),
            Some(4096),
            "left to be freed"
        );

        let kept = copy_into(&mut None, b"first");
        assert_eq!(
            (kept.as_slice(), kept.capacity()),
            (&b"first"[..], 5 + 5 / HEADROOM)
        );
    }

    #[test]
    fn a_new_buffer_has_headroom_so_a_slightly_longer_next_text_is_written_over_it() {
        let text = vec![1u8; 4096];
        let kept = copy_into(&mut None, &text);
        assert_eq!(kept, text);
        assert!(kept.capacity() >= 4096 + 4096 / HEADROOM);

        // The slot's next text, 200 bytes longer: the same buffer.
        let at = kept.as_ptr();
        let mut replaced = Some(kept);
        let longer = vec![2u8; 4296];
        let kept = copy_into(&mut replaced, &longer);
        assert_eq!(kept, longer);
        assert_eq!(kept.as_ptr(), at, "written over, not reallocated");
        assert!(replaced.is_none());
    }

    #[test]
    fn a_text_longer_than_the_replaced_buffer_gets_a_new_one_and_the_old_is_left_to_free() {
        // Growing the old buffer would copy its dead bytes: it is left whole in
        // `replaced` (freed after the lock) and the text goes to a new buffer.
        let mut replaced = Some(vec![9u8; 1000]);
        let old = replaced.as_ref().map(|b| (b.as_ptr(), b.capacity()));
        let text = vec![3u8; 1500];
        let kept = copy_into(&mut replaced, &text);
        assert_eq!(kept, text);
        assert!(kept.capacity() >= 1500 + 1500 / HEADROOM);
        assert_eq!(replaced.as_ref().map(|b| (b.as_ptr(), b.capacity())), old);
        assert_eq!(replaced.map(|b| b.len()), Some(1000), "untouched");
    }

    #[test]
    fn the_oldest_step_of_a_number_is_the_one_found() {
        let log = SessionLog::new();
        log.put("s", text("first"), Some(7), 5, u64::MAX, || 1);
        log.put("s", text("second"), Some(7), 5, u64::MAX, || 2);
        assert_eq!(
            log.step("s", 7, 5, |s| s.map(|s| s.data.to_vec())),
            Some(b"first".to_vec())
        );
    }

    #[test]
    fn a_ring_resized_keeps_what_the_slots_layout_gives_and_frees_what_falls_off() {
        let log = SessionLog::new();
        log.put("s", text("1"), None, 2, u64::MAX, || 0);
        log.put("s", text("22"), None, 2, u64::MAX, || 0);
        // Message 3 of a ring of 3 goes to slot 0, which message 2 took.
        log.put("s", text("333"), None, 3, u64::MAX, || 0);
        assert_eq!(texts(&log, "s", 3), ["1", "333"]);
        assert_eq!(log.stats().1, 4);
        // Shrunk to 1: the next put frees every other slot.
        log.put("s", text("4444"), None, 1, u64::MAX, || 0);
        assert_eq!(texts(&log, "s", 1), ["4444"]);
        assert_eq!(log.stats().1, 4);
    }

    #[test]
    fn a_put_over_the_byte_cap_says_so_and_the_trim_drops_the_least_recently_seen() {
        let log = SessionLog::new();
        for s in ["a", "b", "c", "d"] {
            assert!(!log.put(s, text("xxxx"), None, 5, 16, || 0).over_bytes);
        }
        // "a" seen again: "b" is now the least recently seen.
        assert!(log.put("a", text("y"), None, 5, 16, || 0).over_bytes);
        assert_eq!(
            log.trim(10, 13, 100),
            Dropped {
                sessions: 1,
                done: true
            }
        );
        assert_eq!(log.head("b"), None);
        assert_eq!(log.stats(), (3, 13));
        assert_eq!(
            log.trim(1, u64::MAX, 1),
            Dropped {
                sessions: 1,
                done: false
            }
        );
        assert_eq!(
            log.trim(1, u64::MAX, 1),
            Dropped {
                sessions: 1,
                done: true
            }
        );
        assert!(log.head("a").is_some(), "the most recently seen stays");
        assert_eq!(log.stats(), (1, 5));
    }

    #[test]
    fn the_sweep_budget_counts_each_session_and_each_of_its_envelopes() {
        let log = SessionLog::new();
        for s in ["a", "b", "c"] {
            for _ in 0..3 {
                log.put(s, text("x"), None, 5, u64::MAX, || 0);
            }
        }
        // A session of three envelopes spends 4 of the budget: 4 stops after one.
        let first = log.sweep(100, 4);
        assert_eq!((first.sessions, first.done), (1, false));
        let rest = log.sweep(100, 8);
        assert_eq!((rest.sessions, rest.done), (2, true));
        assert_eq!(log.stats(), (0, 0));
    }

    #[test]
    fn the_sweep_drops_sessions_idle_since_the_cutoff_in_chunks() {
        let log = SessionLog::new();
        for (i, s) in ["a", "b", "c"].iter().enumerate() {
            log.put(s, text("x"), None, 5, u64::MAX, || i as i64 * 10);
        }
        assert_eq!(
            log.sweep(15, 1),
            Dropped {
                sessions: 1,
                done: false
            }
        );
        assert_eq!(
            log.sweep(15, 1),
            Dropped {
                sessions: 1,
                done: true
            }
        );
        assert_eq!(
            log.sweep(15, 1),
            Dropped {
                sessions: 0,
                done: true
            }
        );
        assert_eq!(log.stats(), (1, 1));
        assert!(log.remove("c"));
        assert!(!log.remove("c"));
        assert_eq!(log.stats(), (0, 0));
        // The slab's slots are reused.
        log.put("d", text("x"), None, 5, u64::MAX, || 0);
        assert_eq!(log.stats(), (1, 1));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Put {
            session: u8,
            len: u8,
            ring: u8,
        },
        Trim {
            keep_sessions: u8,
            keep_bytes: u16,
            budget: u8,
        },
        Sweep {
            cutoff: u8,
            budget: u8,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..6, 0u8..40, 1u8..5).prop_map(|(session, len, ring)| Op::Put { session, len, ring }),
            1 => (0u8..6, 0u16..300, 0u8..12)
                .prop_map(|(keep_sessions, keep_bytes, budget)| Op::Trim { keep_sessions, keep_bytes, budget }),
            1 => (0u8..60, 0u8..12).prop_map(|(cutoff, budget)| Op::Sweep { cutoff, budget }),
        ]
    }

    /// A session of the model: its key, message count, last time and slots.
    type ModelSession = (
        String,
        u64,
        i64,
        std::collections::BTreeMap<usize, (u64, String)>,
    );

    /// The model: each session a list of every message (seq, text) it sent and its
    /// slots as the ETS layout kept them; the order a list of sessions.
    #[derive(Default)]
    struct Model {
        sessions: Vec<ModelSession>,
    }

    impl Model {
        fn bytes(&self) -> u64 {
            self.sessions
                .iter()
                .flat_map(|s| s.3.values())
                .map(|(_, t)| t.len() as u64)
                .sum()
        }
    }

    proptest! {
        #[test]
        fn a_slot_written_over_and_over_keeps_each_text_in_a_buffer_of_bounded_size(
            lens in proptest::collection::vec(0usize..3000, 1..40)
        ) {
            let mut slot: Option<Vec<u8>> = None;
            for (i, len) in lens.into_iter().enumerate() {
                let text = vec![i as u8; len];
                let mut replaced = slot.take();
                let kept = copy_into(&mut replaced, &text);
                prop_assert_eq!(&kept, &text);
                // Never more than twice the text, or a new buffer's headroom.
                prop_assert!(kept.capacity() <= (2 * len).max(len + len / HEADROOM));
                // What was not reused is left to be freed, whole.
                if let Some(old) = replaced {
                    prop_assert!(old.as_ptr() != kept.as_ptr() || old.capacity() == 0);
                }
                slot = Some(kept);
            }
        }

        #[test]
        fn the_log_behaves_like_a_list_of_rings_with_its_caps(ops in proptest::collection::vec(op(), 1..120)) {
            let log = SessionLog::new();
            let mut model = Model::default();
            let mut clock = 0i64;
            let max_bytes = 200u64;
            let mut last_ring = 1usize;
            for op in ops {
                match op {
                    Op::Put { session, len, ring } => {
                        clock += 1;
                        let ring = ring as usize;
                        last_ring = ring;
                        let key = format!("s{session}");
                        let t = "x".repeat(len as usize) + &clock.to_string();
                        let put = log.put(&key, text(&t), None, ring, max_bytes, || clock);
                        let pos = model.sessions.iter().position(|s| s.0 == key);
                        let mut entry = match pos {
                            Some(p) => model.sessions.remove(p),
                            None => (key.clone(), 0, 0, Default::default()),
                        };
                        prop_assert_eq!(put.new_session, pos.is_none());
                        entry.1 += 1;
                        entry.2 = clock;
                        entry.3.retain(|&i, _| i < ring);
                        entry.3.insert((entry.1 % ring as u64) as usize, (entry.1, t));
                        prop_assert_eq!(put.seq, entry.1);
                        model.sessions.push(entry);
                        prop_assert_eq!(put.bytes, model.bytes());
                        prop_assert_eq!(put.over_bytes, model.bytes() > max_bytes);
                        if put.new_session {
                            prop_assert_eq!(put.sessions, model.sessions.len());
                        }
                    }
                    Op::Trim { keep_sessions, keep_bytes, budget } => {
                        let got = log.trim(keep_sessions as usize, keep_bytes as u64, budget as usize);
                        let (mut n, mut spent) = (0, 0);
                        while (model.sessions.len() > keep_sessions as usize || model.bytes() > keep_bytes as u64)
                            && spent < budget as usize
                        {
                            spent += 1 + model.sessions.remove(0).3.len();
                            n += 1;
                        }
                        let done = !(model.sessions.len() > keep_sessions as usize || model.bytes() > keep_bytes as u64);
                        prop_assert_eq!(got, Dropped { sessions: n, done });
                    }
                    Op::Sweep { cutoff, budget } => {
                        let got = log.sweep(cutoff as i64, budget as usize);
                        // Shard by shard: which idle sessions a call within its budget
                        // drops depends on the shards; each dropped one was idle, the
                        // budget was spent if any idle one is left, and none is once done.
                        let (gone, kept): (Vec<_>, Vec<_>) =
                            model.sessions.drain(..).partition(|s| log.head(&s.0).is_none());
                        model.sessions = kept;
                        prop_assert!(gone.iter().all(|s| s.2 < cutoff as i64));
                        prop_assert_eq!(got.sessions, gone.len());
                        let spent: usize = gone.iter().map(|s| 1 + s.3.len()).sum();
                        let idle_left = model.sessions.iter().any(|s| s.2 < cutoff as i64);
                        prop_assert_eq!(got.done, !idle_left);
                        if idle_left {
                            prop_assert!(spent >= budget as usize);
                        }
                    }
                }
                prop_assert_eq!(log.stats(), (model.sessions.len(), model.bytes()));
                for (key, seq, at, slots) in &model.sessions {
                    prop_assert_eq!(log.head(key), Some((*seq, *at)));
                    let mut kept: Vec<(u64, String)> =
                        slots.iter().filter(|(&i, _)| i < last_ring).map(|(_, v)| v.clone()).collect();
                    kept.sort();
                    let got = log.steps(key, last_ring, |steps| {
                        steps.iter().map(|s| (s.seq, String::from_utf8(s.data.to_vec()).unwrap())).collect::<Vec<_>>()
                    });
                    prop_assert_eq!(got, kept);
                }
            }
        }
    }
}
