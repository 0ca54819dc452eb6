//! One representative parameter set per algorithm, shared by the
//! `decide` benchmark and the `instructions` example (which counts each
//! one's instructions per decision under callgrind).

use tollgate_core::{
    Align, BurstTiers, FixedWindow, Gcra, LeakyBucket, Limit, Nanos, Rate, SlidingLog,
    SlidingWindow, Smooth, Tier, TokenBucket,
};

/// Synthetic time between two decisions: a hot key offered 10 million
/// requests per second, which the limits below admit about half of.
pub const STEP: u64 = 100;

/// One representative parameter set per algorithm. Against a hot key
/// offered one request every [`STEP`] (10M/s), most admit roughly 5M/s,
/// so the hot key sees both grants and rejections. `gcra_reject` admits
/// one hit per second, so it rejects almost everything. Over a million
/// keys each key sees one request per 100ms of synthetic time, which every
/// limit admits.
pub fn algorithms() -> Vec<(&'static str, Limit)> {
    let us = Nanos::from_micros;
    let five_m = Rate::per_second(5_000_000).unwrap();
    let one_m = Rate::per_second(1_000_000).unwrap();
    let tier = |limit, active, cooldown, skippable| Tier {
        limit,
        window: us(20),
        active: us(active),
        cooldown: us(cooldown),
        skippable,
    };
    vec![
        (
            "token_bucket",
            Limit::TokenBucket(TokenBucket::new(100, five_m).unwrap()),
        ),
        ("gcra", Limit::Gcra(Gcra::new(five_m, 100).unwrap())),
        (
            "gcra_reject",
            Limit::Gcra(Gcra::new(Rate::per_second(1).unwrap(), 1).unwrap()),
        ),
        (
            "leaky_bucket",
            Limit::LeakyBucket(LeakyBucket::new(five_m, 100).unwrap()),
        ),
        (
            "fixed_window",
            Limit::FixedWindow(FixedWindow::new(500, us(100), Align::Epoch).unwrap()),
        ),
        (
            "sliding_window",
            Limit::SlidingWindow(SlidingWindow::new(500, us(100), 2).unwrap()),
        ),
        (
            "sliding_log",
            Limit::SlidingLog(SlidingLog::new(50, us(10)).unwrap()),
        ),
        // Guava's limiters count whole microseconds: an interval below one
        // microsecond rounds to zero and admits everything, so these run
        // at 1M/s (about 10% of the hot key's requests granted).
        (
            "smooth_bursty",
            Limit::Smooth(Smooth::bursty(one_m, 100e-6).unwrap()),
        ),
        (
            "smooth_warming_up",
            Limit::Smooth(Smooth::warming_up(one_m, us(100), 3.0).unwrap()),
        ),
        (
            "burst_tiers",
            Limit::BurstTiers(
                BurstTiers::new(vec![
                    tier(100, 1_000, 1_000, true),
                    tier(200, 500, 2_000, false),
                ])
                .unwrap(),
            ),
        ),
    ]
}
