//! `tollgate serve` as a real process: listening on free ports, settings
//! from flags and the environment, JSON logs, SIGHUP reload, SIGTERM
//! shutdown releasing holds, the decision log read back by `replay`, and a
//! bad config refused at startup.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serving::Serving;
use common::Sandbox;

const REQUEST: &str = r#"{"namespace":"default","resource":"api","domain":"acme","hits":1}"#;

#[test]
fn serves_the_bundled_config_on_free_ports_and_stops_on_sigterm_releasing_holds() {
    let dir = Sandbox::new("serve-bundled");
    let server = Serving::start(
        &dir,
        &["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"],
        &[],
    );
    assert_ne!(server.grpc.port(), 8081);
    let (status, body) = server.json("POST", "/v1/request", Some(REQUEST));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["granted"], 1);
    assert_eq!(body["algorithm"], "token_bucket");
    // A hold over HTTP (the bundled `sandbox` resource).
    let (status, body) = server.json(
        "POST",
        "/v1/reserve",
        Some(r#"{"namespace":"default","resource":"sandbox","domain":"acme","copies":2}"#),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["granted"], 2);
    let (status, body) = server.json("GET", "/status", None);
    assert_eq!(status, 200);
    assert_eq!(body["store"], "memory");
    let (code, logs) = server.terminate();
    assert_eq!(code, Some(0), "{logs:?}");
    let stopped = logs
        .iter()
        .find(|l| l["fields"]["message"] == "stopped")
        .unwrap_or_else(|| panic!("{logs:?}"));
    assert_eq!(
        stopped["fields"]["released"], 2,
        "the hold was released at shutdown"
    );
}

#[test]
fn flags_win_over_the_environment() {
    let dir = Sandbox::new("serve-env");
    // The environment names a port that cannot be bound here; the flag
    // wins. TOLLGATE_HTTP has no flag and is used.
    let server = Serving::start(
        &dir,
        &["--grpc", "127.0.0.1:0"],
        &[
            ("TOLLGATE_GRPC", "203.0.113.1:1"),
            ("TOLLGATE_HTTP", "127.0.0.1:0"),
        ],
    );
    assert!(server.grpc.ip().is_loopback());
    assert_eq!(server.http("GET", "/healthz", None).0, 200);
}

const V1: &str = "namespaces:\n  - name: default\n    resources:\n      - { name: api, algorithm: fixed_window, limit: 5, window: 1h, align: first_hit }\n";
const V2: &str = "namespaces:\n  - name: default\n    resources:\n      - { name: api, algorithm: fixed_window, limit: 5, window: 1h, align: first_hit }\n      - { name: new, algorithm: fixed_window, limit: 1, window: 1h, align: first_hit }\n";

#[test]
fn sighup_reloads_and_a_bad_file_is_refused_while_the_old_config_serves() {
    let dir = Sandbox::new("serve-hup");
    let config = dir.write("tollgate.yaml", V1);
    let server = Serving::start_config(
        &dir,
        &config,
        &[
            // Only SIGHUP can cause a reload in this test.
            "--watch-interval-ms",
            "3600000",
        ],
        &[],
    );
    let revision = |s: &Serving| s.json("GET", "/status", None).1["config"]["revision"].clone();
    assert_eq!(revision(&server), 1);
    assert_eq!(
        server.json("POST", "/v1/request", Some(REQUEST)).1["remaining"],
        4
    );
    std::fs::write(&config, V2).unwrap();
    server.signal("HUP");
    server.poll("reloaded on SIGHUP", |s| revision(s) == 2);
    // The unchanged limit kept its count.
    assert_eq!(
        server.json("POST", "/v1/request", Some(REQUEST)).1["remaining"],
        3
    );
    std::fs::write(&config, "namespaces: [").unwrap();
    server.signal("HUP");
    server.poll("the bad file refused", |s| {
        !s.json("GET", "/status", None).1["config"]["last_error"].is_null()
    });
    assert_eq!(revision(&server), 2);
    let (_, metrics) = server.http("GET", "/metrics", None);
    assert!(
        metrics.contains("tollgate_config_last_reload_failed 1"),
        "{metrics}"
    );
    for name in [
        "tollgate_decisions_total{",
        "tollgate_decision_seconds_bucket{",
        "tollgate_sessions ",
        "tollgate_store_transfers_pending ",
        "tollgate_config_reloads_total{outcome=\"ok\"} 1",
        "tollgate_config_reloads_total{outcome=\"error\"} 1",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));
}

#[test]
fn the_decision_log_replays() {
    let dir = Sandbox::new("serve-log");
    let config = dir.write("tollgate.yaml", V1);
    let log = dir.path("decisions.jsonl");
    let server = Serving::start_config(
        &dir,
        &config,
        &["--decision-log", log.to_str().unwrap()],
        &[],
    );
    for _ in 0..7 {
        server.http("POST", "/v1/request", Some(REQUEST));
    }
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));
    let lines = common::json_lines(&std::fs::read_to_string(&log).unwrap());
    assert_eq!(lines.len(), 7);
    let granted = lines
        .iter()
        .filter(|l| l["decision"]["allowed"] == true)
        .count();
    assert_eq!(granted, 5);
    assert_eq!(lines[0]["surface"], "http");
    // The same traffic replayed against the same config decides the same.
    let run = dir.run(&[
        "replay",
        "--config",
        config.to_str().unwrap(),
        "--trace",
        log.to_str().unwrap(),
        "--strict",
    ]);
    assert!(run.success(), "{run}");
    let (events, _) = common::split_events(&run.stdout);
    assert_eq!(events.len(), 7, "{run}");
    let replayed: Vec<bool> = events.iter().map(|e| e["allowed"] == true).collect();
    let logged: Vec<bool> = lines
        .iter()
        .map(|l| l["decision"]["allowed"] == true)
        .collect();
    assert_eq!(replayed, logged);
}

#[test]
fn a_bad_config_at_startup_is_an_error_naming_its_place() {
    let dir = Sandbox::new("serve-bad");
    let config = dir.write(
        "bad.yaml",
        "namespaces:\n  - name: default\n    resources:\n      - { name: api, algorithm: gcra, rate: 10/s, burst: 0 }\n",
    );
    let run = dir.run(&[
        "serve",
        "--config",
        config.to_str().unwrap(),
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
    ]);
    assert!(!run.success(), "{run}");
    assert!(run.stderr.contains("bad.yaml:4:"), "{run}");
}

/// Regression (issue 16, item 11): names went into text logs unescaped, so
/// a name with a newline forged a log line of its choosing. A config
/// warning (at startup) and a refused reload (on SIGHUP) that name such a
/// resource must each be one line, the newline escaped.
#[test]
fn a_name_with_a_newline_cannot_forge_a_text_log_line() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    const FORGED: &str = "2026-01-01T00:00:00Z  INFO tollgate: forged";
    let dir = Sandbox::new("serve-forged-log");
    // hard_limit above global_limit: lowered, with a warning naming the
    // resource.
    let config = dir.write(
        "tollgate.yaml",
        format!(
            "namespaces:\n  - name: default\n    resources:\n      - {{ name: \"api\\n{FORGED}\", algorithm: fixed_window, limit: 5, window: 1h, hard_limit: 100, global_limit: 50 }}\n"
        ),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--log-format", "text", "--config"])
        .arg(&config)
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(["--watch-interval-ms", "3600000"])
        .current_dir(&dir.dir)
        .env("TOLLGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = Arc::clone(&lines);
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    let wait_for = |what: &str| {
        for _ in 0..3000 {
            if lines.lock().unwrap().iter().any(|l| l.contains(what)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no {what:?} line in {:#?}", lines.lock().unwrap());
    };
    wait_for("tollgate listening");
    // A reload refused for a resource with a newline in its name.
    std::fs::write(
        &config,
        format!("namespaces:\n  - name: default\n    resources:\n      - {{ name: \"db\\n{FORGED}\", algorithm: nope }}\n"),
    )
    .unwrap();
    let ok = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    wait_for("config refused");
    let _ = child.kill();
    let _ = child.wait();

    let lines = lines.lock().unwrap();
    assert!(
        !lines.iter().any(|l| l.starts_with(FORGED)),
        "a forged line: {lines:#?}"
    );
    for (what, name) in [("config warning", "api"), ("config refused", "db")] {
        let found: Vec<&String> = lines.iter().filter(|l| l.contains(what)).collect();
        assert_eq!(found.len(), 1, "{lines:#?}");
        // The newline is written as `\n`, inside the one line.
        assert!(
            found[0].contains(&format!("{name}\\n{FORGED}")),
            "{lines:#?}"
        );
    }
}

/// Regression: the SIGTERM and SIGINT handlers were installed only once
/// the ports were bound, so a SIGTERM while `serve` waited at startup (for
/// the config API, for Redis) met the default action, which for PID 1 in a
/// container is to ignore it: the pod hung until the kubelet's SIGKILL.
/// Here (not PID 1) the old server died of the signal, without exit code
/// or log line.
#[test]
fn a_sigterm_while_waiting_for_the_config_api_at_startup_stops_the_server() {
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    // A config API that accepts connections and never answers.
    let api = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", api.local_addr().unwrap());
    let (accepted_tx, accepted) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in api.incoming() {
            held.push(conn);
            let _ = accepted_tx.send(());
        }
    });
    let dir = Sandbox::new("serve-stop-starting");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--log-format", "json", "--config-api", &url])
        .args(["--config-api-startup-ms", "600000"])
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .current_dir(&dir.dir)
        .env_remove("TOLLGATE_CONFIG")
        .env("TOLLGATE_CONFIG_API_TOKEN", "a-read-token")
        .env("TOLLGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    // Connected to the config API: the server is in its startup wait.
    if accepted.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        panic!("the server never asked the config API");
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "still waiting for the config API after SIGTERM: {:?}",
                reader.join()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let lines = reader.join().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}: {lines:#?}");
    let logs: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let stopped = logs
        .iter()
        .find(|l| l["fields"]["message"] == "stopped while starting: exiting without serving")
        .unwrap_or_else(|| panic!("no line says why it exited: {lines:#?}"));
    assert_eq!(stopped["fields"]["signal"], "SIGTERM", "{stopped}");
    assert_eq!(
        stopped["fields"]["waiting_for"], "the config API",
        "{stopped}"
    );
    assert!(
        !logs
            .iter()
            .any(|l| l["fields"]["message"] == "tollgate listening"),
        "{lines:#?}"
    );
}

/// `serve --rls-response-headers` (or `TOLLGATE_RLS_RESPONSE_HEADERS=true`)
/// puts envoyproxy/ratelimit's `RateLimit-*` headers in Envoy RLS answers,
/// as docs/envoy-rls.md §4 says; without it there are none.
#[test]
fn rls_response_headers_are_on_only_when_asked_for() {
    use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
    use tollgate_proto::rls::{descriptor, RateLimitRequest};

    let dir = Sandbox::new("serve-rls-headers");
    let config = common::example("envoy-messaging.yaml");
    let base = ["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0", "--config"];
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for (flag, env, on) in [
        (None, None, false),
        (Some("--rls-response-headers"), None, true),
        (None, Some(("TOLLGATE_RLS_RESPONSE_HEADERS", "true")), true),
    ] {
        let mut args: Vec<&str> = base.to_vec();
        args.push(&config);
        args.extend(flag);
        let server = Serving::start(&dir, &args, &env.into_iter().collect::<Vec<_>>());
        let headers: Vec<(String, String)> = runtime.block_on(async {
            let mut rls = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
                .await
                .unwrap();
            let r = rls
                .should_rate_limit(RateLimitRequest {
                    domain: "messaging".into(),
                    descriptors: vec![descriptor(&[("to_number", "4145551234")])],
                    hits_addend: 1,
                })
                .await
                .unwrap()
                .into_inner();
            r.response_headers_to_add
                .into_iter()
                .map(|h| (h.key, h.value))
                .collect()
        });
        let names: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
        if on {
            assert_eq!(
                names,
                ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
                "{flag:?} {env:?}"
            );
            assert_eq!(headers[0].1, "100");
            assert_eq!(headers[1].1, "99");
        } else {
            assert!(headers.is_empty(), "{headers:?}");
        }
    }
}

/// `GET path` on `server` with `Authorization: Bearer token` when given:
/// (status, body, the whole answer).
fn get_authorized(server: &Serving, path: &str, token: Option<&str>) -> (u16, String, String) {
    get_with_authorization(server, path, token.map(|t| format!("Bearer {t}")))
}

/// `GET path` on `server` with `Authorization: {value}` when given.
fn get_with_authorization(
    server: &Serving,
    path: &str,
    value: Option<String>,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(server.http).unwrap();
    let auth = value
        .map(|v| format!("Authorization: {v}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{auth}\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body, out)
}

/// Issue 22 (review H1) and issue 18 (5): `GET /v1/denied` names the
/// domains refused most (user ids, keys, addresses). It was served to
/// anyone on the data port; it is an admin endpoint now: off without
/// `--admin-tokens-file` (naming the flag), 401 for a missing or wrong
/// token (counted, never logged), and answered for a read token, while
/// `/v1/config` and `/status` stay open.
#[test]
fn top_denied_domains_are_served_only_to_an_admin_token() {
    const TOKEN: &str = "fleet-read-token-0123456789";
    let dir = Sandbox::new("serve-admin-tokens");
    let file = dir.write(
        "limits.yaml",
        "namespaces:\n  - name: shop\n    resources:\n      \
         - { name: api, algorithm: fixed_window, limit: 1, window: 1h }\n",
    );
    let request = r#"{"namespace":"shop","resource":"api","domain":"user-4711","hits":1}"#;

    // No tokens: off, naming the flag; the config and status stay open.
    let server = Serving::start_config(&dir, &file, &[], &[]);
    server.json("POST", "/v1/request", Some(request));
    server.json("POST", "/v1/request", Some(request));
    let (status, body, _) = get_authorized(&server, "/v1/denied", None);
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("--admin-tokens-file"), "{body}");
    assert!(!body.contains("user-4711"), "{body}");
    let (status, _, _) = get_authorized(&server, "/v1/denied", Some(TOKEN));
    assert_eq!(status, 404, "no token opens it when none is configured");
    assert_eq!(server.http("GET", "/v1/config", None).0, 200);
    assert_eq!(server.http("GET", "/status", None).0, 200);
    server.terminate();

    // With tokens: a read token sees the domains.
    let tokens = dir.write(
        "admin-tokens",
        format!("# the config API's console\nread:console:{TOKEN}\n"),
    );
    let server = Serving::start_config(
        &dir,
        &file,
        &["--admin-tokens-file", tokens.to_str().unwrap()],
        &[],
    );
    server.json("POST", "/v1/request", Some(request));
    server.json("POST", "/v1/request", Some(request));
    let (status, body, _) = get_authorized(&server, "/v1/denied", Some(TOKEN));
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(body.trim()).unwrap();
    assert_eq!(
        v["namespaces"]["shop"]["api"][0]["domain"], "user-4711",
        "{v}"
    );
    assert_eq!(v["namespaces"]["shop"]["api"][0]["rejected"], 1, "{v}");
    // Second review of issue 22: the scheme in any case (RFC 9110 §11.1).
    for scheme in ["bearer", "BEARER"] {
        let (status, body, _) =
            get_with_authorization(&server, "/v1/denied", Some(format!("{scheme} {TOKEN}")));
        assert_eq!(status, 200, "{scheme}: {body}");
    }

    // A wrong token and none: 401, counted, the token never logged.
    let (status, body, whole) =
        get_authorized(&server, "/v1/denied", Some("not-a-token-of-this-server"));
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("user-4711"), "{body}");
    assert!(whole.contains("www-authenticate: Bearer"), "{whole}");
    let (status, _, _) = get_authorized(&server, "/v1/denied", None);
    assert_eq!(status, 401);
    assert_eq!(
        server.metric("tollgate_admin_auth_failures_total{reason=\"unknown_token\"}"),
        Some(1.0)
    );
    assert_eq!(
        server.metric("tollgate_admin_auth_failures_total{reason=\"no_token\"}"),
        Some(1.0)
    );
    assert_eq!(server.http("GET", "/status", None).0, 200);
    let (code, logs) = server.terminate();
    assert_eq!(code, Some(0));
    let logs = format!("{logs:?}");
    assert!(
        !logs.contains(TOKEN) && !logs.contains("not-a-token-of-this-server"),
        "a token was logged: {logs}"
    );

    // A bad tokens file stops the start, naming the line, not the token.
    let bad = dir.write("bad-tokens", "owner:x:0123456789abcdef0123\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .arg("--admin-tokens-file")
        .arg(&bad)
        .current_dir(&dir.dir)
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("line 1") && !stderr.contains("0123456789abcdef0123"),
        "{stderr}"
    );
}

/// The decision metrics are counted per surface, name and outcome, exactly,
/// through the per-thread cache of metric handles: granted and rejected
/// apart, hits, near-limit grants, names the config does not know under
/// `_unconfigured`, and the latency histogram per surface.
#[test]
fn decision_metrics_count_each_surface_name_and_outcome_exactly() {
    let dir = Sandbox::new("serve-metrics");
    let config = dir.write(
        "tollgate.yaml",
        "namespaces:
  - name: default
    allow_unconfigured: true
    resources:
      - { name: api, algorithm: token_bucket, capacity: 5, rate: 1/day }
      - { name: wide, algorithm: token_bucket, capacity: 1000, rate: 1/day }
",
    );
    let server = Serving::start_config(&dir, &config, &[], &[]);
    let ask = |resource: &str, hits: u64| {
        let body = format!(
            r#"{{"namespace":"default","resource":"{resource}","domain":"acme","hits":{hits}}}"#
        );
        server.json("POST", "/v1/request", Some(&body)).0
    };
    // 5 grants of 1 (the last leaves nothing: near the limit), 2 refused.
    let statuses: Vec<u16> = (0..7).map(|_| ask("api", 1)).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    // 3 grants of 2 hits on a wide limit: never near it.
    for _ in 0..3 {
        assert_eq!(ask("wide", 2), 200);
    }
    // Names the config does not know: one label for all of them.
    for name in ["x1", "x2", "x3", "x4"] {
        assert_eq!(ask(name, 1), 200);
    }
    let (_, metrics) = server.http("GET", "/metrics", None);
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{series} missing from:\n{metrics}"))
            .parse()
            .unwrap()
    };
    let decisions = |ns: &str, res: &str, outcome: &str| {
        value(&format!(
            r#"tollgate_decisions_total{{surface="http",namespace="{ns}",resource="{res}",outcome="{outcome}"}}"#
        ))
    };
    assert_eq!(decisions("default", "api", "granted"), 5.0);
    assert_eq!(decisions("default", "api", "rejected"), 2.0);
    assert_eq!(decisions("default", "wide", "granted"), 3.0);
    assert_eq!(decisions("_unconfigured", "_unconfigured", "granted"), 4.0);
    assert_eq!(
        value(r#"tollgate_hits_granted_total{namespace="default",resource="api"}"#),
        5.0
    );
    assert_eq!(
        value(r#"tollgate_hits_granted_total{namespace="default",resource="wide"}"#),
        6.0
    );
    assert_eq!(
        value(r#"tollgate_near_limit_total{surface="http",namespace="default",resource="api"}"#),
        1.0
    );
    assert!(
        !metrics.contains(
            r#"tollgate_near_limit_total{surface="http",namespace="default",resource="wide"}"#
        ),
        "a limit never neared has no near-limit series:\n{metrics}"
    );
    assert!(
        !metrics.contains(r#"resource="wide",outcome="rejected""#),
        "no rejection, no rejected series:\n{metrics}"
    );
    assert_eq!(
        value(r#"tollgate_decision_seconds_count{surface="http"}"#),
        14.0
    );
    let (code, _) = server.terminate();
    assert_eq!(code, Some(0));
}

/// The RateLimit header lines of a raw HTTP answer, lower-cased names,
/// in the order sent.
fn ratelimit_lines(raw: &str) -> Vec<String> {
    let head = raw.split("\r\n\r\n").next().unwrap_or_default();
    head.lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("ratelimit"))
        .map(|l| l.trim_end().to_owned())
        .collect()
}

/// `--http-ratelimit-headers` through the binary: each form's exact
/// values on a grant and on a rejection, and no header without the flag.
#[test]
fn http_ratelimit_headers_follow_the_flag() {
    let dir = Sandbox::new("serve-ratelimit-headers");
    // One token a day: a reset is whole days, whatever the test's pace.
    let config = dir.write(
        "tollgate.yaml",
        "namespaces:
  - name: default
    resources:
      - { name: api, algorithm: token_bucket, capacity: 2, rate: 1/day }
",
    );
    let body = r#"{"namespace":"default","resource":"api","domain":"acme","hits":1}"#;
    let ask = |server: &Serving| {
        common::serving::exchange_raw(server.http, "POST", "/v1/request", Some(body)).unwrap()
    };
    let status = |raw: &str| raw.split_whitespace().nth(1).unwrap_or_default().to_owned();

    let ietf = Serving::start_config(&dir, &config, &["--http-ratelimit-headers", "ietf"], &[]);
    let grant = ask(&ietf);
    assert_eq!(status(&grant), "200", "{grant}");
    assert_eq!(
        ratelimit_lines(&grant),
        [
            r#"ratelimit-policy: "default";q=2"#,
            r#"ratelimit: "default";r=1;t=86400"#
        ]
    );
    assert_eq!(status(&ask(&ietf)), "200");
    // Refused: the reset is Retry-After's moment (the next token, a day
    // away), not the bucket full again in two days (second review of
    // issue 18: the draft wants Retry-After no earlier than `t`).
    let refused = ask(&ietf);
    assert_eq!(status(&refused), "429", "{refused}");
    assert_eq!(
        ratelimit_lines(&refused),
        [
            r#"ratelimit-policy: "default";q=2"#,
            r#"ratelimit: "default";r=0;t=86400"#
        ]
    );
    assert!(refused.contains("\r\nretry-after: 86400\r\n"), "{refused}");
    assert_eq!(ietf.terminate().0, Some(0));

    // The environment variable, and the older form.
    let legacy = Serving::start_config(
        &dir,
        &config,
        &[],
        &[("TOLLGATE_HTTP_RATELIMIT_HEADERS", "legacy")],
    );
    assert_eq!(
        ratelimit_lines(&ask(&legacy)),
        [
            "ratelimit-limit: 2",
            "ratelimit-remaining: 1",
            "ratelimit-reset: 86400"
        ]
    );
    ask(&legacy);
    let refused = ask(&legacy);
    assert_eq!(status(&refused), "429", "{refused}");
    assert_eq!(
        ratelimit_lines(&refused),
        [
            "ratelimit-limit: 2",
            "ratelimit-remaining: 0",
            "ratelimit-reset: 86400"
        ]
    );
    assert_eq!(legacy.terminate().0, Some(0));

    // Without the flag: no header on a grant or a rejection.
    let off = Serving::start_config(&dir, &config, &[], &[]);
    for expected in ["200", "200", "429"] {
        let raw = ask(&off);
        assert_eq!(status(&raw), expected, "{raw}");
        assert!(ratelimit_lines(&raw).is_empty(), "{raw}");
    }
    assert_eq!(off.terminate().0, Some(0));

    // A form that does not exist stops the start, naming the choices.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--check", "--http-ratelimit-headers", "draft"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`draft` is not a RateLimit header form: use `off`, `ietf` or `legacy`"),
        "{stderr}"
    );
}

/// `--near-limit-ratio` (here from `TOLLGATE_NEAR_LIMIT_RATIO`) on every
/// surface that counts near-limit grants (HTTP, native gRPC, sessions,
/// Envoy RLS over gRPC and `/json`): at and around the threshold,
/// `floor(limit × ratio)` hits used, exclusive. The limits are token
/// buckets refilling one hit a day, so no calendar window can reset in
/// the middle of the test (a day-long fixed window ends at 00:00 UTC).
///
/// Regression (review of issue 18, finding 2): a request over a
/// shadow-mode limit, let through, is over the limit, not near it; it
/// counted as near before.
#[test]
fn the_near_limit_ratio_applies_on_every_surface() {
    use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
    use tollgate_proto::rls::{RateLimitDescriptor, RateLimitRequest};
    use tollgate_proto::v1::{self, tollgate_client::TollgateClient};
    use tollgate_proto::v1::{session_request, session_response};

    let dir = Sandbox::new("serve-near-limit");
    dir.write(
        "conf/tollgate.yaml",
        "namespaces:
  - name: default
    resources:
      - { name: ten, algorithm: token_bucket, capacity: 10, rate: 1/1d }
      - { name: shadow, algorithm: token_bucket, capacity: 10, rate: 1/1d, shadow_mode: true }
",
    );
    dir.write(
        "conf/envoy.yaml",
        "domain: edge
descriptors:
  - key: user
    rate_limit: { algorithm: token_bucket, capacity: 10, rate: 1/1d }
  - key: tried
    shadow_mode: true
    rate_limit: { algorithm: token_bucket, capacity: 10, rate: 1/1d }
",
    );
    let conf = dir.path("conf");
    // 0.65 of 10: threshold 6; the 7th hit used is the first near it.
    let server = Serving::start_config(&dir, &conf, &[], &[("TOLLGATE_NEAR_LIMIT_RATIO", "0.65")]);
    // The near-limit grants of a surface and namespace, over its
    // resources (a descriptor's resource is named by the config's tree).
    let near = |surface: &str, ns: &str| -> f64 {
        let (_, text) = server.http("GET", "/metrics", None);
        let series = format!(r#"tollgate_near_limit_total{{surface="{surface}",namespace="{ns}","#);
        text.lines()
            .filter(|l| l.starts_with(&series))
            .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
            .sum()
    };
    let http = |resource: &str, domain: &str, hits: u64| {
        let body = format!(
            r#"{{"namespace":"default","resource":"{resource}","domain":"{domain}","hits":{hits}}}"#
        );
        let (status, answer) = server.json("POST", "/v1/request", Some(&body));
        (status, answer["shadowed"] == true)
    };
    // 6 used: at the threshold, not past it.
    assert_eq!(http("ten", "a", 6), (200, false));
    assert_eq!(near("http", "default"), 0.0);
    // 7, then 10: both past it.
    assert_eq!(http("ten", "a", 1), (200, false));
    assert_eq!(near("http", "default"), 1.0);
    assert_eq!(http("ten", "a", 3), (200, false));
    assert_eq!(near("http", "default"), 2.0);
    // Refused: charged nothing, counted nothing.
    assert_eq!(http("ten", "a", 1).0, 429);
    assert_eq!(near("http", "default"), 2.0);
    // A partial grant (min_hits 1 of 10, 4 left after 6) is near by what
    // it left used (10), and counts once: grants, not hits.
    assert_eq!(http("ten", "p", 6), (200, false));
    let (status, answer) = server.json(
        "POST",
        "/v1/request",
        Some(r#"{"namespace":"default","resource":"ten","domain":"p","hits":10,"min_hits":1}"#),
    );
    assert_eq!(
        (status, &answer["granted"]),
        (200, &serde_json::json!(4)),
        "{answer}"
    );
    assert_eq!(near("http", "default"), 3.0);
    // Shadow mode: 9 used is near; the requests over the limit that shadow
    // mode lets through are not.
    assert_eq!(http("shadow", "a", 9), (200, false));
    assert_eq!(near("http", "default"), 4.0);
    assert_eq!(http("shadow", "a", 5), (200, true));
    assert_eq!(near("http", "default"), 4.0, "over the limit, shadowed");
    assert_eq!(http("shadow", "a", 1), (200, false));
    assert_eq!(near("http", "default"), 5.0, "10 used: near");
    assert_eq!(http("shadow", "a", 1), (200, true));
    assert_eq!(near("http", "default"), 5.0, "over the limit, shadowed");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let grpc = format!("http://{}", server.grpc);
    rt.block_on(async {
        let mut native = TollgateClient::connect(grpc.clone()).await.unwrap();
        let ask = |domain: &str, hits: u64| v1::RateRequest {
            namespace: "default".into(),
            resource: "ten".into(),
            domain: domain.into(),
            hits: Some(hits),
            ..Default::default()
        };
        for hits in [6, 1] {
            let a = native.request(ask("b", hits)).await.unwrap().into_inner();
            assert!(a.allowed, "{a:?}");
        }
        // A session's rate requests, alike.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut answers = native
            .session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        for (id, hits) in [(1, 6), (2, 1)] {
            tx.send(v1::SessionRequest {
                id,
                op: Some(session_request::Op::Request(ask("s", hits))),
            })
            .await
            .unwrap();
            let a = answers.message().await.unwrap().unwrap();
            assert!(
                matches!(a.result, Some(session_response::Result::Request(ref r)) if r.allowed),
                "{a:?}"
            );
        }
        drop(tx);
        let mut rls = RateLimitServiceClient::connect(grpc).await.unwrap();
        let descriptor = |key: &str, user: &str| RateLimitDescriptor {
            entries: vec![tollgate_proto::rls::rate_limit_descriptor::Entry {
                key: key.into(),
                value: user.into(),
            }],
            ..Default::default()
        };
        for hits in [6, 1] {
            let a = rls
                .should_rate_limit(RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![descriptor("user", "c")],
                    hits_addend: hits,
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(a.overall_code, 1, "OK: {a:?}");
        }
        // A shadow-mode descriptor: 10 used is near; 1 more, over its
        // limit, is OK and not near.
        for hits in [10, 1] {
            let a = rls
                .should_rate_limit(RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![descriptor("tried", "c")],
                    hits_addend: hits,
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(a.overall_code, 1, "OK: {a:?}");
        }
        // 10 used is near; a refund (`is_negative_hits`) leaving 9 used is
        // no grant near the limit: giving back never brings it nearer.
        for (hits, negative) in [(10, false), (1, true)] {
            let a = rls
                .should_rate_limit(RateLimitRequest {
                    domain: "edge".into(),
                    descriptors: vec![RateLimitDescriptor {
                        is_negative_hits: negative,
                        ..descriptor("user", "e")
                    }],
                    hits_addend: hits,
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(a.overall_code, 1, "OK: {a:?}");
        }
    });
    assert_eq!(near("grpc", "default"), 1.0);
    assert_eq!(near("session", "default"), 1.0);
    assert_eq!(near("rls", "edge"), 3.0);
    // `/json` alike: 6 then 1 more; then a shadowed descriptor over its
    // limit, not counted.
    let json = |key: &str, hits: u32| {
        let body = format!(
            r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"{key}","value":"d"}}]}}],"hitsAddend":{hits}}}"#
        );
        server.json("POST", "/json", Some(&body)).0
    };
    assert_eq!(json("user", 6), 200);
    assert_eq!(near("rls_json", "edge"), 0.0);
    assert_eq!(json("user", 1), 200);
    assert_eq!(near("rls_json", "edge"), 1.0);
    assert_eq!(json("tried", 10), 200);
    assert_eq!(near("rls_json", "edge"), 2.0);
    assert_eq!(json("tried", 1), 200);
    assert_eq!(near("rls_json", "edge"), 2.0);
    assert_eq!(server.terminate().0, Some(0));

    // A ratio past 1 stops the start, naming the value.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--check", "--near-limit-ratio", "1.5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("near-limit ratio `1.5` is more than 1"),
        "{stderr}"
    );
}

/// `--denied-metrics-top`: after refusals of many distinct domains,
/// `/metrics` names only the top ranks of each resource, and none
/// without the flag.
#[test]
fn denied_metrics_name_a_bounded_top() {
    let dir = Sandbox::new("serve-denied-metrics");
    let config = dir.write(
        "tollgate.yaml",
        "namespaces:
  - name: default
    resources:
      - { name: shut, algorithm: deny }
",
    );
    let server = Serving::start_config(&dir, &config, &["--denied-metrics-top", "2"], &[]);
    let refuse = |domain: &str| {
        let body =
            format!(r#"{{"namespace":"default","resource":"shut","domain":"{domain}","hits":1}}"#);
        assert_eq!(server.json("POST", "/v1/request", Some(&body)).0, 429);
    };
    // `bob` 50 times, `carol` 30, then 100 distinct domains once each:
    // the strangers churn through the summary's other counters (none
    // passes 30), and none of them reaches /metrics.
    for _ in 0..50 {
        refuse("bob");
    }
    for _ in 0..30 {
        refuse("carol");
    }
    for i in 0..100 {
        refuse(&format!("stranger-{i}"));
    }
    let (status, text) = server.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tollgate_denied_top"))
        .collect();
    assert_eq!(
        lines,
        [
            r#"tollgate_denied_top_rejected{namespace="default",resource="shut",rank="1"} 50"#,
            r#"tollgate_denied_top_rejected{namespace="default",resource="shut",rank="2"} 30"#,
            r#"tollgate_denied_top_domain{namespace="default",resource="shut",rank="1",domain="bob"} 1"#,
            r#"tollgate_denied_top_domain{namespace="default",resource="shut",rank="2",domain="carol"} 1"#,
        ],
        "{text}"
    );
    assert_eq!(server.terminate().0, Some(0));

    let off = Serving::start_config(&dir, &config, &[], &[]);
    let body = r#"{"namespace":"default","resource":"shut","domain":"bob","hits":1}"#;
    assert_eq!(off.json("POST", "/v1/request", Some(body)).0, 429);
    let (_, text) = off.http("GET", "/metrics", None);
    assert!(!text.contains("tollgate_denied_top"), "{text}");
    assert_eq!(off.terminate().0, Some(0));
}
