//! The hostile-input suite of the limiting server (issue 16): what a
//! stranger can send to an in-process server through real sockets, fuzzed
//! with proptest, and floods of what a stranger can make the server keep.
//!
//! - [`http`]: JSON bodies of every `/v1/*` endpoint and `/json`, and raw
//!   request heads (malformed request lines, huge headers, bad lengths,
//!   chunked garbage, an HTTP/2 preface followed by junk);
//! - [`grpc`]: raw protobuf messages to the native API's unary call and
//!   session stream, and Envoy RLS requests, through a codec that sends
//!   whatever bytes it is given;
//! - [`floods`]: unique domains of the largest size, sessions, holds per
//!   session, seizes of made-up ids, transfers, connections; each checks
//!   the state the server keeps against its bound.
//!
//! Every case must end in a clear error (the JSON error shape with a 4xx,
//! or a gRPC status) or an answer, within a bound (never a hang), the
//! server must still answer afterwards, and no copy may be left counted
//! that no hold owns. The server's clock is a [`ManualClock`]: after each
//! case it jumps a day ahead so every lease and transfer ends, and the
//! case checks that its housekeeping then leaves nothing behind.
//!
//! `TOLLGATE_HOSTILE_CASES` sets the cases per property (default
//! [`DEFAULT_CASES`]) and scales the floods; `docs/reliability.md` says
//! how to run a longer campaign.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod floods;
mod grpc;
mod http;
mod raw;

use std::sync::Arc;
use std::time::Duration;

use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
use tollgate_core::Nanos;
use tollgate_server::{App, ServerOptions};
use tollgate_service::{ManualClock, ServiceOptions};
use tollgate_store::{MemoryStore, MemoryStoreOptions};

/// Cases per property when `TOLLGATE_HOSTILE_CASES` is not set: enough to
/// reach every decoder's error paths in a few seconds each.
pub const DEFAULT_CASES: u32 = 48;

/// How long any answer may take on a loaded machine: a case that gets
/// nothing by then hung.
pub const BOUND: Duration = Duration::from_secs(10);

/// The server's clock starts here (late 2026, in ns).
pub const START: Nanos = Nanos::from_secs(1_790_000_000);

/// Cases per property: `TOLLGATE_HOSTILE_CASES`, or [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var("TOLLGATE_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u32| n > 0)
        .unwrap_or(DEFAULT_CASES)
}

/// A proptest runner for `cases()` cases, keeping failing seeds in a
/// `.proptest-regressions` file beside the source (STYLE: property tests
/// keep their failing seeds), with shrinking bounded so a failure against a
/// live server reports in reasonable time.
pub fn runner(source: &'static str) -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        source_file: Some(source),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        max_shrink_iters: 200,
        ..Config::default()
    })
}

/// `v`'s `Debug` text, cut to a readable length: a case that failed with
/// a 60 KB string should not fill the screen.
pub fn short(v: &impl std::fmt::Debug) -> String {
    let text = format!("{v:?}");
    if text.len() <= 600 {
        return text;
    }
    let mut cut = 600;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..cut], text.len())
}

/// A case's input, shown by proptest through [`short`].
#[derive(Clone)]
pub struct Shown<T>(pub T);

impl<T: std::fmt::Debug> std::fmt::Debug for Shown<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&short(&self.0))
    }
}

/// What the cases of a property came to (`200`, `400 malformed_request`,
/// `closed`...), printed at the end so a run shows what it reached.
#[derive(Default)]
pub struct Tally(std::cell::RefCell<std::collections::BTreeMap<String, u64>>);

impl Tally {
    pub fn add(&self, outcome: impl Into<String>) {
        *self.0.borrow_mut().entry(outcome.into()).or_insert(0) += 1;
    }

    /// Prints `name: N inputs (outcome × n, ...)`.
    pub fn print(&self, name: &str) {
        let map = self.0.borrow();
        let total: u64 = map.values().sum();
        let parts: Vec<String> = map.iter().map(|(k, n)| format!("{k} x{n}")).collect();
        eprintln!("{name}: {total} inputs ({})", parts.join(", "));
    }
}

/// Limits of every kind a stranger can reach: rate resources of several
/// algorithms, a copy pool with a group, a namespace that allows
/// unconfigured resources, and an Envoy domain.
pub const CONFIG: &str = r#"
namespaces:
  - name: app
    resources:
      - { name: api, algorithm: gcra, rate: 1000/s, burst: 1000 }
      - { name: exact, algorithm: sliding_log, limit: 5, window: 10s }
      - { name: bucket, algorithm: token_bucket, capacity: 10, rate: 1/s }
      - { name: queue, algorithm: leaky_bucket, rate: 5/s, queue_size: 10 }
      - name: tiers
        algorithm: burst_tiers
        hard_limit: 20
        global_limit: 1000
        tiers:
          - { limit: 10, window: 1s, active: 60s, cooldown: 0s }
      - name: pool
        kind: concurrency
        domain_limit: 50
        global_limit: 1000
        groups: [ { name: big, members: [acme, globex], limit: 60 } ]
  - name: open
    allow_unconfigured: true
    resources:
      - { name: known, algorithm: gcra, rate: 10/s, burst: 10 }
---
domain: shop
descriptors:
  - key: path
    rate_limit: { unit: second, requests_per_unit: 100 }
  - key: user
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: closed
    rate_limit: { unit: day, requests_per_unit: 0 }
"#;

/// A server under test, on a runtime of its own so that proptest's
/// synchronous cases can drive it with `block_on`.
pub struct Harness {
    pub rt: tokio::runtime::Runtime,
    pub server: common::TestServer,
    pub clock: Arc<ManualClock>,
}

impl Harness {
    /// A server of [`CONFIG`] with `service` and `options` (short header
    /// and body timeouts, so that a case that leaves a request unfinished
    /// is closed quickly), storing in `store`.
    pub fn start(
        store: MemoryStoreOptions,
        service: ServiceOptions,
        options: ServerOptions,
    ) -> Harness {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let clock = Arc::new(ManualClock::new(START));
        let server = rt.block_on(start_server(
            MemoryStore::with_options(store),
            service,
            options,
            Arc::clone(&clock),
        ));
        Harness { rt, server, clock }
    }

    /// [`Harness::start`] with the defaults and short connection timeouts.
    pub fn default_limits() -> Harness {
        Harness::start(
            MemoryStoreOptions::default(),
            ServiceOptions::default(),
            options(),
        )
    }

    pub fn app(&self) -> &Arc<App<MemoryStore>> {
        &self.server.app
    }

    /// An HTTP hold of `copies` copies of `app/pool` for acme, then a
    /// transfer of one of them, for a case's requests to name: the hold's
    /// id and the transfer's.
    pub fn hold_and_transfer(&self, copies: u64) -> (String, String) {
        let reserved = raw::post(
            self.server.http,
            "/v1/reserve",
            &serde_json::json!({"namespace": "app", "resource": "pool", "domain": "acme", "copies": copies, "lease_ms": 60_000}),
        );
        assert_eq!(reserved.status, 200, "{reserved:?}");
        let hold = reserved.json().unwrap()["hold_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let transferred = raw::post(
            self.server.http,
            "/v1/transfer",
            &serde_json::json!({"hold_id": hold, "namespace": "app", "resource": "pool", "domain": "acme", "copies": 1, "ttl_ms": 60_000}),
        );
        assert_eq!(transferred.status, 200, "{transferred:?}");
        let transfer = transferred.json().unwrap()["transfer_id"]
            .as_str()
            .unwrap()
            .to_owned();
        (hold, transfer)
    }

    /// Ends every lease and transfer (the clock jumps a day and a half
    /// ahead) and waits for the housekeeping to release them: afterwards
    /// no session is open, no copy operation is in flight, and the pool
    /// counts no copy. A copy still counted then is one that no hold owns,
    /// a leak.
    pub fn settle(&self, what: &str) {
        self.clock.advance(Duration::from_secs(36 * 3600));
        let app = Arc::clone(self.app());
        self.rt.block_on(async {
            for _ in 0..1000 {
                if app.sessions().is_empty() && app.service().in_flight() == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(
                app.sessions().is_empty(),
                "{what}: {} sessions still open after every lease ended",
                app.sessions().len()
            );
            assert_eq!(
                app.service().in_flight(),
                0,
                "{what}: copy operations still in flight"
            );
            // Staged transfers are released by the next housekeeping run
            // after their ttl.
            for _ in 0..1000 {
                let held = common::holds(&app, "app", "pool", "acme").await.1;
                if held == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let held = common::holds(&app, "app", "pool", "acme").await.1;
            panic!("{what}: {held} copies of app/pool still counted with no hold left: a leak");
        });
    }
}

/// Server options for the suite: header and body timeouts short enough
/// that an unfinished request is closed long before [`BOUND`].
pub fn options() -> ServerOptions {
    let mut o = ServerOptions::default();
    o.connection_limits.header_timeout = Duration::from_millis(300);
    o.connection_limits.body_timeout = Duration::from_millis(300);
    o.connection_limits.idle_timeout = Duration::from_secs(5);
    o
}

async fn start_server(
    store: MemoryStore,
    service: ServiceOptions,
    options: ServerOptions,
    clock: Arc<ManualClock>,
) -> common::TestServer {
    let loaded = tollgate_config::load_str("hostile.yaml", CONFIG).unwrap();
    let app = Arc::new(
        App::builder(store, "memory", loaded.config)
            .options(service)
            .clock(clock)
            .build()
            .unwrap(),
    );
    common::TestServer::serve(app, options, Duration::from_millis(5)).await
}
