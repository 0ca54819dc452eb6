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
//! how). Here atomicity is a lock around the state:
//!
//! - Keys are hashed once (foldhash) into a boxed slice of shards, each a
//!   `parking_lot::Mutex` around a `hashbrown::HashTable`, padded to its own
//!   cache line so two cores working on different shards never invalidate
//!   each other's line. With many shards, two requests rarely meet on one
//!   lock unless they use the same key — and then they must serialise anyway.
//! - A one-limit plan (the common case) takes one hash, one lock and one
//!   probe, and decides the state in place. In `Try` mode it calls the
//!   core's `plan::decide_one`, one dispatch for room, commit and the idle
//!   check, and builds the half-kilobyte `PlanDecision` only after
//!   unlocking (`docs/benchmarks.md`).
//! - A plan over several keys locks every shard it touches in ascending
//!   index order (so two plans can never wait on each other in a cycle),
//!   takes the states out, runs [`tollgate_core::plan::decide`] over them
//!   and writes them back. Holding all the locks for the whole decision is
//!   what makes it all or nothing: nobody can observe or change one limit
//!   between the room check and the commit of another.
//! - Nothing awaits while a shard lock is held — every decision is plain
//!   synchronous arithmetic — so a blocking mutex is right, and the
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
use std::hash::BuildHasher;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::{HashMap, HashTable};
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use tollgate_core::copies::{CopyError, CopyLimits, CopyPool, Groups, Reservation, TransferId};
use tollgate_core::plan::{self, PlanEntry};
use tollgate_core::{Algorithm, Decision, Limit, LimitState, Mode, Nanos, PlanDecision, Request};

use crate::error::StoreError;
use crate::key::{Key, PoolKey};
use crate::plan::{Plan, PlanItem};
use crate::{Held, OpId, Seized, Store};

const KEYS_GAUGE: &str = "tollgate_store_keys";
const UNTRACKED_COUNTER: &str = "tollgate_store_untracked_decisions_total";
const REJECTED_COUNTER: &str = "tollgate_store_rejected_at_capacity_total";
const SWEPT_COUNTER: &str = "tollgate_store_swept_keys_total";
const TRANSFERS_GAUGE: &str = "tollgate_store_transfers_pending";
const TRANSFERS_REFUSED_COUNTER: &str = "tollgate_store_transfers_refused_total";

/// The most shards a store will allocate; more buys nothing but memory.
const MAX_SHARDS: usize = 1 << 16;

/// hashbrown tags each slot with the top 7 bits of the hash. Choosing the
/// shard from those same bits would give every key of a shard the same tag
/// and turn each probe into a row of full key comparisons, so the shard is
/// taken from the bits just below them.
const HASHBROWN_TAG_BITS: u32 = 7;

/// What the store does when a new key would exceed
/// [`MemoryStoreOptions::max_keys`]. See the [module docs](self).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum AtCapacity {
    /// Decide the new key on a fresh state and do not store it: lenient,
    /// as Charon §1 goal 2 asks.
    #[default]
    DecideUntracked,
    /// Fail the decision with [`StoreError::AtCapacity`], changing nothing.
    Reject,
}

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
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
    /// `ceil(max_keys / shards)`.
    shard_cap: usize,
    options: MemoryStoreOptions,
    /// Touched only on rare events (capacity, sweeps), so one shared line is
    /// no contention point.
    untracked: AtomicU64,
    rejected: AtomicU64,
    swept: AtomicU64,
    /// One mutex for every pool and the transfer index: a pool is one
    /// resource whose counts must change atomically anyway, so splitting
    /// the map would only separate different resources, which are few;
    /// a pool operation is a handful of small map updates; and keeping the
    /// index under the same lock keeps transfer, seize and expiry consistent
    /// without a lock order.
    pools: Mutex<Pools>,
}

/// One shard, alone on its cache line(s) so neighbouring shards' locks
/// never share a line (128 bytes covers adjacent-line prefetching too).
#[repr(align(128))]
struct Shard {
    inner: Mutex<ShardInner>,
    /// The table's length, published after every change made under the lock
    /// so [`MemoryStore::stats`] can read it without locking. Kept per shard
    /// (not one global counter) so inserts on different shards never touch
    /// a shared line.
    len: AtomicUsize,
}

struct ShardInner {
    table: HashTable<Slot>,
    /// When this shard was last swept, to rate-limit capacity sweeps.
    last_sweep: Option<Nanos>,
}

/// One stored state. The limit travels with it so a sweep can ask the
/// algorithm whether the state is idle; keys name their parameters
/// ([`crate::LimitId`]), so the limit stored for a key is the one every
/// plan for that key brings.
struct Slot {
    key: Key,
    state: LimitState,
    limit: Arc<Limit>,
}

#[derive(Default)]
struct Pools {
    pools: HashMap<PoolKey, CopyPool>,
    transfers: HashMap<TransferId, PoolKey>,
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

/// What a decision did that counters and metrics must hear about, recorded
/// under the lock and reported after it is released.
#[derive(Default)]
struct Events {
    swept: u64,
    untracked: bool,
    rejected: bool,
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
        let shards = (0..options.shards)
            .map(|_| Shard {
                inner: Mutex::new(ShardInner {
                    table: HashTable::new(),
                    last_sweep: None,
                }),
                len: AtomicUsize::new(0),
            })
            .collect();
        MemoryStore {
            shards,
            hasher: foldhash::fast::RandomState::default(),
            shard_cap: options.max_keys.div_ceil(options.shards),
            options,
            untracked: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            swept: AtomicU64::new(0),
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
        StoreStats {
            keys: self.keys(),
            untracked_decisions: self.untracked.load(Ordering::Relaxed),
            rejected_at_capacity: self.rejected.load(Ordering::Relaxed),
            swept: self.swept.load(Ordering::Relaxed),
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
    /// Errors: [`StoreError::DuplicateKey`] if two items share a key,
    /// [`StoreError::Plan`] for [`Mode::Acquire`] on an algorithm that
    /// cannot schedule, [`StoreError::AtCapacity`] under
    /// [`AtCapacity::Reject`]. None of them changes anything.
    pub fn decide_now(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Request,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        match plan.items.as_slice() {
            [] => Ok(plan::decide(&mut [], now, request, mode)?),
            [item] => match mode {
                Mode::Try => self.decide_one_try(item, now, request),
                Mode::Acquire => self.decide_one_acquire(item, now, request),
            },
            items => self.decide_many(items, now, request, mode),
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
        request: Request,
    ) -> Result<Decision, StoreError> {
        self.decide_one(key, limit, now, |limit, state| {
            let alone = limit.decide_alone(state, now, request);
            (alone.decision, Effect::after(alone.idle))
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
        request: Request,
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
        let mut swept = 0;
        for shard in self.shards.iter() {
            let mut inner = shard.inner.lock();
            swept = inner.sweep(now, &self.hasher).saturating_add(swept);
            shard.len.store(inner.table.len(), Ordering::Relaxed);
        }
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
        if swept > 0 {
            self.swept.fetch_add(swept, Ordering::Relaxed);
            metrics::counter!(SWEPT_COUNTER).increment(swept);
        }
        metrics::gauge!(KEYS_GAUGE).set(self.keys() as f64);
        swept
    }

    fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.len.load(Ordering::Relaxed))
            .fold(0, usize::saturating_add)
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
        if events.swept > 0 {
            self.swept.fetch_add(events.swept, Ordering::Relaxed);
            metrics::counter!(SWEPT_COUNTER).increment(events.swept);
        }
        if events.untracked {
            self.untracked.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(UNTRACKED_COUNTER).increment(1);
        }
        if events.rejected {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(REJECTED_COUNTER).increment(1);
        }
        if events.swept > 0 || events.untracked || events.rejected {
            metrics::gauge!(KEYS_GAUGE).set(self.keys() as f64);
        }
    }

    /// Whether `inner` can take `extra` more keys, sweeping it first if it
    /// cannot and a sweep is due.
    fn make_room(
        &self,
        inner: &mut ShardInner,
        extra: usize,
        now: Nanos,
        events: &mut Events,
    ) -> bool {
        let fits = |inner: &ShardInner| inner.table.len().saturating_add(extra) <= self.shard_cap;
        if fits(inner) {
            return true;
        }
        let due = inner
            .last_sweep
            .is_none_or(|last| now.saturating_sub(last) >= self.options.sweep_interval);
        if due {
            events.swept = inner.sweep(now, &self.hasher).saturating_add(events.swept);
        }
        fits(inner)
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
        request: Request,
    ) -> Result<PlanDecision, StoreError> {
        let decide = |limit: &Limit, state: &mut LimitState| {
            let one = plan::decide_one(limit, state, item.shadow, now, request);
            (one, Effect::after(one.idle))
        };
        match self.decide_one(&item.key, &item.limit, now, decide) {
            Ok(one) => Ok(one.into_plan_decision(request, item.shadow)),
            Err(e) => Err(e),
        }
    }

    /// A one-item plan in [`Mode::Acquire`], through the core's
    /// [`plan::decide`]. Kept out of line so that its large temporaries do
    /// not weigh on the `Try` path's stack frame.
    #[inline(never)]
    fn decide_one_acquire(
        &self,
        item: &PlanItem,
        now: Nanos,
        request: Request,
    ) -> Result<PlanDecision, StoreError> {
        self.decide_one(&item.key, &item.limit, now, |limit, state| {
            match decide_entry(limit, state, item.shadow, now, request, Mode::Acquire) {
                Ok(d) => (Ok(d), Effect::after(limit.is_idle(state, now))),
                // Refused before the state was touched.
                Err(e) => (Err(e), Effect::Untouched),
            }
        })?
    }

    /// The fast path: one key, one lock, the state decided in place by
    /// `decide` (which sees the stored state, or a fresh one on a miss).
    ///
    /// Generic over what `decide` returns, so each caller carries out of
    /// the lock only what it needs. Always inlined, so that each caller's
    /// `decide` can be
    /// inlined into it.
    #[inline(always)]
    fn decide_one<T>(
        &self,
        key: &Key,
        arc: &Arc<Limit>,
        now: Nanos,
        decide: impl FnOnce(&Limit, &mut LimitState) -> (T, Effect),
    ) -> Result<T, StoreError> {
        let limit: &Limit = arc;
        let hash = self.hash(key);
        let shard = &self.shards[self.shard_of(hash)];
        // A blocking lock: nothing below awaits, and the hold is one probe
        // plus one algorithm step.
        let mut inner = shard.inner.lock();
        let mut entry = inner.table.find_entry(hash, |s| s.key == *key).ok();
        // `decide` is called at one place, for a stored or a fresh state,
        // so that it is inlined and its answer is not copied around.
        let mut fresh = None;
        let state = match &mut entry {
            Some(e) => &mut e.get_mut().state,
            None => fresh.insert(limit.fresh()),
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
                self.insert_new(shard, inner, hash, key, arc, state, now, decision)
            }
            // A fresh state left idle needs no room.
            _ => Ok(decision),
        }
    }

    /// Stores a new key's state after its first decision, making room or
    /// applying [`AtCapacity`] when the shard is full. Out of line: the
    /// common case is a key already stored.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn insert_new<T>(
        &self,
        shard: &Shard,
        mut inner: MutexGuard<'_, ShardInner>,
        hash: u64,
        key: &Key,
        arc: &Arc<Limit>,
        state: LimitState,
        now: Nanos,
        decision: T,
    ) -> Result<T, StoreError> {
        let mut events = Events::default();
        let result = if self.make_room(&mut inner, 1, now, &mut events) {
            let slot = Slot {
                key: key.clone(),
                state,
                limit: Arc::clone(arc),
            };
            inner
                .table
                .insert_unique(hash, slot, |s| self.hasher.hash_one(&s.key));
            Ok(decision)
        } else {
            match self.options.at_capacity {
                AtCapacity::DecideUntracked => {
                    events.untracked = true;
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

    /// Several keys: lock their shards in ascending order, take the states
    /// out, decide them together, write back what is not idle.
    fn decide_many(
        &self,
        items: &[PlanItem],
        now: Nanos,
        request: Request,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        let hashes: SmallVec<[u64; 4]> = items.iter().map(|i| self.hash(&i.key)).collect();
        check_distinct(items, &hashes)?;
        let shard_ids: SmallVec<[usize; 4]> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        // Each item's guard is `guards[pos[i]]`. Nothing awaits while these
        // are held.
        let (order, pos) = crate::plan::lock_order(&shard_ids);
        let mut guards: SmallVec<[MutexGuard<'_, ShardInner>; 4]> =
            order.iter().map(|&s| self.shards[s].inner.lock()).collect();

        // Take each state out of its table (or start fresh on a miss),
        // remembering the stored key and limit of those that were present.
        let mut states: SmallVec<[LimitState; 4]> = SmallVec::with_capacity(items.len());
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
                    states.push(item.limit.fresh());
                    stored.push(None);
                }
            }
        }

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

        let result = {
            let mut entries: SmallVec<[PlanEntry<'_>; 4]> = items
                .iter()
                .zip(states.iter_mut())
                .map(|(item, state)| PlanEntry {
                    limit: &item.limit,
                    state,
                    shadow: item.shadow,
                })
                .collect();
            plan::decide(&mut entries, now, request, mode)
        };
        let mut events = Events::default();
        let mut garbage: SmallVec<[(Key, Arc<Limit>); 4]> = SmallVec::new();

        let decision = match result {
            Ok(decision) => decision,
            Err(e) => {
                // `plan::decide` fails before changing any state: put them
                // all back as they were.
                self.put_back(
                    &mut guards,
                    Placement {
                        pos: &pos,
                        hashes: &hashes,
                    },
                    states,
                    stored,
                );
                self.publish_lens(&order, &guards);
                drop(guards);
                return Err(e.into());
            }
        };

        let idle: SmallVec<[bool; 4]> = items
            .iter()
            .zip(&states)
            .map(|(item, state)| item.limit.is_idle(state, now))
            .collect();

        if let Some(originals) = originals {
            // Per shard: states going back, and new states needing a slot.
            let mut back: SmallVec<[usize; 4]> = SmallVec::from_elem(0, guards.len());
            let mut new: SmallVec<[usize; 4]> = SmallVec::from_elem(0, guards.len());
            for i in (0..items.len()).filter(|&i| !idle[i]) {
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
                self.put_back(
                    &mut guards,
                    Placement {
                        pos: &pos,
                        hashes: &hashes,
                    },
                    originals,
                    stored,
                );
                self.publish_lens(&order, &guards);
                drop(guards);
                drop(garbage);
                events.rejected = true;
                self.record(events);
                return Err(StoreError::AtCapacity(self.options.max_keys));
            }
        }

        // States that were stored go back first: they had their slots, and
        // a new key must not take one from them.
        let mut pending: SmallVec<[(usize, LimitState); 4]> = SmallVec::new();
        for (i, (state, kept)) in states.into_iter().zip(stored).enumerate() {
            match kept {
                Some((key, limit)) => {
                    if idle[i] {
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
                None if !idle[i] => pending.push((i, state)),
                None => {}
            }
        }
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
                events.untracked = true;
            }
        }
        self.publish_lens(&order, &guards);
        drop(guards);
        drop(garbage);
        self.record(events);
        Ok(decision)
    }

    /// Reinserts the states that were stored before the decision, exactly
    /// as given (idle or not): used when the decision must change nothing.
    fn put_back(
        &self,
        guards: &mut [MutexGuard<'_, ShardInner>],
        placement: Placement<'_>,
        states: SmallVec<[LimitState; 4]>,
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

    fn publish_lens(&self, order: &[usize], guards: &[MutexGuard<'_, ShardInner>]) {
        for (&s, guard) in order.iter().zip(guards) {
            self.shards[s]
                .len
                .store(guard.table.len(), Ordering::Relaxed);
        }
    }
}

impl ShardInner {
    /// Drops every idle state; returns how many.
    fn sweep(&mut self, now: Nanos, hasher: &foldhash::fast::RandomState) -> u64 {
        let before = self.table.len();
        self.table.retain(|s| !s.limit.is_idle(&s.state, now));
        let after = self.table.len();
        // Give memory back after a flood has drained, but only when the
        // table is mostly empty, so a shard near its working size does not
        // shrink and regrow on every sweep.
        if self.table.capacity() > after.saturating_mul(4).max(64) {
            self.table.shrink_to(after, |s| hasher.hash_one(&s.key));
        }
        self.last_sweep = Some(now);
        before.saturating_sub(after) as u64
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

/// Decides one limit as a one-entry plan: the same rules (shadow, acquire)
/// as every other plan.
fn decide_entry(
    limit: &Limit,
    state: &mut LimitState,
    shadow: bool,
    now: Nanos,
    request: Request,
    mode: Mode,
) -> Result<PlanDecision, StoreError> {
    let mut entries = [PlanEntry {
        limit,
        state,
        shadow,
    }];
    Ok(plan::decide(&mut entries, now, request, mode)?)
}

/// What a decision under the lock did to its state, and so to the table.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Effect {
    /// The state is live: keep it (insert it, for a new key).
    Keep,
    /// The state is idle: drop it (never insert it).
    Idle,
    /// The decision was refused before touching the state: change nothing.
    Untouched,
}

impl Effect {
    #[inline]
    fn after(idle: bool) -> Effect {
        if idle {
            Effect::Idle
        } else {
            Effect::Keep
        }
    }
}

/// Fails with [`StoreError::DuplicateKey`] if two items share a key:
/// sorts by hash and compares keys only within runs of equal hashes, so a
/// long plan costs `n log n`, not `n²`.
fn check_distinct(items: &[PlanItem], hashes: &[u64]) -> Result<(), StoreError> {
    let mut by_hash: SmallVec<[(u64, usize); 4]> =
        hashes.iter().copied().zip(0..items.len()).collect();
    by_hash.sort_unstable();
    for run in by_hash.chunk_by(|a, b| a.0 == b.0) {
        for (n, a) in run.iter().enumerate() {
            for b in &run[n + 1..] {
                if items[a.1].key == items[b.1].key {
                    return Err(StoreError::DuplicateKey(items[a.1].key.to_string()));
                }
            }
        }
    }
    Ok(())
}

// Each future does its work on its first poll and is ready then: a future
// dropped unpolled (a losing `select!` branch) changes nothing.
impl Store for MemoryStore {
    async fn decide(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Request,
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
        request: Request,
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
}
