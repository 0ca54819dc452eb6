//! The service's clock: [`tollgate_core::clock`], re-exported under the
//! name the service's users have always imported it by. It lives in the
//! core so that crates which do not need the service (the config API)
//! read the same clock.

pub use tollgate_core::clock::*;
