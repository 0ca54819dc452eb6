//! A time-ordered log of granted hits, shared by the sliding log, the burst
//! tiers' windows and the per-second hard and global limits.
//!
//! Entries are `(time, count)`, so a request for many hits costs one entry.
//! A log only ever needs its newest `keep` hits: "are there fewer than
//! `limit` hits since `t`?" depends on nothing older. Trimming to the limit
//! bounds memory by the limit, even when rejected attempts are recorded.

use std::collections::VecDeque;

use crate::time::Nanos;

/// Hits ordered by time, with a running total.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct HitLog {
    entries: VecDeque<(Nanos, u64)>,
    total: u64,
}

impl HitLog {
    /// Hits at or after `from`.
    pub fn count_since(&self, from: Nanos) -> u64 {
        let mut count = self.total;
        for &(t, n) in &self.entries {
            if t >= from {
                break;
            }
            count -= n;
        }
        count
    }

    /// Forgets hits before `from`.
    pub fn prune(&mut self, from: Nanos) {
        while let Some(&(t, n)) = self.entries.front() {
            if t >= from {
                break;
            }
            self.total -= n;
            self.entries.pop_front();
        }
    }

    /// Records `n` hits at `at` and keeps only the newest `keep` hits. A time
    /// before the newest entry (a clock going backwards) is recorded at the
    /// newest entry's time, which keeps the hit counted longer, never less.
    pub fn push(&mut self, at: Nanos, n: u64, keep: u64) {
        // Only the newest `keep` hits are kept, so at most `keep` of these;
        // making room *before* adding keeps `total` (the sum of the entries)
        // from saturating, which would break `count_since` and `prune`.
        let n = n.min(keep);
        if n == 0 {
            return;
        }
        let at = self.newest().map_or(at, |newest| at.max(newest));
        self.trim(keep - n);
        match self.entries.back_mut() {
            Some((t, count)) if *t == at => *count = count.saturating_add(n),
            _ => self.entries.push_back((at, n)),
        }
        self.total = self.total.saturating_add(n);
    }

    /// Drops the oldest hits until at most `keep` remain.
    fn trim(&mut self, keep: u64) {
        while self.total > keep {
            let excess = self.total - keep;
            let Some(front) = self.entries.front_mut() else {
                break;
            };
            if front.1 > excess {
                front.1 -= excess;
                self.total -= excess;
            } else {
                self.total -= front.1;
                self.entries.pop_front();
            }
        }
    }

    /// Time of the newest hit.
    pub fn newest(&self) -> Option<Nanos> {
        self.entries.back().map(|&(t, _)| t)
    }

    /// Whether the log holds no hits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.total = 0;
    }

    /// The time of the hit that must leave a window before at most `allowed`
    /// hits remain in it: walking from the newest hit, the first entry that
    /// takes the count past `allowed`. `None` when at most `allowed` hits
    /// are logged at all.
    pub fn blocking_entry(&self, allowed: u64) -> Option<Nanos> {
        let mut seen = 0u64;
        for &(t, n) in self.entries.iter().rev() {
            seen = seen.saturating_add(n);
            if seen > allowed {
                return Some(t);
            }
        }
        None
    }

    /// Bytes of heap this log holds.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(Nanos, u64)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_to_the_newest_hits() {
        let mut log = HitLog::default();
        log.push(Nanos::new(1), 3, 4);
        log.push(Nanos::new(2), 3, 4);
        assert_eq!(log.count_since(Nanos::ZERO), 4);
        assert_eq!(log.count_since(Nanos::new(2)), 3);
        log.push(Nanos::new(3), 10, 4);
        assert_eq!(log.count_since(Nanos::ZERO), 4);
        assert_eq!(log.blocking_entry(3), Some(Nanos::new(3)));
    }

    #[test]
    fn backwards_time_is_recorded_at_the_newest() {
        let mut log = HitLog::default();
        log.push(Nanos::new(10), 1, 10);
        log.push(Nanos::new(5), 1, 10);
        assert_eq!(log.newest(), Some(Nanos::new(10)));
        assert_eq!(log.count_since(Nanos::new(10)), 2);
        log.prune(Nanos::new(11));
        assert!(log.is_empty());
    }
}
