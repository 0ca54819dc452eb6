//! Several limits on one resource (`limits:`), decided together through
//! [`Limiter`] over the memory store, on a clock the test sets: all or
//! nothing with the partial-grant rule, the binding limit named and
//! reported, each limit's own state, overrides by name, and counters that
//! follow a limit's name rather than its place in the list.

// Helpers outside #[test] fns are not covered by clippy.toml's
// allow-unwrap-in-tests; a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_config::load_str;
use tollgate_config::model::{EnvoyLimit, EnvoyUnit};
use tollgate_core::{Mode, Nanos};
use tollgate_service::limiter::MAX_CACHED_OVERRIDES;
use tollgate_service::{DescriptorRequest, LimitedBy, Limiter, RateOutcome, RateRequest, View};
use tollgate_store::MemoryStore;

fn view(yaml: &str) -> View {
    let loaded = load_str("test.yaml", yaml).unwrap_or_else(|e| panic!("{e}"));
    View::new(&loaded.config, Nanos::ZERO)
}

const DAY: u64 = 86_400;

/// A bucket of 5 refilling 1 a second, and 8 a day (epoch-aligned).
const API: &str = "
namespaces:
  - name: ns
    resources:
      - name: api
        limits:
          - { name: burst, algorithm: token_bucket, capacity: 5, rate: 1/s }
          - { name: daily, algorithm: fixed_window, limit: 8, window: 1d }
        domains:
          acme:
            limits:
              - { name: daily, limit: 100 }
";

async fn ask(
    l: &Limiter<MemoryStore>,
    domain: &str,
    hits: u64,
    min_hits: u64,
    at: Nanos,
) -> RateOutcome {
    let req = RateRequest {
        namespace: "ns",
        resource: "api",
        domain,
        hits,
        min_hits,
        mode: Mode::Try,
        limit: None,
    };
    l.request(&req, at).await.unwrap()
}

/// `(name, remaining)` of each limit in the answer's detail list.
fn remaining(o: &RateOutcome) -> Vec<(String, u64)> {
    o.limits
        .iter()
        .map(|l| (l.name.to_string(), l.decision.remaining))
        .collect()
}

#[tokio::test]
async fn every_limit_is_charged_together_and_the_binding_one_is_named() {
    let l = Limiter::new(MemoryStore::new(), view(API));
    let t0 = Nanos::from_secs(10 * DAY);
    // 4 of 4: both have room.
    let o = ask(&l, "u", 4, 1, t0).await;
    assert_eq!((o.allowed, o.granted), (true, 4));
    assert_eq!(o.limited_by, None);
    assert_eq!(remaining(&o), [("burst".into(), 1), ("daily".into(), 4)]);
    // With nothing limiting, the answer is the limit with the least left.
    assert_eq!((o.decision.limit, o.decision.remaining), (5, 1));
    assert_eq!(o.limit_name.as_deref(), Some("burst"));
    assert_eq!(o.algorithm, "token_bucket");

    // 4 more, at least 1: the bucket has 1, so 1 is granted, and charged
    // to both limits alike.
    let o = ask(&l, "u", 4, 1, t0).await;
    assert_eq!((o.allowed, o.granted), (true, 1));
    assert_eq!(o.limited_by, Some(LimitedBy::Limit));
    assert_eq!(o.limit_name.as_deref(), Some("burst"));
    assert_eq!(remaining(&o), [("burst".into(), 0), ("daily".into(), 3)]);

    // 10 s later the bucket is full again, but the day has 3 left: a
    // request for 4 (all or nothing) is refused by `daily`, and neither
    // limit is charged.
    let t1 = t0.saturating_add(Nanos::from_secs(10));
    let o = ask(&l, "u", 4, 4, t1).await;
    assert_eq!((o.allowed, o.granted), (false, 0));
    assert_eq!(o.limited_by, Some(LimitedBy::Limit));
    assert_eq!(o.limit_name.as_deref(), Some("daily"));
    assert_eq!(o.algorithm, "fixed_window");
    // The answer's limit and reset are the day's own: the window ends at
    // the next midnight (UTC), not when the bucket refills.
    assert_eq!(o.decision.limit, 8);
    assert_eq!(o.decision.reset_after, Nanos::from_secs(DAY - 10));
    assert_eq!(remaining(&o), [("burst".into(), 5), ("daily".into(), 3)]);
    // 3 fit in both: granted, and the bucket shows it was not charged
    // by the refused request.
    let o = ask(&l, "u", 3, 3, t1).await;
    assert!(o.allowed);
    assert_eq!(remaining(&o), [("burst".into(), 2), ("daily".into(), 0)]);
    // Another domain has its own counters.
    let o = ask(&l, "v", 5, 5, t1).await;
    assert!(o.allowed);
    assert_eq!(remaining(&o), [("burst".into(), 0), ("daily".into(), 3)]);
}

#[tokio::test]
async fn an_override_by_name_changes_only_that_limit() {
    let l = Limiter::new(MemoryStore::new(), view(API));
    let mut at = Nanos::from_secs(3 * DAY);
    let mut granted = 0;
    // acme's day allows 100, its bucket still 5 a burst at 1/s: 5 at a
    // time, every 5 s, passes 8 easily.
    for _ in 0..4 {
        let o = ask(&l, "acme", 5, 5, at).await;
        assert!(o.allowed, "{o:?}");
        granted += o.granted;
        at = at.saturating_add(Nanos::from_secs(5));
    }
    assert_eq!(granted, 20);
    let o = ask(&l, "acme", 1, 1, at).await;
    assert_eq!(o.limits[1].decision.limit, 100);
    assert_eq!(o.limits[1].decision.remaining, 79);
}

#[tokio::test]
async fn a_named_limit_keeps_its_counter_when_the_list_is_reordered() {
    let l = Limiter::new(MemoryStore::new(), view(API));
    let at = Nanos::from_secs(DAY);
    assert!(ask(&l, "u", 5, 5, at).await.allowed);
    // The same limits, listed the other way round.
    let swapped = API.replace(
        "          - { name: burst, algorithm: token_bucket, capacity: 5, rate: 1/s }\n          - { name: daily, algorithm: fixed_window, limit: 8, window: 1d }\n",
        "          - { name: daily, algorithm: fixed_window, limit: 8, window: 1d }\n          - { name: burst, algorithm: token_bucket, capacity: 5, rate: 1/s }\n",
    );
    assert_ne!(swapped, API);
    l.set_view(view(&swapped));
    let o = ask(&l, "u", 1, 1, at).await;
    assert!(!o.allowed, "the bucket is still empty: {o:?}");
    assert_eq!(o.limit_name.as_deref(), Some("burst"));
    assert_eq!(remaining(&o), [("daily".into(), 3), ("burst".into(), 0)]);
    // Changing a limit's parameters starts that limit afresh, as for a
    // resource's single algorithm; the other keeps its count.
    let bigger = swapped.replace("capacity: 5", "capacity: 6");
    l.set_view(view(&bigger));
    let o = ask(&l, "u", 1, 1, at).await;
    assert!(o.allowed, "{o:?}");
    assert_eq!(remaining(&o), [("daily".into(), 2), ("burst".into(), 5)]);
}

#[tokio::test]
async fn shadow_mode_lets_the_request_through_and_names_what_would_have_bound() {
    let yaml = API.replace(
        "      - name: api\n",
        "      - name: api\n        shadow_mode: true\n",
    );
    let l = Limiter::new(MemoryStore::new(), view(&yaml));
    let at = Nanos::from_secs(DAY);
    assert!(ask(&l, "u", 5, 5, at).await.allowed);
    let o = ask(&l, "u", 2, 2, at).await;
    assert!(o.allowed && o.shadowed, "{o:?}");
    assert_eq!(o.limited_by, Some(LimitedBy::Limit));
    assert_eq!(o.limit_name.as_deref(), Some("burst"));
    assert!(o.limits.iter().all(|d| d.shadow));
}

#[tokio::test]
async fn hard_and_global_limits_are_listed_after_the_named_ones() {
    let yaml = "
namespaces:
  - name: ns
    resources:
      - name: api
        hard_limit: 2
        global_limit: 50
        limits:
          - { name: minute, algorithm: fixed_window, limit: 10, window: 1m }
";
    let l = Limiter::new(MemoryStore::new(), view(yaml));
    let at = Nanos::from_secs(DAY);
    let o = ask(&l, "u", 3, 1, at).await;
    assert_eq!(o.granted, 2);
    assert_eq!(o.limited_by, Some(LimitedBy::Hard));
    // Bound by the hard limit: no listed limit is named as binding.
    assert_eq!(o.limit_name, None);
    let names: Vec<&str> = o.limits.iter().map(|d| &*d.name).collect();
    assert_eq!(names, ["minute", "hard", "global"]);
}

const LYFT: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit:
      - { name: second, unit: second, requests_per_unit: 2 }
      - { name: hour, unit: hour, requests_per_unit: 3 }
  - key: path
    rate_limit: { unit: hour, requests_per_unit: 100 }
";

#[tokio::test]
async fn a_descriptor_with_a_rate_limit_list_is_within_it_only_when_within_every_limit() {
    let l = Limiter::new(MemoryStore::new(), view(LYFT));
    let d = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
    let list = [d("user", "alice"), d("path", "/")];
    let req = DescriptorRequest {
        namespace: "edge",
        descriptors: &list,
        hits: 1,
        mode: Mode::Try,
        limits: &[],
        descriptor_hits: &[],
        refunds: &[],
    };
    let mut at = Nanos::from_secs(DAY);
    for _ in 0..3 {
        let o = l.request_descriptors(&req, at).await.unwrap();
        assert!(o.allowed, "{o:?}");
        at = at.saturating_add(Nanos::from_secs(1));
    }
    // The fourth within the hour: the second's window has room, the
    // hour's has not; the descriptor names the hour (position 1).
    let o = l.request_descriptors(&req, at).await.unwrap();
    assert!(!o.allowed);
    let user = &o.statuses[0];
    assert!(!user.allowed);
    assert_eq!(user.limit, Some(1));
    assert_eq!(user.decision.unwrap().limit, 3);
    // The path descriptor had room, and all or nothing charged it nothing.
    assert!(o.statuses[1].allowed);
    assert_eq!(o.statuses[1].limit, None);
    assert_eq!(o.statuses[1].decision.unwrap().remaining, 97);
}

/// Item 4: a resource that takes a limit from its requests, up to a rate.
const PLANS: &str = "
namespaces:
  - name: ns
    resources:
      - name: api
        algorithm: fixed_window
        limit: 5
        window: 1h
        hard_limit: 100
        allow_override: true
        override_max: 1000/h
      - { name: fixed, algorithm: fixed_window, limit: 5, window: 1h }
";

fn brought(requests_per_unit: u64, unit: EnvoyUnit) -> Option<EnvoyLimit> {
    Some(EnvoyLimit {
        requests_per_unit,
        unit,
    })
}

async fn ask_with(
    l: &Limiter<MemoryStore>,
    resource: &str,
    domain: &str,
    limit: Option<EnvoyLimit>,
    at: Nanos,
) -> Result<RateOutcome, tollgate_service::ServiceError> {
    let req = RateRequest {
        namespace: "ns",
        resource,
        domain,
        hits: 1,
        min_hits: 1,
        mode: Mode::Try,
        limit,
    };
    l.request(&req, at).await
}

#[tokio::test]
async fn a_request_brings_its_own_limit_within_the_resources_override_max() {
    let l = Limiter::new(MemoryStore::new(), view(PLANS));
    let at = Nanos::from_secs(DAY);
    // 7 an hour for this tenant, in place of the resource's 5.
    let plan = brought(7, EnvoyUnit::Hour);
    for i in 0..7 {
        let o = ask_with(&l, "api", "t", plan, at).await.unwrap();
        assert!(o.allowed, "hit {i}: {o:?}");
        assert_eq!(o.decision.limit, 7);
    }
    let o = ask_with(&l, "api", "t", plan, at).await.unwrap();
    assert!(!o.allowed);
    assert_eq!(o.limited_by, Some(LimitedBy::Limit));
    assert_eq!(o.algorithm, "fixed_window");
    // The resource's own limit kept its own counter: untouched.
    let o = ask_with(&l, "api", "t", None, at).await.unwrap();
    assert_eq!(
        (o.allowed, o.decision.limit, o.decision.remaining),
        (true, 5, 4)
    );
    // Another plan is another counter (a plan change starts afresh).
    let o = ask_with(&l, "api", "t", brought(8, EnvoyUnit::Hour), at)
        .await
        .unwrap();
    assert_eq!((o.allowed, o.decision.remaining), (true, 7));
    // The hard limit still applies beside a brought limit.
    assert_eq!(o.hard_limit, Some(100));
    // A limit of 0 refuses.
    let o = ask_with(&l, "api", "t", brought(0, EnvoyUnit::Hour), at)
        .await
        .unwrap();
    assert!(!o.allowed);
}

#[tokio::test]
async fn a_brought_limit_is_refused_where_the_resource_does_not_take_it() {
    let l = Limiter::new(MemoryStore::new(), view(PLANS));
    let at = Nanos::from_secs(DAY);
    // Faster than 1000/h: 17 a minute is 1020 an hour.
    let err = ask_with(&l, "api", "t", brought(17, EnvoyUnit::Minute), at)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "invalid_limit_override");
    assert!(
        err.to_string().contains(
            "a limit of 17 per minute is faster than resource `api`'s override_max of 1000/1h"
        ),
        "{err}"
    );
    // Exactly the bound is taken.
    assert!(
        ask_with(&l, "api", "t", brought(1000, EnvoyUnit::Hour), at)
            .await
            .unwrap()
            .allowed
    );
    let err = ask_with(&l, "fixed", "t", brought(3, EnvoyUnit::Hour), at)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "invalid_limit_override");
    assert!(
        err.to_string()
            .contains("does not take a limit from requests"),
        "{err}"
    );
}

const EDGE_OVERRIDES: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 100 }
";

#[tokio::test]
async fn an_envoy_descriptor_limit_decides_in_place_of_the_config_matched_or_not() {
    let l = Limiter::new(MemoryStore::new(), view(EDGE_OVERRIDES));
    let d = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
    let at = Nanos::from_secs(DAY);
    let two = [brought(2, EnvoyUnit::Minute)];
    for descriptors in [[d("user", "alice")], [d("tenant", "acme")]] {
        let req = DescriptorRequest {
            namespace: "edge",
            descriptors: &descriptors,
            hits: 1,
            mode: Mode::Try,
            limits: &two,
            descriptor_hits: &[],
            refunds: &[],
        };
        for _ in 0..2 {
            let o = l.request_descriptors(&req, at).await.unwrap();
            assert!(o.allowed, "{o:?}");
            assert_eq!(o.statuses[0].limit_override, two[0]);
            assert_eq!(o.statuses[0].decision.unwrap().limit, 2);
        }
        let o = l.request_descriptors(&req, at).await.unwrap();
        assert!(!o.allowed, "the third within the minute: {o:?}");
    }
    // The config's own limit for alice was never charged.
    let plain = [d("user", "alice")];
    let req = DescriptorRequest {
        namespace: "edge",
        descriptors: &plain,
        hits: 1,
        mode: Mode::Try,
        limits: &[],
        descriptor_hits: &[],
        refunds: &[],
    };
    let o = l.request_descriptors(&req, at).await.unwrap();
    assert_eq!(o.statuses[0].decision.unwrap().remaining, 99);
    // A limit of 0 is over its limit, and nothing is charged.
    let zero = [brought(0, EnvoyUnit::Second)];
    let req = DescriptorRequest {
        namespace: "edge",
        descriptors: &plain,
        hits: 1,
        mode: Mode::Try,
        limits: &zero,
        descriptor_hits: &[],
        refunds: &[],
    };
    let o = l.request_descriptors(&req, at).await.unwrap();
    assert!(!o.allowed && !o.statuses[0].allowed);
}

#[tokio::test]
async fn an_inspection_names_each_limit_of_a_list_and_a_reset_starts_them_all_afresh() {
    let l = Limiter::new(MemoryStore::new(), view(API));
    let at = Nanos::from_secs(DAY);
    assert!(ask(&l, "u", 4, 4, at).await.allowed);
    let tollgate_service::Counters::Rate { limits, deny } =
        l.inspect("ns", "api", "u", at).await.unwrap()
    else {
        panic!("a rate resource")
    };
    assert!(!deny);
    let seen: Vec<(&str, &str, u64)> = limits
        .iter()
        .map(|d| (&*d.name, d.algorithm, d.decision.remaining))
        .collect();
    assert_eq!(
        seen,
        [("burst", "token_bucket", 1), ("daily", "fixed_window", 4)]
    );
    assert_eq!(l.reset("ns", "api", "u", at).await.unwrap(), 2);
    let o = ask(&l, "u", 1, 1, at).await;
    assert_eq!(remaining(&o), [("burst".into(), 4), ("daily".into(), 7)]);
}

/// Two resources whose names join alike with a `/` (`a/b` + `c` and `a`
/// + `b/c`), both taking limits from requests.
const SLASHED: &str = "
namespaces:
  - name: a/b
    resources:
      - { name: c, algorithm: fixed_window, limit: 5, window: 1h, allow_override: true, override_max: 1000/h }
  - name: a
    resources:
      - { name: b/c, algorithm: fixed_window, limit: 5, window: 1h, allow_override: true, override_max: 1000/h }
";

/// Regression: a brought limit's counter was keyed by
/// `format!("{namespace}/{resource}")`, so namespace `a/b`'s resource `c`
/// and namespace `a`'s resource `b/c` shared one counter for the same
/// brought limit and domain: one tenant's traffic used up the other's.
#[tokio::test]
async fn regression_brought_limits_of_resources_whose_names_join_alike_keep_apart() {
    let l = Limiter::new(MemoryStore::new(), view(SLASHED));
    let at = Nanos::from_secs(DAY);
    let ask = |namespace: &'static str, resource: &'static str| RateRequest {
        namespace,
        resource,
        domain: "t",
        hits: 2,
        min_hits: 2,
        mode: Mode::Try,
        limit: brought(2, EnvoyUnit::Hour),
    };
    let o = l.request(&ask("a/b", "c"), at).await.unwrap();
    assert!(o.allowed, "{o:?}");
    let o = l.request(&ask("a", "b/c"), at).await.unwrap();
    assert!(o.allowed, "the other resource's counter is its own: {o:?}");
    assert_eq!(o.decision.remaining, 0);
}

/// Regression: the override cache took a limit for any Envoy domain,
/// known or not, before the domain was looked up, and once full it kept
/// what came first for good: a stranger sending 1024 requests with made-up
/// domains (or 1024 distinct limits) left every later limit built and
/// admitted afresh on each request.
#[tokio::test]
async fn regression_the_override_cache_takes_no_unknown_domain_and_starts_over_when_full() {
    let l = Limiter::new(MemoryStore::new(), view(EDGE_OVERRIDES));
    let at = Nanos::from_secs(DAY);
    let descriptors = [vec![("user".to_owned(), "alice".to_owned())]];
    let two = [brought(2, EnvoyUnit::Minute)];
    for i in 0..8 {
        let namespace = format!("made-up-{i}");
        let o = l
            .request_descriptors(
                &DescriptorRequest {
                    namespace: &namespace,
                    descriptors: &descriptors,
                    hits: 1,
                    mode: Mode::Try,
                    limits: &two,
                    descriptor_hits: &[],
                    refunds: &[],
                },
                at,
            )
            .await
            .unwrap();
        assert!(o.allowed, "an unknown domain is OK, as upstream answers");
    }
    assert_eq!(l.cached_overrides(), 0);
    let req = DescriptorRequest {
        namespace: "edge",
        descriptors: &descriptors,
        hits: 1,
        mode: Mode::Try,
        limits: &two,
        descriptor_hits: &[],
        refunds: &[],
    };
    l.request_descriptors(&req, at).await.unwrap();
    assert_eq!(l.cached_overrides(), 1);
    // Filled with distinct limits, it empties and takes the next.
    let p = Limiter::new(MemoryStore::new(), view(PLANS));
    for n in 1..=MAX_CACHED_OVERRIDES as u64 {
        ask_with(&p, "api", "t", brought(n, EnvoyUnit::Day), at)
            .await
            .unwrap();
    }
    assert_eq!(p.cached_overrides(), MAX_CACHED_OVERRIDES);
    ask_with(&p, "api", "t", brought(5, EnvoyUnit::Hour), at)
        .await
        .unwrap();
    assert_eq!(p.cached_overrides(), 1);
}

/// Regression: a limit brought to a resource the config does not name,
/// in a namespace that allows such resources, was silently dropped and
/// the request granted without any limit; the caller believed it was
/// limited.
#[tokio::test]
async fn regression_a_limit_brought_to_an_unconfigured_resource_is_refused() {
    let yaml = "
namespaces:
  - name: ns
    allow_unconfigured: true
    resources:
      - { name: api, algorithm: fixed_window, limit: 5, window: 1h }
";
    let l = Limiter::new(MemoryStore::new(), view(yaml));
    let at = Nanos::from_secs(DAY);
    let err = ask_with(&l, "nowhere", "t", brought(1, EnvoyUnit::Hour), at)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "invalid_limit_override");
    assert!(err.to_string().contains("is not configured"), "{err}");
    // Without a limit of its own, it is granted as before.
    assert!(
        ask_with(&l, "nowhere", "t", None, at)
            .await
            .unwrap()
            .unconfigured
    );
}

/// Regression: a list refused by its hard limit answered the tightest
/// count beside the *longest* reset of all its limits: `limit: 3,
/// remaining: 1` (the hard limit's) with `reset_after` a whole day (the
/// daily window's), though the hard limit is clear within a second and
/// the docs promise the binding limit's own numbers.
#[tokio::test]
async fn regression_a_list_bound_by_its_hard_limit_reports_the_hard_limits_reset() {
    let yaml = "
namespaces:
  - name: ns
    resources:
      - name: api
        hard_limit: 3
        limits:
          - { name: burst, algorithm: token_bucket, capacity: 5, rate: 1/s }
          - { name: daily, algorithm: fixed_window, limit: 8, window: 1d }
";
    let l = Limiter::new(MemoryStore::new(), view(yaml));
    let at = Nanos::from_secs(3 * DAY);
    let o = ask(&l, "u", 2, 2, at).await;
    assert!(o.allowed);
    let o = ask(&l, "u", 2, 2, at).await;
    assert!(!o.allowed);
    assert_eq!(o.limited_by, Some(LimitedBy::Hard));
    assert_eq!((o.decision.limit, o.decision.remaining), (3, 1));
    assert!(
        o.decision.reset_after <= Nanos::from_secs(2),
        "the hard limit's own reset, not the day's: {:?}",
        o.decision.reset_after
    );
}

/// A request in `mode` for `hits`, with no limit of its own.
async fn usage(
    l: &Limiter<MemoryStore>,
    resource: &str,
    hits: u64,
    mode: Mode,
    at: Nanos,
) -> RateOutcome {
    let req = RateRequest {
        namespace: "ns",
        resource,
        domain: "u",
        hits,
        min_hits: hits,
        mode,
        limit: None,
    };
    l.request(&req, at).await.unwrap()
}

/// Items 1 and 3 together: a report charges every limit of a `limits:`
/// list (each into its own debt), and a refund gives back to every one;
/// `max_debt` bounds each limit of the list, not only a single algorithm.
#[tokio::test]
async fn a_report_charges_every_limit_of_a_limits_list() {
    const LISTED: &str = "
namespaces:
  - name: ns
    resources:
      - name: api
        limits:
          - { name: burst, algorithm: token_bucket, capacity: 5, rate: 1/s }
          - { name: daily, algorithm: fixed_window, limit: 8, window: 1d }
      - name: capped
        max_debt: 2
        limits:
          - { name: burst, algorithm: token_bucket, capacity: 5, rate: 1/s }
          - { name: daily, algorithm: fixed_window, limit: 8, window: 1d }
";
    let l = Limiter::new(MemoryStore::new(), view(LISTED));
    let t0 = Nanos::from_secs(10 * DAY);
    let secs = |s: u64| t0.saturating_add(Nanos::from_secs(s));
    // 7 reported: past the bucket's 5 (it owes 2), within the day's 8.
    let o = usage(&l, "api", 7, Mode::Report, t0).await;
    assert!(o.allowed, "{o:?}");
    assert_eq!(o.granted, 7);
    assert_eq!(remaining(&o), [("burst".into(), 0), ("daily".into(), 1)]);
    // The bucket's debt is paid first: a second later it still owes one.
    let o = usage(&l, "api", 1, Mode::Try, secs(1)).await;
    assert!(!o.allowed);
    assert_eq!(o.limit_name.as_deref(), Some("burst"));
    // Once the bucket refilled, the day's count holds the report too:
    // one more hit fits, the next does not.
    assert!(usage(&l, "api", 1, Mode::Try, secs(10)).await.allowed);
    let o = usage(&l, "api", 1, Mode::Try, secs(20)).await;
    assert!(!o.allowed);
    assert_eq!(o.limit_name.as_deref(), Some("daily"));
    // A refund gives back to the day's window as well.
    assert!(usage(&l, "api", 3, Mode::Refund, secs(20)).await.allowed);
    assert!(usage(&l, "api", 1, Mode::Try, secs(21)).await.allowed);
    // `max_debt: 2` bounds each limit: the bucket takes 5 + 2, the day
    // 8 + 2; the report is charged as far as the tighter allows.
    let o = usage(&l, "capped", 20, Mode::Report, t0).await;
    assert!(o.allowed);
    assert_eq!(o.granted, 7, "{o:?}");
    assert_eq!(o.limit_name.as_deref(), Some("burst"));
}

/// Items 1 and 3 on Envoy's rate-limit service: a `report: true`
/// descriptor whose `rate_limit` is a list is charged on every limit of
/// it, and a check with no hits is refused while any of them is spent.
#[tokio::test]
async fn a_reported_descriptor_with_a_rate_limit_list_charges_every_limit() {
    const GW: &str = "
domain: gw
descriptors:
  - key: user
    report: true
    rate_limit:
      - { name: second, unit: second, requests_per_unit: 5 }
      - { name: hour, unit: hour, requests_per_unit: 8 }
";
    let l = Limiter::new(MemoryStore::new(), view(GW));
    let list = [vec![("user".to_owned(), "alice".to_owned())]];
    let at = |s: u64| Nanos::from_secs(DAY + s);
    let req = |hits: u64| DescriptorRequest {
        namespace: "gw",
        descriptors: &list,
        hits,
        mode: Mode::Try,
        limits: &[],
        descriptor_hits: &[],
        refunds: &[],
    };
    // 7 told after the fact: past the second's 5, never refused.
    let o = l.request_descriptors(&req(7), at(0)).await.unwrap();
    assert!(o.allowed, "{o:?}");
    // The check before the next request: the second is spent.
    let o = l.request_descriptors(&req(0), at(0)).await.unwrap();
    assert!(!o.allowed);
    assert_eq!(o.statuses[0].limit, Some(0));
    // A second later the second's window is new; the hour has 1 left.
    let o = l.request_descriptors(&req(0), at(1)).await.unwrap();
    assert!(o.allowed, "{o:?}");
    assert_eq!(o.statuses[0].limit, Some(1));
    assert_eq!(o.statuses[0].decision.unwrap().remaining, 1);
    // 2 more reported: the hour now owes, and the check says so.
    assert!(l.request_descriptors(&req(2), at(1)).await.unwrap().allowed);
    let o = l.request_descriptors(&req(0), at(2)).await.unwrap();
    assert!(!o.allowed);
    assert_eq!(o.statuses[0].limit, Some(1));
}

/// Items 3 and 4: a limit brought by the request (a fixed window) takes
/// reports as the resource's own fixed window does: charged past its
/// limit, then refusing until its window ends; the resource's own counter
/// is not charged.
#[tokio::test]
async fn a_brought_limit_takes_a_report_like_the_resources_fixed_window() {
    let l = Limiter::new(MemoryStore::new(), view(PLANS));
    let at = Nanos::from_secs(DAY);
    let plan = brought(3, EnvoyUnit::Minute);
    let req = RateRequest {
        namespace: "ns",
        resource: "api",
        domain: "t",
        hits: 5,
        min_hits: 5,
        mode: Mode::Report,
        limit: plan,
    };
    let o = l.request(&req, at).await.unwrap();
    assert!(o.allowed, "{o:?}");
    assert_eq!(
        (o.granted, o.decision.limit, o.decision.remaining),
        (5, 3, 0)
    );
    let o = ask_with(&l, "api", "t", plan, at).await.unwrap();
    assert!(!o.allowed);
    assert_eq!(o.limited_by, Some(LimitedBy::Limit));
    // The next minute's window forgives the debt, as a fixed window does.
    let next = Nanos::from_secs(DAY + 60);
    assert!(ask_with(&l, "api", "t", plan, next).await.unwrap().allowed);
    let o = ask_with(&l, "api", "t", None, at).await.unwrap();
    assert_eq!((o.allowed, o.decision.remaining), (true, 4));
}

/// A plan one limit of a `limits:` list refuses (it cannot schedule, or
/// never admits the hits) is refused naming that limit, with the reason
/// the store gave.
#[tokio::test]
async fn a_list_refusing_a_mode_names_the_limit_that_refuses() {
    let l = Limiter::new(MemoryStore::new(), view(API));
    let t0 = Nanos::from_secs(10 * DAY);
    let req = |hits, mode| RateRequest {
        namespace: "ns",
        resource: "api",
        domain: "u",
        hits,
        min_hits: hits,
        mode,
        limit: None,
    };
    // A fixed window cannot schedule requests.
    let err = l.request(&req(1, Mode::Acquire), t0).await.unwrap_err();
    assert_eq!(err.reason(), "cannot_schedule");
    let text = err.to_string();
    assert!(
        text.contains("resource `api`, limit `daily`") && text.contains("fixed_window"),
        "{text}"
    );
    // A single algorithm's refusal is as before, with no limit named.
    const ONE: &str = "
namespaces:
  - name: ns
    resources:
      - { name: api, algorithm: fixed_window, limit: 8, window: 1d }
";
    let l = Limiter::new(MemoryStore::new(), view(ONE));
    let err = l.request(&req(1, Mode::Acquire), t0).await.unwrap_err();
    assert_eq!(err.reason(), "cannot_schedule");
    assert!(!err.to_string().contains("limit `"), "{err}");
}

/// Issue 18 items 3 and 4, regression (review of the per-descriptor hits
/// change): a `report: true` descriptor asking no hits of its own (the
/// check before a call) beside a descriptor charged its own hits. While
/// the reported counter owes, the request is refused, and the other
/// descriptor's counter must not be charged: all or nothing. It was
/// charged, since the plan let the zero-hit item through and only the
/// descriptor's status then said it was exhausted.
#[tokio::test]
async fn regression_a_zero_hit_check_of_a_reported_descriptor_refuses_without_charging_the_others()
{
    const GW: &str = "
domain: gw
descriptors:
  - key: user
    report: true
    rate_limit: { algorithm: token_bucket, capacity: 10, rate: 10/1d }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 100 }
";
    let l = Limiter::new(MemoryStore::new(), view(GW));
    let user = vec![("user".to_owned(), "alice".to_owned())];
    let path = vec![("path".to_owned(), "/chat".to_owned())];
    let at = Nanos::from_secs(DAY);
    // 15 reported: 5 owed.
    let report = [user.clone()];
    let o = l
        .request_descriptors(
            &DescriptorRequest {
                namespace: "gw",
                descriptors: &report,
                hits: 15,
                mode: Mode::Try,
                limits: &[],
                descriptor_hits: &[],
                refunds: &[],
            },
            at,
        )
        .await
        .unwrap();
    assert!(o.allowed, "{o:?}");
    // The path charged 1, the user checked (0 hits of its own): refused.
    let both = [path.clone(), user.clone()];
    let mixed = DescriptorRequest {
        namespace: "gw",
        descriptors: &both,
        hits: 1,
        mode: Mode::Try,
        limits: &[],
        descriptor_hits: &[Some(1), Some(0)],
        refunds: &[],
    };
    for _ in 0..2 {
        let o = l.request_descriptors(&mixed, at).await.unwrap();
        assert!(!o.allowed, "{o:?}");
        assert!(!o.statuses[1].allowed, "{o:?}");
        assert!(o.statuses[0].allowed, "the path had room: {o:?}");
    }
    // Nothing was charged to the path.
    let only = [path];
    assert_eq!(left(&l, "gw", &only, at).await, 100);
}

/// Regression (review of the per-descriptor hits change): a descriptor
/// refunding to a limit without a sound debt beside a checked one. The
/// refund is refused (`no_usage`), and so is the whole request, before
/// anything is charged: the check used to be charged first, then the
/// refund failed, and the caller got an error for a request that had
/// taken hits.
#[tokio::test]
async fn regression_a_refund_no_limit_can_take_fails_before_the_check_beside_it_is_charged() {
    const GW: &str = "
domain: gw
descriptors:
  - key: slow
    rate_limit: { algorithm: smooth_bursty, rate: 5/s }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 100 }
";
    let l = Limiter::new(MemoryStore::new(), view(GW));
    let slow = vec![("slow".to_owned(), "x".to_owned())];
    let path = vec![("path".to_owned(), "/chat".to_owned())];
    let at = Nanos::from_secs(DAY);
    let both = [path.clone(), slow];
    let mixed = DescriptorRequest {
        namespace: "gw",
        descriptors: &both,
        hits: 1,
        mode: Mode::Try,
        limits: &[],
        descriptor_hits: &[],
        refunds: &[false, true],
    };
    let err = l.request_descriptors(&mixed, at).await.unwrap_err();
    assert_eq!(err.reason(), "no_usage", "{err}");
    let only = [path];
    assert_eq!(left(&l, "gw", &only, at).await, 100);
}

/// What the one descriptor of `only` in `namespace` has left: a check of
/// no hits of its own, which charges nothing.
async fn left(
    l: &Limiter<MemoryStore>,
    namespace: &str,
    only: &[Vec<(String, String)>],
    at: Nanos,
) -> u64 {
    let o = l
        .request_descriptors(
            &DescriptorRequest {
                namespace,
                descriptors: only,
                hits: 1,
                mode: Mode::Try,
                limits: &[],
                descriptor_hits: &[Some(0)],
                refunds: &[],
            },
            at,
        )
        .await
        .unwrap();
    o.statuses[0].decision.unwrap().remaining
}
