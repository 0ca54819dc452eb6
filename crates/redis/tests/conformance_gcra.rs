//! GCRA and the leaky bucket: the Redis store answers what the memory store
//! answers, step for step.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::strategies::step;
use common::{
    caller_clock_server, conform, conform_on_a_new_server, gcra, mixed_items, Item, Step, T0,
};
use proptest::prelude::*;
use tollgate_core::{Hits, LeakyBucket, Limit, Mode, Nanos, Rate};

fn leaky(count: u64, period: Nanos, queue: u64) -> Limit {
    Limit::LeakyBucket(LeakyBucket::new(Rate::new(count, period).unwrap(), queue).unwrap())
}

#[tokio::test]
async fn gcra_fixed_vectors_match() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        Item::new(gcra(10, Nanos::SECOND, 5), 1, "acme"),
        Item::new(leaky(3, Nanos::SECOND, 4), 2, "acme"),
    ];
    let ms = Nanos::from_millis;
    let steps = [
        Step::exactly(Nanos::ZERO, 3, 1),
        Step::exactly(ms(1), 3, 1),
        Step::exactly(ms(50), 1, 1),
        Step::exactly(ms(100), 1, 2),
        Step::exactly(ms(0), 2, 2),
        Step {
            advance: ms(10),
            request: Hits::between(1, 9),
            mode: Mode::Try,
            items: vec![1, 0],
            own: Vec::new(),
        },
        Step {
            advance: ms(10),
            request: Hits::exactly(2),
            mode: Mode::Acquire,
            items: vec![0, 1],
            own: Vec::new(),
        },
        Step::exactly(Nanos::from_secs(30), 6, 1),
    ];
    conform(&redis, &items, T0, &steps).await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn gcra_and_leaky_bucket_match_the_memory_store(
        a in (1u64..50, 1u64..3000, 1u64..8),
        b in (1u64..50, 1u64..3000, 1u64..8),
        shadow in any::<bool>(),
        steps in proptest::collection::vec(step(3, 400_000_000, 10, 8), 1..40),
    ) {
        let ms = Nanos::from_millis;
        let items = mixed_items(
            gcra(a.0, ms(a.1), a.2),
            leaky(b.0, ms(b.1), b.2),
            shadow,
            (b.0, a.1, a.2),
            "",
        );
        conform_on_a_new_server(&items, T0, &steps);
    }
}
