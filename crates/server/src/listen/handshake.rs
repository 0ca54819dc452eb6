//! Why a TLS handshake failed, in words, in the log and in a metric.
//!
//! A client that is refused (no certificate, one the client CA did not
//! sign, an X.509 v1 one) learns little: with TLS 1.3 it finishes its own
//! handshake before the server has checked its certificate, and reads the
//! server's alert only afterwards, as a dropped connection. The operator
//! therefore needs the server to say why, naming the peer.
//!
//! Anyone who can reach the port can fail handshakes, so the log is
//! bounded: each reason is logged at most once every ten seconds per
//! port, with the number of failures since its last line, and every
//! failure is counted in `tollgate_tls_handshake_failures_total` by
//! `listener` and `reason` (a fixed set of labels, so a stranger cannot
//! grow the metric either). A connection closed during its handshake
//! without a word (a TCP health check, a port scan) is counted and
//! logged at `debug` only: load balancers do it every few seconds.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rustls::{AlertDescription, CertificateError};

use super::Throttle;
use crate::metrics as m;
use crate::tls::{is_ca_as_leaf, is_x509_v1, HOW_TO_MAKE_CERTIFICATES};

/// Why a handshake failed: the `reason` label of the metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    /// Mutual TLS, and the client sent no certificate.
    NoClientCert,
    /// The client's certificate is not signed by the client CA.
    ClientCertUntrusted,
    /// The client's certificate is X.509 v1.
    ClientCertV1,
    /// The client's certificate expired or is not valid yet.
    ClientCertExpired,
    /// The client's certificate was refused for another reason (its key
    /// usage, its signature, ...).
    ClientCertRefused,
    /// The client ended the handshake with an alert (most often: it does
    /// not trust this server's certificate).
    ClientAlert,
    /// The client did not speak TLS.
    NotTls,
    /// Any other breach or mismatch of the protocol (no common version,
    /// cipher suite or application protocol).
    Protocol,
    /// The client closed the connection without a word.
    Closed,
}

impl Reason {
    const ALL: [Reason; 9] = [
        Reason::NoClientCert,
        Reason::ClientCertUntrusted,
        Reason::ClientCertV1,
        Reason::ClientCertExpired,
        Reason::ClientCertRefused,
        Reason::ClientAlert,
        Reason::NotTls,
        Reason::Protocol,
        Reason::Closed,
    ];

    fn label(self) -> &'static str {
        match self {
            Reason::NoClientCert => "no_client_cert",
            Reason::ClientCertUntrusted => "client_cert_untrusted",
            Reason::ClientCertV1 => "client_cert_v1",
            Reason::ClientCertExpired => "client_cert_expired",
            Reason::ClientCertRefused => "client_cert_refused",
            Reason::ClientAlert => "client_alert",
            Reason::NotTls => "not_tls",
            Reason::Protocol => "protocol",
            Reason::Closed => "closed",
        }
    }
}

/// The failed handshakes of one port.
pub(crate) struct Handshakes {
    /// The `listener` label: `http`, `grpc`, `config_api`.
    listener: &'static str,
    /// One per [`Reason`], in the order of [`Reason::ALL`].
    throttles: [Throttle; Reason::ALL.len()],
}

impl Handshakes {
    /// The log and counters of `listener`'s handshakes; every reason's
    /// series is present (at 0) from now on, so an alert on its rate sees
    /// the first failure.
    pub(crate) fn new(listener: &'static str) -> Handshakes {
        for reason in Reason::ALL {
            ::metrics::counter!(m::TLS_HANDSHAKE_FAILURES, "listener" => listener, "reason" => reason.label())
                .absolute(0);
        }
        Handshakes {
            listener,
            throttles: std::array::from_fn(|_| Throttle::new(Duration::from_secs(10))),
        }
    }

    /// Counts and (throttled) logs the handshake with `peer` that failed
    /// with `e` (tokio-rustls's error, the rustls error inside).
    pub(crate) fn failed(&self, peer: Option<SocketAddr>, e: &io::Error) {
        let (reason, why) = classify(e);
        let listener = self.listener;
        ::metrics::counter!(m::TLS_HANDSHAKE_FAILURES, "listener" => listener, "reason" => reason.label())
            .increment(1);
        let peer = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
        if reason == Reason::Closed {
            tracing::debug!(listener, %peer, reason = reason.label(), why, "TLS handshake failed");
            return;
        }
        let index = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.throttles[index].note(|failures| {
            tracing::warn!(
                listener,
                %peer,
                reason = reason.label(),
                why,
                failures,
                "TLS handshake failed (logged at most every 10 s per reason)"
            );
        });
    }
}

/// Why a handshake failed, for the metric and in words for the log.
fn classify(e: &io::Error) -> (Reason, String) {
    use rustls::Error as E;
    use AlertDescription as A;
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => (
                Reason::Closed,
                "the client closed the connection during the handshake".to_owned(),
            ),
            _ => (Reason::Protocol, e.to_string()),
        };
    };
    match tls {
        E::NoCertificatesPresented => (
            Reason::NoClientCert,
            "the client presented no certificate, and this port requires one signed by \
             --tls-client-ca (mutual TLS)"
                .to_owned(),
        ),
        // A bad signature is most often another CA of the same name (one
        // made again) having signed it.
        E::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature) => {
            (
                Reason::ClientCertUntrusted,
                "the client's certificate is not signed by --tls-client-ca".to_owned(),
            )
        }
        E::InvalidCertificate(c) if is_x509_v1(c) => (
            Reason::ClientCertV1,
            format!(
                "the client's certificate (or one in its chain) is X.509 v1, which is refused: \
                 only v3 certificates are accepted ({HOW_TO_MAKE_CERTIFICATES})"
            ),
        ),
        E::InvalidCertificate(c) if is_ca_as_leaf(c) => (
            Reason::ClientCertRefused,
            format!(
                "the client's certificate is a CA certificate (basicConstraints CA:TRUE), not a \
                 client's own: sign a client certificate with the CA ({HOW_TO_MAKE_CERTIFICATES})"
            ),
        ),
        E::InvalidCertificate(
            c @ (CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. }),
        ) => (
            Reason::ClientCertExpired,
            format!("the client's certificate is refused: {c}"),
        ),
        E::InvalidCertificate(c) => (
            Reason::ClientCertRefused,
            format!("the client's certificate is refused: {c}"),
        ),
        E::AlertReceived(
            a @ (A::UnknownCA
            | A::BadCertificate
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateExpired
            | A::DecryptError
            | A::AccessDenied),
        ) => (
            Reason::ClientAlert,
            format!(
                "the client refused this server's certificate (TLS alert {a:?}): give the \
                 client the CA that signed --tls-cert, and have it connect by a name the \
                 certificate carries"
            ),
        ),
        E::AlertReceived(a) => (
            Reason::ClientAlert,
            format!("the client ended the handshake with the TLS alert {a:?}"),
        ),
        E::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => (
            Reason::NotTls,
            "the client did not speak TLS (plain text sent to a TLS port?)".to_owned(),
        ),
        e => (Reason::Protocol, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(e: rustls::Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn each_failure_gets_its_reason() {
        let cases = [
            (io(rustls::Error::NoCertificatesPresented), "no_client_cert"),
            (
                io(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )),
                "client_cert_untrusted",
            ),
            (
                io(rustls::Error::AlertReceived(AlertDescription::UnknownCA)),
                "client_alert",
            ),
            (
                io(rustls::Error::InvalidMessage(
                    rustls::InvalidMessage::InvalidContentType,
                )),
                "not_tls",
            ),
            (
                io(rustls::Error::InvalidCertificate(CertificateError::Other(
                    rustls::OtherError(std::sync::Arc::new(webpki::Error::UnsupportedCertVersion)),
                ))),
                "client_cert_v1",
            ),
            (io::Error::from(io::ErrorKind::UnexpectedEof), "closed"),
        ];
        for (e, label) in cases {
            assert_eq!(classify(&e).0.label(), label, "{e}");
        }
    }
}
