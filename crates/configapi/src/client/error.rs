//! What can go wrong following the API: building the client, and each
//! fetch. A fetch's error says which of the follower's kinds of trouble
//! it is ([`super::throttle`]): no answer, a refused token, or an answer
//! that is not a delta.

use std::path::PathBuf;

use super::token::{TokenError, TokenSource, TOKEN_FORMAT, TOKEN_VARIABLE};

/// The API refused the server's token (401, or 403): waiting does not
/// help, a token does.
#[derive(Debug)]
pub struct TokenRefused {
    /// The API's URL as shown (without a user or password).
    pub(crate) shown: String,
    pub(crate) source: TokenSource,
    pub(crate) status: reqwest::StatusCode,
    /// The API's message (its error shape's), or the start of its body,
    /// as [`super::Follower`] shows an answer.
    pub(crate) message: String,
    /// The token looks like a whole line of the tokens file.
    pub(crate) whole_line: bool,
}

impl std::fmt::Display for TokenRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the config API at {} refused the token in {} ({}: {}); {TOKEN_FORMAT}",
            self.shown, self.source, self.status, self.message
        )?;
        if self.whole_line {
            f.write_str("; it holds a whole `ROLE:NAME:TOKEN` line: keep only the TOKEN part")?;
        }
        Ok(())
    }
}

impl std::error::Error for TokenRefused {}

/// Why a follower could not be built (nothing was contacted).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The URL holds a user or password (shown redacted).
    #[error(
        "{0}: the URL holds a user or password, which the config API does not take; remove \
         `USER:PASSWORD@` (the server's credential is the read token, in a token file or \
         {TOKEN_VARIABLE})"
    )]
    UserInfo(String),
    /// Not an `http://` or `https://` URL (shown redacted).
    #[error("the config API's URL must be an http:// or https:// URL, not {0:?}")]
    NotHttp(String),
    /// The token cannot be used.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The CA file cannot be read.
    #[error("cannot read {}", .0.display())]
    CaUnreadable(PathBuf, #[source] std::io::Error),
    /// The CA file is not PEM certificates.
    #[error("the config API's CA")]
    Ca(#[source] reqwest::Error),
    /// The HTTP client could not be built (TLS setup).
    #[error("cannot build the config API client")]
    Client(#[source] reqwest::Error),
}

/// Why a fetch of the API's config failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// No answer (connection refused, timed out, TLS failed).
    #[error("cannot reach the config API at {shown}")]
    Unreachable {
        /// The API's URL as shown.
        shown: String,
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
    /// The answer broke off.
    #[error("reading the config API's answer")]
    Reading(#[source] reqwest::Error),
    /// The token was refused.
    #[error(transparent)]
    Refused(#[from] TokenRefused),
    /// Another error status.
    #[error("the config API answered {status}: {message}")]
    Answered {
        /// The status.
        status: reqwest::StatusCode,
        /// Its body, as [`super::Follower`] shows an answer (no token, one
        /// line, bounded).
        message: String,
    },
    /// A success whose body is not a delta.
    #[error("the config API's answer is not a delta")]
    NotDelta(#[source] serde_json::Error),
}

/// `e` and its sources, `: `-separated (anyhow's `{:#}`), for a log line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}
