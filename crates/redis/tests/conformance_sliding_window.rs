//! The sliding window, with 2 and N counters: the Redis store answers what
//! the memory store answers, step for step, down to the last nanosecond of
//! `retry_after` for windows long enough that the core's u128 products
//! pass 2^53.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::strategies::step;
use common::{
    caller_clock_server, conform, conform_on_a_new_server, gcra, mixed_items, Item, Step, T0,
};
use proptest::prelude::*;
use tollgate_core::{Hits, Limit, Mode, Nanos, PlanError, SlidingWindow};
use tollgate_redis::RedisStore;
use tollgate_store::{MemoryStore, Plan, Store, StoreError};

const DAY: Nanos = Nanos::from_secs(86_400);
/// The largest count and span the Redis store accepts: 2^52 − 1.
const TOP: u64 = (1 << 52) - 1;

fn sw(limit: u64, window: Nanos, buckets: u32) -> Limit {
    Limit::SlidingWindow(SlidingWindow::new(limit, window, buckets).unwrap())
}

/// The first sub-window boundary (a multiple of `sub` since the epoch)
/// after `t`, so a scenario can land exactly on the edges.
fn boundary_after(t: Nanos, sub: Nanos) -> Nanos {
    Nanos::new(t.as_u64() - t.as_u64() % sub.as_u64() + sub.as_u64())
}

/// A `Try` step for `request` on the plan `items`.
fn at(advance: Nanos, request: Hits, items: &[usize]) -> Step {
    Step {
        advance,
        request,
        mode: Mode::Try,
        items: items.to_vec(),
        own: Vec::new(),
    }
}

/// After each advance, every request in turn (at that same time).
fn probes(advances: &[Nanos], requests: &[Hits], items: &[usize]) -> Vec<Step> {
    let mut steps = Vec::new();
    for &a in advances {
        for (i, &r) in requests.iter().enumerate() {
            let advance = if i == 0 { a } else { Nanos::ZERO };
            steps.push(at(advance, r, items));
        }
    }
    steps
}

/// `conform` with absolute times, which may go backwards.
async fn conform_at(redis: &RedisStore, items: &[Item], steps: &[(Nanos, Step)]) {
    let memory = MemoryStore::new();
    for (n, (now, step)) in steps.iter().enumerate() {
        let Some(plan) = common::plan_of(items, step) else {
            continue;
        };
        let want = memory.decide_now(&plan, *now, step.request, step.mode);
        let got = redis.decide(&plan, *now, step.request, step.mode).await;
        assert_eq!(
            got, want,
            "step {n} at {now} ({step:?}) differs: Redis (left) vs memory (right)\nitems: {items:?}"
        );
    }
}

#[tokio::test]
async fn two_buckets_weigh_the_previous_window() {
    let (_server, redis) = caller_clock_server().await;
    let minute = Nanos::from_secs(60);
    let items = [Item::new(sw(100, minute, 2), 1, "acme")];
    let s = Nanos::from_secs;
    let ns = Nanos::new;
    let steps = [
        // Seed 004's example: 60 in the first minute, then at 01:43 the
        // previous minute weighs 17/60 and 83 remain.
        at(s(30), Hits::between(1, 60), &[0]),
        at(s(73), Hits::between(1, 1000), &[0]),
        at(ns(0), Hits::exactly(1), &[0]),
        // One nanosecond before 01:44 the weight still rounds up to 17.
        at(s(1).saturating_sub(ns(1)), Hits::exactly(1), &[0]),
        at(ns(1), Hits::exactly(1), &[0]),
        at(ns(0), Hits::between(0, 0), &[0]),
        at(ns(0), Hits::between(0, 7), &[0]),
        // Malformed, and more than the limit can ever hold.
        at(ns(0), Hits::between(5, 3), &[0]),
        at(ns(0), Hits::exactly(101), &[0]),
        at(ns(0), Hits::between(101, 200), &[0]),
        // Just before, at and just after the minute's edge: the current
        // minute becomes the fully weighted previous one.
        at(s(16).saturating_sub(ns(1)), Hits::exactly(1), &[0]),
        at(ns(1), Hits::exactly(1), &[0]),
        at(ns(1), Hits::between(1, 100), &[0]),
        at(s(59), Hits::between(1, 100), &[0]),
        // A shift of exactly one, then far more than the two counters.
        at(s(1), Hits::between(0, 3), &[0]),
        at(s(60 * 5 + 7), Hits::between(2, 300), &[0]),
        at(s(59), Hits::exactly(100), &[0]),
        at(s(1), Hits::exactly(1), &[0]),
        at(s(119), Hits::between(0, 1), &[0]),
        at(s(1), Hits::between(0, 1), &[0]),
    ];
    conform(&redis, &items, boundary_after(T0, minute), &steps).await;
}

#[tokio::test]
async fn n_buckets_track_sub_windows() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        // Five 15 s sub-windows' counters (the core's own example).
        Item::new(sw(10, Nanos::from_secs(60), 5), 1, "acme"),
        // 1024 counters of 10 ms each.
        Item::new(sw(50, Nanos::from_millis(10_230), 1024), 2, "acme"),
        // A window that does not divide evenly: 7 s over 3 sub-windows.
        Item::new(sw(9, Nanos::from_secs(7), 4), 3, ""),
    ];
    let s = Nanos::from_secs;
    let ms = Nanos::from_millis;
    let ns = Nanos::new;
    let mut steps = vec![
        at(ns(0), Hits::exactly(10), &[0]),
        at(s(59), Hits::exactly(1), &[0]),
        // At 60 s the first sub-window is the fully weighted oldest; it
        // fades until 1.5 s later.
        at(s(1), Hits::exactly(1), &[0]),
        at(ms(1500).saturating_sub(ns(1)), Hits::exactly(1), &[0]),
        at(ns(1), Hits::exactly(1), &[0]),
        at(ns(0), Hits::between(0, 10), &[0]),
        // A shift of two sub-windows, then of exactly the edge.
        at(s(30), Hits::between(1, 10), &[0]),
        at(ms(13_500).saturating_sub(ns(1)), Hits::between(0, 10), &[0]),
        at(ns(1), Hits::between(0, 10), &[0]),
        at(s(15), Hits::between(1, 4), &[0]),
        // Further than every counter, and a request no wait admits.
        at(s(3600).saturating_add(ns(1)), Hits::between(1, 4), &[0]),
        at(ns(0), Hits::exactly(11), &[0]),
    ];
    // The 1024 counters, hit in many sub-windows, then shifted by less and
    // more than their number.
    for k in 0..40u64 {
        steps.push(at(ns(7_000_000 + k * 3), Hits::between(1, 3), &[1]));
    }
    steps.extend([
        at(ms(10_000), Hits::between(1, 50), &[1]),
        at(ms(230).saturating_sub(ns(1)), Hits::between(0, 50), &[1]),
        at(ns(1), Hits::between(0, 50), &[1]),
        at(s(20), Hits::between(1, 50), &[1]),
        at(ms(5), Hits::exactly(51), &[1]),
    ]);
    // The uneven window, alone and in one plan with the others.
    for k in 0..30u64 {
        let items: &[usize] = if k % 3 == 0 { &[2, 0, 1] } else { &[2] };
        steps.push(at(ms(400 + 37 * k), Hits::between(k % 2, 4), items));
    }
    conform(
        &redis,
        &items,
        boundary_after(T0, Nanos::from_secs(60)),
        &steps,
    )
    .await;
}

#[tokio::test]
async fn long_windows_and_large_counts_are_exact() {
    let (_server, redis) = caller_clock_server().await;
    let month = Nanos::from_secs(30 * 86_400);
    let items = [
        // 10^9 over 30 days: oldest × (S − e) reaches about 2.6 × 10^24.
        Item::new(sw(1_000_000_000, month, 2), 1, "acme"),
        Item::new(sw(1_000_000_000, month, 7), 2, "acme"),
        // The largest limit and span the Redis store accepts: products
        // near 2^104.
        Item::new(sw(TOP, Nanos::new(TOP), 2), 3, "acme"),
        Item::new(sw(TOP, Nanos::new(TOP), 1024), 4, "acme"),
    ];
    let ns = Nanos::new;
    let odd = [
        DAY.saturating_add(ns(123_456_789)),
        Nanos::from_secs(29 * 86_400).saturating_add(ns(987_654_321)),
        DAY.saturating_mul(7).saturating_add(ns(3)),
        Nanos::from_secs(12 * 3600).saturating_add(ns(13)),
        DAY.saturating_mul(3).saturating_add(ns(999_999_999)),
        ns(1),
        DAY.saturating_mul(11).saturating_add(ns(424_242_424_242)),
    ];
    let billion = [
        Hits::between(1, 999_999_937),
        Hits::exactly(1),
        Hits::exactly(17),
        Hits::exactly(1_000_000_000),
        Hits::between(0, 500_000_001),
        Hits::between(1_000_000_001, 1_000_000_001),
    ];
    let top = [
        Hits::between(1, TOP),
        Hits::exactly(1),
        Hits::exactly(TOP),
        Hits::between(0, 1 << 51),
        Hits::exactly(123_456_789_012_345),
    ];
    let mut steps = probes(&odd, &billion, &[0]);
    steps.extend(probes(&odd, &billion, &[1]));
    steps.extend(probes(&odd, &billion, &[0, 1]));
    steps.extend(probes(&odd, &top, &[2]));
    steps.extend(probes(&odd, &top, &[3]));
    steps.extend(probes(&odd, &top, &[2, 3]));
    conform(&redis, &items, T0.saturating_add(ns(271_828_182)), &steps).await;
}

#[tokio::test]
async fn retry_after_is_exact_for_long_windows() {
    let (_server, redis) = caller_clock_server().await;
    let month = Nanos::from_secs(30 * 86_400);
    let items = [
        Item::new(sw(1_000_000_000, month, 2), 1, "acme"),
        Item::new(sw(1_000_000_000, month, 4), 2, "acme"),
        Item::new(sw(TOP, Nanos::new(TOP), 2), 3, "acme"),
    ];
    let ns = Nanos::new;
    // A nearly full sub-window becomes the oldest; then requests it rejects
    // (rejections change nothing), each needing r·S / oldest with r·S far
    // past 2^53. In doubles, 500_000_001 over 30 days is 1 ns off, say.
    let wanted = |limit: u64| {
        [
            limit / 2 + 1,
            limit / 3,
            limit / 7 * 5,
            limit / 10 + 7,
            limit / 100 * 77,
            limit - limit / 1000,
            limit / 5 * 2 + 1,
            limit / 9 * 8 + 3,
            limit / 2 + 12_345,
            limit / 3 * 2 + 1,
        ]
    };
    for (i, limit, fill, sub) in [
        (0usize, 1_000_000_000u64, 999_999_937u64, month),
        (1, 1_000_000_000, 999_999_937, Nanos::from_secs(10 * 86_400)),
        (2, TOP, TOP - 1_234_567, Nanos::new(TOP)),
    ] {
        let mut steps = vec![at(ns(0), Hits::between(1, fill), &[i])];
        for advance in [
            sub.saturating_add(DAY).saturating_add(ns(777)),
            DAY.saturating_mul(3).saturating_add(ns(5)),
        ] {
            let requests = wanted(limit).map(Hits::exactly);
            steps.extend(probes(&[advance], &requests, &[i]));
        }
        // Each item alone, from the start of one of its sub-windows.
        let start = boundary_after(T0, sub).saturating_add(ns(12_345));
        conform(&redis, &items, start, &steps).await;
    }
}

#[tokio::test]
async fn acquire_cannot_schedule_in_either_store() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        Item::new(sw(5, Nanos::SECOND, 3), 1, "acme"),
        Item::new(gcra(10, Nanos::SECOND, 4), 2, "acme"),
    ];
    let acquire = |items: &[usize]| Step {
        advance: Nanos::from_millis(10),
        request: Hits::exactly(1),
        mode: Mode::Acquire,
        items: items.to_vec(),
        own: Vec::new(),
    };
    let steps = [
        at(Nanos::ZERO, Hits::exactly(2), &[0, 1]),
        acquire(&[0]),
        acquire(&[1, 0]),
        acquire(&[0, 1]),
        // Nothing was recorded by the failed acquires.
        at(Nanos::ZERO, Hits::between(1, 9), &[0, 1]),
        at(Nanos::ZERO, Hits::between(1, 9), &[1]),
    ];
    conform(&redis, &items, T0, &steps).await;

    // Equal answers could be equal by accident: the error is the one the
    // core gives, naming the entry and the algorithm.
    let mut plan = Plan::default().with_affinity(7);
    plan.push(items[1].key.clone(), Arc::clone(&items[1].limit), false)
        .unwrap();
    plan.push(items[0].key.clone(), Arc::clone(&items[0].limit), true)
        .unwrap();
    let got = redis
        .decide(&plan, T0, Hits::exactly(1), Mode::Acquire)
        .await;
    assert_eq!(
        got,
        Err(StoreError::Plan(PlanError::CannotSchedule {
            index: 1,
            algorithm: "sliding_window",
        }))
    );
}

#[tokio::test]
async fn shadow_and_multi_limit_plans_match() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        Item::new(sw(8, Nanos::SECOND, 2), 1, "acme"),
        // Tighter, in shadow: it records what it would grant but never
        // limits.
        Item::new(sw(3, Nanos::SECOND, 4), 2, "acme").shadow(),
        Item::new(gcra(10, Nanos::SECOND, 4), 3, "acme"),
        Item::new(sw(5, Nanos::from_millis(300), 6), 4, "").shadow(),
    ];
    let ms = Nanos::from_millis;
    let mut steps = Vec::new();
    for k in 0..36u64 {
        let plan: &[usize] = match k % 4 {
            0 => &[0, 1, 2, 3],
            1 => &[1, 0],
            2 => &[3, 2, 1],
            _ => &[1, 3],
        };
        steps.push(at(ms(45 * (k % 5)), Hits::between(k % 3, 1 + k % 6), plan));
    }
    conform(&redis, &items, T0, &steps).await;
}

#[tokio::test]
async fn time_going_backwards_keeps_the_counters() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        Item::new(sw(10, Nanos::from_secs(60), 5), 1, "acme"),
        Item::new(sw(10, Nanos::from_secs(60), 2), 2, "acme"),
    ];
    let base = boundary_after(T0, Nanos::from_secs(60));
    let s = |n: u64| base.saturating_add(Nanos::from_secs(n));
    let back = |n: u64| base.saturating_sub(Nanos::from_secs(n));
    let step = |request: Hits, items: &[usize]| at(Nanos::ZERO, request, items);
    let steps = [
        (s(20), step(Hits::exactly(4), &[0, 1])),
        // Into earlier sub-windows: the oldest weighs fully.
        (s(5), step(Hits::between(1, 10), &[0, 1])),
        (back(50), step(Hits::between(0, 10), &[0])),
        (back(50), step(Hits::between(0, 10), &[1])),
        (s(70), step(Hits::between(1, 10), &[0, 1])),
        (s(16), step(Hits::between(0, 10), &[0, 1])),
        (s(140), step(Hits::between(0, 3), &[0, 1])),
        (s(10), step(Hits::between(0, 3), &[0, 1])),
    ];
    conform_at(&redis, &items, &steps).await;
}

/// Runs one `Try` request on `item` at `now` in the Redis store, returning
/// whether it was allowed.
async fn hit(redis: &RedisStore, item: &Item, now: Nanos, hits: u64) -> bool {
    let mut plan = Plan::default().with_affinity(7);
    plan.push(item.key.clone(), Arc::clone(&item.limit), false)
        .unwrap();
    let d = redis
        .decide(&plan, now, Hits::exactly(hits), Mode::Try)
        .await
        .unwrap();
    d.allowed
}

#[tokio::test]
async fn keys_live_until_idle_and_no_longer() {
    let (server, redis) = caller_clock_server().await;
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let item = Item::new(sw(10, Nanos::from_secs(60), 5), 1, "acme");
    let sub = Nanos::from_secs(15);
    // A hit 7 s into a sub-window weighs until that sub-window is five
    // sub-windows old: 68 s later.
    let first = boundary_after(T0, sub).saturating_add(Nanos::from_secs(7));
    assert!(hit(&redis, &item, first, 3).await);
    // Limit states only: the store keeps keys of its own (its copy log's
    // live set) beside them.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:l:*")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let before: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut con)
        .await
        .unwrap();

    // A rejected request one nanosecond before it is idle stores it again;
    // at the edge the key goes.
    let edge = first.saturating_add(Nanos::from_secs(68));
    assert!(!hit(&redis, &item, edge.saturating_sub(Nanos::new(1)), 11).await);
    assert_eq!(server.command(&format!("EXISTS {}", keys[0])), ":1");
    let after: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query_async(&mut con)
        .await
        .unwrap();
    // The script sets floor(ttl in ms) plus a margin of its own choosing;
    // the two TTLs differ by the 68 s of the script's time that passed
    // (give or take the real time between the calls).
    assert!(
        (67_000..=69_000).contains(&(before - after)),
        "PTTL {before} then {after}"
    );
    assert!(!hit(&redis, &item, edge, 11).await);
    assert_eq!(server.command(&format!("EXISTS {}", keys[0])), ":0");
}

/// Sliding-window parameters: limit, window in ms, buckets (mostly 2..=8,
/// sometimes many).
fn window_params() -> impl Strategy<Value = (u64, u64, u32)> {
    (
        1u64..40,
        1u64..3000,
        prop_oneof![8 => 2u32..=8, 1 => 9u32..=64, 1 => Just(1024u32)],
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn sliding_windows_match_the_memory_store(
        a in window_params(),
        b in window_params(),
        c in window_params(),
        g in (1u64..50, 1u64..3000, 1u64..8),
        shadow in any::<bool>(),
        offset in 0u64..10_000_000_000,
        steps in proptest::collection::vec(step(4, 400_000_000, 12, 8), 1..40),
    ) {
        let ms = Nanos::from_millis;
        let mut items = mixed_items(sw(a.0, ms(a.1), a.2), sw(b.0, ms(b.1), b.2), shadow, g, "acme");
        items.push(Item::new(sw(c.0, ms(c.1), c.2), 4, ""));
        conform_on_a_new_server(&items, T0.saturating_add(Nanos::new(offset)), &steps);
    }

    #[test]
    fn long_windows_match_the_memory_store(
        params in proptest::collection::vec(
            ((1u64 << 30)..=TOP, (1u64 << 40)..=TOP, 2u32..=8),
            3,
        ),
        offset in 0u64..(1 << 52),
        steps in proptest::collection::vec(step(3, 1 << 50, 1 << 50, 0), 1..40),
    ) {
        let items: Vec<Item> = params
            .iter()
            .enumerate()
            .map(|(i, &(limit, window, buckets))| {
                Item::new(sw(limit, Nanos::new(window), buckets), i as u64 + 1, "acme")
            })
            .collect();
        conform_on_a_new_server(&items, T0.saturating_add(Nanos::new(offset)), &steps);
    }
}
