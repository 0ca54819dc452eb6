//! `tollgate serve` as a real process: listening on free ports, settings
//! from flags and the environment, JSON logs, SIGHUP reload, SIGTERM
//! shutdown releasing holds, the decision log read back by `replay`, and a
//! bad config refused at startup.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Sandbox;
use serde_json::Value;

/// A running `tollgate serve`, killed on drop.
struct Serving {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    logs: Arc<Mutex<Vec<Value>>>,
}

impl Serving {
    /// Starts `tollgate serve --log-format json args...` on free ports and
    /// waits for its "listening" line.
    fn start(dir: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Serving {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.arg("serve")
            .args(["--log-format", "json"])
            .args(args)
            .current_dir(&dir.dir)
            .env_remove("TOLLGATE_CONFIG")
            .env_remove("TOLLGATE_GRPC")
            .env_remove("TOLLGATE_HTTP")
            .env("TOLLGATE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    panic!("a log line that is not JSON: {line}");
                };
                if v["fields"]["message"] == "tollgate listening" {
                    let _ = tx.send(v.clone());
                }
                sink.lock().unwrap().push(v);
            }
        });
        let listening = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no listening line; logs: {:?}", logs.lock().unwrap()));
        let addr = |k: &str| listening["fields"][k].as_str().unwrap().parse().unwrap();
        Serving {
            grpc: addr("grpc"),
            http: addr("http"),
            child,
            logs,
        }
    }

    fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name}");
    }

    /// Sends SIGTERM and returns the exit code.
    fn terminate(mut self) -> (Option<i32>, Vec<Value>) {
        self.signal("TERM");
        let status = self.child.wait().unwrap();
        // The reader thread ends with the pipe; give it a moment to push
        // the last lines.
        for _ in 0..100 {
            let done = self
                .logs
                .lock()
                .unwrap()
                .iter()
                .any(|l| l["fields"]["message"] == "stopped");
            if done {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let logs = self.logs.lock().unwrap().clone();
        (status.code(), logs)
    }

    /// One HTTP/1.1 exchange: (status, body).
    fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut s = TcpStream::connect(self.http).unwrap();
        let body = body.unwrap_or("");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        // Chunked bodies: keep the JSON or text between the size lines.
        let body = if out
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            body.lines()
                .filter(|l| usize::from_str_radix(l.trim(), 16).is_err())
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            body.to_owned()
        };
        (status, body)
    }

    fn json(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, text) = self.http(method, path, body);
        let v =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        (status, v)
    }

    fn poll(&self, what: &str, mut check: impl FnMut(&Serving) -> bool) {
        for _ in 0..1000 {
            if check(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("never happened: {what}");
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    let server = Serving::start(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
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
    let server = Serving::start(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--decision-log",
            log.to_str().unwrap(),
        ],
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
