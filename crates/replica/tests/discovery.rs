#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Seeds found by DNS, on the simulated network: what a node does when
//! the seed list it starts with is empty or only itself, and when a later
//! answer lists its peers (`Node::set_seeds`). The DNS side (parsing
//! `dns:NAME:PORT`, looking names up) is tested in `discovery.rs`'s unit
//! tests and end to end in `crates/tollgate/tests/cluster.rs`.

use std::net::SocketAddr;
use std::sync::Arc;

use tollgate_core::replicated::strategy::{Replication, StrategyKind};
use tollgate_core::replicated::NodeId;
use tollgate_core::{Hits, Limit, Mode, Nanos, Rate, TokenBucket};
use tollgate_replica::node::MAX_SEEDS;
use tollgate_replica::sim::{addr_of, SimNet};
use tollgate_replica::{Replica, ReplicaOptions};
use tollgate_store::{Key, LimitId, Plan, StoreError};

const START: Nanos = Nanos::from_secs(1_800_000_000);
const LIMIT: LimitId = LimitId(9);
const JOIN_TIMEOUT: Nanos = Nanos::from_secs(3);

fn options(node: NodeId) -> ReplicaOptions {
    ReplicaOptions {
        node,
        ..ReplicaOptions::default()
    }
}

fn how() -> Replication {
    Replication::new(StrategyKind::Counter)
}

/// A counter-replicated bucket of 30 that does not refill during a test.
fn plan(replica: &Replica, domain: &str) -> Plan {
    let bucket = TokenBucket::new(30, Rate::new(1, Nanos::from_secs(3600)).unwrap()).unwrap();
    let limit = replica
        .prepare_limit(Limit::TokenBucket(bucket), Some(&how()))
        .unwrap();
    let limit = Arc::new(limit);
    replica.register(LIMIT, Arc::clone(&limit));
    Plan::single(Key::new(LIMIT, domain), limit)
}

fn hit(net: &mut SimNet, i: usize, domain: &str) -> u64 {
    let p = plan(net.replica(i), domain);
    net.decide(i, &p, Hits::exactly(1)).unwrap().granted
}

fn remaining(net: &mut SimNet, i: usize, domain: &str) -> u64 {
    let p = plan(net.replica(i), domain);
    net.decide(i, &p, Hits::exactly(0)).unwrap().decisions[0].remaining
}

fn members(net: &SimNet, i: usize) -> usize {
    net.node(i).unwrap().members().count()
}

/// Whether node `i` refuses to decide (it is joining).
fn refuses(net: &SimNet, i: usize) -> bool {
    let p = plan(net.replica(i), "probe");
    matches!(
        net.replica(i)
            .decide_now(&p, net.now(), Hits::exactly(0), Mode::Try),
        Err(StoreError::Unavailable(_))
    )
}

/// With seeds given on the command line, a node without any is the first
/// of its cluster and decides at once. With seeds from DNS, an answer that
/// lists only the node itself may mean its peers are not listed yet: it
/// waits one join timeout for them, then decides alone (ready, the first
/// of its cluster).
#[test]
fn a_node_alone_in_dns_decides_alone_after_one_join_timeout() {
    let given = SimNet::new(1, START, Nanos::from_millis(1), 1, options);
    assert!(
        given.replica(0).is_synced(),
        "no seeds given: the first at once"
    );

    let mut net = SimNet::discovering(1, START, Nanos::from_millis(1), 1, |i| vec![i], options);
    assert!(
        net.node(0).unwrap().seeds().is_empty(),
        "its own address is no seed"
    );
    net.run_for(JOIN_TIMEOUT.saturating_sub(Nanos::from_millis(1)));
    assert!(
        !net.replica(0).is_synced(),
        "decided before its join timeout"
    );
    assert!(refuses(&net, 0));
    net.run_for(Nanos::from_millis(2));
    assert!(net.replica(0).is_synced(), "never decided alone");
    assert_eq!(hit(&mut net, 0, "u"), 1);
}

/// A pod that starts while DNS lists only itself waits; when the next
/// answer lists its peers (before its join timeout), it joins and gets
/// the cluster's state: it never decides on an empty one.
#[test]
fn a_node_whose_peers_are_listed_late_joins_with_their_state() {
    let seeds = |i| if i == 2 { vec![2] } else { vec![0, 1] };
    let mut net = SimNet::discovering(3, START, Nanos::from_millis(1), 2, seeds, options);
    // Node 2 is not up yet (nothing ran: it sent nothing, nobody knows
    // it); nodes 0 and 1 form the cluster and grant.
    net.crash(2);
    net.run_for(Nanos::from_secs(7));
    for i in 0..2 {
        assert!(net.replica(i).is_synced());
        assert_eq!(members(&net, i), 1, "node {i}");
    }
    for _ in 0..4 {
        assert_eq!(hit(&mut net, 0, "u"), 1);
    }
    net.run_for(Nanos::from_secs(1));
    // It starts; DNS lists only itself so far.
    net.restart(2, options(NodeId(3)), 33);
    net.run_for(Nanos::from_secs(1));
    assert!(refuses(&net, 2), "decided before it found its peers");
    assert_eq!(members(&net, 2), 0);
    net.set_seeds(2, &[0, 1, 2]);
    net.run_for(Nanos::from_millis(500));
    // Well before its join timeout: synced by a peer's full state.
    assert!(net.replica(2).is_synced(), "never got a full state");
    assert_eq!(remaining(&mut net, 2, "u"), 26, "not the cluster's state");
    net.run_for(Nanos::from_secs(3));
    for i in 0..3 {
        assert_eq!(members(&net, i), 2, "node {i}");
    }
}

/// Nodes that decided alone, each listed only by itself, join when DNS
/// lists them all: full states go both ways, so every node ends with what
/// every side granted, and the cluster size membership works with grows
/// to the answer's.
#[test]
fn nodes_that_decided_alone_merge_when_dns_lists_them_all() {
    let mut net = SimNet::discovering(3, START, Nanos::from_millis(1), 3, |i| vec![i], options);
    net.run_for(JOIN_TIMEOUT.saturating_add(Nanos::from_millis(10)));
    for i in 0..3 {
        assert!(net.replica(i).is_synced(), "node {i} never decided alone");
        assert_eq!(members(&net, i), 0);
        assert_eq!(net.node(i).unwrap().cluster_size(), 1);
    }
    let grants = [(0, 3), (1, 2), (2, 1)];
    for (i, n) in grants {
        for _ in 0..n {
            assert_eq!(hit(&mut net, i, "m"), 1);
        }
    }
    // Only node 2 is told at first: the others learn of everyone through
    // it, as a pod that starts last finds the running ones.
    net.set_seeds(2, &[0, 1, 2]);
    assert_eq!(net.node(2).unwrap().cluster_size(), 3);
    net.run_for(Nanos::from_secs(5));
    for i in 0..3 {
        assert_eq!(members(&net, i), 2, "node {i}");
        assert_eq!(remaining(&mut net, i, "m"), 24, "node {i}");
    }
    let key = Key::new(LIMIT, "m");
    assert_eq!(net.replica(0).state_of(&key), net.replica(1).state_of(&key));
    assert_eq!(net.replica(1).state_of(&key), net.replica(2).state_of(&key));
}

/// A seed list is kept sorted, without duplicates and without the node's
/// own address, and at most `MAX_SEEDS` long: a DNS answer of thousands
/// of addresses cannot make a node announce to all of them every second.
#[test]
fn seed_lists_drop_the_node_itself_and_are_bounded() {
    let mut net = SimNet::discovering(2, START, Nanos::from_millis(1), 4, |_| vec![], options);
    net.set_seeds(0, &[1, 0, 1, 0]);
    assert_eq!(net.node(0).unwrap().seeds(), &[addr_of(1)]);
    let many: Vec<usize> = (0..MAX_SEEDS + 50).rev().collect();
    net.set_seeds(0, &many);
    let seeds = net.node(0).unwrap().seeds();
    assert_eq!(seeds.len(), MAX_SEEDS);
    assert!(!seeds.contains(&addr_of(0)));
    assert!(seeds.windows(2).all(|w| w[0] < w[1]), "not sorted");
    assert_eq!(seeds[0], addr_of(1));
    assert_eq!(net.node(0).unwrap().cluster_size(), MAX_SEEDS as u32 + 1);
    // The same list again changes nothing.
    net.set_seeds(0, &many);
    assert_eq!(net.node(0).unwrap().seeds().len(), MAX_SEEDS);
}

/// A dual-stack headless Service lists every pod under IPv4 and IPv6; a
/// node advertising an IPv4 address keeps only the IPv4 ones (its socket
/// cannot reach the others, and one of them is itself).
#[test]
fn seeds_of_the_other_address_family_are_dropped() {
    let mut net = SimNet::discovering(2, START, Nanos::from_millis(1), 4, |_| vec![], options);
    let v6 = |i: usize| SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr_of(i).port());
    net.set_seed_addrs(0, vec![addr_of(0), v6(0), addr_of(1), v6(1)]);
    assert_eq!(net.node(0).unwrap().seeds(), &[addr_of(1)]);
    // An IPv4-mapped IPv6 address is an IPv4 address.
    let mapped = SocketAddr::new(
        std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().into(),
        addr_of(1).port(),
    );
    net.set_seed_addrs(0, vec![v6(1), mapped]);
    assert_eq!(net.node(0).unwrap().seeds(), &[addr_of(1)]);
}
