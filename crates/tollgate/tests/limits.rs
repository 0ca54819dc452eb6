//! Several limits on one resource, through the real binary: a `limits:`
//! list answered over HTTP, native gRPC and Envoy's RLS (and its `/json`
//! form) by a server on the memory store, by two servers sharing a real
//! redis-server, and by one on a real Redis Cluster; a gossip cluster
//! serving the algorithms it can replicate and refusing, by name, a limit
//! it cannot. Also limits brought by requests (`allow_override`) over
//! HTTP, Envoy's RLS, native gRPC, the Rust client and the CLI, and a
//! gossip cluster refusing them when the config loads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serving::Serving;
use common::Sandbox;
use serde_json::Value;
use tollgate_redis::testing::{RedisCluster, RedisServer};

/// A bucket of 3 that does not refill within a test, and 5 a day from
/// the first hit (so no window edge falls inside a test); `vip` has a
/// bucket of 100 by overriding `burst` alone.
const CONFIG: &str = "
namespaces:
  - name: shop
    resources:
      - name: api
        limits:
          - { name: burst, algorithm: token_bucket, capacity: 3, rate: 1/1d }
          - { name: daily, algorithm: fixed_window, limit: 5, window: 1d, align: first_hit }
        domains:
          vip:
            limits:
              - { name: burst, capacity: 100, rate: 1/1h }
";

const ENVOY: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit:
      - { name: burst, algorithm: token_bucket, capacity: 3, rate: 1/1d }
      - { name: daily, unit: day, requests_per_unit: 5 }
";

fn ask(s: &Serving, domain: &str, hits: u64) -> (u16, Value) {
    let body =
        format!(r#"{{"namespace":"shop","resource":"api","domain":"{domain}","hits":{hits}}}"#);
    s.json("POST", "/v1/request", Some(&body))
}

/// `(name, remaining)` of each limit in an answer's `limits`.
fn states(answer: &Value) -> Vec<(String, u64)> {
    answer["limits"]
        .as_array()
        .unwrap_or_else(|| panic!("no limits in {answer}"))
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_owned(),
                l["remaining"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn pairs(p: &[(&str, u64)]) -> Vec<(String, u64)> {
    p.iter().map(|(n, r)| ((*n).to_owned(), *r)).collect()
}

/// The HTTP API's story of one domain: `a` and `b` may be the same
/// server or two sharing a store.
fn http_story(a: &Serving, b: &Serving, domain: &str) {
    let (status, v) = ask(a, domain, 3);
    assert_eq!(status, 200, "{v}");
    assert_eq!(states(&v), pairs(&[("burst", 0), ("daily", 2)]));
    assert_eq!(
        (v["limit"].as_u64(), v["remaining"].as_u64()),
        (Some(3), Some(0))
    );
    // The bucket is empty: refused by `burst`, and `daily` is not charged.
    let (status, v) = ask(b, domain, 1);
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["limited_by"], "limit");
    assert_eq!(v["limited_by_name"], "burst");
    assert_eq!(v["algorithm"], "token_bucket");
    assert_eq!(states(&v), pairs(&[("burst", 0), ("daily", 2)]));

    // `vip` overrides `burst` only: its day still holds 5.
    let (status, v) = ask(a, "vip", 5);
    assert_eq!(status, 200, "{v}");
    assert_eq!(states(&v), pairs(&[("burst", 95), ("daily", 0)]));
    let (status, v) = ask(b, "vip", 1);
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["limited_by_name"], "daily");
    assert_eq!(v["algorithm"], "fixed_window");
    // The answer's limit and reset are the day's own.
    assert_eq!(v["limit"], 5);
    let reset = v["reset_after_ns"].as_u64().unwrap();
    assert!(
        reset > 86_000_000_000_000 && reset <= 86_400_000_000_000,
        "a day's reset, not the bucket's: {v}"
    );
}

#[test]
fn a_memory_server_answers_every_surface_with_the_binding_limit_named() {
    use tollgate_proto::v1::{self, tollgate_client::TollgateClient};

    let dir = Sandbox::new("limits-memory");
    dir.write("conf/tollgate.yaml", CONFIG);
    dir.write("conf/envoy.yaml", ENVOY);
    let server = Serving::start_config(&dir, &dir.path("conf"), &[], &[]);
    http_story(&server, &server, "h");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let grpc = format!("http://{}", server.grpc);
    rt.block_on(async {
        let mut native = TollgateClient::connect(grpc.clone()).await.unwrap();
        let ask = |hits: u64| v1::RateRequest {
            namespace: "shop".into(),
            resource: "api".into(),
            domain: "g".into(),
            hits: Some(hits),
            ..Default::default()
        };
        let a = native.request(ask(3)).await.unwrap().into_inner();
        assert!(a.allowed);
        let names: Vec<(&str, u64)> = a
            .limits
            .iter()
            .map(|l| (l.name.as_str(), l.remaining))
            .collect();
        assert_eq!(names, [("burst", 0), ("daily", 2)]);
        assert_eq!(a.limited_by_name, "", "nothing limited it");
        let a = native.request(ask(1)).await.unwrap().into_inner();
        assert!(!a.allowed);
        assert_eq!(a.limited_by, v1::LimitedBy::Limit as i32);
        assert_eq!(a.limited_by_name, "burst");
        assert_eq!(a.limits[0].algorithm, "token_bucket");
        assert_eq!(a.limits[1].limit, 5);

        rls_story(grpc, "r").await;
    });
    // The `/json` form of the RLS: 2 more for another user, then the day
    // binds at 5 (3 + 2), named with Envoy's unit.
    let json = |hits: u32| {
        let body = format!(
            r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"j"}}]}}],"hitsAddend":{hits}}}"#
        );
        server.json("POST", "/json", Some(&body))
    };
    let (status, v) = json(2);
    assert_eq!(status, 200, "{v}");
    let limit = &v["statuses"][0]["currentLimit"];
    assert_eq!(limit["name"], "burst", "{v}");
    assert_eq!(limit["requestsPerUnit"], 3, "{v}");
}

/// Envoy's RLS on `grpc` for user `user`: a `rate_limit` list is one
/// descriptor, within its limit only when within every one; the answer's
/// current limit is the binding one, by name and in Envoy's own terms.
async fn rls_story(grpc: String, user: &str) {
    use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
    use tollgate_proto::rls::{
        rate_limit_descriptor::Entry, RateLimitDescriptor, RateLimitRequest,
    };

    let mut rls = RateLimitServiceClient::connect(grpc).await.unwrap();
    let request = |hits: u32| RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..Default::default()
        }],
        hits_addend: hits,
    };
    let a = rls
        .should_rate_limit(request(3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.overall_code, 1, "OK: {a:?}");
    let status = &a.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("burst", 3));
    assert_eq!(status.limit_remaining, 0);
    let a = rls
        .should_rate_limit(request(1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.overall_code, 2, "OVER_LIMIT: {a:?}");
    assert_eq!(a.statuses[0].current_limit.as_ref().unwrap().name, "burst");
}

/// Near-limit metrics judge every limit of a list: a burst bucket that
/// refills within microseconds binds (it has least left, 5 of 10) while
/// the day's 100 are 85 % spent, which is near (default ratio 0.8). Over
/// HTTP and Envoy's RLS, the one request past 80 of the day counts.
#[test]
fn a_limits_list_is_near_its_limit_when_any_of_its_limits_is() {
    let dir = Sandbox::new("limits-near");
    dir.write(
        "conf/tollgate.yaml",
        "namespaces:\n  - name: shop\n    resources:\n      - name: quick\n        limits:\n          \
         - { name: burst, algorithm: token_bucket, capacity: 10, rate: 1000/1ms }\n          \
         - { name: daily, algorithm: fixed_window, limit: 100, window: 1d, align: first_hit }\n",
    );
    dir.write(
        "conf/envoy.yaml",
        "domain: edge\ndescriptors:\n  - key: quick\n    rate_limit:\n      \
         - { name: burst, algorithm: token_bucket, capacity: 10, rate: 1000/1ms }\n      \
         - { name: daily, algorithm: fixed_window, limit: 100, window: 1d, align: first_hit }\n",
    );
    let server = Serving::start_config(&dir, &dir.path("conf"), &[], &[]);
    let body = r#"{"namespace":"shop","resource":"quick","domain":"n","hits":5}"#;
    for i in 0..17 {
        let (status, v) = server.json("POST", "/v1/request", Some(body));
        assert_eq!(status, 200, "request {i}: {v}");
        if i == 16 {
            // The answer is the binding bucket's, which is not near.
            assert_eq!(
                (&v["limit"], &v["remaining"]),
                (&Value::from(10), &Value::from(5)),
                "{v}"
            );
            assert_eq!(states(&v)[1], ("daily".to_owned(), 15), "{v}");
        }
    }
    let near = |surface: &str, ns: &str, resource: &str| {
        server
            .metric(&format!(
                r#"tollgate_near_limit_total{{surface="{surface}",namespace="{ns}",resource="{resource}"}}"#
            ))
            .unwrap_or(0.0)
    };
    assert_eq!(near("http", "shop", "quick"), 1.0);
    let json = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"quick","value":"q"}]}],"hitsAddend":5}"#;
    for i in 0..17 {
        let (status, v) = server.json("POST", "/json", Some(json));
        assert_eq!(
            (status, &v["overallCode"]),
            (200, &Value::from("OK")),
            "request {i}: {v}"
        );
    }
    assert_eq!(near("rls_json", "edge", "quick"), 1.0);
}

#[test]
fn two_servers_sharing_redis_decide_a_limits_list_together() {
    let dir = Sandbox::new("limits-redis");
    dir.write("tollgate.yaml", CONFIG);
    let redis = RedisServer::start();
    let a = Serving::start_redis(&dir, &redis.url(), &[], &[]);
    let b = Serving::start_redis(&dir, &redis.url(), &[], &[]);
    http_story(&a, &b, "r");
    // Envoy's RLS on the same Redis: the list in one script call.
    dir.write("conf/tollgate.yaml", CONFIG);
    dir.write("conf/envoy.yaml", ENVOY);
    let url = redis.url();
    let c = Serving::start_config(&dir, &dir.path("conf"), &["--store", url.as_str()], &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(rls_story(format!("http://{}", c.grpc), "redis"));
}

#[test]
fn a_server_on_a_redis_cluster_decides_a_limits_list() {
    let dir = Sandbox::new("limits-redis-cluster");
    dir.write("tollgate.yaml", CONFIG);
    let cluster = RedisCluster::start();
    let a = Serving::start_redis(&dir, &cluster.url(), &[], &[]);
    http_story(&a, &a, "c");
}

#[test]
fn a_gossip_cluster_serves_the_limits_it_can_replicate_and_names_one_it_cannot() {
    let dir = Sandbox::new("limits-cluster");
    dir.write("secret", "0123456789abcdef0123456789abcdef");
    dir.write(
        "good.yaml",
        "
namespaces:
  - name: shop
    resources:
      - name: api
        limits:
          - { name: burst, algorithm: token_bucket, capacity: 3, rate: 1/s }
          - { name: steady, algorithm: gcra, rate: 100/m, burst: 10 }
",
    );
    dir.write("bad.yaml", CONFIG);
    let check = |config: &str| {
        let mut args = vec!["serve", "--check", "--config", config];
        args.extend_from_slice(&common::NODE_N1);
        common::run_clean(&dir.dir, &args, &[])
    };
    let good = check("good.yaml");
    assert!(good.success(), "{good}");
    let bad = check("bad.yaml");
    assert_eq!(bad.code, Some(1), "{bad}");
    assert!(
        bad.stderr.contains(
            "namespace `shop`, resource `api`, limit `daily`: `fixed_window` cannot be replicated"
        ),
        "{bad}"
    );
    // And a node serves the good list: both limits are decided.
    let node = Serving::start_config(&dir, &dir.path("good.yaml"), &common::NODE_N1, &[]);
    let (status, v) = ask(&node, "n", 3);
    assert_eq!(status, 200, "{v}");
    let (status, v) = ask(&node, "n", 1);
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["limited_by_name"], "burst");
    assert_eq!(states(&v).len(), 2);
}

/// Item 4 through the binary: a SaaS's plan brought by the request over
/// HTTP, refused past `override_max`, and Envoy's descriptor `limit`.
#[test]
fn requests_bring_their_own_limits_over_http_and_envoy() {
    use tollgate_proto::rls::rate_limit_descriptor::{Entry, RateLimitOverride};
    use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
    use tollgate_proto::rls::{RateLimitDescriptor, RateLimitRequest};

    let dir = Sandbox::new("limits-override");
    dir.write(
        "conf/tollgate.yaml",
        "
namespaces:
  - name: shop
    resources:
      - name: api
        algorithm: fixed_window
        limit: 5
        window: 1d
        align: first_hit
        allow_override: true
        override_max: 1000/d
",
    );
    dir.write(
        "conf/envoy.yaml",
        "
domain: edge
descriptors:
  - key: user
    rate_limit: { unit: day, requests_per_unit: 100 }
",
    );
    let server = Serving::start_config(&dir, &dir.path("conf"), &[], &[]);
    let ask = |limit: &str| {
        let body = format!(
            r#"{{"namespace":"shop","resource":"api","domain":"t","hits":1,"limit":{limit}}}"#
        );
        server.json("POST", "/v1/request", Some(&body))
    };
    let plan = r#"{"requests_per_unit":2,"unit":"day"}"#;
    for _ in 0..2 {
        let (status, v) = ask(plan);
        assert_eq!((status, &v["limit"]), (200, &Value::from(2)), "{v}");
    }
    let (status, v) = ask(plan);
    assert_eq!(status, 429, "{v}");
    let (status, v) = ask(r#"{"requests_per_unit":2000,"unit":"day"}"#);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["reason"], "invalid_limit_override", "{v}");
    let (status, v) = ask(r#"{"requests_per_unit":2,"unit":"fortnight"}"#);
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("fortnight"),
        "{v}"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut rls = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        let request = |unit: i32| RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: "o".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 1,
                    unit,
                }),
                ..Default::default()
            }],
            hits_addend: 1,
        };
        // Unit 3 is HOUR.
        let a = rls
            .should_rate_limit(request(3))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(a.overall_code, 1, "OK: {a:?}");
        let limit = a.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (1, 3), "{a:?}");
        let a = rls
            .should_rate_limit(request(3))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(a.overall_code, 2, "OVER_LIMIT: {a:?}");
        // UNKNOWN is refused, not guessed.
        let err = rls.should_rate_limit(request(0)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("no unit"), "{err:?}");
    });
    brought_over_native_grpc_and_the_client(&rt, &server);
}

/// The same plan brought over the native gRPC API and by the Rust client
/// (`RequestBuilder::limit`): 2 a day granted twice, then refused; a plan
/// past `override_max` refused naming the reason.
fn brought_over_native_grpc_and_the_client(rt: &tokio::runtime::Runtime, server: &Serving) {
    use tollgate_client::{Client, ClientConfig};
    use tollgate_proto::v1::{self, tollgate_client::TollgateClient};

    rt.block_on(async {
        let mut native = TollgateClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        let request = |per_day: u64| v1::RateRequest {
            namespace: "shop".into(),
            resource: "api".into(),
            domain: "grpc".into(),
            limit: Some(v1::LimitOverride {
                requests_per_unit: per_day,
                unit: "day".into(),
            }),
            ..Default::default()
        };
        for _ in 0..2 {
            let a = native.request(request(2)).await.unwrap().into_inner();
            assert!(a.allowed && a.limit == 2, "{a:?}");
        }
        let a = native.request(request(2)).await.unwrap().into_inner();
        assert!(!a.allowed, "{a:?}");
        let err = native.request(request(2000)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("override_max"), "{err:?}");

        let client =
            Client::new(ClientConfig::new(vec![format!("http://{}", server.grpc)])).unwrap();
        for _ in 0..2 {
            let g = client
                .request("shop", "api", "client")
                .limit(2, "day")
                .send()
                .await
                .unwrap();
            assert_eq!(g.granted, 1);
        }
        match client
            .request("shop", "api", "client")
            .limit(2, "day")
            .send()
            .await
        {
            Err(tollgate_client::Error::Rejected(_)) => {}
            other => panic!("expected a rejection, got {other:?}"),
        }
        match client
            .request("shop", "api", "client")
            .limit(2000, "day")
            .send()
            .await
        {
            Err(tollgate_client::Error::Refused { reason, .. }) => {
                assert_eq!(reason, "invalid_limit_override");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    });
    // And `tollgate request --limit`, without the caller's settings.
    let grpc = server.grpc.to_string();
    let dir = Sandbox::new("limits-override-cli");
    let cli = |limit: &str| {
        let run = common::run_clean(
            &dir.dir,
            &[
                "request", "shop", "api", "cli", "--json", "--server", &grpc, "--limit", limit,
            ],
            &[],
        );
        (run.code, format!("{}{}", run.stdout, run.stderr))
    };
    for _ in 0..2 {
        let (code, text) = cli("2/day");
        assert_eq!(code, Some(0), "{text}");
        assert!(text.contains(r#""limit":2"#), "{text}");
    }
    let (code, text) = cli("2/day");
    assert_eq!(code, Some(1), "rejected: {text}");
    let (code, text) = cli("2000/day");
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("invalid_limit_override"), "{text}");
    let (code, text) = cli("lots/day");
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("is not a count"), "{text}");
}

/// A gossip cluster cannot serve the fixed windows requests bring: a
/// config with `allow_override: true` is refused when it loads, naming
/// the resource, not request by request.
#[test]
fn a_cluster_refuses_a_resource_that_takes_limits_from_requests() {
    let dir = Sandbox::new("limits-override-cluster");
    dir.write(
        "plans.yaml",
        "namespaces:\n  - name: shop\n    resources:\n      \
         - { name: api, algorithm: token_bucket, capacity: 10, rate: 1/s, allow_override: true, override_max: 100/s }\n      \
         - { name: fixed, algorithm: token_bucket, capacity: 10, rate: 1/s }\n",
    );
    let check = |cluster: bool| {
        let mut args = vec!["check-config", "--quiet", "plans.yaml"];
        if cluster {
            args.insert(1, "--cluster");
        }
        common::run_clean(&dir.dir, &args, &[])
    };
    let out = check(true);
    let stderr = &out.stderr;
    assert_eq!(out.code, Some(1), "{stderr}");
    assert!(
        stderr.contains("resource `api`")
            && stderr.contains("`allow_override: true` lets requests bring"),
        "{stderr}"
    );
    assert!(!stderr.contains("resource `fixed`"), "{stderr}");
    // Without `--cluster` the file is valid.
    let out = check(false);
    assert!(out.success(), "{out}");
    // And a node checking its config (`serve --check`) refuses it as it
    // would at startup.
    dir.write("secret", "0123456789abcdef0123456789abcdef");
    let mut args = vec!["serve", "--check", "--config", "plans.yaml"];
    args.extend_from_slice(&common::NODE_N1);
    let out = common::run_clean(&dir.dir, &args, &[]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr
            .contains("namespace `shop`, resource `api`: `allow_override: true`"),
        "{out}"
    );
}
