//! A small harness for running the real `tollgate` binary: a temp dir that
//! cleans up after itself, a runner that captures exit code and output, and
//! a `Display` that shows both streams when an assertion fails.

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

pub mod config_api;
pub mod dns;
pub mod live_usage;
pub mod serving;

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

/// The `serve` flags of one gossip-cluster node: cluster `prod`, node
/// `n1`, gossip on a free port, the secret in the sandbox's `secret`.
pub const NODE_N1: [&str; 8] = [
    "--cluster",
    "prod",
    "--node-id",
    "n1",
    "--gossip",
    "127.0.0.1:0",
    "--cluster-secret-file",
    "secret",
];

/// A fresh directory under the system temp dir, removed on drop.
pub struct Sandbox {
    pub dir: PathBuf,
}

impl Sandbox {
    pub fn new(name: &str) -> Sandbox {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-test-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Sandbox { dir }
    }

    /// Writes `contents` to `file` in the sandbox; returns its path.
    pub fn write(&self, file: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.dir.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, contents).unwrap();
        path
    }

    /// Writes `certs`' server certificate and key as `{name}.pem` and
    /// `{name}.key`, and their CA as `ca.pem`; returns the three paths.
    pub fn write_server_tls(
        &self,
        certs: &tollgate_redis::testing::TestCerts,
        name: &str,
    ) -> (PathBuf, PathBuf, PathBuf) {
        let cert = self.write(&format!("{name}.pem"), &certs.server_cert);
        let key = self.write(&format!("{name}.key"), &certs.server_key);
        let ca = self.write("ca.pem", &certs.ca);
        (cert, key, ca)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap()
    }

    /// Runs `tollgate args...` in the sandbox.
    pub fn run(&self, args: &[&str]) -> Run {
        run_in(&self.dir, args, None)
    }

    /// Runs `tollgate args...` in the sandbox, killing it if it has not
    /// exited within `limit` (then its exit code is `None`): for a command
    /// that must refuse, and that would serve forever if it did not.
    pub fn run_within(&self, args: &[&str], limit: std::time::Duration) -> Run {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.args(args)
            .current_dir(&self.dir)
            .env_remove("TOLLGATE_CONFIG");
        run_bounded(cmd, args.iter().map(|s| (*s).to_owned()).collect(), limit)
    }

    /// Runs `tollgate args...` in the sandbox with `stdin` piped in.
    pub fn run_with_stdin(&self, args: &[&str], stdin: &[u8]) -> Run {
        run_in(&self.dir, args, Some(stdin))
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A finished run of the binary.
pub struct Run {
    pub args: Vec<String>,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cut = |s: &str| -> String {
            if s.len() > 4000 {
                let head: String = s.chars().take(4000).collect();
                format!("{head}\n... ({} bytes)", s.len())
            } else {
                s.to_owned()
            }
        };
        write!(
            f,
            "\n$ tollgate {}\nexit: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.args.join(" "),
            self.code,
            cut(&self.stdout),
            cut(&self.stderr)
        )
    }
}

fn run_in(dir: &Path, args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args(args)
        .current_dir(dir)
        // `replay --config` falls back to this variable; the caller's
        // environment must not leak into the test.
        .env_remove("TOLLGATE_CONFIG")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the tollgate binary runs");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        // Written from a thread so a child that fills its stdout pipe before
        // reading all of stdin cannot deadlock the test.
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let out = child.wait_with_output().unwrap();
    Run {
        args: args.iter().map(|s| (*s).to_owned()).collect(),
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Removes the test's own `TOLLGATE_*` and `OTEL_*` variables from what
/// `cmd` inherits: a flag's variable in the test's environment would
/// change what is tested (`OTEL_*` too: `serve` refuses values the trace
/// exporter cannot use).
pub fn without_callers_settings(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("TOLLGATE_") || k.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// `tollgate ARGS` in `dir` with `env` and none of the caller's `TOLLGATE_*`
/// variables (a flag's variable in the test's environment would change
/// what is tested), run as [`run_bounded`] does within a minute.
#[allow(dead_code)] // not every test file runs the binary this way
pub fn run_clean<S: AsRef<str>>(dir: &Path, args: &[S], env: &[(S, S)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args(args.iter().map(AsRef::as_ref)).current_dir(dir);
    without_callers_settings(&mut cmd);
    cmd.envs(env.iter().map(|(k, v)| (k.as_ref(), v.as_ref())));
    let shown = args.iter().map(|a| a.as_ref().to_owned()).collect();
    run_bounded(cmd, shown, std::time::Duration::from_secs(60))
}

/// Runs `cmd` (no stdin) and collects its output, killing it if it has not
/// exited within `limit`: its exit code is then `None` and its stderr ends
/// with a line saying so.
pub fn run_bounded(mut cmd: Command, args: Vec<String>, limit: std::time::Duration) -> Run {
    use std::io::Read;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the tollgate binary runs");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8(bytes).unwrap()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + limit;
    let (code, killed) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status.code(), false);
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = stderr.join().unwrap();
    if killed {
        stderr += &format!("\n(killed: still running after {limit:?})\n");
    }
    Run {
        args,
        code,
        stdout: stdout.join().unwrap(),
        stderr,
    }
}

/// A file of the repository's `examples/` directory.
pub fn example(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(file)
        .display()
        .to_string()
}

/// Splits replay output into its leading JSON event lines and the rest (the
/// summary).
pub fn split_events(stdout: &str) -> (Vec<Value>, Vec<&str>) {
    let mut events = Vec::new();
    let mut lines = stdout.lines().peekable();
    while let Some(line) = lines.peek() {
        if !line.starts_with('{') {
            break;
        }
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("event line is not JSON ({e}): {line}"));
        events.push(v);
        lines.next();
    }
    (events, lines.collect())
}

/// Parses every line of `text` as JSON.
pub fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}
