//! A deterministic, in-memory network of [`Node`]s on simulated time: the
//! same node code the real cluster runs, with datagrams delivered after a
//! fixed latency, links that can be cut, and every random choice seeded.
//! Tests use it to check the protocol without sockets or wall-clock time;
//! the simulator (`tollgate sim`) builds on it. It can also play an
//! attacker on the network: record the datagrams delivered
//! ([`SimNet::record`]) and play any bytes to a node from any address
//! ([`SimNet::inject`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;

use crate::node::{Node, NodeConfig, NodeTimer, Output};
use crate::replica::{Replica, ReplicaOptions};
use crate::wire::ClusterKey;

/// The secret every simulated node shares.
pub const SECRET: &[u8] = b"simulated cluster secret";

/// The name of the simulated cluster.
pub const CLUSTER: &str = "sim";

/// The key every simulated node encrypts and authenticates with (from
/// [`SECRET`] and [`CLUSTER`]), for tests that read or forge datagrams.
pub fn key() -> ClusterKey {
    ClusterKey::new(SECRET, CLUSTER)
}

/// A datagram the network delivered, as an eavesdropper records it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The sending node.
    pub from: usize,
    /// The receiving node.
    pub to: usize,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

enum Event {
    Datagram {
        to: usize,
        from: SocketAddr,
        bytes: Vec<u8>,
        /// Played by the test as an attacker: no link cut stops it.
        forged: bool,
    },
    Timer {
        node: usize,
        timer: NodeTimer,
    },
    Wake {
        node: usize,
    },
}

/// A simulated cluster; see the [module docs](self).
pub struct SimNet {
    nodes: Vec<Option<Node>>,
    replicas: Vec<Arc<Replica>>,
    addrs: Vec<SocketAddr>,
    queue: BinaryHeap<Reverse<(Nanos, u64)>>,
    events: HashMap<u64, Event>,
    next: u64,
    now: Nanos,
    latency: Nanos,
    /// Largest latency: each datagram takes a uniform draw in
    /// `[latency, latency_max]`.
    latency_max: Nanos,
    /// Probability that a datagram is lost.
    loss: f64,
    rng: rand::rngs::SmallRng,
    cut: HashSet<(usize, usize)>,
    /// Each node's clock offset from simulated time, in nanoseconds.
    offsets: Vec<i64>,
    anti_entropy: Nanos,
    /// Datagrams delivered, when recording.
    recorded: Option<Vec<Recorded>>,
    /// Datagrams sent to addresses that are no node's.
    strays: Vec<(usize, SocketAddr)>,
    /// Each node's secret, when not [`SECRET`] (used at its next boot).
    secrets: HashMap<usize, Vec<u8>>,
    /// Each node's seeds as discovery last gave them, when they come from
    /// discovery ([`SimNet::discovering`]); otherwise every node is
    /// seeded with every other.
    discovered: Option<Vec<Vec<SocketAddr>>>,
    /// Datagrams delivered.
    pub delivered: u64,
    /// Bytes delivered.
    pub bytes: u64,
}

/// The address of simulated node `i`.
pub fn addr_of(i: usize) -> SocketAddr {
    SocketAddr::from((
        Ipv4Addr::LOCALHOST,
        10_000 + u16::try_from(i).unwrap_or(u16::MAX),
    ))
}

impl SimNet {
    /// `n` nodes of cluster `sim`, every one seeded with every other, time
    /// starting at `start`, datagrams taking `latency`. `options` builds
    /// each node's replica options from its id.
    pub fn new(
        n: usize,
        start: Nanos,
        latency: Nanos,
        seed: u64,
        options: impl Fn(NodeId) -> ReplicaOptions,
    ) -> SimNet {
        SimNet::with_anti_entropy(n, start, latency, seed, Nanos::from_secs(30), options)
    }

    /// As [`SimNet::new`], with nodes comparing digests with a random
    /// member every `anti_entropy` (zero: never; the server's default is
    /// 30 s).
    pub fn with_anti_entropy(
        n: usize,
        start: Nanos,
        latency: Nanos,
        seed: u64,
        anti_entropy: Nanos,
        options: impl Fn(NodeId) -> ReplicaOptions,
    ) -> SimNet {
        let mut net = SimNet::unbooted(n, start, latency, seed, anti_entropy);
        net.boot_all(seed, options);
        net
    }

    /// `n` nodes' network with no node booted yet.
    fn unbooted(n: usize, start: Nanos, latency: Nanos, seed: u64, anti_entropy: Nanos) -> SimNet {
        SimNet {
            nodes: Vec::new(),
            replicas: Vec::new(),
            addrs: (0..n).map(addr_of).collect(),
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            next: 0,
            now: start,
            latency,
            latency_max: latency,
            loss: 0.0,
            rng: rand::SeedableRng::seed_from_u64(seed ^ 0x5151_5151),
            cut: HashSet::new(),
            offsets: vec![0; n],
            anti_entropy,
            recorded: None,
            strays: Vec::new(),
            secrets: HashMap::new(),
            discovered: None,
            delivered: 0,
            bytes: 0,
        }
    }

    /// `n` nodes whose seeds come from discovery, as DNS would give them:
    /// node `i` starts with `seeds(i)` (nodes by index; a node's own
    /// address is ignored), and [`SimNet::set_seeds`] changes them later.
    /// Otherwise as [`SimNet::new`].
    pub fn discovering(
        n: usize,
        start: Nanos,
        latency: Nanos,
        seed: u64,
        seeds: impl Fn(usize) -> Vec<usize>,
        options: impl Fn(NodeId) -> ReplicaOptions,
    ) -> SimNet {
        let mut net = SimNet::unbooted(n, start, latency, seed, Nanos::from_secs(30));
        net.discovered = Some(
            (0..n)
                .map(|i| seeds(i).into_iter().map(addr_of).collect())
                .collect(),
        );
        net.boot_all(seed, options);
        net
    }

    fn boot_all(&mut self, seed: u64, options: impl Fn(NodeId) -> ReplicaOptions) {
        for i in 0..self.addrs.len() {
            let replica = Arc::new(Replica::new(options(NodeId(i as u64 + 1))));
            self.replicas.push(replica);
            self.nodes.push(None);
            let stamp = self.now.as_u64();
            self.boot(i, seed.wrapping_add(i as u64), stamp);
        }
    }

    /// Gives node `i` the seeds `seeds` (nodes by index), as a DNS refresh
    /// would ([`Node::set_seeds`]); they are also its seeds at its next
    /// restart.
    pub fn set_seeds(&mut self, i: usize, seeds: &[usize]) {
        self.set_seed_addrs(i, seeds.iter().copied().map(addr_of).collect());
    }

    /// Gives node `i` the seeds `addrs`, as a DNS refresh would; see
    /// [`SimNet::set_seeds`].
    pub fn set_seed_addrs(&mut self, i: usize, addrs: Vec<SocketAddr>) {
        if let Some(discovered) = self.discovered.as_mut() {
            discovered[i] = addrs.clone();
        }
        let clock = self.clock(i);
        if let Some(node) = self.nodes[i].as_mut() {
            let out = node.set_seeds(addrs, clock);
            self.apply(i, out);
        }
    }

    fn config(&self, i: usize, incarnation: u64) -> NodeConfig {
        NodeConfig {
            cluster: CLUSTER.into(),
            node: NodeId(i as u64 + 1),
            addr: self.addrs[i],
            seeds: match &self.discovered {
                Some(seeds) => seeds[i].clone(),
                None => self.addrs.clone(),
            },
            seeds_discovered: self.discovered.is_some(),
            key: self
                .secrets
                .get(&i)
                .map_or_else(key, |secret| ClusterKey::new(secret, CLUSTER)),
            incarnation,
            max_clock_skew: Nanos::from_millis(250),
            join_timeout: Nanos::from_secs(3),
            probe_interval: Nanos::from_secs(1),
            // As the server sizes it: the seeds it starts with and itself.
            expected_size: u32::try_from(match &self.discovered {
                Some(seeds) => seeds[i].iter().filter(|a| **a != self.addrs[i]).count() + 1,
                None => self.addrs.len(),
            })
            .unwrap_or(u32::MAX),
            anti_entropy: self.anti_entropy,
        }
    }

    /// Node `i`'s clock: simulated time plus its offset.
    pub fn clock(&self, i: usize) -> Nanos {
        let t = i128::from(self.now.as_u64()) + i128::from(self.offsets[i]);
        Nanos::new(u64::try_from(t.max(0)).unwrap_or(u64::MAX))
    }

    /// Sets node `i`'s clock offset (a node whose clock is wrong).
    pub fn set_clock_offset(&mut self, i: usize, offset_ns: i64) {
        self.offsets[i] = offset_ns;
    }

    fn boot(&mut self, i: usize, seed: u64, incarnation: u64) {
        let config = self.config(i, incarnation);
        let mut node = Node::new(config, Arc::clone(&self.replicas[i]), seed);
        let out = node.start(self.clock(i));
        self.nodes[i] = Some(node);
        self.apply(i, out);
    }

    /// Sets the network: each datagram takes a latency drawn uniformly in
    /// `[min, max]` and is lost with probability `loss` (seeded).
    pub fn set_network(&mut self, min: Nanos, max: Nanos, loss: f64) {
        self.latency = min;
        self.latency_max = max.max(min);
        self.loss = loss.clamp(0.0, 1.0);
    }

    /// How many nodes the network has.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether the network has no node.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// Node `i`'s replica.
    pub fn replica(&self, i: usize) -> &Arc<Replica> {
        &self.replicas[i]
    }

    /// Node `i`, if running.
    pub fn node(&self, i: usize) -> Option<&Node> {
        self.nodes[i].as_ref()
    }

    /// Simulated now.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Stops node `i` at once, as a crash would: nothing more is sent or
    /// received, its state is lost.
    pub fn crash(&mut self, i: usize) {
        self.nodes[i] = None;
    }

    /// Restarts a crashed node `i` with an empty replica (`options` for its
    /// replica) and a new incarnation.
    pub fn restart(&mut self, i: usize, options: ReplicaOptions, seed: u64) {
        let stamp = self.now.as_u64();
        self.restart_with_incarnation(i, options, seed, stamp);
    }

    /// [`SimNet::restart`] with the boot stamp `incarnation`, as a node
    /// whose clock was stepped back (or that restarted within one stamp)
    /// would boot.
    pub fn restart_with_incarnation(
        &mut self,
        i: usize,
        options: ReplicaOptions,
        seed: u64,
        incarnation: u64,
    ) {
        self.replicas[i] = Arc::new(Replica::new(options));
        self.boot(i, seed, incarnation);
    }

    /// Gives node `i` another secret from its next (re)start on: a node
    /// misconfigured with a secret its cluster does not share.
    pub fn set_secret(&mut self, i: usize, secret: &[u8]) {
        self.secrets.insert(i, secret.to_vec());
    }

    /// The datagrams nodes sent to addresses that are no node's (a forged
    /// source's), as (sender, address), in order.
    pub fn strays(&self) -> &[(usize, SocketAddr)] {
        &self.strays
    }

    /// Starts (or stops) recording every datagram delivered; starting
    /// forgets what was recorded before.
    pub fn record(&mut self, on: bool) {
        self.recorded = on.then(Vec::new);
    }

    /// The datagrams delivered since recording started, in order.
    pub fn recorded(&self) -> &[Recorded] {
        self.recorded.as_deref().unwrap_or_default()
    }

    /// Delivers `bytes` to node `to` now, as if sent from `from`: an
    /// attacker replaying a recorded datagram, or forging its source. No
    /// cut link stops it.
    pub fn inject(&mut self, to: usize, from: SocketAddr, bytes: Vec<u8>) {
        let now = self.now;
        self.schedule(
            now,
            Event::Datagram {
                to,
                from,
                bytes,
                forged: true,
            },
        );
    }

    /// Cuts (or heals, `cut == false`) the link between `a` and `b`, both
    /// ways.
    pub fn set_cut(&mut self, a: usize, b: usize, cut: bool) {
        for pair in [(a, b), (b, a)] {
            if cut {
                self.cut.insert(pair);
            } else {
                self.cut.remove(&pair);
            }
        }
    }

    fn schedule(&mut self, at: Nanos, event: Event) {
        let id = self.next;
        self.next += 1;
        self.queue.push(Reverse((at, id)));
        self.events.insert(id, event);
    }

    fn apply(&mut self, i: usize, out: Output) {
        for (after, timer) in out.timers {
            let at = self.now.saturating_add(Nanos::new(
                u64::try_from(after.as_nanos()).unwrap_or(u64::MAX),
            ));
            self.schedule(at, Event::Timer { node: i, timer });
        }
        for (to, bytes) in out.sends {
            let Some(j) = self.addrs.iter().position(|a| *a == to) else {
                self.strays.push((i, to));
                continue;
            };
            if self.cut.contains(&(i, j)) {
                continue;
            }
            if self.loss > 0.0 && rand::Rng::random_bool(&mut self.rng, self.loss.min(1.0)) {
                continue;
            }
            let latency = if self.latency_max > self.latency {
                Nanos::new(rand::Rng::random_range(
                    &mut self.rng,
                    self.latency.as_u64()..=self.latency_max.as_u64(),
                ))
            } else {
                self.latency
            };
            let at = self.now.saturating_add(latency);
            let from = self.addrs[i];
            self.schedule(
                at,
                Event::Datagram {
                    to: j,
                    from,
                    bytes,
                    forged: false,
                },
            );
        }
    }

    /// Asks node `i` to send what its replica queued urgently (the real
    /// runtime does it when the replica wakes it).
    pub fn wake(&mut self, i: usize) {
        let now = self.now;
        self.schedule(now, Event::Wake { node: i });
    }

    /// Decides `plan` on node `i` now, as a request would, and lets the
    /// node send what became urgent (eager pushes).
    pub fn decide(
        &mut self,
        i: usize,
        plan: &tollgate_store::Plan,
        request: tollgate_core::Hits,
    ) -> Result<tollgate_core::PlanDecision, tollgate_store::StoreError> {
        self.decide_in(i, plan, request, tollgate_core::Mode::Try)
    }

    /// [`SimNet::decide`] in `mode`: usage told after the fact (a report
    /// or a refund) as well as a check.
    pub fn decide_in(
        &mut self,
        i: usize,
        plan: &tollgate_store::Plan,
        request: tollgate_core::Hits,
        mode: tollgate_core::Mode,
    ) -> Result<tollgate_core::PlanDecision, tollgate_store::StoreError> {
        let d = self.replicas[i].decide_now(plan, self.clock(i), request, mode);
        self.wake(i);
        d
    }

    /// Runs every event up to `until` (inclusive), then sets the time to it.
    pub fn run_until(&mut self, until: Nanos) {
        while let Some(Reverse((at, id))) = self.queue.peek().copied() {
            if at > until {
                break;
            }
            self.queue.pop();
            self.now = at;
            let Some(event) = self.events.remove(&id) else {
                continue;
            };
            match event {
                Event::Datagram {
                    to,
                    from,
                    bytes,
                    forged,
                } => {
                    let sender = self.addrs.iter().position(|a| *a == from);
                    if !forged && sender.is_some_and(|s| self.cut.contains(&(s, to))) {
                        continue;
                    }
                    self.delivered += 1;
                    self.bytes += bytes.len() as u64;
                    if let (Some(log), Some(from), false) = (&mut self.recorded, sender, forged) {
                        log.push(Recorded {
                            from,
                            to,
                            bytes: bytes.clone(),
                        });
                    }
                    let clock = self.clock(to);
                    if let Some(node) = self.nodes[to].as_mut() {
                        let out = node.handle_datagram(from, &bytes, clock);
                        self.apply(to, out);
                    }
                }
                Event::Timer { node, timer } => {
                    let clock = self.clock(node);
                    if let Some(n) = self.nodes[node].as_mut() {
                        let out = n.handle_timer(timer, clock);
                        self.apply(node, out);
                    }
                }
                Event::Wake { node } => {
                    let clock = self.clock(node);
                    if let Some(n) = self.nodes[node].as_mut() {
                        let out = n.flush_urgent(clock);
                        self.apply(node, out);
                    }
                }
            }
        }
        self.now = until;
    }

    /// Runs for `span` of simulated time.
    pub fn run_for(&mut self, span: Nanos) {
        let until = self.now.saturating_add(span);
        self.run_until(until);
    }
}
