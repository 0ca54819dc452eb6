//! `tollgate serve --store rediss://...` as a real process against a
//! TLS-only redis-server that requires client certificates (certificates
//! made fresh by the test): served with the CA, certificate and key files,
//! and TLS files that cannot work refused at startup, naming the flag and
//! the file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serving::{Serving, FREE_PORTS};
use common::Sandbox;
use tollgate_redis::testing::{free_port, RedisServer, TestCerts};

const CONFIG: &str = r#"
namespaces:
  - name: shop
    resources:
      - { name: checkout, algorithm: fixed_window, limit: 2, window: 1h, align: first_hit }
"#;

fn checkout(s: &Serving) -> (u16, serde_json::Value) {
    s.json(
        "POST",
        "/v1/request",
        Some(r#"{"namespace":"shop","resource":"checkout","domain":"acme","hits":1}"#),
    )
}

#[test]
fn serve_uses_a_mutual_tls_redis_with_the_ca_certificate_and_key_files() {
    let dir = Sandbox::new("redis-tls");
    dir.write("tollgate.yaml", CONFIG);
    let (redis, certs) = RedisServer::start_tls(true);
    let ca = dir.write("ca.pem", &certs.ca);
    let cert = dir.write("client.pem", &certs.client_cert);
    let key = dir.write("client.key", &certs.client_key);
    let url = redis.url();
    let s = Serving::start_redis(
        &dir,
        &url,
        &[
            "--redis-cert-file",
            cert.to_str().unwrap(),
            "--redis-key-file",
            key.to_str().unwrap(),
        ],
        // The CA through its environment variable, as a deployment would.
        &[("TOLLGATE_REDIS_CA_FILE", ca.to_str().unwrap())],
    );
    let answers: Vec<(u16, bool)> = (0..3)
        .map(|_| {
            let (status, v) = checkout(&s);
            (status, v["allowed"].as_bool().unwrap())
        })
        .collect();
    assert_eq!(answers, [(200, true), (200, true), (429, false)]);
    assert_eq!(s.http("GET", "/readyz", None).0, 200);
    // The window lives in the TLS-only Redis.
    let keys = redis.keys("tollgate:");
    assert!(keys.iter().any(|k| k.contains(":l:")), "{keys:?}");

    let (code, logs) = s.terminate();
    assert_eq!(code, Some(0));
    let logs = serde_json::to_string(&logs).unwrap();
    for line in certs.client_key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!logs.contains(line), "the key in the logs: {logs}");
    }
}

#[test]
fn tls_files_that_cannot_work_are_a_clear_startup_error() {
    let dir = Sandbox::new("redis-tls-bad");
    dir.write("tollgate.yaml", CONFIG);
    let certs = TestCerts::generate();
    let ca = dir.write("ca.pem", &certs.ca);
    let cert = dir.write("client.pem", &certs.client_cert);
    let key = dir.write("client.key", &certs.client_key);
    let garbage = dir.write("garbage.key", "not a key");
    let missing = dir.path("missing.key");
    // Nothing listens there: every case must fail before connecting.
    let tls_url = format!("rediss://127.0.0.1:{}/", free_port());
    let plain_url = format!("redis://127.0.0.1:{}/", free_port());
    let [ca, cert, key, garbage, missing] =
        [&ca, &cert, &key, &garbage, &missing].map(|p| p.to_str().unwrap().to_owned());
    let cases: Vec<(&str, Vec<&str>, String)> = vec![
        (
            &tls_url,
            vec!["--redis-cert-file", &cert, "--redis-key-file", &missing],
            format!("cannot read --redis-key-file {missing}"),
        ),
        (
            &tls_url,
            vec!["--redis-cert-file", &cert],
            format!("--redis-cert-file {cert} needs --redis-key-file"),
        ),
        (
            &tls_url,
            vec!["--redis-key-file", &key],
            format!("--redis-key-file {key} needs --redis-cert-file"),
        ),
        (
            &tls_url,
            vec!["--redis-cert-file", &cert, "--redis-key-file", &garbage],
            format!("with --redis-key-file {garbage}: bad TLS client key"),
        ),
        (
            &plain_url,
            vec!["--redis-ca-file", &ca],
            format!("with --redis-ca-file {ca}: TLS certificates were given"),
        ),
    ];
    for (url, flags, expect) in cases {
        let mut args = vec!["serve", "--config", "tollgate.yaml"];
        args.extend(FREE_PORTS);
        args.extend(["--store", url, "--redis-connect-timeout-ms", "200"]);
        args.extend(flags);
        let run = dir.run(&args);
        assert_eq!(run.code, Some(1), "{run}");
        assert!(run.stderr.contains(&expect), "expected `{expect}`: {run}");
        assert!(!run.stderr.contains("tollgate listening"), "{run}");
        for line in certs.client_key.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!run.stderr.contains(line), "the key in the output: {run}");
        }
    }
}
