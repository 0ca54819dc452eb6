//! [`Table`]: the sharded keyed-state table both in-process stores keep
//! their limit states in (the [`MemoryStore`](crate::MemoryStore) and the
//! gossip cluster's replica).
//!
//! # What it is for
//!
//! It owns the mechanics of deciding limit states atomically in one
//! process: hashing a [`Key`] to a shard, locking the shards of a plan in
//! the one global order, taking the states out, letting the store decide
//! them, putting back what stays alive, and bounding how many keys are
//! kept. What a state *is* and when it may be forgotten are the store's:
//! a [`Policy`] says so (the memory store keeps a
//! [`LimitState`](tollgate_core::LimitState) and forgets it once idle; the
//! replica keeps a state and its last gossiped report, and forgets it only
//! after its retention margin).
//!
//! # What it is not for
//!
//! Deciding: the algorithm runs in the closure a store passes (the core's
//! pure `plan::decide`), which also sees every state before and after the
//! decision — that is where the replica observes what changed for its
//! neighbours. Nor sharing state between processes.
//!
//! # Why this design
//!
//! - Keys are hashed once (foldhash) into a boxed slice of shards, each a
//!   `parking_lot::RwLock` around a `hashbrown::HashTable`, padded to its
//!   own cache line so two cores working on different shards never
//!   invalidate each other's line.
//! - A one-key decision ([`Table::decide_one`]) takes one hash, the write
//!   lock and one probe and decides the state in place; it is always
//!   inlined, so the caller's closure is too.
//! - A one-key decision on a stored state that can change atomically on
//!   its own ([`Table::decide_shared`]: the memory store's GCRA state, one
//!   atomic word) takes the *read* lock instead, so threads deciding one
//!   hot key run side by side, as in governor. What that cannot decide (a
//!   key not stored, a state left dead, a reloaded limit) the caller then
//!   decides under the write lock: a second hash, lock and probe. Everything
//!   else takes the write lock, so it never sees a state while a shared
//!   decision is changing it, and the table's shape (inserts, removals,
//!   sweeps, the cap) only ever changes under the write lock.
//! - A plan over several keys ([`Table::decide_many`]) locks every shard it
//!   touches in ascending index order ([`crate::lock_order`]), so two plans
//!   never wait on each other in a cycle, and holds them all for the whole
//!   decision: all or nothing. A [`Plan`]'s keys are distinct by
//!   construction, so every key is taken out once.
//! - Nothing awaits while a shard lock is held, so a blocking lock is
//!   right.
//!
//! # Capacity
//!
//! [`TableOptions::max_keys`] is a hard cap, enforced per shard as
//! `ceil(max_keys / shards)` under the shard's lock (so it holds however
//! many threads insert at once, and the table never holds more than
//! `shards × ceil(max_keys / shards)` keys, which is `max_keys` when
//! `shards` divides it). When a new key would exceed it, the table first
//! sweeps that shard of dead states ([`Policy::is_dead`]) — at most once
//! per [`TableOptions::sweep_interval`], so a flood of unique keys cannot
//! make every insert a scan — and if the shard is still full applies
//! [`AtCapacity`]. What happened is reported to [`Policy::record`] after
//! the locks are released, for the store's metrics.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;
use parking_lot::{RwLock, RwLockWriteGuard};
use smallvec::SmallVec;
use tollgate_core::{Limit, Nanos};

use crate::error::StoreError;
use crate::key::Key;
use crate::plan::Plan;

/// The most shards a table will allocate; more buys nothing but memory.
pub const MAX_SHARDS: usize = 1 << 16;

/// hashbrown tags each slot with the top 7 bits of the hash. Choosing the
/// shard from those same bits would give every key of a shard the same tag
/// and turn each probe into a row of full key comparisons, so the shard is
/// taken from the bits just below them.
const HASHBROWN_TAG_BITS: u32 = 7;

/// What the table does when a new key would exceed
/// [`TableOptions::max_keys`]. See the [module docs](self).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum AtCapacity {
    /// Decide the new key on a fresh state and do not store it: lenient,
    /// as Charon §1 goal 2 asks.
    #[default]
    DecideUntracked,
    /// Fail the decision with [`StoreError::AtCapacity`], changing nothing.
    Reject,
}

/// How a [`Table`] is sized and what it does at its bound.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TableOptions {
    /// Number of independently locked shards, clamped to `1..=65536`.
    pub shards: usize,
    /// The most keys kept, enforced per shard as `ceil(max_keys / shards)`.
    pub max_keys: usize,
    /// What to do with a new key when its shard is full.
    pub at_capacity: AtCapacity,
    /// The least time between two capacity-triggered sweeps of one shard.
    pub sweep_interval: Nanos,
}

/// What a store keeps per key, and when it may forget it: the table's
/// hooks. The table calls them under a shard lock, so they must be cheap
/// and must not lock the table.
pub trait Policy: Send + Sync + 'static {
    /// The state kept per key (with the key's [`Limit`]). `Clone` so that
    /// a decision refused at capacity can be undone ([`AtCapacity::Reject`]);
    /// `Sync` because decisions under a shard's read lock share it
    /// ([`Table::decide_shared`]).
    type State: Send + Sync + Clone;

    /// The state of a key that is not stored.
    fn fresh(&self, limit: &Limit) -> Self::State;

    /// Whether `state` may be forgotten at `now`: it is then not put back
    /// after a multi-key decision, not stored for a new key, and dropped
    /// by sweeps (a capacity sweep included).
    fn is_dead(&self, limit: &Limit, state: &Self::State, now: Nanos) -> bool;

    /// Hears what a decision or sweep did at the bound (for metrics),
    /// after the locks are released; `keys` is the table's length then.
    /// Called only when something happened. The default ignores it.
    fn record(&self, events: &Events, keys: usize) {
        let _ = (events, keys);
    }
}

/// What one decision or sweep did that the store's counters and metrics
/// hear about ([`Policy::record`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Events {
    /// Dead states dropped by sweeps.
    pub swept: u64,
    /// New keys decided (or received) but not stored: the table was full
    /// under [`AtCapacity::DecideUntracked`].
    pub untracked: u64,
    /// The decision was refused: the table was full under
    /// [`AtCapacity::Reject`].
    pub rejected: bool,
}

impl Events {
    fn any(&self) -> bool {
        self.swept > 0 || self.untracked > 0 || self.rejected
    }
}

/// A snapshot of a [`Table`]'s counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableStats {
    /// Keys stored now.
    pub keys: usize,
    /// Decisions (or received states) that could not store a new key
    /// because its shard was full ([`AtCapacity::DecideUntracked`]).
    pub untracked_decisions: u64,
    /// Decisions refused because a shard was full ([`AtCapacity::Reject`]).
    pub rejected_at_capacity: u64,
    /// Dead states dropped by sweeps (timer or capacity-triggered).
    pub swept: u64,
}

/// What a decision under the lock did to its state, and so to the table.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// The state is live: keep it (insert it, for a new key).
    Keep,
    /// The state is dead: drop it (never insert it).
    Idle,
    /// The decision was refused before touching the state: change nothing.
    Untouched,
}

impl Effect {
    /// [`Effect::Idle`] if `dead`, else [`Effect::Keep`].
    #[inline]
    pub fn after(dead: bool) -> Effect {
        if dead {
            Effect::Idle
        } else {
            Effect::Keep
        }
    }
}

/// The sharded keyed-state table; see the [module docs](self).
pub struct Table<P: Policy> {
    shards: Box<[Shard<P::State>]>,
    hasher: foldhash::fast::RandomState,
    /// `ceil(max_keys / shards)`.
    shard_cap: usize,
    options: TableOptions,
    policy: P,
    /// Touched only on rare events (capacity, sweeps), so one shared line is
    /// no contention point.
    untracked: AtomicU64,
    rejected: AtomicU64,
    swept: AtomicU64,
}

/// One shard, alone on its cache line(s) so neighbouring shards' locks
/// never share a line (128 bytes covers adjacent-line prefetching too).
#[repr(align(128))]
struct Shard<S> {
    inner: RwLock<ShardInner<S>>,
    /// The table's length, published after every change made under the lock
    /// so [`Table::len`] can read it without locking. Kept per shard (not
    /// one global counter) so inserts on different shards never touch a
    /// shared line.
    len: AtomicUsize,
}

/// What a shard's lock guards. Aligned to its own cache line(s), apart
/// from the lock word: the table's header changes only under the write
/// lock, so readers on several cores keep it cached side by side, while
/// the lock word they all write to moves between them.
#[repr(align(128))]
struct ShardInner<S> {
    table: HashTable<Slot<S>>,
    /// When this shard was last swept, to rate-limit capacity sweeps.
    last_sweep: Option<Nanos>,
}

/// One stored state. The limit travels with it so a sweep can ask whether
/// the state is dead without a plan at hand; keys name their parameters
/// ([`crate::LimitId`]), so the limit stored for a key is the one every
/// plan for that key brings.
struct Slot<S> {
    key: Key,
    state: S,
    limit: Arc<Limit>,
}

/// The stored key and limit of a state taken out for a decision, or `None`
/// if the key was not stored.
type Kept = Option<(Key, Arc<Limit>)>;

/// Where each item of a multi-key plan lives: its guard's position in the
/// lock order and its hash.
#[derive(Copy, Clone)]
struct Placement<'a> {
    pos: &'a [usize],
    hashes: &'a [u64],
}

impl<P: Policy> std::fmt::Debug for Table<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("options", &self.options)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<P: Policy> Table<P> {
    /// An empty table sized by `options` (shards clamped to `1..=65536`),
    /// keeping states as `policy` says.
    pub fn new(mut options: TableOptions, policy: P) -> Table<P> {
        options.shards = options.shards.clamp(1, MAX_SHARDS);
        let shards = (0..options.shards)
            .map(|_| Shard {
                inner: RwLock::new(ShardInner {
                    table: HashTable::new(),
                    last_sweep: None,
                }),
                len: AtomicUsize::new(0),
            })
            .collect();
        Table {
            shards,
            hasher: foldhash::fast::RandomState::default(),
            shard_cap: options.max_keys.div_ceil(options.shards),
            options,
            policy,
            untracked: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            swept: AtomicU64::new(0),
        }
    }

    /// The options in effect (after clamping).
    pub fn options(&self) -> &TableOptions {
        &self.options
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// Keys stored: per-shard counts summed without locking, so under
    /// concurrent traffic a moment's approximation.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.len.load(Ordering::Relaxed))
            .fold(0, usize::saturating_add)
    }

    /// Whether no key is stored (see [`Table::len`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Current counters (`keys` as [`Table::len`]).
    pub fn stats(&self) -> TableStats {
        TableStats {
            keys: self.len(),
            untracked_decisions: self.untracked.load(Ordering::Relaxed),
            rejected_at_capacity: self.rejected.load(Ordering::Relaxed),
            swept: self.swept.load(Ordering::Relaxed),
        }
    }

    /// Decides one key in place: `decide` sees its stored state, or a fresh
    /// one ([`Policy::fresh`]) if it is not stored, and says by its
    /// [`Effect`] what becomes of it. A live new state is stored if there
    /// is room ([`AtCapacity`] otherwise); a stored one follows `arc`, the
    /// key's limit (a reloaded config brings an equal limit in a new
    /// allocation).
    ///
    /// Generic over what `decide` returns, so each caller carries out of
    /// the lock only what it needs. Always inlined, so that each caller's
    /// `decide` can be inlined into it. Fails only with
    /// [`StoreError::AtCapacity`].
    #[inline(always)]
    pub fn decide_one<T>(
        &self,
        key: &Key,
        arc: &Arc<Limit>,
        now: Nanos,
        decide: impl FnOnce(&Limit, &mut P::State) -> (T, Effect),
    ) -> Result<T, StoreError> {
        let limit: &Limit = arc;
        let hash = self.hash(key);
        let shard = &self.shards[self.shard_of(hash)];
        // A blocking lock: nothing below awaits, and the hold is one probe
        // plus one algorithm step.
        let mut inner = shard.inner.write();
        let mut entry = inner.table.find_entry(hash, |s| s.key == *key).ok();
        // `decide` is called at one place, for a stored or a fresh state,
        // so that it is inlined and its answer is not copied around.
        let mut fresh = None;
        let state = match &mut entry {
            Some(e) => &mut e.get_mut().state,
            None => fresh.insert(self.policy.fresh(limit)),
        };
        // The answer is returned as is, not wrapped in a `Result` inside
        // the lock: moving it through such layers cost about a third of a
        // hot-key decision (`docs/benchmarks.md`).
        let (decision, effect) = decide(limit, state);
        match (entry, fresh) {
            _ if effect == Effect::Untouched => Ok(decision),
            (Some(entry), _) => {
                if effect == Effect::Idle {
                    let (garbage, _) = entry.remove();
                    shard.len.store(inner.table.len(), Ordering::Relaxed);
                    drop(inner);
                    // Freed after unlocking: the key's heap and the limit's
                    // reference count need not hold up the shard.
                    drop(garbage);
                } else {
                    let slot = entry.into_mut();
                    if !Arc::ptr_eq(&slot.limit, arc) {
                        // A reloaded config brought an equal limit in a new
                        // allocation; follow it so the old one can be freed.
                        slot.limit = Arc::clone(arc);
                    }
                    // The table did not change: no length to publish,
                    // nothing to record.
                }
                Ok(decision)
            }
            (None, Some(state)) if effect == Effect::Keep => {
                let slot = Slot {
                    key: key.clone(),
                    state,
                    limit: Arc::clone(arc),
                };
                self.insert_new(shard, inner, hash, slot, now, decision)
            }
            // A fresh state left dead needs no room.
            _ => Ok(decision),
        }
    }

    /// Decides one *stored* key under its shard's read lock, so that
    /// decisions on one key by several threads run side by side: `decide`
    /// sees the stored state by shared reference and may change it only
    /// through the state's own atomics (the store's business: see the
    /// memory store's `Stored`). It answers `None` when the decision needs
    /// the write lock after all (the state would be left dead, say); so
    /// does this method, without calling `decide`, when the key is not
    /// stored or is stored with another allocation of its limit (a
    /// reloaded config, which [`Table::decide_one`] follows). The caller
    /// then decides through [`Table::decide_one`]: the table never changes
    /// on this path, so a `None` has changed nothing.
    ///
    /// [`Table::decide_one`] then hashes the key again. Handing it this
    /// hash instead was tried: keeping the hash live across this call cost
    /// the decisions this path answers (the common case: a stored key) 6
    /// to 10 instructions each, of 240 to 380 (callgrind,
    /// `benches/instructions.sh`), to save hashing the key again (about
    /// 22) on the rarer ones that go on to the write lock.
    ///
    /// Every other operation takes the write lock, so a multi-key plan
    /// never sees a state while a shared decision is changing it.
    #[inline(always)]
    pub fn decide_shared<T>(
        &self,
        key: &Key,
        arc: &Arc<Limit>,
        decide: impl FnOnce(&Limit, &P::State) -> Option<T>,
    ) -> Option<T> {
        let hash = self.hash(key);
        let lock = &self.shards[self.shard_of(hash)].inner;
        // `try_read` first: when only readers hold the lock it retries a
        // lost compare-and-swap on the reader count at once, where `read`
        // backs off with growing runs of `pause` — which, with two threads
        // reading one hot key, cost more than the decision itself
        // (`docs/benchmarks.md`). It fails only if a writer holds or awaits
        // the lock (parking_lot lets no reader past a writer that waits for
        // readers to leave); `read` then waits, parked. Keep it one
        // `try_read` then `read`, never a loop of `try_read`: a failed
        // `try_read` takes no place in the lock's queue, so it never holds
        // up a waiting writer, but a reader spinning on it would burn a
        // core for as long as the writer keeps the lock (a sweep of the
        // whole shard, say; maybe on the core that writer needs) and, never
        // queued, could be passed over by writer after writer. Parked in
        // `read`, it is woken when the writer unlocks.
        let inner = match lock.try_read() {
            Some(inner) => inner,
            None => lock.read(),
        };
        let slot = inner.table.find(hash, |s| s.key == *key)?;
        if !Arc::ptr_eq(&slot.limit, arc) {
            return None;
        }
        decide(arc, &slot.state)
    }

    /// Stores a new key's state after its first decision, making room or
    /// applying [`AtCapacity`] when the shard is full. Out of line: the
    /// common case is a key already stored.
    #[inline(never)]
    fn insert_new<T>(
        &self,
        shard: &Shard<P::State>,
        mut inner: RwLockWriteGuard<'_, ShardInner<P::State>>,
        hash: u64,
        slot: Slot<P::State>,
        now: Nanos,
        decision: T,
    ) -> Result<T, StoreError> {
        let mut events = Events::default();
        let result = if self.make_room(&mut inner, 1, now, &mut events) {
            inner
                .table
                .insert_unique(hash, slot, |s| self.hasher.hash_one(&s.key));
            Ok(decision)
        } else {
            match self.options.at_capacity {
                AtCapacity::DecideUntracked => {
                    events.untracked = 1;
                    Ok(decision)
                }
                AtCapacity::Reject => {
                    // The fresh state was never stored: dropping it changes
                    // nothing.
                    events.rejected = true;
                    Err(StoreError::AtCapacity(self.options.max_keys))
                }
            }
        };
        shard.len.store(inner.table.len(), Ordering::Relaxed);
        drop(inner);
        self.record(events);
        result
    }

    /// Decides every key of `plan` together, all or nothing: locks their
    /// shards in ascending order, takes the states out (fresh ones for keys
    /// not stored), hands them to `decide` in the plan's order, and puts
    /// back what is not dead ([`Policy::is_dead`]), stored keys first so a
    /// new key never takes a slot from one. New keys that find no room
    /// are forgotten under [`AtCapacity::DecideUntracked`]; under
    /// [`AtCapacity::Reject`] the whole decision is undone and fails with
    /// [`StoreError::AtCapacity`].
    ///
    /// `decide` must leave the states as it found them when it fails (the
    /// core's `plan::decide` does): they are put back as they are.
    pub fn decide_many<T>(
        &self,
        plan: &Plan,
        now: Nanos,
        decide: impl FnOnce(&mut [P::State]) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let items = plan.items();
        let hashes: SmallVec<[u64; 4]> = items.iter().map(|i| self.hash(&i.key)).collect();
        let shard_ids: SmallVec<[usize; 4]> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        // Each item's guard is `guards[pos[i]]`. Nothing awaits while these
        // are held.
        let (order, pos) = crate::plan::lock_order(&shard_ids);
        let mut guards: SmallVec<[RwLockWriteGuard<'_, ShardInner<P::State>>; 4]> = order
            .iter()
            .map(|&s| self.shards[s].inner.write())
            .collect();

        // Take each state out of its table (or start fresh on a miss),
        // remembering the stored key and limit of those that were present.
        // The plan's keys are distinct, so no key is looked for twice.
        let mut states: SmallVec<[P::State; 4]> = SmallVec::with_capacity(items.len());
        let mut stored: SmallVec<[Kept; 4]> = SmallVec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match guards[pos[i]]
                .table
                .find_entry(hashes[i], |s| s.key == item.key)
            {
                Ok(entry) => {
                    let (slot, _) = entry.remove();
                    states.push(slot.state);
                    stored.push(Some((slot.key, slot.limit)));
                }
                Err(_) => {
                    states.push(self.policy.fresh(&item.limit));
                    stored.push(None);
                }
            }
        }
        let placement = Placement {
            pos: &pos,
            hashes: &hashes,
        };

        // Under `Reject`, a shard that may not fit the plan's new keys
        // needs the pre-decision states kept, to undo the decision if it
        // turns out they do not fit.
        let tight = self.options.at_capacity == AtCapacity::Reject && {
            let mut in_shard: SmallVec<[usize; 4]> = SmallVec::from_elem(0, guards.len());
            for &p in &pos {
                in_shard[p] += 1;
            }
            guards
                .iter()
                .zip(&in_shard)
                .any(|(g, &n)| g.table.len().saturating_add(n) > self.shard_cap)
        };
        let originals = tight.then(|| states.clone());

        let decision = match decide(&mut states) {
            Ok(decision) => decision,
            Err(e) => {
                // `decide` fails before changing any state: put them all
                // back as they were.
                self.put_back(&mut guards, placement, states, stored);
                self.publish_lens(&order, &guards);
                drop(guards);
                return Err(e);
            }
        };
        let mut events = Events::default();
        let mut garbage: SmallVec<[(Key, Arc<Limit>); 4]> = SmallVec::new();

        let dead: SmallVec<[bool; 4]> = items
            .iter()
            .zip(&states)
            .map(|(item, state)| self.policy.is_dead(&item.limit, state, now))
            .collect();

        if let Some(originals) = originals {
            // Per shard: states going back, and new states needing a slot.
            let mut back: SmallVec<[usize; 4]> = SmallVec::from_elem(0, guards.len());
            let mut new: SmallVec<[usize; 4]> = SmallVec::from_elem(0, guards.len());
            for i in (0..items.len()).filter(|&i| !dead[i]) {
                if stored[i].is_some() {
                    back[pos[i]] += 1;
                } else {
                    new[pos[i]] += 1;
                }
            }
            let fits = (0..guards.len()).all(|p| {
                new[p] == 0 || self.make_room(&mut guards[p], back[p] + new[p], now, &mut events)
            });
            if !fits {
                self.put_back(&mut guards, placement, originals, stored);
                self.publish_lens(&order, &guards);
                drop(guards);
                events.rejected = true;
                self.record(events);
                return Err(StoreError::AtCapacity(self.options.max_keys));
            }
        }

        // States that were stored go back first: they had their slots, and
        // a new key must not take one from them.
        let mut pending: SmallVec<[(usize, P::State); 4]> = SmallVec::new();
        for (i, (state, kept)) in states.into_iter().zip(stored).enumerate() {
            match kept {
                Some((key, limit)) => {
                    if dead[i] {
                        garbage.push((key, limit));
                    } else {
                        // See `decide_one` on following a reloaded limit.
                        let limit = if Arc::ptr_eq(&limit, &items[i].limit) {
                            limit
                        } else {
                            Arc::clone(&items[i].limit)
                        };
                        let slot = Slot { key, state, limit };
                        guards[pos[i]]
                            .table
                            .insert_unique(hashes[i], slot, |s| self.hasher.hash_one(&s.key));
                    }
                }
                None if !dead[i] => pending.push((i, state)),
                None => {}
            }
        }
        let mut untracked = 0;
        for (i, state) in pending {
            if self.make_room(&mut guards[pos[i]], 1, now, &mut events) {
                let slot = Slot {
                    key: items[i].key.clone(),
                    state,
                    limit: Arc::clone(&items[i].limit),
                };
                guards[pos[i]]
                    .table
                    .insert_unique(hashes[i], slot, |s| self.hasher.hash_one(&s.key));
            } else {
                // Under `Reject` the check above already made room, so this
                // is `DecideUntracked`: the state is forgotten.
                untracked += 1;
            }
        }
        events.untracked = untracked;
        self.publish_lens(&order, &guards);
        drop(guards);
        drop(garbage);
        self.record(events);
        Ok(decision)
    }

    /// Updates one key in place, making room for it first if it is not
    /// stored: `update` sees the stored state (and `true`), or a fresh one
    /// (and `false`), and says by its [`Effect`] what becomes of it (a
    /// live fresh state is stored). `None`, with `update` never called,
    /// when the key is not stored and its shard is full: counted as
    /// untracked whatever [`AtCapacity`] says, since nothing was decided.
    /// What a peer sends is merged this way.
    pub fn update<T>(
        &self,
        key: &Key,
        limit: &Arc<Limit>,
        now: Nanos,
        update: impl FnOnce(&mut P::State, bool) -> (T, Effect),
    ) -> Option<T> {
        let hash = self.hash(key);
        let shard = &self.shards[self.shard_of(hash)];
        let mut inner = shard.inner.write();
        let mut events = Events::default();
        let out = match inner.table.find_entry(hash, |s| s.key == *key) {
            Ok(mut entry) => {
                let (out, effect) = update(&mut entry.get_mut().state, true);
                match effect {
                    Effect::Idle => drop(entry.remove()),
                    Effect::Keep => {
                        let slot = entry.into_mut();
                        if !Arc::ptr_eq(&slot.limit, limit) {
                            slot.limit = Arc::clone(limit);
                        }
                    }
                    Effect::Untouched => {}
                }
                Some(out)
            }
            Err(_) => {
                if self.make_room(&mut inner, 1, now, &mut events) {
                    let mut state = self.policy.fresh(limit);
                    let (out, effect) = update(&mut state, false);
                    if effect == Effect::Keep {
                        let slot = Slot {
                            key: key.clone(),
                            state,
                            limit: Arc::clone(limit),
                        };
                        inner
                            .table
                            .insert_unique(hash, slot, |s| self.hasher.hash_one(&s.key));
                    }
                    Some(out)
                } else {
                    events.untracked = 1;
                    None
                }
            }
        };
        shard.len.store(inner.table.len(), Ordering::Relaxed);
        drop(inner);
        self.record(events);
        out
    }

    /// Runs `f` on `key`'s stored limit and state under its shard's lock;
    /// `None` if the key is not stored.
    pub fn with_stored<T>(
        &self,
        key: &Key,
        f: impl FnOnce(&Arc<Limit>, &mut P::State) -> T,
    ) -> Option<T> {
        let hash = self.hash(key);
        let mut inner = self.shards[self.shard_of(hash)].inner.write();
        let slot = inner.table.find_mut(hash, |s| s.key == *key)?;
        Some(f(&slot.limit, &mut slot.state))
    }

    /// Forgets `key`; returns its state, if it was stored.
    pub fn remove(&self, key: &Key) -> Option<P::State> {
        let hash = self.hash(key);
        let shard = &self.shards[self.shard_of(hash)];
        let mut inner = shard.inner.write();
        let slot = match inner.table.find_entry(hash, |s| s.key == *key) {
            Ok(entry) => entry.remove().0,
            Err(_) => return None,
        };
        shard.len.store(inner.table.len(), Ordering::Relaxed);
        drop(inner);
        Some(slot.state)
    }

    /// Runs `f` on every stored key, its limit and state, locking each
    /// shard in turn (so it sees no one moment's whole table, and `f` must
    /// not touch the table).
    pub fn for_each(&self, mut f: impl FnMut(&Key, &Arc<Limit>, &mut P::State)) {
        for shard in self.shards.iter() {
            let mut inner = shard.inner.write();
            for slot in inner.table.iter_mut() {
                f(&slot.key, &slot.limit, &mut slot.state);
            }
        }
    }

    /// Drops every dead state ([`Policy::is_dead`]), locking each shard in
    /// turn for one pass over it. Returns how many were dropped.
    pub fn sweep(&self, now: Nanos) -> u64 {
        let mut swept = 0;
        for shard in self.shards.iter() {
            let mut inner = shard.inner.write();
            swept = self.sweep_shard(&mut inner, now).saturating_add(swept);
            shard.len.store(inner.table.len(), Ordering::Relaxed);
        }
        self.record(Events {
            swept,
            ..Events::default()
        });
        swept
    }

    fn hash(&self, key: &Key) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of `hash`: Lemire's multiply-shift over the bits below
    /// hashbrown's tag, so any shard count works and the result is always
    /// `< shards.len()`.
    fn shard_of(&self, hash: u64) -> usize {
        let bits = u128::from(hash << HASHBROWN_TAG_BITS);
        ((bits * self.shards.len() as u128) >> 64) as usize
    }

    fn record(&self, events: Events) {
        if !events.any() {
            return;
        }
        if events.swept > 0 {
            self.swept.fetch_add(events.swept, Ordering::Relaxed);
        }
        if events.untracked > 0 {
            self.untracked.fetch_add(1, Ordering::Relaxed);
        }
        if events.rejected {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        self.policy.record(&events, self.len());
    }

    /// Whether `inner` can take `extra` more keys, sweeping it first if it
    /// cannot and a sweep is due.
    fn make_room(
        &self,
        inner: &mut ShardInner<P::State>,
        extra: usize,
        now: Nanos,
        events: &mut Events,
    ) -> bool {
        let fits = |inner: &ShardInner<P::State>| {
            inner.table.len().saturating_add(extra) <= self.shard_cap
        };
        if fits(inner) {
            return true;
        }
        let due = inner
            .last_sweep
            .is_none_or(|last| now.saturating_sub(last) >= self.options.sweep_interval);
        if due {
            events.swept = self.sweep_shard(inner, now).saturating_add(events.swept);
        }
        fits(inner)
    }

    /// Drops every dead state of one shard; returns how many.
    fn sweep_shard(&self, inner: &mut ShardInner<P::State>, now: Nanos) -> u64 {
        let before = inner.table.len();
        inner
            .table
            .retain(|s| !self.policy.is_dead(&s.limit, &s.state, now));
        let after = inner.table.len();
        // Give memory back after a flood has drained, but only when the
        // table is mostly empty, so a shard near its working size does not
        // shrink and regrow on every sweep.
        if inner.table.capacity() > after.saturating_mul(4).max(64) {
            inner
                .table
                .shrink_to(after, |s| self.hasher.hash_one(&s.key));
        }
        inner.last_sweep = Some(now);
        before.saturating_sub(after) as u64
    }

    /// Reinserts the states that were stored before the decision, exactly
    /// as given (dead or not): used when the decision must change nothing.
    fn put_back(
        &self,
        guards: &mut [RwLockWriteGuard<'_, ShardInner<P::State>>],
        placement: Placement<'_>,
        states: SmallVec<[P::State; 4]>,
        stored: SmallVec<[Kept; 4]>,
    ) {
        for (i, (state, kept)) in states.into_iter().zip(stored).enumerate() {
            if let Some((key, limit)) = kept {
                let slot = Slot { key, state, limit };
                guards[placement.pos[i]]
                    .table
                    .insert_unique(placement.hashes[i], slot, |s| self.hasher.hash_one(&s.key));
            }
        }
    }

    fn publish_lens(&self, order: &[usize], guards: &[RwLockWriteGuard<'_, ShardInner<P::State>>]) {
        for (&s, guard) in order.iter().zip(guards) {
            self.shards[s]
                .len
                .store(guard.table.len(), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard's size, as `docs/benchmarks.md` (Memory) gives it: the lock
    /// word, the table header it guards and the length, each on its own
    /// 128 bytes. It does not depend on the state kept, so the replica's
    /// table pays the same.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_shard_is_384_bytes_whatever_its_state() {
        assert_eq!(std::mem::size_of::<Shard<u64>>(), 384);
        assert_eq!(std::mem::size_of::<Shard<[u64; 64]>>(), 384);
        assert_eq!(std::mem::align_of::<Shard<u64>>(), 128);
    }
}
