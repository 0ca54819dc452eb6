//! The clock the edges read: the one place a server (or the config API)
//! reads the time.
//!
//! The algorithms of this crate take time as an argument and never read a
//! clock (governor's habit, STYLE.md); the edge does, through this trait,
//! so tests drive time by hand with [`ManualClock`] instead of sleeping,
//! and every surface of one server agrees on what "now" is (a lease
//! renewed over HTTP lapses in the housekeeping that reads the same
//! clock). It lives here, in the lowest crate, so that every crate above
//! (the service, the config API) shares one trait and one fake clock
//! without depending on each other (governor's `clock` module is the
//! model).
//!
//! Time is Unix-epoch nanoseconds ([`Nanos`]), the core's time. A store
//! with an authoritative clock of its own (Redis's `TIME`) may ignore it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::Nanos;

/// Where a server reads the time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now, in Unix-epoch nanoseconds.
    fn now(&self) -> Nanos;
}

/// The system's wall clock.
#[derive(Copy, Clone, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        system_now()
    }
}

/// Now, by the system's wall clock, in Unix-epoch nanoseconds (zero if the
/// clock is before 1970, which no limit can be harmed by).
pub fn system_now() -> Nanos {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Nanos::new(u64::try_from(since).unwrap_or(u64::MAX))
}

/// The system's wall clock shifted by a fixed offset: `tollgate serve`'s
/// test hook (`--clock-offset-ms`) for a server whose time must stand near
/// an edge a test cannot wait for (a calendar month's), while it still
/// runs in real time.
#[derive(Copy, Clone, Debug, Default)]
pub struct ShiftedClock {
    offset_ns: i128,
}

impl ShiftedClock {
    /// The system clock moved by `offset_ms` milliseconds (negative: into
    /// the past).
    pub fn new(offset_ms: i64) -> ShiftedClock {
        ShiftedClock {
            offset_ns: i128::from(offset_ms) * 1_000_000,
        }
    }
}

impl Clock for ShiftedClock {
    fn now(&self) -> Nanos {
        let shifted = i128::from(system_now().as_u64()) + self.offset_ns;
        Nanos::new(u64::try_from(shifted.max(0)).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told: for tests, and for anyone who wants
/// to replay time (governor's `FakeRelativeClock`).
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Nanos) -> ManualClock {
        ManualClock {
            now: AtomicU64::new(start.as_u64()),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // A saturating add in a loop: `fetch_add` would wrap.
        let _ = self
            .now
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the clock to `to` (backwards too: a stepped wall clock).
    pub fn set(&self, to: Nanos) {
        self.now.store(to.as_u64(), Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        Nanos::new(self.now.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_saturates() {
        let c = ManualClock::new(Nanos::new(5));
        assert_eq!(c.now(), Nanos::new(5));
        c.advance(Duration::from_nanos(10));
        assert_eq!(c.now(), Nanos::new(15));
        c.advance(Duration::MAX);
        assert_eq!(c.now(), Nanos::new(u64::MAX));
        c.set(Nanos::new(3));
        assert_eq!(c.now(), Nanos::new(3));
    }

    #[test]
    fn a_shifted_clock_is_the_system_clock_moved() {
        let before = SystemClock.now();
        let t = ShiftedClock::new(86_400_000).now();
        let after = SystemClock.now();
        let day = Nanos::from_secs(86_400);
        assert!(t >= before.saturating_add(day) && t <= after.saturating_add(day));
        assert_eq!(ShiftedClock::new(i64::MIN).now(), Nanos::ZERO);
    }

    #[test]
    fn the_system_clock_is_after_2020() {
        assert!(SystemClock.now().as_u64() > 1_577_836_800_000_000_000);
    }
}
