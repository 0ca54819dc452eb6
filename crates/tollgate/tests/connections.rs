//! Connection limits of real `tollgate serve` and `tollgate config-api`
//! processes (issue 16, item 5, "slowloris"): the flags reach the
//! servers, the connection cap refuses with a metric and a log line that a
//! flood cannot multiply, and the config API closes slow and idle
//! connections and answers a trickling body 408 in its own error shape.
//!
//! Timeouts are configured short and outcomes polled for with a generous
//! bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::config_api::{sqlite, ConfigApi, ADMIN};
use common::serving::{exchange, Serving};
use common::Sandbox;
use serde_json::Value;

/// How long anything that should happen may take on a loaded machine.
const BOUND: Duration = Duration::from_secs(10);

/// Reads until the server closes the connection, up to [`BOUND`]: what it
/// sent before, or `None` if it kept the connection open.
fn until_closed(s: &mut TcpStream) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(BOUND)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            // Reset: closed.
            Err(_) => return Some(got),
        }
    }
}

/// Whether the server keeps `s` open: nothing arrives within a short
/// wait (a connection refused over the cap is closed at once).
fn still_open(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 1];
    matches!(
        s.read(&mut buf),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
    )
}

/// One HTTP/1.1 answer on a kept-alive connection: (status, body).
fn answer(s: &mut TcpStream) -> (u16, String) {
    s.set_read_timeout(Some(BOUND)).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + length {
                let status = head[9..12].parse().unwrap();
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]);
                return (status, body.into_owned());
            }
        }
        let n = s.read(&mut chunk).expect("no answer");
        assert!(n > 0, "closed mid-answer");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn metric(addr: SocketAddr, series: &str) -> Option<f64> {
    let (status, text) = exchange(addr, "GET", "/metrics", None).ok()?;
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(name, _)| *name == series)
        .map(|(_, v)| v.trim().parse().unwrap())
}

fn poll(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("never happened: {what}");
}

const REFUSING: &str =
    "connection limit reached: closing new connections at once (logged at most every 10 s)";

#[test]
fn serve_caps_its_connections_with_a_metric_and_one_log_line_for_a_flood() {
    let dir = Sandbox::new("connections-serve");
    let s = Serving::start(
        &dir,
        &[
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--max-connections",
            "3",
            "--http-header-timeout-ms",
            "600000",
        ],
        &[],
    );
    let open = r#"tollgate_connections{listener="http"}"#;
    let refused = r#"tollgate_connections_refused_total{listener="http"}"#;
    // The scrape's own connection.
    poll("one HTTP connection open", || {
        metric(s.http, open) == Some(1.0)
    });
    assert_eq!(
        metric(s.http, r#"tollgate_connections{listener="grpc"}"#),
        Some(0.0)
    );
    assert_eq!(metric(s.http, refused), Some(0.0));

    // Three held connections. The scrape's own connection may not be
    // closed on the server's side yet, so one of these can be refused:
    // open again until three are in.
    let mut held: Vec<TcpStream> = Vec::new();
    for _ in 0..100 {
        held.retain_mut(still_open);
        if held.len() == 3 {
            break;
        }
        held.push(TcpStream::connect(s.http).unwrap());
    }
    assert_eq!(held.len(), 3, "three connections admitted");
    for _ in 0..20 {
        let mut over = TcpStream::connect(s.http).unwrap();
        let sent = until_closed(&mut over).expect("a connection over the cap was kept");
        assert!(sent.is_empty(), "closed without an answer");
    }
    held.pop();
    poll("a connection is admitted again", || {
        exchange(s.http, "GET", "/healthz", None).is_ok()
    });
    // The two still held, and the scrape.
    poll("three HTTP connections open", || {
        metric(s.http, open) == Some(3.0)
    });
    // The scrape above was the third connection: until the server has seen
    // it close, the next one is over the cap and refused, so poll.
    poll("the refused connections scraped", || {
        metric(s.http, refused).is_some_and(|n| n >= 20.0)
    });
    let lines = s.logged(REFUSING);
    assert_eq!(lines.len(), 1, "one line for the whole flood: {lines:?}");
    assert_eq!(lines[0]["fields"]["listener"], "http");
    assert_eq!(lines[0]["fields"]["max_connections"], 3);
}

#[test]
fn serve_refuses_a_zero_limit_naming_the_flag() {
    let dir = Sandbox::new("connections-flags");
    let run = dir.run(&["serve", "--http-body-timeout-ms", "0"]);
    assert_eq!(run.code, Some(2), "{run}");
    assert!(run.stderr.contains("--http-body-timeout-ms"), "{run}");
}

/// Sends the head of a PUT with a 1000-byte body and its first byte, then
/// a byte every 20 ms (the whole body would take 20 s): what the API sent
/// until it closed, or `None` if it did not within [`BOUND`].
fn trickle(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "PUT {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {ADMIN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    )
    .unwrap();
    let mut tx = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for _ in 0..999 {
            std::thread::sleep(Duration::from_millis(20));
            if tx.write_all(b" ").is_err() {
                return;
            }
        }
    });
    let got = until_closed(&mut s);
    let _ = s.shutdown(std::net::Shutdown::Both);
    writer.join().unwrap();
    got.map(|b| String::from_utf8_lossy(&b).into_owned())
}

#[test]
fn the_config_api_closes_slow_and_idle_connections_and_answers_a_trickling_body_408() {
    let dir = Sandbox::new("connections-config-api");
    let api = ConfigApi::start(
        &dir,
        &sqlite(&dir, "t.db"),
        &[
            "--http-header-timeout-ms",
            "300",
            "--http-idle-timeout-ms",
            "300",
            "--http-body-timeout-ms",
            "300",
        ],
    );
    // Half a head.
    let mut half = TcpStream::connect(api.addr).unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        .unwrap();
    let sent = until_closed(&mut half).expect("half a head was kept");
    assert!(sent.is_empty());
    // Idle after an answer.
    let mut idle = TcpStream::connect(api.addr).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(answer(&mut idle).0, 200);
    assert!(
        until_closed(&mut idle).is_some(),
        "an idle connection was kept"
    );
    // A body that trickles.
    let text = trickle(api.addr, "/v1/namespaces/slow").expect("a trickling body was kept");
    let (head, body) = text.split_once("\r\n\r\n").expect("an answer");
    assert!(head.starts_with("HTTP/1.1 408"), "{text}");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"]["reason"], "body_timeout", "{text}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("300 ms"),
        "{text}"
    );
    // Nothing was written, and a body that arrives in time is.
    assert_eq!(admin(api.addr, "GET", "/v1/namespaces/slow", "").0, 404);
    assert_eq!(admin(api.addr, "PUT", "/v1/namespaces/quick", "{}").0, 200);
}

/// One request with the admin token on a new connection: (status, body).
fn admin(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {ADMIN}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    answer(&mut s)
}

#[test]
fn the_config_api_caps_its_connections_with_a_metric() {
    let dir = Sandbox::new("connections-config-api-cap");
    let api = ConfigApi::start(&dir, &sqlite(&dir, "t.db"), &["--max-connections", "2"]);
    let open = r#"tollgate_connections{listener="config_api"}"#;
    let refused = r#"tollgate_connections_refused_total{listener="config_api"}"#;
    poll("the scrape's own connection", || {
        metric(api.addr, open) == Some(1.0)
    });
    let held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(api.addr).unwrap())
        .collect();
    let mut over = TcpStream::connect(api.addr).unwrap();
    assert_eq!(until_closed(&mut over), Some(vec![]));
    drop(held);
    poll("room again, and the refusal counted", || {
        metric(api.addr, refused).is_some_and(|n| n >= 1.0)
    });
}

#[test]
fn the_config_api_closes_tls_handshakes_that_never_complete() {
    let certs = tollgate_redis::testing::TestCerts::generate();
    let dir = Sandbox::new("connections-config-api-tls");
    let cert = dir.write("api.pem", &certs.server_cert);
    let key = dir.write("api.key", &certs.server_key);
    let api = ConfigApi::start_trusting(
        &dir,
        &sqlite(&dir, "t.db"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--tls-handshake-timeout-ms",
            "200",
        ],
        Some(&certs.ca),
    );
    let mut silent = TcpStream::connect(api.addr).unwrap();
    assert!(
        until_closed(&mut silent).is_some(),
        "a handshake that never began was kept"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = runtime.block_on(async {
        let (status, _) = api.call(None, "GET", "/healthz", None).await;
        status
    });
    assert_eq!(status, 200, "a whole handshake is served");
}
