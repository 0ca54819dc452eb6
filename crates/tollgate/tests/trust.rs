//! Issue 16's reproductions, through real processes: `tollgate serve` on a
//! real redis-server that stalls (`DEBUG SLEEP`), restarts empty, and is
//! sent made-up transfer ids, and HTTP clients that hang up mid-call. Each
//! test failed on the code before the fix; each asserts that every copy
//! ends up with exactly one owner and the server keeps serving.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::serving::Serving;
use common::Sandbox;
use serde_json::Value;
use tollgate_redis::testing::RedisServer;

const CONFIG: &str = r#"
namespaces:
  - name: default
    resources:
      - { name: sandbox, kind: concurrency, domain_limit: 3 }
"#;

/// A server on `redis` whose copy operations are answered within 200 ms
/// (then undone if Redis applies them later).
fn serve(dir: &Sandbox, redis: &RedisServer) -> Serving {
    dir.write("tollgate.yaml", CONFIG);
    Serving::start_redis(dir, &redis.url(), &["--copy-deadline-ms", "200"], &[])
}

fn redis_with_debug() -> RedisServer {
    RedisServer::start_with(&["--enable-debug-command", "yes"])
}

/// Stalls Redis for `seconds`, in a thread of its own.
fn stall(redis: &RedisServer, seconds: f64) -> std::thread::JoinHandle<()> {
    let mut client = redis.client();
    std::thread::spawn(move || {
        assert_eq!(client.text(&["DEBUG", "SLEEP", &seconds.to_string()]), "OK");
    })
}

fn reserve(s: &Serving, copies: u64) -> (u16, Value) {
    s.json(
        "POST",
        "/v1/reserve",
        Some(&format!(
            r#"{{"namespace":"default","resource":"sandbox","domain":"hooli","copies":{copies},"lease_ms":600000}}"#
        )),
    )
}

fn hold(s: &Serving, copies: u64) -> String {
    let (status, v) = reserve(s, copies);
    assert_eq!(status, 200, "{v}");
    v["hold_id"].as_str().unwrap().to_owned()
}

/// Whether all three copies can be reserved now (and gives them back).
fn all_free(s: &Serving) -> bool {
    let (status, v) = reserve(s, 3);
    if status != 200 {
        return false;
    }
    let id = v["hold_id"].as_str().unwrap();
    assert_eq!(s.http("DELETE", &format!("/v1/holds/{id}"), None).0, 200);
    true
}

/// Sends `body` to `path` and hangs up at once, without reading the
/// answer: hyper then drops the handler's future.
fn post_and_hang_up(s: &Serving, path: &str, body: &str) {
    let mut tcp = TcpStream::connect(s.http).unwrap();
    write!(
        tcp,
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    tcp.flush().unwrap();
    // Long enough for the server to read the request and start on it.
    std::thread::sleep(Duration::from_millis(100));
    drop(tcp);
}

/// Item 1: a hold dropped while Redis stalls (the release times out) used
/// to stay counted for good: ten seconds later every reserve for `hooli`
/// was refused with `domain_holds: 3` although nobody held anything. The
/// release now goes on until Redis answers.
#[test]
fn a_hold_dropped_while_redis_stalls_is_released_once_redis_answers() {
    let dir = Sandbox::new("trust-stall-release");
    let redis = redis_with_debug();
    let s = serve(&dir, &redis);
    let id = hold(&s, 3);
    let stalled = stall(&redis, 1.0);
    std::thread::sleep(Duration::from_millis(100));
    let (status, v) = s.json("DELETE", &format!("/v1/holds/{id}"), None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["released"], 3, "{v}");
    assert_eq!(v["pending"], true, "Redis had not answered yet: {v}");
    stalled.join().unwrap();
    s.poll("the three copies are free again", all_free);
    assert_eq!(s.http("GET", "/readyz", None).0, 200);
}

/// Item 2: a client that hung up during a release leaked the copies: they
/// were taken out of the hold before the store call, and nothing gave
/// them back when hyper dropped the handler. The release is now undone
/// when Redis applies it: the hold still holds its three copies.
#[test]
fn a_client_that_hangs_up_during_a_release_or_transfer_leaks_nothing() {
    let dir = Sandbox::new("trust-hang-up");
    let redis = redis_with_debug();
    let s = serve(&dir, &redis);
    let id = hold(&s, 3);
    for (path, body) in [
        (
            "/v1/release",
            format!(
                r#"{{"hold_id":"{id}","namespace":"default","resource":"sandbox","domain":"hooli","copies":2}}"#
            ),
        ),
        (
            "/v1/transfer",
            format!(
                r#"{{"hold_id":"{id}","namespace":"default","resource":"sandbox","domain":"hooli","copies":2,"ttl_ms":600000}}"#
            ),
        ),
    ] {
        let stalled = stall(&redis, 0.6);
        std::thread::sleep(Duration::from_millis(50));
        post_and_hang_up(&s, path, &body);
        stalled.join().unwrap();
        // The hold holds its three again (a release of all three goes
        // through), and the domain has none to spare meanwhile.
        s.poll(&format!("{path} undone"), |s| {
            s.metric("tollgate_copy_ops_in_flight").unwrap_or(0.0) == 0.0
        });
        let (status, v) = reserve(&s, 1);
        assert_eq!(status, 429, "{path}: nothing was freed: {v}");
    }
    let (status, v) = s.json(
        "POST",
        "/v1/release",
        Some(&format!(
            r#"{{"hold_id":"{id}","namespace":"default","resource":"sandbox","domain":"hooli","copies":3}}"#
        )),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["still_held"], 0, "{v}");
    assert!(all_free(&s));
}

/// Item 3: 3,000 seizes of made-up transfer ids left 3,001 pools in the
/// server's registration set and about 10,000 EVALSHA calls a second of
/// housekeeping, for good. Now nothing is written, and housekeeping costs
/// what it cost before.
#[test]
fn seizes_of_made_up_transfers_leave_nothing_in_redis() {
    let dir = Sandbox::new("trust-seizes");
    let redis = RedisServer::start();
    let s = serve(&dir, &redis);
    let before = redis.keys("tollgate:");
    for i in 0..300u64 {
        let id = format!("{:016x}{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15), i);
        let (status, v) = s.json(
            "POST",
            "/v1/seize",
            Some(&format!(r#"{{"transfer_id":"{id}"}}"#)),
        );
        assert_eq!(status, 404, "{v}");
        assert_eq!(v["error"]["reason"], "unknown_transfer");
    }
    let after = redis.keys("tollgate:");
    assert_eq!(after, before, "no key was written");
    assert!(after.iter().all(|k| !k.contains(":pools:")), "{after:?}");
    assert_eq!(s.json("GET", "/status", None).1["sessions"]["open"], 0);
    // Housekeeping now: a few heartbeats, not a sweep of 300 pools four
    // times a second (1,200 calls a second before the fix).
    let calls = || -> u64 {
        let info = redis.client().text(&["INFO", "commandstats"]);
        info.lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let first = calls();
    std::thread::sleep(Duration::from_secs(1));
    let housekeeping = calls() - first;
    assert!(
        housekeeping < 30,
        "{housekeeping} EVALSHA calls in a second"
    );
}

/// Item 8: Redis restarted empty under a running server made it exit with
/// "resigned from the copy log: this server was declared dead by another",
/// and every server of a fleet with it. Now the server joins again, counts
/// the copies its holds hold again, and keeps serving.
#[test]
fn a_redis_that_restarts_empty_costs_the_counts_not_the_server() {
    let dir = Sandbox::new("trust-redis-restart");
    let mut redis = RedisServer::start();
    dir.write("tollgate.yaml", CONFIG);
    let mut s = Serving::start_redis(&dir, &redis.url(), &["--heartbeat-ttl-ms", "600"], &[]);
    let id = hold(&s, 3);
    redis.restart();
    s.poll("ready again", |s| s.http("GET", "/readyz", None).0 == 200);
    // The hold's copies are counted again: the domain has none to spare.
    s.poll("the hold is counted again", |s| reserve(s, 1).0 == 429);
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "the server is running"
    );
    assert!(s
        .logged("resigned from the copy log: shutting down")
        .is_empty());
    let (status, v) = s.json("DELETE", &format!("/v1/holds/{id}"), None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["released"], 3);
    assert!(all_free(&s));
}
