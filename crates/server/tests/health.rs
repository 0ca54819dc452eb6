//! gRPC health checking on the gRPC port, through a real socket with
//! `tonic-health`'s generated client: Check of the three names the server
//! answers for and of an unknown one, Check and `/readyz` agreeing once
//! shutdown begins, and Watch pushing `NOT_SERVING` when it does, then
//! ending so that a graceful shutdown is not held up. (A store that is not
//! ready is tested with a real Redis in `crates/tollgate/tests/health.rs`;
//! health over TLS in `tls.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::TestServer;
use tollgate_server::ServerOptions;
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const CONFIG: &str = "namespaces:\n  - name: app\n    resources:\n      - { name: api, algorithm: gcra, rate: 10/s, burst: 5 }\n";

const NAMES: [&str; 3] = [
    "",
    "tollgate.v1.Tollgate",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// How long a test waits for an answer that must come before it fails:
/// generous, it bounds a hang, not a speed.
const BOUND: Duration = Duration::from_secs(30);

async fn client(s: &TestServer) -> HealthClient<Channel> {
    let channel = Channel::from_shared(s.grpc_url()).unwrap();
    HealthClient::new(channel.connect().await.unwrap())
}

async fn check(
    c: &mut HealthClient<Channel>,
    service: &str,
) -> Result<ServingStatus, tonic::Status> {
    let answer = c
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?;
    Ok(answer.into_inner().status())
}

/// The next message of a Watch: `Some(status)`, or `None` once the call
/// ended with OK.
async fn next(
    watch: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
) -> Option<ServingStatus> {
    tokio::time::timeout(BOUND, watch.message())
        .await
        .expect("no Watch message within the bound")
        .unwrap()
        .map(|m| m.status())
}

async fn watch(
    c: &mut HealthClient<Channel>,
    service: &str,
) -> tonic::Streaming<tonic_health::pb::HealthCheckResponse> {
    c.watch(HealthCheckRequest {
        service: service.to_owned(),
    })
    .await
    .unwrap()
    .into_inner()
}

async fn readyz(s: &TestServer) -> (u16, String) {
    let r = reqwest::get(s.http_url("/readyz")).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn check_answers_for_the_server_the_native_api_and_the_rls_and_not_found_otherwise() {
    let s = TestServer::start(CONFIG).await;
    let mut c = client(&s).await;
    for name in NAMES {
        assert_eq!(
            check(&mut c, name).await.unwrap(),
            ServingStatus::Serving,
            "{name:?}"
        );
    }
    for unknown in [
        "tollgate.v1",
        "grpc.health.v1.Health",
        "Tollgate",
        "x".repeat(60_000).as_str(),
    ] {
        let e = check(&mut c, unknown).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{unknown:?}: {e:?}");
        // A long name is not repeated whole into the answer's header.
        assert!(e.message().len() < 300, "{}", e.message());
    }
    // The message size bound applies to health as to every service.
    let e = check(&mut c, &"x".repeat(100_000)).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
}

#[tokio::test]
async fn check_and_readyz_say_not_serving_from_the_moment_shutdown_begins() {
    let mut s = TestServer::start(CONFIG).await;
    let mut c = client(&s).await;
    let mut watches = Vec::new();
    for name in NAMES {
        let mut w = watch(&mut c, name).await;
        assert_eq!(next(&mut w).await, Some(ServingStatus::Serving), "{name:?}");
        watches.push(w);
    }
    assert_eq!(readyz(&s).await, (200, "ready".to_owned()));

    // What the shutdown signal does first, while the ports still answer.
    s.app.begin_stopping();
    assert_eq!(readyz(&s).await, (503, "stopping".to_owned()));
    for name in NAMES {
        assert_eq!(
            check(&mut c, name).await.unwrap(),
            ServingStatus::NotServing,
            "{name:?}"
        );
    }
    for (name, w) in NAMES.into_iter().zip(watches.iter_mut()) {
        assert_eq!(next(w).await, Some(ServingStatus::NotServing), "{name:?}");
    }
    // A Watch opened now says so at once.
    let mut late = watch(&mut c, "").await;
    assert_eq!(next(&mut late).await, Some(ServingStatus::NotServing));
    // Each ends when the listeners close (at once here: no shutdown
    // delay), not before, so a client that watches again at once is not
    // answered by a loop of calls while the port still accepts.
    s.begin_stop();
    for (name, mut w) in NAMES.into_iter().zip(watches) {
        assert_eq!(next(&mut w).await, None, "{name:?}: the Watch ends");
    }
    assert_eq!(next(&mut late).await, None);
}

#[tokio::test]
async fn a_watch_sees_not_serving_at_shutdown_and_ends_without_holding_the_shutdown_up() {
    // A grace period far longer than the bound: a Watch that did not end
    // would keep the server running past it.
    let options = ServerOptions {
        shutdown_grace: Duration::from_secs(3600),
        ..ServerOptions::default()
    };
    let s = TestServer::start_with(CONFIG, Default::default(), options).await;
    let mut c = client(&s).await;
    let mut w = watch(&mut c, "envoy.service.ratelimit.v3.RateLimitService").await;
    assert_eq!(next(&mut w).await, Some(ServingStatus::Serving));
    let stopped = tokio::spawn(s.stop());
    assert_eq!(next(&mut w).await, Some(ServingStatus::NotServing));
    assert_eq!(next(&mut w).await, None);
    tokio::time::timeout(BOUND, stopped)
        .await
        .expect("the server did not stop within the bound")
        .unwrap();
}

/// Review of issue 19: readiness went to "stopping" in the same instant
/// the listeners closed, so a load balancer never saw it before new
/// connections were refused. With a shutdown delay the server says
/// "stopping" (gRPC health and `/readyz`) and still serves decisions.
#[tokio::test]
async fn during_the_shutdown_delay_the_server_is_not_ready_and_still_answers() {
    let options = ServerOptions {
        shutdown_delay: Duration::from_secs(3600),
        ..ServerOptions::default()
    };
    let mut s = TestServer::start_with(CONFIG, Default::default(), options).await;
    let mut c = client(&s).await;
    assert_eq!(check(&mut c, "").await.ok(), Some(ServingStatus::Serving));
    s.begin_stop();
    let mut status = check(&mut c, "").await.ok();
    for _ in 0..3000 {
        if status == Some(ServingStatus::NotServing) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        status = check(&mut c, "").await.ok();
    }
    assert_eq!(status, Some(ServingStatus::NotServing));
    let http = reqwest::Client::new();
    let ready = http.get(s.http_url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(ready.text().await.unwrap(), "stopping");
    // New connections are still accepted and decisions still made.
    let fresh = reqwest::Client::new();
    let answer = fresh
        .post(s.http_url("/v1/request"))
        .body(r#"{"namespace":"app","resource":"api","domain":"d"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let mut native = s.native().await;
    let granted = native
        .request(tollgate_proto::v1::RateRequest {
            namespace: "app".into(),
            resource: "api".into(),
            domain: "d".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(granted.allowed, "{granted:?}");
    // A Watch opened during the delay is told, and stays open until the
    // listeners close: here, when the delay is cut short (as a second
    // signal or a resignation does).
    let mut w = watch(&mut c, "").await;
    assert_eq!(next(&mut w).await, Some(ServingStatus::NotServing));
    s.hurry.now();
    assert_eq!(next(&mut w).await, None, "the Watch ends with the delay");
    tokio::time::timeout(BOUND, s.stopped())
        .await
        .expect("the server did not stop once its delay was cut short");
}

#[tokio::test]
async fn a_watch_of_an_unknown_name_says_service_unknown_rather_than_failing() {
    let mut s = TestServer::start(CONFIG).await;
    let mut c = client(&s).await;
    let mut w = watch(&mut c, "no.such.Service").await;
    assert_eq!(next(&mut w).await, Some(ServingStatus::ServiceUnknown));
    // It stays open until shutdown, then ends with nothing more to say.
    s.begin_stop();
    assert_eq!(next(&mut w).await, None);
}
