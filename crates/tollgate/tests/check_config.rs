//! `tollgate check-config`, run as the real binary: exit codes, the
//! normalized config on stdout, errors and warnings on stderr.

// Helpers outside #[test] fns are not covered by clippy.toml's
// allow-unwrap-in-tests; a failed unwrap here is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{example, Sandbox};

#[test]
fn the_bundled_example_is_valid_and_its_normal_form_is_stable() {
    let sb = Sandbox::new("check-example");
    let run = sb.run(&["check-config", &example("tollgate.yaml")]);
    assert!(run.success(), "{run}");
    assert!(run.stdout.starts_with("namespaces:\n"), "{run}");
    for resource in [
        "api", "search", "feed", "exact", "hourly", "queue", "guava", "warm", "login", "batch",
        "sandbox",
    ] {
        assert!(
            run.stdout.contains(&format!("      - name: {resource}\n")),
            "{resource} missing{run}"
        );
    }
    assert!(!run.stderr.contains("error"), "{run}");

    // The normalized config is itself a valid config, and normalizing it
    // again changes nothing.
    sb.write("normal.yaml", &run.stdout);
    let again = sb.run(&["check-config", "normal.yaml"]);
    assert!(again.success(), "{again}");
    assert_eq!(again.stdout, run.stdout, "{again}");
    assert_eq!(again.stderr, "", "{again}");

    // --quiet validates without printing the config.
    let quiet = sb.run(&["check-config", "--quiet", "normal.yaml"]);
    assert!(quiet.success(), "{quiet}");
    assert_eq!(quiet.stdout, "", "{quiet}");
}

#[test]
fn errors_name_file_line_and_column_and_fail() {
    let sb = Sandbox::new("check-errors");
    sb.write(
        "bad.yaml",
        "\
namespaces:
  - name: ns
    resources:
      - { name: ok, algorithm: token_bucket, capacity: 1, rate: 1/s }
      - { name: typo, algorithm: fixed_windw, limit: 2, window: 1s }
      - { name: empty, algorithm: token_bucket, capacity: 0, rate: 1/s }
",
    );
    let run = sb.run(&["check-config", "bad.yaml"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert_eq!(
        run.stdout, "",
        "no config is printed for an invalid one{run}"
    );
    let errors: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(errors.len(), 2, "every error is reported at once{run}");
    assert!(
        errors[0].starts_with("error: bad.yaml:5:"),
        "error names file:line:col{run}"
    );
    assert!(errors[0].contains("fixed_windw"), "{run}");
    assert!(errors[0].contains("did you mean `fixed_window`"), "{run}");
    assert!(errors[1].starts_with("error: bad.yaml:6:"), "{run}");
    assert!(errors[1].contains("capacity"), "{run}");
    // line:col are numbers, then the message.
    for e in &errors {
        let rest = e.strip_prefix("error: bad.yaml:").unwrap();
        let mut parts = rest.splitn(3, ':');
        let line: usize = parts.next().unwrap().parse().unwrap();
        let col: usize = parts.next().unwrap().parse().unwrap();
        assert!(line > 0 && col > 0, "{e}");
        assert!(parts.next().unwrap().starts_with(' '), "{e}");
    }

    // YAML syntax errors are positioned too.
    sb.write("syntax.yaml", "namespaces:\n  - name: [unclosed\n");
    let run = sb.run(&["check-config", "syntax.yaml"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(run.stderr.starts_with("error: syntax.yaml:"), "{run}");

    // A missing file is an error, not a crash.
    let run = sb.run(&["check-config", "missing.yaml"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(run.stderr.contains("missing.yaml"), "{run}");
    assert!(run.stderr.contains("cannot read"), "{run}");
}

#[test]
fn warnings_go_to_stderr_and_the_normal_form_applies_them() {
    let sb = Sandbox::new("check-warnings");
    sb.write(
        "tiers.yaml",
        "\
namespaces:
  - name: ns
    resources:
      - name: login
        algorithm: burst_tiers
        tiers:
          - { limit: 10, window: 10s, active: 5s }
          - { limit: 20, window: 1s, active: 0s }
",
    );
    let run = sb.run(&["check-config", "tiers.yaml"]);
    assert!(run.success(), "warnings do not fail the check{run}");
    let warnings: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(warnings.len(), 2, "{run}");
    assert!(
        warnings
            .iter()
            .all(|w| w.starts_with("warning: tiers.yaml:")),
        "{run}"
    );
    assert!(warnings[0].contains("shortened"), "{run}");
    assert!(warnings[1].contains("removed"), "{run}");
    // The window was shortened to the active time and the zero-active tier
    // dropped (Charon §4.1).
    assert!(
        run.stdout.contains(
            "tiers: [{ limit: 10, window: 5s, active: 5s, cooldown: 0s, skippable: false }]"
        ),
        "{run}"
    );
    // The normalized form needs no more normalizing.
    sb.write("normal.yaml", &run.stdout);
    let again = sb.run(&["check-config", "normal.yaml"]);
    assert!(again.success(), "{again}");
    assert_eq!(again.stderr, "", "{again}");
}

#[test]
fn a_directory_is_read_file_by_file_and_namespaces_must_be_unique() {
    let sb = Sandbox::new("check-dir");
    sb.write(
        "conf/a.yaml",
        "namespaces:\n  - name: one\n    resources:\n      - { name: r, algorithm: unlimited }\n",
    );
    sb.write(
        "conf/b.yaml",
        "domain: two\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 5 }\n",
    );
    sb.write("conf/notes.txt", "not yaml: [");
    sb.write("conf/.hidden.yaml", "not yaml: [");
    let run = sb.run(&["check-config", "conf"]);
    assert!(run.success(), "{run}");
    assert!(run.stdout.contains("  - name: one\n"), "{run}");
    // The envoy-format namespace comes back in its own format.
    assert!(run.stdout.contains("---\ndomain: two\n"), "{run}");

    sb.write(
        "conf/c.yaml",
        "namespaces:\n  - name: one\n    resources: []\n",
    );
    let run = sb.run(&["check-config", "conf"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(run.stderr.contains("c.yaml:2:"), "{run}");
    assert!(run.stderr.contains("defined twice"), "{run}");
    assert!(
        run.stderr.contains("a.yaml:2:"),
        "names the first definition{run}"
    );
}

#[test]
fn an_envoy_config_checks_and_its_warnings_are_positioned() {
    let sb = Sandbox::new("check-envoy");
    sb.write(
        "envoy.yaml",
        "\
domain: edge
descriptors:
  - key: ip
    value: 10.0.0.1
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
",
    );
    let run = sb.run(&["check-config", "envoy.yaml"]);
    assert!(run.success(), "{run}");
    assert!(run.stderr.starts_with("warning: envoy.yaml:7:"), "{run}");
    assert!(run.stderr.contains("every request is rejected"), "{run}");
    assert!(run.stdout.starts_with("domain: edge\n"), "{run}");
    assert!(
        run.stdout
            .contains("rate_limit: { unit: second, requests_per_unit: 0 }"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("rate_limit: { unit: minute, requests_per_unit: 3 }"),
        "{run}"
    );

    sb.write("envoy.yaml", "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: fortnight, requests_per_unit: 3 }\n");
    let run = sb.run(&["check-config", "envoy.yaml"]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(run.stderr.starts_with("error: envoy.yaml:4:"), "{run}");
    assert!(run.stderr.contains("fortnight"), "{run}");
}

/// Issue 23 (config.md §4): a hard limit lowered to the global limit was
/// warned about once, for the resource, while `check-config` printed the
/// lowered value in every refining override too. Each domain whose hard
/// limit is lowered now gets its own warning, and the normal form shows the
/// lowered value.
#[test]
fn a_lowered_hard_limit_is_warned_about_for_each_override_it_lowers() {
    let sb = Sandbox::new("check-hard-limit");
    sb.write(
        "ov.yaml",
        "\
namespaces:
  - name: n
    resources:
      - name: a
        algorithm: token_bucket
        capacity: 10
        rate: 1/s
        hard_limit: 5
        global_limit: 3
        domains:
          refine: { capacity: 20 }
          own: { hard_limit: 4 }
          replace: { algorithm: gcra, rate: 5/s }
",
    );
    let run = sb.run(&["check-config", "ov.yaml"]);
    assert!(run.success(), "{run}");
    assert_eq!(
        run.stderr,
        "\
warning: ov.yaml:8:9: resource `a`: hard_limit 5 is above the global_limit 3; lowered to 3
warning: ov.yaml:8:9: resource `a`, domain `refine`: hard_limit 5 is above the global_limit 3; lowered to 3
warning: ov.yaml:12:18: resource `a`, domain `own`: hard_limit 4 is above the global_limit 3; lowered to 3
",
        "{run}"
    );
    for line in [
        "        hard_limit: 3\n        global_limit: 3\n",
        "          refine: { algorithm: token_bucket, capacity: 20, rate: 1/1s, hard_limit: 3 }\n",
        "          own: { algorithm: token_bucket, capacity: 10, rate: 1/1s, hard_limit: 3 }\n",
        // A replacing override inherits no hard limit: nothing to lower.
        "          replace: { algorithm: gcra, rate: 5/1s, burst: 1 }\n",
    ] {
        assert!(run.stdout.contains(line), "{line}{run}");
    }
    sb.write("normal.yaml", &run.stdout);
    let again = sb.run(&["check-config", "normal.yaml"]);
    assert_eq!(
        (again.stdout.as_str(), again.stderr.as_str()),
        (run.stdout.as_str(), ""),
        "{again}"
    );
}

/// Issue 23: `check-config` could not check a file for a replicated
/// cluster, which refused the README's and the bundled config one resource
/// per run. `check-config --cluster` holds a file to the cluster's rules
/// without starting anything and lists every resource to change.
#[test]
fn check_config_cluster_holds_a_file_to_a_clusters_rules() {
    let sb = Sandbox::new("check-cluster");
    // The example written for a cluster passes, printed as usual.
    let ok = sb.run(&["check-config", "--cluster", &example("cluster.yaml")]);
    assert!(ok.success(), "{ok}");
    assert!(
        ok.stdout.starts_with("namespaces:\n  - name: web\n"),
        "{ok}"
    );
    assert_eq!(ok.stderr, "", "{ok}");
    // It is an ordinary config too, and loads beside the bundled one.
    let plain = sb.run(&["check-config", "--quiet", &example("")]);
    assert!(plain.success(), "{plain}");

    // The bundled example: valid, but not for a cluster; every resource a
    // cluster cannot serve is listed at once, and nothing is printed.
    let bundled = example("tollgate.yaml");
    assert!(sb.run(&["check-config", "-q", &bundled]).success());
    let run = sb.run(&["check-config", "--cluster", &bundled]);
    assert_eq!((run.code, run.stdout.as_str()), (Some(1), ""), "{run}");
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(
        lines[0],
        "error: the config cannot run on the replicated store (10 problems, each saying what to change):",
        "{run}"
    );
    let listed: Vec<&str> = lines[1..]
        .iter()
        .map(|l| {
            l.strip_prefix("  namespace `default`, resource `")
                .and_then(|r| r.split('`').next())
                .unwrap_or_else(|| panic!("{l}{run}"))
        })
        .collect();
    assert_eq!(
        listed,
        [
            "feed", "exact", "hourly", "queue", "guava", "warm", "plan", "login", "batch",
            "sandbox"
        ],
        "{run}"
    );
    assert!(
        lines[1..].iter().all(|l| l.contains("Redis store")),
        "each says what to do instead{run}"
    );

    // The default strategy is `serve --replication`'s, checked by name.
    let epoch = sb.run(&[
        "check-config",
        "--cluster",
        "--replication",
        "epoch",
        "-q",
        &example("cluster.yaml"),
    ]);
    assert!(epoch.success(), "{epoch}");
    let bad = sb.run(&[
        "check-config",
        "--cluster",
        "--replication",
        "gossip",
        &bundled,
    ]);
    assert_eq!(bad.code, Some(2), "{bad}");
    assert!(
        bad.stderr
            .contains("[possible values: counter, queue, epoch]"),
        "{bad}"
    );
    // --replication means nothing without --cluster.
    let alone = sb.run(&["check-config", "--replication", "epoch", &bundled]);
    assert_eq!(alone.code, Some(2), "{alone}");
    assert!(alone.stderr.contains("--cluster"), "{alone}");
}

/// Review of issue 23: a domain override refused for the text its
/// resource was refused for was not listed, so an override that replaces
/// the algorithm with another the cluster cannot serve either (a
/// `fixed_window` of its own on a `fixed_window` resource, a token bucket
/// with its own `initial_tokens`) showed up only once the resource was
/// fixed. Such an override is listed; one that refines the resource (names
/// no `algorithm:`) inherits its limit and is told of the resource alone.
#[test]
fn check_config_cluster_lists_overrides_that_replace_the_algorithm() {
    let sb = Sandbox::new("check-cluster-overrides");
    sb.write(
        "overrides.yaml",
        "\
namespaces:
  - name: default
    resources:
      - name: hourly
        algorithm: fixed_window
        limit: 100
        window: 1h
        domains:
          acme: { limit: 500 }
          globex: { algorithm: fixed_window, limit: 5, window: 1m }
      - name: warm
        algorithm: token_bucket
        capacity: 10
        rate: 1/s
        initial_tokens: 0
        domains:
          acme: { capacity: 20 }
          globex: { algorithm: token_bucket, capacity: 5, rate: 1/s, initial_tokens: 1 }
",
    );
    let run = sb.run(&["check-config", "--cluster", "-q", "overrides.yaml"]);
    let window = "`fixed_window` cannot be replicated in a gossip cluster; use `token_bucket` or `gcra` (replicated as queue), or serve it from the Redis store";
    let initial = "`initial_tokens` cannot be replicated: every node starts a key full; remove `initial_tokens`, or serve it from the Redis store";
    assert_eq!(
        (run.code, run.stderr.as_str()),
        (
            Some(1),
            format!(
                "\
error: the config cannot run on the replicated store (4 problems, each saying what to change):
  namespace `default`, resource `hourly`: {window}
  namespace `default`, resource `hourly`, domain `globex`: {window}
  namespace `default`, resource `warm`: {initial}
  namespace `default`, resource `warm`, domain `globex`: {initial}
"
            )
            .as_str()
        ),
        "{run}"
    );
}

/// Review of issue 23: `check-config --cluster` and `serve --cluster` each
/// built their own cluster to check a config on, and parsed the default
/// strategy each their own way: check-config ignored `TOLLGATE_REPLICATION`
/// (checking as `queue` a cluster that runs `epoch`), and refused a bad
/// name with another error than serve. Both now check on the same cluster
/// with the same flag: the same lines, the same errors.
#[test]
fn check_config_cluster_and_serve_check_the_same_cluster_with_the_same_flag() {
    let sb = Sandbox::new("check-cluster-alike");
    sb.write(
        "hourly.yaml",
        "namespaces:\n  - name: default\n    resources:\n      - { name: hourly, algorithm: fixed_window, limit: 100, window: 1h }\n",
    );
    sb.write("secret", "0123456789abcdef0123456789abcdef");
    let checked = |env: &[(&str, &str)], flags: &[&str]| {
        let mut args = vec!["check-config", "--cluster", "-q", "hourly.yaml"];
        args.extend_from_slice(flags);
        common::run_clean(&sb.dir, &args, env)
    };
    let served = |env: &[(&str, &str)], flags: &[&str]| {
        let mut args = vec!["serve", "--check", "--config", "hourly.yaml"];
        args.extend_from_slice(&common::NODE_N1);
        args.extend_from_slice(flags);
        common::run_clean(&sb.dir, &args, env)
    };
    let want = |strategy: &str| {
        format!(
            "error: the config cannot run on the replicated store: namespace `default`, resource \
             `hourly`: `fixed_window` cannot be replicated in a gossip cluster; use \
             `token_bucket` or `gcra` (replicated as {strategy}), or serve it from the Redis \
             store\n"
        )
    };
    for (env, flags, strategy) in [
        (&[][..], &[][..], "queue"),
        (&[("TOLLGATE_REPLICATION", "epoch")][..], &[][..], "epoch"),
        (&[][..], &["--replication", "counter"][..], "counter"),
    ] {
        let a = checked(env, flags);
        let b = served(env, flags);
        assert_eq!(
            (a.code, a.stderr.as_str()),
            (Some(1), want(strategy).as_str()),
            "{a}"
        );
        assert_eq!(
            (b.code, b.stderr.as_str()),
            (Some(1), want(strategy).as_str()),
            "{b}"
        );
    }
    // A name that is no strategy: the same refusal, from the flag or the
    // variable, naming the names there are.
    for (env, flags) in [
        (&[("TOLLGATE_REPLICATION", "gossip")][..], &[][..]),
        (&[][..], &["--replication", "gossip"][..]),
    ] {
        let a = checked(env, flags);
        let b = served(env, flags);
        assert_eq!(a.code, Some(2), "{a}");
        assert_eq!((b.code, &b.stderr), (Some(2), &a.stderr), "{b}");
        assert!(
            a.stderr.starts_with(
                "error: invalid value 'gossip' for '--replication <STRATEGY>'\n  [possible values: counter, queue, epoch]\n"
            ),
            "{a}"
        );
    }
    // The variable is the cluster's setting, set for `serve`: without
    // --cluster, check-config does not use it, and is not refused for it.
    let plain = common::run_clean(
        &sb.dir,
        &["check-config", "-q", "hourly.yaml"],
        &[("TOLLGATE_REPLICATION", "epoch")],
    );
    assert!(plain.success(), "{plain}");
}
