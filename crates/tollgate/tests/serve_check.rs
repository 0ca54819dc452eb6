//! `tollgate serve --check` as the real binary: a good setup of each store
//! is accepted with a one-line summary while nothing is bound or contacted
//! (its ports are taken, its Redis and config API do not exist), and each
//! kind of bad input is refused with the very error `serve` gives.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{TcpListener, UdpSocket};

use common::config_api::{ConfigApi, ADMIN, READER};
use common::serving::FREE_PORTS;
use common::{Run, Sandbox};
use tollgate_redis::testing::{free_port, RedisServer, TestCerts};

const CONFIG: &str = "\
namespaces:
  - name: default
    resources:
      - { name: api, algorithm: token_bucket, capacity: 10, rate: 1/s }
      - { name: search, algorithm: gcra, rate: 100/min, burst: 10 }
";

/// A config a cluster cannot serve: a copy-limited resource.
const HOLDS: &str = "\
namespaces:
  - name: default
    resources:
      - { name: api, algorithm: token_bucket, capacity: 10, rate: 1/s }
      - { name: sandbox, kind: concurrency, domain_limit: 3 }
";

/// A config Redis cannot serve: a count its scripts cannot keep exact.
const HUGE: &str = "\
namespaces:
  - name: default
    resources:
      - { name: api, algorithm: fixed_window, limit: 9007199254740993, window: 1h }
";

/// Runs `tollgate serve ARGS` in the sandbox with `env` (and no
/// `TOLLGATE_*` variable of the caller's). A `serve` that does not refuse
/// would serve on: it is killed after a minute (exit code `None`), so the
/// test fails instead of hanging.
fn serve_run(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut all = vec!["serve"];
    all.extend_from_slice(args);
    common::run_clean(&sb.dir, &all, env)
}

/// `serve --check ARGS`.
fn check(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut all = vec!["--check"];
    all.extend_from_slice(args);
    serve_run(sb, &all, env)
}

/// The `error: ...` line a run ends with.
fn error_line(run: &Run) -> String {
    run.stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line{run}"))
        .to_owned()
}

/// Asserts that `--check` refuses `args` with an error containing `want`,
/// and that `serve` (on free ports) refuses them with the same error.
fn refused_alike(sb: &Sandbox, args: &[&str], env: &[(&str, &str)], want: &str) {
    let checked = check(sb, args, env);
    assert_eq!(checked.code, Some(1), "{checked}");
    assert_eq!(
        checked.stdout, "",
        "no summary for a refused setup{checked}"
    );
    let error = error_line(&checked);
    assert!(error.contains(want), "expected {want:?}{checked}");
    let mut served_args = FREE_PORTS.to_vec();
    served_args.extend_from_slice(args);
    let served = serve_run(sb, &served_args, env);
    assert_eq!(served.code, Some(1), "{served}");
    assert_eq!(
        error_line(&served),
        error,
        "serve and serve --check give the same error{served}"
    );
}

/// Issue 23: a missing config file was reported as
/// `error: cannot load the config limits.yaml: error: limits.yaml:0:0: ...`:
/// the file named twice, "error" said twice, and a position it has not.
#[test]
fn a_missing_config_file_is_named_once_and_says_what_to_check() {
    let sb = Sandbox::new("check-missing-config");
    let want = "error: cannot load the config: limits.yaml: cannot read: No such file or \
                directory (os error 2) (check the path; `--config` takes a YAML file or a \
                directory of them)";
    refused_alike(&sb, &["--config", "limits.yaml"], &[], want);
    let checked = check(&sb, &["--config", "limits.yaml"], &[]);
    assert_eq!(error_line(&checked), want, "{checked}");
}

/// The `key=value` fields of a summary line.
fn field<'a>(summary: &'a str, key: &str) -> Option<&'a str> {
    summary
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

#[test]
fn a_good_memory_setup_with_mutual_tls_passes_without_binding_its_ports() {
    let sb = Sandbox::new("check-memory");
    sb.write("conf/limits.yaml", CONFIG);
    let certs = TestCerts::generate();
    sb.write("server.pem", &certs.server_cert);
    sb.write("server.key", &certs.server_key);
    sb.write("ca.pem", &certs.ca);
    // Both ports are taken: serving would fail, checking must not bind.
    let grpc = TcpListener::bind("127.0.0.1:0").unwrap();
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let grpc_addr = grpc.local_addr().unwrap().to_string();
    let http_addr = http.local_addr().unwrap().to_string();
    let run = check(
        &sb,
        &[
            "--config",
            "conf",
            "--grpc",
            &grpc_addr,
            "--tls-cert",
            "server.pem",
            "--tls-key",
            "server.key",
            "--tls-client-ca",
            "ca.pem",
        ],
        // The HTTP address through its environment variable.
        &[("TOLLGATE_HTTP", &http_addr)],
    );
    assert!(run.success(), "{run}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line{run}");
    let line = lines[0];
    assert!(line.starts_with("ok: "), "{run}");
    assert_eq!(field(line, "grpc"), Some(grpc_addr.as_str()), "{run}");
    assert_eq!(field(line, "http"), Some(http_addr.as_str()), "{run}");
    assert_eq!(field(line, "transport"), Some("mutual-tls"), "{run}");
    assert_eq!(field(line, "store"), Some("memory"), "{run}");
    assert_eq!(field(line, "namespaces"), Some("1"), "{run}");
    assert_eq!(field(line, "resources"), Some("2"), "{run}");
    assert_eq!(run.stderr, "", "{run}");

    // The same flags really are refused by `serve`, for the taken port.
    let served = serve_run(
        &sb,
        &[
            "--config",
            "conf",
            "--grpc",
            &grpc_addr,
            "--http",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(served.code, Some(1), "{served}");
    assert!(error_line(&served).contains(&grpc_addr), "{served}");
}

#[test]
fn the_bundled_config_passes_and_config_warnings_go_to_stderr() {
    let sb = Sandbox::new("check-bundled");
    let run = check(&sb, &[], &[]);
    assert!(run.success(), "{run}");
    assert_eq!(field(&run.stdout, "config"), Some("bundled"), "{run}");
    assert_eq!(field(&run.stdout, "grpc"), Some("127.0.0.1:8081"), "{run}");

    sb.write(
        "warn.yaml",
        "namespaces:\n  - name: default\n    resources:\n      - { name: api, algorithm: token_bucket, capacity: 10, rate: 1/s, global_limit: 5, hard_limit: 9 }\n",
    );
    let run = check(&sb, &["--config", "warn.yaml"], &[]);
    assert!(run.success(), "{run}");
    assert!(run.stderr.starts_with("warning: "), "{run}");
    assert!(
        run.stderr
            .contains("hard_limit 9 is above the global_limit 5"),
        "{run}"
    );
    assert_eq!(field(&run.stdout, "warnings"), Some("1"), "{run}");
}

#[test]
fn a_good_redis_setup_passes_without_contacting_redis() {
    let sb = Sandbox::new("check-redis");
    sb.write("tollgate.yaml", CONFIG);
    let certs = TestCerts::generate();
    sb.write("ca.pem", &certs.ca);
    sb.write("client.pem", &certs.client_cert);
    sb.write("client.key", &certs.client_key);
    sb.write("password", "hunter2\n");
    // Nothing listens there.
    let url = format!("rediss://:inurl@127.0.0.1:{}/0", free_port());
    let run = check(
        &sb,
        &[
            "--config",
            "tollgate.yaml",
            "--store",
            &url,
            "--store-prefix",
            "team-a:",
            "--redis-ca-file",
            "ca.pem",
            "--redis-cert-file",
            "client.pem",
            "--redis-key-file",
            "client.key",
            "--redis-password-file",
            "password",
        ],
        &[],
    );
    assert!(run.success(), "{run}");
    assert_eq!(field(&run.stdout, "store"), Some("redis"), "{run}");
    assert!(
        !run.stdout.contains("inurl"),
        "the password is not shown{run}"
    );
    // A Redis cluster's seeds parse too.
    let run = check(
        &sb,
        &[
            "--config",
            "tollgate.yaml",
            "--store",
            "redis-cluster://10.0.0.1:6379,10.0.0.2:6379",
        ],
        &[],
    );
    assert!(run.success(), "{run}");
}

/// `serve --check` of `tollgate.yaml` as node `tollgate-0` of cluster
/// `prod` gossiping on `gossip`, plus `extra` flags.
fn check_node(sb: &Sandbox, gossip: &str, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let mut args = vec![
        "--config",
        "tollgate.yaml",
        "--cluster",
        "prod",
        "--node-id",
        "tollgate-0",
        "--gossip",
        gossip,
    ];
    args.extend_from_slice(extra);
    check(sb, &args, env)
}

#[test]
fn a_good_cluster_node_passes_without_binding_its_gossip_port() {
    let sb = Sandbox::new("check-cluster");
    sb.write("tollgate.yaml", CONFIG);
    sb.write("secret", "0123456789abcdef0123456789abcdef\n");
    let gossip = UdpSocket::bind("127.0.0.1:0").unwrap();
    let gossip_addr = gossip.local_addr().unwrap().to_string();
    let run = check_node(
        &sb,
        &gossip_addr,
        &[
            "--cluster-secret-file",
            "secret",
            "--replication",
            "counter",
        ],
        &[],
    );
    assert!(run.success(), "{run}");
    assert_eq!(field(&run.stdout, "store"), Some("replicated"), "{run}");
    assert_eq!(field(&run.stdout, "cluster"), Some("prod"), "{run}");
    assert_eq!(field(&run.stdout, "node"), Some("tollgate-0"), "{run}");
    assert_eq!(field(&run.stdout, "gossip"), Some(gossip_addr.as_str()));

    // An unspecified gossip address with the address peers reach; the
    // secret from the environment.
    let run = check_node(
        &sb,
        "0.0.0.0:7946",
        &["--gossip-advertise", "10.1.2.3:7946"],
        &[("TOLLGATE_CLUSTER_SECRET", "0123456789abcdef")],
    );
    assert!(run.success(), "{run}");
    assert_eq!(field(&run.stdout, "advertise"), Some("10.1.2.3:7946"));
}

#[test]
fn a_config_api_is_not_contacted_and_its_token_and_ca_are_checked() {
    let sb = Sandbox::new("check-config-api");
    sb.write("tollgate.yaml", CONFIG);
    sb.write("token", "read-token\n");
    let certs = TestCerts::generate();
    sb.write("ca.pem", &certs.ca);
    let url = format!("https://127.0.0.1:{}", free_port());
    let run = check(
        &sb,
        &[
            "--config-api",
            &url,
            "--config-api-token-file",
            "token",
            "--config-api-ca",
            "ca.pem",
        ],
        &[],
    );
    assert!(run.success(), "{run}");
    assert!(run.stdout.contains("(not contacted)"), "{run}");
    assert_eq!(field(&run.stdout, "namespaces"), Some("0"), "{run}");

    refused_alike(
        &sb,
        &["--config-api", &url, "--config-api-token-file", "no-token"],
        &[],
        "cannot read --config-api-token-file no-token",
    );
    refused_alike(
        &sb,
        &["--config-api", &url],
        &[],
        "--config-api needs a token",
    );
    refused_alike(
        &sb,
        &[
            "--config-api",
            "ftp://x",
            "--config-api-token-file",
            "token",
        ],
        &[],
        "must be an http:// or https:// URL",
    );

    // Review of issue 23: a user and password in the URL were shown
    // whole (in `/status`, which needs no token, and in the log) and sent
    // as a second `Authorization` header. They are refused, not shown.
    let with_password = format!("https://fleet:hunter2@127.0.0.1:{}", free_port());
    let args = [
        "--config-api",
        &with_password,
        "--config-api-token-file",
        "token",
    ];
    refused_alike(&sb, &args, &[], "the URL holds a user or password");
    let run = check(&sb, &args, &[]);
    assert!(!run.stderr.contains("hunter2"), "{run}");
    assert!(run.stderr.contains("https://***@127.0.0.1:"), "{run}");

    // Review of issue 23: a variable that is not unicode was reported as
    // missing ("needs a token").
    use std::os::unix::ffi::OsStrExt;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args(["serve", "--check", "--config-api", &url])
        .current_dir(&sb.dir)
        .env(
            "TOLLGATE_CONFIG_API_TOKEN",
            std::ffi::OsStr::from_bytes(b"token\xff"),
        );
    let run = common::run_bounded(cmd, vec![], std::time::Duration::from_secs(60));
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        error_line(&run)
            .starts_with("error: TOLLGATE_CONFIG_API_TOKEN is not valid UTF-8: it must hold"),
        "{run}"
    );
}

#[test]
fn bad_flags_are_refused_as_serve_refuses_them() {
    let sb = Sandbox::new("check-flags");
    for args in [
        &["--no-such-flag"][..],
        &["--grpc", "not-an-address"],
        &["--max-connections", "0"],
        &["--tls-cert", "server.pem"],
    ] {
        let checked = check(&sb, args, &[]);
        assert_eq!(checked.code, Some(2), "{checked}");
        let served = serve_run(&sb, args, &[]);
        assert_eq!(served.code, Some(2), "{served}");
        // The same error; only clap's usage line below it differs.
        assert_eq!(
            served.stderr.lines().next(),
            checked.stderr.lines().next(),
            "{served}"
        );
    }
}

#[test]
fn a_bad_config_is_refused_naming_its_place() {
    let sb = Sandbox::new("check-config");
    sb.write(
        "bad.yaml",
        "namespaces:\n  - name: default\n    resources:\n      - { name: api, algorithm: token_bukket, capacity: 1, rate: 1/s }\n",
    );
    refused_alike(&sb, &["--config", "bad.yaml"], &[], "bad.yaml:4:");
    refused_alike(&sb, &["--config", "missing.yaml"], &[], "missing.yaml");
}

#[test]
fn a_config_its_store_cannot_serve_is_refused() {
    let sb = Sandbox::new("check-store-rules");
    sb.write("holds.yaml", HOLDS);
    sb.write("huge.yaml", HUGE);
    sb.write("secret", "0123456789abcdef0123456789abcdef");
    let node = common::NODE_N1;
    // Cluster mode: copy-limited resources, and limits that do not
    // replicate.
    let mut args = vec!["--config", "holds.yaml"];
    args.extend_from_slice(&node);
    refused_alike(
        &sb,
        &args,
        &[],
        "the config cannot run on the replicated store: namespace `default`, resource `sandbox`",
    );
    let mut args = vec!["--config", "huge.yaml"];
    args.extend_from_slice(&node);
    refused_alike(&sb, &args, &[], "`fixed_window` cannot be replicated");
    // The same configs run on the memory store...
    assert!(check(&sb, &["--config", "holds.yaml"], &[]).success());
    assert!(check(&sb, &["--config", "huge.yaml"], &[]).success());
    // ... but not the huge one on Redis (which is never reached: the
    // check needs no connection, and serve refuses it after connecting,
    // so only --check is run here).
    let url = format!("redis://127.0.0.1:{}", free_port());
    let run = check(&sb, &["--config", "huge.yaml", "--store", &url], &[]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        error_line(&run).contains(
            "the config cannot run on the redis store: namespace `default`, resource `api`: limit 9007199254740993 is too large for the Redis store"
        ),
        "{run}"
    );
}

/// Issue 23: a config a cluster cannot serve was refused one resource per
/// run, so fixing a file took as many runs as it had problems. Now `serve
/// --cluster` (and `serve --check`) lists every one, in the config's
/// order, each saying what to change; a domain override is listed only
/// when it is refused for a reason of its own.
#[test]
fn a_cluster_refuses_a_config_listing_every_resource_to_change() {
    let sb = Sandbox::new("check-cluster-all");
    sb.write(
        "mixed.yaml",
        "\
namespaces:
  - name: default
    resources:
      - { name: api, algorithm: token_bucket, capacity: 10, rate: 1/s }
      - { name: sandbox, kind: concurrency, domain_limit: 3 }
      - name: feed
        algorithm: sliding_window
        limit: 100
        window: 1m
        domains: { acme: { limit: 200 } }
      - name: burst
        algorithm: gcra
        rate: 5/s
        domains: { acme: { algorithm: fixed_window, limit: 5, window: 1m } }
      - { name: exact, algorithm: sliding_log, limit: 5, window: 10s }
      - { name: warm, algorithm: token_bucket, capacity: 10, rate: 1/s, initial_tokens: 0 }
",
    );
    sb.write("secret", "0123456789abcdef0123456789abcdef");
    let mut node = vec!["--config", "mixed.yaml"];
    node.extend_from_slice(&common::NODE_N1);
    let want = "\
error: the config cannot run on the replicated store (5 problems, each saying what to change):
  namespace `default`, resource `sandbox`: copy-limited (concurrency) resources need one owner of truth, which this store does not have; remove it from this config, or serve it from a store that keeps copy pools (the Redis store does: --store redis://...)
  namespace `default`, resource `feed`: `sliding_window` cannot be replicated in a gossip cluster; use `token_bucket` or `gcra` (replicated as queue), or serve it from the Redis store
  namespace `default`, resource `burst`, domain `acme`: `fixed_window` cannot be replicated in a gossip cluster; use `token_bucket` or `gcra` (replicated as queue), or serve it from the Redis store
  namespace `default`, resource `exact`: a `sliding_log` is replicated only with `window: 1s` and neither `min_gap` nor `count_rejected`; change it so, use `token_bucket` or `gcra`, or serve it from the Redis store
  namespace `default`, resource `warm`: `initial_tokens` cannot be replicated: every node starts a key full; remove `initial_tokens`, or serve it from the Redis store
";
    let checked = check(&sb, &node, &[]);
    assert_eq!(
        (
            checked.code,
            checked.stdout.as_str(),
            checked.stderr.as_str()
        ),
        (Some(1), "", want),
        "{checked}"
    );
    let mut args = FREE_PORTS.to_vec();
    args.extend_from_slice(&node);
    let served = serve_run(&sb, &args, &[]);
    assert_eq!(served.code, Some(1), "{served}");
    assert!(served.stderr.ends_with(want), "serve refuses alike{served}");
    // The same file on the memory store is fine.
    assert!(check(&sb, &["--config", "mixed.yaml"], &[]).success());
}

/// Review of issue 23: `serve --check` listed what Redis cannot serve
/// sorted by name, without the domain override a problem is in (and
/// dropped only repeats that sorted next to each other), while `serve`,
/// compiling on the Redis store it connected to, listed them in the
/// config's order with the override named. Both now give the same lines.
/// `serve` compiles on Redis when its config comes from a config API
/// (with a file, it refuses before connecting, as --check does); the API
/// keeps namespaces and resources by name, so the file is written so too,
/// and every override resolved, so none here refines a refused limit (one
/// would be listed from the API, told of its resource alone from a file:
/// `Resource::refining`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_serve_check_list_what_redis_cannot_serve_alike() {
    const HUGE_MANY: &str = "\
namespaces:
  - name: alpha
    resources:
      - { name: c, algorithm: fixed_window, limit: 9007199254740993, window: 1m }
  - name: zeta
    resources:
      - name: a
        algorithm: fixed_window
        limit: 10
        window: 1m
        domains:
          acme: { algorithm: fixed_window, limit: 9007199254740993, window: 1m }
          globex: { hard_limit: 3 }
      - { name: b, algorithm: fixed_window, limit: 9007199254740993, window: 1h }
";
    let sb = Sandbox::new("check-redis-alike");
    sb.write("huge.yaml", HUGE_MANY);
    let too_large = "is too large for the Redis store (at most 4503599627370495)";
    let want = format!(
        "\
error: the config cannot run on the redis store (3 problems, each saying what to change):
  namespace `alpha`, resource `c`: limit 9007199254740993 {too_large}
  namespace `zeta`, resource `a`, domain `acme`: limit 9007199254740993 {too_large}
  namespace `zeta`, resource `b`: limit 9007199254740993 {too_large}
"
    );
    let redis = RedisServer::start();
    let url = redis.url();
    let checked = check(&sb, &["--config", "huge.yaml", "--store", &url], &[]);
    assert_eq!(
        (checked.code, checked.stderr.as_str()),
        (Some(1), want.as_str()),
        "{checked}"
    );
    let api = ConfigApi::start(&sb, &common::config_api::sqlite(&sb, "api.db"), &[]);
    let (status, r) = api
        .call(Some(ADMIN), "POST", "/v1/import", Some(HUGE_MANY))
        .await;
    assert_eq!(status, 200, "{r}");
    let token = sb.write("read-token", format!("{READER}\n"));
    let api_url = format!("http://{}", api.addr);
    let served = serve_run(
        &sb,
        &[
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--config-api",
            &api_url,
            "--config-api-token-file",
            token.to_str().unwrap(),
            "--store",
            &url,
        ],
        &[],
    );
    assert_eq!(served.code, Some(1), "{served}");
    assert!(
        served.stderr.ends_with(&want),
        "serve on Redis lists the same lines{served}"
    );
}

/// The same review: the list is in the order the config writes its
/// namespaces and resources, not sorted by name.
#[test]
fn serve_check_lists_what_redis_cannot_serve_in_the_configs_order() {
    let sb = Sandbox::new("check-redis-order");
    sb.write(
        "huge.yaml",
        "\
namespaces:
  - name: zeta
    resources:
      - { name: b, algorithm: fixed_window, limit: 9007199254740993, window: 1h }
      - { name: a, algorithm: fixed_window, limit: 9007199254740993, window: 1h }
  - name: alpha
    resources:
      - { name: c, algorithm: fixed_window, limit: 9007199254740993, window: 1h }
",
    );
    let url = format!("redis://127.0.0.1:{}", free_port());
    let run = check(&sb, &["--config", "huge.yaml", "--store", &url], &[]);
    assert_eq!(run.code, Some(1), "{run}");
    let listed: Vec<&str> = run
        .stderr
        .lines()
        .skip(1)
        .map(|l| l.split(':').next().unwrap())
        .collect();
    assert_eq!(
        listed,
        [
            "  namespace `zeta`, resource `b`",
            "  namespace `zeta`, resource `a`",
            "  namespace `alpha`, resource `c`"
        ],
        "{run}"
    );
}

#[test]
fn bad_tls_files_are_refused_naming_the_file() {
    let sb = Sandbox::new("check-tls");
    sb.write("tollgate.yaml", CONFIG);
    let certs = TestCerts::generate();
    let other = TestCerts::generate();
    sb.write("server.pem", &certs.server_cert);
    sb.write("server.key", &certs.server_key);
    sb.write("other.key", &other.server_key);
    sb.write("ca.pem", &certs.ca);
    sb.write("junk.pem", "not a certificate\n");
    let with = |extra: &[&'static str]| {
        let mut args = vec!["--config", "tollgate.yaml"];
        args.extend_from_slice(extra);
        args
    };
    refused_alike(
        &sb,
        &with(&["--tls-cert", "server.pem", "--tls-key", "other.key"]),
        &[],
        "TLS setup: certificate and key",
    );
    refused_alike(
        &sb,
        &with(&["--tls-cert", "missing.pem", "--tls-key", "server.key"]),
        &[],
        "cannot read certificate missing.pem",
    );
    // Issue 23: the cause was said twice (in the message and as its source).
    let run = check(
        &sb,
        &with(&["--tls-cert", "missing.pem", "--tls-key", "server.key"]),
        &[],
    );
    assert!(
        error_line(&run).ends_with(
            "cannot read certificate missing.pem: No such file or directory (os error 2)"
        ),
        "{run}"
    );
    refused_alike(
        &sb,
        &with(&["--tls-cert", "junk.pem", "--tls-key", "server.key"]),
        &[],
        "certificate junk.pem",
    );
    refused_alike(
        &sb,
        &with(&["--tls-cert", "server.pem", "--tls-key", "server.pem"]),
        &[],
        "private key server.pem",
    );
    refused_alike(
        &sb,
        &with(&[
            "--tls-cert",
            "server.pem",
            "--tls-key",
            "server.key",
            "--tls-client-ca",
            "junk.pem",
        ]),
        &[],
        "client CA junk.pem",
    );
}

#[test]
fn bad_store_urls_and_redis_settings_are_refused() {
    let sb = Sandbox::new("check-redis-bad");
    sb.write("tollgate.yaml", CONFIG);
    let certs = TestCerts::generate();
    sb.write("ca.pem", &certs.ca);
    sb.write("client.pem", &certs.client_cert);
    sb.write("junk.pem", "not a certificate\n");
    let port = free_port().to_string();
    let plain = format!("redis://127.0.0.1:{port}");
    let tls = format!("rediss://127.0.0.1:{port}");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--store", "postgres://db:5432"],
            "unknown scheme `postgres`",
        ),
        (vec!["--store", "localhost:6379"], "bad Redis URL"),
        // Issue 23: `memory` was not among the choices a bad store named.
        (
            vec!["--store", "mem"],
            "bad Redis URL `mem`: expected `memory` (the embedded store), or a URL",
        ),
        (vec!["--store", "redis-cluster://"], "no seed nodes"),
        (
            vec!["--store", &plain, "--store-prefix", "a{b}:"],
            // Issue 23: this was reported as a bad Redis URL.
            "error: bad --store-prefix `a{b}:`: it must not contain `{` or `}`",
        ),
        (
            vec!["--store", &plain, "--redis-ca-file", "ca.pem"],
            "cannot use --store",
        ),
        (
            vec!["--store", &tls, "--redis-ca-file", "junk.pem"],
            "--redis-ca-file junk.pem",
        ),
        (
            vec!["--store", &tls, "--redis-ca-file", "nothere.pem"],
            "cannot read --redis-ca-file nothere.pem",
        ),
        (
            vec!["--store", &tls, "--redis-cert-file", "client.pem"],
            "needs --redis-key-file",
        ),
        (
            vec![
                "--store",
                &tls,
                "--redis-cert-file",
                "client.pem",
                "--redis-key-file",
                "junk.pem",
            ],
            "--redis-key-file junk.pem",
        ),
        (
            vec!["--store", &plain, "--redis-password-file", "nothere"],
            "cannot read the Redis password file nothere",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["--config", "tollgate.yaml"];
        args.extend_from_slice(&extra);
        refused_alike(&sb, &args, &[], want);
    }
}

#[test]
fn a_bad_cluster_secret_or_node_is_refused() {
    let sb = Sandbox::new("check-cluster-bad");
    sb.write("tollgate.yaml", CONFIG);
    sb.write("short", "0123456789\n");
    sb.write("secret", "0123456789abcdef");
    // Node n1 (common::NODE_N1) with its secret in the file `secret`.
    let node = |secret: &'static str| {
        let mut args = vec!["--config", "tollgate.yaml"];
        args.extend_from_slice(&common::NODE_N1[..6]);
        args.extend(["--cluster-secret-file", secret]);
        args
    };
    refused_alike(
        &sb,
        &node("short"),
        &[],
        "the cluster secret is 10 bytes; use at least 16",
    );
    refused_alike(
        &sb,
        &node("nothere"),
        &[],
        "cannot read --cluster-secret-file nothere",
    );
    let mut args = node("secret");
    args.drain(8..);
    refused_alike(&sb, &args, &[], "needs the cluster's secret");
    refused_alike(
        &sb,
        &[
            "--cluster",
            "prod",
            "--gossip",
            "127.0.0.1:0",
            "--cluster-secret-file",
            "secret",
        ],
        &[],
        "needs --node-id",
    );
    // A strategy that is none is refused by the flag's parser, as every
    // other malformed flag is (exit 2), alike by serve and --check.
    let mut args = node("secret");
    args.extend(["--replication", "gossip"]);
    let checked = check(&sb, &args, &[]);
    assert_eq!(checked.code, Some(2), "{checked}");
    assert!(
        checked
            .stderr
            .starts_with("error: invalid value 'gossip' for '--replication <STRATEGY>'"),
        "{checked}"
    );
    let served = serve_run(&sb, &args, &[]);
    assert_eq!(
        (served.code, &served.stderr),
        (Some(2), &checked.stderr),
        "{served}"
    );
    // So is a dissemination that is none.
    let mut args = node("secret");
    args.extend(["--dissemination", "flood"]);
    let served = serve_run(&sb, &args, &[]);
    assert_eq!(served.code, Some(2), "{served}");
    assert!(
        served
            .stderr
            .contains("invalid value 'flood' for '--dissemination")
            && served.stderr.contains("expected origin or epidemic"),
        "{served}"
    );
    let mut args = node("secret");
    args[7] = "0.0.0.0:7946";
    refused_alike(
        &sb,
        &args,
        &[],
        "--gossip 0.0.0.0:7946 is not an address peers can reach",
    );
}

#[test]
fn a_good_trace_export_passes_without_contacting_the_collector() {
    let sb = Sandbox::new("check-otlp");
    sb.write("tollgate.yaml", CONFIG);
    sb.write("ca.pem", TestCerts::generate().ca);
    // No collector runs there, and none is looked up.
    let endpoint = "https://collector.invalid:4317";
    let run = check(
        &sb,
        &[
            "--config",
            "tollgate.yaml",
            "--otlp-endpoint",
            endpoint,
            "--otlp-ca",
            "ca.pem",
        ],
        &[
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=abc"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
        ],
    );
    assert!(run.success(), "{run}");
    assert_eq!(field(run.stdout.trim(), "otlp"), Some(endpoint), "{run}");
}

/// Regression: `serve --check` did not check the trace export at all
/// (`--otlp-endpoint collector:4317`, a missing `--otlp-ca` printed `ok`
/// while `serve` exited 1), and `OTEL_EXPORTER_OTLP_COMPRESSION`, documented
/// as refused, was ignored by both.
#[test]
fn bad_trace_export_settings_are_refused_as_serve_refuses_them() {
    let sb = Sandbox::new("check-otlp-bad");
    sb.write("tollgate.yaml", CONFIG);
    sb.write("ca.pem", TestCerts::generate().ca);
    sb.write("junk.pem", "not a certificate\n");
    let with = |extra: &[&'static str]| {
        let mut args = vec!["--config", "tollgate.yaml"];
        args.extend_from_slice(extra);
        args
    };
    let http = ["--otlp-endpoint", "http://collector:4317"];
    for (args, env, want) in [
        (
            with(&["--otlp-endpoint", "collector:4317"]),
            vec![],
            "cannot export traces to --otlp-endpoint collector:4317: the URL must start with http:// or https://",
        ),
        (
            with(&["--otlp-endpoint", "http://collector:4317", "--otlp-ca", "ca.pem"]),
            vec![],
            "--otlp-ca ca.pem needs an https:// endpoint",
        ),
        (
            with(&["--otlp-endpoint", "https://collector:4317", "--otlp-ca", "missing.pem"]),
            vec![],
            "cannot read --otlp-ca missing.pem",
        ),
        (
            with(&["--otlp-endpoint", "https://collector:4317", "--otlp-ca", "junk.pem"]),
            vec![],
            "--otlp-ca junk.pem: no CERTIFICATE block found",
        ),
        (
            with(&http),
            vec![("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
            "OTEL_EXPORTER_OTLP_COMPRESSION=\"gzip\": compression is not built into tollgate",
        ),
        (
            with(&http),
            vec![("OTEL_EXPORTER_OTLP_HEADERS", "an-api-key-without-its-name")],
            "OTEL_EXPORTER_OTLP_HEADERS (NAME=VALUE,NAME=VALUE): entry 1 is not NAME=VALUE",
        ),
        (
            with(&http),
            vec![("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")],
            "OTEL_EXPORTER_OTLP_TIMEOUT=\"10s\" is not a whole number of milliseconds",
        ),
        (
            with(&http),
            vec![("OTEL_TRACES_SAMPLER", "sometimes")],
            "OTEL_TRACES_SAMPLER=\"sometimes\" is not a sampler tollgate has",
        ),
    ] {
        refused_alike(&sb, &args, &env, want);
    }
    // Export off: the variables are not read, so not refused.
    let run = check(
        &sb,
        &with(&[]),
        &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
    );
    assert!(run.success(), "{run}");
    assert_eq!(field(run.stdout.trim(), "otlp"), None, "{run}");
}
