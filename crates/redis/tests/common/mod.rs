//! What the Redis store's tests share: real redis-server processes on free
//! ports, and the conformance runner that drives the memory store and the
//! Redis store through the same scenario.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_core::{Limit, Mode, Nanos, Request};
use tollgate_redis::{Clock, RedisOptions, RedisStore};
use tollgate_store::{Key, LimitId, MemoryStore, Plan, Store};

/// A time in 2026, so the scripts see realistic absolute times (the core's
/// saturation at zero never comes into play).
pub const T0: Nanos = Nanos::new(1_790_000_000_123_456_789);

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

static PREFIXES: AtomicU64 = AtomicU64::new(0);

/// A prefix no other store in this process uses.
pub fn unique_prefix() -> String {
    format!("t{}:", PREFIXES.fetch_add(1, Ordering::Relaxed))
}

/// A Redis store on `server` taking the caller's clock, with its own
/// prefix and a timeout generous enough for a loaded test machine.
pub async fn caller_clock_store(server: &RedisServer) -> RedisStore {
    let mut o = RedisOptions::new(server.url());
    o.prefix = unique_prefix();
    o.clock = Clock::Caller;
    o.connect.response_timeout = Duration::from_secs(5);
    RedisStore::connect(o).await.unwrap()
}

/// One limit of a scenario: its algorithm, the key it is kept under and
/// whether it is in shadow mode.
#[derive(Clone, Debug)]
pub struct Item {
    pub limit: Arc<Limit>,
    pub key: Key,
    pub shadow: bool,
}

impl Item {
    /// Limit `id` for domain `scope`.
    pub fn new(limit: Limit, id: u64, scope: &str) -> Item {
        Item {
            limit: Arc::new(limit),
            key: Key::new(LimitId(id), scope),
            shadow: false,
        }
    }

    /// The same, in shadow mode.
    pub fn shadow(mut self) -> Item {
        self.shadow = true;
        self
    }
}

/// One request of a scenario: `advance` after the previous step, the
/// request and mode, and which of the scenario's items form its plan
/// (indices, in plan order).
#[derive(Clone, Debug)]
pub struct Step {
    pub advance: Nanos,
    pub request: Request,
    pub mode: Mode,
    pub items: Vec<usize>,
}

impl Step {
    /// A `Try` request for exactly `hits` against every item, `advance`
    /// after the previous step.
    pub fn exactly(advance: Nanos, hits: u64, items: usize) -> Step {
        Step {
            advance,
            request: Request::exactly(hits),
            mode: Mode::Try,
            items: (0..items).collect(),
        }
    }
}

/// Runs `steps` through a fresh memory store and `redis` (which must take
/// the caller's clock), starting at `start`, and panics at the first step
/// whose answers differ, showing both.
pub async fn conform(redis: &RedisStore, items: &[Item], start: Nanos, steps: &[Step]) {
    let memory = MemoryStore::new();
    let mut now = start;
    for (n, step) in steps.iter().enumerate() {
        now = now.saturating_add(step.advance);
        let mut plan = Plan::default().with_affinity(7);
        for &i in &step.items {
            let it = &items[i];
            plan.push(it.key.clone(), Arc::clone(&it.limit), it.shadow);
        }
        let want = memory.decide_now(&plan, now, step.request, step.mode);
        let got = redis.decide(&plan, now, step.request, step.mode).await;
        assert_eq!(
            got,
            want,
            "step {n} at +{} ({step:?}) differs: Redis (left) vs memory (right)\nitems: {items:?}",
            now.saturating_sub(start)
        );
    }
}

/// A runtime for tests that drive async stores from synchronous code
/// (proptest bodies).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Proptest strategies shared by the conformance tests.
pub mod strategies {
    use proptest::prelude::*;
    use tollgate_core::{Mode, Nanos, Request};

    use super::Step;

    /// A step over a plan of `items` items: a random advance up to
    /// `max_advance`, up to `max_hits` hits with a random minimum (now and
    /// then a malformed one), `Acquire` about one time in `acquire_one_in`
    /// (never if 0), and a random non-empty subset of the items.
    pub fn step(
        items: usize,
        max_advance: u64,
        max_hits: u64,
        acquire_one_in: u32,
    ) -> impl Strategy<Value = Step> {
        (
            prop_oneof![3 => Just(0u64), 7 => 0..=max_advance],
            0..=max_hits,
            0..=max_hits.saturating_add(1),
            0..acquire_one_in.max(1),
            proptest::collection::vec(any::<bool>(), items),
        )
            .prop_map(move |(advance, hits, min, acq, mask)| {
                let mut chosen: Vec<usize> = (0..items).filter(|&i| mask[i]).collect();
                if chosen.is_empty() {
                    chosen.push(0);
                }
                // Mostly well-formed requests; min > hits now and then.
                let min_hits = if min > hits && min % 4 != 0 {
                    hits
                } else {
                    min
                };
                let mode = if acquire_one_in > 0 && acq == 0 {
                    Mode::Acquire
                } else {
                    Mode::Try
                };
                Step {
                    advance: Nanos::new(advance),
                    request: Request::between(min_hits, hits),
                    mode,
                    items: chosen,
                }
            })
    }
}

/// Waits until `check` holds, polling; panics after `limit` (a bound on a
/// hung test, not a timing assertion: the behaviour is that it happens).
pub async fn eventually<F, Fut>(limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "condition not reached within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
