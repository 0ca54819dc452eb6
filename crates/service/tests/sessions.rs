//! Sessions against a real memory store: what a closed session is granted
//! is given back, closing twice releases once, leases lapse and renew.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_core::{Nanos, Request};
use tollgate_service::{Limiter, ServiceError, SessionLimits, Sessions, View};
use tollgate_store::MemoryStore;

const CONFIG: &str = "namespaces:\n  - name: app\n    resources:\n      - { name: pool, kind: concurrency, domain_limit: 3 }\n";

fn limiter() -> Limiter<MemoryStore> {
    let loaded = tollgate_config::load_str("t.yaml", CONFIG).unwrap();
    Limiter::new(MemoryStore::new(), View::new(&loaded.config, Nanos::ZERO))
}

async fn held(l: &Limiter<MemoryStore>) -> u64 {
    l.reserve("app", "pool", "d", Request::between(0, 0), Nanos::ZERO)
        .await
        .unwrap()
        .reservation
        .context
        .domain_holds
}

#[tokio::test]
async fn a_grant_to_a_session_that_already_closed_is_given_back() {
    let l = limiter();
    let sessions = Sessions::new(SessionLimits::default());
    let s = sessions.open(None, Nanos::ZERO).unwrap();
    sessions.close(&l, &s).await;
    // The race this stands for: the stream ended while the store answered.
    let e = sessions
        .reserve(&l, &s, "app", "pool", "d", Request::exactly(2), Nanos::ZERO)
        .await
        .unwrap_err();
    assert_eq!(e, ServiceError::SessionClosed);
    assert_eq!(held(&l).await, 0, "nothing leaked");
}

#[tokio::test]
async fn closing_twice_releases_once() {
    let l = limiter();
    let sessions = Sessions::new(SessionLimits::default());
    let s = sessions.open(None, Nanos::ZERO).unwrap();
    sessions
        .reserve(&l, &s, "app", "pool", "d", Request::exactly(2), Nanos::ZERO)
        .await
        .unwrap();
    // Another client's copy, which must survive both closes.
    let other = sessions.open(None, Nanos::ZERO).unwrap();
    sessions
        .reserve(
            &l,
            &other,
            "app",
            "pool",
            "d",
            Request::exactly(1),
            Nanos::ZERO,
        )
        .await
        .unwrap();
    assert_eq!(sessions.close(&l, &s).await, 2);
    assert_eq!(sessions.close(&l, &s).await, 0);
    assert_eq!(held(&l).await, 1);
}

#[tokio::test]
async fn leases_lapse_unless_renewed_and_the_limit_on_sessions_holds() {
    let l = limiter();
    let sessions = Sessions::new(SessionLimits { max_sessions: 2 });
    let sec = |n: u64| Nanos::new(n * 1_000_000_000);
    let a = sessions.open(Some(sec(10)), Nanos::ZERO).unwrap();
    let b = sessions.open(Some(sec(10)), Nanos::ZERO).unwrap();
    assert_eq!(
        sessions.open(None, Nanos::ZERO).unwrap_err(),
        ServiceError::TooManySessions(2)
    );
    for s in [&a, &b] {
        sessions
            .reserve(&l, s, "app", "pool", "d", Request::exactly(1), Nanos::ZERO)
            .await
            .unwrap();
    }
    // Renewed at 5 s for 20 s: lapses at 25 s; b lapses at 10 s.
    assert_eq!(
        sessions.renew(a.id(), Some(sec(20)), sec(5)).unwrap(),
        sec(25)
    );
    assert_eq!(sessions.reap(&l, sec(10)).await, 1);
    assert_eq!(held(&l).await, 1);
    assert!(sessions.get(b.id()).is_err());
    // Too late to renew a lapsed lease, even before it is reaped.
    assert!(sessions.renew(a.id(), None, sec(25)).is_err());
    assert_eq!(sessions.reap(&l, sec(25)).await, 1);
    assert_eq!(held(&l).await, 0);
    assert!(sessions.is_empty());
}

#[tokio::test]
async fn a_shadow_pool_grants_counts_in_its_groups_and_says_it_would_have_refused() {
    let yaml = "namespaces:\n  - name: app\n    resources:\n      - { name: pool, kind: concurrency, shadow_mode: true, domain_limit: 1, global_limit: 5, groups: [ { name: big, members: [d], limit: 2 } ] }\n";
    let loaded = tollgate_config::load_str("t.yaml", yaml).unwrap();
    let l = Limiter::new(MemoryStore::new(), View::new(&loaded.config, Nanos::ZERO));
    let first = l
        .reserve("app", "pool", "d", Request::exactly(1), Nanos::ZERO)
        .await
        .unwrap();
    assert!(!first.shadowed, "within every limit");
    let second = l
        .reserve("app", "pool", "d", Request::exactly(2), Nanos::ZERO)
        .await
        .unwrap();
    assert!(second.reservation.allowed && second.shadowed && !second.ignored);
    let c = &second.reservation.context;
    assert_eq!((c.domain_limit, c.domain_holds), (1, 3));
    assert_eq!(c.global_limit, Some(5));
    // Counted in the group, so an enforcing config releases them from it.
    assert_eq!(second.reservation.groups, vec!["big".to_owned()]);
    assert_eq!((c.groups[0].limit, c.groups[0].holds), (2, 3));
}
