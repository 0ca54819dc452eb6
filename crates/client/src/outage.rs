//! Why a call found no server: every server tried, each with its error.
//!
//! A degraded grant ([`Via::Degraded`](crate::Via::Degraded)) carries one,
//! so a caller (and `tollgate request`) can say which servers failed and
//! how, instead of only that limiting was off for this call; with
//! fail-open off, [`Error::Unavailable`](crate::Error::Unavailable) says
//! the same in words.

use std::fmt;

use crate::session::Failure;

/// The servers a call tried without an answer, in the order tried.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outage {
    /// Each server tried and what went wrong with it.
    pub tried: Vec<Unanswered>,
}

/// One server that did not answer a call, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unanswered {
    /// The server as the client was given it (`127.0.0.1:8081`,
    /// `https://tollgate.internal:8081`).
    pub server: String,
    /// What went wrong, without the server's name: `cannot connect: ...
    /// Connection refused`, `did not answer within 2s`, a server error
    /// such as `Unavailable (store_unavailable): ...`.
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
            server: server.to_owned(),
            error: failure.to_string(),
            kind,
        });
    }

    /// Whether TLS failed with any server tried: a misconfiguration
    /// rather than (only) an outage.
    pub fn tls_failed(&self) -> bool {
        self.tried.iter().any(|u| u.kind == FailureKind::Tls)
    }
}

/// `server: error` for each server tried, joined by `; `.
impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tried.is_empty() {
            return f.write_str("no server was tried");
        }
        for (i, u) in self.tried.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", u.server, u.error)?;
        }
        Ok(())
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
}
