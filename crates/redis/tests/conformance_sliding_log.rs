//! The sliding log: the Redis store answers what the memory store answers,
//! step for step — min_gap, count_rejected, scheduling behind a slower
//! limit of the plan, and long logs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::strategies::step;
use common::{
    check_ttls, conform_on_a_new_server, gcra, mixed_items, run, shaped_steps, Item, RedisServer,
    Step, T0,
};
use proptest::prelude::*;
use tollgate_core::{Hits, Limit, Mode, Nanos, SlidingLog};

const NS: Nanos = Nanos::NANOSECOND;

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

fn log(limit: u64, window: Nanos, min_gap: Nanos, count_rejected: bool) -> Limit {
    Limit::SlidingLog(
        SlidingLog::new(limit, window)
            .unwrap()
            .with_min_gap(min_gap)
            .counting_rejected(count_rejected),
    )
}

fn step_at(advance: Nanos, request: Hits, mode: Mode, items: &[usize]) -> Step {
    Step {
        advance,
        request,
        mode,
        items: items.to_vec(),
        own: Vec::new(),
    }
}

#[tokio::test]
async fn window_edges_and_partial_grants_match() {
    let server = RedisServer::start();
    let items = [Item::new(log(2, ms(1000), Nanos::ZERO, false), 1, "acme")];
    // A hit at t still counts at t + window, not one nanosecond later.
    let steps = [
        Step::exactly(Nanos::ZERO, 1, 1),
        Step::exactly(ms(400), 1, 1),
        Step::exactly(ms(600), 1, 1),
        Step::exactly(NS, 1, 1),
        Step::exactly(Nanos::ZERO, 1, 1),
        step_at(ms(399), Hits::between(1, 5), Mode::Try, &[0]),
        step_at(NS, Hits::between(1, 5), Mode::Try, &[0]),
        step_at(Nanos::ZERO, Hits::between(0, 5), Mode::Try, &[0]),
        // More than the limit: retry_after never; min_hits > hits: rejected.
        step_at(Nanos::ZERO, Hits::exactly(3), Mode::Try, &[0]),
        step_at(Nanos::ZERO, Hits::between(4, 2), Mode::Try, &[0]),
        step_at(Nanos::ZERO, Hits::exactly(0), Mode::Try, &[0]),
        // Idle again: the key is dropped, and a fresh state decides.
        Step::exactly(Nanos::from_secs(5), 2, 1),
    ];
    run(&server, &items, &steps).await;
}

#[tokio::test]
async fn min_gap_matches() {
    let server = RedisServer::start();
    let items = [
        Item::new(log(10, ms(1000), ms(100), false), 1, "acme"),
        // A gap longer than the window: reset_after and the TTL follow it.
        Item::new(log(3, ms(50), ms(700), false), 2, "acme"),
    ];
    let steps = [
        Step::exactly(Nanos::ZERO, 1, 1),
        Step::exactly(ms(50), 1, 1),
        Step::exactly(ms(50).saturating_sub(NS), 1, 1),
        Step::exactly(NS, 1, 1),
        // min_hits 0 is granted now even while the gap is closed.
        step_at(ms(1), Hits::between(0, 3), Mode::Try, &[0, 1]),
        step_at(Nanos::ZERO, Hits::exactly(2), Mode::Try, &[1]),
        step_at(ms(60), Hits::exactly(1), Mode::Try, &[1]),
        step_at(ms(640), Hits::exactly(1), Mode::Try, &[1, 0]),
        step_at(NS, Hits::exactly(3), Mode::Try, &[1, 0]),
        step_at(ms(100), Hits::between(2, 4), Mode::Try, &[0, 1]),
        // Shadow: recorded as if live, never limiting.
        step_at(ms(5), Hits::exactly(1), Mode::Try, &[0]),
        step_at(ms(700), Hits::exactly(1), Mode::Acquire, &[1, 0]),
        step_at(ms(1), Hits::exactly(1), Mode::Acquire, &[0, 1]),
        Step::exactly(Nanos::from_secs(3), 1, 2),
    ];
    run(&server, &items, &steps).await;
    let shadowed = [
        Item::new(log(10, ms(1000), ms(100), false), 1, "acme"),
        Item::new(log(3, ms(50), ms(700), true), 2, "acme").shadow(),
    ];
    run(&server, &shadowed, &steps).await;
}

#[tokio::test]
async fn count_rejected_matches() {
    let server = RedisServer::start();
    let items = [
        Item::new(log(2, ms(1000), Nanos::ZERO, true), 1, "acme"),
        Item::new(log(2, ms(1000), Nanos::ZERO, false), 2, "acme"),
        Item::new(log(4, ms(300), ms(20), true), 3, "acme"),
    ];
    let mut steps = vec![
        Step::exactly(Nanos::ZERO, 1, 3),
        Step::exactly(ms(10), 1, 3),
    ];
    // A client hammering every 300 ms keeps the counting log closed.
    for _ in 0..3 {
        steps.push(Step::exactly(ms(290), 1, 3));
    }
    steps.push(Step::exactly(ms(300), 1, 3));
    // Rejected requests of several hits (and of none, malformed) are logged
    // as their hits (at least one), trimmed to the limit.
    steps.push(step_at(ms(1), Hits::exactly(7), Mode::Try, &[2, 0]));
    steps.push(step_at(ms(1), Hits::between(3, 2), Mode::Try, &[2]));
    steps.push(step_at(ms(1), Hits::between(9, 0), Mode::Try, &[0]));
    steps.push(step_at(NS, Hits::between(0, 6), Mode::Try, &[2, 1]));
    // Memory stays bounded by the limit while it keeps hammering.
    for k in 0..200 {
        steps.push(step_at(
            ms(1 + k % 7),
            Hits::between(k % 3, 1 + k % 4),
            Mode::Try,
            &[(k % 3) as usize, 2],
        ));
    }
    steps.push(Step::exactly(Nanos::from_secs(2), 2, 3));
    run(&server, &items, &steps).await;
}

#[tokio::test]
async fn acquire_waits_for_the_plan_and_logs_hits_then() {
    let server = RedisServer::start();
    let items = [
        Item::new(log(3, ms(1000), Nanos::ZERO, false), 1, "acme"),
        // One every 700 ms: the plan's wait soon passes the log's own.
        Item::new(gcra(1, ms(700), 1), 2, "acme"),
        Item::new(log(2, ms(500), ms(150), true), 3, "acme"),
    ];
    let acquire = |advance: Nanos, hits: u64, items: &[usize]| {
        step_at(advance, Hits::exactly(hits), Mode::Acquire, items)
    };
    let steps = [
        acquire(Nanos::ZERO, 1, &[0, 1]),
        acquire(Nanos::ZERO, 1, &[0, 1]),
        acquire(Nanos::ZERO, 1, &[1, 0]),
        // The log is full of hits scheduled in the future: the next one
        // waits for the oldest to leave, and Try sees them counted now.
        acquire(Nanos::ZERO, 1, &[0, 1]),
        Step::exactly(ms(100), 1, 1),
        acquire(ms(100), 2, &[0]),
        // A Try grant at a time before the newest (future) entry is logged
        // at that entry.
        Step::exactly(Nanos::from_secs(3), 1, 1),
        acquire(Nanos::ZERO, 2, &[0, 1, 2]),
        acquire(NS, 1, &[2, 1]),
        acquire(NS, 0, &[2, 0]),
        // More than the limit never fits: refused, nothing changes.
        acquire(Nanos::ZERO, 4, &[1, 0]),
        acquire(Nanos::ZERO, 3, &[0, 2]),
        // A shadow log schedules at the plan's wait, not its own.
        Step::exactly(ms(1), 1, 1),
        acquire(ms(1), 1, &[1, 0, 2]),
        Step::exactly(Nanos::from_secs(10), 3, 1),
    ];
    run(&server, &items, &steps).await;
    let shadowed = [
        items[0].clone().shadow(),
        items[1].clone(),
        items[2].clone().shadow(),
    ];
    run(&server, &shadowed, &steps).await;
}

#[tokio::test]
async fn long_logs_match() {
    let server = RedisServer::start();
    let items = [
        Item::new(
            log(500, Nanos::from_secs(10), Nanos::ZERO, false),
            1,
            "acme",
        ),
        Item::new(log(300, Nanos::from_secs(2), NS, true), 2, "acme"),
    ];
    let mut steps = Vec::new();
    // Hundreds of distinct timestamps, with batches and partial grants.
    for k in 0..700u64 {
        let request = match k % 5 {
            0 => Hits::between(1, 7),
            1 => Hits::exactly(3),
            2 => Hits::between(0, 2),
            _ => Hits::exactly(1),
        };
        let items: &[usize] = match k % 3 {
            0 => &[0],
            1 => &[1],
            _ => &[0, 1],
        };
        steps.push(step_at(ms(3 + k % 11), request, Mode::Try, items));
    }
    steps.push(step_at(
        Nanos::ZERO,
        Hits::exactly(5),
        Mode::Acquire,
        &[0, 1],
    ));
    steps.push(Step::exactly(Nanos::from_secs(11), 500, 1));
    run(&server, &items, &steps).await;
}

#[tokio::test]
async fn keys_live_until_the_log_is_idle() {
    let server = RedisServer::start();
    let items = [
        Item::new(log(3, Nanos::from_secs(10), Nanos::ZERO, false), 1, "acme"),
        // The gap outlasts the window: the key must outlive both.
        Item::new(log(2, ms(500), Nanos::from_secs(30), true), 2, "acme"),
        Item::new(gcra(1, ms(700), 1), 3, "acme"),
    ];
    let acquire = |advance: Nanos, hits: u64, items: &[usize]| {
        step_at(advance, Hits::exactly(hits), Mode::Acquire, items)
    };
    let steps = [
        Step::exactly(Nanos::ZERO, 1, 2),
        Step::exactly(ms(5), 2, 2),
        Step::exactly(Nanos::from_secs(9), 1, 2),
        // Scheduled in the future: the key lives past the scheduled hit.
        acquire(ms(1), 1, &[0, 2]),
        acquire(Nanos::ZERO, 1, &[2, 0]),
        Step::exactly(Nanos::from_secs(31), 1, 2),
        Step::exactly(Nanos::from_secs(60), 0, 2),
    ];
    check_ttls(&server, &items, &steps).await;
}

/// Sliding-log parameters: limit, window (ns: tiny, whole milliseconds or
/// any), min_gap (ns, often 0), count_rejected.
fn log_params() -> impl Strategy<Value = (u64, u64, u64, bool)> {
    (
        1u64..12,
        prop_oneof![
            1u64..2_000,
            (1u64..2_000).prop_map(|m| m * 1_000_000),
            1_000_000u64..2_000_000_000,
        ],
        prop_oneof![
            3 => Just(0u64),
            1 => (1u64..500).prop_map(|m| m * 1_000_000),
            1 => 1u64..500_000_000,
        ],
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn sliding_logs_match_the_memory_store(
        a in log_params(),
        b in log_params(),
        c in log_params(),
        g in (1u64..50, 1u64..3000, 1u64..8),
        three in any::<bool>(),
        shadow in any::<bool>(),
        coarse in any::<bool>(),
        steps in proptest::collection::vec(step(4, 400_000_000, 14, 6), 1..60),
    ) {
        let make = |p: (u64, u64, u64, bool)| log(p.0, Nanos::new(p.1), Nanos::new(p.2), p.3);
        let mut items = mixed_items(make(a), make(b), shadow, g, "acme");
        items.push(Item::new(make(c), 4, ""));
        conform_on_a_new_server(&items, T0, &shaped_steps(steps, three, coarse));
    }
}
