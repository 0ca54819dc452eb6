//! The HTTP port: JSON bodies of every endpoint, mutated field by field
//! and byte by byte, and request heads no client library would send.

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::raw::{self, Answer, Outcome};
use crate::{Harness, Shown};

/// An endpoint that reads a body.
#[derive(Clone, Copy, Debug)]
enum Endpoint {
    Request,
    Reserve,
    Release,
    Transfer,
    Seize,
    Renew,
    Json,
}

/// Live ids a case's bodies may name: a hold of the pool (2 copies of
/// `acme`) and a staged transfer of one more.
struct Ids {
    hold: String,
    transfer: String,
}

impl Endpoint {
    /// The path and a valid body, and the places in it a case may change
    /// (JSON pointers).
    fn template(self, ids: &Ids) -> (String, Value, &'static [&'static str]) {
        match self {
            Endpoint::Request => (
                "/v1/request".into(),
                json!({"namespace": "app", "resource": "api", "domain": "acme", "hits": 1, "min_hits": 1, "mode": "try"}),
                &[
                    "/namespace",
                    "/resource",
                    "/domain",
                    "/hits",
                    "/min_hits",
                    "/mode",
                ],
            ),
            Endpoint::Reserve => (
                "/v1/reserve".into(),
                json!({"namespace": "app", "resource": "pool", "domain": "acme", "copies": 1, "min_copies": 1, "lease_ms": 60_000}),
                &[
                    "/namespace",
                    "/resource",
                    "/domain",
                    "/copies",
                    "/min_copies",
                    "/lease_ms",
                ],
            ),
            Endpoint::Release => (
                "/v1/release".into(),
                json!({"hold_id": ids.hold, "namespace": "app", "resource": "pool", "domain": "acme", "copies": 1, "groups": ["big"]}),
                &[
                    "/hold_id",
                    "/namespace",
                    "/resource",
                    "/domain",
                    "/copies",
                    "/groups",
                    "/groups/0",
                ],
            ),
            Endpoint::Transfer => (
                "/v1/transfer".into(),
                json!({"hold_id": ids.hold, "namespace": "app", "resource": "pool", "domain": "acme", "copies": 1, "groups": [], "ttl_ms": 60_000}),
                &[
                    "/hold_id",
                    "/namespace",
                    "/resource",
                    "/domain",
                    "/copies",
                    "/groups",
                    "/ttl_ms",
                ],
            ),
            Endpoint::Seize => (
                "/v1/seize".into(),
                json!({"transfer_id": ids.transfer, "lease_ms": 60_000}),
                &["/transfer_id", "/lease_ms"],
            ),
            Endpoint::Renew => (
                format!("/v1/holds/{}/renew", ids.hold),
                json!({"lease_ms": 60_000}),
                &["/lease_ms"],
            ),
            Endpoint::Json => (
                "/json".into(),
                json!({"domain": "shop", "descriptors": [{"entries": [{"key": "user", "value": "u1"}, {"key": "plan", "value": "free"}], "hitsAddend": 1}], "hitsAddend": 1}),
                &[
                    "/domain",
                    "/descriptors",
                    "/descriptors/0",
                    "/descriptors/0/entries",
                    "/descriptors/0/entries/0",
                    "/descriptors/0/entries/0/key",
                    "/descriptors/0/entries/1/value",
                    "/descriptors/0/hitsAddend",
                    "/descriptors/0/limit",
                    "/descriptors/0/isNegativeHits",
                    "/hitsAddend",
                    "/hits_addend",
                ],
            ),
        }
    }
}

/// A value a stranger might put anywhere.
#[derive(Clone, Debug)]
enum Hostile {
    /// Any JSON value.
    Json(Value),
    /// Text spliced in as is: numbers JSON allows but no field fits,
    /// things JSON does not allow, deep nesting, long strings.
    Raw(String),
}

fn names() -> impl Strategy<Value = Value> {
    prop::sample::select(vec![
        "app", "open", "shop", "api", "exact", "bucket", "queue", "tiers", "pool", "known", "nope",
        "acme", "globex", "big", "try", "acquire", "user", "plan", "free", "closed", "path",
    ])
    .prop_map(Value::from)
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let json = prop_oneof![
        Just(json!(u64::MAX)),
        Just(json!(u64::MAX - 1)),
        Just(json!(u64::from(u32::MAX) + 1)),
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(2)),
        Just(json!(-1)),
        Just(json!(i64::MIN)),
        Just(json!(1.5)),
        Just(json!(1e300)),
        Just(json!(-0.0)),
        Just(Value::Null),
        Just(json!(true)),
        Just(json!([])),
        Just(json!({})),
        Just(json!({"a": {"b": [1, "x", null]}})),
        Just(json!("")),
        Just(json!("1")),
        Just(json!("-1")),
        names(),
        prop::collection::vec(names(), 0..5).prop_map(Value::from),
        "\\PC{0,24}".prop_map(Value::from),
        "[\\x00-\\x1f\\x7f\\u{202e}\\u{feff}]{1,12}".prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
    ]
    .prop_map(Hostile::Json);
    let raw = prop_oneof![
        prop::sample::select(vec![
            "18446744073709551616",
            "-18446744073709551617",
            "99999999999999999999999999999999",
            "-0",
            "1e400",
            "-1e400",
            "1E2",
            "0.0000000000000000000001",
            "00",
            "0x10",
            "NaN",
            "Infinity",
            "undefined",
            "'single'",
            "\"\\ud800\"",
            "\"\\u0000\"",
            "\"\\x41\"",
            "\"unterminated",
            "tru",
            "[1,]",
            "{\"a\":1,}",
        ])
        .prop_map(String::from),
        // Nesting past serde_json's recursion limit (128), and far past.
        (1usize..3000).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d))),
        (1usize..3000).prop_map(|d| format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d))),
        // Strings up to past the body limit (64 KiB).
        (
            0usize..70_000,
            prop::sample::select(vec!['x', 'é', '\u{1F600}'])
        )
            .prop_map(|(n, c)| format!("\"{}\"", c.to_string().repeat(n / c.len_utf8()))),
    ]
    .prop_map(Hostile::Raw);
    prop_oneof![3 => json, 1 => raw]
}

/// One change to a body.
#[derive(Clone, Debug)]
enum Edit {
    /// Sets the `i`-th changeable place.
    Set(usize, Hostile),
    /// Removes the `i`-th changeable place.
    Remove(usize),
    /// Adds a field the message does not have.
    Unknown(String, Hostile),
    /// Writes a top-level field twice.
    Duplicate(usize, Hostile),
    /// Repeats the first element of the `i`-th place, if a list, `n` times.
    Repeat(usize, usize),
    /// Replaces the whole body.
    Whole(Hostile),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        6 => (any::<usize>(), hostile()).prop_map(|(i, h)| Edit::Set(i, h)),
        2 => any::<usize>().prop_map(Edit::Remove),
        1 => ("[a-z_]{1,12}|\\PC{1,8}", hostile()).prop_map(|(k, h)| Edit::Unknown(k, h)),
        1 => (any::<usize>(), hostile()).prop_map(|(i, h)| Edit::Duplicate(i, h)),
        1 => (any::<usize>(), 0usize..3000).prop_map(|(i, n)| Edit::Repeat(i, n)),
        1 => hostile().prop_map(Edit::Whole),
    ]
}

/// A change to the bytes of the encoded body.
#[derive(Clone, Debug)]
enum ByteEdit {
    Overwrite(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Overwrite(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        any::<usize>().prop_map(ByteEdit::Delete),
        any::<usize>().prop_map(ByteEdit::Truncate),
    ]
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    prop::sample::select(vec![
        Endpoint::Request,
        Endpoint::Reserve,
        Endpoint::Release,
        Endpoint::Transfer,
        Endpoint::Seize,
        Endpoint::Renew,
        Endpoint::Json,
    ])
}

/// The body `edits` make of `template`, then `bytes` applied to it.
fn body(template: Value, places: &[&str], edits: &[Edit], bytes: &[ByteEdit]) -> Vec<u8> {
    let mut v = template;
    let mut raws: Vec<String> = Vec::new();
    // A raw value goes in as a placeholder string, replaced once encoded.
    let mut value_of = |h: &Hostile| match h {
        Hostile::Json(j) => j.clone(),
        Hostile::Raw(text) => {
            raws.push(text.clone());
            Value::from(format!("@@raw{}@@", raws.len() - 1))
        }
    };
    let mut duplicates = Vec::new();
    let mut whole = None;
    for e in edits {
        match e {
            Edit::Set(i, h) => {
                let place = places[i % places.len()];
                let new = value_of(h);
                set(&mut v, place, new);
            }
            Edit::Remove(i) => {
                let place = places[i % places.len()];
                remove(&mut v, place);
            }
            Edit::Unknown(k, h) => {
                let new = value_of(h);
                if let Some(m) = v.as_object_mut() {
                    m.insert(k.clone(), new);
                }
            }
            Edit::Duplicate(i, h) => {
                let place = places[i % places.len()];
                let key = place
                    .trim_start_matches('/')
                    .split('/')
                    .next()
                    .unwrap_or("");
                duplicates.push((key.to_owned(), value_of(h)));
            }
            Edit::Repeat(i, n) => {
                let place = places[i % places.len()];
                if let Some(Value::Array(items)) = v.pointer_mut(place) {
                    if let Some(first) = items.first().cloned() {
                        items.extend(std::iter::repeat_n(first, *n));
                    }
                }
            }
            Edit::Whole(h) => whole = Some(value_of(h)),
        }
    }
    let mut text = match whole {
        Some(w) => w.to_string(),
        None => v.to_string(),
    };
    for (key, value) in duplicates {
        if text.ends_with('}') && text.len() > 2 {
            text.pop();
            text.push_str(&format!(",{}:{}}}", Value::from(key), value));
        }
    }
    for (i, raw) in raws.iter().enumerate() {
        text = text.replacen(&format!("\"@@raw{i}@@\""), raw, 1);
    }
    let mut out = text.into_bytes();
    for b in bytes {
        let len = out.len();
        match *b {
            ByteEdit::Overwrite(i, byte) if len > 0 => out[i % len] = byte,
            ByteEdit::Insert(i, byte) => out.insert(i % (len + 1), byte),
            ByteEdit::Delete(i) if len > 0 => {
                out.remove(i % len);
            }
            ByteEdit::Truncate(i) => out.truncate(i % (len + 1)),
            _ => {}
        }
    }
    out
}

/// Sets the value at `pointer`, creating a missing last field.
fn set(v: &mut Value, pointer: &str, new: Value) {
    if let Some(slot) = v.pointer_mut(pointer) {
        *slot = new;
        return;
    }
    let (parent, last) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    if let Some(Value::Object(m)) = v.pointer_mut(parent) {
        m.insert(last.to_owned(), new);
    }
}

fn remove(v: &mut Value, pointer: &str) {
    let (parent, last) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    match v.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.remove(last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
}

/// Panics unless `a` is an answer a client can act on: a success or a
/// limiting answer as JSON, or the API's error shape with a 4xx; and no
/// larger than what provoked it, give or take a normal answer's size.
fn check_answer(what: &str, sent: usize, a: &Answer) {
    match a.status {
        200 => assert!(
            a.json().is_some_and(|v| v.is_object()),
            "{what}: 200 without a JSON object: {a:?}"
        ),
        429 => {
            let v = a
                .json()
                .unwrap_or_else(|| panic!("{what}: 429 without JSON: {a:?}"));
            if v.get("error").is_some() {
                let reason = a.error_reason(what);
                assert!(
                    [
                        "too_many_sessions",
                        "store_at_capacity",
                        "too_many_transfers"
                    ]
                    .contains(&reason.as_str()),
                    "{what}: a 429 refusal for {reason}"
                );
            } else {
                // Limited: a rate, reserve or RLS answer saying no.
                assert!(
                    v["allowed"] == false || v["overallCode"] == "OVER_LIMIT",
                    "{what}: a 429 that says neither no nor why: {v}"
                );
            }
        }
        400 | 404 | 405 | 409 | 413 => {
            a.error_reason(what);
            // The message is cut to a bound (and JSON escapes a control
            // character in at most six bytes).
            assert!(
                a.body.len() <= 6 * tollgate_server::errors::MAX_MESSAGE_BYTES + 256,
                "{what}: a {}-byte error",
                a.body.len()
            );
        }
        s => panic!(
            "{what}: status {s}, which no input should cause: {:?}",
            String::from_utf8_lossy(&a.body)
        ),
    }
    let allowed = 4096usize.max(2 * sent);
    assert!(
        a.body.len() <= allowed,
        "{what}: a {}-byte answer to a {sent}-byte body",
        a.body.len()
    );
}

/// An answer's status and, for an error, its reason.
fn outcome(a: &Answer) -> String {
    match a
        .json()
        .as_ref()
        .and_then(|v| v["error"]["reason"].as_str().map(str::to_owned))
    {
        Some(reason) => format!("{} {reason}", a.status),
        None => a.status.to_string(),
    }
}

/// A fresh hold of 2 copies and a transfer of one more, for a case's
/// bodies to name.
fn ids(h: &Harness) -> Ids {
    let (hold, transfer) = h.hold_and_transfer(3);
    Ids { hold, transfer }
}

/// Every endpoint's JSON body, with fields set to hostile values (huge,
/// negative, fractional, wrong types, unicode and control characters,
/// deep nesting, long strings, unknown and duplicated fields) and bytes
/// overwritten, inserted, deleted or cut off. Each answer is a success, a
/// limiting answer or the JSON error shape with a 4xx; the server answers
/// afterwards; and once every lease and transfer ended, no copy is left
/// counted.
#[test]
fn json_bodies_of_every_endpoint() {
    let h = Harness::default_limits();
    let strategy = (
        endpoint(),
        prop::collection::vec(edit(), 0..4),
        prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(byte_edit(), 1..4)],
    );
    let tally = crate::Tally::default();
    crate::runner(file!())
        .run(
            &strategy.prop_map(Shown),
            |Shown((endpoint, edits, bytes))| {
                let ids = ids(&h);
                let (path, template, places) = endpoint.template(&ids);
                let body = body(template, places, &edits, &bytes);
                let what = format!(
                    "{path} with {:?}",
                    String::from_utf8_lossy(&body[..body.len().min(300)])
                );
                let a = raw::request(h.server.http, "POST", &path, &body);
                check_answer(&what, body.len(), &a);
                tally.add(outcome(&a));
                raw::alive(h.server.http, &what);
                h.settle(&what);
                Ok(())
            },
        )
        .unwrap();
    tally.print("HTTP JSON bodies");
}

/// A part of a request head.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "GET", "POST", "DELETE", "PUT", "get", "CONNECT", "OPTIONS", "TRACE", "PRI", "",
        ])
        .prop_map(String::from),
        "[A-Z]{1,12}",
        "\\PC{1,16}",
        (1usize..20_000).prop_map(|n| "M".repeat(n)),
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "/v1/request",
            "/v1/reserve",
            "/json",
            "/healthz",
            "/status",
            "/metrics",
            "/v1/config",
            "/v1/holds/0123456789abcdef0123456789abcdef/renew",
            "/v1/holds//renew",
            "/v1/holds/%00%ff/renew",
            "/v1/holds/..%2f..%2f/renew",
            "*",
            "http://t/v1/request",
            "//",
            "/%",
            "/%zz",
            "",
            "/v1/request?x=1&x=2",
        ])
        .prop_map(String::from),
        "/[\\x21-\\x7e]{0,40}",
        "/\\PC{0,20}",
        (1usize..100_000).prop_map(|n| format!("/{}", "a".repeat(n))),
        (1usize..300).prop_map(|n| format!("/v1/holds/{}/renew", "%41".repeat(n))),
    ]
}

fn version() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "HTTP/1.1",
        "HTTP/1.0",
        "HTTP/2.0",
        "HTTP/0.9",
        "HTTP/9.9",
        "HTTP/1.1x",
        "http/1.1",
        "",
        "HTTP/1.1 extra",
    ])
    .prop_map(String::from)
}

fn header() -> impl Strategy<Value = (String, String)> {
    let name = prop_oneof![
        prop::sample::select(vec![
            "Content-Length",
            "Transfer-Encoding",
            "Host",
            "Connection",
            "Expect",
            "Upgrade",
            "Content-Type",
            "Authorization",
            "HTTP2-Settings",
            "TE",
            "Trailer",
        ])
        .prop_map(String::from),
        "[A-Za-z-]{1,20}",
        "[\\x00-\\x7f]{1,10}",
        (1usize..70_000).prop_map(|n| "X".repeat(n)),
    ];
    let value = prop_oneof![
        prop::sample::select(vec![
            "0",
            "-1",
            "1",
            "abc",
            "99999999999999999999",
            "18446744073709551615",
            "1, 2",
            "5 5",
            "chunked",
            "gzip",
            "chunked, gzip",
            "gzip, chunked",
            "identity",
            "100-continue",
            "close",
            "upgrade",
            "h2c",
            "keep-alive",
            "application/json",
            "text/plain; charset=latin1",
            "Bearer x",
            "",
        ])
        .prop_map(String::from),
        "\\PC{0,20}",
        "[\\x00-\\x1f\\x7f]{1,5}",
        (1usize..500_000).prop_map(|n| "v".repeat(n)),
    ];
    (name, value)
}

fn chunked_body() -> impl Strategy<Value = Vec<u8>> {
    let chunk = prop_oneof![
        prop::sample::select(vec![
            "0\r\n\r\n",
            "5\r\nhello\r\n",
            "zz\r\n",
            "ffffffffffffffffff\r\n",
            "-1\r\n",
            "5\r\nhel",
            "3;ext=1\r\nabc\r\n",
            "0\r\nTrailer: x\r\n\r\n",
            "\r\n",
            "1\nx\n",
            "10000000\r\n",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..64),
    ];
    prop::collection::vec(chunk, 0..6).prop_map(|cs| cs.concat())
}

/// A whole raw input for the HTTP port.
fn raw_input() -> impl Strategy<Value = Vec<u8>> {
    let head = (
        token(),
        path(),
        version(),
        prop::collection::vec(header(), 0..6),
        (0usize..3000, any::<bool>()),
        prop_oneof![
            Just(b"{\"namespace\":\"app\",\"resource\":\"api\",\"domain\":\"acme\"}".to_vec()),
            prop::collection::vec(any::<u8>(), 0..200),
            chunked_body(),
        ],
        prop::sample::select(vec!["\r\n", "\n", "\r", "\r\n\r\n"]),
    )
        .prop_map(
            |(method, path, version, headers, (many, close), body, eol)| {
                let mut out = format!("{method} {path} {version}{eol}").into_bytes();
                for (k, v) in headers {
                    out.extend_from_slice(format!("{k}: {v}{eol}").as_bytes());
                }
                // Many small headers (hyper allows 100).
                for i in 0..many {
                    out.extend_from_slice(format!("X-{i}: {i}{eol}").as_bytes());
                }
                if close {
                    out.extend_from_slice(format!("Connection: close{eol}").as_bytes());
                }
                out.extend_from_slice(eol.as_bytes());
                out.extend_from_slice(&body);
                out
            },
        );
    prop_oneof![
        6 => head,
        1 => prop::collection::vec(any::<u8>(), 0..2000),
        // An HTTP/2 client (prior knowledge) that then sends junk frames.
        1 => prop::collection::vec(any::<u8>(), 0..2000).prop_map(|junk| {
            let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            out.extend_from_slice(&junk);
            out
        }),
    ]
}

/// Request heads no client library would send: malformed request lines,
/// huge methods, paths and headers, many headers, control characters,
/// conflicting, negative and enormous lengths, chunked bodies with
/// garbage sizes, bare line feeds, random bytes, an HTTP/2 preface
/// followed by junk. Each is answered with a 2xx or 4xx (the API's error
/// shape whenever it reached the router) or closed, within a bound; the
/// server answers afterwards.
#[test]
fn raw_request_heads() {
    let h = Harness::default_limits();
    let tally = crate::Tally::default();
    crate::runner(file!())
        .run(&raw_input().prop_map(Shown), |Shown(bytes)| {
            let what = format!(
                "{:?}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            );
            let got = raw::send(h.server.http, &bytes);
            tally.add(match &got {
                Outcome::Answered(a) => outcome(a),
                Outcome::Closed(_) => "closed".into(),
            });
            match got {
                Outcome::Answered(a) => {
                    let routed = a.header("content-type") == Some("application/json");
                    match a.status {
                        200..=299 => {}
                        // hyper's own answers to heads it cannot read:
                        // a status and no body, then the connection closes.
                        400 | 408 | 413 | 414 | 431 | 501 | 505 if !routed => {}
                        400..=499 => {
                            a.error_reason(&what);
                        }
                        s => panic!("{what}: answered {s}: {a:?}"),
                    }
                }
                // A head the server could not read, or did not finish in
                // time: closed, which is all it can do.
                Outcome::Closed(_) => {}
            }
            raw::alive(h.server.http, &what);
            Ok(())
        })
        .unwrap();
    h.settle("raw request heads");
    tally.print("HTTP request heads");
}
