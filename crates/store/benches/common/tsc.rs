//! The benchmarks' clock, shared by `decide` and `versus`.

use std::time::{SystemTime, UNIX_EPOCH};

use tollgate_core::Nanos;

/// Unix-epoch nanoseconds from the TSC, through the same `quanta` calls as
/// governor's default `QuantaClock::now` (`raw`, then `delta_as_nanos`), so
/// both sides of a comparison pay for the same clock.
pub struct TscClock {
    clock: quanta::Clock,
    base: u64,
}

impl TscClock {
    pub fn new() -> TscClock {
        let clock = quanta::Clock::new();
        let since = clock.delta_as_nanos(0, clock.raw());
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let unix = u64::try_from(unix.as_nanos()).unwrap();
        TscClock {
            clock,
            base: unix - since,
        }
    }

    #[inline]
    pub fn now(&self) -> Nanos {
        Nanos::new(self.base + self.clock.delta_as_nanos(0, self.clock.raw()))
    }
}
