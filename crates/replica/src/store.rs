//! [`ReplicaStore`]: the [`Store`] the server decides on in a gossip
//! cluster, a thin adapter over a shared [`Replica`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tollgate_core::{Hits, Limit, Mode, Nanos, ParamError, PlanDecision};
use tollgate_store::{Admit, LimitId, Plan, Refusal, Store, StoreError};

use crate::replica::{Replica, SWEEP_EVERY};

/// Why a gossip cluster cannot replicate a configured limit
/// ([`Replica::prepare_limit`]): each says what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotReplicable {
    /// A token bucket that starts below full: every node starts a key full.
    #[error(
        "`initial_tokens` cannot be replicated: every node starts a key full; remove \
         `initial_tokens`, or serve it from the Redis store"
    )]
    InitialTokens,
    /// A sliding log that is not a plain N per second.
    #[error(
        "a `sliding_log` is replicated only with `window: 1s` and neither `min_gap` nor \
         `count_rejected`; change it so, use `token_bucket` or `gcra`, or serve it from the \
         Redis store"
    )]
    SlidingLog,
    /// An algorithm no replication strategy has a CRDT for.
    #[error(
        "`{algorithm}` cannot be replicated in a gossip cluster; use `token_bucket` or `gcra` \
         (replicated as {strategy}), or serve it from the Redis store"
    )]
    Algorithm {
        /// The configured algorithm.
        algorithm: &'static str,
        /// The strategy the resource would be replicated with.
        strategy: &'static str,
    },
    /// The limit's rate or its replication's parameters do not make a
    /// CRDT (said as the core says it).
    #[error(transparent)]
    Parameter(#[from] ParamError),
}

/// The replicated store: a [`Store`] over a shared [`Replica`].
#[derive(Clone, Debug)]
pub struct ReplicaStore {
    replica: Arc<Replica>,
}

impl ReplicaStore {
    /// A store deciding on `replica`.
    pub fn new(replica: Arc<Replica>) -> ReplicaStore {
        ReplicaStore { replica }
    }

    /// The replica.
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }
}

impl Store for ReplicaStore {
    async fn decide(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        self.replica.decide_now(plan, now, request, mode)
    }

    async fn sweep(&self, now: Nanos) {
        // The server calls this every 250 ms; a key is dropped only after
        // seconds of idleness anyway, so a pass over every key once a
        // second is plenty.
        let last = self.replica.last_sweep.load(Ordering::Relaxed);
        if now.as_u64().saturating_sub(last) >= SWEEP_EVERY.as_u64() {
            self.replica
                .last_sweep
                .store(now.as_u64(), Ordering::Relaxed);
            self.replica.sweep_now(now);
        }
    }

    /// This node's view of each key: peers' grants merged so far.
    async fn inspect(&self, plan: &Plan, now: Nanos) -> Result<PlanDecision, StoreError> {
        self.replica.inspect_now(plan, now)
    }

    /// Resets each key on every node ([`Replica::reset_now`]): a new
    /// reset generation, which wins over every state from before it.
    async fn reset(&self, plan: &Plan, now: Nanos) -> Result<(), StoreError> {
        self.replica.reset_now(plan, now)
    }

    /// Makes a rate limit its resource's CRDT on this node
    /// ([`Replica::prepare_limit`]), and refuses copy pools: copies need
    /// one owner of truth, which a replicated cluster does not have.
    fn admit(&self, limit: Admit<'_>) -> Result<(), Refusal> {
        match limit {
            Admit::Rate { limit, replication } => {
                let replicated = self
                    .replica
                    .prepare_limit(Limit::clone(limit), replication)
                    .map_err(Refusal::limit)?;
                *limit = replicated;
                Ok(())
            }
            Admit::Copies(_) => Err(Refusal::NoCopies),
        }
    }

    fn serve_limits(&self, limits: Vec<(LimitId, Arc<Limit>)>) {
        self.replica.serve_limits(limits);
    }

    /// Ready when the replica decides (it has its full state, or found no
    /// peer to give it one), its clock is within the allowed skew, and it
    /// is not cut off from its seeds by a different secret
    /// ([`Replica::key_mismatch`]).
    fn is_ready(&self) -> bool {
        self.replica.is_synced() && self.replica.is_healthy() && !self.replica.key_mismatch()
    }
}
