//! tollgate's configuration API (Charon §4.1): resource configurations in
//! a relational database (SQLite by default, PostgreSQL for a fleet),
//! normalized on write exactly as the file loader does, every change a
//! revision with an audit row, and deltas for limiting servers.
//!
//! - [`store`]: the database (sqlx, one set of portable queries).
//! - [`normalize`]: validation and normalization through
//!   `tollgate_config`.
//! - [`auth`]: bearer tokens with `read` and `admin` roles.
//! - [`precondition`]: revisions as `ETag`s, `If-Match` on writes.
//! - [`http`]: the HTTP API.
//! - [`usage`]: live usage from the limiting servers' metrics, for the
//!   console.

#![deny(missing_docs)]

pub mod auth;
pub mod error;
pub mod http;
pub mod normalize;
pub mod precondition;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod ui;
pub mod usage;

pub use auth::{Caller, Role, Tokens};
pub use error::ApiError;
pub use store::{Db, Delta};
