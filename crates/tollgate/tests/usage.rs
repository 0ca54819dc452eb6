//! Usage reported after the fact (issue 18 item 3), end to end through a
//! real `tollgate serve`: on the HTTP API, the native gRPC API (unary and
//! in a session), the Rust client and Envoy's rate-limit service, a
//! gateway checks before a call with an estimate, reports the real usage
//! (an LLM answer's tokens) after it, is refused while the debt lasts,
//! sees a report past the bound clamped (and counted in a metric), and
//! gives back what it did not use, never past a full bucket.
//!
//! The buckets refill 1000 tokens a day, so no whole token refills during
//! a test: the debt is paid by refunds, and every answer is exact but for
//! the fraction of a token real time refills.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serving::Serving;
use common::Sandbox;
use serde_json::Value;

/// 1000 tokens, refilled 1000 a day, owing at most 500.
const NATIVE: &str = "namespaces:
  - name: llm
    resources:
      - { name: tokens, algorithm: token_bucket, capacity: 1000, rate: 1000/1d, max_debt: 500 }
      - { name: calls, algorithm: smooth_bursty, rate: 5/s }
";

/// The same bucket behind a descriptor charged in report mode, and a
/// plain per-minute limit beside it.
const ENVOY: &str = "domain: gateway
descriptors:
  - key: user
    report: true
    max_debt: 500
    rate_limit: { algorithm: token_bucket, capacity: 1000, rate: 1000/1d }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: blocked
    rate_limit: { unit: second, requests_per_unit: 0 }
";

fn start() -> (Sandbox, Serving) {
    let dir = Sandbox::new("usage");
    dir.write("conf/tollgate.yaml", NATIVE);
    dir.write("conf/envoy.yaml", ENVOY);
    let conf = dir.path("conf");
    let server = Serving::start_config(&dir, &conf, &[], &[]);
    (dir, server)
}

/// The clamped-report counter of namespace `ns`.
fn clamped(server: &Serving, ns: &str) -> f64 {
    server
        .metric(&format!(
            r#"tollgate_reports_clamped_total{{namespace="{ns}"}}"#
        ))
        .unwrap_or(0.0)
}

/// One step of the flow, as every API answers it: allowed, granted.
type Answer = (bool, u64);

/// The flow every API goes through, `ask(mode, hits)` answering each step
/// (`mode` one of `try`, `report`, `refund`).
fn check_before_report_after(mut ask: impl FnMut(&str, u64) -> Answer) {
    // Check with an estimate: 100 tokens.
    assert_eq!(ask("try", 100), (true, 100));
    // The answer used 1300: 1200 more, charged past the limit (300 owed).
    assert_eq!(ask("report", 1200), (true, 1200));
    // The debt blocks the next check, however small.
    assert_eq!(ask("try", 1), (false, 0));
    // A report past the bound is charged up to it (500 owed) and no more.
    assert_eq!(ask("report", 1000), (true, 200));
    assert_eq!(ask("try", 1), (false, 0));
    // Giving back 600 leaves 100: the debt is paid, 100 can be granted.
    assert_eq!(ask("refund", 600), (true, 600));
    assert_eq!(ask("try", 101), (false, 0));
    assert_eq!(ask("try", 100), (true, 100));
    // A refund never fills the bucket past full. (What the bucket refilled
    // since the test began, a fraction of a token, is not counted as given
    // back: 999 of the 1000 then.)
    let (allowed, back) = ask("refund", 5000);
    assert!(allowed && (999..=1000).contains(&back), "{back}");
    assert_eq!(ask("try", 1001), (false, 0));
    assert_eq!(ask("try", 1000), (true, 1000));
}

#[test]
fn check_before_report_after_on_http() {
    let (_dir, server) = start();
    let mut last: Value = Value::Null;
    check_before_report_after(|mode, hits| {
        let body = format!(
            r#"{{"namespace":"llm","resource":"tokens","domain":"http","hits":{hits},"mode":"{mode}"}}"#
        );
        let (status, answer) = server.json("POST", "/v1/request", Some(&body));
        assert_eq!(
            status == 200,
            answer["allowed"] == true,
            "{status} {answer}"
        );
        last = answer.clone();
        (
            answer["allowed"] == true,
            answer["granted"].as_u64().unwrap_or(0),
        )
    });
    assert!(last["allowed"] == true);
    assert_eq!(clamped(&server, "llm"), 1.0);
    // The clamped report names the limit that clamped it.
    let body =
        r#"{"namespace":"llm","resource":"tokens","domain":"http2","hits":5000,"mode":"report"}"#;
    let (status, answer) = server.json("POST", "/v1/request", Some(body));
    assert_eq!(
        (status, &answer["granted"]),
        (200, &Value::from(1500)),
        "{answer}"
    );
    assert_eq!(answer["limited_by"], "limit");
    assert_eq!(answer["remaining"], 0);
    assert_eq!(clamped(&server, "llm"), 2.0);
    // Each kind of hits in its counter, as charged: the checks granted
    // (100, 100, 1000), the reports (1200, 200 up to the bound, 1500),
    // the refunds (600, and up to full).
    assert_eq!(hits(&server, "granted", "llm", "tokens"), 1200.0);
    assert_eq!(hits(&server, "reported", "llm", "tokens"), 2900.0);
    let refunded = hits(&server, "refunded", "llm", "tokens");
    assert!((1599.0..=1600.0).contains(&refunded), "{refunded}");
    // An algorithm without a sound debt is refused, naming it.
    let body = r#"{"namespace":"llm","resource":"calls","domain":"d","hits":3,"mode":"report"}"#;
    let (status, answer) = server.json("POST", "/v1/request", Some(body));
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["reason"], "no_usage");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("smooth_bursty"), "{answer}");
    // An unknown mode names the known ones.
    let body = r#"{"namespace":"llm","resource":"tokens","domain":"d","mode":"later"}"#;
    let (status, text) = server.http("POST", "/v1/request", Some(body));
    assert_eq!(status, 400);
    assert!(text.contains("`report` or `refund`"), "{text}");
}

/// The same flow over HTTP with the Redis store: the decide script
/// charges, clamps and refunds as the memory store does.
#[test]
fn check_before_report_after_on_http_with_redis() {
    let redis = tollgate_redis::testing::RedisServer::start();
    http_flow_on_redis("usage-redis", &redis.url());
}

/// [`check_before_report_after_on_http_with_redis`] and the Envoy flow
/// ([`envoy_flow`]: reports beside checks in one script call, refunds,
/// per-descriptor hits) on a real Redis Cluster, whose script calls go to
/// the slot of each namespace's keys.
#[test]
fn check_before_report_after_on_a_redis_cluster() {
    let cluster = tollgate_redis::testing::RedisCluster::start();
    let url = cluster.url();
    http_flow_on_redis("usage-redis-cluster", &url);
    let dir = Sandbox::new("usage-envoy-redis-cluster");
    dir.write("conf/tollgate.yaml", NATIVE);
    dir.write("conf/envoy.yaml", ENVOY);
    let conf = dir.path("conf");
    let args = ["--store", url.as_str(), "--redis-timeout-ms", "2000"];
    let server = Serving::start_config(&dir, &conf, &args, &[]);
    envoy_flow(&server);
}

/// The HTTP flow by a server on the Redis store at `url`.
fn http_flow_on_redis(name: &str, url: &str) {
    let dir = Sandbox::new(name);
    dir.write("tollgate.yaml", NATIVE);
    let server = Serving::start_redis(&dir, url, &[], &[]);
    check_before_report_after(|mode, hits| {
        let body = format!(
            r#"{{"namespace":"llm","resource":"tokens","domain":"redis","hits":{hits},"mode":"{mode}"}}"#
        );
        let (status, answer) = server.json("POST", "/v1/request", Some(&body));
        assert_eq!(
            status == 200,
            answer["allowed"] == true,
            "{status} {answer}"
        );
        (
            answer["allowed"] == true,
            answer["granted"].as_u64().unwrap_or(0),
        )
    });
    assert_eq!(clamped(&server, "llm"), 1.0);
    assert_eq!(hits(&server, "reported", "llm", "tokens"), 1400.0);
    let body = r#"{"namespace":"llm","resource":"calls","domain":"d","hits":3,"mode":"refund"}"#;
    let (status, answer) = server.json("POST", "/v1/request", Some(body));
    assert_eq!(
        (status, &answer["error"]["reason"]),
        (409, &Value::from("no_usage"))
    );
}

#[test]
fn check_before_report_after_on_native_grpc_and_sessions() {
    use tollgate_proto::v1::{
        self, session_request, session_response, tollgate_client::TollgateClient,
    };

    let (_dir, server) = start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mode = |m: &str| match m {
        "report" => v1::Mode::Report,
        "refund" => v1::Mode::Refund,
        _ => v1::Mode::Try,
    } as i32;
    let request = |domain: &str, m: &str, hits: u64| v1::RateRequest {
        namespace: "llm".into(),
        resource: "tokens".into(),
        domain: domain.into(),
        hits: Some(hits),
        mode: mode(m),
        ..Default::default()
    };
    rt.block_on(async {
        let mut native = TollgateClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        let mut answers = Vec::new();
        for (m, hits) in FLOW {
            let a = native
                .request(request("grpc", m, *hits))
                .await
                .unwrap()
                .into_inner();
            answers.push((a.allowed, a.granted));
        }
        replay_flow(&answers);
        // The same in a session.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut stream = native
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let mut answers = Vec::new();
        for (id, (m, hits)) in FLOW.iter().enumerate() {
            tx.send(v1::SessionRequest {
                id: id as u64,
                op: Some(session_request::Op::Request(request("session", m, *hits))),
            })
            .await
            .unwrap();
            let a = stream.message().await.unwrap().unwrap();
            let Some(session_response::Result::Request(r)) = a.result else {
                panic!("{a:?}");
            };
            answers.push((r.allowed, r.granted));
        }
        replay_flow(&answers);
        // Refused for an algorithm without a debt: FAILED_PRECONDITION.
        let mut calls = request("grpc", "refund", 1);
        calls.resource = "calls".into();
        let err = native.request(calls).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
        assert!(err.message().contains("smooth_bursty"), "{err}");
    });
}

#[test]
fn check_before_report_after_with_the_rust_client() {
    use tollgate_client::{Client, ClientConfig};

    let (_dir, server) = start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client =
            Client::new(ClientConfig::new(vec![format!("http://{}", server.grpc)])).unwrap();
        let mut answers = Vec::new();
        for (m, hits) in FLOW {
            let b = client.request("llm", "tokens", "client").hits(*hits);
            let b = match *m {
                "report" => b.report(),
                "refund" => b.refund(),
                _ => b,
            };
            answers.push(match b.send().await {
                Ok(g) => {
                    assert!(!g.is_degraded());
                    (true, g.granted)
                }
                Err(tollgate_client::Error::Rejected(_)) => (false, 0),
                Err(e) => panic!("{e}"),
            });
        }
        replay_flow(&answers);
    });
}

#[test]
fn check_before_report_after_on_envoy_rls() {
    let (_dir, server) = start();
    envoy_flow(&server);
}

/// The Envoy flow with the Redis store: the decide script takes each
/// descriptor's own hits, and refunds beside checks, as the memory store.
#[test]
fn check_before_report_after_on_envoy_rls_with_redis() {
    let redis = tollgate_redis::testing::RedisServer::start();
    let dir = Sandbox::new("usage-envoy-redis");
    dir.write("conf/tollgate.yaml", NATIVE);
    dir.write("conf/envoy.yaml", ENVOY);
    let conf = dir.path("conf");
    let url = redis.url();
    let args = ["--store", url.as_str(), "--redis-timeout-ms", "2000"];
    let server = Serving::start_config(&dir, &conf, &args, &[]);
    envoy_flow(&server);
}

/// Check before, report after, over Envoy's rate-limit service: the
/// `report: true` user and the checked path of [`ENVOY`], with
/// descriptors' own hits and refunds beside checks.
fn envoy_flow(server: &Serving) {
    use tollgate_proto::rls::rate_limit_descriptor::Entry;
    use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
    use tollgate_proto::rls::{RateLimitDescriptor, RateLimitRequest};

    let rt = tokio::runtime::Runtime::new().unwrap();
    let descriptor = |key: &str, value: &str, negative: bool| RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        is_negative_hits: negative,
        ..Default::default()
    };
    // A descriptor asking for no hits at all: its own `hits_addend` of 0
    // (the request's 0 means 1, as upstream reads it).
    let probe = |key: &str, value: &str| {
        let mut d = descriptor(key, value, false);
        d.hits_addend.get_or_insert_with(Default::default).value = 0;
        vec![d]
    };
    rt.block_on(async {
        let rls = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        let ask = |descriptors: Vec<RateLimitDescriptor>, hits: u32| {
            let req = RateLimitRequest {
                domain: "gateway".into(),
                descriptors,
                hits_addend: hits,
            };
            let mut rls = rls.clone();
            async move { rls.should_rate_limit(req).await.unwrap().into_inner() }
        };
        const OK: i32 = 1;
        const OVER: i32 = 2;
        let user = |negative| vec![descriptor("user", "alice", negative)];
        // The check at the request's start: no hits, is the bucket
        // exhausted? (A `report: true` descriptor with hits is charged.)
        let a = ask(probe("user", "alice"), 1).await;
        assert_eq!(a.overall_code, OK, "{a:?}");
        assert_eq!(a.statuses[0].limit_remaining, 1000);
        // At the stream's end: 1300 tokens, charged past the limit.
        let a = ask(user(false), 1300).await;
        assert_eq!(a.overall_code, OK, "usage is never refused: {a:?}");
        assert_eq!(a.statuses[0].limit_remaining, 0);
        // The next request's check is refused while the debt lasts.
        let a = ask(probe("user", "alice"), 1).await;
        assert_eq!(a.overall_code, OVER, "{a:?}");
        // A report past the bound is clamped, and counted.
        let a = ask(user(false), 1000).await;
        assert_eq!(a.overall_code, OK, "{a:?}");
        // `is_negative_hits` gives 600 back: 100 left, the check passes.
        let a = ask(user(true), 600).await;
        assert_eq!(a.overall_code, OK, "{a:?}");
        let a = ask(probe("user", "alice"), 1).await;
        assert_eq!(a.overall_code, OK, "{a:?}");
        assert_eq!(a.statuses[0].limit_remaining, 100);
        // A request mixing a checked descriptor and a reported one: the
        // path is checked (and counted), the user charged whatever it says.
        let mixed = vec![
            descriptor("path", "/chat", false),
            descriptor("user", "alice", false),
        ];
        let a = ask(mixed, 150).await;
        assert_eq!(
            a.overall_code, OVER,
            "150 is over the path's 100 a minute: {a:?}"
        );
        assert_eq!(a.statuses[0].code, OVER);
        assert_eq!(a.statuses[1].code, OK);
        assert_eq!(a.statuses[1].limit_remaining, 0, "the user was charged 150");
        // Refunds never pass a full bucket.
        let a = ask(user(true), 5000).await;
        assert_eq!(a.overall_code, OK, "{a:?}");
        let a = ask(probe("user", "alice"), 1).await;
        assert_eq!(a.statuses[0].limit_remaining, 1000);
        // One request both checking and giving back, each descriptor with
        // its own hits (Envoy's descriptor-level `hits_addend`): alice
        // reports 300, then the next request checks 1 on the path and
        // refunds 200 of them.
        let a = ask(user(false), 300).await;
        assert_eq!(a.statuses[0].limit_remaining, 700, "{a:?}");
        let own = |mut d: RateLimitDescriptor, hits: u64| {
            d.hits_addend.get_or_insert_with(Default::default).value = hits;
            d
        };
        let a = ask(
            vec![
                own(descriptor("path", "/chat", false), 1),
                own(descriptor("user", "alice", true), 200),
            ],
            1,
        )
        .await;
        assert_eq!(a.overall_code, OK, "{a:?}");
        assert_eq!(a.statuses[0].limit_remaining, 99, "the path was checked");
        assert_eq!(a.statuses[1].limit_remaining, 900, "alice got 200 back");
        // A refund goes through even when the check beside it fails.
        let a = ask(
            vec![
                own(descriptor("path", "/chat", false), 500),
                own(descriptor("user", "alice", true), 100),
            ],
            1,
        )
        .await;
        assert_eq!(a.overall_code, OVER, "{a:?}");
        let a = ask(probe("user", "alice"), 1).await;
        assert_eq!(a.statuses[0].limit_remaining, 1000);
    });
    assert_eq!(clamped(server, "gateway"), 1.0);
    // The hits counters: alice's reports as charged (1300, 200 of the
    // 1000 past the bound, 150 beside a refused check, 300), her refunds
    // as given back (600, up to full from 50 owed, 200, 100 beside a
    // refused check: the two refunds that reach full give back a token
    // less for the fraction real time refilled), and the path's one
    // grant: never what a refused check asked, and no usage counted as
    // granted.
    assert_eq!(hits(server, "reported", "gateway", "user"), 1950.0);
    let refunded = hits(server, "refunded", "gateway", "user");
    assert!((1948.0..=1950.0).contains(&refunded), "{refunded}");
    assert_eq!(hits(server, "granted", "gateway", "user"), 0.0);
    assert_eq!(hits(server, "granted", "gateway", "path"), 1.0);
}

/// `tollgate_hits_{what}_total` of `namespace` and `resource` (0 when the
/// series does not exist).
fn hits(server: &Serving, what: &str, namespace: &str, resource: &str) -> f64 {
    server
        .metric(&format!(
            r#"tollgate_hits_{what}_total{{namespace="{namespace}",resource="{resource}"}}"#
        ))
        .unwrap_or(0.0)
}

/// A descriptor of one entry asking `hits` of its own (Envoy's
/// descriptor-level `hits_addend`).
fn own(key: &str, value: &str, hits: u64) -> tollgate_proto::rls::RateLimitDescriptor {
    let mut d = tollgate_proto::rls::RateLimitDescriptor {
        entries: vec![tollgate_proto::rls::rate_limit_descriptor::Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    };
    d.hits_addend.get_or_insert_with(Default::default).value = hits;
    d
}

/// A rate-limit service client asking in domain `gateway`.
struct Gateway(
    tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient<
        tonic::transport::Channel,
    >,
);

impl Gateway {
    async fn connect(server: &Serving) -> Gateway {
        let url = format!("http://{}", server.grpc);
        Gateway(
            tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient::connect(url)
                .await
                .unwrap(),
        )
    }

    /// The answer to `descriptors`, with a request `hits_addend` of 1.
    async fn ask(
        &self,
        descriptors: Vec<tollgate_proto::rls::RateLimitDescriptor>,
    ) -> tollgate_proto::rls::RateLimitResponse {
        let req = tollgate_proto::rls::RateLimitRequest {
            domain: "gateway".into(),
            descriptors,
            hits_addend: 1,
        };
        self.0
            .clone()
            .should_rate_limit(req)
            .await
            .unwrap()
            .into_inner()
    }
}

/// A deny refuses the request, but usage beside it happened and is
/// charged (review of the hits counters): on the memory store and on
/// Redis, a report beside a `requests_per_unit: 0` descriptor is
/// OVER_LIMIT overall, its counter charged, the check beside it not.
#[test]
fn a_deny_beside_a_report_refuses_the_request_and_charges_the_report() {
    let (_dir, memory) = start();
    deny_beside_report(&memory);
    let redis = tollgate_redis::testing::RedisServer::start();
    let dir = Sandbox::new("usage-deny-redis");
    dir.write("conf/envoy.yaml", ENVOY);
    let url = redis.url();
    let args = ["--store", url.as_str(), "--redis-timeout-ms", "2000"];
    let on_redis = Serving::start_config(&dir, &dir.path("conf"), &args, &[]);
    deny_beside_report(&on_redis);
}

fn deny_beside_report(server: &Serving) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let rls = Gateway::connect(server).await;
        let ask = |descriptors| rls.ask(descriptors);
        let a = ask(vec![
            own("path", "/d", 1),
            own("user", "dora", 300),
            own("blocked", "x", 1),
        ])
        .await;
        assert_eq!(a.overall_code, 2, "OVER_LIMIT: {a:?}");
        let codes: Vec<i32> = a.statuses.iter().map(|s| s.code).collect();
        assert_eq!(codes, [1, 1, 2], "only the deny is over: {a:?}");
        // The path was not charged; dora's 300 were.
        let a = ask(vec![own("path", "/d", 0), own("user", "dora", 0)]).await;
        assert_eq!(a.statuses[0].limit_remaining, 100, "{a:?}");
        assert_eq!(a.statuses[1].limit_remaining, 700, "{a:?}");
    });
    assert_eq!(hits(server, "reported", "gateway", "user"), 300.0);
}

/// Regressions (review of the per-descriptor hits change): a report
/// charged its own hits beside a check, clamped by more than the
/// request's `hits_addend`, is counted in the clamped-hits metric with
/// what was dropped (it counted the request's hits at most); and a
/// zero-hit check of an exhausted `report: true` descriptor beside a
/// descriptor charged its own hits refuses without charging it.
#[test]
fn envoy_descriptors_with_their_own_hits_count_clamps_and_probe_first() {
    let (_dir, server) = start();
    own_hits_flow(&server);
}

/// [`envoy_descriptors_with_their_own_hits_count_clamps_and_probe_first`]
/// with the Redis store: the script asks each item its own hits, and an
/// inspection of the uncharged check reads its counters as they stand.
#[test]
fn envoy_descriptors_with_their_own_hits_on_redis() {
    let redis = tollgate_redis::testing::RedisServer::start();
    let dir = Sandbox::new("usage-own-redis");
    dir.write("conf/envoy.yaml", ENVOY);
    let conf = dir.path("conf");
    let url = redis.url();
    let args = ["--store", url.as_str(), "--redis-timeout-ms", "2000"];
    let server = Serving::start_config(&dir, &conf, &args, &[]);
    own_hits_flow(&server);
}

fn own_hits_flow(server: &Serving) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let rls = Gateway::connect(server).await;
        let ask = |descriptors| rls.ask(descriptors);
        const OK: i32 = 1;
        const OVER: i32 = 2;
        // 1 on the path, 2000 tokens reported: 1000 + 500 owed, 500
        // dropped.
        let a = ask(vec![own("path", "/a", 1), own("user", "bob", 2000)]).await;
        assert_eq!(a.overall_code, OK, "{a:?}");
        assert_eq!(a.statuses[0].limit_remaining, 99);
        // Bob owes: his check beside 1 on the path is refused, and the
        // path is not charged.
        let a = ask(vec![own("path", "/a", 1), own("user", "bob", 0)]).await;
        assert_eq!(a.overall_code, OVER, "{a:?}");
        assert_eq!(a.statuses[0].code, OK, "{a:?}");
        assert_eq!(a.statuses[1].code, OVER, "{a:?}");
        let a = ask(vec![own("path", "/a", 0)]).await;
        assert_eq!(a.statuses[0].limit_remaining, 99, "{a:?}");
    });
    assert_eq!(clamped(server, "gateway"), 1.0);
    let dropped = server
        .metric(r#"tollgate_report_clamped_hits_total{namespace="gateway"}"#)
        .unwrap_or(0.0);
    assert_eq!(dropped, 500.0);
}

/// The flow of [`check_before_report_after`] as a list, for APIs driven
/// from async code.
const FLOW: &[(&str, u64)] = &[
    ("try", 100),
    ("report", 1200),
    ("try", 1),
    ("report", 1000),
    ("try", 1),
    ("refund", 600),
    ("try", 101),
    ("try", 100),
    ("refund", 5000),
    ("try", 1001),
    ("try", 1000),
];

/// Checks answers collected for [`FLOW`] against the flow's expectations.
fn replay_flow(answers: &[Answer]) {
    let mut i = 0;
    check_before_report_after(|mode, hits| {
        assert_eq!((mode, hits), FLOW[i], "the flow and FLOW agree");
        i += 1;
        answers[i - 1]
    });
    assert_eq!(i, answers.len());
}

/// A gossip cluster of two nodes: `tokens` replicated with the `counter`
/// strategy (which takes usage), `plain` with `queue` (which does not).
const CLUSTER: &str = "namespaces:
  - name: llm
    resources:
      - { name: tokens, algorithm: token_bucket, capacity: 1000, rate: 1000/1d, max_debt: 500, replication: counter }
      - { name: plain, algorithm: token_bucket, capacity: 1000, rate: 1000/1d, replication: queue }
";

/// The check-before / report-after flow in a gossip cluster (issue 18's
/// gap: usage in a gossip cluster; it used to be refused with
/// `no_usage`), its steps spread over two nodes: each node decides on
/// what the other charged, reported or refunded, once gossip brought it,
/// so the cluster answers the flow as one bucket does. A queue-replicated
/// resource refuses a report (`no_usage`, naming the strategy).
#[test]
fn check_before_report_after_in_a_gossip_cluster() {
    let dir = Sandbox::new("usage-cluster");
    dir.write("tollgate.yaml", CLUSTER);
    dir.write("secret", "an end-to-end test secret, long enough\n");
    let n1 = Serving::start_node(&dir, "u", "n1", "127.0.0.1:0", &[], &[]);
    let n2 = Serving::start_node(&dir, "u", "n2", "127.0.0.1:0", &[n1.gossip()], &[]);
    let nodes = [&n1, &n2];
    for node in nodes {
        node.poll("the cluster forms", |s| {
            s.http("GET", "/readyz", None).0 == 200
                && s.metric("tollgate_cluster_peers_alive") == Some(1.0)
        });
    }
    let merges = |s: &Serving| s.metric("tollgate_gossip_merges_total").unwrap_or(0.0);
    // Step `i` goes to node `i % 2`; a step that changed the bucket is
    // waited for until the other node merged it.
    let mut step = 0;
    check_before_report_after(|mode, hits| {
        let (at, other) = (nodes[step % 2], nodes[(step + 1) % 2]);
        step += 1;
        let before = merges(other);
        let body = format!(
            r#"{{"namespace":"llm","resource":"tokens","domain":"c","hits":{hits},"mode":"{mode}"}}"#
        );
        let (status, answer) = at.json("POST", "/v1/request", Some(&body));
        assert_eq!(
            status == 200,
            answer["allowed"] == true,
            "{status} {answer}"
        );
        let granted = answer["granted"].as_u64().unwrap_or(0);
        if granted > 0 {
            other.poll("the other node merges the change", |s| merges(s) > before);
        }
        (answer["allowed"] == true, granted)
    });
    // The queue strategy takes no usage: refused, naming it.
    let body = r#"{"namespace":"llm","resource":"plain","domain":"d","hits":3,"mode":"report"}"#;
    let (status, answer) = n2.json("POST", "/v1/request", Some(body));
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["reason"], "no_usage");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("replicated_queue"), "{answer}");
    assert!(message.contains("replication: counter"), "{answer}");
    n2.terminate();
    n1.terminate();
}

/// A resource that takes usage (`report: true` or `max_debt`) but is
/// replicated with a strategy that has no debt is a config error when a
/// cluster loads it, naming the resource and the field.
#[test]
fn a_cluster_refuses_usage_fields_on_a_strategy_without_a_debt() {
    let dir = Sandbox::new("usage-cluster-config");
    dir.write(
        "queue.yaml",
        "namespaces:\n  - name: llm\n    resources:\n      \
         - { name: q, algorithm: token_bucket, capacity: 10, rate: 1/s, max_debt: 5, replication: queue }\n      \
         - { name: e, algorithm: token_bucket, capacity: 10, rate: 1/s, report: true, replication: epoch }\n      \
         - { name: c, algorithm: token_bucket, capacity: 10, rate: 1/s, report: true, replication: counter }\n",
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .current_dir(dir.path("."))
        .args(["check-config", "--cluster", "--quiet", "queue.yaml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("(2 problems"), "{stderr}");
    assert!(
        stderr.contains("resource `q`")
            && stderr.contains("`max_debt` needs every limit to owe hits"),
        "{stderr}"
    );
    assert!(stderr.contains("`replicated_queue`"), "{stderr}");
    assert!(
        stderr.contains("resource `e`") && stderr.contains("`report: true` needs"),
        "{stderr}"
    );
    assert!(!stderr.contains("resource `c`"), "{stderr}");
    // Without `--cluster` (one server, any store) the same file is fine.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .current_dir(dir.path("."))
        .args(["check-config", "--quiet", "queue.yaml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
