//! The fixed window counter (seed 004, seed 002).
//!
//! Hits are counted per window of `window` length; a window admits `limit`
//! hits. Windows are aligned either to the Unix epoch (`align: epoch`, what
//! envoyproxy/ratelimit and most Redis `INCR` + `EXPIRE` schemes do: every
//! key's window starts at a multiple of `window`) or to the first hit after
//! the previous window ended (`align: first_hit`), or to a time zone's
//! calendar (`align: calendar`: a day, week, month or year starting at
//! local midnight, [`Calendar`]). Cheap and exact about its own windows,
//! but a burst straddling a boundary can pass up to twice the limit in one
//! window-length (seed 002's "stampeding elephant").
//!
//! The state keeps the instant its window ends, not where it started: that
//! is all a decision needs, and a calendar window's end (which no
//! arithmetic on a period gives) is then computed once, when the window
//! starts, rather than on every decision.

use std::num::NonZeroU64;

use crate::algorithm::{Algorithm, Usage, NEXT_HIT};
use crate::calendar::Calendar;
use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::time::{Nanos, Span};

/// Where a window starts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Align {
    /// At multiples of the window length since the Unix epoch.
    #[default]
    Epoch,
    /// At the first hit after the previous window ended.
    FirstHit,
    /// At local midnight of a calendar's day, week, month or year; the
    /// window's length is the calendar's unit.
    Calendar(Calendar),
}

/// Fixed-window parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    limit: NonZeroU64,
    window: Span,
    align: Align,
    /// Hits a report may count beyond the limit ([`Usage`]); one limit by
    /// default.
    max_debt: u64,
}

/// Fixed-window state: the current window and its count.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FixedWindowState {
    /// The first instant after the window the count belongs to.
    pub end: Nanos,
    /// Hits granted in that window.
    pub count: u64,
}

impl FixedWindow {
    /// `limit` hits per `window`, windows aligned as `align` says. With
    /// [`Align::Calendar`], `window` must be the calendar unit's nominal
    /// length ([`crate::CalendarUnit::nominal`]), so the two cannot
    /// disagree; [`FixedWindow::calendar`] needs no `window`.
    pub fn new(limit: u64, window: Nanos, align: Align) -> Result<FixedWindow, ParamError> {
        let limit = ParamError::positive("limit", limit)?;
        let window = ParamError::span("window", window)?;
        if let Align::Calendar(c) = &align {
            if window.get() != c.unit().nominal() {
                return Err(ParamError::Invalid {
                    param: "window",
                    reason: format!(
                        "a calendar window of {} is {} long, not {window}",
                        c.unit(),
                        c.unit().nominal()
                    ),
                });
            }
        }
        Ok(FixedWindow {
            limit,
            window,
            align,
            max_debt: limit.get(),
        })
    }

    /// Bounds the count a report may leave at `limit + max_debt`
    /// ([`Usage`]); the default is one limit beyond it.
    #[must_use]
    pub fn with_max_debt(mut self, max_debt: u64) -> FixedWindow {
        self.max_debt = max_debt;
        self
    }

    /// Hits a report may count beyond the limit.
    pub fn max_debt(&self) -> u64 {
        self.max_debt
    }

    /// `limit` hits per window of `calendar`.
    pub fn calendar(limit: u64, calendar: Calendar) -> Result<FixedWindow, ParamError> {
        let window = calendar.unit().nominal();
        FixedWindow::new(limit, window, Align::Calendar(calendar))
    }

    /// The window's length; for a calendar window its unit's nominal
    /// length (a month is 30 days here), which the real windows are not.
    pub fn window(&self) -> Nanos {
        self.window.get()
    }

    /// A bound on the length of every window: the length itself, or for
    /// a calendar window its unit's longest ([`crate::CalendarUnit::longest`]).
    pub fn longest_window(&self) -> Nanos {
        match &self.align {
            Align::Calendar(c) => c.unit().longest(),
            _ => self.window.get(),
        }
    }

    /// Where windows start.
    pub fn align(&self) -> &Align {
        &self.align
    }

    /// Hits per window.
    pub fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// Whether the stored window still covers `now`. A time before the
    /// window (a clock or trace going backwards) keeps it: forgetting hits
    /// because time went backwards would be an exploit.
    fn current(&self, state: &FixedWindowState, now: Nanos) -> bool {
        state.count > 0 && now < state.end
    }

    fn count(&self, state: &FixedWindowState, now: Nanos) -> u64 {
        if self.current(state, now) {
            state.count
        } else {
            0
        }
    }

    /// The end of the window that starts (or holds) `now`: the one place
    /// a calendar is consulted.
    pub fn window_end(&self, now: Nanos) -> Nanos {
        match &self.align {
            Align::Epoch => Nanos::new(now.as_u64() - now.as_u64() % self.window.as_non_zero())
                .saturating_add(self.window.get()),
            Align::FirstHit => now.saturating_add(self.window.get()),
            Align::Calendar(c) => c.window_at(now).1,
        }
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    fn fresh(&self) -> FixedWindowState {
        FixedWindowState::default()
    }

    #[inline]
    fn room(&self, state: &FixedWindowState, now: Nanos, hits: u64) -> u64 {
        self.limit
            .get()
            .saturating_sub(self.count(state, now))
            .min(hits)
    }

    #[inline]
    fn commit(
        &self,
        state: &mut FixedWindowState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        if grant.granted > 0 {
            if !self.current(state, now) {
                *state = FixedWindowState {
                    end: self.window_end(now),
                    count: 0,
                };
            }
            state.count = state.count.saturating_add(grant.granted);
        }
        let count = self.count(state, now);
        let until_end = if count > 0 {
            state.end.saturating_sub(now)
        } else {
            Nanos::ZERO
        };
        let retry_after = if request.min_hits > self.limit.get() {
            None
        } else if count.saturating_add(request.min_hits) <= self.limit.get() {
            Some(Nanos::ZERO)
        } else {
            Some(until_end)
        };
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit: self.limit.get(),
            remaining: self.limit.get().saturating_sub(count),
            reset_after: until_end,
            retry_after,
            wait: Nanos::ZERO,
            tier: None,
        }
    }

    #[inline]
    fn is_idle(&self, state: &FixedWindowState, now: Nanos) -> bool {
        !self.current(state, now)
    }
}

/// Both go through `commit`, which knows where windows start: a report is
/// a grant the limit did not check, a refund uncounts hits first.
impl Usage for FixedWindow {
    /// Counts the hits even past the limit, up to `limit + max_debt`; the
    /// window's end forgives what is left, as it forgets every count.
    fn report(&self, state: &mut FixedWindowState, now: Nanos, hits: u64) -> Decision {
        let fits = self
            .limit
            .get()
            .saturating_add(self.max_debt)
            .saturating_sub(self.count(state, now));
        let grant = Grant {
            granted: hits.min(fits),
            allowed: true,
        };
        self.commit(state, now, NEXT_HIT, grant)
    }

    /// Uncounts hits of the current window, never below zero.
    fn refund(&self, state: &mut FixedWindowState, now: Nanos, hits: u64) -> Decision {
        let back = hits.min(self.count(state, now));
        state.count -= back;
        let none = Grant {
            granted: 0,
            allowed: true,
        };
        let mut d = self.commit(state, now, NEXT_HIT, none);
        d.granted = back;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_windows_reset_at_the_boundary() {
        let w = FixedWindow::new(3, Nanos::from_secs(60), Align::Epoch).unwrap();
        let mut s = w.fresh();
        let t = Nanos::from_secs(60 * 100 + 59);
        assert_eq!(w.decide(&mut s, t, Hits::between(1, 5)).granted, 3);
        let d = w.decide(&mut s, t, Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Nanos::from_secs(1)));
        // The stampede: a new window one second later admits three more.
        let next = Nanos::from_secs(60 * 101);
        assert_eq!(w.decide(&mut s, next, Hits::between(1, 5)).granted, 3);
    }

    #[test]
    fn first_hit_windows_start_with_the_hit() {
        let w = FixedWindow::new(2, Nanos::from_secs(10), Align::FirstHit).unwrap();
        let mut s = w.fresh();
        let t0 = Nanos::from_secs(7);
        let d = w.decide(&mut s, t0, Hits::exactly(2));
        assert_eq!(d.reset_after, Nanos::from_secs(10));
        assert!(
            !w.decide(&mut s, Nanos::from_secs(16), Hits::exactly(1))
                .allowed
        );
        assert!(
            w.decide(&mut s, Nanos::from_secs(17), Hits::exactly(1))
                .allowed
        );
        assert_eq!(s.end, Nanos::from_secs(27));
    }

    #[test]
    fn time_going_backwards_keeps_the_count() {
        let w = FixedWindow::new(1, Nanos::from_secs(10), Align::FirstHit).unwrap();
        let mut s = w.fresh();
        assert!(
            w.decide(&mut s, Nanos::from_secs(100), Hits::exactly(1))
                .allowed
        );
        assert!(
            !w.decide(&mut s, Nanos::from_secs(95), Hits::exactly(1))
                .allowed
        );
    }
}
