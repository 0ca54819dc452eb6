//! The approximated sliding window (seed 002, seed 004).
//!
//! Hits are counted in fixed sub-windows; the count over the last `window`
//! is estimated as the sum of the sub-windows it fully covers plus the
//! oldest, partly covered sub-window weighted by how much of it is still
//! inside. `buckets` is how many counters are kept:
//!
//! - `buckets: 2` is seed 004's weighted previous window: sub-windows as long
//!   as the window, the estimate `current + previous × (W − elapsed) / W`.
//! - `buckets: N` keeps N counters of `window / (N − 1)` each: the current
//!   one, N − 2 whole ones and the weighted oldest, so `window: 60s,
//!   buckets: 5` is seed 004's "five 15 s windows". More buckets, closer to
//!   the exact sliding log, at N counters per key.
//!
//! The weighting is computed exactly in integers (no float drift): a request
//! for `n` is admitted when `(whole + n)·S + oldest·(S − e) <= limit·S`.
//! Sub-windows are aligned to the Unix epoch and their length is
//! `window / (N − 1)` rounded down to whole nanoseconds.

use std::num::NonZeroU64;

use smallvec::{smallvec, SmallVec};

use crate::algorithm::{Algorithm, Usage, NEXT_HIT};
use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::time::{Nanos, Span};

/// The most counters a key may keep.
pub const MAX_BUCKETS: u32 = 1024;

/// Sliding-window parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlidingWindow {
    limit: NonZeroU64,
    buckets: u32,
    /// The sub-window's length: a span, so never zero.
    sub: Span,
    /// How far past the limit a report may take the estimate
    /// ([`Usage`]); one limit by default.
    max_debt: u64,
}

/// Sliding-window state: the newest sub-window's start and the counters,
/// newest first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlidingWindowState {
    /// Start of the sub-window counted by `counts[0]`.
    pub start: Nanos,
    /// Hits per sub-window, newest first; `buckets` long.
    pub counts: SmallVec<[u64; 2]>,
}

/// The counters as seen at some time, without moving them.
struct Counted {
    /// Start of the sub-window containing `now`.
    start: Nanos,
    /// Nanoseconds of that sub-window already elapsed.
    elapsed: u64,
    /// How many sub-windows the stored counters are shifted by.
    shift: usize,
}

impl SlidingWindow {
    /// `limit` hits per `window`, estimated from `buckets` counters (>= 2).
    pub fn new(limit: u64, window: Nanos, buckets: u32) -> Result<SlidingWindow, ParamError> {
        let limit = ParamError::positive("limit", limit)?;
        let window = ParamError::span("window", window)?.get();
        if !(2..=MAX_BUCKETS).contains(&buckets) {
            return Err(ParamError::Invalid {
                param: "buckets",
                reason: format!("must be between 2 and {MAX_BUCKETS}, got {buckets}"),
            });
        }
        let sub = Span::new(window.div_floor(u64::from(buckets - 1))).map_err(|_| {
            ParamError::Invalid {
                param: "buckets",
                reason: format!("{window} cannot be split into {} sub-windows", buckets - 1),
            }
        })?;
        Ok(SlidingWindow {
            limit,
            buckets,
            sub,
            max_debt: limit.get(),
        })
    }

    /// Bounds the estimate a report may leave at `limit + max_debt`
    /// ([`Usage`]); the default is one limit beyond it.
    #[must_use]
    pub fn with_max_debt(mut self, max_debt: u64) -> SlidingWindow {
        self.max_debt = max_debt;
        self
    }

    /// Hits a report may count beyond the limit.
    pub fn max_debt(&self) -> u64 {
        self.max_debt
    }

    /// Number of counters kept (sub-windows plus one).
    pub fn buckets(&self) -> u32 {
        self.buckets
    }

    /// Hits per window.
    pub fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// Length of one sub-window.
    pub fn sub_window(&self) -> Nanos {
        self.sub.get()
    }

    fn n(&self) -> usize {
        self.buckets as usize
    }

    fn view(&self, state: &SlidingWindowState, now: Nanos) -> Counted {
        let s = self.sub.as_u64();
        let start = Nanos::new(now.as_u64() - now.as_u64() % s);
        if start < state.start {
            // Time went backwards: keep the counters, weigh the oldest fully.
            return Counted {
                start: state.start,
                elapsed: 0,
                shift: 0,
            };
        }
        let shift = (start.saturating_sub(state.start).as_u64() / s).min(self.n() as u64) as usize;
        Counted {
            start,
            elapsed: now.as_u64() - start.as_u64(),
            shift,
        }
    }

    /// The counter at `index` (0 = current) after shifting by `shift`.
    fn count_at(&self, state: &SlidingWindowState, shift: usize, index: usize) -> u64 {
        if index < shift {
            0
        } else {
            state.counts.get(index - shift).copied().unwrap_or(0)
        }
    }

    /// (sum of the whole sub-windows incl. the current one, the oldest).
    fn split(&self, state: &SlidingWindowState, shift: usize) -> (u64, u64) {
        let n = self.n();
        let whole = (0..n - 1).fold(0u64, |acc, i| {
            acc.saturating_add(self.count_at(state, shift, i))
        });
        (whole, self.count_at(state, shift, n - 1))
    }

    /// Room for hits given the whole count, the oldest and the elapsed time.
    fn room_with(&self, whole: u64, oldest: u64, elapsed: u64) -> u64 {
        self.room_under(self.limit.get(), whole, oldest, elapsed)
    }

    /// [`SlidingWindow::room_with`] under any limit (`limit + max_debt` for
    /// a report).
    fn room_under(&self, limit: u64, whole: u64, oldest: u64, elapsed: u64) -> u64 {
        let s = self.sub.as_u64() as u128;
        let weighted = oldest as u128 * (s - elapsed as u128);
        let budget = limit as u128 * s;
        if weighted > budget {
            return 0;
        }
        let free = ((budget - weighted) / s) as u64;
        free.saturating_sub(whole)
    }

    fn retry_after(&self, state: &SlidingWindowState, now: Nanos, min_hits: u64) -> Option<Nanos> {
        if min_hits > self.limit.get() {
            return None;
        }
        let view = self.view(state, now);
        let s = self.sub.as_u64();
        let n = self.n();
        // Each step shifts the counters by one sub-window: the one at index
        // N - 2 becomes the oldest and leaves the whole sum. O(N) in all.
        let (mut whole, mut oldest) = self.split(state, view.shift);
        for k in 0..=n {
            let from = if k == 0 { view.elapsed } else { 0 };
            if let Some(r) = self.limit.get().checked_sub(whole.saturating_add(min_hits)) {
                // Need oldest·(S − e) <= r·S, i.e. e >= S − floor(r·S / oldest).
                let e_min = if oldest == 0 {
                    0
                } else {
                    let slack = (r as u128 * s as u128) / oldest as u128;
                    s.saturating_sub(slack.min(s as u128) as u64)
                };
                let e = e_min.max(from);
                if e < s {
                    let at = view
                        .start
                        .saturating_add(self.sub.get().saturating_mul(k as u64))
                        .saturating_add(Nanos::new(e));
                    return Some(at.saturating_sub(now));
                }
            }
            let moving = self.count_at(state, view.shift + k, n - 2);
            whole = whole.saturating_sub(moving);
            oldest = moving;
        }
        // Unreachable: after N shifts every counter is gone.
        Some(Nanos::ZERO)
    }
}

impl Algorithm for SlidingWindow {
    type State = SlidingWindowState;

    fn fresh(&self) -> SlidingWindowState {
        SlidingWindowState {
            start: Nanos::ZERO,
            counts: smallvec![0; self.n()],
        }
    }

    fn room(&self, state: &SlidingWindowState, now: Nanos, hits: u64) -> u64 {
        let view = self.view(state, now);
        let (whole, oldest) = self.split(state, view.shift);
        self.room_with(whole, oldest, view.elapsed).min(hits)
    }

    fn commit(
        &self,
        state: &mut SlidingWindowState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        if grant.granted > 0 {
            self.add(state, now, grant.granted);
        }
        self.describe(state, now, request, grant)
    }

    fn is_idle(&self, state: &SlidingWindowState, now: Nanos) -> bool {
        let view = self.view(state, now);
        (0..self.n()).all(|i| self.count_at(state, view.shift, i) == 0)
    }
}

impl SlidingWindow {
    /// Moves the counters to `now` and counts `hits` in the current one.
    fn add(&self, state: &mut SlidingWindowState, now: Nanos, hits: u64) {
        self.shift(state, now);
        if let Some(current) = state.counts.first_mut() {
            *current = current.saturating_add(hits);
        }
    }

    /// Moves the counters so that `counts[0]` is the sub-window of `now`.
    fn shift(&self, state: &mut SlidingWindowState, now: Nanos) {
        let view = self.view(state, now);
        if view.shift > 0 {
            let n = self.n();
            state.counts.resize(n, 0);
            state.counts.rotate_right(view.shift.min(n));
            for c in state.counts.iter_mut().take(view.shift) {
                *c = 0;
            }
            state.start = view.start;
        }
    }

    fn describe(
        &self,
        state: &SlidingWindowState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        let view = self.view(state, now);
        let (whole, oldest) = self.split(state, view.shift);
        let newest = (0..self.n()).find(|&i| self.count_at(state, view.shift, i) > 0);
        let reset_after = match newest {
            Some(i) => view
                .start
                .saturating_add(self.sub.get().saturating_mul((self.n() - i) as u64))
                .saturating_sub(now),
            None => Nanos::ZERO,
        };
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit: self.limit.get(),
            remaining: self.room_with(whole, oldest, view.elapsed),
            reset_after,
            retry_after: self.retry_after(state, now, request.min_hits),
            wait: Nanos::ZERO,
            tier: None,
        }
    }
}

impl Usage for SlidingWindow {
    /// Counts the hits in the current sub-window even past the limit, as
    /// long as the estimate stays within `limit + max_debt`.
    fn report(&self, state: &mut SlidingWindowState, now: Nanos, hits: u64) -> Decision {
        let view = self.view(state, now);
        let (whole, oldest) = self.split(state, view.shift);
        let limit = self.limit.get().saturating_add(self.max_debt);
        let charged = self
            .room_under(limit, whole, oldest, view.elapsed)
            .min(hits);
        if charged > 0 {
            self.add(state, now, charged);
        }
        let grant = Grant {
            granted: charged,
            allowed: true,
        };
        self.describe(state, now, NEXT_HIT, grant)
    }

    /// Uncounts hits still inside the window, newest sub-window first,
    /// never below zero.
    fn refund(&self, state: &mut SlidingWindowState, now: Nanos, hits: u64) -> Decision {
        let mut left = hits;
        if !self.is_idle(state, now) {
            self.shift(state, now);
            for c in state.counts.iter_mut() {
                let back = left.min(*c);
                *c -= back;
                left -= back;
            }
        }
        let grant = Grant {
            granted: hits - left,
            allowed: true,
        };
        self.describe(state, now, NEXT_HIT, grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_buckets_weigh_the_previous_window() {
        // Seed 004's example: 100 per minute, a call at 00:01:43 counts the
        // previous minute at 17/60.
        let w = SlidingWindow::new(100, Nanos::from_secs(60), 2).unwrap();
        let mut s = w.fresh();
        assert_eq!(
            w.decide(&mut s, Nanos::from_secs(30), Hits::between(1, 60))
                .granted,
            60
        );
        let t = Nanos::from_secs(103);
        // 60 × 17/60 = 17 estimated from the previous minute.
        assert_eq!(w.decide(&mut s, t, Hits::between(1, 1000)).granted, 83);
        let d = w.decide(&mut s, t, Hits::exactly(1));
        assert!(!d.allowed);
        // One more fits once the previous minute weighs 16/60 or less: 1 s.
        assert_eq!(d.retry_after, Some(Nanos::from_secs(1)));
    }

    #[test]
    fn five_buckets_track_fifteen_second_windows() {
        let w = SlidingWindow::new(10, Nanos::from_secs(60), 5).unwrap();
        assert_eq!(w.sub_window(), Nanos::from_secs(15));
        let mut s = w.fresh();
        assert!(
            w.decide(&mut s, Nanos::from_secs(0), Hits::exactly(10))
                .allowed
        );
        assert!(
            !w.decide(&mut s, Nanos::from_secs(59), Hits::exactly(1))
                .allowed
        );
        // At 60 s the first sub-window is the oldest, fully weighted; it
        // fades over [60, 75): 10·(15 − e)/15 <= 9 from e = 1.5 s.
        let d = w.decide(&mut s, Nanos::from_secs(60), Hits::exactly(1));
        assert_eq!(d.retry_after, Some(Nanos::from_millis(1500)));
        assert!(
            w.decide(&mut s, Nanos::from_millis(61_500), Hits::exactly(1))
                .allowed
        );
        // That hit, in the sub-window [60, 75), weighs until 135 s.
        assert!(!w.is_idle(&s, Nanos::from_millis(134_999)));
        assert!(w.is_idle(&s, Nanos::from_secs(135)));
    }

    #[test]
    fn rejects_bad_bucket_counts() {
        assert!(SlidingWindow::new(1, Nanos::SECOND, 1).is_err());
        assert!(SlidingWindow::new(1, Nanos::new(2), 4).is_err());
        assert!(SlidingWindow::new(1, Nanos::SECOND, MAX_BUCKETS + 1).is_err());
    }
}
