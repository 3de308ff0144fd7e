//! Reference-counted interning.
//!
//! A session window stores 4-byte ids instead of strings: thousands of sessions that
//! call the same tool share one copy of `{intent, tool_call, status}`. Each id counts
//! the windows that hold it and is freed (and its slot reused) when the count drops to
//! zero, so the interner never outgrows the live windows.
//!
//! Lookups take a precomputed hash and an equality test on the borrowed form, so a hit
//! allocates nothing. Keys with equal hashes are told apart by exact equality: ids are
//! equal if and only if keys are equal.

use hashbrown::HashTable;

/// A stable handle for an interned key; valid while its reference count is positive.
pub type Id = u32;

struct Entry<K> {
    key: K,
    hash: u64,
    refs: u32,
}

/// Interned keys with reference counts. Not thread-safe: one per store shard.
pub struct Interner<K> {
    /// Ids, found by the key's hash; equality is checked against `entries`.
    index: HashTable<Id>,
    entries: Vec<Option<Entry<K>>>,
    free: Vec<Id>,
}

impl<K> Default for Interner<K> {
    fn default() -> Self {
        Self {
            index: HashTable::new(),
            entries: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<K> Interner<K> {
    /// Returns the id of the key equal to the probe, adding one reference; creates the
    /// entry with `make` when no such key exists.
    pub fn acquire(
        &mut self,
        hash: u64,
        matches: impl Fn(&K) -> bool,
        make: impl FnOnce() -> K,
    ) -> Id {
        let entries = &mut self.entries;
        if let Some(&id) = self.index.find(hash, |&id| matches(&live(entries, id).key)) {
            live_mut(entries, id).refs += 1;
            return id;
        }
        let entry = Entry {
            key: make(),
            hash,
            refs: 1,
        };
        let id = match self.free.pop() {
            Some(id) => {
                entries[id as usize] = Some(entry);
                id
            }
            None => {
                entries.push(Some(entry));
                Id::try_from(entries.len() - 1).expect("fewer than 2^32 live keys")
            }
        };
        self.index
            .insert_unique(hash, id, |&other| live(entries, other).hash);
        id
    }

    /// Drops one reference; the key is freed when none are left.
    pub fn release(&mut self, id: Id) {
        let entry = live_mut(&mut self.entries, id);
        entry.refs -= 1;
        if entry.refs > 0 {
            return;
        }
        let hash = entry.hash;
        if let Ok(found) = self.index.find_entry(hash, |&other| other == id) {
            found.remove();
        }
        self.entries[id as usize] = None;
        self.free.push(id);
    }

    /// The key behind a live id.
    pub fn get(&self, id: Id) -> &K {
        &live(&self.entries, id).key
    }

    /// Number of distinct live keys.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn live<K>(entries: &[Option<Entry<K>>], id: Id) -> &Entry<K> {
    entries[id as usize]
        .as_ref()
        .expect("id is live while a window holds it")
}

fn live_mut<K>(entries: &mut [Option<Entry<K>>], id: Id) -> &mut Entry<K> {
    entries[id as usize]
        .as_mut()
        .expect("id is live while a window holds it")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(interner: &mut Interner<String>, hash: u64, key: &str) -> Id {
        interner.acquire(hash, |k| k == key, || key.to_owned())
    }

    #[test]
    fn equal_keys_share_an_id() {
        let mut interner = Interner::default();
        let a = acquire(&mut interner, 1, "read_file");
        let b = acquire(&mut interner, 1, "read_file");
        assert_eq!(a, b);
        assert_eq!(interner.len(), 1);
    }

    #[test]
    fn colliding_hashes_keep_keys_apart() {
        let mut interner = Interner::default();
        let a = acquire(&mut interner, 7, "a");
        let b = acquire(&mut interner, 7, "b");
        assert_ne!(a, b);
        assert_eq!(interner.get(a), "a");
        assert_eq!(interner.get(b), "b");
        interner.release(a);
        assert_eq!(acquire(&mut interner, 7, "b"), b);
        assert_eq!(interner.len(), 1);
    }

    #[test]
    fn last_release_frees_and_reuses_the_slot() {
        let mut interner = Interner::default();
        let a = acquire(&mut interner, 1, "a");
        acquire(&mut interner, 1, "a");
        interner.release(a);
        assert_eq!(interner.len(), 1);
        interner.release(a);
        assert!(interner.is_empty());
        let c = acquire(&mut interner, 3, "c");
        assert_eq!(c, a, "the freed slot is reused");
    }
}
