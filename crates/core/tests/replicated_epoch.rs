//! Tests of the gossiping interval limiter's bucket (`replicated::epoch`,
//! seed 001): the seed's greedy-client scenario, the gossiped report's
//! merge as a join, exactly-once correction, one node alone against a
//! token-bucket reference, idle states against fresh ones, and the bound on
//! what N nodes grant with gossip every epoch (stated in the module docs):
//! `T/I + N·C + (N − 1)·(E/I + 1)`.

// Test code, where a panic is how a check fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cases, delta, start, UNIT};
use proptest::prelude::*;
use tollgate_core::replicated::epoch::{EpochBucket, EpochBucketState, EpochReport};
use tollgate_core::replicated::{Generation, NodeId};
use tollgate_core::{Algorithm, Hits, Nanos, Rate, TokenBucket};

// ---------------------------------------------------------------------------
// Helpers and generators
// ---------------------------------------------------------------------------

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

/// Every node's report at `now`, then each delivered to every other node:
/// one full round of push-pull at an epoch boundary.
fn gossip(b: &EpochBucket, states: &mut [EpochBucketState], now: Nanos) {
    let reports: Vec<EpochReport> = states
        .iter_mut()
        .enumerate()
        .map(|(i, s)| b.report(s, NodeId(i as u64), now))
        .collect();
    for (i, s) in states.iter_mut().enumerate() {
        for (j, r) in reports.iter().enumerate() {
            if i != j {
                b.receive(s, NodeId(i as u64), now, r);
            }
        }
    }
}

/// Capacity, rate and epoch length, in multiples of the unit.
fn params() -> impl Strategy<Value = EpochBucket> {
    (1u64..8, 1u64..5, 1u64..40, 1u64..40).prop_map(|(capacity, count, k, e)| {
        EpochBucket::with_epoch(
            capacity,
            Rate::new(count, Nanos::new(k * UNIT)).unwrap(),
            Nanos::new(e * UNIT),
        )
        .unwrap()
    })
}

fn report() -> impl Strategy<Value = EpochReport> {
    (
        0u64..3,
        prop::collection::vec((0u64..4, 0u64..10), 0..5),
        prop_oneof![
            3 => Just(Generation::ZERO),
            1 => (1u64..3, 0u64..3).prop_map(|(at, node)| Generation {
                at: Nanos::new(at),
                node: NodeId(node),
            }),
        ],
    )
        .prop_map(|(e, t, g)| {
            EpochReport::from_parts(e, t.into_iter().map(|(n, c)| (NodeId(n), c)))
                .with_generation(g)
        })
}

/// Something that happens to one key on node 0.
#[derive(Clone, Debug)]
enum Op {
    Decide(Hits),
    Receive(EpochReport),
    Report,
}

fn op() -> impl Strategy<Value = (u64, Op)> {
    let op = prop_oneof![
        4 => (0u64..4, 0u64..4).prop_map(|(m, x)| Op::Decide(Hits::between(m, m + x))),
        2 => report().prop_map(Op::Receive),
        1 => Just(Op::Report),
    ];
    (delta(), op)
}

/// Applies `ops` on node 0, each after its delay, from `t0`: the time
/// after the last.
fn apply_all(b: &EpochBucket, s: &mut EpochBucketState, t0: u64, ops: &[(u64, Op)]) -> u64 {
    let mut t = t0;
    for (dt, op) in ops {
        t = t.saturating_add(*dt);
        apply(b, s, Nanos::new(t), op);
    }
    t
}

/// Applies `op` on node 0 at `now`; what it answered, for comparison.
fn apply(b: &EpochBucket, s: &mut EpochBucketState, now: Nanos, op: &Op) -> String {
    match op {
        Op::Decide(r) => format!("{:?}", b.decide(s, NodeId(0), now, *r)),
        Op::Receive(r) => format!("{:?}", b.receive(s, NodeId(0), now, r)),
        Op::Report => format!("{:?}", b.report(s, NodeId(0), now)),
    }
}

/// The reference token bucket: the time `full` at which it is full again;
/// it holds `C − ⌈(full − t)/I⌉` tokens at `t` (all `C` once `t >= full`),
/// and granting `n` moves `full` to `max(full, t) + n·I`.
struct Reference {
    capacity: u64,
    interval: u64,
    full: u64,
}

impl Reference {
    fn tokens(&self, t: u64) -> u64 {
        if t >= self.full {
            return self.capacity;
        }
        let short = (self.full - t).div_ceil(self.interval);
        self.capacity.saturating_sub(short)
    }

    fn try_take(&mut self, t: u64, n: u64) -> bool {
        if self.tokens(t) < n {
            return false;
        }
        self.full = self.full.max(t) + n * self.interval;
        true
    }
}

// ---------------------------------------------------------------------------
// Fixed vectors
// ---------------------------------------------------------------------------

#[test]
fn seed_001_greedy_client_bursts_then_buckets_go_negative() {
    // Capacity 10, 10 tokens per second, one-second epochs, three nodes.
    let b = EpochBucket::new(10, Rate::per_second(10).unwrap()).unwrap();
    let mut states = vec![EpochBucketState::default(); 3];
    // "a greedy client [can] request bucket max tokens from each node":
    // 30 tokens at once, three times the single-node maximum burst.
    let burst: u64 = states
        .iter_mut()
        .enumerate()
        .map(|(i, s)| {
            b.decide(s, NodeId(i as u64), Nanos::ZERO, Hits::between(1, 100))
                .granted
        })
        .sum();
    assert_eq!(burst, 30);
    // "the nodes will gossip on the following epoch, correcting their
    // bucket values - which will therefore become negative": each refilled
    // 10 and owes its two peers' 20.
    gossip(&b, &mut states, Nanos::SECOND);
    for s in &states {
        assert_eq!(s.level(), -10);
        assert_eq!(s.report().total(), 30);
    }
    // "it will take longer for the buckets to regain a positive capacity":
    // the debt is repaid at the configured rate.
    for (i, s) in states.iter_mut().enumerate() {
        let n = NodeId(i as u64);
        let d = b.decide(s, n, Nanos::SECOND, Hits::exactly(1));
        assert_eq!(d.retry_after, Some(ms(1100)));
        assert!(!b.decide(s, n, ms(2099), Hits::exactly(1)).allowed);
        assert!(b.decide(s, n, ms(2100), Hits::exactly(1)).allowed);
    }
}

#[test]
fn seed_001_long_run_average_is_the_configured_rate() {
    // The same greedy client asks every node for a token every 10 ms for a
    // minute, with gossip at every boundary: "the average throughput of
    // tokens remains as configured, in the long run".
    let b = EpochBucket::new(10, Rate::per_second(10).unwrap()).unwrap();
    let n = 3u64;
    let mut states = vec![EpochBucketState::default(); n as usize];
    let mut total = 0u64;
    let secs = 60u64;
    for t in (0..secs * 1000).step_by(10) {
        if t % 1000 == 0 {
            gossip(&b, &mut states, ms(t));
        }
        for (i, s) in states.iter_mut().enumerate() {
            total += b
                .decide(s, NodeId(i as u64), ms(t), Hits::exactly(1))
                .granted;
        }
    }
    // Configured: 600 over the minute. The bound: 600 + N·C + (N−1)(E/I+1).
    let bound = secs * 10 + n * 10 + (n - 1) * (10 + 1);
    assert!(total <= bound, "{total} > {bound}");
    assert!(total >= secs * 10 - 10, "{total}");
    let rate = total as f64 / secs as f64;
    assert!((rate - 10.0).abs() < 1.0, "{rate} per second");
}

#[test]
fn seed_001_partitions_deliver_the_rate_on_each_side_then_reconverge() {
    // "Each partition will deliver tokens at the same, total rate": two
    // sides of one node each, split for 10 s, then healed for 10 s.
    let b = EpochBucket::new(10, Rate::per_second(10).unwrap()).unwrap();
    let mut states = vec![EpochBucketState::default(); 2];
    let mut split = 0u64;
    let mut healed = 0u64;
    for t in (0..20_000u64).step_by(10) {
        if t % 1000 == 0 && t >= 10_000 {
            gossip(&b, &mut states, ms(t));
        }
        for (i, s) in states.iter_mut().enumerate() {
            let g = b
                .decide(s, NodeId(i as u64), ms(t), Hits::exactly(1))
                .granted;
            if t < 10_000 {
                split += g;
            } else {
                healed += g;
            }
        }
    }
    // Each side: 10 to start with, then 10 per second.
    assert_eq!(split, 2 * (10 + 99));
    // Healed: the last split epoch's traffic is corrected (not the totals
    // of the split before it), then the global rate again.
    assert!(healed <= 10 * 10 + 2 * 10 + 11, "{healed}");
    assert!(healed < 2 * 10 * 10);
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn report_merge_is_a_join(x in report(), y in report(), z in report()) {
        let mut xy = x.clone();
        xy.merge(&y);
        let mut yx = y.clone();
        yx.merge(&x);
        prop_assert_eq!(&xy, &yx);
        let mut xy_z = xy.clone();
        xy_z.merge(&z);
        let mut yz = y.clone();
        yz.merge(&z);
        let mut x_yz = x.clone();
        x_yz.merge(&yz);
        prop_assert_eq!(&xy_z, &x_yz);
        let mut xx = x.clone();
        prop_assert!(!xx.merge(&x));
        prop_assert_eq!(&xx, &x);
        prop_assert!(xy.includes(&x) && xy.includes(&y));
        let mut bottom = EpochReport::default();
        bottom.merge(&x);
        prop_assert_eq!(&bottom, &x);
        prop_assert!(!x.clone().merge(&EpochReport::default()));
    }

    #[test]
    fn a_report_received_twice_counts_once(
        b in params(),
        t0 in start(),
        ops in prop::collection::vec(op(), 0..20),
        r in report(),
        d in delta(),
    ) {
        let mut s = EpochBucketState::default();
        let t = apply_all(&b, &mut s, t0, &ops);
        let now = Nanos::new(t);
        b.receive(&mut s, NodeId(0), now, &r);
        let once = s.clone();
        prop_assert!(!b.receive(&mut s, NodeId(0), now, &r));
        prop_assert_eq!(&s, &once);
        // Later too: only the time's own effects (refill, tick) differ.
        let later = Nanos::new(t.saturating_add(d));
        let mut twice = s.clone();
        b.receive(&mut twice, NodeId(0), later, &r);
        b.advance(&mut s, NodeId(0), later);
        prop_assert_eq!(&twice, &s);
    }

    #[test]
    fn own_traffic_is_never_subtracted(
        b in params(),
        t0 in start(),
        ops in prop::collection::vec(op(), 0..20),
    ) {
        let mut s = EpochBucketState::default();
        let t = apply_all(&b, &mut s, t0, &ops);
        let now = Nanos::new(t);
        let own = b.report(&mut s, NodeId(0), now);
        let mut echoed = EpochReport::from_parts(own.epoch(), [(NodeId(0), own.traffic_of(NodeId(0)) + 5)]);
        echoed.merge(&own);
        let level = s.level();
        b.receive(&mut s, NodeId(0), now, &echoed);
        prop_assert_eq!(s.level(), level);
    }

    #[test]
    fn one_node_alone_is_a_token_bucket(
        b in params(),
        t0 in start(),
        steps in prop::collection::vec((delta(), 0u64..10, any::<bool>()), 1..60),
    ) {
        let tb = TokenBucket::new(b.capacity(), b.rate()).unwrap();
        let mut reference = Reference { capacity: b.capacity(), interval: b.interval().as_u64(), full: 0 };
        let mut s = EpochBucketState::default();
        let mut ts = tb.fresh();
        let mut t = t0;
        for (dt, hits, tick) in steps {
            t = t.saturating_add(dt);
            let now = Nanos::new(t);
            if tick {
                // Gossip with no peers: ticks and commits, changes no decision.
                b.report(&mut s, NodeId(7), now);
            }
            let d = b.decide(&mut s, NodeId(7), now, Hits::exactly(hits));
            prop_assert_eq!(d.allowed, reference.try_take(t, hits), "at {}", t);
            prop_assert_eq!(d, tb.decide(&mut ts, now, Hits::exactly(hits)));
        }
    }

    #[test]
    fn an_idle_state_is_a_fresh_one(
        b in params(),
        t0 in start(),
        before in prop::collection::vec(op(), 0..15),
        gap in delta(),
        after in prop::collection::vec(op(), 0..15),
    ) {
        let mut s = EpochBucketState::default();
        let mut t = apply_all(&b, &mut s, t0, &before);
        t = t.saturating_add(gap);
        if !b.is_idle(&s, Nanos::new(t)) {
            return Ok(());
        }
        // Fresh in the same reset generation: a reset key ignores reports
        // from before its reset, which a never-reset one takes.
        let mut f = EpochBucketState::reset(s.generation());
        for (dt, op) in &after {
            t = t.saturating_add(*dt);
            let now = Nanos::new(t);
            prop_assert_eq!(apply(&b, &mut s, now, op), apply(&b, &mut f, now, op));
        }
    }

    #[test]
    fn n_nodes_gossiping_every_epoch_stay_within_the_bound(
        b in params(),
        n in 2usize..5,
        epochs in prop::collection::vec(
            prop::collection::vec((0u64..1000, 0usize..5, 1u64..6), 0..25), 1..12),
    ) {
        let e = b.epoch().as_u64();
        let i = b.interval().as_u64();
        let c = b.capacity();
        let nn = n as u64;
        let mut states = vec![EpochBucketState::default(); n];
        let mut total = 0u64;
        for (k, requests) in epochs.iter().enumerate() {
            let boundary = k as u64 * e;
            gossip(&b, &mut states, Nanos::new(boundary));
            let mut requests = requests.clone();
            requests.sort();
            for (at, node, hits) in requests {
                let t = boundary + at * e / 1000;
                let node = node % n;
                total += b
                    .decide(&mut states[node], NodeId(node as u64), Nanos::new(t), Hits::between(1, hits))
                    .granted;
                let bound = t / i + nn * c + (nn - 1) * (e / i + 1);
                prop_assert!(total <= bound, "{} granted by {}, bound {}", total, t, bound);
            }
        }
    }
}
