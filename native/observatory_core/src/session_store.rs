//! The sharded session store behind `EntropyTracker`.
//!
//! One [`Window`] per session id, each session in one of N shards chosen by a keyed
//! hash of its id, each shard behind its own mutex: two schedulers recording for
//! different sessions almost never wait for each other. Per message the work is one
//! hash of the session id (reused for the shard and the table), a lock, an interned
//! tuple lookup and a ring-buffer push.
//!
//! Memory is bounded two ways (design.md §2): sessions idle for longer than a TTL are
//! dropped by [`Store::sweep`], and each shard holds at most its share of
//! `max_sessions`, evicting its least recently seen sessions first when full.
//! A dropped session is the same as UC-0250 F1: its next message starts a fresh window.
//!
//! Time is a coarse clock the owner advances with [`Store::tick`]: reading the OS
//! clock on every message would cost more than the rest of the call, and idle
//! expiry only needs the resolution of a tick.
//!
//! Hashing uses std's keyed SipHash: session ids come from clients, and a predictable
//! hash would let one agent degrade every shard (HashDoS). A session id is hashed as
//! the other per-session stores hash it ([`key_hash`]), so that the scoring call
//! hashes it once for all of them.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use hashbrown::HashTable;
use parking_lot::Mutex;

use crate::interner::{Id, Interner};
use crate::keyed_store::{key_hash, InlineStr};
use crate::severity::{round4, Severity, Thresholds};
use crate::window::Window;
use crate::Error;

/// `session_id` and `agent_id`: 1–256 bytes (design.md §3).
pub const MAX_ID_BYTES: usize = 256;
/// `intent` and `tool_call`: at most 1 KiB (design.md §3).
pub const MAX_FIELD_BYTES: usize = 1024;
/// Upper bound on a configured window size.
pub const MAX_WINDOW_SIZE: usize = 1024;

/// One `{intent, tool_call, action_status}` tuple; `status` is the caller's code for
/// an action status from its fixed set. The strings are inline when short (most are):
/// a step compares its tuple with the interned one without two more cache misses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub intent: InlineStr,
    pub tool_call: InlineStr,
    pub status: u8,
}

/// One step of one session, borrowed from the caller's buffers.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    pub session_id: &'a [u8],
    pub intent: &'a [u8],
    pub tool_call: &'a [u8],
    pub status: u8,
    /// The session's agent; remembered once seen, so later steps may omit it.
    pub agent_id: Option<&'a [u8]>,
}

/// Settings read by the caller on every call (FR-9.11).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub window_size: usize,
    pub thresholds: Thresholds,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            window_size: 5,
            thresholds: Thresholds::default(),
        }
    }
}

/// The result of recording one step, borrowed from the store while its shard is
/// locked: the caller encodes what it needs without copying strings first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored<'a> {
    /// Uniqueness ratio rounded to 4 places.
    pub score: f64,
    pub severity: Severity,
    /// Severity after the session's previous step; `None` for a new window.
    pub previous: Option<Severity>,
    pub window_len: usize,
    /// Present whenever the caller has something to broadcast: the session is in
    /// WARNING or LOOP now, or has just left one of them.
    pub detail: Option<Detail<'a>>,
}

/// What a broadcast needs, read under the same lock as the score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Detail<'a> {
    pub agent_id: Option<&'a str>,
    /// The most frequent tuple in the window and its count (FR-9.7).
    pub repeated: &'a Tuple,
    pub occurrences: usize,
}

/// A copy of one session's state, for inspection.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionView {
    /// Oldest first.
    pub window: Vec<Tuple>,
    pub agent_id: Option<String>,
    pub score: f64,
    pub severity: Severity,
    pub last_seen_ms: i64,
}

/// One line of [`Store::list`].
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSummary {
    pub session_id: String,
    pub agent_id: Option<String>,
    pub score: f64,
    pub severity: Severity,
    pub last_seen_ms: i64,
}

/// Counters since the store was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub sessions: usize,
    pub evicted_over_capacity: u64,
    pub expired: u64,
}

/// A session id, kept inside the session record when it is short (most are: uuids,
/// "sess-…"): comparing it then touches no other cache line.
enum SessionKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

const INLINE_KEY: usize = 38;

impl SessionKey {
    fn new(id: &[u8]) -> Self {
        if id.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..id.len()].copy_from_slice(id);
            Self::Inline {
                len: id.len() as u8,
                bytes,
            }
        } else {
            Self::Heap(id.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(bytes) => bytes,
        }
    }
}

struct Session {
    key: SessionKey,
    window: Window,
    agent: Option<Id>,
    severity: Severity,
    last_seen_ms: i64,
    /// Shard-local recency counter; unique, so least-recently-seen order is exact.
    touch: u64,
}

#[derive(Default)]
struct Shard {
    sessions: HashTable<Session>,
    tuples: Interner<Tuple>,
    /// Inline when short, as the tuples' strings: a step checks that its agent is
    /// the session's without following a pointer.
    agents: Interner<InlineStr>,
    clock: u64,
}

/// Most recently seen first; `touch` breaks ties within a shard.
fn newer_first(a: &Session, b: &Session) -> std::cmp::Ordering {
    b.last_seen_ms
        .cmp(&a.last_seen_ms)
        .then(b.touch.cmp(&a.touch))
}

/// Sessions' windows, sharded and bounded. `Sync`: share it between threads.
pub struct Store {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    max_per_shard: usize,
    now_ms: AtomicI64,
    evicted_over_capacity: AtomicU64,
    expired: AtomicU64,
}

impl Store {
    /// A store of `shards` shards holding at most about `max_sessions` sessions
    /// (each shard holds at most `ceil(max_sessions / shards)`).
    pub fn new(shards: usize, max_sessions: usize) -> Self {
        let shards = shards.max(1);
        Self {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            max_per_shard: max_sessions.div_ceil(shards).max(1),
            now_ms: AtomicI64::new(0),
            evicted_over_capacity: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Advances the store's clock; steps recorded from now on are seen at `now_ms`.
    pub fn tick(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Records one step and scores the session's window (FR-9.2–9.6, UC-0250), then
    /// hands the result to `f` while the session's shard is still locked.
    /// On error nothing is changed and `f` is not called.
    pub fn record<R>(
        &self,
        obs: &Observation<'_>,
        settings: &Settings,
        f: impl FnOnce(Scored<'_>) -> R,
    ) -> Result<R, Error> {
        self.record_hashed(obs, key_hash(obs.session_id), settings, f)
    }

    /// [`record`](Self::record) with the session id's hash as [`key_hash`] gave it.
    pub fn record_hashed<R>(
        &self,
        obs: &Observation<'_>,
        hash: u64,
        settings: &Settings,
        f: impl FnOnce(Scored<'_>) -> R,
    ) -> Result<R, Error> {
        debug_assert_eq!(hash, key_hash(obs.session_id), "not the session's hash");
        let intent = field(obs.intent)?;
        let tool_call = field(obs.tool_call)?;
        let session_id = id_bytes(obs.session_id, Error::InvalidSessionId)?.as_bytes();
        let agent_id = obs
            .agent_id
            .map(|a| id_bytes(a, Error::InvalidAgentId))
            .transpose()?;
        if settings.window_size == 0 || settings.window_size > MAX_WINDOW_SIZE {
            return Err(Error::InvalidWindowSize);
        }

        let mut guard = self.shard(hash).lock();
        let shard = &mut *guard;
        shard.clock += 1;
        let touch = shard.clock;
        let now_ms = self.now_ms.load(Ordering::Relaxed);

        let is_new = shard
            .sessions
            .find(hash, |s| s.key.as_bytes() == session_id)
            .is_none();
        if is_new && shard.sessions.len() >= self.max_per_shard {
            let batch = (self.max_per_shard / 64).max(1);
            let evicted = shard.evict_least_recent(batch);
            self.evicted_over_capacity
                .fetch_add(evicted as u64, Ordering::Relaxed);
        }
        let Shard {
            sessions,
            tuples,
            agents,
            ..
        } = shard;
        let session = if is_new {
            let fresh = Session {
                key: SessionKey::new(session_id),
                window: Window::default(),
                agent: None,
                severity: Severity::Normal,
                last_seen_ms: now_ms,
                touch,
            };
            // The hash is not stored (8 bytes a session): a resize recomputes it.
            sessions
                .insert_unique(hash, fresh, |s| key_hash(s.key.as_bytes()))
                .into_mut()
        } else {
            sessions
                .find_mut(hash, |s| s.key.as_bytes() == session_id)
                .expect("found above, under the same lock")
        };
        let previous = (!is_new).then_some(session.severity);

        if let Some(agent_id) = agent_id {
            let same = session
                .agent
                .is_some_and(|id| agents.get(id).as_bytes() == agent_id.as_bytes());
            if !same {
                let new = agents.acquire(
                    self.hasher.hash_one(agent_id),
                    |k| k.as_bytes() == agent_id.as_bytes(),
                    || InlineStr::new(agent_id),
                );
                if let Some(old) = session.agent.replace(new) {
                    agents.release(old);
                }
            }
        }

        let tuple_id = tuples.acquire(
            self.hasher.hash_one((intent, tool_call, obs.status)),
            |t| {
                t.intent.as_bytes() == intent.as_bytes()
                    && t.tool_call.as_bytes() == tool_call.as_bytes()
                    && t.status == obs.status
            },
            || Tuple {
                intent: InlineStr::new(intent),
                tool_call: InlineStr::new(tool_call),
                status: obs.status,
            },
        );
        session
            .window
            .push(tuple_id, settings.window_size, |old| tuples.release(old));

        let score = round4(session.window.uniqueness());
        let severity = settings.thresholds.classify(score);
        session.severity = severity;
        session.last_seen_ms = now_ms;
        session.touch = touch;

        let broadcast =
            severity != Severity::Normal || previous.is_some_and(|p| p != Severity::Normal);
        let detail = broadcast.then(|| {
            let (repeated, occurrences) = session
                .window
                .most_frequent()
                .expect("the window holds the step just pushed");
            Detail {
                agent_id: session.agent.map(|id| &**agents.get(id)),
                repeated: tuples.get(repeated),
                occurrences,
            }
        });

        Ok(f(Scored {
            score,
            severity,
            previous,
            window_len: session.window.len(),
            detail,
        }))
    }

    /// A copy of one session's state, or `None` if it has no window.
    pub fn session(&self, session_id: &[u8]) -> Option<SessionView> {
        let hash = key_hash(session_id);
        let shard = self.shard(hash).lock();
        let s = shard
            .sessions
            .find(hash, |s| s.key.as_bytes() == session_id)?;
        Some(SessionView {
            window: s
                .window
                .iter()
                .map(|id| shard.tuples.get(id).clone())
                .collect(),
            agent_id: s.agent.map(|id| shard.agents.get(id).to_string()),
            score: round4(s.window.uniqueness()),
            severity: s.severity,
            last_seen_ms: s.last_seen_ms,
        })
    }

    /// Up to `limit` sessions, most recently seen first: `(session_id, agent_id,
    /// score, severity, last_seen_ms)`. Visits every shard; for dashboards, not for
    /// the hot path.
    pub fn list(&self, limit: usize) -> Vec<SessionSummary> {
        let mut all: Vec<(u64, SessionSummary)> = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            // Only this shard's newest `limit` are copied out: a fleet of a million
            // sessions costs one pass over references, not a million summaries.
            let mut newest: Vec<&Session> = shard.sessions.iter().collect();
            if newest.len() > limit && limit > 0 {
                newest.select_nth_unstable_by(limit - 1, |a, b| newer_first(a, b));
            }
            newest.truncate(limit);
            all.extend(newest.into_iter().map(|s| {
                let summary = SessionSummary {
                    session_id: String::from_utf8_lossy(s.key.as_bytes()).into_owned(),
                    agent_id: s.agent.map(|id| shard.agents.get(id).to_string()),
                    score: round4(s.window.uniqueness()),
                    severity: s.severity,
                    last_seen_ms: s.last_seen_ms,
                };
                (s.touch, summary)
            }));
        }
        all.sort_unstable_by(|a, b| b.1.last_seen_ms.cmp(&a.1.last_seen_ms).then(b.0.cmp(&a.0)));
        all.into_iter().take(limit).map(|(_, s)| s).collect()
    }

    /// Drops one session's window. Returns whether it existed.
    pub fn forget(&self, session_id: &[u8]) -> bool {
        let hash = key_hash(session_id);
        let mut guard = self.shard(hash).lock();
        let shard = &mut *guard;
        match shard
            .sessions
            .find_entry(hash, |s| s.key.as_bytes() == session_id)
        {
            Ok(found) => {
                let (session, _) = found.remove();
                release(session, &mut shard.tuples, &mut shard.agents);
                true
            }
            Err(_) => false,
        }
    }

    /// Advances the clock to `now_ms` and drops every session not seen for `ttl_ms`
    /// or longer; returns how many. Locks one shard at a time, so recording goes on in
    /// the others.
    pub fn sweep(&self, now_ms: i64, ttl_ms: u64) -> usize {
        self.tick(now_ms);
        let ttl_ms = i64::try_from(ttl_ms).unwrap_or(i64::MAX);
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            dropped += shard.drop_where(|s| now_ms.saturating_sub(s.last_seen_ms) >= ttl_ms);
        }
        self.expired.fetch_add(dropped as u64, Ordering::Relaxed);
        dropped
    }

    /// Number of sessions with a window.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().sessions.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> Stats {
        Stats {
            sessions: self.len(),
            evicted_over_capacity: self.evicted_over_capacity.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
        }
    }

    /// Distinct interned tuples across shards (for memory tests).
    pub fn interned_tuples(&self) -> usize {
        self.shards.iter().map(|s| s.lock().tuples.len()).sum()
    }

    /// Distinct interned agent ids across shards (for memory tests).
    pub fn interned_agents(&self) -> usize {
        self.shards.iter().map(|s| s.lock().agents.len()).sum()
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        // The table inside a shard uses the low bits of the same hash: pick the shard
        // with the high bits so the two stay independent.
        let index = ((hash >> 32) as usize) % self.shards.len();
        &self.shards[index]
    }
}

impl Shard {
    /// Evicts the `count` least recently seen sessions (exact within the shard).
    fn evict_least_recent(&mut self, count: usize) -> usize {
        let mut touches: Vec<u64> = self.sessions.iter().map(|s| s.touch).collect();
        if count == 0 || touches.is_empty() {
            return 0;
        }
        let nth = count.min(touches.len()) - 1;
        let (_, &mut cutoff, _) = touches.select_nth_unstable(nth);
        self.drop_where(|s| s.touch <= cutoff)
    }

    fn drop_where(&mut self, doomed: impl Fn(&Session) -> bool) -> usize {
        let Shard {
            sessions,
            tuples,
            agents,
            ..
        } = self;
        let before = sessions.len();
        sessions.retain(|s| {
            if doomed(s) {
                s.window.drain(|id| tuples.release(id));
                if let Some(agent) = s.agent.take() {
                    agents.release(agent);
                }
                false
            } else {
                true
            }
        });
        before - sessions.len()
    }
}

fn release(mut session: Session, tuples: &mut Interner<Tuple>, agents: &mut Interner<InlineStr>) {
    session.window.drain(|id| tuples.release(id));
    if let Some(agent) = session.agent {
        agents.release(agent);
    }
}

fn field(bytes: &[u8]) -> Result<&str, Error> {
    if bytes.len() > MAX_FIELD_BYTES {
        return Err(Error::FieldTooLong);
    }
    std::str::from_utf8(bytes).map_err(|_| Error::InvalidUtf8)
}

fn id_bytes(bytes: &[u8], invalid: Error) -> Result<&str, Error> {
    if bytes.is_empty() || bytes.len() > MAX_ID_BYTES {
        return Err(invalid);
    }
    std::str::from_utf8(bytes).map_err(|_| Error::InvalidUtf8)
}

#[cfg(test)]
mod tests;
