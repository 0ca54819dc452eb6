//! The connection limits of both ports, through real sockets against an
//! in-process server (issue 16, item 5, "slowloris": half-sent heads held
//! connections open for good, and nothing capped them).
//!
//! Timeouts are configured short and outcomes polled for with a generous
//! bound; a bound is never the thing asserted. Where a test must show that
//! something is *not* cut off (an idle gRPC session, a kept-alive
//! connection idling past the header timeout), it waits several times the
//! deadline that would cut it and then uses it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{eventually, TestServer};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tollgate_proto::v1::{self, session_request::Op, session_response::Result as Answer};
use tollgate_server::{ConnectionLimits, ServerOptions};

const CONFIG: &str = "namespaces:\n  - name: app\n    resources:\n      - { name: api, algorithm: gcra, rate: 1000/s, burst: 1000 }\n      - { name: pool, kind: concurrency, domain_limit: 3 }\n";

/// How long anything that should happen may take on a loaded machine.
const BOUND: Duration = Duration::from_secs(10);
/// A timeout that never fires during a test.
const LONG: Duration = Duration::from_secs(600);

fn limits(header: Duration, idle: Duration, body: Duration) -> ConnectionLimits {
    ConnectionLimits {
        header_timeout: header,
        idle_timeout: idle,
        body_timeout: body,
        ..ConnectionLimits::default()
    }
}

async fn start(limits: ConnectionLimits) -> TestServer {
    let options = ServerOptions {
        connection_limits: limits,
        ..ServerOptions::default()
    };
    TestServer::start_with(CONFIG, Default::default(), options).await
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

/// Reads until the server closes the connection (end of stream or reset),
/// up to [`BOUND`]: the bytes it sent before, or `None` if it never closed.
async fn until_closed(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read_all = async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(BOUND, read_all).await.ok()?;
    Some(got)
}

/// One HTTP/1.1 response: (status, headers lower-cased, body).
async fn response(s: &mut TcpStream) -> (u16, String, String) {
    let read = async {
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
                    return (status, head, body.into_owned());
                }
            }
            let n = s.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "closed mid-response: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(BOUND, read)
        .await
        .expect("no response")
}

async fn healthz(s: &mut TcpStream) -> u16 {
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    response(s).await.0
}

#[tokio::test]
async fn half_a_request_head_is_closed_after_the_header_timeout() {
    let s = start(limits(Duration::from_millis(200), LONG, LONG)).await;
    let mut half = connect(s.http).await;
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        .await
        .unwrap();
    let mut silent = connect(s.http).await;
    for conn in [&mut half, &mut silent] {
        let sent = until_closed(conn)
            .await
            .expect("a connection without a complete head was never closed");
        assert!(sent.is_empty(), "closed without an answer");
    }
    // Meanwhile a whole request is served.
    let mut whole = connect(s.http).await;
    assert_eq!(healthz(&mut whole).await, 200);
}

#[tokio::test]
async fn a_kept_alive_connection_may_idle_past_the_header_timeout() {
    // hyper's own header timeout would run from the moment the connection
    // went idle and close it here.
    let s = start(limits(Duration::from_millis(100), LONG, LONG)).await;
    let mut c = connect(s.http).await;
    assert_eq!(healthz(&mut c).await, 200);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(healthz(&mut c).await, 200, "the idle connection was closed");
    // And the next head, once begun, has the header timeout again.
    c.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    assert!(until_closed(&mut c).await.is_some());
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let s = start(limits(LONG, Duration::from_millis(200), LONG)).await;
    let mut c = connect(s.http).await;
    assert_eq!(healthz(&mut c).await, 200);
    let sent = until_closed(&mut c)
        .await
        .expect("the idle connection was never closed");
    assert!(sent.is_empty());
}

/// Sends the head of a POST to `path` with a 1000-byte body and its
/// first byte, then one more byte every 20 ms (the whole body would take
/// 20 s): everything the server sent until it closed the connection, or
/// `None` if it did not within [`BOUND`].
async fn trickle(addr: SocketAddr, path: &str) -> Option<String> {
    let (mut rx, mut tx) = connect(addr).await.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    );
    tx.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        for _ in 0..999 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if tx.write_all(b" ").await.is_err() {
                return;
            }
        }
    });
    let mut got = Vec::new();
    let read = tokio::time::timeout(BOUND, async {
        let mut buf = [0u8; 4096];
        loop {
            match rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    writer.abort();
    read.ok()?;
    Some(String::from_utf8_lossy(&got).into_owned())
}

/// The status and JSON body of a raw HTTP/1.1 answer.
fn parse(answer: &str) -> (u16, Value) {
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head[9..12].parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_body_that_trickles_is_answered_408_and_its_connection_closed() {
    let s = start(limits(LONG, LONG, Duration::from_millis(300))).await;
    // `/v1/request` reads its body itself; `/json` through axum's
    // extractor, whose failure the port replaces: the same answer.
    for path in ["/v1/request", "/json"] {
        let answer = trickle(s.http, path)
            .await
            .unwrap_or_else(|| panic!("{path}: a trickling body was never cut off"));
        let (status, body) = parse(&answer);
        assert_eq!(status, 408, "{path}: {answer}");
        assert_eq!(body["error"]["reason"], "body_timeout", "{path}: {answer}");
        assert_eq!(body["error"]["code"], 4, "DEADLINE_EXCEEDED: {answer}");
        assert!(
            answer.to_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
    // A body that arrives in time is served as before.
    let mut c = connect(s.http).await;
    let body = r#"{"namespace":"app","resource":"api","domain":"d","hits":1}"#;
    let req = format!(
        "POST /v1/request HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let (status, _, text) = response(&mut c).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn the_http_cap_closes_one_more_connection_at_once_and_admits_again_after_one_closes() {
    let s = start(ConnectionLimits {
        max_connections: 2,
        ..limits(LONG, LONG, LONG)
    })
    .await;
    let mut first = connect(s.http).await;
    let mut second = connect(s.http).await;
    // Both admitted: each is served.
    assert_eq!(healthz(&mut first).await, 200);
    assert_eq!(healthz(&mut second).await, 200);
    let mut third = connect(s.http).await;
    let sent = until_closed(&mut third)
        .await
        .expect("a connection beyond the cap was held open");
    assert!(sent.is_empty());
    drop(first);
    // Once the server has seen the first one close, there is room again.
    let mut admitted = false;
    for _ in 0..100 {
        let mut next = connect(s.http).await;
        if next
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .is_ok()
        {
            let mut buf = [0u8; 12];
            if let Ok(Ok(_)) = tokio::time::timeout(BOUND, next.read_exact(&mut buf)).await {
                assert_eq!(&buf, b"HTTP/1.1 200");
                admitted = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(admitted, "no connection was admitted after one closed");
    assert_eq!(
        healthz(&mut second).await,
        200,
        "the admitted one still works"
    );
}

#[tokio::test]
async fn the_grpc_port_closes_a_connection_without_the_http2_preface_after_the_header_timeout() {
    let s = start(limits(Duration::from_millis(200), LONG, LONG)).await;
    let mut silent = connect(s.grpc).await;
    let mut half = connect(s.grpc).await;
    half.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    for conn in [&mut silent, &mut half] {
        assert!(
            until_closed(conn).await.is_some(),
            "a gRPC connection without a preface was never closed"
        );
    }
    // A client that speaks HTTP/2 is served.
    let mut client = s.native().await;
    client.request(rate(1)).await.unwrap();
}

fn rate(hits: u64) -> v1::RateRequest {
    v1::RateRequest {
        namespace: "app".into(),
        resource: "api".into(),
        domain: "d".into(),
        hits: Some(hits),
        min_hits: Some(hits),
        mode: v1::Mode::Try as i32,
        limit: None,
    }
}

#[tokio::test]
async fn the_grpc_cap_closes_one_more_connection_at_once_and_admits_again_after_one_closes() {
    let s = start(ConnectionLimits {
        max_connections: 1,
        ..limits(LONG, LONG, LONG)
    })
    .await;
    let first = connect(s.grpc).await;
    let mut second = connect(s.grpc).await;
    let sent = until_closed(&mut second)
        .await
        .expect("a gRPC connection beyond the cap was held open");
    assert!(sent.is_empty());
    drop(first);
    let mut served = false;
    for _ in 0..100 {
        if let Ok(mut client) =
            tollgate_proto::v1::tollgate_client::TollgateClient::connect(s.grpc_url()).await
        {
            if client.request(rate(1)).await.is_ok() {
                served = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "no gRPC connection was admitted after one closed");
}

#[tokio::test]
async fn a_grpc_session_survives_idling_past_every_http_timeout() {
    let short = Duration::from_millis(100);
    let options = ServerOptions {
        connection_limits: limits(short, short, short),
        // Pings flow while the session idles; answering them is all a
        // client needs to do to stay.
        keepalive_interval: short,
        ..ServerOptions::default()
    };
    let s = TestServer::start_with(CONFIG, Default::default(), options).await;
    let mut client = s.native().await;
    let (tx, rx) = mpsc::channel(8);
    let mut answers = client
        .session(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let reserve = |id| v1::SessionRequest {
        id,
        op: Some(Op::Reserve(v1::ReserveRequest {
            namespace: "app".into(),
            resource: "pool".into(),
            domain: "d".into(),
            copies: 1,
            min_copies: Some(1),
            lease_ms: None,
        })),
    };
    for id in 1..=2 {
        tx.send(reserve(id)).await.unwrap();
        let answer = answers.next().await.unwrap().unwrap();
        match answer.result {
            Some(Answer::Reserve(r)) => assert_eq!(r.granted, 1),
            other => panic!("expected a reservation, got {other:?}"),
        }
        // Ten times every HTTP deadline, and many pings.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(common::holds(&s.app, "app", "pool", "d").await.0, 2);
    assert_eq!(s.app.sessions().len(), 1);
}

#[tokio::test]
async fn shutdown_closes_idle_connections_at_once_and_finishes_a_request_in_flight() {
    let options = ServerOptions {
        connection_limits: limits(LONG, LONG, LONG),
        shutdown_grace: LONG,
        ..ServerOptions::default()
    };
    let s = TestServer::start_with(CONFIG, Default::default(), options).await;
    let mut idle = connect(s.http).await;
    assert_eq!(healthz(&mut idle).await, 200);
    let mut busy = connect(s.http).await;
    let body = r#"{"namespace":"app","resource":"api","domain":"d","hits":1}"#;
    let head = format!(
        "POST /v1/request HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    busy.write_all(head.as_bytes()).await.unwrap();
    busy.write_all(&body.as_bytes()[..10]).await.unwrap();
    let app = std::sync::Arc::clone(&s.app);
    let http = s.http;
    let stopping = tokio::spawn(s.stop());
    eventually("shutdown begins", || app.is_stopping()).await;
    // The idle connection is closed without waiting for the grace period.
    assert!(until_closed(&mut idle).await.is_some());
    // The port is closed to new connections.
    eventually("the port closes", || {
        std::net::TcpStream::connect(http).is_err()
    })
    .await;
    // The request in flight is finished, then its connection closed.
    busy.write_all(&body.as_bytes()[10..]).await.unwrap();
    let (status, _, text) = response(&mut busy).await;
    assert_eq!(status, 200, "{text}");
    tokio::time::timeout(BOUND, stopping)
        .await
        .expect("shutdown waited for the grace period")
        .unwrap();
}

/// An HTTP/2 frame: type, flags, stream, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed_though_it_pings_and_never_acks_the_goaway_ping() {
    let s = start(limits(LONG, Duration::from_millis(200), LONG)).await;
    let (mut rx, mut tx) = connect(s.http).await.into_split();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(4, 0, 0, &[])); // SETTINGS
                                       // GET http /healthz: HPACK `:method GET`, `:scheme http`, `:path`
                                       // (name from the static table) `/healthz`.
    let mut headers = vec![0x82, 0x86, 0x44, 8];
    headers.extend_from_slice(b"/healthz");
    hello.extend(frame(1, 0x5, 1, &headers)); // HEADERS, END_STREAM | END_HEADERS
    tx.write_all(&hello).await.unwrap();
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match rx.read(&mut buf).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    });
    // Pings (which the server answers) are no request: they must not keep
    // the connection open. The server's own pings are never answered.
    let pinging = async {
        while !reader.is_finished() {
            if tx.write_all(&frame(6, 0, 0, b"12345678")).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(BOUND, pinging)
        .await
        .expect("an idle HTTP/2 connection was kept open");
    let got = reader.await.unwrap();
    // Frame types the server sent, in order.
    let mut kinds = Vec::new();
    let mut at = 0;
    while at + 9 <= got.len() {
        let len =
            usize::from(got[at]) << 16 | usize::from(got[at + 1]) << 8 | usize::from(got[at + 2]);
        kinds.push(got[at + 3]);
        at += 9 + len;
    }
    assert!(kinds.contains(&1), "the request was answered: {kinds:?}");
    assert!(kinds.contains(&7), "closed with a GOAWAY: {kinds:?}");
}
