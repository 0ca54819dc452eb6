#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The gossip node under hostile datagrams (issue 16), on the simulated
//! network, where the test plays the attacker: junk from anywhere,
//! datagrams recorded on the wire and replayed (to their recipient, to
//! another member, from a spoofed source), recorded datagrams with bytes
//! changed, forgeries sealed with another cluster's key, and (a leaked
//! secret, or a buggy member) authentic datagrams with any header and any
//! body: foca messages of junk, deltas and full-state chunks of made-up
//! keys, clock probes with absurd times, outdated notices.
//!
//! A stranger without the secret must change nothing: the cluster keeps
//! its members, stays synced, keeps gossiping grants, keeps no state for
//! the stranger, and answers at most one small notice per address per
//! second. Whoever holds the secret still cannot crash a node, make it
//! send datagrams over the size limit, or grow its keys past
//! `max_keys`. The wire decoder alone is fuzzed in `tests/wire.rs`; here
//! the whole node is. The node on a real UDP socket of a real server is
//! in the binary's hostile suite.
//!
//! `TOLLGATE_HOSTILE_CASES` sets the cases per property (default 48).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use tollgate_core::replicated::counter::CounterBucketState;
use tollgate_core::replicated::epoch::EpochReport;
use tollgate_core::replicated::strategy::{Payload, Replication, StrategyKind};
use tollgate_core::replicated::NodeId;
use tollgate_core::{Hits, Limit, Nanos, Rate, TokenBucket};
use tollgate_replica::sim::{self, addr_of, SimNet};
use tollgate_replica::wire::{self, Body, ClusterKey, Header, ANYONE, MAX_DOMAIN};
use tollgate_replica::{Replica, ReplicaOptions};
use tollgate_store::{Key, LimitId, Plan};

const START: Nanos = Nanos::from_secs(1_800_000_000);
const LIMIT: LimitId = LimitId(7);
const NODES: usize = 3;
/// The replicas' key cap, small so a flood reaches it.
const MAX_KEYS: usize = 64;

fn cases() -> u32 {
    std::env::var("TOLLGATE_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u32| n > 0)
        .unwrap_or(48)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        max_shrink_iters: 200,
        ..Config::default()
    })
}

fn options(node: NodeId) -> ReplicaOptions {
    ReplicaOptions {
        node,
        max_keys: MAX_KEYS,
        ..ReplicaOptions::default()
    }
}

/// A replicated token bucket of 30 refilled once an hour, for `domain`.
fn plan(replica: &Replica, domain: &str) -> Plan {
    let bucket = TokenBucket::new(30, Rate::new(1, Nanos::from_secs(3600)).unwrap()).unwrap();
    let limit = replica
        .prepare_limit(
            Limit::TokenBucket(bucket),
            Some(&Replication::new(StrategyKind::Counter)),
        )
        .unwrap();
    let limit = Arc::new(limit);
    replica.register(LIMIT, Arc::clone(&limit));
    Plan::single(Key::new(LIMIT, domain), limit)
}

fn remaining(net: &mut SimNet, i: usize, domain: &str) -> u64 {
    let p = plan(net.replica(i), domain);
    net.decide(i, &p, Hits::exactly(0)).unwrap().decisions[0].remaining
}

fn hit(net: &mut SimNet, i: usize, domain: &str) -> u64 {
    let p = plan(net.replica(i), domain);
    net.decide(i, &p, Hits::exactly(1)).unwrap().granted
}

fn members(net: &SimNet, i: usize) -> usize {
    net.node(i).map_or(0, |n| n.members().count())
}

/// A settled cluster (every node synced and a member of every other) that
/// has granted 3 hits of `u`, and the datagrams the network carried
/// meanwhile, as an eavesdropper recorded them.
fn settled(seed: u64) -> (SimNet, Vec<sim::Recorded>) {
    let mut net = SimNet::new(NODES, START, Nanos::from_millis(1), seed, options);
    net.record(true);
    net.run_for(Nanos::from_secs(7));
    for i in 0..NODES {
        plan(net.replica(i), "u");
    }
    for i in 0..NODES {
        assert_eq!(hit(&mut net, i, "u"), 1);
    }
    // Gossip rounds bring each grant to every node within about 3 s.
    net.run_for(Nanos::from_secs(4));
    let recorded = net.recorded().to_vec();
    net.record(false);
    for i in 0..NODES {
        assert!(net.replica(i).is_synced(), "node {i} never synced");
        assert_eq!(members(&net, i), NODES - 1);
        assert_eq!(remaining(&mut net, i, "u"), 27);
    }
    (net, recorded)
}

/// A source address: a member's, a stranger's, or any.
fn source() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        2 => (0..NODES).prop_map(addr_of),
        2 => (NODES..NODES + 50).prop_map(addr_of),
        1 => (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::from((Ipv4Addr::from(ip), port))),
    ]
}

/// What a stranger without the secret can send.
#[derive(Clone, Debug)]
enum Stranger {
    Junk {
        to: usize,
        from: SocketAddr,
        bytes: Vec<u8>,
    },
    /// A recorded datagram played again, to any node, from any address.
    Replay {
        which: Index,
        to: usize,
        from: SocketAddr,
    },
    /// A recorded datagram with bytes changed.
    Tampered {
        which: Index,
        changes: Vec<(Index, u8)>,
        to: usize,
    },
    /// A datagram sealed with a key of the stranger's own (right cluster
    /// name, wrong secret; or another cluster).
    Forged {
        to: usize,
        from: SocketAddr,
        header: Header,
        body: Body,
        other_cluster: bool,
    },
}

fn stranger() -> impl Strategy<Value = Stranger> {
    prop_oneof![
        2 => (0..NODES, source(), prop_oneof![
            prop::collection::vec(any::<u8>(), 0..1400),
            // Starts like a datagram of this cluster.
            prop::collection::vec(any::<u8>(), 0..200).prop_map(|mut b| {
                let mut head = b"TG\x03".to_vec();
                head.extend_from_slice(&wire::cluster_tag(sim::CLUSTER).to_le_bytes());
                head.append(&mut b);
                head
            }),
        ])
            .prop_map(|(to, from, bytes)| Stranger::Junk { to, from, bytes }),
        3 => (any::<Index>(), 0..NODES, source()).prop_map(|(which, to, from)| Stranger::Replay { which, to, from }),
        2 => (any::<Index>(), prop::collection::vec((any::<Index>(), any::<u8>()), 1..4), 0..NODES)
            .prop_map(|(which, changes, to)| Stranger::Tampered { which, changes, to }),
        2 => (0..NODES, source(), header(), body(), any::<bool>())
            .prop_map(|(to, from, header, body, other_cluster)| Stranger::Forged { to, from, header, body, other_cluster }),
    ]
}

fn node_id() -> impl Strategy<Value = NodeId> {
    prop_oneof![3 => 1..=NODES as u64 + 1, 1 => Just(0u64), 1 => any::<u64>()].prop_map(NodeId)
}

fn time() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        3 => START.as_u64()..START.as_u64() + 60_000_000_000,
        1 => Just(0u64),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
    .prop_map(Nanos::new)
}

/// Any header of this cluster (the recipient's incarnation is fixed up to
/// the real one when `to_incarnation` is 1, so some reach the node).
fn header() -> impl Strategy<Value = Header> {
    (
        node_id(),
        any::<u64>(),
        prop_oneof![0u64..4, any::<u64>()],
        time(),
        node_id(),
        prop_oneof![Just(0u64), Just(1u64), any::<u64>()],
    )
        .prop_map(
            |(from, incarnation, seq, sent_at, to, to_incarnation)| Header {
                cluster: wire::cluster_tag(sim::CLUSTER),
                from,
                incarnation,
                seq,
                sent_at,
                to,
                to_incarnation,
            },
        )
}

fn domain() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec!["u", "", "acme", "ünïcødé"]).prop_map(String::from),
        2 => "[a-z0-9]{1,16}",
        1 => (0usize..=MAX_DOMAIN).prop_map(|n| "d".repeat(n)),
    ]
}

fn payload() -> impl Strategy<Value = Payload> {
    let entries = || prop::collection::vec((node_id(), prop_oneof![0u64..40, any::<u64>()]), 0..5);
    prop_oneof![
        (
            entries(),
            prop_oneof![0u64..100, any::<u64>()],
            prop::option::of(time())
        )
            .prop_map(|(e, limit, refill)| Payload::Counter(
                CounterBucketState::from_parts(e, limit, refill)
            )),
        (prop_oneof![0u64..10, any::<u64>()], entries())
            .prop_map(|(epoch, traffic)| Payload::Epoch(EpochReport::from_parts(epoch, traffic))),
    ]
}

fn items() -> impl Strategy<Value = Vec<(Key, Payload)>> {
    prop::collection::vec(
        (
            prop_oneof![3 => Just(LIMIT), 1 => any::<u64>().prop_map(LimitId)],
            domain(),
            payload(),
        )
            .prop_map(|(limit, domain, p)| (Key::new(limit, &domain), p)),
        0..8,
    )
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..400).prop_map(Body::Membership),
        2 => items().prop_map(|items| Body::Delta { items }),
        1 => Just(Body::FullRequest),
        2 => (any::<u64>(), prop_oneof![0u32..3, any::<u32>()], any::<bool>(), items())
            .prop_map(|(stream, index, last, items)| Body::Full { stream, index, last, items }),
        1 => time().prop_map(|t1| Body::Ping { t1 }),
        1 => (time(), time(), time()).prop_map(|(t1, t2, t3)| Body::Pong { t1, t2, t3 }),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(incarnation, seq)| Body::Outdated { incarnation, seq }),
        1 => Just(Body::Unauthenticated),
    ]
}

/// `header` made to reach node `to` when it asks for that (`to_incarnation`
/// 1 means "the recipient's real one").
fn aimed(net: &SimNet, to: usize, mut header: Header) -> Header {
    if header.to_incarnation == 1 {
        header.to = NodeId(to as u64 + 1);
        header.to_incarnation = net.node(to).map_or(0, |n| n.incarnation());
    }
    header
}

/// Datagrams from strangers, played to a settled cluster: nothing changes.
/// Every node keeps its members and stays synced, a grant still reaches
/// every node, no node keeps a key it did not have, and the cluster
/// answered at most one small notice per shot to addresses that are not
/// members.
#[test]
fn datagrams_from_strangers_change_nothing() {
    let shots = prop::collection::vec(stranger(), 1..40);
    let tally = std::cell::Cell::new(0u64);
    runner()
        .run(&(any::<u64>(), shots), |(seed, shots)| {
            let (mut net, recorded) = settled(seed % 4);
            let keys: Vec<u64> = (0..NODES).map(|i| net.replica(i).keys()).collect();
            let strays = net.strays().len();
            for shot in &shots {
                tally.set(tally.get() + 1);
                match shot {
                    Stranger::Junk { to, from, bytes } => net.inject(*to, *from, bytes.clone()),
                    Stranger::Replay { which, to, from } => {
                        let r = which.get(&recorded);
                        net.inject(*to, *from, r.bytes.clone());
                    }
                    Stranger::Tampered { which, changes, to } => {
                        let r = which.get(&recorded);
                        let mut bytes = r.bytes.clone();
                        for (at, b) in changes {
                            let i = at.index(bytes.len());
                            // A change that changes nothing is a replay.
                            bytes[i] ^= b.max(&1);
                        }
                        net.inject(*to, addr_of(r.from), bytes);
                    }
                    Stranger::Forged {
                        to,
                        from,
                        header,
                        body,
                        other_cluster,
                    } => {
                        let (key, mut header) = if *other_cluster {
                            let h = Header {
                                cluster: wire::cluster_tag("other"),
                                ..*header
                            };
                            (ClusterKey::new(sim::SECRET, "other"), h)
                        } else {
                            (ClusterKey::new(b"not the secret", sim::CLUSTER), *header)
                        };
                        header = aimed(&net, *to, header);
                        if let Ok(bytes) = wire::encode(&key, &header, body) {
                            net.inject(*to, *from, bytes);
                        }
                    }
                }
                net.run_for(Nanos::from_millis(3));
            }
            net.run_for(Nanos::from_secs(3));
            for (i, &kept) in keys.iter().enumerate() {
                assert_eq!(
                    members(&net, i),
                    NODES - 1,
                    "node {i}'s members after {shots:?}"
                );
                assert!(net.replica(i).is_synced(), "node {i} no longer synced");
                assert_eq!(
                    net.replica(i).keys(),
                    kept,
                    "node {i} keeps state for a stranger"
                );
            }
            // Answers to strangers: at most one per shot (the throttled
            // `unauthenticated` notice), never a stream of them.
            let answered = net.strays().len() - strays;
            assert!(
                answered <= shots.len(),
                "{answered} datagrams sent to strangers for {} shots",
                shots.len()
            );
            // Replays of recorded grants counted nothing twice, and the
            // cluster still gossips.
            for i in 0..NODES {
                assert_eq!(remaining(&mut net, i, "u"), 27, "node {i} after {shots:?}");
            }
            assert_eq!(hit(&mut net, 1, "u"), 1);
            net.run_for(Nanos::from_secs(4));
            for i in 0..NODES {
                assert_eq!(
                    remaining(&mut net, i, "u"),
                    26,
                    "node {i} missed a grant after {shots:?}"
                );
            }
            Ok(())
        })
        .unwrap();
    eprintln!(
        "gossip datagrams from strangers: {} played to settled clusters",
        tally.get()
    );
}

/// Authentic datagrams with any header and any body, as a node whose
/// secret leaked (or a buggy member) could send: no node panics, every
/// datagram a node sends stays within the size limit, and no node keeps
/// more keys than `max_keys`, also under a flood of deltas for unique
/// domains.
#[test]
fn authentic_datagrams_with_any_header_and_body_keep_the_node_bounded() {
    let shot = (0..NODES, source(), header(), body());
    let shots = prop::collection::vec(shot, 1..40);
    let tally = std::cell::Cell::new(0u64);
    runner()
        .run(
            &(any::<u64>(), shots, 0usize..200),
            |(seed, shots, flood)| {
                let (mut net, _) = settled(seed % 4);
                let key = sim::key();
                for (to, from, header, body) in &shots {
                    tally.set(tally.get() + 1);
                    let header = aimed(&net, *to, *header);
                    if let Ok(bytes) = wire::encode(&key, &header, body) {
                        net.inject(*to, *from, bytes);
                    }
                    net.run_for(Nanos::from_millis(3));
                }
                // A flood of deltas for unique domains, from a member.
                for n in 0..flood {
                    let items = (0..8)
                        .map(|k| {
                            let p = Payload::Counter(CounterBucketState::from_parts(
                                [(NodeId(2), 1)],
                                30,
                                None,
                            ));
                            (Key::new(LIMIT, &format!("flood-{n}-{k}")), p)
                        })
                        .collect();
                    let header = Header {
                        cluster: wire::cluster_tag(sim::CLUSTER),
                        from: NodeId(2),
                        incarnation: net.node(1).unwrap().incarnation(),
                        seq: u64::MAX / 2 + n as u64,
                        sent_at: net.now(),
                        to: NodeId(1),
                        to_incarnation: net.node(0).unwrap().incarnation(),
                    };
                    if let Ok(bytes) = wire::encode(&key, &header, &Body::Delta { items }) {
                        net.inject(0, addr_of(1), bytes);
                    }
                }
                net.run_for(Nanos::from_secs(3));
                for i in 0..NODES {
                    let keys = net.replica(i).keys();
                    assert!(keys <= MAX_KEYS as u64, "node {i} keeps {keys} keys");
                }
                Ok(())
            },
        )
        .unwrap();
    eprintln!(
        "authentic gossip datagrams: {} with any header and body",
        tally.get()
    );
}

#[test]
fn the_recipient_field_is_what_aimed_sets() {
    // `aimed` must produce headers the node accepts, or the property
    // above would test only the misaddressed path.
    let (mut net, _) = settled(1);
    let before = net.node(0).unwrap().dropped("misaddressed");
    let header = aimed(
        &net,
        0,
        Header {
            cluster: wire::cluster_tag(sim::CLUSTER),
            from: NodeId(99),
            incarnation: 5,
            seq: 0,
            sent_at: net.now(),
            to: ANYONE,
            to_incarnation: 1,
        },
    );
    let bytes = wire::encode(&sim::key(), &header, &Body::FullRequest).unwrap();
    net.inject(0, addr_of(40), bytes);
    net.run_for(Nanos::from_millis(5));
    let node = net.node(0).unwrap();
    assert_eq!(node.dropped("misaddressed"), before);
    // Not a member: the request is refused as such, past every check.
    assert_eq!(node.dropped("not_a_member"), 1);
}
