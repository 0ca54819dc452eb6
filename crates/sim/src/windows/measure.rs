//! The measurements: the perfect sliding window the contenders are held
//! against, measurement 1 (estimate error, counting every arrival), and
//! measurements 2 and 3 (decisions at the real limit, and their cost).
//! See the parent module's "Measurements" for what each one means.
//!
//! Apart from the traffic and the outputs because this is the part whose
//! rules (where a sample is taken, what counts as wrong) decide what the
//! numbers mean; it only computes, and writes nothing.

use std::collections::VecDeque;

use tollgate_core::{Algorithm, Grant, Hits, Limit, LimitState, Nanos};

use super::{Contender, TimeSeries, WindowParams, WindowsError};

/// The limit the counting-only instances of measurement 1 run with: high
/// enough that nothing is ever blocked, so they count every arrival.
pub const OBSERVER_LIMIT: u64 = 1 << 40;

/// The algorithm's count in its window at `now`, as it decides by:
/// `limit − remaining` of a zero-hit peek (`Hits::exactly(0)`), which
/// grants and records nothing (a sliding log only forgets expired hits).
pub fn estimate(limit: &Limit, state: &mut LimitState, now: Nanos) -> u64 {
    let d = limit.decide(state, now, Hits::exactly(0));
    d.limit.saturating_sub(d.remaining)
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
pub(super) struct ErrorAcc {
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

    pub(super) fn stats(&self) -> EstimateStats {
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
pub(super) fn measure_estimates(
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
            limit.decide(state, t, Hits::exactly(1));
        }
        perfect.push(t);
    }
    sample_grid(None, &mut next, &mut states, &mut perfect);
    Ok((series, at_arrivals, on_grid))
}

pub(super) struct Decided {
    pub(super) perfect: DecisionStats,
    pub(super) perfect_grants: Vec<Nanos>,
    pub(super) stats: Vec<DecisionStats>,
    pub(super) costs: Vec<Cost>,
    pub(super) grants: Vec<Vec<Nanos>>,
}

/// Measurement 2 and 3: every limiter decides every arrival at the limit.
pub(super) fn measure_decisions(
    params: &WindowParams,
    arrivals: &[Nanos],
) -> Result<Decided, WindowsError> {
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
            let d = limit.decide(state, t, Hits::exactly(1));
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
            limit.commit(shadow, t, Hits::exactly(1), grant);
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
pub(super) fn granted_series(grants: &[Nanos], grid: &[Nanos], window: Nanos) -> Vec<u64> {
    grid.iter()
        .map(|&g| {
            let to = grants.partition_point(|&t| t <= g);
            let from = grants.partition_point(|&t| t < g.saturating_sub(window));
            to.saturating_sub(from) as u64
        })
        .collect()
}
