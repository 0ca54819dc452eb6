//! [`MemoryStore`]: the embedded, in-process store, and tollgate's default.
//!
//! # What it is for
//!
//! One tollgate process (or a Rust program embedding the store, or `tollgate
//! replay` and the benchmarks, which call the synchronous `*_now` methods)
//! keeps every limit's state in its own memory and decides plans against
//! it. It is the reference store: the Redis and replicated stores must
//! answer what this one answers.
//!
//! # What it is not for
//!
//! Sharing limits between processes: two `MemoryStore`s know nothing of each
//! other, so two servers each grant a full limit. Nor persistence: state is
//! lost on restart, which errs on the lenient side (Charon §1, goal 2).
//!
//! # Why this design
//!
//! The algorithm is the core's pure function `(params, &mut state, now,
//! hits) -> decision`; the store only owns atomicity (governor's habit:
//! the limiter applies a pure update atomically, the algorithm never knows
//! how). Here atomicity is a lock around the state, kept in the keyed-state
//! table [`crate::table`] shares with the replicated store, and for GCRA
//! (and the leaky bucket, the same state) a compare-and-swap:
//!
//! - Keys are hashed once (foldhash) into a boxed slice of shards, each a
//!   `parking_lot::RwLock` around a `hashbrown::HashTable`, padded to its
//!   own cache line so two cores working on different shards never
//!   invalidate each other's line. With many shards, two requests rarely
//!   meet on one lock unless they use the same key.
//! - A one-limit plan (the common case) takes one hash, one lock and one
//!   probe, and decides the state in place (for GCRA and the leaky bucket,
//!   a few decisions take two of each: below). In `Try` mode it calls the
//!   core's `plan::decide_one`, one dispatch for room, commit and the idle
//!   check, and builds the half-kilobyte `PlanDecision` only after
//!   unlocking (`docs/benchmarks.md`).
//! - A stored GCRA or leaky-bucket state is one timestamp, kept in an
//!   atomic (`Stored`): a one-limit decision on it takes the shard's *read*
//!   lock, decides on a copy, and stores the new timestamp with one
//!   compare-and-swap (deciding again if another thread got there first),
//!   governor's design. A rejection only reads, so threads rejected on one
//!   hot key are answered side by side instead of taking turns. What this
//!   path cannot do (store a new key, drop a state left idle, follow a
//!   reloaded limit) it leaves to the write lock, having changed nothing:
//!   such a decision (a key's first, one untracked at the cap, one that
//!   leaves its state idle, the first after a reload) takes a hash, the
//!   read lock and a probe, then a hash, the write lock and a probe again
//!   (reusing the hash made the common case dearer: see
//!   [`Table::decide_shared`]).
//!   Every other algorithm's state, being larger than one word, is decided
//!   under the write lock.
//! - A plan over several keys locks every shard it touches in ascending
//!   index order (so two plans can never wait on each other in a cycle),
//!   takes the states out, runs [`tollgate_core::plan::decide`] over them
//!   and writes them back. Holding all the write locks for the whole
//!   decision is what makes it all or nothing: nobody can observe or change
//!   one limit between the room check and the commit of another, not even
//!   a compare-and-swap, which only runs under a read lock.
//! - Nothing awaits while a shard lock is held — every decision is plain
//!   synchronous arithmetic — so a blocking lock is right, and the
//!   [`Store`] futures are ready on their first poll.
//!
//! # Memory bound and behaviour at the cap
//!
//! A state that is idle (equivalent to a fresh one now and later, see
//! [`Algorithm::is_idle`]) is never stored: a decision that leaves a state
//! idle removes it, and [`MemoryStore::sweep_now`] (which the caller runs on
//! a timer, every [`MemoryStoreOptions::sweep_interval`] say) drops every
//! idle state. Each entry remembers its [`Limit`] so that a sweep can tell
//! idleness without a plan at hand.
//!
//! On top of that, [`MemoryStoreOptions::max_keys`] is a hard cap, enforced
//! per shard as `ceil(max_keys / shards)` (so the store never holds more
//! than `shards × ceil(max_keys / shards)` keys, which is `max_keys` when
//! `shards` divides it). When a decision would store a *new* key in a full
//! shard, the store first sweeps that shard — at most once per
//! `sweep_interval`, so a flood of unique keys cannot make every insert cost
//! a scan of the shard — and if the shard is still full it applies
//! [`AtCapacity`]:
//!
//! - [`AtCapacity::DecideUntracked`] (the default): the new key is decided
//!   on a fresh state, which is then forgotten. Existing keys keep being
//!   limited exactly; new keys get their first request's worth of leniency
//!   each time, rather than the service failing closed (Charon §1, goal 2).
//!   Counted in [`StoreStats::untracked_decisions`] and
//!   `tollgate_store_untracked_decisions_total`.
//! - [`AtCapacity::Reject`]: the decision fails with
//!   [`StoreError::AtCapacity`] and changes nothing, not even the plan's
//!   existing keys. Counted in [`StoreStats::rejected_at_capacity`] and
//!   `tollgate_store_rejected_at_capacity_total`.
//!
//! Only keys whose state would be stored count: a new key that stays idle
//! (a rejected request, say) never needs room and never hits the cap.
//!
//! # Metrics
//!
//! Emitted through the `metrics` facade: gauge `tollgate_store_keys`,
//! counters `tollgate_store_untracked_decisions_total`,
//! `tollgate_store_rejected_at_capacity_total` and
//! `tollgate_store_swept_keys_total`. The gauge is refreshed by every sweep
//! and at-capacity event, not by every insert: a gauge is sampled anyway,
//! and a registry lookup per insert would sit on the hot path.
//! [`MemoryStore::stats`] reads exact figures at any time.
//!
//! # Copy pools
//!
//! Copy-limited resources ([`CopyPool`]) live in one map behind one mutex,
//! with an index from transfer id to pool; see [`MemoryStore::reserve_now`].

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::Mutex;
use smallvec::SmallVec;
use tollgate_core::algorithms::gcra::GcraState;
use tollgate_core::copies::{
    CopyContext, CopyError, CopyLimits, CopyPool, Groups, Reservation, TransferId,
};
use tollgate_core::plan::{self, PlanEntry};
use tollgate_core::{Algorithm, Decision, Hits, Limit, LimitState, Mode, Nanos, PlanDecision};

use crate::error::StoreError;
use crate::key::{Key, PoolKey};
use crate::plan::{Plan, PlanItem};
use crate::table::{Effect, Events, Policy, Table, TableOptions, MAX_SHARDS};
use crate::{Held, OpId, Seized, Store};

pub use crate::table::AtCapacity;

const KEYS_GAUGE: &str = "tollgate_store_keys";
const UNTRACKED_COUNTER: &str = "tollgate_store_untracked_decisions_total";
const REJECTED_COUNTER: &str = "tollgate_store_rejected_at_capacity_total";
const SWEPT_COUNTER: &str = "tollgate_store_swept_keys_total";
const TRANSFERS_GAUGE: &str = "tollgate_store_transfers_pending";
const TRANSFERS_REFUSED_COUNTER: &str = "tollgate_store_transfers_refused_total";

/// How a [`MemoryStore`] is sized. `Default` suits a server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryStoreOptions {
    /// Number of independently locked shards, clamped to `1..=65536`.
    /// Default: the next power of two at or above four per available CPU,
    /// at least 16.
    pub shards: usize,
    /// The most limit states kept, enforced per shard as
    /// `ceil(max_keys / shards)`. Default: 10 million.
    pub max_keys: usize,
    /// What to do with a new key when its shard is full.
    pub at_capacity: AtCapacity,
    /// The most transfers staged at once (each holds copies until seized
    /// or expired): bounds the transfer index whatever clients do, also
    /// for unconfigured resources, whose limits are unbounded. Default:
    /// one million.
    pub max_transfers: usize,
    /// The least time between two capacity-triggered sweeps of one shard,
    /// and a sensible period for the caller's [`MemoryStore::sweep_now`]
    /// timer. Default: one second.
    pub sweep_interval: Nanos,
}

impl Default for MemoryStoreOptions {
    fn default() -> MemoryStoreOptions {
        let cpus = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        let shards = cpus
            .saturating_mul(4)
            .max(16)
            .checked_next_power_of_two()
            .unwrap_or(MAX_SHARDS);
        MemoryStoreOptions {
            shards,
            max_keys: 10_000_000,
            max_transfers: 1_000_000,
            at_capacity: AtCapacity::default(),
            sweep_interval: Nanos::SECOND,
        }
    }
}

/// A snapshot of a [`MemoryStore`]'s counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Limit states stored now.
    pub keys: usize,
    /// Decisions that could not store a new key because its shard was full
    /// ([`AtCapacity::DecideUntracked`]).
    pub untracked_decisions: u64,
    /// Decisions refused because a shard was full ([`AtCapacity::Reject`]).
    pub rejected_at_capacity: u64,
    /// Idle states dropped by sweeps (timer or capacity-triggered).
    pub swept: u64,
}

/// The embedded in-memory [`Store`]; see the [module docs](self).
pub struct MemoryStore {
    /// The limit states: the shared keyed-state table ([`crate::table`]).
    table: Table<MemoryPolicy>,
    options: MemoryStoreOptions,
    /// One mutex for every pool and the transfer index: a pool is one
    /// resource whose counts must change atomically anyway, so splitting
    /// the map would only separate different resources, which are few;
    /// a pool operation is a handful of small map updates; and keeping the
    /// index under the same lock keeps transfer, seize and expiry consistent
    /// without a lock order.
    pools: Mutex<Pools>,
}

/// How the memory store keeps its states: a [`Stored`] state, forgotten as
/// soon as it is idle (equivalent to a fresh one now and later), and
/// capacity events counted in the store's metrics.
struct MemoryPolicy;

impl Policy for MemoryPolicy {
    type State = Stored;

    #[inline]
    fn fresh(&self, limit: &Limit) -> Stored {
        Stored::new(limit.fresh())
    }

    fn is_dead(&self, limit: &Limit, state: &Stored, now: Nanos) -> bool {
        match state {
            Stored::Tat(tat) => limit.is_idle(&tat_state(tat.load(Ordering::Relaxed)), now),
            Stored::Any(state) => limit.is_idle(state, now),
        }
    }

    fn record(&self, events: &Events, keys: usize) {
        if events.swept > 0 {
            metrics::counter!(SWEPT_COUNTER).increment(events.swept);
        }
        if events.untracked > 0 {
            // Counted per decision, as `StoreStats::untracked_decisions`.
            metrics::counter!(UNTRACKED_COUNTER).increment(1);
        }
        if events.rejected {
            metrics::counter!(REJECTED_COUNTER).increment(1);
        }
        metrics::gauge!(KEYS_GAUGE).set(keys as f64);
    }
}

/// A limit state as the memory store keeps it.
///
/// GCRA's and the leaky bucket's state is one timestamp, the theoretical
/// arrival time: it is kept in an atomic, so that a single-limit decision
/// on it runs under its shard's *read* lock ([`Table::decide_shared`]) and
/// applies its new state with one compare-and-swap, as governor does. A
/// rejection then changes nothing and only reads, so threads rejected on
/// one hot key are answered side by side instead of taking turns. Every
/// other state, and every decision that needs more (a plan over several
/// keys, a new key, a state left idle), is decided under the write lock,
/// which no shared decision holds at the same time.
///
/// Invariant: `Any` never holds a [`LimitState::Gcra`] ([`Stored::new`]).
enum Stored {
    /// A [`GcraState`]'s `tat`, in nanoseconds since the Unix epoch.
    Tat(AtomicU64),
    /// Any other algorithm's state.
    Any(LimitState),
}

/// A GCRA state at `tat`.
#[inline(always)]
fn tat_state(tat: u64) -> LimitState {
    LimitState::Gcra(GcraState {
        tat: Nanos::new(tat),
    })
}

impl Stored {
    /// `state` in its kept form.
    #[inline]
    fn new(state: LimitState) -> Stored {
        match state {
            LimitState::Gcra(s) => Stored::Tat(AtomicU64::new(s.tat.as_u64())),
            other => Stored::Any(other),
        }
    }

    /// The state in place, for exclusive access (under the write lock); a
    /// [`Stored::Tat`] is unpacked first. Give it back its kept form with
    /// [`Stored::pack`] once done.
    #[inline(always)]
    fn unpacked(&mut self) -> &mut LimitState {
        match self {
            Stored::Any(state) => state,
            Stored::Tat(_) => self.unpack(),
        }
    }

    /// Makes a [`Stored::Tat`] the `Any` it stands for. Out of line: a
    /// stored GCRA state is decided under the read lock, and comes here
    /// only for what that path cannot do (a new key, a state left idle, a
    /// plan over several keys).
    #[inline(never)]
    fn unpack(&mut self) -> &mut LimitState {
        if let Stored::Tat(tat) = self {
            *self = Stored::Any(tat_state(*tat.get_mut()));
        }
        match self {
            Stored::Any(state) => state,
            // Not reached (just unpacked); unpacking again keeps this total
            // without a panic.
            Stored::Tat(_) => self.unpack(),
        }
    }

    /// Restores the kept form after [`Stored::unpacked`]: a GCRA state,
    /// unpacked or fresh (one that replaced another algorithm's state when
    /// parameters changed under a key), goes back into the atomic.
    #[inline(always)]
    fn pack(&mut self) {
        if let Stored::Any(LimitState::Gcra(state)) = self {
            *self = Stored::Tat(AtomicU64::new(state.tat.as_u64()));
        }
    }
}

impl Clone for Stored {
    fn clone(&self) -> Stored {
        match self {
            Stored::Tat(tat) => Stored::Tat(AtomicU64::new(tat.load(Ordering::Relaxed))),
            Stored::Any(state) => Stored::Any(state.clone()),
        }
    }
}

/// Decides a virtual-time state shared by several threads: `decide` runs
/// on a copy of the state read from `cell`, and its new state is stored by
/// compare-and-swap, deciding again from the current state if another
/// thread changed it meanwhile. A decision that changes nothing (a
/// rejection) is one load. `None`, having changed nothing, when the state
/// would be left idle (it must then be removed, under the write lock).
#[inline(always)]
fn decide_tat<T>(
    cell: &AtomicU64,
    decide: impl Fn(&mut GcraState) -> Option<(T, bool)>,
) -> Option<T> {
    // Relaxed: the state is this one word, and nothing else is published
    // through it; the shard's lock orders it against exclusive access.
    let mut seen = cell.load(Ordering::Relaxed);
    loop {
        let mut state = GcraState {
            tat: Nanos::new(seen),
        };
        let (out, idle) = decide(&mut state)?;
        if idle {
            return None;
        }
        let after = state.tat.as_u64();
        if after == seen {
            return Some(out);
        }
        match cell.compare_exchange_weak(seen, after, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(out),
            Err(current) => seen = current,
        }
    }
}

/// Whether `limit`'s state is kept packed in a [`Stored::Tat`].
#[inline(always)]
fn packed(limit: &Limit) -> bool {
    matches!(limit, Limit::Gcra(_) | Limit::LeakyBucket(_))
}

/// One algorithm's decision, and whether it left the state idle.
#[inline(always)]
fn alone<A: Algorithm>(
    alg: &A,
    state: &mut A::State,
    now: Nanos,
    request: Hits,
) -> (Decision, bool) {
    let alone = alg.decide_alone(state, now, request);
    (alone.decision, alone.idle)
}

#[derive(Default)]
struct Pools {
    pools: HashMap<PoolKey, CopyPool>,
    transfers: HashMap<TransferId, PoolKey>,
}

impl Default for MemoryStore {
    fn default() -> MemoryStore {
        MemoryStore::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("options", &self.options)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A store with [`MemoryStoreOptions::default`].
    pub fn new() -> MemoryStore {
        MemoryStore::with_options(MemoryStoreOptions::default())
    }

    /// A store sized by `options` (shards clamped to `1..=65536`).
    pub fn with_options(mut options: MemoryStoreOptions) -> MemoryStore {
        options.shards = options.shards.clamp(1, MAX_SHARDS);
        let table = Table::new(
            TableOptions {
                shards: options.shards,
                max_keys: options.max_keys,
                at_capacity: options.at_capacity,
                sweep_interval: options.sweep_interval,
            },
            MemoryPolicy,
        );
        MemoryStore {
            table,
            options,
            pools: Mutex::new(Pools::default()),
        }
    }

    /// The options in effect (after clamping).
    pub fn options(&self) -> &MemoryStoreOptions {
        &self.options
    }

    /// Current counters. `keys` sums per-shard counts without locking, so
    /// under concurrent traffic it is a moment's approximation.
    pub fn stats(&self) -> StoreStats {
        let t = self.table.stats();
        StoreStats {
            keys: t.keys,
            untracked_decisions: t.untracked_decisions,
            rejected_at_capacity: t.rejected_at_capacity,
            swept: t.swept,
        }
    }

    /// Registers descriptions of the store's metrics with the installed
    /// `metrics` recorder; call it once after installing the recorder.
    pub fn describe_metrics() {
        metrics::describe_counter!(
            TRANSFERS_REFUSED_COUNTER,
            "Transfers refused because the memory store held its maximum of staged transfers."
        );
        metrics::describe_gauge!(KEYS_GAUGE, "Limit states held by the memory store.");
        metrics::describe_counter!(
            UNTRACKED_COUNTER,
            "Decisions whose new key was not stored because the memory store was at capacity."
        );
        metrics::describe_counter!(
            REJECTED_COUNTER,
            "Decisions refused because the memory store was at capacity."
        );
        metrics::describe_gauge!(
            TRANSFERS_GAUGE,
            "Transfers staged and not yet seized or expired (as of the last sweep)."
        );
        metrics::describe_counter!(
            SWEPT_COUNTER,
            "Idle limit states dropped by memory store sweeps."
        );
    }

    /// [`Store::decide`], synchronously.
    ///
    /// Errors: [`StoreError::Plan`] for [`Mode::Acquire`] on an algorithm that
    /// cannot schedule, [`StoreError::AtCapacity`] under
    /// [`AtCapacity::Reject`]. None of them changes anything.
    pub fn decide_now(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        match plan.items() {
            [] => Ok(plan::decide(&mut [], now, request, mode)?),
            [item] => match mode {
                Mode::Try if !item.has_own_hits() => self.decide_one_try(item, now, request),
                // Acquire, report and refund, and an item asked hits of
                // its own: rare, through the core's plan.
                mode => self.decide_one_mode(item, now, request, mode),
            },
            _ => self.decide_many(plan, now, request, mode),
        }
    }

    /// Decides one limit for one key, in [`Mode::Try`]: the fast path for a
    /// single-limit check (what governor's `check_key` answers), returning
    /// the limit's own [`Decision`] rather than a whole [`PlanDecision`].
    /// The same state and the same answer as [`MemoryStore::decide_now`] on
    /// a one-item, non-shadow plan.
    #[inline]
    pub fn decide_limit(
        &self,
        key: &Key,
        limit: &Arc<Limit>,
        now: Nanos,
        request: Hits,
    ) -> Result<Decision, StoreError> {
        if packed(limit) {
            let shared = self.decide_shared(key, limit, |limit, s| match limit {
                Limit::Gcra(a) => Some(alone(a, s, now, request)),
                Limit::LeakyBucket(a) => Some(alone(a, s, now, request)),
                _ => None,
            });
            if let Some(decision) = shared {
                return Ok(decision);
            }
        }
        self.decide_locked(key, limit, now, |limit, s| alone(limit, s, now, request))
    }

    /// Decides a stored virtual-time state ([`Stored::Tat`]) under its
    /// shard's read lock: `decide` runs on a copy of the state, and says
    /// whether it left it idle (or answers `None` if it cannot decide it).
    /// `None`, having changed nothing, when the decision needs the write
    /// lock ([`Table::decide_shared`]).
    #[inline(always)]
    fn decide_shared<T>(
        &self,
        key: &Key,
        limit: &Arc<Limit>,
        decide: impl Fn(&Limit, &mut GcraState) -> Option<(T, bool)>,
    ) -> Option<T> {
        self.table
            .decide_shared(key, limit, |limit, stored| match stored {
                Stored::Tat(tat) => decide_tat(tat, |s| decide(limit, s)),
                Stored::Any(_) => None,
            })
    }

    /// Decides one key under its shard's write lock: `decide` runs on the
    /// state in place, and says whether it left it idle.
    #[inline(always)]
    fn decide_locked<T>(
        &self,
        key: &Key,
        limit: &Arc<Limit>,
        now: Nanos,
        decide: impl FnOnce(&Limit, &mut LimitState) -> (T, bool),
    ) -> Result<T, StoreError> {
        self.table.decide_one(key, limit, now, |limit, stored| {
            let (out, idle) = decide(limit, stored.unpacked());
            stored.pack();
            (out, Effect::after(idle))
        })
    }

    /// [`Store::reserve`], synchronously: releases the pool's transfers
    /// expired by `now`, then reserves the largest `n` in `[min_hits, hits]`
    /// copies of `pool` for `domain` that `limits` allow, or nothing.
    pub fn reserve_now(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
        request: Hits,
        now: Nanos,
    ) -> Result<Reservation, StoreError> {
        let mut guard = self.pools.lock();
        let Pools { pools, transfers } = &mut *guard;
        if let Some(p) = pools.get_mut(pool) {
            for (expired, _) in p.expire(now) {
                transfers.remove(&expired);
            }
        }
        Ok(with_pool(pools, pool, |p| {
            p.reserve(limits, domain, request)
        }))
    }

    /// [`Store::release`], synchronously: gives back `copies` that `domain`
    /// reserved while in `groups`. Fails with [`CopyError::NotHeld`] (as
    /// [`StoreError::Copy`]) if they are not held.
    pub fn release_now(
        &self,
        pool: &PoolKey,
        domain: &str,
        groups: &Groups,
        copies: u64,
    ) -> Result<(), StoreError> {
        let mut guard = self.pools.lock();
        with_pool(&mut guard.pools, pool, |p| {
            p.release(domain, groups, copies)
        })?;
        Ok(())
    }

    /// [`Store::restore`], synchronously: counts again `copies` that
    /// `domain` holds under `groups`, whatever the limits say.
    pub fn restore_now(&self, pool: &PoolKey, domain: &str, groups: &Groups, copies: u64) {
        let mut guard = self.pools.lock();
        with_pool(&mut guard.pools, pool, |p| {
            p.restore(domain, groups, copies)
        });
    }

    /// [`Store::transfer`], synchronously: stages `copies` under a new
    /// random transfer id until `now + ttl`.
    pub fn transfer_now(
        &self,
        pool: &PoolKey,
        domain: &str,
        groups: &Groups,
        copies: u64,
        ttl: Nanos,
        now: Nanos,
    ) -> Result<TransferId, StoreError> {
        let expires_at = now.saturating_add(ttl);
        // Drawn before locking: the random source may be a system call.
        let mut id = TransferId(uuid::Uuid::new_v4().as_u128());
        let mut guard = self.pools.lock();
        let Pools { pools, transfers } = &mut *guard;
        if transfers.len() >= self.options.max_transfers {
            // Due ones first: they hold nothing any more.
            for p in pools.values_mut() {
                for (expired, _) in p.expire(now) {
                    transfers.remove(&expired);
                }
            }
            pools.retain(|_, p| !p.is_empty());
            if transfers.len() >= self.options.max_transfers {
                metrics::counter!(TRANSFERS_REFUSED_COUNTER).increment(1);
                return Err(StoreError::TooManyTransfers(self.options.max_transfers));
            }
        }
        // Random v4 ids are unique in practice; checking the index makes it
        // certain.
        while transfers.contains_key(&id) {
            id = TransferId(uuid::Uuid::new_v4().as_u128());
        }
        with_pool(pools, pool, |p| {
            p.transfer(domain, groups, copies, id, expires_at)
        })?;
        transfers.insert(id, pool.clone());
        Ok(id)
    }

    /// [`Store::seize`], synchronously: claims staged copies at `now`.
    /// Fails with [`CopyError::UnknownTransfer`] if there is no such
    /// transfer or it expired (releasing it, if nobody had yet).
    pub fn seize_now(&self, id: TransferId, now: Nanos) -> Result<Seized, StoreError> {
        let mut guard = self.pools.lock();
        let Pools { pools, transfers } = &mut *guard;
        let Some(key) = transfers.remove(&id) else {
            return Err(CopyError::UnknownTransfer.into());
        };
        let Some(p) = pools.get_mut(&key) else {
            return Err(CopyError::UnknownTransfer.into());
        };
        // Expire here rather than inside `CopyPool::seize` so the index
        // forgets the expired ids too.
        for (expired, _) in p.expire(now) {
            transfers.remove(&expired);
        }
        let seized = p.seize(id, now);
        if p.is_empty() {
            pools.remove(&key);
        }
        let staged = seized?;
        Ok(Seized { pool: key, staged })
    }

    /// [`Store::sweep`], synchronously: drops every idle limit state,
    /// releases every transfer expired by `now` and drops empty pools.
    /// Returns how many limit states were dropped.
    ///
    /// Each shard is locked in turn for one pass over its table.
    pub fn sweep_now(&self, now: Nanos) -> u64 {
        // The table counts the sweep and reports it to `MemoryPolicy`.
        let swept = self.table.sweep(now);
        let pending = {
            let mut guard = self.pools.lock();
            let Pools { pools, transfers } = &mut *guard;
            pools.retain(|_, p| {
                for (expired, _) in p.expire(now) {
                    transfers.remove(&expired);
                }
                !p.is_empty()
            });
            transfers.len()
        };
        metrics::gauge!(TRANSFERS_GAUGE).set(pending as f64);
        metrics::gauge!(KEYS_GAUGE).set(self.table.len() as f64);
        swept
    }

    /// [`Store::inspect`], synchronously: each item decided for zero hits
    /// on a copy of its stored state (a fresh one if it has none), so no
    /// key is stored and none changes.
    pub fn inspect_now(&self, plan: &Plan, now: Nanos) -> Result<PlanDecision, StoreError> {
        let mut states: SmallVec<[LimitState; 4]> = plan
            .items()
            .iter()
            .map(|item| {
                self.table
                    .with_stored(&item.key, |_, stored| match stored {
                        Stored::Tat(tat) => tat_state(tat.load(Ordering::Relaxed)),
                        Stored::Any(state) => state.clone(),
                    })
                    .unwrap_or_else(|| item.limit.fresh())
            })
            .collect();
        crate::probe(plan, &mut states, now)
    }

    /// [`Store::holds`], synchronously: an absent pool holds nothing (and
    /// stays absent). Staged transfers count as held until seized or
    /// released, as they do for a reserve.
    pub fn holds_now(&self, pool: &PoolKey, limits: &CopyLimits, domain: &str) -> CopyContext {
        let guard = self.pools.lock();
        match guard.pools.get(pool) {
            Some(p) => p.context(limits, domain),
            None => CopyPool::default().context(limits, domain),
        }
    }

    /// [`Store::reset`], synchronously: forgets every key of `plan`, so
    /// the next decision of each starts from a fresh state. Returns how
    /// many keys were stored.
    pub fn reset_now(&self, plan: &Plan) -> usize {
        let removed = plan
            .items()
            .iter()
            .filter(|item| self.table.remove(&item.key).is_some())
            .count();
        metrics::gauge!(KEYS_GAUGE).set(self.table.len() as f64);
        removed
    }

    /// A one-item plan in [`Mode::Try`], the common case: decided by the
    /// core's [`plan::decide_one`] under the lock, which hands out a small
    /// `OneDecision`; the large [`PlanDecision`] (inline room for four
    /// decisions, half a kilobyte) is built once, after unlocking, rather
    /// than copied out of the locked section.
    #[inline]
    fn decide_one_try(
        &self,
        item: &PlanItem,
        now: Nanos,
        request: Hits,
    ) -> Result<PlanDecision, StoreError> {
        let shadow = item.shadow;
        if packed(&item.limit) {
            let shared = self.decide_shared(&item.key, &item.limit, |limit, s| {
                let one = match limit {
                    Limit::Gcra(a) => plan::decide_one(a, s, shadow, now, request),
                    Limit::LeakyBucket(a) => plan::decide_one(a, s, shadow, now, request),
                    _ => return None,
                };
                Some((one, one.idle))
            });
            if let Some(one) = shared {
                return Ok(one.into_plan_decision(request, shadow));
            }
        }
        let one = self.decide_locked(&item.key, &item.limit, now, |limit, state| {
            let one = plan::decide_one(limit, state, shadow, now, request);
            (one, one.idle)
        })?;
        Ok(one.into_plan_decision(request, shadow))
    }

    /// A one-item plan in [`Mode::Acquire`], [`Mode::Report`] or
    /// [`Mode::Refund`], through the core's [`plan::decide`]. Kept out of
    /// line so that its large temporaries do not weigh on the `Try` path's
    /// stack frame.
    #[inline(never)]
    fn decide_one_mode(
        &self,
        item: &PlanItem,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        self.table
            .decide_one(&item.key, &item.limit, now, |limit, stored| {
                let state = stored.unpacked();
                let out = match decide_entry(limit, state, item, now, request, mode) {
                    Ok(d) => (Ok(d), Effect::after(limit.is_idle(state, now))),
                    // Refused before the state was touched.
                    Err(e) => (Err(e), Effect::Untouched),
                };
                stored.pack();
                out
            })?
    }

    /// Several keys: the table locks their shards in ascending order and
    /// takes the states out; they are decided together by the core's
    /// [`plan::decide`], and the table writes back what is not idle.
    fn decide_many(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        self.table.decide_many(plan, now, |stored| {
            let mut entries: SmallVec<[PlanEntry<'_>; 4]> = plan
                .items()
                .iter()
                .zip(stored.iter_mut())
                .map(|(item, kept)| PlanEntry {
                    limit: &item.limit,
                    state: kept.unpacked(),
                    shadow: item.shadow,
                    hits: item.hits,
                })
                .collect();
            let decision = plan::decide(&mut entries, now, request, mode);
            drop(entries);
            for kept in stored.iter_mut() {
                kept.pack();
            }
            Ok(decision?)
        })
    }
}

/// Runs `f` on the pool of `key` (an absent pool is an empty one), then
/// keeps the pool only if it holds or stages anything.
fn with_pool<R>(
    pools: &mut HashMap<PoolKey, CopyPool>,
    key: &PoolKey,
    f: impl FnOnce(&mut CopyPool) -> R,
) -> R {
    match pools.get_mut(key) {
        Some(p) => {
            let out = f(p);
            if p.is_empty() {
                pools.remove(key);
            }
            out
        }
        None => {
            let mut p = CopyPool::default();
            let out = f(&mut p);
            if !p.is_empty() {
                pools.insert(key.clone(), p);
            }
            out
        }
    }
}

/// Decides `item`'s limit as a one-entry plan: the same rules (shadow,
/// acquire, hits of its own) as every other plan.
fn decide_entry(
    limit: &Limit,
    state: &mut LimitState,
    item: &PlanItem,
    now: Nanos,
    request: Hits,
    mode: Mode,
) -> Result<PlanDecision, StoreError> {
    let mut entries = [PlanEntry {
        limit,
        state,
        shadow: item.shadow,
        hits: item.hits,
    }];
    Ok(plan::decide(&mut entries, now, request, mode)?)
}

// Each future does its work on its first poll and is ready then: a future
// dropped unpolled (a losing `select!` branch) changes nothing.
impl Store for MemoryStore {
    async fn decide(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        self.decide_now(plan, now, request, mode)
    }

    // Copy operations complete under one lock, on first poll: nothing is
    // ever sent twice, so `op` needs no remembering.
    async fn reserve(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
        request: Hits,
        now: Nanos,
        _op: OpId,
    ) -> Result<Reservation, StoreError> {
        self.reserve_now(pool, limits, domain, request, now)
    }

    async fn release(&self, held: Held<'_>, _op: OpId) -> Result<(), StoreError> {
        self.release_now(held.pool, held.domain, held.groups, held.copies)
    }

    async fn restore(&self, held: Held<'_>, _op: OpId) -> Result<(), StoreError> {
        self.restore_now(held.pool, held.domain, held.groups, held.copies);
        Ok(())
    }

    async fn transfer(
        &self,
        held: Held<'_>,
        ttl: Nanos,
        now: Nanos,
        _op: OpId,
    ) -> Result<TransferId, StoreError> {
        self.transfer_now(held.pool, held.domain, held.groups, held.copies, ttl, now)
    }

    async fn seize(&self, id: TransferId, now: Nanos, _op: OpId) -> Result<Seized, StoreError> {
        self.seize_now(id, now)
    }

    async fn sweep(&self, now: Nanos) {
        self.sweep_now(now);
    }

    async fn holds(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
        _now: Nanos,
    ) -> Result<CopyContext, StoreError> {
        Ok(self.holds_now(pool, limits, domain))
    }

    async fn inspect(&self, plan: &Plan, now: Nanos) -> Result<PlanDecision, StoreError> {
        self.inspect_now(plan, now)
    }

    async fn reset(&self, plan: &Plan, _now: Nanos) -> Result<(), StoreError> {
        self.reset_now(plan);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeping GCRA's timestamp in an atomic costs no memory: a stored
    /// state is as large as a bare `LimitState` (40 bytes), so a slot stays
    /// 80 bytes (`docs/benchmarks.md`, Memory).
    #[test]
    fn a_stored_state_is_no_larger_than_a_limit_state() {
        assert_eq!(
            std::mem::size_of::<Stored>(),
            std::mem::size_of::<LimitState>()
        );
    }
}
