//! Bearer tokens with two roles, `ROLE:NAME:TOKEN` per line. The parsing
//! and checking live in [`tollgate_server::tokens`], because the limiting
//! server reads the same file format for its admin endpoints
//! (`serve --admin-tokens-file`); this module is that one, under the name
//! the config API has always used.

pub use tollgate_server::tokens::{Caller, Role, Tokens};
