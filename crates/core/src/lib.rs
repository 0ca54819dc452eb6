//! tollgate's core: every limiting algorithm as a pure function.
//!
//! `(params, &mut state, now, hits, min_hits) -> decision`, with no I/O, no
//! async and no clock read: time is an argument, in nanoseconds ([`Nanos`]). The
//! same code decides in the in-memory store, in the replicated cluster, in
//! the simulator and in `tollgate replay`; the Redis store runs equivalent
//! scripts and a shared conformance suite proves they agree.
//!
//! What is here:
//! - [`Algorithm`]: the two-step contract (`room`, then `commit`) that lets
//!   several limits be decided all or nothing ([`plan`]).
//! - [`algorithms`]: token bucket, GCRA, leaky bucket, fixed window, sliding
//!   window, sliding log, Guava's smooth limiters and Charon's burst tiers.
//! - [`Limit`] / [`LimitState`]: any of them behind one type.
//! - [`copies`]: Charon's copy-limited resources (counting semaphores with
//!   domain, group and global limits, transfer and seize).
//! - [`replicated`]: limit states a gossip cluster replicates (CRDTs and
//!   their merges).
//! - [`calendar`]: calendar windows (a day, week, month or year of a time
//!   zone), the fixed window's `align: calendar`.
//! - [`hash`]: the stable hash that names shared state (FNV-1a-64).
//! - [`clock`]: the [`Clock`] trait the edges read the time through (the
//!   system's, or a [`ManualClock`] tests move by hand); nothing in the
//!   algorithms calls it.
//! - [`message`]: error texts for clients, bounded in bytes.
//!
//! What is not here: keys, storage, concurrency, configuration parsing.
//! Arithmetic saturates; no input makes this crate panic.

#![deny(missing_docs)]

pub mod algorithm;
pub mod algorithms;
pub mod calendar;
pub mod clock;
pub mod copies;
pub mod decision;
pub mod error;
pub mod hash;
pub mod limit;
pub mod message;
pub mod plan;
pub mod rate;
pub mod replicated;
pub mod time;

pub use algorithm::{Algorithm, Alone, Schedule, Usage};
pub use algorithms::burst_tiers::{BurstTiers, Tier};
pub use algorithms::fixed_window::{Align, FixedWindow};
pub use algorithms::gcra::Gcra;
pub use algorithms::leaky_bucket::LeakyBucket;
pub use algorithms::sliding_log::SlidingLog;
pub use algorithms::sliding_window::SlidingWindow;
pub use algorithms::smooth::{Smooth, SmoothKind};
pub use algorithms::token_bucket::TokenBucket;
pub use calendar::{Calendar, CalendarUnit};
pub use clock::{Clock, ManualClock, ShiftedClock, SystemClock};
pub use decision::{Decision, Grant, Hits, Mode, TierInfo};
pub use error::ParamError;
pub use limit::{Limit, LimitState};
pub use plan::{PlanDecision, PlanEntry, PlanError};
pub use rate::Rate;
pub use time::{Nanos, Span, SpanError};

/// A per-second sliding log: Charon's hard limit (per domain) and global
/// limit (all domains), "the maximum number of requests that can be granted
/// per second" (Charon §2.1), counted exactly.
pub fn per_second_limit(limit: u64) -> Result<SlidingLog, ParamError> {
    SlidingLog::new(limit, Nanos::SECOND)
}
