//! Why a call found no server: every server tried, each with its error.
//!
//! A degraded grant ([`Via::Degraded`](crate::Via::Degraded)) carries one,
//! so a caller (and `tollgate request`) can say which servers failed and
//! how, instead of only that limiting was off for this call; with
//! fail-open off, [`Error::Unavailable`](crate::Error::Unavailable) says
//! the same in words.
//!
//! An error's text may come from far away (a status message of a remote
//! server or of a proxy on the way, kilobytes long, any bytes), and it is
//! printed to terminals and logged: each is kept to
//! [`MAX_ERROR_BYTES`], control characters
//! escaped, and the text of an outage names the first few servers only.

use std::fmt;

use crate::session::Failure;

/// How many servers an outage's text names before `… and N more`.
pub const SHOWN_SERVERS: usize = 3;

/// The longest error (and server name) an [`Unanswered`] keeps, in bytes,
/// before the `…` that marks the cut.
pub const MAX_ERROR_BYTES: usize = tollgate_tls::BOUNDED_BYTES;

/// `text` on one line and bounded: control characters (newlines, ANSI
/// escapes) escaped as `\n`, `\u{1b}`, then cut to [`MAX_ERROR_BYTES`]
/// on a character boundary.
pub(crate) fn clean(text: impl fmt::Display) -> String {
    struct Escaped<T>(T);
    impl<T: fmt::Display> fmt::Display for Escaped<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            use fmt::Write;
            // Escapes whatever the inner text writes, piece by piece, so
            // a long text is not built in full before the cut.
            struct W<'a, 'b>(&'a mut fmt::Formatter<'b>);
            impl fmt::Write for W<'_, '_> {
                fn write_str(&mut self, s: &str) -> fmt::Result {
                    for c in s.chars() {
                        if c.is_control() {
                            write!(self.0, "{}", c.escape_default())?;
                        } else {
                            self.0.write_char(c)?;
                        }
                    }
                    Ok(())
                }
            }
            write!(W(f), "{}", self.0)
        }
    }
    tollgate_tls::bounded(Escaped(text))
}

/// The servers a call tried without an answer, in the order tried.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outage {
    /// Each server tried and what went wrong with it.
    pub tried: Vec<Unanswered>,
}

/// One server that did not answer a call, and why. Non-exhaustive: only
/// the client makes one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unanswered {
    /// The server as the client was given it (`127.0.0.1:8081`,
    /// `https://tollgate.internal:8081`), at most [`MAX_ERROR_BYTES`].
    pub server: String,
    /// What went wrong, without the server's name: `cannot connect: ...
    /// Connection refused`, `did not answer within 2s`, a server error
    /// such as `Unavailable (store_unavailable): ...`. At most
    /// [`MAX_ERROR_BYTES`] (then `…`), control characters escaped.
    pub error: String,
    /// What kind of failure it was: a caller (and `tollgate request`)
    /// says what to check by it.
    pub kind: FailureKind,
}

/// What kind of failure kept a server from answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// No connection, a broken stream, or no answer in time: the server
    /// may not run there, or the network is down.
    Unreachable,
    /// TLS with the server failed in a way a setting fixes (a client
    /// certificate it requires or refused, its certificate not trusted
    /// or without the name connected to).
    Tls,
    /// The server answered with an error of its own
    /// (`store_unavailable`, `INTERNAL`): it runs, but could not decide.
    Server,
}

impl Outage {
    /// Records that `server` failed with `failure`.
    pub(crate) fn push(&mut self, server: &str, failure: Failure) {
        let kind = match failure {
            Failure::Unreachable(_) => FailureKind::Unreachable,
            Failure::Tls(_) => FailureKind::Tls,
            Failure::Status { .. } => FailureKind::Server,
        };
        self.tried.push(Unanswered {
            server: clean(server),
            error: clean(&failure),
            kind,
        });
    }

    /// An outage of one server.
    pub(crate) fn one(server: &str, failure: Failure) -> Outage {
        let mut outage = Outage::default();
        outage.push(server, failure);
        outage
    }

    /// Whether TLS failed with any server tried: a misconfiguration
    /// rather than (only) an outage.
    pub fn tls_failed(&self) -> bool {
        self.tried.iter().any(|u| u.kind == FailureKind::Tls)
    }
}

/// `server: error` for each server tried, joined by `; `; past the first
/// [`SHOWN_SERVERS`], `… and N more`.
impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tried.is_empty() {
            return f.write_str("no server was tried");
        }
        for (i, u) in self.tried.iter().take(SHOWN_SERVERS).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", u.server, u.error)?;
        }
        match self.tried.len().saturating_sub(SHOWN_SERVERS) {
            0 => Ok(()),
            more => write!(f, "; … and {more} more"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_every_server_with_its_error() {
        let mut outage = Outage::default();
        assert_eq!(outage.to_string(), "no server was tried");
        outage.push(
            "127.0.0.1:1",
            Failure::Unreachable("cannot connect: Connection refused".into()),
        );
        outage.push(
            "b:8081",
            Failure::Unreachable("did not answer within 2s".into()),
        );
        assert!(!outage.tls_failed());
        assert_eq!(
            outage.to_string(),
            "127.0.0.1:1: cannot connect: Connection refused; b:8081: did not answer within 2s"
        );
    }

    /// Review of issue 23: an error was kept whole (a remote server's or
    /// proxy's status message, kilobytes of any bytes) and printed raw,
    /// newlines and terminal escapes included, for any number of servers.
    #[test]
    fn errors_are_bounded_on_one_line_and_few_servers_are_named() {
        let mut outage = Outage::default();
        let long = format!("é{}", "x".repeat(10_000));
        outage.push(
            "a:1",
            Failure::Status {
                code: tonic::Code::Internal,
                reason: String::new(),
                message: long,
            },
        );
        let error = &outage.tried[0].error;
        assert!(error.len() <= MAX_ERROR_BYTES + '…'.len_utf8(), "{error}");
        assert!(error.ends_with('…'), "{error}");
        outage.push(
            "b:1",
            Failure::Unreachable("line one\nline two \u{1b}[31mred\r".into()),
        );
        assert_eq!(
            outage.tried[1].error,
            "line one\\nline two \\u{1b}[31mred\\r"
        );
        outage.push("c\n:1", Failure::Unreachable("x".into()));
        assert_eq!(outage.tried[2].server, "c\\n:1");
        for _ in 0..5 {
            outage.push("d:1", Failure::Unreachable("y".into()));
        }
        let text = outage.to_string();
        assert!(text.ends_with("; c\\n:1: x; … and 5 more"), "{text}");
        assert!(!text.contains("d:1"), "{text}");
        assert!(!text.chars().any(char::is_control), "{text}");
    }
}
