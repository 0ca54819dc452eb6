#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The follower (`client`) against this crate's real API on a free
//! loopback port, over a real SQLite file: the deltas the API writes are
//! the ones the follower reads, with the same structs, and each change is
//! handed to the caller as a config text. No server is needed: the
//! caller's install step is a channel here.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tollgate_configapi::client::{ConfigText, FetchError, FirstError, Follower, TokenSource};
use tollgate_configapi::http::Api;
use tollgate_configapi::{Db, Tokens};
use tollgate_core::{ManualClock, Nanos};

const ADMIN: &str = "admin-token-0123456789abcdef";
const READ: &str = "read-token-0123456789abcdef";

/// A directory of its own for one test.
fn dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tg-follow-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The API over a new SQLite file in `dir`, on a free port: its base URL.
async fn start_api(dir: &std::path::Path) -> String {
    let url = format!("sqlite://{}", dir.join("config.db").display());
    // A clock that stands still: the API's rate limit never refills, and
    // its bucket is far larger than this test's requests.
    let clock = Arc::new(ManualClock::new(Nanos::from_secs(1_700_000_000)));
    let db = Db::connect(&url, clock).await.unwrap();
    let tokens = Tokens::parse(&format!("admin:alice:{ADMIN}\nread:fleet:{READ}\n")).unwrap();
    let api = Api::new(db, tokens, 1000, 1000).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = api.router(Vec::new());
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

/// A write with the admin token: the revision it made.
async fn write(base: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> i64 {
    let mut request = reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let answer = request.send().await.unwrap();
    assert!(answer.status().is_success(), "{path}: {}", answer.status());
    let answer: Value = serde_json::from_str(&answer.text().await.unwrap()).unwrap();
    answer["revision"].as_i64().unwrap()
}

/// The resources of namespace `ns` in a config text, by name.
fn resources(text: &ConfigText, ns: &str) -> Vec<String> {
    let doc: Value = serde_json::from_str(&text.text).unwrap();
    let namespaces = doc["namespaces"].as_array().unwrap();
    let Some(ns) = namespaces.iter().find(|n| n["name"] == ns) else {
        return Vec::new();
    };
    ns["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The next config text handed over at `revision` (earlier ones skipped),
/// within a generous bound.
async fn handed(rx: &mut mpsc::UnboundedReceiver<ConfigText>, revision: i64) -> ConfigText {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let text = rx.recv().await.expect("the follower stopped");
            if text.revision >= revision {
                return text;
            }
        }
    })
    .await
    .expect("the follower never handed the revision over")
}

/// Namespace `shop` with an unlimited resource `api`: the revision.
async fn shop_with_api(base: &str) -> i64 {
    write(
        base,
        reqwest::Method::PUT,
        "/v1/namespaces/shop",
        Some(json!({})),
    )
    .await;
    write(
        base,
        reqwest::Method::PUT,
        "/v1/namespaces/shop/resources/api",
        Some(json!({"algorithm": "unlimited"})),
    )
    .await
}

/// A follower of `base` with the read token, in a file in `dir`.
fn reader(dir: &std::path::Path, base: &str) -> Follower {
    let token = dir.join("read-token");
    std::fs::write(&token, format!("{READ}\n")).unwrap();
    Follower::new(base, TokenSource::file(token), None, Duration::from_secs(5)).unwrap()
}

/// `follower` running until the sender is told `true`: each config text it
/// hands over arrives on the receiver.
fn follow(
    follower: Follower,
) -> (
    mpsc::UnboundedReceiver<ConfigText>,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (stop_tx, stop) = watch::channel(false);
    let following = tokio::spawn(follower.run(
        move |text: ConfigText| {
            let revision = text.revision;
            tx.send(text).map_err(|_| "the test stopped listening")?;
            Ok::<u64, &str>(u64::try_from(revision).unwrap_or(0))
        },
        stop,
    ));
    (rx, stop_tx, following)
}

#[tokio::test]
async fn a_follower_reads_the_apis_deltas_and_hands_each_revision_over() {
    let dir = dir("follows");
    let base = start_api(&dir).await;
    let first = shop_with_api(&base).await;

    let mut follower = reader(&dir, &base);
    let text = follower.first().await.unwrap();
    assert_eq!(text.revision, first);
    assert_eq!(resources(&text, "shop"), ["api"]);

    let (mut rx, stop_tx, following) = follow(follower);

    // A new resource: the long poll wakes and hands the whole config over.
    let added = write(
        &base,
        reqwest::Method::PUT,
        "/v1/namespaces/shop/resources/search",
        Some(json!({"algorithm": "unlimited"})),
    )
    .await;
    let text = handed(&mut rx, added).await;
    assert_eq!(text.revision, added);
    assert_eq!(resources(&text, "shop"), ["api", "search"]);

    // A deletion reaches it as a deletion.
    let deleted = write(
        &base,
        reqwest::Method::DELETE,
        "/v1/namespaces/shop/resources/api",
        None,
    )
    .await;
    let text = handed(&mut rx, deleted).await;
    assert_eq!(resources(&text, "shop"), ["search"]);

    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(60), following)
        .await
        .expect("the follower did not stop")
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A token the API does not know is a refusal naming where the token
/// came from, and the API's own message, read from its error shape.
#[tokio::test]
async fn an_unknown_token_is_refused_with_the_apis_message() {
    let dir = dir("refused");
    let base = start_api(&dir).await;
    let token = dir.join("wrong-token");
    std::fs::write(&token, "not-a-token-of-this-api\n").unwrap();
    let mut follower = Follower::new(
        &base,
        TokenSource::file(token.clone()),
        None,
        Duration::from_secs(5),
    )
    .unwrap();
    let e = follower.first().await.unwrap_err();
    assert!(
        matches!(e, FirstError::Fetch(FetchError::Refused(_))),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "the config API at {base} refused the token in the token file {} \
             (401 Unauthorized: the bearer token is not known); it must hold a `read` token \
             of the config API alone (the TOKEN of a `read:NAME:TOKEN` line of the API's \
             tokens file)",
            token.display()
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An API that answers a 200 whose body is not a delta, between good ones:
/// `GET /v1/config...` requests are answered from `answers` in turn (the
/// last one for every request after), and each request line is sent on
/// `seen`. It stands in for a proxy or a broken API, which the real API
/// cannot be made into.
async fn scripted_api(answers: Vec<String>, seen: mpsc::UnboundedSender<String>) -> String {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut n = 0usize;
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let mut socket = BufReader::new(socket);
            // One request per connection read at a time: the head, then
            // the answer; reqwest may reuse the connection.
            loop {
                let mut line = String::new();
                if socket.read_line(&mut line).await.unwrap_or(0) == 0 {
                    break;
                }
                let request = line.trim_end().to_owned();
                loop {
                    let mut header = String::new();
                    if socket.read_line(&mut header).await.unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                }
                let body = &answers[n.min(answers.len() - 1)];
                n += 1;
                let _ = seen.send(request);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if socket.get_mut().write_all(answer.as_bytes()).await.is_err() {
                    break;
                }
            }
        }
    });
    format!("http://{addr}")
}

/// Review of issue 20: a 200 whose body was not a delta was retried at the
/// same `since` for as long as the API kept sending it. It is a bad delta:
/// the follower forgets its copy and asks for everything, and puts the
/// whole config in force again.
#[tokio::test]
async fn a_body_that_is_not_a_delta_makes_the_follower_fetch_everything_again() {
    let dir = dir("not-a-delta");
    let real = start_api(&dir).await;
    let revision = shop_with_api(&real).await;
    // What the real API serves from nothing, word for word.
    let everything = reqwest::Client::new()
        .get(format!("{real}/v1/config?since=0"))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let base = scripted_api(
        vec![
            everything.clone(),
            r#"{"this": "is not a delta"}"#.to_owned(),
            everything,
        ],
        seen_tx,
    )
    .await;

    let mut follower = reader(&dir, &base);
    let text = follower.first().await.unwrap();
    assert_eq!(text.revision, revision);

    let (mut rx, stop_tx, following) = follow(follower);
    let mut lines = Vec::new();
    while lines.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(30), seen.recv())
            .await
            .expect("the follower stopped asking")
            .expect("the API stopped");
        lines.push(line);
    }
    assert!(lines[0].contains("since=0"), "{lines:?}");
    assert!(
        lines[1].contains(&format!("since={revision}")),
        "the follower asks for what came after its copy: {lines:?}"
    );
    assert!(
        lines[2].contains("since=0"),
        "after a body that is not a delta, the follower asks for everything: {lines:?}"
    );
    // The copy was reset: the same revision is put in force again, whole.
    let again = handed(&mut rx, revision).await;
    assert_eq!(again.revision, revision);
    assert_eq!(resources(&again, "shop"), ["api"]);
    stop_tx.send(true).unwrap();
    following.await.unwrap();
}
