//! Property tests of the thesis's counter-based token bucket
//! (`replicated::counter`, seed 000 §3.1): its merge is a join (commutative,
//! associative, idempotent, with the empty state as identity), local
//! decisions only move a state up, replicas converge whatever the order of
//! gossip and lose no grant, one node alone decides exactly like the core's
//! `TokenBucket`, and nodes that merge after every step grant exactly what
//! one centralized bucket grants.
//!
//! Times follow `properties.rs`: steps biased towards repeats, nanosecond
//! jitter and multiples of 25 ms (the unit of every generated period) ± 1 ns,
//! so whole tokens are hit exactly.

// Test code, where a panic is how a check fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cases, delta, start, UNIT};
use proptest::prelude::*;
use tollgate_core::replicated::counter::{CounterBucket, CounterBucketState};
use tollgate_core::replicated::{Generation, NodeId};
use tollgate_core::{Algorithm, Decision, Hits, Nanos, Rate, TokenBucket, Usage};

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// A step in time that sometimes goes backwards (a clock or trace out of
/// order).
fn jump() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => delta().prop_map(|d| d as i64),
        1 => delta().prop_map(|d| -(d as i64)),
    ]
}

fn moved(t: u64, by: i64) -> u64 {
    if by >= 0 {
        t.saturating_add(by as u64)
    } else {
        t.saturating_sub(by.unsigned_abs())
    }
}

/// Mostly well-formed requests; sometimes `min_hits > hits`.
fn request() -> impl Strategy<Value = Hits> {
    prop_oneof![
        4 => (0u64..4).prop_map(Hits::exactly),
        2 => (0u64..4, 0u64..10).prop_map(|(min, extra)| Hits::between(min, min + extra)),
        1 => (0u64..12).prop_map(Hits::exactly),
        1 => (1u64..6, 0u64..6).prop_map(|(min, hits)| Hits::between(min, hits)),
    ]
}

/// Capacity and rate, in the shapes the config accepts.
fn params() -> impl Strategy<Value = (u64, Rate)> {
    (1u64..8, 1u64..5, 1u64..40).prop_map(|(capacity, count, k)| {
        (capacity, Rate::new(count, Nanos::new(k * UNIT)).unwrap())
    })
}

fn bucket((capacity, rate): (u64, Rate)) -> CounterBucket {
    CounterBucket::new(capacity, rate).unwrap()
}

/// Any state at all, reachable or not, with small values so that equal
/// limits, equal timestamps and shared nodes are common.
fn any_state() -> impl Strategy<Value = CounterBucketState> {
    let count = prop_oneof![4 => 0u64..6, 1 => any::<u64>()];
    let limit = prop_oneof![4 => 0u64..12, 1 => any::<u64>()];
    let at = prop_oneof![4 => (0u64..4).prop_map(Nanos::from_secs), 1 => any::<u64>().prop_map(Nanos::new)];
    (
        prop::collection::vec((0u64..4, count), 0..6),
        limit,
        prop::option::of(at),
        generation(),
    )
        .prop_map(|(entries, limit, at, generation)| {
            CounterBucketState::from_parts(
                entries.into_iter().map(|(n, c)| (NodeId(n), c)),
                limit,
                at,
            )
            .with_generation(generation)
        })
}

/// Mostly a key never reset; sometimes one of a few reset generations
/// (two nodes resetting at one instant among them), so states of equal and
/// of different generations meet.
fn generation() -> impl Strategy<Value = Generation> {
    prop_oneof![
        3 => Just(Generation::ZERO),
        1 => (1u64..3, 1u64..3).prop_map(|(at, node)| Generation {
            at: Nanos::new(at),
            node: NodeId(node),
        }),
    ]
}

/// One step of a cluster run: a request at a node, or one node's state
/// gossiped to another.
#[derive(Clone, Debug)]
enum Step {
    Request { node: usize, dt: u64, request: Hits },
    Gossip { from: usize, to: usize },
}

fn steps(nodes: usize) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        3 => (0..nodes, delta(), request())
            .prop_map(|(node, dt, request)| Step::Request { node, dt, request }),
        2 => (0..nodes, 0..nodes).prop_map(|(from, to)| Step::Gossip { from, to }),
    ];
    prop::collection::vec(step, 0..60)
}

fn merged(a: &CounterBucketState, b: &CounterBucketState) -> CounterBucketState {
    let mut m = a.clone();
    m.merge(b);
    m
}

// ---------------------------------------------------------------------------
// The merge is a join
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn merge_is_commutative_associative_and_idempotent(
        a in any_state(),
        b in any_state(),
        c in any_state(),
    ) {
        prop_assert_eq!(merged(&a, &b), merged(&b, &a));
        prop_assert_eq!(merged(&merged(&a, &b), &c), merged(&a, &merged(&b, &c)));
        prop_assert_eq!(merged(&a, &a), a.clone());
        prop_assert_eq!(merged(&a, &CounterBucketState::default()), a.clone());
        prop_assert_eq!(merged(&CounterBucketState::default(), &a), a.clone());
    }

    #[test]
    fn merge_is_the_least_upper_bound_and_reports_change(
        a in any_state(),
        b in any_state(),
        x in any_state(),
    ) {
        let mut m = a.clone();
        let changed = m.merge(&b);
        prop_assert_eq!(changed, m != a);
        prop_assert!(m.includes(&a) && m.includes(&b));
        prop_assert_eq!(a.includes(&b), merged(&a, &b) == a);
        // Least: anything above both is above the merge.
        if x.includes(&a) && x.includes(&b) {
            prop_assert!(x.includes(&m));
        }
    }

    #[test]
    fn local_decisions_only_move_a_state_up(
        p in params(),
        s in any_state(),
        node in 0u64..4,
        now in any::<u64>(),
        request in request(),
    ) {
        let b = bucket(p);
        let mut after = s.clone();
        let d = b.decide(&mut after, NodeId(node), Nanos::new(now), request);
        prop_assert!(after.includes(&s));
        if d.granted == 0 {
            prop_assert_eq!(&after, &s);
        } else {
            prop_assert_eq!(after.consumed_by(NodeId(node)), s.consumed_by(NodeId(node)).saturating_add(d.granted));
        }
    }

    #[test]
    fn no_input_panics(
        p in params(),
        a in any_state(),
        b in any_state(),
        now in any::<u64>(),
        hits in any::<u64>(),
        min_hits in any::<u64>(),
    ) {
        let bk = bucket(p);
        let mut s = merged(&a, &b);
        let now = Nanos::new(now);
        let _ = bk.decide(&mut s, NodeId(0), now, Hits::between(min_hits, hits));
        let _ = bk.is_idle(&s, now);
        let _ = bk.full_at(&s);
        let _ = s.footprint();
    }
}

// ---------------------------------------------------------------------------
// One node alone
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(1000))]

    /// With the fraction of a token kept (module docs), one node that never
    /// merges is the core's token bucket, decision for decision.
    #[test]
    fn one_node_decides_like_the_core_token_bucket(
        p in params(),
        t0 in start(),
        script in prop::collection::vec((delta(), request()), 1..80),
    ) {
        let b = bucket(p);
        let core = TokenBucket::new(p.0, p.1).unwrap();
        let mut s = CounterBucketState::default();
        let mut c = core.fresh();
        let mut t = t0;
        for (i, (dt, request)) in script.into_iter().enumerate() {
            t = t.saturating_add(dt);
            let now = Nanos::new(t);
            let ours = b.decide(&mut s, NodeId(7), now, request);
            let theirs: Decision = core.decide(&mut c, now, request);
            prop_assert_eq!(ours, theirs, "step {} at {:?}: {:?}", i, now, request);
            prop_assert!(s.limit() <= s.consumed().saturating_add(p.0));
        }
    }

    /// When time goes backwards the two still grant alike. Their timings
    /// part: before the last refill the core counts `reset_after` and
    /// `retry_after` as if refilling resumed now, this bucket from the
    /// refill timestamp, when it really resumes.
    #[test]
    fn one_node_grants_like_the_core_token_bucket_when_time_goes_back(
        p in params(),
        t0 in start(),
        script in prop::collection::vec((jump(), request()), 1..80),
    ) {
        let b = bucket(p);
        let core = TokenBucket::new(p.0, p.1).unwrap();
        let mut s = CounterBucketState::default();
        let mut c = core.fresh();
        let mut t = t0;
        for (i, (by, request)) in script.into_iter().enumerate() {
            t = moved(t, by);
            let now = Nanos::new(t);
            let ours = b.decide(&mut s, NodeId(7), now, request);
            let theirs = core.decide(&mut c, now, request);
            prop_assert_eq!(
                (ours.granted, ours.allowed, ours.remaining),
                (theirs.granted, theirs.allowed, theirs.remaining),
                "step {} at {:?}: {:?}", i, now, request
            );
        }
    }

    /// `is_idle` means what a store relies on: from then on, the state and
    /// an empty one decide alike.
    #[test]
    fn an_idle_state_decides_like_an_empty_one(
        p in params(),
        t0 in start(),
        script in prop::collection::vec((delta(), request()), 1..60),
    ) {
        let b = bucket(p);
        let mut s = CounterBucketState::default();
        let mut t = t0;
        let mut dropped: Option<CounterBucketState> = None;
        for (dt, request) in script {
            t = t.saturating_add(dt);
            let now = Nanos::new(t);
            if dropped.is_none() && !s.is_empty() && b.is_idle(&s, now) {
                dropped = Some(CounterBucketState::default());
            }
            let ours = b.decide(&mut s, NodeId(1), now, request);
            if let Some(fresh) = dropped.as_mut() {
                let theirs = b.decide(fresh, NodeId(1), now, request);
                prop_assert_eq!(ours, theirs);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// A cluster
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(500))]

    /// Whatever gossip happened, merging every replica's state in any order
    /// gives the same state, and that state counts every grant exactly once.
    #[test]
    fn replicas_converge_in_any_order_and_lose_no_grant(
        p in params(),
        t0 in start(),
        (nodes, script, order) in (2usize..6).prop_flat_map(|n| {
            (Just(n), steps(n), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
        }),
    ) {
        let b = bucket(p);
        let mut states = vec![CounterBucketState::default(); nodes];
        let mut t = t0;
        let mut granted = 0u64;
        for step in script {
            match step {
                Step::Request { node, dt, request } => {
                    t = t.saturating_add(dt);
                    granted += b
                        .decide(&mut states[node], NodeId(node as u64), Nanos::new(t), request)
                        .granted;
                }
                Step::Gossip { from, to } => {
                    let sent = states[from].clone();
                    states[to].merge(&sent);
                }
            }
            for s in &states {
                // A limit never runs ahead of the consumption it was
                // computed from by more than a bucket.
                prop_assert!(s.limit() <= s.consumed().saturating_add(p.0));
            }
        }
        let mut forwards = CounterBucketState::default();
        for s in &states {
            forwards.merge(s);
        }
        let mut shuffled = CounterBucketState::default();
        for &i in &order {
            shuffled.merge(&states[i]);
        }
        // Pairwise gossip around a ring, twice, as a cluster would.
        let mut ring = states.clone();
        for _ in 0..2 {
            for i in 0..nodes {
                let sent = ring[i].clone();
                ring[(i + 1) % nodes].merge(&sent);
            }
        }
        prop_assert_eq!(&forwards, &shuffled);
        for s in &ring {
            prop_assert_eq!(s, &forwards);
        }
        prop_assert_eq!(forwards.consumed(), granted);
    }

    /// Nodes that merge after every step share one state, so together they
    /// grant exactly what one centralized bucket grants for the same
    /// requests: never more.
    #[test]
    fn fully_synchronized_nodes_grant_what_one_bucket_grants(
        p in params(),
        t0 in start(),
        (nodes, script) in (2usize..6).prop_flat_map(|n| {
            (Just(n), prop::collection::vec((0..n, delta(), request()), 0..60))
        }),
    ) {
        let b = bucket(p);
        let central = TokenBucket::new(p.0, p.1).unwrap();
        let mut c = central.fresh();
        let mut states = vec![CounterBucketState::default(); nodes];
        let mut t = t0;
        let (mut ours, mut theirs) = (0u64, 0u64);
        for (node, dt, request) in script {
            t = t.saturating_add(dt);
            let now = Nanos::new(t);
            let d = b.decide(&mut states[node], NodeId(node as u64), now, request);
            let e = central.decide(&mut c, now, request);
            prop_assert_eq!(d.granted, e.granted);
            ours += d.granted;
            theirs += e.granted;
            let sent = states[node].clone();
            for s in states.iter_mut() {
                s.merge(&sent);
            }
        }
        prop_assert!(ours <= theirs);
        prop_assert_eq!(ours, theirs);
    }
}

// ---------------------------------------------------------------------------
// Usage reported after the fact (issue 18, item 3, in a gossip cluster)
// ---------------------------------------------------------------------------

/// A check, a report or a refund.
#[derive(Clone, Debug)]
enum Use {
    Check(Hits),
    Report(u64),
    Refund(u64),
}

fn uses() -> impl Strategy<Value = Use> {
    prop_oneof![
        3 => request().prop_map(Use::Check),
        2 => (0u64..12).prop_map(Use::Report),
        2 => (0u64..12).prop_map(Use::Refund),
    ]
}

proptest! {
    #![proptest_config(cases(1000))]

    /// On one node, checks, reports and refunds decide exactly as the
    /// core's token bucket with the same `max_debt` decides them, decision
    /// for decision: the same debt bound, the same repayment by refill,
    /// the same refunds clamped at full (whole tokens).
    #[test]
    fn one_node_reports_and_refunds_like_the_core_token_bucket(
        p in params(),
        debt in prop_oneof![Just(None), (0u64..10).prop_map(Some)],
        t0 in start(),
        script in prop::collection::vec((delta(), uses()), 1..80),
    ) {
        let mut b = bucket(p);
        let mut core = TokenBucket::new(p.0, p.1).unwrap();
        if let Some(d) = debt {
            b = b.with_max_debt(d).unwrap();
            core = core.with_max_debt(d).unwrap();
        }
        prop_assert_eq!(b.max_debt(), core.max_debt());
        let mut s = CounterBucketState::default();
        let mut c = core.fresh();
        let mut t = t0;
        for (i, (dt, u)) in script.into_iter().enumerate() {
            t = t.saturating_add(dt);
            let now = Nanos::new(t);
            let before = s.clone();
            let (ours, theirs): (Decision, Decision) = match u {
                Use::Check(r) => (b.decide(&mut s, NodeId(7), now, r), core.decide(&mut c, now, r)),
                Use::Report(h) => (b.report(&mut s, NodeId(7), now, h), core.report(&mut c, now, h)),
                Use::Refund(h) => (b.refund(&mut s, now, h), core.refund(&mut c, now, h)),
            };
            prop_assert_eq!(ours, theirs, "step {} at {:?}", i, now);
            // Every operation only moves the state up: it stays a CRDT.
            prop_assert!(s.includes(&before), "step {}: {:?} -> {:?}", i, before, s);
            prop_assert!(s.limit() <= s.consumed().saturating_add(p.0));
            prop_assert!(
                s.consumed() <= s.limit().saturating_add(b.max_debt()) || ours.granted == 0,
                "step {}: past the debt bound", i
            );
        }
    }

    /// Reports made on two nodes both count once the nodes gossip, and the
    /// merged debt is repaid by refill before anything is granted; refunds
    /// made on two nodes at once never give back more than either alone
    /// (the merge keeps the larger limit: an under-refund), and never
    /// fill past the capacity.
    #[test]
    fn reports_on_two_nodes_both_count_and_refunds_never_over_refund(
        p in params(),
        t0 in start(),
        spent in 0u64..8,
        reports in (0u64..8, 0u64..8),
        refunds in (0u64..8, 0u64..8),
    ) {
        let b = bucket(p);
        let now = Nanos::new(t0);
        let mut a = CounterBucketState::default();
        b.report(&mut a, NodeId(1), now, spent);
        let mut x = a.clone();
        let mut y = a.clone();
        let rx = b.report(&mut x, NodeId(1), now, reports.0).granted;
        let ry = b.report(&mut y, NodeId(2), now, reports.1).granted;
        let m = merged(&x, &y);
        prop_assert_eq!(m.consumed(), a.consumed() + rx + ry);
        prop_assert_eq!(&m, &merged(&y, &x));

        // Refunds on both, at once, from the merged state.
        let mut x2 = m.clone();
        let mut y2 = m.clone();
        let gx = b.refund(&mut x2, now, refunds.0).granted;
        let gy = b.refund(&mut y2, now, refunds.1).granted;
        let r = merged(&x2, &y2);
        // What the merged state gives back is what the larger refund gave.
        prop_assert_eq!(r.limit(), m.limit() + gx.max(gy));
        prop_assert_eq!(r.consumed(), m.consumed());
        prop_assert!(b.room(&r, now, u64::MAX) <= p.0);
        prop_assert!(r.limit() <= r.consumed() + p.0);
    }
}

/// Hand-computed: capacity 5 at one token a second. A report past the
/// limit takes the bucket into debt (bounded at `max_debt` = one
/// capacity), the debt blocks grants until refilled, and a refund gives
/// back at most what fits below full.
#[test]
fn a_report_owes_and_a_refund_gives_back_by_the_limit() {
    let b = bucket((5, Rate::per_second(1).unwrap()));
    let mut s = CounterBucketState::default();
    let t = Nanos::from_secs(100);
    let d = b.report(&mut s, NodeId(1), t, 8);
    assert_eq!((d.granted, d.allowed, d.remaining), (8, true, 0));
    // Three in debt: the next hit is four seconds away.
    assert_eq!(d.retry_after, Some(Nanos::from_secs(4)));
    // Seven more would pass the debt bound of five: two fit.
    assert_eq!(b.report(&mut s, NodeId(1), t, 7).granted, 2);
    assert_eq!(s.consumed(), 10);
    assert!(!b.decide(&mut s, NodeId(1), t, Hits::exactly(1)).allowed);
    // A refund of 20 at once gives back the ten below full, no more.
    let d = b.refund(&mut s, t, 20);
    assert_eq!((d.granted, d.remaining), (10, 5));
    assert_eq!(s.limit(), s.consumed() + 5);
    assert_eq!(b.refund(&mut s, t, 1).granted, 0);
}

/// The bound `docs/algorithms/usage.md` states for reports in a cluster:
/// N nodes reporting on the same full bucket before they gossip owe at
/// most N × (capacity + max_debt) − capacity once merged, and then no
/// node charges anything more until refill repays it.
#[test]
fn reports_on_every_node_owe_at_most_their_sum() {
    let b = bucket((5, Rate::per_second(1).unwrap()));
    assert_eq!(b.max_debt(), 5);
    let t = Nanos::from_secs(100);
    let mut states: Vec<CounterBucketState> = (1..=3)
        .map(|n| {
            let mut s = CounterBucketState::default();
            assert_eq!(b.report(&mut s, NodeId(n), t, 100).granted, 10);
            s
        })
        .collect();
    let mut m = CounterBucketState::default();
    for s in &states {
        m.merge(s);
    }
    assert_eq!(m.consumed() - m.limit(), 3 * (5 + 5) - 5);
    for (i, s) in states.iter_mut().enumerate() {
        s.merge(&m);
        assert_eq!(b.report(s, NodeId(i as u64 + 1), t, 100).granted, 0);
    }
}
