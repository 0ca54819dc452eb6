//! What a client call can end in besides a grant.

use std::time::Duration;

use tollgate_proto::v1;

use crate::outage::Outage;

/// A request or hold that did not succeed.
///
/// Non-exhaustive: new ways to fail may be told apart in later versions,
/// so a `match` needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server rejected every attempt until `max_wait` was spent (or
    /// said the request can never succeed); the last rejection is kept.
    #[error("rejected after {} attempt(s) over {:?}", .0.attempts, .0.waited)]
    Rejected(Box<Rejection>),
    /// The server refused the request as the caller's mistake (unknown
    /// resource, wrong kind, malformed, not held, unknown transfer, not
    /// allowed): never failed open, since retrying cannot help.
    #[error("refused by the server ({reason}): {message}")]
    Refused {
        /// The gRPC status code.
        code: tonic::Code,
        /// Machine-readable: `unknown_resource`, `not_held`, ...
        reason: String,
        /// For people.
        message: String,
    },
    /// Every server that answered refused for want of room of its own
    /// (`too_many_sessions`, `store_at_capacity`). The servers are up and
    /// limiting, so the call is not failed open (that is only for when no
    /// server answers): the caller may retry later, or give up.
    #[error("refused by every server that answered ({reason}): {message}")]
    AtCapacity {
        /// Machine-readable: `too_many_sessions`, `store_at_capacity`.
        reason: String,
        /// For people.
        message: String,
    },
    /// No server answered (unreachable, no answer in time, or a server
    /// error such as `store_unavailable`) and fail-open is off: each
    /// server tried and its error.
    #[error("no tollgate server answered: {0}")]
    Unavailable(Outage),
    /// No server answered, and TLS with one of them failed in a way a
    /// setting fixes: the server requires a client certificate or does
    /// not trust this one, or its certificate is not signed by the CA
    /// given or does not carry the name connected to. That server's
    /// entry in the outage ([`FailureKind::Tls`](crate::FailureKind::Tls))
    /// says which, and what to pass. Otherwise the same as
    /// [`Error::Unavailable`] (a call with fail-open on was granted
    /// degraded instead); separate so that a caller can tell a
    /// misconfiguration, which waiting does not mend, from an outage.
    #[error("no tollgate server answered: {0}")]
    Tls(Outage),
    /// The hold's session ended (its server went away): the server has
    /// released what it held, so there is nothing left to release or
    /// transfer.
    #[error("the hold's session ended; its server released its copies")]
    HoldLost,
    /// A degraded or overridden hold holds nothing on any server: it cannot
    /// be transferred.
    #[error("a hold granted without a server (degraded or kill switch) cannot be transferred")]
    NotOnServer,
    /// A server answered with an answer of another kind than the one
    /// asked for (a release answered as a reserve): a bug of the server
    /// or of this client, not an outage.
    #[error(
        "a tollgate server answered with an answer of the wrong kind (a bug; please report it)"
    )]
    WrongAnswer,
    /// The call itself is wrong (no endpoints, a bad URL, two rate-limited
    /// resources in one acquisition, ...).
    #[error("{0}")]
    Invalid(String),
}

/// The last rejection of a call that gave up.
#[derive(Clone, Debug)]
pub struct Rejection {
    /// Requests sent, the first included.
    pub attempts: u32,
    /// Time spent, sleeps included.
    pub waited: Duration,
    /// The server's last answer.
    pub last: Rejected,
}

/// A rejecting answer of either kind.
#[derive(Clone, Debug)]
pub enum Rejected {
    /// A rate request's answer (limit, remaining, retry_after, tier, ...).
    Rate(v1::RateResponse),
    /// A reserve's answer (domain, group and global limits and holds).
    Hold(v1::ReserveResponse),
}

/// No server answered: [`Error::Tls`] if TLS failed with any server tried
/// (a setting the caller can fix, rather than an outage), else
/// [`Error::Unavailable`].
impl From<Outage> for Error {
    fn from(outage: Outage) -> Error {
        if outage.tls_failed() {
            Error::Tls(outage)
        } else {
            Error::Unavailable(outage)
        }
    }
}

impl Error {
    /// The rejection, if this is one.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Error::Rejected(r) => Some(r),
            _ => None,
        }
    }

    /// Each server tried and its error, when no server answered
    /// ([`Error::Unavailable`], [`Error::Tls`]).
    pub fn outage(&self) -> Option<&Outage> {
        match self {
            Error::Unavailable(o) | Error::Tls(o) => Some(o),
            _ => None,
        }
    }
}
