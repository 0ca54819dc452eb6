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
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::CertificateDer;
use tollgate_tls::{is_x509_v1, Anchors, PemError, HOW_TO_MAKE_CERTIFICATES};

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

/// `problem` with the file `path` (given for `what`).
fn pem_error(what: &'static str, path: &Path, problem: PemError) -> TlsError {
    TlsError::Pem {
        what,
        path: path.to_owned(),
        problem: problem.to_string(),
    }
}

fn certs(
    what: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    tollgate_tls::certificates(pem).map_err(|e| pem_error(what, path, e))
}

/// The CA certificates of `pem` (from `path`) as trust anchors, `which`
/// of them must be usable.
fn roots(
    what: &'static str,
    path: &Path,
    pem: &[u8],
    which: Anchors,
) -> Result<RootCertStore, TlsError> {
    tollgate_tls::trust_anchors(pem, which).map_err(|e| pem_error(what, path, e))
}

/// Reads the PEM CA certificates in `path` and checks them as tonic will
/// use them, for a client that takes the PEM itself (tonic's, to an
/// OpenTelemetry collector): tonic skips a certificate it cannot parse,
/// so at least one must be usable. Returns the file's bytes. `what` names
/// the file in errors (the flag that gave it, say).
pub fn read_ca(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(what, path)?;
    roots(what, path, &pem, Anchors::Usable)?;
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
        let key = tollgate_tls::private_key(&key_pem)
            .map_err(|e| pem_error("private key", &files.key, e))?;
        let builder = ServerConfig::builder();
        let builder = match (&files.client_ca, &client_ca_pem) {
            (Some(path), Some(pem)) => {
                // Every certificate of the bundle: the server applies it
                // itself, and a broken entry is better named than skipped.
                let roots = roots("client CA", path, pem, Anchors::Every)?;
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
