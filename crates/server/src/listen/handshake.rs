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
//!
//! A connection whose handshake failed is closed gently ([`linger`]), so
//! that the client reads the alert rustls sent rather than a reset.

//!
//! The words are fixed where they can be; where they quote rustls (a
//! refusal this module has no words of its own for), the quote is cut to
//! a few hundred bytes ([`tollgate_tls::bounded`]): rustls's errors quote
//! the client's certificate, and a certificate can name thousands of key
//! usages.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rustls::{AlertDescription, CertificateError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_tls::{bounded, is_ca_as_leaf, is_x509_v1, HOW_TO_MAKE_CERTIFICATES};

use super::Throttle;
use crate::metrics as m;

/// Why a handshake failed: the `reason` label of the metric. Declared in
/// the order of [`Reason::ALL`], so `reason as usize` is its index there.
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
    /// The client's certificate was refused for another reason (a CA
    /// certificate as a leaf, a key usage without `clientAuth`, ...).
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
        let peer = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
        if reason == Reason::Closed {
            self.count(reason, Instant::now());
            tracing::debug!(listener, %peer, reason = reason.label(), why, "TLS handshake failed");
            return;
        }
        if let Some(failures) = self.count(reason, Instant::now()) {
            tracing::warn!(
                listener,
                %peer,
                reason = reason.label(),
                why,
                failures,
                "TLS handshake failed (logged at most every 10 s per reason)"
            );
        }
    }

    /// Counts a failure for `reason` at `now`: the number of failures
    /// since the reason's last line when one is due now, else `None`.
    /// `closed` is never due (logged at `debug` only).
    fn count(&self, reason: Reason, now: Instant) -> Option<u64> {
        ::metrics::counter!(m::TLS_HANDSHAKE_FAILURES, "listener" => self.listener, "reason" => reason.label())
            .increment(1);
        if reason == Reason::Closed {
            return None;
        }
        self.throttles[reason as usize].note(now)
    }
}

/// How long a connection whose handshake failed is kept open to be read
/// out ([`linger`]).
const LINGER: Duration = Duration::from_secs(1);

/// How many bytes are read out of such a connection at most.
const LINGER_BYTES: usize = 64 * 1024;

/// Closes a connection whose handshake failed so that the client reads
/// the alert rustls wrote: the write side is shut (the alert, then the
/// end), and what the client still sends is read and dropped until it
/// closes, for at most [`LINGER`] and [`LINGER_BYTES`]. Closing at once
/// while the client's bytes wait unread (its HTTP/2 preface, sent right
/// after its side of a TLS 1.3 handshake, or the plain text it spoke)
/// makes the kernel answer with a reset, and a reset makes the client's
/// kernel drop whatever it had not read yet, the alert included: the
/// client then knows only that the connection was reset. The connection
/// keeps its place under the port's cap meanwhile, so a flood of failing
/// handshakes holds no more than the cap.
pub(crate) async fn linger(mut tcp: TcpStream) {
    let _ = tcp.shutdown().await;
    let _ = tokio::time::timeout(LINGER, async {
        let mut buf = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
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
            _ => (Reason::Protocol, bounded(e)),
        };
    };
    match tls {
        E::NoCertificatesPresented => (
            Reason::NoClientCert,
            "the client presented no certificate, and this port requires one signed by \
             --tls-client-ca (mutual TLS)"
                .to_owned(),
        ),
        E::InvalidCertificate(CertificateError::UnknownIssuer) => (
            Reason::ClientCertUntrusted,
            "the client's certificate is not signed by --tls-client-ca".to_owned(),
        ),
        // A CA of the same name as --tls-client-ca, but another key:
        // most often the CA made again.
        E::InvalidCertificate(CertificateError::BadSignature) => (
            Reason::ClientCertUntrusted,
            "the client's certificate is not signed by --tls-client-ca: its issuer has the \
             CA's name, but the signature does not verify with the CA's key (a CA made again \
             under the same name?)"
                .to_owned(),
        ),
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
            format!("the client's certificate is refused: {}", bounded(c)),
        ),
        // rustls's words list every usage the certificate names.
        E::InvalidCertificate(
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
        ) => (
            Reason::ClientCertRefused,
            format!(
                "the client's certificate names its usages (extendedKeyUsage) without \
                 clientAuth: re-issue it with extendedKeyUsage = clientAuth \
                 ({HOW_TO_MAKE_CERTIFICATES})"
            ),
        ),
        E::InvalidCertificate(c) => (
            Reason::ClientCertRefused,
            format!("the client's certificate is refused: {}", bounded(c)),
        ),
        E::AlertReceived(
            a @ (A::UnknownCA
            | A::BadCertificate
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateExpired
            | A::AccessDenied),
        ) => (
            Reason::ClientAlert,
            format!(
                "the client refused this server's certificate (TLS alert {a:?}): give the \
                 client the CA that signed --tls-cert, and have it connect by a name the \
                 certificate carries"
            ),
        ),
        // What rustls (and OpenSSL) send when a signature does not verify:
        // one in this server's certificate chain (most often: the client
        // trusts another CA of the same name, one made again), or the
        // handshake's own. Not a verdict on trust, so said as it is.
        E::AlertReceived(A::DecryptError) => (
            Reason::ClientAlert,
            "the client could not verify a signature (TLS alert DecryptError): most often \
             one in this server's certificate chain, the client trusting another CA of the same \
             name as the one that signed --tls-cert (a CA made again); else one of the handshake"
                .to_owned(),
        ),
        E::AlertReceived(a) => (
            Reason::ClientAlert,
            format!("the client ended the handshake with the TLS alert {a:?}"),
        ),
        E::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => (
            Reason::NotTls,
            "the client did not speak TLS (plain text sent to a TLS port?)".to_owned(),
        ),
        e => (Reason::Protocol, bounded(e)),
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
            // Signed by another CA of the same name (docs/server.md's
            // table lists it under client_cert_untrusted).
            (
                io(rustls::Error::InvalidCertificate(
                    CertificateError::BadSignature,
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
            (
                io(rustls::Error::InvalidCertificate(
                    CertificateError::InvalidPurpose,
                )),
                "client_cert_refused",
            ),
            (io::Error::from(io::ErrorKind::UnexpectedEof), "closed"),
        ];
        for (e, label) in cases {
            assert_eq!(classify(&e).0.label(), label, "{e}");
        }
    }

    #[test]
    fn reasons_are_declared_in_the_order_of_all() {
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(reason as usize, i, "{reason:?}");
        }
    }

    /// Regression: `why` quoted rustls's error, which lists every key
    /// usage the client's certificate names: a certificate with thousands
    /// made a log line of tens of KiB, at a stranger's rate.
    #[test]
    fn what_the_peer_controls_is_bounded_in_the_log() {
        let usages = rustls::Error::InvalidCertificate(CertificateError::InvalidPurposeContext {
            required: rustls::ExtendedKeyPurpose::ClientAuth,
            presented: (0..5_000)
                .map(|i| rustls::ExtendedKeyPurpose::Other(vec![1, 3, 6, 1, 4, 1, i]))
                .collect(),
        });
        assert!(usages.to_string().len() > 50_000, "the case is long");
        let (reason, why) = classify(&io(usages));
        assert_eq!(reason, Reason::ClientCertRefused);
        assert!(why.contains("clientAuth") && why.len() < 400, "{why}");
        let names = rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
            std::sync::Arc::new(io::Error::other("x".repeat(70_000))),
        )));
        let (_, why) = classify(&io(names));
        assert!(why.len() < 400, "{}", why.len());
        let (reason, why) = classify(&io::Error::other("y".repeat(70_000)));
        assert_eq!(reason, Reason::Protocol);
        assert!(why.len() < 400, "{}", why.len());
    }

    /// Regression: a client's DecryptError alert was logged as "the client
    /// refused this server's certificate", which it does not say: a
    /// signature did not verify.
    #[test]
    fn a_decrypt_error_alert_is_said_as_a_signature_that_did_not_verify() {
        let (reason, why) = classify(&io(rustls::Error::AlertReceived(
            AlertDescription::DecryptError,
        )));
        assert_eq!(reason, Reason::ClientAlert);
        assert!(why.contains("could not verify a signature"), "{why}");
        assert!(!why.contains("refused this server's certificate"), "{why}");
    }

    /// A flood of failed handshakes: each reason's first failure is
    /// logged, then nothing for ten seconds, then one line with the count
    /// since; one reason's flood does not hide another; `closed` is never
    /// logged at `warn`.
    #[test]
    fn a_flood_gives_one_line_per_reason_per_ten_seconds_with_the_count() {
        let handshakes = Handshakes::new("test");
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut lines = Vec::new();
        for i in 0..1_000 {
            // 1000 failures over 9.99 s.
            if let Some(n) = handshakes.count(Reason::NotTls, at(i * 10)) {
                lines.push((i, n));
            }
        }
        assert_eq!(lines, vec![(0, 1)]);
        assert_eq!(handshakes.count(Reason::NoClientCert, at(500)), Some(1));
        assert_eq!(handshakes.count(Reason::Closed, at(0)), None);
        assert_eq!(handshakes.count(Reason::Closed, at(60_000)), None);
        // Ten seconds after the first line: the 999 since, and this one.
        assert_eq!(handshakes.count(Reason::NotTls, at(10_000)), Some(1_000));
        assert_eq!(handshakes.count(Reason::NotTls, at(10_001)), None);
    }
}
