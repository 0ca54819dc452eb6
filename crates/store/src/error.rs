//! Why a store could not decide.

use thiserror::Error;
use tollgate_core::copies::CopyError;
use tollgate_core::PlanError;

use crate::plan::DuplicateKey;

/// A store's failure. Client errors (`Plan`, `Copy`, `DuplicateKey`) are the
/// caller's fault; `AtCapacity` and `Unavailable` are the server's.
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
    /// The refusal of a store that keeps no copy pools (a replicated
    /// cluster has no single owner of truth for them).
    pub fn no_copies() -> StoreError {
        StoreError::Unsupported(
            "copy-limited resources need the memory or Redis store; a replicated cluster has \
             no single owner of truth"
                .into(),
        )
    }
}
