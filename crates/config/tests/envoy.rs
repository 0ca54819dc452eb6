//! envoyproxy/ratelimit files load unchanged, with that project's
//! semantics.

// Helpers outside #[test] fns are not covered by clippy.toml's
// allow-unwrap-in-tests; a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_config::{load_str, AlgorithmSpec, Namespace, ResourceKind};
use tollgate_core::{Align, Nanos};

const MESSAGING: &str = include_str!("../../../examples/envoy-messaging.yaml");

fn load(text: &str) -> Namespace {
    let loaded = load_str("envoy.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    loaded.config.namespaces.into_iter().next().unwrap()
}

fn algo(ns: &Namespace, name: &str) -> AlgorithmSpec {
    let r = ns
        .resource(name)
        .unwrap_or_else(|| panic!("no resource {name}"));
    let ResourceKind::Rate(rate) = &r.kind else {
        panic!()
    };
    rate.default.algorithm().unwrap().clone()
}

fn find(ns: &Namespace, entries: &[(&str, &str)]) -> Option<(String, String)> {
    let m = ns.descriptors.as_ref().unwrap().find(entries)?;
    Some((ns.resources[m.resource].name.clone(), m.domain))
}

#[test]
fn the_lyft_example_from_charon() {
    let ns = load(MESSAGING);
    assert_eq!(ns.name, "messaging");
    assert_eq!(
        algo(&ns, "to_number"),
        AlgorithmSpec::FixedWindow {
            limit: 100,
            window: Nanos::from_secs(86_400),
            align: Align::Epoch
        }
    );
    assert_eq!(
        find(&ns, &[("to_number", "4145551234")]),
        Some(("to_number".into(), "to_number=4145551234".into()))
    );
    // Each value has its own counter: the domains differ.
    assert_ne!(
        find(&ns, &[("to_number", "1")]),
        find(&ns, &[("to_number", "2")])
    );
    assert_eq!(
        find(
            &ns,
            &[("message_type", "marketing"), ("to_number", "4145551234")]
        ),
        Some((
            "message_type_marketing.to_number".into(),
            "message_type=marketing/to_number=4145551234".into()
        ))
    );
    match algo(&ns, "message_type_marketing.to_number") {
        AlgorithmSpec::FixedWindow { limit, .. } => assert_eq!(limit, 5),
        other => panic!("{other:?}"),
    }
}

#[test]
fn matching_depth_rules() {
    let ns = load(MESSAGING);
    // A request deeper than the config gets no limit.
    assert_eq!(find(&ns, &[("to_number", "1"), ("extra", "x")]), None);
    // A request that stops at a node without a limit gets none.
    assert_eq!(find(&ns, &[("message_type", "marketing")]), None);
    // An unmatched value with no key-only sibling gets none.
    assert_eq!(
        find(
            &ns,
            &[("message_type", "transactional"), ("to_number", "1")]
        ),
        None
    );
    assert_eq!(find(&ns, &[]), None);
}

#[test]
fn exact_then_wildcard_then_key_only_without_backtracking() {
    let ns = load(
        "domain: d\ndescriptors:\n  - key: path\n    value: /admin\n    rate_limit: { unit: second, requests_per_unit: 1 }\n  - key: path\n    value: /api*\n    rate_limit: { unit: second, requests_per_unit: 2 }\n  - key: path\n    value: /ap*\n    rate_limit: { unit: second, requests_per_unit: 3 }\n  - key: path\n    rate_limit: { unit: second, requests_per_unit: 4 }\n",
    );
    let limit_of = |v: &str| {
        let (name, _) = find(&ns, &[("path", v)]).unwrap();
        match algo(&ns, &name) {
            AlgorithmSpec::FixedWindow { limit, .. } => limit,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(limit_of("/admin"), 1);
    assert_eq!(
        limit_of("/api/v1"),
        2,
        "first wildcard in config order wins"
    );
    assert_eq!(limit_of("/apx"), 3);
    assert_eq!(limit_of("/other"), 4);
}

#[test]
fn share_threshold_shares_one_counter() {
    let ns = load("domain: d\ndescriptors:\n  - key: file\n    value: files/*\n    share_threshold: true\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n");
    let a = find(&ns, &[("file", "files/a.pdf")]).unwrap();
    let b = find(&ns, &[("file", "files/b.csv")]).unwrap();
    assert_eq!(a, b);
}

#[test]
fn units_unlimited_and_zero() {
    let ns = load("domain: d\ndescriptors:\n  - { key: w, rate_limit: { unit: WEEK, requests_per_unit: 1 } }\n  - { key: m, rate_limit: { unit: month, requests_per_unit: 1 } }\n  - { key: y, rate_limit: { unit: year, requests_per_unit: 1 } }\n  - { key: u, rate_limit: { unlimited: true } }\n  - { key: z, rate_limit: { unit: second, requests_per_unit: 0 } }\n");
    let window = |n: &str| match algo(&ns, n) {
        AlgorithmSpec::FixedWindow { window, .. } => window,
        other => panic!("{other:?}"),
    };
    assert_eq!(window("w"), Nanos::from_secs(7 * 86_400));
    assert_eq!(window("m"), Nanos::from_secs(30 * 86_400));
    assert_eq!(window("y"), Nanos::from_secs(365 * 86_400));
    assert_eq!(algo(&ns, "u"), AlgorithmSpec::Unlimited);
    assert_eq!(algo(&ns, "z"), AlgorithmSpec::Deny);
}

#[test]
fn shadow_mode_replaces_and_names() {
    let ns = load("domain: d\ndescriptors:\n  - key: a\n    shadow_mode: true\n    detailed_metric: true\n    rate_limit: { unit: second, requests_per_unit: 1, name: first }\n  - key: b\n    rate_limit: { unit: second, requests_per_unit: 9, replaces: [ { name: first } ] }\n");
    let a = ns.resource("a").unwrap();
    assert!(a.shadow);
    let meta = a.envoy.as_ref().unwrap();
    assert_eq!(meta.name.as_deref(), Some("first"));
    assert!(meta.detailed_metric);
    assert_eq!(
        ns.resource("b").unwrap().envoy.as_ref().unwrap().replaces,
        vec!["first".to_string()]
    );
}

#[test]
fn extension_names_any_algorithm() {
    let ns = load("domain: d\ndescriptors:\n  - key: user\n    rate_limit: { algorithm: token_bucket, capacity: 10, rate: 1/s, name: tb }\n");
    assert_eq!(
        algo(&ns, "user").to_string(),
        "token_bucket { capacity: 10, rate: 1/1s }"
    );
}

#[test]
fn loader_errors_match_upstream() {
    let err = |text: &str| load_str("e.yaml", text).unwrap_err().to_string();
    assert!(err("domain: \"\"\n").contains("config file cannot have empty domain"));
    assert!(
        err("domain: d\ndescriptors:\n  - { value: x }\n").contains("missing required field `key`")
    );
    assert!(err("domain: d\ndescriptors:\n  - { key: a, rate_limit: { unit: fortnight, requests_per_unit: 1 } }\n")
        .contains("invalid rate limit unit 'fortnight'"));
    assert!(err(
        "domain: d\ndescriptors:\n  - { key: a, rate_limit: { unit: second, unlimited: true } }\n"
    )
    .contains("should not specify rate limit unit when unlimited"));
    assert!(
        err("domain: d\ndescriptors:\n  - { key: a }\n  - { key: a }\n")
            .contains("duplicate descriptor composite key `a`")
    );
    assert!(err("domain: d\ndescriptors:\n  - { key: a, rate_limit: { unit: second, requests_per_unit: 1, name: x, replaces: [ { name: x } ] } }\n")
        .contains("replaces should not contain name of same descriptor"));
    assert!(
        err("domain: d\ndescriptors:\n  - { key: a, rate_limt: { unit: second } }\n")
            .contains("unknown key `rate_limt` in descriptor `a`, did you mean `rate_limit`?")
    );
    assert!(
        err("domain: d\ndescriptors:\n  - { key: a, value: x, share_threshold: true }\n")
            .contains("share_threshold can only be used with wildcard values")
    );
}

#[test]
fn known_keys_at_the_wrong_level_are_ignored_with_a_warning() {
    let loaded = load_str("w.yaml", "domain: d\ndescriptors:\n  - key: a\n    unit: second\n    rate_limit: { unit: second, requests_per_unit: 3, shadow_mode: true }\n").unwrap();
    assert_eq!(loaded.warnings.len(), 2, "{:?}", loaded.warnings);
    assert!(loaded.warnings[0]
        .to_string()
        .contains("`unit` has no meaning in descriptor `a`"));
    assert!(
        !loaded.config.namespaces[0].resources[0].shadow,
        "shadow_mode inside rate_limit is ignored upstream"
    );
}

#[test]
fn a_directory_of_files_loads_like_upstream() {
    let dir = std::env::temp_dir().join(format!("tollgate-envoy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.yaml"), MESSAGING).unwrap();
    std::fs::write(dir.join("b.yml"), "namespaces:\n  - name: native\n").unwrap();
    std::fs::write(dir.join(".hidden.yaml"), "garbage: [").unwrap();
    std::fs::write(dir.join("notes.txt"), "not yaml").unwrap();
    let loaded = tollgate_config::load_path(&dir).unwrap();
    let names: Vec<_> = loaded
        .config
        .namespaces
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(names, vec!["messaging", "native"]);
    std::fs::write(dir.join("c.yaml"), MESSAGING).unwrap();
    let e = tollgate_config::load_path(&dir).unwrap_err().to_string();
    assert!(e.contains("namespace `messaging` is defined twice"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn normalized_output_keeps_the_envoy_format() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - key: user\n        shadow_mode: true\n        detailed_metric: true\n        rate_limit: { unit: minute, requests_per_unit: 7, name: per_user }\n  - key: path\n    value: /api*\n    share_threshold: true\n    rate_limit: { algorithm: gcra, rate: 5/s, burst: 2, replaces: [ { name: per_user } ] }\n  - key: free\n    rate_limit: { unlimited: true }\n";
    let first = load_str("a.yaml", text).unwrap().config;
    let yaml = tollgate_config::emit::to_yaml(&first);
    let second = load_str("b.yaml", &yaml)
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
        .config;
    let (a, b) = (&first.namespaces[0], &second.namespaces[0]);
    assert_eq!(a.descriptors, b.descriptors, "{yaml}");
    for (ra, rb) in a.resources.iter().zip(&b.resources) {
        assert_eq!(
            (&ra.name, &ra.kind, ra.shadow, &ra.envoy),
            (&rb.name, &rb.kind, rb.shadow, &rb.envoy)
        );
    }
    // A mixed config comes out as one native document and one envoy one.
    let mixed = format!("{text}---\nnamespaces:\n  - name: native\n");
    let yaml = tollgate_config::emit::to_yaml(&load_str("m.yaml", &mixed).unwrap().config);
    assert!(
        yaml.starts_with("namespaces:\n") && yaml.contains("---\ndomain: d\n"),
        "{yaml}"
    );
    assert_eq!(
        load_str("m2.yaml", &yaml).unwrap().config.namespaces.len(),
        2
    );
}

#[test]
fn ambiguous_paths_are_warned_about() {
    let loaded = load_str(
        "a.yaml",
        "domain: d\ndescriptors:\n  - key: x.y\n    rate_limit: { unit: second, requests_per_unit: 1 }\n  - key: x\n    descriptors:\n      - key: y\n        rate_limit: { unit: second, requests_per_unit: 2 }\n",
    )
    .unwrap();
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(loaded.warnings[0].message.contains("`x.y`"));
    let ns = &loaded.config.namespaces[0];
    let tree = ns.descriptors.as_ref().unwrap();
    assert_ne!(
        tree.find(&[("x.y", "1")]).unwrap().resource,
        tree.find(&[("x", "1"), ("y", "2")]).unwrap().resource
    );
}

/// Issue 18 item 3: a descriptor marked `report: true` (tollgate's
/// extension of the format) is charged in report mode; it loads with its
/// `max_debt`, round-trips, and needs a `rate_limit` beside it.
#[test]
fn a_report_descriptor_loads_and_round_trips() {
    let text = "domain: llm\ndescriptors:\n  - key: tokens\n    report: true\n    max_debt: 500\n    rate_limit: { unit: minute, requests_per_unit: 1000 }\n";
    let ns = load(text);
    let r = ns.resource("tokens").unwrap();
    assert!(r.usage.report);
    assert_eq!(r.usage.max_debt, Some(500));
    let config = load_str("envoy.yaml", text).unwrap().config;
    let yaml = tollgate_config::emit::to_yaml(&config);
    assert!(yaml.contains("report: true"), "{yaml}");
    assert_eq!(load_str("envoy.yaml", &yaml).unwrap().config, config);
    let err = load_str(
        "envoy.yaml",
        "domain: llm\ndescriptors:\n  - key: tokens\n    report: true\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("`report` needs a `rate_limit`"), "{err}");
    let err = load_str(
        "envoy.yaml",
        "domain: llm\ndescriptors:\n  - key: tokens\n    report: true\n    rate_limit: { unit: minute, requests_per_unit: 0 }\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("`deny` cannot"), "{err}");
}
