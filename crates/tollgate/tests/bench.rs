#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `tollgate bench` and `tollgate bench-echo`, end to end: the real binary
//! serves on port 0, the bench drives it briefly, and the JSON summary is
//! checked for behaviour (counts add up, errors are counted, percentiles
//! are ordered, limits are applied), never for speed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tollgate_testing::KillOnDrop;

/// A running `tollgate` server process, killed when dropped (also when a
/// test panics).
struct Server {
    child: KillOnDrop,
    grpc: String,
    http: Option<String>,
}

impl Server {
    /// `tollgate serve` on free ports, with the bundled config and
    /// examples/envoy-messaging.yaml (the `messaging` domain that bench's
    /// RLS defaults name).
    fn serve() -> Server {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let examples = examples.to_str().unwrap();
        Server::start(&[
            "serve",
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--config",
            examples,
        ])
    }

    /// `tollgate bench-echo` on a free port.
    fn echo() -> Server {
        Server::start(&["bench-echo", "--grpc", "127.0.0.1:0"])
    }

    /// Starts `tollgate args...` and waits for its "listening" log line.
    fn start(args: &[&str]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // The caller's environment must not change what the server does.
        for var in [
            "TOLLGATE_CONFIG",
            "TOLLGATE_GRPC",
            "TOLLGATE_HTTP",
            "TOLLGATE_LOG",
            "TOLLGATE_LOG_FORMAT",
        ] {
            cmd.env_remove(var);
        }
        let mut child = KillOnDrop::spawn(&mut cmd).expect("the tollgate binary runs");
        let stderr = child.stderr.take().unwrap();
        let mut server = Server {
            child,
            grpc: String::new(),
            http: None,
        };
        let (tx, rx) = mpsc::channel();
        // Reads stderr to its end, so the server never blocks on a full
        // pipe; the lines before "listening" are kept for the failure
        // message.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    // Nobody listens any more; keep draining.
                    continue;
                }
            }
        });
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(e) => panic!(
                    "`tollgate {}` did not log its address ({e}); stderr:\n{}",
                    args.join(" "),
                    seen.join("\n")
                ),
            };
            if line.contains("tollgate listening") {
                let field = |name: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(name))
                        .map(str::to_owned)
                };
                server.grpc = field("grpc=").expect("the grpc address is logged");
                server.http = field("http=");
                return server;
            }
            seen.push(line);
        }
    }
}

/// Runs `tollgate bench --json ...` briefly against `target`.
fn bench(target: &str, api: &str, extra: &[&str]) -> (Output, Value) {
    let mut args = vec![
        "bench",
        "--target",
        target,
        "--api",
        api,
        "--duration",
        "300ms",
        "--warmup",
        "0s",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("the tollgate binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "`tollgate {}` printed no JSON summary ({e}); exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
            args.join(" "),
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

fn count(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("`{field}` is not a count in {report:#}"))
}

/// What every successful run must satisfy.
fn assert_sane(out: &Output, report: &Value) {
    assert!(
        out.status.success(),
        "exit {:?}; stderr:\n{}\nreport: {report:#}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = count(report, "requests");
    assert!(requests > 0, "{report:#}");
    assert_eq!(count(report, "errors"), 0, "{report:#}");
    assert_eq!(
        count(report, "granted") + count(report, "rejected"),
        requests,
        "{report:#}"
    );
    let l = &report["latency_us"];
    let p = |q: &str| l[q].as_f64().unwrap_or_else(|| panic!("no {q} in {l}"));
    assert!(p("p50") > 0.0, "{l}");
    assert!(p("p50") <= p("p90"), "{l}");
    assert!(p("p90") <= p("p99"), "{l}");
    assert!(p("p99") <= p("p999"), "{l}");
    assert!(p("p999") <= p("max"), "{l}");
    assert!(report["throughput"].as_f64().unwrap() > 0.0, "{report:#}");
}

#[test]
fn native_requests_are_decided_and_counted() {
    let server = Server::serve();
    let (out, report) = bench(
        &server.grpc,
        "native",
        &["--concurrency", "4", "--keys", "20"],
    );
    assert_sane(&out, &report);
    assert_eq!(report["api"], "native");
    assert_eq!(report["mode"], "closed");
    assert_eq!(count(&report, "connections"), 4);

    // One key of `api` (token bucket: capacity 100, 10/s): the server
    // really limits, so no more than the bucket plus its refill during
    // the run is granted.
    let started = Instant::now();
    let (out, report) = bench(
        &server.grpc,
        "native",
        &["--keys", "1", "--concurrency", "2", "--connections", "1"],
    );
    let refill = 10 * (started.elapsed().as_secs() + 1);
    assert_sane(&out, &report);
    assert!(count(&report, "granted") <= 100 + refill, "{report:#}");
}

#[test]
fn zipf_keys_work() {
    let server = Server::serve();
    let (out, report) = bench(
        &server.grpc,
        "native",
        &[
            "--distribution",
            "zipf",
            "--zipf-exponent",
            "1.2",
            "--keys",
            "1000",
            "--resource",
            "search",
        ],
    );
    assert_sane(&out, &report);
    assert_eq!(report["distribution"], "zipf");
}

#[test]
fn rls_requests_are_decided_and_counted() {
    let server = Server::serve();
    let (out, report) = bench(&server.grpc, "rls", &["--concurrency", "8"]);
    assert_sane(&out, &report);
    assert_eq!(report["api"], "rls");

    // examples/envoy-messaging.yaml allows 100 a day per `to_number`: one
    // key gets at most 100 (200 if the run straddles midnight UTC, where
    // the day's window turns).
    let (out, report) = bench(&server.grpc, "rls", &["--keys", "1", "--concurrency", "2"]);
    assert_sane(&out, &report);
    assert!(count(&report, "granted") <= 200, "{report:#}");
}

#[test]
fn http_requests_are_decided_and_counted() {
    let server = Server::serve();
    let http = server.http.clone().expect("serve logs its HTTP address");
    let (out, report) = bench(&http, "http", &["--concurrency", "4", "--keys", "20"]);
    assert_sane(&out, &report);
    assert_eq!(report["api"], "http");

    // As over gRPC, one key of `api` is limited to its bucket and refill.
    let started = Instant::now();
    let (out, report) = bench(&http, "http", &["--keys", "1", "--concurrency", "2"]);
    let refill = 10 * (started.elapsed().as_secs() + 1);
    assert_sane(&out, &report);
    assert!(count(&report, "granted") <= 100 + refill, "{report:#}");
}

#[test]
fn the_echo_server_grants_everything() {
    let echo = Server::echo();
    let pid = echo.child.id().to_string();
    for api in ["rls", "native"] {
        let (out, report) = bench(
            &echo.grpc,
            api,
            &["--concurrency", "8", "--server-pid", &pid],
        );
        assert_sane(&out, &report);
        assert_eq!(
            count(&report, "granted"),
            count(&report, "requests"),
            "{report:#}"
        );
        // Both processes' CPU time is read from /proc.
        if cfg!(target_os = "linux") {
            for side in ["client_cpu", "server_cpu"] {
                let per = report[side]["us_per_request"].as_f64();
                assert!(per.is_some_and(|p| p >= 0.0), "{side}: {report:#}");
            }
        }
    }
}

#[test]
fn an_open_loop_sends_no_more_than_the_offered_rate() {
    let echo = Server::echo();
    let (out, report) = bench(&echo.grpc, "rls", &["--rate", "1000", "--concurrency", "4"]);
    assert_sane(&out, &report);
    assert_eq!(report["mode"], "open");
    // 300 ms at 1000/s: exactly 300 tickets, each sent once at most.
    assert!(count(&report, "requests") <= 300, "{report:#}");
    assert_eq!(
        count(&report, "requests") + count(&report, "unsent"),
        300,
        "{report:#}"
    );
}

#[test]
fn failures_are_counted_and_a_run_where_all_fail_exits_non_zero() {
    let server = Server::serve();
    let (out, report) = bench(
        &server.grpc,
        "native",
        &["--namespace", "no-such-namespace", "--concurrency", "2"],
    );
    assert!(!out.status.success(), "{report:#}");
    let requests = count(&report, "requests");
    assert!(requests > 0, "{report:#}");
    assert_eq!(count(&report, "errors"), requests, "{report:#}");
    let kinds = report["error_kinds"].as_object().unwrap();
    assert!(kinds.keys().any(|k| k.contains("NotFound")), "{report:#}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("every request failed"), "{stderr}");
}

#[test]
fn an_unreachable_target_is_an_error() {
    // Nothing listens there, and no server of another test will.
    let target = tollgate_testing::refused_addr().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "bench",
            "--target",
            &target,
            "--api",
            "rls",
            "--duration",
            "100ms",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot connect"), "{stderr}");
}
