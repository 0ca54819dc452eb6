//! Where limit state lives: the [`Store`] trait, the embedded
//! [`MemoryStore`], and the sharded keyed-state [`Table`] it keeps its
//! states in (shared with the gossip cluster's replica).
//!
//! A store answers one question atomically: "apply this [`Plan`] of limit
//! keys now, all or nothing, granting the most hits in `[min_hits, hits]`
//! that every limit allows". It also keeps the copy pools of copy-limited
//! resources. No store lets two concurrent requests both pass a limit that
//! has room for one.
//!
//! The algorithms are the core's pure functions; a store only decides *how*
//! they run atomically (a shard lock here, a Lua script in Redis, a CRDT
//! merge in the replicated cluster). This crate does not know those other
//! stores exist.

#![deny(missing_docs)]

pub mod error;
pub mod key;
pub mod memory;
pub mod plan;
pub mod table;

use std::future::Future;

pub use error::{Refusal, StoreError};
pub use key::{Key, LimitId, PoolKey};
pub use memory::{AtCapacity, MemoryStore, MemoryStoreOptions, StoreStats};
pub use plan::{lock_order, DuplicateKey, Plan, PlanItem};
pub use table::{Table, TableOptions};

use smallvec::SmallVec;
use tollgate_core::copies::{CopyContext, CopyLimits, Groups, Reservation, Staged, TransferId};
use tollgate_core::replicated::strategy::Replication;
use tollgate_core::{Hits, Limit, Mode, Nanos, PlanDecision};

/// The answer [`Store::inspect`] gives: each item of `plan` decided for a
/// request of zero hits on `states` (its stored states, or fresh ones),
/// which are copies, so nothing the caller keeps changes. For stores that
/// hold the core's states (memory, the replicated cluster).
pub fn probe(
    plan: &Plan,
    states: &mut [tollgate_core::LimitState],
    now: Nanos,
) -> Result<PlanDecision, StoreError> {
    let mut entries: smallvec::SmallVec<[tollgate_core::plan::PlanEntry<'_>; 4]> = plan
        .items()
        .iter()
        .zip(states.iter_mut())
        .map(|(item, state)| tollgate_core::plan::PlanEntry {
            limit: &item.limit,
            state,
            shadow: item.shadow,
            hits: None,
        })
        .collect();
    Ok(tollgate_core::plan::decide(
        &mut entries,
        now,
        Hits::exactly(0),
        Mode::Try,
    )?)
}

/// Copies claimed by [`Store::seize`], and the resource they belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seized {
    /// The copy-limited resource.
    pub pool: PoolKey,
    /// What was staged: domain, groups, copies.
    pub staged: Staged,
}

/// Identifies one copy operation, so that a store can apply it at most
/// once however often it is sent (DESIGN.md's failure model: an operation
/// that moves copies is retried until its outcome is known).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct OpId(pub u128);

impl OpId {
    /// A new random id: unique in practice, and unguessable, so one
    /// client cannot replay another's operation.
    pub fn random() -> OpId {
        OpId(uuid::Uuid::new_v4().as_u128())
    }
}

impl std::fmt::Display for OpId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Copies one domain holds of one pool under one set of groups: what a
/// release, a restore or a transfer moves.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Held<'a> {
    /// The copy-limited resource.
    pub pool: &'a PoolKey,
    /// Whose copies.
    pub domain: &'a str,
    /// The groups they were counted in when reserved.
    pub groups: &'a Groups,
    /// How many.
    pub copies: u64,
}

/// One limit of a config, as a store is asked to serve it
/// ([`Store::admit`]).
#[derive(Debug)]
pub enum Admit<'a> {
    /// A rate limit (a resource's algorithm, a domain override's, a hard
    /// or a global limit) and how its resource asks to be replicated
    /// (`None`: it does not say). The store may replace `limit` with the
    /// one it decides (the replicated store makes it its cluster's CRDT).
    Rate {
        /// The limit as configured; on success, as the store decides it.
        limit: &'a mut Limit,
        /// The resource's `replication:`, if it has one.
        replication: Option<&'a Replication>,
    },
    /// The copy pool of a copy-limited (concurrency) resource.
    Copies(&'a CopyLimits),
}

/// A place where limit state lives and is updated atomically.
///
/// `now` is the caller's clock; a store with its own authoritative clock
/// (Redis's `TIME`) may ignore it and must then say so in its docs.
pub trait Store: Send + Sync + 'static {
    /// Decides `request` against every item of `plan`, all or nothing.
    fn decide(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> impl Future<Output = Result<PlanDecision, StoreError>> + Send;

    /// Decides `parts` (each a plan, its request and its mode) in order,
    /// each as [`Store::decide`] would, in one step where the store can
    /// make it one: an Envoy request's check and the usage it reports
    /// beside it. A store reached over a network (Redis) sends them in one
    /// call, so a failure leaves all of them decided or none (never the
    /// check charged and the report lost); a store in this process decides
    /// them one after the other, which nothing can interrupt but a refusal.
    /// An error is the first part's that failed. For checks (`Mode::Try`)
    /// and usage only: a caller first refuses usage to a limit that takes
    /// none ([`tollgate_core::Limit::takes_usage`]), which a store deciding
    /// in one call could otherwise refuse for that part alone after the
    /// others were decided.
    fn decide_together(
        &self,
        parts: &[(&Plan, Hits, Mode)],
        now: Nanos,
    ) -> impl Future<Output = Result<SmallVec<[PlanDecision; 3]>, StoreError>> + Send {
        async move {
            let mut out = SmallVec::new();
            for (plan, request, mode) in parts {
                out.push(self.decide(plan, now, *request, *mode).await?);
            }
            Ok(out)
        }
    }

    /// Each item of `plan` as it stands at `now`: the decision a request
    /// of zero hits would get (an item asked hits of its own,
    /// [`PlanItem::hits`], too), with nothing charged and nothing created (a
    /// key never decided is answered as a fresh state and stays absent;
    /// caches of answers are neither read nor filled). What an operator
    /// reads to see a live counter (`GET /v1/counters`).
    ///
    /// Each key is read at its own moment, not all of the plan at one
    /// instant: an admin's view, never the basis of a decision.
    ///
    /// The default refuses: every store tollgate serves from implements it.
    fn inspect(
        &self,
        plan: &Plan,
        now: Nanos,
    ) -> impl Future<Output = Result<PlanDecision, StoreError>> + Send {
        let _ = (plan, now);
        std::future::ready(Err(StoreError::Unsupported(
            "this store cannot inspect counters".into(),
        )))
    }

    /// Forgets the state of every item of `plan`, so the next decision of
    /// each sees a fresh state (`DELETE /v1/counters`). A store that cannot
    /// make a reset stick (a replicated cluster whose peers would merge the
    /// old counts back) refuses it, saying why, rather than pretend.
    ///
    /// The default refuses, as [`Store::inspect`]'s does.
    fn reset(
        &self,
        plan: &Plan,
        now: Nanos,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (plan, now);
        std::future::ready(Err(StoreError::Unsupported(
            "this store cannot reset counters".into(),
        )))
    }

    /// The copies of `pool` held now by `domain`, by everyone, and by each
    /// of `domain`'s groups, against `limits` (what a reserve's context
    /// says), with nothing reserved or created. Holds are owned by their
    /// holders, so there is no reset of a pool: a holder releases.
    ///
    /// The default refuses, as the copy operations' do.
    fn holds(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
        now: Nanos,
    ) -> impl Future<Output = Result<CopyContext, StoreError>> + Send {
        let _ = (pool, limits, domain, now);
        std::future::ready(Err(StoreError::no_copies()))
    }

    /// Reserves the largest `n` in `[min, max]` copies of `pool` for
    /// `domain` that `limits` allow, or nothing. Transfers of the pool whose
    /// TTL ended by `now` are released first, so they never hold copies
    /// past their time.
    ///
    /// Copy operations (this one, [`Store::release`], [`Store::restore`],
    /// [`Store::transfer`], [`Store::seize`]) resolve only with a definitive
    /// answer: what the store did, or why it refused. A store that can lose
    /// a request on its way (Redis) sends it again under the same `op` until
    /// it has one, and applies an `op` at most once however often it is
    /// sent. `Err(StoreError::Unavailable)` from a copy operation means the
    /// answer can never be known (the server resigned from a shared copy
    /// log, whose survivors then release everything it held).
    ///
    /// The default refuses: a store without copy pools (whose
    /// [`Store::admit`] refuses [`Admit::Copies`]) need not implement them.
    fn reserve(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
        request: Hits,
        now: Nanos,
        op: OpId,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send {
        let _ = (pool, limits, domain, request, now, op);
        std::future::ready(Err(StoreError::no_copies()))
    }

    /// Releases copies `held.domain` reserved while in `held.groups`.
    fn release(
        &self,
        held: Held<'_>,
        op: OpId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (held, op);
        std::future::ready(Err(StoreError::no_copies()))
    }

    /// Counts again copies a release took whose holder still holds them
    /// (the release's caller was told it failed), whatever the limits say
    /// now: the inverse of [`Store::release`].
    fn restore(
        &self,
        held: Held<'_>,
        op: OpId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (held, op);
        std::future::ready(Err(StoreError::no_copies()))
    }

    /// Stages held copies for transfer; they are released at `now + ttl`
    /// unless seized first. Returns the new transfer's id.
    fn transfer(
        &self,
        held: Held<'_>,
        ttl: Nanos,
        now: Nanos,
        op: OpId,
    ) -> impl Future<Output = Result<TransferId, StoreError>> + Send {
        let _ = (held, ttl, now, op);
        std::future::ready(Err(StoreError::no_copies()))
    }

    /// Claims staged copies; they count as held by the caller from now on.
    fn seize(
        &self,
        id: TransferId,
        now: Nanos,
        op: OpId,
    ) -> impl Future<Output = Result<Seized, StoreError>> + Send {
        let _ = (id, now, op);
        std::future::ready(Err(StoreError::no_copies()))
    }

    /// Takes back copies this server staged under `id` whose transfer's
    /// caller never learnt the id: a seize that is not a new hold, so a
    /// store that refuses new holds for a while (a Redis server that could
    /// not renew its heartbeat) must still do it. Default: [`Store::seize`].
    fn take_back(
        &self,
        id: TransferId,
        now: Nanos,
        op: OpId,
    ) -> impl Future<Output = Result<Seized, StoreError>> + Send {
        self.seize(id, now, op)
    }

    /// Drops idle state and releases expired transfers. Stores call it on a
    /// timer; it is cheap to call often.
    fn sweep(&self, now: Nanos) -> impl Future<Output = ()> + Send;

    /// Whether this store will serve `limit`, one limit of a config about
    /// to be served, and as what; called for every limit (and every copy
    /// pool) of a config before it is put in force, so a config the store
    /// cannot serve is refused, saying why, rather than served wrongly.
    /// The default admits everything as configured (the memory store).
    /// The Redis store refuses limits its scripts cannot decide exactly
    /// (below 2^52); the replicated store makes a rate limit its cluster's
    /// CRDT, refuses what it cannot replicate, and refuses copy pools
    /// ([`Refusal::NoCopies`]: copies need one owner of truth).
    fn admit(&self, limit: Admit<'_>) -> Result<(), Refusal> {
        let _ = limit;
        Ok(())
    }

    /// The limits of the config about to be served, by id (called once a
    /// config passed every check, just before it is put in force). The
    /// replicated store merges peers' keys only of these limits.
    fn serve_limits(&self, limits: Vec<(LimitId, std::sync::Arc<Limit>)>) {
        let _ = limits;
    }

    /// Whether the store can decide right now (a remote store whose backend
    /// is unreachable is not ready; `/readyz` reports it).
    fn is_ready(&self) -> bool {
        true
    }
}
