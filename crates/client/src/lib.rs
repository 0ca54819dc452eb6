//! tollgate's client: rate requests and holds of copy-limited resources,
//! with the behaviour Charon's reference client gave its users (§3.2,
//! §3.3, §4.3).
//!
//! - **Sessions.** Holds, transfers and seizes go over one gRPC session
//!   stream per server, opened lazily and reopened with backoff when a
//!   server goes away; several servers are tried in order. Rate requests
//!   hold nothing: they are unary calls and need no session, so a server
//!   whose session table is full still decides them.
//! - **Backoff.** A rejected call is retried until `max_wait` is spent,
//!   sleeping `min(max_wait − elapsed, jitter(2^i · base))`, or the
//!   server's `retry_after` when that is sooner ([`backoff`]).
//! - **Implicit release.** A [`Hold`] releases what it still holds when
//!   dropped, panics included; a crashed client's session ends and the
//!   server releases for it.
//! - **Fail-open.** When no server answers, or one fails with a server
//!   error, a call grants its minimum and says so ([`Via::Degraded`], with
//!   an [`Outage`] naming each server tried and its error), with a metric
//!   and a rate-limited log line; service resumes by itself. A
//!   server that answers but has no room (too many sessions, store at
//!   capacity) has answered: the other servers are tried, and the call
//!   ends in [`Error::AtCapacity`], never in a degraded grant.
//! - **Kill switch.** [`ClientConfig::kill_switch`] (or
//!   `TOLLGATE_KILL_SWITCH=1`) turns rejections into grants
//!   ([`Via::KillSwitch`]), for running new limits in shadow.
//! - **Multi-resource acquisition** ([`Client::acquire`]): copy-limited
//!   resources first, at most one rate-limited last, nothing held on
//!   failure.
//! - **Blocking** programs use [`blocking::Client`].
//!
//! ```no_run
//! # async fn example() -> Result<(), tollgate_client::Error> {
//! use std::time::Duration;
//! use tollgate_client::{Client, ClientConfig};
//!
//! let client = Client::new(ClientConfig::new(["127.0.0.1:8081"]))?;
//! let grant = client
//!     .request("default", "api", "acme")
//!     .hits(1)
//!     .max_wait(Duration::from_secs(5))
//!     .send()
//!     .await?;
//! let mut hold = client.hold("default", "sandbox", "acme").copies(10).send().await?;
//! hold.release(5).await?;
//! // The other five are released when `hold` goes out of scope.
//! # let _ = grant;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod acquire;
pub mod backoff;
pub mod blocking;
mod client;
mod config;
mod error;
mod hold;
pub mod metrics;
mod outage;
mod session;
mod tls;

pub use acquire::{AcquireBuilder, Acquired};
pub use client::{Client, Grant, HoldBuilder, RequestBuilder, Via};
pub use config::{kill_switch_from_env, ClientConfig, Tls, KILL_SWITCH_ENV};
pub use error::{Error, Rejected, Rejection};
pub use hold::Hold;
pub use outage::{FailureKind, Outage, Unanswered, MAX_ERROR_BYTES, SHOWN_SERVERS};
pub use tollgate_proto::v1;
