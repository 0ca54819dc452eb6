//! What one load task measured: latency histograms (HDR, nanoseconds)
//! and counts by outcome, merged into one at the end.
//!
//! Apart because it is the one rule of what counts: errors are counted by
//! kind but kept out of the latency percentiles, which describe answers.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;

use super::client::Outcome;

/// What one task measured.
pub(super) struct Tally {
    pub(super) latency: Histogram<u64>,
    /// Open loop: how late requests were sent after their intended time
    /// (the client's own scheduling delay, part of `latency`).
    pub(super) lag: Histogram<u64>,
    pub(super) requests: u64,
    pub(super) granted: u64,
    pub(super) rejected: u64,
    pub(super) errors: BTreeMap<String, u64>,
    /// Open loop: tickets of the measured window never sent because the
    /// run's deadline passed first.
    pub(super) unsent: u64,
}

pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Latencies recorded from 1 ns up to an hour.
const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

impl Tally {
    pub(super) fn new() -> Result<Tally> {
        Ok(Tally {
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .context("cannot create a latency histogram")?,
            lag: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .context("cannot create a latency histogram")?,
            requests: 0,
            granted: 0,
            rejected: 0,
            errors: BTreeMap::new(),
            unsent: 0,
        })
    }

    pub(super) fn record(&mut self, outcome: Outcome, latency: Duration) {
        self.requests += 1;
        match outcome {
            Outcome::Granted => self.granted += 1,
            Outcome::Rejected => self.rejected += 1,
            Outcome::Error(kind) => {
                *self.errors.entry(kind).or_default() += 1;
                // An error's latency (often an instant refusal) would
                // flatter the percentiles; they describe answers.
                return;
            }
        }
        self.latency.saturating_record(nanos(latency));
    }

    pub(super) fn merge(&mut self, other: Tally) -> Result<()> {
        self.latency
            .add(&other.latency)
            .and_then(|()| self.lag.add(&other.lag))
            .map_err(|e| anyhow::anyhow!("cannot merge latency histograms: {e:?}"))?;
        self.requests += other.requests;
        self.granted += other.granted;
        self.rejected += other.rejected;
        self.unsent += other.unsent;
        for (kind, n) in other.errors {
            *self.errors.entry(kind).or_default() += n;
        }
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;
    use crate::cmd::bench::client::Outcome;

    #[test]
    fn a_tally_counts_every_outcome_and_times_only_answers() {
        let mut a = Tally::new().unwrap();
        a.record(Outcome::Granted, Duration::from_micros(10));
        a.record(Outcome::Rejected, Duration::from_micros(30));
        a.record(Outcome::Error("x".into()), Duration::from_secs(1));
        let mut b = Tally::new().unwrap();
        b.record(Outcome::Error("x".into()), Duration::ZERO);
        a.merge(b).unwrap();
        assert_eq!((a.requests, a.granted, a.rejected), (4, 1, 1));
        assert_eq!(a.errors.get("x"), Some(&2));
        assert_eq!(a.latency.len(), 2);
        assert!(a.latency.max() < 31_000);
    }
}
