//! Sessions through the service, against a real memory store: what a
//! closed session is granted is given back, closing twice releases once,
//! leases lapse and renew on the service's clock — and every copy keeps
//! exactly one owner when the store stalls past the caller's deadline or
//! the caller goes away (a store that stalls on command stands between
//! the service and the memory store).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio::sync::watch;
use tollgate_core::copies::{CopyLimits, Reservation, TransferId};
use tollgate_core::{Hits, Mode, Nanos, PlanDecision};
use tollgate_service::{
    Limiter, ManualClock, NotHeld, Service, ServiceError, ServiceOptions, Session, SessionLimits,
    Target, View, MAX_NAMED_GROUPS,
};
use tollgate_store::{Held, MemoryStore, OpId, Plan, PoolKey, Seized, Store, StoreError};

const CONFIG: &str = "namespaces:\n  - name: app\n    resources:\n      - { name: pool, kind: concurrency, domain_limit: 3 }\n      - { name: big, kind: concurrency, domain_limit: 1000 }\n";

/// A memory store whose copy operations wait while it is stalled, then
/// apply: Redis stalling past the caller's deadline and applying anyway.
struct Stalling {
    inner: MemoryStore,
    open: watch::Sender<bool>,
    /// While false, `restore` is refused as by a Redis store whose server
    /// resigned (the one store state in which copies cannot be counted
    /// again).
    restores: AtomicBool,
}

impl Stalling {
    fn new() -> Stalling {
        Stalling {
            inner: MemoryStore::new(),
            open: watch::channel(true).0,
            restores: AtomicBool::new(true),
        }
    }

    fn stall(&self) {
        self.open.send_replace(false);
    }

    fn resume(&self) {
        self.open.send_replace(true);
    }

    fn gate(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.open.subscribe();
        async move {
            let _ = rx.wait_for(|open| *open).await;
        }
    }
}

impl Store for Stalling {
    async fn decide(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        self.inner.decide(plan, now, request, mode).await
    }

    async fn reserve(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
        request: Hits,
        now: Nanos,
        op: OpId,
    ) -> Result<Reservation, StoreError> {
        self.gate().await;
        self.inner
            .reserve(pool, limits, domain, request, now, op)
            .await
    }

    async fn release(&self, held: Held<'_>, op: OpId) -> Result<(), StoreError> {
        self.gate().await;
        self.inner.release(held, op).await
    }

    async fn restore(&self, held: Held<'_>, op: OpId) -> Result<(), StoreError> {
        self.gate().await;
        if !self.restores.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable(
                "this server resigned from the copy log".into(),
            ));
        }
        self.inner.restore(held, op).await
    }

    async fn transfer(
        &self,
        held: Held<'_>,
        ttl: Nanos,
        now: Nanos,
        op: OpId,
    ) -> Result<TransferId, StoreError> {
        self.gate().await;
        self.inner.transfer(held, ttl, now, op).await
    }

    async fn seize(&self, id: TransferId, now: Nanos, op: OpId) -> Result<Seized, StoreError> {
        self.gate().await;
        self.inner.seize(id, now, op).await
    }

    async fn sweep(&self, now: Nanos) {
        self.inner.sweep(now).await;
    }
}

fn service_with(
    limits: SessionLimits,
    deadline: Duration,
) -> (Arc<Service<Stalling>>, Arc<ManualClock>) {
    service_with_options(ServiceOptions {
        sessions: limits,
        copy_deadline: deadline,
        ..ServiceOptions::default()
    })
}

fn service_with_options(options: ServiceOptions) -> (Arc<Service<Stalling>>, Arc<ManualClock>) {
    let loaded = tollgate_config::load_str("t.yaml", CONFIG).unwrap();
    let clock = Arc::new(ManualClock::new(Nanos::from_secs(1_000)));
    let limiter = Limiter::new(Stalling::new(), View::new(&loaded.config, Nanos::ZERO));
    let clock_dyn: Arc<dyn tollgate_service::Clock> = Arc::clone(&clock) as _;
    (Arc::new(Service::new(limiter, clock_dyn, options)), clock)
}

fn service() -> Arc<Service<Stalling>> {
    service_with(SessionLimits::default(), Duration::from_secs(5)).0
}

fn target(resource: &str) -> Target<'_> {
    Target {
        namespace: "app",
        resource,
        domain: "d",
    }
}

/// Copies of `app/resource` the memory store counts for `domain`, as a
/// zero-copy reserve reports them.
fn store_counts(store: &MemoryStore, resource: &str, domain: &str) -> u64 {
    store
        .reserve_now(
            &PoolKey::new("app", resource),
            &CopyLimits::new(u64::MAX, None),
            domain,
            Hits::between(0, 0),
            Nanos::ZERO,
        )
        .unwrap()
        .context
        .domain_holds
}

/// Copies of `resource` the store counts for domain `d`.
fn counted(svc: &Service<Stalling>, resource: &str) -> u64 {
    store_counts(&svc.limiter().store().inner, resource, "d")
}

/// Waits until no copy operation is in flight (their tasks run on the
/// test's runtime).
async fn settled<S: Store>(svc: &Service<S>) {
    for _ in 0..10_000 {
        if svc.in_flight() == 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("copy operations still in flight");
}

async fn reserve(svc: &Arc<Service<Stalling>>, s: &Arc<Session>, n: u64) -> u64 {
    svc.reserve(s, target("pool"), Hits::exactly(n))
        .await
        .unwrap()
        .reservation
        .granted
}

fn unavailable(e: &ServiceError) -> bool {
    matches!(e, ServiceError::Store(StoreError::Unavailable(_)))
}

/// Runs `op` while the store stalls past the caller's deadline, so it fails
/// as unavailable; then lets the store go on and waits until what it
/// applied meanwhile is settled.
async fn fails_while_stalled<T: std::fmt::Debug>(
    svc: &Service<Stalling>,
    op: impl Future<Output = Result<T, ServiceError>>,
) -> ServiceError {
    // `op` is an async call: it does nothing until awaited, after the stall.
    svc.limiter().store().stall();
    let e = op.await.unwrap_err();
    assert!(unavailable(&e), "{e:?}");
    svc.limiter().store().resume();
    settled(svc).await;
    e
}

#[tokio::test]
async fn a_grant_to_a_session_that_closed_meanwhile_is_given_back() {
    let svc = service();
    let s = svc.open(None).unwrap();
    svc.limiter().store().stall();
    let reserving = tokio::spawn({
        let (svc, s) = (Arc::clone(&svc), Arc::clone(&s));
        async move { svc.reserve(&s, target("pool"), Hits::exactly(2)).await }
    });
    tokio::task::yield_now().await;
    // The stream ends while the store is answering.
    assert_eq!(svc.close(&s).await.released, 0);
    svc.limiter().store().resume();
    let e = reserving.await.unwrap().unwrap_err();
    assert_eq!(e, ServiceError::SessionClosed);
    settled(&svc).await;
    assert_eq!(counted(&svc, "pool"), 0, "nothing leaked");
}

#[tokio::test]
async fn closing_twice_releases_once() {
    let svc = service();
    let s = svc.open(None).unwrap();
    assert_eq!(reserve(&svc, &s, 2).await, 2);
    // Another client's copy, which must survive both closes.
    let other = svc.open(None).unwrap();
    assert_eq!(reserve(&svc, &other, 1).await, 1);
    assert_eq!(svc.close(&s).await.released, 2);
    assert_eq!(svc.close(&s).await.released, 0);
    assert_eq!(counted(&svc, "pool"), 1);
}

#[tokio::test]
async fn leases_lapse_on_the_service_clock_unless_renewed_and_the_limit_on_sessions_holds() {
    let (svc, clock) = service_with(
        SessionLimits {
            max_sessions: 2,
            max_holds: 10,
        },
        Duration::from_secs(5),
    );
    let sec = Nanos::from_secs;
    let a = svc.open(Some(sec(10))).unwrap();
    let b = svc.open(Some(sec(10))).unwrap();
    assert_eq!(
        svc.open(None).unwrap_err(),
        ServiceError::TooManySessions(2)
    );
    for s in [&a, &b] {
        assert_eq!(reserve(&svc, s, 1).await, 1);
    }
    // Renewed at 5 s for 20 s: lapses at 25 s; b lapses at 10 s.
    clock.advance(Duration::from_secs(5));
    let renewed = svc.renew(&a.id().to_string(), Some(sec(20))).unwrap();
    assert_eq!(renewed, sec(1_025));
    clock.advance(Duration::from_secs(5));
    assert_eq!(svc.reap(), 1);
    settled(&svc).await;
    assert_eq!(counted(&svc, "pool"), 1);
    assert!(svc.hold(&b.id().to_string()).is_err());
    // Too late to renew a lapsed lease, even before it is reaped.
    clock.advance(Duration::from_secs(15));
    assert!(svc.renew(&a.id().to_string(), None).is_err());
    assert!(svc.hold(&a.id().to_string()).is_err());
    assert_eq!(svc.reap(), 1);
    settled(&svc).await;
    assert_eq!(counted(&svc, "pool"), 0);
    assert!(svc.sessions().is_empty());
}

/// Issue 16 item 1: the store stalls while a hold is dropped. The close is
/// never undone: its releases go on until the store answers, and no copy
/// stays counted for a session that no longer exists.
#[tokio::test]
async fn a_close_during_a_stall_releases_everything_once_the_store_answers() {
    let (svc, _) = service_with(SessionLimits::default(), Duration::from_millis(10));
    let s = svc.open(Some(Nanos::from_secs(60))).unwrap();
    assert_eq!(reserve(&svc, &s, 3).await, 3);
    svc.limiter().store().stall();
    let closed = svc.close(&s).await;
    assert_eq!(closed.released, 3);
    assert!(closed.pending, "the store has not confirmed yet");
    assert!(svc.sessions().is_empty());
    assert_eq!(counted(&svc, "pool"), 3, "still counted during the stall");
    svc.limiter().store().resume();
    settled(&svc).await;
    assert_eq!(counted(&svc, "pool"), 0, "released once the store answered");
    // And the domain can reserve its whole limit again.
    let t = svc.open(None).unwrap();
    assert_eq!(reserve(&svc, &t, 3).await, 3);
}

/// A reserve the store applies after the caller's deadline is undone: the
/// caller was told it failed, and nothing is held.
#[tokio::test]
async fn a_reserve_applied_after_its_deadline_is_released() {
    let (svc, _) = service_with(SessionLimits::default(), Duration::from_millis(10));
    let s = svc.open(None).unwrap();
    let e = fails_while_stalled(&svc, svc.reserve(&s, target("pool"), Hits::exactly(2))).await;
    assert_eq!(e.reason(), "store_unavailable");
    assert_eq!(s.held(), 0);
    assert_eq!(counted(&svc, "pool"), 0);
}

/// Issue 16 item 2: the caller of a release goes away (an HTTP client that
/// hangs up makes hyper drop the handler's future). The release is undone:
/// the session still holds the copies, and the store still counts them.
#[tokio::test]
async fn a_release_whose_caller_went_away_is_undone() {
    let svc = service();
    let s = svc.open(None).unwrap();
    assert_eq!(reserve(&svc, &s, 3).await, 3);
    svc.limiter().store().stall();
    {
        let release = svc.release(&s, target("pool"), None, 2);
        // Polled once, then dropped.
        let polled = tokio::time::timeout(Duration::from_millis(1), release).await;
        assert!(polled.is_err());
    }
    svc.limiter().store().resume();
    settled(&svc).await;
    assert_eq!(s.held(), 3, "the session holds what it held");
    assert_eq!(counted(&svc, "pool"), 3, "and the store counts it");
    // A release now goes through.
    let done = svc.release(&s, target("pool"), None, 3).await.unwrap();
    assert_eq!((done.released, done.still_held), (3, 0));
    assert_eq!(counted(&svc, "pool"), 0);
}

/// A transfer whose caller gave up is taken back into the session, so
/// nobody holds copies staged under an id nobody knows.
#[tokio::test]
async fn a_transfer_whose_caller_gave_up_is_seized_back() {
    let (svc, _) = service_with(SessionLimits::default(), Duration::from_millis(10));
    let s = svc.open(None).unwrap();
    assert_eq!(reserve(&svc, &s, 2).await, 2);
    fails_while_stalled(
        &svc,
        svc.transfer(&s, target("pool"), None, 2, Nanos::from_secs(60)),
    )
    .await;
    assert_eq!(s.held(), 2);
    assert_eq!(counted(&svc, "pool"), 2);
    let store = &svc.limiter().store().inner;
    assert_eq!(store.sweep_now(Nanos::from_secs(10_000)), 0);
    assert_eq!(
        store_counts(store, "pool", "d"),
        2,
        "nothing was left staged to expire"
    );
}

/// A seize whose caller gave up releases what it took.
#[tokio::test]
async fn a_seize_whose_caller_gave_up_is_released() {
    let (svc, _) = service_with(SessionLimits::default(), Duration::from_millis(10));
    let giver = svc.open(None).unwrap();
    assert_eq!(reserve(&svc, &giver, 2).await, 2);
    let id = svc
        .transfer(&giver, target("pool"), None, 2, Nanos::from_secs(60))
        .await
        .unwrap();
    let taker = svc.open(None).unwrap();
    fails_while_stalled(&svc, svc.seize(&taker, id)).await;
    assert_eq!(taker.held(), 0);
    assert_eq!(counted(&svc, "pool"), 0);
}

/// A store that stalls for long must not pile up a task per request:
/// past `max_in_flight` waiting operations, new ones are refused at once,
/// while closes still go through.
#[tokio::test]
async fn copy_operations_waiting_for_a_stalled_store_are_bounded() {
    let (svc, _) = service_with_options(ServiceOptions {
        copy_deadline: Duration::from_millis(5),
        max_in_flight: 2,
        ..ServiceOptions::default()
    });
    let s = svc.open(None).unwrap();
    assert_eq!(reserve(&svc, &s, 1).await, 1);
    svc.limiter().store().stall();
    for _ in 0..2 {
        let e = svc
            .reserve(&s, target("pool"), Hits::exactly(1))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("did not answer"), "{e}");
    }
    assert_eq!(svc.in_flight(), 2);
    let e = svc
        .reserve(&s, target("pool"), Hits::exactly(1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("already waiting"), "{e}");
    // A release or a transfer refused for load moves nothing out of the
    // hold (review: they used to lose the copies they had taken out).
    let e = svc.release(&s, target("pool"), None, 1).await.unwrap_err();
    assert!(e.to_string().contains("already waiting"), "{e}");
    let e = svc
        .transfer(&s, target("pool"), None, 1, Nanos::from_secs(60))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("already waiting"), "{e}");
    assert_eq!(s.held(), 1, "the hold keeps its copy");
    assert_eq!(svc.in_flight(), 2, "nothing more was started");
    // Ending the session is never refused.
    assert_eq!(svc.close(&s).await.released, 1);
    assert_eq!(svc.in_flight(), 3);
    svc.limiter().store().resume();
    settled(&svc).await;
    assert_eq!(
        counted(&svc, "pool"),
        0,
        "the two late grants undone, the hold released"
    );
}

/// Issue 16 item 6: a session's record is bounded in entries.
#[tokio::test]
async fn a_session_holds_copies_under_at_most_max_holds_entries() {
    let (svc, _) = service_with(
        SessionLimits {
            max_sessions: 10,
            max_holds: 2,
        },
        Duration::from_secs(5),
    );
    let s = svc.open(None).unwrap();
    for domain in ["a", "b"] {
        let t = Target {
            domain,
            ..target("big")
        };
        svc.reserve(&s, t, Hits::exactly(1)).await.unwrap();
    }
    // More of a key it holds is fine; a third key is refused, untouched.
    let again = Target {
        domain: "a",
        ..target("big")
    };
    svc.reserve(&s, again, Hits::exactly(1)).await.unwrap();
    let third = Target {
        domain: "c",
        ..target("big")
    };
    let e = svc.reserve(&s, third, Hits::exactly(1)).await.unwrap_err();
    assert_eq!(e, ServiceError::TooManyHolds(2));
    assert_eq!(e.reason(), "too_many_holds");
    assert!(e.is_client_error());
    assert_eq!(s.held(), 3);
}

/// Issue 16 item 6: names are bounded in bytes, with an error naming the
/// limit, before anything is stored.
#[tokio::test]
async fn names_over_the_limit_are_refused() {
    let svc = service();
    let s = svc.open(None).unwrap();
    let long = "x".repeat(1025);
    let t = Target {
        domain: &long,
        ..target("big")
    };
    let e = svc.reserve(&s, t, Hits::exactly(1)).await.unwrap_err();
    assert_eq!(e.reason(), "malformed_request");
    assert!(e.to_string().contains("1025 bytes"), "{e}");
    assert!(e.to_string().contains("1024"), "{e}");
    assert_eq!(s.held(), 0);
}

#[tokio::test]
async fn a_shadow_pool_grants_counts_in_its_groups_and_says_it_would_have_refused() {
    let yaml = "namespaces:\n  - name: app\n    resources:\n      - { name: pool, kind: concurrency, shadow_mode: true, domain_limit: 1, global_limit: 5, groups: [ { name: big, members: [d], limit: 2 } ] }\n";
    let loaded = tollgate_config::load_str("t.yaml", yaml).unwrap();
    let l = Limiter::new(MemoryStore::new(), View::new(&loaded.config, Nanos::ZERO));
    let reserve = |copies| {
        l.reserve(
            "app",
            "pool",
            "d",
            Hits::exactly(copies),
            Nanos::ZERO,
            OpId::random(),
        )
    };
    let first = reserve(1).await.unwrap();
    assert!(!first.shadowed, "within every limit");
    let second = reserve(2).await.unwrap();
    assert!(second.reservation.allowed && second.shadowed && !second.ignored);
    let c = &second.reservation.context;
    assert_eq!((c.domain_limit, c.domain_holds), (1, 3));
    assert_eq!(c.global_limit, Some(5));
    // Counted in the group, so an enforcing config releases them from it.
    assert_eq!(second.reservation.groups, vec!["big".to_owned()]);
    assert_eq!((c.groups[0].limit, c.groups[0].holds), (2, 3));
}

/// One step of the property test below.
#[derive(Clone, Debug)]
enum Step {
    Reserve {
        session: usize,
        copies: u64,
    },
    Release {
        session: usize,
        copies: u64,
    },
    Transfer {
        session: usize,
        copies: u64,
    },
    Seize {
        session: usize,
    },
    Close {
        session: usize,
    },
    /// Stall the store; the next operation's caller gives up.
    Stall,
    Resume,
}

fn step() -> impl Strategy<Value = Step> {
    let session = 0usize..3;
    prop_oneof![
        (session.clone(), 1u64..4).prop_map(|(session, copies)| Step::Reserve { session, copies }),
        (session.clone(), 1u64..3).prop_map(|(session, copies)| Step::Release { session, copies }),
        (session.clone(), 1u64..3).prop_map(|(session, copies)| Step::Transfer { session, copies }),
        session.clone().prop_map(|session| Step::Seize { session }),
        session.prop_map(|session| Step::Close { session }),
        Just(Step::Stall),
        Just(Step::Resume),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever mix of operations, stalls past the deadline, abandoned
    /// callers and closes: once everything settled, the store counts
    /// exactly what the open sessions hold plus what is staged, never
    /// more than the limit; and after every session closes and every
    /// transfer expires, nothing.
    #[test]
    fn every_copy_keeps_exactly_one_owner(steps in prop::collection::vec(step(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let (svc, _) = service_with(SessionLimits::default(), Duration::from_millis(2));
            let mut sessions: Vec<Arc<Session>> = (0..3).map(|_| svc.open(None).unwrap()).collect();
            let mut staged: Vec<TransferId> = Vec::new();
            for s in steps {
                match s {
                    Step::Reserve { session, copies } => {
                        let _ = svc.reserve(&sessions[session], target("pool"), Hits::between(1, copies)).await;
                    }
                    Step::Release { session, copies } => {
                        let _ = svc.release(&sessions[session], target("pool"), None, copies).await;
                    }
                    Step::Transfer { session, copies } => {
                        if let Ok(id) = svc.transfer(&sessions[session], target("pool"), None, copies, Nanos::from_secs(60)).await {
                            staged.push(id);
                        }
                    }
                    Step::Seize { session } => {
                        if let Some(id) = staged.pop() {
                            let _ = svc.seize(&sessions[session], id).await;
                        }
                    }
                    Step::Close { session } => {
                        svc.close(&sessions[session]).await;
                        sessions[session] = svc.open(None).unwrap();
                    }
                    Step::Stall => svc.limiter().store().stall(),
                    Step::Resume => svc.limiter().store().resume(),
                }
            }
            svc.limiter().store().resume();
            settled(&svc).await;
            let held: u64 = sessions.iter().map(|s| s.held()).sum();
            let pool = PoolKey::new("app", "pool");
            let store = &svc.limiter().store().inner;
            // What is still staged is counted too: taken out (seized and
            // released), the rest must be exactly what the sessions hold.
            for id in &staged {
                if let Ok(s) = store.seize_now(*id, Nanos::from_secs(1_000)) {
                    store
                        .release_now(&pool, &s.staged.domain, &s.staged.groups, s.staged.copies)
                        .unwrap();
                }
            }
            assert_eq!(counted(&svc, "pool"), held, "the store counts what the sessions hold");
            assert!(held <= 3, "never beyond the domain limit");
            for s in &sessions {
                svc.close(s).await;
            }
            settled(&svc).await;
            assert_eq!(counted(&svc, "pool"), 0, "nothing left once every session closed");
        });
    }
}

/// Issue 23: `not_held` said ``domain `globex` holds 2 copies in groups []``
/// of a hold whose copies are in group `big`, and a release naming the
/// wrong domain did not say whose copies the hold has. The refusal now
/// names the holder, what was asked, and what it holds instead.
#[tokio::test]
async fn not_held_says_what_the_session_holds_instead() {
    const GROUPS: &str = "namespaces:\n  - name: app\n    resources:\n      - { name: sandbox, kind: concurrency, domain_limit: 3, groups: [ { name: big, members: [acme, globex], limit: 20 } ] }\n      - { name: other, kind: concurrency, domain_limit: 3 }\n      - { name: api, algorithm: gcra, rate: 1/s }\n";
    let svc = memory_service(GROUPS);
    let at = |resource, domain| Target {
        namespace: "app",
        resource,
        domain,
    };
    fn message<T: std::fmt::Debug>(r: Result<T, ServiceError>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.reason(), "not_held", "{e}");
        e.to_string()
    }
    let big = vec!["big".to_string()];
    let small = vec!["small".to_string()];
    // An HTTP hold: a session with a lease.
    let hold = svc.open(Some(Nanos::from_secs(60))).unwrap();
    let r = svc
        .reserve(&hold, at("sandbox", "globex"), Hits::exactly(2))
        .await
        .unwrap();
    assert_eq!(r.reservation.groups, big);
    let has = "it holds 2 copies of `sandbox` for domain `globex` in group `big`";
    assert_eq!(
        message(svc.release(&hold, at("sandbox", "globex"), None, 3).await),
        format!("this hold holds only 2 copies of resource `sandbox` for domain `globex`, so it cannot release 3; {has}")
    );
    assert_eq!(
        message(svc.release(&hold, at("sandbox", "acme"), None, 1).await),
        format!("this hold holds no copies of resource `sandbox` for domain `acme`, so it cannot release 1; {has}")
    );
    assert_eq!(
        message(svc.release(&hold, at("sandbox", "globex"), Some(&small), 1).await),
        format!("this hold holds no copies of resource `sandbox` for domain `globex` in group `small`, so it cannot release 1; {has}")
    );
    assert_eq!(
        message(
            svc.transfer(&hold, at("other", "globex"), None, 1, Nanos::from_secs(5))
                .await
        ),
        format!("this hold holds no copies of resource `other` for domain `globex`, so it cannot transfer 1; {has}")
    );
    // Nothing moved; naming it right works.
    assert_eq!(counted_in(&svc, "sandbox", "globex"), 2);
    svc.release(&hold, at("sandbox", "globex"), Some(&big), 1)
        .await
        .unwrap();

    // A gRPC session (no lease) that holds nothing, then many entries:
    // the message lists the ones asked about first and stays bounded.
    let session = svc.open(None).unwrap();
    assert_eq!(
        message(svc.release(&session, at("sandbox", "globex"), None, 1).await),
        "this session holds no copies of resource `sandbox` for domain `globex`, so it cannot release 1; it holds no copies at all"
    );
    for domain in ["d1", "d2", "d3", "d4", "d5", "d6"] {
        svc.reserve(&session, at("other", domain), Hits::exactly(1))
            .await
            .unwrap();
    }
    svc.reserve(&session, at("sandbox", "acme"), Hits::exactly(1))
        .await
        .unwrap();
    assert_eq!(
        message(svc.release(&session, at("sandbox", "acme"), None, 2).await),
        "this session holds only 1 copy of resource `sandbox` for domain `acme`, so it cannot release 2; it holds 1 copy of `sandbox` for domain `acme` in group `big`, 1 copy of `other` for domain `d1` in no group, 1 copy of `other` for domain `d2` in no group, 1 copy of `other` for domain `d3` in no group, 1 copy of `other` for domain `d4` in no group, and 2 more"
    );
    // A wrong resource name is still told it is wrong, not "not held".
    let e = svc
        .release(&session, at("nope", "acme"), None, 1)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "unknown_resource", "{e}");
    let e = svc
        .release(&session, at("api", "acme"), None, 1)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "wrong_resource_kind", "{e}");
}

/// Copies of `resource` the memory store counts for `domain`.
fn counted_in(svc: &Service<MemoryStore>, resource: &str, domain: &str) -> u64 {
    store_counts(svc.limiter().store(), resource, domain)
}

/// A pool whose domain `d` is in group `big` (`grouped`) or in none.
fn pool_config(grouped: bool) -> tollgate_config::Config {
    let groups = if grouped {
        ", groups: [ { name: big, members: [d], limit: 100 } ]"
    } else {
        ""
    };
    let yaml = format!(
        "namespaces:\n  - name: app\n    resources:\n      - {{ name: pool, kind: concurrency, domain_limit: 100{groups} }}\n"
    );
    tollgate_config::load_str("t.yaml", &yaml).unwrap().config
}

/// A session holding 3 copies of `pool` for `d` in group `big` and 1 in no
/// group (its domain left the group between the two reserves), and the
/// store's count of the second taken away behind the session's back, so
/// the store refuses a release of it.
async fn two_holds_the_second_unknown_to_the_store<S: Store>(
    svc: &Arc<Service<S>>,
    memory: impl Fn(&S) -> &MemoryStore,
) -> Arc<Session> {
    let limiter = svc.limiter();
    limiter.set_view(View::new(&pool_config(true), Nanos::ZERO));
    let s = svc.open(None).unwrap();
    let r = svc
        .reserve(&s, target("pool"), Hits::exactly(3))
        .await
        .unwrap();
    assert_eq!(r.reservation.groups, vec!["big".to_owned()]);
    limiter.set_view(View::new(&pool_config(false), Nanos::ZERO));
    let r = svc
        .reserve(&s, target("pool"), Hits::exactly(1))
        .await
        .unwrap();
    assert!(r.reservation.groups.is_empty());
    memory(limiter.store())
        .release_now(&PoolKey::new("app", "pool"), "d", &vec![], 1)
        .unwrap();
    assert_eq!(s.held(), 4);
    s
}

/// Review of issue 23: a release naming no groups took 3 copies from the
/// hold in group `big` and 1 from the hold in no group; the store released
/// the first and refused the second (`not_held`), and the caller was told
/// the release failed while the first 3 stayed released and out of the
/// session's record. A refused release now changes nothing.
#[tokio::test]
async fn a_release_the_store_refuses_halfway_changes_nothing() {
    let svc = memory_service(CONFIG);
    let s = two_holds_the_second_unknown_to_the_store(&svc, |m| m).await;
    let e = svc.release(&s, target("pool"), None, 4).await.unwrap_err();
    assert_eq!(e.reason(), "not_held", "{e}");
    settled(&svc).await;
    assert_eq!(s.held(), 4, "the session holds what it held");
    let big = vec!["big".to_owned()];
    assert_eq!(
        counted_in(&svc, "pool", "d"),
        3,
        "and the store counts the 3 in `big` again"
    );
    // They are released as any others are.
    let done = svc
        .release(&s, target("pool"), Some(&big), 3)
        .await
        .unwrap();
    assert_eq!((done.released, done.still_held), (3, 1));
}

/// The other half of the rule above: when the store cannot count copies
/// again (a Redis server that resigned), what it released stays released,
/// and the caller is told that much was released rather than an error, so
/// the hold is what the answer says.
#[tokio::test]
async fn a_release_refused_halfway_that_cannot_be_undone_answers_what_was_released() {
    let svc = service();
    let s = two_holds_the_second_unknown_to_the_store(&svc, |st| &st.inner).await;
    svc.limiter()
        .store()
        .restores
        .store(false, Ordering::SeqCst);
    let done = svc.release(&s, target("pool"), None, 4).await.unwrap();
    assert_eq!((done.released, done.still_held), (3, 1));
    settled(&svc).await;
    assert_eq!(s.held(), 1, "the session holds what the answer says");
    assert_eq!(counted(&svc, "pool"), 0);
}

/// Review of issue 23: the `groups` of a release or transfer were bounded
/// neither in number nor in length (`namespace`, `resource` and `domain`
/// are), and `not_held` echoed them all, with every name of what the
/// session holds: five holdings with 1 KiB names made a message over the
/// 1 KiB a surface sends, which then cut out its middle, the list of what
/// is held. Groups are now bounded as names are, and the message stays
/// within its budget naming what is held first.
#[tokio::test]
async fn not_held_stays_within_its_budget_and_groups_are_bounded() {
    // 1 KiB domains (two-byte characters, to be cut at one), groups half
    // that, each domain in all eight.
    let domains: Vec<String> = (1..=7)
        .map(|i| format!("d{i}{}", "é".repeat(511)))
        .collect();
    let groups: Vec<String> = (0..8).map(|i| format!("g{i}{}", "x".repeat(510))).collect();
    let mut yaml = String::from(
        "namespaces:\n  - name: app\n    resources:\n      - name: sandbox\n        kind: concurrency\n        domain_limit: 10\n        groups:\n",
    );
    for g in &groups {
        yaml += &format!(
            "          - {{ name: {g}, limit: 100, members: [{}] }}\n",
            domains.join(", ")
        );
    }
    let svc = memory_service(&yaml);
    let at = |domain| Target {
        namespace: "app",
        resource: "sandbox",
        domain,
    };
    let s = svc.open(None).unwrap();
    assert_eq!(domains[0].len(), 1024);
    for d in &domains[..6] {
        svc.reserve(&s, at(d), Hits::exactly(1)).await.unwrap();
    }
    // As many groups as a request may name, each as long as a name may be.
    let named: Vec<String> = (0..MAX_NAMED_GROUPS)
        .map(|i| format!("{i:04}{}", "n".repeat(1020)))
        .collect();
    let e = svc
        .release(&s, at(&domains[6]), Some(&named), 1)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "not_held", "{e}");
    let message = e.to_string();
    assert!(
        message.len() <= NotHeld::MAX_BYTES,
        "{} bytes: {message}",
        message.len()
    );
    let cut = |name: &str| {
        let mut end = NotHeld::NAME_BYTES;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &name[..end])
    };
    assert!(
        message.starts_with(&format!(
            "this session holds no copies of resource `sandbox` for domain `{}` in groups `{}`, `{}` and 62 more, so it cannot release 1; it holds 1 copy of `sandbox` for domain `{}` in groups `{}`, `{}` and 6 more",
            cut(&domains[6]),
            cut(&named[0]),
            cut(&named[1]),
            cut(&domains[0]),
            cut(&groups[0]),
            cut(&groups[1]),
        )),
        "{message}"
    );
    assert!(message.ends_with(" more"), "{message}");

    // One group more than the bound, or one byte more in a group's name,
    // is refused as a malformed request saying the bound.
    let mut too_many = named.clone();
    too_many.push("g".into());
    let e = svc
        .release(&s, at(&domains[0]), Some(&too_many), 1)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "malformed_request", "{e}");
    assert!(
        e.to_string().contains("names 65 groups; the limit is 64"),
        "{e}"
    );
    let long = vec!["g".repeat(1025)];
    let e = svc
        .transfer(&s, at(&domains[0]), Some(&long), 1, Nanos::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "malformed request: the group is 1025 bytes long; the limit is 1024 bytes"
    );
    assert_eq!(s.held(), 6, "nothing moved");
}

/// A service over a memory store with the config `yaml`, at a fixed time.
fn memory_service(yaml: &str) -> Arc<Service<MemoryStore>> {
    let loaded = tollgate_config::load_str("t.yaml", yaml).unwrap();
    let clock = Arc::new(ManualClock::new(Nanos::from_secs(1_000)));
    let limiter = Limiter::new(MemoryStore::new(), View::new(&loaded.config, Nanos::ZERO));
    Arc::new(Service::new(limiter, clock as _, ServiceOptions::default()))
}

/// Regression: the bounds on named groups refused releases of holds the
/// config itself made. A domain in more groups than a request may name,
/// with a group name longer than a name may be, reserves; its release and
/// transfer naming exactly the groups the reserve answered are taken.
#[tokio::test]
async fn a_hold_in_more_groups_than_a_request_may_name_is_released_by_naming_them() {
    let mut groups: Vec<String> = (0..=MAX_NAMED_GROUPS).map(|i| format!("g{i}")).collect();
    groups[0] = format!("g{}", "x".repeat(2000));
    let mut yaml = String::from(
        "namespaces:\n  - name: app\n    resources:\n      - name: sandbox\n        kind: concurrency\n        domain_limit: 10\n        groups:\n",
    );
    for g in &groups {
        yaml += &format!("          - {{ name: {g}, limit: 100, members: [acme] }}\n");
    }
    let svc = memory_service(&yaml);
    let at = Target {
        namespace: "app",
        resource: "sandbox",
        domain: "acme",
    };
    let s = svc.open(None).unwrap();
    let granted = svc.reserve(&s, at, Hits::exactly(3)).await.unwrap();
    let named = granted.reservation.groups.clone();
    assert_eq!(named.len(), MAX_NAMED_GROUPS + 1);
    svc.release(&s, at, Some(&named), 1).await.unwrap();
    svc.transfer(&s, at, Some(&named), 1, Nanos::from_secs(5))
        .await
        .unwrap();
    assert_eq!(s.held(), 1);
    // The same list with one name changed names no hold: bounded, refused.
    let mut other = named.clone();
    other[1] = "nope".into();
    let e = svc.release(&s, at, Some(&other), 1).await.unwrap_err();
    assert_eq!(e.reason(), "malformed_request", "{e}");
    assert_eq!(s.held(), 1, "nothing moved");
}

/// However long every name and however many entries, a `not_held` message
/// stays within [`NotHeld::MAX_BYTES`] and names the first holding.
#[test]
fn the_longest_not_held_message_fits_its_budget() {
    let long = |c: &str| c.repeat(4096);
    let groups = |n: usize| {
        (0..n)
            .map(|i| format!("{i}{}", long("g")))
            .collect::<Vec<_>>()
    };
    let holding = tollgate_service::Holding {
        namespace: long("m"),
        resource: long("r"),
        domain: long("ü"),
        groups: groups(1000),
        copies: u64::MAX,
    };
    for operation in ["release", "transfer"] {
        let e = NotHeld {
            holder: "session",
            operation,
            namespace: long("n"),
            resource: long("r"),
            domain: long("d"),
            groups: Some(groups(MAX_NAMED_GROUPS)),
            held: u64::MAX,
            requested: u64::MAX,
            holds: vec![holding.clone(); NotHeld::SHOWN],
            more: usize::MAX,
        };
        let message = e.to_string();
        assert!(
            message.len() <= NotHeld::MAX_BYTES,
            "{} bytes: {message}",
            message.len()
        );
        assert!(
            message.contains(&format!("; it holds {} copies of `rrrr", u64::MAX)),
            "{message}"
        );
        assert!(
            message.ends_with(&format!(", and {} more", usize::MAX)),
            "{message}"
        );
    }
}
