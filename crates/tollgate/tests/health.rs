//! gRPC health checking of a real `tollgate serve` process over a real
//! Redis: Check and Watch of the three names follow `/readyz` as Redis
//! goes away and comes back, and at SIGTERM a Watch gets `NOT_SERVING`
//! and ends, and the process exits at once rather than after its grace
//! period.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::serving::Serving;
use common::Sandbox;
use tokio::runtime::Runtime;
use tollgate_redis::testing::RedisServer;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

const CONFIG: &str = r#"
namespaces:
  - name: shop
    resources:
      - { name: checkout, algorithm: fixed_window, limit: 50, window: 1h, align: first_hit }
"#;

const NAMES: [&str; 3] = [
    "",
    "tollgate.v1.Tollgate",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// How long to wait for a message that must come: it bounds a hang, not
/// a speed.
const BOUND: Duration = Duration::from_secs(60);

struct Health {
    rt: Runtime,
    client: HealthClient<Channel>,
}

impl Health {
    fn connect(s: &Serving) -> Health {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let endpoint = Channel::from_shared(format!("http://{}", s.grpc)).unwrap();
        let client = HealthClient::new(rt.block_on(endpoint.connect()).unwrap());
        Health { rt, client }
    }

    fn check(&mut self, service: &str) -> Result<ServingStatus, tonic::Status> {
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        let answer = self.rt.block_on(self.client.check(request))?;
        Ok(answer.into_inner().status())
    }

    fn all(&mut self) -> Vec<ServingStatus> {
        NAMES.iter().map(|n| self.check(n).unwrap()).collect()
    }

    fn watch(&mut self, service: &str) -> tonic::Streaming<HealthCheckResponse> {
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        self.rt
            .block_on(self.client.watch(request))
            .unwrap()
            .into_inner()
    }

    /// The next message of `watch`, `None` once it ended with OK.
    fn next(&self, watch: &mut tonic::Streaming<HealthCheckResponse>) -> Option<ServingStatus> {
        self.rt
            .block_on(async { tokio::time::timeout(BOUND, watch.message()).await })
            .expect("no Watch message within the bound")
            .unwrap()
            .map(|m| m.status())
    }
}

fn readyz(s: &Serving) -> u16 {
    s.http("GET", "/readyz", None).0
}

#[test]
fn health_follows_redis_going_and_coming_back_and_ends_at_shutdown() {
    let dir = Sandbox::new("grpc-health");
    dir.write("tollgate.yaml", CONFIG);
    let mut redis = RedisServer::start();
    let s = Serving::start_redis(
        &dir,
        &redis.url(),
        // Longer than the test, so only a Watch that ends lets the process
        // exit at once. Redis comes back empty, which makes a server resign
        // from the copy log unless told to keep serving.
        &[
            "--shutdown-grace-ms",
            "600000",
            "--keep-serving-after-resign",
        ],
        &[],
    );
    let mut health = Health::connect(&s);
    assert_eq!(health.all(), [ServingStatus::Serving; 3]);
    let e = health.check("tollgate.v1.Nope").unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_eq!(readyz(&s), 200);

    let mut watches: Vec<_> = NAMES.iter().map(|n| health.watch(n)).collect();
    for w in &mut watches {
        assert_eq!(health.next(w), Some(ServingStatus::Serving));
    }

    // Redis goes: the store's readiness changes with no request and no
    // event, and every Watch is told.
    redis.kill();
    for w in &mut watches {
        assert_eq!(health.next(w), Some(ServingStatus::NotServing));
    }
    assert_eq!(health.all(), [ServingStatus::NotServing; 3]);
    assert_eq!(readyz(&s), 503);

    redis.restart();
    for w in &mut watches {
        assert_eq!(health.next(w), Some(ServingStatus::Serving));
    }
    assert_eq!(health.all(), [ServingStatus::Serving; 3]);
    assert_eq!(readyz(&s), 200);

    // SIGTERM: NOT_SERVING, then the call ends, so the process exits
    // without waiting out its grace period.
    s.signal("TERM");
    for w in &mut watches {
        assert_eq!(health.next(w), Some(ServingStatus::NotServing));
        assert_eq!(health.next(w), None);
    }
    let (code, logs) = s.terminate_within(BOUND);
    assert_eq!(code, Some(0), "{logs:#?}");
}
