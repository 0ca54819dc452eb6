//! [`ReplicaStore`]: the [`Store`] the server decides on in a gossip
//! cluster, a thin adapter over a shared [`Replica`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tollgate_core::replicated::strategy::Replication;
use tollgate_core::{Limit, Mode, Nanos, PlanDecision, Request};
use tollgate_store::{LimitId, Plan, Store, StoreError};

use crate::replica::{Replica, SWEEP_EVERY};

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
        request: Request,
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

    fn prepare(&self, limit: Limit, replication: Option<&Replication>) -> Result<Limit, String> {
        self.replica.prepare_limit(limit, replication)
    }

    fn serve_limits(&self, limits: Vec<(LimitId, Arc<Limit>)>) {
        self.replica.serve_limits(limits);
    }

    fn check_limit(&self, limit: &Limit) -> Result<(), String> {
        match limit {
            Limit::Replicated(_) => Ok(()),
            other => Err(format!(
                "`{}` is not replicated; a cluster decides only replicated limits",
                other.algorithm_name()
            )),
        }
    }

    fn holds_copies(&self) -> bool {
        false
    }

    /// Ready when the replica decides (it has its full state, or found no
    /// peer to give it one), its clock is within the allowed skew, and it
    /// is not cut off from its seeds by a different secret
    /// ([`Replica::key_mismatch`]).
    fn is_ready(&self) -> bool {
        self.replica.is_synced() && self.replica.is_healthy() && !self.replica.key_mismatch()
    }
}
