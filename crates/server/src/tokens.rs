//! Bearer tokens with two roles: [`tollgate_auth`], under the name the
//! server's modules use. The format is shared with the config API, which
//! reads it without depending on the server.

pub use tollgate_auth::{bearer, Caller, Role, Tokens, TokensError};
