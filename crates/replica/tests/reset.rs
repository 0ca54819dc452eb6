#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Resetting counters in a gossip cluster (issue 18, item 5; the gap
//! "reset in a gossip cluster"): a reset on any node reaches every node
//! and wins over every state from before it, whatever the order, loss,
//! duplication or delay of gossip; grants after it count. In-process
//! replicas, their gossip carried by hand (and, for the wire, encoded and
//! decoded), so every interleaving is the test's to choose.

use std::net::SocketAddr;
use std::sync::Arc;

use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tollgate_core::replicated::strategy::{Payload, ReplicatedState, Replication, StrategyKind};
use tollgate_core::replicated::NodeId;
use tollgate_core::{Hits, Limit, Mode, Nanos, Rate, TokenBucket};
use tollgate_replica::wire::{self, Batch, ClusterKey, Header};
use tollgate_replica::{Class, Replica, ReplicaOptions, ReplicaStore, Round};
use tollgate_store::{Key, LimitId, Plan, Store};

const T0: Nanos = Nanos::from_secs(1_800_000_000);
const LIMIT: LimitId = LimitId(7);
const CAPACITY: u64 = 1000;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9000 + i as u16))
}

fn how(kind: StrategyKind) -> Replication {
    Replication {
        eager: None,
        near_limit: false,
        ..Replication::new(kind)
    }
}

/// `n` synced replicas (origin dissemination, the default), each with the
/// others as peers, serving one token bucket of `capacity` refilled at one
/// token per 100 s; and each one's plan of key `domain` (a node decides
/// with its own limit, which names it).
fn cluster(n: usize, kind: StrategyKind, capacity: u64, domain: &str) -> (Vec<Replica>, Vec<Plan>) {
    let tb = TokenBucket::new(capacity, Rate::new(1, Nanos::from_secs(100)).unwrap()).unwrap();
    (0..n)
        .map(|i| {
            let r = Replica::new(ReplicaOptions {
                node: NodeId(i as u64 + 1),
                ..ReplicaOptions::default()
            });
            r.set_synced(true);
            for j in (0..n).filter(|&j| j != i) {
                r.add_peer(addr(j));
            }
            let limit = r
                .prepare_limit(Limit::TokenBucket(tb.clone()), Some(&how(kind)))
                .unwrap();
            let limit = Arc::new(limit);
            r.register(LIMIT, Arc::clone(&limit));
            (r, Plan::single(Key::new(LIMIT, domain), limit))
        })
        .unzip()
}

fn class(kind: StrategyKind) -> Class {
    Class::of(&how(kind))
}

/// A datagram's worth of gossip on its way: from replica `from` to `to`.
#[derive(Clone, Debug)]
struct Message {
    from: usize,
    to: usize,
    items: Vec<(Key, Payload)>,
}

/// Everything `replicas[i]` would send now: its urgent payloads and one
/// gossip round.
fn outbox(replicas: &[Replica], i: usize, kind: StrategyKind, now: Nanos) -> Vec<Message> {
    let mut rng = SmallRng::seed_from_u64(i as u64);
    let to = |a: SocketAddr| (0..replicas.len()).find(|&j| addr(j) == a).unwrap();
    let mut out: Vec<Message> = replicas[i]
        .take_urgent()
        .into_iter()
        .map(|(a, items)| Message {
            from: i,
            to: to(a),
            items,
        })
        .collect();
    for round in replicas[i].take_round(class(kind), now, &mut rng) {
        match round {
            Round::Delta(a, items) => out.push(Message {
                from: i,
                to: to(a),
                items,
            }),
            // A full state is what a resync sends.
            Round::Resync(a) => out.push(Message {
                from: i,
                to: to(a),
                items: replicas[i].full_state(now),
            }),
        }
    }
    out
}

/// Delivers `m`, through the wire format (encoded, decoded) as the node
/// would.
fn deliver(replicas: &[Replica], m: &Message, now: Nanos) {
    let items = through_the_wire(m.from, &m.items, now);
    replicas[m.to].absorb(addr(m.from), NodeId(m.from as u64 + 1), items, now);
}

fn through_the_wire(from: usize, items: &[(Key, Payload)], now: Nanos) -> Vec<(Key, Payload)> {
    let key = ClusterKey::new(b"a secret of sixteen bytes or more", "reset");
    let header = Header {
        cluster: wire::cluster_tag("reset"),
        from: NodeId(from as u64 + 1),
        incarnation: 1,
        seq: 1,
        sent_at: now,
        to: NodeId(99),
        to_incarnation: 1,
    };
    let mut seq = 1;
    let packed = wire::encode_items(&key, &header, &mut seq, Batch::Delta, items);
    let mut out = Vec::new();
    for datagram in packed.datagrams {
        let message = wire::decode(&key, wire::cluster_tag("reset"), &datagram).unwrap();
        match message.body {
            wire::Body::Delta { items } => out.extend(items),
            other => panic!("not a delta: {other:?}"),
        }
    }
    out
}

/// Anti-entropy as the node runs it, between every pair: where digests
/// differ, each sends the other its keys of those buckets.
fn anti_entropy(replicas: &[Replica], now: Nanos) {
    for _ in 0..2 {
        for i in 0..replicas.len() {
            for j in (0..replicas.len()).filter(|&j| j != i) {
                let differ = replicas[i].digest(now).differs(&replicas[j].digest(now));
                if differ == 0 {
                    continue;
                }
                for (from, to) in [(i, j), (j, i)] {
                    let items = replicas[from].items_in(differ, now);
                    deliver(replicas, &Message { from, to, items }, now);
                }
            }
        }
    }
}

fn remaining(r: &Replica, plan: &Plan, now: Nanos) -> u64 {
    r.inspect_now(plan, now).unwrap().decisions[0].remaining
}

fn grant(r: &Replica, plan: &Plan, now: Nanos, hits: u64) -> bool {
    r.decide_now(plan, now, Hits::exactly(hits), Mode::Try)
        .unwrap()
        .allowed
}

fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

/// The scenario of the gap, on every strategy: node 0 exhausts a key, the
/// cluster converges, node 1 resets it (through the store, as the server
/// does); node 0 hears of it while node 2 does not. Node 2's old state,
/// arriving afterwards (a delayed datagram, a full state), brings nothing
/// back; anti-entropy carries the reset to node 2; every node then grants
/// again, and those grants count everywhere.
#[test]
fn a_reset_wins_over_every_older_state_and_later_grants_count() {
    for kind in [
        StrategyKind::Counter,
        StrategyKind::Queue,
        StrategyKind::Epoch,
    ] {
        let (rs, plans) = cluster(3, kind, 5, "acme");
        let mut now = T0;
        assert!(grant(&rs[0], &plans[0], now, 5), "{kind:?}");
        // Converge (an epoch reports its traffic once its epoch closed).
        now = now.saturating_add(Nanos::from_millis(1500));
        for i in 0..3 {
            for m in outbox(&rs, i, kind, now) {
                deliver(&rs, &m, now);
            }
        }
        anti_entropy(&rs, now);
        for (i, r) in rs.iter().enumerate() {
            assert_eq!(remaining(r, &plans[i], now), 0, "{kind:?}: not converged");
        }
        // Node 2's state from before the reset, held back.
        let stale = rs[2].full_state(now);
        assert!(!stale.is_empty(), "{kind:?}");

        rs[1].reset_now(&plans[1], now).unwrap();
        assert_eq!(remaining(&rs[1], &plans[1], now), 5, "{kind:?}: reset node");
        // The reset is pushed at once, not at the next round.
        let urgent: Vec<Message> = outbox(&rs, 1, kind, now);
        assert!(
            urgent.iter().any(|m| m.to == 0) && urgent.iter().any(|m| m.to == 2),
            "{kind:?}: {urgent:?}"
        );
        for m in urgent.iter().filter(|m| m.to == 0) {
            deliver(&rs, m, now);
            deliver(&rs, m, now); // duplicated
        }
        assert_eq!(
            remaining(&rs[0], &plans[0], now),
            5,
            "{kind:?}: reset reached"
        );
        // Node 2's old state reaches node 0 late: ignored.
        deliver(
            &rs,
            &Message {
                from: 2,
                to: 0,
                items: stale.clone(),
            },
            now,
        );
        assert_eq!(
            remaining(&rs[0], &plans[0], now),
            5,
            "{kind:?}: old counts back"
        );
        // Node 2 never got the push (lost): its digest differs, and
        // anti-entropy repairs it.
        assert_ne!(
            rs[2].digest(now).differs(&rs[1].digest(now)),
            0,
            "{kind:?}: a reset is no difference to the digests"
        );
        anti_entropy(&rs, now);
        assert_eq!(
            remaining(&rs[2], &plans[2], now),
            5,
            "{kind:?}: not repaired"
        );
        // Everyone grants again; the grants count everywhere.
        for (i, r) in rs.iter().enumerate() {
            assert!(
                grant(r, &plans[i], now, 1),
                "{kind:?}: node {i} after reset"
            );
        }
        now = now.saturating_add(Nanos::from_millis(1000));
        for _ in 0..2 {
            for i in 0..3 {
                for m in outbox(&rs, i, kind, now) {
                    deliver(&rs, &m, now);
                }
            }
        }
        anti_entropy(&rs, now);
        // The stale state once more, to everyone: still nothing.
        for to in 0..2 {
            deliver(
                &rs,
                &Message {
                    from: 2,
                    to,
                    items: stale.clone(),
                },
                now,
            );
        }
        for (i, r) in rs.iter().enumerate() {
            // Three grants, no refill yet (a token per 100 s).
            let left = remaining(r, &plans[i], now);
            assert_eq!(left, 2, "{kind:?}: node {i} after three grants");
        }
        let views: Vec<Option<Payload>> = rs
            .iter()
            .map(|r| r.view_of(&plans[0].items()[0].key, now))
            .collect();
        if kind != StrategyKind::Epoch {
            // An epoch bucket's level is each node's own; its report is
            // compared instead below.
            assert_eq!(views[0], views[1], "{kind:?}");
            assert_eq!(views[1], views[2], "{kind:?}");
        }
    }
}

/// The store adapter resets (issue 18, item 5: it used to refuse with
/// `RESET_REFUSED`), and a key this node never saw is reset too: the
/// peers that hold it hear of it.
#[test]
fn the_store_resets_and_a_key_never_seen_still_propagates() {
    let (rs, plans) = cluster(2, StrategyKind::Counter, 5, "never-here");
    assert!(grant(&rs[0], &plans[0], T0, 5));
    let rs: Vec<Arc<Replica>> = rs.into_iter().map(Arc::new).collect();
    let store = ReplicaStore::new(Arc::clone(&rs[1]));
    assert_eq!(rs[1].keys(), 0);
    block_on(store.reset(&plans[1], T0)).unwrap();
    let pushed = rs[1].take_urgent();
    assert_eq!(pushed.len(), 1);
    let items = through_the_wire(1, &pushed[0].1, T0);
    rs[0].absorb(addr(1), NodeId(2), items, T0);
    assert_eq!(remaining(&rs[0], &plans[0], T0), 5);
    // The old delta node 0 queued for node 1 arrives after: ignored.
    let mut rng = SmallRng::seed_from_u64(0);
    for round in rs[0].take_round(class(StrategyKind::Counter), T0, &mut rng) {
        if let Round::Delta(_, items) = round {
            rs[1].absorb(addr(0), NodeId(1), items, T0);
        }
    }
    assert_eq!(remaining(&rs[1], &plans[1], T0), 5);
}

/// A node still joining refuses a reset as it refuses decisions.
#[test]
fn a_joining_node_refuses_a_reset() {
    let (rs, plans) = cluster(1, StrategyKind::Queue, 5, "k");
    rs[0].set_synced(false);
    assert!(matches!(
        rs[0].reset_now(&plans[0], T0),
        Err(tollgate_store::StoreError::Unavailable(_))
    ));
}

/// An idle reset key is kept for the hold, so the old counts of a peer
/// that missed the reset cannot come back through it; a key never reset
/// goes after its retention margin as before.
#[test]
fn a_reset_key_is_held_past_its_idleness() {
    let (rs, plans) = cluster(2, StrategyKind::Counter, 5, "held");
    assert!(grant(&rs[0], &plans[0], T0, 5));
    let stale = rs[0].full_state(T0);
    rs[1].reset_now(&plans[1], T0).unwrap();
    // An hour later (far past the retention margin and a full refill).
    let later = T0.saturating_add(Nanos::from_secs(300));
    rs[1].sweep_now(later);
    assert_eq!(rs[1].keys(), 1, "the reset key was swept while held");
    rs[1].absorb(addr(0), NodeId(1), stale.clone(), later);
    assert_eq!(remaining(&rs[1], &plans[1], later), 5);
    let past = T0.saturating_add(tollgate_replica::replica::RESET_HOLD);
    rs[1].sweep_now(past.saturating_add(Nanos::from_secs(10)));
    assert_eq!(rs[1].keys(), 0, "the reset key was never forgotten");
}

/// What one step of the property test does.
#[derive(Clone, Debug)]
enum Step {
    /// Replica `i` grants `hits`.
    Grant(usize, u64),
    /// Replica `i` puts what it would send in flight.
    Send(usize),
    /// The message at this index (modulo) is delivered (and stays in
    /// flight when `again`: delivered again later, a duplicate).
    Deliver(usize, bool),
    /// The message at this index (modulo) is lost.
    Lose(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3usize, 1..4u64).prop_map(|(i, h)| Step::Grant(i, h)),
        (0..3usize).prop_map(Step::Send),
        (0..64usize, any::<bool>()).prop_map(|(i, again)| Step::Deliver(i, again)),
        (0..64usize).prop_map(Step::Lose),
    ]
}

fn run(kind: StrategyKind, before: &[Step], resetter: usize, after: &[Step]) {
    let (rs, plans) = cluster(3, kind, CAPACITY, "prop");
    let key = plans[0].items()[0].key.clone();
    let now = T0;
    let mut flight: Vec<Message> = Vec::new();
    let mut counted = 0u64;
    let mut reset_done = false;
    let apply = |s: &Step, flight: &mut Vec<Message>, counted: &mut u64, reset_done: bool| {
        match *s {
            Step::Grant(i, hits) => {
                let generation = rs[i].state_of(&key).map(|s| s.generation());
                let after_reset = reset_done && generation.is_some_and(|g| !g.is_zero());
                assert!(grant(&rs[i], &plans[i], now, hits));
                // A grant counts when its node had seen the reset; one
                // made before it heard of it is concurrent with the
                // reset, which wipes it as it wipes older ones.
                if after_reset {
                    *counted += hits;
                }
            }
            Step::Send(i) => flight.extend(outbox(&rs, i, kind, now)),
            Step::Deliver(at, again) if !flight.is_empty() => {
                let at = at % flight.len();
                let m = if again {
                    flight[at].clone()
                } else {
                    flight.remove(at)
                };
                deliver(&rs, &m, now);
            }
            Step::Lose(at) if !flight.is_empty() => {
                flight.remove(at % flight.len());
            }
            _ => {}
        }
    };
    for s in before {
        apply(s, &mut flight, &mut counted, reset_done);
    }
    rs[resetter].reset_now(&plans[resetter], now).unwrap();
    reset_done = true;
    let generation = rs[resetter].state_of(&key).unwrap().generation();
    for s in after {
        apply(s, &mut flight, &mut counted, reset_done);
    }
    // What is still in flight arrives, in any case late; then
    // anti-entropy repairs what was lost, once it settled (a queue's
    // digest leaves out elements that may still be on their way).
    for m in flight.drain(..).rev() {
        deliver(&rs, &m, now);
    }
    let now = now.saturating_add(Nanos::from_secs(5));
    anti_entropy(&rs, now);
    let views: Vec<ReplicatedState> = rs.iter().map(|r| r.state_of(&key).unwrap()).collect();
    for (i, v) in views.iter().enumerate() {
        assert_eq!(v.generation(), generation, "{kind:?}: node {i}");
        let used = match v {
            ReplicatedState::Counter(c) => c.consumed(),
            ReplicatedState::Queue(q) => q.len() as u64,
            ReplicatedState::Epoch(_) => unreachable!(),
        };
        assert_eq!(used, counted, "{kind:?}: node {i} holds {v:?}");
        assert_eq!(
            remaining(&rs[i], &plans[i], now),
            CAPACITY - counted,
            "{kind:?}: node {i}"
        );
    }
    assert_eq!(views[0], views[1], "{kind:?}");
    assert_eq!(views[1], views[2], "{kind:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any interleaving, duplication and loss of gossip around a reset,
    /// then anti-entropy, leaves every replica with the reset's
    /// generation and exactly the grants made after it (by nodes that had
    /// seen it), for counters and queues.
    #[test]
    fn gossip_around_a_reset_converges_to_the_post_reset_state(
        before in proptest::collection::vec(step(), 0..24),
        resetter in 0..3usize,
        after in proptest::collection::vec(step(), 0..24),
        queue in any::<bool>(),
    ) {
        let kind = if queue { StrategyKind::Queue } else { StrategyKind::Counter };
        run(kind, &before, resetter, &after);
    }
}

/// Regression (review of issue 18's gossip reset): a node that lost the
/// reset's push kept deciding on the old counts, and its peers silently
/// ignored its old-generation gossip, until anti-entropy (every 30 s by
/// default; never with `--anti-entropy-ms 0`, unless another node
/// granted): only epoch buckets answered a peer behind them. A peer that
/// sends a state from before a reset this node knows of now gets the
/// reset back at once, on every strategy.
#[test]
fn a_peer_gossiping_from_before_a_reset_gets_the_reset_back() {
    for kind in [StrategyKind::Counter, StrategyKind::Queue] {
        let (rs, plans) = cluster(3, kind, 10, "acme");
        let now = T0;
        assert!(grant(&rs[0], &plans[0], now, 8), "{kind:?}");
        for i in 0..3 {
            for m in outbox(&rs, i, kind, now) {
                deliver(&rs, &m, now);
            }
        }
        assert_eq!(remaining(&rs[2], &plans[2], now), 2, "{kind:?}");
        rs[1].reset_now(&plans[1], now).unwrap();
        // The push reaches node 0; the one to node 2 is lost.
        for m in outbox(&rs, 1, kind, now).iter().filter(|m| m.to == 0) {
            deliver(&rs, m, now);
        }
        assert_eq!(remaining(&rs[0], &plans[0], now), 10, "{kind:?}");
        // Node 2, still before the reset, grants and gossips.
        assert!(grant(&rs[2], &plans[2], now, 1), "{kind:?}");
        for m in outbox(&rs, 2, kind, now) {
            deliver(&rs, &m, now);
        }
        // Its peers answer with the reset; no anti-entropy here.
        for i in [0, 1] {
            for m in outbox(&rs, i, kind, now).iter().filter(|m| m.to == 2) {
                deliver(&rs, m, now);
            }
        }
        assert_eq!(
            remaining(&rs[2], &plans[2], now),
            10,
            "{kind:?}: the node that missed the reset still decides on the old counts"
        );
    }
}

/// Regression (review of issue 18's gossip reset): a generation at the
/// end of time (only a peer's absurd one gets there) admits no later
/// one; a reset made under it used to be a generation *lower* than the
/// one the key held (a state moved down its lattice), which every peer
/// ignored and this node gave up at the peer's next gossip, while the
/// reset answered as done. It is refused now, naming the key, and the
/// state is left as it was.
#[test]
fn a_reset_under_a_generation_at_the_end_of_time_is_refused_not_lost() {
    use tollgate_core::replicated::counter::CounterBucketState;
    use tollgate_core::replicated::Generation;
    let (rs, plans) = cluster(2, StrategyKind::Counter, 10, "acme");
    let key = plans[0].items()[0].key.clone();
    let absurd = Generation {
        at: Nanos::MAX,
        node: NodeId(9),
    };
    let payload = Payload::Counter(
        CounterBucketState::from_parts([(NodeId(9), 10)], 10, Some(T0)).with_generation(absurd),
    );
    let items = through_the_wire(1, &[(key.clone(), payload)], T0);
    assert_eq!(rs[0].absorb(addr(1), NodeId(2), items, T0).merged, 1);
    assert_eq!(remaining(&rs[0], &plans[0], T0), 0);
    let refused = rs[0].reset_now(&plans[0], T0);
    assert!(
        matches!(&refused, Err(tollgate_store::StoreError::Unsupported(m)) if m.contains("end of time")),
        "{refused:?}"
    );
    let view = rs[0].view_of(&key, T0).unwrap();
    assert_eq!(view.generation(), absurd);
    assert_eq!(remaining(&rs[0], &plans[0], T0), 0);
}
