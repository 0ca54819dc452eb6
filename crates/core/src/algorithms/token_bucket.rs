//! The token bucket (seed 002, seed 004, thesis §2.2).
//!
//! A bucket holds up to `capacity` tokens and refills continuously at
//! `rate`; a hit takes a token, and a request that finds too few tokens takes
//! none. Tokens are fractional (seed 004's note: an integer refill would
//! improperly replenish the bucket). They are kept exactly, as *token-time*:
//! `tokens × T` nanoseconds, where `T` is the refill interval, so a refill of
//! `e` nanoseconds adds exactly `e / T` tokens with no rounding at all.
//!
//! `initial_tokens` (default `capacity`) is what a new bucket holds; it may
//! exceed the capacity (seed 004's "burst": more than the capacity at first,
//! never refilled past it). A bucket that is full and has not been used for
//! a whole refill time (`capacity × T`) is forgotten and starts again from
//! `initial_tokens` (seed 004: "if a bucket is too old, the token count is
//! reset"). With the default `initial_tokens` forgetting is invisible,
//! because a full bucket and a new one behave alike; it is what lets a store
//! drop idle keys and keep memory bounded.

use std::num::NonZeroU64;

use crate::algorithm::{Algorithm, Schedule, Usage, NEXT_HIT};
use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::rate::Rate;
use crate::time::{Nanos, Span};

/// Token-bucket parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    capacity: NonZeroU64,
    initial: u64,
    interval: Nanos,
    /// `capacity × interval`, the token-time of a full bucket (a [`Span`],
    /// so it fits an `i64`).
    full: i64,
    /// `initial × interval`, zero or a [`Span`].
    initial_time: i64,
    /// `max_debt × interval`: how far below empty a report may take the
    /// token-time; zero or a [`Span`]. Defaults to `full` (one capacity).
    debt: i64,
}

/// Marks a bucket that has never been used.
const NEVER: u64 = u64::MAX;

/// Token-bucket state: stored token-time and when it was last used.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Tokens × interval, in nanoseconds; negative when in debt after an
    /// acquire.
    pub token_time: i64,
    /// When tokens were last taken (`u64::MAX`: never).
    pub last: u64,
}

impl TokenBucket {
    /// A bucket of `capacity` refilled at `rate`; a new bucket starts full.
    pub fn new(capacity: u64, rate: Rate) -> Result<TokenBucket, ParamError> {
        TokenBucket::with_initial(capacity, rate, capacity)
    }

    /// As [`TokenBucket::new`], with `initial` tokens in a new bucket.
    pub fn with_initial(
        capacity: u64,
        rate: Rate,
        initial: u64,
    ) -> Result<TokenBucket, ParamError> {
        let capacity = ParamError::positive("capacity", capacity)?;
        let interval = rate.interval();
        // A span is at most 2^62 ns: the token-times fit an `i64`.
        let full = ParamError::hits_span("capacity", capacity, interval)?.as_u64() as i64;
        let initial_time = match NonZeroU64::new(initial) {
            None => 0,
            Some(n) => ParamError::hits_span("initial_tokens", n, interval)?.as_u64() as i64,
        };
        Ok(TokenBucket {
            capacity,
            initial,
            interval,
            full,
            initial_time,
            debt: full,
        })
    }

    /// Bounds the debt a report may leave at `max_debt` tokens below
    /// empty ([`Usage`]); the default is one capacity.
    pub fn with_max_debt(mut self, max_debt: u64) -> Result<TokenBucket, ParamError> {
        self.debt = match NonZeroU64::new(max_debt) {
            None => 0,
            Some(n) => ParamError::hits_span("max_debt", n, self.interval)?.as_u64() as i64,
        };
        Ok(self)
    }

    /// `interval × max_debt`: how far below empty a report may take the
    /// token-time.
    pub fn debt_time(&self) -> Nanos {
        Nanos::new(self.debt as u64)
    }

    /// The most tokens a report may leave the bucket owing.
    pub fn max_debt(&self) -> u64 {
        self.debt as u64 / self.interval.as_u64()
    }

    /// Nanoseconds per token, rounded down (see [`Rate`]).
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// `interval × capacity`: the token time of a full bucket.
    pub fn full_time(&self) -> Nanos {
        Nanos::new(self.full as u64)
    }

    /// `interval × initial_tokens`: the token time of a fresh bucket.
    pub fn initial_time(&self) -> Nanos {
        Nanos::new(self.initial_time as u64)
    }

    /// Tokens a full bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity.get()
    }

    /// Tokens a new bucket holds.
    pub fn initial_tokens(&self) -> u64 {
        self.initial
    }

    /// Whether the bucket is forgotten at `now`: full, and unused for a
    /// whole refill time (strictly after both, so a request at the instant
    /// the bucket becomes full still sees it full).
    fn forgotten(&self, state: &TokenBucketState, now: Nanos) -> bool {
        if state.last == NEVER {
            return true;
        }
        let idle = now.as_u64().saturating_sub(state.last);
        // Unused for a whole refill time after repaying any debt: by then
        // the bucket is full, whatever it held.
        let needed = (self.full as u64).saturating_add(state.token_time.min(0).unsigned_abs());
        idle > needed
    }

    /// Token-time available at `now`.
    fn level(&self, state: &TokenBucketState, now: Nanos) -> i64 {
        if self.forgotten(state, now) {
            return self.initial_time;
        }
        if state.token_time >= self.full {
            // Initial tokens above the capacity are spent, never refilled.
            return state.token_time;
        }
        let elapsed = now
            .as_u64()
            .saturating_sub(state.last)
            .min(Span::MAX.as_u64()) as i64;
        state.token_time.saturating_add(elapsed).min(self.full)
    }

    fn tokens(&self, token_time: i64) -> u64 {
        if token_time <= 0 {
            0
        } else {
            token_time as u64 / self.interval.as_u64()
        }
    }

    fn take(&self, state: &mut TokenBucketState, now: Nanos, hits: u64) {
        let cost = self
            .interval
            .as_u64()
            .saturating_mul(hits)
            .min(i64::MAX as u64) as i64;
        let forgotten = self.forgotten(state, now);
        state.token_time = self.level(state, now).saturating_sub(cost);
        // A time before the last use (a clock or trace going backwards)
        // must not move the refill origin back: that span would be
        // refilled twice.
        state.last = if forgotten {
            now.as_u64()
        } else {
            state.last.max(now.as_u64())
        };
    }

    fn retry_after(&self, state: &TokenBucketState, now: Nanos, min_hits: u64) -> Option<Nanos> {
        if min_hits == 0 {
            // Granted now, even in debt after an acquire.
            return Some(Nanos::ZERO);
        }
        let level = self.level(state, now);
        let needed = self.interval.as_u64().saturating_mul(min_hits);
        if level >= 0 && level as u64 >= needed {
            return Some(Nanos::ZERO);
        }
        if min_hits <= self.capacity.get() {
            // Refill adds one nanosecond of token-time per nanosecond.
            let missing = (needed as i128 - level as i128).max(0) as u64;
            return Some(Nanos::new(missing));
        }
        if min_hits <= self.initial && state.last != NEVER {
            // Only a forgotten bucket holds that many again.
            let needed_idle =
                (self.full as u64).saturating_add(state.token_time.min(0).unsigned_abs());
            let at = state.last.saturating_add(needed_idle).saturating_add(1);
            return Some(Nanos::new(at).saturating_sub(now));
        }
        None
    }

    fn describe(
        &self,
        state: &TokenBucketState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        let level = self.level(state, now);
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit: self.capacity.get(),
            remaining: self.tokens(level),
            reset_after: Nanos::new((self.full as i128 - level as i128).max(0) as u64),
            retry_after: self.retry_after(state, now, request.min_hits),
            wait: Nanos::ZERO,
            tier: None,
        }
    }
}

impl Algorithm for TokenBucket {
    type State = TokenBucketState;

    fn fresh(&self) -> TokenBucketState {
        TokenBucketState {
            token_time: self.initial_time,
            last: NEVER,
        }
    }

    fn room(&self, state: &TokenBucketState, now: Nanos, hits: u64) -> u64 {
        self.tokens(self.level(state, now)).min(hits)
    }

    fn commit(
        &self,
        state: &mut TokenBucketState,
        now: Nanos,
        request: Hits,
        grant: Grant,
    ) -> Decision {
        if grant.granted > 0 {
            self.take(state, now, grant.granted);
        } else if self.forgotten(state, now) && self.initial < self.capacity.get() {
            // A new bucket below capacity starts refilling from its first
            // request, even a rejected one; nothing is taken.
            self.take(state, now, 0);
        }
        self.describe(state, now, request, grant)
    }

    fn is_idle(&self, state: &TokenBucketState, now: Nanos) -> bool {
        self.forgotten(state, now)
    }
}

impl Usage for TokenBucket {
    /// Takes the tokens into debt, down to `max_debt` below empty.
    fn report(&self, state: &mut TokenBucketState, now: Nanos, hits: u64) -> Decision {
        let level = self.level(state, now) as i128;
        let floor = -(self.debt as i128);
        let interval = self.interval.as_u64() as i128;
        let fits = ((level - floor).max(0) / interval).min(u64::MAX as i128) as u64;
        let charged = hits.min(fits);
        if charged > 0 {
            self.take(state, now, charged);
        }
        let grant = Grant {
            granted: charged,
            allowed: true,
        };
        self.describe(state, now, NEXT_HIT, grant)
    }

    /// Puts tokens back, never above a full bucket (nor lowering one that
    /// holds more, from `initial_tokens`). A forgotten bucket gets nothing:
    /// it is already as fresh as it can be.
    fn refund(&self, state: &mut TokenBucketState, now: Nanos, hits: u64) -> Decision {
        let mut given = 0;
        if !self.forgotten(state, now) {
            let level = self.level(state, now) as i128;
            let top = level.max(self.full as i128);
            let cost = hits as i128 * self.interval.as_u64() as i128;
            let (to, back) = if level + cost <= top {
                (level + cost, hits)
            } else {
                (top, ((top - level) / self.interval.as_u64() as i128) as u64)
            };
            // Between the debt floor and a full bucket (or the initial
            // burst): within an `i64`.
            state.token_time = to as i64;
            state.last = state.last.max(now.as_u64());
            given = back;
        }
        let grant = Grant {
            granted: given,
            allowed: true,
        };
        self.describe(state, now, NEXT_HIT, grant)
    }
}

impl Schedule for TokenBucket {
    /// Takes the tokens even into debt; the wait is the time to repay it.
    fn acquire(&self, state: &mut TokenBucketState, now: Nanos, hits: u64) -> Decision {
        self.take(state, now, hits);
        let grant = Grant {
            granted: hits,
            allowed: true,
        };
        let mut d = self.describe(state, now, Hits::exactly(hits), grant);
        d.wait = Nanos::new(state.token_time.min(0).unsigned_abs());
        d.retry_after = self.retry_after(state, now, 1);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(capacity: u64, per_sec: u64) -> TokenBucket {
        TokenBucket::new(capacity, Rate::per_second(per_sec).unwrap()).unwrap()
    }

    #[test]
    fn drains_then_refills_fractionally() {
        let b = bucket(10, 4);
        let mut s = b.fresh();
        let t0 = Nanos::from_secs(1000);
        let d = b.decide(&mut s, t0, Hits::exactly(10));
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_after, Nanos::from_millis(2500));
        // 100 ms is 0.4 of a token: not enough, but it is kept.
        let t1 = t0.saturating_add(Nanos::from_millis(100));
        let d = b.decide(&mut s, t1, Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Nanos::from_millis(150)));
        let t2 = t0.saturating_add(Nanos::from_millis(250));
        assert!(b.decide(&mut s, t2, Hits::exactly(1)).allowed);
        // The 0.0 left over plus 500 ms is exactly two tokens.
        let t3 = t2.saturating_add(Nanos::from_millis(500));
        assert_eq!(b.decide(&mut s, t3, Hits::between(1, 5)).granted, 2);
    }

    #[test]
    fn never_refills_past_capacity() {
        let b = bucket(3, 1);
        let mut s = b.fresh();
        assert!(b.decide(&mut s, Nanos::ZERO, Hits::exactly(1)).allowed);
        let later = Nanos::from_secs(60);
        let d = b.decide(&mut s, later, Hits::between(1, 10));
        assert_eq!(d.granted, 3);
    }

    #[test]
    fn initial_tokens_above_capacity_are_a_one_off_burst() {
        let b = TokenBucket::with_initial(100, Rate::new(100, Nanos::from_secs(60)).unwrap(), 150)
            .unwrap();
        let mut s = b.fresh();
        let d = b.decide(&mut s, Nanos::ZERO, Hits::between(1, 1000));
        assert_eq!(d.granted, 150);
        // Thirty seconds refill fifty, not more.
        let d = b.decide(&mut s, Nanos::from_secs(30), Hits::between(1, 1000));
        assert_eq!(d.granted, 50);
        // Idle for a whole refill time after being full: the burst returns.
        let t = Nanos::from_secs(30 + 60 + 60 + 1);
        let d = b.decide(&mut s, t, Hits::between(1, 1000));
        assert_eq!(d.granted, 150);
    }

    #[test]
    fn initial_tokens_below_capacity_refill_from_the_first_request() {
        let b = TokenBucket::with_initial(10, Rate::per_second(1).unwrap(), 2).unwrap();
        let mut s = b.fresh();
        let d = b.decide(&mut s, Nanos::ZERO, Hits::exactly(5));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Nanos::from_secs(3)));
        assert!(
            b.decide(&mut s, Nanos::from_secs(3), Hits::exactly(5))
                .allowed
        );
    }

    #[test]
    fn asking_for_more_than_capacity_never_succeeds() {
        let b = bucket(5, 1);
        let mut s = b.fresh();
        let d = b.decide(&mut s, Nanos::ZERO, Hits::exactly(6));
        assert_eq!(d.retry_after, None);
        assert!(b.is_idle(&s, Nanos::ZERO));
    }

    #[test]
    fn acquire_goes_into_debt_and_waits_it_out() {
        let b = bucket(2, 10);
        let mut s = b.fresh();
        assert_eq!(b.acquire(&mut s, Nanos::ZERO, 2).wait, Nanos::ZERO);
        assert_eq!(
            b.acquire(&mut s, Nanos::ZERO, 3).wait,
            Nanos::from_millis(300)
        );
        // The debt is repaid before anything is admitted again.
        let d = b.decide(&mut s, Nanos::from_millis(350), Hits::exactly(1));
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Nanos::from_millis(50)));
        assert!(!b.is_idle(&s, Nanos::from_millis(400)));
    }

    #[test]
    fn bug_time_going_backwards_refills_nothing_twice() {
        // Alternating between two times must not refill the span between
        // them on every swing.
        let b = bucket(10, 1);
        let mut s = b.fresh();
        let granted: u64 = (0..200)
            .map(|i| {
                let t = if i % 2 == 0 { 110 } else { 100 };
                b.decide(&mut s, Nanos::from_secs(t), Hits::exactly(1))
                    .granted
            })
            .sum();
        assert_eq!(granted, 10);
    }

    #[test]
    fn a_full_unused_bucket_is_idle() {
        let b = bucket(10, 10);
        let mut s = b.fresh();
        b.decide(&mut s, Nanos::ZERO, Hits::exactly(10));
        assert!(!b.is_idle(&s, Nanos::from_millis(1000)));
        assert!(b.is_idle(&s, Nanos::from_millis(1001)));
    }
}
