//! The study's input: a seeded Poisson process whose rate changes per
//! segment (bursts, lulls, normal traffic), scaled to a long-run mean.
//!
//! Apart from the measurements so that the input can be swapped (the
//! study also runs on given arrivals, [`super::run_on`]) and so that its
//! determinism in the seed is visible in one function.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use tollgate_core::Nanos;

use super::{invalid, WindowParams, WindowsError};

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
