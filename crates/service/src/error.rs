//! Why the service could not answer a request (Charon §3.1's error classes).

use std::fmt;

use thiserror::Error;
use tollgate_core::copies::{Copies, Groups, InGroups};
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
    /// A release or transfer asked a session for copies its record does
    /// not hold (Charon §3.1 client error 4, as the session sees it).
    #[error("{0}")]
    NotHeld(Box<NotHeld>),
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
            ServiceError::NotHeld(_) => "not_held",
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

/// What a session was asked to release or transfer and could not, with
/// what it does hold, so the message names the domain, groups and
/// resource the caller should have named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotHeld {
    /// `hold` for an HTTP hold (a leased session), `session` for a gRPC
    /// session: the word the caller knows it by.
    pub holder: &'static str,
    /// `release` or `transfer`.
    pub operation: &'static str,
    /// The namespace asked for.
    pub namespace: String,
    /// The resource asked for.
    pub resource: String,
    /// The domain asked for.
    pub domain: String,
    /// The groups asked for, if the request named any.
    pub groups: Option<Groups>,
    /// Copies the session holds under what was asked for.
    pub held: u64,
    /// Copies asked for.
    pub requested: u64,
    /// What the session holds: those of the domain and resource asked for
    /// first, then of the resource, then the rest, each by most copies; at
    /// most [`NotHeld::SHOWN`] entries.
    pub holds: Vec<Holding>,
    /// Entries the session holds beyond those in `holds`.
    pub more: usize,
}

impl NotHeld {
    /// Entries of the session's record a message lists: a session may
    /// hold under a thousand, and an error should stay a line.
    pub const SHOWN: usize = 5;
}

/// Copies a session holds of one resource, for one domain, in one set of
/// groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The resource's namespace.
    pub namespace: String,
    /// The resource.
    pub resource: String,
    /// The domain the copies were reserved for.
    pub domain: String,
    /// The groups they are counted in.
    pub groups: Groups,
    /// How many.
    pub copies: u64,
}

impl fmt::Display for NotHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = match self.held {
            0 => Copies(0).to_string(),
            n => format!("only {}", Copies(n)),
        };
        write!(
            f,
            "this {} holds {held} of resource `{}` for domain `{}`",
            self.holder, self.resource, self.domain
        )?;
        if let Some(groups) = &self.groups {
            write!(f, " {}", InGroups(groups))?;
        }
        write!(f, ", so it cannot {} {}; ", self.operation, self.requested)?;
        if self.holds.is_empty() {
            return write!(f, "it holds no copies at all");
        }
        f.write_str("it holds ")?;
        for (i, h) in self.holds.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} of `{}`", Copies(h.copies), h.resource)?;
            if h.namespace != self.namespace {
                write!(f, " (namespace `{}`)", h.namespace)?;
            }
            write!(f, " for domain `{}` {}", h.domain, InGroups(&h.groups))?;
        }
        if self.more > 0 {
            write!(f, ", and {} more", self.more)?;
        }
        Ok(())
    }
}
