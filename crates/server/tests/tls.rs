//! TLS on both ports, and mutual TLS refusing clients without a
//! certificate from the configured CA. Certificates are made fresh by each
//! test (rcgen); the only network is loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::TestServer;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_proto::v1::{self, tollgate_client::TollgateClient};
use tollgate_server::tls::{Tls, TlsFiles};
use tollgate_server::{ConnectionLimits, ServerOptions};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const CONFIG: &str = "namespaces:\n  - name: app\n    resources:\n      - { name: api, algorithm: gcra, rate: 10/s, burst: 5 }\n";

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf certificate for `localhost`: (cert PEM, key PEM).
    fn leaf(&self, name: &str) -> (String, String) {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

async fn start(dir: &Path, server_ca: &Ca, client_ca: Option<&Ca>) -> TestServer {
    start_limited(dir, server_ca, client_ca, ConnectionLimits::default()).await
}

async fn start_limited(
    dir: &Path,
    server_ca: &Ca,
    client_ca: Option<&Ca>,
    connection_limits: ConnectionLimits,
) -> TestServer {
    let (cert, key) = server_ca.leaf("tollgate");
    let files = TlsFiles {
        cert: write(dir, "server.pem", &cert),
        key: write(dir, "server.key", &key),
        client_ca: client_ca.map(|ca| write(dir, "client-ca.pem", &ca.pem())),
    };
    let options = ServerOptions {
        tls: Some(Tls::load(&files).unwrap()),
        connection_limits,
        ..ServerOptions::default()
    };
    TestServer::start_with(CONFIG, Default::default(), options).await
}

async fn grpc(
    server: &TestServer,
    ca: &Ca,
    identity: Option<(String, String)>,
) -> Result<TollgateClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://{}", server.grpc))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(TollgateClient::new(channel))
}

fn request() -> v1::RateRequest {
    v1::RateRequest {
        namespace: "app".into(),
        resource: "api".into(),
        domain: "d".into(),
        hits: Some(1),
        min_hits: None,
        mode: 0,
        limit: None,
    }
}

/// Whether `client`'s request is allowed; it must be answered.
async fn allowed(client: &mut TollgateClient<Channel>) -> bool {
    client
        .request(request())
        .await
        .unwrap()
        .into_inner()
        .allowed
}

/// `GET /healthz` over TLS by hand (tokio-rustls): the status line, or
/// the error that ended the exchange.
async fn https_healthz(
    server: &TestServer,
    ca: &Ca,
    identity: Option<(String, String)>,
) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => {
            use rustls_pki_types::pem::PemObject;
            let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(server.http).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    tls.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(out.lines().next().unwrap_or_default().to_owned())
}

use rustls_pki_types::pem::PemObject;

#[tokio::test]
async fn both_ports_serve_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let server = start(dir.path(), &ca, None).await;
    let mut client = grpc(&server, &ca, None).await.unwrap();
    assert!(allowed(&mut client).await);
    assert_eq!(
        https_healthz(&server, &ca, None).await.unwrap(),
        "HTTP/1.1 200 OK"
    );
    // Plain text is not served on a TLS port.
    let mut plain = TollgateClient::connect(server.grpc_url()).await.unwrap();
    assert!(plain.request(request()).await.is_err());
}

#[tokio::test]
async fn mutual_tls_refuses_strangers_on_both_ports() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let stranger_ca = Ca::new("stranger CA");
    let server = start(dir.path(), &server_ca, Some(&client_ca)).await;

    // A known client.
    let mut client = grpc(&server, &server_ca, Some(client_ca.leaf("app")))
        .await
        .unwrap();
    assert!(allowed(&mut client).await);
    assert_eq!(
        https_healthz(&server, &server_ca, Some(client_ca.leaf("ops")))
            .await
            .unwrap(),
        "HTTP/1.1 200 OK"
    );

    // No certificate, or one from another CA: refused.
    for identity in [None, Some(stranger_ca.leaf("mallory"))] {
        let refused = match grpc(&server, &server_ca, identity.clone()).await {
            Err(_) => true,
            Ok(mut c) => c.request(request()).await.is_err(),
        };
        assert!(refused, "a gRPC client without a valid certificate got in");
        assert!(
            https_healthz(&server, &server_ca, identity).await.is_err(),
            "an HTTP client without a valid certificate got in"
        );
    }
}

/// Reads until the server closes the connection, up to 10 s: whether it
/// did.
async fn closed(conn: &mut (impl tokio::io::AsyncRead + Unpin)) -> bool {
    let read_all = async {
        let mut buf = [0u8; 1024];
        while let Ok(n) = conn.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read_all)
        .await
        .is_ok()
}

/// A finished TLS handshake with `addr`, offering `alpn`.
async fn handshake(
    addr: SocketAddr,
    ca: &Ca,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

const LONG: Duration = Duration::from_secs(600);

/// Slowloris (issue 16, item 5) over TLS: before this, the gRPC port had
/// no handshake timeout at all.
#[tokio::test]
async fn handshakes_that_never_complete_are_closed_on_both_ports() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let limits = ConnectionLimits {
        handshake_timeout: Duration::from_millis(200),
        header_timeout: LONG,
        idle_timeout: LONG,
        ..ConnectionLimits::default()
    };
    let server = start_limited(dir.path(), &ca, None, limits).await;
    for addr in [server.http, server.grpc] {
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        // The first bytes of a ClientHello record, and no more.
        let mut partial = tokio::net::TcpStream::connect(addr).await.unwrap();
        partial.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
        assert!(
            closed(&mut silent).await,
            "{addr}: a silent client was kept"
        );
        assert!(closed(&mut partial).await, "{addr}: half a hello was kept");
    }
    // Whole handshakes are served.
    assert_eq!(
        https_healthz(&server, &ca, None).await.unwrap(),
        "HTTP/1.1 200 OK"
    );
    let mut client = grpc(&server, &ca, None).await.unwrap();
    assert!(client.request(request()).await.is_ok());
}

#[tokio::test]
async fn after_its_handshake_a_silent_client_is_closed_after_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let limits = ConnectionLimits {
        header_timeout: Duration::from_millis(200),
        idle_timeout: LONG,
        ..ConnectionLimits::default()
    };
    let server = start_limited(dir.path(), &ca, None, limits).await;
    let mut http = handshake(server.http, &ca, b"http/1.1").await;
    assert!(closed(&mut http).await, "HTTP: no request head, yet kept");
    let mut grpc = handshake(server.grpc, &ca, b"h2").await;
    assert!(closed(&mut grpc).await, "gRPC: no HTTP/2 preface, yet kept");
}

#[tokio::test]
async fn a_connection_still_in_its_handshake_counts_against_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let limits = ConnectionLimits {
        max_connections: 1,
        handshake_timeout: LONG,
        ..ConnectionLimits::default()
    };
    let server = start_limited(dir.path(), &ca, None, limits).await;
    for addr in [server.http, server.grpc] {
        let _holding = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(closed(&mut next).await, "{addr}: one over the cap was kept");
    }
}

#[test]
fn bad_tls_files_are_named_without_their_content() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("ca");
    let (cert, key) = ca.leaf("x");
    let (_, other_key) = ca.leaf("y");
    let files = |cert: &str, key: &str| TlsFiles {
        cert: write(dir.path(), "c.pem", cert),
        key: write(dir.path(), "k.pem", key),
        client_ca: None,
    };
    let e = Tls::load(&files("not pem", &key)).unwrap_err().to_string();
    assert!(e.contains("c.pem") && e.contains("CERTIFICATE"), "{e}");
    let e = Tls::load(&files(&cert, "garbage")).unwrap_err().to_string();
    assert!(e.contains("k.pem") && e.contains("PRIVATE KEY"), "{e}");
    let e = Tls::load(&files(&cert, &other_key))
        .unwrap_err()
        .to_string();
    assert!(e.contains("certificate and key"), "{e}");
    assert!(!e.contains("BEGIN"), "no key material in errors: {e}");
    let missing = TlsFiles {
        cert: dir.path().join("nope.pem"),
        key: dir.path().join("k.pem"),
        client_ca: None,
    };
    let e = Tls::load(&missing).unwrap_err().to_string();
    assert!(e.contains("nope.pem"), "{e}");
    // And the Debug form shows no key.
    let ok = Tls::load(&files(&cert, &key)).unwrap();
    assert!(!format!("{ok:?}").contains("BEGIN"));
}

/// A health client whose TLS offers no ALPN (as a proxy's health checker
/// may be configured), with `identity` as its client certificate.
async fn health_without_alpn(
    server: &TestServer,
    ca: &Ca,
    identity: (String, String),
) -> HealthClient<Channel> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let chain = rustls_pki_types::CertificateDer::pem_slice_iter(identity.0.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(identity.1.as_bytes()).unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    assert!(config.alpn_protocols.is_empty());
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let addr = server.grpc;
    // TLS is done by the connector, so the endpoint's own scheme is plain.
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .unwrap();
    HealthClient::new(channel)
}

async fn serving(client: &mut HealthClient<Channel>, service: &str) -> Result<i32, tonic::Status> {
    let answer = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?;
    Ok(answer.into_inner().status)
}

/// gRPC health checks (as Envoy's `grpc_health_check` sends them, over
/// its own connection) through mutual TLS and the gRPC port's connection
/// limits: with or without ALPN, Check and Watch answer, and a health
/// connection counts against the cap like any other. (A checker without a
/// client certificate is refused in the handshake, before any service:
/// `mutual_tls_refuses_strangers_on_both_ports`.)
#[tokio::test]
async fn health_checks_over_mutual_tls_with_or_without_alpn_within_the_connection_cap() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let limits = ConnectionLimits {
        max_connections: 2,
        handshake_timeout: Duration::from_secs(10),
        header_timeout: Duration::from_secs(10),
        ..ConnectionLimits::default()
    };
    let server = start_limited(dir.path(), &server_ca, Some(&client_ca), limits).await;
    let serving_now = ServingStatus::Serving as i32;

    // tonic's client offers h2 by ALPN.
    let mut tls = Channel::from_shared(format!("https://{}", server.grpc))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(server_ca.pem()))
                .domain_name("localhost")
                .identity({
                    let (cert, key) = client_ca.leaf("envoy");
                    Identity::from_pem(cert, key)
                }),
        )
        .unwrap()
        .connect()
        .await
        .map(HealthClient::new)
        .unwrap();
    for name in [
        "",
        "tollgate.v1.Tollgate",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        assert_eq!(
            serving(&mut tls, name).await.unwrap(),
            serving_now,
            "{name:?}"
        );
    }
    let mut watch = tls
        .watch(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(watch.message().await.unwrap().unwrap().status, serving_now);

    // One that offers none.
    let mut bare = health_without_alpn(&server, &server_ca, client_ca.leaf("checker")).await;
    assert_eq!(serving(&mut bare, "").await.unwrap(), serving_now);

    // Both places are taken: a third connection is closed at once.
    let mut third = tokio::net::TcpStream::connect(server.grpc).await.unwrap();
    assert!(closed(&mut third).await, "one over the cap was kept");

    // Checks keep coming over the connections already open.
    for _ in 0..10 {
        assert_eq!(serving(&mut tls, "").await.unwrap(), serving_now);
        assert_eq!(serving(&mut bare, "").await.unwrap(), serving_now);
    }
    drop(watch);
}
