//! Test support shared by tollgate's crates; a dev-dependency only,
//! never linked into what ships.
//!
//! - [`JavaRandom`]: `java.util.Random`, bit for bit, so tests replay what
//!   Guava's own tests draw with the same seeds.
//! - [`eventually`]: polls a condition of a real process (which a test
//!   cannot step by a clock of its own) until it holds, and fails with its
//!   last complaint after a bound.

#![deny(missing_docs)]

mod java_random;

pub use java_random::JavaRandom;

use std::time::{Duration, Instant};

/// How often [`eventually`] asks again.
const POLL: Duration = Duration::from_millis(50);

/// Calls `check` every 50 ms until it returns `Ok`; panics naming `what`
/// and the last `Err` it gave once `within` has passed.
///
/// For outcomes of real processes only (a socket closed, a log line
/// written): the bound is generous and only a failing test waits it out.
pub fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + within;
    loop {
        let last = match check() {
            Ok(()) => return,
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "never happened within {within:?}: {what}; last: {last}"
        );
        std::thread::sleep(POLL);
    }
}
