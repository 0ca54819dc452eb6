//! A blocking HTTP/1.1 client over a raw socket: sends exactly the bytes
//! it is given, so a case can send what no HTTP library would, and reads
//! whatever comes back within [`BOUND`].

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Instant;

use serde_json::Value;

use crate::BOUND;

/// One response as received.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The head, header names and values lower-cased.
    pub head: String,
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// A header's value (`name` lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            (n.trim() == name).then(|| v.trim())
        })
    }

    /// Panics unless the body is the API's error shape,
    /// `{"error": {"code", "reason", "message"}}`, with a numeric code and
    /// a non-empty reason and message; returns the reason.
    pub fn error_reason(&self, what: &str) -> String {
        let v = self.json().unwrap_or_else(|| {
            panic!(
                "{what}: {} without a JSON body: {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        });
        let e = &v["error"];
        assert!(e["code"].is_i64(), "{what}: no numeric error.code in {v}");
        let reason = e["reason"].as_str().unwrap_or_default();
        assert!(
            !reason.is_empty() && reason.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{what}: error.reason {reason:?} is not a stable label, in {v}"
        );
        let message = e["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "{what}: empty error.message in {v}");
        reason.to_owned()
    }
}

/// What came back for a request.
#[derive(Debug)]
pub enum Outcome {
    /// A whole response (a `100 Continue` is skipped).
    Answered(Answer),
    /// The server closed the connection without a whole response; what it
    /// sent before (usually nothing).
    Closed(Vec<u8>),
}

/// Sends `bytes` on a new connection and reads the first whole response,
/// or until the server closes. Panics if neither happens within
/// [`BOUND`]: the server hung on the input.
pub fn send(addr: SocketAddr, bytes: &[u8]) -> Outcome {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    s.set_read_timeout(Some(BOUND)).unwrap();
    s.set_write_timeout(Some(BOUND)).unwrap();
    // The server may answer (413, 400) and close before reading all of a
    // large input: a failed write is not the outcome, what is read is.
    let _ = s.write_all(bytes);
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(answer) = parse(&got) {
            return Outcome::Answered(answer);
        }
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!(
                    "the server neither answered nor closed within {BOUND:?} of {} bytes \
                     starting {:?}; got {:?}",
                    bytes.len(),
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)]),
                    String::from_utf8_lossy(&got)
                )
            }
            // A reset after an answer we could not read in full.
            Err(_) => break,
        }
        assert!(started.elapsed() < BOUND * 2, "no end to the answer");
    }
    let _ = s.shutdown(Shutdown::Both);
    // A response without a length ends with the connection.
    match parse_until_close(&got) {
        Some(answer) => Outcome::Answered(answer),
        None => Outcome::Closed(got),
    }
}

/// A well-formed request: `method path` with `body`, closing after it.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Answer {
    let mut bytes = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    match send(addr, &bytes) {
        Outcome::Answered(a) => a,
        Outcome::Closed(got) => panic!(
            "{method} {path}: closed without an answer (got {:?})",
            String::from_utf8_lossy(&got)
        ),
    }
}

/// `POST path` with a JSON body.
pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Answer {
    request(addr, "POST", path, body.to_string().as_bytes())
}

/// Panics unless the server answers `GET /healthz` with 200.
pub fn alive(addr: SocketAddr, after: &str) {
    let a = request(addr, "GET", "/healthz", b"");
    assert_eq!(
        a.status, 200,
        "the server no longer answers after {after}: {a:?}"
    );
}

/// The head's end, if it has arrived.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

/// A whole response at the start of `buf` (skipping `100 Continue`s), if
/// one has arrived and its length is known (`Content-Length` or chunked).
fn parse(buf: &[u8]) -> Option<Answer> {
    let end = head_end(buf)?;
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    let status: u16 = head.get(9..12)?.parse().ok()?;
    let rest = &buf[end + 4..];
    if status == 100 {
        return parse(rest);
    }
    let answer = |body: Vec<u8>| Answer {
        status,
        head: head.clone(),
        body,
    };
    if let Some(len) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return (rest.len() >= len).then(|| answer(rest[..len].to_vec()));
    }
    if head.contains("transfer-encoding: chunked") {
        return dechunk(rest).map(answer);
    }
    None
}

/// A response whose body runs to the end of the connection.
fn parse_until_close(buf: &[u8]) -> Option<Answer> {
    if let Some(a) = parse(buf) {
        return Some(a);
    }
    let end = head_end(buf)?;
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    let status: u16 = head.get(9..12)?.parse().ok()?;
    Some(Answer {
        status,
        head,
        body: buf[end + 4..].to_vec(),
    })
}

/// A whole chunked body, if it has all arrived.
fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..line]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line + 2..];
        if size == 0 {
            return Some(body);
        }
        if rest.len() < size + 2 {
            return None;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
