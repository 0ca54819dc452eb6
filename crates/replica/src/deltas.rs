//! Per-neighbour deltas: what each peer has not been sent yet, and the
//! rules that decide who gets an update ([`Dissemination`]).
//!
//! The deltas keep, for each live peer, the payloads waiting for it,
//! merged per key as they accumulate (thesis §3.1, §4.2.1). Which peers an
//! update is added to is the dissemination rule:
//!
//! - [`Dissemination::Origin`] (the default): a node sends its **own**
//!   changes (local grants, its epoch reports) to every peer, and every
//!   gossip round ships every peer's pending delta. What it learns from a
//!   peer it keeps, and passes on only to peers that asked it to relay
//!   (a graft): in a full mesh nobody asks, so each update crosses the
//!   network once per receiving node, N − 1 times in all. A node that
//!   cannot reach some member (it misses the clock probes), or finds
//!   through anti-entropy that it lacked news from a third node, grafts
//!   members it hears (a partial mesh, such as a ring, or a link that
//!   drops datagrams); a relay is renewed while the gap lasts or while it
//!   brings news the node did not have otherwise, and lapses after that.
//! - [`Dissemination::Epidemic`] (the thesis's, kept to compare): every
//!   change a node learns from peer P is added to every other peer's delta
//!   ("merged and forwarded, never echoed"), and each round ships one
//!   neighbour's delta, chosen at random or least-informed first (§4.2.4).
//!   Each update crosses the network on the order of N × (N − 1) times.
//!
//! Eager pushes (frequency analysis, near-limit propagation) and epoch
//! pull answers go out at once as *urgent* payloads, under both rules.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use rand::Rng;
use tollgate_core::replicated::queue::QueueState;
use tollgate_core::replicated::strategy::{Payload, Replication, StrategyKind};
use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;
use tollgate_store::Key;

use crate::replica::ReplicaStats;

/// A peer, as the deltas know it: its gossip address.
pub type PeerAddr = SocketAddr;

/// How updates spread through the cluster; see the [module docs](self).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum Dissemination {
    /// Each node sends its own changes to every peer every round, and
    /// relays what it learns only to peers that grafted it.
    #[default]
    Origin,
    /// The thesis's: everything learnt is forwarded to every other peer,
    /// and each round ships one neighbour's delta.
    Epidemic,
}

impl Dissemination {
    /// Reads `origin` or `epidemic`.
    pub fn parse(name: &str) -> Option<Dissemination> {
        match name {
            "origin" => Some(Dissemination::Origin),
            "epidemic" => Some(Dissemination::Epidemic),
            _ => None,
        }
    }

    /// The name [`Dissemination::parse`] reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Dissemination::Origin => "origin",
            Dissemination::Epidemic => "epidemic",
        }
    }
}

impl std::fmt::Display for Dissemination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A gossip class: keys gossiped at the same interval with the same rule
/// for choosing a neighbour. Each class has its own gossip timer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Class {
    /// How often a round runs.
    pub interval: Nanos,
    /// Least-informed neighbour first (§4.2.4) rather than uniformly random
    /// (epidemic dissemination only: under origin dissemination every
    /// neighbour gets its delta each round).
    pub least_informed: bool,
    /// Every neighbour each round (epoch reports, seed 001: a report must
    /// reach every node within its epoch, or its traffic is never
    /// subtracted there; reports are small and change once an epoch).
    pub everyone: bool,
}

impl Class {
    /// The class of a resource replicated as `r`.
    pub fn of(r: &Replication) -> Class {
        Class {
            interval: r.gossip_interval,
            least_informed: r.least_informed && r.strategy == StrategyKind::Queue,
            everyone: r.strategy == StrategyKind::Epoch,
        }
    }
}

/// One key's payload waiting for a peer.
pub(crate) struct Pending {
    pub(crate) payload: Payload,
    pub(crate) class: Class,
    /// When it first waited: the convergence lag's start.
    pub(crate) since: Nanos,
}

/// What one peer has not been sent yet.
#[derive(Default)]
pub(crate) struct PeerDelta {
    pub(crate) items: HashMap<Key, Pending>,
    /// Updates queued (§4.2.4's priority).
    priority: u64,
    /// The delta overflowed: send a full state instead.
    resync: bool,
    /// Until when this node relays what it learns to the peer (it grafted
    /// this node; origin dissemination only).
    relay_until: Nanos,
    /// Whose news not to relay: updates that originated at these nodes
    /// (the ones the peer hears itself) stay here.
    relay_except: BTreeSet<NodeId>,
}

/// What one gossip round sends.
#[derive(Debug)]
pub enum Round {
    /// These payloads, to this peer.
    Delta(PeerAddr, Vec<(Key, Payload)>),
    /// This peer's delta overflowed: send it a full state.
    Resync(PeerAddr),
}

/// Every peer's delta, the urgent payloads and the epoch keys to report;
/// see the [module docs](self).
#[derive(Default)]
pub(crate) struct Deltas {
    pub(crate) dissemination: Dissemination,
    pub(crate) peers: HashMap<PeerAddr, PeerDelta>,
    /// Payloads to send now (eager pushes, pull answers), by peer.
    pub(crate) urgent: Vec<(PeerAddr, Key, Payload)>,
    /// Epoch keys with traffic whose reports are still to gossip.
    pub(crate) epoch_keys: HashSet<Key>,
}

/// Where one update goes and how large a delta may grow.
pub(crate) struct Update<'a> {
    pub(crate) key: &'a Key,
    pub(crate) payload: &'a Payload,
    pub(crate) class: Class,
    pub(crate) now: Nanos,
    pub(crate) max_keys: usize,
}

impl Deltas {
    /// Empty deltas under `dissemination`.
    pub(crate) fn new(dissemination: Dissemination) -> Deltas {
        Deltas {
            dissemination,
            ..Deltas::default()
        }
    }

    /// Adds a change learnt from `from` to the deltas of the peers that
    /// are to hear of it: every other peer (epidemic), or the peers that
    /// grafted this node (origin). Never back to `from`. Relayed news
    /// waits for the next round: pushing it at once as well makes every
    /// hop of a partial mesh a burst of its own (tried on a 30-node ring:
    /// 189 MB of gossip where rounds send 23 MB).
    pub(crate) fn add_learned(
        &mut self,
        from: PeerAddr,
        update: &Update<'_>,
        stats: &ReplicaStats,
    ) {
        let relay_all = self.dissemination == Dissemination::Epidemic;
        for (addr, delta) in self.peers.iter_mut() {
            if *addr == from {
                continue;
            }
            if relay_all {
                add(delta, update, stats);
            } else if delta.relay_until > update.now {
                if let Some(part) = not_from(update.payload, &delta.relay_except) {
                    add(
                        delta,
                        &Update {
                            payload: &part,
                            ..*update
                        },
                        stats,
                    );
                }
            }
        }
    }

    /// Adds a change this node made (a local grant) to every peer's
    /// delta, and moves the key's pending payload of each peer for which
    /// `push_now` says so to the urgent list (an eager push). Returns how
    /// many peers got one.
    pub(crate) fn add_local(
        &mut self,
        update: &Update<'_>,
        stats: &ReplicaStats,
        push_now: impl Fn(&Payload) -> bool,
    ) -> usize {
        let mut pushed = 0;
        for (addr, delta) in self.peers.iter_mut() {
            if add(delta, update, stats) {
                pushed += push_if_due(delta, *addr, update.key, &mut self.urgent, &push_now);
            }
        }
        pushed
    }

    /// Adds an update this node originated to every peer's delta.
    pub(crate) fn add_everywhere(&mut self, update: &Update<'_>, stats: &ReplicaStats) {
        for delta in self.peers.values_mut() {
            add(delta, update, stats);
        }
    }

    /// From now until `until`, `peer` hears what this node learns of the
    /// updates of every node but `except` (the nodes the peer hears
    /// itself, as it said in its latest request; origin dissemination).
    /// Returns whether the peer was not relayed to before.
    pub(crate) fn graft(
        &mut self,
        peer: PeerAddr,
        except: &[NodeId],
        now: Nanos,
        until: Nanos,
    ) -> bool {
        let Some(delta) = self.peers.get_mut(&peer) else {
            return false;
        };
        let new = delta.relay_until <= now;
        delta.relay_except = except.iter().copied().collect();
        delta.relay_until = delta.relay_until.max(until);
        new
    }

    /// Whether this node relays to `peer` at `now`.
    pub(crate) fn relays_to(&self, peer: PeerAddr, now: Nanos) -> bool {
        self.peers.get(&peer).is_some_and(|d| d.relay_until > now)
    }

    /// One gossip round of `class`: under origin dissemination every peer
    /// with something of the class; under epidemic dissemination every
    /// peer for an `everyone` class, else one (uniformly at random, or the
    /// least informed, ties broken at random).
    pub(crate) fn take_round(&mut self, class: Class, rng: &mut impl Rng) -> Vec<Round> {
        let mut addrs: Vec<PeerAddr> = self.peers.keys().copied().collect();
        addrs.sort_unstable();
        if class.everyone || self.dissemination == Dissemination::Origin {
            return addrs
                .into_iter()
                .filter_map(|peer| self.take_for(peer, class))
                .collect();
        }
        if addrs.is_empty() {
            return Vec::new();
        }
        let peer = if class.least_informed {
            // Only among peers with something to send: a peer whose
            // updates all left by eager pushes can keep a priority (merged
            // updates count less than their parts), and picking it every
            // round would starve the others for good.
            let priority = |a: &PeerAddr| {
                self.peers
                    .get(a)
                    .filter(|d| d.resync || d.items.values().any(|p| p.class == class))
                    .map(|d| d.priority)
            };
            let Some(best) = addrs.iter().filter_map(priority).max() else {
                return Vec::new();
            };
            let top: Vec<PeerAddr> = addrs
                .iter()
                .copied()
                .filter(|a| priority(a) == Some(best))
                .collect();
            top[rng.random_range(0..top.len())]
        } else {
            addrs[rng.random_range(0..addrs.len())]
        };
        self.take_for(peer, class).into_iter().collect()
    }

    /// Takes `class`'s part of `peer`'s delta (or its resync).
    fn take_for(&mut self, peer: PeerAddr, class: Class) -> Option<Round> {
        let delta = self.peers.get_mut(&peer)?;
        if delta.resync {
            delta.resync = false;
            delta.items.clear();
            delta.priority = 0;
            return Some(Round::Resync(peer));
        }
        let keys: Vec<Key> = delta
            .items
            .iter()
            .filter(|(_, p)| p.class == class)
            .map(|(k, _)| k.clone())
            .collect();
        if keys.is_empty() {
            return None;
        }
        let mut items = Vec::with_capacity(keys.len());
        let mut sent = 0u64;
        for k in keys {
            if let Some(Pending { payload: p, .. }) = delta.items.remove(&k) {
                sent = sent.saturating_add(p.updates() as u64);
                items.push((k, p));
            }
        }
        delta.priority = if class.least_informed {
            0
        } else {
            delta.priority.saturating_sub(sent)
        };
        Some(Round::Delta(peer, items))
    }

    /// Payloads to send at once, grouped by peer.
    pub(crate) fn take_urgent(&mut self) -> Vec<(PeerAddr, Vec<(Key, Payload)>)> {
        group(std::mem::take(&mut self.urgent))
    }

    /// A peer came up: it gets a delta of its own from now on.
    pub(crate) fn add_peer(&mut self, peer: PeerAddr) {
        self.peers.entry(peer).or_default();
    }

    /// A peer went down or left: its delta and urgent payloads are
    /// dropped (it receives a full state when it rejoins).
    pub(crate) fn remove_peer(&mut self, peer: PeerAddr) {
        self.peers.remove(&peer);
        self.urgent.retain(|(p, _, _)| *p != peer);
    }

    /// How long the oldest payload still waiting for a peer has waited.
    pub(crate) fn lag(&self, now: Nanos) -> Nanos {
        let oldest = self
            .peers
            .values()
            .flat_map(|d| d.items.values())
            .map(|p| p.since)
            .min();
        oldest.map_or(Nanos::ZERO, |since| now.saturating_sub(since))
    }

    /// Keys pending over every peer's delta, and the updates they carry.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        let keys = self.peers.values().map(|d| d.items.len()).sum();
        let updates = self
            .peers
            .values()
            .flat_map(|d| d.items.values())
            .map(|p| p.payload.updates())
            .sum();
        (keys, updates)
    }

    /// Bytes of every pending payload and its key, plus each delta's own
    /// bookkeeping (map overhead left out).
    pub(crate) fn footprint(&self) -> usize {
        self.peers
            .values()
            .map(|d| {
                std::mem::size_of::<PeerDelta>()
                    + d.items
                        .iter()
                        .map(|(k, p)| {
                            std::mem::size_of_val(k) + k.scope().len() + p.payload.footprint()
                        })
                        .sum::<usize>()
            })
            .sum()
    }
}

/// The part of `payload` that did not originate at `except`; `None` when
/// nothing is left. A queue keeps the other nodes' elements (a subset of
/// a closed queue is closed); an epoch report, small and merged whole,
/// goes whole when it names another node; a counter goes whole always.
fn not_from(payload: &Payload, except: &BTreeSet<NodeId>) -> Option<Payload> {
    if except.is_empty() {
        return Some(payload.clone());
    }
    // A reset made by a node the peer does not hear goes on, even with no
    // grant since.
    let generation = payload.generation();
    let reset = !generation.is_zero() && !except.contains(&generation.node);
    match payload {
        Payload::Queue(q) => {
            let part = QueueState::from_elements(
                q.interval(),
                q.elements()
                    .filter(|e| !except.contains(&e.id.node))
                    .copied(),
            );
            (!part.is_empty() || reset).then(|| Payload::Queue(part.with_generation(generation)))
        }
        // A refund raises a counter's limit and names no node (it adds to
        // no entry), so nothing tells whether a changed counter holds news
        // of a node the peer does not hear: it goes whole, always.
        Payload::Counter(_) => Some(payload.clone()),
        Payload::Epoch(r) => {
            (reset || r.traffic().iter().any(|(n, _)| !except.contains(n))).then(|| payload.clone())
        }
    }
}

/// Moves `delta`'s pending payload of `key` to `urgent` when `push_now`
/// says it is due; returns 1 if it did, else 0.
fn push_if_due(
    delta: &mut PeerDelta,
    addr: PeerAddr,
    key: &Key,
    urgent: &mut Vec<(PeerAddr, Key, Payload)>,
    push_now: &impl Fn(&Payload) -> bool,
) -> usize {
    if !delta.items.get(key).is_some_and(|p| push_now(&p.payload)) {
        return 0;
    }
    let Some(Pending { payload, .. }) = delta.items.remove(key) else {
        return 0;
    };
    delta.priority = if delta.items.is_empty() {
        0
    } else {
        delta.priority.saturating_sub(payload.updates() as u64)
    };
    urgent.push((addr, key.clone(), payload));
    1
}

/// Merges `update` into `delta`'s entry for its key (a delta that would
/// outgrow `max_keys` is cleared and becomes a resync instead). Returns
/// whether the update is pending in the delta.
fn add(delta: &mut PeerDelta, update: &Update<'_>, stats: &ReplicaStats) -> bool {
    if delta.resync {
        return false;
    }
    let payload = update.payload;
    if !delta.items.contains_key(update.key) && delta.items.len() >= update.max_keys {
        delta.items.clear();
        delta.priority = 0;
        delta.resync = true;
        stats.resyncs.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    delta.priority = delta.priority.saturating_add(payload.updates() as u64);
    delta
        .items
        .entry(update.key.clone())
        .and_modify(|p| {
            if p.payload.kind() == payload.kind() {
                p.payload.merge(payload);
            } else {
                p.payload = payload.clone();
            }
            p.class = update.class;
        })
        .or_insert_with(|| Pending {
            payload: payload.clone(),
            class: update.class,
            since: update.now,
        });
    true
}

fn group(items: Vec<(PeerAddr, Key, Payload)>) -> Vec<(PeerAddr, Vec<(Key, Payload)>)> {
    let mut by: HashMap<PeerAddr, Vec<(Key, Payload)>> = HashMap::new();
    for (peer, key, payload) in items {
        let list = by.entry(peer).or_default();
        match list.iter_mut().find(|(k, _)| *k == key) {
            Some((_, p)) => {
                p.merge(&payload);
            }
            None => list.push((key, payload)),
        }
    }
    by.into_iter().collect()
}
