//! Why the service could not answer a request (Charon §3.1's error classes).

use thiserror::Error;
use tollgate_store::StoreError;

/// A request the service cannot answer. Being limited is not an error.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The request is not well-formed (Charon §3.1 client error 1).
    #[error("malformed request: {0}")]
    Malformed(String),
    /// No such namespace.
    #[error("unknown namespace `{0}`")]
    UnknownNamespace(String),
    /// No such resource, and the namespace does not allow unconfigured ones
    /// (client error 2).
    #[error("unknown resource `{resource}` in namespace `{namespace}`")]
    UnknownResource {
        /// The namespace.
        namespace: String,
        /// The resource asked for.
        resource: String,
    },
    /// The resource is of the other kind (client error 3).
    #[error("resource `{resource}` in namespace `{namespace}` is {actual}-limited; {operation} needs a {expected}-limited resource")]
    WrongKind {
        /// The namespace.
        namespace: String,
        /// The resource.
        resource: String,
        /// What it is: `rate` or `concurrency`.
        actual: &'static str,
        /// What the operation needs.
        expected: &'static str,
        /// The operation.
        operation: &'static str,
    },
    /// Descriptors sent to a namespace that has no descriptor tree.
    #[error(
        "namespace `{0}` has no descriptors (it was not loaded from an envoyproxy/ratelimit file)"
    )]
    NoDescriptors(String),
    /// No open session or HTTP hold has this id (it was never issued, was
    /// closed, or its lease lapsed).
    #[error("no hold or session `{0}` (never issued, closed, or its lease lapsed)")]
    UnknownHold(String),
    /// The server's session limit is reached.
    #[error("too many sessions: the server allows {0} at once")]
    TooManySessions(usize),
    /// The session holds copies under as many distinct (resource, domain,
    /// groups) entries as one session may.
    #[error("too many holds: one session may hold copies under at most {0} distinct resource, domain and group entries; release some or open another session")]
    TooManyHolds(usize),
    /// The session ended while the operation ran; what it was granted has
    /// been given back.
    #[error("the session is closed")]
    SessionClosed,
    /// The store refused or failed (releasing what is not held is client
    /// error 4).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ServiceError {
    /// Whether the caller is at fault (retrying the same request to the same
    /// server cannot help) rather than the server.
    pub fn is_client_error(&self) -> bool {
        !matches!(
            self,
            ServiceError::Store(
                StoreError::AtCapacity(_)
                    | StoreError::TooManyTransfers(_)
                    | StoreError::Unavailable(_)
            ) | ServiceError::TooManySessions(_)
        )
    }

    /// A stable, machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ServiceError::Malformed(_) => "malformed_request",
            ServiceError::UnknownNamespace(_) => "unknown_namespace",
            ServiceError::UnknownResource { .. } => "unknown_resource",
            ServiceError::WrongKind { .. } => "wrong_resource_kind",
            ServiceError::NoDescriptors(_) => "no_descriptors",
            ServiceError::UnknownHold(_) => "unknown_hold",
            ServiceError::TooManySessions(_) => "too_many_sessions",
            ServiceError::TooManyHolds(_) => "too_many_holds",
            ServiceError::SessionClosed => "session_closed",
            ServiceError::Store(StoreError::Copy(tollgate_core::copies::CopyError::NotHeld {
                ..
            })) => "not_held",
            ServiceError::Store(StoreError::Copy(
                tollgate_core::copies::CopyError::UnknownTransfer,
            )) => "unknown_transfer",
            ServiceError::Store(StoreError::Copy(_)) => "bad_copies",
            ServiceError::Store(StoreError::Plan(tollgate_core::PlanError::NeverAdmits {
                ..
            })) => "exceeds_limit",
            ServiceError::Store(StoreError::Plan(_)) => "cannot_schedule",
            ServiceError::Store(StoreError::DuplicateKey(_)) => "duplicate_key",
            ServiceError::Store(StoreError::AtCapacity(_)) => "store_at_capacity",
            ServiceError::Store(StoreError::TooManyTransfers(_)) => "too_many_transfers",
            ServiceError::Store(StoreError::Unsupported(_)) => "unsupported_by_store",
            ServiceError::Store(_) => "store_unavailable",
        }
    }
}
