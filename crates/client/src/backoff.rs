//! When to try again after a rejection: Charon's exponential backoff
//! (§3.2), and the [`Timer`] it measures and sleeps with.
//!
//! After the i-th failure (i = 1 for the first) the client sleeps
//! `min(max_wait − elapsed, jitter(2^i · base))`, where `jitter(v)` is
//! uniform in `[v − v/4, v + v/4]`, and gives up once `max_wait − elapsed`
//! is no longer positive. Charon's unit is the second; here it is
//! [`Backoff::base`] (50 ms by default, so the first retry comes after
//! about 100 ms: limits of a few per second are common, and a first retry
//! two seconds later would miss their refill).
//! tollgate's server also says when a request can next succeed
//! (`retry_after`): when that is sooner than the backoff, the client sleeps
//! only that long, and when the server says never, it does not sleep at
//! all.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rand::Rng;

/// The backoff policy: the base unit of Charon's `2^i` (see the module
/// docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The unit of the exponential sequence: the first retry comes after
    /// about two `base`s, the next after four, then eight, ...
    pub base: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_millis(50),
        }
    }
}

/// What the server said about retrying the request it just rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryHint {
    /// Nothing (copy-limited resources): back off as Charon does.
    None,
    /// It could succeed after this long.
    After(Duration),
    /// It can never succeed (more hits than the limit holds): do not
    /// retry.
    Never,
}

impl Backoff {
    /// `2^failure · base`, before jitter (saturating).
    pub fn nominal(&self, failure: u32) -> Duration {
        let factor = 1u32.checked_shl(failure.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor)
    }

    /// The sleep after the `failure`-th failure (1 for the first), with
    /// `elapsed` of `max_wait` already spent: `None` to give up.
    pub fn sleep(
        &self,
        failure: u32,
        elapsed: Duration,
        max_wait: Duration,
        hint: RetryHint,
        rng: &mut impl Rng,
    ) -> Option<Duration> {
        let left = max_wait.checked_sub(elapsed).filter(|d| !d.is_zero())?;
        let backoff = jitter(self.nominal(failure), rng);
        let wanted = match hint {
            RetryHint::Never => return None,
            RetryHint::None => backoff,
            // At least a millisecond: a server that says "now" and still
            // rejects (another client took the token first) is not
            // hammered.
            RetryHint::After(after) => backoff.min(after.max(Duration::from_millis(1))),
        };
        Some(wanted.min(left))
    }
}

/// `v` randomized uniformly within `[v − v/4, v + v/4]` (Charon §3.2).
pub fn jitter(v: Duration, rng: &mut impl Rng) -> Duration {
    let quarter = v / 4;
    let low = v.saturating_sub(quarter);
    let high = v.saturating_add(quarter);
    if high <= low {
        return v;
    }
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.random_range(nanos(low)..=nanos(high)))
}

/// A sleeping future, boxed so a [`Timer`] can be a trait object.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The time a client measures `elapsed` with and sleeps on. The default is
/// tokio's; tests use one they control, so backoff is checked by what the
/// client asked for rather than by the wall clock.
pub trait Timer: Send + Sync + 'static {
    /// Time since an arbitrary origin, never going back.
    fn now(&self) -> Duration;
    /// Waits `d`.
    fn sleep(&self, d: Duration) -> Sleep;
}

/// tokio's time: its monotonic clock and its sleep.
#[derive(Debug)]
pub struct TokioTimer {
    origin: tokio::time::Instant,
}

impl Default for TokioTimer {
    fn default() -> TokioTimer {
        TokioTimer {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Timer for TokioTimer {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, d: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn sleeps_follow_charon_within_a_quarter_and_stop_at_max_wait() {
        let b = Backoff { base: 100 * MS };
        let mut rng = SmallRng::seed_from_u64(1);
        let max = Duration::from_secs(10);
        for i in 1..6 {
            let v = 100 * MS * (1 << i);
            for _ in 0..200 {
                let s = b.sleep(i, Duration::ZERO, max, RetryHint::None, &mut rng);
                let s = s.unwrap();
                assert!(s >= v - v / 4 && s <= v + v / 4, "failure {i}: {s:?}");
            }
        }
        // Never past max_wait; nothing once it is spent.
        let s = b.sleep(6, 9_900 * MS, max, RetryHint::None, &mut rng);
        // The first failure sleeps 2 · base (Charon's 2^1), within a quarter.
        let first = b.sleep(1, Duration::ZERO, max, RetryHint::None, &mut rng);
        assert!(first.is_some_and(|f| f >= 150 * MS && f <= 250 * MS));
        assert_eq!(s, Some(100 * MS));
        assert_eq!(b.sleep(0, max, max, RetryHint::None, &mut rng), None);
        assert_eq!(b.sleep(0, max + MS, max, RetryHint::None, &mut rng), None);
        assert_eq!(
            b.sleep(0, Duration::ZERO, Duration::ZERO, RetryHint::None, &mut rng),
            None
        );
    }

    #[test]
    fn a_sooner_retry_after_wins_and_never_means_give_up() {
        let b = Backoff {
            base: Duration::from_secs(1),
        };
        let mut rng = SmallRng::seed_from_u64(2);
        let max = Duration::from_secs(60);
        let hint = RetryHint::After(30 * MS);
        assert_eq!(
            b.sleep(3, Duration::ZERO, max, hint, &mut rng),
            Some(30 * MS)
        );
        // A later retry_after does not stretch the backoff.
        let s = b
            .sleep(0, Duration::ZERO, max, RetryHint::After(max), &mut rng)
            .unwrap();
        assert!(s <= Duration::from_millis(1250), "{s:?}");
        assert_eq!(
            b.sleep(
                0,
                Duration::ZERO,
                max,
                RetryHint::After(Duration::ZERO),
                &mut rng
            ),
            Some(MS)
        );
        assert_eq!(
            b.sleep(0, Duration::ZERO, max, RetryHint::Never, &mut rng),
            None
        );
    }

    #[test]
    fn huge_failure_counts_saturate() {
        let b = Backoff::default();
        assert!(b.nominal(200) >= b.nominal(31));
        let mut rng = SmallRng::seed_from_u64(3);
        let s = b.sleep(
            1000,
            Duration::ZERO,
            Duration::from_secs(5),
            RetryHint::None,
            &mut rng,
        );
        assert_eq!(s, Some(Duration::from_secs(5)));
    }
}
