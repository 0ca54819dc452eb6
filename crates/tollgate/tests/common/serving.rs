//! A running `tollgate serve` process for end-to-end tests: free ports,
//! JSON logs captured, HTTP exchanges over a raw socket.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tollgate_testing::KillOnDrop;

use super::Sandbox;

/// How long [`Serving::poll`] and [`Serving::gossip`] wait: a bound on a
/// hung test, which a passing one never reaches.
pub const WAIT: Duration = Duration::from_secs(30);

/// The `serve` flags that put gRPC and HTTP on free loopback ports.
pub const FREE_PORTS: [&str; 4] = ["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"];

/// A running `tollgate serve`, killed on drop (by its guard).
pub struct Serving {
    pub child: KillOnDrop,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub logs: Arc<Mutex<Vec<Value>>>,
}

impl Serving {
    /// Starts `tollgate serve --log-format json args...` on free ports and
    /// waits for its "listening" line.
    pub fn start(dir: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Serving {
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
        let mut child = KillOnDrop::spawn(&mut cmd).unwrap();
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

    pub fn signal(&self, name: &str) {
        assert!(
            tollgate_testing::signal(self.child.id(), name),
            "kill -{name}"
        );
    }

    /// Sends SIGTERM and waits at most `limit` for the process to exit:
    /// its exit code, or `None` if it had not exited by then (it is then
    /// killed); and its log.
    pub fn terminate_within(mut self, limit: Duration) -> (Option<i32>, Vec<Value>) {
        self.signal("TERM");
        let deadline = std::time::Instant::now() + limit;
        let code = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status.code();
            }
            if std::time::Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let logs = self.logs.lock().unwrap().clone();
        (code, logs)
    }

    /// Sends SIGTERM and returns the exit code.
    pub fn terminate(mut self) -> (Option<i32>, Vec<Value>) {
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

    /// Starts `tollgate serve --config config` on free gRPC and HTTP ports,
    /// plus `extra` flags and `env`.
    pub fn start_config(
        dir: &Sandbox,
        config: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Serving {
        let mut args = vec!["--config", config.to_str().unwrap()];
        args.extend_from_slice(&FREE_PORTS);
        args.extend_from_slice(extra);
        Serving::start(dir, &args, env)
    }

    /// Starts `tollgate serve` with the sandbox's `tollgate.yaml`, on free
    /// ports, storing in the Redis at `url` (a decision may wait 2 s, for a
    /// loaded test machine), plus `extra` flags and `env`.
    pub fn start_redis(dir: &Sandbox, url: &str, extra: &[&str], env: &[(&str, &str)]) -> Serving {
        let mut args = vec!["--store", url, "--redis-timeout-ms", "2000"];
        args.extend_from_slice(extra);
        Serving::start_config(dir, &dir.path("tollgate.yaml"), &args, env)
    }

    /// Starts one node of cluster `cluster` with gossip on `gossip`, seeded
    /// with `peers`, plus `extra` flags.
    pub fn start_node(
        dir: &Sandbox,
        cluster: &str,
        id: &str,
        gossip: &str,
        peers: &[SocketAddr],
        extra: &[&str],
    ) -> Serving {
        let peers: Vec<String> = peers.iter().map(ToString::to_string).collect();
        let peers = peers.join(",");
        let mut args = vec![
            "--cluster",
            cluster,
            "--node-id",
            id,
            "--gossip",
            gossip,
            "--cluster-secret-file",
            "secret",
        ];
        if !peers.is_empty() {
            args.extend(["--peers", peers.as_str()]);
        }
        args.extend_from_slice(extra);
        Serving::start_config(
            dir,
            Path::new("tollgate.yaml"),
            &args,
            &[("TOLLGATE_LOG", "info,tollgate_replica=debug")],
        )
    }

    /// One HTTP/1.1 exchange: (status, body).
    pub fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        exchange(self.http, method, path, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub fn json(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, text) = self.http(method, path, body);
        let v =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        (status, v)
    }

    /// The gossip address of a `--cluster` server, from its "listening"
    /// line (a field of its own, written with `Display`).
    pub fn gossip(&self) -> SocketAddr {
        // `start` returns when the reader thread has seen the line, which
        // it stores just after: give it a moment.
        let line = tollgate_testing::eventually("the listening line is stored", WAIT, || {
            self.logged("tollgate listening")
                .into_iter()
                .next()
                .ok_or_else(|| format!("logs: {:?}", self.logs.lock().unwrap()))
        });
        line["fields"]["gossip"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no gossip address in {line}"))
    }

    /// The value of one series of `/metrics`, written as Prometheus writes
    /// it (`name` or `name{label="value"}`); `None` when it is absent.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (status, text) = self.http("GET", "/metrics", None);
        assert_eq!(status, 200, "GET /metrics: {text}");
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .find(|(name, _)| *name == series)
            .map(|(_, v)| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{series}: {v:?} is not a number ({e})"))
            })
    }

    /// The log lines whose message is `message`.
    pub fn logged(&self, message: &str) -> Vec<Value> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l["fields"]["message"] == message)
            .cloned()
            .collect()
    }

    /// Polls `check` until it holds (up to [`WAIT`]).
    pub fn poll(&self, what: &str, mut check: impl FnMut(&Serving) -> bool) {
        tollgate_testing::eventually(what, WAIT, || {
            check(self)
                .then_some(())
                .ok_or_else(|| "not yet".to_owned())
        });
    }
}

/// One HTTP/1.1 exchange with `addr`: (status, body), or `Err` when the
/// connection fails or the answer is cut short (a server that died).
pub fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String), String> {
    let out = exchange_raw(addr, method, path, body)?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {out:?}"))?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {out:?}"))?;
    // Chunked bodies: keep the JSON or text between the size lines.
    let body = if head
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
    Ok((status, body))
}

/// One HTTP/1.1 exchange with `addr`: the whole answer as sent, status
/// line and headers included.
pub fn exchange_raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| format!("set_read_timeout: {e}"))?;
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read: {e}"))?;
    Ok(out)
}
