//! Saying in words what went wrong with TLS towards a server, and what to
//! do about it.
//!
//! tonic makes the connections, with its own rustls connector built from
//! the [`Tls`] settings. This module builds the same rustls settings a
//! second time, as tonic does (the same CA certificates, the same crypto
//! provider), for two reasons:
//!
//! - **Checking the settings up front.** tonic reports an unusable CA or
//!   client certificate as a bare `transport error`; building them here
//!   first names the problem (an X.509 v1 client certificate, a key that
//!   does not match, a CA file with no usable certificate in it).
//! - **Probing after a failure.** With TLS 1.3 a client finishes its
//!   handshake before the server has checked the client's certificate: a
//!   server that finds none, or refuses it, says so with an alert that the
//!   client reads only afterwards. By then hyper has handed the connection
//!   to its HTTP/2 task; when that task dies of the alert, the call waiting
//!   on it ends in `Cancelled: operation was canceled` ("connection
//!   closed"), and the alert is lost. So when a call fails that way,
//!   [`Probe::refused`] opens one connection of its own with the same
//!   settings, reads the server's first words, and names what the server
//!   said. A plain-text client is probed too: a TLS port answers its
//!   first bytes with an alert, which reaches the call as an HTTP/2
//!   protocol error or, as often, as the same `Cancelled` (whether the
//!   call had reached the connection when it died decides which).
//!
//! The probe is bounded so that a client in trouble does not make more of
//! it: one probe per server runs at a time, and what it found (or that it
//! found nothing) is reused by every failure for [`REUSE_FOR`]; it takes
//! at most the client's `connect_timeout`; and a caller waits for it only
//! as long as its own call may still take, so failing over to the next
//! server is never later than without it. A probe is a handshake the
//! server sees fail too: the server counts and logs it like the call's.
//!
//! Failures of the handshake itself (the server's certificate is not
//! trusted, or not valid for the name) reach the caller in the source
//! chain of tonic's connect error; [`Probe::explain`] finds the rustls
//! error there, without connecting again.
//!
//! Messages name the CLI's flags first (most people meet them there),
//! then the field of [`Tls`] a Rust caller sets. What they quote from the
//! server's certificate (the names it carries) is cut short
//! ([`tollgate_tls::bounded`]): the server chooses its length.

use std::error::Error as StdError;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, CertificateError, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tollgate_tls::{
    bounded, is_ca_as_leaf, is_x509_v1, Anchors, PemError, HOW_TO_MAKE_CERTIFICATES as HOW_TO_MAKE,
};

use crate::backoff::Timer;
use crate::config::Tls;

/// How long what a probe found is reused by later failures, before a
/// failure probes again.
pub(crate) const REUSE_FOR: Duration = Duration::from_secs(5);

/// What a probe found: what the server refused, in words, or `None`.
type Finding = Option<String>;

/// One server, as a probe reaches it: its address, and the TLS settings
/// the client connects with (`None`: plain text).
pub(crate) struct Probe {
    host: String,
    port: u16,
    tls: Option<Settings>,
    /// The longest a probe takes, connecting included.
    bound: Duration,
    /// Times what a probe found, for [`REUSE_FOR`].
    timer: Arc<dyn Timer>,
    // A std mutex: nothing awaits while it is held.
    state: Mutex<ProbeState>,
}

#[derive(Default)]
struct ProbeState {
    /// The probe running now: its finding arrives here (`Some` once done).
    running: Option<watch::Receiver<Option<Finding>>>,
    /// The last finding, and when (clock time) it was made.
    last: Option<(Duration, Finding)>,
}

/// The rustls settings of the client, and what they were made from.
struct Settings {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
    /// Whether a CA was given (otherwise the web's public roots are
    /// trusted).
    ca: bool,
    /// Whether the client presents a certificate.
    identity: bool,
}

impl Probe {
    /// The probe of the server at `uri`, with TLS when `https`; a probe
    /// takes at most `bound`, and `timer` times what it found. Errors say
    /// what is wrong with `tls`.
    pub(crate) fn new(
        uri: &tonic::codegen::http::Uri,
        tls: Option<&Tls>,
        https: bool,
        bound: Duration,
        timer: Arc<dyn Timer>,
    ) -> Result<Probe, String> {
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = match https {
            true => Some(settings(&host, tls)?),
            false => None,
        };
        Ok(Probe {
            host,
            port,
            tls,
            bound,
            timer,
            state: Mutex::new(ProbeState::default()),
        })
    }

    /// What a connect error (tonic's, with its sources) says about TLS,
    /// in words, or `None` when it is not about TLS.
    pub(crate) fn explain(&self, e: &(dyn StdError + 'static)) -> Option<String> {
        let settings = self.tls.as_ref()?;
        rustls_error(e).map(|r| describe(r, settings))
    }

    /// What the server refused, for a call that failed on its connection:
    /// what a probe found, waiting for it until `deadline` at most. Starts
    /// a probe unless one runs, or one found something (or nothing)
    /// within [`REUSE_FOR`]; none when `deadline` has passed. `None` when
    /// the probe found nothing (in time).
    pub(crate) async fn refused(self: &Arc<Self>, deadline: Instant) -> Option<String> {
        let mut finding = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((at, found)) = &state.last {
                if self.timer.now().saturating_sub(*at) < REUSE_FOR {
                    return found.clone();
                }
            }
            // A probe whose task is gone (its runtime shut down) never
            // answers: start another.
            let running = state.running.clone().filter(|r| r.has_changed().is_ok());
            match running {
                Some(running) => running,
                None if Instant::now() >= deadline => return None,
                None => {
                    let (tx, rx) = watch::channel(None);
                    state.running = Some(rx.clone());
                    let probe = Arc::clone(self);
                    tokio::spawn(async move {
                        let found = tokio::time::timeout(probe.bound, probe.run())
                            .await
                            .ok()
                            .flatten();
                        if let Some(why) = &found {
                            // Once per probe, not once per failed call.
                            tracing::error!(server = %probe.host, port = probe.port, error = %why, "TLS with the server failed");
                        }
                        {
                            let mut state =
                                probe.state.lock().unwrap_or_else(PoisonError::into_inner);
                            state.running = None;
                            state.last = Some((probe.timer.now(), found.clone()));
                        }
                        let _ = tx.send(Some(found));
                    });
                    rx
                }
            }
        };
        let found = tokio::time::timeout_at(deadline, finding.wait_for(Option::is_some)).await;
        match found {
            Ok(Ok(found)) => found.clone().flatten(),
            _ => None,
        }
    }

    /// Connects once more, as the client does, and reads the server's
    /// first words: what the server refused, in words, or `None` when it
    /// refused nothing (or could not be reached at all, which the
    /// caller's own error says better). The caller bounds how long it
    /// takes.
    async fn run(&self) -> Option<String> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .ok()?;
        match &self.tls {
            Some(settings) => probe_tls(tcp, settings).await,
            None => probe_plain(tcp).await,
        }
    }
}

/// After the handshake, a server that accepted the client sends its
/// HTTP/2 settings at once; one that refused its certificate sends an
/// alert instead. Nothing is written first: a server that closes while
/// unread data waits may reset the connection, which would lose the
/// alert. (A server that waits for the client's preface before its
/// settings, which tollgate's does not, holds the probe until the
/// caller's bound, and the caller's own error stands.)
async fn probe_tls(tcp: TcpStream, settings: &Settings) -> Option<String> {
    let connector = TlsConnector::from(Arc::clone(&settings.config));
    let mut tls = match connector.connect(settings.name.clone(), tcp).await {
        Ok(tls) => tls,
        Err(e) => return rustls_error(&e).map(|r| describe(r, settings)),
    };
    // tonic refuses a connection without HTTP/2 ("HTTP/2 was not
    // negotiated"), which names nothing.
    if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
        return Some(NO_H2.to_owned());
    }
    let mut first = [0u8; 64];
    match tls.read(&mut first).await {
        Ok(_) => None,
        Err(e) => rustls_error(&e).map(|r| describe(r, settings)),
    }
}

/// What a client sends first on HTTP/2, then an empty SETTINGS frame: a
/// plain-text probe's first words.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// A plain-text client talking to a TLS port: the server answers the
/// HTTP/2 preface with a TLS alert record (content type 21, version 3.x).
async fn probe_plain(mut tcp: TcpStream) -> Option<String> {
    tcp.write_all(PREFACE).await.ok()?;
    let mut first = [0u8; 8];
    let n = tcp.read(&mut first).await.ok()?;
    let tls_record = n >= 2 && matches!(first[0], 21 | 22) && first[1] == 3;
    tls_record.then(|| {
        "the server speaks TLS and this client connected in plain text: connect with \
         https://HOST:PORT and --tls-ca FILE, the CA that signed the server's certificate \
         (Tls::ca)"
            .to_owned()
    })
}

/// The server did not agree to HTTP/2 in the TLS handshake.
const NO_H2: &str = "the server does not offer HTTP/2 over TLS (ALPN h2), which gRPC needs: is \
     this the address of tollgate's gRPC port (serve --grpc)?";

/// The rustls settings tonic builds from `tls` for `host`: the CA (or the
/// web's public roots), the client certificate, the name to verify, and
/// ALPN `h2`.
fn settings(host: &str, tls: Option<&Tls>) -> Result<Settings, String> {
    let builder = rustls::ClientConfig::builder_with_provider(tollgate_tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    let ca = tls.and_then(|t| t.ca.as_deref());
    let roots = match ca {
        Some(pem) => ca_roots(pem)?,
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let builder = builder.with_root_certificates(roots);
    let identity = tls.and_then(|t| t.identity.as_ref());
    let mut config = match identity {
        Some((cert, key)) => {
            let (chain, key) = client_identity(cert, key)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| client_cert_refused(&e))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let domain = tls.and_then(|t| t.domain.as_deref()).unwrap_or(host);
    let name = ServerName::try_from(domain.to_owned()).map_err(|_| {
        format!("{domain:?} is not a server name to check a certificate against (--tls-domain, Tls::domain)")
    })?;
    Ok(Settings {
        config: Arc::new(config),
        name,
        ca: ca.is_some(),
        identity: identity.is_some(),
    })
}

/// The CA certificates of `pem` that can be trust anchors, skipping the
/// others as tonic does: at least one.
fn ca_roots(pem: &[u8]) -> Result<RootCertStore, String> {
    tollgate_tls::trust_anchors(pem, Anchors::Usable)
        .map_err(|e| format!("the CA to trust (--tls-ca, Tls::ca): {e}"))
}

/// The client's certificate chain and key, parsed.
#[allow(clippy::type_complexity)]
fn client_identity(
    cert: &[u8],
    key: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = tollgate_tls::certificates(cert)
        .map_err(|e| format!("the client certificate (--tls-cert, Tls::identity): {e}"))?;
    let key = tollgate_tls::private_key(key)
        .map_err(|e: PemError| format!("the client key (--tls-key, Tls::identity): {e}"))?;
    Ok((chain, key))
}

/// Why rustls would not take the client's certificate and key.
fn client_cert_refused(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(c) if is_x509_v1(c) => format!(
            "the client certificate (--tls-cert, Tls::identity) is X.509 v1, which rustls \
             cannot use (nor can tollgate's server): re-issue it as X.509 v3, with \
             extendedKeyUsage = clientAuth ({HOW_TO_MAKE})"
        ),
        rustls::Error::InconsistentKeys(_) => "the client key (--tls-key) is not the key of \
             the client certificate (--tls-cert)"
            .to_owned(),
        e => format!(
            "the client certificate (--tls-cert) and key (--tls-key): {}",
            bounded(e)
        ),
    }
}

/// The rustls error in `e`'s source chain. An `io::Error` hides the error
/// it wraps from `source()` (it returns that error's own source), so each
/// one is opened by hand.
fn rustls_error<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>());
        if inner.is_some() {
            return inner;
        }
        next = e.source();
    }
    None
}

/// What a rustls error on the client's side means, and what to do.
fn describe(e: &rustls::Error, s: &Settings) -> String {
    use rustls::Error as E;
    use AlertDescription as A;
    match e {
        // The server's verdict on the client's certificate (or on its
        // absence), read after the handshake with TLS 1.3.
        E::AlertReceived(A::CertificateRequired) => "the server requires a client certificate \
             (mutual TLS) and this client presented none: pass --tls-cert and --tls-key \
             (Tls::identity), a certificate signed by the server's --tls-client-ca"
            .to_owned(),
        E::AlertReceived(A::HandshakeFailure) if !s.identity => "the server refused the TLS \
             handshake (alert HandshakeFailure); if it requires a client certificate (mutual \
             TLS), pass --tls-cert and --tls-key (Tls::identity)"
            .to_owned(),
        E::AlertReceived(A::UnknownCA) if s.identity => "the server does not trust this \
             client's certificate: it is not signed by the CA the server checks client \
             certificates against (its --tls-client-ca)"
            .to_owned(),
        E::AlertReceived(A::CertificateExpired) if s.identity => "the server refused this \
             client's certificate as expired or not yet valid: renew it (or check the clocks)"
            .to_owned(),
        // What rustls (and OpenSSL) send when a signature does not verify:
        // most often the certificate's, signed by another CA of the same
        // name as the server's (the CA made again).
        E::AlertReceived(A::DecryptError) if s.identity => "the server does not trust this \
             client's certificate: a signature did not verify (TLS alert DecryptError), most \
             often because another CA of the same name as the server's --tls-client-ca (one \
             made again) signed it, else a signature algorithm the server does not support \
             or a signature of the handshake; the server's log says which"
            .to_owned(),
        E::AlertReceived(
            a @ (A::BadCertificate
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::AccessDenied),
        ) if s.identity => format!(
            "the server refused this client's certificate (TLS alert {a:?}); the server's log \
             says why. Certificates must be X.509 v3, signed by the server's --tls-client-ca, \
             with extendedKeyUsage = clientAuth if they name a usage ({HOW_TO_MAKE})"
        ),
        // Offered h2 (ALPN), and the server speaks none of it.
        E::AlertReceived(A::NoApplicationProtocol) | E::NoApplicationProtocol => NO_H2.to_owned(),
        E::AlertReceived(a) => format!("the server ended the TLS handshake with the alert {a:?}"),
        // This client's verdict on the server's certificate. A bad
        // signature is most often another CA of the same name (one made
        // again) having signed it.
        E::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature)
            if s.ca =>
        {
            "the server's certificate is not signed by the CA this client trusts (--tls-ca, \
             Tls::ca): pass the CA that signed it"
                .to_owned()
        }
        E::InvalidCertificate(CertificateError::UnknownIssuer) => "the server's certificate is \
             not signed by a public CA: pass the CA that signed it with --tls-ca FILE (Tls::ca)"
            .to_owned(),
        E::InvalidCertificate(
            c @ (CertificateError::NotValidForName
            | CertificateError::NotValidForNameContext { .. }),
        ) => format!(
            "the server's certificate does not carry the name this client checks ({}): \
             connect by a name it carries, or give the name to check with --tls-domain \
             (Tls::domain)",
            // The names it carries: as many as the server likes.
            bounded(c)
        ),
        E::InvalidCertificate(c) if is_x509_v1(c) => format!(
            "the server's certificate is X.509 v1, which TLS here refuses: the server needs a \
             v3 certificate ({HOW_TO_MAKE})"
        ),
        E::InvalidCertificate(c) if is_ca_as_leaf(c) => format!(
            "the server's certificate is a CA certificate (basicConstraints CA:TRUE), not a \
             server's own: the server needs a certificate signed by that CA ({HOW_TO_MAKE})"
        ),
        E::InvalidCertificate(c) => {
            format!("the server's certificate is refused: {}", bounded(c))
        }
        E::InvalidMessage(_) => "the server did not answer in TLS: if it serves plain text, \
             connect with http://HOST:PORT and no TLS options"
            .to_owned(),
        e => format!("TLS with the server failed: {}", bounded(e)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::net::TcpListener;

    use super::*;
    use crate::backoff::Sleep;

    #[test]
    fn the_rustls_error_is_found_inside_an_io_error_in_a_chain() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("transport error")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
        );
        let outer = Outer(io);
        assert!(matches!(
            rustls_error(&outer),
            Some(rustls::Error::AlertReceived(
                AlertDescription::CertificateRequired
            ))
        ));
        let plain = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(rustls_error(&plain).is_none());
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_named() {
        let tls = Tls {
            ca: Some(b"not a certificate".to_vec()),
            ..Tls::default()
        };
        let e = settings("localhost", Some(&tls)).err().unwrap();
        assert!(
            e.contains("--tls-ca") && e.contains("no CERTIFICATE"),
            "{e}"
        );
    }

    /// Regression: the up-front check refused a CA bundle holding one
    /// certificate rustls cannot parse, which tonic skips.
    #[test]
    fn a_ca_bundle_is_taken_as_tonic_takes_it() {
        let broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let ca = include_str!("../../../examples/tls/ca.pem");
        let with = |pem: String| Tls {
            ca: Some(pem.into_bytes()),
            ..Tls::default()
        };
        assert!(settings("localhost", Some(&with(format!("{broken}{ca}")))).is_ok());
        let e = settings("localhost", Some(&with(broken.to_owned())))
            .err()
            .unwrap();
        assert!(e.contains("--tls-ca") && e.contains("usable CA"), "{e}");
    }

    /// The settings of a client without a CA or a certificate.
    fn plain_settings() -> Settings {
        settings("localhost", None).unwrap()
    }

    #[test]
    fn what_the_server_said_is_named_and_what_its_certificate_says_is_cut_short() {
        let mut s = plain_settings();
        let alpn = describe(
            &rustls::Error::AlertReceived(AlertDescription::NoApplicationProtocol),
            &s,
        );
        assert!(alpn.contains("ALPN h2"), "{alpn}");
        s.identity = true;
        let signature = describe(
            &rustls::Error::AlertReceived(AlertDescription::DecryptError),
            &s,
        );
        assert!(
            signature.contains("does not trust this client's certificate")
                && signature.contains("same name"),
            "{signature}"
        );
        let names = rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected: ServerName::try_from("localhost").unwrap(),
            presented: (0..10_000).map(|i| format!("host-{i}.example")).collect(),
        });
        let said = describe(&names, &s);
        assert!(
            said.contains("--tls-domain") && said.len() < 1_000,
            "{}",
            said.len()
        );
    }

    /// A clock that moves only when told.
    #[derive(Default)]
    struct Manual(Mutex<Duration>);

    impl Timer for Manual {
        fn now(&self) -> Duration {
            *self.0.lock().unwrap()
        }
        fn sleep(&self, _: Duration) -> Sleep {
            Box::pin(std::future::pending())
        }
    }

    /// A loopback "server" that counts its connections and answers each
    /// with `answer`, or with nothing (holding it open) when `None`.
    async fn server(answer: Option<&'static [u8]>) -> (u16, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                match answer {
                    Some(bytes) => {
                        let _ = tcp.write_all(bytes).await;
                    }
                    None => held.push(tcp),
                }
            }
        });
        (port, accepted)
    }

    fn probe(port: u16, https: bool, bound: Duration, clock: Arc<Manual>) -> Arc<Probe> {
        let scheme = if https { "https" } else { "http" };
        let uri = format!("{scheme}://127.0.0.1:{port}").parse().unwrap();
        Arc::new(Probe::new(&uri, None, https, bound, clock).unwrap())
    }

    fn in_a_minute() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// Regression: every failed call to a server probed it once more, all
    /// at once when many failed together. Now one probe runs at a time,
    /// and what it found serves every failure for `REUSE_FOR`.
    #[tokio::test]
    async fn failures_share_one_probe_and_reuse_what_it_found() {
        let (port, accepted) = server(Some(b"HTTP/1.1 400 Bad Request\r\n\r\n")).await;
        let clock = Arc::new(Manual::default());
        let probe = probe(port, true, Duration::from_secs(3600), Arc::clone(&clock));
        let calls: Vec<_> = (0..10)
            .map(|_| {
                let probe = Arc::clone(&probe);
                tokio::spawn(async move { probe.refused(in_a_minute()).await })
            })
            .collect();
        for call in calls {
            let found = call.await.unwrap().unwrap();
            assert!(found.contains("did not answer in TLS"), "{found}");
        }
        // Every caller had its answer from the probe's connection.
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        let again = probe.refused(in_a_minute()).await.unwrap();
        assert!(again.contains("did not answer in TLS"), "{again}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "reused");
        *clock.0.lock().unwrap() += REUSE_FOR;
        assert!(probe.refused(in_a_minute()).await.is_some());
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "probed again");
    }

    /// Regression: the probe ran outside the call's time, so a call could
    /// take its whole request timeout plus the probe's. A caller now waits
    /// for the probe only until its own deadline, and starts none when
    /// that has passed.
    #[tokio::test]
    async fn a_caller_waits_for_the_probe_only_until_its_deadline() {
        let (port, accepted) = server(None).await;
        let clock = Arc::new(Manual::default());
        // A probe that would take an hour: the server never answers.
        let probe = probe(port, true, Duration::from_secs(3600), clock);
        assert_eq!(probe.refused(Instant::now()).await, None);
        assert!(
            probe.state.lock().unwrap().running.is_none(),
            "none started"
        );
        let deadline = Instant::now() + Duration::from_millis(50);
        let waited = tokio::time::timeout(Duration::from_secs(60), probe.refused(deadline)).await;
        assert_eq!(waited, Ok(None), "returned at its deadline");
        // The probe goes on (its finding will serve later failures), and
        // a later failure waits on it rather than starting another.
        let running = probe.state.lock().unwrap().running.clone().unwrap();
        let deadline = Instant::now() + Duration::from_millis(50);
        assert_eq!(probe.refused(deadline).await, None);
        let still = probe.state.lock().unwrap().running.clone().unwrap();
        assert!(running.same_channel(&still));
        for _ in 0..6_000 {
            if accepted.load(Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_plain_text_probe_hears_a_tls_port() {
        // A TLS port's answer to plain text: an alert record.
        let (port, _) = server(Some(b"\x15\x03\x03\x00\x02\x02\x32")).await;
        let tls_port = probe(port, false, Duration::from_secs(3600), Arc::default());
        let found = tls_port.refused(in_a_minute()).await.unwrap();
        assert!(
            found.contains("speaks TLS") && found.contains("--tls-ca"),
            "{found}"
        );
        // An HTTP/2 server's answer: its SETTINGS frame.
        let (port, _) = server(Some(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")).await;
        let h2_port = probe(port, false, Duration::from_secs(3600), Arc::default());
        assert_eq!(h2_port.refused(in_a_minute()).await, None);
    }
}
