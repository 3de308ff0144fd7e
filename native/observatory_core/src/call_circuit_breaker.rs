//! Proxy-level limit on identical tool calls (seed 002, layer 2): stops sandbox code
//! that hammers one tool with the same arguments in a tight loop.
//!
//! Calls are identical when they have the same tool name and the same arguments hash
//! (normally [`stable_hash`](crate::stable_json::stable_hash) of the arguments). Each
//! such key keeps the times of its recent *allowed* calls, oldest first.
//!
//! # Window semantics
//!
//! A call at `now` is allowed when fewer than `max_calls` allowed calls of the same key
//! fall in the window `(now - window_ms, now]`; otherwise it is denied. With the
//! defaults, at most 20 identical calls pass in any 60-second span and the 21st is
//! denied. A call exactly `window_ms` after an earlier one no longer sees it.
//!
//! Denied calls are not recorded, so they do not extend the denial: a caller that backs
//! off for `retry_after_ms` gets through, and one that keeps retrying gets through as
//! soon as the oldest allowed call leaves the window.
//!
//! Time comes in as `now_ms` from the caller (no clock in here, so tests and replays
//! are exact). Concurrent callers may deliver times slightly out of order; a time older
//! than the key's last call is recorded as that last call's time, which keeps each
//! key's times sorted and only ever holds a call in the window longer, never shorter.
//!
//! # Memory
//!
//! A key holds at most `max_calls` timestamps, pruned on each of its checks.
//! [`CallCircuitBreaker::prune`] drops keys with no call left in the window; the owner
//! runs it periodically. At most `max_keys` keys are kept: a new key arriving when the
//! map is full first triggers a prune, and if every key is still active, the eighth of
//! the keys (at least one) with the oldest last call are forgotten. Evicting a batch
//! makes the O(keys) scan rare (once per `max_keys / 8` new keys) instead of paying it
//! on every new key while full. A forgotten key starts again from zero, which is the
//! least harm: those are the keys that have gone quiet the longest.

use std::collections::{HashMap, VecDeque};

use crate::stable_json::Digest;
use crate::Error;

/// Limits of a [`CallCircuitBreaker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Identical calls allowed within any `window_ms`.
    pub max_calls: u32,
    /// Width of the sliding window, in milliseconds.
    pub window_ms: u64,
    /// Most distinct `(tool, args_hash)` keys kept at once.
    pub max_keys: usize,
}

impl Default for Config {
    /// The seed's 20 calls per 60 s. 100 000 keys bounds memory to a few tens of MiB in
    /// the worst case (every key holding `max_calls` timestamps).
    fn default() -> Self {
        Self {
            max_calls: 20,
            window_ms: 60_000,
            max_keys: 100_000,
        }
    }
}

impl Config {
    /// Every limit must be at least 1: a zero would deny everything or keep nothing.
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_calls >= 1 && self.window_ms >= 1 && self.max_keys >= 1 {
            Ok(())
        } else {
            Err(Error::InvalidBreakerConfig)
        }
    }
}

/// The answer for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Forward the call. `count` is the number of identical calls in the window,
    /// this one included.
    Allow { count: u32 },
    /// Refuse the call. `count` identical calls are already in the window; the next
    /// one is allowed in `retry_after_ms`.
    Deny { count: u32, retry_after_ms: u64 },
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }
}

/// Sliding-window counts of identical calls. Plain `&mut self`: the owner decides how
/// it is shared.
#[derive(Debug, Clone)]
pub struct CallCircuitBreaker {
    config: Config,
    /// Tool name, then arguments hash, to the times of recent allowed calls. Two levels
    /// so a lookup borrows the `&str` instead of allocating a key per call.
    calls: HashMap<Box<str>, HashMap<Digest, VecDeque<u64>>>,
    keys: usize,
}

impl CallCircuitBreaker {
    pub fn new(config: Config) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self {
            config,
            calls: HashMap::new(),
            keys: 0,
        })
    }

    /// Decides one call of `tool` with arguments hashing to `args_hash` at `now_ms`, and
    /// records it if allowed (see the module docs for the exact window).
    pub fn check(&mut self, tool: &str, args_hash: Digest, now_ms: u64) -> Decision {
        let Config {
            max_calls,
            window_ms,
            ..
        } = self.config;
        if let Some(times) = self
            .calls
            .get_mut(tool)
            .and_then(|by_args| by_args.get_mut(&args_hash))
        {
            expire(times, now_ms, window_ms);
            let count = times.len() as u32;
            if count >= max_calls {
                let oldest = times.front().copied().unwrap_or(now_ms);
                return Decision::Deny {
                    count,
                    retry_after_ms: oldest.saturating_add(window_ms).saturating_sub(now_ms),
                };
            }
            let at = times.back().map_or(now_ms, |&last| last.max(now_ms));
            times.push_back(at);
            return Decision::Allow { count: count + 1 };
        }

        if self.keys >= self.config.max_keys {
            self.make_room(now_ms);
        }
        let times = VecDeque::from([now_ms]);
        match self.calls.get_mut(tool) {
            Some(by_args) => {
                by_args.insert(args_hash, times);
            }
            None => {
                self.calls
                    .insert(tool.into(), HashMap::from([(args_hash, times)]));
            }
        }
        self.keys += 1;
        Decision::Allow { count: 1 }
    }

    /// Drops the calls that have left the window and the keys left with none. Returns
    /// how many keys were removed.
    pub fn prune(&mut self, now_ms: u64) -> usize {
        let window_ms = self.config.window_ms;
        let mut removed = 0;
        self.calls.retain(|_, by_args| {
            by_args.retain(|_, times| {
                expire(times, now_ms, window_ms);
                removed += usize::from(times.is_empty());
                !times.is_empty()
            });
            !by_args.is_empty()
        });
        self.keys -= removed;
        removed
    }

    /// Number of `(tool, args_hash)` keys held.
    pub fn len(&self) -> usize {
        self.keys
    }

    pub fn is_empty(&self) -> bool {
        self.keys == 0
    }

    pub fn config(&self) -> Config {
        self.config
    }

    /// Forgets every call.
    pub fn clear(&mut self) {
        self.calls.clear();
        self.keys = 0;
    }

    fn make_room(&mut self, now_ms: u64) {
        self.prune(now_ms);
        if self.keys >= self.config.max_keys {
            self.evict_oldest((self.config.max_keys / 8).max(1));
        }
    }

    /// Removes the `n` keys whose last call is oldest; ties at the cut are broken by
    /// map order. One pass to find the cut-off time, one to remove.
    fn evict_oldest(&mut self, n: usize) {
        let mut lasts: Vec<u64> = self
            .calls
            .values()
            .flat_map(HashMap::values)
            .map(last)
            .collect();
        let n = n.min(lasts.len());
        if n == 0 {
            return;
        }
        let cutoff = *lasts.select_nth_unstable(n - 1).1;
        let mut ties = n - lasts.iter().filter(|&&t| t < cutoff).count();
        self.calls.retain(|_, by_args| {
            by_args.retain(|_, times| {
                let t = last(times);
                let evict = t < cutoff || (t == cutoff && ties > 0);
                if t == cutoff && evict {
                    ties -= 1;
                }
                !evict
            });
            !by_args.is_empty()
        });
        self.keys -= n;
    }
}

/// Pops the calls that are `window_ms` or more before `now_ms`. A time after `now_ms`
/// (a caller's clock behind another's) counts as in the window.
fn expire(times: &mut VecDeque<u64>, now_ms: u64, window_ms: u64) {
    while times
        .front()
        .is_some_and(|&t| now_ms.saturating_sub(t) >= window_ms)
    {
        times.pop_front();
    }
}

fn last(times: &VecDeque<u64>) -> u64 {
    times.back().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Digest = [1; 32];
    const B: Digest = [2; 32];

    fn breaker() -> CallCircuitBreaker {
        CallCircuitBreaker::new(Config::default()).unwrap()
    }

    fn small(max_calls: u32, window_ms: u64, max_keys: usize) -> CallCircuitBreaker {
        CallCircuitBreaker::new(Config {
            max_calls,
            window_ms,
            max_keys,
        })
        .unwrap()
    }

    fn key(i: usize) -> Digest {
        let mut d = [0; 32];
        d[..8].copy_from_slice(&(i as u64).to_le_bytes());
        d
    }

    #[test]
    fn twenty_allowed_twenty_first_denied() {
        let mut cb = breaker();
        for i in 1..=20 {
            assert_eq!(
                cb.check("read", A, 1_000 + i),
                Decision::Allow { count: i as u32 }
            );
        }
        // Oldest call at 1_001 leaves the window at 61_001.
        assert_eq!(
            cb.check("read", A, 1_030),
            Decision::Deny {
                count: 20,
                retry_after_ms: 59_971
            }
        );
    }

    #[test]
    fn window_is_half_open() {
        let mut cb = breaker();
        for _ in 0..20 {
            cb.check("read", A, 0);
        }
        let just_inside = cb.check("read", A, 59_999);
        assert_eq!(
            just_inside,
            Decision::Deny {
                count: 20,
                retry_after_ms: 1
            }
        );
        // At exactly window_ms every call at 0 has expired.
        assert_eq!(cb.check("read", A, 60_000), Decision::Allow { count: 1 });
    }

    #[test]
    fn window_slides_one_call_at_a_time() {
        let mut cb = breaker();
        for i in 0..20 {
            cb.check("read", A, i * 1_000);
        }
        assert!(!cb.check("read", A, 59_000).is_allowed());
        // The call at 0 has left; the 19 others remain.
        assert_eq!(cb.check("read", A, 60_000), Decision::Allow { count: 20 });
        assert!(!cb.check("read", A, 60_500).is_allowed());
        assert_eq!(cb.check("read", A, 61_000), Decision::Allow { count: 20 });
    }

    #[test]
    fn denied_calls_do_not_count() {
        let mut cb = small(2, 100, 10);
        cb.check("t", A, 0);
        cb.check("t", A, 10);
        for now in 20..100 {
            assert!(!cb.check("t", A, now).is_allowed());
        }
        // Only the two allowed calls were recorded: the one at 0 has expired.
        assert_eq!(cb.check("t", A, 100), Decision::Allow { count: 2 });
    }

    #[test]
    fn different_args_and_tools_are_separate_keys() {
        let mut cb = small(1, 1_000, 10);
        assert!(cb.check("read", A, 0).is_allowed());
        assert!(cb.check("read", B, 0).is_allowed());
        assert!(cb.check("write", A, 0).is_allowed());
        assert!(!cb.check("read", A, 1).is_allowed());
        assert!(!cb.check("write", A, 1).is_allowed());
        assert_eq!(cb.len(), 3);
    }

    #[test]
    fn prune_removes_idle_keys_only() {
        let mut cb = small(5, 100, 10);
        cb.check("read", A, 0);
        cb.check("read", B, 50);
        cb.check("write", A, 99);
        assert_eq!(cb.prune(100), 1);
        assert_eq!(cb.len(), 2);
        assert_eq!(cb.check("read", B, 100), Decision::Allow { count: 2 });
        assert_eq!(cb.prune(1_000), 2);
        assert!(cb.is_empty());
        assert!(cb.calls.is_empty(), "empty tool maps are dropped too");
    }

    #[test]
    fn full_map_prunes_idle_keys_first() {
        let mut cb = small(5, 10, 2);
        cb.check("t", key(0), 0);
        cb.check("t", key(1), 5);
        // key(0) is idle at 12; key(1) is not.
        cb.check("t", key(2), 12);
        assert_eq!(cb.len(), 2);
        assert_eq!(cb.check("t", key(1), 13), Decision::Allow { count: 2 });
        assert_eq!(cb.check("t", key(0), 13), Decision::Allow { count: 1 });
    }

    #[test]
    fn full_map_evicts_the_key_with_the_oldest_last_call() {
        let mut cb = small(5, 1_000, 4);
        cb.check("t", key(0), 0);
        cb.check("t", key(1), 1);
        cb.check("t", key(2), 2);
        cb.check("t", key(3), 3);
        cb.check("t", key(0), 4); // key(0) is now the most recent; key(1) the oldest
        cb.check("u", key(9), 5);
        assert_eq!(cb.len(), 4);
        assert_eq!(cb.check("t", key(0), 6), Decision::Allow { count: 3 });
        assert_eq!(cb.check("t", key(2), 6), Decision::Allow { count: 2 });
        assert_eq!(
            cb.check("t", key(1), 6),
            Decision::Allow { count: 1 },
            "forgotten"
        );
    }

    #[test]
    fn full_map_evicts_an_eighth_at_once() {
        let mut cb = small(5, 1_000_000, 64);
        for i in 0..64 {
            cb.check("t", key(i), i as u64);
        }
        cb.check("t", key(1_000), 100);
        assert_eq!(cb.len(), 64 - 8 + 1);
        assert_eq!(cb.check("t", key(8), 200), Decision::Allow { count: 2 });
        for i in 0..7 {
            assert_eq!(cb.check("t", key(i), 200), Decision::Allow { count: 1 });
        }
        assert_eq!(cb.len(), 64);
    }

    #[test]
    fn eviction_breaks_ties_at_the_cutoff() {
        let mut cb = small(5, 1_000, 16);
        for i in 0..16 {
            cb.check("t", key(i), 7);
        }
        cb.check("t", key(100), 8);
        assert_eq!(cb.len(), 16 - 2 + 1);
    }

    #[test]
    fn out_of_order_times_are_clamped_to_the_last_call() {
        let mut cb = small(2, 100, 10);
        cb.check("t", A, 100);
        // A caller with an older `now` is recorded at 100, not 50.
        assert_eq!(cb.check("t", A, 50), Decision::Allow { count: 2 });
        assert_eq!(
            cb.check("t", A, 60),
            Decision::Deny {
                count: 2,
                retry_after_ms: 140
            }
        );
        assert!(cb.check("t", A, 200).is_allowed());
    }

    #[test]
    fn clear_forgets_everything() {
        let mut cb = small(1, 100, 10);
        cb.check("t", A, 0);
        cb.clear();
        assert!(cb.is_empty());
        assert!(cb.check("t", A, 1).is_allowed());
    }

    #[test]
    fn invalid_config_is_refused() {
        let ok = Config::default();
        for bad in [
            Config { max_calls: 0, ..ok },
            Config { window_ms: 0, ..ok },
            Config { max_keys: 0, ..ok },
        ] {
            assert_eq!(
                CallCircuitBreaker::new(bad).unwrap_err(),
                Error::InvalidBreakerConfig
            );
        }
        assert_eq!(breaker().config(), ok);
    }
}
