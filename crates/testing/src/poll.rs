//! Polling until an outcome of a real process holds.
//!
//! A test of a real process (a socket closed, a log line written, a
//! server's status changed) cannot step a clock of its own, so it asks
//! again until the answer is the one it wants. The bound is generous and
//! only a failing test waits it out: these are checks of behaviour, never
//! of speed.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`eventually`] and [`eventually_async`] ask again.
pub const POLL: Duration = Duration::from_millis(50);

/// Calls `check` every [`POLL`] until it returns `Ok`, and returns what it
/// gave; panics naming `what` and the last `Err` once `within` has passed.
///
/// For outcomes of real processes only (a socket closed, a log line
/// written): the bound is generous and only a failing test waits it out.
pub fn eventually<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let last = match check() {
            Ok(v) => return v,
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "never happened within {within:?}: {what}; last: {last}"
        );
        std::thread::sleep(POLL);
    }
}

/// [`eventually`] for a check that awaits (an HTTP call of an async
/// client), sleeping on tokio's timer between tries so the runtime goes on
/// meanwhile.
pub async fn eventually_async<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "never happened within {within:?}: {what}; last: {last}"
        );
        tokio::time::sleep(POLL).await;
    }
}
