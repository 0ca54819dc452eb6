//! The native gRPC API through real sockets: unary requests, errors with
//! reasons, sessions whose holds are released however they end, transfer
//! and seize across sessions, graceful shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{eventually, TestServer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tollgate_core::copies::Groups;
use tollgate_proto::v1::{
    self, session_request::Op, session_response::Result as Answer, tollgate_client::TollgateClient,
};
use tollgate_server::App;
use tollgate_store::MemoryStore;

const CONFIG: &str = r#"
namespaces:
  - name: app
    resources:
      - { name: api, algorithm: gcra, rate: 1/min, burst: 3 }
      - name: login
        algorithm: burst_tiers
        hard_limit: 4
        global_limit: 6
        tiers:
          - { limit: 10, window: 1s, active: 60s, cooldown: 0s }
      - name: sandbox
        kind: concurrency
        domain_limit: 3
        global_limit: 5
        groups: [ { name: big, members: [acme], limit: 4 } ]
  - name: open
    allow_unconfigured: true
    resources: []
  - name: quiet
    ignore_configured: true
    resources:
      - { name: api, algorithm: gcra, rate: 1/min, burst: 1 }
      - { name: pool, kind: concurrency, domain_limit: 1 }
"#;

fn rate(resource: &str, domain: &str, hits: u64) -> v1::RateRequest {
    v1::RateRequest {
        namespace: "app".into(),
        resource: resource.into(),
        domain: domain.into(),
        hits: Some(hits),
        min_hits: Some(hits),
        mode: v1::Mode::Try as i32,
        limit: None,
    }
}

async fn holds(app: &App<MemoryStore>, domain: &str) -> (u64, u64) {
    common::holds(app, "app", "sandbox", domain).await
}

/// A session on one stream: send operations, read answers in order.
struct Session {
    tx: mpsc::Sender<v1::SessionRequest>,
    rx: tonic::Streaming<v1::SessionResponse>,
    next: u64,
}

impl Session {
    async fn open(client: &mut TollgateClient<tonic::transport::Channel>) -> Session {
        let (tx, rx) = mpsc::channel(8);
        let rx = client
            .session(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Session { tx, rx, next: 1 }
    }

    async fn call(&mut self, op: Op) -> Answer {
        let id = self.next;
        self.next += 1;
        self.tx
            .send(v1::SessionRequest { id, op: Some(op) })
            .await
            .unwrap();
        let resp = self.rx.next().await.unwrap().unwrap();
        assert_eq!(resp.id, id, "answers come in order, with the request's id");
        resp.result.unwrap()
    }

    async fn reserve(&mut self, domain: &str, copies: u64, min: u64) -> v1::ReserveResponse {
        match self
            .call(Op::Reserve(v1::ReserveRequest {
                namespace: "app".into(),
                resource: "sandbox".into(),
                domain: domain.into(),
                copies,
                min_copies: Some(min),
                lease_ms: None,
            }))
            .await
        {
            Answer::Reserve(r) => r,
            other => panic!("expected a reservation, got {other:?}"),
        }
    }

    async fn release(&mut self, domain: &str, copies: u64, groups: Groups) -> Answer {
        self.call(Op::Release(v1::ReleaseRequest {
            namespace: "app".into(),
            resource: "sandbox".into(),
            domain: domain.into(),
            copies,
            groups,
            hold_id: String::new(),
        }))
        .await
    }

    async fn seize(&mut self, transfer_id: String) -> Answer {
        self.call(Op::Seize(v1::SeizeRequest {
            transfer_id,
            lease_ms: None,
        }))
        .await
    }

    /// Closes the session, which must answer `closed`.
    async fn close(&mut self) {
        let answer = self.call(Op::Close(v1::Close {})).await;
        assert!(matches!(answer, Answer::Closed(_)), "{answer:?}");
    }

    async fn transfer(&mut self, domain: &str, copies: u64, ttl_ms: u64) -> Answer {
        self.call(Op::Transfer(v1::TransferRequest {
            namespace: "app".into(),
            resource: "sandbox".into(),
            domain: domain.into(),
            copies,
            groups: vec![],
            ttl_ms,
            hold_id: String::new(),
        }))
        .await
    }
}

/// A server of [`CONFIG`], a client of it, and a session on that client
/// holding `copies` copies of `sandbox` for acme.
async fn a_session_holding(
    copies: u64,
) -> (
    TestServer,
    TollgateClient<tonic::transport::Channel>,
    Session,
) {
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;
    let mut s = Session::open(&mut client).await;
    assert_eq!(s.reserve("acme", copies, copies).await.granted, copies);
    (server, client, s)
}

/// A unary rate request that must succeed.
async fn ask(
    client: &mut TollgateClient<tonic::transport::Channel>,
    req: v1::RateRequest,
) -> v1::RateResponse {
    client.request(req).await.unwrap().into_inner()
}

/// The `tollgate-reason` of a refused call.
fn reason(e: &tonic::Status) -> &str {
    e.metadata()
        .get("tollgate-reason")
        .unwrap()
        .to_str()
        .unwrap()
}

/// Waits until the server has no session left (`what` names the wait), and
/// then nothing of acme's is held.
async fn released(server: &TestServer, what: &str) {
    eventually(what, || server.app.sessions().is_empty()).await;
    assert_eq!(holds(&server.app, "acme").await, (0, 0));
}

fn error(answer: &Answer) -> &v1::Error {
    match answer {
        Answer::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test]
async fn unary_requests_count_down_then_reject_with_context() {
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;
    for remaining in [2, 1, 0] {
        let r = ask(&mut client, rate("api", "u1", 1)).await;
        assert!(r.allowed);
        assert_eq!((r.granted, r.limit, r.remaining), (1, 3, remaining));
        assert_eq!(r.algorithm, "gcra");
    }
    let r = ask(&mut client, rate("api", "u1", 1)).await;
    assert!(!r.allowed);
    assert_eq!(r.granted, 0);
    assert_eq!(r.limited_by, v1::LimitedBy::Limit as i32);
    // One hit a minute once the burst of 3 is spent.
    let retry = r.retry_after_ns.unwrap();
    assert!(retry > 59_000_000_000 && retry <= 60_000_000_000, "{retry}");
    // Another domain has its own state.
    let r = ask(&mut client, rate("api", "u2", 1)).await;
    assert!(r.allowed);
    // Partial grants: 5 wanted, at least 1.
    let mut req = rate("api", "u3", 5);
    req.min_hits = Some(1);
    let r = ask(&mut client, req).await;
    assert_eq!((r.allowed, r.granted), (true, 3));
}

#[tokio::test]
async fn hard_and_global_limits_are_reported_and_name_what_limited() {
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;
    let r = ask(&mut client, rate("login", "a", 4)).await;
    assert!(r.allowed);
    assert_eq!((r.hard_limit, r.global_limit), (Some(4), Some(6)));
    assert_eq!(r.domain_hits_last_second, Some(4));
    assert_eq!(r.global_hits_last_second, Some(4));
    let tier = r.tier.unwrap();
    assert_eq!((tier.index, tier.limit, tier.hits), (1, 10, 4));
    // The hard limit (4 per second per domain) is spent.
    let r = ask(&mut client, rate("login", "a", 1)).await;
    assert!(!r.allowed);
    assert_eq!(r.limited_by, v1::LimitedBy::Hard as i32);
    // Another domain: 2 more reach the global limit of 6, the third fails.
    let r = ask(&mut client, rate("login", "b", 2)).await;
    assert!(r.allowed);
    let r = ask(&mut client, rate("login", "b", 1)).await;
    assert!(!r.allowed);
    assert_eq!(r.limited_by, v1::LimitedBy::Global as i32);
}

#[tokio::test]
async fn client_errors_have_distinct_codes_and_reasons() {
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;
    let cases = [
        (
            rate("nope", "u", 1),
            tonic::Code::NotFound,
            "unknown_resource",
        ),
        (
            rate("sandbox", "u", 1),
            tonic::Code::FailedPrecondition,
            "wrong_resource_kind",
        ),
        (
            v1::RateRequest {
                min_hits: Some(3),
                ..rate("api", "u", 2)
            },
            tonic::Code::InvalidArgument,
            "malformed_request",
        ),
        (
            v1::RateRequest {
                namespace: "ghost".into(),
                ..rate("api", "u", 1)
            },
            tonic::Code::NotFound,
            "unknown_namespace",
        ),
    ];
    for (req, code, why) in cases {
        let e = client.request(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert_eq!(reason(&e), why);
    }
    // allow_unconfigured: anything goes, and says so.
    let r = ask(
        &mut client,
        v1::RateRequest {
            namespace: "open".into(),
            ..rate("whatever", "u", 7)
        },
    )
    .await;
    assert!(r.allowed && r.unconfigured);
    assert_eq!(r.granted, 7);
}

#[tokio::test]
async fn a_session_reserves_releases_and_reports_errors_without_ending() {
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;
    let mut s = Session::open(&mut client).await;
    let r = s.reserve("acme", 2, 2).await;
    assert!(r.allowed);
    assert_eq!((r.granted, r.domain_holds, r.global_holds), (2, 2, 2));
    assert_eq!(r.groups, vec!["big".to_owned()]);
    assert_eq!(r.group_limits[0].holds, 2);
    // Only one copy is left for acme (domain limit 3).
    let r = s.reserve("acme", 2, 1).await;
    assert_eq!((r.granted, r.domain_holds), (1, 3));
    let r = s.reserve("acme", 1, 1).await;
    assert!(!r.allowed);
    // Release without naming groups: the session knows them.
    match s.release("acme", 2, vec![]).await {
        Answer::Release(r) => assert_eq!((r.released, r.still_held), (2, 1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(holds(&server.app, "acme").await, (1, 1));
    // Releasing more than the session holds: a client error, nothing lost.
    let e = s.release("acme", 5, vec![]).await;
    assert_eq!(error(&e).reason, "not_held");
    assert_eq!(error(&e).code, tonic::Code::FailedPrecondition as i32);
    assert_eq!(holds(&server.app, "acme").await, (1, 1));
    // Another session cannot release this one's copies.
    let mut other = Session::open(&mut client).await;
    assert_eq!(
        error(&other.release("acme", 1, vec![]).await).reason,
        "not_held"
    );
    // Wrong kind and unknown resource, inside the session.
    let e = s
        .call(Op::Reserve(v1::ReserveRequest {
            namespace: "app".into(),
            resource: "api".into(),
            domain: "acme".into(),
            copies: 1,
            ..Default::default()
        }))
        .await;
    assert_eq!(error(&e).reason, "wrong_resource_kind");
    let e = s.call(Op::Request(rate("nope", "x", 1))).await;
    assert_eq!(error(&e).reason, "unknown_resource");
    let e = s.seize("zz".into()).await;
    assert_eq!(error(&e).reason, "unknown_transfer");
    // Rate requests work on a session too.
    match s.call(Op::Request(rate("api", "acme", 1))).await {
        Answer::Request(r) => assert!(r.allowed),
        other => panic!("{other:?}"),
    }
    // The session still works after all those errors.
    assert_eq!(s.reserve("acme", 1, 1).await.granted, 1);
}

#[tokio::test]
async fn closing_a_session_releases_its_holds() {
    let (server, _client, mut s) = a_session_holding(3).await;
    assert_eq!(s.reserve("initech", 2, 2).await.granted, 2);
    assert_eq!(holds(&server.app, "acme").await, (3, 5));
    s.close().await;
    // Released before `closed` was answered.
    assert_eq!(holds(&server.app, "acme").await, (0, 0));
    // And the server ends the stream.
    assert!(s.rx.next().await.is_none());
    assert_eq!(server.app.sessions().len(), 0);
}

#[tokio::test]
async fn a_stream_that_just_ends_or_drops_releases_its_holds() {
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;
    // Half-close: the client ends its side without `Close`.
    let mut s = Session::open(&mut client).await;
    assert_eq!(s.reserve("acme", 2, 2).await.granted, 2);
    drop(s.tx);
    assert!(s.rx.next().await.is_none());
    released(&server, "half-closed session released").await;
    // Both sides dropped, connection kept (the client goes on with other
    // calls).
    let mut s = Session::open(&mut client).await;
    assert_eq!(s.reserve("acme", 3, 3).await.granted, 3);
    drop(s);
    released(&server, "dropped session released").await;
    // The whole connection dropped.
    let mut c2 = server.native().await;
    let mut s = Session::open(&mut c2).await;
    assert_eq!(s.reserve("acme", 1, 1).await.granted, 1);
    drop(s);
    drop(c2);
    released(&server, "dropped connection's session released").await;
}

#[tokio::test]
async fn transfer_and_seize_move_holds_between_sessions() {
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;
    let mut a = Session::open(&mut client).await;
    let mut b = Session::open(&mut client).await;
    assert_eq!(a.reserve("acme", 3, 3).await.granted, 3);
    let id = match a.transfer("acme", 2, 60_000).await {
        Answer::Transfer(t) => t.transfer_id,
        other => panic!("{other:?}"),
    };
    // Staged copies still count, and are no longer the sender's to release.
    assert_eq!(holds(&server.app, "acme").await, (3, 3));
    assert_eq!(
        error(&a.release("acme", 2, vec![]).await).reason,
        "not_held"
    );
    let seized = match b.seize(id.clone()).await {
        Answer::Seize(s) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (
            seized.namespace.as_str(),
            seized.resource.as_str(),
            seized.domain.as_str(),
            seized.copies
        ),
        ("app", "sandbox", "acme", 2)
    );
    assert_eq!(seized.groups, vec!["big".to_owned()]);
    // A transfer is seized once.
    let e = a.seize(id).await;
    assert_eq!(error(&e).reason, "unknown_transfer");
    // Closing the receiver releases what it seized; the sender keeps one.
    b.close().await;
    assert_eq!(holds(&server.app, "acme").await, (1, 1));
    // zero ttl is refused
    assert_eq!(
        error(&a.transfer("acme", 1, 0).await).reason,
        "malformed_request"
    );
}

#[tokio::test]
async fn an_unseized_transfer_is_released_when_its_ttl_ends() {
    let (server, _client, mut a) = a_session_holding(2).await;
    assert!(matches!(
        a.transfer("acme", 2, 30).await,
        Answer::Transfer(_)
    ));
    // The server's housekeeping sweeps expired transfers; polling the
    // store's view (a zero-copy reserve also expires them) until released.
    let app = &server.app;
    for _ in 0..1000 {
        if holds(app, "acme").await == (0, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(holds(app, "acme").await, (0, 0));
    // The session does not hold them either.
    assert_eq!(
        error(&a.release("acme", 1, vec![]).await).reason,
        "not_held"
    );
}

#[tokio::test]
async fn shutdown_ends_sessions_and_releases_their_holds() {
    let (server, _client, mut s) = a_session_holding(3).await;
    let app = std::sync::Arc::clone(&server.app);
    // `stop` returns once the server has stopped, which needs the session
    // stream to end: it does, without the client doing anything.
    let stopping = tokio::spawn(server.stop());
    assert!(s.rx.next().await.is_none_or(|r| r.is_err()));
    stopping.await.unwrap();
    assert!(app.sessions().is_empty());
    assert_eq!(holds(&app, "acme").await, (0, 0));
}

/// Regression (issue 16, item 4): a full session table answered
/// `UNAVAILABLE`, which clients read as "no server answered" and failed
/// open on. It is a refusal: `RESOURCE_EXHAUSTED`, with its reason; and
/// rate requests, which need no session, are still decided.
#[tokio::test]
async fn the_session_limit_refuses_more_sessions_with_resource_exhausted() {
    let server = TestServer::start_with(
        CONFIG,
        tollgate_service::SessionLimits {
            max_sessions: 1,
            ..Default::default()
        },
        tollgate_server::ServerOptions::default(),
    )
    .await;
    let mut client = server.native().await;
    let mut first = Session::open(&mut client).await;
    assert_eq!(first.reserve("acme", 1, 1).await.granted, 1);
    let (_tx, rx) = mpsc::channel::<v1::SessionRequest>(1);
    let e = client.session(ReceiverStream::new(rx)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert_eq!(reason(&e), "too_many_sessions");
    let r = ask(&mut client, rate("api", "acme", 1)).await;
    assert_eq!((r.allowed, r.granted), (true, 1));
}

/// Regression (issue 16, item 9): a rate request without `hits` was a
/// probe that counted nothing and answered `allowed`. Absent is one hit,
/// unary and on a session alike; `hits: 0` is still a probe.
#[tokio::test]
async fn a_request_without_hits_counts_one() {
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;
    let bare = |domain: &str| v1::RateRequest {
        hits: None,
        min_hits: None,
        ..rate("api", domain, 1)
    };
    for remaining in [2, 1, 0] {
        let r = ask(&mut client, bare("u")).await;
        assert_eq!((r.allowed, r.granted, r.remaining), (true, 1, remaining));
    }
    let r = ask(&mut client, bare("u")).await;
    assert_eq!((r.allowed, r.granted), (false, 0));
    // On a session.
    let mut s = Session::open(&mut client).await;
    for remaining in [2, 1] {
        let Answer::Request(r) = s.call(Op::Request(bare("v"))).await else {
            panic!()
        };
        assert_eq!((r.allowed, r.granted, r.remaining), (true, 1, remaining));
    }
    // A probe, asked for: nothing counted.
    let probe = v1::RateRequest {
        hits: Some(0),
        ..bare("v")
    };
    for _ in 0..2 {
        let r = ask(&mut client, probe.clone()).await;
        assert_eq!((r.allowed, r.granted, r.remaining), (true, 0, 1));
    }
}

/// Set in the child process of `a_killed_client_process_leaks_nothing`.
const CHILD_ENV: &str = "TOLLGATE_TEST_CHILD_GRPC";

/// In the child process only: opens a session, holds 3 copies, says so,
/// and waits to be killed. (In a normal run it does nothing.)
#[tokio::test]
async fn child_process_holding_copies() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut client = TollgateClient::connect(url).await.unwrap();
    let mut s = Session::open(&mut client).await;
    assert_eq!(s.reserve("acme", 3, 3).await.granted, 3);
    println!("HELD");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[tokio::test]
async fn a_killed_client_process_leaks_nothing() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let server = TestServer::start(CONFIG).await;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_process_holding_copies", "--exact", "--nocapture"])
        .env(CHILD_ENV, server.grpc_url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let held = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.trim() == "HELD")
    })
    .await
    .unwrap();
    assert!(held, "the child never reported holding");
    assert_eq!(holds(&server.app, "acme").await, (3, 3));
    // SIGKILL: no chance to close anything.
    child.kill().unwrap();
    child.wait().unwrap();
    released(&server, "the killed client's session released").await;
}

/// `RateRequest`'s wire shape with byte strings, to send what a
/// well-behaved client cannot: names that are not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawRateRequest {
    #[prost(bytes = "vec", tag = "1")]
    namespace: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    resource: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    domain: Vec<u8>,
    #[prost(uint64, tag = "4")]
    hits: u64,
}

#[tokio::test]
async fn bad_input_gets_client_errors_and_changes_nothing() {
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;

    // hits 0: a probe, granted, nothing counted.
    let r = ask(&mut client, rate("api", "p", 0)).await;
    assert!(r.allowed);
    assert_eq!((r.granted, r.remaining), (0, 3));
    // Huge hits: rejected, nothing counted, no overflow.
    let r = ask(&mut client, rate("api", "p", u64::MAX)).await;
    assert!(!r.allowed);
    assert_eq!(r.retry_after_ns, None, "more than the burst never fits");
    // In acquire mode a huge request is granted with the wait it implies
    // (saturating, no overflow), on its own domain's account only.
    let mut acquire = rate("api", "huge", u64::MAX);
    acquire.mode = v1::Mode::Acquire as i32;
    let r = ask(&mut client, acquire).await;
    assert!(r.allowed);
    assert!(
        r.wait_ns > 100 * 365 * 86_400 * 1_000_000_000,
        "{}",
        r.wait_ns
    );
    // Acquire on an algorithm that cannot schedule.
    let mut tiers = rate("login", "p", 1);
    tiers.mode = v1::Mode::Acquire as i32;
    let e = client.request(tiers).await.unwrap_err();
    assert_eq!(reason(&e), "cannot_schedule");
    // Empty names are malformed, not unknown.
    let e = client.request(rate("", "p", 1)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("resource is required"), "{e:?}");
    let mut empty_ns = rate("api", "p", 1);
    empty_ns.namespace.clear();
    let e = client.request(empty_ns).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Not even a namespace that allows unconfigured resources grants one
    // without a name.
    let e = client
        .request(v1::RateRequest {
            namespace: "open".into(),
            ..rate("", "p", 1)
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Absent min_hits is all or nothing; 0 makes a grant of nothing
    // acceptable.
    let mut probe = rate("api", "q", 9);
    probe.min_hits = None;
    let r = ask(&mut client, probe.clone()).await;
    assert_eq!((r.allowed, r.granted), (false, 0));
    probe.min_hits = Some(0);
    let r = ask(&mut client, probe).await;
    assert_eq!((r.allowed, r.granted), (true, 3));
    // An oversized message (the default limit is 64 KiB).
    let e = client
        .request(rate("api", &"x".repeat(100_000), 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    assert!(e.message().contains("too large"), "{e:?}");
    // Names that are not UTF-8: the message does not decode.
    let channel = tonic::transport::Channel::from_shared(server.grpc_url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    raw.ready().await.unwrap();
    let e = raw
        .unary::<RawRateRequest, v1::RateResponse, _>(
            tonic::Request::new(RawRateRequest {
                namespace: b"app".to_vec(),
                resource: b"api".to_vec(),
                domain: vec![0xff, 0xfe],
                hits: 1,
            }),
            http::uri::PathAndQuery::from_static("/tollgate.v1.Tollgate/Request"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert!(e.message().contains("decode"), "{e:?}");
    // None of it consumed anything: all three of the burst remain.
    let r = ask(&mut client, rate("api", "p", 1)).await;
    assert_eq!(r.remaining, 2);
    // A flood of unique domains is bounded by the store's key cap
    // (covered in the store's own tests); the server stays up.
    for i in 0..200 {
        client
            .request(rate("api", &format!("flood-{i}"), 1))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn an_ignoring_namespace_grants_and_says_what_it_would_have_done() {
    // Charon §4.3's switch for a whole namespace: limiting off, use still
    // counted, answers marked.
    let server = TestServer::start(CONFIG).await;
    let mut client = server.native().await;
    let quiet = |hits| v1::RateRequest {
        namespace: "quiet".into(),
        ..rate("api", "u", hits)
    };
    let first = ask(&mut client, quiet(1)).await;
    assert!(first.allowed && !first.ignored);
    let second = ask(&mut client, quiet(1)).await;
    assert!(second.allowed, "limiting is off");
    assert!(
        second.ignored,
        "but the answer says the limit would have rejected"
    );
    assert_eq!(second.granted, 1);
    // Holds too: more than the domain limit of 1.
    let mut s = Session::open(&mut client).await;
    let r = s
        .call(Op::Reserve(v1::ReserveRequest {
            namespace: "quiet".into(),
            resource: "pool".into(),
            domain: "u".into(),
            copies: 3,
            ..Default::default()
        }))
        .await;
    match r {
        Answer::Reserve(r) => {
            assert_eq!((r.allowed, r.granted), (true, 3));
            // Reported against the configured limit, which it exceeds.
            assert_eq!((r.domain_limit, r.domain_holds), (1, 3));
            assert!(r.ignored && !r.shadowed);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_broken_session_stream_ends_with_the_error_and_releases_holds() {
    let (server, _client, mut s) = a_session_holding(2).await;
    // Over the 64 KiB message limit: the stream cannot go on.
    s.tx.send(v1::SessionRequest {
        id: 99,
        op: Some(Op::Request(rate("api", &"x".repeat(100_000), 1))),
    })
    .await
    .unwrap();
    let end = s.rx.next().await.unwrap().unwrap_err();
    assert_eq!(end.code(), tonic::Code::OutOfRange, "{end:?}");
    released(&server, "the broken session released").await;
}

#[tokio::test]
async fn shutdown_finishes_even_when_a_session_client_stops_reading() {
    let options = tollgate_server::ServerOptions {
        shutdown_grace: Duration::from_millis(300),
        ..tollgate_server::ServerOptions::default()
    };
    let server = TestServer::start_with(CONFIG, Default::default(), options).await;
    let mut client = server.native().await;
    let (tx, rx) = mpsc::channel(1024);
    // Never read: answers back up into the server's session task.
    let _unread = client.session(ReceiverStream::new(rx)).await.unwrap();
    let request = |id| v1::SessionRequest {
        id,
        op: Some(Op::Request(v1::RateRequest {
            namespace: "open".into(),
            ..rate("x", &"d".repeat(200), 1)
        })),
    };
    let flood = tokio::spawn(async move {
        for id in 0..300_000 {
            if tx.send(request(id)).await.is_err() {
                break;
            }
        }
        tx
    });
    // Until the server stops taking requests (its task is stuck sending)
    // or everything was sent.
    for _ in 0..500 {
        if flood.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let app = std::sync::Arc::clone(&server.app);
    let stopped = tokio::time::timeout(Duration::from_secs(60), server.stop()).await;
    assert!(
        stopped.is_ok(),
        "shutdown hung on a client that stopped reading"
    );
    assert!(app.sessions().is_empty());
    flood.abort();
}
