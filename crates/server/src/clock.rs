//! The server's clock: Unix-epoch nanoseconds, the core's time.

use std::time::{SystemTime, UNIX_EPOCH};

use tollgate_core::Nanos;

/// Now, in Unix-epoch nanoseconds (zero if the system clock is before
/// 1970, which no limit can be harmed by).
pub fn now() -> Nanos {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Nanos::new(u64::try_from(since).unwrap_or(u64::MAX))
}

/// Milliseconds as [`Nanos`], saturating.
pub fn ms(ms: u64) -> Nanos {
    Nanos::new(ms.saturating_mul(1_000_000))
}
