//! TLS for both ports (rustls, ring provider), and mutual TLS when a client
//! CA is given: then only clients with a certificate that CA signed can
//! connect, to the limiting API and to the admin endpoints alike.
//!
//! Keys are read from files (paths from flags or the environment) and
//! never logged; errors name the file and what is wrong with it, not its
//! content.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A TLS setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// `certificate`, `private key` or `client CA`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM item of the kind needed.
    #[error("{what} {path}: {problem}")]
    Pem {
        /// `certificate`, `private key` or `client CA`.
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
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    client_ca_pem: Option<Vec<u8>>,
    rustls: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field("mutual", &self.client_ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
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
                let mut roots = RootCertStore::empty();
                for c in certs("client CA", path, pem)? {
                    roots.add(c).map_err(|e| {
                        TlsError::Config(format!("client CA {}: {e}", path.display()))
                    })?;
                }
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Config(format!("certificate and key: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls {
            cert_pem,
            key_pem,
            client_ca_pem,
            rustls: Arc::new(config),
        })
    }

    /// Whether clients must present a certificate.
    pub fn is_mutual(&self) -> bool {
        self.client_ca_pem.is_some()
    }

    /// The gRPC port's TLS settings.
    pub fn tonic(&self) -> tonic::transport::ServerTlsConfig {
        let identity = tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem);
        let config = tonic::transport::ServerTlsConfig::new().identity(identity);
        match &self.client_ca_pem {
            Some(ca) => config.client_ca_root(tonic::transport::Certificate::from_pem(ca)),
            None => config,
        }
    }

    /// A listener for the HTTP port that hands out finished TLS
    /// connections, with `TCP_NODELAY` set when `nodelay`.
    pub fn listener(&self, tcp: TcpListener, nodelay: bool) -> TlsListener {
        TlsListener::new(tcp, TlsAcceptor::from(Arc::clone(&self.rustls)), nodelay)
    }
}

/// How long a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts TCP connections and completes their TLS handshakes in their
/// own tasks, so that a slow or silent client cannot hold up the others;
/// failed handshakes are logged and dropped.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, std::net::SocketAddr)>,
    local: std::io::Result<std::net::SocketAddr>,
}

impl TlsListener {
    fn new(tcp: TcpListener, acceptor: TlsAcceptor, nodelay: bool) -> TlsListener {
        let local = tcp.local_addr();
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                if nodelay {
                    let _ = stream.set_nodelay(true);
                }
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = ?e.to_string(), "TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task only ends with the listener; wait forever
            // like a listener with no more clients would.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local {
            Ok(a) => Ok(*a),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}
