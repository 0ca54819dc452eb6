//! Service errors as gRPC statuses and HTTP answers (Charon §3.1's error
//! classes): client errors get distinct codes and a machine-readable
//! reason; a server that is up but refuses (too many sessions, store at
//! capacity, store overloaded) is `RESOURCE_EXHAUSTED` / 429 with
//! `Retry-After`; a server that cannot answer
//! (its store failed) is `UNAVAILABLE` / 503, or `INTERNAL` / 500 for a
//! bug.
//!
//! The distinction between the last two matters to clients: Charon's
//! client fails open only when no server answers (§4.3.1), so a refusal
//! must not look like an outage, or filling a server's session table
//! would switch limiting off for every client.
//!
//! Every message a client reads is made here ([`message`]): a store
//! failure's own text names the store's address and its raw error, which
//! are the operator's business, so the answer says only that the store is
//! unavailable and the detail goes to the server's log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use http::StatusCode;
use tollgate_service::ServiceError;
use tollgate_store::StoreError;
use tonic::{Code, Status};

/// The metadata key carrying the machine-readable reason.
pub const REASON_HEADER: &str = "tollgate-reason";

/// The `Retry-After` (seconds) of a refusal (`429` with an error body):
/// the server cannot know when a session or a key frees up, and a second
/// is long enough not to hammer it and short enough not to idle.
pub const REFUSAL_RETRY_AFTER_S: u64 = 1;

/// What a client reads when the store failed: no address, no raw error.
pub const STORE_UNAVAILABLE: &str =
    "store unavailable: the server cannot reach its store now; retry, or ask another server (the server's log has the detail)";

/// The bound on the messages an error answer carries, and the cut that
/// keeps them to it: shared with the config API (`tollgate_core::message`
/// says why the bound exists).
pub use tollgate_core::message::{bounded, MAX_MESSAGE_BYTES};

// `not_held` keeps to a budget of its own, so that no surface cuts the
// middle (what the session holds) out of it.
const _: () = assert!(tollgate_service::NotHeld::MAX_BYTES <= MAX_MESSAGE_BYTES);

/// The gRPC code of `e`.
pub fn grpc_code(e: &ServiceError) -> Code {
    match e.reason() {
        "malformed_request" | "bad_copies" | "invalid_limit_override" => Code::InvalidArgument,
        "unknown_namespace" | "unknown_resource" | "unknown_transfer" | "unknown_hold" => {
            Code::NotFound
        }
        "wrong_resource_kind"
        | "not_held"
        | "no_descriptors"
        | "cannot_schedule"
        | "no_usage"
        | "session_closed"
        | "too_many_holds"
        | "holds_not_resettable" => Code::FailedPrecondition,
        "exceeds_limit" | "unsupported_by_store" => Code::OutOfRange,
        // Up and answering, but refusing for want of room of its own.
        "too_many_sessions" | "store_at_capacity" | "too_many_transfers" | "store_overloaded" => {
            Code::ResourceExhausted
        }
        "store_unavailable" => Code::Unavailable,
        "duplicate_key" => Code::Internal,
        // A reason this table does not know is a bug here, never an
        // outage: `UNAVAILABLE` makes clients fail open, which is how
        // `too_many_holds`, once missing here, switched limiting off for a
        // session at its bound.
        _ => Code::Internal,
    }
}

/// The HTTP status of `e`.
pub fn http_status(e: &ServiceError) -> StatusCode {
    match grpc_code(e) {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::FailedPrecondition => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The message a client reads for `e`. A store failure is logged here,
/// with any URL's credentials redacted, and answered with
/// [`STORE_UNAVAILABLE`].
pub fn message(e: &ServiceError) -> String {
    match e {
        ServiceError::Store(StoreError::Unavailable(detail)) => {
            log_unavailable(detail);
            STORE_UNAVAILABLE.to_owned()
        }
        _ => bounded(e.to_string()),
    }
}

/// `e` as a gRPC status with the reason in metadata.
pub fn status(e: &ServiceError) -> Status {
    let mut s = Status::new(grpc_code(e), message(e));
    if let Ok(v) = e.reason().parse() {
        s.metadata_mut().insert(REASON_HEADER, v);
    }
    s
}

/// A malformed request found by a surface before the service saw it.
pub fn malformed(message: impl Into<String>) -> ServiceError {
    ServiceError::Malformed(message.into())
}

/// How often a failing store is logged at `warn`: every answer it spoils
/// is logged at `debug`, but a store that is down spoils every request,
/// and one line per request would bury the log.
const WARN_EVERY: Duration = Duration::from_secs(10);

fn log_unavailable(detail: &str) {
    let detail = redact_urls(detail);
    tracing::debug!(detail = ?detail, "answered store_unavailable");
    // Monotonic milliseconds since first use, plus one (0: never logged).
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    let last = LAST.load(Ordering::Relaxed);
    let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64;
    if due
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(detail = ?detail, "the store failed; clients are answered store_unavailable");
    }
}

/// `text` with the credentials of every URL in it (`scheme://user:pass@host`)
/// replaced by `***`, by the rule of the Redis store's own `redact` for
/// one URL ([`tollgate_auth::redact`]): everything from a line's first
/// `://` to the last `@` of the line is hidden, and so are the values of
/// query parameters named like a password. A password may hold any character
/// (`/`, `?`, `#`, `@`, `,`, `)`, a space), and in free text nothing says
/// where a URL ends; but credentials always end at an `@`, so hiding up to
/// the line's last one hides them whatever they hold. An `@` later on the
/// line (a second URL's credentials, an address in the message) hides more
/// than the credentials, never less (second review of issue 18: a
/// password with a `/`, `,`, `;`, `)`, `"` or a space was shown, since the
/// authority was taken to end there).
pub fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&redact_line(line));
    }
    out
}

/// [`redact_urls`] for a text of one line: the line from its first URL
/// on is shown as [`tollgate_auth::redact`] shows a URL (which also hides
/// the values of query parameters named like a password).
fn redact_line(line: &str) -> String {
    if line.contains("://") {
        tollgate_auth::redact(line)
    } else {
        line.to_owned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials_wherever_they_are_in_a_message() {
        assert_eq!(
            redact_urls("reserve (redis://u:secret@10.0.0.1:6379/0): broken pipe"),
            "reserve (redis://***@10.0.0.1:6379/0): broken pipe"
        );
        // Two URLs with credentials on one line: everything between the
        // first's scheme and the last `@` is hidden (more than the
        // credentials, never less).
        assert_eq!(
            redact_urls("a rediss://:pw@h:1 and redis://h:2, redis://x@y"),
            "a rediss://***@y"
        );
        assert_eq!(
            redact_urls("a redis://h:2 failed\nthen redis://u:pw@h:3 did"),
            "a redis://h:2 failed\nthen redis://***@h:3 did"
        );
        assert_eq!(redact_urls("no url here"), "no url here");
    }

    /// Regression (second review of issue 18): the authority was taken to
    /// end at the first `/`, `,`, `;`, `)`, `"` or space, so a password
    /// holding one was shown whole (the part after it, and often the part
    /// before). Every character a password may hold, in every place.
    #[test]
    fn a_password_holding_any_character_is_never_shown() {
        for mark in [
            "/", "?", "#", "@", ",", ";", ")", "(", "\"", " ", "://", "%2F", ":",
        ] {
            let password = format!("hun{mark}ter2");
            for text in [
                format!("Redis failed (redis://:{password}@10.0.0.1:6379/0): broken pipe"),
                format!("redis://user:{password}@h"),
                format!("cannot reach rediss-sentinel://:{password}@a:1,b:2/m, retrying"),
                format!("x redis://h:1 and redis://:{password}@h:2/0 failed"),
                format!("cannot open the database postgres://u@h/db?password={password}"),
            ] {
                let shown = redact_urls(&text);
                assert!(
                    !shown.contains("hun") && !shown.contains("ter2"),
                    "{text:?} shown as {shown:?}"
                );
                assert!(shown.contains("***"), "{shown}");
            }
        }
    }

    #[test]
    fn refusals_are_resource_exhausted_and_429_and_store_failures_unavailable() {
        let full = ServiceError::TooManySessions(2);
        assert_eq!(grpc_code(&full), Code::ResourceExhausted);
        assert_eq!(http_status(&full), StatusCode::TOO_MANY_REQUESTS);
        let cap = ServiceError::Store(StoreError::AtCapacity(10));
        assert_eq!(grpc_code(&cap), Code::ResourceExhausted);
        // Issue 16: a session at --max-holds-per-session was answered
        // UNAVAILABLE, on which the client library fails open. It is the
        // session's own doing: a client error.
        let holds = ServiceError::TooManyHolds(4);
        assert_eq!(grpc_code(&holds), Code::FailedPrecondition);
        assert_eq!(http_status(&holds), StatusCode::CONFLICT);
        // Review of issue 17, finding 4: a decision the Redis store shed
        // (too many waiting) was answered store_unavailable, on which
        // clients fail open. The store answered: a refusal.
        let shed = ServiceError::Store(StoreError::Overloaded(8192));
        assert_eq!(shed.reason(), "store_overloaded");
        assert!(!shed.is_client_error());
        assert_eq!(grpc_code(&shed), Code::ResourceExhausted);
        assert_eq!(http_status(&shed), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            status(&shed).metadata().get(REASON_HEADER).unwrap(),
            "store_overloaded"
        );
        assert!(message(&shed).contains("overloaded"), "{}", message(&shed));
        let down = ServiceError::Store(StoreError::Unavailable(
            "reserve (redis://u:pw@h:1): connection refused".into(),
        ));
        assert_eq!(grpc_code(&down), Code::Unavailable);
        assert_eq!(http_status(&down), StatusCode::SERVICE_UNAVAILABLE);
        let s = status(&down);
        assert_eq!(s.message(), STORE_UNAVAILABLE);
        assert_eq!(
            s.metadata().get(REASON_HEADER).unwrap(),
            "store_unavailable"
        );
    }
}
