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

use crate::deltas::{Class, Dissemination, Round};
use crate::digest::Digest;
use crate::metrics as m;
use crate::replica::Replica;
use crate::wire::{
    self, Admission, Batch, Body, ClusterKey, Header, Message, ReplayGuard, WireError, ANYONE,
};

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
    pub timers: Vec<(Duration, Timer)>,
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

/// Most addresses (or senders) a [`Throttle`] remembers.
const MAX_THROTTLED: usize = 256;

/// Does something at most once every `every` per key, remembering at most
/// [`MAX_THROTTLED`] keys: when they are all recent, nothing more is done
/// (strangers choose the keys, so it must not grow).
#[derive(Debug)]
struct Throttle<K> {
    last: HashMap<K, Nanos>,
    every: Nanos,
}

impl<K: std::hash::Hash + Eq> Throttle<K> {
    fn new(every: Nanos) -> Throttle<K> {
        Throttle {
            last: HashMap::new(),
            every,
        }
    }

    /// Whether to do it for `key` now; records it if so.
    fn allow(&mut self, key: K, now: Nanos) -> bool {
        let every = self.every;
        let recent = |at: &Nanos| now.saturating_sub(*at) < every;
        if self.last.get(&key).is_some_and(recent) {
            return false;
        }
        if self.last.len() >= MAX_THROTTLED && !self.last.contains_key(&key) {
            self.last.retain(|_, at| recent(at));
            if self.last.len() >= MAX_THROTTLED {
                return false;
            }
        }
        self.last.insert(key, now);
        true
    }
}

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

    /// Handles a datagram from `from`: authenticated, checked for its
    /// recipient and for replay, then acted on. Anything wrong is dropped
    /// and counted; nothing here can fail the node.
    pub fn handle_datagram(&mut self, from: SocketAddr, data: &[u8], now: Nanos) -> Output {
        let mut out = Output::default();
        metrics::counter!(m::BYTES_RECEIVED).increment(data.len() as u64);
        let message = match wire::decode(&self.config.key, self.tag, data) {
            Ok(message) => message,
            Err(e) => {
                self.count_drop(e.reason(), 1);
                tracing::debug!(%from, error = %e, "gossip datagram dropped");
                if e == WireError::BadMac {
                    self.unauthenticated(from, data, now, &mut out);
                }
                return out;
            }
        };
        let Message { header, body } = message;
        if !self.is_for_me(&header, &body) {
            self.count_drop(WireError::Misaddressed.reason(), 1);
            tracing::debug!(
                %from,
                to = header.to.0,
                to_incarnation = header.to_incarnation,
                "gossip datagram for another node dropped"
            );
            return out;
        }
        match self
            .replay
            .admit(header.from, header.incarnation, header.seq)
        {
            Admission::Fresh => {}
            Admission::Duplicate => {
                self.count_drop(WireError::Replayed.reason(), 1);
                return out;
            }
            Admission::Outdated { incarnation, top } => {
                self.count_drop("outdated", 1);
                let known = Body::Outdated {
                    incarnation,
                    seq: top,
                };
                self.answer_outdated(from, &header, known, data.len(), now, &mut out);
                return out;
            }
        }
        self.heard_authentic(now);
        metrics::counter!(m::MESSAGES_RECEIVED, "kind" => kind(&body)).increment(1);
        // The sender as membership knows it. Answers go to the address it
        // gave the cluster, never to the one a datagram claims to come
        // from: an authentic datagram raced to this node with a forged
        // source reflects nothing to that source.
        let member = self.member_addr(header.from, header.incarnation);
        let peer = member.unwrap_or(from);
        if let Some(member) = member {
            self.heard.insert(member, now);
        }
        match body {
            Body::Membership(bytes) => {
                if let Err(e) = self.foca.handle_data(&bytes, &mut self.runtime) {
                    self.count_drop("membership", 1);
                    tracing::debug!(%from, error = %e, "membership message refused");
                }
                self.drain_membership(now, &mut out);
            }
            Body::Delta { items } => {
                let absorbed = self.replica.absorb(peer, header.from, items, now);
                // Under origin dissemination a peer sends third nodes'
                // news only as a relay this node asked for: news it did
                // not have otherwise keeps the relay going.
                if !absorbed.relayed.is_empty() && member.is_some() {
                    self.graft(peer, RELAY_FOR.div_floor(2), now, &mut out);
                }
            }
            Body::Digest { at, buckets } => match member {
                Some(member) => self.answer_digest(member, at, buckets, now, &mut out),
                None => self.count_drop("not_a_member", 1),
            },
            Body::Pull { buckets } => match member {
                Some(member) if self.may_repair(member, now) => {
                    let items = self.replica.items_in(buckets, now);
                    self.send_items(member, items, Batch::Repair, now, &mut out);
                }
                Some(_) => self.count_drop("repair_throttled", 1),
                None => self.count_drop("not_a_member", 1),
            },
            Body::Repair { items } => {
                let absorbed = self.replica.absorb(peer, header.from, items, now);
                if !absorbed.late.is_empty() && member.is_some() {
                    self.graft(peer, RELAY_FOR.div_floor(2), now, &mut out);
                }
            }
            Body::Graft { except } => match member {
                Some(member) => {
                    let until = now.saturating_add(RELAY_FOR);
                    if self.replica.graft(member, &except, now, until) {
                        tracing::debug!(peer = %member, "relaying to a member that cannot hear some nodes");
                        // What this node learnt before the graft has not
                        // reached the member: a digest lets it pull that.
                        if self.replica.is_synced() {
                            self.send_digest(member, now, &mut out);
                        }
                    }
                }
                None => self.count_drop("not_a_member", 1),
            },
            Body::FullRequest => match member {
                Some(member) => self.answer_full_request(member, now, &mut out),
                None => self.count_drop("not_a_member", 1),
            },
            Body::Full {
                stream,
                index,
                last,
                items,
            } => {
                self.replica.absorb(peer, header.from, items, now);
                if self.replica.is_synced() {
                    // A member sent its state after a partition, or as
                    // anti-entropy: merged, nothing to count.
                    return out;
                }
                if self.streams.len() >= MAX_STREAMS && !self.streams.contains_key(&(peer, stream))
                {
                    self.streams.clear();
                }
                let seen = self.streams.entry((peer, stream)).or_insert(0);
                *seen = seen.saturating_add(1);
                if last {
                    let complete = *seen == index.saturating_add(1);
                    self.streams.remove(&(peer, stream));
                    metrics::counter!(m::FULL_STATES, "direction" => "received").increment(1);
                    if complete {
                        tracing::info!(peer = %peer, "full state received: deciding");
                        self.replica.set_synced(true);
                        self.streams.clear();
                    }
                    // Otherwise a chunk was lost: the join timer asks
                    // again.
                }
            }
            // Only members are answered: a stranger (or a forged source)
            // gets nothing.
            Body::Ping { t1 } => match member {
                Some(member) => {
                    let t = now;
                    self.send_to_member(member, Body::Pong { t1, t2: t, t3: t }, now, &mut out);
                }
                None => self.count_drop("not_a_member", 1),
            },
            // Only the answer to the last ping sent to that member counts,
            // so a replayed pong cannot fake an offset.
            Body::Pong { t1, t2, t3 }
                if member.is_some_and(|m| self.pings.get(&m) == Some(&t1)) =>
            {
                self.pings.remove(&peer);
                let t = |n: Nanos| i128::from(n.as_u64());
                let offset = ((t(t2) - t(t1)) + (t(t3) - t(now))) / 2;
                self.offsets.insert(peer, offset);
                self.check_clocks();
            }
            Body::Pong { .. } => self.count_drop("unexpected_pong", 1),
            Body::Outdated { incarnation, seq } => {
                self.outdated(from, incarnation, seq, now, &mut out);
            }
            Body::Unauthenticated => {
                // This node shares the key, so its datagram was damaged on
                // the way, or the peer's key changed since.
                tracing::debug!(%from, "a peer could not authenticate a datagram of ours");
            }
        }
        out
    }

    /// Whether a datagram that passed authentication is for this node:
    /// addressed to this very incarnation, or, for the bodies that may be,
    /// to anyone at this address. foca checks membership messages further
    /// (an announce must name this node's address, anything else this
    /// exact identity), so those may also be for an earlier incarnation
    /// (an announce to a member some node saw go down).
    fn is_for_me(&self, header: &Header, body: &Body) -> bool {
        if header.is_for(self.config.node, self.incarnation) {
            return true;
        }
        match body {
            Body::Membership(_) => header.is_for_anyone() || header.to == self.config.node,
            Body::Unauthenticated => header.is_for_anyone(),
            _ => false,
        }
    }

    /// The address of the member `node` in `incarnation`, if it is one.
    fn member_addr(&self, node: NodeId, incarnation: u64) -> Option<SocketAddr> {
        self.members
            .values()
            .find(|p| p.node == node.0 && p.bump == incarnation)
            .map(|p| p.addr)
    }

    /// A datagram passed every check: this node shares its cluster's key.
    fn heard_authentic(&mut self, now: Nanos) {
        self.last_authentic = Some(now);
        if self.replica.key_mismatch() {
            self.check_key(now);
        }
    }

    /// A datagram from `from` failed authentication. From a seed or a
    /// member, it is evidence of a key mismatch ([`Node::check_key`]).
    /// An announce to anyone at this address (what a node that does not
    /// know this one yet sends its seeds) is answered with
    /// [`Body::Unauthenticated`], so a node with another secret hears a
    /// datagram it cannot authenticate from its seed even when the seed
    /// does not know it (it would otherwise hear nothing at all, as if its
    /// seed were down). The answer is bounded: at most once a second per
    /// address, never larger than the datagram it answers, and sealed
    /// like every other, so it tells a stranger nothing but that a node
    /// of the cluster listens here.
    fn unauthenticated(&mut self, from: SocketAddr, data: &[u8], now: Nanos, out: &mut Output) {
        let known = self.config.seeds.contains(&from) || self.members.contains_key(&from);
        if known {
            self.last_unauthenticated = Some(now);
            self.check_key(now);
        }
        if self.unauthenticated_warnings.allow(from, now) {
            tracing::warn!(
                peer = %from,
                known,
                "a datagram of this cluster failed authentication: its sender has another \
                 cluster secret (or forged it); it cannot be a member"
            );
        }
        let to_anyone = wire::unauthenticated_header(data).is_some_and(|h| h.is_for_anyone());
        if to_anyone && self.unauthenticated_answers.allow(from, now) {
            let header = self.header(now, ANYONE, 0);
            self.answer(from, &header, &Body::Unauthenticated, data.len(), out);
        }
    }

    /// Whether this node is cut off from its cluster by a different
    /// secret: for [`AUTH_GRACE`] it authenticated nothing, and what it
    /// heard since from its seeds and members failed authentication. A node
    /// whose seeds are simply not up yet heard nothing from them, and
    /// stays ready once it decides alone; a datagram that authenticates
    /// clears the verdict at once.
    fn check_key(&mut self, now: Nanos) {
        let since = self.last_authentic.unwrap_or(self.started_at);
        let mismatch = self.last_unauthenticated.is_some_and(|bad| bad >= since)
            && now.saturating_sub(since) >= AUTH_GRACE;
        if mismatch != self.replica.key_mismatch() {
            if mismatch {
                // Names the flags, never the secret.
                tracing::error!(
                    seeds = ?self.config.seeds,
                    cluster = %self.config.cluster,
                    "every datagram from this node's seeds and members fails authentication \
                     and none has authenticated: this node's cluster secret most likely differs \
                     from theirs (compare --cluster-secret-file or TOLLGATE_CLUSTER_SECRET, and \
                     --cluster, on every node); it is cut off from its cluster and reports itself \
                     not ready"
                );
            } else {
                tracing::info!(
                    "a datagram of the cluster authenticated: the cluster secret matches"
                );
            }
        }
        self.replica.set_key_mismatch(mismatch);
        metrics::gauge!(m::KEY_MISMATCH).set(if mismatch { 1.0 } else { 0.0 });
    }

    /// Tells the sender of an authentic datagram from an earlier life than
    /// one seen of it ([`Admission::Outdated`]) which incarnation this node
    /// knows (`known`, a [`Body::Outdated`]): a sender that restarted with a smaller (or equal) boot stamp
    /// then takes a larger one ([`Node::outdated`]). The sender has not
    /// proved it is who it claims (the datagram may be a replay with a
    /// forged source), so the answer goes where the datagram came from,
    /// addressed to the life it claims, at most once a second per sender
    /// and never larger than the datagram it answers.
    fn answer_outdated(
        &mut self,
        from: SocketAddr,
        stale: &Header,
        known: Body,
        len: usize,
        now: Nanos,
        out: &mut Output,
    ) {
        if !self.outdated_answers.allow(stale.from, now) {
            return;
        }
        let header = self.header(now, stale.from, stale.incarnation);
        self.answer(from, &header, &known, len, out);
    }

    /// Sends `body` to `to`, which has not proved it is a member, only if
    /// it is no larger than the `len` bytes it answers: whoever forged the
    /// source of that datagram gets no more bytes sent to its victim than
    /// it sent itself.
    fn answer(
        &mut self,
        to: SocketAddr,
        header: &Header,
        body: &Body,
        len: usize,
        out: &mut Output,
    ) {
        match wire::encode(&self.config.key, header, body) {
            Ok(bytes) if bytes.len() <= len => {
                metrics::counter!(m::MESSAGES_SENT, "kind" => kind(body)).increment(1);
                metrics::counter!(m::BYTES_SENT).increment(bytes.len() as u64);
                self.sent.other_datagrams += 1;
                self.sent.other_bytes += bytes.len() as u64;
                out.sends.push((to, bytes));
            }
            Ok(_) => self.count_drop("answer_too_large", 1),
            Err(e) => self.count_drop(e.reason(), 1),
        }
    }

    /// A peer says it has seen `seen` (up to sequence number `seen_seq`)
    /// of this node, from an earlier life than this one: this node
    /// restarted with a boot stamp no larger than before (its clock was
    /// stepped back, or it restarted within one stamp), and its peers
    /// refuse it. It takes the next incarnation and announces itself
    /// again. A live node that has itself sent `seen_seq` in `seen` ignores
    /// it: the notice answers a replay of one of its own datagrams.
    fn outdated(
        &mut self,
        from: SocketAddr,
        seen: u64,
        seen_seq: u64,
        now: Nanos,
        out: &mut Output,
    ) {
        let earlier_life =
            seen > self.incarnation || (seen == self.incarnation && seen_seq > self.seq);
        if !earlier_life {
            self.count_drop("outdated_notice", 1);
            return;
        }
        let Some(next) = seen.max(self.incarnation).checked_add(1) else {
            tracing::error!(
                seen,
                "a peer knows this node at the last incarnation there is"
            );
            return;
        };
        tracing::warn!(
            peer = %from,
            seen,
            stamp = self.incarnation,
            incarnation = next,
            "a peer knows a later life of this node than its boot stamp (its clock was stepped \
             back, or it restarted within one stamp): rejoining with a larger incarnation"
        );
        self.incarnation = next;
        let me = Peer {
            addr: self.config.addr,
            node: self.config.node.0,
            bump: next,
        };
        if let Err(e) = self.foca.change_identity(me, &mut self.runtime) {
            tracing::debug!(error = %e, "cannot change identity");
        }
        // The peer that told us may not be a seed: announce to it too.
        let placeholder = Peer {
            addr: from,
            node: ANYONE.0,
            bump: 0,
        };
        if let Err(e) = self.foca.announce(placeholder, &mut self.runtime) {
            tracing::debug!(peer = %from, error = %e, "cannot announce to a peer");
        }
        self.announce_to_seeds();
        self.drain_membership(now, out);
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
                    self.send_to_member(peer, Body::Ping { t1: now }, now, &mut out);
                }
                self.offsets.retain(|a, _| self.members.contains_key(a));
                self.pings.retain(|a, _| self.members.contains_key(a));
                self.heard.retain(|a, _| self.members.contains_key(a));
                self.check_clocks();
                self.graft_around_gaps(now, &mut out);
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
                        key_mismatch = self.replica.key_mismatch(),
                        "no member sent a full state: deciding alone (the first of the cluster, \
                         or every member is joining too)"
                    );
                    self.replica.set_synced(true);
                    self.streams.clear();
                }
            }
            Timer::AntiEntropy => {
                // Deltas are sent once; a datagram lost on the way, or a
                // link that does not exist (a partial mesh), would leave a
                // gap for good. A digest to one member now and then finds
                // any such gap, and the two repair it.
                if let Some(peer) = self.anti_entropy_peer(now) {
                    self.send_digest(peer, now, &mut out);
                }
                out.timers
                    .push((nanos(self.config.anti_entropy), Timer::AntiEntropy));
            }
            Timer::Housekeeping => {
                self.check_key(now);
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
    /// answers), to members only: a pull answer to a sender that is not
    /// one is dropped (`not_a_member`).
    pub fn flush_urgent(&mut self, now: Nanos) -> Output {
        let mut out = Output::default();
        for (peer, items) in self.replica.take_urgent() {
            self.send_items(peer, items, Batch::Delta, now, &mut out);
        }
        out
    }

    fn gossip_round(&mut self, class: Class, now: Nanos, out: &mut Output) {
        for round in self.replica.take_round(class, now, &mut self.rng) {
            match round {
                Round::Delta(peer, items) => {
                    metrics::gauge!(m::DELTA_SIZE).set(items.len() as f64);
                    self.send_items(peer, items, Batch::Delta, now, out);
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
        self.send_items(peer, items, Batch::Full { stream }, now, out);
    }

    /// Whether `member` was heard from in the last three probe intervals:
    /// every member answers each probe, so one that did not is out of
    /// this node's reach (a partial mesh, a broken link), or down.
    fn reachable(&self, member: SocketAddr, now: Nanos) -> bool {
        let recent = self.gap_after();
        self.heard
            .get(&member)
            .is_some_and(|at| now.saturating_sub(*at) <= recent)
    }

    /// How long a member goes unheard before it counts as out of reach:
    /// three probe intervals (also how often a gap's grafts are repeated).
    fn gap_after(&self) -> Nanos {
        self.config.probe_interval.saturating_mul(3)
    }

    /// Under origin dissemination, news from a node this node cannot hear
    /// comes only through others: when some member is out of reach, this
    /// node asks every member it hears to relay what it learns of every
    /// node's updates but those it hears itself (which of its members hear
    /// the missing ones it cannot tell, and membership may not even list
    /// them; those that do not hear them have nothing to relay). The
    /// request is repeated every three probe intervals while the gap
    /// lasts, so a lost graft or a relay that restarted is asked again
    /// within seconds. In a full mesh nobody asks, and nothing is relayed.
    fn graft_around_gaps(&mut self, now: Nanos, out: &mut Output) {
        if self.replica.dissemination() != Dissemination::Origin {
            return;
        }
        let (heard, gap): (Vec<SocketAddr>, Vec<SocketAddr>) = self
            .members
            .keys()
            .copied()
            .partition(|m| self.reachable(*m, now));
        if gap.is_empty() {
            return;
        }
        let mut heard = heard;
        heard.sort_unstable();
        let every = self.gap_after();
        for peer in heard {
            self.graft(peer, every, now, out);
        }
    }

    /// The nodes whose updates this node hears itself: itself and the
    /// members it heard from lately (at most [`wire::MAX_GRAFT_EXCEPT`];
    /// beyond that, none are named and relays pass on every node's news).
    fn heard_nodes(&self, now: Nanos) -> Vec<NodeId> {
        let mut nodes: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(addr, _)| self.reachable(**addr, now))
            .map(|(_, p)| NodeId(p.node))
            .chain(std::iter::once(self.config.node))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        if nodes.len() > wire::MAX_GRAFT_EXCEPT {
            nodes.clear();
        }
        nodes
    }

    /// The member anti-entropy talks to this time: one at random among
    /// those heard from in the last three probe intervals (in a partial
    /// mesh, the ones this node can reach), or among all when none was.
    fn anti_entropy_peer(&mut self, now: Nanos) -> Option<SocketAddr> {
        if !self.replica.is_synced() || self.members.is_empty() {
            return None;
        }
        let mut members: Vec<SocketAddr> = self
            .members
            .keys()
            .copied()
            .filter(|m| self.reachable(*m, now))
            .collect();
        if members.is_empty() {
            members = self.members.keys().copied().collect();
        }
        members.sort_unstable();
        Some(members[self.rng.random_range(0..members.len())])
    }

    /// A member's digest: where this node's differs, it sends its keys of
    /// those buckets and pulls the member's. Nothing when they agree.
    fn answer_digest(
        &mut self,
        member: SocketAddr,
        at: Nanos,
        buckets: Vec<(u8, u64)>,
        now: Nanos,
        out: &mut Output,
    ) {
        if !self.replica.is_synced() {
            self.count_drop("not_synced", 1);
            return;
        }
        // A digest taken far from this node's time cannot be compared
        // (what is settled differs): a clock this far off is reported
        // unhealthy by the clock checks anyway.
        if at.saturating_sub(now) > self.config.max_clock_skew.max(Nanos::SECOND) {
            self.count_drop("digest_from_the_future", 1);
            return;
        }
        if !self.may_repair(member, now) {
            self.count_drop("repair_throttled", 1);
            return;
        }
        let Some(theirs) = Digest::from_entries(buckets) else {
            self.count_drop("malformed", 1);
            return;
        };
        let differ = self.replica.digest(at).differs(&theirs);
        metrics::counter!(m::ANTI_ENTROPY, "outcome" => if differ == 0 { "agreed" } else { "repaired" })
            .increment(1);
        if differ == 0 {
            return;
        }
        let items = self.replica.items_in(differ, now);
        self.send_items(member, items, Batch::Repair, now, out);
        self.send_to_member(member, Body::Pull { buckets: differ }, now, out);
    }

    /// Whether a member's digest or pull may be answered now (at most once
    /// a [`REPAIR_EVERY`] per member).
    fn may_repair(&mut self, member: SocketAddr, now: Nanos) -> bool {
        once_per(&mut self.repaired, member, REPAIR_EVERY, now, &self.members)
    }

    /// Sends `peer` this node's digest, taken now.
    fn send_digest(&mut self, peer: SocketAddr, now: Nanos, out: &mut Output) {
        let buckets = self.replica.digest(now).entries().collect();
        self.send_to_member(peer, Body::Digest { at: now, buckets }, now, out);
    }

    /// Asks `peer` to relay to this node, for [`RELAY_FOR`], what it
    /// learns of every node's updates but those this node hears itself.
    /// Asked again only after `every`, unless the nodes it hears changed.
    /// Only under origin dissemination: under the epidemic rule everything
    /// is relayed anyway.
    fn graft(&mut self, peer: SocketAddr, every: Nanos, now: Nanos, out: &mut Output) {
        if self.replica.dissemination() != Dissemination::Origin {
            return;
        }
        let except = self.heard_nodes(now);
        if let Some((at, asked)) = self.grafted.get(&peer) {
            if now.saturating_sub(*at) < every && *asked == except {
                return;
            }
        }
        tracing::debug!(%peer, hears = except.len(), "asking a member to relay");
        self.grafted.insert(peer, (now, except.clone()));
        self.grafted.retain(|a, _| self.members.contains_key(a));
        self.send_to_member(peer, Body::Graft { except }, now, out);
    }

    /// A member asks for this node's whole state (`from` is its address
    /// as membership knows it). Answered only when this node is synced (a
    /// joining node's state would let the asker start from nothing), only
    /// to members (a forged source gets nothing sent to a stranger), and at
    /// most once per member every two seconds (a full state is large).
    fn answer_full_request(&mut self, from: SocketAddr, now: Nanos, out: &mut Output) {
        let reason = if !self.replica.is_synced() {
            Some("not_synced")
        } else if !self.members.contains_key(&from) {
            Some("not_a_member")
        } else if !once_per(
            &mut self.answered,
            from,
            FULL_REQUEST_EVERY,
            now,
            &self.members,
        ) {
            Some("full_request_throttled")
        } else {
            None
        };
        if let Some(reason) = reason {
            self.count_drop(reason, 1);
            return;
        }
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
        self.send_to_member(peer, Body::FullRequest, now, out);
    }

    /// Acts on what foca asked for: sends, timers, membership changes.
    fn drain_membership(&mut self, now: Nanos, out: &mut Output) {
        while let Some(n) = self.runtime.to_notify() {
            match n {
                OwnedNotification::MemberUp(p) => self.member_up(p, now, out),
                OwnedNotification::MemberDown(p) if self.members.get(&p.addr) == Some(&p) => {
                    tracing::info!(peer = %p.addr, node = p.node, "member down");
                    self.members.remove(&p.addr);
                    self.grafted.remove(&p.addr);
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
                // foca renewed this node's identity after it was declared
                // down (a partition): datagrams carry the new incarnation.
                OwnedNotification::Rejoin(me) => {
                    tracing::info!(
                        incarnation = me.bump,
                        "declared down by the cluster: rejoined"
                    );
                    self.incarnation = me.bump;
                }
                OwnedNotification::Defunct if !self.leaving => {
                    tracing::warn!("declared down by the cluster: rejoining");
                    let _ = self.foca.reuse_down_identity();
                }
                _ => {}
            }
        }
        while let Some((peer, data)) = self.runtime.to_send() {
            // A seed not met yet is a placeholder of node 0: anyone there.
            let to = (NodeId(peer.node), peer.bump);
            self.send(peer.addr, to, Body::Membership(data.to_vec()), now, out);
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
            self.count_drop("conflicting_node_id", 1);
        }
        tracing::info!(peer = %peer.addr, node = peer.node, "member up");
        let addr = peer.addr;
        self.replica.add_peer(addr);
        self.members.insert(addr, peer);
        // A new member (or a new life of one) is given the probes' grace
        // before it counts as out of reach, and whatever it was asked to
        // relay is asked again: a restarted member relays nothing.
        self.heard.insert(addr, now);
        self.grafted.remove(&addr);
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

    /// The header of the next datagram, for `to` in `to_incarnation`.
    fn header(&mut self, now: Nanos, to: NodeId, to_incarnation: u64) -> Header {
        self.seq = self.seq.wrapping_add(1);
        Header {
            cluster: self.tag,
            from: self.config.node,
            incarnation: self.incarnation,
            seq: self.seq,
            sent_at: now,
            to,
            to_incarnation,
        }
    }

    /// The identity datagrams to the member at `addr` are addressed to;
    /// `None` (counted) when it is not a member: only members are sent
    /// gossip, full states and answers.
    fn recipient(&mut self, addr: SocketAddr) -> Option<(NodeId, u64)> {
        let to = self.members.get(&addr).map(|p| (NodeId(p.node), p.bump));
        if to.is_none() {
            self.count_drop("not_a_member", 1);
        }
        to
    }

    fn send_to_member(&mut self, addr: SocketAddr, body: Body, now: Nanos, out: &mut Output) {
        if let Some(to) = self.recipient(addr) {
            self.send(addr, to, body, now, out);
        }
    }

    fn send(
        &mut self,
        addr: SocketAddr,
        (to, to_incarnation): (NodeId, u64),
        body: Body,
        now: Nanos,
        out: &mut Output,
    ) {
        let header = self.header(now, to, to_incarnation);
        let kind = kind(&body);
        match wire::encode(&self.config.key, &header, &body) {
            Ok(bytes) => {
                metrics::counter!(m::MESSAGES_SENT, "kind" => kind).increment(1);
                metrics::counter!(m::BYTES_SENT).increment(bytes.len() as u64);
                // Anti-entropy and relay requests are state gossip; the
                // rest (membership, probes, notices) is counted apart.
                if matches!(
                    body,
                    Body::Digest { .. }
                        | Body::Pull { .. }
                        | Body::Repair { .. }
                        | Body::Graft { .. }
                ) {
                    self.sent.gossip_datagrams += 1;
                    self.sent.gossip_bytes += bytes.len() as u64;
                } else {
                    self.sent.other_datagrams += 1;
                    self.sent.other_bytes += bytes.len() as u64;
                }
                out.sends.push((addr, bytes));
            }
            Err(e) => {
                self.count_drop(e.reason(), 1);
                tracing::warn!(%addr, error = %e, "cannot encode a gossip message");
            }
        }
    }

    /// Sends `items` to `to` as `batch` (deltas, repairs, or the chunks of
    /// a full state), in as many datagrams as they need.
    fn send_items(
        &mut self,
        to: SocketAddr,
        items: Vec<(Key, Payload)>,
        batch: Batch,
        now: Nanos,
        out: &mut Output,
    ) {
        let full = matches!(batch, Batch::Full { .. });
        if items.is_empty() && !full {
            return;
        }
        let Some((node, incarnation)) = self.recipient(to) else {
            return;
        };
        let template = self.header(now, node, incarnation);
        let mut seq = self.seq;
        let packed = wire::encode_items(&self.config.key, &template, &mut seq, batch, &items);
        self.sent.gossip_updates += items.iter().map(|(_, p)| p.updates() as u64).sum::<u64>();
        self.seq = seq;
        if packed.dropped > 0 {
            self.count_drop("unencodable", packed.dropped as u64);
        }
        let kind = match batch {
            Batch::Full { .. } => "full",
            Batch::Repair => "repair",
            Batch::Delta => "delta",
        };
        for bytes in packed.datagrams {
            metrics::counter!(m::MESSAGES_SENT, "kind" => kind).increment(1);
            metrics::counter!(m::BYTES_SENT).increment(bytes.len() as u64);
            self.sent.gossip_datagrams += 1;
            self.sent.gossip_bytes += bytes.len() as u64;
            out.sends.push((to, bytes));
        }
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

/// Membership's settings for a cluster of about `size` members: foca's
/// LAN defaults (its piggybacking grows with the size), with faster
/// probes and a 2 s suspicion, packets that fit a datagram, and frequent
/// announces so a node that started alone finds its seeds soon.
fn foca_config(size: u32) -> foca::Config {
    let size = NonZeroU32::new(size).unwrap_or(NonZeroU32::MIN);
    let mut config = foca::Config::new_lan(size);
    config.max_packet_size = NonZeroUsize::new(FOCA_PACKET).unwrap_or(NonZeroUsize::MIN);
    config.probe_period = Duration::from_millis(500);
    config.probe_rtt = Duration::from_millis(200);
    config.suspect_to_down_after = Duration::from_secs(2);
    config.periodic_announce = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(2),
        num_members: NonZeroUsize::MIN,
    });
    config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(3),
        num_members: NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN),
    });
    config
}

/// `seed` written in `own`'s address family (an IPv4 address plain or
/// mapped into IPv6, as `own` is), or `None` if it is of the other family.
fn same_family(seed: SocketAddr, own: SocketAddr) -> Option<SocketAddr> {
    use std::net::IpAddr;
    let ip = match (seed.ip().to_canonical(), own.ip()) {
        (IpAddr::V4(v4), IpAddr::V4(_)) => IpAddr::V4(v4),
        (IpAddr::V4(v4), IpAddr::V6(o)) if o.to_ipv4_mapped().is_some() => {
            IpAddr::V6(v4.to_ipv6_mapped())
        }
        (IpAddr::V6(v6), IpAddr::V6(o)) if o.to_ipv4_mapped().is_none() => IpAddr::V6(v6),
        _ => return None,
    };
    Some(SocketAddr::new(ip, seed.port()))
}

/// `seeds` in `own`'s address family ([`same_family`]), sorted, without
/// duplicates and without `own` (this node's address), cut to
/// [`MAX_SEEDS`]. The family matters because a dual-stack Service lists
/// every pod under both families, this node included, and the node's
/// socket speaks only its advertised address's family.
fn normalize_seeds(seeds: Vec<SocketAddr>, own: SocketAddr) -> Vec<SocketAddr> {
    let listed = seeds.len();
    let mut seeds: Vec<SocketAddr> = seeds
        .into_iter()
        .filter_map(|s| same_family(s, own))
        .collect();
    if listed > 0 && seeds.is_empty() {
        tracing::warn!(
            listed,
            own = %own,
            "every seed is of the other address family than --gossip-advertise: none kept"
        );
    }
    seeds.retain(|s| *s != own);
    seeds.sort_unstable();
    seeds.dedup();
    if seeds.len() > MAX_SEEDS {
        tracing::warn!(
            seeds = seeds.len(),
            kept = MAX_SEEDS,
            "more seed peers than a node keeps: the lowest addresses are kept"
        );
        seeds.truncate(MAX_SEEDS);
    }
    seeds
}

fn nanos(n: Nanos) -> Duration {
    Duration::from_nanos(n.as_u64())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::same_family;
    use std::net::SocketAddr;

    /// A seed is kept only in the node's own family, written as the
    /// node's own address is (plain IPv4, or IPv4 mapped into IPv6 for a
    /// dual-stack socket).
    #[test]
    fn seeds_are_written_in_the_nodes_own_family() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let v4 = a("10.0.0.1:7946");
        let mapped = a("[::ffff:10.0.0.1]:7946");
        let v6 = a("[fd00::1]:7946");
        let seed_v4 = a("10.0.0.2:7946");
        let seed_mapped = a("[::ffff:10.0.0.2]:7946");
        let seed_v6 = a("[fd00::2]:7946");
        assert_eq!(same_family(seed_v4, v4), Some(seed_v4));
        assert_eq!(same_family(seed_mapped, v4), Some(seed_v4));
        assert_eq!(same_family(seed_v6, v4), None);
        assert_eq!(same_family(seed_v4, mapped), Some(seed_mapped));
        assert_eq!(same_family(seed_v6, mapped), None);
        assert_eq!(same_family(seed_v6, v6), Some(seed_v6));
        assert_eq!(same_family(seed_v4, v6), None);
        assert_eq!(same_family(seed_mapped, v6), None);
    }
}
