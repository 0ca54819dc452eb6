//! Bearer tokens with two roles: [`tollgate_auth`], under the name the
//! server's modules use. The format is shared with the config API, which
//! reads it without depending on the server.
//!
//! [`authorize`] is the one rule every admin endpoint follows, on HTTP
//! (`/v1/denied`, `/v1/counters`) and on gRPC (`Inspect`, `Reset`): off
//! without tokens, a known token of the right role, else refused with a
//! reason (counted in `tollgate_admin_auth_failures_total`). Reads take
//! either role; writes (resetting counters) take `admin`.

pub use tollgate_auth::{bearer, Caller, Role, Tokens, TokensError};

use crate::metrics as m;

/// Why an admin request was refused. Names no token: a refusal is logged
/// and answered, and neither may carry a secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No token is configured: admin endpoints are off.
    Off,
    /// No bearer token was sent (`no_token`), or one this server does not
    /// know (`unknown_token`).
    Unauthenticated(&'static str),
    /// A `read` token asked to write.
    Forbidden,
}

impl Refused {
    /// The machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Off => "admin_endpoints_off",
            Refused::Unauthenticated(reason) => reason,
            Refused::Forbidden => "admin_role_required",
        }
    }

    /// What the caller reads: what is wrong and how to fix it. `what`
    /// names the endpoint (`/v1/counters`, `Inspect`).
    pub fn message(&self, what: &str) -> String {
        match self {
            Refused::Off => format!(
                "{what} is an admin endpoint, and admin endpoints are off: start the server with \
                 --admin-tokens-file (or TOLLGATE_ADMIN_TOKENS_FILE), ROLE:NAME:TOKEN per line, \
                 and send a token as `Authorization: Bearer TOKEN`"
            ),
            Refused::Unauthenticated("unknown_token") => {
                "the bearer token is not one of this server's admin tokens".to_owned()
            }
            Refused::Unauthenticated(_) => {
                "an admin endpoint needs `Authorization: Bearer TOKEN` with a token of the \
                 server's --admin-tokens-file"
                    .to_owned()
            }
            Refused::Forbidden => format!(
                "{what} changes state and needs a token of role `admin`; this token's role is \
                 `read`"
            ),
        }
    }
}

/// Whether a request bearing `authorization` (the header's or metadata's
/// value, if any) may use an admin endpoint: any known token reads, only
/// an `admin` token writes. A refusal other than [`Refused::Off`] is
/// counted in `tollgate_admin_auth_failures_total` by reason.
pub fn authorize(
    tokens: &Tokens,
    authorization: Option<&str>,
    write: bool,
) -> Result<Caller, Refused> {
    if tokens.is_empty() {
        return Err(Refused::Off);
    }
    let refused = match authorization.and_then(bearer).map(|t| tokens.check(t)) {
        Some(Some(caller)) if !write || caller.role == Role::Admin => return Ok(caller),
        Some(Some(_)) => Refused::Forbidden,
        Some(None) => Refused::Unauthenticated("unknown_token"),
        None => Refused::Unauthenticated("no_token"),
    };
    metrics::counter!(m::ADMIN_AUTH_FAILURES, "reason" => refused.reason()).increment(1);
    Err(refused)
}
