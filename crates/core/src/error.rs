//! Errors for parameters that no algorithm can run with.
//!
//! These are configuration errors: the config crate attaches file, line and
//! column. A request never produces one; being limited is a [`crate::Decision`].

use thiserror::Error;

/// A parameter an algorithm cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ParamError {
    /// A count or duration that must be positive was zero.
    #[error("`{param}` must be greater than zero")]
    MustBePositive {
        /// The parameter's name as written in the config.
        param: &'static str,
    },
    /// A value beyond what the algorithm can represent exactly.
    #[error("`{param}` is too large: {reason}")]
    TooLarge {
        /// The parameter's name as written in the config.
        param: &'static str,
        /// Why, with the bound.
        reason: String,
    },
    /// Any other impossible value.
    #[error("`{param}` is invalid: {reason}")]
    Invalid {
        /// The parameter's name as written in the config.
        param: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}
