//! A time-ordered log of granted hits, shared by the sliding log, the burst
//! tiers' windows and the per-second hard and global limits.
//!
//! Entries are `(time, count)`, so a request for many hits costs one entry.
//! A log only ever needs its newest `keep` hits: "are there fewer than
//! `limit` hits since `t`?" depends on nothing older. Trimming to the limit
//! bounds memory by the limit, even when rejected attempts are recorded.

use std::collections::VecDeque;

use crate::time::Nanos;

/// Cumulative counts are rebased below this, so they never saturate.
const REBASE_AT: u64 = 1 << 62;

/// Hits ordered by time.
///
/// Each entry holds its time and the *cumulative* number of hits logged up
/// to and including it; `base` is the cumulative count before the first
/// entry. "How many hits since `t`" is then a binary search and one
/// subtraction, whatever the log's length — which keeps a decision, and the
/// exact `retry_after` searches built on it, cheap for large limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct HitLog {
    entries: VecDeque<(Nanos, u64)>,
    base: u64,
}

impl HitLog {
    fn last_cum(&self) -> u64 {
        self.entries.back().map_or(self.base, |&(_, c)| c)
    }

    /// The cumulative count before entry `i`.
    fn cum_before(&self, i: usize) -> u64 {
        match i.checked_sub(1) {
            Some(j) => self.entries.get(j).map_or(self.base, |&(_, c)| c),
            None => self.base,
        }
    }

    /// Hits logged in total.
    pub fn total(&self) -> u64 {
        self.last_cum() - self.base
    }

    /// Hits at or after `from`.
    pub fn count_since(&self, from: Nanos) -> u64 {
        let i = self.entries.partition_point(|&(t, _)| t < from);
        self.last_cum() - self.cum_before(i)
    }

    /// Forgets hits before `from`.
    pub fn prune(&mut self, from: Nanos) {
        while let Some(&(t, c)) = self.entries.front() {
            if t >= from {
                break;
            }
            self.base = c;
            self.entries.pop_front();
        }
        if self.entries.is_empty() {
            self.base = 0;
        }
    }

    /// Records `n` hits at `at` and keeps only the newest `keep` hits. A time
    /// before the newest entry (a clock going backwards) is recorded at the
    /// newest entry's time, which keeps the hit counted longer, never less.
    pub fn push(&mut self, at: Nanos, n: u64, keep: u64) {
        // Only the newest `keep` hits are kept, so at most `keep` of these.
        let n = n.min(keep);
        if n == 0 {
            return;
        }
        let at = self.newest().map_or(at, |newest| at.max(newest));
        self.trim(keep - n);
        // After a rebase the sum is the total, at most `keep - n`: adding
        // `n` cannot overflow.
        if self.last_cum() >= REBASE_AT || self.last_cum() > u64::MAX - n {
            let base = self.base;
            for e in &mut self.entries {
                e.1 -= base;
            }
            self.base = 0;
        }
        let cum = self.last_cum() + n;
        match self.entries.back_mut() {
            Some((t, c)) if *t == at => *c = cum,
            _ => self.entries.push_back((at, cum)),
        }
    }

    /// Forgets up to `n` of the newest hits (a refund); returns how many.
    pub fn take_newest(&mut self, n: u64) -> u64 {
        let mut left = n;
        while left > 0 {
            let Some(&(_, c)) = self.entries.back() else {
                break;
            };
            let before = self.cum_before(self.entries.len() - 1);
            let in_entry = c - before;
            if in_entry <= left {
                left -= in_entry;
                self.entries.pop_back();
            } else if let Some(last) = self.entries.back_mut() {
                last.1 -= left;
                left = 0;
            }
        }
        if self.entries.is_empty() {
            self.base = 0;
        }
        n - left
    }

    /// Drops the oldest hits until at most `keep` remain.
    fn trim(&mut self, keep: u64) {
        while self.total() > keep {
            let excess = self.total() - keep;
            let Some(&(_, first)) = self.entries.front() else {
                break;
            };
            if first - self.base > excess {
                // Part of the oldest entry goes.
                self.base += excess;
            } else {
                self.base = first;
                self.entries.pop_front();
            }
        }
        if self.entries.is_empty() {
            self.base = 0;
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
        self.base = 0;
    }

    /// The time of the hit that must leave a window before at most `allowed`
    /// hits remain in it: walking from the newest hit, the first entry that
    /// takes the count past `allowed`. `None` when at most `allowed` hits
    /// are logged at all.
    pub fn blocking_entry(&self, allowed: u64) -> Option<Nanos> {
        if self.total() <= allowed {
            return None;
        }
        // The entry with the smallest cumulative count at or above this is
        // the one whose hits, counted from the newest, pass `allowed`.
        let target = self.last_cum() - allowed;
        let i = self.entries.partition_point(|&(_, c)| c < target);
        self.entries.get(i).map(|&(t, _)| t)
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
