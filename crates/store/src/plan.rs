//! A [`Plan`]: the limits one request must pass, each with its key.
//!
//! A plan's keys are distinct, and the plan itself keeps them so: its
//! items are private, and [`Plan::push`] refuses a key it already holds
//! with [`DuplicateKey`]. Every store can therefore take each key of a plan
//! out once without checking (deciding one key twice in one plan would
//! count the request twice against it, or lose one of the two updates).

use std::sync::Arc;

use smallvec::SmallVec;
use thiserror::Error;
use tollgate_core::{Limit, Mode, PlanError};

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
    /// Hits of this item's own, decided exactly in place of the request's
    /// (Envoy descriptors each with their own `hits_addend`; see
    /// [`tollgate_core::plan::PlanEntry::hits`]). `None`: the request's.
    pub hits: Option<u64>,
}

impl PlanItem {
    /// Whether the item is asked its own hits: a store's one-item fast
    /// path, which decides for the request's hits, does not take it.
    pub fn has_own_hits(&self) -> bool {
        self.hits.is_some()
    }
}

/// A key pushed onto a [`Plan`] that already holds it.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("plan lists key `{key}` twice")]
pub struct DuplicateKey {
    /// The key pushed twice.
    pub key: Key,
}

/// The limits one request must pass, decided all or nothing. Its keys are
/// distinct ([`Plan::push`] refuses a key twice).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The items, in the order their decisions are reported.
    items: SmallVec<[PlanItem; 3]>,
    /// See [`Plan::affinity`].
    affinity: u64,
}

impl Plan {
    /// A plan of one limit.
    pub fn single(key: Key, limit: Arc<Limit>) -> Plan {
        let mut items = SmallVec::new();
        items.push(PlanItem {
            key,
            limit,
            shadow: false,
            hits: None,
        });
        Plan { items, affinity: 0 }
    }

    /// Adds a limit, or refuses it, leaving the plan as it was, if the plan
    /// holds `key` already. Compares with every item: plans are a handful
    /// of limits.
    pub fn push(&mut self, key: Key, limit: Arc<Limit>, shadow: bool) -> Result<(), DuplicateKey> {
        if self.position(&key).is_some() {
            return Err(DuplicateKey { key });
        }
        self.items.push(PlanItem {
            key,
            limit,
            shadow,
            hits: None,
        });
        Ok(())
    }

    /// The index of the item deciding `key`: the plan's own when it holds
    /// the key already (two Envoy descriptors naming one counter share
    /// it, and the first one's `shadow` stands), else a new item of
    /// `limit`. One pass over the items, where `position` then `push`
    /// would make two.
    pub fn item_for(&mut self, key: Key, limit: &Arc<Limit>, shadow: bool) -> usize {
        if let Some(existing) = self.position(&key) {
            return existing;
        }
        self.items.push(PlanItem {
            key,
            limit: Arc::clone(limit),
            shadow,
            hits: None,
        });
        self.items.len() - 1
    }

    /// Asks item `index` for `hits` of its own in place of the request's
    /// ([`PlanItem::hits`]); an item asked twice (two Envoy descriptors
    /// sharing a counter) is asked the larger, since the counter is
    /// charged once. An index past the items changes nothing.
    pub fn ask(&mut self, index: usize, hits: u64) {
        if let Some(item) = self.items.get_mut(index) {
            item.hits = Some(item.hits.map_or(hits, |h| h.max(hits)));
        }
    }

    /// The plan with `affinity` (see [`Plan::affinity`]).
    #[must_use]
    pub fn with_affinity(mut self, affinity: u64) -> Plan {
        self.affinity = affinity;
        self
    }

    /// The items, in the order their decisions are reported; their keys
    /// are distinct.
    pub fn items(&self) -> &[PlanItem] {
        &self.items
    }

    /// Which keys must live together: a store that partitions its keys
    /// (Redis Cluster) places every key of a plan by this one number, so a
    /// plan is always decided in one place. The service sets it per
    /// namespace; the memory store ignores it.
    pub fn affinity(&self) -> u64 {
        self.affinity
    }

    /// Why the plan cannot be told usage in `mode` whatever the state: its
    /// first item whose limit has no sound debt
    /// ([`Limit::takes_usage`]), as the core's plan refuses it; `None`
    /// when `mode` is no usage or every limit takes it. For deciding
    /// several plans together, where a refusal found late would come after
    /// another plan was decided.
    pub fn usage_refusal(&self, mode: Mode) -> Option<PlanError> {
        if !mode.is_usage() {
            return None;
        }
        let (index, it) = self
            .items
            .iter()
            .enumerate()
            .find(|(_, it)| !it.limit.takes_usage())?;
        Some(PlanError::NoUsage {
            index,
            algorithm: it.limit.algorithm_name(),
            mode,
        })
    }

    /// The position of the item of `key`, if the plan holds it.
    pub fn position(&self, key: &Key) -> Option<usize> {
        self.items.iter().position(|it| it.key == *key)
    }

    /// How many limits the plan checks.
    pub fn len(&self) -> usize {
        self.items.len()
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
