//! A rate: `count` events per `period`.
//!
//! Algorithms that refill or drain continuously work with the emission
//! interval `period / count` in whole nanoseconds. The interval is rounded
//! down, which errs on the side of leniency (Charon §1, goal 2) by less than
//! one nanosecond per hit; a rate faster than one hit per nanosecond is
//! refused rather than silently slowed.

use std::fmt;
use std::num::NonZeroU64;

use crate::error::ParamError;
use crate::time::Nanos;

/// `count` hits per `period`; see the module docs for rounding.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct Rate {
    count: NonZeroU64,
    period: Nanos,
}

impl Rate {
    /// A rate of `count` per `period`. Both must be positive and the
    /// interval between hits at least one nanosecond.
    pub fn new(count: u64, period: Nanos) -> Result<Rate, ParamError> {
        let count = ParamError::positive("rate", count)?;
        if period.is_zero() {
            return Err(ParamError::MustBePositive {
                param: "rate period",
            });
        }
        if period.as_u64() / count == 0 {
            return Err(ParamError::TooLarge {
                param: "rate",
                reason: format!("{count} per {period} is faster than one hit per nanosecond"),
            });
        }
        Ok(Rate { count, period })
    }

    /// `count` per second.
    pub fn per_second(count: u64) -> Result<Rate, ParamError> {
        Rate::new(count, Nanos::SECOND)
    }

    /// Hits per period.
    pub const fn count(&self) -> u64 {
        self.count.get()
    }

    /// The period.
    pub const fn period(&self) -> Nanos {
        self.period
    }

    /// Nanoseconds between two hits, rounded down (at least 1).
    #[inline]
    pub const fn interval(&self) -> Nanos {
        Nanos::new(self.period.as_u64() / self.count.get())
    }

    /// Hits per second as a float (for Guava-style algorithms).
    pub fn per_second_f64(&self) -> f64 {
        self.count.get() as f64 * 1e9 / self.period.as_u64() as f64
    }
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, self.period)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, self.period)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_rounds_down() {
        let r = Rate::new(3, Nanos::SECOND).unwrap();
        assert_eq!(r.interval(), Nanos::new(333_333_333));
        let r = Rate::new(100, Nanos::from_secs(60)).unwrap();
        assert_eq!(r.interval(), Nanos::from_millis(600));
    }

    #[test]
    fn rejects_impossible_rates() {
        assert!(Rate::new(0, Nanos::SECOND).is_err());
        assert!(Rate::new(1, Nanos::ZERO).is_err());
        assert!(Rate::new(2_000_000_000, Nanos::SECOND).is_err());
        assert!(Rate::new(1_000_000_000, Nanos::SECOND).is_ok());
    }
}
