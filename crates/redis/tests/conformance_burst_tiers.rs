//! Charon's burst tiers: the Redis store answers what the memory store
//! answers, step for step, on the paper's examples (§2.1 Figures 2–3, the
//! §2.3 cookbook) and on random tiers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::strategies::step;
use common::{
    check_ttls, conform_on_a_new_server, gcra, mixed_items, run, shaped_steps, Item, RedisServer,
    Step, T0,
};
use proptest::prelude::*;
use tollgate_core::{BurstTiers, Hits, Limit, Mode, Nanos, Tier};

const NS: Nanos = Nanos::NANOSECOND;
const ZERO: Nanos = Nanos::ZERO;

fn secs(n: u64) -> Nanos {
    Nanos::from_secs(n)
}

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

/// `a + b`.
fn at(a: Nanos, b: Nanos) -> Nanos {
    a.saturating_add(b)
}

fn tier(limit: u64, window: Nanos, active: Nanos, cooldown: Nanos, skippable: bool) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable,
    }
}

fn tiers(t: Vec<Tier>) -> Limit {
    Limit::BurstTiers(BurstTiers::new(t).unwrap())
}

fn one() -> Hits {
    Hits::exactly(1)
}

/// Try steps at the given offsets from the start (non-decreasing), each
/// against `items`.
fn timeline(points: &[(Nanos, Hits)], items: &[usize]) -> Vec<Step> {
    let mut prev = ZERO;
    points
        .iter()
        .map(|&(t, request)| {
            let advance = t.saturating_sub(prev);
            prev = t;
            Step {
                advance,
                request,
                mode: Mode::Try,
                items: items.to_vec(),
                own: Vec::new(),
            }
        })
        .collect()
}

/// Figure 2's tiers: tier 1 is `L=10` per 1 s, active 60 s, no cooldown;
/// tier 2 is `L=50` per 10 s, active 30 s, cooldown 300 s.
fn figure_2() -> Limit {
    tiers(vec![
        tier(10, secs(1), secs(60), ZERO, false),
        tier(50, secs(10), secs(30), secs(300), false),
    ])
}

#[tokio::test]
async fn successful_burst_figure_2() {
    let server = RedisServer::start();
    let items = [Item::new(figure_2(), 1, "acme")];
    let mut points = vec![(ZERO, one())];
    for k in 2..=10 {
        points.push((ms(10 * (k - 1)), one()));
    }
    let t11 = ms(100);
    points.extend([
        // Tier 1 is full: a burst into tier 2.
        (t11, one()),
        (ms(200), one()),
        (ms(300), Hits::between(1, 100)),
        (ms(400), one()),
        // The oldest hit of tier 2 leaves its window at t11 + 10 s + 1ns.
        (at(t11, secs(10)), one()),
        (at(at(t11, secs(10)), NS), one()),
        (at(t11, secs(30)).saturating_sub(NS), Hits::between(0, 60)),
        // Tier 2 cools down; tier 1 is current again.
        (at(t11, secs(30)), Hits::between(1, 60)),
        (secs(60), one()),
        (at(t11, secs(330)).saturating_sub(NS), Hits::exactly(11)),
        (at(t11, secs(330)), Hits::exactly(11)),
        (secs(400), Hits::exactly(70)),
    ]);
    run(&server, &items, &timeline(&points, &[0])).await;
}

#[tokio::test]
async fn burst_blocked_by_cooldown_figure_3() {
    let server = RedisServer::start();
    let items = [Item::new(figure_2(), 1, "acme")];
    let t2 = ms(100);
    let active_end = at(t2, secs(30));
    let fill = secs(32);
    let t = secs(60).saturating_sub(ms(200));
    let end = at(t2, secs(330));
    let points = [
        (ZERO, Hits::exactly(10)),
        (t2, one()),
        (active_end.saturating_sub(NS), one()),
        // Fallback to tier 1; tier 2 cools down and blocks any burst.
        (active_end, one()),
        (fill, Hits::between(1, 100)),
        (at(fill, ms(500)), one()),
        (t, Hits::exactly(10)),
        // Re-entered at the end of tier 1's period, its old hits still count.
        (at(t, ms(100)), one()),
        (secs(60), one()),
        (at(t, secs(1)), one()),
        (at(at(t, secs(1)), NS), one()),
        (end.saturating_sub(ms(100)), Hits::exactly(10)),
        (end.saturating_sub(ms(100)), one()),
        (end.saturating_sub(NS), one()),
        (end, one()),
        (end, Hits::between(1, 100)),
    ];
    run(&server, &items, &timeline(&points, &[0])).await;
}

fn skip_tiers(skippable: bool) -> Limit {
    tiers(vec![
        tier(2, secs(1), secs(60), ZERO, false),
        tier(3, secs(1), secs(5), secs(100), skippable),
        tier(5, secs(1), secs(60), ZERO, false),
    ])
}

#[tokio::test]
async fn skippable_and_blocking_tiers_in_cooldown() {
    let server = RedisServer::start();
    let points = [
        (ZERO, Hits::exactly(5)),
        (secs(6), Hits::exactly(2)),
        // Skipped when skippable; otherwise the burst is blocked.
        (secs(6), one()),
        (secs(6), Hits::between(1, 10)),
        (secs(7), Hits::between(2, 10)),
        (at(secs(7), NS), Hits::between(3, 4)),
        (secs(105).saturating_sub(NS), Hits::between(1, 100)),
        (secs(105), Hits::between(1, 100)),
        (secs(110), Hits::between(6, 100)),
    ];
    for skippable in [true, false] {
        let items = [
            Item::new(skip_tiers(skippable), 1, "acme"),
            Item::new(skip_tiers(!skippable), 2, "acme"),
        ];
        run(&server, &items, &timeline(&points, &[0])).await;
        // Both side by side: the plan grants what the tighter one admits.
        run(&server, &items, &timeline(&points, &[1, 0])).await;
    }
}

#[tokio::test]
async fn fallback_drops_several_levels_at_once() {
    let server = RedisServer::start();
    let items = [Item::new(
        tiers(vec![
            tier(1, secs(1), secs(100), ZERO, false),
            tier(1, secs(10), secs(10), secs(50), false),
            tier(1, secs(10), secs(10), secs(50), false),
        ]),
        1,
        "acme",
    )];
    let points = [
        (ZERO, Hits::exactly(3)),
        (secs(10).saturating_sub(NS), one()),
        (secs(10), one()),
        (secs(10), one()),
        (secs(60), Hits::between(1, 5)),
        (secs(61), Hits::between(1, 5)),
    ];
    run(&server, &items, &timeline(&points, &[0])).await;
}

#[tokio::test]
async fn hits_outlive_the_tier_period() {
    let server = RedisServer::start();
    // A window longer than the active period (the core does not normalize
    // it away): once the period ends, the tier is inactive but its hits
    // still count, so the state is not idle and must be kept.
    let items = [Item::new(
        tiers(vec![
            tier(2, secs(10), secs(1), ZERO, false),
            tier(3, secs(2), secs(1), secs(1), true),
        ]),
        1,
        "acme",
    )];
    let points = [
        (ZERO, one()),
        (secs(2), Hits::exactly(6)),
        (secs(3), Hits::exactly(2)),
        (secs(3), Hits::between(1, 6)),
        (secs(5), Hits::exactly(5)),
        (secs(10), Hits::exactly(2)),
        (at(secs(10), NS), Hits::exactly(2)),
        (secs(20), Hits::between(0, 9)),
    ];
    run(&server, &items, &timeline(&points, &[0])).await;
}

#[tokio::test]
async fn min_hits_spanning_tiers() {
    let server = RedisServer::start();
    let items = [
        Item::new(
            tiers(vec![
                tier(2, secs(1), secs(60), ZERO, false),
                tier(3, secs(1), secs(60), ZERO, false),
                tier(5, secs(1), secs(60), ZERO, false),
            ]),
            1,
            "acme",
        ),
        Item::new(gcra(10, secs(1), 20), 2, "acme"),
    ];
    let partial = [
        (ZERO, one()),
        // 1 left in tier 1, 3 in tier 2, 5 in tier 3.
        (ms(1), Hits::between(3, 20)),
        (ms(2), one()),
        (at(secs(1), NS), Hits::between(9, 9)),
    ];
    run(&server, &items, &timeline(&partial, &[0])).await;
    let spanning = [
        (ZERO, one()),
        // 10 does not fit the walk now (1 + 3 + 5), once tier 1 empties it
        // does (2 + 3 + 5).
        (ZERO, Hits::between(10, 20)),
        (secs(1), Hits::between(10, 20)),
        (at(secs(1), NS), Hits::between(10, 20)),
        (secs(2), Hits::between(4, 4)),
    ];
    run(&server, &items, &timeline(&spanning, &[0])).await;
    run(&server, &items, &timeline(&spanning, &[1, 0])).await;
    // More than every tier together never fits; a huge request takes all.
    let never = [
        (ZERO, Hits::exactly(11)),
        (ZERO, Hits::between(1, 1 << 40)),
        (ms(5), Hits::between(0, 1 << 40)),
    ];
    run(&server, &items, &timeline(&never, &[0])).await;
}

#[tokio::test]
async fn fake_tier_zero_and_no_tiers() {
    let server = RedisServer::start();
    let items = [
        Item::new(figure_2(), 1, "acme"),
        Item::new(tiers(Vec::new()), 2, "acme"),
    ];
    let points = [
        (ZERO, Hits::exactly(61)),
        (ZERO, one()),
        (secs(60).saturating_sub(NS), Hits::exactly(61)),
        // Tier 1's period (no cooldown) is over: idle, the fake tier again.
        (secs(60), Hits::exactly(61)),
        (secs(60), Hits::between(0, 3)),
    ];
    run(&server, &items, &timeline(&points, &[0])).await;
    let none = [
        (ZERO, one()),
        (ZERO, Hits::between(1, 10)),
        (ZERO, Hits::between(0, 10)),
        (ms(1), Hits::exactly(1000)),
    ];
    run(&server, &items, &timeline(&none, &[1])).await;
    run(&server, &items, &timeline(&points, &[0, 1])).await;
}

/// §2.3 Penalties: higher tiers give more, briefly, and cool down longer.
#[tokio::test]
async fn penalties_pattern() {
    let server = RedisServer::start();
    let items = [Item::new(
        tiers(vec![
            tier(10, secs(1), secs(60), ZERO, false),
            tier(20, secs(1), secs(5), secs(60), false),
            tier(40, secs(1), secs(5), secs(120), false),
        ]),
        1,
        "acme",
    )];
    let all = Hits::between(1, 1000);
    let mut points = vec![(ZERO, all), (at(secs(1), NS), all)];
    let mut now = secs(5);
    while now < secs(59) {
        points.push((now, all));
        points.push((now, one()));
        now = at(now, at(secs(1), NS));
    }
    points.extend([
        (secs(60), all),
        (secs(65), all),
        (secs(125), all),
        (secs(125), one()),
        (secs(130), all),
    ]);
    run(&server, &items, &timeline(&points, &[0])).await;
}

/// §2.3 Punishment: a buffer tier, then a prison tier of limit 1 and a
/// long active period.
#[tokio::test]
async fn punishment_prison_tier() {
    let server = RedisServer::start();
    let hour = secs(3600);
    let items = [Item::new(
        tiers(vec![
            tier(5, secs(1), secs(60), ZERO, false),
            tier(1, hour, hour, ZERO, false),
        ]),
        1,
        "acme",
    )];
    let caught = ms(1);
    let free = at(caught, hour);
    let points = [
        (ZERO, Hits::exactly(5)),
        (caught, one()),
        (at(caught, NS), Hits::between(1, 100)),
        (secs(2), one()),
        (secs(61), one()),
        (at(caught, secs(1800)), one()),
        (free.saturating_sub(NS), one()),
        (free, one()),
        (free, Hits::between(1, 100)),
    ];
    run(&server, &items, &timeline(&points, &[0])).await;
}

/// §2.3 Batch processing: `L=5000, Tw=300, Ta=300, Tc=86100`.
#[tokio::test]
async fn batch_processing_pattern() {
    let server = RedisServer::start();
    let items = [Item::new(
        tiers(vec![tier(5000, secs(300), secs(300), secs(86_100), false)]),
        1,
        "acme",
    )];
    let mut points: Vec<(Nanos, Hits)> =
        (0..100).map(|k| (secs(3 * k), Hits::exactly(50))).collect();
    let day = secs(86_400);
    points.extend([
        (secs(299), one()),
        (secs(300).saturating_sub(NS), one()),
        (secs(300), one()),
        (secs(301), one()),
        (secs(40_000), one()),
        (day.saturating_sub(NS), one()),
        (day, Hits::between(1, 10_000)),
        (at(day, secs(1)), one()),
    ]);
    run(&server, &items, &timeline(&points, &[0])).await;
}

#[tokio::test]
async fn acquire_cannot_schedule_and_changes_nothing() {
    let server = RedisServer::start();
    let items = [
        Item::new(gcra(10, secs(1), 5), 1, "acme"),
        Item::new(figure_2(), 2, "acme"),
    ];
    let acquire = |items: Vec<usize>| Step {
        advance: ms(1),
        request: Hits::exactly(2),
        mode: Mode::Acquire,
        items,
        own: Vec::new(),
    };
    let steps = [
        Step::exactly(ZERO, 3, 2),
        acquire(vec![0, 1]),
        acquire(vec![1, 0]),
        acquire(vec![1]),
        Step::exactly(ms(1), 3, 2),
    ];
    run(&server, &items, &steps).await;
}

#[tokio::test]
async fn reshaped_tiers_under_a_key_start_fresh() {
    let server = RedisServer::start();
    // One key, its tiers changed by a config reload (and once replaced by
    // another algorithm): a state of another shape is read as fresh.
    let items = [
        Item::new(figure_2(), 1, "acme"),
        Item::new(skip_tiers(true), 1, "acme"),
        Item::new(gcra(10, secs(1), 5), 1, "acme"),
    ];
    let step = |advance: Nanos, hits: u64, item: usize| Step {
        advance,
        request: Hits::between(1, hits),
        mode: Mode::Try,
        items: vec![item],
        own: Vec::new(),
    };
    let steps = [
        step(ZERO, 12, 0),
        step(ms(1), 4, 1),
        step(ms(1), 12, 0),
        step(ms(1), 3, 2),
        step(ms(1), 12, 0),
        step(ms(1), 12, 0),
    ];
    run(&server, &items, &steps).await;
}

#[tokio::test]
async fn keys_live_until_the_tiers_are_idle() {
    let server = RedisServer::start();
    let items = [
        Item::new(figure_2(), 1, "acme"),
        Item::new(
            tiers(vec![
                tier(2, secs(10), secs(1), ZERO, false),
                tier(3, secs(2), secs(1), secs(40), true),
            ]),
            2,
            "acme",
        ),
    ];
    let points = [
        (ZERO, Hits::exactly(11)),
        (ms(1), one()),
        (secs(2), Hits::exactly(6)),
        (secs(5), one()),
        (secs(40), one()),
        (secs(400), Hits::between(0, 4)),
        (secs(800), Hits::exactly(0)),
    ];
    check_ttls(&server, &items, &timeline(&points, &[0, 1])).await;
    check_ttls(&server, &items, &timeline(&points, &[1])).await;
}

/// A span: whole milliseconds (so steps land on edges) or any nanoseconds.
fn span(max_ms: u64) -> impl Strategy<Value = Nanos> {
    prop_oneof![
        (1..max_ms).prop_map(Nanos::from_millis),
        (1..max_ms * 1_000_000).prop_map(Nanos::new),
    ]
}

fn random_tiers() -> impl Strategy<Value = Limit> {
    proptest::collection::vec(
        (
            1u64..6,
            span(1500),
            span(4000),
            prop_oneof![Just(ZERO), span(4000)],
            any::<bool>(),
        ),
        0..=3,
    )
    .prop_map(|t| {
        tiers(
            t.into_iter()
                .map(|(l, w, a, c, s)| tier(l, w, a, c, s))
                .collect(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn burst_tiers_match_the_memory_store(
        a in random_tiers(),
        b in random_tiers(),
        c in random_tiers(),
        g in (1u64..50, 1u64..3000, 1u64..8),
        three in any::<bool>(),
        shadow in any::<bool>(),
        coarse in any::<bool>(),
        steps in proptest::collection::vec(step(4, 300_000_000, 12, 10), 1..60),
    ) {
        let mut items = mixed_items(a, b, shadow, g, "acme");
        items.push(Item::new(c, 4, ""));
        conform_on_a_new_server(&items, T0, &shaped_steps(steps, three, coarse));
    }
}
