//! [`Replica`]: one node's replicated state, shared by the request path
//! (which decides locally, as a [`Store`](tollgate_store::Store)) and the gossip node (which
//! merges what peers send and ships what they lack).
//!
//! # What it holds
//!
//! - **Keys**: the store's keyed-state table ([`tollgate_store::table`]),
//!   from [`Key`] to the limit, its [`ReplicatedState`] and its last
//!   gossiped report, decided under the shard locks exactly as the memory
//!   store decides (the same table: all or nothing over a plan, locks
//!   taken in ascending shard order, the same capacity rule). A key is
//!   forgotten only once idle for longer than its retention margin.
//! - **Per-neighbour deltas** ([`crate::deltas`]): for each live peer, the
//!   payloads it has not been sent yet. A local grant adds its change to
//!   every peer's delta; what is learnt from a peer goes to the peers the
//!   dissemination rule names (none in a full mesh under origin
//!   dissemination; every other one under the thesis's epidemic rule).
//! - **Eager pushes** (§4.2.3): after a local grant of a queue with
//!   frequency analysis, a peer whose pending delta for the key holds
//!   `window` elements at an average gap of at most the threshold gets it
//!   at once, as does every peer near the limit; the node is woken to
//!   send it.
//! - **Digests** ([`crate::digest`]): a hash of the settled state, for
//!   anti-entropy, and the keys of the buckets where two digests differ.
//! - **Epoch reports** (seed 001): epoch keys that granted are remembered,
//!   and each gossip round of their class adds their report to every
//!   peer's delta when it changed.
//!
//! # Why one lock for the deltas
//!
//! Deltas change on every grant; one mutex keeps the bookkeeping simple
//! and is held for a few map operations per peer. The cluster is for
//! tens of nodes, not thousands (the thesis evaluates 30).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rand::Rng;
use smallvec::SmallVec;
use tollgate_core::hash::Fnv1a;
use tollgate_core::plan::{self, PlanEntry};
use tollgate_core::replicated::strategy::{
    Mark, Payload, ReplicatedLimit, ReplicatedState, Replication, Strategy, StrategyKind,
};
use tollgate_core::replicated::NodeId;
use tollgate_core::{Algorithm, Hits, Limit, LimitState, Mode, Nanos, PlanDecision, Rate};
use tollgate_store::table::{AtCapacity, Effect, Events, Policy, Table, TableOptions};
use tollgate_store::{Key, LimitId, Plan, PlanItem, StoreError};

use crate::deltas::{Class, Deltas, Dissemination, PeerAddr, Round, Update};
use crate::digest::{Buckets, Digest};
use crate::metrics as m;
use crate::store::NotReplicable;
use crate::wire;

/// Options of a [`Replica`].
#[derive(Clone, Debug)]
pub struct ReplicaOptions {
    /// This node.
    pub node: NodeId,
    /// How resources without `replication:` are replicated.
    pub default: Replication,
    /// Most keys kept, enforced per shard as `ceil(max_keys / 64)` (the
    /// replica has 64 shards; see [`tollgate_store::table`]); new keys
    /// beyond it are decided on a fresh state that is not kept, and
    /// received ones are dropped (counted in
    /// [`ReplicaStats::at_capacity`]).
    pub max_keys: usize,
    /// Most keys pending in one peer's delta; beyond it the delta is
    /// cleared and the peer gets a full state instead.
    pub max_delta_keys: usize,
    /// How updates spread ([`Dissemination::Origin`] by default).
    pub dissemination: Dissemination,
}

impl Default for ReplicaOptions {
    fn default() -> ReplicaOptions {
        ReplicaOptions {
            node: NodeId(0),
            default: Replication::new(StrategyKind::Queue),
            max_keys: 10_000_000,
            max_delta_keys: 100_000,
            dissemination: Dissemination::Origin,
        }
    }
}

/// What the replica keeps per key besides its limit.
#[derive(Clone)]
struct Entry {
    state: LimitState,
    /// The last epoch report added to the deltas (epoch keys only).
    reported: Option<Payload>,
}

/// How the replica keeps its keys in the table: with their last report,
/// until idle for longer than their retention margin (so replicas that
/// converged drop a key together), counting keys not kept at capacity.
struct Keeping {
    stats: Arc<ReplicaStats>,
}

impl Policy for Keeping {
    type State = Entry;

    fn fresh(&self, limit: &Limit) -> Entry {
        Entry {
            state: limit.fresh(),
            reported: None,
        }
    }

    fn is_dead(&self, limit: &Limit, entry: &Entry, now: Nanos) -> bool {
        is_expired(limit, &entry.state, now)
    }

    fn record(&self, events: &Events, _keys: usize) {
        self.stats
            .at_capacity
            .fetch_add(events.untracked, Ordering::Relaxed);
    }
}

/// Counters of what the replica did, for metrics and tests.
#[derive(Default, Debug)]
pub struct ReplicaStats {
    /// Payloads merged into the local state (changed something).
    pub merges: AtomicU64,
    /// Received payloads of limits this node does not know.
    pub unknown_limits: AtomicU64,
    /// Eager pushes (§4.2.3).
    pub eager_pushes: AtomicU64,
    /// Keys decided on a state not kept, or received and dropped, because
    /// the replica was at `max_keys`.
    pub at_capacity: AtomicU64,
    /// Deltas that overflowed and became full-state resyncs.
    pub resyncs: AtomicU64,
}

/// One node's replicated state; see the [module docs](self).
pub struct Replica {
    options: ReplicaOptions,
    table: Table<Keeping>,
    limits: RwLock<HashMap<LimitId, Arc<Limit>>>,
    gossip: Mutex<Deltas>,
    synced: AtomicBool,
    healthy: AtomicBool,
    key_mismatch: AtomicBool,
    pub(crate) last_sweep: AtomicU64,
    /// Counters (shared with the table's policy, which counts keys not
    /// kept at capacity).
    pub stats: Arc<ReplicaStats>,
    /// Woken when urgent payloads wait ([`Replica::take_urgent`]).
    pub wake: tokio::sync::Notify,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("node", &self.options.node)
            .field("keys", &self.table.len())
            .finish_non_exhaustive()
    }
}

const SHARDS: usize = 64;

/// Least time between two sweeps through [`Store::sweep`](tollgate_store::Store::sweep).
pub(crate) const SWEEP_EVERY: Nanos = Nanos::SECOND;

// A key's scope is at most this long (longer ones are digests), so every
// key the store decides can be gossiped.
const _: () = assert!(tollgate_store::key::MAX_SCOPE_BYTES <= wire::MAX_DOMAIN);

impl Replica {
    /// An empty replica. It decides nothing until [`Replica::set_synced`]
    /// (the node calls it once a full state arrived, or nobody answered).
    pub fn new(options: ReplicaOptions) -> Replica {
        let dissemination = options.dissemination;
        let stats = Arc::new(ReplicaStats::default());
        let table = Table::new(
            TableOptions {
                shards: SHARDS,
                max_keys: options.max_keys,
                at_capacity: AtCapacity::DecideUntracked,
                sweep_interval: SWEEP_EVERY,
            },
            Keeping {
                stats: Arc::clone(&stats),
            },
        );
        Replica {
            options,
            table,
            limits: RwLock::new(HashMap::new()),
            gossip: Mutex::new(Deltas::new(dissemination)),
            synced: AtomicBool::new(false),
            healthy: AtomicBool::new(true),
            key_mismatch: AtomicBool::new(false),
            last_sweep: AtomicU64::new(0),
            stats,
            wake: tokio::sync::Notify::new(),
        }
    }

    /// This node.
    pub fn node(&self) -> NodeId {
        self.options.node
    }

    /// Whether the replica decides: it has its full state (or found no
    /// peer to give it one).
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// Starts or stops deciding (§5.5: not before a full state arrived).
    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Relaxed);
    }

    /// Whether the node is healthy: its clock is within the configured
    /// skew of its peers'.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Records the clock check's verdict.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Whether the node hears only datagrams it cannot authenticate from
    /// its seeds and members: it most likely has another cluster secret
    /// than theirs, and is cut off from its cluster without knowing it.
    pub fn key_mismatch(&self) -> bool {
        self.key_mismatch.load(Ordering::Relaxed)
    }

    /// Records the node's verdict on [`Replica::key_mismatch`].
    pub fn set_key_mismatch(&self, mismatch: bool) {
        self.key_mismatch.store(mismatch, Ordering::Relaxed);
    }

    /// Keys held.
    pub fn keys(&self) -> u64 {
        self.table.len() as u64
    }

    /// The gossip classes of every replicated limit known: each needs a
    /// gossip timer.
    pub fn classes(&self) -> Vec<Class> {
        let mut classes: Vec<Class> = self
            .limits
            .read()
            .values()
            .filter_map(|l| match &**l {
                Limit::Replicated(r) => Some(Class::of(&r.replication)),
                _ => None,
            })
            .collect();
        classes.sort_unstable();
        classes.dedup();
        classes
    }

    /// Builds the replicated limit of a configured one (see
    /// [`Store::admit`](tollgate_store::Store::admit)): token buckets, GCRA and per-second limits
    /// become the resource's strategy on this node.
    pub fn prepare_limit(
        &self,
        limit: Limit,
        replication: Option<&Replication>,
    ) -> Result<Limit, NotReplicable> {
        let how = replication.copied().unwrap_or(self.options.default);
        let (capacity, rate) = match &limit {
            Limit::TokenBucket(tb) => {
                if tb.initial_tokens() != tb.capacity() {
                    return Err(NotReplicable::InitialTokens);
                }
                (tb.capacity(), Rate::new(1, tb.interval()))
            }
            Limit::Gcra(g) => (g.burst(), Rate::new(1, g.interval())),
            Limit::SlidingLog(l)
                if l.window() == Nanos::SECOND && l.min_gap().is_zero() && !l.counts_rejected() =>
            {
                // Hard and global limits (N per second) are replicated as
                // a token bucket of N refilled at N per second.
                (l.limit(), Rate::per_second(l.limit()))
            }
            Limit::Replicated(_) => return Ok(limit),
            Limit::SlidingLog(_) => return Err(NotReplicable::SlidingLog),
            other => {
                return Err(NotReplicable::Algorithm {
                    algorithm: other.algorithm_name(),
                    strategy: how.strategy.as_str(),
                })
            }
        };
        let mut replicated = how.build(capacity, rate?, self.options.node)?;
        if let Some(debt) = limit.max_debt() {
            // The debt a report may leave, as configured (`max_debt`) or
            // the algorithm's default, for the strategies that take usage.
            replicated = replicated.with_max_debt(debt)?;
        }
        Ok(Limit::Replicated(replicated))
    }

    /// Makes `limit` known under `id`, so keys of it received from peers
    /// can be merged.
    pub fn register(&self, id: LimitId, limit: Arc<Limit>) {
        if matches!(*limit, Limit::Replicated(_)) {
            self.limits.write().insert(id, limit);
        }
    }

    /// Makes exactly `limits` known (a config put in force): keys of
    /// limits no longer served are not merged any more, and gossip classes
    /// no longer used stop.
    pub fn serve_limits(&self, limits: Vec<(LimitId, Arc<Limit>)>) {
        let limits = limits
            .into_iter()
            .filter(|(_, l)| matches!(**l, Limit::Replicated(_)))
            .collect();
        *self.limits.write() = limits;
    }

    /// Decides `plan` locally, all or nothing (see [`Store::decide`](tollgate_store::Store::decide)), and
    /// queues what the grant changed for every neighbour.
    ///
    /// Every key's domain fits a datagram: a store keeps a domain longer
    /// than [`tollgate_store::key::MAX_SCOPE_BYTES`] as a short digest, so
    /// a grant for any domain reaches the peers (issue 16: a long domain
    /// used to be decided on each node alone).
    pub fn decide_now(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        if !self.is_synced() {
            return Err(StoreError::Unavailable(
                "joining the cluster: waiting for a full state from a peer".into(),
            ));
        }
        let items = plan.items();
        // An item asked hits of its own goes through the core's plan,
        // which knows them; the one-item path decides the request's.
        if let [item] = items {
            if !item.has_own_hits() {
                return self.decide_one(item, now, request, mode);
            }
        }
        let origin = self.origin();
        // Each state taken out of the table (or fresh), with what it was
        // last reported as; the news of what the decision changed is
        // worked out under the locks, and published after.
        let (decision, news) = self.table.decide_many(plan, now, |taken| {
            let marks: SmallVec<[Mark; 4]> = items
                .iter()
                .zip(taken.iter())
                .map(|(item, e)| mark_of(&item.limit, &e.state))
                .collect();
            let decision = {
                let mut entries: SmallVec<[PlanEntry<'_>; 4]> = items
                    .iter()
                    .zip(taken.iter_mut())
                    .map(|(item, e)| PlanEntry {
                        limit: &item.limit,
                        state: &mut e.state,
                        shadow: item.shadow,
                        hits: item.hits,
                    })
                    .collect();
                plan::decide(&mut entries, now, request, mode)?
            };
            let news: SmallVec<[News; 4]> = items
                .iter()
                .zip(taken.iter())
                .zip(marks)
                .map(|((item, e), mark)| news_of(item, &e.state, mark, now, origin))
                .collect();
            Ok((decision, news))
        })?;
        self.publish(items, news, now);
        Ok(decision)
    }

    /// [`tollgate_store::Store::inspect`] on this node: each item of `plan`
    /// decided for zero hits on a copy of this node's state of its key
    /// (what this node would decide by, peers' news merged so far), or a
    /// fresh one; nothing is stored, changed or gossiped.
    pub fn inspect_now(&self, plan: &Plan, now: Nanos) -> Result<PlanDecision, StoreError> {
        let mut states: SmallVec<[LimitState; 4]> = plan
            .items()
            .iter()
            .map(|item| {
                self.table
                    .with_stored(&item.key, |_, entry| entry.state.clone())
                    .unwrap_or_else(|| item.limit.fresh())
            })
            .collect();
        tollgate_store::probe(plan, &mut states, now)
    }

    /// [`tollgate_store::Store::reset`] on this node: each key of `plan`
    /// becomes a fresh state of a new reset generation
    /// ([`ReplicatedLimit::reset`]), kept here (held for a while even
    /// idle: see [`RESET_HOLD`]) and pushed at once to every peer, which
    /// replace their own states of the key with it. A key this node never
    /// saw is reset the same way, so the peers that hold it hear of it.
    /// At `max_keys` the reset is not kept here but still goes to the
    /// peers. A key whose generation admits no later one (a peer's absurd
    /// generation at the end of time, [`Generation::next`]) is not reset,
    /// and the answer is an error naming it: a reset every peer would
    /// ignore is not reported as done.
    ///
    /// [`Generation::next`]: tollgate_core::replicated::Generation::next
    pub fn reset_now(&self, plan: &Plan, now: Nanos) -> Result<(), StoreError> {
        if !self.is_synced() {
            return Err(StoreError::Unavailable(
                "joining the cluster: waiting for a full state from a peer".into(),
            ));
        }
        let mut resets: Vec<(Key, Payload, Class)> = Vec::new();
        let mut stuck: Vec<&Key> = Vec::new();
        for item in plan.items() {
            let Limit::Replicated(r) = &*item.limit else {
                continue;
            };
            let kept = self.table.update(&item.key, &item.limit, now, |entry, _| {
                let payload = match &mut entry.state {
                    LimitState::Replicated(state) => r.reset(state, now),
                    other => {
                        let mut state = r.fresh();
                        let payload = r.reset(&mut state, now);
                        *other = LimitState::Replicated(Box::new(state));
                        payload
                    }
                };
                if payload.is_none() {
                    return (None, Effect::Untouched);
                }
                entry.reported = None;
                (payload, Effect::Keep)
            });
            let payload = match kept {
                Some(payload) => payload,
                None => r.reset(&mut r.fresh(), now),
            };
            match payload {
                Some(payload) => {
                    resets.push((item.key.clone(), payload, Class::of(&r.replication)))
                }
                None => stuck.push(&item.key),
            }
        }
        let refused = (!stuck.is_empty()).then(|| {
            let names: Vec<String> = stuck.iter().map(|k| format!("`{k}`")).collect();
            StoreError::Unsupported(format!(
                "cannot reset {}: its reset generation is at the end of time (a peer sent an \
                 absurd one), so no later reset would win over it",
                names.join(", ")
            ))
        });
        if resets.is_empty() {
            return refused.map_or(Ok(()), Err);
        }
        let mut gossip = self.gossip.lock();
        for (key, payload, class) in &resets {
            let update = Update {
                key,
                payload,
                class: *class,
                now,
                max_keys: self.options.max_delta_keys,
            };
            gossip.add_local(&update, &self.stats, |_| true);
        }
        drop(gossip);
        self.wake.notify_one();
        refused.map_or(Ok(()), Err)
    }

    /// A one-limit plan, the common case: decided in place under one lock.
    fn decide_one(
        &self,
        item: &PlanItem,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        let origin = self.origin();
        let (result, news) = self
            .table
            .decide_one(&item.key, &item.limit, now, |limit, e| {
                let mark = mark_of(limit, &e.state);
                let mut entries = [PlanEntry {
                    limit,
                    state: &mut e.state,
                    shadow: item.shadow,
                    hits: None,
                }];
                match plan::decide(&mut entries, now, request, mode) {
                    Ok(d) => {
                        let news = news_of(item, &e.state, mark, now, origin);
                        let dead = is_expired(limit, &e.state, now);
                        ((Ok(d), Some(news)), Effect::after(dead))
                    }
                    // Refused before the state was touched.
                    Err(err) => ((Err(err), None), Effect::Untouched),
                }
            })?;
        let decision = result?;
        if let Some(news) = news {
            self.publish(
                std::slice::from_ref(item),
                [news].into_iter().collect(),
                now,
            );
        }
        Ok(decision)
    }

    /// Queues what decisions changed for the neighbours, and remembers
    /// epoch keys whose reports are to be gossiped.
    fn publish(&self, items: &[PlanItem], news: SmallVec<[News; 4]>, now: Nanos) {
        if news.iter().all(|n| n.change.is_none() && !n.epoch) {
            return;
        }
        let mut gossip = self.gossip.lock();
        let mut woke = false;
        for (item, n) in items.iter().zip(news) {
            if n.epoch {
                gossip.epoch_keys.insert(item.key.clone());
            }
            if let (Some(payload), Limit::Replicated(r)) = (n.change, &*item.limit) {
                woke |= self.queue_local(&mut gossip, &item.key, r, payload, n.available, now);
            }
        }
        drop(gossip);
        if woke {
            self.wake.notify_one();
        }
    }

    /// Adds a local change to every peer's delta, pushing it at once to
    /// peers for whom the key is frequent (§4.2.3, Listing 4.5), or to
    /// every peer near the limit. Returns whether anything became urgent.
    fn queue_local(
        &self,
        deltas: &mut Deltas,
        key: &Key,
        limit: &ReplicatedLimit,
        payload: Payload,
        available: u64,
        now: Nanos,
    ) -> bool {
        let class = Class::of(&limit.replication);
        let rule = PushRule::of(limit, available, deltas.peers.len() as u64 + 1);
        let update = Update {
            key,
            payload: &payload,
            class,
            now,
            max_keys: self.options.max_delta_keys,
        };
        let pushed = deltas.add_local(&update, &self.stats, |pending| rule.due(pending));
        if pushed > 0 {
            self.stats
                .eager_pushes
                .fetch_add(pushed as u64, Ordering::Relaxed);
            metrics::counter!(m::EAGER_PUSHES).increment(pushed as u64);
        }
        pushed > 0
    }

    /// Merges what peer `from` (node `sender`) sent (§4.2.1): each payload
    /// into its key's state, each change into the deltas of the peers that
    /// are to hear of it ([`Dissemination`]), and, for an epoch report
    /// that misses what this node knows, this node's report back to `from`
    /// (seed 001's pull). Keys of unknown limits are skipped and counted.
    pub fn absorb(
        &self,
        from: PeerAddr,
        sender: NodeId,
        items: Vec<(Key, Payload)>,
        now: Nanos,
    ) -> Absorbed {
        let mut forwards: Vec<(Key, Payload, Class)> = Vec::new();
        let mut answers: Vec<(Key, Payload)> = Vec::new();
        let mut out = Absorbed::default();
        for (key, payload) in items {
            let Some(limit) = self.limits.read().get(&key.limit).cloned() else {
                self.stats.unknown_limits.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(m::DROPPED, "reason" => "unknown_limit").increment(1);
                continue;
            };
            let Limit::Replicated(r) = &*limit else {
                continue;
            };
            let me = self.node();
            // A key not held takes room first: at capacity it is dropped
            // unmerged (the table counts it in `stats.at_capacity`).
            let merged = self.table.update(&key, &limit, now, |entry, present| {
                let LimitState::Replicated(state) = &mut entry.state else {
                    entry.state = limit.fresh();
                    return (None, Effect::Keep);
                };
                let news = relayed_news(state, &payload, sender, me);
                let changed = r.absorb(state, now, &payload);
                // A key this node swept (or never held) whose news is
                // already past its retention margin stays forgotten:
                // adopting it would restart its gossip to every neighbour,
                // and they too would adopt it after sweeping it, round
                // after round. The receiver ends as the sender soon will:
                // without the key.
                if !present && is_expired(&limit, &entry.state, now) {
                    return (None, Effect::Idle);
                }
                let LimitState::Replicated(state) = &mut entry.state else {
                    return (None, Effect::Keep);
                };
                let answer = if r.should_answer(state, &payload) {
                    r.full(state, now)
                } else {
                    None
                };
                let keep = !matches!(&**state, ReplicatedState::Queue(q)
                    if q.is_empty() && q.generation().is_zero());
                (Some((news, changed, answer)), Effect::after(!keep))
            });
            let Some(Some((news, changed, answer))) = merged else {
                continue;
            };
            if let Some((born, origins)) = news {
                let settle = settle_time(Class::of(&r.replication));
                let late = born.saturating_add(settle) <= now;
                // A counter's payload is its whole state, every node's
                // entry in it: news of a third node there is no sign of
                // a relay (only of a gap, when anti-entropy brings it).
                let queue = matches!(payload, Payload::Queue(_));
                for origin in origins {
                    if queue && !out.relayed.contains(&origin) {
                        out.relayed.push(origin);
                    }
                    if late && !out.late.contains(&origin) {
                        out.late.push(origin);
                    }
                }
            }
            if let Some(mine) = answer {
                answers.push((key.clone(), mine));
            }
            if let Some(change) = changed {
                forwards.push((key, change, Class::of(&r.replication)));
            }
        }
        out.merged = forwards.len();
        self.stats
            .merges
            .fetch_add(out.merged as u64, Ordering::Relaxed);
        metrics::counter!(m::MERGES).increment(out.merged as u64);
        if forwards.is_empty() && answers.is_empty() {
            return out;
        }
        let mut gossip = self.gossip.lock();
        for (key, change, class) in &forwards {
            let update = Update {
                key,
                payload: change,
                class: *class,
                now,
                max_keys: self.options.max_delta_keys,
            };
            gossip.add_learned(from, &update, &self.stats);
        }
        let woke = !answers.is_empty();
        for (key, payload) in answers {
            gossip.urgent.push((from, key, payload));
        }
        drop(gossip);
        if woke {
            self.wake.notify_one();
        }
        out
    }

    /// Every key's whole state, for a joining peer (§5.5).
    pub fn full_state(&self, now: Nanos) -> Vec<(Key, Payload)> {
        self.whole_states(now, |_| true)
    }

    /// The whole state of every key `keep` picks.
    fn whole_states(&self, now: Nanos, keep: impl Fn(&Key) -> bool) -> Vec<(Key, Payload)> {
        let mut out = Vec::new();
        self.table.for_each(|key, limit, entry| {
            if !keep(key) {
                return;
            }
            if let (Limit::Replicated(r), LimitState::Replicated(s)) = (&**limit, &mut entry.state)
            {
                if let Some(p) = r.full(s, now) {
                    out.push((key.clone(), p));
                }
            }
        });
        out
    }

    /// A peer came up: it gets a delta of its own from now on.
    pub fn add_peer(&self, peer: PeerAddr) {
        self.gossip.lock().add_peer(peer);
        metrics::gauge!(m::PEERS_ALIVE).set(self.peer_count() as f64);
    }

    /// A peer went down or left: its delta is dropped (it receives a full
    /// state when it rejoins).
    pub fn remove_peer(&self, peer: PeerAddr) {
        self.gossip.lock().remove_peer(peer);
        metrics::gauge!(m::PEERS_ALIVE).set(self.peer_count() as f64);
    }

    /// Live peers.
    pub fn peers(&self) -> Vec<PeerAddr> {
        self.gossip.lock().peers.keys().copied().collect()
    }

    /// How many live peers.
    pub fn peer_count(&self) -> usize {
        self.gossip.lock().peers.len()
    }

    /// Payloads to send at once (eager pushes and pull answers), grouped by
    /// peer.
    pub fn take_urgent(&self) -> Vec<(PeerAddr, Vec<(Key, Payload)>)> {
        self.gossip.lock().take_urgent()
    }

    /// How updates spread from this node.
    pub fn dissemination(&self) -> Dissemination {
        self.options.dissemination
    }

    fn origin(&self) -> bool {
        self.options.dissemination == Dissemination::Origin
    }

    /// From now until `until`, `peer` hears what this node learns of the
    /// updates of every node but `except` (those it hears itself), as it
    /// asked (origin dissemination). Returns whether `peer` was not relayed
    /// to before.
    pub fn graft(&self, peer: PeerAddr, except: &[NodeId], now: Nanos, until: Nanos) -> bool {
        self.gossip.lock().graft(peer, except, now, until)
    }

    /// Whether this node relays what it learns to `peer` at `now`.
    pub fn relays_to(&self, peer: PeerAddr, now: Nanos) -> bool {
        self.gossip.lock().relays_to(peer, now)
    }

    /// One gossip round of `class` (Listing 3.3 / §4.2.4): refreshes the
    /// class's epoch reports and takes the deltas the round ships
    /// ([`Dissemination`] says whose). Empty when there is no peer or
    /// nothing to send. A peer whose delta overflowed gets `Resync`
    /// instead.
    pub fn take_round(&self, class: Class, now: Nanos, rng: &mut impl Rng) -> Vec<Round> {
        self.refresh_reports(class, now);
        self.gossip.lock().take_round(class, rng)
    }

    /// Adds the changed reports of `class`'s epoch keys to every peer's
    /// delta; forgets keys that went idle.
    fn refresh_reports(&self, class: Class, now: Nanos) {
        let keys: Vec<Key> = self.gossip.lock().epoch_keys.iter().cloned().collect();
        if keys.is_empty() {
            return;
        }
        let mut reports = Vec::new();
        let mut done = Vec::new();
        for key in keys {
            // `None`: the key is gone or not replicated; stop listing it.
            let found = self.table.with_stored(&key, |limit, entry| {
                let (Limit::Replicated(r), LimitState::Replicated(s)) =
                    (&**limit, &mut entry.state)
                else {
                    return None;
                };
                if Class::of(&r.replication) != class {
                    return Some(None);
                }
                match r.report(s, now) {
                    Some(report) if entry.reported.as_ref() != Some(&report) => {
                        entry.reported = Some(report.clone());
                        Some(Some(report))
                    }
                    _ => Some(None),
                }
            });
            match found.flatten() {
                None => done.push(key),
                Some(Some(report)) => reports.push((key, report)),
                // An idle key stays listed until the sweep drops its
                // entry: forgetting it here could race with a grant that
                // just listed it again.
                Some(None) => {}
            }
        }
        let mut gossip = self.gossip.lock();
        for key in done {
            gossip.epoch_keys.remove(&key);
        }
        for (key, report) in &reports {
            let update = Update {
                key,
                payload: report,
                class,
                now,
                max_keys: self.options.max_delta_keys,
            };
            gossip.add_everywhere(&update, &self.stats);
        }
    }

    /// Drops keys idle for longer than their retention margin, so replicas
    /// that converged drop a key together (a node that dropped it early
    /// would hide new grants under its peers' old counts).
    pub fn sweep_now(&self, now: Nanos) -> u64 {
        let dropped = self.table.sweep(now);
        metrics::gauge!(m::STATE_KEYS).set(self.keys() as f64);
        let (pending, elements) = self.delta_sizes();
        metrics::gauge!(m::DELTA_KEYS).set(pending as f64);
        metrics::gauge!(m::DELTA_UPDATES).set(elements as f64);
        dropped
    }

    /// How long the oldest payload still waiting for a peer has waited:
    /// how far behind the slowest replica may be (zero when nothing waits).
    pub fn convergence_lag(&self, now: Nanos) -> Nanos {
        self.gossip.lock().lag(now)
    }

    /// Keys pending over every peer's delta, and the updates they carry.
    pub fn delta_sizes(&self) -> (usize, usize) {
        self.gossip.lock().sizes()
    }

    /// The digest of this replica's settled state at `at` (see
    /// [`crate::digest`]): what anti-entropy compares instead of sending a
    /// full state.
    pub fn digest(&self, at: Nanos) -> Digest {
        let mut digest = Digest::default();
        self.table.for_each(|key, limit, entry| {
            if let (Limit::Replicated(r), LimitState::Replicated(s)) = (&**limit, &entry.state) {
                if let Some(h) = settled_hash(r, s, at) {
                    digest.add(key, h);
                }
            }
        });
        digest
    }

    /// Every key of `buckets` with its whole state: what anti-entropy
    /// sends a peer whose digest differs there.
    pub fn items_in(&self, buckets: Buckets, now: Nanos) -> Vec<(Key, Payload)> {
        self.whole_states(now, |key| {
            buckets & (1 << crate::digest::bucket_of(key)) != 0
        })
    }

    /// The state of `key`, for tests and the status page.
    pub fn state_of(&self, key: &Key) -> Option<ReplicatedState> {
        self.table
            .with_stored(key, |_, entry| match &entry.state {
                LimitState::Replicated(s) => Some(ReplicatedState::clone(s)),
                _ => None,
            })
            .flatten()
    }

    /// Bytes the replica's state takes: every key (its name and state)
    /// and every payload waiting in a neighbour's delta, with the
    /// least-informed priorities. Map overhead is left out; it is the
    /// simulator's memory measure (the thesis's "memory per node").
    pub fn memory_bytes(&self) -> usize {
        let mut keys = 0usize;
        self.table.for_each(|k, _, e| {
            keys += std::mem::size_of_val(k) + k.scope().len() + e.state.footprint();
        });
        let deltas = self.gossip.lock().footprint();
        keys + deltas
    }

    /// What `key` amounts to at `now`, comparable across nodes: a
    /// counter's state, a queue's state pruned as it would be at `now`, an
    /// epoch bucket's report (its level is each node's own). Two nodes
    /// have converged on a key when these are equal.
    pub fn view_of(&self, key: &Key, now: Nanos) -> Option<Payload> {
        let (limit, mut state) = self
            .table
            .with_stored(key, |limit, entry| match &entry.state {
                LimitState::Replicated(s) => Some((Arc::clone(limit), ReplicatedState::clone(s))),
                _ => None,
            })
            .flatten()?;
        let Limit::Replicated(r) = &*limit else {
            return None;
        };
        if let (Strategy::Queue(q), ReplicatedState::Queue(s)) = (&r.strategy, &mut state) {
            q.prune(s, now);
        }
        r.full(&mut state, now)
    }

    /// Elements or entries held over every key.
    pub fn state_size(&self) -> usize {
        let mut size = 0;
        self.table.for_each(|_, _, e| {
            if let LimitState::Replicated(r) = &e.state {
                size += ReplicatedLimit::size(r);
            }
        });
        size
    }
}

/// When a key's pending updates for a peer go out at once rather than at
/// the next round (§4.2.3, Listing 4.5, and near-limit propagation).
#[derive(Clone, Copy, Debug)]
struct PushRule {
    /// Near the limit, a late update is what lets a request through:
    /// every neighbour gets the key's updates now.
    near: bool,
    /// Frequency analysis: a pending payload of `window` elements at an
    /// average gap of at most the threshold.
    eager: Option<(u64, Nanos)>,
}

impl PushRule {
    /// The rule for a key of `limit` with `available` tokens left, in a
    /// cluster of `nodes`.
    fn of(limit: &ReplicatedLimit, available: u64, nodes: u64) -> PushRule {
        let window = limit
            .replication
            .eager
            .and_then(|e| e.window)
            .unwrap_or_else(|| (limit.capacity() / nodes.max(1)).max(1));
        PushRule {
            near: limit.replication.near_limit
                && limit.kind() == StrategyKind::Queue
                && available <= window,
            eager: limit.replication.eager.map(|e| (window, e.threshold)),
        }
    }

    /// Whether `pending` is to go out now.
    fn due(&self, pending: &Payload) -> bool {
        self.near
            || self
                .eager
                .is_some_and(|(window, threshold)| pending.is_frequent(window, threshold))
    }
}

/// What [`Replica::absorb`] found in what a peer sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Absorbed {
    /// Payloads that changed the local state.
    pub merged: usize,
    /// The third nodes (neither the sender nor this one) whose queue
    /// elements this node did not have: the sender relayed them.
    pub relayed: Vec<NodeId>,
    /// Those of them whose news was older than a settle time
    /// ([`settle_time`]): it should have arrived from its origin by now,
    /// so the way from there to here is broken, and the sender is a way
    /// around.
    pub late: Vec<NodeId>,
}

/// How long an update may take to arrive from its origin before its
/// absence is a gap rather than news on its way: two gossip rounds of its
/// class, and a second for latency, clock differences and eager pushes.
pub fn settle_time(class: Class) -> Nanos {
    class
        .interval
        .saturating_mul(2)
        .saturating_add(Nanos::SECOND)
}

/// The news `payload` brings to `state` from nodes other than `sender`
/// and `me`: the birth of the oldest such element new here (a queue), or
/// time zero for counter entries that grew (counters carry no time, so
/// any such news counts as late), with the nodes it came from. `None`
/// when it brings none.
fn relayed_news(
    state: &ReplicatedState,
    payload: &Payload,
    sender: NodeId,
    me: NodeId,
) -> Option<(Nanos, SmallVec<[NodeId; 4]>)> {
    let third = |n: NodeId| n != sender && n != me;
    // A payload from before a reset this node knows of merges as nothing:
    // no news. One of a later reset is news whatever this state held.
    let newer = match payload.generation().cmp(&state.generation()) {
        std::cmp::Ordering::Less => return None,
        std::cmp::Ordering::Equal => false,
        std::cmp::Ordering::Greater => true,
    };
    let mut origins: SmallVec<[NodeId; 4]> = SmallVec::new();
    let mut oldest: Option<Nanos> = None;
    match (state, payload) {
        (ReplicatedState::Queue(q), Payload::Queue(p)) => {
            for e in p.elements() {
                if third(e.id.node) && (newer || !q.contains(e.id)) {
                    oldest = Some(oldest.map_or(e.id.birth, |o| o.min(e.id.birth)));
                    if !origins.contains(&e.id.node) {
                        origins.push(e.id.node);
                    }
                }
            }
        }
        (ReplicatedState::Counter(c), Payload::Counter(p)) => {
            for (n, count) in p.token_counter() {
                if third(*n) && (newer || *count > c.consumed_by(*n)) {
                    oldest = Some(Nanos::ZERO);
                    origins.push(*n);
                }
            }
        }
        // Epoch reports aggregate every node's traffic and go to every
        // neighbour each round: they never ask for a relay.
        _ => {}
    }
    oldest.map(|born| (born, origins))
}

/// The hash of a key's settled view at `at` (see [`crate::digest`]);
/// `None` when nothing of it is settled.
fn settled_hash(limit: &ReplicatedLimit, state: &ReplicatedState, at: Nanos) -> Option<u64> {
    let settle = settle_time(Class::of(&limit.replication));
    match (&limit.strategy, state) {
        (Strategy::Queue(tq), ReplicatedState::Queue(q)) => {
            // A reset is settled at once: a peer that missed it differs.
            let reset = !q.generation().is_zero();
            if at < settle && !reset {
                return None;
            }
            let born_by = at.saturating_sub(settle);
            let lives_past = at.saturating_add(settle);
            let mut h = Fnv1a::new().bytes(&q.interval().as_u64().to_le_bytes());
            if reset {
                h = h.bytes(&crate::digest::stable_hash(&q.generation()).to_le_bytes());
            }
            let mut any = reset;
            for e in q.elements() {
                if e.id.birth > born_by || e.death.saturating_add(tq.margin()) <= lives_past {
                    continue;
                }
                any = true;
                h = h.bytes(&crate::digest::stable_hash(e).to_le_bytes());
            }
            any.then(|| h.finish())
        }
        (Strategy::Counter(_), ReplicatedState::Counter(c)) if !c.is_empty() => {
            Some(crate::digest::stable_hash(c))
        }
        // An epoch bucket's reports are left out (each epoch's supersedes
        // the last), but not its reset: a peer that missed it differs.
        (Strategy::Epoch(_), ReplicatedState::Epoch(e)) if !e.generation().is_zero() => {
            Some(crate::digest::stable_hash(&e.generation()))
        }
        _ => None,
    }
}

/// Whether a key has been idle for longer than its retention margin, so
/// every replica may forget it. A limit that is not replicated (the store
/// admits none, but `decide_now` is public) has no margin: it is forgotten
/// once idle, as the memory store forgets it, never while it still limits.
fn is_expired(limit: &Limit, state: &LimitState, now: Nanos) -> bool {
    match (limit, state) {
        (Limit::Replicated(r), LimitState::Replicated(s))
            if now < reset_held_until(r, s.generation()) =>
        {
            false
        }
        (Limit::Replicated(r), _) => {
            let grace = r.replication.retention_margin();
            limit.is_idle(state, now.saturating_sub(grace)) && limit.is_idle(state, now)
        }
        _ => limit.is_idle(state, now),
    }
}

/// The least time a node keeps a key it saw reset, idle or not.
pub const RESET_HOLD: Nanos = Nanos::from_secs(600);

/// Until when a key reset to `generation` is kept, idle or not: its
/// generation is what makes every state from before the reset merge as
/// nothing, so forgetting it would let a peer that missed the reset bring
/// the old counts back. [`RESET_HOLD`] after the reset (time enough for
/// anti-entropy and full states to reach a node that missed it, unless it
/// is cut off for longer), and at least a full refill of the bucket and a
/// retention margin: by then a state from before the reset that was not
/// in debt beyond its capacity is full again, so were it to come back it
/// would limit nothing. A key never reset is not held.
fn reset_held_until(
    limit: &ReplicatedLimit,
    generation: tollgate_core::replicated::Generation,
) -> Nanos {
    if generation.is_zero() {
        return Nanos::ZERO;
    }
    let refill = match &limit.strategy {
        Strategy::Counter(c) => c.interval().saturating_mul(c.capacity()),
        Strategy::Queue(q) => q.lifetime(),
        Strategy::Epoch(e) => e.interval().saturating_mul(e.capacity()),
    };
    let hold = refill
        .saturating_add(limit.replication.retention_margin())
        .max(RESET_HOLD);
    generation.at.saturating_add(hold)
}

/// What a decision changed for the neighbours.
struct News {
    /// The payload to add to every neighbour's delta.
    change: Option<Payload>,
    /// Tokens the bucket holds after the decision.
    available: u64,
    /// An epoch key with traffic: its report is to be gossiped.
    epoch: bool,
}

fn mark_of(limit: &Limit, state: &LimitState) -> Mark {
    match (limit, state) {
        (Limit::Replicated(r), LimitState::Replicated(s)) => r.mark(s),
        _ => Mark::default(),
    }
}

/// What a decision on `item` changed. Under origin dissemination the
/// tokens counted as available are those left less the grants this node
/// knows of from the last gossip interval: as many may have been granted
/// elsewhere since, unseen until their origin's next round, so a key is
/// near its limit that much earlier (a burst that crosses the limit
/// between two rounds is then pushed grant by grant).
fn news_of(item: &PlanItem, state: &LimitState, mark: Mark, now: Nanos, origin: bool) -> News {
    match (&*item.limit, state) {
        (Limit::Replicated(r), LimitState::Replicated(s)) => News {
            change: r.local_changes(s, mark),
            available: match (origin, &**s) {
                (true, ReplicatedState::Queue(q)) => {
                    let since = now.saturating_sub(r.replication.gossip_interval);
                    let recent = q
                        .elements()
                        .rev()
                        .take_while(|e| e.id.birth > since)
                        .count();
                    r.available(s, now).saturating_sub(recent as u64)
                }
                _ => r.available(s, now),
            },
            epoch: r.kind() == StrategyKind::Epoch && !item.limit.is_idle(state, now),
        },
        _ => News {
            change: None,
            available: u64::MAX,
            epoch: false,
        },
    }
}
