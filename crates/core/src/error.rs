//! Errors for parameters that no algorithm can run with.
//!
//! These are configuration errors: the config crate attaches file, line and
//! column. A request never produces one; being limited is a [`crate::Decision`].

use std::num::NonZeroU64;

use thiserror::Error;

use crate::time::{Nanos, Span, SpanError};

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
    /// A duration that is not a [`Span`] for a reason other than being
    /// zero (which is [`ParamError::MustBePositive`], as for counts):
    /// longer than [`Span::MAX`].
    #[error("`{param}` {problem}")]
    Span {
        /// The parameter's name as written in the config.
        param: &'static str,
        /// What is wrong with it (its message says the bound).
        problem: SpanError,
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

impl ParamError {
    /// `duration` as the span parameter `param` must be.
    pub fn span(param: &'static str, duration: Nanos) -> Result<Span, ParamError> {
        Span::new(duration).map_err(|problem| match problem {
            SpanError::Zero => ParamError::MustBePositive { param },
            problem => ParamError::Span { param, problem },
        })
    }

    /// `n` hits, one `interval` apart, as a span: the count `param` is too
    /// large when they take longer than [`Span::MAX`]. `n` is positive.
    pub fn hits_span(
        param: &'static str,
        n: NonZeroU64,
        interval: Nanos,
    ) -> Result<Span, ParamError> {
        Span::times(interval, n.get()).map_err(|problem| ParamError::TooLarge {
            param,
            reason: format!("the time of {n} hits at one every {interval} {problem}"),
        })
    }

    /// `n` as the positive count `param` must be.
    pub fn positive(param: &'static str, n: u64) -> Result<NonZeroU64, ParamError> {
        NonZeroU64::new(n).ok_or(ParamError::MustBePositive { param })
    }
}

#[cfg(test)]
mod tests {
    use crate::{Align, FixedWindow, Nanos, Rate, TokenBucket};

    #[test]
    fn a_duration_beyond_a_span_names_the_parameter_and_the_bound() {
        let e = FixedWindow::new(1, Nanos::new((1 << 62) + 1), Align::Epoch).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`window` must be at most 146 years (2^62 ns)"
        );
        let e = FixedWindow::new(1, Nanos::ZERO, Align::Epoch).unwrap_err();
        assert_eq!(e.to_string(), "`window` must be greater than zero");
    }

    #[test]
    fn a_count_whose_hits_take_longer_than_a_span_says_how_long_they_take() {
        let day = Rate::new(1, Nanos::from_secs(86_400)).unwrap();
        let e = TokenBucket::new(1 << 47, day).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`capacity` is too large: the time of 140737488355328 hits at one every 1d \
             must be at most 146 years (2^62 ns)"
        );
        let e = TokenBucket::with_initial(1, day, u64::MAX).unwrap_err();
        assert!(
            e.to_string().starts_with("`initial_tokens` is too large"),
            "{e}"
        );
        assert!(TokenBucket::with_initial(1, day, 0).is_ok());
    }
}
