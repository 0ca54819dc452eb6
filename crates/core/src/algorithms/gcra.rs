//! GCRA, the generic cell rate algorithm (seed 002's redis-cell link).
//!
//! The state is one timestamp, the theoretical arrival time (TAT): when the
//! key would be back to full if nothing else arrived. A request for `n` hits
//! conforms when `max(TAT, now) + n·T <= now + burst·T`, where `T` is the
//! emission interval. `burst` is how many requests may arrive at once, so a
//! fresh key admits exactly `burst` simultaneous hits and then one every `T`.
//!
//! GCRA is mathematically a token bucket of capacity `burst`; it is kept as
//! its own algorithm because it is the one users of redis-cell and governor
//! configure, with their vocabulary, and because its state is 8 bytes.

use std::num::NonZeroU64;

use crate::algorithm::{Algorithm, Alone, Schedule, Usage, NEXT_HIT};
use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::rate::Rate;
use crate::time::{Nanos, Span};

/// GCRA parameters: a rate and a burst.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Gcra {
    interval: Nanos,
    burst: NonZeroU64,
    /// `burst × interval`: at most [`Span::MAX`], far from `u64` overflow
    /// when added to a Unix-epoch time.
    tolerance: Span,
    /// `max_debt × interval`: how much further than the tolerance a report
    /// may push the TAT ahead of now. Zero or a span; one tolerance by
    /// default.
    debt: Nanos,
}

/// GCRA state: the theoretical arrival time.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GcraState {
    /// When the key is back to full; anything at or before `now` means full.
    pub tat: Nanos,
}

impl Gcra {
    /// `rate` sustained, `burst` hits admitted at once (at least 1).
    pub fn new(rate: Rate, burst: u64) -> Result<Gcra, ParamError> {
        let burst = ParamError::positive("burst", burst)?;
        let interval = rate.interval();
        let tolerance = ParamError::hits_span("burst", burst, interval)?;
        Ok(Gcra {
            interval,
            burst,
            tolerance,
            debt: tolerance.get(),
        })
    }

    /// Bounds the debt a report may leave at `max_debt` hits beyond the
    /// burst ([`Usage`]); the default is one burst.
    pub fn with_max_debt(mut self, max_debt: u64) -> Result<Gcra, ParamError> {
        self.debt = match NonZeroU64::new(max_debt) {
            None => Nanos::ZERO,
            Some(n) => ParamError::hits_span("max_debt", n, self.interval)?.get(),
        };
        Ok(self)
    }

    /// `interval × max_debt`: how much further than the tolerance a report
    /// may push the TAT ahead of now.
    pub fn debt_time(&self) -> Nanos {
        self.debt
    }

    /// The most hits a report may leave owing beyond the burst.
    pub fn max_debt(&self) -> u64 {
        self.debt.as_u64() / self.interval.as_u64()
    }

    /// Charges up to `hits` into debt: the TAT may run `tolerance + debt`
    /// ahead of now. Returns the hits charged.
    #[inline]
    pub(crate) fn charge(&self, state: &mut GcraState, now: Nanos, hits: u64) -> u64 {
        let start = state.tat.max(now);
        let horizon = now
            .saturating_add(self.tolerance.get())
            .saturating_add(self.debt);
        let fits = horizon.saturating_sub(start).as_u64() / self.interval.as_u64();
        let charged = hits.min(fits);
        if charged > 0 {
            self.advance(state, now, charged);
        }
        charged
    }

    /// Moves the TAT back by up to `hits`, never before now (a full key).
    /// Returns the hits given back: whole intervals, so a fraction of one
    /// left before now is not counted.
    #[inline]
    pub(crate) fn give_back(&self, state: &mut GcraState, now: Nanos, hits: u64) -> u64 {
        let ahead = state.tat.saturating_sub(now);
        let back = self.interval.saturating_mul(hits);
        if back <= ahead {
            state.tat = state.tat.saturating_sub(back);
            hits
        } else {
            if state.tat > now {
                state.tat = now;
            }
            ahead.as_u64() / self.interval.as_u64()
        }
    }

    /// The emission interval `T`.
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// `interval × burst`: how far the theoretical arrival time may run
    /// ahead of now.
    pub fn tolerance(&self) -> Nanos {
        self.tolerance.get()
    }

    /// Hits admitted at once.
    pub fn burst(&self) -> u64 {
        self.burst.get()
    }

    #[inline]
    fn room_at(&self, tat: Nanos, now: Nanos) -> u64 {
        let horizon = now.saturating_add(self.tolerance.get());
        let free = horizon.saturating_sub(tat.max(now));
        free.as_u64() / self.interval.as_u64()
    }

    /// Time from `now` until `min_hits` conform, given the TAT.
    #[inline]
    fn retry_after(&self, tat: Nanos, now: Nanos, min_hits: u64) -> Option<Nanos> {
        if min_hits > self.burst.get() {
            return None;
        }
        if min_hits == 0 {
            // Granted now, even in debt after an acquire.
            return Some(Nanos::ZERO);
        }
        let needed = tat
            .saturating_add(self.interval.saturating_mul(min_hits))
            .saturating_sub(self.tolerance.get());
        Some(needed.saturating_sub(now))
    }

    /// Describes the state after a decision.
    #[inline]
    pub(crate) fn describe(
        &self,
        state: &GcraState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit: self.burst.get(),
            remaining: self.room_at(state.tat, now),
            reset_after: state.tat.saturating_sub(now),
            retry_after: self.retry_after(state.tat, now, request.min_hits),
            wait: Nanos::ZERO,
            tier: None,
        }
    }

    /// Advances the TAT by `hits` from `now`; returns the TAT before.
    #[inline]
    pub(crate) fn advance(&self, state: &mut GcraState, now: Nanos, hits: u64) -> Nanos {
        let start = state.tat.max(now);
        state.tat = start.saturating_add(self.interval.saturating_mul(hits));
        start
    }
}

impl Algorithm for Gcra {
    type State = GcraState;

    /// The whole decision in one pass and at most one division: the hot
    /// path of a single GCRA limit. Same answer as `room` then `commit`.
    #[inline]
    fn decide_alone(&self, state: &mut GcraState, now: Nanos, request: Hits) -> Alone {
        let t = self.interval.as_u64();
        let start = state.tat.max(now);
        let horizon = now.saturating_add(self.tolerance.get());
        let free = horizon.saturating_sub(start).as_u64();
        let hits = request.hits;
        let (room, slots) = match hits.checked_mul(t) {
            // All fit: the slots left after them need the one division.
            Some(cost) if cost <= free => (hits, (free - cost) / t + hits),
            _ => {
                let slots = free / t;
                (slots.min(hits), slots)
            }
        };
        let grant = Grant::from_room(request, room);
        if grant.granted > 0 {
            state.tat = start.saturating_add(Nanos::new(t.saturating_mul(grant.granted)));
        }
        Alone {
            decision: Decision {
                granted: grant.granted,
                allowed: grant.allowed,
                limit: self.burst.get(),
                remaining: slots - grant.granted,
                reset_after: state.tat.saturating_sub(now),
                retry_after: self.retry_after(state.tat, now, request.min_hits),
                wait: Nanos::ZERO,
                tier: None,
            },
            room,
            idle: state.tat <= now,
        }
    }

    fn fresh(&self) -> GcraState {
        GcraState::default()
    }

    #[inline]
    fn room(&self, state: &GcraState, now: Nanos, hits: u64) -> u64 {
        // The common question is "do all `hits` fit?": one multiply answers
        // it; only a request that does not fit pays for the division.
        let free = now
            .saturating_add(self.tolerance.get())
            .saturating_sub(state.tat.max(now))
            .as_u64();
        match hits.checked_mul(self.interval.as_u64()) {
            Some(cost) if cost <= free => hits,
            _ => (free / self.interval.as_u64()).min(hits),
        }
    }

    #[inline]
    fn commit(&self, state: &mut GcraState, now: Nanos, request: Hits, grant: Grant) -> Decision {
        if grant.granted > 0 {
            self.advance(state, now, grant.granted);
        }
        self.describe(state, now, request, grant)
    }

    #[inline]
    fn is_idle(&self, state: &GcraState, now: Nanos) -> bool {
        state.tat <= now
    }
}

impl Usage for Gcra {
    fn report(&self, state: &mut GcraState, now: Nanos, hits: u64) -> Decision {
        let granted = self.charge(state, now, hits);
        let grant = Grant {
            granted,
            allowed: true,
        };
        self.describe(state, now, NEXT_HIT, grant)
    }

    fn refund(&self, state: &mut GcraState, now: Nanos, hits: u64) -> Decision {
        let granted = self.give_back(state, now, hits);
        let grant = Grant {
            granted,
            allowed: true,
        };
        self.describe(state, now, NEXT_HIT, grant)
    }
}

impl Schedule for Gcra {
    fn acquire(&self, state: &mut GcraState, now: Nanos, hits: u64) -> Decision {
        self.advance(state, now, hits);
        let request = Hits::exactly(hits);
        let grant = Grant {
            granted: hits,
            allowed: true,
        };
        let mut d = self.describe(state, now, request, grant);
        // The last hit conforms once the TAT is within the tolerance.
        d.wait = state
            .tat
            .saturating_sub(self.tolerance.get())
            .saturating_sub(now);
        d.retry_after = self.retry_after(state.tat, now, 1);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(per_sec: u64, burst: u64) -> Gcra {
        Gcra::new(Rate::per_second(per_sec).unwrap(), burst).unwrap()
    }

    #[test]
    fn fresh_key_admits_exactly_burst_at_once() {
        let g = gcra(10, 5);
        let mut s = g.fresh();
        let now = Nanos::from_secs(100);
        for i in 0..5 {
            let d = g.decide(&mut s, now, Hits::exactly(1));
            assert!(d.allowed, "hit {i}");
            assert_eq!(d.remaining, 4 - i);
        }
        let d = g.decide(&mut s, now, Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.granted, 0);
        assert_eq!(d.retry_after, Some(Nanos::from_millis(100)));
        assert_eq!(d.reset_after, Nanos::from_millis(500));
        // One interval later exactly one more conforms.
        let later = now.saturating_add(Nanos::from_millis(100));
        assert!(g.decide(&mut s, later, Hits::exactly(1)).allowed);
        assert!(!g.decide(&mut s, later, Hits::exactly(1)).allowed);
    }

    #[test]
    fn partial_grant_is_the_largest_that_fits() {
        let g = gcra(1, 10);
        let mut s = g.fresh();
        let d = g.decide(&mut s, Nanos::ZERO, Hits::between(1, 25));
        assert_eq!(d.granted, 10);
        let d = g.decide(&mut s, Nanos::ZERO, Hits::between(2, 5));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Nanos::from_secs(2)));
    }

    #[test]
    fn more_than_burst_never_conforms() {
        let g = gcra(1, 3);
        let mut s = g.fresh();
        let d = g.decide(&mut s, Nanos::ZERO, Hits::exactly(4));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None);
        assert!(g.is_idle(&s, Nanos::ZERO), "a rejection changes nothing");
    }

    #[test]
    fn acquire_schedules_past_the_burst() {
        let g = gcra(2, 1);
        let mut s = g.fresh();
        let d = g.acquire(&mut s, Nanos::ZERO, 1);
        assert_eq!(d.wait, Nanos::ZERO);
        let d = g.acquire(&mut s, Nanos::ZERO, 1);
        assert_eq!(d.wait, Nanos::from_millis(500));
        let d = g.acquire(&mut s, Nanos::ZERO, 2);
        assert_eq!(d.wait, Nanos::from_millis(1500));
    }

    #[test]
    fn rejects_spans_that_overflow() {
        assert!(Gcra::new(Rate::new(1, Nanos::from_secs(86_400)).unwrap(), u64::MAX).is_err());
        assert!(Gcra::new(Rate::per_second(1).unwrap(), 0).is_err());
    }
}
