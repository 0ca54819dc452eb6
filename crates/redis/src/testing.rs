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

    /// A plain (synchronous, non-cluster) connection to this server.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Every key of this server that starts with `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.client().scan(&format!("{prefix}*"))
    }

    /// A client for reading what the store wrote, for tests that cannot
    /// name the `redis` crate's types.
    pub fn client(&self) -> Client {
        Client(self.connection())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A synchronous connection to one redis-server, with the reads the
/// tests make.
pub struct Client(redis::Connection);

impl Client {
    /// Every key matching `pattern` (SCAN), sorted.
    pub fn scan(&mut self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .clone()
            .iter(&mut self.0)
            .unwrap()
            .map(|k| k.unwrap())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// A hash's fields and values, read in one command.
    pub fn hgetall(&mut self, key: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        redis::cmd("HGETALL").arg(key).query(&mut self.0).unwrap()
    }

    /// Whether `key` exists.
    pub fn exists(&mut self, key: &str) -> bool {
        redis::cmd("EXISTS").arg(key).query(&mut self.0).unwrap()
    }

    /// Any command whose answer is a list of strings (ZRANGE, SMEMBERS...).
    pub fn strings(&mut self, args: &[&str]) -> Vec<String> {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.0).unwrap()
    }
}

/// A Redis Cluster of three masters (no replicas) started by the test,
/// each a [`RedisServer`] of its own, slots split evenly. Dropping it
/// kills them all.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, gives each a third of the
    /// 16384 slots, introduces them to each other and waits until every
    /// node reports the cluster healthy and complete.
    pub fn start() -> RedisCluster {
        const SLOTS: u16 = 16384;
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let n = nodes.len() as u16;
        for (i, node) in nodes.iter().enumerate() {
            let i = i as u16;
            let (lo, hi) = (SLOTS * i / n, SLOTS * (i + 1) / n);
            let mut addslots = redis::cmd("CLUSTER");
            addslots.arg("ADDSLOTS");
            for slot in lo..hi {
                addslots.arg(slot);
            }
            let _: () = addslots.query(&mut node.connection()).unwrap();
            // Distinct epochs from the start, so no collision has to be
            // resolved before the cluster settles.
            let _: () = redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(i + 1)
                .query(&mut node.connection())
                .unwrap();
        }
        for other in &nodes[1..] {
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(other.port)
                .query(&mut nodes[0].connection())
                .unwrap();
        }
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.settled() {
            assert!(Instant::now() < deadline, "the test cluster did not settle");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    fn settled(&self) -> bool {
        self.nodes.iter().all(|node| {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut node.connection())
                .unwrap_or_default();
            info.contains("cluster_state:ok")
                && info.contains("cluster_known_nodes:3")
                && info.contains("cluster_slots_ok:16384")
        })
    }

    /// `redis-cluster://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C`: every
    /// master as a seed.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis-cluster://{}", seeds.join(","))
    }

    /// The keys of each master that start with `prefix`, by node.
    pub fn keys_by_node(&self, prefix: &str) -> Vec<Vec<String>> {
        self.nodes.iter().map(|n| n.keys(prefix)).collect()
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
