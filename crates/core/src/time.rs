//! Time as the core sees it: whole nanoseconds in a `u64`.
//!
//! The core never reads a clock. Every algorithm receives `now` as an
//! argument (governor's habit), which is what lets replay, the simulator and
//! the store conformance suites drive it with any time they like. One type
//! serves both for instants (nanoseconds since the Unix epoch, or since any
//! origin a trace chooses) and for durations, and all of its arithmetic
//! saturates, so no input can make the core overflow or panic.
//!
//! A duration a *parameter* takes (a window, an epoch, the time to refill a
//! bucket) is a [`Span`]: greater than zero and at most [`Span::MAX`]. It is
//! checked once, by [`Span::new`] or [`Span::times`], and what holds a
//! `Span` never checks again.

use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use thiserror::Error;

/// A point in time or a span of time, in whole nanoseconds.
///
/// Arithmetic saturates at `0` and [`Nanos::MAX`].
#[derive(Copy, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    /// Zero: the origin, or an empty span.
    pub const ZERO: Nanos = Nanos(0);
    /// The largest representable time (about 584 years).
    pub const MAX: Nanos = Nanos(u64::MAX);
    /// One nanosecond, the resolution of every algorithm.
    pub const NANOSECOND: Nanos = Nanos(1);
    /// One second.
    pub const SECOND: Nanos = Nanos(1_000_000_000);

    /// Wraps a count of nanoseconds.
    #[inline]
    pub const fn new(nanos: u64) -> Nanos {
        Nanos(nanos)
    }

    /// A span of whole seconds, saturating.
    #[inline]
    pub const fn from_secs(secs: u64) -> Nanos {
        Nanos(secs.saturating_mul(1_000_000_000))
    }

    /// A span of whole milliseconds, saturating.
    #[inline]
    pub const fn from_millis(ms: u64) -> Nanos {
        Nanos(ms.saturating_mul(1_000_000))
    }

    /// A span of whole microseconds, saturating.
    #[inline]
    pub const fn from_micros(us: u64) -> Nanos {
        Nanos(us.saturating_mul(1_000))
    }

    /// The raw count of nanoseconds.
    #[inline]
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Whole microseconds, rounded down.
    #[inline]
    pub const fn as_micros(self) -> u64 {
        self.0 / 1_000
    }

    /// Milliseconds as a float (for output; microsecond precision survives).
    #[inline]
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1e6
    }

    /// Seconds as a float.
    #[inline]
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `self + rhs`, saturating at [`Nanos::MAX`].
    #[must_use]
    #[inline]
    pub const fn saturating_add(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(rhs.0))
    }

    /// `self - rhs`, saturating at zero.
    #[must_use]
    #[inline]
    pub const fn saturating_sub(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(rhs.0))
    }

    /// `self * n`, saturating.
    #[must_use]
    #[inline]
    pub const fn saturating_mul(self, n: u64) -> Nanos {
        Nanos(self.0.saturating_mul(n))
    }

    /// `self / n`, rounded down; dividing by zero yields [`Nanos::MAX`].
    #[must_use]
    #[inline]
    pub const fn div_floor(self, n: u64) -> Nanos {
        match self.0.checked_div(n) {
            Some(v) => Nanos(v),
            None => Nanos::MAX,
        }
    }

    /// The larger of two times.
    #[must_use]
    #[inline]
    pub fn max(self, other: Nanos) -> Nanos {
        Ord::max(self, other)
    }

    /// The smaller of two times.
    #[must_use]
    #[inline]
    pub fn min(self, other: Nanos) -> Nanos {
        Ord::min(self, other)
    }

    /// Whether this is zero.
    #[inline]
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl From<Duration> for Nanos {
    #[inline]
    fn from(d: Duration) -> Nanos {
        Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl From<Nanos> for Duration {
    #[inline]
    fn from(n: Nanos) -> Duration {
        Duration::from_nanos(n.0)
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

impl fmt::Display for Nanos {
    /// Prints the largest unit that divides exactly: `5m`, `1500ms`,
    /// `12us`, `7ns`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        let units: [(u64, &str); 7] = [
            (86_400_000_000_000, "d"),
            (3_600_000_000_000, "h"),
            (60_000_000_000, "m"),
            (1_000_000_000, "s"),
            (1_000_000, "ms"),
            (1_000, "us"),
            (1, "ns"),
        ];
        if n == 0 {
            return write!(f, "0s");
        }
        for (size, name) in units {
            if n % size == 0 {
                return write!(f, "{}{}", n / size, name);
            }
        }
        write!(f, "{n}ns")
    }
}

/// A duration a parameter may take: greater than zero and at most
/// [`Span::MAX`] (2^62 ns, about 146 years).
///
/// The bound keeps every sum of a span and a Unix-epoch time, and every
/// signed token-time of one, far from `u64` and `i64` overflow. The only
/// ways to make one are [`Span::new`] and [`Span::times`], so a value of
/// this type needs no further check (and divides without a zero case).
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span(NonZeroU64);

/// Why a duration is not a [`Span`]. Its message completes a sentence that
/// names the parameter: "`window` must be greater than zero".
#[derive(Copy, Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SpanError {
    /// The duration is zero.
    #[error("must be greater than zero")]
    Zero,
    /// The duration is longer than [`Span::MAX`] (or a product that makes
    /// one overflows).
    #[error("must be at most 146 years (2^62 ns)")]
    TooLong,
}

impl Span {
    /// The longest span: 2^62 ns, about 146 years.
    pub const MAX: Span = match NonZeroU64::new(1 << 62) {
        Some(n) => Span(n),
        None => unreachable!(),
    };

    /// One second.
    pub const SECOND: Span = match NonZeroU64::new(Nanos::SECOND.as_u64()) {
        Some(n) => Span(n),
        None => unreachable!(),
    };

    /// `duration` as a span, if it is one.
    pub const fn new(duration: Nanos) -> Result<Span, SpanError> {
        match NonZeroU64::new(duration.as_u64()) {
            None => Err(SpanError::Zero),
            Some(n) if n.get() > Span::MAX.0.get() => Err(SpanError::TooLong),
            Some(n) => Ok(Span(n)),
        }
    }

    /// `n` times `unit` as a span (the time of `n` hits one `unit`
    /// apart), if the product is one.
    pub const fn times(unit: Nanos, n: u64) -> Result<Span, SpanError> {
        match unit.as_u64().checked_mul(n) {
            Some(product) => Span::new(Nanos::new(product)),
            None => Err(SpanError::TooLong),
        }
    }

    /// The span as a time.
    #[inline]
    pub const fn get(self) -> Nanos {
        Nanos(self.0.get())
    }

    /// The raw count of nanoseconds, never zero.
    #[inline]
    pub const fn as_u64(self) -> u64 {
        self.0.get()
    }

    /// The count of nanoseconds as a [`NonZeroU64`], to divide by.
    #[inline]
    pub const fn as_non_zero(self) -> NonZeroU64 {
        self.0
    }
}

impl From<Span> for Nanos {
    #[inline]
    fn from(s: Span) -> Nanos {
        s.get()
    }
}

impl TryFrom<Nanos> for Span {
    type Error = SpanError;

    fn try_from(n: Nanos) -> Result<Span, SpanError> {
        Span::new(n)
    }
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}

impl fmt::Display for Span {
    /// As [`Nanos`] prints: `5m`, `1500ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.get(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_positive_and_at_most_146_years() {
        assert_eq!(Span::new(Nanos::ZERO), Err(SpanError::Zero));
        assert_eq!(Span::new(Nanos::new(1)).map(Span::as_u64), Ok(1));
        assert_eq!(Span::new(Nanos::new(1 << 62)), Ok(Span::MAX));
        assert_eq!(
            Span::new(Nanos::new((1 << 62) + 1)),
            Err(SpanError::TooLong)
        );
        assert_eq!(Span::new(Nanos::MAX), Err(SpanError::TooLong));
        assert_eq!(Span::times(Nanos::new(1 << 31), 1 << 31), Ok(Span::MAX));
        assert_eq!(Span::times(Nanos::new(3), 0), Err(SpanError::Zero));
        assert_eq!(Span::times(Nanos::MAX, 2), Err(SpanError::TooLong));
        assert_eq!(Span::SECOND.get(), Nanos::SECOND);
        assert_eq!(Span::SECOND.to_string(), "1s");
    }

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Nanos::MAX.saturating_add(Nanos::SECOND), Nanos::MAX);
        assert_eq!(Nanos::ZERO.saturating_sub(Nanos::SECOND), Nanos::ZERO);
        assert_eq!(Nanos::from_secs(u64::MAX), Nanos::MAX);
        assert_eq!(Nanos::SECOND.div_floor(0), Nanos::MAX);
        assert_eq!(Nanos::SECOND.div_floor(3), Nanos::new(333_333_333));
    }

    #[test]
    fn display_picks_the_largest_exact_unit() {
        assert_eq!(Nanos::from_secs(300).to_string(), "5m");
        assert_eq!(Nanos::from_millis(1500).to_string(), "1500ms");
        assert_eq!(Nanos::from_secs(86_400).to_string(), "1d");
        assert_eq!(Nanos::new(7).to_string(), "7ns");
        assert_eq!(Nanos::ZERO.to_string(), "0s");
    }
}
