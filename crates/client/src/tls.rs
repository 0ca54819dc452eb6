//! Saying in words what went wrong with TLS towards a server, and what to
//! do about it.
//!
//! tonic makes the connections, with its own rustls connector built from
//! the [`Tls`] settings. This module builds the same rustls settings a
//! second time, for two reasons:
//!
//! - **Checking the settings up front.** tonic reports an unusable CA or
//!   client certificate as a bare `transport error`; building them here
//!   first names the problem (an X.509 v1 client certificate, a key that
//!   does not match, a CA file with no certificate in it).
//! - **Probing after a failure.** With TLS 1.3 a client finishes its
//!   handshake before the server has checked the client's certificate: a
//!   server that finds none, or refuses it, says so with an alert that the
//!   client reads only afterwards. By then hyper has handed the connection
//!   to its HTTP/2 task; when that task dies of the alert, the call waiting
//!   on it ends in `Cancelled: operation was canceled` ("connection
//!   closed"), and the alert is lost. So when a call fails that way,
//!   [`Probe::run`] opens one connection of its own with the same
//!   settings, reads the server's first words, and names what the server
//!   said. It runs only after a failure, so a working client never pays
//!   for it.
//!
//! Failures of the handshake itself (the server's certificate is not
//! trusted, or not valid for the name) reach the caller in the source
//! chain of tonic's connect error; [`Probe::explain`] finds the rustls
//! error there.
//!
//! Messages name the CLI's flags first (most people meet them there),
//! then the field of [`Tls`] a Rust caller sets.

use std::error::Error as StdError;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, CertificateError, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::Tls;

/// Where the certificate rules and the commands that make certificates
/// that work are written down.
const HOW_TO_MAKE: &str = "docs/server.md, \"Making certificates\"";

/// What a client sends first on HTTP/2, then an empty SETTINGS frame: a
/// plain-text probe's first words.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// One server, as a probe reaches it: its address, and the TLS settings
/// the client connects with (`None`: plain text).
pub(crate) struct Probe {
    host: String,
    port: u16,
    tls: Option<Settings>,
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
    /// The probe of the server at `uri`, with TLS when `https`. Errors
    /// say what is wrong with `tls`.
    pub(crate) fn new(
        uri: &tonic::codegen::http::Uri,
        tls: Option<&Tls>,
        https: bool,
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
        Ok(Probe { host, port, tls })
    }

    /// What a connect error (tonic's, with its sources) says about TLS,
    /// in words, or `None` when it is not about TLS.
    pub(crate) fn explain(&self, e: &(dyn StdError + 'static)) -> Option<String> {
        let settings = self.tls.as_ref()?;
        rustls_error(e).map(|r| describe(r, settings))
    }

    /// Connects once more, as the client does, and reads the server's
    /// first words: what the server refused, in words, or `None` when it
    /// refused nothing (or could not be reached at all, which the
    /// caller's own error says better). The caller bounds how long it
    /// takes.
    pub(crate) async fn run(&self) -> Option<String> {
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
    let mut first = [0u8; 64];
    match tls.read(&mut first).await {
        Ok(_) => None,
        Err(e) => rustls_error(&e).map(|r| describe(r, settings)),
    }
}

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

/// The rustls settings tonic builds from `tls` for `host`: the CA (or the
/// web's public roots), the client certificate, the name to verify, and
/// ALPN `h2`.
fn settings(host: &str, tls: Option<&Tls>) -> Result<Settings, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
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

/// The CA certificates of `pem`: at least one, each usable as a trust
/// anchor.
fn ca_roots(pem: &[u8]) -> Result<RootCertStore, String> {
    let what = "the CA to trust (--tls-ca, Tls::ca)";
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} is not valid PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what} holds no CERTIFICATE block"));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("{what} holds a certificate that is not a usable CA: {e}"))?;
    }
    Ok(roots)
}

/// The client's certificate chain and key, parsed.
#[allow(clippy::type_complexity)]
fn client_identity(
    cert: &[u8],
    key: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let what = "the client certificate (--tls-cert, Tls::identity)";
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what} is not valid PEM: {e}"))?;
    if chain.is_empty() {
        return Err(format!("{what} holds no CERTIFICATE block"));
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| {
        "the client key (--tls-key, Tls::identity) holds no usable PRIVATE KEY block \
         (PKCS#8, PKCS#1 or SEC1 PEM expected)"
            .to_owned()
    })?;
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
        e => format!("the client certificate (--tls-cert) and key (--tls-key): {e}"),
    }
}

/// Whether rustls refused a certificate for being X.509 v1 (webpki reads
/// v3 certificates only; a v1 certificate has no extensions, so no
/// subjectAltName or key usage to check).
fn is_x509_v1(e: &CertificateError) -> bool {
    matches!(webpki_error(e), Some(webpki::Error::UnsupportedCertVersion))
}

/// webpki's error behind rustls's, which passes the ones it has no variant
/// for through as `Other`.
fn webpki_error(e: &CertificateError) -> Option<&webpki::Error> {
    match e {
        CertificateError::Other(other) => other.0.downcast_ref::<webpki::Error>(),
        _ => None,
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
        E::AlertReceived(
            a @ (A::BadCertificate
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::AccessDenied
            | A::DecryptError),
        ) if s.identity => format!(
            "the server refused this client's certificate (TLS alert {a:?}); the server's log \
             says why. Certificates must be X.509 v3, signed by the server's --tls-client-ca, \
             with extendedKeyUsage = clientAuth if they name a usage ({HOW_TO_MAKE})"
        ),
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
            "the server's certificate does not carry the name this client checks ({c}): \
             connect by a name it carries, or give the name to check with --tls-domain \
             (Tls::domain)"
        ),
        E::InvalidCertificate(c) if is_x509_v1(c) => format!(
            "the server's certificate is X.509 v1, which TLS here refuses: the server needs a \
             v3 certificate ({HOW_TO_MAKE})"
        ),
        E::InvalidCertificate(c)
            if matches!(webpki_error(c), Some(webpki::Error::CaUsedAsEndEntity)) =>
        {
            format!(
                "the server's certificate is a CA certificate (basicConstraints CA:TRUE), not a \
                 server's own: the server needs a certificate signed by that CA \
                 ({HOW_TO_MAKE})"
            )
        }
        E::InvalidCertificate(c) => format!("the server's certificate is refused: {c}"),
        E::InvalidMessage(_) => "the server did not answer in TLS: if it serves plain text, \
             connect with http://HOST:PORT and no TLS options"
            .to_owned(),
        E::NoApplicationProtocol => "the server does not offer HTTP/2 over TLS (ALPN h2), \
             which gRPC needs"
            .to_owned(),
        e => format!("TLS with the server failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
