//! [`Throttle`]: at most one action per key per interval, over a bounded
//! set of keys.
//!
//! Apart because it is a small data structure with its own rule (strangers
//! choose the keys, so it must never grow past its bound), used by the
//! node's answers to datagrams that did not prove their sender a member.

use std::collections::HashMap;

use tollgate_core::Nanos;

/// Most addresses (or senders) a [`Throttle`] remembers.
const MAX_THROTTLED: usize = 256;

/// Does something at most once every `every` per key, remembering at most
/// [`MAX_THROTTLED`] keys: when they are all recent, nothing more is done
/// (strangers choose the keys, so it must not grow).
#[derive(Debug)]
pub(super) struct Throttle<K> {
    last: HashMap<K, Nanos>,
    every: Nanos,
}

impl<K: std::hash::Hash + Eq> Throttle<K> {
    pub(super) fn new(every: Nanos) -> Throttle<K> {
        Throttle {
            last: HashMap::new(),
            every,
        }
    }

    /// Whether to do it for `key` now; records it if so.
    pub(super) fn allow(&mut self, key: K, now: Nanos) -> bool {
        let every = self.every;
        let recent = |at: &Nanos| now.saturating_sub(*at) < every;
        if self.last.get(&key).is_some_and(recent) {
            return false;
        }
        if self.last.len() >= MAX_THROTTLED && !self.last.contains_key(&key) {
            self.last.retain(|_, at| recent(at));
            if self.last.len() >= MAX_THROTTLED {
                return false;
            }
        }
        self.last.insert(key, now);
        true
    }
}
