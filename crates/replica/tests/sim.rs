#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The gossip node on the simulated network: convergence, joining by full
//! state, partitions, and the precision each strategy promises. Everything
//! is deterministic (simulated time, seeded choices), so the bounds below
//! are checked exactly, not statistically.

use std::sync::Arc;

use tollgate_core::replicated::strategy::{Eager, Replication, StrategyKind};
use tollgate_core::replicated::NodeId;
use tollgate_core::{Hits, Limit, Nanos, Rate, TokenBucket};
use tollgate_replica::sim::{self, SimNet};
use tollgate_replica::{Dissemination, NotReplicable, Replica, ReplicaOptions, ReplicaStore};
use tollgate_store::{Admit, Key, LimitId, Plan, Refusal, Store, StoreError};

const START: Nanos = Nanos::from_secs(1_800_000_000);
const LIMIT: LimitId = LimitId(7);

fn options(node: NodeId) -> ReplicaOptions {
    ReplicaOptions {
        node,
        ..ReplicaOptions::default()
    }
}

/// A replicated token bucket of `capacity` refilled once an hour, as
/// node `replica` runs it.
fn plan(replica: &Replica, how: &Replication, capacity: u64, domain: &str) -> Plan {
    let bucket = TokenBucket::new(capacity, Rate::new(1, Nanos::from_secs(3600)).unwrap()).unwrap();
    let limit = replica
        .prepare_limit(Limit::TokenBucket(bucket), Some(how))
        .unwrap();
    let limit = Arc::new(limit);
    // As a config put in force does (`Store::serve_limits`).
    replica.register(LIMIT, Arc::clone(&limit));
    Plan::single(Key::new(LIMIT, domain), limit)
}

fn net(n: usize, seed: u64) -> SimNet {
    net_with(n, seed, Dissemination::Origin)
}

fn net_with(n: usize, seed: u64, dissemination: Dissemination) -> SimNet {
    let mut net = SimNet::new(n, START, Nanos::from_millis(1), seed, |node| {
        ReplicaOptions {
            dissemination,
            ..options(node)
        }
    });
    // Membership and joining settle: every node starts at once, so none
    // has a state to give, and each decides alone after two join
    // timeouts (3 s each).
    net.run_for(Nanos::from_secs(7));
    for i in 0..n {
        assert!(net.replica(i).is_synced(), "node {i} never synced");
        assert_eq!(
            net.node(i).unwrap().members().count(),
            n - 1,
            "node {i}'s members"
        );
    }
    net
}

/// `remaining` on node `i`, by a request for nothing.
fn remaining(net: &mut SimNet, i: usize, how: &Replication, capacity: u64, domain: &str) -> u64 {
    let p = plan(net.replica(i), how, capacity, domain);
    net.decide(i, &p, Hits::exactly(0)).unwrap().decisions[0].remaining
}

fn hit(net: &mut SimNet, i: usize, how: &Replication, capacity: u64, domain: &str) -> u64 {
    let p = plan(net.replica(i), how, capacity, domain);
    net.decide(i, &p, Hits::exactly(1)).unwrap().granted
}

fn strategies() -> Vec<Replication> {
    vec![
        Replication::new(StrategyKind::Counter),
        Replication::new(StrategyKind::Queue),
        Replication {
            eager: None,
            least_informed: true,
            ..Replication::new(StrategyKind::Queue)
        },
        Replication::new(StrategyKind::Epoch),
    ]
}

#[test]
fn hits_spread_over_three_nodes_converge_to_one_state() {
    for how in strategies() {
        let mut net = net(3, 1);
        for i in 0..3 {
            for _ in 0..5 {
                assert_eq!(hit(&mut net, i, &how, 30, "u"), 1);
            }
        }
        // Epochs are corrected at the next boundary; the others within a
        // few gossip rounds.
        net.run_for(Nanos::from_secs(3));
        for i in 0..3 {
            assert_eq!(
                remaining(&mut net, i, &how, 30, "u"),
                15,
                "{how:?} node {i}"
            );
        }
    }
}

#[test]
fn a_joining_node_decides_only_after_a_full_state() {
    for how in [
        Replication::new(StrategyKind::Counter),
        Replication::new(StrategyKind::Queue),
    ] {
        let mut net = net(3, 2);
        for i in 0..3 {
            for _ in 0..4 {
                hit(&mut net, i, &how, 30, "u");
            }
        }
        net.run_for(Nanos::from_secs(2));
        net.crash(1);
        // The survivors notice, and keep limiting.
        net.run_for(Nanos::from_secs(6));
        assert_eq!(net.node(0).unwrap().members().count(), 1);
        net.restart(1, options(NodeId(2)), 99);
        let p = plan(net.replica(1), &how, 30, "u");
        let refused =
            net.replica(1)
                .decide_now(&p, net.now(), Hits::exactly(1), tollgate_core::Mode::Try);
        assert!(
            matches!(refused, Err(StoreError::Unavailable(_))),
            "{refused:?}"
        );
        net.run_for(Nanos::from_millis(200));
        assert!(net.replica(1).is_synced());
        // What it has is the cluster's, not a fresh bucket.
        assert_eq!(remaining(&mut net, 1, &how, 30, "u"), 18, "{how:?}");
    }
}

#[test]
fn each_side_of_a_partition_keeps_limiting_and_heals() {
    for how in [
        Replication::new(StrategyKind::Counter),
        Replication::new(StrategyKind::Queue),
    ] {
        let mut net = net(3, 3);
        net.set_cut(0, 2, true);
        net.set_cut(1, 2, true);
        // Slowly, so each side is converged between hits: each side grants
        // exactly its capacity.
        let mut granted = [0u64; 3];
        for _ in 0..40 {
            for (i, g) in granted.iter_mut().enumerate() {
                *g += hit(&mut net, i, &how, 10, "p");
            }
            net.run_for(Nanos::from_secs(2));
        }
        assert_eq!(granted[0] + granted[1], 10, "{how:?}: side {{0, 1}}");
        assert_eq!(granted[2], 10, "{how:?}: side {{2}}");
        net.set_cut(0, 2, false);
        net.set_cut(1, 2, false);
        net.run_for(Nanos::from_secs(10));
        // The merged state holds both sides' grants: nothing left anywhere.
        for i in 0..3 {
            assert_eq!(remaining(&mut net, i, &how, 10, "p"), 0, "{how:?} node {i}");
            assert_eq!(hit(&mut net, i, &how, 10, "p"), 0);
        }
    }
}

/// After a partition heals, each side gets what the other granted
/// meanwhile, with no request to stir it: a member that comes back is sent
/// a full state.
#[test]
fn a_healed_partition_exchanges_what_each_side_granted() {
    for how in [
        Replication::new(StrategyKind::Counter),
        Replication::new(StrategyKind::Queue),
    ] {
        let mut net = net(3, 5);
        // Every node has the config's limit.
        for i in 0..3 {
            plan(net.replica(i), &how, 10, "h");
        }
        net.set_cut(0, 2, true);
        net.set_cut(1, 2, true);
        // Long enough for both sides to declare the other down.
        net.run_for(Nanos::from_secs(8));
        assert_eq!(net.node(2).unwrap().members().count(), 0);
        for _ in 0..3 {
            hit(&mut net, 0, &how, 10, "h");
        }
        for _ in 0..2 {
            hit(&mut net, 2, &how, 10, "h");
        }
        net.run_for(Nanos::from_secs(2));
        net.set_cut(0, 2, false);
        net.set_cut(1, 2, false);
        net.run_for(Nanos::from_secs(10));
        let key = Key::new(LIMIT, "h");
        let states: Vec<_> = (0..3).map(|i| net.replica(i).state_of(&key)).collect();
        assert!(states[0].is_some());
        assert!(
            states.iter().all(|s| *s == states[0]),
            "{how:?}: states differ after healing: {states:?}"
        );
        assert_eq!(remaining(&mut net, 1, &how, 10, "h"), 5, "{how:?}");
    }
}

/// A node that found none of its seeds at start decides alone, and joins
/// (both ways merging what was granted) once a seed answers.
#[test]
fn a_node_that_started_alone_joins_when_its_seeds_appear() {
    let how = Replication::new(StrategyKind::Counter);
    let mut net = SimNet::new(2, START, Nanos::from_millis(1), 6, options);
    for i in 0..2 {
        plan(net.replica(i), &how, 10, "s");
    }
    net.set_cut(0, 1, true);
    net.run_for(Nanos::from_secs(5));
    assert!(net.replica(0).is_synced() && net.replica(1).is_synced());
    assert_eq!(net.node(0).unwrap().members().count(), 0);
    hit(&mut net, 0, &how, 10, "s");
    hit(&mut net, 1, &how, 10, "s");
    net.set_cut(0, 1, false);
    net.run_for(Nanos::from_secs(5));
    assert_eq!(net.node(0).unwrap().members().count(), 1);
    assert_eq!(net.node(1).unwrap().members().count(), 1);
    let key = Key::new(LIMIT, "s");
    assert_eq!(net.replica(0).state_of(&key), net.replica(1).state_of(&key));
    assert_eq!(remaining(&mut net, 0, &how, 10, "s"), 8);
}

/// The precision bound, per strategy and dissemination: one client sends
/// a request every 10 ms, round-robin over three nodes, to a bucket of 30
/// that does not refill during the test. A grant is visible to every node
/// once gossip has carried it; until then each other node may grant on
/// its own.
///
/// - **Epidemic** (the thesis's): with gossip every 300 ms to a random one
///   of two neighbours, a grant takes about 450 ms on average to reach a
///   given peer (directly or forwarded). A node stops once its own grants
///   plus what it has heard reach 30: `100·t − 67·0.45 ≥ 30` gives t ≈ 0.6
///   s, about 60 grants in all, so the bound is twice the capacity (these
///   seeds give 50). Frequency analysis pushes a key's updates to a
///   neighbour as soon as `capacity / nodes` of them came fast, which cuts
///   the excess (these seeds give 40; bound 45).
/// - **Origin** (tollgate's): every round ships each node's grants to both
///   neighbours, so a grant is seen within one round (300 ms): t ≈ 0.5 s,
///   about 50 grants (these seeds give 50, and 48 with frequency analysis,
///   whose window a node's own grants fill more slowly).
///
/// With near-limit propagation (tollgate's default queue), every grant
/// made within one node's share of the capacity of the limit (under origin
/// dissemination, plus the grants of the last round, which may be unseen
/// elsewhere) reaches every neighbour at once: these seeds grant exactly
/// the capacity; the bound leaves room for grants made within one network
/// latency.
const NEAR_BOUND: u64 = 33;

#[test]
fn over_admission_stays_within_what_gossip_delay_allows() {
    let freq = Replication {
        eager: Some(Eager {
            window: None,
            threshold: Eager::DEFAULT_THRESHOLD,
        }),
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    };
    let plain = Replication {
        eager: None,
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    };
    let cases = [
        (
            Dissemination::Epidemic,
            Replication::new(StrategyKind::Counter),
            60,
        ),
        (Dissemination::Epidemic, plain, 60),
        (Dissemination::Epidemic, freq, 45),
        // tollgate's default queue: frequency analysis and near-limit
        // propagation.
        (
            Dissemination::Epidemic,
            Replication::new(StrategyKind::Queue),
            NEAR_BOUND,
        ),
        (
            Dissemination::Origin,
            Replication::new(StrategyKind::Counter),
            50,
        ),
        (Dissemination::Origin, plain, 50),
        (Dissemination::Origin, freq, 50),
        (
            Dissemination::Origin,
            Replication::new(StrategyKind::Queue),
            NEAR_BOUND,
        ),
    ];
    for (dissemination, how, bound) in cases {
        let mut net = net_with(3, 4, dissemination);
        // The limit is known (from the config) before traffic comes, and
        // its gossip class has its timer.
        for i in 0..3 {
            remaining(&mut net, i, &how, 30, "flood");
        }
        net.run_for(Nanos::from_secs(2));
        let mut total = 0;
        for n in 0..600 {
            total += hit(&mut net, n % 3, &how, 30, "flood");
            net.run_for(Nanos::from_millis(10));
        }
        assert!(
            total >= 30,
            "{dissemination} {how:?}: granted {total}, less than the capacity"
        );
        assert!(
            total <= bound,
            "{dissemination} {how:?}: granted {total}, over the bound {bound}"
        );
        // Once converged, nobody grants again.
        net.run_for(Nanos::from_secs(3));
        for i in 0..3 {
            assert_eq!(
                hit(&mut net, i, &how, 30, "flood"),
                0,
                "{dissemination} {how:?} node {i}"
            );
        }
        eprintln!(
            "{dissemination} {:?} eager={:?} near={}: granted {total}",
            how.strategy,
            how.eager.is_some(),
            how.near_limit
        );
    }
}

#[test]
fn a_replica_refuses_to_decide_before_it_is_synced() {
    let replica = Replica::new(options(NodeId(1)));
    let p = plan(&replica, &Replication::new(StrategyKind::Counter), 5, "u");
    let r = replica.decide_now(&p, START, Hits::exactly(1), tollgate_core::Mode::Try);
    assert!(
        matches!(r, Err(StoreError::Unavailable(ref m)) if m.contains("full state")),
        "{r:?}"
    );
}

#[test]
fn only_token_buckets_and_their_kin_can_be_replicated() {
    let replica = Replica::new(options(NodeId(1)));
    let how = Replication::new(StrategyKind::Queue);
    let window =
        tollgate_core::FixedWindow::new(5, Nanos::from_secs(1), tollgate_core::Align::Epoch)
            .unwrap();
    let err = replica
        .prepare_limit(Limit::FixedWindow(window), Some(&how))
        .unwrap_err();
    assert_eq!(
        err,
        NotReplicable::Algorithm {
            algorithm: "fixed_window",
            strategy: "queue"
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("fixed_window") && text.contains("Redis"),
        "{text}"
    );
    let tb = TokenBucket::with_initial(5, Rate::per_second(1).unwrap(), 2).unwrap();
    let err = replica
        .prepare_limit(Limit::TokenBucket(tb), Some(&how))
        .unwrap_err();
    assert_eq!(err, NotReplicable::InitialTokens);
    assert!(err.to_string().contains("initial_tokens"), "{err}");
    let gcra = tollgate_core::Gcra::new(Rate::per_second(10).unwrap(), 4).unwrap();
    let limit = replica.prepare_limit(Limit::Gcra(gcra), None).unwrap();
    let Limit::Replicated(r) = limit else {
        panic!("not replicated: {limit:?}");
    };
    assert_eq!(r.capacity(), 4);
    assert_eq!(r.kind(), StrategyKind::Queue, "the default strategy");
    let per_second = tollgate_core::per_second_limit(50).unwrap();
    let Limit::Replicated(r) = replica
        .prepare_limit(
            Limit::SlidingLog(per_second),
            Some(&Replication::new(StrategyKind::Counter)),
        )
        .unwrap()
    else {
        panic!("a per-second limit is replicated");
    };
    assert_eq!((r.capacity(), r.kind()), (50, StrategyKind::Counter));
}

/// Issue 20: the replicated store's one admission call makes a rate limit
/// its cluster's CRDT in place, refuses what it cannot replicate with the
/// replica's own typed reason (no flag named: the binary adds those), and
/// refuses a copy pool itself with a typed reason (it was the service that
/// refused copy-limited resources, on a `holds_copies` flag).
#[test]
fn the_replicated_store_admits_rate_limits_as_crdts_and_refuses_copy_pools() {
    let store = ReplicaStore::new(Arc::new(Replica::new(options(NodeId(1)))));
    let copies = tollgate_core::copies::CopyLimits::new(3, None);
    let refusal = store.admit(Admit::Copies(&copies)).unwrap_err();
    assert!(matches!(refusal, Refusal::NoCopies), "{refusal:?}");
    assert!(
        refusal.to_string().contains("one owner of truth"),
        "{refusal}"
    );

    let how = Replication::new(StrategyKind::Epoch);
    let mut limit = Limit::TokenBucket(TokenBucket::new(5, Rate::per_second(1).unwrap()).unwrap());
    store
        .admit(Admit::Rate {
            limit: &mut limit,
            replication: Some(&how),
        })
        .unwrap();
    let Limit::Replicated(r) = &limit else {
        panic!("not made a CRDT: {limit:?}");
    };
    assert_eq!((r.capacity(), r.kind()), (5, StrategyKind::Epoch));

    let window =
        tollgate_core::FixedWindow::new(5, Nanos::from_secs(1), tollgate_core::Align::Epoch)
            .unwrap();
    let configured = Limit::FixedWindow(window);
    let mut limit = configured.clone();
    let refusal = store
        .admit(Admit::Rate {
            limit: &mut limit,
            replication: None,
        })
        .unwrap_err();
    assert_eq!(limit, configured, "a refused limit is left as it was");
    let Refusal::Limit(why) = &refusal else {
        panic!("not the replica's own reason: {refusal:?}");
    };
    assert_eq!(
        why.downcast_ref::<NotReplicable>(),
        Some(&NotReplicable::Algorithm {
            algorithm: "fixed_window",
            strategy: "queue"
        })
    );
    for refusal in [refusal, Refusal::NoCopies] {
        assert!(!refusal.to_string().contains("--"), "{refusal}");
    }
}

/// Of three nodes, only the one whose clock is wrong reports itself
/// unhealthy; the others see one bad peer out of two and stay healthy.
#[test]
fn only_the_node_with_a_wrong_clock_is_unhealthy() {
    let mut net = net(3, 8);
    net.set_clock_offset(2, 2_000_000_000);
    net.run_for(Nanos::from_secs(3));
    assert!(net.replica(0).is_healthy() && net.replica(1).is_healthy());
    assert!(!net.replica(2).is_healthy());
    assert!(net.node(0).unwrap().worst_skew() >= Nanos::from_millis(1900));
    net.set_clock_offset(2, 0);
    net.run_for(Nanos::from_secs(3));
    assert!(net.replica(2).is_healthy());
}

/// Nodes that start together have nothing to give each other: none is
/// synced by another's empty answer; each waits its join timeouts, then
/// decides alone.
#[test]
fn joining_nodes_do_not_sync_each_other() {
    let mut net = SimNet::new(3, START, Nanos::from_millis(1), 9, options);
    net.run_for(Nanos::from_secs(4));
    for i in 0..3 {
        assert!(
            !net.replica(i).is_synced(),
            "node {i} synced by a joining peer"
        );
    }
    net.run_for(Nanos::from_secs(3));
    for i in 0..3 {
        assert!(net.replica(i).is_synced(), "node {i}");
    }
}

/// A restarted node that cannot reach one member gets its full state from
/// another, and starts with the cluster's counts.
#[test]
fn a_joining_node_gets_its_state_from_a_member_it_can_reach() {
    let how = Replication::new(StrategyKind::Counter);
    let mut net = net(3, 10);
    for i in 0..3 {
        plan(net.replica(i), &how, 30, "r");
    }
    for _ in 0..4 {
        hit(&mut net, 0, &how, 30, "r");
    }
    net.run_for(Nanos::from_secs(2));
    net.crash(1);
    net.run_for(Nanos::from_secs(6));
    net.set_cut(0, 1, true);
    net.restart(1, options(NodeId(2)), 77);
    plan(net.replica(1), &how, 30, "r");
    net.run_for(Nanos::from_secs(8));
    assert!(net.replica(1).is_synced());
    assert_eq!(remaining(&mut net, 1, &how, 30, "r"), 26);
}

/// Deltas are sent once: one lost on the only link between two nodes is
/// repaired by anti-entropy (digests compared with a random member every
/// 30 s, and the buckets that differ exchanged).
#[test]
fn anti_entropy_repairs_a_lost_delta() {
    let how = Replication {
        eager: None,
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    };
    let mut net = net(2, 11);
    for i in 0..2 {
        plan(net.replica(i), &how, 10, "lost");
    }
    // The limit's gossip class gets its timer.
    net.run_for(Nanos::from_secs(2));
    net.set_cut(0, 1, true);
    for _ in 0..3 {
        hit(&mut net, 0, &how, 10, "lost");
    }
    // Short enough that membership does not notice.
    net.run_for(Nanos::from_millis(600));
    net.set_cut(0, 1, false);
    net.run_for(Nanos::from_secs(2));
    let key = Key::new(LIMIT, "lost");
    assert_eq!(
        net.replica(1).state_of(&key),
        None,
        "the delta was not lost"
    );
    net.run_for(Nanos::from_secs(35));
    assert_eq!(net.replica(1).state_of(&key), net.replica(0).state_of(&key));
}

/// §5.4: a steady rate just above the refill rate must not slip through.
/// One client sends a request every 0.9 s (1.11 a second), round-robin
/// over three nodes, to a bucket of 5 refilled at 1 a second (the
/// thesis's data set D). A centralized token bucket sees the same trace;
/// over two minutes the cluster may grant a little more while news
/// travels, but the excess must not grow with time (no drift), and
/// gossip goes quiet once traffic stops.
#[test]
fn a_steady_rate_just_above_the_limit_does_not_drift_through() {
    for how in strategies() {
        let mut net = net(3, 12);
        let bucket = |r: &Replica| {
            let tb = TokenBucket::new(5, Rate::per_second(1).unwrap()).unwrap();
            let limit = Arc::new(r.prepare_limit(Limit::TokenBucket(tb), Some(&how)).unwrap());
            r.register(LIMIT, Arc::clone(&limit));
            Plan::single(Key::new(LIMIT, "d"), limit)
        };
        let plans: Vec<Plan> = (0..3).map(|i| bucket(net.replica(i))).collect();
        net.run_for(Nanos::from_secs(2));
        let central_limit = TokenBucket::new(5, Rate::per_second(1).unwrap()).unwrap();
        let mut central = tollgate_core::Algorithm::fresh(&central_limit);
        let (mut cluster, mut reference) = (0u64, 0u64);
        let mut excess_at_half = 0i64;
        for n in 0..134 {
            let now = net.now();
            reference += tollgate_core::Algorithm::decide(
                &central_limit,
                &mut central,
                now,
                Hits::exactly(1),
            )
            .granted;
            cluster += net
                .decide(n % 3, &plans[n % 3], Hits::exactly(1))
                .unwrap()
                .granted;
            if n == 66 {
                excess_at_half = cluster as i64 - reference as i64;
            }
            net.run_for(Nanos::from_millis(900));
        }
        let excess = cluster as i64 - reference as i64;
        assert!(
            excess <= 4,
            "{how:?}: {cluster} granted against {reference} centrally"
        );
        assert!(
            excess <= excess_at_half + 2,
            "{how:?}: the excess grew from {excess_at_half} to {excess}"
        );
        net.run_for(Nanos::from_secs(5));
        for i in 0..3 {
            assert_eq!(net.replica(i).delta_sizes(), (0, 0), "{how:?} node {i}");
            assert_eq!(net.replica(i).convergence_lag(net.now()), Nanos::ZERO);
        }
    }
}

/// Gossip sent by every node: (datagrams, updates carried).
fn gossip_totals(net: &SimNet) -> (u64, u64) {
    (0..net.len())
        .filter_map(|i| net.node(i))
        .map(|n| n.sent())
        .fold((0, 0), |(d, u), s| {
            (d + s.gossip_datagrams, u + s.gossip_updates)
        })
}

/// Issue 21: under origin dissemination a grant crosses the network once
/// per other node (N − 1 copies), where the thesis's epidemic forwarding
/// sends it on the order of N × (N − 1) times.
#[test]
fn in_a_full_mesh_each_grant_reaches_each_node_once() {
    let how = Replication {
        eager: None,
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    };
    let n = 6;
    let mut copies = Vec::new();
    for dissemination in [Dissemination::Origin, Dissemination::Epidemic] {
        let mut net = net_with(n, 21, dissemination);
        for i in 0..n {
            plan(net.replica(i), &how, 1000, "once");
        }
        net.run_for(Nanos::from_secs(2));
        let (_, before) = gossip_totals(&net);
        // Three grants on three nodes, far from the limit (no eager push).
        for i in 0..3 {
            assert_eq!(hit(&mut net, i, &how, 1000, "once"), 1);
        }
        net.run_for(Nanos::from_secs(20));
        let key = Key::new(LIMIT, "once");
        for i in 1..n {
            assert_eq!(
                net.replica(i).state_of(&key),
                net.replica(0).state_of(&key),
                "{dissemination}: node {i} did not converge"
            );
        }
        let (_, after) = gossip_totals(&net);
        copies.push(after - before);
    }
    assert_eq!(copies[0], 3 * (n as u64 - 1), "origin: {copies:?}");
    assert!(copies[1] > copies[0], "epidemic: {copies:?}");
}

/// Issue 21: anti-entropy costs one digest per round when the replicas
/// agree, not a full state.
#[test]
fn anti_entropy_sends_only_a_digest_when_nothing_differs() {
    let how = Replication::new(StrategyKind::Queue);
    let mut net = net(3, 12);
    for i in 0..3 {
        plan(net.replica(i), &how, 100, "same");
    }
    for i in 0..3 {
        for _ in 0..5 {
            hit(&mut net, i, &how, 100, "same");
        }
    }
    net.run_for(Nanos::from_secs(5));
    let (datagrams, updates) = gossip_totals(&net);
    // Two anti-entropy intervals: each node sends two digests, and the
    // others find nothing to repair.
    net.run_for(Nanos::from_secs(60));
    let (datagrams_after, updates_after) = gossip_totals(&net);
    assert_eq!(updates_after, updates, "anti-entropy sent state");
    assert_eq!(
        datagrams_after - datagrams,
        3 * 2,
        "one digest each per interval"
    );
    let key = Key::new(LIMIT, "same");
    assert_eq!(net.replica(1).state_of(&key), net.replica(0).state_of(&key));
}

/// Issue 21: on a ring (each node reaches only its two neighbours) news
/// still reaches every node: a node that cannot reach some member asks
/// its neighbours to relay, and they pass on what they learn.
#[test]
fn a_ring_converges_through_relays() {
    let how = Replication {
        eager: None,
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    };
    let n = 8;
    let mut net = net(n, 13);
    for a in 0..n {
        for b in (a + 1)..n {
            let neighbours = (a + 1) % n == b || (b + 1) % n == a;
            if !neighbours {
                net.set_cut(a, b, true);
            }
        }
    }
    for i in 0..n {
        plan(net.replica(i), &how, 100, "ring");
    }
    // The probes find who is out of reach, and relays are asked for.
    net.run_for(Nanos::from_secs(3));
    for _ in 0..4 {
        assert_eq!(hit(&mut net, 0, &how, 100, "ring"), 1);
    }
    // Four hops to the far side, a round each: well within 10 s, long
    // before the first anti-entropy round (30 s).
    net.run_for(Nanos::from_secs(10));
    let key = Key::new(LIMIT, "ring");
    for i in 1..n {
        assert_eq!(
            net.replica(i).state_of(&key),
            net.replica(0).state_of(&key),
            "node {i}"
        );
    }
}

/// Cuts every link of `net` that `linked` does not name.
fn keep_links(net: &mut SimNet, linked: impl Fn(usize, usize) -> bool) {
    let n = net.len();
    for a in 0..n {
        for b in (a + 1)..n {
            if !linked(a, b) {
                net.set_cut(a, b, true);
            }
        }
    }
}

/// Issue 21 (review): two meshes of four joined by one link (3–4). Nodes
/// that cannot reach the other side ask every member they hear to relay
/// its news, so the bridge (node 3 for 0–2, node 4 for 5–7) is among the
/// relays, and news crosses within seconds, not at the next anti-entropy
/// round.
#[test]
fn news_crosses_a_single_bridge_between_two_meshes() {
    let how = Replication {
        eager: None,
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    };
    let mut net = net(8, 14);
    keep_links(&mut net, |a, b| (a < 4) == (b < 4) || (a, b) == (3, 4));
    for i in 0..8 {
        plan(net.replica(i), &how, 100, "bridge");
    }
    net.run_for(Nanos::from_secs(5));
    for _ in 0..3 {
        assert_eq!(hit(&mut net, 7, &how, 100, "bridge"), 1);
        assert_eq!(hit(&mut net, 0, &how, 100, "bridge"), 1);
    }
    net.run_for(Nanos::from_secs(5));
    let key = Key::new(LIMIT, "bridge");
    for i in 1..8 {
        assert_eq!(
            net.replica(i).state_of(&key),
            net.replica(0).state_of(&key),
            "node {i}"
        );
    }
}

/// Issue 21 (review): on a line 0–1–2, node 1 relays between 0 and 2. When
/// it restarts it relays nothing, and the nodes at the ends ask it again
/// within seconds (not when a half-life of the old relay has passed).
#[test]
fn a_relay_that_restarts_is_asked_again() {
    let how = Replication {
        eager: None,
        near_limit: false,
        ..Replication::new(StrategyKind::Queue)
    };
    let mut net = net(3, 15);
    keep_links(&mut net, |a, b| (a, b) != (0, 2));
    for i in 0..3 {
        plan(net.replica(i), &how, 100, "line");
    }
    net.run_for(Nanos::from_secs(5));
    assert!(net.replica(1).relays_to(sim::addr_of(0), net.now()));
    net.crash(1);
    net.run_for(Nanos::from_millis(500));
    net.restart(1, options(NodeId(2)), 99);
    plan(net.replica(1), &how, 100, "line");
    // Joining (a full state from a member) and the next probes.
    net.run_for(Nanos::from_secs(8));
    assert!(net.replica(1).is_synced());
    assert!(
        net.replica(1).relays_to(sim::addr_of(0), net.now()),
        "node 0 did not ask the restarted node to relay"
    );
    for _ in 0..3 {
        assert_eq!(hit(&mut net, 2, &how, 100, "line"), 1);
    }
    net.run_for(Nanos::from_secs(3));
    let key = Key::new(LIMIT, "line");
    assert_eq!(net.replica(0).state_of(&key), net.replica(2).state_of(&key));
}
