//! The sliding log (seed 002, seed 004): exact, at a cost.
//!
//! Every granted hit is logged with its time; a request is admitted when the
//! hits of the last `window` plus the request fit in `limit`. A hit at `t`
//! counts while `now <= t + window` (Charon §2.1: the next request is
//! granted only when `now > t + window`). Nothing is approximated, so no
//! window of that length ever holds more than `limit` granted hits.
//!
//! Two options follow the Redis sorted-set notes of seed 002:
//! - `min_gap` (note 4): a request closer than `min_gap` to the newest logged
//!   hit is rejected.
//! - `count_rejected` (note 6): rejected attempts are logged too, so a client
//!   that keeps trying faster than the limit stays blocked until it pauses.
//!
//! Memory is one 16-byte entry per distinct timestamp, never more than
//! `limit` entries: only the newest `limit` hits can affect a decision.

use std::num::NonZeroU64;

use crate::algorithm::{Algorithm, Usage, NEXT_HIT};
use crate::algorithms::hit_log::HitLog;
use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::time::{Nanos, Span};

/// Sliding-log parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlidingLog {
    limit: NonZeroU64,
    window: Span,
    min_gap: Nanos,
    count_rejected: bool,
    /// Hits a report may log beyond the limit ([`Usage`]); one limit by
    /// default. The log then holds at most `limit + max_debt` hits.
    max_debt: u64,
}

/// Sliding-log state: the log.
pub type SlidingLogState = Box<HitLog>;

impl SlidingLog {
    /// At most `limit` hits in any `window`.
    pub fn new(limit: u64, window: Nanos) -> Result<SlidingLog, ParamError> {
        let limit = ParamError::positive("limit", limit)?;
        let window = ParamError::span("window", window)?;
        Ok(SlidingLog {
            limit,
            window,
            min_gap: Nanos::ZERO,
            count_rejected: false,
            max_debt: limit.get(),
        })
    }

    /// Bounds the hits a report may log beyond the limit ([`Usage`]); the
    /// default is one limit.
    #[must_use]
    pub fn with_max_debt(mut self, max_debt: u64) -> SlidingLog {
        self.max_debt = max_debt;
        self
    }

    /// Hits a report may log beyond the limit.
    pub fn max_debt(&self) -> u64 {
        self.max_debt
    }

    /// Also requires `min_gap` between a request and the newest logged hit.
    #[must_use]
    pub fn with_min_gap(mut self, min_gap: Nanos) -> SlidingLog {
        self.min_gap = min_gap;
        self
    }

    /// Also logs rejected attempts.
    #[must_use]
    pub fn counting_rejected(mut self, count_rejected: bool) -> SlidingLog {
        self.count_rejected = count_rejected;
        self
    }

    /// The least time between two granted requests (zero: none).
    pub fn min_gap(&self) -> Nanos {
        self.min_gap
    }

    /// Whether rejected attempts are logged too.
    pub fn counts_rejected(&self) -> bool {
        self.count_rejected
    }

    /// Hits per window.
    pub fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// The window.
    pub fn window(&self) -> Nanos {
        self.window.get()
    }

    /// First instant at which a hit logged at `now - window` no longer counts
    /// is `now + 1`; so the window at `now` starts at `now - window`.
    fn window_start(&self, now: Nanos) -> Nanos {
        now.saturating_sub(self.window.get())
    }

    /// Hits counted at `now`.
    pub fn count(&self, log: &HitLog, now: Nanos) -> u64 {
        log.count_since(self.window_start(now))
    }

    fn gap_open(&self, log: &HitLog, now: Nanos) -> bool {
        self.min_gap.is_zero()
            || log
                .newest()
                .is_none_or(|t| now >= t.saturating_add(self.min_gap))
    }

    fn retry_after(&self, log: &HitLog, now: Nanos, min_hits: u64) -> Option<Nanos> {
        if min_hits > self.limit.get() {
            return None;
        }
        if min_hits == 0 {
            // Granted now, even while `min_gap` closes the log.
            return Some(Nanos::ZERO);
        }
        Some(self.earliest(log, now, min_hits).saturating_sub(now))
    }

    /// The first instant from `from` at which the log has room for `hits`
    /// (`hits <= limit`) and `min_gap` has passed since its newest hit.
    fn earliest(&self, log: &HitLog, from: Nanos, hits: u64) -> Nanos {
        let mut at = from;
        if let Some(t) = log.blocking_entry(self.limit.get() - hits) {
            at = at.max(
                t.saturating_add(self.window.get())
                    .saturating_add(Nanos::NANOSECOND),
            );
        }
        if !self.min_gap.is_zero() {
            if let Some(t) = log.newest() {
                at = at.max(t.saturating_add(self.min_gap));
            }
        }
        at
    }
}

impl SlidingLog {
    /// How long until `hits` fit, for [`crate::Mode::Acquire`]: the first
    /// instant, no earlier than the newest logged hit (so the log stays in
    /// time order), at which the window holds room for them and `min_gap`
    /// has passed. `None` when more than `limit` hits are asked at once.
    pub fn schedule(&self, log: &HitLog, now: Nanos, hits: u64) -> Option<Nanos> {
        if hits > self.limit.get() {
            return None;
        }
        let from = log.newest().map_or(now, |n| now.max(n));
        Some(self.earliest(log, from, hits).saturating_sub(now))
    }

    /// Logs `hits` at `at` (when the caller will use them: what
    /// [`SlidingLog::schedule`] said, or later) and describes the state.
    pub fn acquire_at(&self, log: &mut HitLog, now: Nanos, hits: u64, at: Nanos) -> Decision {
        log.prune(self.window_start(now));
        log.push(at, hits, self.limit.get());
        let grant = Grant {
            granted: hits,
            allowed: true,
        };
        let mut d = self.describe(log, now, Hits::between(hits.min(1), hits), grant);
        d.wait = at.saturating_sub(now);
        d
    }

    fn describe(&self, log: &HitLog, now: Nanos, request: Hits, grant: Grant) -> Decision {
        let count = self.count(log, now);
        // Fresh again once the newest hit has left the window and the gap
        // after it has passed.
        let reset_after = log.newest().map_or(Nanos::ZERO, |t| {
            t.saturating_add(self.window.get())
                .saturating_add(Nanos::NANOSECOND)
                .max(t.saturating_add(self.min_gap))
                .saturating_sub(now)
        });
        let remaining = if self.gap_open(log, now) {
            self.limit.get().saturating_sub(count)
        } else {
            0
        };
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit: self.limit.get(),
            remaining,
            reset_after,
            retry_after: self.retry_after(log, now, request.min_hits),
            wait: Nanos::ZERO,
            tier: None,
        }
    }
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;

    fn fresh(&self) -> SlidingLogState {
        Box::default()
    }

    fn room(&self, log: &SlidingLogState, now: Nanos, hits: u64) -> u64 {
        if !self.gap_open(log, now) {
            return 0;
        }
        self.limit
            .get()
            .saturating_sub(self.count(log, now))
            .min(hits)
    }

    fn commit(
        &self,
        log: &mut SlidingLogState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        log.prune(self.window_start(now));
        if grant.granted > 0 {
            log.push(now, grant.granted, self.limit.get());
        } else if !grant.allowed && self.count_rejected {
            // Past the limit only after a report: the attempt renews the
            // block without forgiving the debt.
            let keep = self.limit.get().max(log.total());
            log.push(now, request.hits.max(1), keep);
        }
        self.describe(log, now, request, grant)
    }

    fn is_idle(&self, log: &SlidingLogState, now: Nanos) -> bool {
        self.count(log, now) == 0 && self.gap_open(log, now)
    }
}

impl Usage for SlidingLog {
    /// Logs the hits at `now` even past the limit, up to `limit +
    /// max_debt` in the window: the debt is paid as they leave it.
    fn report(&self, log: &mut SlidingLogState, now: Nanos, hits: u64) -> Decision {
        log.prune(self.window_start(now));
        let keep = self.limit.get().saturating_add(self.max_debt);
        let charged = hits.min(keep.saturating_sub(log.total()));
        log.push(now, charged, keep);
        let grant = Grant {
            granted: charged,
            allowed: true,
        };
        self.describe(log, now, NEXT_HIT, grant)
    }

    /// Forgets the newest hits still in the window.
    fn refund(&self, log: &mut SlidingLogState, now: Nanos, hits: u64) -> Decision {
        log.prune(self.window_start(now));
        let back = log.take_newest(hits);
        let grant = Grant {
            granted: back,
            allowed: true,
        };
        self.describe(log, now, NEXT_HIT, grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Nanos {
        Nanos::from_millis(n)
    }

    #[test]
    fn exact_window_with_inclusive_edge() {
        let l = SlidingLog::new(2, ms(1000)).unwrap();
        let mut s = l.fresh();
        assert!(l.decide(&mut s, ms(0), Hits::exactly(1)).allowed);
        assert!(l.decide(&mut s, ms(400), Hits::exactly(1)).allowed);
        let d = l.decide(&mut s, ms(1000), Hits::exactly(1));
        assert!(!d.allowed, "the hit at 0 still counts at exactly 1000");
        assert_eq!(d.retry_after, Some(Nanos::NANOSECOND));
        assert!(
            l.decide(
                &mut s,
                ms(1000).saturating_add(Nanos::NANOSECOND),
                Hits::exactly(1)
            )
            .allowed
        );
    }

    #[test]
    fn min_gap_blocks_close_requests() {
        let l = SlidingLog::new(10, ms(1000)).unwrap().with_min_gap(ms(100));
        let mut s = l.fresh();
        assert!(l.decide(&mut s, ms(0), Hits::exactly(1)).allowed);
        let d = l.decide(&mut s, ms(50), Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(ms(50)));
        assert!(l.decide(&mut s, ms(100), Hits::exactly(1)).allowed);
    }

    #[test]
    fn counting_rejected_keeps_a_hammering_client_out() {
        let counting = SlidingLog::new(2, ms(1000))
            .unwrap()
            .counting_rejected(true);
        let plain = SlidingLog::new(2, ms(1000)).unwrap();
        let (mut s, mut p) = (counting.fresh(), plain.fresh());
        for t in [0, 10] {
            assert!(counting.decide(&mut s, ms(t), Hits::exactly(1)).allowed);
            assert!(plain.decide(&mut p, ms(t), Hits::exactly(1)).allowed);
        }
        // Keeps trying every 300 ms: each rejected attempt renews the block.
        for t in [300, 600, 900] {
            assert!(
                !counting.decide(&mut s, ms(t), Hits::exactly(1)).allowed,
                "at {t}"
            );
            assert!(
                !plain.decide(&mut p, ms(t), Hits::exactly(1)).allowed,
                "at {t}"
            );
        }
        assert!(!counting.decide(&mut s, ms(1200), Hits::exactly(1)).allowed);
        assert!(plain.decide(&mut p, ms(1200), Hits::exactly(1)).allowed);
        let l = counting;
        // Memory stays bounded by the limit.
        for t in 0..1000 {
            l.decide(&mut s, ms(3000 + t), Hits::exactly(1));
        }
        assert!(s.heap_bytes() <= 16 * 8);
    }
}

#[cfg(test)]
mod schedule_tests {
    use super::*;

    #[test]
    fn acquire_logs_hits_when_they_happen() {
        let l = SlidingLog::new(2, Nanos::SECOND).unwrap();
        let mut s = l.fresh();
        let now = Nanos::from_secs(10);
        let waits: Vec<Nanos> = (0..3)
            .map(|_| {
                let w = l.schedule(&s, now, 1).unwrap();
                l.acquire_at(&mut s, now, 1, now.saturating_add(w)).wait
            })
            .collect();
        // The third waits until the first has left the window.
        assert_eq!(
            waits,
            vec![
                Nanos::ZERO,
                Nanos::ZERO,
                Nanos::SECOND.saturating_add(Nanos::NANOSECOND)
            ]
        );
        // The scheduled hit counts from now on: nothing more fits before it.
        assert_eq!(l.room(&s, now, 1), 0);
        assert_eq!(
            l.schedule(&s, now, 3),
            None,
            "more than the limit never fits"
        );
    }
}
