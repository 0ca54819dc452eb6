//! The native format: loading, errors with positions, normalization.

// Helpers outside #[test] fns are not covered by clippy.toml's
// allow-unwrap-in-tests; a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_config::{load_str, AlgorithmSpec, ConfigError, ResourceKind};
use tollgate_core::{Nanos, Tier};

fn errors(text: &str) -> Vec<String> {
    match load_str("t.yaml", text) {
        Ok(_) => panic!("expected an error"),
        Err(ConfigError { errors }) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

fn one_error(text: &str) -> String {
    let e = errors(text);
    assert_eq!(e.len(), 1, "{e:?}");
    e.into_iter().next().unwrap()
}

#[test]
fn the_bundled_example_loads() {
    let text = include_str!("../../../examples/tollgate.yaml");
    let loaded = load_str("tollgate.yaml", text).unwrap();
    let ns = loaded.config.namespace("default").unwrap();
    assert_eq!(ns.resources.len(), 12);
    let login = ns.resource("login").unwrap();
    let ResourceKind::Rate(rate) = &login.kind else {
        panic!()
    };
    assert_eq!(rate.global_limit, Some(1000));
    assert_eq!(rate.default.hard_limit, Some(20));
    // The override replaces the tiers and inherits the hard limit.
    let acme = rate.for_domain("acme");
    assert_eq!(acme.hard_limit, Some(20));
    let AlgorithmSpec::BurstTiers { tiers } = acme.algorithm().unwrap() else {
        panic!()
    };
    assert_eq!(tiers.len(), 1);
    assert_eq!(tiers[0].limit, 100);
    let sandbox = ns.resource("sandbox").unwrap();
    let ResourceKind::Concurrency(c) = &sandbox.kind else {
        panic!()
    };
    assert_eq!(c.domain_limit_for("acme"), 10);
    assert_eq!(c.domain_limit_for("other"), 3);
    assert_eq!(c.groups_of("globex"), vec!["big".to_string()]);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}

#[test]
fn unknown_field_has_position_and_suggestion() {
    let e = one_error(
        "namespaces:\n  - name: n\n    resources:\n      - name: api\n        algorithm: token_bucket\n        capcity: 10\n        rate: 1/s\n",
    );
    assert_eq!(
        e,
        "t.yaml:6:9: unknown field `capcity` in resource `api`, did you mean `capacity`?"
    );
}

#[test]
fn unknown_algorithm_suggests() {
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: token_buckit, capacity: 1, rate: 1/s }\n");
    assert!(
        e.contains("unknown algorithm `token_buckit`, did you mean `token_bucket`?"),
        "{e}"
    );
    assert!(e.starts_with("t.yaml:4:"), "{e}");
}

#[test]
fn bad_rate_and_negative_limit_are_named() {
    let e = errors(
        "namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: gcra, rate: 10/fortnight }\n      - { name: b, algorithm: fixed_window, limit: -5, window: 1s }\n",
    );
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("t.yaml:4:") && e[0].contains("rate `10/fortnight`"),
        "{}",
        e[0]
    );
    assert!(
        e[1].starts_with("t.yaml:5:") && e[1].contains("`limit` must not be negative, found -5"),
        "{}",
        e[1]
    );
}

/// Issue 23: `rate: 10` said "`rate` must be a string, found a number",
/// and `window: "1h 30m"` "unknown unit `h `": neither said what to write.
#[test]
fn a_number_for_a_rate_and_a_spaced_duration_say_what_to_write() {
    let e = errors(
        "namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: gcra, rate: 10 }\n      - { name: b, algorithm: fixed_window, limit: 5, window: \"1h 30m\" }\n",
    );
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("t.yaml:4:")
            && e[0].contains("`10` is not a rate (expected e.g. 10/s, 100/min, 5000/300s)"),
        "{}",
        e[0]
    );
    assert!(
        e[1].starts_with("t.yaml:5:")
            && e[1].contains(
                "`1h 30m` has a space in it: write a duration without spaces, e.g. `1h30m`"
            ),
        "{}",
        e[1]
    );
}

/// Issue 23: a missing file was reported at `limits.yaml:0:0`; a file that
/// cannot be read has no line to point at, and the message says what to
/// check.
#[test]
fn a_missing_file_is_named_without_a_position() {
    let dir = std::env::temp_dir().join(format!("tollgate-missing-{}", std::process::id()));
    let path = dir.join("limits.yaml");
    let e = tollgate_config::load_path(&path).unwrap_err();
    let shown = e.plain();
    assert_eq!(
        shown,
        format!(
            "{}: cannot read: No such file or directory (os error 2) (check the path; `--config` takes a YAML file or a directory of them)",
            path.display()
        )
    );
    assert_eq!(e.to_string(), format!("error: {shown}"));
}

#[test]
fn duplicate_names_point_at_the_first() {
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: unlimited }\n      - { name: a, algorithm: deny }\n");
    assert!(
        e.contains("resource `a` is defined twice in namespace `n` (first at t.yaml:4:9)"),
        "{e}"
    );
    let e = one_error("namespaces:\n  - { name: n }\n  - { name: n }\n");
    assert!(e.contains("namespace `n` is defined twice"), "{e}");
}

#[test]
fn missing_fields_and_zero_params_are_errors() {
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: token_bucket, rate: 1/s }\n");
    assert!(e.contains("missing required field `capacity`"), "{e}");
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: token_bucket, capacity: 0, rate: 1/s }\n");
    assert!(e.contains("`capacity` must be greater than zero"), "{e}");
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: smooth_warming_up, rate: 1/s, warmup: 0s }\n");
    assert!(e.contains("warmup"), "{e}");
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: fixed_window, limit: 1, window: 10 }\n");
    assert!(e.contains("`window` needs a unit: write `10s`"), "{e}");
}

#[test]
fn burst_tiers_are_normalized_with_warnings() {
    let loaded = load_str(
        "t.yaml",
        "namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: burst_tiers\n        tiers:\n          - { limit: 1, window: 1s, active: 0s }\n          - { limit: 5, window: 10s, active: 5s }\n          - { limit: 9, window: 2s, active: 7s, cooldown: 1m, skippable: true }\n",
    )
    .unwrap();
    let ResourceKind::Rate(r) = &loaded.config.namespaces[0].resources[0].kind else {
        panic!()
    };
    let AlgorithmSpec::BurstTiers { tiers } = r.default.algorithm().unwrap() else {
        panic!()
    };
    assert_eq!(
        tiers,
        &vec![
            Tier {
                limit: 5,
                window: Nanos::from_secs(5),
                active: Nanos::from_secs(5),
                cooldown: Nanos::ZERO,
                skippable: false
            },
            Tier {
                limit: 9,
                window: Nanos::from_secs(2),
                active: Nanos::from_secs(6),
                cooldown: Nanos::from_secs(60),
                skippable: true
            },
        ]
    );
    let w: Vec<String> = loaded.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(
        w[0].contains("tier 1: active time is zero") && w[0].starts_with("t.yaml:7:"),
        "{}",
        w[0]
    );
    assert!(
        w[1].contains("tier 2: window 10s is longer than the active period 5s; shortened to 5s"),
        "{}",
        w[1]
    );
    assert!(
        w[2].contains("tier 3: active period 7s is not a multiple of the window 2s; trimmed to 6s"),
        "{}",
        w[2]
    );
}

#[test]
fn limits_above_the_global_limit_are_capped() {
    let loaded = load_str(
        "t.yaml",
        "namespaces:\n  - name: n\n    resources:\n      - name: c\n        kind: concurrency\n        domain_limit: 50\n        global_limit: 10\n        groups: [ { name: g, members: [x], limit: 20 } ]\n        domains: { x: { domain_limit: 30 } }\n      - { name: r, algorithm: gcra, rate: 1/s, hard_limit: 200, global_limit: 100 }\n",
    )
    .unwrap();
    let ns = &loaded.config.namespaces[0];
    let ResourceKind::Concurrency(c) = &ns.resources[0].kind else {
        panic!()
    };
    assert_eq!(c.domain_limit(), 10);
    assert_eq!(c.domain_limit_for("x"), 10);
    assert_eq!(c.groups()[0].limit, 10);
    let ResourceKind::Rate(r) = &ns.resources[1].kind else {
        panic!()
    };
    assert_eq!(r.default.hard_limit, Some(100));
    assert_eq!(loaded.warnings.len(), 4, "{:?}", loaded.warnings);
}

#[test]
fn domain_overrides_refine_or_replace() {
    let loaded = load_str(
        "t.yaml",
        "namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: token_bucket\n        capacity: 10\n        rate: 1/s\n        domains:\n          big: { capacity: 1000 }\n          other: { algorithm: gcra, rate: 5/s, burst: 2 }\n",
    )
    .unwrap();
    let ResourceKind::Rate(r) = &loaded.config.namespaces[0].resources[0].kind else {
        panic!()
    };
    assert_eq!(
        r.for_domain("big").algorithm().unwrap().to_string(),
        "token_bucket { capacity: 1000, rate: 1/1s }"
    );
    assert_eq!(
        r.for_domain("other").algorithm().unwrap().to_string(),
        "gcra { rate: 5/1s, burst: 2 }"
    );
    assert_eq!(
        r.for_domain("nobody").algorithm().unwrap().to_string(),
        "token_bucket { capacity: 10, rate: 1/1s }"
    );
}

#[test]
fn overrides_cannot_set_resource_wide_fields() {
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: gcra\n        rate: 1/s\n        domains: { d: { global_limit: 5 } }\n");
    assert!(
        e.contains("`global_limit` applies to the whole resource"),
        "{e}"
    );
}

/// Issue 23: an override's unknown field listed the fields only a resource
/// may have (`name, kind, shadow_mode, domains, global_limit`) as expected,
/// and suggested `shadow_mode` for `shadow_mod`, which an override may not
/// set either.
#[test]
fn an_overrides_unknown_field_lists_only_what_an_override_takes() {
    let e = errors("namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: token_bucket\n        capacity: 10\n        rate: 1/s\n        domains:\n          acme: { wibble: 3 }\n          globex: { shadow_mod: true }\n          initech: { capasity: 3 }\n          umbrella: { algorithm: gcra, rate: 1/s, bogus: 1 }\n");
    assert_eq!(
        e,
        [
            "t.yaml:9:19: unknown field `wibble` in resource `a`, domain `acme` (expected one of: algorithm, hard_limit, capacity, rate, initial_tokens)",
            "t.yaml:10:21: unknown field `shadow_mod` in resource `a`, domain `globex` (expected one of: algorithm, hard_limit, capacity, rate, initial_tokens)",
            "t.yaml:11:22: unknown field `capasity` in resource `a`, domain `initech`, did you mean `capacity`?",
            "t.yaml:12:51: unknown field `bogus` in resource `a`, domain `umbrella` (expected one of: algorithm, hard_limit, rate, burst)",
        ]
    );
    // A resource-wide field in an override is told so, once, not also
    // called unknown.
    let e = errors("namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: gcra\n        rate: 1/s\n        domains: { d: { shadow_mode: true, name: x } }\n");
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e.iter()
            .all(|m| m.contains("applies to the whole resource")),
        "{e:?}"
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let e = errors("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: gcra }\n      - { name: b, algorithm: nope }\n      - { name: c, kind: weird }\n");
    assert_eq!(e.len(), 3, "{e:?}");
}

#[test]
fn syntax_errors_and_wrong_top_level() {
    let e = one_error("namespaces: [\n");
    assert!(e.contains("invalid YAML"), "{e}");
    let e = one_error("limits: []\n");
    assert!(e.contains("expected `namespaces:`"), "{e}");
}

#[test]
fn normalized_output_reads_back_identically() {
    let text = include_str!("../../../examples/tollgate.yaml");
    let first = load_str("a.yaml", text).unwrap().config;
    let yaml = tollgate_config::emit::to_yaml(&first);
    let second = load_str("b.yaml", &yaml)
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
        .config;
    assert_eq!(first.namespaces.len(), second.namespaces.len());
    for (a, b) in first.namespaces.iter().zip(&second.namespaces) {
        assert_eq!(a.name, b.name);
        for (ra, rb) in a.resources.iter().zip(&b.resources) {
            assert_eq!(ra.name, rb.name);
            assert_eq!(ra.kind, rb.kind, "resource {}", ra.name);
        }
    }
}

#[test]
fn messages_carry_their_context() {
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: burst_tiers\n        tiers:\n          - { limit: 0, window: 1s, active: 1s }\n");
    assert!(
        e.starts_with("t.yaml:7:15: resource `a`, tier 1: `limit` must be at least 1"),
        "{e}"
    );
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: fixed_window, limit: 1, window: 10 }\n");
    assert!(e.contains("resource `a`: `window` needs a unit"), "{e}");
    // A lowered hard limit is reported for the resource and again for each
    // refining override that inherits it (issue 23: config.md promised it,
    // and each override's printed normal form shows the lowered value), at
    // the resource's `hard_limit`.
    let loaded = load_str(
        "t.yaml",
        "namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: gcra\n        rate: 1/s\n        hard_limit: 50\n        global_limit: 10\n        domains: { x: { burst: 2 }, y: { burst: 3 } }\n",
    )
    .unwrap();
    let warnings: Vec<String> = loaded.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        warnings,
        [
            "t.yaml:7:9: resource `a`: hard_limit 50 is above the global_limit 10; lowered to 10",
            "t.yaml:7:9: resource `a`, domain `x`: hard_limit 50 is above the global_limit 10; lowered to 10",
            "t.yaml:7:9: resource `a`, domain `y`: hard_limit 50 is above the global_limit 10; lowered to 10",
        ]
    );
}

/// Regression (issue 16, item 11): a document nested 100,000 levels deep
/// overflowed the stack of the loader (which recurses per level), killing
/// a server reloading it or a config API importing it. Now it is an error
/// naming the bound and where it was passed, in block and in flow style,
/// on a thread with an ordinary 2 MiB stack.
#[test]
fn deeply_nested_yaml_is_an_error_naming_the_bound_not_a_stack_overflow() {
    let deep = 100_000;
    // Each with where it goes too deep: the 65th level (the root mapping
    // is the first), or, for flow sequences, which the scanner reads ahead
    // of the events, where it stops by itself (255 levels of brackets).
    let cases = [
        // Block sequences, each inside the last, on one line.
        (
            format!("namespaces:\n  {}x\n", "- ".repeat(deep)),
            (2, 3 + 63 * 2),
        ),
        // Block mappings, each indented one more (100,000 levels would be
        // gigabytes of indentation: enough to pass the bound many times).
        (
            (0..1_000).fold(String::from("namespaces:\n"), |mut s, i| {
                s.push_str(&" ".repeat(i + 2));
                s.push_str("k:\n");
                s
            }),
            (65, 66),
        ),
        // Flow style.
        (
            format!("namespaces: {}{}\n", "[".repeat(deep), "]".repeat(deep)),
            (1, 13 + 255),
        ),
        (
            format!("namespaces: {}1{}\n", "{a: ".repeat(deep), "}".repeat(deep)),
            (1, 13 + 63 * 4),
        ),
    ];
    for (text, (line, col)) in cases {
        let message = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || one_error(&text))
            .unwrap()
            .join()
            .expect("the loader did not crash");
        assert_eq!(
            message,
            format!(
                "t.yaml:{line}:{col}: YAML nested more than 64 levels deep (lists and mappings \
                 inside each other); a config needs far fewer"
            )
        );
    }
    // The bound itself is allowed (64 levels, 63 of them below the root).
    let ok = format!("x: {}1{}\n", "[".repeat(63), "]".repeat(63));
    assert!(tollgate_config::yaml::parse("t.yaml", &ok).is_ok());
    let over = format!("x: {}1{}\n", "[".repeat(64), "]".repeat(64));
    let e = tollgate_config::yaml::parse("t.yaml", &over).unwrap_err();
    assert_eq!((e.pos.line, e.pos.col), (1, 67), "{e}");
}

/// An override that names no `algorithm:` refines its resource; one that
/// names one replaces it, even with the same algorithm. Errors about a
/// store's rules tell an inherited limit of its resource alone, so the
/// resolved config keeps which is which.
#[test]
fn a_resource_knows_which_overrides_refine_it() {
    let config = load_str(
        "r.yaml",
        "namespaces:\n  - name: n\n    resources:\n      - name: hourly\n        algorithm: fixed_window\n        limit: 100\n        window: 1h\n        domains:\n          acme: { limit: 500 }\n          globex: { algorithm: fixed_window, limit: 5, window: 1m }\n          initech: { hard_limit: 3 }\n      - { name: pool, kind: concurrency, domain_limit: 3, domains: { acme: { domain_limit: 5 } } }\n",
    )
    .unwrap()
    .config;
    let resources = &config.namespaces[0].resources;
    assert_eq!(
        resources[0].refining.iter().collect::<Vec<_>>(),
        ["acme", "initech"]
    );
    assert!(resources[1].refining.is_empty());
}

/// Issue 18 item 3: `max_debt` and `report` load, round-trip through the
/// normalized output, and are refused where no debt is sound.
#[test]
fn usage_fields_load_round_trip_and_are_refused_without_a_sound_debt() {
    let text = "namespaces:\n  - name: n\n    resources:\n      - { name: llm, algorithm: token_bucket, capacity: 1000, rate: 100/s, max_debt: 5000, report: true }\n";
    let loaded = load_str("t.yaml", text).unwrap();
    let r = loaded
        .config
        .namespace("n")
        .unwrap()
        .resource("llm")
        .unwrap();
    assert_eq!(r.usage.max_debt, Some(5000));
    assert!(r.usage.report);
    let yaml = tollgate_config::emit::to_yaml(&loaded.config);
    assert!(yaml.contains("max_debt: 5000"), "{yaml}");
    let again = load_str("t.yaml", &yaml).unwrap();
    let back = again
        .config
        .namespace("n")
        .unwrap()
        .resource("llm")
        .unwrap();
    assert_eq!((&back.kind, back.usage), (&r.kind, r.usage));

    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - { name: s, algorithm: smooth_bursty, rate: 5/s, report: true }\n");
    assert!(e.starts_with("t.yaml:4:"), "{e}");
    assert!(
        e.contains("resource `s`: `report: true` needs an algorithm that can owe hits")
            && e.contains("`smooth_bursty` cannot"),
        "{e}"
    );
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - name: t\n        algorithm: fixed_window\n        limit: 5\n        window: 1s\n        max_debt: 3\n        domains:\n          acme: { algorithm: burst_tiers, tiers: [{ limit: 2, window: 1s, active: 1s, cooldown: 1s }] }\n");
    assert!(
        e.contains("`max_debt` needs") && e.contains("`burst_tiers` cannot"),
        "{e}"
    );
    assert!(e.starts_with("t.yaml:8:"), "{e}");
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - name: t\n        algorithm: fixed_window\n        limit: 5\n        window: 1s\n        domains:\n          acme: { max_debt: 3 }\n");
    assert!(
        e.contains("`max_debt` applies to the whole resource"),
        "{e}"
    );
    // A debt whose refill would take longer than a span.
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - { name: b, algorithm: gcra, rate: 1/1d, burst: 1, max_debt: 1000000000000 }\n");
    assert!(e.contains("`max_debt` is too large"), "{e}");
}
