//! The Redis store over TLS, against TLS-only redis-servers the tests
//! start with certificates made fresh for them (rcgen): deciding and
//! holding copies with the test CA, mutual TLS with and without a client
//! certificate (one server and a three-master cluster), the system's roots
//! refusing the test CA's server, and TLS material that cannot work
//! refused before any connection.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{reserve_as, unique_prefix, RedisServer};
use tollgate_core::copies::CopyLimits;
use tollgate_core::{Align, FixedWindow, Hits, Limit, Mode, Nanos};
use tollgate_redis::conn::{ClientCert, TlsPart};
use tollgate_redis::testing::{RedisCluster, TestCerts};
use tollgate_redis::{ConnectError, RedisOptions, RedisStore};
use tollgate_store::{Held, Key, LimitId, OpId, Plan, PoolKey, Store};

/// Options for `url` trusting `ca`, presenting `client` if any.
fn options(url: &str, ca: Option<&TestCerts>, client: Option<ClientCert>) -> RedisOptions {
    let mut o = RedisOptions::new(url);
    o.prefix = unique_prefix();
    o.connect.response_timeout = Duration::from_secs(5);
    o.connect.tls_ca = ca.map(|c| c.ca.clone().into_bytes());
    o.connect.tls_client = client;
    o
}

async fn connect(o: RedisOptions) -> Result<RedisStore, ConnectError> {
    RedisStore::connect(o).await
}

/// Why connecting with `o` fails; it must.
async fn connect_err(o: RedisOptions) -> ConnectError {
    connect(o).await.map(|_| ()).unwrap_err()
}

/// Three hits an hour per domain, then copies of a pool of five: what a
/// store on a TLS server must still do.
async fn decides_and_holds(store: &RedisStore) {
    let window = Arc::new(Limit::FixedWindow(
        FixedWindow::new(3, Nanos::from_secs(3600), Align::FirstHit).unwrap(),
    ));
    let mut plan = Plan::default().with_affinity(1);
    plan.push(Key::new(LimitId(1), "acme"), window, false)
        .unwrap();
    let mut granted = Vec::new();
    for _ in 0..4 {
        let d = store
            .decide(&plan, Nanos::ZERO, Hits::exactly(1), Mode::Try)
            .await
            .unwrap();
        granted.push(d.allowed);
    }
    assert_eq!(granted, [true, true, true, false]);

    let pool = PoolKey::new("ns", "db");
    let limits = CopyLimits::new(5, Some(5));
    let first = reserve_as(store, &pool, &limits, "acme", Hits::exactly(4))
        .await
        .unwrap();
    assert_eq!(first.granted, 4);
    let second = reserve_as(store, &pool, &limits, "acme", Hits::between(1, 3))
        .await
        .unwrap();
    assert_eq!(second.granted, 1);
    store
        .release(
            Held {
                pool: &pool,
                domain: "acme",
                groups: &first.groups,
                copies: 4,
            },
            OpId::random(),
        )
        .await
        .unwrap();
    let third = reserve_as(store, &pool, &limits, "acme", Hits::between(1, 9))
        .await
        .unwrap();
    assert_eq!(third.granted, 4);
}

#[tokio::test]
async fn the_store_decides_and_holds_copies_over_tls_trusting_the_given_ca() {
    let (server, certs) = RedisServer::start_tls(false);
    assert!(server.url().starts_with("rediss://127.0.0.1:"));
    let o = options(&server.url(), Some(&certs), None);
    let prefix = o.prefix.clone();
    let store = connect(o).await.unwrap();
    decides_and_holds(&store).await;
    // What the store wrote is in the TLS-only server.
    let keys = server.keys(&prefix);
    assert!(keys.iter().any(|k| k.contains(":l:")), "{keys:?}");
    assert!(keys.iter().any(|k| k.ends_with(":pool")), "{keys:?}");
}

#[tokio::test]
async fn mutual_tls_works_with_the_client_certificate_and_is_refused_without() {
    let (server, certs) = RedisServer::start_tls(true);
    let store = connect(options(&server.url(), Some(&certs), Some(certs.client())))
        .await
        .unwrap();
    decides_and_holds(&store).await;

    let err = connect_err(options(&server.url(), Some(&certs), None)).await;
    assert!(matches!(err, ConnectError::Connect { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("cannot connect to Redis at {}", server.url())),
        "{text}"
    );
    assert!(text.contains("CertificateRequired"), "{text}");

    // A certificate from another CA is no better.
    let stranger = TestCerts::generate();
    let err = connect_err(options(
        &server.url(),
        Some(&certs),
        Some(stranger.client()),
    ))
    .await;
    assert!(matches!(err, ConnectError::Connect { .. }), "{err:?}");
}

#[tokio::test]
async fn a_tls_cluster_is_reached_on_every_master_with_the_client_certificate() {
    let (cluster, certs) = RedisCluster::start_tls();
    let url = cluster.url();
    assert!(url.starts_with("rediss-cluster://"), "{url}");
    let o = options(&url, Some(&certs), Some(certs.client()));
    let prefix = o.prefix.clone();
    let store = connect(o).await.unwrap();
    assert!(store.is_cluster());
    decides_and_holds(&store).await;
    // Plans of many namespaces (affinities) land on every master, each
    // reached over TLS through the slots the cluster announced.
    let window = Arc::new(Limit::FixedWindow(
        FixedWindow::new(1, Nanos::from_secs(3600), Align::FirstHit).unwrap(),
    ));
    for affinity in 0..24u64 {
        let mut plan = Plan::default().with_affinity(affinity.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        plan.push(Key::new(LimitId(2), "acme"), Arc::clone(&window), false)
            .unwrap();
        let d = store
            .decide(&plan, Nanos::ZERO, Hits::exactly(1), Mode::Try)
            .await
            .unwrap();
        assert!(d.allowed, "affinity {affinity}");
    }
    let by_node = cluster.keys_by_node(&prefix);
    assert!(by_node.iter().all(|keys| !keys.is_empty()), "{by_node:?}");

    // Without the client certificate the cluster refuses.
    let err = connect_err(options(&url, Some(&certs), None)).await;
    assert!(matches!(err, ConnectError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("CertificateRequired"), "{err}");
}

#[tokio::test]
async fn without_the_ca_the_system_roots_refuse_the_servers_certificate() {
    let (server, _certs) = RedisServer::start_tls(false);
    let err = connect_err(options(&server.url(), None, None)).await;
    let text = err.to_string();
    assert!(matches!(err, ConnectError::Connect { .. }), "{err:?}");
    assert!(text.contains("invalid peer certificate"), "{text}");

    // Another CA than the one that signed the server's certificate: the
    // same refusal.
    let other = TestCerts::generate();
    let err = connect_err(options(&server.url(), Some(&other), None)).await;
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
}

#[tokio::test]
async fn tls_material_with_a_url_without_tls_is_refused_before_connecting() {
    let plain = RedisServer::start();
    let certs = TestCerts::generate();
    let cluster = format!("redis-cluster://127.0.0.1:{}", plain.port);
    for (url, ca, client) in [
        (plain.url(), Some(&certs), None),
        (plain.url(), None, Some(certs.client())),
        (cluster, Some(&certs), Some(certs.client())),
    ] {
        let err = connect_err(options(&url, ca, client)).await;
        assert!(matches!(err, ConnectError::TlsOnPlainUrl { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("does not use TLS"), "{text}");
        assert!(text.contains("rediss://"), "{text}");
    }
    // Nothing reached the server.
    assert_eq!(plain.keys(""), Vec::<String>::new());
}

#[tokio::test]
async fn unusable_tls_material_is_refused_naming_the_part_and_never_the_key() {
    let (server, certs) = RedisServer::start_tls(true);
    let other = TestCerts::generate();
    let client = |cert: &str, key: &str| ClientCert {
        cert_pem: cert.as_bytes().to_vec(),
        key_pem: key.as_bytes().to_vec(),
    };
    let url = server.url();
    let cases: Vec<(RedisOptions, TlsPart, &str)> = vec![
        // A key file given as the CA file: no certificate in it.
        (
            {
                let mut o = options(&url, None, None);
                o.connect.tls_ca = Some(certs.client_key.clone().into_bytes());
                o
            },
            TlsPart::Ca,
            "no CERTIFICATE block",
        ),
        (
            options(&url, Some(&certs), Some(client("", &certs.client_key))),
            TlsPart::ClientCert,
            "no CERTIFICATE block",
        ),
        (
            options(
                &url,
                Some(&certs),
                Some(client(&certs.client_cert, "garbage")),
            ),
            TlsPart::ClientKey,
            "no usable PRIVATE KEY block",
        ),
        // Another certificate's key.
        (
            options(
                &url,
                Some(&certs),
                Some(client(&certs.client_cert, &other.client_key)),
            ),
            TlsPart::ClientKey,
            "unusable with the certificate",
        ),
    ];
    for (o, want_part, want_reason) in cases {
        let keys = o
            .connect
            .tls_client
            .as_ref()
            .map(|c| c.key_pem.clone())
            .unwrap_or_default();
        let err = connect_err(o).await;
        let ConnectError::BadTls { part, reason, .. } = &err else {
            panic!("{want_part:?}: not BadTls: {err:?}");
        };
        assert_eq!(*part, want_part, "{err}");
        assert!(reason.contains(want_reason), "{err}");
        let text = format!("{err} {err:?}");
        assert!(
            text.starts_with(&format!("bad TLS {want_part} for Redis at {url}")),
            "{text}"
        );
        // No line of a key's PEM shows (the other key's neither).
        for key in [
            &keys[..],
            certs.client_key.as_bytes(),
            other.client_key.as_bytes(),
        ] {
            let key = String::from_utf8_lossy(key);
            for line in key
                .lines()
                .filter(|l| l.len() > 20 && !l.starts_with("-----"))
            {
                assert!(!text.contains(line), "key material in {text}");
            }
        }
    }
}

#[test]
fn debug_output_never_shows_the_key_or_the_password() {
    let certs = TestCerts::generate();
    let mut o = options("rediss://127.0.0.1:1/", Some(&certs), Some(certs.client()));
    o.connect.password = Some("hunter2".into());
    let shown = format!("{o:?}");
    assert!(shown.contains("<redacted>"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
    for line in certs.client_key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!shown.contains(line), "{shown}");
    }
}
