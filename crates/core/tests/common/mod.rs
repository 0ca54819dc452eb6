//! What the core's property tests share: the unit of generated times, the
//! number of cases, and generators of starting times and steps.

#![allow(dead_code)]

use proptest::prelude::*;

/// The unit of generated windows and periods: times are multiples of it,
/// give or take a nanosecond, so boundaries are hit exactly.
pub const UNIT: u64 = 25_000_000;

/// `cases` per property, unless `PROPTEST_CASES` asks for a deeper run.
pub fn cases(cases: u32) -> ProptestConfig {
    match std::env::var("PROPTEST_CASES") {
        Ok(_) => ProptestConfig::default(),
        Err(_) => ProptestConfig::with_cases(cases),
    }
}

/// A starting time: zero, a multiple of the unit, or anything up to 2096.
pub fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        (0u64..1_000_000).prop_map(|k| k * UNIT),
        0u64..4_000_000_000_000_000_000,
    ]
}

/// A step forward in time: often none, often whole units, sometimes a
/// nanosecond either side of one, now and then up to 20 s.
pub fn delta() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0u64),
        2 => 0u64..4,
        3 => (0u64..40).prop_map(|k| k * UNIT),
        3 => (1u64..80, 0u64..3).prop_map(|(k, j)| k * UNIT + j - 1),
        1 => 0u64..20_000_000_000,
    ]
}
