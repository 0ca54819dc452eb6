//! The study's parameters ([`WindowParams`]) and the checks the core does
//! not make (traffic shares and levels, segment lengths, the sampling
//! grid).
//!
//! Apart so that every refusal of a bad parameter is in one place, before
//! any traffic is drawn or algorithm built.

use tollgate_core::Nanos;

use super::traffic::Traffic;
#[cfg(doc)]
use super::Contender;
use super::{invalid, WindowsError};

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
    pub(super) fn validate(&self) -> Result<(), WindowsError> {
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
