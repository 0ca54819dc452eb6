//! The service end to end over the memory store: configs written as YAML,
//! requests through [`Limiter`], answers checked against Charon (§2.1,
//! §2.2, §3.1, §4.3) and envoyproxy/ratelimit's descriptor semantics.

// Helpers outside #[test] fns are not covered by clippy.toml's
// allow-unwrap-in-tests; a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_config::load_str;
use tollgate_core::copies::CopyError;
use tollgate_core::copies::{Groups, Reservation, TransferId};
use tollgate_core::{Hits, Mode, Nanos, PlanError};
use tollgate_service::{
    DescriptorOutcome, DescriptorRequest, LimitedBy, Limiter, RateOutcome, RateRequest,
    ReserveOutcome, ServiceError, View,
};
use tollgate_store::{Held, MemoryStore, OpId, PoolKey, Seized, Store, StoreError};

// The copy operations of a session-less caller, by resource name: the
// limiter checks the name, the store moves the copies.

async fn release(
    l: &Limiter<MemoryStore>,
    ns: &str,
    resource: &str,
    domain: &str,
    groups: &Groups,
    copies: u64,
) -> Result<(), ServiceError> {
    let pool: PoolKey = l.copy_pool(ns, resource, "release")?;
    let held = Held {
        pool: &pool,
        domain,
        groups,
        copies,
    };
    Ok(l.store().release(held, OpId::random()).await?)
}

/// A transfer staged at time zero, as the reserves here are made.
async fn transfer(
    l: &Limiter<MemoryStore>,
    ns: &str,
    resource: &str,
    domain: &str,
    groups: &Groups,
    copies: u64,
    ttl: Nanos,
) -> Result<TransferId, ServiceError> {
    let pool: PoolKey = l.copy_pool(ns, resource, "transfer")?;
    let held = Held {
        pool: &pool,
        domain,
        groups,
        copies,
    };
    Ok(l.store()
        .transfer(held, ttl, Nanos::ZERO, OpId::random())
        .await?)
}

async fn seize(
    l: &Limiter<MemoryStore>,
    id: TransferId,
    now: Nanos,
) -> Result<Seized, ServiceError> {
    Ok(l.store().seize(id, now, OpId::random()).await?)
}

fn view(yaml: &str) -> View {
    let loaded = load_str("test.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    View::new(&loaded.config, Nanos::ZERO)
}

fn limiter(yaml: &str) -> Limiter<MemoryStore> {
    Limiter::new(MemoryStore::new(), view(yaml))
}

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

/// A try-mode request in namespace `ns`.
fn rate<'a>(resource: &'a str, domain: &'a str, hits: u64, min_hits: u64) -> RateRequest<'a> {
    RateRequest {
        namespace: "ns",
        resource,
        domain,
        hits,
        min_hits,
        mode: Mode::Try,
        limit: None,
    }
}

async fn ask(
    l: &Limiter<MemoryStore>,
    resource: &str,
    domain: &str,
    hits: u64,
    min_hits: u64,
    at: Nanos,
) -> RateOutcome {
    l.request(&rate(resource, domain, hits, min_hits), at)
        .await
        .unwrap_or_else(|e| panic!("{resource}/{domain}: {e}"))
}

/// One hit, all or nothing.
async fn hit(l: &Limiter<MemoryStore>, resource: &str, domain: &str, at: Nanos) -> RateOutcome {
    ask(l, resource, domain, 1, 1, at).await
}

/// A reserve at time zero under a fresh op id, as every copy test here
/// makes it.
async fn try_reserve(
    l: &Limiter<MemoryStore>,
    ns: &str,
    resource: &str,
    domain: &str,
    hits: Hits,
) -> Result<ReserveOutcome, ServiceError> {
    l.reserve(ns, resource, domain, hits, Nanos::ZERO, OpId::random())
        .await
}

/// [`try_reserve`] that must succeed: what the store granted.
async fn reserve(
    l: &Limiter<MemoryStore>,
    ns: &str,
    resource: &str,
    domain: &str,
    hits: Hits,
) -> Reservation {
    try_reserve(l, ns, resource, domain, hits)
        .await
        .unwrap_or_else(|e| panic!("{ns}/{resource}/{domain}: {e}"))
        .reservation
}

// ---------------------------------------------------------------- request

#[tokio::test]
async fn token_bucket_grants_the_most_hits_in_min_to_max_or_nothing() {
    let l = limiter(
        "namespaces:\n  - name: ns\n    resources:\n      - { name: api, algorithm: token_bucket, capacity: 10, rate: 1/s }\n",
    );
    let o = ask(&l, "api", "acme", 4, 4, Nanos::ZERO).await;
    assert!(o.allowed);
    assert_eq!(o.granted, 4);
    assert_eq!(o.decision.limit, 10);
    assert_eq!(o.decision.remaining, 6);
    assert_eq!(o.limited_by, None);
    assert_eq!(o.algorithm, "token_bucket");

    // Six tokens left: up to 10 asked, at least 2 useful → 6 granted.
    let o = ask(&l, "api", "acme", 10, 2, Nanos::ZERO).await;
    assert!(o.allowed);
    assert_eq!(o.granted, 6);
    assert_eq!(o.decision.remaining, 0);
    assert_eq!(o.limited_by, Some(LimitedBy::Limit));

    // Empty: rejected, with the time until one token is back.
    let o = ask(&l, "api", "acme", 3, 1, Nanos::ZERO).await;
    assert!(!o.allowed);
    assert_eq!(o.granted, 0);
    assert_eq!(o.decision.retry_after, Some(Nanos::SECOND));
    assert_eq!(o.limited_by, Some(LimitedBy::Limit));

    // Two seconds later two tokens are back; asking for at least 3 fails
    // and leaves the bucket untouched (Charon §3.1)...
    let o = ask(&l, "api", "acme", 5, 3, Nanos::from_secs(2)).await;
    assert!(!o.allowed);
    assert_eq!(o.granted, 0);
    // ...so both tokens are still there for the next request.
    let o = ask(&l, "api", "acme", 2, 2, Nanos::from_secs(2)).await;
    assert!(o.allowed);
    assert_eq!(o.granted, 2);

    // min_hits = 0 succeeds with whatever is left, even nothing.
    let o = ask(&l, "api", "acme", 5, 0, Nanos::from_secs(2)).await;
    assert!(o.allowed);
    assert_eq!(o.granted, 0);

    // Another domain has its own bucket.
    assert_eq!(
        ask(&l, "api", "globex", 10, 10, Nanos::ZERO).await.granted,
        10
    );
}

const HARD_GLOBAL: &str = "\
namespaces:
  - name: ns
    resources:
      - name: r
        algorithm: token_bucket
        capacity: 1000
        rate: 1000/s
        hard_limit: 3
        global_limit: 5
";

/// `o` was refused by `by`, with the domain's and all domains' hits of the
/// last second as given.
#[track_caller]
fn assert_refused(o: &RateOutcome, by: LimitedBy, domain: u64, global: u64) {
    assert!(!o.allowed, "{o:?}");
    assert_eq!(o.limited_by, Some(by));
    assert_eq!(o.domain_hits_last_second, Some(domain));
    assert_eq!(o.global_hits_last_second, Some(global));
}

#[tokio::test]
async fn hard_limit_bounds_a_domain_and_global_limit_bounds_all_domains() {
    let l = limiter(HARD_GLOBAL);
    let t = Nanos::ZERO;
    for n in 1..=3 {
        let o = hit(&l, "r", "a", t).await;
        assert!(o.allowed, "hit {n}");
        assert_eq!(o.domain_hits_last_second, Some(n));
        assert_eq!(o.global_hits_last_second, Some(n));
        assert_eq!(o.hard_limit, Some(3));
        assert_eq!(o.global_limit, Some(5));
    }
    let o = hit(&l, "r", "a", t).await;
    assert_refused(&o, LimitedBy::Hard, 3, 3);

    // Domain b has its own hard limit, but only two global hits are left.
    for n in 1..=2 {
        let o = hit(&l, "r", "b", t).await;
        assert!(o.allowed);
        assert_eq!(o.domain_hits_last_second, Some(n));
        assert_eq!(o.global_hits_last_second, Some(3 + n));
    }
    let o = hit(&l, "r", "b", t).await;
    assert_refused(&o, LimitedBy::Global, 2, 5);

    // Every domain is now limited by the global limit, even one that never
    // asked before.
    let o = hit(&l, "r", "c", t).await;
    assert_refused(&o, LimitedBy::Global, 0, 5);
    assert_eq!(o.decision.retry_after.map(|r| r > Nanos::ZERO), Some(true));

    // Once the second has passed, partial grants stop at whichever is
    // tighter: the hard limit (3) for d, then the global limit (5 - 3) for e.
    let later = Nanos::from_secs(2);
    let o = ask(&l, "r", "d", 10, 1, later).await;
    assert_eq!((o.granted, o.limited_by), (3, Some(LimitedBy::Hard)));
    let o = ask(&l, "r", "e", 10, 1, later).await;
    assert_eq!((o.granted, o.limited_by), (2, Some(LimitedBy::Global)));
    assert_eq!(o.global_hits_last_second, Some(5));
    // A request whose min_hits exceeds the hard limit always fails.
    let o = ask(&l, "r", "f", 4, 4, Nanos::from_secs(4)).await;
    assert!(!o.allowed);
    assert_eq!(o.limited_by, Some(LimitedBy::Hard));
    assert_eq!(o.decision.retry_after, None);
}

#[tokio::test]
async fn a_rejected_request_counts_in_neither_the_hard_nor_the_global_limit() {
    // The main algorithm rejects (capacity 1), so the hard and global logs
    // must not see the hit: all or nothing across the plan.
    let l = limiter(
        "namespaces:\n  - name: ns\n    resources:\n      - { name: r, algorithm: token_bucket, capacity: 1, rate: 1/min, hard_limit: 10, global_limit: 10 }\n",
    );
    assert!(hit(&l, "r", "a", Nanos::ZERO).await.allowed);
    for _ in 0..3 {
        let o = hit(&l, "r", "a", Nanos::ZERO).await;
        assert_refused(&o, LimitedBy::Limit, 1, 1);
    }
}

const TIERS: &str = "\
namespaces:
  - name: ns
    resources:
      - name: login
        algorithm: burst_tiers
        tiers:
          - { limit: 2, window: 1s, active: 10s, cooldown: 0s }
          - { limit: 3, window: 1s, active: 10s, cooldown: 60s }
        domains:
          vip: { tiers: [ { limit: 5, window: 1s, active: 10s } ] }
";

#[tokio::test]
async fn burst_tiers_report_tier_context_and_limit_by_tier() {
    let l = limiter(TIERS);
    let t = Nanos::ZERO;
    // The first hit bursts out of the fake tier 0 into tier 1.
    let o = hit(&l, "login", "acme", t).await;
    let tier = o.tier.expect("tier context");
    assert_eq!(
        (tier.index, tier.limit, tier.hits, tier.burst),
        (1, 2, 1, true)
    );
    assert_eq!(o.algorithm, "burst_tiers");
    let tier = hit(&l, "login", "acme", t).await.tier.unwrap();
    assert_eq!((tier.index, tier.hits, tier.burst), (1, 2, false));
    // Tier 1 is full: the third hit bursts into tier 2.
    let o = hit(&l, "login", "acme", t).await;
    let tier = o.tier.unwrap();
    assert_eq!(
        (tier.index, tier.limit, tier.hits, tier.burst),
        (2, 3, 1, true)
    );
    assert!(o.allowed);
    for hits in 2..=3 {
        let tier = hit(&l, "login", "acme", t).await.tier.unwrap();
        assert_eq!((tier.index, tier.hits, tier.burst), (2, hits, false));
    }
    // No tier 3: rejected, limited by the tier.
    let o = hit(&l, "login", "acme", t).await;
    assert!(!o.allowed);
    assert_eq!(o.limited_by, Some(LimitedBy::Tier));
    let tier = o.tier.unwrap();
    assert_eq!((tier.index, tier.limit, tier.hits), (2, 3, 3));

    // A multi-hit request may pass through a whole tier at once.
    let o = ask(&l, "login", "globex", 4, 4, t).await;
    assert!(o.allowed);
    let tier = o.tier.unwrap();
    assert_eq!((tier.index, tier.hits, tier.burst), (2, 2, true));

    // The vip override has one tier of 5.
    let o = ask(&l, "login", "vip", 10, 1, t).await;
    assert_eq!(o.granted, 5);
    assert_eq!(o.limited_by, Some(LimitedBy::Tier));
    assert_eq!(o.tier.unwrap().limit, 5);
}

#[tokio::test]
async fn domain_overrides_take_precedence_over_the_default() {
    let l = limiter(
        "\
namespaces:
  - name: ns
    resources:
      - name: api
        algorithm: token_bucket
        capacity: 1
        rate: 1/min
        hard_limit: 100
        domains:
          vip: { capacity: 3 }
          slow: { hard_limit: 1, capacity: 50 }
          banned: { algorithm: deny }
          free: { algorithm: unlimited }
",
    );
    let t = Nanos::ZERO;
    assert_eq!(ask(&l, "api", "acme", 5, 1, t).await.granted, 1);
    let o = ask(&l, "api", "vip", 5, 1, t).await;
    assert_eq!((o.granted, o.decision.limit), (3, 3));
    // `slow` refines the default: capacity 50 but a hard limit of 1/s.
    let o = ask(&l, "api", "slow", 5, 1, t).await;
    assert_eq!(
        (o.granted, o.limited_by, o.hard_limit),
        (1, Some(LimitedBy::Hard), Some(1))
    );
    let o = hit(&l, "api", "banned", t).await;
    assert!(!o.allowed);
    assert_eq!(o.limited_by, Some(LimitedBy::Deny));
    // An override naming an algorithm replaces the resource's limits,
    // including the inherited hard limit.
    let o = ask(&l, "api", "free", 1000, 1000, t).await;
    assert!(o.allowed);
    assert_eq!(
        (o.granted, o.hard_limit, o.algorithm),
        (1000, None, "unlimited")
    );
}

#[tokio::test]
async fn deny_rejects_everything_and_unlimited_grants_everything() {
    let l = limiter(
        "namespaces:\n  - name: ns\n    resources:\n      - { name: closed, algorithm: deny }\n      - { name: open, algorithm: unlimited }\n",
    );
    let o = ask(&l, "closed", "acme", 1, 1, Nanos::ZERO).await;
    assert!(!o.allowed);
    assert_eq!(o.granted, 0);
    assert_eq!(o.limited_by, Some(LimitedBy::Deny));
    assert_eq!(o.algorithm, "deny");
    assert_eq!(o.decision.remaining, 0);
    // Even a request that accepts nothing learns it is denied.
    assert!(!ask(&l, "closed", "acme", 1, 0, Nanos::ZERO).await.allowed);

    for _ in 0..3 {
        let o = ask(&l, "open", "acme", u64::MAX, u64::MAX, Nanos::ZERO).await;
        assert!(o.allowed);
        assert_eq!(o.granted, u64::MAX);
        assert_eq!(o.limited_by, None);
        assert_eq!(o.algorithm, "unlimited");
        assert_eq!(o.decision.remaining, u64::MAX);
    }
}

#[tokio::test]
async fn shadow_mode_never_rejects_and_says_when_it_would_have() {
    let l = limiter(
        "\
namespaces:
  - name: ns
    resources:
      - { name: api, algorithm: token_bucket, capacity: 2, rate: 1/min, shadow_mode: true }
      - { name: closed, algorithm: deny, shadow_mode: true }
",
    );
    let t = Nanos::ZERO;
    for _ in 0..2 {
        let o = hit(&l, "api", "acme", t).await;
        assert!(o.allowed);
        assert!(!o.shadowed);
    }
    for _ in 0..3 {
        let o = hit(&l, "api", "acme", t).await;
        assert!(o.allowed, "shadow mode never rejects");
        assert_eq!(o.granted, 1);
        assert!(o.shadowed);
        assert_eq!(o.limited_by, Some(LimitedBy::Limit));
        assert!(!o.ignored);
    }
    // A partial grant in shadow mode: everything asked is granted.
    let o = ask(&l, "api", "globex", 5, 1, t).await;
    assert!(o.allowed && o.shadowed);
    assert_eq!(o.granted, 5);

    // A shadowed deny is allowed, and says the deny would have rejected.
    let o = hit(&l, "closed", "acme", t).await;
    assert!(o.allowed);
    assert_eq!(o.granted, 1);
    assert!(o.shadowed);
    assert_eq!(o.limited_by, Some(LimitedBy::Deny));
}

const IGNORING: &str = "\
namespaces:
  - name: ns
    ignore_configured: true
    resources:
      - { name: api, algorithm: token_bucket, capacity: 2, rate: 1/min }
      - { name: closed, algorithm: deny }
      - { name: pool, kind: concurrency, domain_limit: 1 }
";

#[tokio::test]
async fn ignore_configured_never_rejects_but_still_records_use() {
    let l = limiter(IGNORING);
    let t = Nanos::ZERO;
    for n in 1..=4 {
        let o = hit(&l, "api", "acme", t).await;
        assert!(o.allowed, "hit {n}");
        assert_eq!(o.granted, 1);
        assert_eq!(
            o.ignored,
            n > 2,
            "hit {n}: only hits over the limit are flagged"
        );
        assert!(!o.shadowed);
    }
    let o = hit(&l, "closed", "acme", t).await;
    assert!(o.allowed);
    assert!(o.ignored);
    assert_eq!(o.limited_by, Some(LimitedBy::Deny));
    // Copies are not limited either.
    let r = reserve(&l, "ns", "pool", "acme", Hits::exactly(5)).await;
    assert!(r.allowed);
    assert_eq!(r.granted, 5);

    // Turning limiting back on (a reload that changes only the flag): the
    // two hits recorded while ignoring are still there, so the bucket is
    // empty. Another domain, which used nothing, is not limited.
    l.set_view(view(
        &IGNORING.replace("ignore_configured: true", "ignore_configured: false"),
    ));
    let o = hit(&l, "api", "acme", t).await;
    assert!(!o.allowed);
    assert_eq!(o.limited_by, Some(LimitedBy::Limit));
    assert!(!o.ignored);
    assert!(hit(&l, "api", "globex", t).await.allowed);
    // The five copies held are still counted against the domain limit.
    let r = reserve(&l, "ns", "pool", "acme", Hits::exactly(1)).await;
    assert!(!r.allowed);
    assert_eq!(r.context.domain_holds, 5);
    release(&l, "ns", "pool", "acme", &r.groups, 5)
        .await
        .unwrap();
}

/// acme reserves `copies` of `ns/resource` and is granted them all (no limit
/// stands in the way), gives them all back, and then holds nothing to give.
async fn all_granted_then_given_back(
    l: &Limiter<MemoryStore>,
    ns: &str,
    resource: &str,
    copies: u64,
) {
    let r = reserve(l, ns, resource, "acme", Hits::exactly(copies)).await;
    assert!(r.allowed);
    assert_eq!(r.granted, copies);
    assert_eq!(r.context.domain_holds, copies);
    release(l, ns, resource, "acme", &r.groups, copies)
        .await
        .unwrap();
    let err = release(l, ns, resource, "acme", &r.groups, 1)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "not_held");
}

#[tokio::test]
async fn a_shadowed_copy_limited_resource_grants_beyond_its_limits_and_counts() {
    let l = limiter(
        "namespaces:\n  - name: ns\n    resources:\n      - { name: pool, kind: concurrency, domain_limit: 1, shadow_mode: true }\n",
    );
    all_granted_then_given_back(&l, "ns", "pool", 3).await;
}

const OPEN: &str = "\
namespaces:
  - name: open
    allow_unconfigured: true
    resources:
      - { name: api, algorithm: token_bucket, capacity: 1, rate: 1/min }
  - name: ns
    resources:
      - { name: api, algorithm: token_bucket, capacity: 1, rate: 1/min }
";

#[tokio::test]
async fn allow_unconfigured_grants_unknown_resources_of_either_kind() {
    let l = limiter(OPEN);
    let t = Nanos::ZERO;
    let unknown = RateRequest {
        namespace: "open",
        resource: "new-endpoint",
        domain: "acme",
        hits: 1_000_000,
        min_hits: 1_000_000,
        mode: Mode::Try,
        limit: None,
    };
    for _ in 0..3 {
        let o = l.request(&unknown, t).await.unwrap();
        assert!(o.allowed);
        assert!(o.unconfigured);
        assert_eq!(o.granted, 1_000_000);
        assert_eq!(o.limited_by, None);
    }
    // Configured resources of that namespace are still limited.
    let api = RateRequest {
        resource: "api",
        hits: 1,
        min_hits: 1,
        ..unknown.clone()
    };
    assert!(l.request(&api, t).await.unwrap().allowed);
    let o = l.request(&api, t).await.unwrap();
    assert!(!o.allowed);
    assert!(!o.unconfigured);

    // An unknown copy-limited resource: as many copies as asked, held and
    // released like any other.
    all_granted_then_given_back(&l, "open", "new-pool", 1_000).await;
}

/// Both a release and a transfer of acme's `copies` of `ns/resource` are
/// refused for `reason`.
async fn release_and_transfer_refused(
    l: &Limiter<MemoryStore>,
    resource: &str,
    groups: &Groups,
    copies: u64,
    reason: &str,
) {
    let err = release(l, "ns", resource, "acme", groups, copies)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), reason, "release");
    let err = transfer(l, "ns", resource, "acme", groups, copies, Nanos::SECOND)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), reason, "transfer");
}

#[tokio::test]
async fn unknown_resources_namespaces_and_kinds_are_client_errors() {
    let l = limiter(
        "\
namespaces:
  - name: ns
    resources:
      - { name: api, algorithm: token_bucket, capacity: 1, rate: 1/s }
      - { name: pool, kind: concurrency, domain_limit: 1 }
",
    );
    let t = Nanos::ZERO;
    let err = l.request(&rate("nope", "acme", 1, 1), t).await.unwrap_err();
    assert_eq!(
        err,
        ServiceError::UnknownResource {
            namespace: "ns".into(),
            resource: "nope".into()
        }
    );
    assert_eq!(err.reason(), "unknown_resource");
    assert!(err.is_client_error());
    let err = try_reserve(&l, "ns", "nope", "acme", Hits::exactly(1))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "unknown_resource");
    let err = l
        .request(
            &RateRequest {
                namespace: "elsewhere",
                ..rate("api", "acme", 1, 1)
            },
            t,
        )
        .await
        .unwrap_err();
    assert_eq!(err, ServiceError::UnknownNamespace("elsewhere".into()));
    assert_eq!(err.reason(), "unknown_namespace");

    // Wrong kind, both ways (Charon §3.1 client error 3).
    let err = l.request(&rate("pool", "acme", 1, 1), t).await.unwrap_err();
    assert!(
        matches!(
            &err,
            ServiceError::WrongKind {
                actual: "concurrency",
                expected: "rate",
                operation: "request",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.reason(), "wrong_resource_kind");
    assert!(err.is_client_error());
    let err = try_reserve(&l, "ns", "api", "acme", Hits::exactly(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ServiceError::WrongKind {
                actual: "rate",
                expected: "concurrency",
                operation: "reserve",
                ..
            }
        ),
        "{err:?}"
    );
    let groups = Vec::new();
    release_and_transfer_refused(&l, "api", &groups, 1, "wrong_resource_kind").await;

    // Nothing above consumed the token.
    assert!(hit(&l, "api", "acme", t).await.allowed);
}

#[tokio::test]
async fn min_hits_above_hits_is_malformed_and_changes_nothing() {
    let l = limiter(
        "namespaces:\n  - name: ns\n    resources:\n      - { name: api, algorithm: token_bucket, capacity: 2, rate: 1/min }\n      - { name: pool, kind: concurrency, domain_limit: 2 }\n",
    );
    let err = l
        .request(&rate("api", "acme", 1, 2), Nanos::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, ServiceError::Malformed(_)), "{err:?}");
    assert_eq!(err.reason(), "malformed_request");
    assert!(err.is_client_error());
    let err = try_reserve(&l, "ns", "pool", "acme", Hits::between(3, 2))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "malformed_request");
    assert_eq!(ask(&l, "api", "acme", 2, 2, Nanos::ZERO).await.granted, 2);
    let r = reserve(&l, "ns", "pool", "acme", Hits::exactly(2)).await;
    assert_eq!(r.granted, 2);
}

#[tokio::test]
async fn acquire_returns_waits_or_cannot_schedule() {
    let l = limiter(
        "\
namespaces:
  - name: ns
    resources:
      - { name: bucket, algorithm: token_bucket, capacity: 2, rate: 1/s }
      - { name: queue, algorithm: leaky_bucket, rate: 5/s, queue_size: 10 }
      - name: tiers
        algorithm: burst_tiers
        tiers: [ { limit: 1, window: 1s, active: 1s } ]
",
    );
    let acquire = |resource| RateRequest {
        mode: Mode::Acquire,
        ..rate(resource, "acme", 1, 1)
    };
    let t = Nanos::ZERO;
    let mut waits = Vec::new();
    for _ in 0..4 {
        let o = l.request(&acquire("bucket"), t).await.unwrap();
        assert!(o.allowed);
        assert_eq!(o.granted, 1);
        waits.push(o.decision.wait);
    }
    assert_eq!(
        waits,
        [Nanos::ZERO, Nanos::ZERO, Nanos::SECOND, Nanos::from_secs(2)]
    );
    let waits: Vec<Nanos> = {
        let mut w = Vec::new();
        for _ in 0..3 {
            w.push(l.request(&acquire("queue"), t).await.unwrap().decision.wait);
        }
        w
    };
    assert_eq!(waits, [Nanos::ZERO, ms(200), ms(400)]);

    let err = l.request(&acquire("tiers"), t).await.unwrap_err();
    assert!(
        matches!(
            err,
            ServiceError::Store(StoreError::Plan(PlanError::CannotSchedule {
                algorithm: "burst_tiers",
                ..
            }))
        ),
        "{err:?}"
    );
    assert_eq!(err.reason(), "cannot_schedule");
    assert!(err.is_client_error());
    // The refused acquire recorded nothing.
    assert!(hit(&l, "tiers", "acme", t).await.allowed);
}

#[tokio::test]
async fn acquire_waits_for_hard_and_global_limits_too() {
    // A generous bucket behind a hard limit of 2/s: the hard limit sets the
    // pace, and the per-second log records each hit when it will happen.
    let l = limiter(
        "\
namespaces:
  - name: ns
    resources:
      - { name: api, algorithm: token_bucket, capacity: 100, rate: 100/s, hard_limit: 2, global_limit: 3 }
",
    );
    let acquire = |domain| RateRequest {
        mode: Mode::Acquire,
        limit: None,
        ..rate("api", domain, 1, 1)
    };
    let t = Nanos::from_secs(10);
    let mut waits = Vec::new();
    for _ in 0..3 {
        waits.push(l.request(&acquire("acme"), t).await.unwrap().decision.wait);
    }
    let late = Nanos::SECOND.saturating_add(Nanos::NANOSECOND);
    assert_eq!(waits, [Nanos::ZERO, Nanos::ZERO, late]);
    // Another domain: its own hard limit is free, but the global limit (3/s)
    // now holds two hits at t and one at t + 1 s.
    let o = l.request(&acquire("globex"), t).await.unwrap();
    assert_eq!(o.decision.wait, late);
    // More than the hard limit at once can never be scheduled.
    let err = l
        .request(
            &RateRequest {
                mode: Mode::Acquire,
                limit: None,
                ..rate("api", "initech", 3, 3)
            },
            t,
        )
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "exceeds_limit");
}

// ----------------------------------------------------------------- copies

const SANDBOX: &str = "\
namespaces:
  - name: ns
    resources:
      - name: sandbox
        kind: concurrency
        domain_limit: 2
        global_limit: 4
        groups: [ { name: big, members: [acme, globex], limit: 3 } ]
        domains: { initech: { domain_limit: 4 } }
";

#[tokio::test]
async fn reserve_respects_domain_group_and_global_limits() {
    let l = limiter(SANDBOX);
    let r = reserve(&l, "ns", "sandbox", "acme", Hits::exactly(2)).await;
    assert!(r.allowed);
    assert_eq!(r.granted, 2);
    assert_eq!(r.groups, ["big"]);
    assert_eq!(r.context.domain_limit, 2);
    assert_eq!(r.context.global_limit, Some(4));
    assert_eq!((r.context.domain_holds, r.context.global_holds), (2, 2));
    assert_eq!(r.context.groups.len(), 1);
    assert_eq!(
        (r.context.groups[0].limit, r.context.groups[0].holds),
        (3, 2)
    );
    // acme is at its domain limit.
    let r = reserve(&l, "ns", "sandbox", "acme", Hits::exactly(1)).await;
    assert!(!r.allowed);
    assert_eq!(r.granted, 0);
    // globex may hold 2, but group `big` has one copy left: partial grant.
    let r = reserve(&l, "ns", "sandbox", "globex", Hits::between(1, 2)).await;
    assert_eq!((r.granted, r.allowed), (1, true));
    assert_eq!(r.context.groups[0].holds, 3);
    // initech (limit 4, no group) meets the global limit: 4 - 3 = 1 left.
    let r = reserve(&l, "ns", "sandbox", "initech", Hits::exactly(2)).await;
    assert!(!r.allowed);
    assert_eq!(r.context.domain_limit, 4);
    assert!(r.groups.is_empty());
    let r = reserve(&l, "ns", "sandbox", "initech", Hits::between(1, 4)).await;
    assert_eq!(r.granted, 1);
    assert_eq!(r.context.global_holds, 4);
}

/// The holds of `domain` as a zero-copy reserve reports them.
async fn holds(l: &Limiter<MemoryStore>, domain: &str) -> (u64, u64) {
    let r = reserve(l, "ns", "sandbox", domain, Hits::between(0, 0)).await;
    assert_eq!(r.granted, 0);
    (r.context.domain_holds, r.context.global_holds)
}

#[tokio::test]
async fn release_of_what_is_not_held_is_refused_and_changes_nothing() {
    let l = limiter(SANDBOX);
    let r = reserve(&l, "ns", "sandbox", "acme", Hits::exactly(2)).await;
    let big = r.groups.clone();
    assert_eq!(holds(&l, "acme").await, (2, 2));

    // More than held.
    let err = release(&l, "ns", "sandbox", "acme", &big, 3)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "not_held");
    assert!(err.is_client_error());
    assert!(
        matches!(
            &err,
            ServiceError::Store(StoreError::Copy(CopyError::NotHeld {
                held: 2,
                requested: 3,
                ..
            }))
        ),
        "{err:?}"
    );
    // Under other groups than it was reserved with (Charon §3.1).
    let err = release(&l, "ns", "sandbox", "acme", &Vec::new(), 1)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "not_held");
    // By another domain.
    let err = release(&l, "ns", "sandbox", "globex", &big, 1)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "not_held");
    assert_eq!(holds(&l, "acme").await, (2, 2));
    assert_eq!(holds(&l, "globex").await, (0, 2));

    // Zero copies is not a release.
    release_and_transfer_refused(&l, "sandbox", &big, 0, "bad_copies").await;
    assert_eq!(holds(&l, "acme").await, (2, 2));

    // Releases may be split.
    release(&l, "ns", "sandbox", "acme", &big, 1).await.unwrap();
    assert_eq!(holds(&l, "acme").await, (1, 1));
    release(&l, "ns", "sandbox", "acme", &big, 1).await.unwrap();
    assert_eq!(holds(&l, "acme").await, (0, 0));
    let err = release(&l, "ns", "sandbox", "acme", &big, 1)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "not_held");
    assert_eq!(holds(&l, "acme").await, (0, 0));
}

#[tokio::test]
async fn transfer_stages_copies_and_seize_claims_them() {
    let l = limiter(SANDBOX);
    let r = reserve(&l, "ns", "sandbox", "acme", Hits::exactly(2)).await;
    let big = r.groups.clone();
    let id = transfer(&l, "ns", "sandbox", "acme", &big, 1, Nanos::from_secs(10))
        .await
        .unwrap();
    // Staged copies still count, but cannot be released by the giver.
    assert_eq!(holds(&l, "acme").await, (2, 2));
    release(&l, "ns", "sandbox", "acme", &big, 1).await.unwrap();
    let err = release(&l, "ns", "sandbox", "acme", &big, 1)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "not_held");
    assert_eq!(holds(&l, "acme").await, (1, 1));

    let seized = seize(&l, id, Nanos::from_secs(5)).await.unwrap();
    assert_eq!(seized.pool.to_string(), "ns/sandbox");
    assert_eq!(seized.staged.domain, "acme");
    assert_eq!(seized.staged.groups, big);
    assert_eq!(seized.staged.copies, 1);
    // A transfer is claimed once.
    let err = seize(&l, id, Nanos::from_secs(5)).await.unwrap_err();
    assert_eq!(err.reason(), "unknown_transfer");
    // The seized copy is held again and released like a reserved one.
    assert_eq!(holds(&l, "acme").await, (1, 1));
    release(&l, "ns", "sandbox", "acme", &seized.staged.groups, 1)
        .await
        .unwrap();
    assert_eq!(holds(&l, "acme").await, (0, 0));

    // A transfer nobody seizes in time is released implicitly.
    let r = reserve(&l, "ns", "sandbox", "globex", Hits::exactly(2)).await;
    let id = transfer(&l, "ns", "sandbox", "globex", &r.groups, 2, Nanos::SECOND)
        .await
        .unwrap();
    assert_eq!(holds(&l, "globex").await, (2, 2));
    let err = seize(&l, id, Nanos::from_secs(2)).await.unwrap_err();
    assert_eq!(err.reason(), "unknown_transfer");
    assert_eq!(holds(&l, "globex").await, (0, 0));
    // Transferring what is not held is refused.
    let err = transfer(&l, "ns", "sandbox", "globex", &r.groups, 1, Nanos::SECOND)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "not_held");
}

// ------------------------------------------------------------ descriptors

const MESSAGING: &str = include_str!("../../../examples/envoy-messaging.yaml");

fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A descriptor request of `hits` hits on every descriptor of `list`.
async fn try_descriptors(
    l: &Limiter<MemoryStore>,
    namespace: &str,
    list: &[Vec<(String, String)>],
    hits: u64,
    at: Nanos,
) -> Result<DescriptorOutcome, ServiceError> {
    l.request_descriptors(
        &DescriptorRequest {
            namespace,
            descriptors: list,
            hits,
            mode: Mode::Try,
            limits: &[],
            descriptor_hits: &[],
            refunds: &[],
        },
        at,
    )
    .await
}

/// One hit on every descriptor of `list`, which must be answered.
async fn descriptors(
    l: &Limiter<MemoryStore>,
    namespace: &str,
    list: &[Vec<(String, String)>],
    at: Nanos,
) -> DescriptorOutcome {
    try_descriptors(l, namespace, list, 1, at)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn the_messaging_example_limits_marketing_to_five_a_day() {
    let l = limiter(MESSAGING);
    let t = Nanos::from_secs(3_600);
    let number = "4145551234";
    let both = [
        entries(&[("message_type", "marketing"), ("to_number", number)]),
        entries(&[("to_number", number)]),
    ];
    for n in 1..=5 {
        let o = descriptors(&l, "messaging", &both, t).await;
        assert!(o.allowed, "message {n}");
        let marketing = &o.statuses[0];
        assert_eq!(
            marketing.resource.as_deref(),
            Some("message_type_marketing.to_number")
        );
        assert_eq!(
            marketing.domain.as_deref(),
            Some("message_type=marketing/to_number=4145551234")
        );
        let d = marketing.decision.unwrap();
        assert_eq!((d.limit, d.remaining), (5, 5 - n));
        assert_eq!(o.statuses[1].resource.as_deref(), Some("to_number"));
        assert_eq!(o.statuses[1].decision.unwrap().remaining, 100 - n);
    }
    let o = descriptors(&l, "messaging", &both, t).await;
    assert!(!o.allowed);
    assert!(!o.statuses[0].allowed);
    assert!(o.statuses[1].allowed, "the per-number limit has room");
    // The rejected request consumed nothing from the per-number counter.
    let o = descriptors(&l, "messaging", &both[1..], t).await;
    assert!(o.allowed);
    assert_eq!(o.statuses[0].decision.unwrap().remaining, 100 - 6);
    // Another number has its own counters; the marketing counter resets at
    // the next UTC day.
    let other = [entries(&[
        ("message_type", "marketing"),
        ("to_number", "1"),
    ])];
    assert!(descriptors(&l, "messaging", &other, t).await.allowed);
    let tomorrow = Nanos::from_secs(86_400);
    assert!(descriptors(&l, "messaging", &both, tomorrow).await.allowed);
}

const EDGE: &str = "\
domain: edge
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: path
    value: /open
    rate_limit: { unlimited: true }
  - key: ip
    value: 10.0.0.1
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: tenant
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: account
    rate_limit: { name: per_account, unit: minute, requests_per_unit: 1 }
  - key: premium
    value: 'yes'
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces: [ { name: per_account } ]
";

#[tokio::test]
async fn several_descriptors_are_all_or_nothing() {
    let l = limiter(EDGE);
    let t = Nanos::ZERO;
    let req = [entries(&[("user", "u1")]), entries(&[("path", "/x")])];
    for _ in 0..3 {
        assert!(descriptors(&l, "edge", &req, t).await.allowed);
    }
    let o = descriptors(&l, "edge", &req, t).await;
    assert!(!o.allowed);
    assert_eq!(o.statuses.len(), 2);
    assert!(!o.statuses[0].allowed);
    assert!(o.statuses[1].allowed);
    // The path counter saw three hits, not four.
    let o = descriptors(&l, "edge", &req[1..], t).await;
    assert_eq!(o.statuses[0].decision.unwrap().remaining, 10 - 4);

    // A denied descriptor (requests_per_unit: 0) rejects the request and
    // consumes nothing from the others.
    let req = [entries(&[("ip", "10.0.0.1")]), entries(&[("path", "/y")])];
    let o = descriptors(&l, "edge", &req, t).await;
    assert!(!o.allowed);
    assert!(!o.statuses[0].allowed);
    let o = descriptors(&l, "edge", &req[1..], t).await;
    assert_eq!(o.statuses[0].decision.unwrap().remaining, 10 - 1);
    // Another ip has no limit at all.
    let o = descriptors(&l, "edge", &[entries(&[("ip", "10.0.0.2")])], t).await;
    assert!(o.allowed);
    assert_eq!(o.statuses[0].resource, None);

    // hits applies to every descriptor, all or nothing.
    let o = try_descriptors(
        &l,
        "edge",
        &[entries(&[("user", "u2")]), entries(&[("path", "/z")])],
        4,
        t,
    )
    .await
    .unwrap();
    assert!(!o.allowed);
    let o = descriptors(&l, "edge", &[entries(&[("path", "/z")])], t).await;
    assert_eq!(o.statuses[0].decision.unwrap().remaining, 10 - 1);
}

#[tokio::test]
async fn unlimited_unmatched_and_shadow_descriptors() {
    let l = limiter(EDGE);
    let t = Nanos::ZERO;
    for _ in 0..20 {
        let o = descriptors(&l, "edge", &[entries(&[("path", "/open")])], t).await;
        assert!(o.allowed);
        let s = &o.statuses[0];
        assert!(s.unlimited);
        assert!(s.allowed);
        assert_eq!(s.decision, None);
        assert_eq!(s.resource.as_deref(), Some("path_/open"));
    }
    // Unmatched: no key, a deeper request than the config, no entries
    // matching at all. Each is OK with no limit.
    for d in [
        entries(&[("nothing", "here")]),
        entries(&[("user", "u1"), ("extra", "x")]),
    ] {
        let o = descriptors(&l, "edge", &[d], t).await;
        assert!(o.allowed);
        assert_eq!(o.statuses[0].resource, None);
        assert_eq!(o.statuses[0].decision, None);
        assert!(!o.statuses[0].unlimited);
    }
    // Shadow mode: counted, over the limit after one hit, never rejected.
    let tenant = [entries(&[("tenant", "t1")])];
    let o = descriptors(&l, "edge", &tenant, t).await;
    assert!(o.allowed && !o.statuses[0].shadowed);
    for _ in 0..3 {
        let o = descriptors(&l, "edge", &tenant, t).await;
        assert!(o.allowed);
        assert!(o.statuses[0].allowed);
        assert!(o.statuses[0].shadowed);
        assert_eq!(o.statuses[0].decision.unwrap().remaining, 0);
    }
}

#[tokio::test]
async fn replaces_drops_the_named_limit_from_the_request() {
    let l = limiter(EDGE);
    let t = Nanos::ZERO;
    let with_premium = [
        entries(&[("account", "a1")]),
        entries(&[("premium", "yes")]),
    ];
    for _ in 0..5 {
        let o = descriptors(&l, "edge", &with_premium, t).await;
        assert!(o.allowed);
        // The per-account limit was replaced: no resource, no counter.
        assert_eq!(o.statuses[0].resource, None);
        assert_eq!(o.statuses[0].decision, None);
        assert_eq!(o.statuses[1].resource.as_deref(), Some("premium_yes"));
    }
    // Without the premium descriptor the per-account limit applies, and the
    // replaced requests left it untouched.
    let alone = [entries(&[("account", "a1")])];
    let o = descriptors(&l, "edge", &alone, t).await;
    assert!(o.allowed);
    assert_eq!(o.statuses[0].decision.unwrap().remaining, 0);
    assert!(!descriptors(&l, "edge", &alone, t).await.allowed);
}

#[tokio::test]
async fn descriptor_requests_need_a_descriptor_namespace_and_descriptors() {
    let l = limiter(&format!(
        "{EDGE}---\nnamespaces:\n  - name: ns\n    resources:\n      - {{ name: api, algorithm: unlimited }}\n"
    ));
    let list = [entries(&[("user", "u")])];
    let err = try_descriptors(&l, "ns", &list, 1, Nanos::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "no_descriptors");
    let err = try_descriptors(&l, "edge", &[], 1, Nanos::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "malformed_request");
    // envoyproxy/ratelimit answers OK, with no limit, for an unknown domain.
    let out = try_descriptors(&l, "nowhere", &list, 1, Nanos::ZERO)
        .await
        .unwrap();
    assert!(out.allowed);
    assert_eq!(out.statuses.len(), list.len());
    assert!(out
        .statuses
        .iter()
        .all(|s| s.allowed && s.resource.is_none() && s.decision.is_none()));
}

// ----------------------------------------------------------------- reload

const BEFORE: &str = "\
namespaces:
  - name: ns
    resources:
      - { name: same, algorithm: token_bucket, capacity: 2, rate: 1/min, hard_limit: 5 }
      - { name: changed, algorithm: token_bucket, capacity: 2, rate: 1/min }
      - { name: hard, algorithm: unlimited, hard_limit: 2 }
      - { name: pool, kind: concurrency, domain_limit: 2 }
";

const AFTER: &str = "\
namespaces:
  - name: ns
    resources:
      - { name: pool, kind: concurrency, domain_limit: 3 }
      - { name: hard, algorithm: unlimited, hard_limit: 3 }
      - { name: changed, algorithm: token_bucket, capacity: 3, rate: 1/min }
      - { name: same, algorithm: token_bucket, capacity: 2, rate: 1/min, hard_limit: 5 }
";

#[tokio::test]
async fn set_view_keeps_unchanged_limits_and_starts_changed_ones_fresh() {
    let l = limiter(BEFORE);
    let t = Nanos::ZERO;
    for resource in ["same", "changed", "hard"] {
        assert_eq!(ask(&l, resource, "acme", 2, 2, t).await.granted, 2);
        assert!(!hit(&l, resource, "acme", t).await.allowed, "{resource}");
    }
    let r = reserve(&l, "ns", "pool", "acme", Hits::exactly(2)).await;

    l.set_view(view(AFTER));
    // Same parameters (resources reordered): the state carries over.
    let o = hit(&l, "same", "acme", t).await;
    assert!(!o.allowed);
    assert_eq!(o.limited_by, Some(LimitedBy::Limit));
    assert_eq!(o.domain_hits_last_second, Some(2));
    // New parameters: a fresh limit.
    let o = ask(&l, "changed", "acme", 3, 3, t).await;
    assert!(o.allowed);
    assert_eq!(o.decision.limit, 3);
    let o = ask(&l, "hard", "acme", 3, 3, t).await;
    assert!(o.allowed);
    assert_eq!(o.domain_hits_last_second, Some(3));
    // Holds survive a change of limits: the pool is named without them.
    let more = reserve(&l, "ns", "pool", "acme", Hits::exactly(1)).await;
    assert!(more.allowed);
    assert_eq!(more.context.domain_holds, 3);
    release(&l, "ns", "pool", "acme", &r.groups, 2)
        .await
        .unwrap();
}

/// The server runs requests on a multi-threaded runtime: the futures must be
/// `Send` (a config-view guard held across an await would make them not).
#[allow(dead_code)]
fn futures_are_send(l: &Limiter<MemoryStore>) {
    fn send<T: Send>(_: T) {}
    let req = RateRequest {
        namespace: "ns",
        resource: "r",
        domain: "d",
        hits: 1,
        min_hits: 1,
        mode: Mode::Try,
        limit: None,
    };
    send(l.request(&req, Nanos::ZERO));
    let descriptors: Vec<Vec<(String, String)>> = Vec::new();
    send(l.request_descriptors(
        &DescriptorRequest {
            namespace: "ns",
            descriptors: &descriptors,
            hits: 1,
            mode: Mode::Try,
            limits: &[],
            descriptor_hits: &[],
            refunds: &[],
        },
        Nanos::ZERO,
    ));
    send(l.reserve(
        "ns",
        "r",
        "d",
        Hits::exactly(1),
        Nanos::ZERO,
        OpId::random(),
    ));
}

/// Review of issue 23: problems were put in the config's order by a
/// comparator that looked each place up (a scan per comparison), and
/// repeats were dropped only when they sorted next to each other. Now the
/// order is the config's, each resource's own problems before its
/// overrides', and every repeat goes.
#[test]
fn problems_are_put_in_the_configs_order_without_repeats() {
    use tollgate_service::view::in_config_order;
    use tollgate_service::Unservable;
    let config = load_str(
        "t.yaml",
        "namespaces:\n  - name: zeta\n    resources:\n      - { name: b, algorithm: unlimited }\n      - { name: a, algorithm: unlimited }\n  - name: alpha\n    resources:\n      - { name: c, algorithm: unlimited }\n",
    )
    .unwrap()
    .config;
    let problem =
        |namespace: &str, resource: &str, domain: Option<&str>, reason: &str| Unservable {
            namespace: namespace.into(),
            resource: resource.into(),
            domain: domain.map(Into::into),
            limit: None,
            reason: tollgate_store::Refusal::limit(std::io::Error::other(reason.to_owned())),
        };
    let mut problems = vec![
        problem("alpha", "c", None, "one"),
        problem("zeta", "a", Some("acme"), "two"),
        problem("zeta", "a", None, "three"),
        problem("zeta", "a", Some("acme"), "four"),
        problem("zeta", "b", None, "five"),
        problem("alpha", "c", None, "one"),
        problem("zeta", "a", Some("acme"), "two"),
    ];
    in_config_order(&config, &mut problems);
    assert_eq!(
        problems,
        [
            problem("zeta", "b", None, "five"),
            problem("zeta", "a", None, "three"),
            problem("zeta", "a", Some("acme"), "two"),
            problem("zeta", "a", Some("acme"), "four"),
            problem("alpha", "c", None, "one"),
        ]
    );
}

/// A store that keeps no copy pools and refuses every sliding log (a
/// per-domain hard limit is one), each for a typed reason: only its
/// admission matters to the tests that compile configs for it.
struct Picky;

/// [`Picky`]'s own reason for refusing a limit.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("this store keeps no sliding logs")]
struct NoLogs;

impl Store for Picky {
    async fn decide(
        &self,
        _plan: &tollgate_store::Plan,
        _now: Nanos,
        _request: Hits,
        _mode: Mode,
    ) -> Result<tollgate_core::PlanDecision, StoreError> {
        Err(StoreError::Unavailable("a store only for compiling".into()))
    }

    async fn sweep(&self, _now: Nanos) {}

    fn admit(&self, limit: tollgate_store::Admit<'_>) -> Result<(), tollgate_store::Refusal> {
        use tollgate_store::{Admit, Refusal};
        match limit {
            Admit::Copies(_) => Err(Refusal::NoCopies),
            Admit::Rate { limit, .. } if limit.algorithm_name() == "sliding_log" => {
                Err(Refusal::limit(NoLogs))
            }
            Admit::Rate { .. } => Ok(()),
        }
    }
}

/// Issue 20: compiling for a store that refuses limits was a
/// `Result<_, String>` whose copy refusal named a command-line flag
/// (`--store redis://...`) from the service layer. Now the store refuses
/// copy pools itself, through the one admission call, and the error is
/// typed: every problem, in the config's order, with where it is and the
/// store's reason as its source, which names no flag.
#[test]
fn a_config_the_store_cannot_serve_is_refused_with_every_place_and_typed_reason() {
    use std::error::Error as _;
    use tollgate_store::Refusal;
    let config = load_str(
        "t.yaml",
        "namespaces:\n  - name: ns\n    resources:\n      - { name: fine, algorithm: token_bucket, capacity: 2, rate: 1/s }\n      - { name: pool, kind: concurrency, domain_limit: 1 }\n      - { name: api, algorithm: token_bucket, capacity: 2, rate: 1/s, hard_limit: 10 }\n",
    )
    .unwrap()
    .config;
    let unserved = Limiter::new(Picky, View::default())
        .compile(&config, Nanos::ZERO)
        .unwrap_err();
    let places: Vec<(&str, &str)> = unserved
        .problems
        .iter()
        .map(|p| (p.namespace.as_str(), p.resource.as_str()))
        .collect();
    assert_eq!(places, [("ns", "pool"), ("ns", "api")]);
    let [pool, api] = unserved.problems.as_slice() else {
        panic!("{unserved:?}");
    };
    assert_eq!(pool.reason, Refusal::NoCopies);
    let Refusal::Limit(why) = &api.reason else {
        panic!("{api:?}");
    };
    assert_eq!(why.downcast_ref::<NoLogs>(), Some(&NoLogs));
    // The place is the problem's own message, the reason its source.
    assert_eq!(api.to_string(), "namespace `ns`, resource `api`");
    assert_eq!(
        api.source().map(ToString::to_string).as_deref(),
        Some("this store keeps no sliding logs")
    );
    let text = unserved.to_string();
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        [
            format!("namespace `ns`, resource `pool`: {}", Refusal::NoCopies).as_str(),
            "namespace `ns`, resource `api`: this store keeps no sliding logs",
        ]
    );
    assert!(!text.contains("--"), "the service names no flag: {text}");
}
