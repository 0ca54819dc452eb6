//! The leaky bucket as a queue (seed 002, seed 004's note).
//!
//! Requests pour into a bucket of `queue_size` hits that drains at a constant
//! rate; a request that would overflow is rejected, an admitted one is told
//! the delay at which it may proceed, so what leaves the bucket is perfectly
//! smooth. There is no background "drip" (seed 002's weakness of the naive
//! leaky bucket): the state is the time at which the bucket will be empty,
//! and the level is derived from it.
//!
//! `queue_size` counts every hit in the bucket, including the one being
//! released now: a fresh bucket of size 5 admits 5 simultaneous hits, which
//! proceed after 0, T, 2T, 3T and 4T. A request for `n` hits proceeds when
//! its last hit's turn comes, so the output never exceeds one hit per `T`.
//! Admission is the same arithmetic as GCRA with `burst = queue_size`; the
//! difference is that GCRA lets conforming hits through at once while the
//! leaky bucket spreads them out.

use crate::algorithm::{Algorithm, Schedule, Usage};
use crate::algorithms::gcra::{Gcra, GcraState};
use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::rate::Rate;
use crate::time::Nanos;

/// Leaky-bucket parameters: the drain rate and the bucket size.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeakyBucket {
    meter: Gcra,
}

impl LeakyBucket {
    /// Drains at `rate`, holds at most `queue_size` hits (at least 1).
    pub fn new(rate: Rate, queue_size: u64) -> Result<LeakyBucket, ParamError> {
        Gcra::new(rate, queue_size)
            .map(|meter| LeakyBucket { meter })
            .map_err(|e| match e {
                ParamError::MustBePositive { .. } => ParamError::MustBePositive {
                    param: "queue_size",
                },
                ParamError::TooLarge { reason, .. } => ParamError::TooLarge {
                    param: "queue_size",
                    reason,
                },
                other => other,
            })
    }

    /// The GCRA meter this bucket is decided by (interval and tolerance).
    pub fn meter(&self) -> &Gcra {
        &self.meter
    }

    /// Bounds the debt a report may leave at `max_debt` hits beyond the
    /// queue ([`Usage`]); the default is one queue.
    pub fn with_max_debt(self, max_debt: u64) -> Result<LeakyBucket, ParamError> {
        Ok(LeakyBucket {
            meter: self.meter.with_max_debt(max_debt)?,
        })
    }

    /// The bucket size.
    pub fn queue_size(&self) -> u64 {
        self.meter.burst()
    }

    #[inline]
    fn decision(&self, state: &GcraState, now: Nanos, request: Hits, grant: Grant) -> Decision {
        let mut d = self.meter.describe(state, now, request, grant);
        if grant.granted > 0 {
            // The last granted hit drains during [tat - T, tat).
            d.wait = state
                .tat
                .saturating_sub(self.meter.interval())
                .saturating_sub(now);
        }
        d
    }
}

impl Algorithm for LeakyBucket {
    type State = GcraState;

    fn fresh(&self) -> GcraState {
        GcraState::default()
    }

    #[inline]
    fn room(&self, state: &GcraState, now: Nanos, hits: u64) -> u64 {
        self.meter.room(state, now, hits)
    }

    #[inline]
    fn commit(&self, state: &mut GcraState, now: Nanos, request: Hits, grant: Grant) -> Decision {
        if grant.granted > 0 {
            self.meter.advance(state, now, grant.granted);
        }
        self.decision(state, now, request, grant)
    }

    #[inline]
    fn is_idle(&self, state: &GcraState, now: Nanos) -> bool {
        state.tat <= now
    }
}

/// The hits of a report or refund were used, or never will be: nothing
/// waits, so the decisions are the meter's.
impl Usage for LeakyBucket {
    fn report(&self, state: &mut GcraState, now: Nanos, hits: u64) -> Decision {
        self.meter.report(state, now, hits)
    }

    fn refund(&self, state: &mut GcraState, now: Nanos, hits: u64) -> Decision {
        self.meter.refund(state, now, hits)
    }
}

impl Schedule for LeakyBucket {
    /// Queues the hits even past `queue_size`: the caller chose to wait.
    fn acquire(&self, state: &mut GcraState, now: Nanos, hits: u64) -> Decision {
        self.meter.advance(state, now, hits);
        let grant = Grant {
            granted: hits,
            allowed: true,
        };
        // Like the other schedulers, retry_after is for one more hit.
        self.decision(state, now, Hits::between(hits.min(1), hits), grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admitted_hits_are_spread_at_the_drain_rate() {
        let b = LeakyBucket::new(Rate::per_second(4).unwrap(), 3).unwrap();
        let mut s = b.fresh();
        let waits: Vec<_> = (0..3)
            .map(|_| b.decide(&mut s, Nanos::ZERO, Hits::exactly(1)).wait)
            .collect();
        assert_eq!(
            waits,
            vec![
                Nanos::ZERO,
                Nanos::from_millis(250),
                Nanos::from_millis(500)
            ]
        );
        let full = b.decide(&mut s, Nanos::ZERO, Hits::exactly(1));
        assert!(!full.allowed, "a full queue rejects");
        assert_eq!(full.retry_after, Some(Nanos::from_millis(250)));
        assert_eq!(full.reset_after, Nanos::from_millis(750));
    }

    #[test]
    fn a_batch_proceeds_with_its_last_hit() {
        let b = LeakyBucket::new(Rate::per_second(10).unwrap(), 10).unwrap();
        let mut s = b.fresh();
        let d = b.decide(&mut s, Nanos::ZERO, Hits::exactly(4));
        assert_eq!(d.wait, Nanos::from_millis(300));
        let d = b.decide(&mut s, Nanos::ZERO, Hits::exactly(1));
        assert_eq!(d.wait, Nanos::from_millis(400));
    }

    #[test]
    fn queue_size_one_is_a_constant_rate_meter() {
        let b = LeakyBucket::new(Rate::per_second(2).unwrap(), 1).unwrap();
        let mut s = b.fresh();
        assert!(b.decide(&mut s, Nanos::ZERO, Hits::exactly(1)).allowed);
        assert!(
            !b.decide(&mut s, Nanos::from_millis(499), Hits::exactly(1))
                .allowed
        );
        assert!(
            b.decide(&mut s, Nanos::from_millis(500), Hits::exactly(1))
                .allowed
        );
    }

    #[test]
    fn zero_queue_is_a_named_error() {
        let e = LeakyBucket::new(Rate::per_second(1).unwrap(), 0).unwrap_err();
        assert_eq!(
            e,
            ParamError::MustBePositive {
                param: "queue_size"
            }
        );
    }
}
