//! Why the service could not answer a request (Charon §3.1's error classes).

use std::fmt::{self, Write as _};

use thiserror::Error;
use tollgate_core::copies::{Copies, Groups};
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
    /// A limit the request brought of its own that its resource does not
    /// take: it allows none, or the limit is faster than its
    /// `override_max`.
    #[error("{0}")]
    LimitOverride(String),
    /// A reset of a copy-limited resource: its holds belong to the clients
    /// holding them.
    #[error(
        "resource `{resource}` in namespace `{namespace}` is concurrency-limited: its holds \
         belong to the clients holding them and cannot be reset; a holder releases its copies \
         (a session's end or a hold's lapsed lease releases them too)"
    )]
    HoldsNotResettable {
        /// The namespace.
        namespace: String,
        /// The resource.
        resource: String,
    },
    /// One limit of a resource's `limits:` list refused the plan (it cannot
    /// schedule, never admits the hits, or takes no usage): the store's
    /// refusal, naming the limit, whose reason it keeps.
    #[error("resource `{}`, limit `{}`: {}", .0.resource, .0.limit, .0.source)]
    InLimit(Box<InLimit>),
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
                    | StoreError::Overloaded(_)
                    | StoreError::Unavailable(_)
            ) | ServiceError::TooManySessions(_)
        )
    }

    /// A stable, machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ServiceError::Malformed(_) => "malformed_request",
            ServiceError::LimitOverride(_) => "invalid_limit_override",
            ServiceError::UnknownNamespace(_) => "unknown_namespace",
            ServiceError::UnknownResource { .. } => "unknown_resource",
            ServiceError::WrongKind { .. } => "wrong_resource_kind",
            ServiceError::NoDescriptors(_) => "no_descriptors",
            ServiceError::UnknownHold(_) => "unknown_hold",
            ServiceError::TooManySessions(_) => "too_many_sessions",
            ServiceError::TooManyHolds(_) => "too_many_holds",
            ServiceError::SessionClosed => "session_closed",
            ServiceError::NotHeld(_) => "not_held",
            ServiceError::HoldsNotResettable { .. } => "holds_not_resettable",
            ServiceError::Store(e) => store_reason(e),
            ServiceError::InLimit(r) => store_reason(&r.source),
        }
    }
}

/// What [`ServiceError::InLimit`] carries (boxed: it is rare, and every
/// `Result` of the service would otherwise carry its size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InLimit {
    /// The resource.
    pub resource: String,
    /// The limit's name (its `name:`, else its position from 1).
    pub limit: String,
    /// The store's refusal.
    pub source: StoreError,
}

/// The reason of a store's refusal or failure.
fn store_reason(e: &StoreError) -> &'static str {
    match e {
        StoreError::Copy(tollgate_core::copies::CopyError::NotHeld { .. }) => "not_held",
        StoreError::Copy(tollgate_core::copies::CopyError::UnknownTransfer) => "unknown_transfer",
        StoreError::Copy(_) => "bad_copies",
        StoreError::Plan(tollgate_core::PlanError::NeverAdmits { .. }) => "exceeds_limit",
        StoreError::Plan(tollgate_core::PlanError::NoUsage { .. }) => "no_usage",
        StoreError::Plan(_) => "cannot_schedule",
        StoreError::DuplicateKey(_) => "duplicate_key",
        StoreError::AtCapacity(_) => "store_at_capacity",
        StoreError::Overloaded(_) => "store_overloaded",
        StoreError::TooManyTransfers(_) => "too_many_transfers",
        StoreError::Unsupported(_) => "unsupported_by_store",
        _ => "store_unavailable",
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
    /// The most bytes the message takes: below the 1 KiB every surface
    /// allows an error message (`tollgate_server::errors::MAX_MESSAGE_BYTES`),
    /// so no surface cuts it, which would cut the middle out of what the
    /// session holds. Entries that do not fit are counted in "and N more".
    pub const MAX_BYTES: usize = 1000;
    /// The bytes of one name (a domain, a resource, a group) the message
    /// echoes; a longer one is cut there and ends in `…`. Names may be as
    /// long as `max_name_bytes`, and the message lists several.
    pub const NAME_BYTES: usize = 64;
    /// The bytes one list of groups takes before the rest are counted
    /// (`and 3 more`): a handful of short names, two cut ones; always at
    /// least one.
    pub const GROUPS_BYTES: usize = 160;
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
        // Built whole, then written: entries are added while they fit in
        // `MAX_BYTES` (the first always does: every part of it is cut to
        // `NAME_BYTES` and `GROUPS_BYTES`).
        let mut out = String::with_capacity(Self::MAX_BYTES);
        let held = match self.held {
            0 => Copies(0).to_string(),
            n => format!("only {}", Copies(n)),
        };
        let _ = write!(
            out,
            "this {} holds {held} of resource `{}` for domain `{}`",
            self.holder,
            Name(&self.resource),
            Name(&self.domain)
        );
        if let Some(groups) = &self.groups {
            let _ = write!(out, " {}", Listed(groups));
        }
        let _ = write!(
            out,
            ", so it cannot {} {}; ",
            self.operation, self.requested
        );
        if self.holds.is_empty() {
            out.push_str("it holds no copies at all");
            return f.write_str(&out);
        }
        out.push_str("it holds ");
        // Room kept for the count of what is left out, at its largest.
        let tail = format!(", and {} more", self.more.saturating_add(self.holds.len())).len();
        let mut shown = 0;
        for h in &self.holds {
            let mut entry = format!("{} of `{}`", Copies(h.copies), Name(&h.resource));
            if h.namespace != self.namespace {
                let _ = write!(entry, " (namespace `{}`)", Name(&h.namespace));
            }
            let _ = write!(
                entry,
                " for domain `{}` {}",
                Name(&h.domain),
                Listed(&h.groups)
            );
            if shown > 0 {
                if out.len() + 2 + entry.len() + tail > Self::MAX_BYTES {
                    break;
                }
                out.push_str(", ");
            }
            out.push_str(&entry);
            shown += 1;
        }
        let left = self.more.saturating_add(self.holds.len() - shown);
        if left > 0 {
            let _ = write!(out, ", and {left} more");
        }
        f.write_str(&out)
    }
}

/// A name as a message echoes it: at most [`NotHeld::NAME_BYTES`] bytes of
/// it (cut at a character), then `…` if it was longer.
struct Name<'a>(&'a str);

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.len() <= NotHeld::NAME_BYTES {
            return f.write_str(self.0);
        }
        let mut end = NotHeld::NAME_BYTES;
        while !self.0.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{}…", &self.0[..end])
    }
}

/// Groups as a message says them ([`InGroups`]), each a [`Name`], as many
/// as fit in [`NotHeld::GROUPS_BYTES`] (at least one), the rest counted:
/// ``in groups `a`, `b` and 2 more``.
struct Listed<'a>(&'a [String]);

impl fmt::Display for Listed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = String::new();
        let mut shown = 0;
        for g in self.0 {
            let item = format!("`{}`", Name(g));
            if shown > 0 {
                if list.len() + 2 + item.len() > NotHeld::GROUPS_BYTES {
                    break;
                }
                list.push_str(", ");
            }
            list.push_str(&item);
            shown += 1;
        }
        match (self.0.len(), self.0.len() - shown) {
            (0, _) => f.write_str("in no group"),
            (1, _) => write!(f, "in group {list}"),
            (_, 0) => write!(f, "in groups {list}"),
            (_, more) => write!(f, "in groups {list} and {more} more"),
        }
    }
}
