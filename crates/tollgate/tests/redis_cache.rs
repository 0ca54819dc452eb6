//! `tollgate serve --store redis://...` answers a key over its limit from
//! its local over-limit cache (issue 17, docs/redis.md "The local
//! over-limit cache"): real processes, a real redis-server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serving::Serving;
use common::Sandbox;
use tollgate_redis::testing::RedisServer;

const CONFIG: &str = r#"
namespaces:
  - name: shop
    resources:
      - { name: search, algorithm: gcra, rate: 1/h, burst: 2 }
      - { name: feed, algorithm: sliding_window, limit: 2, window: 1h, buckets: 2 }
"#;

fn ask(s: &Serving, resource: &str) -> (u16, serde_json::Value) {
    s.json(
        "POST",
        "/v1/request",
        Some(&format!(
            r#"{{"namespace":"shop","resource":"{resource}","domain":"acme","hits":1}}"#
        )),
    )
}

/// Once Redis rejects a GCRA key, the server answers it itself, the same
/// rejection with its times counted down, and counts it in its metrics;
/// Redis sees none of those requests. A sliding window over its limit is
/// not cached: each of its requests reaches Redis.
#[test]
fn a_key_over_its_limit_is_answered_by_the_server_and_counted() {
    let dir = Sandbox::new("redis-cache");
    dir.write("tollgate.yaml", CONFIG);
    let redis = RedisServer::start();
    // Entries kept an hour (the default is a second), so that no answer
    // depends on the test's speed.
    let s = Serving::start_redis(
        &dir,
        &redis.url(),
        &["--redis-rejection-cache-ms", "3600000"],
        &[],
    );
    for _ in 0..2 {
        assert_eq!(ask(&s, "search").0, 200);
    }
    let (status, first) = ask(&s, "search");
    assert_eq!(status, 429, "{first}");
    let calls = redis.evalsha_calls();
    let mut retry = first["retry_after_ns"].as_u64().unwrap();
    for _ in 0..10 {
        let (status, v) = ask(&s, "search");
        assert_eq!(status, 429, "{v}");
        assert_eq!(v["allowed"], false);
        assert_eq!(v["remaining"], 0);
        assert_eq!(v["limited_by"], "limit");
        let now = v["retry_after_ns"].as_u64().unwrap();
        assert!(now <= retry && now > 3_000_000_000_000, "{v}");
        // In Redis's granularity (its TIME is in microseconds).
        assert_eq!(now % 1000, 0, "{v}");
        retry = now;
    }
    assert_eq!(redis.evalsha_calls(), calls, "the repeats reached Redis");
    s.poll("the cache's hits are published", |s| {
        s.metric("tollgate_store_rejection_cache_hits_total") == Some(10.0)
    });
    assert_eq!(
        s.metric("tollgate_store_rejection_cache_entries"),
        Some(1.0)
    );
    assert_eq!(
        s.metric("tollgate_store_rejection_cache_evictions_total"),
        Some(0.0)
    );
    assert_eq!(s.metric("tollgate_store_decisions_shed_total"), Some(0.0));

    for _ in 0..2 {
        assert_eq!(ask(&s, "feed").0, 200);
    }
    let calls = redis.evalsha_calls();
    for _ in 0..5 {
        assert_eq!(ask(&s, "feed").0, 429);
    }
    assert_eq!(redis.evalsha_calls(), calls + 5);
}
/// `--redis-rejection-cache 0` turns the cache off, and so does
/// `--redis-rejection-cache-ms 0` (an entry that may live no time could
/// never answer): every request for a key over its limit reaches Redis,
/// and nothing is counted as a hit.
#[test]
fn the_cache_can_be_turned_off() {
    for off in ["--redis-rejection-cache", "--redis-rejection-cache-ms"] {
        let dir = Sandbox::new("redis-cache-off");
        dir.write("tollgate.yaml", CONFIG);
        let redis = RedisServer::start();
        let s = Serving::start_redis(
            &dir,
            &redis.url(),
            &[off, "0", "--redis-max-waiting", "64"],
            &[],
        );
        for _ in 0..2 {
            assert_eq!(ask(&s, "search").0, 200, "{off} 0");
        }
        let calls = redis.evalsha_calls();
        for _ in 0..5 {
            assert_eq!(ask(&s, "search").0, 429, "{off} 0");
        }
        assert_eq!(redis.evalsha_calls(), calls + 5, "{off} 0");
        s.poll("the store's metrics are published", |s| {
            s.metric("tollgate_store_rejection_cache_hits_total") == Some(0.0)
        });
    }
}
