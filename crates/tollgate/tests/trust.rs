//! Issue 16's reproductions, through real processes: `tollgate serve` on a
//! real redis-server that stalls (`CLIENT PAUSE`), restarts empty, and is
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
/// (then undone if Redis applies them later), and whose Redis calls time
/// out after 100 ms (the old code gave up on a copy operation then), plus
/// `extra` flags.
fn serve_with(dir: &Sandbox, redis: &RedisServer, extra: &[&str]) -> Serving {
    dir.write("tollgate.yaml", CONFIG);
    let url = redis.url();
    let mut args = vec![
        "--store",
        &url,
        "--redis-timeout-ms",
        "100",
        "--copy-deadline-ms",
        "200",
    ];
    args.extend_from_slice(extra);
    Serving::start_config(dir, &dir.path("tollgate.yaml"), &args, &[])
}

fn serve(dir: &Sandbox, redis: &RedisServer) -> Serving {
    serve_with(dir, redis, &[])
}

/// The copies Redis counts for `hooli` (its pool's `d:hooli`), read
/// without taking any.
fn counted(redis: &RedisServer) -> u64 {
    let mut c = redis.client();
    let Some(pool) = c.scan("tollgate:{c:*}:pool").into_iter().next() else {
        return 0;
    };
    c.hgetall(&pool)
        .into_iter()
        .find(|(f, _)| f == b"d:hooli")
        .map_or(0, |(_, v)| String::from_utf8_lossy(&v).parse().unwrap())
}

/// Stalls Redis for `seconds`, and returns once the stall has begun, with
/// a thread that ends when the stall does. The stall is a `CLIENT PAUSE`
/// (every client's commands wait, as behind a `DEBUG SLEEP`), which Redis
/// answers when it begins: what the test sends next surely waits for it,
/// without a sleep that guesses when a `DEBUG SLEEP` has started.
fn stall(redis: &RedisServer, seconds: f64) -> std::thread::JoinHandle<()> {
    let mut client = redis.client();
    let ms = (seconds * 1000.0) as u64;
    assert_eq!(
        client.text(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"]),
        "OK"
    );
    std::thread::spawn(move || {
        // Answered once the pause is over.
        assert_eq!(client.text(&["PING"]), "PONG");
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

/// `POST /v1/transfer` of `copies` of hold `id`, staged for `ttl_ms`.
fn transfer(s: &Serving, id: &str, copies: u64, ttl_ms: u64) -> (u16, Value) {
    s.json(
        "POST",
        "/v1/transfer",
        Some(&format!(
            r#"{{"hold_id":"{id}","namespace":"default","resource":"sandbox","domain":"hooli","copies":{copies},"ttl_ms":{ttl_ms}}}"#
        )),
    )
}

/// `POST /v1/release` of `copies` of hold `id`.
fn release(s: &Serving, id: &str, copies: u64) -> (u16, Value) {
    s.json(
        "POST",
        "/v1/release",
        Some(&format!(
            r#"{{"hold_id":"{id}","namespace":"default","resource":"sandbox","domain":"hooli","copies":{copies}}}"#
        )),
    )
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
    let redis = RedisServer::start();
    let s = serve(&dir, &redis);
    let id = hold(&s, 3);
    let stalled = stall(&redis, 1.0);
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
    let redis = RedisServer::start();
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
    let (status, v) = release(&s, &id, 3);
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
    let mut s = serve_with(&dir, &redis, &["--heartbeat-ttl-ms", "600"]);
    let id = hold(&s, 3);
    assert_eq!(counted(&redis), 3);
    redis.restart();
    assert_eq!(counted(&redis), 0, "Redis lost everything");
    // The server finds its heartbeat gone though nobody declared it dead,
    // joins again and counts its hold again.
    s.poll("the server joined again", |s| {
        s.metric("tollgate_store_live_set_lost_total")
            .unwrap_or(0.0)
            >= 1.0
    });
    s.poll("the hold is counted again", |_| counted(&redis) == 3);
    // Heartbeats go on (one every 200 ms): the server is still running a
    // few beats later, and never resigned.
    for _ in 0..5 {
        assert_eq!(s.http("GET", "/readyz", None).0, 200);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "the server is running"
    );
    assert!(s
        .logged("resigned from the copy log: shutting down")
        .is_empty());
    // The domain has nothing to spare, and the hold releases as usual.
    let (status, v) = reserve(&s, 1);
    assert_eq!(status, 429, "{v}");
    let (status, v) = s.json("DELETE", &format!("/v1/holds/{id}"), None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["released"], 3);
    assert_eq!(counted(&redis), 0);
    assert!(all_free(&s));
}

/// Review of the fix: a staged transfer falling due while Redis hung made
/// the server's housekeeping wait for Redis (so lapsed holds were not
/// reaped), and shutdown wait for housekeeping past its grace period.
#[test]
fn a_hung_redis_holds_up_neither_housekeeping_nor_shutdown() {
    let dir = Sandbox::new("trust-hung-redis");
    let redis = RedisServer::start();
    let s = serve_with(&dir, &redis, &["--shutdown-grace-ms", "1000"]);
    let id = hold(&s, 2);
    let (status, v) = transfer(&s, &id, 1, 300);
    assert_eq!(status, 200, "{v}");
    let (status, v) = s.json(
        "POST",
        "/v1/reserve",
        Some(r#"{"namespace":"default","resource":"sandbox","domain":"hooli","copies":1,"lease_ms":500}"#),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.json("GET", "/status", None).1["sessions"]["open"], 2);
    redis.pause();
    // The short hold lapses and is reaped although Redis does not answer.
    s.poll("the lapsed hold is reaped", |s| {
        s.json("GET", "/status", None).1["sessions"]["open"] == 1
    });
    let (code, _) = s.terminate_within(Duration::from_secs(20));
    assert!(code.is_some(), "the server exited within its grace period");
    redis.resume();
}

/// Review of the fix: a transfer whose caller gave up was to be taken
/// back into its hold, but after a stall longer than the heartbeat TTL the
/// server refused (it takes no new holds until it reaches Redis again), so
/// the copies stayed staged under an id nobody knew.
#[test]
fn a_transfer_given_up_during_a_long_stall_is_taken_back() {
    let dir = Sandbox::new("trust-long-stall-transfer");
    let redis = RedisServer::start();
    let s = serve_with(&dir, &redis, &["--heartbeat-ttl-ms", "1000"]);
    let id = hold(&s, 3);
    let stalled = stall(&redis, 2.5);
    let (status, v) = transfer(&s, &id, 2, 600000);
    assert_eq!(status, 503, "{v}");
    stalled.join().unwrap();
    s.poll("the transfer is undone", |s| {
        s.metric(r#"tollgate_copy_ops_undone_total{op="transfer"}"#) == Some(1.0)
            && s.metric("tollgate_copy_ops_in_flight").unwrap_or(0.0) == 0.0
    });
    // The hold has its three again, and releases them.
    let (status, v) = release(&s, &id, 3);
    assert_eq!(status, 200, "{v}");
    assert_eq!(counted(&redis), 0);
}
