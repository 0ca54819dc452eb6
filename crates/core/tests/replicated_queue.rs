//! Property tests for the thesis's token-bucket queue
//! (`tollgate_core::replicated::queue`): the merge is a join (commutative,
//! associative, idempotent), replicas converge whatever the order of
//! gossip, one node alone is exactly a token bucket, identical-instant
//! grants on two nodes stay two elements, a cluster that merges after every
//! step grants exactly what one centralized bucket grants, deltas bring a
//! peer up to date, `retry_after` is exact even in debt, memory stays
//! bounded and no input panics.
//!
//! Times are multiples of a 25 ms unit ± a nanosecond, plus repeats, so
//! deaths are hit exactly.

// This whole file is test code, where a panic is how a check fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cases, delta, start, UNIT};
use proptest::prelude::*;
use tollgate_core::replicated::queue::{Element, ElementId, QueueState, TokenQueue, MAX_ELEMENTS};
use tollgate_core::replicated::{Generation, NodeId};
use tollgate_core::{Algorithm, Decision, Grant, Hits, Nanos, Rate, TokenBucket};

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// A rate of one token every 1–8 units.
fn rate() -> impl Strategy<Value = Rate> {
    (1u64..=8).prop_map(|k| Rate::new(1, Nanos::new(k * UNIT)).unwrap())
}

/// Capacity 1–6, a margin of 0–3 intervals (or an odd one).
fn queue() -> impl Strategy<Value = TokenQueue> {
    (
        1u64..=6,
        rate(),
        prop_oneof![
            3 => (0u64..=3).prop_map(|k| k * UNIT),
            1 => 0u64..200_000_000,
        ],
    )
        .prop_map(|(capacity, rate, margin)| {
            TokenQueue::with_margin(capacity, rate, Nanos::new(margin)).unwrap()
        })
}

/// Mostly well-formed requests; sometimes `min_hits > hits`.
fn request() -> impl Strategy<Value = Hits> {
    prop_oneof![6 => 0u64..=4, 1 => 0u64..=10]
        .prop_flat_map(|hits| {
            (
                Just(hits),
                prop_oneof![6 => 0..=hits, 1 => Just(hits), 1 => Just(hits + 1)],
            )
        })
        .prop_map(|(hits, min_hits)| Hits { hits, min_hits })
}

/// What happens in a cluster, step by step.
#[derive(Clone, Debug)]
enum Op {
    /// Time passes, then `node` decides `request`.
    Decide {
        node: usize,
        delta: u64,
        request: Hits,
    },
    /// `from` sends its whole state to `to`, which merges and prunes.
    Gossip { from: usize, to: usize },
    /// `node` prunes at the current time.
    Prune { node: usize },
}

fn op(nodes: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..nodes, delta(), request())
            .prop_map(|(node, delta, request)| Op::Decide { node, delta, request }),
        2 => (0..nodes, 0..nodes).prop_map(|(from, to)| Op::Gossip { from, to }),
        1 => (0..nodes).prop_map(|node| Op::Prune { node }),
    ]
}

fn node(i: usize) -> NodeId {
    // Not in index order, so node order and index order differ.
    NodeId((i as u64 * 7919) % 13)
}

/// Runs `ops` on a cluster of `states.len()` nodes from time `start`;
/// returns the final time.
fn run_cluster(q: &TokenQueue, states: &mut [QueueState], start: u64, ops: &[Op]) -> Nanos {
    let mut now = start;
    for op in ops {
        match *op {
            Op::Decide {
                node: n,
                delta,
                request,
            } => {
                now = now.saturating_add(delta);
                q.decide(&mut states[n], node(n), Nanos::new(now), request);
            }
            Op::Gossip { from, to } => {
                let sent = states[from].clone();
                states[to].merge(&sent);
                q.prune(&mut states[to], Nanos::new(now));
            }
            Op::Prune { node: n } => q.prune(&mut states[n], Nanos::new(now)),
        }
    }
    Nanos::new(now)
}

/// A closed state from arbitrary elements: small births, nodes and
/// sequence numbers, so that states share identities.
fn raw_state() -> impl Strategy<Value = QueueState> {
    (
        prop_oneof![Just(0u64), 1u64..4, (1u64..=4).prop_map(|k| k * UNIT)],
        prop::collection::vec(
            (0u64..6, 0u64..3, 0u32..2, 0u64..12).prop_map(|(b, n, seq, d)| Element {
                id: ElementId {
                    birth: Nanos::new(b * UNIT),
                    node: NodeId(n),
                    seq,
                },
                death: Nanos::new(d * UNIT / 2),
            }),
            0..10,
        ),
        prop_oneof![
            3 => Just(Generation::ZERO),
            1 => (1u64..3, 0u64..3).prop_map(|(at, node)| Generation {
                at: Nanos::new(at),
                node: NodeId(node),
            }),
        ],
    )
        .prop_map(|(interval, elements, generation)| {
            QueueState::from_elements(Nanos::new(interval), elements).with_generation(generation)
        })
}

/// A state built by a small cluster's history (closed by construction,
/// sharing elements with the other states of the same history).
fn cluster_states() -> impl Strategy<Value = (TokenQueue, Vec<QueueState>)> {
    (queue(), 2usize..=4).prop_flat_map(|(q, nodes)| {
        (
            Just(q),
            Just(nodes),
            prop::collection::vec(op(nodes), 0..40),
        )
            .prop_map(|(q, nodes, ops)| {
                let mut states = vec![QueueState::default(); nodes];
                run_cluster(&q, &mut states, 0, &ops);
                (q, states)
            })
    })
}

/// Three states, either from one history or arbitrary.
fn three_states() -> impl Strategy<Value = [QueueState; 3]> {
    prop_oneof![
        (raw_state(), raw_state(), raw_state()).prop_map(|(a, b, c)| [a, b, c]),
        cluster_states().prop_map(|(_, s)| {
            let n = s.len();
            [s[0].clone(), s[1 % n].clone(), s[n - 1].clone()]
        }),
    ]
}

fn merged(a: &QueueState, b: &QueueState) -> QueueState {
    let mut m = a.clone();
    m.merge(b);
    m
}

/// A naive token bucket: token-time in whole nanoseconds, full at first.
struct ReferenceBucket {
    capacity: u64,
    interval: u64,
    level: u64,
    last: Option<u64>,
}

impl ReferenceBucket {
    fn new(q: &TokenQueue) -> ReferenceBucket {
        ReferenceBucket {
            capacity: q.capacity(),
            interval: q.interval().as_u64(),
            level: q.capacity() * q.interval().as_u64(),
            last: None,
        }
    }

    /// Grants the largest n in [min_hits, hits] that the tokens cover.
    fn decide(&mut self, now: u64, request: Hits) -> u64 {
        let full = self.capacity * self.interval;
        if let Some(last) = self.last {
            self.level = full.min(self.level + (now - last));
        }
        self.last = Some(now);
        let room = (self.level / self.interval).min(request.hits);
        if request.min_hits > request.hits || room < request.min_hits {
            return 0;
        }
        self.level -= room * self.interval;
        room
    }
}

// ---------------------------------------------------------------------------
// The merge is a join
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn merge_is_commutative([a, b, _c] in three_states()) {
        prop_assert_eq!(merged(&a, &b), merged(&b, &a));
    }

    #[test]
    fn merge_is_associative([a, b, c] in three_states()) {
        prop_assert_eq!(merged(&merged(&a, &b), &c), merged(&a, &merged(&b, &c)));
    }

    #[test]
    fn merge_is_idempotent([a, b, _c] in three_states()) {
        prop_assert_eq!(merged(&a, &a), a.clone());
        let ab = merged(&a, &b);
        prop_assert_eq!(merged(&ab, &b), ab.clone());
        prop_assert_eq!(merged(&ab, &a), ab.clone());
    }

    #[test]
    fn merge_reports_change_exactly_when_not_included([a, b, _c] in three_states()) {
        let mut m = a.clone();
        let changed = m.merge(&b);
        prop_assert_eq!(changed, !a.includes(&b));
        prop_assert_eq!(changed, m != a);
        prop_assert!(m.includes(&a) && m.includes(&b));
    }

    #[test]
    fn merged_states_are_closed([a, b, _c] in three_states()) {
        let m = merged(&a, &b);
        let ids: Vec<ElementId> = m.elements().map(|e| e.id).collect();
        prop_assert!(ids.windows(2).all(|w| w[0] < w[1]));
        let deaths: Vec<Nanos> = m.elements().map(|e| e.death).collect();
        prop_assert!(deaths
            .windows(2)
            .all(|w| w[1] >= w[0].saturating_add(m.interval())));
        // Merging never forgets an element of its generation (the later
        // of the two: a reset drops what came before it), nor lowers a
        // death.
        prop_assert_eq!(m.generation(), a.generation().max(b.generation()));
        let current = [&a, &b].into_iter().filter(|s| s.generation() == m.generation());
        for e in current.flat_map(|s| s.elements()) {
            let kept = m.elements().find(|k| k.id == e.id);
            prop_assert!(kept.is_some_and(|k| k.death >= e.death));
        }
    }
}

// ---------------------------------------------------------------------------
// Replicas converge
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn replicas_converge_whatever_the_order(
        (q, states) in cluster_states(),
        order in Just((0..4usize).collect::<Vec<_>>()).prop_shuffle(),
        later in 0u64..(20 * UNIT),
    ) {
        // Each node merges everybody's current state, in its own order.
        let n = states.len();
        let order: Vec<usize> = order.into_iter().filter(|&i| i < n).collect();
        let finals: Vec<QueueState> = (0..n)
            .map(|me| {
                let mut s = states[me].clone();
                for k in 0..n {
                    // Node `me` starts the rotation at itself.
                    s.merge(&states[order[(k + me) % n]]);
                }
                s
            })
            .collect();
        let all = states.iter().fold(QueueState::default(), |acc, s| merged(&acc, s));
        for f in &finals {
            prop_assert_eq!(f, &all);
        }
        // And they still agree after pruning at the same time.
        let now = Nanos::new(later);
        let mut pruned: Vec<QueueState> = finals.clone();
        for p in &mut pruned {
            q.prune(p, now);
        }
        prop_assert!(pruned.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn pairwise_gossip_converges_once_everyone_heard_everyone(
        (q, mut states) in cluster_states(),
        rounds in prop::collection::vec((0usize..4, 0usize..4), 0..30),
    ) {
        let n = states.len();
        for (from, to) in rounds {
            let sent = states[from % n].clone();
            states[to % n].merge(&sent);
        }
        // A ring twice round: everyone has everything.
        for _ in 0..2 {
            for i in 0..n {
                let sent = states[i].clone();
                states[(i + 1) % n].merge(&sent);
            }
        }
        prop_assert!(states.windows(2).all(|w| w[0] == w[1]));
        let _ = q;
    }
}

// ---------------------------------------------------------------------------
// One node is a token bucket; a synced cluster is one centralized bucket
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn a_node_that_never_merges_is_a_token_bucket(
        q in queue(),
        start in start(),
        steps in prop::collection::vec((delta(), request()), 1..60),
    ) {
        let bucket = TokenBucket::new(q.capacity(), Rate::new(1, q.interval()).unwrap()).unwrap();
        let mut reference = ReferenceBucket::new(&q);
        let mut b = bucket.fresh();
        let mut s = QueueState::default();
        let mut now = start;
        for (delta, request) in steps {
            now += delta;
            let t = Nanos::new(now);
            let d = q.decide(&mut s, NodeId(1), t, request);
            prop_assert_eq!(d.granted, reference.decide(now, request));
            // The whole decision matches the crate's token bucket: remaining,
            // reset_after and the exact retry_after included.
            let expected: Decision = bucket.decide(&mut b, t, request);
            prop_assert_eq!(d, expected);
        }
    }

    #[test]
    fn a_cluster_merging_after_every_step_is_one_centralized_bucket(
        q in queue(),
        nodes in 2usize..=5,
        start in start(),
        steps in prop::collection::vec((0usize..5, delta(), request()), 1..60),
    ) {
        let mut states = vec![QueueState::default(); nodes];
        let mut central = ReferenceBucket::new(&q);
        let mut now = start;
        let (mut granted, mut central_granted) = (0u64, 0u64);
        for (n, delta, request) in steps {
            let n = n % nodes;
            now += delta;
            let t = Nanos::new(now);
            let d = q.decide(&mut states[n], node(n), t, request);
            let c = central.decide(now, request);
            prop_assert_eq!(d.granted, c);
            granted += d.granted;
            central_granted += c;
            let sent = states[n].clone();
            for (i, s) in states.iter_mut().enumerate() {
                if i != n {
                    s.merge(&sent);
                    q.prune(s, t);
                }
            }
        }
        prop_assert!(granted <= central_granted);
    }

    #[test]
    fn identical_instant_grants_keep_every_element(
        q in queue(),
        at in start(),
        hits in prop::collection::vec(1u64..=6, 2..=5),
    ) {
        // Every node grants at the same nanosecond from an empty queue.
        let t = Nanos::new(at);
        let states: Vec<QueueState> = hits
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                let mut s = QueueState::default();
                let d = q.decide(&mut s, node(i), t, Hits::between(1, h));
                assert_eq!(d.granted, h.min(q.capacity()));
                s
            })
            .collect();
        let all = states.iter().fold(QueueState::default(), |acc, s| merged(&acc, s));
        let total: u64 = hits.iter().map(|&h| h.min(q.capacity())).sum();
        prop_assert_eq!(all.len() as u64, total);
        prop_assert_eq!(q.live(&all, t), total);
        // The merged queue refills as if one node had granted them all.
        let last = all.elements().last().unwrap().death;
        prop_assert_eq!(last, t.saturating_add(q.interval().saturating_mul(total)));
    }
}

// ---------------------------------------------------------------------------
// Deltas, retry_after, memory, panics
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn deltas_bring_a_peer_up_to_date([x, y, _z] in three_states()) {
        let mut z = x.clone();
        let d = z.merge_changes(&y);
        prop_assert_eq!(&z, &merged(&x, &y));
        prop_assert_eq!(&merged(&x, &d), &z);
        prop_assert_eq!(&z.changes_since(&x), &d);
        // Anyone who has x and receives d has z's information.
        prop_assert!(merged(&merged(&x, &y), &d).includes(&z));
    }

    #[test]
    fn local_grants_only_append(
        (q, states) in cluster_states(),
        delta in delta(),
        request in request(),
    ) {
        let mut s = states[0].clone();
        let now = s
            .elements()
            .map(|e| e.id.birth)
            .max()
            .unwrap_or(Nanos::ZERO)
            .saturating_add(Nanos::new(delta));
        q.prune(&mut s, now);
        let before = s.clone();
        let version = s.tail_id();
        q.decide(&mut s, NodeId(99), now, request);
        prop_assert_eq!(s.elements_after(version), s.changes_since(&before));
        prop_assert!(s.includes(&before));
    }

    #[test]
    fn retry_after_is_exact_even_in_debt(
        (q, states) in cluster_states(),
        at in 0u64..(40 * UNIT),
        min_hits in 1u64..=7,
    ) {
        // Merge everything: a queue that may hold more than its capacity.
        let s = states.iter().fold(QueueState::default(), |acc, s| merged(&acc, s));
        let now = Nanos::new(at);
        let mut probe = s.clone();
        let d = q.commit(
            &mut probe,
            NodeId(99),
            now,
            Hits::exactly(min_hits),
            Grant { granted: 0, allowed: false },
        );
        match d.retry_after {
            None => prop_assert!(min_hits > q.capacity()),
            Some(wait) => {
                let then = now.saturating_add(wait);
                prop_assert!(q.room(&s, NodeId(99), then, min_hits) >= min_hits);
                if !wait.is_zero() {
                    let before = then.saturating_sub(Nanos::NANOSECOND);
                    prop_assert!(q.room(&s, NodeId(99), before, min_hits) < min_hits);
                }
            }
        }
        prop_assert_eq!(d.remaining, q.capacity().saturating_sub(q.live(&s, now)));
    }

    #[test]
    fn one_node_holds_at_most_capacity_plus_the_margin(
        q in queue(),
        start in start(),
        steps in prop::collection::vec((delta(), request(), any::<bool>()), 1..80),
    ) {
        // Time may also go backwards here. A decision at an earlier time
        // sees the elements alive then, which may be more than the
        // capacity (granted later, when older ones had died): that only
        // makes it stricter. Memory is bounded by the latest time seen.
        let bound = q.capacity() + q.margin().as_u64().div_ceil(q.interval().as_u64()) + 1;
        let mut s = QueueState::default();
        let mut now = start;
        let mut latest = start;
        for (delta, request, back) in steps {
            now = if back { now.saturating_sub(delta) } else { now.saturating_add(delta) };
            latest = latest.max(now);
            let room = q.room(&s, NodeId(1), Nanos::new(now), request.hits);
            let d = q.decide(&mut s, NodeId(1), Nanos::new(now), request);
            prop_assert!(d.granted <= room);
            prop_assert!(s.len() as u64 <= bound);
            prop_assert!(q.live(&s, Nanos::new(latest)) <= q.capacity());
            if now == latest {
                prop_assert!(q.live(&s, Nanos::new(now)) <= q.capacity());
            }
        }
    }
}

/// Values at and around the ends of `u64`.
fn edge() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1u64),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(1u64 << 62),
        Just(1u64 << 63),
        any::<u64>(),
    ]
}

fn extreme_state() -> impl Strategy<Value = QueueState> {
    (
        edge(),
        prop::collection::vec(
            (edge(), edge(), any::<u32>(), edge()).prop_map(|(b, n, seq, d)| Element {
                id: ElementId {
                    birth: Nanos::new(b),
                    node: NodeId(n),
                    seq,
                },
                death: Nanos::new(d),
            }),
            0..6,
        ),
    )
        .prop_map(|(i, e)| QueueState::from_elements(Nanos::new(i), e))
}

fn extreme_queue() -> impl Strategy<Value = Option<TokenQueue>> {
    (edge(), edge(), edge(), edge()).prop_map(|(cap, count, period, margin)| {
        let rate = Rate::new(count, Nanos::new(period)).ok()?;
        TokenQueue::with_margin(cap, rate, Nanos::new(margin)).ok()
    })
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn no_input_panics(
        q in extreme_queue(),
        a in extreme_state(),
        b in extreme_state(),
        node in edge(),
        now in edge(),
        hits in edge(),
        min_hits in edge(),
    ) {
        let mut a = a;
        let now = Nanos::new(now);
        let request = Hits { hits, min_hits };
        let _ = a.clone().merge_changes(&b);
        let _ = b.changes_since(&a);
        let _ = a.includes(&b);
        a.merge(&b);
        let Some(q) = q else { return Ok(()) };
        let room = q.room(&a, NodeId(node), now, hits);
        let d = q.decide(&mut a, NodeId(node), now, request);
        prop_assert!(d.granted <= room);
        prop_assert!(d.granted <= q.capacity());
        let _ = q.commit(&mut a, NodeId(node), now, request, Grant { granted: hits, allowed: true });
        let _ = q.is_idle(&a, now);
        q.prune(&mut a, now);
        let _ = a.footprint();
    }
}

// ---------------------------------------------------------------------------
// Fixed cases
// ---------------------------------------------------------------------------

#[test]
fn max_elements_is_reachable_and_no_more() {
    let r = Rate::per_second(1).unwrap();
    assert!(TokenQueue::new(MAX_ELEMENTS - 1, r).is_ok());
    assert!(TokenQueue::new(MAX_ELEMENTS, r).is_err());
}

#[test]
fn an_element_is_32_bytes() {
    // The memory cost the module docs promise: the thesis's two
    // timestamps plus the node and sequence number of the identity.
    assert_eq!(std::mem::size_of::<Element>(), 32);
}

#[test]
fn the_queue_is_an_algorithm_on_a_node() {
    let q = TokenQueue::new(2, Rate::per_second(1).unwrap()).unwrap();
    let at = q.on(NodeId(4));
    let mut s = at.fresh();
    let alone = at.decide_alone(&mut s, Nanos::ZERO, Hits::exactly(2));
    assert!(alone.decision.allowed);
    assert!(!alone.idle);
    assert!(s.elements().all(|e| e.id.node == NodeId(4)));
    assert!(at.is_idle(&s, Nanos::from_secs(2)));
}

#[test]
fn thesis_scenario_two_nodes_in_one_millisecond_pay_twice() {
    // §4.2.2, second scenario, with the thesis's millisecond clocks: two
    // nodes grant the user's last token at the same millisecond. With
    // identities by birth alone the merge would keep one element and the
    // user would get "two requests served for the price of one"; here the
    // merged queue holds both and refills one interval later.
    let q = TokenQueue::new(1, Rate::per_second(1).unwrap()).unwrap();
    let t = Nanos::from_millis(1_700_000_000_123);
    let mut a = QueueState::default();
    let mut b = QueueState::default();
    assert!(q.decide(&mut a, NodeId(1), t, Hits::exactly(1)).allowed);
    assert!(q.decide(&mut b, NodeId(2), t, Hits::exactly(1)).allowed);
    a.merge(&b);
    let d = q.decide(&mut a, NodeId(1), t, Hits::exactly(1));
    assert!(!d.allowed);
    // Both tokens must come back before the next grant: the user is in
    // debt by one, as after a centralized bucket's two grants.
    assert_eq!(a.len(), 2);
    assert_eq!(d.retry_after, Some(Nanos::from_secs(2)));
    assert_eq!(d.reset_after, Nanos::from_secs(2));
}

/// Regression (review of issue 18's gossip reset): a node taking in a
/// peer's reset of a queue key that had elements answered no change to
/// pass on (the reset carries no element, and only elements counted as
/// news), so the reset reached the resetting node's own peers and went no
/// further: relays (a partial mesh) and epidemic gossip never carried it.
/// Every strategy's reset is news to pass on.
#[test]
fn a_reset_taken_in_from_a_peer_is_news_to_pass_on() {
    use tollgate_core::replicated::strategy::{Replication, StrategyKind};
    let rate = Rate::per_second(1).unwrap();
    let t = Nanos::from_secs(1_000);
    for kind in [
        StrategyKind::Queue,
        StrategyKind::Counter,
        StrategyKind::Epoch,
    ] {
        let here = Replication::new(kind).build(5, rate, NodeId(1)).unwrap();
        let there = Replication::new(kind).build(5, rate, NodeId(2)).unwrap();
        let mut state = here.fresh();
        assert!(here.decide(&mut state, t, Hits::exactly(3)).allowed);
        let mut theirs = state.clone();
        let reset = there.reset(&mut theirs, t).unwrap();
        let passed = here.absorb(&mut state, t, &reset);
        let Some(passed) = passed else {
            panic!("{kind:?}: a reset taken in is not passed on");
        };
        assert_eq!(passed.generation(), reset.generation(), "{kind:?}");
        assert_eq!(here.available(&state, t), 5, "{kind:?}");
    }
}
