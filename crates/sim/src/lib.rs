//! `tollgate sim`: the thesis's evaluation (seed 000, §4.3 and §5) as a
//! tool. Traffic (a recorded trace or a generated data set) is replayed
//! into a simulated gossip cluster that runs tollgate's real replication
//! code ([`tollgate_replica::sim`]), and into one centralized limiter that
//! sees everything (the ground truth); the difference is the cluster's
//! precision. Also the window-approximation study of seed 004.
//!
//! - [`dataset`]: the thesis's data sets A–D, generated from a capacity
//!   and a seed;
//! - [`run`]: one simulation of a data set and a strategy, against the
//!   centralized ground truth;
//! - [`windows`]: fixed window, the two-window approximation, N
//!   sub-windows and the sliding log against a perfect sliding window;
//! - [`figures`]: the simulation's charts of rejections, memory and
//!   bandwidth over time;
//! - [`chart`]: SVG line charts (plotters' SVG backend, no system fonts).

#![deny(missing_docs)]

pub mod chart;
pub mod dataset;
pub mod figures;
pub mod run;
pub mod windows;

use tollgate_core::Nanos;

/// One request of a trace or data set: who, and when.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arrival {
    /// When it arrives (nanoseconds from the trace's start, or Unix time).
    pub at: Nanos,
    /// Whose it is: the limit's domain (the thesis's user id).
    pub user: String,
    /// Usage told after the fact (a trace's `report` and `refund`
    /// lines); `None`: a check of one hit, the thesis's request.
    pub told: Option<Told>,
}

/// Usage told after the fact: hits charged whatever the bucket holds, or
/// given back (docs/algorithms/usage.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Told {
    /// Hits used, charged into debt if need be.
    Report(u64),
    /// Hits not used after all, given back.
    Refund(u64),
}
