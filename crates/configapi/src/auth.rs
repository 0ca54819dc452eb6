//! Bearer tokens with two roles, `ROLE:NAME:TOKEN` per line. The parsing
//! and checking live in [`tollgate_auth`], because the limiting server
//! reads the same file format for its admin endpoints
//! (`serve --admin-tokens-file`); this module is that one, under the name
//! the config API has always used.

pub use tollgate_auth::{bearer, Caller, Role, Tokens, TokensError};
