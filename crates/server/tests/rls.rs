//! Envoy's rate-limit service v3 and envoyproxy/ratelimit's `POST /json`
//! through real sockets: the real tonic client against the server's gRPC
//! port, and an HTTP client against `/json`, both on the server's HTTP
//! port and mounted alone by a tiny router of this file.
//!
//! Every limit is per day (or longer) and windows are aligned to the epoch,
//! so counts cannot reset in the middle of a test except across midnight
//! UTC.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use common::TestServer;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tollgate_core::Nanos;
use tollgate_proto::rls::descriptor;
use tollgate_proto::rls::rate_limit_response::rate_limit::Unit;
use tollgate_proto::rls::rate_limit_response::{Code, DescriptorStatus};
use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::rls::rate_limit_service_server::RateLimitServiceServer;
use tollgate_proto::rls::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use tollgate_server::rls::Rls;
use tollgate_server::App;
use tollgate_service::ManualClock;
use tollgate_store::MemoryStore;
use tonic::transport::Channel;

const CONFIG: &str = r#"
domain: shop
descriptors:
  # Matching preference: exact value, then wildcard, then key only.
  - key: path
    value: /exact
    rate_limit: { unit: day, requests_per_unit: 1, name: exact }
  - key: path
    value: /ex*
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: path
    rate_limit: { unit: day, requests_per_unit: 3 }
  # Nested: only user + plan=free has a limit.
  - key: user
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: day, requests_per_unit: 2 }
  - key: api
    rate_limit: { unit: day, requests_per_unit: 3 }
  - key: small
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: big
    rate_limit: { unit: day, requests_per_unit: 5 }
  - key: hits
    rate_limit: { unit: day, requests_per_unit: 10 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: free
    rate_limit: { unlimited: true }
  - key: closed
    rate_limit: { unit: week, requests_per_unit: 0 }
  - key: tenant
    rate_limit: { unit: day, requests_per_unit: 1, name: tenant_default }
  - key: vip
    rate_limit: { unit: day, requests_per_unit: 100, replaces: [ { name: tenant_default } ] }
  - key: log
    rate_limit: { algorithm: sliding_log, limit: 2, window: 1h, name: hourly }
  - key: bucket
    rate_limit: { algorithm: token_bucket, capacity: 4, rate: 1/min }
  - key: daily
    rate_limit: { algorithm: fixed_window, limit: 2, window: 1d, align: first_hit }
---
namespaces:
  - name: native
    resources:
      - { name: api, algorithm: token_bucket, capacity: 3, rate: 1/min }
"#;

/// `d` with its own `hits_addend` (the wrapper type is reached through the
/// field: `tollgate_proto` does not re-export it by name).
fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    d.hits_addend.get_or_insert_with(Default::default).value = hits;
    d
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: hits,
    }
}

/// One descriptor `[key=value]` of domain `shop`, one hit.
fn one(key: &str, value: &str) -> RateLimitRequest {
    request("shop", vec![descriptor(&[(key, value)])], 0)
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
) -> RateLimitResponse {
    client.should_rate_limit(r).await.unwrap().into_inner()
}

fn code(c: i32) -> Code {
    Code::try_from(c).unwrap()
}

fn limit_of(s: &DescriptorStatus) -> (u32, Unit) {
    let l = s.current_limit.as_ref().expect("a current_limit");
    (l.requests_per_unit, Unit::try_from(l.unit).unwrap())
}

fn reset_secs(s: &DescriptorStatus) -> f64 {
    let d = s
        .duration_until_reset
        .as_ref()
        .expect("a duration_until_reset");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

/// An app over `yaml`, for servers this file builds itself.
fn app(yaml: &str) -> Arc<App<MemoryStore>> {
    app_at(yaml, Arc::new(tollgate_service::SystemClock))
}

/// [`app`], reading time from `clock`.
fn app_at(yaml: &str, clock: Arc<dyn tollgate_service::Clock>) -> Arc<App<MemoryStore>> {
    let loaded = tollgate_config::load_str("test.yaml", yaml).unwrap();
    Arc::new(
        App::builder(MemoryStore::new(), "memory", loaded.config)
            .clock(clock)
            .build()
            .unwrap(),
    )
}

/// Serves only the RLS service, with response headers on, on a free
/// loopback port; it stops when the returned sender is dropped.
async fn rls_with_headers(
    app: Arc<App<MemoryStore>>,
) -> (RateLimitServiceClient<Channel>, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(
                Rls::new(app).with_headers(true),
            ))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    (client, stop)
}

/// Serves only `POST /json` on a free loopback port (the handler as the
/// HTTP router mounts it).
async fn json_server(app: Arc<App<MemoryStore>>) -> SocketAddr {
    let router = axum::Router::new()
        .route(
            "/json",
            axum::routing::post(tollgate_server::rls_json::json::<MemoryStore>),
        )
        .with_state(app);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

#[tokio::test]
async fn exact_value_beats_wildcard_beats_key_only() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    // `/exact` also starts with `/ex` and has a key-only sibling: the
    // exact node wins, with its own name.
    let r = ask(&mut rls, one("path", "/exact")).await;
    assert_eq!(limit_of(&r.statuses[0]), (1, Unit::Day));
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "exact");
    // `/exa` matches the wildcard and the key-only node: the wildcard wins.
    let r = ask(&mut rls, one("path", "/exa")).await;
    assert_eq!(limit_of(&r.statuses[0]), (2, Unit::Day));
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "");
    // Anything else: the key-only node.
    let r = ask(&mut rls, one("path", "/other")).await;
    assert_eq!(limit_of(&r.statuses[0]), (3, Unit::Day));
    // And each limit really applies: the exact one is spent after 1.
    let r = ask(&mut rls, one("path", "/exact")).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let r = ask(&mut rls, one("path", "/exa")).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

#[tokio::test]
async fn nested_descriptors_match_the_whole_path() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    let free = |user: &str| {
        request(
            "shop",
            vec![descriptor(&[("user", user), ("plan", "free")])],
            0,
        )
    };
    let r = ask(&mut rls, free("alice")).await;
    assert_eq!(limit_of(&r.statuses[0]), (2, Unit::Day));
    assert_eq!(r.statuses[0].limit_remaining, 1);
    ask(&mut rls, free("alice")).await;
    assert_eq!(
        code(ask(&mut rls, free("alice")).await.overall_code),
        Code::OverLimit
    );
    // Each user has a counter of their own.
    let r = ask(&mut rls, free("bob")).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    // The parent alone, or another plan, has no limit: OK, nothing else.
    for d in [
        descriptor(&[("user", "alice")]),
        descriptor(&[("user", "alice"), ("plan", "pro")]),
        descriptor(&[("user", "alice"), ("plan", "free"), ("deeper", "x")]),
    ] {
        let r = ask(&mut rls, request("shop", vec![d], 0)).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None);
    }
}

#[tokio::test]
async fn remaining_counts_down_then_over_limit() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    for left in [2, 1, 0] {
        let r = ask(&mut rls, one("api", "k")).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        let s = &r.statuses[0];
        assert_eq!(code(s.code), Code::Ok);
        assert_eq!(s.limit_remaining, left);
        assert_eq!(limit_of(s), (3, Unit::Day));
        assert!(reset_secs(s) > 0.0 && reset_secs(s) <= 86_400.0);
    }
    for _ in 0..2 {
        let r = ask(&mut rls, one("api", "k")).await;
        assert_eq!(code(r.overall_code), Code::OverLimit);
        let s = &r.statuses[0];
        assert_eq!(code(s.code), Code::OverLimit);
        assert_eq!(s.limit_remaining, 0);
        assert_eq!(limit_of(s), (3, Unit::Day));
        assert!(reset_secs(s) > 0.0 && reset_secs(s) <= 86_400.0);
    }
    // Another value is another counter.
    let r = ask(&mut rls, one("api", "other")).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn one_descriptor_over_limit_consumes_from_none() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    ask(&mut rls, one("small", "x")).await;
    let both = request(
        "shop",
        vec![descriptor(&[("small", "x")]), descriptor(&[("big", "x")])],
        0,
    );
    for _ in 0..3 {
        let r = ask(&mut rls, both.clone()).await;
        assert_eq!(code(r.overall_code), Code::OverLimit);
        // In request order: the spent one is over, the other is within.
        assert_eq!(code(r.statuses[0].code), Code::OverLimit);
        assert_eq!(code(r.statuses[1].code), Code::Ok);
        assert_eq!(r.statuses[1].limit_remaining, 5);
    }
    // `big` was never charged by the rejected requests.
    let r = ask(&mut rls, one("big", "x")).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
}

#[tokio::test]
async fn hits_addend_zero_is_one_and_larger_values_count() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    let hits = |n: u32| request("shop", vec![descriptor(&[("hits", "a")])], n);
    let r = ask(&mut rls, hits(0)).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
    let r = ask(&mut rls, hits(5)).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
    // 5 more do not fit in 4: rejected, nothing charged. Over its limit,
    // the descriptor says 0 remaining (as upstream); a check without
    // charging still finds the 4.
    let r = ask(&mut rls, hits(5)).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let check = request("shop", vec![with_hits(descriptor(&[("hits", "a")]), 0)], 0);
    assert_eq!(ask(&mut rls, check).await.statuses[0].limit_remaining, 4);
    // A descriptor's own hits_addend overrides the request's.
    let own = request("shop", vec![with_hits(descriptor(&[("hits", "a")]), 3)], 5);
    let r = ask(&mut rls, own).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    // ... and 0 there checks without charging.
    let check = request("shop", vec![with_hits(descriptor(&[("hits", "a")]), 0)], 0);
    let r = ask(&mut rls, check).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    // Huge values are over limit, not a crash.
    let r = ask(&mut rls, hits(u32::MAX)).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let huge = request(
        "shop",
        vec![with_hits(descriptor(&[("hits", "a")]), u64::MAX)],
        0,
    );
    let r = ask(&mut rls, huge).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 0);
}

/// Issue 23: 6 hits on the 5-a-day `message_type_marketing.to_number`
/// limit of examples/envoy-messaging.yaml answered OVER_LIMIT with
/// `limit_remaining: 5` and `duration_until_reset: 0s` (the counter, which
/// all-or-nothing left untouched). Over its limit a descriptor says 0
/// remaining and when its window ends, over gRPC and `/json` alike.
#[tokio::test]
async fn more_hits_than_the_limit_are_over_with_nothing_remaining_until_the_window_ends() {
    const MESSAGING: &str = include_str!("../../../examples/envoy-messaging.yaml");
    // 10:00 UTC: the day's window ends in 14 hours.
    let day = 86_400;
    let clock = Arc::new(ManualClock::new(Nanos::from_secs(19_000 * day + 36_000)));
    let server = TestServer::start_clocked(MESSAGING, Arc::clone(&clock)).await;
    let mut rls = server.rls().await;
    let marketing = |number: &str, hits: u32| {
        request(
            "messaging",
            vec![descriptor(&[
                ("message_type", "marketing"),
                ("to_number", number),
            ])],
            hits,
        )
    };
    let r = ask(&mut rls, marketing("4145551234", 6)).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let s = &r.statuses[0];
    assert_eq!(code(s.code), Code::OverLimit);
    assert_eq!(limit_of(s), (5, Unit::Day));
    assert_eq!(s.limit_remaining, 0);
    assert_eq!(reset_secs(s), 50_400.0);
    // Nothing was charged: the next hit finds all 5.
    let r = ask(&mut rls, marketing("4145551234", 1)).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(reset_secs(&r.statuses[0]), 50_400.0);

    let body = json!({"domain": "messaging", "descriptors": [{"entries": [
        {"key": "message_type", "value": "marketing"},
        {"key": "to_number", "value": "4145559999"}]}], "hitsAddend": 6});
    let r = reqwest::Client::new()
        .post(server.http_url("/json"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        json!({"overallCode": "OVER_LIMIT", "statuses": [{"code": "OVER_LIMIT",
            "currentLimit": {"requestsPerUnit": 5, "unit": "DAY"},
            "limitRemaining": 0, "durationUntilReset": "50400s"}]})
    );

    // The RateLimit-* headers describe it the same way.
    let (mut rls, _stop) = rls_with_headers(app_at(MESSAGING, clock)).await;
    let r = ask(&mut rls, marketing("4145551234", 6)).await;
    assert_eq!(
        headers_of(&r),
        [
            ("RateLimit-Limit", "5"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "50400")
        ]
    );
}

/// The example of docs/envoy-rls.md §4: the headers of the first and the
/// 101st request of a day on the 100-a-day `to_number` limit, at 10:00 UTC.
#[tokio::test]
async fn the_documented_header_example_holds() {
    const MESSAGING: &str = include_str!("../../../examples/envoy-messaging.yaml");
    let clock = Arc::new(ManualClock::new(Nanos::from_secs(19_000 * 86_400 + 36_000)));
    let (mut rls, _stop) = rls_with_headers(app_at(MESSAGING, clock)).await;
    let number = || {
        request(
            "messaging",
            vec![descriptor(&[("to_number", "4145551234")])],
            0,
        )
    };
    let r = ask(&mut rls, number()).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(
        headers_of(&r),
        [
            ("RateLimit-Limit", "100"),
            ("RateLimit-Remaining", "99"),
            ("RateLimit-Reset", "50400")
        ]
    );
    for _ in 1..100 {
        ask(&mut rls, number()).await;
    }
    let r = ask(&mut rls, number()).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(
        headers_of(&r),
        [
            ("RateLimit-Limit", "100"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "50400")
        ]
    );
}

/// The response headers to add, as `(name, value)`.
fn headers_of(r: &RateLimitResponse) -> Vec<(&str, &str)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect()
}

/// Review of issue 23: an extension whose window is a whole unit (a
/// `fixed_window` of 1d aligned on the first hit) reports unit DAY, and
/// its over-limit reset was the end of the UTC day, not when its own
/// window (started by a first hit now) would end.
#[tokio::test]
async fn more_hits_than_a_first_hit_day_report_a_day_not_utc_midnight() {
    // 10:00 UTC: midnight is 14 hours away; a first-hit window, 24.
    let day = 86_400;
    let clock = Arc::new(ManualClock::new(Nanos::from_secs(19_000 * day + 36_000)));
    let server = TestServer::start_clocked(CONFIG, Arc::clone(&clock)).await;
    let mut rls = server.rls().await;
    let r = ask(
        &mut rls,
        request("shop", vec![descriptor(&[("daily", "z")])], 3),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(limit_of(&r.statuses[0]), (2, Unit::Day));
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(reset_secs(&r.statuses[0]), 86_400.0);
}

/// The same rule for limits that are not "N per unit" and for shadow
/// mode: over with a fresh counter says 0 remaining and the time a used-up
/// counter takes to be fresh again.
#[tokio::test]
async fn more_hits_than_an_extension_or_shadow_limit_report_nothing_remaining() {
    let clock = Arc::new(ManualClock::new(Nanos::from_secs(1_700_000_000)));
    let server = TestServer::start_clocked(CONFIG, Arc::clone(&clock)).await;
    let mut rls = server.rls().await;
    // A token bucket of 4 refilling 1 a minute: empty to full is 4 minutes.
    let r = ask(
        &mut rls,
        request("shop", vec![descriptor(&[("bucket", "x")])], 5),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(limit_of(&r.statuses[0]), (4, Unit::Unknown));
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(reset_secs(&r.statuses[0]), 240.0);
    // A shadow limit of 1 a day, asked for 2: OK, but over, so 0 left.
    let r = ask(
        &mut rls,
        request("shop", vec![descriptor(&[("shadow", "y")])], 2),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(code(r.statuses[0].code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(reset_secs(&r.statuses[0]) > 0.0);
}

#[tokio::test]
async fn shadow_mode_answers_ok_with_nothing_remaining() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    for _ in 0..3 {
        let r = ask(&mut rls, one("shadow", "s")).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        let s = &r.statuses[0];
        assert_eq!(code(s.code), Code::Ok);
        // The limit is reported and counted: what a real limit would say.
        assert_eq!(limit_of(s), (1, Unit::Day));
        assert_eq!(s.limit_remaining, 0);
    }
    // An over-limit shadow limit does not block a request's other
    // descriptors, which are charged.
    let r = ask(
        &mut rls,
        request(
            "shop",
            vec![descriptor(&[("shadow", "s")]), descriptor(&[("big", "s")])],
            0,
        ),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses[1].limit_remaining, 4);
}

#[tokio::test]
async fn unlimited_and_unmatched_answer_ok_without_a_limit() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    for _ in 0..20 {
        let r = ask(
            &mut rls,
            request(
                "shop",
                vec![
                    descriptor(&[("free", "x")]),
                    descriptor(&[("nothing", "x")]),
                ],
                1000,
            ),
        )
        .await;
        assert_eq!(code(r.overall_code), Code::Ok);
        for s in &r.statuses {
            assert_eq!(code(s.code), Code::Ok);
            assert_eq!(s.current_limit, None);
            assert_eq!(s.duration_until_reset, None);
        }
    }
}

#[tokio::test]
async fn unknown_domain_answers_ok_and_native_namespace_is_an_error() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    let r = ask(
        &mut rls,
        request(
            "nobody",
            vec![descriptor(&[("api", "k")]), descriptor(&[("x", "y")])],
            u32::MAX,
        ),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses.len(), 2);
    assert!(r
        .statuses
        .iter()
        .all(|s| code(s.code) == Code::Ok && s.current_limit.is_none()));
    // A namespace of tollgate's own format has no descriptor tree.
    let err = rls
        .should_rate_limit(request("native", vec![descriptor(&[("api", "k")])], 0))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("native"), "{}", err.message());
    assert_eq!(
        err.metadata().get("tollgate-reason").unwrap(),
        "no_descriptors"
    );
}

#[tokio::test]
async fn a_replaced_limit_is_not_applied() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    let both = request(
        "shop",
        vec![
            descriptor(&[("tenant", "t1")]),
            descriptor(&[("vip", "t1")]),
        ],
        0,
    );
    for left in [99, 98, 97] {
        let r = ask(&mut rls, both.clone()).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        // The tenant limit (1 a day) would have rejected the second one.
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.statuses[1].limit_remaining, left);
    }
    // It was not counted either: alone, the tenant still has its 1.
    let r = ask(&mut rls, one("tenant", "t1")).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "tenant_default"
    );
    assert_eq!(
        code(ask(&mut rls, one("tenant", "t1")).await.overall_code),
        Code::OverLimit
    );
}

#[tokio::test]
async fn deny_and_extension_limits_report_what_they_can() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    // requests_per_unit: 0 rejects everything and blocks the request's
    // other descriptors, which are not charged.
    let r = ask(
        &mut rls,
        request(
            "shop",
            vec![descriptor(&[("closed", "x")]), descriptor(&[("big", "d")])],
            0,
        ),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(code(r.statuses[0].code), Code::OverLimit);
    assert_eq!(limit_of(&r.statuses[0]), (0, Unit::Week));
    assert!(reset_secs(&r.statuses[0]) > 0.0 && reset_secs(&r.statuses[0]) <= 604_800.0);
    assert_eq!(code(r.statuses[1].code), Code::Ok);
    let r = ask(&mut rls, one("big", "d")).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
    // A sliding log of 2 per hour is "2 per HOUR".
    let r = ask(&mut rls, one("log", "x")).await;
    assert_eq!(limit_of(&r.statuses[0]), (2, Unit::Hour));
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "hourly");
    assert_eq!(r.statuses[0].limit_remaining, 1);
    // A token bucket has no unit: its capacity, unit UNKNOWN.
    let r = ask(&mut rls, one("bucket", "x")).await;
    assert_eq!(limit_of(&r.statuses[0]), (4, Unit::Unknown));
    assert_eq!(r.statuses[0].limit_remaining, 3);
}

#[tokio::test]
async fn headers_describe_the_descriptor_closest_to_its_limit_when_enabled() {
    // Off by default.
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    let r = ask(&mut rls, one("api", "h")).await;
    assert!(r.response_headers_to_add.is_empty());

    let (mut rls, _stop) = rls_with_headers(app(CONFIG)).await;
    let both = request(
        "shop",
        vec![descriptor(&[("big", "h")]), descriptor(&[("api", "h")])],
        0,
    );
    let r = ask(&mut rls, both).await;
    let headers: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    // `api` (2 of 3 left) is closer to its limit than `big` (4 of 5).
    assert_eq!(
        headers[..2],
        [("RateLimit-Limit", "3"), ("RateLimit-Remaining", "2")]
    );
    assert_eq!(headers[2].0, "RateLimit-Reset");
    let reset: u64 = headers[2].1.parse().unwrap();
    assert!((1..=86_400).contains(&reset), "{reset}");
    // Nothing with a limit: no headers.
    let r = ask(&mut rls, one("free", "h")).await;
    assert!(r.response_headers_to_add.is_empty());
}

/// Envoy's descriptor-level `hits_addend` as upstream honours it: each
/// descriptor is charged its own hits, and (tollgate's rule) still all or
/// nothing with the others.
#[tokio::test]
async fn descriptors_asking_different_hits_are_each_charged_their_own_all_or_nothing() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    let big = descriptor(&[("big", "x")]);
    let ten = descriptor(&[("hits", "x")]);
    let pair = |a: u64, b: u64| {
        request(
            "shop",
            vec![with_hits(big.clone(), a), with_hits(ten.clone(), b)],
            0,
        )
    };
    let remaining = |r: &RateLimitResponse| -> Vec<u32> {
        r.statuses.iter().map(|s| s.limit_remaining).collect()
    };
    // 2 of big's 5 and 7 of hits' 10.
    let r = ask(&mut rls, pair(2, 7)).await;
    assert_eq!(code(r.overall_code), Code::Ok, "{r:?}");
    assert_eq!(remaining(&r), [3, 3]);
    // 1 fits big's 3 but 4 does not fit hits' 3: neither is charged.
    let r = ask(&mut rls, pair(1, 4)).await;
    assert_eq!(code(r.overall_code), Code::OverLimit, "{r:?}");
    assert_eq!(code(r.statuses[0].code), Code::Ok);
    assert_eq!(code(r.statuses[1].code), Code::OverLimit);
    let r = ask(&mut rls, pair(0, 0)).await;
    assert_eq!(remaining(&r), [3, 3], "the refused request charged nothing");
    // A descriptor without hits of its own takes the request's.
    let r = ask(
        &mut rls,
        request("shop", vec![with_hits(big.clone(), 1), ten.clone()], 2),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::Ok, "{r:?}");
    assert_eq!(remaining(&r), [2, 1]);
    // Two identical descriptors share one counter, charged once: the
    // larger of their hits.
    let y = descriptor(&[("hits", "y")]);
    let r = ask(
        &mut rls,
        request(
            "shop",
            vec![with_hits(y.clone(), 2), with_hits(y.clone(), 5)],
            0,
        ),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::Ok, "{r:?}");
    assert_eq!(remaining(&r), [5, 5]);
    // Some descriptors refund (`is_negative_hits`) while others are
    // checked: the refund is given back whatever the check says.
    let refund = |d: &RateLimitDescriptor, hits: u64| RateLimitDescriptor {
        is_negative_hits: true,
        ..with_hits(d.clone(), hits)
    };
    let r = ask(
        &mut rls,
        request("shop", vec![refund(&big, 2), with_hits(ten.clone(), 1)], 0),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::Ok, "{r:?}");
    assert_eq!(remaining(&r), [4, 0]);
    let r = ask(
        &mut rls,
        request("shop", vec![refund(&big, 1), with_hits(ten.clone(), 1)], 0),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::OverLimit, "{r:?}");
    assert_eq!(code(r.statuses[0].code), Code::Ok);
    let r = ask(&mut rls, pair(0, 0)).await;
    assert_eq!(remaining(&r), [5, 0], "refunded though the check failed");
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_naming_the_problem() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    let ok = descriptor(&[("api", "k")]);
    let cases = [
        (request("", vec![ok.clone()], 0), "domain must not be empty"),
        (
            request("shop", vec![], 0),
            "descriptor list must not be empty",
        ),
        (
            request("shop", vec![ok.clone(), descriptor(&[])], 0),
            "descriptor 1 has no entries",
        ),
        (
            request("shop", vec![descriptor(&[("api", "k"), ("", "v")])], 0),
            "descriptor 0, entry 1: empty key",
        ),
        (
            request(
                "shop",
                vec![
                    ok.clone(),
                    RateLimitDescriptor {
                        is_negative_hits: true,
                        ..ok.clone()
                    },
                ],
                0,
            ),
            // One counter named twice, once charged and once refunded.
            "a counter is charged or refunded, not both",
        ),
    ];
    for (r, says) in cases {
        let err = rls.should_rate_limit(r).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{says}");
        assert!(err.message().contains(says), "{} vs {says}", err.message());
        assert_eq!(
            err.metadata().get("tollgate-reason").unwrap(),
            "malformed_request"
        );
    }
    // Nothing was charged by any of them.
    let r = ask(&mut rls, one("api", "k")).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn odd_but_valid_input_is_answered() {
    let server = TestServer::start(CONFIG).await;
    let mut rls = server.rls().await;
    let long = "v".repeat(10_000);
    let many: Vec<_> = (0..200)
        .map(|i| descriptor(&[("api", &format!("many-{i}"))]))
        .collect();
    for r in [
        one("api", ""),
        one("api", "ünïcødé/=%"),
        one("api", &long),
        one("path", "*"),
        request("shop", many, 0),
        request("ünïcødé", vec![descriptor(&[("k", "v")])], 0),
    ] {
        let n = r.descriptors.len();
        let r = ask(&mut rls, r).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert_eq!(r.statuses.len(), n);
    }
}

#[tokio::test]
async fn json_answers_200_then_429_with_protojson() {
    let server = TestServer::start(CONFIG).await;
    let own = json_server(app(CONFIG)).await;
    let http = reqwest::Client::new();
    for url in [format!("http://{own}/json"), server.http_url("/json")] {
        let post = |body: Value| http.post(&url).json(&body).send();
        let body = json!({"domain": "shop", "descriptors": [{"entries": [{"key": "path", "value": "/exa"}]}], "hitsAddend": 1});
        let r = post(body.clone()).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["overallCode"], "OK");
        let s = &v["statuses"][0];
        assert_eq!(s["code"], "OK");
        assert_eq!(
            s["currentLimit"],
            json!({"requestsPerUnit": 2, "unit": "DAY"})
        );
        assert_eq!(s["limitRemaining"], 1);
        let reset = s["durationUntilReset"].as_str().unwrap();
        let secs: f64 = reset.strip_suffix('s').unwrap().parse().unwrap();
        assert!(secs > 0.0 && secs <= 86_400.0, "{reset}");
        assert_eq!(s.as_object().unwrap().len(), 4, "{s}");

        // snake_case names, as protojson also accepts: the last hit.
        let snake = json!({"domain": "shop", "descriptors": [{"entries": [{"key": "path", "value": "/exa"}]}], "hits_addend": 1});
        let r = post(snake.clone()).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["statuses"][0]["limitRemaining"], 0);

        let r = post(snake).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["overallCode"], "OVER_LIMIT");
        assert_eq!(v["statuses"][0]["code"], "OVER_LIMIT");
        assert_eq!(v["statuses"][0]["limitRemaining"], 0);

        // A descriptor without a limit is just `{"code": "OK"}`.
        let r = post(
            json!({"domain": "shop", "descriptors": [{"entries": [{"key": "free", "value": "x"}]}]}),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v,
            json!({"overallCode": "OK", "statuses": [{"code": "OK"}]})
        );
    }
}

#[tokio::test]
async fn json_refuses_bad_bodies_with_400() {
    let server = TestServer::start(CONFIG).await;
    let own = json_server(app(CONFIG)).await;
    let http = reqwest::Client::new();
    for url in [format!("http://{own}/json"), server.http_url("/json")] {
        for (body, says) in [
            ("{not json", "not a valid RateLimitRequest"),
            (
                r#"{"domain": "shop", "descriptorz": []}"#,
                "unknown field `descriptorz`",
            ),
            (r#"{"domain": "shop", "hitsAddend": -3}"#, "hitsAddend"),
            (
                r#"{"domain": "shop", "descriptors": []}"#,
                "descriptor list must not be empty",
            ),
            (
                r#"{"domain": "shop", "descriptors": [{"entries": [{"value": "v"}]}]}"#,
                "descriptor 0, entry 0: empty key",
            ),
        ] {
            let r = http.post(&url).body(body).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["reason"], "malformed_request", "{body}");
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.contains(says), "{message} vs {says}");
        }
    }
}
