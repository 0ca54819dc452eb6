//! Several limits on one resource (`limits:`), in tollgate's format and as
//! a `rate_limit` list in envoyproxy/ratelimit's: reading, overrides by
//! name, errors, and normalized output that reads back the same.

// Helpers outside #[test] fns are not covered by clippy.toml's
// allow-unwrap-in-tests; a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_config::{load_str, AlgorithmSpec, ConfigError, RateResource, ResourceKind};
use tollgate_core::{Nanos, Rate};

fn errors(text: &str) -> Vec<String> {
    match load_str("t.yaml", text) {
        Ok(_) => panic!("expected an error"),
        Err(ConfigError { errors }) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

fn rate(text: &str, resource: &str) -> RateResource {
    let loaded = load_str("t.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    let ns = &loaded.config.namespaces[0];
    match &ns.resource(resource).unwrap().kind {
        ResourceKind::Rate(r) => r.clone(),
        other => panic!("not a rate resource: {other:?}"),
    }
}

/// Wraps resource lines (indented for a resource list) into a document.
fn doc(resources: &str) -> String {
    format!("namespaces:\n  - name: n\n    resources:\n{resources}")
}

const API: &str = "      - name: api
        hard_limit: 50
        limits:
          - { name: burst, algorithm: token_bucket, capacity: 20, rate: 10/s }
          - { name: daily, algorithm: fixed_window, limit: 1000, window: 1d }
        domains:
          acme:
            limits:
              - { name: daily, limit: 5000 }
          globex:
            limits:
              - { name: burst, algorithm: gcra, rate: 5/s, burst: 2 }
          solo:
            algorithm: fixed_window
            limit: 7
            window: 1m
";

#[test]
fn a_resource_lists_several_named_limits() {
    let r = rate(&doc(API), "api");
    let names: Vec<String> = (0..r.default.limits.len())
        .map(|i| r.default.limit_name(i))
        .collect();
    assert_eq!(names, ["burst", "daily"]);
    assert!(r.default.is_list());
    assert_eq!(r.default.algorithm(), None);
    assert_eq!(r.default.hard_limit, Some(50));
    assert_eq!(
        r.default.limits[0].algorithm,
        AlgorithmSpec::TokenBucket {
            capacity: 20,
            rate: Rate::per_second(10).unwrap(),
            initial_tokens: None,
        }
    );
    assert_eq!(
        r.default.limits[1].algorithm.to_string(),
        "fixed_window { limit: 1000, window: 1d, align: epoch }"
    );
}

#[test]
fn an_override_refines_or_replaces_each_limit_by_name_and_inherits_the_rest() {
    let r = rate(&doc(API), "api");
    // acme refines `daily` (window and alignment inherited) and keeps
    // `burst` and the hard limit as the resource has them.
    let acme = r.for_domain("acme");
    assert_eq!(acme.limits.len(), 2);
    assert_eq!(acme.limits[0], r.default.limits[0]);
    assert_eq!(
        acme.limits[1].algorithm.to_string(),
        "fixed_window { limit: 5000, window: 1d, align: epoch }"
    );
    assert_eq!(acme.limit_name(1), "daily");
    assert_eq!(acme.hard_limit, Some(50));
    // globex replaces `burst` with another algorithm.
    let globex = r.for_domain("globex");
    assert_eq!(globex.limits[0].algorithm.name(), "gcra");
    assert_eq!(globex.limit_name(0), "burst");
    assert_eq!(globex.limits[1], r.default.limits[1]);
    // An override with its own `algorithm:` replaces the whole list.
    let solo = r.for_domain("solo");
    assert!(!solo.is_list());
    assert_eq!(solo.algorithm().unwrap().name(), "fixed_window");
}

#[test]
fn unnamed_limits_are_named_by_their_position() {
    let r = rate(
        &doc("      - name: api\n        limits:\n          - { algorithm: gcra, rate: 1/s }\n          - { algorithm: fixed_window, limit: 9, window: 1h }\n"),
        "api",
    );
    assert_eq!(r.default.limit_name(0), "1");
    assert_eq!(r.default.limit_name(1), "2");
    // A list of one is still a list: its limit is named in answers.
    let one = rate(
        &doc("      - name: api\n        limits:\n          - { algorithm: gcra, rate: 1/s }\n"),
        "api",
    );
    assert!(one.default.is_list());
    assert_eq!(one.default.limit_name(0), "1");
}

#[test]
fn malformed_lists_are_refused_naming_the_problem() {
    let cases: &[(&str, &str)] = &[
        (
            "      - name: api\n        algorithm: gcra\n        rate: 1/s\n        limits:\n          - { algorithm: gcra, rate: 1/s }\n",
            "resource `api`: give either `algorithm:` or `limits:`, not both",
        ),
        (
            "      - name: api\n        limits: []\n",
            "resource `api`: `limits:` lists no limit",
        ),
        (
            "      - name: api\n        limits:\n          - { name: a, algorithm: gcra, rate: 1/s }\n          - { name: a, algorithm: gcra, rate: 2/s }\n",
            "resource `api`: two limits are called `a`",
        ),
        (
            "      - name: api\n        limits:\n          - { name: hard, algorithm: gcra, rate: 1/s }\n",
            "limit name \"hard\" is reserved",
        ),
        (
            "      - name: api\n        limits:\n          - { name: 'a b', algorithm: gcra, rate: 1/s }\n",
            "may only use letters, digits",
        ),
        (
            "      - name: api\n        limits:\n          - { name: x, algorithm: deny }\n",
            "resource `api`, limit `x`: `deny` cannot be one limit of a list",
        ),
        (
            "      - name: api\n        limits:\n          - { name: x, algorithm: gcra, rate: 1/s, limit: 3 }\n",
            "unknown field `limit` in resource `api`, limit `x`",
        ),
        (
            "      - name: api\n        limits:\n          - { name: x, algorithm: gcra, rate: 1/s }\n        capacity: 3\n",
            "unknown field `capacity` in resource `api`",
        ),
        (
            "      - name: api\n        limits:\n          - { name: x, algorithm: gcra, rate: 1/s }\n        domains:\n          d:\n            limits:\n              - { name: y, rate: 2/s }\n",
            "resource `api`, domain `d`: the resource has no limit called `y`",
        ),
        (
            "      - name: api\n        limits:\n          - { name: x, algorithm: gcra, rate: 1/s }\n        domains:\n          d:\n            rate: 2/s\n",
            "unknown field `rate` in resource `api`, domain `d`",
        ),
        (
            "      - name: api\n        algorithm: gcra\n        rate: 1/s\n        domains:\n          d:\n            limits:\n              - { name: x, rate: 2/s }\n",
            "resource `api`, domain `d`: the resource has one algorithm, not a `limits:` list",
        ),
        (
            "      - name: api\n        limits:\n          - { name: x, algorithm: gcra, rate: 1/s }\n        domains:\n          d:\n            limits:\n              - { name: x, rate: 2/s }\n              - { name: x, rate: 3/s }\n",
            "limit `x` is overridden twice",
        ),
    ];
    for (resources, expected) in cases {
        let errs = errors(&doc(resources));
        assert!(
            errs.iter().any(|e| e.contains(expected)),
            "expected {expected:?} in {errs:?}"
        );
    }
    // More limits than a resource may list.
    let mut many = String::from("      - name: api\n        limits:\n");
    for i in 0..=tollgate_config::MAX_LIMITS_PER_RESOURCE {
        many.push_str(&format!(
            "          - {{ name: l{i}, algorithm: gcra, rate: 1/s }}\n"
        ));
    }
    let errs = errors(&doc(&many));
    assert!(
        errs.iter().any(|e| e.contains("a resource has at most 16")),
        "{errs:?}"
    );
}

#[test]
fn normalized_lists_read_back_identically() {
    let first = load_str("a.yaml", &doc(API)).unwrap().config;
    let yaml = tollgate_config::emit::to_yaml(&first);
    let second = load_str("b.yaml", &yaml)
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
        .config;
    assert_eq!(
        first.namespaces[0].resources[0].kind, second.namespaces[0].resources[0].kind,
        "{yaml}"
    );
}

const LYFT: &str = "\
domain: edge
descriptors:
  - key: user
    rate_limit:
      - { name: second, unit: second, requests_per_unit: 10 }
      - { name: day, unit: day, requests_per_unit: 1000 }
      - { algorithm: token_bucket, capacity: 5, rate: 1/s }
";

#[test]
fn a_lyft_rate_limit_may_be_a_list() {
    let loaded = load_str("t.yaml", LYFT).unwrap_or_else(|e| panic!("{e}"));
    let ns = &loaded.config.namespaces[0];
    let ResourceKind::Rate(r) = &ns.resources[0].kind else {
        panic!()
    };
    let names: Vec<String> = (0..r.default.limits.len())
        .map(|i| r.default.limit_name(i))
        .collect();
    assert_eq!(names, ["second", "day", "3"]);
    assert_eq!(
        r.default.limits[1].algorithm,
        AlgorithmSpec::FixedWindow {
            limit: 1000,
            window: Nanos::from_secs(86_400),
            align: tollgate_core::Align::Epoch,
        }
    );
    // Its normalized form is a list again, and reads back the same.
    let yaml = tollgate_config::emit::to_yaml(&loaded.config);
    assert!(
        yaml.contains("rate_limit: [{ name: second, unit: second, requests_per_unit: 10 }"),
        "{yaml}"
    );
    let again = load_str("b.yaml", &yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    assert_eq!(
        again.config.namespaces[0].resources[0].kind,
        ns.resources[0].kind
    );
}

#[test]
fn a_lyft_list_refuses_what_belongs_to_a_whole_descriptor() {
    for (entry, expected) in [
        (
            "{ unlimited: true }",
            "`unlimited` applies to a whole descriptor",
        ),
        (
            "{ name: a, unit: second, requests_per_unit: 1, replaces: [{ name: b }] }",
            "`replaces` applies to a whole descriptor",
        ),
        (
            "{ unit: second, requests_per_unit: 0 }",
            "a limit of 0 requests cannot be one limit of a list",
        ),
        (
            "{ unit: fortnight, requests_per_unit: 3 }",
            "invalid rate limit unit 'fortnight'",
        ),
    ] {
        let text =
            format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      - {entry}\n");
        let errs = errors(&text);
        assert!(
            errs.iter().any(|e| e.contains(expected)),
            "expected {expected:?} in {errs:?}"
        );
    }
}

#[test]
fn allow_override_needs_a_bound_and_reads_back() {
    let text = doc("      - name: api\n        algorithm: fixed_window\n        limit: 5\n        window: 1h\n        allow_override: true\n        override_max: 1000/h\n");
    let r = rate(&text, "api");
    assert_eq!(r.override_max.unwrap().to_string(), "1000/1h");
    let loaded = load_str("a.yaml", &text).unwrap();
    let yaml = tollgate_config::emit::to_yaml(&loaded.config);
    assert!(
        yaml.contains("allow_override: true\n        override_max: 1000/1h\n"),
        "{yaml}"
    );
    let again = load_str("b.yaml", &yaml).unwrap();
    assert_eq!(
        again.config.namespaces[0].resources[0].kind,
        loaded.config.namespaces[0].resources[0].kind
    );
    for (extra, expected) in [
        (
            "        allow_override: true\n",
            "`allow_override: true` needs `override_max`",
        ),
        (
            "        override_max: 10/s\n",
            "`override_max` is given but `allow_override` is not true",
        ),
        (
            "        allow_override: true\n        override_max: fast\n",
            "resource `api`: override_max",
        ),
        (
            "        domains:\n          d: { allow_override: true }\n",
            "`allow_override` applies to the whole resource",
        ),
    ] {
        let text = doc(&format!(
            "      - name: api\n        algorithm: gcra\n        rate: 1/s\n{extra}"
        ));
        let errs = errors(&text);
        assert!(
            errs.iter().any(|e| e.contains(expected)),
            "expected {expected:?} in {errs:?}"
        );
    }
}
