//! tollgate's configuration API (Charon §4.1): resource configurations in
//! a relational database (SQLite by default, PostgreSQL for a fleet),
//! normalized on write exactly as the file loader does, every change a
//! revision with an audit row, and deltas for limiting servers.
//!
//! - [`protocol`]: the wire types servers and the web page read (deltas,
//!   snapshots, the audit trail), written and read by the same structs.
//! - [`store`]: the database (sqlx, one set of portable queries).
//! - [`normalize`]: validation and normalization through
//!   `tollgate_config`.
//! - [`auth`]: bearer tokens with `read` and `admin` roles.
//! - [`precondition`]: revisions as `ETag`s, `If-Match` on writes.
//! - [`http`]: the HTTP API.
//! - [`usage`]: live usage from the limiting servers' metrics, for the
//!   console.
//! - `client` (feature `client`): the follower a limiting server runs
//!   for `serve --config-api`, reading deltas as [`protocol`] types; it
//!   hands each revision to its caller to put in force, so this crate
//!   does not depend on the server.
//!
//! Time comes from the [`tollgate_core::Clock`] given to [`Db::connect`]
//! (the audit trail's times, the API's own rate limit): tests pass a
//! [`tollgate_core::ManualClock`].

#![deny(missing_docs)]

pub mod auth;
#[cfg(feature = "client")]
pub mod client;
pub mod error;
pub mod http;
pub mod normalize;
pub mod precondition;
pub mod protocol;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod ui;
pub mod usage;

pub use auth::{Caller, Role, Tokens};
pub use error::ApiError;
pub use store::{Db, Delta};
