//! How often the follower logs its failures, so an outage or a refused
//! token makes a few log lines, not one per retry.

use super::error::{chain, FetchError};

/// Why a fetch failed, for the log while following.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trouble {
    /// No answer (connection refused, timed out, TLS failed).
    Unreachable,
    /// 401 or 403: the token; or a 429 right after one (the API's rate
    /// limit puts every unknown token in one bucket, so a refused token
    /// meets it too, and it says nothing new of the token).
    Refused,
    /// Another error status, or an answer that is not a delta.
    BadAnswer,
}

/// A kind of trouble is logged the first time it happens after a
/// success, then every this many times.
const LOG_EVERY: u32 = 20;

/// What the follower says of its failures. Each kind of trouble is
/// counted on its own since the last success, so two kinds that alternate
/// (a refused token and the rate limit, an API restarting) are each
/// logged the first time and every [`LOG_EVERY`] times. It only counts:
/// the caller logs.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    /// Failures of each kind since the last success, by `Trouble as usize`.
    counts: [u32; 3],
    /// The last trouble since the last success.
    last: Option<Trouble>,
    /// The last refusal's message: what a 429 that counts as a refusal
    /// logs.
    refusal: Option<String>,
    /// The last error reading the token again, logged when it changes.
    pub(crate) read_error: Option<String>,
}

impl Throttle {
    /// The kind of trouble `e` is.
    pub(crate) fn classify(&self, e: &FetchError) -> Trouble {
        match e {
            FetchError::Refused(_) => Trouble::Refused,
            FetchError::Answered { status, .. }
                if *status == reqwest::StatusCode::TOO_MANY_REQUESTS
                    && self.last == Some(Trouble::Refused) =>
            {
                Trouble::Refused
            }
            FetchError::Unreachable { .. } | FetchError::Reading(_) => Trouble::Unreachable,
            FetchError::Answered { .. } | FetchError::NotDelta(_) => Trouble::BadAnswer,
        }
    }

    /// Counts a failure `e` of kind `trouble`: the text to log (for a
    /// refusal, the refusal's, also after a 429), if this one is logged.
    pub(crate) fn failed(&mut self, trouble: Trouble, e: &FetchError) -> Option<String> {
        let error = chain(e);
        if matches!(e, FetchError::Refused(_)) {
            self.refusal = Some(error.clone());
        }
        self.last = Some(trouble);
        let n = &mut self.counts[trouble as usize];
        *n = n.saturating_add(1);
        if *n != 1 && *n % LOG_EVERY != 0 {
            return None;
        }
        match (trouble, &self.refusal) {
            (Trouble::Refused, Some(refusal)) => Some(refusal.clone()),
            _ => Some(error),
        }
    }

    /// Reading the token again failed with `error`: whether to log it (a
    /// new error, or `loud`: the refusal is logged now too).
    pub(crate) fn read_failed(&mut self, error: String, loud: bool) -> bool {
        let new = self.read_error.as_ref() != Some(&error);
        self.read_error = Some(error);
        new || loud
    }

    /// A fetch succeeded: whether the token had been refused since the
    /// last success. Every count starts again.
    pub(crate) fn recovered(&mut self) -> bool {
        let refused = self.counts[Trouble::Refused as usize] > 0;
        *self = Throttle::default();
        refused
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::error::TokenRefused;
    use super::super::token::TokenSource;
    use super::*;

    fn refused() -> FetchError {
        TokenRefused {
            shown: "http://127.0.0.1:1".into(),
            source: TokenSource::file("token"),
            status: reqwest::StatusCode::UNAUTHORIZED,
            message: "the bearer token is not known".into(),
            whole_line: false,
        }
        .into()
    }

    fn answered(status: u16) -> FetchError {
        FetchError::Answered {
            status: reqwest::StatusCode::from_u16(status).unwrap(),
            message: "too many requests; retry in 20 ms".into(),
        }
    }

    /// Review of issue 23: the API's rate limit puts unknown tokens in
    /// one bucket, so a refused token's retries alternate 401 and 429,
    /// and a change of kind logged every one of them. A 429 after a
    /// refusal counts as one; it logs the refusal; each kind is counted on
    /// its own.
    #[test]
    fn alternating_refusals_and_rate_limits_are_logged_as_one_refusal_now_and_then() {
        let mut throttle = Throttle::default();
        let mut logged = Vec::new();
        for i in 0..80 {
            let e = if i % 2 == 0 { refused() } else { answered(429) };
            let trouble = throttle.classify(&e);
            assert_eq!(trouble, Trouble::Refused, "try {i}");
            if let Some(text) = throttle.failed(trouble, &e) {
                assert!(text.contains("refused the token"), "{text}");
                logged.push(i);
            }
        }
        // The 1st, 20th, 40th, 60th and 80th.
        assert_eq!(logged, [0, 19, 39, 59, 79]);

        // A 429 without a refusal before it is the API answering with an
        // error; two kinds alternating are each logged once in 20.
        let mut throttle = Throttle::default();
        assert_eq!(throttle.classify(&answered(429)), Trouble::BadAnswer);
        let mut logged = Vec::new();
        for i in 0..40 {
            let e = if i % 2 == 0 { answered(500) } else { refused() };
            let trouble = throttle.classify(&e);
            if throttle.failed(trouble, &e).is_some() {
                logged.push((i, trouble));
            }
        }
        assert_eq!(
            logged,
            [
                (0, Trouble::BadAnswer),
                (1, Trouble::Refused),
                (38, Trouble::BadAnswer),
                (39, Trouble::Refused)
            ]
        );
        // After a success, the first of each kind is logged again, and
        // the recovery says the token was accepted.
        assert!(throttle.recovered());
        let e = answered(500);
        assert!(throttle.failed(throttle.classify(&e), &e).is_some());
        assert!(!throttle.recovered());
    }
}
