//! The study itself: [`run`] draws the traffic and [`run_on`] measures
//! it, and the results ([`StudyResult`]) they return.
//!
//! Apart so that the order of the study (validate, grid, measurement 1,
//! measurements 2 and 3, time series) reads in one place.

use tollgate_core::Nanos;

use super::measure::{
    granted_series, measure_decisions, measure_estimates, Cost, DecisionStats, EstimateStats,
};
use super::{invalid, traffic, Contender, WindowParams, WindowsError};

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

/// Runs the study on [`traffic()`] drawn from `params`.
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
