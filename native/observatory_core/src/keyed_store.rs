//! A sharded, bounded map from session id to per-session state (`StepLoopDetector`s,
//! loop-verdict states).
//!
//! Same shape as the entropy store, without its interning: N shards, each a mutex over
//! a hash table, a coarse clock advanced by the owner, idle entries dropped by
//! [`KeyedStore::sweep`], and each shard capped at its share of `max_entries`
//! (the least recently seen evicted first when full). A key is hashed once per call
//! (keyed SipHash: keys come from clients), and the hash picks both the shard and the
//! bucket; entries keep their hash, so growing a table never rehashes a key.
//!
//! Every store hashes a key with the same random key ([`key_hash`]), so that a call
//! that finds one session in several stores (the scoring call: the entropy window,
//! the loop verdict, the step detector) hashes its id once (~25 ns each time).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;

use hashbrown::HashTable;
use parking_lot::Mutex;

struct Slot<T> {
    key: InlineStr,
    hash: u64,
    value: T,
    last_seen_ms: i64,
}

type Shard<T> = Mutex<HashTable<Slot<T>>>;

/// Bytes of a string kept inline rather than in an allocation of its own.
const INLINE_BYTES: usize = 30;

/// A string kept inline when short (session ids, agent ids, tool names and intents
/// usually are): whoever finds the struct holding it then compares it without a
/// second cache miss on a separate allocation. 32 bytes either way.
#[derive(Clone)]
pub enum InlineStr {
    Inline { len: u8, bytes: [u8; INLINE_BYTES] },
    Heap(Box<str>),
}

impl InlineStr {
    pub fn new(text: &str) -> Self {
        if text.len() <= INLINE_BYTES {
            let mut bytes = [0u8; INLINE_BYTES];
            bytes[..text.len()].copy_from_slice(text.as_bytes());
            InlineStr::Inline {
                len: text.len() as u8,
                bytes,
            }
        } else {
            InlineStr::Heap(text.into())
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            InlineStr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            InlineStr::Heap(text) => text.as_bytes(),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            // SAFETY: the bytes were copied whole from a `&str` (`new`).
            InlineStr::Inline { .. } => unsafe { std::str::from_utf8_unchecked(self.as_bytes()) },
            InlineStr::Heap(text) => text,
        }
    }
}

/// The session log's name for its keys (they are the same thing).
pub(crate) type Key = InlineStr;

impl std::ops::Deref for InlineStr {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for InlineStr {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for InlineStr {}

impl std::hash::Hash for InlineStr {
    /// As the `str` it holds.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl std::fmt::Debug for InlineStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// The keyed hash of a key (a session id) as every store hashes it: one random
/// SipHash key for the library, drawn when first used. A NIF library is never
/// upgraded in place, so every store it makes lives under that one key.
pub fn key_hash(key: &[u8]) -> u64 {
    static HASHER: OnceLock<RandomState> = OnceLock::new();
    HASHER.get_or_init(RandomState::new).hash_one(key)
}

/// Per-key state, sharded by a keyed hash of the key. `Sync` when `T: Send`.
pub struct KeyedStore<T> {
    shards: Box<[Shard<T>]>,
    max_per_shard: usize,
    now_ms: AtomicI64,
}

impl<T> KeyedStore<T> {
    pub fn new(shards: usize, max_entries: usize) -> Self {
        let shards = shards.max(1);
        Self {
            shards: (0..shards).map(|_| Mutex::new(HashTable::new())).collect(),
            max_per_shard: max_entries.div_ceil(shards).max(1),
            now_ms: AtomicI64::new(0),
        }
    }

    /// Advances the clock that stamps entries as seen.
    pub fn tick(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Runs `f` on the key's state, creating it with `make` first if absent.
    pub fn update<R>(&self, key: &str, make: impl FnOnce() -> T, f: impl FnOnce(&mut T) -> R) -> R {
        self.update_hashed(key, key_hash(key.as_bytes()), make, f)
    }

    /// [`update`](Self::update) with the key's hash as [`key_hash`] gave it.
    pub fn update_hashed<R>(
        &self,
        key: &str,
        hash: u64,
        make: impl FnOnce() -> T,
        f: impl FnOnce(&mut T) -> R,
    ) -> R {
        debug_assert_eq!(hash, key_hash(key.as_bytes()), "not the key's hash");
        let now_ms = self.now_ms.load(Ordering::Relaxed);
        let mut shard = self.shard(hash).lock();
        if let Some(slot) = shard.find_mut(hash, |s| s.key.as_bytes() == key.as_bytes()) {
            slot.last_seen_ms = now_ms;
            return f(&mut slot.value);
        }
        if shard.len() >= self.max_per_shard {
            evict_oldest(&mut shard, (self.max_per_shard / 64).max(1));
        }
        let slot = Slot {
            key: InlineStr::new(key),
            hash,
            value: make(),
            last_seen_ms: now_ms,
        };
        f(&mut shard.insert_unique(hash, slot, |s| s.hash).into_mut().value)
    }

    /// Runs `f` on the key's state if it exists.
    pub fn read<R>(&self, key: &str, f: impl FnOnce(&T) -> R) -> Option<R> {
        let hash = key_hash(key.as_bytes());
        self.shard(hash)
            .lock()
            .find(hash, |s| s.key.as_bytes() == key.as_bytes())
            .map(|slot| f(&slot.value))
    }

    /// Runs `f` on the key's state if it exists, without marking it as seen.
    pub fn modify<R>(&self, key: &str, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let hash = key_hash(key.as_bytes());
        self.shard(hash)
            .lock()
            .find_mut(hash, |s| s.key.as_bytes() == key.as_bytes())
            .map(|slot| f(&mut slot.value))
    }

    /// Up to `limit` entries for which `f` returns `Some`, as `(key, value)`.
    pub fn collect<R>(&self, limit: usize, mut f: impl FnMut(&T) -> Option<R>) -> Vec<(String, R)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            for slot in shard.lock().iter() {
                if out.len() >= limit {
                    return out;
                }
                if let Some(r) = f(&slot.value) {
                    out.push((slot.key.as_str().to_owned(), r));
                }
            }
        }
        out
    }

    pub fn remove(&self, key: &str) -> bool {
        let hash = key_hash(key.as_bytes());
        match self
            .shard(hash)
            .lock()
            .find_entry(hash, |s| s.key.as_bytes() == key.as_bytes())
        {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Advances the clock and drops entries idle for `ttl_ms` or longer.
    pub fn sweep(&self, now_ms: i64, ttl_ms: u64) -> usize {
        self.tick(now_ms);
        let ttl_ms = i64::try_from(ttl_ms).unwrap_or(i64::MAX);
        self.shards
            .iter()
            .map(|shard| {
                let mut shard = shard.lock();
                let before = shard.len();
                shard.retain(|slot| now_ms.saturating_sub(slot.last_seen_ms) < ttl_ms);
                before - shard.len()
            })
            .sum()
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, hash: u64) -> &Shard<T> {
        &self.shards[(hash >> 32) as usize % self.shards.len()]
    }
}

fn evict_oldest<T>(shard: &mut HashTable<Slot<T>>, count: usize) {
    let mut seen: Vec<i64> = shard.iter().map(|s| s.last_seen_ms).collect();
    let nth = count.min(seen.len()).saturating_sub(1);
    if seen.is_empty() {
        return;
    }
    let (_, &mut cutoff, _) = seen.select_nth_unstable(nth);
    let mut budget = count;
    shard.retain(|slot| {
        if budget > 0 && slot.last_seen_ms <= cutoff {
            budget -= 1;
            false
        } else {
            true
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_hashed_once_finds_its_state_in_every_store() {
        // The scoring call hashes a session id once for several stores: each finds,
        // with or without the hash handed in, the state the other way made.
        let counts: KeyedStore<u32> = KeyedStore::new(4, 100);
        let names: KeyedStore<String> = KeyedStore::new(8, 100);
        let long = "x".repeat(INLINE_BYTES + 5);
        for key in ["s-1", "s-2", long.as_str()] {
            let hash = key_hash(key.as_bytes());
            counts.update_hashed(key, hash, || 0, |n| *n += 1);
            names.update_hashed(key, hash, String::new, |s| s.push('a'));
            counts.update(key, || 0, |n| *n += 1);
            names.update_hashed(key, key_hash(key.as_bytes()), String::new, |s| s.push('b'));
            assert_eq!(counts.read(key, |n| *n), Some(2));
            assert_eq!(names.read(key, |s| s.clone()).as_deref(), Some("ab"));
        }
        assert_eq!((counts.len(), names.len()), (3, 3));
        assert!(names.remove("s-1"));
        assert_eq!(names.read("s-1", |s| s.clone()), None);
    }

    #[test]
    fn a_keys_hash_is_keyed_and_tells_keys_apart() {
        // One hash for every store, so it must still spread client-chosen ids (a
        // constant would put every session in one shard's one probe chain) and be
        // keyed (unkeyed SipHash, std's DefaultHasher, is predictable: HashDoS).
        use std::collections::hash_map::DefaultHasher;
        use std::collections::HashSet;
        use std::hash::BuildHasherDefault;
        let keys: Vec<String> = (0..1_000).map(|i| format!("sess-{i}")).collect();
        let hashes: HashSet<u64> = keys.iter().map(|k| key_hash(k.as_bytes())).collect();
        assert_eq!(hashes.len(), keys.len());
        let shards: HashSet<u64> = hashes.iter().map(|h| h % 16).collect();
        assert_eq!(shards.len(), 16);
        assert_eq!(key_hash(b"sess-1"), key_hash(b"sess-1"));
        let unkeyed = |k: &[u8]| BuildHasherDefault::<DefaultHasher>::default().hash_one(k);
        assert!(keys
            .iter()
            .all(|k| key_hash(k.as_bytes()) != unkeyed(k.as_bytes())));
    }

    #[test]
    fn modify_changes_an_existing_entry_and_makes_none() {
        let store: KeyedStore<u32> = KeyedStore::new(2, 10);
        assert_eq!(store.modify("absent", |n| *n += 1), None);
        assert!(store.is_empty(), "modify made an entry");
        store.update("s", || 1, |_| ());
        assert_eq!(
            store.modify("s", |n| {
                *n += 1;
                *n
            }),
            Some(2)
        );
        assert_eq!(store.read("s", |n| *n), Some(2));
    }

    #[test]
    fn short_and_long_keys_are_told_apart() {
        let store: KeyedStore<u32> = KeyedStore::new(1, 100);
        let long = "s".repeat(INLINE_BYTES + 1);
        let longer = "s".repeat(INLINE_BYTES + 2);
        let at_limit = "s".repeat(INLINE_BYTES);
        for (i, key) in [&long, &longer, &at_limit, &"s".to_string()]
            .iter()
            .enumerate()
        {
            store.update(key, || i as u32, |_| ());
        }
        assert_eq!(store.read(&long, |v| *v), Some(0));
        assert_eq!(store.read(&longer, |v| *v), Some(1));
        assert_eq!(store.read(&at_limit, |v| *v), Some(2));
        assert_eq!(store.read("s", |v| *v), Some(3));
        let mut keys: Vec<String> = store
            .collect(10, |_| Some(()))
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        let mut want = vec!["s".to_string(), at_limit, long, longer];
        want.sort();
        assert_eq!(keys, want);
    }

    #[test]
    fn update_creates_then_reuses_state() {
        let store: KeyedStore<u32> = KeyedStore::new(4, 100);
        assert_eq!(
            store.update(
                "a",
                || 10,
                |v| {
                    *v += 1;
                    *v
                }
            ),
            11
        );
        assert_eq!(
            store.update(
                "a",
                || 0,
                |v| {
                    *v += 1;
                    *v
                }
            ),
            12
        );
        assert_eq!(store.read("a", |v| *v), Some(12));
        assert_eq!(store.read("b", |v| *v), None);
        assert!(store.remove("a"));
        assert!(store.is_empty());
    }

    #[test]
    fn full_shard_evicts_the_least_recently_seen() {
        let store: KeyedStore<u32> = KeyedStore::new(1, 2);
        store.tick(1);
        store.update("old", || 1, |_| ());
        store.tick(2);
        store.update("mid", || 2, |_| ());
        store.tick(3);
        store.update("new", || 3, |_| ());
        assert_eq!(store.len(), 2);
        assert!(store.read("old", |_| ()).is_none());
    }

    #[test]
    fn sweep_drops_idle_entries() {
        let store: KeyedStore<u32> = KeyedStore::new(2, 100);
        store.tick(0);
        store.update("idle", || 1, |_| ());
        store.tick(900);
        store.update("busy", || 1, |_| ());
        assert_eq!(store.sweep(1_000, 500), 1);
        assert_eq!(
            store.collect(10, |v| Some(*v)),
            vec![("busy".to_string(), 1)]
        );
    }

    use proptest::prelude::*;

    proptest! {
        /// An inline string is the `Box<str>` it replaced: the same text back, equal
        /// exactly when the texts are, hashed as the text.
        #[test]
        fn an_inline_string_answers_as_its_text(
            a in "[a-z\\u{e9}\\u{4e2d}]{0,40}",
            b in "[a-z\\u{e9}\\u{4e2d}]{0,40}",
        ) {
            let (x, y) = (InlineStr::new(&a), InlineStr::new(&b));
            prop_assert_eq!(x.as_str(), a.as_str());
            prop_assert_eq!(&*y, b.as_str());
            prop_assert_eq!(x == y, a == b);
            // Equal texts compare equal (two random texts are rarely the same).
            prop_assert!(x == InlineStr::new(&a));
            prop_assert_eq!(x.as_bytes() == y.as_bytes(), a == b);
            let hasher = RandomState::new();
            prop_assert_eq!(hasher.hash_one(&x), hasher.hash_one(a.as_str()));
        }
    }
}
