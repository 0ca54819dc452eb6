//! `replication:` on a rate resource: the strategy of the gossip cluster,
//! in its short and mapping forms, its errors, and its round trip through
//! the normalized output.

// Helpers outside #[test] fns are not covered by clippy.toml's
// allow-unwrap-in-tests; a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_config::{load_str, ConfigError, Resource};
use tollgate_core::replicated::strategy::{Eager, Replication, StrategyKind};
use tollgate_core::Nanos;

/// A namespace with one token bucket `a` whose `replication:` value is
/// `value`, written on line 8 (key at column 9, value at column 22).
fn with_replication(value: &str) -> String {
    format!(
        "namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: token_bucket\n        capacity: 10\n        rate: 1/s\n        replication: {value}\n"
    )
}

fn resource(text: &str) -> Resource {
    let loaded = load_str("t.yaml", text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    loaded.config.namespaces[0].resources[0].clone()
}

fn replication(value: &str) -> Option<Replication> {
    resource(&with_replication(value)).replication
}

fn errors(text: &str) -> Vec<String> {
    match load_str("t.yaml", text) {
        Ok(_) => panic!("expected an error:\n{text}"),
        Err(ConfigError { errors }) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

fn one_error(text: &str) -> String {
    let e = errors(text);
    assert_eq!(e.len(), 1, "{e:?}");
    e.into_iter().next().unwrap()
}

fn replication_error(value: &str) -> String {
    one_error(&with_replication(value))
}

#[test]
fn absent_means_the_clusters_default() {
    let r = resource("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: gcra, rate: 1/s }\n");
    assert_eq!(r.replication, None);
}

#[test]
fn a_strategy_name_takes_the_thesis_defaults() {
    for (name, kind) in [
        ("counter", StrategyKind::Counter),
        ("queue", StrategyKind::Queue),
        ("epoch", StrategyKind::Epoch),
    ] {
        assert_eq!(replication(name), Some(Replication::new(kind)), "{name}");
    }
    let queue = replication("queue").unwrap();
    assert_eq!(queue.gossip_interval, Nanos::from_millis(300));
    assert_eq!(
        queue.eager,
        Some(Eager {
            window: None,
            threshold: Nanos::from_millis(2400)
        })
    );
    assert!(!queue.least_informed);
    assert_eq!(queue.retention, None);
    assert_eq!(replication("epoch").unwrap().epoch, Nanos::SECOND);
}

#[test]
fn a_mapping_with_only_the_strategy_is_the_short_form() {
    for (name, kind) in [
        ("counter", StrategyKind::Counter),
        ("queue", StrategyKind::Queue),
        ("epoch", StrategyKind::Epoch),
    ] {
        assert_eq!(
            replication(&format!("{{ strategy: {name} }}")),
            Some(Replication::new(kind)),
            "{name}"
        );
    }
    // `eager: true` is the queue's default.
    assert_eq!(
        replication("{ strategy: queue, eager: true }"),
        Some(Replication::new(StrategyKind::Queue))
    );
}

#[test]
fn a_queue_takes_every_parameter() {
    let r = replication(
        "{ strategy: queue, gossip_interval: 100ms, window: 10, frequency_threshold: 1.5s, least_informed: true, near_limit: false, retention: 5s }",
    )
    .unwrap();
    assert_eq!(
        r,
        Replication {
            strategy: StrategyKind::Queue,
            gossip_interval: Nanos::from_millis(100),
            eager: Some(Eager {
                window: Some(10),
                threshold: Nanos::from_millis(1500),
            }),
            least_informed: true,
            near_limit: false,
            epoch: Nanos::SECOND,
            retention: Some(Nanos::from_secs(5)),
        }
    );
    assert_eq!(r.retention_margin(), Nanos::from_secs(5));
}

#[test]
fn window_or_threshold_imply_eager_and_eager_false_turns_it_off() {
    let r = replication("{ strategy: queue, window: 3 }").unwrap();
    assert_eq!(
        r.eager,
        Some(Eager {
            window: Some(3),
            threshold: Eager::DEFAULT_THRESHOLD
        })
    );
    let r = replication("{ strategy: queue, eager: true, frequency_threshold: 1s }").unwrap();
    assert_eq!(
        r.eager,
        Some(Eager {
            window: None,
            threshold: Nanos::SECOND
        })
    );
    let r = replication("{ strategy: queue, eager: false }").unwrap();
    assert_eq!(r.eager, None);
    assert_eq!(
        r,
        Replication {
            eager: None,
            ..Replication::new(StrategyKind::Queue)
        }
    );
}

#[test]
fn counter_and_epoch_take_their_parameters() {
    assert_eq!(
        replication("{ strategy: counter, gossip_interval: 1s }"),
        Some(Replication {
            gossip_interval: Nanos::SECOND,
            ..Replication::new(StrategyKind::Counter)
        })
    );
    assert_eq!(
        replication("{ strategy: epoch, epoch: 500ms, gossip_interval: 50ms }"),
        Some(Replication {
            epoch: Nanos::from_millis(500),
            gossip_interval: Nanos::from_millis(50),
            ..Replication::new(StrategyKind::Epoch)
        })
    );
}

#[test]
fn the_block_form_works_too() {
    let text = "namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: gcra\n        rate: 10/s\n        burst: 5\n        replication:\n          strategy: epoch\n          epoch: 2s\n";
    assert_eq!(
        resource(text).replication,
        Some(Replication {
            epoch: Nanos::from_secs(2),
            ..Replication::new(StrategyKind::Epoch)
        })
    );
}

#[test]
fn domain_overrides_keep_the_resources_replication() {
    let text = "namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: token_bucket\n        capacity: 10\n        rate: 1/s\n        replication: counter\n        domains:\n          big: { capacity: 100 }\n          other: { algorithm: gcra, rate: 5/s }\n";
    let r = resource(text);
    assert_eq!(r.replication, Some(Replication::new(StrategyKind::Counter)));
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - name: a\n        algorithm: gcra\n        rate: 1/s\n        domains: { d: { replication: queue } }\n");
    assert!(
        e.starts_with("t.yaml:7:25: resource `a`, domain `d`: `replication` applies to the whole resource and cannot be set per domain"),
        "{e}"
    );
}

#[test]
fn envoy_limits_have_no_replication() {
    let loaded = load_str(
        "e.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 5 }\n",
    )
    .unwrap();
    let ns = &loaded.config.namespaces[0];
    assert!(!ns.resources.is_empty());
    assert!(ns.resources.iter().all(|r| r.replication.is_none()));
}

#[test]
fn unknown_strategies_list_the_three() {
    let e = replication_error("gossip");
    assert!(e.starts_with("t.yaml:8:22: resource `a`: "), "{e}");
    assert!(
        e.contains(
            "unknown replication strategy `gossip` (expected `counter`, `queue` or `epoch`)"
        ),
        "{e}"
    );
    let e = replication_error("{ strategy: qeue }");
    assert!(
        e.contains("resource `a`, replication: unknown replication strategy `qeue` (expected `counter`, `queue` or `epoch`), did you mean `queue`?"),
        "{e}"
    );
    let e = replication_error("{ strategy: 3 }");
    assert!(
        e.contains("`strategy` must be a string, found a number"),
        "{e}"
    );
}

#[test]
fn the_mapping_needs_a_strategy() {
    let e = replication_error("{ gossip_interval: 1s }");
    assert!(
        e.contains("resource `a`, replication is missing required field `strategy`"),
        "{e}"
    );
    // A misspelt `strategy` is one error, not two.
    let e = replication_error("{ stratgy: queue }");
    assert!(
        e.contains(
            "unknown field `stratgy` in resource `a`, replication, did you mean `strategy`?"
        ),
        "{e}"
    );
}

#[test]
fn unknown_fields_are_errors_like_elsewhere() {
    let e = replication_error("{ strategy: queue, fanout: 3 }");
    assert!(e.starts_with("t.yaml:8:41: "), "{e}");
    assert!(
        e.contains("unknown field `fanout` in resource `a`, replication (expected one of: strategy, gossip_interval, eager, window, frequency_threshold, least_informed, near_limit, epoch, retention)"),
        "{e}"
    );
    let e = replication_error("{ strategy: queue, gossip_intervall: 1s }");
    assert!(e.contains("did you mean `gossip_interval`?"), "{e}");
}

#[test]
fn fields_of_another_strategy_are_refused() {
    for (value, field, owner, strategy) in [
        (
            "{ strategy: counter, eager: true }",
            "eager",
            "queue",
            "counter",
        ),
        ("{ strategy: epoch, window: 3 }", "window", "queue", "epoch"),
        (
            "{ strategy: counter, frequency_threshold: 1s }",
            "frequency_threshold",
            "queue",
            "counter",
        ),
        (
            "{ strategy: epoch, least_informed: true }",
            "least_informed",
            "queue",
            "epoch",
        ),
        (
            "{ strategy: counter, retention: 5s }",
            "retention",
            "queue",
            "counter",
        ),
        ("{ strategy: queue, epoch: 1s }", "epoch", "epoch", "queue"),
        (
            "{ strategy: counter, epoch: 1s }",
            "epoch",
            "epoch",
            "counter",
        ),
    ] {
        let e = replication_error(value);
        assert!(
            e.contains(&format!(
                "resource `a`, replication: `{field}` only applies to `strategy: {owner}`, not `strategy: {strategy}`"
            )),
            "{value}: {e}"
        );
    }
}

#[test]
fn eager_false_with_its_tuning_is_contradictory() {
    let e = replication_error("{ strategy: queue, eager: false, window: 4 }");
    assert!(e.starts_with("t.yaml:8:41: "), "{e}");
    assert!(e.contains("`eager: false` contradicts `window`"), "{e}");
    let e =
        replication_error("{ strategy: queue, frequency_threshold: 1s, eager: false, window: 4 }");
    assert!(
        e.contains("`eager: false` contradicts `window` and `frequency_threshold`"),
        "{e}"
    );
}

#[test]
fn durations_and_window_must_be_positive() {
    for (value, field) in [
        (
            "{ strategy: counter, gossip_interval: 0s }",
            "gossip_interval",
        ),
        ("{ strategy: queue, gossip_interval: 0 }", "gossip_interval"),
        ("{ strategy: epoch, epoch: 0s }", "epoch"),
        ("{ strategy: queue, retention: 0ms }", "retention"),
        (
            "{ strategy: queue, frequency_threshold: 0s }",
            "frequency_threshold",
        ),
    ] {
        let e = replication_error(value);
        assert!(
            e.contains(&format!(
                "resource `a`, replication: `{field}` must be greater than zero"
            )),
            "{value}: {e}"
        );
    }
    let e = replication_error("{ strategy: queue, window: 0 }");
    assert!(
        e.contains("resource `a`, replication: `window` must be at least 1"),
        "{e}"
    );
    let e = replication_error("{ strategy: queue, window: -2 }");
    assert!(e.contains("`window` must not be negative, found -2"), "{e}");
    let e = replication_error("{ strategy: queue, window: 1.5 }");
    assert!(e.contains("`window` must be a whole number"), "{e}");
    let e = replication_error("{ strategy: queue, retention: 200000d }");
    assert!(e.contains("`retention` must be at most 146 years"), "{e}");
}

#[test]
fn durations_parse_like_every_other() {
    let e = replication_error("{ strategy: counter, gossip_interval: 300 }");
    assert!(
        e.contains(
            "resource `a`, replication: `gossip_interval` needs a unit: write `300s` or `300ms`"
        ),
        "{e}"
    );
    let e = replication_error("{ strategy: epoch, epoch: 1fortnight }");
    assert!(e.contains("unknown unit `fortnight`"), "{e}");
    assert_eq!(
        replication("{ strategy: counter, gossip_interval: 1m30s }")
            .unwrap()
            .gossip_interval,
        Nanos::from_secs(90)
    );
}

#[test]
fn wrong_types_are_named() {
    let e = replication_error("7");
    assert!(
        e.contains("resource `a`: `replication` must be a strategy name (counter, queue, epoch) or a mapping with `strategy`, found a number"),
        "{e}"
    );
    let e = replication_error("{ strategy: queue, least_informed: yes }");
    assert!(
        e.contains("`least_informed` must be `true` or `false`, found a string"),
        "{e}"
    );
    let e = replication_error("{ strategy: queue, eager: 1 }");
    assert!(e.contains("`eager` must be `true` or `false`"), "{e}");
}

#[test]
fn concurrency_resources_cannot_be_replicated() {
    let e = one_error("namespaces:\n  - name: n\n    resources:\n      - name: c\n        kind: concurrency\n        domain_limit: 3\n        replication: queue\n");
    assert_eq!(
        e,
        "t.yaml:7:9: resource `c`: `replication` applies to rate-limited resources; concurrency resources need the Redis store in a cluster"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    // A bad replication does not hide the resource's other problems, nor
    // one problem of the mapping another.
    let e = errors("namespaces:\n  - name: n\n    resources:\n      - { name: a, algorithm: token_bucket, rate: 1/s, replication: { strategy: counter, gossip_interval: 0s, epoch: 1s } }\n");
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e.iter()
            .any(|m| m.contains("`gossip_interval` must be greater than zero")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.contains("`epoch` only applies to `strategy: epoch`")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|m| m.contains("missing required field `capacity`")),
        "{e:?}"
    );
}

/// Every form the loader accepts, one resource each.
const ROUND_TRIP: &str = "namespaces:
  - name: n
    resources:
      - { name: none, algorithm: gcra, rate: 1/s }
      - { name: counter, algorithm: gcra, rate: 1/s, replication: counter }
      - { name: queue, algorithm: gcra, rate: 1/s, replication: queue }
      - { name: epoch, algorithm: gcra, rate: 1/s, replication: epoch }
      - { name: spelt_out, algorithm: gcra, rate: 1/s, replication: { strategy: queue, gossip_interval: 300ms, eager: true, frequency_threshold: 2400ms } }
      - { name: lazy, algorithm: gcra, rate: 1/s, replication: { strategy: queue, eager: false } }
      - name: tuned
        algorithm: token_bucket
        capacity: 100
        rate: 10/s
        hard_limit: 5
        global_limit: 50
        replication: { strategy: queue, gossip_interval: 100ms, window: 10, frequency_threshold: 1s, least_informed: true, retention: 5s }
        domains:
          big: { capacity: 1000 }
      - { name: slow, algorithm: gcra, rate: 1/s, replication: { strategy: counter, gossip_interval: 1500ms } }
      - { name: epochs, algorithm: gcra, rate: 1/s, replication: { strategy: epoch, epoch: 250ms } }
      - { name: shadowed, algorithm: gcra, rate: 1/s, shadow_mode: true, replication: { strategy: queue, window: 2 } }
";

#[test]
fn normalized_output_round_trips() {
    let first = load_str("a.yaml", ROUND_TRIP).unwrap().config;
    let yaml = tollgate_config::emit::to_yaml(&first);
    let second = load_str("b.yaml", &yaml)
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
        .config;
    let (a, b) = (&first.namespaces[0], &second.namespaces[0]);
    assert_eq!(a.resources.len(), 10);
    assert_eq!(a.resources.len(), b.resources.len());
    for (ra, rb) in a.resources.iter().zip(&b.resources) {
        assert_eq!(ra.name, rb.name);
        assert_eq!(
            ra.replication, rb.replication,
            "resource {}\n{yaml}",
            ra.name
        );
        assert_eq!(ra.kind, rb.kind, "resource {}", ra.name);
        assert_eq!(ra.shadow, rb.shadow, "resource {}", ra.name);
    }
    // Printing it again changes nothing.
    assert_eq!(tollgate_config::emit::to_yaml(&second), yaml);
}

#[test]
fn defaults_print_short_and_the_rest_only_what_differs() {
    let config = load_str("a.yaml", ROUND_TRIP).unwrap().config;
    let yaml = tollgate_config::emit::to_yaml(&config);
    let lines: Vec<&str> = yaml.lines().map(str::trim).collect();
    let replications: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("replication: "))
        .collect();
    assert_eq!(
        replications,
        vec![
            "counter",
            "queue",
            "epoch",
            "queue",
            "{ strategy: queue, eager: false }",
            "{ strategy: queue, gossip_interval: 100ms, window: 10, frequency_threshold: 1s, least_informed: true, retention: 5s }",
            "{ strategy: counter, gossip_interval: 1500ms }",
            "{ strategy: epoch, epoch: 250ms }",
            "{ strategy: queue, window: 2 }",
        ],
        "{yaml}"
    );
}

#[test]
fn values_built_in_code_print_only_their_strategys_fields() {
    // A value the loader would not produce (an epoch length on a
    // counter) still prints as something the loader reads.
    let mut config = load_str("a.yaml", &with_replication("counter"))
        .unwrap()
        .config;
    config.namespaces[0].resources[0].replication = Some(Replication {
        epoch: Nanos::from_secs(7),
        ..Replication::new(StrategyKind::Counter)
    });
    let yaml = tollgate_config::emit::to_yaml(&config);
    assert!(yaml.contains("        replication: counter\n"), "{yaml}");
    let back = load_str("b.yaml", &yaml).unwrap().config;
    assert_eq!(
        back.namespaces[0].resources[0].replication,
        Some(Replication::new(StrategyKind::Counter))
    );
}

#[test]
fn near_limit_propagation_is_on_for_queues_and_can_be_turned_off() {
    let on = tollgate_core::replicated::strategy::Replication::new(
        tollgate_core::replicated::strategy::StrategyKind::Queue,
    );
    assert!(on.near_limit);
    let yaml = "namespaces:\n  - name: n\n    resources:\n      - { name: r, algorithm: token_bucket, capacity: 5, rate: 1/s, replication: { strategy: queue, near_limit: false } }\n";
    let loaded = tollgate_config::load_str("t.yaml", yaml).unwrap();
    let r = loaded.config.namespaces[0].resources[0]
        .replication
        .unwrap();
    assert!(!r.near_limit);
    let emitted = tollgate_config::emit::to_yaml(&loaded.config);
    assert!(emitted.contains("near_limit: false"), "{emitted}");
    let counter = "namespaces:\n  - name: n\n    resources:\n      - { name: r, algorithm: token_bucket, capacity: 5, rate: 1/s, replication: { strategy: counter, near_limit: true } }\n";
    let err = tollgate_config::load_str("t.yaml", counter)
        .unwrap_err()
        .to_string();
    assert!(err.contains("near_limit"), "{err}");
}
