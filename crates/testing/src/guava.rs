//! The scripts of Guava's smooth rate limiters that tollgate's memory and
//! Redis implementations both replay (`tests/guava.rs` in tollgate-core,
//! `tests/conformance_smooth.rs` in tollgate-redis): what each script does,
//! drawn with `java.util.Random(seed)`, and the waits the Java port of
//! Guava that passes `RateLimiterTest` printed for it.
//!
//! The rates, warm-ups and cold factors are odd on purpose: there the two
//! truncated parts of a warm-up wait do not add up to whole microseconds,
//! so the scripts tell Guava's arithmetic from a near miss.

use crate::JavaRandom;

/// The limiter a script runs, created on a stopwatch at zero.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GuavaLimiter {
    /// `RateLimiter.create(permitsPerSecond)`.
    Bursty,
    /// `RateLimiter.create(permitsPerSecond, warmup, MILLISECONDS,
    /// coldFactor)`.
    WarmingUp {
        /// The warm-up period, in milliseconds.
        warmup_millis: u64,
        /// How much slower than the stable rate a cold limiter is.
        cold_factor: f64,
    },
}

/// One script: a limiter of `permits` per `seconds`, the seed its steps
/// are drawn with, and the wait (in microseconds) Guava returned for each
/// acquire.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GuavaScript {
    /// Which limiter.
    pub limiter: GuavaLimiter,
    /// Permits per [`GuavaScript::seconds`]: the stable rate.
    pub permits: u64,
    /// The rate's period, in seconds.
    pub seconds: u64,
    /// The seed of [`guava_steps`].
    pub seed: i64,
    /// Guava's wait for each acquire, in microseconds, in order.
    pub waits: &'static [u64],
}

/// One step of a script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuavaStep {
    /// `acquire(permits)`.
    Acquire(u64),
    /// The user sleeps this many milliseconds.
    SleepMillis(u64),
}

/// The 40 steps of the script of `seed`: `r = nextInt(10)`; `r < 7`
/// acquires `1 + nextInt(4)` permits, else the user sleeps
/// `nextInt(3000)` ms.
pub fn guava_steps(seed: i64) -> Vec<GuavaStep> {
    let mut random = JavaRandom::new(seed);
    (0..40)
        .map(|_| {
            if random.next_int(10) < 7 {
                GuavaStep::Acquire(1 + u64::from(random.next_int(4).unsigned_abs()))
            } else {
                GuavaStep::SleepMillis(u64::from(random.next_int(3000).unsigned_abs()))
            }
        })
        .collect()
}

/// The limiters of the scripts (warming-up ones first) as (limiter,
/// permits, seconds), each with Guava's waits for seeds 1 and 2.
type Limiters = [(GuavaLimiter, u64, u64, [&'static [u64]; 2]); 9];

const LIMITERS: Limiters = [
    // warm 3.0 1234 2.5
    (
        GuavaLimiter::WarmingUp {
            warmup_millis: 1234,
            cold_factor: 2.5,
        },
        3,
        1,
        [
            &[
                0, 0, 715_153, 0, 1_528_857, 1_333_332, 666_666, 1_333_333, 333_333, 0, 1_528_857,
                333_332, 0, 1_862_190, 0, 715_153, 1_147_036, 666_666, 333_333, 771_000, 666_666,
                333_333, 0, 0, 715_153, 478_795, 1_334_907,
            ],
            &[
                0, 0, 0, 1_193_949, 1_001_573, 934_333, 0, 1_193_949, 668_240, 0, 0, 0, 715_153,
                1_147_036, 0, 715_153, 1_147_036, 333_333, 207_333, 1_333_333, 1_000_000,
                1_333_333, 0,
            ],
        ],
    ),
    // warm 7.0 5000 7.0
    (
        GuavaLimiter::WarmingUp {
            warmup_millis: 5000,
            cold_factor: 7.0,
        },
        7,
        1,
        [
            &[
                0, 0, 951_020, 0, 2_559_183, 2_040_816, 435_714, 571_428, 142_857, 0, 1_204_041,
                205_428, 0, 2_898_472, 0, 951_020, 2_265_306, 1_020_408, 363_265, 349_571, 285_714,
                142_857, 0, 0, 951_020, 853_061, 2_432_653,
            ],
            &[
                0, 0, 0, 1_728_485, 1_858_034, 726_753, 0, 1_804_081, 1_412_244, 0, 0, 0, 951_020,
                2_265_306, 0, 951_020, 2_265_306, 559_183, 134_203, 571_428, 428_571, 571_428, 0,
            ],
        ],
    ),
    // warm 0.3 10000 3.0
    (
        GuavaLimiter::WarmingUp {
            warmup_millis: 10000,
            cold_factor: 3.0,
        },
        3,
        10,
        [
            &[
                0, 5_464_777, 3_888_888, 5_515_999, 10_000_000, 13_333_333, 6_666_666, 13_333_333,
                3_333_333, 4_211_666, 10_000_000, 3_333_333, 10_513_333, 13_333_333, 2_337_666,
                3_333_333, 10_000_000, 6_666_666, 3_333_333, 9_771_000, 6_666_666, 3_333_333,
                1_823_333, 3_950_666, 3_333_333, 3_333_333, 13_333_333,
            ],
            &[
                0, 6_427_777, 2_820_888, 6_666_666, 10_000_000, 12_934_333, 6_711_000, 6_666_666,
                6_666_666, 10_157_333, 2_463_666, 914_333, 3_333_333, 10_000_000, 2_592_000,
                3_333_333, 10_000_000, 3_333_333, 12_207_333, 13_333_333, 10_000_000, 13_333_333,
                810_333,
            ],
        ],
    ),
    // warm 2.5 777 1.5
    (
        GuavaLimiter::WarmingUp {
            warmup_millis: 777,
            cold_factor: 1.5,
        },
        5,
        2,
        [
            &[
                0, 0, 535_649, 0, 1_355_399, 1_600_000, 800_000, 1_600_000, 400_000, 0, 1_355_399,
                400_000, 0, 1_755_399, 0, 535_649, 1_219_750, 800_000, 400_000, 971_000, 800_000,
                400_000, 0, 0, 535_649, 419_750, 1_599_999,
            ],
            &[
                0, 0, 0, 955_399, 1_199_999, 1_201_000, 0, 955_399, 799_999, 0, 0, 0, 535_649,
                1_219_750, 0, 535_649, 1_219_750, 400_000, 474_000, 1_600_000, 1_200_000,
                1_600_000, 0,
            ],
        ],
    ),
    // warm 13.0 3333 10.0
    (
        GuavaLimiter::WarmingUp {
            warmup_millis: 3333,
            cold_factor: 10.0,
        },
        13,
        1,
        [
            &[
                0, 0, 725_291, 0, 1_912_238, 1_319_350, 187_717, 307_692, 76_923, 0, 1_912_238,
                461_655, 0, 2_373_894, 0, 725_291, 1_648_602, 659_675, 198_019, 35_640, 153_846,
                76_923, 0, 0, 725_291, 637_412, 1_670_865,
            ],
            &[
                0, 0, 0, 1_362_704, 1_384_966, 272_635, 0, 1_362_704, 1_011_189, 0, 0, 0, 725_291,
                1_648_602, 0, 725_291, 1_648_602, 373_777, 0, 678_579, 230_769, 307_692, 0,
            ],
        ],
    ),
    // bursty 3.0
    (
        GuavaLimiter::Bursty,
        3,
        1,
        [
            &[
                0, 0, 0, 0, 0, 1_333_333, 666_666, 1_333_333, 333_333, 0, 0, 333_333, 0, 333_333,
                0, 0, 333_333, 666_666, 333_333, 771_000, 666_666, 333_333, 0, 0, 0, 0, 1_000_000,
            ],
            &[
                0, 0, 0, 0, 666_666, 934_333, 0, 0, 333_333, 0, 0, 0, 0, 333_333, 0, 0, 333_333,
                333_333, 207_333, 1_333_333, 1_000_000, 1_333_333, 0,
            ],
        ],
    ),
    // bursty 0.3
    (
        GuavaLimiter::Bursty,
        3,
        10,
        [
            &[
                0, 1_020_333, 3_333_333, 5_516_000, 10_000_000, 13_333_333, 6_666_666, 13_333_333,
                3_333_333, 4_211_666, 10_000_000, 3_333_333, 10_513_333, 13_333_333, 2_337_666,
                3_333_333, 10_000_000, 6_666_666, 3_333_333, 9_771_000, 6_666_666, 3_333_333,
                1_823_333, 3_950_666, 3_333_333, 3_333_333, 13_333_333,
            ],
            &[
                0, 1_611_333, 2_265_333, 6_666_666, 10_000_000, 12_934_333, 6_711_000, 6_666_666,
                6_666_666, 10_157_333, 2_463_666, 914_333, 3_333_333, 10_000_000, 2_592_000,
                3_333_333, 10_000_000, 3_333_333, 12_207_333, 13_333_333, 10_000_000, 13_333_333,
                810_333,
            ],
        ],
    ),
    // bursty 13.0
    (
        GuavaLimiter::Bursty,
        13,
        1,
        [
            &[
                0, 0, 0, 0, 0, 0, 0, 0, 76_923, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                0,
            ],
            &[
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
        ],
    ),
    // bursty 2.5
    (
        GuavaLimiter::Bursty,
        5,
        2,
        [
            &[
                0, 0, 0, 0, 200_000, 1_600_000, 800_000, 1_600_000, 400_000, 0, 200_000, 400_000,
                0, 600_000, 0, 0, 600_000, 800_000, 400_000, 971_000, 800_000, 400_000, 0, 0, 0, 0,
                1_400_000,
            ],
            &[
                0, 0, 0, 0, 1_000_000, 1_201_000, 0, 0, 600_000, 0, 0, 0, 0, 600_000, 0, 0,
                600_000, 400_000, 474_000, 1_600_000, 1_200_000, 1_600_000, 0,
            ],
        ],
    ),
];

/// Every script: each limiter with seeds 1 and 2.
pub fn guava_scripts() -> impl Iterator<Item = GuavaScript> {
    LIMITERS
        .iter()
        .flat_map(|&(limiter, permits, seconds, waits)| {
            (1..=2).zip(waits).map(move |(seed, waits)| GuavaScript {
                limiter,
                permits,
                seconds,
                seed,
                waits,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests that replay the scripts iterate over them: none may be
    /// lost, and each has a wait for every acquire of its steps.
    #[test]
    fn every_script_has_a_wait_per_acquire() {
        let scripts: Vec<GuavaScript> = guava_scripts().collect();
        assert_eq!(scripts.len(), 18);
        for s in scripts {
            let acquires = guava_steps(s.seed)
                .iter()
                .filter(|step| matches!(step, GuavaStep::Acquire(_)))
                .count();
            assert_eq!(s.waits.len(), acquires, "{s:?}");
        }
    }
}
