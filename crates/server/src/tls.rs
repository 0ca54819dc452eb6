//! TLS for both ports (rustls, ring provider), and mutual TLS when a client
//! CA is given: then only clients with a certificate that CA signed can
//! connect, to the limiting API and to the admin endpoints alike.
//!
//! This module only loads and checks the material; handshakes are done by
//! [`crate::listen`], which bounds how long one may take and counts a
//! connection against the port's cap from the moment it is accepted.
//!
//! Keys are read from files (paths from flags or the environment) and
//! never logged; errors name the file and what is wrong with it, not its
//! content.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Where the rules for certificates, and commands that make certificates
/// that work, are written down (for errors that send the reader there).
pub(crate) const HOW_TO_MAKE_CERTIFICATES: &str = "docs/server.md, \"Making certificates\"";

/// Whether rustls refused a certificate for being X.509 v1. webpki reads
/// v3 certificates only (a v1 certificate has no extensions: no
/// subjectAltName, key usage or CA flag to check), so a v1 server
/// certificate cannot be served and a v1 client certificate is refused
/// in the handshake. A v1 CA certificate is fine as a trust anchor.
pub(crate) fn is_x509_v1(e: &CertificateError) -> bool {
    matches!(webpki_error(e), Some(webpki::Error::UnsupportedCertVersion))
}

/// Whether rustls refused a certificate for being a CA's (basicConstraints
/// CA:TRUE) where a leaf was expected: a self-signed certificate made with
/// `openssl req -x509`, say, presented as a client's own.
pub(crate) fn is_ca_as_leaf(e: &CertificateError) -> bool {
    matches!(webpki_error(e), Some(webpki::Error::CaUsedAsEndEntity))
}

/// webpki's error behind rustls's, which passes the ones it has no variant
/// for through as `Other`.
fn webpki_error(e: &CertificateError) -> Option<&webpki::Error> {
    match e {
        CertificateError::Other(other) => other.0.downcast_ref::<webpki::Error>(),
        _ => None,
    }
}

/// A TLS setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    // The cause is in the message and not a `source`: anyhow's chain
    // would print it a second time.
    #[error("cannot read {what} {path}: {cause}")]
    Read {
        /// `certificate`, `private key`, `client CA`, or the flag that
        /// named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind needed.
    #[error("{what} {path}: {problem}")]
    Pem {
        /// `certificate`, `private key`, `client CA`, or the flag that
        /// named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong (never the content).
        problem: String,
    },
    /// rustls refused the combination (a key that does not match the
    /// certificate, say).
    #[error("TLS setup: {0}")]
    Config(String),
}

/// Where the server's TLS material is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates that sign client certificates; when given,
    /// clients must present one (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// Loaded TLS material, ready for either port.
#[derive(Clone)]
pub struct Tls {
    mutual: bool,
    rustls: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field("mutual", &self.mutual)
            .finish_non_exhaustive()
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|cause| TlsError::Read {
        what,
        path: path.to_owned(),
        cause,
    })
}

fn certs(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_owned(),
            problem: format!("not valid PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            path: path.to_owned(),
            problem: "no CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

/// The CA certificates of `pem` (from `path`) as trust anchors: at least
/// one, each one rustls can verify a chain against.
fn roots(what: &'static str, path: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs(what, path, pem)? {
        roots.add(c).map_err(|e| TlsError::Pem {
            what,
            path: path.to_owned(),
            problem: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

/// Reads the PEM CA certificates in `path` and checks them as the server's
/// own client CA is checked (at least one, each a usable trust anchor),
/// for a client that takes the PEM itself (tonic's, to an OpenTelemetry
/// collector): the file's bytes. `what` names the file in errors (the
/// flag that gave it, say).
pub fn read_ca(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(what, path)?;
    roots(what, path, &pem)?;
    Ok(pem)
}

impl Tls {
    /// Reads and checks the files: the certificate and key must parse and
    /// match, the client CA (if any) must hold at least one certificate.
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        let cert_pem = read("certificate", &files.cert)?;
        let key_pem = read("private key", &files.key)?;
        let client_ca_pem = files
            .client_ca
            .as_deref()
            .map(|p| read("client CA", p))
            .transpose()?;
        let chain = certs("certificate", &files.cert, &cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::Pem {
            what: "private key",
            path: files.key.clone(),
            problem: "no usable PRIVATE KEY block found (PKCS#8, PKCS#1 or SEC1 PEM expected)"
                .into(),
        })?;
        let builder = ServerConfig::builder();
        let builder = match (&files.client_ca, &client_ca_pem) {
            (Some(path), Some(pem)) => {
                let roots = roots("client CA", path, pem)?;
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| match &e {
            rustls::Error::InvalidCertificate(c) if is_x509_v1(c) => TlsError::Pem {
                what: "certificate",
                path: files.cert.clone(),
                problem: format!(
                    "an X.509 v1 certificate, which TLS clients refuse: re-issue it as v3, \
                     with the server's names in subjectAltName ({HOW_TO_MAKE_CERTIFICATES})"
                ),
            },
            _ => TlsError::Config(format!("certificate and key: {e}")),
        })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls {
            mutual: client_ca_pem.is_some(),
            rustls: Arc::new(config),
        })
    }

    /// Whether clients must present a certificate.
    pub fn is_mutual(&self) -> bool {
        self.mutual
    }

    /// The rustls settings of an HTTP port: ALPN offers HTTP/2 and
    /// HTTP/1.1. The handshake itself is done by [`crate::listen`], under its
    /// connection cap and handshake timeout.
    pub fn http_config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.rustls)
    }

    /// The rustls settings of the gRPC port: the same certificate and
    /// client CA, with ALPN offering HTTP/2 only (gRPC runs on nothing
    /// else), as tonic's own TLS would.
    pub fn grpc_config(&self) -> Arc<ServerConfig> {
        let mut config = (*self.rustls).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(config)
    }
}
