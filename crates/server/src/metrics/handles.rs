//! Metric handles of decisions, cached per thread.
//!
//! `metrics::counter!` with labels builds a key (allocating the owned
//! labels), hashes it and looks it up in the recorder's registry on every
//! call: about 6,000 instructions a decision, more than the decision
//! itself (docs/benchmarks.md, "Where an HTTP decision's time goes"). The
//! handle it returns stays valid for the life of the process, so each
//! thread keeps the handles it used, found by surface, namespace and
//! resource, and a decision costs a hash and an atomic add.
//!
//! Names reach the cache only when the config knows them (or as
//! `_unconfigured`), so its size follows the config; it is still capped,
//! and emptied when full, so a long life of configs renaming resources
//! cannot grow it.
//!
//! A handle taken before the process's recorder is installed stays a
//! no-op for good, so nothing is kept until [`recorder_installed`] says the
//! recorder is in place; until then every call registers, as
//! `metrics::counter!` does.

use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};

use hashbrown::{DefaultHashBuilder, HashTable};
use metrics::{Counter, Histogram};

use tollgate_core::Mode;

use super::{DECISIONS, HITS, HITS_REFUNDED, HITS_REPORTED, LATENCY, NEAR_LIMIT};

/// Most label sets one thread keeps.
const MAX_ENTRIES: usize = 4096;

/// Whether handles may be kept: the recorder is installed.
static CACHING: AtomicBool = AtomicBool::new(false);

/// From now on handles are real and may be kept.
pub(super) fn recorder_installed() {
    CACHING.store(true, Ordering::Release);
}

/// One label set's decision counters, each registered on first use (so a
/// resource that never came near its limit has no near-limit series, as
/// before the cache).
pub(super) struct Handles {
    surface: &'static str,
    namespace: Box<str>,
    resource: Box<str>,
    granted: Option<Counter>,
    rejected: Option<Counter>,
    /// Granted, reported and refunded hits, each registered on first use.
    hits: [Option<Counter>; 3],
    near_limit: Option<Counter>,
}

impl Handles {
    fn new(surface: &'static str, namespace: &str, resource: &str) -> Handles {
        Handles {
            surface,
            namespace: namespace.into(),
            resource: resource.into(),
            granted: None,
            rejected: None,
            hits: [None, None, None],
            near_limit: None,
        }
    }

    fn is(&self, surface: &str, namespace: &str, resource: &str) -> bool {
        self.surface == surface && &*self.namespace == namespace && &*self.resource == resource
    }

    /// `tollgate_decisions_total` with outcome `granted` or `rejected`.
    pub(super) fn decision(&mut self, allowed: bool) -> &Counter {
        let (slot, outcome) = if allowed {
            (&mut self.granted, "granted")
        } else {
            (&mut self.rejected, "rejected")
        };
        slot.get_or_insert_with(|| {
            metrics::counter!(
                DECISIONS,
                "surface" => self.surface,
                "namespace" => self.namespace.to_string(),
                "resource" => self.resource.to_string(),
                "outcome" => outcome
            )
        })
    }

    /// The hits counter of `mode` (not by surface):
    /// `tollgate_hits_granted_total` for a check,
    /// `tollgate_hits_reported_total` for a report and
    /// `tollgate_hits_refunded_total` for a refund.
    pub(super) fn hits(&mut self, mode: Mode) -> &Counter {
        let (slot, name) = match mode {
            Mode::Report => (&mut self.hits[1], HITS_REPORTED),
            Mode::Refund => (&mut self.hits[2], HITS_REFUNDED),
            Mode::Try | Mode::Acquire => (&mut self.hits[0], HITS),
        };
        slot.get_or_insert_with(|| {
            metrics::counter!(
                name,
                "namespace" => self.namespace.to_string(),
                "resource" => self.resource.to_string()
            )
        })
    }

    /// `tollgate_near_limit_total`.
    pub(super) fn near_limit(&mut self) -> &Counter {
        self.near_limit.get_or_insert_with(|| {
            metrics::counter!(
                NEAR_LIMIT,
                "surface" => self.surface,
                "namespace" => self.namespace.to_string(),
                "resource" => self.resource.to_string()
            )
        })
    }
}

/// One thread's handles.
struct Cache {
    /// foldhash (hashbrown's): a third of SipHash's cost on these short
    /// names, and the names come from the config, not from strangers.
    hasher: DefaultHashBuilder,
    sets: HashTable<Handles>,
    latency: Vec<(&'static str, Histogram)>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache {
        hasher: DefaultHashBuilder::default(),
        sets: HashTable::new(),
        latency: Vec::new(),
    });
}

/// Calls `f` with the handles of `surface`, `namespace` and `resource`.
pub(super) fn with(
    surface: &'static str,
    namespace: &str,
    resource: &str,
    f: impl FnOnce(&mut Handles),
) {
    if !CACHING.load(Ordering::Acquire) {
        return f(&mut Handles::new(surface, namespace, resource));
    }
    CACHE.with(|cache| {
        let Ok(mut cache) = cache.try_borrow_mut() else {
            // Only reachable if `f` recorded a decision itself; never
            // lose the count for it.
            return f(&mut Handles::new(surface, namespace, resource));
        };
        let cache = &mut *cache;
        let hash = cache.hasher.hash_one((surface, namespace, resource));
        let hasher = &cache.hasher;
        if cache.sets.len() >= MAX_ENTRIES
            && cache
                .sets
                .find(hash, |h| h.is(surface, namespace, resource))
                .is_none()
        {
            cache.sets.clear();
        }
        let entry = cache.sets.entry(
            hash,
            |h| h.is(surface, namespace, resource),
            |h| hasher.hash_one((h.surface, &*h.namespace, &*h.resource)),
        );
        f(entry
            .or_insert_with(|| Handles::new(surface, namespace, resource))
            .into_mut());
    });
}

/// Records `seconds` in `tollgate_decision_seconds` of `surface`.
pub(super) fn record_latency(surface: &'static str, seconds: f64) {
    if !CACHING.load(Ordering::Acquire) {
        return metrics::histogram!(LATENCY, "surface" => surface).record(seconds);
    }
    CACHE.with(|cache| {
        let Ok(mut cache) = cache.try_borrow_mut() else {
            return metrics::histogram!(LATENCY, "surface" => surface).record(seconds);
        };
        if let Some((_, h)) = cache.latency.iter().find(|(s, _)| *s == surface) {
            return h.record(seconds);
        }
        let h = metrics::histogram!(LATENCY, "surface" => surface);
        h.record(seconds);
        cache.latency.push((surface, h));
    });
}
