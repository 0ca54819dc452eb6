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
//!   address; a restarted peer comes back with a larger incarnation, wins
//!   the address, and is a new member to the others.
//! - **Incarnations** start at the boot stamp (the wall clock at start),
//!   but are not trusted to grow with it: a peer that receives an
//!   authentic datagram of an earlier life of its sender than one it has
//!   seen answers [`Body::Outdated`] with the incarnation it knows, and a
//!   node that learns so of itself takes the next one and announces itself
//!   again. A node restarted with its clock stepped back, or within one
//!   stamp, thus rejoins at once, while its peers' replay guards keep
//!   refusing every datagram of its earlier lives.
//! - **Recipients**: every datagram names the member it is for (node id
//!   and incarnation, [`Header::to`]); a datagram for another member, or
//!   for an earlier life of this node, is dropped (`misaddressed`).
//!   Answers (pongs, full states, epoch pull answers) go only to members,
//!   at the address membership knows them by.
//! - **A different secret**: a node that, for [`AUTH_GRACE`], hears
//!   nothing it can authenticate and only datagrams that fail
//!   authentication from its seeds or members logs an error naming the
//!   likely cause and reports itself not ready
//!   ([`Replica::key_mismatch`]). A node answers an announce-to-a-seed it
//!   cannot authenticate with a small [`Body::Unauthenticated`] (at most
//!   once a second per address, never larger than what it answers), so a
//!   node with another secret hears from its seed even when the seed does
//!   not know it.
//! - **Joining** (§5.5): the node decides nothing ([`Replica::is_synced`]
//!   is false) until it has a full state. When it learns of a live peer it
//!   asks it ([`Body::FullRequest`]); the peer streams its whole state as
//!   [`Body::Full`] chunks. When the last chunk arrives (every chunk
//!   counted) the node decides. If no peer answers within the join
//!   timeout, the node starts alone: it is the first of its cluster.
//! - **Seeds** are given at start, or found by DNS and replaced while the
//!   node runs ([`Node::set_seeds`]). Seeds that are not members are
//!   announced to every second. A node with no seeds decides at once, as
//!   the first of its cluster, unless its seeds come from discovery: an
//!   empty DNS answer may only mean the peers are not listed yet, so it
//!   waits one join timeout before deciding alone. Peers listed later are
//!   joined as a healed partition is: full states both ways.
//! - **Gossip**: one timer per gossip class; each round sends the class's
//!   part of the deltas [`crate::deltas::Dissemination`] says
//!   ([`Replica::take_round`]): every neighbour's (origin), or one
//!   neighbour's (epidemic). Urgent payloads (eager pushes, epoch pull
//!   answers) go out as soon as the runtime wakes the node.
//! - **Relays** (origin dissemination): every member answers the clock
//!   probes, so one not heard from in three probe intervals is out of
//!   reach; a node with such a gap asks every member it hears to relay
//!   what they learn of the nodes it does not hear ([`Body::Graft`],
//!   repeated every three probe intervals while the gap lasts, and renewed
//!   while relays bring news); a member asked anew answers with a digest,
//!   so what it learnt before is pulled too.
//! - **Anti-entropy**: every `anti_entropy`, a [`Body::Digest`] of the
//!   settled state ([`crate::digest`]) to one random member heard from
//!   lately; the receiver answers only where its own digest differs, with
//!   its keys of those buckets ([`Body::Repair`]) and a [`Body::Pull`] for
//!   the sender's. Repair that brings settled news from a third node
//!   grafts the peer that had it.
//! - **Clocks**: every probe interval the node pings each member with its
//!   time and computes the offset NTP-style from the answer
//!   (`((t2 − t1) + (t3 − t4)) / 2`). When the largest offset exceeds the
//!   configured skew, the node reports itself unhealthy (`/readyz` 503)
//!   and keeps limiting.
//!
//! # Modules
//!
//! This file holds the node's state, its configuration and its timers;
//! each protocol above has a file of its own, each an `impl Node` block:
//! `receive` (the checks every datagram passes, and dispatch), `trust`
//! (failed authentication, answers to strangers, earlier lives),
//! `membership` (foca and the seeds), `join` (full-state transfer),
//! `gossip` (rounds and relays), `anti_entropy`, `clocks`, and `send`
//! (headers and the way out). `throttle` is the bounded once-per-interval
//! rule the answers to strangers use.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use foca::{AccumulatingRuntime, Foca, NoCustomBroadcast, PostcardCodec};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;

use crate::deltas::Class;
use crate::metrics as m;
use crate::replica::Replica;
#[cfg(doc)]
use crate::wire::Header;
use crate::wire::{self, Batch, Body, ClusterKey, ReplayGuard};

mod anti_entropy;
mod clocks;
mod gossip;
mod join;
mod membership;
mod receive;
mod send;
mod throttle;
mod trust;

use membership::{foca_config, normalize_seeds};
use throttle::Throttle;

/// A member of the cluster as foca knows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Peer {
    /// Its gossip address: how members tell each other apart.
    pub addr: SocketAddr,
    /// Its node id.
    pub node: u64,
    /// Its incarnation: a restarted node has a larger one and wins its
    /// address back (see the [module docs](self)).
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
    /// Seed peers to announce to (this node's own address is ignored).
    /// [`Node::set_seeds`] replaces them while the node runs.
    pub seeds: Vec<SocketAddr>,
    /// Whether the seeds come from discovery (DNS) and may arrive after
    /// start ([`Node::set_seeds`]). A node without seeds is then not the
    /// first of its cluster at once: its peers may only not be listed
    /// yet, so it waits one join timeout for them, as a node whose seeds
    /// are silent does, before it decides alone.
    pub seeds_discovered: bool,
    /// The cluster's key: encrypts and authenticates every datagram.
    pub key: ClusterKey,
    /// This run's boot stamp (wall-clock nanoseconds at start), the first
    /// incarnation. Usually larger than any earlier run's; when it is not
    /// (a clock stepped back), peers say so and the node takes a larger
    /// one.
    pub incarnation: u64,
    /// The largest clock offset to a peer that keeps the node healthy.
    pub max_clock_skew: Nanos,
    /// How long a joining node waits for a full state before it starts
    /// alone.
    pub join_timeout: Nanos,
    /// How often clocks are probed.
    pub probe_interval: Nanos,
    /// Expected members, for foca's dissemination settings (how many
    /// times a membership update is piggybacked). Grows when
    /// [`Node::set_seeds`] lists more seeds: a DNS name lists the whole
    /// cluster.
    pub expected_size: u32,
    /// How often a digest goes to one random member it can reach, to find
    /// and repair what lost datagrams dropped; zero turns it off.
    pub anti_entropy: Nanos,
}

/// Timers a node asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeTimer {
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
    /// An anti-entropy digest to a random member it can reach.
    AntiEntropy,
}

/// What a node has sent, by kind, for the simulator's bandwidth measure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Datagrams of state gossip: deltas, eager pushes, epoch pull
    /// answers, full states, and anti-entropy digests, pulls and repairs,
    /// and relay requests.
    pub gossip_datagrams: u64,
    /// Their bytes.
    pub gossip_bytes: u64,
    /// Updates they carried: queue elements, counter and epoch entries
    /// (a measure of how many times each update crosses the network).
    pub gossip_updates: u64,
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
    pub timers: Vec<(Duration, NodeTimer)>,
}

/// Largest foca packet: what fits a datagram with our header and tag.
const FOCA_PACKET: usize = wire::MAX_MEMBERSHIP;

/// How often periodic duties run.
const HOUSEKEEPING: Duration = Duration::from_secs(1);

/// Join timeouts a node waits through, asking a member each time, before
/// it decides alone.
const JOIN_ATTEMPTS: u32 = 2;

/// Most seeds a node keeps: a DNS answer listing more is cut to the
/// lowest addresses (announcing to each seed that is not a member every
/// second must stay cheap).
pub const MAX_SEEDS: usize = 1024;

/// Full-state transfers tracked at once while joining.
const MAX_STREAMS: usize = 16;

/// Least time between two full states sent to one member on request.
const FULL_REQUEST_EVERY: Nanos = Nanos::from_secs(2);

/// Least time between two anti-entropy answers (to a digest or a pull) to
/// one member: each costs a pass over every key.
const REPAIR_EVERY: Nanos = Nanos::SECOND;

/// How long a peer relays to this node after this node grafted it; a
/// relay that keeps bringing news is renewed when half of it is left.
pub const RELAY_FOR: Nanos = Nanos::from_secs(60);

/// How long a node hears nothing it can authenticate, and only datagrams
/// that fail authentication from its seeds or members, before it reports
/// a key mismatch. Members probe each other every 500 ms, so a member
/// never goes this long without an authentic datagram.
pub const AUTH_GRACE: Nanos = Nanos::from_secs(3);

/// Least time between two answers to one address (or sender) that did
/// not prove it is a member: [`Body::Outdated`] and
/// [`Body::Unauthenticated`].
const ANSWER_EVERY: Nanos = Nanos::SECOND;

/// Least time between two warnings about datagrams from one address that
/// fail authentication.
const WARN_EVERY: Nanos = Nanos::from_secs(60);

/// The node; see the [module docs](self).
pub struct Node {
    config: NodeConfig,
    replica: Arc<Replica>,
    foca: Foca<Peer, PostcardCodec, SmallRng, NoCustomBroadcast>,
    runtime: AccumulatingRuntime<Peer>,
    tag: u64,
    /// The cluster size foca is configured for (see
    /// [`NodeConfig::expected_size`]).
    cluster_size: u32,
    /// This node's incarnation: the boot stamp, or larger once a peer
    /// said it knew a later life (or foca renewed a downed identity). The
    /// bump of foca's identity, and the `incarnation` of every header.
    incarnation: u64,
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
    /// When each member last sent an authentic datagram: anti-entropy
    /// picks among members heard lately, which a partial mesh (a ring)
    /// can reach.
    heard: HashMap<SocketAddr, Nanos>,
    /// When each member's digest or pull was last answered.
    repaired: HashMap<SocketAddr, Nanos>,
    /// When each member was last asked to relay ([`Body::Graft`]), and
    /// the nodes whose news it was told this node hears itself.
    grafted: HashMap<SocketAddr, (Nanos, Vec<NodeId>)>,
    sent: Sent,
    /// Drops by reason, as counted in the metric (for tests).
    dropped: HashMap<&'static str, u64>,
    /// When the node started.
    started_at: Nanos,
    /// When a datagram last passed every check.
    last_authentic: Option<Nanos>,
    /// When a datagram from a seed or a member last failed authentication.
    last_unauthenticated: Option<Nanos>,
    /// [`Body::Outdated`] answers, per sender.
    outdated_answers: Throttle<NodeId>,
    /// [`Body::Unauthenticated`] answers, per address.
    unauthenticated_answers: Throttle<SocketAddr>,
    /// Warnings about datagrams that fail authentication, per address.
    unauthenticated_warnings: Throttle<SocketAddr>,
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
        let cluster_size = config.expected_size.max(1);
        let foca_config = foca_config(cluster_size);
        let foca = Foca::new(
            me,
            foca_config,
            SmallRng::seed_from_u64(seed),
            PostcardCodec,
        );
        Node {
            tag: wire::cluster_tag(&config.cluster),
            cluster_size,
            incarnation: config.incarnation,
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
            heard: HashMap::new(),
            repaired: HashMap::new(),
            grafted: HashMap::new(),
            sent: Sent::default(),
            dropped: HashMap::new(),
            started_at: Nanos::ZERO,
            last_authentic: None,
            last_unauthenticated: None,
            outdated_answers: Throttle::new(ANSWER_EVERY),
            unauthenticated_answers: Throttle::new(ANSWER_EVERY),
            unauthenticated_warnings: Throttle::new(WARN_EVERY),
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

    /// This node's current incarnation (see [`NodeConfig::incarnation`]).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Datagrams or payloads this node dropped for `reason` (a label of
    /// [`m::DROPPED`]).
    pub fn dropped(&self, reason: &str) -> u64 {
        self.dropped.get(reason).copied().unwrap_or(0)
    }

    /// Counts `n` drops for `reason`, in the metric and for
    /// [`Node::dropped`].
    fn count_drop(&mut self, reason: &'static str, n: u64) {
        metrics::counter!(m::DROPPED, "reason" => reason).increment(n);
        *self.dropped.entry(reason).or_insert(0) += n;
    }

    /// Starts the node: announces it to the seeds and sets its timers. A
    /// node without seeds is the first of its cluster and decides at once,
    /// unless its seeds come from discovery
    /// ([`NodeConfig::seeds_discovered`]): it then waits for them until
    /// its join timeout.
    pub fn start(&mut self, now: Nanos) -> Output {
        let mut out = Output::default();
        self.started_at = now;
        tracing::info!(
            node = self.config.node.0,
            incarnation = self.incarnation,
            addr = %self.config.addr,
            "gossip node started"
        );
        metrics::gauge!(m::KEY_MISMATCH).set(0.0);
        self.config.seeds =
            normalize_seeds(std::mem::take(&mut self.config.seeds), self.config.addr);
        metrics::gauge!(m::SEEDS).set(self.config.seeds.len() as f64);
        // Without seeds the node is the first of its cluster and decides
        // at once, unless seeds come from discovery: then an empty list
        // may only mean its peers are not listed yet, and the join timer
        // decides (alone, if nobody turned up by then).
        if self.announce_to_seeds() == 0 && !self.config.seeds_discovered {
            self.replica.set_synced(true);
        }
        self.drain_membership(now, &mut out);
        out.timers
            .push((nanos(self.config.join_timeout), NodeTimer::Join));
        out.timers
            .push((nanos(self.config.probe_interval), NodeTimer::Probe));
        out.timers.push((Duration::ZERO, NodeTimer::Housekeeping));
        if !self.config.anti_entropy.is_zero() {
            out.timers
                .push((nanos(self.config.anti_entropy), NodeTimer::AntiEntropy));
        }
        out
    }

    /// Replaces the seeds with `seeds` (what DNS lists now): this node's
    /// own address is dropped, duplicates too, and at most [`MAX_SEEDS`]
    /// are kept. Seeds that are not members are announced to at once (and
    /// every second after, as at start), so a node that started before its
    /// peers were listed joins them now: before its join timeout, with a
    /// full state from one of them; after it (it decided alone meanwhile),
    /// by exchanging full states, as a healed partition does. Seeds that
    /// are gone from the list are not announced to any more; members stay
    /// members until membership finds them down. A longer list also
    /// raises the cluster size foca disseminates for.
    pub fn set_seeds(&mut self, seeds: Vec<SocketAddr>, now: Nanos) -> Output {
        let mut out = Output::default();
        let seeds = normalize_seeds(seeds, self.config.addr);
        if seeds == self.config.seeds {
            return out;
        }
        tracing::info!(seeds = ?seeds, "seed peers changed");
        self.config.seeds = seeds;
        metrics::gauge!(m::SEEDS).set(self.config.seeds.len() as f64);
        let size =
            u32::try_from(self.config.seeds.len().max(self.members.len()) + 1).unwrap_or(u32::MAX);
        if size > self.cluster_size {
            match self.foca.set_config(foca_config(size)) {
                Ok(()) => self.cluster_size = size,
                Err(e) => tracing::debug!(error = %e, "cannot resize membership"),
            }
        }
        self.announce_to_seeds();
        self.drain_membership(now, &mut out);
        out
    }

    /// The seeds this node announces to (see [`Node::set_seeds`]).
    pub fn seeds(&self) -> &[SocketAddr] {
        &self.config.seeds
    }

    /// The cluster size membership is configured for: the larger of
    /// [`NodeConfig::expected_size`] and the longest seed list since.
    pub fn cluster_size(&self) -> u32 {
        self.cluster_size
    }

    /// Leaves the cluster gracefully (peers stop waiting for this node).
    pub fn leave(&mut self, now: Nanos) -> Output {
        let mut out = Output::default();
        self.leaving = true;
        let _ = self.foca.leave_cluster(&mut self.runtime);
        self.drain_membership(now, &mut out);
        out
    }

    /// Handles a timer the node asked for.
    pub fn handle_timer(&mut self, timer: NodeTimer, now: Nanos) -> Output {
        let mut out = Output::default();
        match timer {
            NodeTimer::Membership(t) => {
                if let Err(e) = self.foca.handle_timer(t, &mut self.runtime) {
                    tracing::debug!(error = %e, "membership timer failed");
                }
                self.drain_membership(now, &mut out);
            }
            NodeTimer::Gossip(class) => {
                self.gossip_round(class, now, &mut out);
                if self.replica.classes().contains(&class) {
                    out.timers
                        .push((nanos(class.interval), NodeTimer::Gossip(class)));
                } else {
                    self.classes.remove(&class);
                }
            }
            NodeTimer::Probe => {
                let members: Vec<SocketAddr> = self.members.keys().copied().collect();
                for peer in members {
                    self.pings.insert(peer, now);
                    self.send_to_member(peer, Body::Ping { t1: now }, now, &mut out);
                }
                self.offsets.retain(|a, _| self.members.contains_key(a));
                self.pings.retain(|a, _| self.members.contains_key(a));
                self.heard.retain(|a, _| self.members.contains_key(a));
                self.check_clocks();
                self.graft_around_gaps(now, &mut out);
                out.timers
                    .push((nanos(self.config.probe_interval), NodeTimer::Probe));
            }
            NodeTimer::Join => {
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
                        .push((nanos(self.config.join_timeout), NodeTimer::Join));
                } else {
                    tracing::warn!(
                        members = self.members.len(),
                        key_mismatch = self.replica.key_mismatch(),
                        "no member sent a full state: deciding alone (the first of the cluster, \
                         or every member is joining too)"
                    );
                    self.replica.set_synced(true);
                    self.streams.clear();
                }
            }
            NodeTimer::AntiEntropy => {
                // Deltas are sent once; a datagram lost on the way, or a
                // link that does not exist (a partial mesh), would leave a
                // gap for good. A digest to one member now and then finds
                // any such gap, and the two repair it.
                if let Some(peer) = self.anti_entropy_peer(now) {
                    self.send_digest(peer, now, &mut out);
                }
                out.timers
                    .push((nanos(self.config.anti_entropy), NodeTimer::AntiEntropy));
            }
            NodeTimer::Housekeeping => {
                self.check_key(now);
                self.announce_to_seeds();
                self.drain_membership(now, &mut out);
                for class in self.replica.classes() {
                    if self.classes.insert(class) {
                        out.timers
                            .push((nanos(class.interval), NodeTimer::Gossip(class)));
                    }
                }
                metrics::gauge!(m::STATE_KEYS).set(self.replica.keys() as f64);
                metrics::gauge!(m::STATE_SIZE).set(self.replica.state_size() as f64);
                metrics::gauge!(m::PEERS_ALIVE).set(self.members.len() as f64);
                metrics::gauge!(m::CONVERGENCE_LAG)
                    .set(self.replica.convergence_lag(now).as_secs_f64());
                out.timers.push((HOUSEKEEPING, NodeTimer::Housekeeping));
            }
        }
        out
    }

    /// Sends the urgent payloads the replica queued (eager pushes, pull
    /// answers), to members only: a pull answer to a sender that is not
    /// one is dropped (`not_a_member`).
    pub fn flush_urgent(&mut self, now: Nanos) -> Output {
        let mut out = Output::default();
        for (peer, items) in self.replica.take_urgent() {
            self.send_items(peer, items, Batch::Delta, now, &mut out);
        }
        out
    }
}

/// Whether `member` may be answered at `now`: not within `every` of the
/// last answer `last` recorded for it. Records `now` when so, and forgets
/// addresses that are no longer members (so `last` holds members only).
fn once_per(
    last: &mut HashMap<SocketAddr, Nanos>,
    member: SocketAddr,
    every: Nanos,
    now: Nanos,
    members: &HashMap<SocketAddr, Peer>,
) -> bool {
    if last
        .get(&member)
        .is_some_and(|at| now.saturating_sub(*at) < every)
    {
        return false;
    }
    last.insert(member, now);
    last.retain(|a, _| members.contains_key(a));
    true
}

fn kind(body: &Body) -> &'static str {
    match body {
        Body::Membership(_) => "membership",
        Body::Delta { .. } => "delta",
        Body::FullRequest => "full_request",
        Body::Full { .. } => "full",
        Body::Ping { .. } => "ping",
        Body::Pong { .. } => "pong",
        Body::Outdated { .. } => "outdated",
        Body::Unauthenticated => "unauthenticated",
        Body::Digest { .. } => "digest",
        Body::Pull { .. } => "pull",
        Body::Repair { .. } => "repair",
        Body::Graft { .. } => "graft",
    }
}

fn nanos(n: Nanos) -> Duration {
    Duration::from_nanos(n.as_u64())
}
