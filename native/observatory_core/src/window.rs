//! A session's sliding window of interned `{intent, tool_call, status}` ids (FR-9.2)
//! and the uniqueness ratio over it (FR-9.3).

use std::collections::VecDeque;

use crate::interner::Id;

/// Windows up to this size live inside the session record: no allocation and no
/// pointer to chase, which matters when a million sessions miss the CPU cache.
pub const INLINE_CAPACITY: usize = 6;

/// Windows up to this size are scored on the stack without allocating.
const STACK_SCORING: usize = 32;

/// The last N tuple ids of one session, oldest first: a ring buffer, so append at the
/// back and eviction from the front are both O(1).
#[derive(Debug, Clone)]
pub struct Window {
    ring: Ring,
}

#[derive(Debug, Clone)]
enum Ring {
    Inline {
        ids: [Id; INLINE_CAPACITY],
        head: u8,
        len: u8,
    },
    /// Boxed so that the common, inline case sets the size of every session record
    /// (a bare `VecDeque` would add 8 bytes to each of a million sessions).
    #[allow(clippy::box_collection)]
    Heap(Box<VecDeque<Id>>),
}

impl Default for Window {
    fn default() -> Self {
        Self {
            ring: Ring::Inline {
                ids: [0; INLINE_CAPACITY],
                head: 0,
                len: 0,
            },
        }
    }
}

impl Window {
    /// Appends `id`, then evicts from the front until at most `capacity` ids remain,
    /// handing each evicted id to `evicted`. A capacity lowered at run time therefore
    /// trims the window on its next push (design.md §2).
    pub fn push(&mut self, id: Id, capacity: usize, mut evicted: impl FnMut(Id)) {
        let capacity = capacity.max(1);
        if capacity > INLINE_CAPACITY {
            if let Ring::Inline { .. } = self.ring {
                self.ring = Ring::Heap(Box::new(self.iter().collect()));
            }
        }
        match &mut self.ring {
            Ring::Inline { ids, head, len } => {
                if usize::from(*len) == INLINE_CAPACITY {
                    evicted(ids[usize::from(*head)]);
                    *head = ((usize::from(*head) + 1) % INLINE_CAPACITY) as u8;
                    *len -= 1;
                }
                ids[(usize::from(*head) + usize::from(*len)) % INLINE_CAPACITY] = id;
                *len += 1;
                while usize::from(*len) > capacity {
                    evicted(ids[usize::from(*head)]);
                    *head = ((usize::from(*head) + 1) % INLINE_CAPACITY) as u8;
                    *len -= 1;
                }
            }
            Ring::Heap(ids) => {
                ids.push_back(id);
                while ids.len() > capacity {
                    if let Some(old) = ids.pop_front() {
                        evicted(old);
                    }
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        match &self.ring {
            Ring::Inline { len, .. } => usize::from(*len),
            Ring::Heap(ids) => ids.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th id, oldest first.
    fn get(&self, i: usize) -> Id {
        match &self.ring {
            Ring::Inline { ids, head, .. } => ids[(usize::from(*head) + i) % INLINE_CAPACITY],
            Ring::Heap(ids) => ids[i],
        }
    }

    /// Ids oldest first.
    pub fn iter(&self) -> impl Iterator<Item = Id> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }

    /// Removes every id, handing each to `released`.
    pub fn drain(&mut self, released: impl FnMut(Id)) {
        self.iter().for_each(released);
        *self = Self::default();
    }

    /// Number of distinct ids (exact equality, since ids are interned exactly).
    pub fn distinct_count(&self) -> usize {
        let len = self.len();
        let mut stack = [0 as Id; STACK_SCORING];
        let mut heap;
        let ids: &mut [Id] = if len <= STACK_SCORING {
            for (slot, id) in stack.iter_mut().zip(self.iter()) {
                *slot = id;
            }
            &mut stack[..len]
        } else {
            heap = self.iter().collect::<Vec<_>>();
            &mut heap
        };
        if len <= INLINE_CAPACITY {
            // A handful of ids: comparing pairs beats sorting.
            (0..len).filter(|&i| !ids[..i].contains(&ids[i])).count()
        } else {
            ids.sort_unstable();
            1 + ids.windows(2).filter(|w| w[0] != w[1]).count()
        }
    }

    /// `distinct / len`: 1.0 when every tuple differs, 1/len for a pure loop.
    /// An empty window scores 1.0 (nothing repeats).
    pub fn uniqueness(&self) -> f64 {
        if self.is_empty() {
            return 1.0;
        }
        self.distinct_count() as f64 / self.len() as f64
    }

    /// The most frequent id and its count (FR-9.7's `repeated_pattern`). On a tie the
    /// id seen most recently wins: it is the loop the agent is in now.
    pub fn most_frequent(&self) -> Option<(Id, usize)> {
        let len = self.len();
        let mut best: Option<(Id, usize)> = None;
        for newest_first in 0..len {
            let pos = len - 1 - newest_first;
            let id = self.get(pos);
            if (pos + 1..len).any(|later| self.get(later) == id) {
                continue; // counted already, from its more recent occurrence
            }
            let count = self.iter().filter(|&x| x == id).count();
            if best.is_none_or(|(_, c)| count > c) {
                best = Some((id, count));
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn window_of(ids: &[Id], capacity: usize) -> Window {
        let mut w = Window::default();
        for &id in ids {
            w.push(id, capacity, |_| {});
        }
        w
    }

    #[test]
    fn fr_9_2_sixth_push_evicts_the_oldest() {
        let mut w = window_of(&[1, 2, 3, 4, 5], 5);
        let mut evicted = vec![];
        w.push(6, 5, |id| evicted.push(id));
        assert_eq!(evicted, vec![1]);
        assert_eq!(w.iter().collect::<Vec<_>>(), vec![2, 3, 4, 5, 6]);
    }

    #[test]
    fn fr_9_2_partial_window_is_scored_over_what_it_has() {
        let w = window_of(&[1, 2, 2], 5);
        assert_eq!(w.len(), 3);
        assert!((w.uniqueness() - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn fr_9_3_pure_loop_and_all_unique() {
        assert_eq!(window_of(&[9, 9, 9, 9, 9], 5).uniqueness(), 0.2);
        assert_eq!(window_of(&[1, 2, 3, 4, 5], 5).uniqueness(), 1.0);
    }

    #[test]
    fn lowered_capacity_trims_on_next_push() {
        let mut w = window_of(&[1, 2, 3, 4, 5], 5);
        let mut evicted = vec![];
        w.push(6, 3, |id| evicted.push(id));
        assert_eq!(evicted, vec![1, 2, 3]);
        assert_eq!(w.iter().collect::<Vec<_>>(), vec![4, 5, 6]);
    }

    #[test]
    fn fr_9_7_most_frequent_prefers_the_recent_on_ties() {
        assert_eq!(window_of(&[4, 4, 4, 4, 1], 5).most_frequent(), Some((4, 4)));
        assert_eq!(window_of(&[1, 1, 2, 2, 3], 5).most_frequent(), Some((2, 2)));
        assert_eq!(Window::default().most_frequent(), None);
    }

    #[test]
    fn growing_past_the_inline_capacity_keeps_order() {
        let mut w = window_of(&[1, 2, 3, 4, 5, 6, 7, 8], 8);
        w.push(9, 20, |_| panic!("nothing to evict"));
        assert_eq!(w.iter().collect::<Vec<_>>(), (1..=9).collect::<Vec<_>>());
    }

    #[test]
    fn large_windows_are_scored_too() {
        let ids: Vec<Id> = (0..100).map(|i| i % 10).collect();
        assert_eq!(window_of(&ids, 100).distinct_count(), 10);
    }

    proptest! {
        #[test]
        fn window_never_exceeds_its_size(ids in prop::collection::vec(0u32..8, 0..64), cap in 1usize..20) {
            let mut w = Window::default();
            for id in ids {
                w.push(id, cap, |_| {});
                prop_assert!(w.len() <= cap);
            }
        }

        #[test]
        fn window_keeps_the_newest_in_order(ids in prop::collection::vec(0u32..1000, 1..64), cap in 1usize..20) {
            let w = window_of(&ids, cap);
            let start = ids.len().saturating_sub(cap);
            prop_assert_eq!(w.iter().collect::<Vec<_>>(), ids[start..].to_vec());
        }

        #[test]
        fn evictions_are_the_oldest_in_order(ids in prop::collection::vec(0u32..1000, 1..64), caps in prop::collection::vec(1usize..20, 64)) {
            let mut w = Window::default();
            let mut model: std::collections::VecDeque<u32> = Default::default();
            for (&id, &cap) in ids.iter().zip(caps.iter()) {
                let mut evicted = vec![];
                w.push(id, cap, |old| evicted.push(old));
                model.push_back(id);
                let mut expected = vec![];
                while model.len() > cap { expected.push(model.pop_front().unwrap()); }
                prop_assert_eq!(evicted, expected);
                prop_assert_eq!(w.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
            }
        }

        #[test]
        fn score_is_distinct_over_len(ids in prop::collection::vec(0u32..6, 1..40), cap in 1usize..40) {
            let w = window_of(&ids, cap);
            let distinct: std::collections::HashSet<_> = w.iter().collect();
            prop_assert_eq!(w.distinct_count(), distinct.len());
            prop_assert_eq!(w.uniqueness(), distinct.len() as f64 / w.len() as f64);
        }

        #[test]
        fn most_frequent_count_is_the_maximum(ids in prop::collection::vec(0u32..4, 1..20)) {
            let w = window_of(&ids, 20);
            let (id, count) = w.most_frequent().unwrap();
            prop_assert_eq!(w.iter().filter(|&x| x == id).count(), count);
            for other in w.iter() {
                prop_assert!(w.iter().filter(|&x| x == other).count() <= count);
            }
        }
    }
}
