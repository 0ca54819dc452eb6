//! `tollgate serve --store redis-sentinel://...` (issue 18, item 8): real
//! processes (a master, its replica, three sentinels, the server); the
//! server follows a forced failover without a restart. And bad sentinel
//! URLs refused at startup, naming the problem.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serving::{Serving, FREE_PORTS};
use common::Sandbox;
use tollgate_redis::testing::RedisSentinels;

const CONFIG: &str = r#"
namespaces:
  - name: shop
    resources:
      - { name: search, algorithm: gcra, rate: 1/h, burst: 3 }
"#;

fn ask(s: &Serving) -> u16 {
    s.json(
        "POST",
        "/v1/request",
        Some(r#"{"namespace":"shop","resource":"search","domain":"acme","hits":1}"#),
    )
    .0
}

/// The server asks the sentinels for the master, decides there, and after
/// `SENTINEL FAILOVER` decides on the new master, with the state the
/// replica had: the same process, never restarted.
#[test]
fn the_server_follows_a_failover_without_a_restart() {
    let dir = Sandbox::new("redis-sentinel");
    dir.write("tollgate.yaml", CONFIG);
    let sentinels = RedisSentinels::start();
    let old = sentinels.master_port();
    let s = Serving::start_redis(&dir, &sentinels.url(), &[], &[]);
    assert_eq!(ask(&s), 200);
    assert_eq!(ask(&s), 200);
    assert!(sentinels.server(old).evalsha_calls() > 0);
    sentinels.sync_replica();

    let new = sentinels.failover();
    let calls = sentinels.server(new).evalsha_calls();
    s.poll("the server follows the new master", |s| {
        s.metric("tollgate_store_master_changes_total") == Some(1.0)
    });
    // Written after the counter, through the server's log pipeline:
    // polled for too (review of issue 18, finding 4).
    s.poll("the failover is logged", |s| {
        !s.logged(
            "the sentinels name a new master: connections moved there; the over-limit cache \
             is cleared and this server's holds are counted again pool by pool",
        )
        .is_empty()
    });
    // The third of three is granted, the fourth refused: the replica's
    // state, decided on the new master.
    assert_eq!(ask(&s), 200);
    assert_eq!(ask(&s), 429);
    assert!(sentinels.server(new).evalsha_calls() > calls);
    assert_eq!(s.http("GET", "/readyz", None).0, 200);
}

/// The master freezes (SIGSTOP: it dies without closing its sockets, as
/// a crashed host or a partition would) and the sentinels fail it over by
/// themselves: the server follows and decides on the new master, with
/// the state the replica had.
#[test]
fn the_server_follows_the_sentinels_when_the_master_freezes() {
    let dir = Sandbox::new("redis-sentinel-frozen");
    dir.write("tollgate.yaml", CONFIG);
    let sentinels = RedisSentinels::start();
    let old = sentinels.master_port();
    let s = Serving::start_redis(&dir, &sentinels.url(), &[], &[]);
    assert_eq!(ask(&s), 200);
    assert_eq!(ask(&s), 200);
    sentinels.sync_replica();

    sentinels.server(old).pause();
    let new = sentinels.await_promotion(old);
    s.poll("the server follows the new master", |s| {
        s.metric("tollgate_store_master_changes_total") == Some(1.0)
    });
    // The third of three is granted (a store that fails answers 503), the
    // fourth refused: the replica's state, decided on the new master.
    assert_eq!(ask(&s), 200);
    assert_eq!(ask(&s), 429);
    assert!(sentinels.server(new).evalsha_calls() > 0);
}

#[test]
fn bad_sentinel_urls_are_clear_startup_errors() {
    let dir = Sandbox::new("redis-sentinel-bad");
    dir.write("tollgate.yaml", CONFIG);
    let port = tollgate_redis::testing::free_port();
    let nobody = format!("redis-sentinel://127.0.0.1:{port}/mymaster");
    for (url, expect) in [
        (
            "redis-sentinel://127.0.0.1:26379",
            "no master name: add /MASTER_NAME after the sentinels",
        ),
        (
            "redis-sentinel:///mymaster",
            "no sentinels before the master name",
        ),
        (
            "redis-sentinel://a:26379,b:http/mymaster",
            "bad port `http` of sentinel `b:http`: a number from 1 to 65535 expected",
        ),
        (
            nobody.as_str(),
            "cannot connect to Redis at redis-sentinel://",
        ),
    ] {
        let mut args = vec!["serve", "--config", "tollgate.yaml"];
        args.extend(FREE_PORTS);
        args.extend(["--store", url, "--redis-connect-timeout-ms", "500"]);
        let run = dir.run(&args);
        assert_ne!(run.code, Some(0), "{run}");
        assert!(run.stderr.contains(expect), "{url}: {run}");
    }
    // The password never shows: not when the sentinels cannot be
    // reached, nor when it holds a `?` or `#` that makes the URL refused
    // (review of issue 18, finding 3: it was printed twice).
    for password in ["hunter2", "hun?ter2", "hun#ter2", "hunter2?x@y"] {
        let run = dir.run(&[
            "serve",
            "--store",
            &format!("redis-sentinel://:{password}@127.0.0.1:{port}/mymaster"),
            "--redis-connect-timeout-ms",
            "200",
        ]);
        assert_ne!(run.code, Some(0), "{run}");
        assert!(!run.stderr.contains("ter2"), "{password}: {run}");
        assert!(run.stderr.contains("***@"), "{password}: {run}");
    }
}
