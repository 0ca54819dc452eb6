//! TLS failures told on both sides (issue 23): real `tollgate serve`
//! processes with TLS and mutual TLS on free ports, the CLI and the Rust
//! client as clients, curl as a client that is not tollgate's, and
//! certificates made by rcgen or, where rcgen cannot (X.509 v1), by the
//! openssl commands docs/server.md shows.
//!
//! Each test checks what the client says (its error names what failed and
//! what to pass) and what the server logs (a `warn` line naming the peer
//! and the reason), read from the process's stderr.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output};

use common::serving::Serving;
use common::{Run, Sandbox};
use serde_json::Value;
use tollgate_client::{Client, ClientConfig, Error, Tls};
use tollgate_redis::testing::TestCerts;

/// The message of the server's line for a failed handshake.
const HANDSHAKE_FAILED: &str = "TLS handshake failed (logged at most every 10 s per reason)";

/// `tollgate serve` on free ports with the bundled config and `tls` flags.
fn serve(dir: &Sandbox, tls: &[&str]) -> Serving {
    let mut args = vec!["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"];
    args.extend_from_slice(tls);
    Serving::start(dir, &args, &[])
}

/// Writes rcgen's CA, server and client material into `dir`, and starts a
/// server with it: mutual TLS when `mutual`.
fn serve_rcgen(dir: &Sandbox, certs: &TestCerts, mutual: bool) -> Serving {
    dir.write("ca.pem", &certs.ca);
    dir.write("server.pem", &certs.server_cert);
    dir.write("server.key", &certs.server_key);
    dir.write("client.pem", &certs.client_cert);
    dir.write("client.key", &certs.client_key);
    let mut flags = vec!["--tls-cert", "server.pem", "--tls-key", "server.key"];
    if mutual {
        flags.extend_from_slice(&["--tls-client-ca", "ca.pem"]);
    }
    serve(dir, &flags)
}

/// `tollgate request default api acme` at `server`'s gRPC port, by the
/// name `localhost` (which the test certificates carry), fail-open off.
fn request(dir: &Sandbox, server: &Serving, flags: &[&str]) -> Run {
    let url = format!("https://localhost:{}", server.grpc.port());
    let mut args = vec![
        "request",
        "default",
        "api",
        "acme",
        "--no-fail-open",
        "--server",
        &url,
    ];
    args.extend_from_slice(flags);
    dir.run(&args)
}

/// Waits (generously) for the server's failed-handshake line with
/// `reason`, and returns it.
fn handshake_failure(server: &Serving, reason: &str) -> Value {
    let find = |s: &Serving| {
        s.logged(HANDSHAKE_FAILED)
            .into_iter()
            .find(|l| l["fields"]["reason"] == reason)
    };
    server.poll(
        &format!("a failed handshake logged with reason {reason}"),
        |s| find(s).is_some(),
    );
    let line = find(server).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
    let peer = line["fields"]["peer"].as_str().unwrap_or_default();
    assert!(peer.starts_with("127.0.0.1:"), "the peer is named: {line}");
    line
}

/// Runs `program args` in `dir`.
fn tool(dir: &Sandbox, program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(&dir.dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} does not run ({e}): the TLS tests need it installed"))
}

/// Runs `openssl args` in `dir`, which must succeed.
fn openssl(dir: &Sandbox, args: &[&str]) {
    let out = tool(dir, "openssl", args);
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The commands of docs/server.md's "Making certificates": a CA, a server
/// certificate for localhost and 127.0.0.1, and a client key and request
/// (`client.csr`), signed as `client.pem` with its extension file.
fn make_certificates_as_documented(dir: &Sandbox) {
    let key = |file: &str| {
        openssl(
            dir,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                file,
            ],
        )
    };
    key("ca.key");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-days",
            "365",
            "-subj",
            "/CN=tollgate example CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            "ca.pem",
        ],
    );
    let sign = |name: &str, subject: &str, ext: &str| {
        key(&format!("{name}.key"));
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-subj",
                subject,
                "-out",
                &format!("{name}.csr"),
            ],
        );
        dir.write(&format!("{name}.ext"), ext);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "365",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    };
    sign(
        "server",
        "/CN=localhost",
        "subjectAltName = DNS:localhost, IP:127.0.0.1\nextendedKeyUsage = serverAuth\n",
    );
    sign("client", "/CN=billing", "extendedKeyUsage = clientAuth\n");
}

/// Signs `client.csr` as OpenSSL does without an extension file: an X.509
/// v1 certificate, `name`.
fn sign_v1(dir: &Sandbox, csr: &str, name: &str) {
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "365",
            "-out",
            name,
        ],
    );
    let text = tool(dir, "openssl", &["x509", "-in", name, "-noout", "-text"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("Version: 1 (0x0)"), "not v1:\n{text}");
}

/// Regression (issue 23): a client without a certificate talking to a
/// mutual-TLS server got `Cancelled: operation was canceled`, and the
/// server logged nothing. The client now says the server requires a
/// client certificate and which flags give one, on every path (a unary
/// request, a session, `status`, the Rust client); the server logs the
/// peer and the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_is_told_the_server_requires_one() {
    let dir = Sandbox::new("tls-no-client-cert");
    let certs = TestCerts::generate();
    let server = serve_rcgen(&dir, &certs, true);
    let told = |text: &str| {
        text.contains("the server requires a client certificate (mutual TLS)")
            && text.contains("pass --tls-cert and --tls-key")
            && !text.contains("Cancelled")
    };

    let out = request(&dir, &server, &["--tls-ca", "ca.pem"]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(told(&out.stderr), "{out}");
    let url = format!("https://localhost:{}", server.grpc.port());
    let out = dir.run(&["status", "--server", &url, "--tls-ca", "ca.pem"]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(told(&out.stderr), "{out}");
    let out = dir.run(&[
        "hold",
        "default",
        "sandbox",
        "acme",
        "--no-fail-open",
        "--server",
        &url,
        "--tls-ca",
        "ca.pem",
    ]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(told(&out.stderr), "{out}");

    let mut config = ClientConfig::new([url.clone()]);
    config.fail_open = false;
    config.tls = Some(Tls {
        ca: Some(certs.ca.clone().into_bytes()),
        ..Tls::default()
    });
    let refused = Client::new(config)
        .unwrap()
        .request("default", "api", "acme")
        .send()
        .await;
    match refused {
        Err(Error::Unavailable(why)) => assert!(told(&why), "{why}"),
        other => panic!("{other:?}"),
    }

    let line = handshake_failure(&server, "no_client_cert");
    assert_eq!(line["fields"]["listener"], "grpc", "{line}");
    let why = line["fields"]["why"].as_str().unwrap_or_default();
    assert!(
        why.contains("presented no certificate") && why.contains("--tls-client-ca"),
        "{line}"
    );

    // With its certificate, the same client is served.
    let out = request(
        &dir,
        &server,
        &[
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "client.pem",
            "--tls-key",
            "client.key",
        ],
    );
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("via server"), "{out}");
}

/// Regression (issue 23): the server dropped X.509 v1 client certificates
/// after the handshake and logged nothing. They are refused (webpki reads
/// v3 only), with a reason on both sides: tollgate's client refuses to
/// load one, naming the flag and the fix; another client (curl) is
/// refused in the handshake and the server logs `client_cert_v1`. The
/// commands docs/server.md documents make certificates that work, and a
/// v1 server certificate stops `serve` with its name.
#[test]
fn an_x509_v1_client_certificate_is_refused_with_a_reason_on_both_sides() {
    let dir = Sandbox::new("tls-v1");
    make_certificates_as_documented(&dir);
    sign_v1(&dir, "client.csr", "client-v1.pem");
    let server = serve(
        &dir,
        &[
            "--tls-cert",
            "server.pem",
            "--tls-key",
            "server.key",
            "--tls-client-ca",
            "ca.pem",
        ],
    );

    // The documented certificates work.
    let good = [
        "--tls-ca",
        "ca.pem",
        "--tls-cert",
        "client.pem",
        "--tls-key",
        "client.key",
    ];
    let out = request(&dir, &server, &good);
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("via server"), "{out}");

    let out = request(
        &dir,
        &server,
        &[
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "client-v1.pem",
            "--tls-key",
            "client.key",
        ],
    );
    assert_eq!(out.code, Some(2), "{out}");
    assert!(
        out.stderr.contains("--tls-cert")
            && out.stderr.contains("is X.509 v1")
            && out.stderr.contains("re-issue it as X.509 v3"),
        "{out}"
    );

    // A client that sends it anyway, on the HTTP port.
    let healthz = format!("https://localhost:{}/healthz", server.http.port());
    let curl = |cert: &str| {
        tool(
            &dir,
            "curl",
            &[
                "-sS",
                "--cacert",
                "ca.pem",
                "--cert",
                cert,
                "--key",
                "client.key",
                &healthz,
            ],
        )
    };
    let refused = curl("client-v1.pem");
    assert!(!refused.status.success(), "{refused:?}");
    let line = handshake_failure(&server, "client_cert_v1");
    assert_eq!(line["fields"]["listener"], "http", "{line}");
    assert!(
        line["fields"]["why"]
            .as_str()
            .unwrap_or_default()
            .contains("X.509 v1"),
        "{line}"
    );
    let served = curl("client.pem");
    assert!(served.status.success(), "{served:?}");
    assert_eq!(String::from_utf8_lossy(&served.stdout).trim(), "ok");

    // A v1 server certificate is refused when the server starts.
    sign_v1(&dir, "server.csr", "server-v1.pem");
    let out = dir.run(&[
        "serve",
        "--check",
        "--tls-cert",
        "server-v1.pem",
        "--tls-key",
        "server.key",
    ]);
    assert_ne!(out.code, Some(0), "{out}");
    assert!(
        out.stderr.contains("server-v1.pem") && out.stderr.contains("X.509 v1"),
        "{out}"
    );
}

/// A server certificate the client does not trust, or that does not carry
/// the name the client checks: the client says which and what to pass;
/// the server logs that the client refused its certificate.
#[test]
fn a_server_certificate_the_client_refuses_is_named_on_both_sides() {
    let dir = Sandbox::new("tls-untrusted-server");
    let server = serve_rcgen(&dir, &TestCerts::generate(), false);
    dir.write("other-ca.pem", TestCerts::generate().ca);

    let out = request(&dir, &server, &["--tls-ca", "other-ca.pem"]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(
        out.stderr.contains(
            "the server's certificate is not signed by the CA this client trusts (--tls-ca"
        ),
        "{out}"
    );
    let line = handshake_failure(&server, "client_alert");
    assert!(
        line["fields"]["why"]
            .as_str()
            .unwrap_or_default()
            .contains("the client refused this server's certificate"),
        "{line}"
    );

    let out = request(
        &dir,
        &server,
        &["--tls-ca", "ca.pem", "--tls-domain", "billing.internal"],
    );
    assert_eq!(out.code, Some(2), "{out}");
    assert!(
        out.stderr.contains("does not carry the name") && out.stderr.contains("--tls-domain"),
        "{out}"
    );

    // No CA given: only the web's public roots are trusted.
    let out = request(&dir, &server, &[]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(
        out.stderr
            .contains("pass the CA that signed it with --tls-ca"),
        "{out}"
    );
}

/// A client that connects in plain text to a TLS port hears that the
/// server speaks TLS; the server logs `not_tls`.
#[test]
fn plain_text_to_a_tls_port_is_named_on_both_sides() {
    let dir = Sandbox::new("tls-plain-client");
    let server = serve_rcgen(&dir, &TestCerts::generate(), false);
    let out = dir.run(&[
        "request",
        "default",
        "api",
        "acme",
        "--no-fail-open",
        "--server",
        &format!("127.0.0.1:{}", server.grpc.port()),
    ]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(
        out.stderr.contains("the server speaks TLS") && out.stderr.contains("--tls-ca"),
        "{out}"
    );
    handshake_failure(&server, "not_tls");
}
