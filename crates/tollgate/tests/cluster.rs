//! `tollgate serve --cluster` as real processes gossiping over loopback:
//! three nodes converge for each replication strategy, spreading requests
//! over the nodes over-admits by a bounded amount only, a node killed with
//! SIGKILL rejoins with a full state before it decides, a joining node
//! refuses to decide until it reaches a peer (and does reach it once the
//! network lets it, or once its seed comes up), both sides of a
//! partition keep limiting and merge when it heals, strangers' datagrams
//! and a node of another cluster are refused and counted, configs a
//! cluster cannot serve are refused at startup, a skewed clock makes
//! the nodes unready while they keep limiting, a node restarted with its
//! clock stepped back rejoins, a domain longer than gossip carries is
//! refused with a clear error, a node with another secret says so and
//! is not ready, and nodes whose only seeds are a DNS name (`--peers
//! dns:NAME:PORT`, asked of a DNS server the test runs) form one cluster,
//! including a node that DNS listed alone at first.
//!
//! Every node listens on free ports (`127.0.0.1:0`) and every test has its
//! own sandbox. "Eventually" conditions are polled with generous
//! deadlines; nothing asserts on how long something took.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::dns::{Answer, DnsServer};
use common::serving::Serving;
use common::Sandbox;
use serde_json::Value;
use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;
use tollgate_proto::v1::{self, tollgate_client::TollgateClient};
use tollgate_replica::wire::{self, Body, ClusterKey, Header};

/// Capacity 30 and one token an hour: nothing refills during a test, so
/// `remaining` only ever goes down, by what the cluster granted.
const CONFIG: &str = r#"
namespaces:
  - name: default
    resources:
      - { name: api, algorithm: token_bucket, capacity: 30, rate: 1/h, replication: counter }
      - { name: q, algorithm: token_bucket, capacity: 30, rate: 1/h }
      - { name: e, algorithm: token_bucket, capacity: 30, rate: 1/h, replication: epoch }
"#;

const CAPACITY: i64 = 30;

/// The cluster's secret (the trailing newline is stripped by the server).
const SECRET: &str = "an end-to-end test secret, long enough\n";

/// How long an "eventually" condition may take: gossip every 300 ms and
/// a down member declared after ~2 s converge in a few seconds; this
/// leaves room for a loaded test machine.
const EVENTUALLY: Duration = Duration::from_secs(20);

/// A sandbox with the config and the secret.
fn sandbox(name: &str) -> Sandbox {
    let dir = Sandbox::new(name);
    dir.write("tollgate.yaml", CONFIG);
    dir.write("secret", SECRET);
    dir
}

/// Starts `n` nodes of cluster `cluster` (ids `n1`, `n2`, ...): the first
/// alone, the others seeded with its gossip address; node `i` (from 0)
/// also gets `extra(i)`. Returns once every node is ready and sees the
/// `n - 1` others alive.
fn start_cluster(
    dir: &Sandbox,
    cluster: &str,
    n: usize,
    extra: impl Fn(usize) -> Vec<String>,
) -> Vec<Serving> {
    let mut nodes: Vec<Serving> = Vec::new();
    for i in 0..n {
        let extra = extra(i);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let seeds: Vec<SocketAddr> = nodes.first().map(Serving::gossip).into_iter().collect();
        let id = format!("n{}", i + 1);
        nodes.push(Serving::start_node(
            dir,
            cluster,
            &id,
            "127.0.0.1:0",
            &seeds,
            &extra,
        ));
    }
    wait_formed(&nodes, n - 1);
    nodes
}

/// Waits until every node is ready and sees `peers` live peers.
fn wait_formed(nodes: &[Serving], peers: usize) {
    eventually("the cluster forms", || {
        for (i, s) in nodes.iter().enumerate() {
            let ready = s.http("GET", "/readyz", None).0;
            let alive = alive(s);
            if ready != 200 || alive != Some(peers as f64) {
                let events: Vec<Vec<String>> = nodes.iter().map(events).collect();
                return Err(format!(
                    "node {}: /readyz {ready}, peers alive {alive:?} (want {peers}); \
                     cluster events per node: {events:#?}",
                    i + 1
                ));
            }
        }
        Ok(())
    });
}

/// What a node logged about the cluster (membership, joining, faults),
/// one line per event, for failure messages.
fn events(s: &Serving) -> Vec<String> {
    s.logs
        .lock()
        .unwrap()
        .iter()
        .filter(|l| {
            l["target"]
                .as_str()
                .is_some_and(|t| t.starts_with("tollgate_replica"))
        })
        .map(|l| {
            let f = &l["fields"];
            let mut line = format!("{} {}", l["level"].as_str().unwrap_or(""), f["message"]);
            for k in ["peer", "blocked", "skew_ms"] {
                if !f[k].is_null() {
                    line.push_str(&format!(" {k}={}", f[k]));
                }
            }
            line
        })
        .collect()
}

fn alive(s: &Serving) -> Option<f64> {
    s.metric("tollgate_cluster_peers_alive")
}

/// Polls `check` until it passes; panics with its last complaint after
/// [`EVENTUALLY`].
fn eventually(what: &str, check: impl FnMut() -> Result<(), String>) {
    tollgate_testing::eventually(what, EVENTUALLY, check);
}

/// One request of `hits` on `resource` for `domain`: the answer, which
/// must be a decision (200 or 429).
fn request(s: &Serving, resource: &str, domain: &str, hits: u64) -> Value {
    let (status, v) = s.json(
        "POST",
        "/v1/request",
        Some(&format!(
            r#"{{"namespace":"default","resource":"{resource}","domain":"{domain}","hits":{hits}}}"#
        )),
    );
    assert!(status == 200 || status == 429, "{status} {v}");
    v
}

/// One hit: whether it was granted.
fn hit(s: &Serving, resource: &str, domain: &str) -> bool {
    let v = request(s, resource, domain, 1);
    let granted = v["granted"].as_u64().unwrap();
    assert_eq!(v["allowed"].as_bool().unwrap(), granted == 1, "{v}");
    granted == 1
}

/// What the node would still grant (a peek: grants nothing).
fn remaining(s: &Serving, resource: &str, domain: &str) -> i64 {
    let v = request(s, resource, domain, 0);
    assert_eq!(v["granted"], 0, "{v}");
    v["remaining"]
        .as_i64()
        .unwrap_or_else(|| panic!("no remaining in {v}"))
}

fn remainings(nodes: &[Serving], resource: &str, domain: &str) -> Vec<i64> {
    nodes
        .iter()
        .map(|s| remaining(s, resource, domain))
        .collect()
}

/// Five grants of `k` on each of three nodes, for both resources, seen
/// by all of them (`CAPACITY - 15` left).
fn spend_five_each_on_k(nodes: &[Serving]) {
    for resource in ["q", "api"] {
        for s in nodes {
            for _ in 0..5 {
                assert!(hit(s, resource, "k"));
            }
        }
        converge(nodes, resource, "k", CAPACITY - 15);
    }
}

/// Waits until every node's peek shows `want`.
fn converge(nodes: &[Serving], resource: &str, domain: &str, want: i64) {
    eventually(
        &format!("every node shows remaining {want} for {resource}/{domain}"),
        || {
            let seen = remainings(nodes, resource, domain);
            if seen.iter().all(|r| *r == want) {
                Ok(())
            } else {
                Err(format!("remaining per node: {seen:?}"))
            }
        },
    );
}

fn dropped(s: &Serving, reason: &str) -> f64 {
    s.metric(&format!(
        "tollgate_gossip_dropped_total{{reason=\"{reason}\"}}"
    ))
    .unwrap_or(0.0)
}

/// Clock probes `s` accepted from its peers. Each peer probes once a
/// second (the probe interval), so the count measures how long the
/// cluster has gossiped, by the nodes' own timers.
fn probes(s: &Serving) -> f64 {
    s.metric("tollgate_gossip_messages_received_total{kind=\"ping\"}")
        .unwrap_or(0.0)
}

/// Waits until every node of `nodes` accepted `n` more clock probes than
/// it had: with `p` peers probing once a second each, at least one peer
/// sent `n / p` of them, so at least `n / p - 1` seconds of gossip
/// (rounds every 300 ms, epoch boundaries every second) went by. A test
/// that asserts nothing changed "later" waits for this instead of
/// sleeping: the nodes prove the time passed.
fn after_probes(nodes: &[Serving], n: f64) {
    let from: Vec<f64> = nodes.iter().map(probes).collect();
    eventually(&format!("every node accepts {n} more clock probes"), || {
        let now: Vec<f64> = nodes.iter().map(probes).collect();
        if now.iter().zip(&from).all(|(now, from)| *now >= from + n) {
            Ok(())
        } else {
            Err(format!("probes per node: {from:?} then {now:?}"))
        }
    });
}

// ---------------------------------------------------------------------
// 1. Convergence
// ---------------------------------------------------------------------

/// Five hits on each of three nodes; every node ends up knowing all
/// fifteen, and stays there (nothing is counted twice as gossip goes on).
fn five_hits_on_each_of_three_nodes_converge(resource: &str) {
    let dir = sandbox(&format!("cluster-converge-{resource}"));
    let nodes = start_cluster(&dir, "t", 3, |_| vec![]);
    for s in &nodes {
        for _ in 0..5 {
            // 15 of 30: no node can have seen the capacity spent.
            assert!(hit(s, resource, "u"));
        }
    }
    converge(&nodes, resource, "u", CAPACITY - 15);
    // Several gossip rounds (and, for epochs, at least two epoch
    // boundaries: 8 probes from 2 peers span 3 s) later the value has not
    // moved: merges are idempotent.
    after_probes(&nodes, 8.0);
    assert_eq!(remainings(&nodes, resource, "u"), vec![CAPACITY - 15; 3]);
    for (i, s) in nodes.iter().enumerate() {
        let merges = s.metric("tollgate_gossip_merges_total").unwrap_or(0.0);
        assert!(merges >= 1.0, "node {} merged nothing", i + 1);
    }
}

#[test]
fn three_nodes_converge_with_the_counter_strategy() {
    five_hits_on_each_of_three_nodes_converge("api");
}

#[test]
fn three_nodes_converge_with_the_queue_strategy() {
    five_hits_on_each_of_three_nodes_converge("q");
}

#[test]
fn three_nodes_converge_with_the_epoch_strategy() {
    five_hits_on_each_of_three_nodes_converge("e");
}

// ---------------------------------------------------------------------
// 2. Precision
// ---------------------------------------------------------------------

/// The pause between two requests of [`spend_round_robin`].
const PAUSE: Duration = Duration::from_millis(50);

/// Sends single hits to `nodes` in turn, one at a time (each answered
/// before the next is sent, `PAUSE` apart), until a whole round is
/// rejected; returns the hits granted.
fn spend_round_robin(nodes: &[Serving], resource: &str, domain: &str) -> i64 {
    let mut granted = 0;
    let mut rejected_in_a_row = 0;
    for i in 0..500 {
        if hit(&nodes[i % nodes.len()], resource, domain) {
            granted += 1;
            rejected_in_a_row = 0;
        } else {
            rejected_in_a_row += 1;
            if rejected_in_a_row == nodes.len() {
                return granted;
            }
        }
        std::thread::sleep(PAUSE);
    }
    panic!("{resource}/{domain}: still granting after 500 requests ({granted} granted)");
}

/// The most a 3-node cluster may grant beyond the capacity in
/// [`spend_round_robin`].
///
/// The bound: requests go one at a time at least `PAUSE` (50 ms) apart,
/// so the cluster sees at most 300 / 50 = 6 hits per gossip interval.
/// A node that grants past the capacity does so because grants of its
/// peers have not reached it yet; each gossip round sends one node's
/// delta to one random neighbour, so a grant reaches a given peer
/// within a few rounds (directly, or forwarded through the third node).
/// We allow three rounds of staleness: 3 × 6 = 18, so at most 48 grants.
/// Measured on a 2-core machine, alone, with the whole file running, and
/// with two busy loops competing for the cores (about 25 runs): `counter`
/// granted 32 to 39 (usually 32 to 34), `queue` 30 to 36. A cluster whose
/// gossip does not work grants 30 on each node, 90.
const SLACK: i64 = 3 * 6;

fn spreading_requests_over_the_nodes_over_admits_by_a_bounded_amount(resource: &str) {
    let dir = sandbox(&format!("cluster-precision-{resource}"));
    let nodes = start_cluster(&dir, "t", 3, |_| vec![]);
    let granted = spend_round_robin(&nodes, resource, "p");
    eprintln!("{resource}: {granted} granted for a capacity of {CAPACITY}");
    // A node rejects only when what it knows is already the capacity,
    // and it never knows more than was granted.
    assert!(granted >= CAPACITY, "{resource}: only {granted} granted");
    assert!(
        granted <= CAPACITY + SLACK,
        "{resource}: {granted} granted for a capacity of {CAPACITY} (slack {SLACK})"
    );
    // Once every node rejected, the limit stays shut on every node: no
    // merge forgets a grant.
    for i in 0..30 {
        let s = &nodes[i % nodes.len()];
        assert!(
            !hit(s, resource, "p"),
            "{resource}: request {i} after the limit was reached was granted by node {}",
            i % nodes.len() + 1
        );
        std::thread::sleep(PAUSE);
    }
    converge(&nodes, resource, "p", 0);
}

#[test]
fn the_counter_strategy_over_admits_by_a_bounded_amount() {
    spreading_requests_over_the_nodes_over_admits_by_a_bounded_amount("api");
}

#[test]
fn the_queue_strategy_over_admits_by_a_bounded_amount() {
    spreading_requests_over_the_nodes_over_admits_by_a_bounded_amount("q");
}

/// The epoch strategy lets every node spend its own bucket within an
/// epoch before the corrections arrive, so its documented bound
/// (`crates/core/src/replicated/epoch.rs`, "The bound") is much looser:
/// over [0, T], at most T/I + N·C + (N − 1)·(E/I + 1) grants, which for
/// N = 3 nodes, C = 30, one token an hour (I = 1 h) and epochs of E = 1 s
/// over a run of well under an hour is 0 + 90 + 2 · (1 + 1/3600), so at
/// most 92: a burst can take every node's bucket. Requests spread one at a
/// time, 50 ms apart, are corrected at each epoch boundary: what the
/// cluster grants beyond the capacity is at most the traffic of one epoch
/// plus one gossip interval (1.3 s at 20 requests a second: 26), so at
/// most 56 are asserted (measured: 33 to 44 over about 25 runs), where a
/// cluster whose gossip does not work grants 90.
#[test]
fn the_epoch_strategy_stays_within_its_documented_bound() {
    let dir = sandbox("cluster-precision-e");
    let nodes = start_cluster(&dir, "t", 3, |_| vec![]);
    let granted = spend_round_robin(&nodes, "e", "p");
    eprintln!("e: {granted} granted for a capacity of {CAPACITY}");
    assert!(granted >= CAPACITY, "only {granted} granted");
    assert!(
        granted <= 3 * CAPACITY + 2,
        "{granted} granted: over the documented bound"
    );
    assert!(
        granted <= CAPACITY + 26,
        "{granted} granted: over one epoch of traffic"
    );
    for i in 0..30 {
        assert!(
            !hit(&nodes[i % nodes.len()], "e", "p"),
            "request {i} granted"
        );
        std::thread::sleep(PAUSE);
    }
}

// ---------------------------------------------------------------------
// 3. Kill and restart
// ---------------------------------------------------------------------

#[test]
fn a_node_killed_with_sigkill_rejoins_with_a_full_state_before_deciding() {
    let dir = sandbox("cluster-restart");
    let mut nodes = start_cluster(&dir, "t", 3, |_| vec![]);
    spend_five_each_on_k(&nodes);
    let seed = nodes[0].gossip();
    let gossip = nodes[1].gossip().to_string();
    nodes[1].child.kill().unwrap();
    nodes[1].child.wait().unwrap();
    // The survivors keep deciding.
    assert_eq!(remaining(&nodes[0], "q", "k"), CAPACITY - 15);
    assert_eq!(remaining(&nodes[2], "api", "k"), CAPACITY - 15);

    // Same id, same gossip address. The join timeout is long, so the node
    // can only become ready by receiving a full state.
    let restarted = Serving::start_node(
        &dir,
        "t",
        "n2",
        &gossip,
        &[seed],
        &["--join-timeout-ms", "600000"],
    );
    let deadline = Instant::now() + EVENTUALLY;
    while restarted.http("GET", "/readyz", None).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the restarted node never became ready; logs: {:?}",
            restarted.logs.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Right when it is ready it knows what was spent before it died.
    assert_eq!(remaining(&restarted, "q", "k"), CAPACITY - 15);
    assert_eq!(remaining(&restarted, "api", "k"), CAPACITY - 15);
    let full = restarted
        .metric("tollgate_gossip_full_states_total{direction=\"received\"}")
        .unwrap_or(0.0);
    assert!(full >= 1.0, "ready without a full state ({full})");
    // Its log is read by another thread and may trail /readyz.
    eventually(
        "the restarted node logs its full state once",
        || match restarted.logged("full state received: deciding").len() {
            1 => Ok(()),
            n => Err(format!("logged {n} times")),
        },
    );
    nodes[1] = restarted;
    wait_formed(&nodes, 2);
    // Its new grants count under its id, above what it granted in its
    // first life, so every node sees them.
    for resource in ["q", "api"] {
        assert!(hit(&nodes[1], resource, "k"));
        converge(&nodes, resource, "k", CAPACITY - 16);
    }
}

#[test]
fn a_joining_node_that_cannot_reach_its_peers_refuses_to_decide_until_it_can() {
    let dir = sandbox("cluster-joining");
    let first = start_cluster(&dir, "t", 1, |_| vec![]).remove(0);
    for _ in 0..3 {
        assert!(hit(&first, "q", "j"));
    }
    // The joiner's gossip with the seed is cut from the start.
    dir.write("faults", format!("{}\n", first.gossip()));
    let joiner = Serving::start_node(
        &dir,
        "t",
        "n2",
        "127.0.0.1:0",
        &[first.gossip()],
        &[
            "--join-timeout-ms",
            "600000",
            "--gossip-fault-file",
            dir.path("faults").to_str().unwrap(),
        ],
    );
    // It keeps refusing for as long as it keeps trying to reach the seed:
    // until several of its datagrams to the seed were cut (not for a
    // while on the wall clock).
    let deadline = Instant::now() + EVENTUALLY;
    while dropped(&joiner, "fault_injected") < 3.0 {
        assert!(
            Instant::now() < deadline,
            "the joiner never tried its seed; its events: {:#?}",
            events(&joiner)
        );
        assert_eq!(joiner.http("GET", "/readyz", None).0, 503);
        let (status, v) = joiner.json(
            "POST",
            "/v1/request",
            Some(r#"{"namespace":"default","resource":"q","domain":"j","hits":1}"#),
        );
        assert_eq!(status, 503, "{v}");
        assert_eq!(v["error"]["reason"], "store_unavailable", "{v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(joiner.http("GET", "/readyz", None).0, 503);
    // The network heals: the joiner gets its full state and decides.
    dir.write("faults", "");
    eventually("the joiner becomes ready", || {
        match joiner.http("GET", "/readyz", None).0 {
            200 => Ok(()),
            s => Err(format!(
                "/readyz {s}; the joiner's events: {:#?}; the seed's events: {:#?}",
                events(&joiner),
                events(&first)
            )),
        }
    });
    assert_eq!(remaining(&joiner, "q", "j"), CAPACITY - 3);
    assert!(
        joiner
            .metric("tollgate_gossip_full_states_total{direction=\"received\"}")
            .unwrap_or(0.0)
            >= 1.0
    );
}

#[test]
fn a_node_started_before_its_seed_joins_the_cluster_once_the_seed_is_up() {
    let dir = sandbox("cluster-seed-later");
    let seed = tollgate_testing::free_udp_addr();
    // Node 2 starts first: its announce to the seed finds nobody, and
    // after the join timeout it decides alone.
    let early = Serving::start_node(&dir, "t", "n2", "127.0.0.1:0", &[seed], &[]);
    eventually("the early node decides alone", || {
        match early.http("GET", "/readyz", None).0 {
            200 => Ok(()),
            s => Err(format!("/readyz {s}")),
        }
    });
    assert_eq!(
        early
            .logged(
                "no member sent a full state: deciding alone (the first of the cluster, or \
                 every member is joining too)"
            )
            .len(),
        1
    );
    // The seed comes up where node 2 looks for it, as a seed that was
    // restarted or started last would.
    let seed = Serving::start_node(&dir, "t", "n1", &seed.to_string(), &[], &[]);
    let nodes = [seed, early];
    wait_formed(&nodes, 1);
    assert!(hit(&nodes[0], "q", "u"));
    assert!(hit(&nodes[1], "q", "u"));
    converge(&nodes, "q", "u", CAPACITY - 2);
}

// ---------------------------------------------------------------------
// 4. Partition
// ---------------------------------------------------------------------

#[test]
fn both_sides_of_a_partition_keep_limiting_and_merge_when_it_heals() {
    let dir = sandbox("cluster-partition");
    let faults: Vec<String> = (1..=3)
        .map(|i| dir.path(&format!("faults-{i}")).display().to_string())
        .collect();
    let nodes = start_cluster(&dir, "t", 3, |i| {
        vec!["--gossip-fault-file".into(), faults[i].clone()]
    });
    let g: Vec<SocketAddr> = nodes.iter().map(Serving::gossip).collect();
    dir.write("faults-1", format!("{}\n", g[2]));
    dir.write("faults-2", format!("{}\n", g[2]));
    dir.write("faults-3", format!("{}\n{}\n", g[0], g[1]));
    // Wait until membership sees the split: {1, 2} and {3}.
    eventually("the partition is seen", || {
        let a: Vec<Option<f64>> = nodes.iter().map(alive).collect();
        if a == [Some(1.0), Some(1.0), Some(0.0)] {
            Ok(())
        } else {
            Err(format!("peers alive per node: {a:?}"))
        }
    });
    let (side, alone) = nodes.split_at(2);
    let alone = &alone[0];
    for resource in ["q", "api"] {
        // Each side limits at the capacity on its own: the pair within the
        // gossip slack, the lone node exactly (it has nobody to wait for).
        let granted = spend_round_robin(side, resource, "p");
        assert!(
            (CAPACITY..=CAPACITY + SLACK).contains(&granted),
            "{resource}: side {{1, 2}} granted {granted}"
        );
        assert_eq!(
            spend_round_robin(std::slice::from_ref(alone), resource, "p"),
            CAPACITY
        );
        // Some use on each side, below the capacity.
        for _ in 0..3 {
            assert!(hit(&side[0], resource, "m"));
            assert!(hit(&side[1], resource, "m"));
        }
        for _ in 0..4 {
            assert!(hit(alone, resource, "m"));
        }
        converge(side, resource, "m", CAPACITY - 6);
        assert_eq!(remaining(alone, resource, "m"), CAPACITY - 4);
    }
    // Nothing crossed the partition.
    assert_eq!(remaining(alone, "q", "m"), CAPACITY - 4);
    assert_eq!(remaining(alone, "api", "m"), CAPACITY - 4);
    for (i, s) in nodes.iter().enumerate() {
        assert!(dropped(s, "fault_injected") >= 1.0, "node {}", i + 1);
    }

    // Heal. Both strategies' merge is the union of what each side granted
    // (the counter keeps each node's count, the queue each element): 6 + 4
    // of "m" are spent, and "p" stays shut.
    for i in 1..=3 {
        dir.write(&format!("faults-{i}"), "");
    }
    wait_formed(&nodes, 2);
    eventually("every node shows the merged state", || {
        let seen: Vec<(&str, &str, Vec<i64>)> =
            [("q", "m"), ("api", "m"), ("q", "p"), ("api", "p")]
                .into_iter()
                .map(|(r, d)| (r, d, remainings(&nodes, r, d)))
                .collect();
        let want = |d: &str| if d == "m" { CAPACITY - 10 } else { 0 };
        if seen.iter().all(|(_, d, v)| v.iter().all(|r| *r == want(d))) {
            Ok(())
        } else {
            let events: Vec<Vec<String>> = nodes.iter().map(events).collect();
            Err(format!(
                "remaining per node, by resource and domain (want m: {}, p: 0): {seen:?}; \
                 cluster events per node: {events:#?}",
                CAPACITY - 10
            ))
        }
    });
}

// ---------------------------------------------------------------------
// 5. Strangers' datagrams
// ---------------------------------------------------------------------

/// A node's identity on the wire: its node id and incarnation, as it
/// logged them when its gossip started (the gossip task may log after the
/// server's "listening" line).
fn identity(s: &Serving) -> (NodeId, u64) {
    eventually("the node logs its gossip identity", || {
        match s.logged("gossip node started").len() {
            0 => Err("no \"gossip node started\" line".into()),
            _ => Ok(()),
        }
    });
    let f = &s.logged("gossip node started")[0]["fields"];
    (
        NodeId(f["node"].as_u64().unwrap()),
        f["incarnation"].as_u64().unwrap(),
    )
}

/// The header of a datagram the test sends `to` a node of `cluster`.
fn header(cluster: &str, seq: u64, (to, to_incarnation): (NodeId, u64)) -> Header {
    Header {
        cluster: wire::cluster_tag(cluster),
        from: NodeId(wire::cluster_tag("the test")),
        incarnation: 1,
        seq,
        sent_at: Nanos::new(1),
        to,
        to_incarnation,
    }
}

#[test]
fn strangers_datagrams_are_dropped_and_counted_and_the_node_keeps_serving() {
    let dir = sandbox("cluster-strangers");
    let node = start_cluster(&dir, "t", 1, |_| vec![]).remove(0);
    let to = node.gossip();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let secret = SECRET.trim_end().as_bytes();
    let ping = Body::Ping { t1: Nanos::new(42) };
    let me = identity(&node);
    assert_eq!(me.0, NodeId(wire::cluster_tag("n1")));

    // An authentic datagram of the cluster for this node, but from an
    // address that is not a member (as an authentic datagram raced to it
    // with a forged source would be): accepted past the checks below,
    // counted, never answered.
    let good = wire::encode(&ClusterKey::new(secret, "t"), &header("t", 1, me), &ping).unwrap();
    socket.send_to(&good, to).unwrap();
    eventually(
        "the authentic ping from a non-member is counted",
        || match dropped(&node, "not_a_member") {
            1.0 => Ok(()),
            n => Err(format!("not_a_member: {n}")),
        },
    );
    let mut buf = [0u8; 2048];

    let sent: Vec<(&str, Vec<u8>)> = vec![
        ("bad_magic", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        // The magic and version, then nothing: cut short.
        (
            "malformed",
            [&wire::MAGIC[..], &[wire::VERSION, 0]].concat(),
        ),
        (
            "version",
            [&wire::MAGIC[..], &[wire::VERSION + 1], &[0; 40]].concat(),
        ),
        (
            "oversized",
            [&wire::MAGIC[..], &[wire::VERSION], &[0; 1997]].concat(),
        ),
        (
            "bad_mac",
            wire::encode(
                &ClusterKey::new(b"not the cluster's secret at all", "t"),
                &header("t", 2, me),
                &ping,
            )
            .unwrap(),
        ),
        (
            "foreign_cluster",
            wire::encode(
                &ClusterKey::new(secret, "other"),
                &header("other", 3, me),
                &ping,
            )
            .unwrap(),
        ),
        // Authentic, but for another node, or for an earlier life of this
        // one: as recorded on its way elsewhere.
        (
            "misaddressed",
            wire::encode(
                &ClusterKey::new(secret, "t"),
                &header("t", 4, (NodeId(wire::cluster_tag("n2")), me.1)),
                &ping,
            )
            .unwrap(),
        ),
        // The first, authentic datagram again.
        ("replayed", good.clone()),
    ];
    for (_, bytes) in &sent {
        socket.send_to(bytes, to).unwrap();
    }
    eventually("each datagram is counted under its reason", || {
        let counts: Vec<(&str, f64)> = sent
            .iter()
            .map(|(reason, _)| (*reason, dropped(&node, reason)))
            .collect();
        if counts.iter().all(|(_, n)| *n == 1.0) {
            Ok(())
        } else {
            Err(format!("{counts:?}"))
        }
    });
    // None of them was answered, the authentic ping included.
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    assert!(
        socket.recv_from(&mut buf).is_err(),
        "a stranger was answered"
    );
    // The node still decides.
    assert!(hit(&node, "q", "u"));
    assert_eq!(node.http("GET", "/readyz", None).0, 200);
}

// ---------------------------------------------------------------------
// 6. A node of another cluster
// ---------------------------------------------------------------------

#[test]
fn a_node_of_another_cluster_is_never_a_member_and_its_grants_stay_its_own() {
    let dir = sandbox("cluster-foreign");
    let nodes = start_cluster(&dir, "t", 3, |_| vec![]);
    let seeds: Vec<SocketAddr> = nodes.iter().map(Serving::gossip).collect();
    for _ in 0..3 {
        assert!(hit(&nodes[0], "q", "u"));
        assert!(hit(&nodes[0], "api", "u"));
    }
    // Same secret, another name.
    let stranger = Serving::start_node(&dir, "other", "s1", "127.0.0.1:0", &seeds, &[]);
    // Nobody answers it: it decides alone after the join timeout.
    eventually("the stranger decides alone", || {
        match stranger.http("GET", "/readyz", None).0 {
            200 => Ok(()),
            s => Err(format!("/readyz {s}")),
        }
    });
    for _ in 0..5 {
        assert!(hit(&stranger, "q", "u"));
        assert!(hit(&stranger, "api", "u"));
    }
    eventually("the cluster dropped the stranger's datagrams", || {
        let n: f64 = nodes.iter().map(|s| dropped(s, "foreign_cluster")).sum();
        if n >= 1.0 {
            Ok(())
        } else {
            Err("no foreign_cluster drop".into())
        }
    });
    for resource in ["q", "api"] {
        converge(&nodes, resource, "u", CAPACITY - 3);
    }
    // Gossip rounds and membership probes go on (3 s of clock probes),
    // and the stranger keeps knocking; nothing changes.
    let knocked: f64 = nodes.iter().map(|s| dropped(s, "foreign_cluster")).sum();
    after_probes(&nodes, 8.0);
    eventually("the cluster drops more of the stranger's datagrams", || {
        let n: f64 = nodes.iter().map(|s| dropped(s, "foreign_cluster")).sum();
        if n > knocked {
            Ok(())
        } else {
            Err(format!("{n} foreign_cluster drops, as before"))
        }
    });
    for resource in ["q", "api"] {
        assert_eq!(remainings(&nodes, resource, "u"), vec![CAPACITY - 3; 3]);
        assert_eq!(remaining(&stranger, resource, "u"), CAPACITY - 5);
    }
    assert_eq!(alive(&stranger), Some(0.0));
    for (i, s) in nodes.iter().enumerate() {
        assert_eq!(alive(s), Some(2.0), "node {}", i + 1);
    }
    assert!(stranger.logged("member up").is_empty());
    for s in &nodes {
        let ups = s.logged("member up");
        let stranger_gossip = stranger.gossip().to_string();
        assert!(
            ups.iter()
                .all(|l| l["fields"]["peer"] != stranger_gossip.as_str()),
            "{ups:?}"
        );
    }
}

// ---------------------------------------------------------------------
// 7. Configs a cluster cannot serve
// ---------------------------------------------------------------------

/// Runs `tollgate serve args...` in `dir`, which must exit by itself (a
/// server that starts instead is killed and the test fails): (exit code,
/// stderr).
fn serve_must_exit(dir: &Sandbox, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("serve")
        .args(args)
        .current_dir(&dir.dir)
        .env_remove("TOLLGATE_CONFIG")
        .env_remove("TOLLGATE_CLUSTER_SECRET")
        .env_remove("TOLLGATE_CLUSTER_SECRET_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + EVENTUALLY;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "tollgate serve {} started instead of refusing: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn configs_and_flags_a_cluster_cannot_serve_are_refused_at_startup() {
    let dir = sandbox("cluster-refused");
    dir.write(
        "concurrency.yaml",
        "namespaces:\n  - name: default\n    resources:\n      - { name: api, algorithm: token_bucket, capacity: 30, rate: 1/h }\n      - { name: sandbox, kind: concurrency, domain_limit: 3 }\n",
    );
    dir.write(
        "fixed.yaml",
        "namespaces:\n  - name: default\n    resources:\n      - { name: hourly, algorithm: fixed_window, limit: 1000, window: 1h, align: epoch }\n",
    );
    dir.write("short", "too short\n");
    let serve = |config: &str, secret: Option<&str>| {
        let mut args = vec![
            "--config",
            config,
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--cluster",
            "t",
            "--node-id",
            "n1",
            "--gossip",
            "127.0.0.1:0",
        ];
        if let Some(secret) = secret {
            args.extend(["--cluster-secret-file", secret]);
        }
        serve_must_exit(&dir, &args)
    };

    let (code, stderr) = serve("concurrency.yaml", Some("secret"));
    assert!(code.is_some_and(|c| c != 0), "{code:?} {stderr}");
    assert!(stderr.contains("sandbox"), "{stderr}");
    assert!(stderr.contains("Redis store"), "{stderr}");

    let (code, stderr) = serve("fixed.yaml", Some("secret"));
    assert!(code.is_some_and(|c| c != 0), "{code:?} {stderr}");
    assert!(stderr.contains("fixed_window"), "{stderr}");
    assert!(stderr.contains("hourly"), "{stderr}");

    let (code, stderr) = serve("tollgate.yaml", None);
    assert!(code.is_some_and(|c| c != 0), "{code:?} {stderr}");
    assert!(stderr.contains("secret"), "{stderr}");

    let (code, stderr) = serve("tollgate.yaml", Some("no-such-file"));
    assert!(code.is_some_and(|c| c != 0), "{code:?} {stderr}");
    assert!(stderr.contains("--cluster-secret-file"), "{stderr}");

    let (code, stderr) = serve("tollgate.yaml", Some("short"));
    assert!(code.is_some_and(|c| c != 0), "{code:?} {stderr}");
    assert!(stderr.contains("at least 16"), "{stderr}");
}

// ---------------------------------------------------------------------
// 8. Clock skew
// ---------------------------------------------------------------------

#[test]
fn a_skewed_clock_makes_both_nodes_unready_while_they_keep_limiting() {
    let dir = sandbox("cluster-skew");
    // Node 2's gossip clock runs two seconds ahead; the allowed skew is
    // the default 250 ms.
    let skewed = start_cluster(&dir, "skewed", 2, |i| {
        if i == 1 {
            vec!["--gossip-clock-offset-ms".into(), "2000".into()]
        } else {
            vec![]
        }
    });
    let healthy = start_cluster(&dir, "healthy", 2, |_| vec![]);
    for (i, s) in skewed.iter().enumerate() {
        eventually(&format!("skewed pair: node {} unready", i + 1), || {
            let ready = s.http("GET", "/readyz", None).0;
            let ok = s.metric("tollgate_cluster_healthy");
            if ready == 503 && ok == Some(0.0) {
                Ok(())
            } else {
                Err(format!("/readyz {ready}, healthy {ok:?}"))
            }
        });
        let skew = s.metric("tollgate_cluster_clock_skew_seconds").unwrap();
        assert!((1.5..2.5).contains(&skew), "node {}: skew {skew}", i + 1);
        // Still limiting.
        assert!(hit(s, "q", "u"));
    }
    converge(&skewed, "q", "u", CAPACITY - 2);
    // The healthy pair measured each other several times and stays ready.
    for (i, s) in healthy.iter().enumerate() {
        eventually(
            &format!("healthy pair: node {} measured its peer", i + 1),
            || match s.metric("tollgate_gossip_messages_received_total{kind=\"pong\"}") {
                Some(n) if n >= 3.0 => Ok(()),
                n => Err(format!("pongs received: {n:?}")),
            },
        );
        assert_eq!(s.http("GET", "/readyz", None).0, 200, "node {}", i + 1);
        assert_eq!(s.metric("tollgate_cluster_healthy"), Some(1.0));
        let skew = s.metric("tollgate_cluster_clock_skew_seconds").unwrap();
        assert!(skew < 0.25, "node {}: skew {skew}", i + 1);
    }
}

// ---------------------------------------------------------------------
// 9. Restarts, domains and secrets (issue 16)
// ---------------------------------------------------------------------

/// Issue 16, item 7: a node restarted with a boot stamp below its last
/// one (here its clock is a minute behind, as after a clock stepped back)
/// was refused by its peers' replay guards forever and ended up deciding
/// alone. Now a peer tells it the incarnation it knows; it rejoins with a
/// larger one, gets its full state (the join timeout is too long for
/// anything else to make it ready), and its grants reach everyone.
#[test]
fn a_node_restarted_with_its_clock_stepped_back_rejoins_with_a_full_state() {
    let dir = sandbox("cluster-stepped-back");
    let mut nodes = start_cluster(&dir, "t", 3, |_| vec![]);
    spend_five_each_on_k(&nodes);
    let before = identity(&nodes[1]).1;
    let gossip = nodes[1].gossip().to_string();
    nodes[1].child.kill().unwrap();
    nodes[1].child.wait().unwrap();
    let restarted = Serving::start_node(
        &dir,
        "t",
        "n2",
        &gossip,
        &[nodes[0].gossip()],
        &[
            "--join-timeout-ms",
            "600000",
            "--gossip-clock-offset-ms",
            "-60000",
            "--max-clock-skew-ms",
            "120000",
        ],
    );
    let stamp = identity(&restarted).1;
    assert!(stamp < before, "boot stamp {stamp}, last life {before}");
    eventually("the restarted node is ready", || {
        match restarted.http("GET", "/readyz", None).0 {
            200 => Ok(()),
            s => Err(format!("/readyz {s}; events: {:#?}", events(&restarted))),
        }
    });
    assert!(
        restarted
            .metric("tollgate_gossip_full_states_total{direction=\"received\"}")
            .unwrap_or(0.0)
            >= 1.0
    );
    let renewed = restarted.logged(
        "a peer knows a later life of this node than its boot stamp (its clock was stepped back, \
         or it restarted within one stamp): rejoining with a larger incarnation",
    );
    assert!(!renewed.is_empty(), "{:#?}", events(&restarted));
    assert!(renewed[0]["fields"]["incarnation"].as_u64().unwrap() > before);
    nodes[1] = restarted;
    wait_formed(&nodes, 2);
    // Its new grants count under its id, above its first life's.
    for resource in ["q", "api"] {
        assert!(hit(&nodes[1], resource, "k"));
        let others = [&nodes[0], &nodes[2]];
        eventually(&format!("{resource}: the others see its grant"), || {
            let seen: Vec<i64> = others.iter().map(|s| remaining(s, resource, "k")).collect();
            if seen == [CAPACITY - 16; 2] {
                Ok(())
            } else {
                Err(format!("remaining on nodes 1 and 3: {seen:?}"))
            }
        });
    }
}

/// Issue 16, item 7: a domain longer than a gossip datagram carries (512
/// bytes) was decided on each node and never gossiped, so each enforced
/// the whole limit alone. Every store now keeps a domain longer than 128
/// bytes as a 33-byte digest (`tollgate_store::Key`), so a domain of any
/// length a request can carry is replicated like any other: a grant for a
/// 10,000-byte domain on one node reaches the other. (The replicated
/// store still refuses, naming the limit, a key its wire cannot carry,
/// should one ever reach it: see `Replica`'s unit tests.)
#[test]
fn a_domain_longer_than_gossip_carries_is_replicated_as_a_digest() {
    let dir = sandbox("cluster-long-domain");
    let nodes = start_cluster(&dir, "t", 2, |_| vec![]);
    for len in [512, 513, 10_000] {
        let domain = "d".repeat(len);
        assert!(hit(&nodes[0], "q", &domain));
        converge(&nodes, "q", &domain, CAPACITY - 1);
    }
    // Over gRPC too.
    let too_long = "e".repeat(10_000);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let grpc = format!("http://{}", nodes[1].grpc);
    let granted = rt.block_on(async {
        let mut client = TollgateClient::connect(grpc).await.unwrap();
        client
            .request(v1::RateRequest {
                namespace: "default".into(),
                resource: "q".into(),
                domain: too_long.clone(),
                hits: Some(1),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .granted
    });
    assert_eq!(granted, 1);
    converge(&nodes, "q", &too_long, CAPACITY - 1);
}

/// Issue 16, item 10: a node started with another secret than its
/// cluster's logged `deciding alone … members=0` and reported itself
/// ready while its peers only counted `bad_mac` drops: a silent split.
/// Here it is seeded with a member that does not know it (so that member
/// never gossips to it unasked). It now logs an error naming the likely
/// cause (never the secret), sets `tollgate_cluster_key_mismatch`, and is
/// not ready (`/readyz` and the Status RPC); the two members are unharmed.
#[test]
fn a_node_with_another_secret_says_so_and_is_not_ready() {
    let dir = sandbox("cluster-wrong-secret");
    let nodes = start_cluster(&dir, "t", 2, |_| vec![]);
    const WRONG: &str = "a different secret, long enough too";
    dir.write("wrong-secret", format!("{WRONG}\n"));
    let odd = {
        let peers = nodes[0].gossip().to_string();
        Serving::start_config(
            &dir,
            std::path::Path::new("tollgate.yaml"),
            &[
                "--cluster",
                "t",
                "--node-id",
                "n3",
                "--gossip",
                "127.0.0.1:0",
                "--cluster-secret-file",
                "wrong-secret",
                "--peers",
                &peers,
            ],
            &[("TOLLGATE_LOG", "info,tollgate_replica=debug")],
        )
    };
    let mismatch = "every datagram from this node's seeds and members fails authentication and \
                    none has authenticated: this node's cluster secret most likely differs from \
                    theirs (compare --cluster-secret-file or TOLLGATE_CLUSTER_SECRET, and \
                    --cluster, on every node); it is cut off from its cluster and reports itself \
                    not ready";
    eventually("the odd node reports the mismatch", || {
        let logged = odd.logged(mismatch).len();
        let metric = odd.metric("tollgate_cluster_key_mismatch");
        if logged == 1 && metric == Some(1.0) {
            Ok(())
        } else {
            Err(format!(
                "error logged {logged} times, metric {metric:?}; events: {:#?}",
                events(&odd)
            ))
        }
    });
    assert_eq!(odd.logged(mismatch)[0]["level"], "ERROR");
    // Past the two join timeouts it decides alone, and stays unready.
    eventually("the odd node decides alone", || {
        match odd.logged("no member sent a full state: deciding alone (the first of the cluster, or every member is joining too)").len() {
            1 => Ok(()),
            n => Err(format!("logged {n} times")),
        }
    });
    assert_eq!(odd.http("GET", "/readyz", None).0, 503);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ready = |s: &Serving| {
        let grpc = format!("http://{}", s.grpc);
        rt.block_on(async {
            let mut client = TollgateClient::connect(grpc).await.unwrap();
            client
                .status(v1::StatusRequest::default())
                .await
                .unwrap()
                .into_inner()
                .ready
        })
    };
    assert!(!ready(&odd));
    assert_eq!(alive(&odd), Some(0.0));
    // The members heard its datagrams fail, and are unharmed.
    assert!(dropped(&nodes[0], "bad_mac") >= 1.0);
    for (i, s) in nodes.iter().enumerate() {
        assert_eq!(s.http("GET", "/readyz", None).0, 200, "node {}", i + 1);
        assert!(ready(s), "node {}", i + 1);
        assert_eq!(s.metric("tollgate_cluster_key_mismatch"), Some(0.0));
        assert_eq!(alive(s), Some(1.0), "node {}", i + 1);
    }
    assert!(!nodes[0]
        .logged(
            "a datagram of this cluster failed authentication: its sender has another cluster \
             secret (or forged it); it cannot be a member"
        )
        .is_empty());
    // No log line of any node carries either secret.
    for s in nodes.iter().chain([&odd]) {
        for line in s.logs.lock().unwrap().iter() {
            let text = line.to_string();
            assert!(
                !text.contains(WRONG) && !text.contains(SECRET.trim_end()),
                "a secret in the logs: {text}"
            );
        }
    }
}

// ---------------------------------------------------------------------
// 10. Peers found by DNS (issue 19)
// ---------------------------------------------------------------------

/// What a node logs when its peers' name lists no address.
const DNS_LISTS_NOTHING: &str = "DNS lists no address for the peers' name: asking again every \
                                 refresh (a node listed before its peers joins them when they \
                                 are listed)";

/// Three loopback addresses: DNS gives addresses and `dns:NAME:PORT` one
/// port for all of them, so nodes on one machine listen on different
/// loopback addresses at the same port, as pods do on their own IPs.
const LOOPBACKS: [&str; 3] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"];

/// A UDP port free on every address of `ips` (bound on each, then
/// released).
fn port_free_on(ips: &[&str]) -> u16 {
    for _ in 0..100 {
        let first = UdpSocket::bind((ips[0], 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        if ips[1..]
            .iter()
            .all(|ip| UdpSocket::bind((*ip, port)).is_ok())
        {
            return port;
        }
    }
    panic!("no UDP port free on all of {ips:?}");
}

/// Nodes n2 and n3 on the second and third loopback addresses, formed into
/// a cluster under the DNS name `pair.test`, which lists only them.
fn dns_pair(dir: &Sandbox, dns: &DnsServer, port: u16) -> Vec<Serving> {
    dns.set_addrs("pair.test", &LOOPBACKS[1..]);
    let pair: Vec<Serving> = (1..3)
        .map(|i| {
            dns_node(
                dir,
                dns,
                &format!("n{}", i + 1),
                LOOPBACKS[i],
                port,
                "pair.test",
            )
        })
        .collect();
    wait_formed(&pair, 1);
    pair
}

/// Starts node `id` with gossip on `ip:port`, whose only seeds are the
/// addresses DNS lists for `name` (asked of `dns`, every 200 ms).
fn dns_node(dir: &Sandbox, dns: &DnsServer, id: &str, ip: &str, port: u16, name: &str) -> Serving {
    let peers = format!("dns:{name}:{port}");
    let server = dns.addr.to_string();
    Serving::start_node(
        dir,
        "t",
        id,
        &format!("{ip}:{port}"),
        &[],
        &[
            "--peers",
            &peers,
            "--dns-server",
            &server,
            "--peers-refresh-ms",
            "200",
        ],
    )
}

/// The gossip addresses `s` logged a "member up" for.
fn members_up(s: &Serving) -> Vec<String> {
    let mut up: Vec<String> = s
        .logged("member up")
        .iter()
        .filter_map(|l| l["fields"]["peer"].as_str().map(str::to_owned))
        .collect();
    up.sort();
    up.dedup();
    up
}

#[test]
fn three_nodes_that_find_each_other_by_dns_form_one_cluster_and_share_limits() {
    let dir = sandbox("cluster-dns");
    let dns = DnsServer::start();
    let port = port_free_on(&LOOPBACKS);
    dns.set_addrs("peers.test", &LOOPBACKS);
    let nodes: Vec<Serving> = LOOPBACKS
        .iter()
        .enumerate()
        .map(|(i, ip)| dns_node(&dir, &dns, &format!("n{}", i + 1), ip, port, "peers.test"))
        .collect();
    wait_formed(&nodes, 2);
    for (i, s) in nodes.iter().enumerate() {
        let others: Vec<String> = LOOPBACKS
            .iter()
            .filter(|ip| **ip != LOOPBACKS[i])
            .map(|ip| format!("{ip}:{port}"))
            .collect();
        // The log is read from the node's stderr by another thread, so it
        // may trail the metric that `wait_formed` saw.
        eventually("each node logs its two peers up", || match members_up(s) {
            up if up == others => Ok(()),
            up => Err(format!("node {}'s members: {up:?}", i + 1)),
        });
        // Its own address is not a seed.
        assert_eq!(s.metric("tollgate_cluster_seeds"), Some(2.0));
    }
    assert!(dns.questions("peers.test") >= 3);
    // One cluster: what each grants, every node counts.
    for s in &nodes {
        for _ in 0..5 {
            assert!(hit(s, "q", "u"));
        }
    }
    converge(&nodes, "q", "u", CAPACITY - 15);
}

#[test]
fn a_node_alone_in_dns_is_ready_and_joins_its_peers_once_dns_lists_them() {
    let dir = sandbox("cluster-dns-alone");
    let dns = DnsServer::start();
    let port = port_free_on(&LOOPBACKS);
    // Two nodes already form a cluster under a name of their own.
    let mut pair = dns_pair(&dir, &dns, port);
    // The third node's name lists only itself: after its join timeout it
    // decides alone, the first of its cluster, and is ready.
    dns.set_addrs("all.test", &LOOPBACKS[..1]);
    let alone = dns_node(&dir, &dns, "n1", LOOPBACKS[0], port, "all.test");
    eventually("the node alone in DNS is ready", || {
        match alone.http("GET", "/readyz", None).0 {
            200 => Ok(()),
            s => Err(format!("/readyz {s}; events: {:#?}", events(&alone))),
        }
    });
    assert_eq!(alive(&alone), Some(0.0));
    assert_eq!(alone.metric("tollgate_cluster_seeds"), Some(0.0));
    for _ in 0..3 {
        assert!(hit(&alone, "q", "u"));
    }
    for _ in 0..2 {
        assert!(hit(&pair[0], "q", "u"));
    }
    // The name lists nothing for a while: said once, however often it is
    // asked again (an A and an AAAA question per refresh), and the node
    // keeps serving.
    dns.set("all.test", Answer::Empty);
    let asked = dns.questions("all.test");
    eventually("the node asks DNS again, three times", || {
        let now = dns.questions("all.test");
        if now >= asked + 6 {
            Ok(())
        } else {
            Err(format!("{} questions since", now - asked))
        }
    });
    assert_eq!(alone.logged(DNS_LISTS_NOTHING).len(), 1);
    assert_eq!(alone.http("GET", "/readyz", None).0, 200);
    // Now DNS lists everyone: the node joins the pair, and every node
    // ends with what both sides granted.
    dns.set_addrs("all.test", &LOOPBACKS);
    let nodes = [alone, pair.remove(0), pair.remove(0)];
    wait_formed(&nodes, 2);
    converge(&nodes, "q", "u", CAPACITY - 5);
}

/// Review of issue 19: DNS was asked once at start and then only every
/// refresh (10 s by default), so a node whose first answer listed only
/// itself (pods of a StatefulSet starting together) decided alone at its
/// join timeout, before it could see its peers. While joining it now asks
/// every sixth of the join timeout: here the refresh (60 s) is far past
/// the join timeout (30 s), so only the faster asking lets the node see
/// its peers, listed just after its first question, and join them rather
/// than decide alone.
#[test]
fn a_joining_node_asks_dns_again_before_its_join_timeout() {
    let dir = sandbox("cluster-dns-joining");
    let dns = DnsServer::start();
    let port = port_free_on(&LOOPBACKS);
    let pair = dns_pair(&dir, &dns, port);
    dns.set_addrs("all.test", &LOOPBACKS[..1]);
    let peers = format!("dns:all.test:{port}");
    let server = dns.addr.to_string();
    let joining = Serving::start_node(
        &dir,
        "t",
        "n1",
        &format!("{}:{port}", LOOPBACKS[0]),
        &[],
        &[
            "--peers",
            &peers,
            "--dns-server",
            &server,
            "--peers-refresh-ms",
            "60000",
            "--join-timeout-ms",
            "30000",
        ],
    );
    // Its first answer lists only itself; only then are the others listed.
    eventually("the joining node has its first answer", || {
        match joining.logged("peers found in DNS").len() {
            0 => Err(format!("events: {:#?}", events(&joining))),
            _ => Ok(()),
        }
    });
    dns.set_addrs("all.test", &LOOPBACKS);
    eventually("the joining node is ready", || {
        match joining.http("GET", "/readyz", None).0 {
            200 => Ok(()),
            s => Err(format!("/readyz {s}; events: {:#?}", events(&joining))),
        }
    });
    assert!(
        joining
            .logged(
                "no member sent a full state: deciding alone (the first of the cluster, \
                 or every member is joining too)"
            )
            .is_empty(),
        "it decided alone: {:#?}",
        events(&joining)
    );
    // A full state from one peer makes the node ready; that each peer is
    // up is logged as foca hears from it, which may come just after.
    eventually(
        "the joining node sees both peers up",
        || match members_up(&joining).len() {
            2 => Ok(()),
            n => Err(format!("{n} members up; events: {:#?}", events(&joining))),
        },
    );
    drop(pair);
}

#[test]
fn a_bad_dns_peer_is_refused_at_startup_naming_the_expected_form() {
    let dir = sandbox("cluster-dns-refused");
    for (peers, want) in [
        ("dns:peers.test", "`dns:peers.test` has no port"),
        ("dns:peers.test:http", "`http` is not a port"),
        ("peers.test:7946", "`peers.test:7946` is not an address"),
    ] {
        let (code, stderr) = serve_must_exit(
            &dir,
            &[
                "--config",
                "tollgate.yaml",
                "--cluster",
                "t",
                "--node-id",
                "n1",
                "--cluster-secret-file",
                "secret",
                "--peers",
                peers,
            ],
        );
        assert!(code.is_some_and(|c| c != 0), "{code:?} {stderr}");
        assert!(stderr.contains(want), "{peers}: {stderr}");
        assert!(stderr.contains("dns:NAME:PORT"), "{peers}: {stderr}");
    }
}
