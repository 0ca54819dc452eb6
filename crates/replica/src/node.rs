//! The sans-IO gossip node: membership (foca's SWIM), gossip rounds,
//! full-state transfer to joining nodes, and clock checks.
//!
//! The node owns no socket and reads no clock. A runtime feeds it what
//! arrived ([`Node::handle_datagram`]), the timers it asked for
//! ([`Node::handle_timer`]) and wake-ups for urgent payloads
//! ([`Node::flush_urgent`]), each with the current time; the node answers
//! with an [`Output`]: datagrams to send and timers to set. The tokio
//! runtime ([`crate::runtime`]) drives it on a UDP socket; the simulator
//! drives the same code over a simulated network and simulated time.
//!
//! # Protocol
//!
//! - **Membership**: foca's SWIM messages travel inside authenticated
//!   datagrams ([`Body::Membership`]). A peer is known by its gossip
//!   address; a restarted peer comes back with a larger boot stamp, wins
//!   the address, and is a new member to the others.
//! - **Joining** (§5.5): the node decides nothing ([`Replica::is_synced`]
//!   is false) until it has a full state. When it learns of a live peer it
//!   asks it ([`Body::FullRequest`]); the peer streams its whole state as
//!   [`Body::Full`] chunks. When the last chunk arrives (every chunk
//!   counted) the node decides. If no peer answers within the join
//!   timeout, the node starts alone: it is the first of its cluster.
//! - **Gossip**: one timer per gossip class; each round sends one
//!   neighbour the class's part of its delta ([`Replica::take_round`]).
//!   Urgent payloads (eager pushes, epoch pull answers) go out as soon as
//!   the runtime wakes the node.
//! - **Clocks**: every probe interval the node pings each member with its
//!   time and computes the offset NTP-style from the answer
//!   (`((t2 − t1) + (t3 − t4)) / 2`). When the largest offset exceeds the
//!   configured skew, the node reports itself unhealthy (`/readyz` 503)
//!   and keeps limiting.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, OwnedNotification, PostcardCodec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tollgate_core::replicated::strategy::Payload;
use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;
use tollgate_store::Key;

use crate::metrics as m;
use crate::replica::{Class, Replica, Round};
use crate::wire::{self, Batch, Body, ClusterKey, Header, Message, ReplayGuard};

/// A member of the cluster as foca knows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Peer {
    /// Its gossip address: how members tell each other apart.
    pub addr: SocketAddr,
    /// Its node id.
    pub node: u64,
    /// Its boot stamp: a restarted node has a larger one and wins its
    /// address back.
    pub bump: u64,
}

impl foca::Identity for Peer {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Peer> {
        Some(Peer {
            bump: self.bump.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Peer) -> bool {
        self.bump > adversary.bump
    }
}

/// How a node runs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The cluster's name: datagrams of another cluster are dropped.
    pub cluster: String,
    /// This node's id, the same across restarts.
    pub node: NodeId,
    /// The gossip address peers reach this node at.
    pub addr: SocketAddr,
    /// Seed peers to announce to.
    pub seeds: Vec<SocketAddr>,
    /// The cluster's key: encrypts and authenticates every datagram.
    pub key: ClusterKey,
    /// This run's boot stamp (wall-clock nanoseconds at start): larger
    /// than any earlier run's.
    pub incarnation: u64,
    /// The largest clock offset to a peer that keeps the node healthy.
    pub max_clock_skew: Nanos,
    /// How long a joining node waits for a full state before it starts
    /// alone.
    pub join_timeout: Nanos,
    /// How often clocks are probed.
    pub probe_interval: Nanos,
    /// Expected members, for foca's suspicion and dissemination settings.
    pub expected_size: u32,
    /// How often a full state goes to one random member, to repair what
    /// lost datagrams dropped; zero turns it off.
    pub anti_entropy: Nanos,
}

/// Timers a node asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Timer {
    /// One of foca's.
    Membership(foca::Timer<Peer>),
    /// A gossip round of a class.
    Gossip(Class),
    /// Clock probes.
    Probe,
    /// The join deadline.
    Join,
    /// Periodic duties: new gossip classes, metrics.
    Housekeeping,
    /// A full state to a random member.
    AntiEntropy,
}

/// What a node has sent, by kind, for the simulator's bandwidth measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Datagrams of gossip (deltas, full states, pull answers, eager
    /// pushes).
    pub gossip_datagrams: u64,
    /// Their bytes.
    pub gossip_bytes: u64,
    /// Datagrams of membership and clock probes.
    pub other_datagrams: u64,
    /// Their bytes.
    pub other_bytes: u64,
}

/// What a node asks its runtime to do.
#[derive(Debug, Default)]
pub struct Output {
    /// Datagrams to send.
    pub sends: Vec<(SocketAddr, Vec<u8>)>,
    /// Timers to set.
    pub timers: Vec<(Duration, Timer)>,
}

/// Largest foca packet: what fits a datagram with our header and tag.
const FOCA_PACKET: usize = wire::MAX_MEMBERSHIP;

/// How often periodic duties run.
const HOUSEKEEPING: Duration = Duration::from_secs(1);

/// Join timeouts a node waits through, asking a member each time, before
/// it decides alone.
const JOIN_ATTEMPTS: u32 = 2;

/// Full-state transfers tracked at once while joining.
const MAX_STREAMS: usize = 16;

/// Least time between two full states sent to one member on request.
const FULL_REQUEST_EVERY: Nanos = Nanos::from_secs(2);

/// The node; see the [module docs](self).
pub struct Node {
    config: NodeConfig,
    replica: Arc<Replica>,
    foca: Foca<Peer, PostcardCodec, SmallRng, NoCustomBroadcast>,
    runtime: AccumulatingRuntime<Peer>,
    tag: u64,
    seq: u64,
    replay: ReplayGuard,
    rng: SmallRng,
    offsets: HashMap<SocketAddr, i128>,
    members: HashMap<SocketAddr, Peer>,
    asked: Option<SocketAddr>,
    /// Full-state chunks received, per (peer, stream).
    streams: HashMap<(SocketAddr, u64), u32>,
    next_stream: u64,
    classes: HashSet<Class>,
    leaving: bool,
    join_attempts: u32,
    last_asked: Option<SocketAddr>,
    /// The last ping's time sent to each member.
    pings: HashMap<SocketAddr, Nanos>,
    /// When each member was last sent a full state on request.
    answered: HashMap<SocketAddr, Nanos>,
    sent: Sent,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node", &self.config.node)
            .field("addr", &self.config.addr)
            .field("members", &self.members.len())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// A node over `replica`; `seed` seeds its random choices (the
    /// simulator passes its own, the runtime a random one).
    pub fn new(config: NodeConfig, replica: Arc<Replica>, seed: u64) -> Node {
        let me = Peer {
            addr: config.addr,
            node: config.node.0,
            bump: config.incarnation,
        };
        let size = NonZeroU32::new(config.expected_size.max(1)).unwrap_or(NonZeroU32::MIN);
        let mut foca_config = foca::Config::new_lan(size);
        foca_config.max_packet_size = NonZeroUsize::new(FOCA_PACKET).unwrap_or(NonZeroUsize::MIN);
        foca_config.probe_period = Duration::from_millis(500);
        foca_config.probe_rtt = Duration::from_millis(200);
        foca_config.suspect_to_down_after = Duration::from_secs(2);
        foca_config.periodic_announce = Some(foca::PeriodicParams {
            frequency: Duration::from_secs(2),
            num_members: NonZeroUsize::MIN,
        });
        foca_config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: Duration::from_secs(3),
            num_members: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
        });
        let foca = Foca::new(
            me,
            foca_config,
            SmallRng::seed_from_u64(seed),
            PostcardCodec,
        );
        Node {
            tag: wire::cluster_tag(&config.cluster),
            config,
            replica,
            foca,
            runtime: AccumulatingRuntime::new(),
            seq: 0,
            replay: ReplayGuard::new(4096),
            rng: SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            offsets: HashMap::new(),
            members: HashMap::new(),
            asked: None,
            streams: HashMap::new(),
            next_stream: 0,
            classes: HashSet::new(),
            leaving: false,
            join_attempts: 0,
            last_asked: None,
            pings: HashMap::new(),
            answered: HashMap::new(),
            sent: Sent::default(),
        }
    }

    /// The replica this node gossips.
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// What this node has sent so far, by kind.
    pub fn sent(&self) -> Sent {
        self.sent
    }

    /// Live members (other than this node).
    pub fn members(&self) -> impl Iterator<Item = &Peer> {
        self.members.values()
    }

    /// Starts the node: announces it to the seeds and sets its timers. A
    /// node without seeds is the first of its cluster and decides at once.
    pub fn start(&mut self, now: Nanos) -> Output {
        let mut out = Output::default();
        if self.announce_to_seeds() == 0 {
            self.replica.set_synced(true);
        }
        self.drain_membership(now, &mut out);
        out.timers
            .push((nanos(self.config.join_timeout), Timer::Join));
        out.timers
            .push((nanos(self.config.probe_interval), Timer::Probe));
        out.timers.push((Duration::ZERO, Timer::Housekeeping));
        if !self.config.anti_entropy.is_zero() {
            out.timers
                .push((nanos(self.config.anti_entropy), Timer::AntiEntropy));
        }
        out
    }

    /// Announces this node to every seed that is not a live member, and
    /// answers how many there were. Called at start and every second
    /// after: an announce lost because a seed was not up yet, or the
    /// network was cut, is sent again, so a node that started alone joins
    /// its cluster as soon as a seed answers.
    fn announce_to_seeds(&mut self) -> usize {
        let seeds: Vec<SocketAddr> = self
            .config
            .seeds
            .iter()
            .copied()
            .filter(|s| *s != self.config.addr && !self.members.contains_key(s))
            .collect();
        for &seed in &seeds {
            // The seed's id is unknown: announce to a placeholder with its
            // address, which loses to the real identity when it answers.
            let placeholder = Peer {
                addr: seed,
                node: 0,
                bump: 0,
            };
            if let Err(e) = self.foca.announce(placeholder, &mut self.runtime) {
                tracing::debug!(%seed, error = %e, "cannot announce to a seed");
            }
        }
        seeds.len()
    }

    /// Leaves the cluster gracefully (peers stop waiting for this node).
    pub fn leave(&mut self, now: Nanos) -> Output {
        let mut out = Output::default();
        self.leaving = true;
        let _ = self.foca.leave_cluster(&mut self.runtime);
        self.drain_membership(now, &mut out);
        out
    }

    /// Handles a datagram from `from`: authenticated, checked for replay,
    /// then acted on. Anything wrong is dropped and counted; nothing here
    /// can fail the node.
    pub fn handle_datagram(&mut self, from: SocketAddr, data: &[u8], now: Nanos) -> Output {
        let mut out = Output::default();
        metrics::counter!(m::BYTES_RECEIVED).increment(data.len() as u64);
        let message = match wire::decode(&self.config.key, self.tag, data) {
            Ok(message) => message,
            Err(e) => {
                metrics::counter!(m::DROPPED, "reason" => e.reason()).increment(1);
                tracing::debug!(%from, error = %e, "gossip datagram dropped");
                return out;
            }
        };
        let Message { header, body } = message;
        if !self
            .replay
            .accept(header.from, header.incarnation, header.seq)
        {
            metrics::counter!(m::DROPPED, "reason" => "replayed").increment(1);
            return out;
        }
        metrics::counter!(m::MESSAGES_RECEIVED, "kind" => kind(&body)).increment(1);
        match body {
            Body::Membership(bytes) => {
                if let Err(e) = self.foca.handle_data(&bytes, &mut self.runtime) {
                    metrics::counter!(m::DROPPED, "reason" => "membership").increment(1);
                    tracing::debug!(%from, error = %e, "membership message refused");
                }
                self.drain_membership(now, &mut out);
            }
            Body::Delta { items } => {
                self.replica.absorb(from, items, now);
            }
            Body::FullRequest => self.answer_full_request(from, now, &mut out),
            Body::Full {
                stream,
                index,
                last,
                items,
            } => {
                self.replica.absorb(from, items, now);
                if self.replica.is_synced() {
                    // A member sent its state after a partition, or as
                    // anti-entropy: merged, nothing to count.
                    return out;
                }
                if self.streams.len() >= MAX_STREAMS && !self.streams.contains_key(&(from, stream))
                {
                    self.streams.clear();
                }
                let seen = self.streams.entry((from, stream)).or_insert(0);
                *seen = seen.saturating_add(1);
                if last {
                    let complete = *seen == index.saturating_add(1);
                    self.streams.remove(&(from, stream));
                    metrics::counter!(m::FULL_STATES, "direction" => "received").increment(1);
                    if complete {
                        tracing::info!(peer = %from, "full state received: deciding");
                        self.replica.set_synced(true);
                        self.streams.clear();
                    }
                    // Otherwise a chunk was lost: the join timer asks
                    // again.
                }
            }
            // Only members are answered: a datagram replayed with a
            // forged source gets nothing sent to a stranger.
            Body::Ping { t1 } if self.members.contains_key(&from) => {
                let t = now;
                self.send(from, Body::Pong { t1, t2: t, t3: t }, now, &mut out);
            }
            Body::Ping { .. } => {
                metrics::counter!(m::DROPPED, "reason" => "not_a_member").increment(1);
            }
            // Only the answer to the last ping sent to that member counts,
            // so a replayed pong cannot fake an offset.
            Body::Pong { t1, t2, t3 } if self.pings.get(&from) == Some(&t1) => {
                self.pings.remove(&from);
                let t = |n: Nanos| i128::from(n.as_u64());
                let offset = ((t(t2) - t(t1)) + (t(t3) - t(now))) / 2;
                self.offsets.insert(from, offset);
                self.check_clocks();
            }
            Body::Pong { .. } => {
                metrics::counter!(m::DROPPED, "reason" => "unexpected_pong").increment(1);
            }
        }
        out
    }

    /// Handles a timer the node asked for.
    pub fn handle_timer(&mut self, timer: Timer, now: Nanos) -> Output {
        let mut out = Output::default();
        match timer {
            Timer::Membership(t) => {
                if let Err(e) = self.foca.handle_timer(t, &mut self.runtime) {
                    tracing::debug!(error = %e, "membership timer failed");
                }
                self.drain_membership(now, &mut out);
            }
            Timer::Gossip(class) => {
                self.gossip_round(class, now, &mut out);
                if self.replica.classes().contains(&class) {
                    out.timers
                        .push((nanos(class.interval), Timer::Gossip(class)));
                } else {
                    self.classes.remove(&class);
                }
            }
            Timer::Probe => {
                let members: Vec<SocketAddr> = self.members.keys().copied().collect();
                for peer in members {
                    self.pings.insert(peer, now);
                    self.send(peer, Body::Ping { t1: now }, now, &mut out);
                }
                self.offsets.retain(|a, _| self.members.contains_key(a));
                self.pings.retain(|a, _| self.members.contains_key(a));
                self.check_clocks();
                out.timers
                    .push((nanos(self.config.probe_interval), Timer::Probe));
            }
            Timer::Join => {
                if self.replica.is_synced() {
                    return out;
                }
                self.join_attempts = self.join_attempts.saturating_add(1);
                if !self.members.is_empty() && self.join_attempts < JOIN_ATTEMPTS {
                    // A member is there but no full state came (a lost
                    // datagram, or it was joining too): ask the next one.
                    tracing::info!(
                        attempt = self.join_attempts,
                        "no full state yet: asking again"
                    );
                    self.asked = None;
                    self.ask_full(now, &mut out);
                    out.timers
                        .push((nanos(self.config.join_timeout), Timer::Join));
                } else {
                    tracing::warn!(
                        members = self.members.len(),
                        "no member sent a full state: deciding alone (the first of the cluster, \
                         or every member is joining too)"
                    );
                    self.replica.set_synced(true);
                    self.streams.clear();
                }
            }
            Timer::AntiEntropy => {
                // Deltas are sent once; a datagram lost on a link no other
                // node forwards over would be lost for good. A full state
                // to one member now and then repairs any such gap.
                if self.replica.is_synced() && !self.members.is_empty() {
                    let mut members: Vec<SocketAddr> = self.members.keys().copied().collect();
                    members.sort_unstable();
                    let peer = members[self.rng.random_range(0..members.len())];
                    self.send_full(peer, now, &mut out);
                }
                out.timers
                    .push((nanos(self.config.anti_entropy), Timer::AntiEntropy));
            }
            Timer::Housekeeping => {
                self.announce_to_seeds();
                self.drain_membership(now, &mut out);
                for class in self.replica.classes() {
                    if self.classes.insert(class) {
                        out.timers
                            .push((nanos(class.interval), Timer::Gossip(class)));
                    }
                }
                metrics::gauge!(m::STATE_KEYS).set(self.replica.keys() as f64);
                metrics::gauge!(m::STATE_SIZE).set(self.replica.state_size() as f64);
                metrics::gauge!(m::PEERS_ALIVE).set(self.members.len() as f64);
                metrics::gauge!(m::CONVERGENCE_LAG)
                    .set(self.replica.convergence_lag(now).as_secs_f64());
                out.timers.push((HOUSEKEEPING, Timer::Housekeeping));
            }
        }
        out
    }

    /// Sends the urgent payloads the replica queued (eager pushes, pull
    /// answers).
    pub fn flush_urgent(&mut self, now: Nanos) -> Output {
        let mut out = Output::default();
        for (peer, items) in self.replica.take_urgent() {
            self.send_items(peer, items, None, now, &mut out);
        }
        out
    }

    fn gossip_round(&mut self, class: Class, now: Nanos, out: &mut Output) {
        for round in self.replica.take_round(class, now, &mut self.rng) {
            match round {
                Round::Delta(peer, items) => {
                    metrics::gauge!(m::DELTA_SIZE).set(items.len() as f64);
                    self.send_items(peer, items, None, now, out);
                }
                Round::Resync(peer) => self.send_full(peer, now, out),
            }
        }
    }

    fn send_full(&mut self, peer: SocketAddr, now: Nanos, out: &mut Output) {
        let items = self.replica.full_state(now);
        let stream = self.next_stream;
        self.next_stream = self.next_stream.wrapping_add(1);
        metrics::counter!(m::FULL_STATES, "direction" => "sent").increment(1);
        self.send_items(peer, items, Some(stream), now, out);
    }

    /// A member asks for this node's whole state. Answered only when this
    /// node is synced (a joining node's state would let the asker start
    /// from nothing), only to members (a replayed request with a forged
    /// source gets nothing sent to a stranger), and at most once per
    /// member every two seconds (a full state is large).
    fn answer_full_request(&mut self, from: SocketAddr, now: Nanos, out: &mut Output) {
        let reason = if !self.replica.is_synced() {
            Some("not_synced")
        } else if !self.members.contains_key(&from) {
            Some("not_a_member")
        } else if self
            .answered
            .get(&from)
            .is_some_and(|at| now.saturating_sub(*at) < FULL_REQUEST_EVERY)
        {
            Some("full_request_throttled")
        } else {
            None
        };
        if let Some(reason) = reason {
            metrics::counter!(m::DROPPED, "reason" => reason).increment(1);
            return;
        }
        self.answered.insert(from, now);
        self.answered.retain(|a, _| self.members.contains_key(a));
        self.send_full(from, now, out);
    }

    fn ask_full(&mut self, now: Nanos, out: &mut Output) {
        if self.replica.is_synced() || self.asked.is_some() {
            return;
        }
        // The member after the one asked last, in address order, so a
        // second attempt asks someone else.
        let mut members: Vec<SocketAddr> = self.members.keys().copied().collect();
        members.sort_unstable();
        let Some(&first) = members.first() else {
            return;
        };
        let peer = self
            .last_asked
            .and_then(|last| members.iter().copied().find(|m| *m > last))
            .unwrap_or(first);
        self.last_asked = Some(peer);
        self.asked = Some(peer);
        tracing::info!(%peer, "asking a peer for a full state");
        self.send(peer, Body::FullRequest, now, out);
    }

    /// Acts on what foca asked for: sends, timers, membership changes.
    fn drain_membership(&mut self, now: Nanos, out: &mut Output) {
        while let Some(n) = self.runtime.to_notify() {
            match n {
                OwnedNotification::MemberUp(p) => self.member_up(p, now, out),
                OwnedNotification::MemberDown(p) if self.members.get(&p.addr) == Some(&p) => {
                    tracing::info!(peer = %p.addr, node = p.node, "member down");
                    self.members.remove(&p.addr);
                    self.replica.remove_peer(p.addr);
                    if self.asked == Some(p.addr) {
                        self.asked = None;
                    }
                }
                // A restarted member: its old state is gone, so its delta
                // starts over (it fetches a full state itself).
                OwnedNotification::Rename(before, after)
                    if self.members.remove(&before.addr).is_some() =>
                {
                    self.replica.remove_peer(before.addr);
                    self.member_up(after, now, out);
                }
                OwnedNotification::Defunct if !self.leaving => {
                    tracing::warn!("declared down by the cluster: rejoining");
                    let _ = self.foca.reuse_down_identity();
                }
                _ => {}
            }
        }
        while let Some((peer, data)) = self.runtime.to_send() {
            self.send(peer.addr, Body::Membership(data.to_vec()), now, out);
        }
        while let Some((after, timer)) = self.runtime.to_schedule() {
            out.timers.push((after, Timer::Membership(timer)));
        }
        self.ask_full(now, out);
    }

    fn member_up(&mut self, peer: Peer, now: Nanos, out: &mut Output) {
        if peer.node == self.config.node.0 && peer.addr != self.config.addr {
            tracing::error!(
                peer = %peer.addr,
                node = peer.node,
                "another member uses this node's id: their grants would be counted as ours"
            );
            metrics::counter!(m::DROPPED, "reason" => "conflicting_node_id").increment(1);
        }
        tracing::info!(peer = %peer.addr, node = peer.node, "member up");
        let addr = peer.addr;
        self.replica.add_peer(addr);
        self.members.insert(addr, peer);
        if self.replica.is_synced() {
            // A member that was away (a partition, a restart, a node that
            // started alone) missed what was granted meanwhile, and its
            // delta starts empty: it gets everything. Both sides of a
            // healed partition do this, so each merges the other's grants.
            self.send_full(addr, now, out);
        }
        self.ask_full(now, out);
    }

    /// Unhealthy when the clocks of most members are beyond the bound
    /// from this node's: then this node's clock is the odd one out. (Of
    /// two nodes, neither can tell whose clock is wrong: both report it.)
    fn check_clocks(&mut self) {
        let worst = self.worst_skew().as_u64();
        metrics::gauge!(m::SKEW).set(worst as f64 / 1e9);
        let bound = u128::from(self.config.max_clock_skew.as_u64());
        let off = self
            .offsets
            .values()
            .filter(|o| o.unsigned_abs() > bound)
            .count();
        let healthy = off * 2 <= self.offsets.len();
        if healthy != self.replica.is_healthy() {
            if healthy {
                tracing::info!("clock back within the allowed skew of the peers");
            } else {
                tracing::warn!(
                    skew_ms = worst / 1_000_000,
                    max_ms = self.config.max_clock_skew.as_u64() / 1_000_000,
                    "clock skew to a peer beyond the allowed bound: reporting unhealthy"
                );
            }
        }
        metrics::gauge!(m::HEALTHY).set(if healthy { 1.0 } else { 0.0 });
        self.replica.set_healthy(healthy);
    }

    /// The largest clock offset measured to a peer.
    pub fn worst_skew(&self) -> Nanos {
        let worst = self
            .offsets
            .values()
            .map(|o| o.unsigned_abs())
            .max()
            .unwrap_or(0);
        Nanos::new(u64::try_from(worst).unwrap_or(u64::MAX))
    }

    fn header(&mut self, now: Nanos) -> Header {
        self.seq = self.seq.wrapping_add(1);
        Header {
            cluster: self.tag,
            from: self.config.node,
            incarnation: self.config.incarnation,
            seq: self.seq,
            sent_at: now,
        }
    }

    fn send(&mut self, to: SocketAddr, body: Body, now: Nanos, out: &mut Output) {
        let header = self.header(now);
        let kind = kind(&body);
        match wire::encode(&self.config.key, &header, &body) {
            Ok(bytes) => {
                metrics::counter!(m::MESSAGES_SENT, "kind" => kind).increment(1);
                metrics::counter!(m::BYTES_SENT).increment(bytes.len() as u64);
                self.sent.other_datagrams += 1;
                self.sent.other_bytes += bytes.len() as u64;
                out.sends.push((to, bytes));
            }
            Err(e) => {
                metrics::counter!(m::DROPPED, "reason" => e.reason()).increment(1);
                tracing::warn!(%to, error = %e, "cannot encode a gossip message");
            }
        }
    }

    /// Sends `items` to `to` as deltas, or as full-state chunks of
    /// `stream`, in as many datagrams as they need.
    fn send_items(
        &mut self,
        to: SocketAddr,
        items: Vec<(Key, Payload)>,
        stream: Option<u64>,
        now: Nanos,
        out: &mut Output,
    ) {
        if items.is_empty() && stream.is_none() {
            return;
        }
        let template = self.header(now);
        let mut seq = self.seq;
        let batch = match stream {
            Some(stream) => Batch::Full { stream },
            None => Batch::Delta,
        };
        let packed = wire::encode_items(&self.config.key, &template, &mut seq, batch, &items);
        self.seq = seq;
        if packed.dropped > 0 {
            metrics::counter!(m::DROPPED, "reason" => "unencodable")
                .increment(packed.dropped as u64);
        }
        let kind = if stream.is_some() { "full" } else { "delta" };
        for bytes in packed.datagrams {
            metrics::counter!(m::MESSAGES_SENT, "kind" => kind).increment(1);
            metrics::counter!(m::BYTES_SENT).increment(bytes.len() as u64);
            self.sent.gossip_datagrams += 1;
            self.sent.gossip_bytes += bytes.len() as u64;
            out.sends.push((to, bytes));
        }
    }
}

fn kind(body: &Body) -> &'static str {
    match body {
        Body::Membership(_) => "membership",
        Body::Delta { .. } => "delta",
        Body::FullRequest => "full_request",
        Body::Full { .. } => "full",
        Body::Ping { .. } => "ping",
        Body::Pong { .. } => "pong",
    }
}

fn nanos(n: Nanos) -> Duration {
    Duration::from_nanos(n.as_u64())
}
