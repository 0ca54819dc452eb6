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
//! The post gives no distribution. [`traffic`] draws a seeded Poisson
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
//!    `remaining` of a zero-hit peek (`Request::exactly(0)`), as
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

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use thiserror::Error;
use tollgate_core::{
    Algorithm, Align, FixedWindow, Grant, Limit, LimitState, Nanos, ParamError, Request,
    SlidingLog, SlidingWindow,
};

use crate::chart::{self, ChartError, LineStyle, Series};

/// The limit the counting-only instances of measurement 1 run with: high
/// enough that nothing is ever blocked, so they count every arrival.
pub const OBSERVER_LIMIT: u64 = 1 << 40;

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

/// The random traffic: a Poisson process whose rate changes per segment.
#[derive(Clone, Debug, PartialEq)]
pub struct Traffic {
    /// Long-run mean arrivals per window (default 100: the limit).
    pub mean_per_window: f64,
    /// Rate of a burst segment, relative to normal traffic (default 3).
    pub burst: f64,
    /// Share of segments that are bursts (default 0.2).
    pub burst_share: f64,
    /// Rate of a lull segment, relative to normal traffic (default 0.25).
    pub lull: f64,
    /// Share of segments that are lulls (default 0.3).
    pub lull_share: f64,
    /// Shortest segment (default 5 s).
    pub segment_min: Nanos,
    /// Longest segment (default 45 s).
    pub segment_max: Nanos,
}

impl Default for Traffic {
    fn default() -> Traffic {
        Traffic {
            mean_per_window: 100.0,
            burst: 3.0,
            burst_share: 0.2,
            lull: 0.25,
            lull_share: 0.3,
            segment_min: Nanos::from_secs(5),
            segment_max: Nanos::from_secs(45),
        }
    }
}

/// The study's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowParams {
    /// Seed of the traffic (default 4, for seed 004).
    pub seed: u64,
    /// Hits allowed per window (default 100, the post's limit).
    pub limit: u64,
    /// The window (default 60 s).
    pub window: Nanos,
    /// How long the traffic runs (default 30 minutes).
    pub duration: Nanos,
    /// Counters of [`Contender::SubWindows`] (default 5: "five 15 s
    /// windows"; see the module documentation).
    pub sub_window_buckets: u32,
    /// The traffic.
    pub traffic: Traffic,
    /// Spacing of the time series (default 1 s).
    pub sample_every: Nanos,
    /// How much of the time series the charts show, from the start
    /// (default 10 minutes; the CSV holds all of it).
    pub chart_span: Nanos,
}

impl Default for WindowParams {
    fn default() -> WindowParams {
        WindowParams {
            seed: 4,
            limit: 100,
            window: Nanos::from_secs(60),
            duration: Nanos::from_secs(30 * 60),
            sub_window_buckets: 5,
            traffic: Traffic::default(),
            sample_every: Nanos::SECOND,
            chart_span: Nanos::from_secs(10 * 60),
        }
    }
}

impl WindowParams {
    /// Checks what the core does not: the traffic and the sampling.
    fn validate(&self) -> Result<(), WindowsError> {
        let t = &self.traffic;
        if self.window.is_zero() {
            return Err(invalid("window", "must be greater than zero"));
        }
        if self.sample_every.is_zero() {
            return Err(invalid("sample_every", "must be greater than zero"));
        }
        for (param, v) in [
            ("traffic.mean_per_window", t.mean_per_window),
            ("traffic.burst", t.burst),
            ("traffic.lull", t.lull),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(invalid(param, format!("must be finite and >= 0, got {v}")));
            }
        }
        for (param, v) in [
            ("traffic.burst_share", t.burst_share),
            ("traffic.lull_share", t.lull_share),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(param, format!("must be in [0, 1], got {v}")));
            }
        }
        if t.burst_share + t.lull_share > 1.0 {
            return Err(invalid(
                "traffic.burst_share",
                "burst_share + lull_share must be at most 1",
            ));
        }
        if t.segment_min.is_zero() || t.segment_min > t.segment_max {
            return Err(invalid(
                "traffic.segment_min",
                "segments need 0 < segment_min <= segment_max",
            ));
        }
        Ok(())
    }
}

/// One algorithm of the study.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Contender {
    /// [`FixedWindow`], epoch-aligned.
    FixedWindow,
    /// [`SlidingWindow`] with 2 buckets: the weighted previous window.
    TwoWindows,
    /// [`SlidingWindow`] with [`WindowParams::sub_window_buckets`] buckets.
    SubWindows,
    /// [`SlidingLog`], exact.
    SlidingLog,
}

impl Contender {
    /// Every contender, cheapest first.
    pub const ALL: [Contender; 4] = [
        Contender::FixedWindow,
        Contender::TwoWindows,
        Contender::SubWindows,
        Contender::SlidingLog,
    ];

    /// A short identifier, for CSV columns and file names.
    pub fn key(self) -> &'static str {
        match self {
            Contender::FixedWindow => "fixed_window",
            Contender::TwoWindows => "two_windows",
            Contender::SubWindows => "sub_windows",
            Contender::SlidingLog => "sliding_log",
        }
    }

    /// A human name, for tables and legends.
    pub fn label(self, params: &WindowParams) -> String {
        match self {
            Contender::FixedWindow => format!("fixed window ({})", secs(params.window)),
            Contender::TwoWindows => "2-window approximation".to_string(),
            Contender::SubWindows => {
                let n = params.sub_window_buckets.max(2);
                let sub = params.window.div_floor(u64::from(n - 1));
                format!("{n} × {} sub-windows", secs(sub))
            }
            Contender::SlidingLog => "sliding log (exact)".to_string(),
        }
    }

    /// The core algorithm, at `limit` hits per window.
    pub fn limit(self, params: &WindowParams, limit: u64) -> Result<Limit, WindowsError> {
        Ok(match self {
            Contender::FixedWindow => {
                Limit::FixedWindow(FixedWindow::new(limit, params.window, Align::Epoch)?)
            }
            Contender::TwoWindows => {
                Limit::SlidingWindow(SlidingWindow::new(limit, params.window, 2)?)
            }
            Contender::SubWindows => Limit::SlidingWindow(SlidingWindow::new(
                limit,
                params.window,
                params.sub_window_buckets,
            )?),
            Contender::SlidingLog => Limit::SlidingLog(SlidingLog::new(limit, params.window)?),
        })
    }

    /// Counters read per decision, when fixed (the sliding log's varies:
    /// see [`Cost::counters`]).
    pub fn counters(self, params: &WindowParams) -> Option<u64> {
        match self {
            Contender::FixedWindow => Some(1),
            Contender::TwoWindows => Some(2),
            Contender::SubWindows => Some(u64::from(params.sub_window_buckets)),
            Contender::SlidingLog => None,
        }
    }

    /// Its line in the charts: the first is orange and dashed, as the
    /// post's fixed-window figure; each differs from the others, and from
    /// the perfect window's, in colour and dash.
    pub fn style(self) -> LineStyle {
        LineStyle::series(match self {
            Contender::FixedWindow => 0,
            Contender::TwoWindows => 1,
            Contender::SubWindows => 2,
            Contender::SlidingLog => 3,
        })
    }
}

fn secs(n: Nanos) -> String {
    let s = n.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s} s")
    }
}

/// The algorithm's count in its window at `now`, as it decides by:
/// `limit − remaining` of a zero-hit peek (`Request::exactly(0)`), which
/// grants and records nothing (a sliding log only forgets expired hits).
pub fn estimate(limit: &Limit, state: &mut LimitState, now: Nanos) -> u64 {
    let d = limit.decide(state, now, Request::exactly(0));
    d.limit.saturating_sub(d.remaining)
}

/// Draws the study's traffic: sorted arrival times from 0 to
/// `params.duration`, deterministic in `params.seed`.
pub fn traffic(params: &WindowParams) -> Result<Vec<Nanos>, WindowsError> {
    params.validate()?;
    let t = &params.traffic;
    let mut rng = StdRng::seed_from_u64(params.seed);
    let normal_share = 1.0 - t.burst_share - t.lull_share;
    let mean_level = t.burst_share * t.burst + t.lull_share * t.lull + normal_share;
    let window_s = params.window.as_secs_f64();
    let base = if mean_level > 0.0 {
        t.mean_per_window / window_s / mean_level
    } else {
        0.0
    };
    let end = params.duration.as_u64();
    // The expected count, capped: a hint, not a promise.
    let expected = (base * params.duration.as_secs_f64()) as usize;
    let mut out = Vec::with_capacity(expected.min(1 << 20) + 16);
    let mut start = 0u64;
    while start < end {
        let len = rng.random_range(t.segment_min.as_u64()..=t.segment_max.as_u64());
        let stop = start.saturating_add(len).min(end);
        let u: f64 = rng.random();
        let level = if u < t.burst_share {
            t.burst
        } else if u < t.burst_share + t.lull_share {
            t.lull
        } else {
            1.0
        };
        let rate = base * level;
        if rate > 0.0 {
            let gaps = Exp::new(rate).map_err(|e| invalid("traffic", e.to_string()))?;
            // Seconds from the segment's start; the process is memoryless,
            // so restarting it at each segment is exact.
            let mut at = 0.0f64;
            loop {
                at += gaps.sample(&mut rng);
                let ns = start.saturating_add((at * 1e9) as u64);
                if ns >= stop {
                    break;
                }
                out.push(Nanos::new(ns));
            }
        }
        start = stop;
    }
    Ok(out)
}

/// Error statistics of an estimated count against the true count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EstimateStats {
    /// Instants compared.
    pub samples: u64,
    /// Mean absolute error, in hits.
    pub mae: f64,
    /// Root mean square error, in hits.
    pub rmse: f64,
    /// Mean signed error (estimate − truth): positive overestimates.
    pub bias: f64,
    /// Largest overestimate (estimate − truth), 0 if never over.
    pub max_over: u64,
    /// Largest underestimate (truth − estimate), 0 if never under.
    pub max_under: u64,
}

#[derive(Default)]
struct ErrorAcc {
    n: u64,
    abs: f64,
    sq: f64,
    signed: f64,
    over: u64,
    under: u64,
}

impl ErrorAcc {
    fn add(&mut self, estimate: u64, truth: u64) {
        self.n += 1;
        let e = estimate as f64 - truth as f64;
        self.abs += e.abs();
        self.sq += e * e;
        self.signed += e;
        self.over = self.over.max(estimate.saturating_sub(truth));
        self.under = self.under.max(truth.saturating_sub(estimate));
    }

    fn stats(&self) -> EstimateStats {
        if self.n == 0 {
            return EstimateStats::default();
        }
        let n = self.n as f64;
        EstimateStats {
            samples: self.n,
            mae: self.abs / n,
            rmse: (self.sq / n).sqrt(),
            bias: self.signed / n,
            max_over: self.over,
            max_under: self.under,
        }
    }
}

/// How one limiter decided the arrivals at the real limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecisionStats {
    /// Requests allowed.
    pub allowed: u64,
    /// Requests blocked.
    pub blocked: u64,
    /// Allowed here, blocked by the perfect window, each deciding with its
    /// own state (knock-on effects included).
    pub wrongly_allowed: u64,
    /// Blocked here, allowed by the perfect window, each deciding with its
    /// own state (knock-on effects included).
    pub wrongly_blocked: u64,
    /// Allowed here, blocked by the perfect window, when the algorithm is
    /// fed the perfect window's history: its state records exactly what
    /// the perfect window granted (the core's `room` then `commit`, as a
    /// plan whose other limit decides). Only the estimate's own error, no
    /// knock-on effects.
    pub shadow_wrongly_allowed: u64,
    /// Blocked here, allowed by the perfect window, on the perfect
    /// window's history (see [`DecisionStats::shadow_wrongly_allowed`]).
    pub shadow_wrongly_blocked: u64,
    /// The most hits granted in any closed span of one window length.
    pub worst_window: u64,
    /// Where that span ends (its first occurrence).
    pub worst_window_end: Nanos,
}

/// What an algorithm costs per key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cost {
    /// Counters read per decision: 1, 2 or N for the windows; for the
    /// sliding log, the most log entries held (one per granted hit in the
    /// window, so at most the limit).
    pub counters: u64,
    /// Peak [`LimitState::footprint`] over the decision run, in bytes.
    pub state_bytes_peak: usize,
    /// Mean [`LimitState::footprint`] after each decision, in bytes.
    pub state_bytes_mean: f64,
}

/// Everything measured for one contender.
#[derive(Clone, Debug, PartialEq)]
pub struct AlgorithmStats {
    /// Which one.
    pub contender: Contender,
    /// Its [`Contender::label`].
    pub name: String,
    /// Measurement 1, sampled at every arrival.
    pub at_arrivals: EstimateStats,
    /// Measurement 1, sampled on the time-series grid.
    pub on_grid: EstimateStats,
    /// Measurement 2.
    pub decisions: DecisionStats,
    /// Measurement 3.
    pub cost: Cost,
}

/// The count in the window over time, on the grid.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimeSeries {
    /// The grid's instants.
    pub at: Vec<Nanos>,
    /// Arrivals in the window at each instant (the perfect count).
    pub perfect: Vec<u64>,
    /// Each contender's estimated count of arrivals, in
    /// [`Contender::ALL`] order.
    pub estimates: Vec<Vec<u64>>,
    /// Hits the perfect window granted in the window at each instant.
    pub perfect_granted: Vec<u64>,
    /// Hits each contender granted in the window at each instant, in
    /// [`Contender::ALL`] order.
    pub granted: Vec<Vec<u64>>,
}

/// The study's results.
#[derive(Clone, Debug, PartialEq)]
pub struct StudyResult {
    /// What was run.
    pub params: WindowParams,
    /// Arrivals in the traffic.
    pub arrivals: u64,
    /// How the perfect window decided (never wrong, by definition).
    pub perfect: DecisionStats,
    /// One entry per contender, in [`Contender::ALL`] order.
    pub algorithms: Vec<AlgorithmStats>,
    /// The time series behind the charts.
    pub series: TimeSeries,
}

/// Runs the study on [`traffic`] drawn from `params`.
pub fn run(params: &WindowParams) -> Result<StudyResult, WindowsError> {
    let arrivals = traffic(params)?;
    run_on(params, &arrivals)
}

/// Runs the study on given arrival times (sorted, non-decreasing); the
/// grid runs to `params.duration` or the last arrival, whichever is later.
/// `params.traffic` and `params.seed` are not used.
pub fn run_on(params: &WindowParams, arrivals: &[Nanos]) -> Result<StudyResult, WindowsError> {
    params.validate()?;
    if arrivals.windows(2).any(|w| w[1] < w[0]) {
        return Err(invalid("arrivals", "must be sorted by time"));
    }
    let end = arrivals
        .last()
        .map_or(params.duration, |&t| t.max(params.duration));
    let grid: Vec<Nanos> = {
        let step = params.sample_every.as_u64();
        let n = end.as_u64() / step;
        (0..=n).map(|i| Nanos::new(i * step)).collect()
    };

    let (mut series, at_arrivals, on_grid) = measure_estimates(params, arrivals, &grid)?;
    let decided = measure_decisions(params, arrivals)?;

    series.perfect_granted = granted_series(&decided.perfect_grants, &grid, params.window);
    series.granted = decided
        .grants
        .iter()
        .map(|g| granted_series(g, &grid, params.window))
        .collect();

    let algorithms = Contender::ALL
        .iter()
        .enumerate()
        .map(|(i, &c)| AlgorithmStats {
            contender: c,
            name: c.label(params),
            at_arrivals: at_arrivals[i].stats(),
            on_grid: on_grid[i].stats(),
            decisions: decided.stats[i].clone(),
            cost: decided.costs[i].clone(),
        })
        .collect();
    Ok(StudyResult {
        params: params.clone(),
        arrivals: arrivals.len() as u64,
        perfect: decided.perfect,
        algorithms,
        series,
    })
}

/// The perfect sliding window: times in the window, oldest first.
struct Perfect {
    window: Nanos,
    times: VecDeque<Nanos>,
}

impl Perfect {
    fn new(window: Nanos) -> Perfect {
        Perfect {
            window,
            times: VecDeque::new(),
        }
    }

    /// Hits at `t` with `now − window <= t` (times are never later than
    /// `now` here).
    fn count(&mut self, now: Nanos) -> u64 {
        let from = now.saturating_sub(self.window);
        while self.times.front().is_some_and(|&t| t < from) {
            self.times.pop_front();
        }
        self.times.len() as u64
    }

    fn push(&mut self, at: Nanos) {
        self.times.push_back(at);
    }
}

/// Measurement 1: counting-only instances against the true arrival count.
fn measure_estimates(
    params: &WindowParams,
    arrivals: &[Nanos],
    grid: &[Nanos],
) -> Result<(TimeSeries, Vec<ErrorAcc>, Vec<ErrorAcc>), WindowsError> {
    let limits = Contender::ALL
        .iter()
        .map(|c| c.limit(params, OBSERVER_LIMIT))
        .collect::<Result<Vec<_>, _>>()?;
    let mut states: Vec<LimitState> = limits.iter().map(Algorithm::fresh).collect();
    let mut perfect = Perfect::new(params.window);
    let mut at_arrivals: Vec<ErrorAcc> = limits.iter().map(|_| ErrorAcc::default()).collect();
    let mut on_grid: Vec<ErrorAcc> = limits.iter().map(|_| ErrorAcc::default()).collect();
    let mut series = TimeSeries {
        at: grid.to_vec(),
        perfect: Vec::with_capacity(grid.len()),
        estimates: vec![Vec::with_capacity(grid.len()); limits.len()],
        ..TimeSeries::default()
    };

    let mut sample_grid = |until: Option<Nanos>,
                           next: &mut usize,
                           states: &mut [LimitState],
                           perfect: &mut Perfect| {
        while let Some(&g) = grid.get(*next) {
            if until.is_some_and(|u| g > u) {
                break;
            }
            let truth = perfect.count(g);
            series.perfect.push(truth);
            for (i, (limit, state)) in limits.iter().zip(states.iter_mut()).enumerate() {
                let est = estimate(limit, state, g);
                on_grid[i].add(est, truth);
                series.estimates[i].push(est);
            }
            *next += 1;
        }
    };

    let mut next = 0usize;
    for &t in arrivals {
        // Grid instants up to and including `t` see the count before it.
        sample_grid(Some(t), &mut next, &mut states, &mut perfect);
        let truth = perfect.count(t);
        for (i, (limit, state)) in limits.iter().zip(states.iter_mut()).enumerate() {
            at_arrivals[i].add(estimate(limit, state, t), truth);
            limit.decide(state, t, Request::exactly(1));
        }
        perfect.push(t);
    }
    sample_grid(None, &mut next, &mut states, &mut perfect);
    Ok((series, at_arrivals, on_grid))
}

struct Decided {
    perfect: DecisionStats,
    perfect_grants: Vec<Nanos>,
    stats: Vec<DecisionStats>,
    costs: Vec<Cost>,
    grants: Vec<Vec<Nanos>>,
}

/// Measurement 2 and 3: every limiter decides every arrival at the limit.
fn measure_decisions(params: &WindowParams, arrivals: &[Nanos]) -> Result<Decided, WindowsError> {
    let limits = Contender::ALL
        .iter()
        .map(|c| c.limit(params, params.limit))
        .collect::<Result<Vec<_>, _>>()?;
    let mut states: Vec<LimitState> = limits.iter().map(Algorithm::fresh).collect();
    let mut shadows: Vec<LimitState> = limits.iter().map(Algorithm::fresh).collect();
    let mut perfect = Perfect::new(params.window);
    let mut perfect_stats = DecisionStats::default();
    let mut perfect_grants = Vec::new();
    let mut stats = vec![DecisionStats::default(); limits.len()];
    let mut grants: Vec<Vec<Nanos>> = vec![Vec::new(); limits.len()];
    let mut bytes_sum = vec![0u128; limits.len()];
    let mut costs: Vec<Cost> = Contender::ALL
        .iter()
        .map(|c| Cost {
            counters: c.counters(params).unwrap_or(0),
            ..Cost::default()
        })
        .collect();

    for &t in arrivals {
        let ok = perfect.count(t) < params.limit;
        if ok {
            perfect.push(t);
            perfect_grants.push(t);
            perfect_stats.allowed += 1;
        } else {
            perfect_stats.blocked += 1;
        }
        for (i, (limit, state)) in limits.iter().zip(states.iter_mut()).enumerate() {
            let d = limit.decide(state, t, Request::exactly(1));
            let s = &mut stats[i];
            if d.allowed {
                s.allowed += 1;
                grants[i].push(t);
                if !ok {
                    s.wrongly_allowed += 1;
                }
            } else {
                s.blocked += 1;
                if ok {
                    s.wrongly_blocked += 1;
                }
            }
            // The same algorithm on the perfect window's history.
            let shadow = &mut shadows[i];
            let would = limit.room(shadow, t, 1) >= 1;
            match (would, ok) {
                (true, false) => s.shadow_wrongly_allowed += 1,
                (false, true) => s.shadow_wrongly_blocked += 1,
                _ => {}
            }
            let grant = Grant {
                granted: u64::from(ok),
                allowed: ok,
            };
            limit.commit(shadow, t, Request::exactly(1), grant);
            let bytes = state.footprint();
            bytes_sum[i] += bytes as u128;
            let cost = &mut costs[i];
            cost.state_bytes_peak = cost.state_bytes_peak.max(bytes);
            if Contender::ALL[i] == Contender::SlidingLog {
                // One entry per granted hit still in the window.
                cost.counters = cost.counters.max(d.limit.saturating_sub(d.remaining));
            }
        }
    }
    let n = arrivals.len().max(1) as f64;
    for (cost, sum) in costs.iter_mut().zip(&bytes_sum) {
        cost.state_bytes_mean = *sum as f64 / n;
    }
    (perfect_stats.worst_window, perfect_stats.worst_window_end) =
        worst_window(&perfect_grants, params.window);
    for (s, g) in stats.iter_mut().zip(&grants) {
        (s.worst_window, s.worst_window_end) = worst_window(g, params.window);
    }
    Ok(Decided {
        perfect: perfect_stats,
        perfect_grants,
        stats,
        costs,
        grants,
    })
}

/// The most `times` in any closed span `[end − window, end]`, and the first
/// such `end` (a span ending at a grant holds the most).
pub fn worst_window(times: &[Nanos], window: Nanos) -> (u64, Nanos) {
    let mut best = (0u64, Nanos::ZERO);
    let mut from = 0usize;
    for (j, &t) in times.iter().enumerate() {
        let start = t.saturating_sub(window);
        while times.get(from).is_some_and(|&s| s < start) {
            from += 1;
        }
        let n = (j + 1 - from) as u64;
        if n > best.0 {
            best = (n, t);
        }
    }
    best
}

/// Grants in `[g − window, g]` at each grid instant `g`.
fn granted_series(grants: &[Nanos], grid: &[Nanos], window: Nanos) -> Vec<u64> {
    grid.iter()
        .map(|&g| {
            let to = grants.partition_point(|&t| t <= g);
            let from = grants.partition_point(|&t| t < g.saturating_sub(window));
            to.saturating_sub(from) as u64
        })
        .collect()
}

impl StudyResult {
    /// The per-algorithm statistics as an aligned text table.
    pub fn table(&self) -> String {
        let p = &self.params;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "window study: seed {}, limit {} per {}, {} of traffic, {} arrivals; \
             perfect window allowed {}, worst {} span {}",
            p.seed,
            p.limit,
            secs(p.window),
            minutes(p.duration),
            self.arrivals,
            self.perfect.allowed,
            secs(p.window),
            self.perfect.worst_window,
        );
        let _ = writeln!(
            out,
            "estimate error: count of arrivals in the window vs truth, at each arrival; \
             decisions: at the limit, vs the perfect window (own state; shadow = on the perfect \
             window's history)"
        );
        let header = [
            "algorithm",
            "counters",
            "state B",
            "MAE",
            "RMSE",
            "bias",
            "max over",
            "max under",
            "allowed",
            "wrongly allowed",
            "wrongly blocked",
            "shadow allowed",
            "shadow blocked",
            "worst window",
        ];
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
        rows.push(vec![
            "perfect sliding window".into(),
            "-".into(),
            "-".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            self.perfect.allowed.to_string(),
            "0".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            self.perfect.worst_window.to_string(),
        ]);
        for a in &self.algorithms {
            let e = &a.at_arrivals;
            let counters = match a.contender {
                Contender::SlidingLog => format!("<={}", a.cost.counters),
                _ => a.cost.counters.to_string(),
            };
            rows.push(vec![
                a.name.clone(),
                counters,
                a.cost.state_bytes_peak.to_string(),
                format!("{:.2}", e.mae),
                format!("{:.2}", e.rmse),
                format!("{:+.2}", e.bias),
                e.max_over.to_string(),
                e.max_under.to_string(),
                a.decisions.allowed.to_string(),
                a.decisions.wrongly_allowed.to_string(),
                a.decisions.wrongly_blocked.to_string(),
                a.decisions.shadow_wrongly_allowed.to_string(),
                a.decisions.shadow_wrongly_blocked.to_string(),
                a.decisions.worst_window.to_string(),
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| {
                rows.iter()
                    .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &rows {
            let mut line = String::new();
            for (c, (cell, w)) in row.iter().zip(&widths).enumerate() {
                let pad = w.saturating_sub(cell.chars().count());
                if c == 0 {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                } else {
                    line.push_str("  ");
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }

    /// The per-algorithm statistics as CSV, one row per algorithm and the
    /// perfect window first (its cost cells empty).
    pub fn stats_csv(&self) -> String {
        let mut out = String::from(
            "key,algorithm,counters,state_bytes_peak,state_bytes_mean,\
             arrival_samples,arrival_mae,arrival_rmse,arrival_bias,arrival_max_over,arrival_max_under,\
             grid_samples,grid_mae,grid_rmse,grid_bias,grid_max_over,grid_max_under,\
             allowed,blocked,wrongly_allowed,wrongly_blocked,shadow_wrongly_allowed,\
             shadow_wrongly_blocked,worst_window,worst_window_end_s\n",
        );
        let zero = EstimateStats::default();
        let est = |e: &EstimateStats| {
            format!(
                "{},{:.6},{:.6},{:.6},{},{}",
                e.samples, e.mae, e.rmse, e.bias, e.max_over, e.max_under
            )
        };
        let dec = |d: &DecisionStats| {
            format!(
                "{},{},{},{},{},{},{},{:.9}",
                d.allowed,
                d.blocked,
                d.wrongly_allowed,
                d.wrongly_blocked,
                d.shadow_wrongly_allowed,
                d.shadow_wrongly_blocked,
                d.worst_window,
                d.worst_window_end.as_secs_f64()
            )
        };
        let _ = writeln!(
            out,
            "perfect,perfect sliding window,,,,{},{},{}",
            est(&zero),
            est(&zero),
            dec(&self.perfect)
        );
        for a in &self.algorithms {
            let _ = writeln!(
                out,
                "{},{},{},{},{:.3},{},{},{}",
                a.contender.key(),
                a.name,
                a.cost.counters,
                a.cost.state_bytes_peak,
                a.cost.state_bytes_mean,
                est(&a.at_arrivals),
                est(&a.on_grid),
                dec(&a.decisions)
            );
        }
        out
    }

    /// The time series as CSV: seconds, then the count of arrivals in the
    /// window (perfect, then each contender's estimate), then the hits
    /// granted in the window at the limit (perfect, then each contender).
    pub fn series_csv(&self) -> String {
        let s = &self.series;
        let mut out = String::from("t_s,perfect_count");
        for c in Contender::ALL {
            let _ = write!(out, ",{}_count", c.key());
        }
        out.push_str(",perfect_granted");
        for c in Contender::ALL {
            let _ = write!(out, ",{}_granted", c.key());
        }
        out.push('\n');
        for (i, at) in s.at.iter().enumerate() {
            let _ = write!(out, "{}", at.as_secs_f64());
            let cell = |v: Option<&u64>| v.map_or(String::new(), u64::to_string);
            let _ = write!(out, ",{}", cell(s.perfect.get(i)));
            for e in &s.estimates {
                let _ = write!(out, ",{}", cell(e.get(i)));
            }
            let _ = write!(out, ",{}", cell(s.perfect_granted.get(i)));
            for g in &s.granted {
                let _ = write!(out, ",{}", cell(g.get(i)));
            }
            out.push('\n');
        }
        out
    }

    /// The charts' series over [`WindowParams::chart_span`]: the perfect
    /// count (the reference, drawn on top) and `which` contenders' estimates.
    pub fn estimate_series(&self, which: &[Contender]) -> Vec<Series> {
        let s = &self.series;
        let mut out = vec![Series::reference(
            "perfect sliding window",
            self.points(&s.perfect),
        )];
        for (i, c) in Contender::ALL.iter().enumerate() {
            if which.contains(c) {
                let values = s.estimates.get(i).map_or(&[][..], Vec::as_slice);
                out.push(Series::new(
                    c.label(&self.params),
                    self.points(values),
                    c.style(),
                ));
            }
        }
        out
    }

    /// The hits granted in the last window over [`WindowParams::chart_span`]
    /// at the limit: the perfect window (the reference, drawn on top), every
    /// contender, and the
    /// limit itself.
    pub fn granted_series(&self) -> Vec<Series> {
        let s = &self.series;
        let mut out = vec![Series::reference(
            "perfect sliding window",
            self.points(&s.perfect_granted),
        )];
        for (i, c) in Contender::ALL.iter().enumerate() {
            let values = s.granted.get(i).map_or(&[][..], Vec::as_slice);
            out.push(Series::new(
                c.label(&self.params),
                self.points(values),
                c.style(),
            ));
        }
        let span = self.chart_end().as_secs_f64();
        let limit = self.params.limit as f64;
        out.push(Series::new(
            format!("limit ({})", self.params.limit),
            vec![(0.0, limit), (span, limit)],
            LineStyle::GUIDE,
        ));
        out
    }

    fn chart_end(&self) -> Nanos {
        let last = self.series.at.last().copied().unwrap_or(Nanos::ZERO);
        last.min(self.params.chart_span)
    }

    fn points(&self, values: &[u64]) -> Vec<(f64, f64)> {
        let end = self.chart_end();
        self.series
            .at
            .iter()
            .zip(values)
            .take_while(|(t, _)| **t <= end)
            .map(|(t, v)| (t.as_secs_f64(), *v as f64))
            .collect()
    }

    /// Writes `windows-stats.csv`, `windows-series.csv`, `windows-table.txt`
    /// and the charts (SVG, and PNG beside each) into `dir` (created if
    /// missing): one chart per
    /// contender against the perfect window (`windows-<key>.svg`, as the
    /// post's figures), all of them together (`windows-all.svg`) and the
    /// hits granted in the window at the limit (`windows-granted.svg`).
    /// Returns the paths written.
    pub fn write_outputs(&self, dir: &Path) -> Result<Vec<PathBuf>, WindowsError> {
        std::fs::create_dir_all(dir)?;
        let mut written = Vec::new();
        for (name, text) in [
            ("windows-stats.csv", self.stats_csv()),
            ("windows-series.csv", self.series_csv()),
            ("windows-table.txt", self.table()),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text)?;
            written.push(path);
        }
        let w = secs(self.params.window);
        let y = format!("hits in the last {w}");
        for c in Contender::ALL {
            let path = dir.join(format!("windows-{}.svg", c.key()));
            let title = format!("{} vs perfect sliding window", c.label(&self.params));
            let paths = chart::line_chart_files(
                &path,
                &title,
                "time (s)",
                &y,
                &self.estimate_series(&[c]),
            )?;
            written.extend(paths);
        }
        let path = dir.join("windows-all.svg");
        let paths = chart::line_chart_files(
            &path,
            "window algorithms vs perfect sliding window (all arrivals counted)",
            "time (s)",
            &y,
            &self.estimate_series(&Contender::ALL),
        )?;
        written.extend(paths);
        let path = dir.join("windows-granted.svg");
        let paths = chart::line_chart_files(
            &path,
            &format!("hits granted in the last {w} at the limit"),
            "time (s)",
            &format!("granted in the last {w}"),
            &self.granted_series(),
        )?;
        written.extend(paths);
        Ok(written)
    }
}

fn minutes(n: Nanos) -> String {
    let m = n.as_secs_f64() / 60.0;
    if m.fract() == 0.0 {
        format!("{m:.0} min")
    } else {
        format!("{m:.2} min")
    }
}
