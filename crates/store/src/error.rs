//! Why a store could not decide, and why it will not serve a limit.

use std::sync::Arc;

use thiserror::Error;
use tollgate_core::copies::CopyError;
use tollgate_core::PlanError;

use crate::plan::DuplicateKey;

/// A store's failure. Client errors (`Plan`, `Copy`, `DuplicateKey`) are the
/// caller's fault; `AtCapacity`, `Overloaded` and `Unavailable` are the
/// server's.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The plan cannot be decided (acquire on an algorithm that cannot
    /// schedule).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A copy operation was refused (not held, unknown transfer, ...).
    #[error(transparent)]
    Copy(#[from] CopyError),
    /// Two items of one plan would share a key: building the plan failed
    /// ([`crate::Plan::push`]); no store sees such a plan.
    #[error(transparent)]
    DuplicateKey(#[from] DuplicateKey),
    /// The store holds its maximum number of keys and is configured to
    /// reject requests for new ones.
    #[error("the store is at its key capacity ({0} keys)")]
    AtCapacity(usize),
    /// The store holds its maximum number of staged transfers: staging
    /// another must wait until some are seized or expire.
    #[error("the store holds its maximum of {0} staged transfers; seize or let some expire first")]
    TooManyTransfers(usize),
    /// The store is up and answering, but the most requests that may wait
    /// for it (the number) already do: this one was shed at once rather
    /// than queued without end (the Redis store past `max_waiting`). An
    /// answer, not an outage: clients should retry, not fail open.
    #[error(
        "the store is overloaded: the most decisions that may wait for it ({0}) already do, \
         so this one was shed; retry shortly"
    )]
    Overloaded(usize),
    /// The backing service cannot be reached or failed to answer in time
    /// (not used by the memory store).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The request is valid but this store cannot represent it exactly
    /// (the Redis store's scripts count in doubles, exact below 2^52).
    #[error("not supported by this store: {0}")]
    Unsupported(String),
}

impl StoreError {
    /// The refusal of a store that keeps no copy pools (it has no single
    /// owner of truth for them). [`Refusal::NoCopies`] keeps such a
    /// resource out of its config; this answers a copy operation that
    /// reaches it anyway.
    pub fn no_copies() -> StoreError {
        StoreError::Unsupported(
            "this store keeps no copy pools: copy-limited resources need a store with one owner \
             of truth"
                .into(),
        )
    }
}

/// Why a store will not serve one limit of a config ([`Store::admit`](crate::Store::admit)):
/// the config is refused with it before it is put in force, rather than
/// served wrongly. Says what to change, but names no command-line flag:
/// the binary that maps it knows its flags.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The store keeps no copy pools, and the limit is a copy-limited
    /// resource's.
    #[error(
        "copy-limited (concurrency) resources need one owner of truth, which this store does \
         not have; remove it from this config, or serve it from a store that keeps copy pools"
    )]
    NoCopies,
    /// The store cannot decide the limit as configured; the store's own
    /// error (its type is the store's: downcast to branch on it) names the
    /// parameter or algorithm and what to change.
    #[error(transparent)]
    Limit(Arc<dyn std::error::Error + Send + Sync + 'static>),
}

impl Refusal {
    /// A refusal of a limit, for the store's own reason `why`.
    pub fn limit(why: impl std::error::Error + Send + Sync + 'static) -> Refusal {
        Refusal::Limit(Arc::new(why))
    }
}

/// Two refusals are the same when they are of one kind and say the same:
/// a config's list of problems tells each once.
impl PartialEq for Refusal {
    fn eq(&self, other: &Refusal) -> bool {
        match (self, other) {
            (Refusal::NoCopies, Refusal::NoCopies) => true,
            (Refusal::Limit(a), Refusal::Limit(b)) => a.to_string() == b.to_string(),
            _ => false,
        }
    }
}

impl Eq for Refusal {}

impl std::hash::Hash for Refusal {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        if let Refusal::Limit(why) = self {
            why.to_string().hash(state);
        }
    }
}
