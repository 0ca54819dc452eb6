//! Seed 004's window-approximation study: how far tollgate's window
//! algorithms are from a perfect sliding window, and what that costs.
//!
//! The blog post (seed 004, "Let's compare" and "Diminishing returns")
//! compares, on "a random traffic input" at **100 calls per minute**, the
//! fixed window, the two-window weighted approximation and "five 15s
//! windows" against "a perfect sliding window, which at any point in time
//! corresponds to the number of calls made in the past 60 seconds", and
//! only by eye. This module runs the same comparison with tollgate's real
//! algorithms and puts numbers on it.
//!
//! # Contenders
//!
//! Each is a [`tollgate_core::Limit`], decided through the
//! [`Algorithm`] trait exactly as a store would:
//!
//! - [`Contender::FixedWindow`]: [`FixedWindow`] aligned to the epoch (a
//!   counter per calendar minute, the post's `{clientId}_{yyyyMMddHHmm}`).
//! - [`Contender::TwoWindows`]: [`SlidingWindow`] with `buckets: 2`, the
//!   post's "current + previous × remaining fraction" (a call at 00:01:43
//!   weighs the 00:00 counter by 17/60).
//! - [`Contender::SubWindows`]: [`SlidingWindow`] with
//!   [`WindowParams::sub_window_buckets`] counters. The core keeps `N`
//!   counters of `window / (N − 1)`: the current one, `N − 2` whole ones and
//!   the weighted oldest. The post's "five 15 s windows" is therefore
//!   `buckets: 5` (five counters of 15 s), the default here.
//! - [`Contender::SlidingLog`]: [`SlidingLog`], exact.
//!
//! The **perfect** reference is computed by the study itself from a
//! `VecDeque` of times. It uses the sliding log's edge convention: a hit at
//! `t` counts at `now` while `now − window <= t <= now`.
//!
//! # Traffic
//!
//! The post gives no distribution. [`traffic()`] draws a seeded Poisson
//! process whose rate is piecewise constant: segments of uniform random
//! length in `[segment_min, segment_max]`, each a burst, a lull or normal
//! traffic ([`Traffic`]). The levels are scaled so that the long-run mean is
//! [`Traffic::mean_per_window`] arrivals per window (by default the limit,
//! 100 per minute). Times start at 0, which is a minute mark, so the fixed
//! window's calendar minutes are `[0, 60)`, `[60, 120)`, … seconds.
//!
//! # Measurements
//!
//! 1. **Estimate error.** Each algorithm counts *every arrival* (its limit
//!    raised to [`OBSERVER_LIMIT`] so that it never blocks), and its count in
//!    the window is compared with the true number of arrivals in the last
//!    window. Counting arrivals rather than grants keeps the comparison on
//!    one input: with limiting on, every algorithm would have granted a
//!    different history. The count is what the algorithm decides by: the
//!    `remaining` of a zero-hit peek (`Hits::exactly(0)`), as
//!    `limit − remaining`. For the sliding window that is
//!    `whole + ⌈oldest × (S − elapsed) / S⌉` (the core admits `n` when
//!    `whole + n + oldest·(S − e)/S <= limit`, i.e. the weighted part
//!    rounds up). It is sampled at every arrival, just before the arrival
//!    is counted (the view its decision is made on), and on a fixed grid
//!    ([`WindowParams::sample_every`]; that grid is also the time series and
//!    the charts). Reported: mean absolute error, RMSE, mean signed error
//!    (bias), largest over- and under-estimate.
//! 2. **Decision error.** Each algorithm decides the same arrivals at the
//!    real limit, one hit each, in try mode, with its own state; the
//!    perfect window does the same. A request one allows and the other
//!    blocks is *wrongly allowed* or *wrongly blocked*. Because states
//!    diverge after a first disagreement, these counts include knock-on
//!    effects: they measure how differently the limiter behaves, not only
//!    how often its estimate crosses the limit on the wrong side. So each
//!    algorithm is also run as a *shadow* on the perfect window's history
//!    (its state records exactly the hits the perfect window granted, via
//!    the core's `room` / `commit` split): there a disagreement is purely
//!    the estimate crossing the limit on the wrong side. Also the
//!    **worst window**: the most hits granted in any closed span of one
//!    window length (the perfect window never exceeds the limit; the
//!    fixed window can reach twice the limit across a minute mark).
//! 3. **Cost**, "better accuracy = worse performance": counters read per
//!    decision (1, 2, N, or the log's entries, at most the limit) and the
//!    key's state size ([`LimitState::footprint`]), peak and mean over the
//!    decision run.
//!
//! # Modules
//!
//! One concern per file, everything public re-exported here:
//! `params` (the study's parameters and their checks), `traffic` (the
//! arrivals), `contender` (the algorithms compared), `measure` (the
//! perfect window and measurements 1 to 3), `study` ([`run`], and the
//! results), `output` (the table, the CSVs and the charts).

use thiserror::Error;
use tollgate_core::ParamError;
#[cfg(doc)]
use tollgate_core::{Algorithm, FixedWindow, LimitState, SlidingLog, SlidingWindow};

use crate::chart::ChartError;

mod contender;
mod measure;
mod output;
mod params;
mod study;
mod traffic;

pub use contender::Contender;
pub use measure::{estimate, worst_window, Cost, DecisionStats, EstimateStats, OBSERVER_LIMIT};
pub use params::WindowParams;
pub use study::{run, run_on, AlgorithmStats, StudyResult, TimeSeries};
pub use traffic::{traffic, Traffic};

/// Why the study could not run or write its outputs.
#[derive(Debug, Error)]
pub enum WindowsError {
    /// The core rejected an algorithm's parameters.
    #[error("algorithm parameters: {0}")]
    Param(#[from] ParamError),
    /// A study parameter is out of range.
    #[error("invalid study parameter `{param}`: {reason}")]
    Invalid {
        /// The parameter.
        param: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An output file could not be written.
    #[error("writing the study's outputs: {0}")]
    Io(#[from] std::io::Error),
    /// A chart could not be drawn.
    #[error(transparent)]
    Chart(#[from] ChartError),
}

fn invalid(param: &'static str, reason: impl Into<String>) -> WindowsError {
    WindowsError::Invalid {
        param,
        reason: reason.into(),
    }
}
