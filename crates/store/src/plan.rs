//! A [`Plan`]: the limits one request must pass, each with its key.

use std::sync::Arc;

use smallvec::SmallVec;
use tollgate_core::Limit;

use crate::key::Key;

/// One limit a request must pass.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanItem {
    /// Where the limit's state for this request lives.
    pub key: Key,
    /// The algorithm and its parameters.
    pub limit: Arc<Limit>,
    /// Evaluated and recorded but never limits (shadow mode).
    pub shadow: bool,
}

/// The limits one request must pass, decided all or nothing. Keys must be
/// distinct.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The items, in the order their decisions are reported.
    pub items: SmallVec<[PlanItem; 3]>,
    /// Which keys must live together: a store that partitions its keys
    /// (Redis Cluster) places every key of a plan by this one number, so a
    /// plan is always decided in one place. The service sets it per
    /// namespace; the memory store ignores it.
    pub affinity: u64,
}

impl Plan {
    /// A plan of one limit.
    pub fn single(key: Key, limit: Arc<Limit>) -> Plan {
        let mut items = SmallVec::new();
        items.push(PlanItem {
            key,
            limit,
            shadow: false,
        });
        Plan { items, affinity: 0 }
    }

    /// Adds a limit.
    pub fn push(&mut self, key: Key, limit: Arc<Limit>, shadow: bool) {
        self.items.push(PlanItem { key, limit, shadow });
    }

    /// The plan with `affinity` (see [`Plan::affinity`]).
    #[must_use]
    pub fn with_affinity(mut self, affinity: u64) -> Plan {
        self.affinity = affinity;
        self
    }

    /// Whether the plan checks nothing (an unlimited request).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The shards to lock for a plan whose items live in `shards` (one shard
/// index per item), in the one global lock order (ascending, each once),
/// and each item's position in that order. Every sharded store locks a
/// plan's shards this way, so two plans can never each hold a lock the
/// other waits for.
pub fn lock_order(shards: &[usize]) -> (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) {
    let mut order: SmallVec<[usize; 4]> = shards.iter().copied().collect();
    order.sort_unstable();
    order.dedup();
    let pos = shards
        .iter()
        .map(|s| order.partition_point(|o| o < s))
        .collect();
    (order, pos)
}
