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

#[tokio::test]
async fn a_follower_reads_the_apis_deltas_and_hands_each_revision_over() {
    let dir = dir("follows");
    let base = start_api(&dir).await;
    write(
        &base,
        reqwest::Method::PUT,
        "/v1/namespaces/shop",
        Some(json!({})),
    )
    .await;
    let first = write(
        &base,
        reqwest::Method::PUT,
        "/v1/namespaces/shop/resources/api",
        Some(json!({"algorithm": "unlimited"})),
    )
    .await;

    let token = dir.join("read-token");
    std::fs::write(&token, format!("{READ}\n")).unwrap();
    let mut follower = Follower::new(
        &base,
        TokenSource::file(token),
        None,
        Duration::from_secs(5),
    )
    .unwrap();
    let text = follower.first().await.unwrap();
    assert_eq!(text.revision, first);
    assert_eq!(resources(&text, "shop"), ["api"]);

    let (tx, mut rx) = mpsc::unbounded_channel();
    let (stop_tx, stop) = watch::channel(false);
    let following = tokio::spawn(follower.run(
        move |text: ConfigText| {
            let revision = text.revision;
            tx.send(text).map_err(|_| "the test stopped listening")?;
            Ok::<u64, &str>(u64::try_from(revision).unwrap_or(0))
        },
        stop,
    ));

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
