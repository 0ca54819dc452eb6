//! Test support (feature `testing`): real redis-server processes of a
//! test's own, on free loopback ports. Used by this crate's tests and by
//! the `tollgate` binary's end-to-end tests.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The redis-server binary: `$TOLLGATE_REDIS_SERVER`, else the one on the
/// PATH. `scripts/test.sh` installs it when missing.
pub fn redis_server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("TOLLGATE_REDIS_SERVER") {
        return PathBuf::from(p);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join("redis-server");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "redis-server not found: install it (scripts/test.sh does) or set TOLLGATE_REDIS_SERVER"
    );
}

/// A free loopback port (the listener is dropped just before use; a clash
/// with another process in that instant makes the start fail loudly).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A redis-server process of the test's own, killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a redis-server on a free port, without persistence.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts one with extra arguments (`--cluster-enabled yes`, ...).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RedisServer {
            child: None,
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new(redis_server_binary())
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ping(self.port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (SIGKILL): everything in it is lost.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again, empty, on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Runs redis-cli-like raw commands: sends `cmd` inline and returns the
    /// first reply line.
    pub fn command(&self, cmd: &str) -> String {
        raw(self.port, cmd)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn raw(port: u16, cmd: &str) -> String {
    use std::io::{BufRead, BufReader, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("{cmd}\r\n").as_bytes()).is_err() {
        return String::new();
    }
    let mut line = String::new();
    let _ = BufReader::new(s).read_line(&mut line);
    line.trim_end().to_owned()
}

fn ping(port: u16) -> bool {
    raw(port, "PING") == "+PONG"
}
