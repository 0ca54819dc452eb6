//! `tollgate serve --store redis://...` as real processes sharing a real
//! redis-server (or a real three-master Redis Cluster): one limit enforced
//! exactly by two servers, the holds of a server killed with SIGKILL
//! released by the survivor, Redis restarting under a running server, and
//! bad Redis URLs refused at startup.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serving::{Serving, FREE_PORTS};
use common::Sandbox;
use tollgate_redis::testing::{RedisCluster, RedisServer};

const CONFIG: &str = r#"
namespaces:
  - name: shop
    resources:
      - { name: checkout, algorithm: fixed_window, limit: 50, window: 1h, align: first_hit }
      - { name: db, kind: concurrency, domain_limit: 10 }
"#;

fn serve(dir: &Sandbox, url: &str, extra: &[&str]) -> Serving {
    Serving::start_redis(dir, url, extra, &[])
}

fn checkout(s: &Serving) -> bool {
    let (status, v) = s.json(
        "POST",
        "/v1/request",
        Some(r#"{"namespace":"shop","resource":"checkout","domain":"acme","hits":1}"#),
    );
    assert!(status == 200 || status == 429, "{status} {v}");
    v["allowed"].as_bool().unwrap()
}

/// Sends 120 requests from 8 threads, alternating between `a` and `b`,
/// and checks that exactly the window's 50 are granted, whichever server
/// answers, and no more afterwards.
fn exactly_fifty_granted(a: &Serving, b: &Serving) {
    let granted = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|t| {
                scope.spawn(move || {
                    (0..15)
                        .filter(|i| checkout(if (t + i) % 2 == 0 { a } else { b }))
                        .count()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .sum::<usize>()
    });
    assert_eq!(granted, 50);
    assert!(!checkout(a));
    assert!(!checkout(b));
}

#[test]
fn two_servers_sharing_redis_enforce_one_limit_exactly() {
    let dir = Sandbox::new("redis-two");
    dir.write("tollgate.yaml", CONFIG);
    let redis = RedisServer::start();
    let a = serve(&dir, &redis.url(), &[]);
    let b = serve(&dir, &redis.url(), &[]);
    exactly_fifty_granted(&a, &b);
}

#[test]
fn two_servers_on_a_three_master_redis_cluster_share_limits_and_holds() {
    let dir = Sandbox::new("redis-cluster");
    dir.write("tollgate.yaml", CONFIG);
    let cluster = RedisCluster::start();
    let a = serve(&dir, &cluster.url(), &[]);
    let b = serve(&dir, &cluster.url(), &[]);
    exactly_fifty_granted(&a, &b);
    // Holds taken on either server count against one domain limit.
    assert_eq!(reserve(&a, 6, 6)["granted"], 6);
    assert_eq!(reserve(&b, 6, 0)["granted"], 4);
    assert_eq!(reserve(&a, 1, 0)["granted"], 0);
}

fn reserve(s: &Serving, copies: u64, min_copies: u64) -> serde_json::Value {
    let (status, v) = s.json(
        "POST",
        "/v1/reserve",
        Some(&format!(
            r#"{{"namespace":"shop","resource":"db","domain":"acme","copies":{copies},"min_copies":{min_copies},"lease_ms":600000}}"#
        )),
    );
    assert!(status == 200 || status == 429, "{status} {v}");
    v
}

#[test]
fn the_holds_of_a_server_killed_with_sigkill_are_released_by_the_survivor() {
    let dir = Sandbox::new("redis-kill");
    dir.write("tollgate.yaml", CONFIG);
    let redis = RedisServer::start();
    let ttl = ["--heartbeat-ttl-ms", "1000"];
    let victim = serve(&dir, &redis.url(), &ttl);
    let survivor = serve(&dir, &redis.url(), &ttl);
    assert_eq!(reserve(&victim, 6, 6)["granted"], 6);
    assert_eq!(reserve(&survivor, 3, 3)["granted"], 3);
    // Nine of ten are held.
    assert_eq!(reserve(&survivor, 5, 0)["granted"], 1);
    let mut victim = victim;
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    // Within the heartbeat TTL (plus a beat) the survivor releases the
    // victim's six, and only those: then six fit again, and no more.
    survivor.poll("the victim's holds are released", |s| {
        reserve(s, 6, 6)["granted"] == 6
    });
    let v = reserve(&survivor, 1, 1);
    assert_eq!(v["granted"], 0, "{v}");
}

#[test]
fn a_server_serves_again_after_redis_restarts() {
    let dir = Sandbox::new("redis-restart");
    dir.write("tollgate.yaml", CONFIG);
    let mut redis = RedisServer::start();
    let s = serve(&dir, &redis.url(), &["--keep-serving-after-resign"]);
    assert!(checkout(&s));
    redis.kill();
    let (status, v) = s.json(
        "POST",
        "/v1/request",
        Some(r#"{"namespace":"shop","resource":"checkout","domain":"acme","hits":1}"#),
    );
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["reason"], "store_unavailable");
    s.poll("not ready while Redis is down", |s| {
        s.http("GET", "/readyz", None).0 == 503
    });
    redis.restart();
    s.poll("ready again", |s| s.http("GET", "/readyz", None).0 == 200);
    // Redis came back empty: the window starts over.
    assert!(checkout(&s));
}

#[test]
fn a_bad_or_unreachable_redis_url_is_a_clear_startup_error() {
    let dir = Sandbox::new("redis-bad");
    dir.write("tollgate.yaml", CONFIG);
    let port = tollgate_redis::testing::free_port();
    let unreachable = format!("redis://127.0.0.1:{port}/");
    for (url, expect) in [
        ("memcached://x", "unknown scheme"),
        ("redis-cluster://", "no seed nodes"),
        (unreachable.as_str(), "cannot connect to Redis"),
    ] {
        let mut args = vec!["serve", "--config", "tollgate.yaml"];
        args.extend(FREE_PORTS);
        args.extend(["--store", url, "--redis-connect-timeout-ms", "500"]);
        let run = dir.run(&args);
        assert_ne!(run.code, Some(0), "{run}");
        assert!(run.stderr.contains(expect), "{url}: {run}");
    }
    // The password never shows in the error.
    let run = dir.run(&[
        "serve",
        "--store",
        &format!("redis://:hunter2@127.0.0.1:{port}/"),
        "--redis-connect-timeout-ms",
        "200",
    ]);
    assert!(!run.stderr.contains("hunter2"), "{run}");
}

/// Regression (issue 16, item 11): when Redis failed, the 503 answers,
/// which anyone can get without credentials, carried the store's URL and
/// Redis's raw error. They say "store unavailable" now, on every surface,
/// and the detail goes to the server's log with the URL's credentials
/// redacted.
#[test]
fn a_failed_store_is_answered_without_its_address_and_logged_redacted() {
    let dir = Sandbox::new("redis-503-redacted");
    dir.write("tollgate.yaml", CONFIG);
    // A user of its own, so the URL carries a password.
    let mut redis = RedisServer::start_with(&[
        "--user",
        "tollgate",
        "on",
        ">s3cret-pw",
        "~*",
        "&*",
        "+@all",
    ]);
    let port = redis.port.to_string();
    let url = format!("redis://tollgate:s3cret-pw@127.0.0.1:{port}/");
    let s = serve(&dir, &url, &["--keep-serving-after-resign"]);
    assert!(checkout(&s));
    redis.kill();
    let secret = |text: &str| {
        text.contains(&port) || text.contains("redis://") || text.contains("s3cret-pw")
    };
    let body = r#"{"namespace":"shop","resource":"checkout","domain":"acme","hits":1}"#;
    let (status, text) = s.http("POST", "/v1/request", Some(body));
    assert_eq!(status, 503, "{text}");
    assert!(!secret(&text), "{text}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["error"]["reason"], "store_unavailable");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("store unavailable"),
        "{v}"
    );
    // gRPC.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let status = runtime.block_on(async {
        let mut grpc = tollgate_proto::v1::tollgate_client::TollgateClient::connect(format!(
            "http://{}",
            s.grpc
        ))
        .await
        .unwrap();
        grpc.request(tollgate_proto::v1::RateRequest {
            namespace: "shop".into(),
            resource: "checkout".into(),
            domain: "acme".into(),
            ..Default::default()
        })
        .await
        .unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(!secret(status.message()), "{status:?}");
    // The operator's log has the detail, without the password.
    s.poll("the store failure logged", |s| {
        !s.logged("the store failed; clients are answered store_unavailable")
            .is_empty()
    });
    let logs = s.logs.lock().unwrap();
    let line = logs
        .iter()
        .find(|l| {
            l["fields"]["message"] == "the store failed; clients are answered store_unavailable"
        })
        .unwrap();
    let detail = line["fields"]["detail"].as_str().unwrap();
    assert!(detail.contains(&port), "{line}");
    assert!(
        !logs.iter().any(|l| l.to_string().contains("s3cret-pw")),
        "{logs:?}"
    );
}

/// Issue 23: over HTTP on a server storing in Redis, `not_held` said
/// ``domain `globex` holds 2 copies in groups []`` of copies counted in
/// group `big`, and a release naming another domain did not say whose
/// copies the hold has. Both refusals now name the hold's domain, resource
/// and groups, and change nothing in Redis.
#[test]
fn not_held_names_the_domain_resource_and_groups_the_hold_has() {
    let dir = Sandbox::new("redis-not-held");
    dir.write(
        "tollgate.yaml",
        "namespaces:\n  - name: default\n    resources:\n      - { name: sandbox, kind: concurrency, domain_limit: 3, groups: [ { name: big, members: [acme, globex], limit: 20 } ] }\n",
    );
    let redis = RedisServer::start();
    let s = serve(&dir, &redis.url(), &[]);
    let (status, v) = s.json(
        "POST",
        "/v1/reserve",
        Some(r#"{"namespace":"default","resource":"sandbox","domain":"globex","copies":2,"lease_ms":600000}"#),
    );
    assert_eq!(
        (status, &v["groups"]),
        (200, &serde_json::json!(["big"])),
        "{v}"
    );
    let id = v["hold_id"].as_str().unwrap().to_owned();
    let release = |domain: &str, copies: u64| {
        let (status, v) = s.json(
            "POST",
            "/v1/release",
            Some(&format!(
                r#"{{"hold_id":"{id}","namespace":"default","resource":"sandbox","domain":"{domain}","copies":{copies}}}"#
            )),
        );
        assert_eq!(
            (status, &v["error"]["reason"]),
            (409, &serde_json::json!("not_held")),
            "{v}"
        );
        v["error"]["message"].as_str().unwrap().to_owned()
    };
    let has = "it holds 2 copies of `sandbox` for domain `globex` in group `big`";
    assert_eq!(
        release("globex", 3),
        format!("this hold holds only 2 copies of resource `sandbox` for domain `globex`, so it cannot release 3; {has}")
    );
    assert_eq!(
        release("acme", 1),
        format!("this hold holds no copies of resource `sandbox` for domain `acme`, so it cannot release 1; {has}")
    );
    // Nothing was released: the domain's limit still has room for one.
    let (status, v) = s.json(
        "POST",
        "/v1/reserve",
        Some(r#"{"namespace":"default","resource":"sandbox","domain":"globex","copies":2,"min_copies":1,"lease_ms":600000}"#),
    );
    assert_eq!((status, &v["granted"]), (200, &serde_json::json!(1)), "{v}");
}
