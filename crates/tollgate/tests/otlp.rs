//! `tollgate serve --otlp-endpoint`: a real server exports a span per
//! decision to an OTLP/gRPC receiver this test runs on loopback (the
//! collector's own `TraceService`, from `opentelemetry-proto`). Each
//! surface is called with a known W3C `traceparent`; the span must carry
//! the caller's trace id and span id as its parent, and the decision's
//! attributes. Spans still queued when the server stops are flushed
//! before it exits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::serving::Serving;
use common::Sandbox;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use tollgate_proto::rls::rate_limit_descriptor::Entry;
use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::rls::{RateLimitDescriptor, RateLimitRequest};
use tollgate_proto::v1;
use tollgate_proto::v1::tollgate_client::TollgateClient;

const TOLLGATE: &str = "namespaces:\n  - name: default\n    resources:\n      - { name: api, algorithm: token_bucket, capacity: 100, rate: 10/s }\n      - { name: sandbox, kind: concurrency, domain_limit: 3, global_limit: 100 }\n";
const ENVOY: &str = "domain: messaging\ndescriptors:\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n";

/// A span as received, with the service name of its resource.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn attr(&self, key: &str) -> Option<Any> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.clone())
            .and_then(|v| v.value)
    }

    fn text(&self, key: &str) -> String {
        match self.attr(key) {
            Some(Any::StringValue(s)) => s,
            other => panic!("{key} is {other:?} in {self:#?}"),
        }
    }

    fn int(&self, key: &str) -> i64 {
        match self.attr(key) {
            Some(Any::IntValue(n)) => n,
            other => panic!("{key} is {other:?} in {self:#?}"),
        }
    }
}

/// The OTLP receiver: the collector's `TraceService`, keeping every span.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.clone())
                .and_then(|v| v.value)
                .map(|v| match v {
                    Any::StringValue(s) => s,
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    kept.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    /// Serves on a free loopback port of `runtime`; its address.
    fn start(&self, runtime: &tokio::runtime::Runtime) -> SocketAddr {
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(self.clone());
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        addr
    }

    /// Serves TLS with `certs`' server certificate on a free loopback
    /// port of `runtime`; its address.
    fn start_tls(
        &self,
        runtime: &tokio::runtime::Runtime,
        certs: &tollgate_redis::testing::TestCerts,
    ) -> SocketAddr {
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let identity = tonic::transport::Identity::from_pem(&certs.server_cert, &certs.server_key);
        let server = tonic::transport::Server::builder()
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .unwrap()
            .add_service(TraceServiceServer::new(self.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        runtime.spawn(server);
        addr
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// The span whose parent is `caller`'s span, waiting for it with a
    /// generous bound (exports are batched every 50 ms here).
    fn wait_for(&self, caller: &Caller) -> Received {
        let what = format!("a span with parent {} arrives", caller.span_id);
        tollgate_testing::eventually(&what, Duration::from_secs(60), || {
            let spans = self.spans();
            match spans.iter().find(|r| caller.is_parent_of(r)) {
                Some(r) => Ok(r.clone()),
                None => Err(format!("received: {spans:#?}")),
            }
        })
    }
}

/// A caller's W3C trace context.
struct Caller {
    trace_id: String,
    span_id: String,
}

impl Caller {
    /// A sampled context, different for each `n`.
    fn new(n: u8) -> Caller {
        Caller {
            trace_id: format!("4bf92f3577b34da6a3ce929d0e0e47{n:02x}"),
            span_id: format!("00f067aa0ba902{n:02x}"),
        }
    }

    fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }

    fn is_parent_of(&self, r: &Received) -> bool {
        hex(&r.span.parent_span_id) == self.span_id
    }

    /// `request` with this caller's `traceparent` and a `tracestate`.
    fn grpc<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let md = request.metadata_mut();
        md.insert("traceparent", self.traceparent().parse().unwrap());
        md.insert("tracestate", "caller=yes".parse().unwrap());
        request
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Waits for the span of `caller`'s decision, asserts it is the server
/// span named `name` on `surface` ([`assert_child`]) with these text and
/// integer attributes, and returns it.
fn expect_span(
    receiver: &Receiver,
    caller: &Caller,
    name: &str,
    surface: &str,
    texts: &[(&str, &str)],
    ints: &[(&str, i64)],
) -> Received {
    let r = receiver.wait_for(caller);
    assert_child(&r, caller, name, surface);
    for (key, want) in texts {
        assert_eq!(r.text(key), *want, "{key}: {r:#?}");
    }
    for (key, want) in ints {
        assert_eq!(r.int(key), *want, "{key}: {r:#?}");
    }
    r
}

/// Asserts that `r` is the server span of `caller`'s decision named
/// `name` on `surface`.
fn assert_child(r: &Received, caller: &Caller, name: &str, surface: &str) {
    assert_eq!(r.span.name, name, "{r:#?}");
    assert_eq!(hex(&r.span.trace_id), caller.trace_id, "{r:#?}");
    assert_eq!(hex(&r.span.parent_span_id), caller.span_id, "{r:#?}");
    assert_eq!(r.span.trace_state, "caller=yes", "{r:#?}");
    assert_eq!(r.span.kind, SpanKind::Server as i32, "{r:#?}");
    assert_eq!(r.text("tollgate.surface"), surface, "{r:#?}");
    assert_eq!(r.service, "tollgate", "{r:#?}");
    assert!(r.int("tollgate.store_latency_us") >= 0, "{r:#?}");
    assert!(
        r.span.end_time_unix_nano >= r.span.start_time_unix_nano,
        "{r:#?}"
    );
}

/// One HTTP/1.1 POST with trace headers: (status, body).
fn post(addr: SocketAddr, path: &str, body: &str, caller: &Caller) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n\
         traceparent: {}\r\ntracestate: caller=yes\r\nContent-Length: {}\r\n\r\n{body}",
        caller.traceparent(),
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

fn sandbox(name: &str) -> (Sandbox, std::path::PathBuf) {
    let dir = Sandbox::new(name);
    dir.write("config/tollgate.yaml", TOLLGATE);
    dir.write("config/envoy.yaml", ENVOY);
    let config = dir.path("config");
    (dir, config)
}

#[test]
fn every_surface_exports_a_decision_span_in_the_callers_trace() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let receiver = Receiver::default();
    let collector = receiver.start(&runtime);
    let (dir, config) = sandbox("otlp-surfaces");
    let endpoint = format!("http://{collector}");
    let server = Serving::start_config(
        &dir,
        &config,
        &["--otlp-endpoint", &endpoint],
        &[("OTEL_BSP_SCHEDULE_DELAY", "50"), ("OTEL_SERVICE_NAME", "")],
    );
    let grpc = format!("http://{}", server.grpc);

    // Native gRPC: a rate request, and a reserve in a session.
    let (native, session, rls) = (Caller::new(1), Caller::new(2), Caller::new(3));
    runtime.block_on(async {
        let mut client = TollgateClient::connect(grpc.clone()).await.unwrap();
        let answer = client
            .request(native.grpc(v1::RateRequest {
                namespace: "default".into(),
                resource: "api".into(),
                domain: "acme".into(),
                hits: Some(3),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.granted, 3);

        let ops = tokio_stream::iter([v1::SessionRequest {
            id: 1,
            op: Some(v1::session_request::Op::Reserve(v1::ReserveRequest {
                namespace: "default".into(),
                resource: "sandbox".into(),
                domain: "acme".into(),
                copies: 2,
                ..Default::default()
            })),
        }]);
        let mut answers = client
            .session(session.grpc(ops))
            .await
            .unwrap()
            .into_inner();
        let reply = answers.message().await.unwrap().unwrap();
        match reply.result {
            Some(v1::session_response::Result::Reserve(r)) => assert_eq!(r.granted, 2),
            other => panic!("{other:?}"),
        }

        // Envoy's RLS over gRPC.
        let mut envoy = RateLimitServiceClient::connect(grpc.clone()).await.unwrap();
        let answer = envoy
            .should_rate_limit(rls.grpc(RateLimitRequest {
                domain: "messaging".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "to_number".into(),
                        value: "5551234".into(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 1,
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.overall_code, 1, "OK");
    });

    // RLS JSON, over the limit; the HTTP API, granted and refused.
    let (json, http, refused) = (Caller::new(4), Caller::new(5), Caller::new(6));
    let (status, body) = post(
        server.http,
        "/json",
        r#"{"domain":"messaging","descriptors":[{"entries":[{"key":"to_number","value":"5550000"}]}],"hitsAddend":101}"#,
        &json,
    );
    assert_eq!(status, 429, "{body}");
    let (status, body) = post(
        server.http,
        "/v1/request",
        r#"{"namespace":"default","resource":"api","domain":"globex","hits":2}"#,
        &http,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        server.http,
        "/v1/request",
        r#"{"namespace":"nowhere","resource":"api","domain":"globex"}"#,
        &refused,
    );
    assert_eq!(status, 404, "{body}");

    for (caller, name, surface, texts, ints) in [
        (
            &native,
            "tollgate.rate",
            "grpc",
            &[
                ("tollgate.namespace", "default"),
                ("tollgate.resource", "api"),
                ("tollgate.outcome", "granted"),
            ][..],
            &[("tollgate.hits", 3), ("tollgate.granted", 3)][..],
        ),
        (
            &session,
            "tollgate.reserve",
            "session",
            &[
                ("tollgate.namespace", "default"),
                ("tollgate.resource", "sandbox"),
                ("tollgate.outcome", "granted"),
            ],
            &[("tollgate.hits", 2), ("tollgate.granted", 2)],
        ),
        (
            &rls,
            "tollgate.should_rate_limit",
            "rls",
            &[
                ("tollgate.namespace", "messaging"),
                ("tollgate.descriptors", "to_number=5551234"),
                ("tollgate.outcome", "granted"),
            ],
            &[("tollgate.hits", 1)],
        ),
        (
            &json,
            "tollgate.should_rate_limit",
            "rls_json",
            &[
                ("tollgate.namespace", "messaging"),
                ("tollgate.descriptors", "to_number=5550000"),
                ("tollgate.outcome", "rejected"),
            ],
            &[("tollgate.hits", 101), ("tollgate.granted", 0)],
        ),
        (
            &http,
            "tollgate.rate",
            "http",
            &[
                ("tollgate.namespace", "default"),
                ("tollgate.outcome", "granted"),
            ],
            &[("tollgate.hits", 2)],
        ),
    ] {
        expect_span(&receiver, caller, name, surface, texts, ints);
    }
    let r = expect_span(
        &receiver,
        &refused,
        "tollgate.rate",
        "http",
        &[
            ("tollgate.namespace", "nowhere"),
            ("tollgate.outcome", "error"),
            ("tollgate.error", "unknown_namespace"),
        ],
        &[],
    );
    assert_eq!(r.span.status.as_ref().map(|s| s.code), Some(2), "ERROR");

    // One span per decision: no surface exported two.
    let mut per_parent: HashMap<String, usize> = HashMap::new();
    for r in receiver.spans() {
        *per_parent.entry(hex(&r.span.parent_span_id)).or_default() += 1;
    }
    for caller in [&native, &session, &rls, &json, &http, &refused] {
        assert_eq!(per_parent.get(&caller.span_id), Some(&1), "{per_parent:?}");
    }
    let (code, logs) = server.terminate();
    assert_eq!(code, Some(0), "{logs:?}");
}

#[test]
fn spans_still_queued_are_exported_when_the_server_stops() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let receiver = Receiver::default();
    let collector = receiver.start(&runtime);
    let (dir, config) = sandbox("otlp-flush");
    let endpoint = format!("http://{collector}");
    // An hour between exports: only the shutdown can send the span.
    let server = Serving::start_config(
        &dir,
        &config,
        &["--otlp-schedule-delay-ms", "3600000"],
        &[("TOLLGATE_OTLP_ENDPOINT", &endpoint)],
    );
    let caller = Caller::new(7);
    let (status, body) = post(
        server.http,
        "/v1/request",
        r#"{"namespace":"default","resource":"api","domain":"acme"}"#,
        &caller,
    );
    assert_eq!(status, 200, "{body}");
    assert!(receiver.spans().is_empty(), "{:#?}", receiver.spans());
    let (code, logs) = server.terminate();
    assert_eq!(code, Some(0), "{logs:?}");
    // The process has exited: the span was sent before it did.
    let spans = receiver.spans();
    let r = spans
        .iter()
        .find(|r| caller.is_parent_of(r))
        .unwrap_or_else(|| panic!("the queued span was not flushed at shutdown: {spans:#?}"));
    assert_child(r, &caller, "tollgate.rate", "http");
}

#[test]
fn a_bad_endpoint_or_a_ca_without_tls_is_refused_at_startup() {
    let dir = Sandbox::new("otlp-bad");
    // Read and parsed at startup, not at the first export.
    dir.write("junk.pem", "not a certificate\n");
    for (args, expected) in [
        (
            vec!["--otlp-endpoint", "collector:4317"],
            "must start with http:// or https://",
        ),
        (
            vec![
                "--otlp-endpoint",
                "http://collector:4317",
                "--otlp-ca",
                "ca.pem",
            ],
            "--otlp-ca ca.pem needs an https:// endpoint",
        ),
        (
            vec![
                "--otlp-endpoint",
                "https://collector:4317",
                "--otlp-ca",
                "missing.pem",
            ],
            "cannot read --otlp-ca missing.pem",
        ),
        (
            vec![
                "--otlp-endpoint",
                "https://collector:4317",
                "--otlp-ca",
                "junk.pem",
            ],
            "--otlp-ca junk.pem: no CERTIFICATE block found",
        ),
    ] {
        let mut all = vec!["serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"];
        all.extend(args);
        // Bounded: a server that accepted the setup would serve on.
        let run = dir.run_within(&all, Duration::from_secs(60));
        assert_eq!(run.code, Some(1), "{run}");
        assert!(run.stderr.contains(expected), "{run}");
        assert!(run.stderr.contains("--otlp-endpoint"), "{run}");
    }
}

#[test]
fn spans_go_to_a_tls_collector_whose_certificate_chains_to_the_given_ca() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let receiver = Receiver::default();
    let certs = tollgate_redis::testing::TestCerts::generate();
    let collector = receiver.start_tls(&runtime, &certs);
    let (dir, config) = sandbox("otlp-tls");
    let ca = dir.write("ca.pem", &certs.ca).display().to_string();
    let endpoint = format!("https://{collector}");
    let start = |extra: &[&str]| {
        let mut args = vec!["--otlp-endpoint", &endpoint];
        args.extend_from_slice(extra);
        Serving::start_config(
            &dir,
            &config,
            &args,
            &[
                ("OTEL_BSP_SCHEDULE_DELAY", "50"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
            ],
        )
    };
    let request = r#"{"namespace":"default","resource":"api","domain":"acme"}"#;

    let trusted = start(&["--otlp-ca", &ca]);
    let caller = Caller::new(8);
    assert_eq!(post(trusted.http, "/v1/request", request, &caller).0, 200);
    expect_span(&receiver, &caller, "tollgate.rate", "http", &[], &[]);

    // Without the CA the collector's certificate is not trusted (Mozilla's
    // roots do not sign it): the export fails, is counted, and nothing
    // arrives.
    let untrusted = start(&[]);
    let stranger = Caller::new(9);
    assert_eq!(
        post(untrusted.http, "/v1/request", request, &stranger).0,
        200
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while untrusted
        .metric(r#"tollgate_spans_exported_total{outcome="error"}"#)
        .is_none_or(|n| n < 1.0)
    {
        assert!(Instant::now() < deadline, "no failed export was counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !receiver.spans().iter().any(|r| stranger.is_parent_of(r)),
        "{:#?}",
        receiver.spans()
    );
}
