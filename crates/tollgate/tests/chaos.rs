//! The fault-injection suite (docs/reliability.md): seeded schedules of
//! client operations and faults played against real processes, and an
//! invariant checker run once each schedule quiesces.
//!
//! Three families, each a fresh set of processes per schedule:
//!
//! - **redis**: two `tollgate serve --store redis://` on one redis-server
//!   (started with `--enable-debug-command yes`), each through its own TCP
//!   fault proxy (`tollgate_faults::tcp`). Faults: added latency, stalls
//!   longer than the servers' Redis timeout, refused, dropped and reset
//!   connections, `DEBUG SLEEP`, Redis restarted empty (`SHUTDOWN
//!   NOSAVE`), SIGKILL and restart of a server; clients that vanish
//!   mid-call (HTTP requests whose connection closes right after they are
//!   sent, gRPC sessions cut right after a reserve).
//! - **cluster**: two servers on a three-master Redis Cluster, without a
//!   proxy (a client follows `MOVED` redirects and `CLUSTER SLOTS` to the
//!   masters' own ports, past any proxy). Faults: a master stalled with
//!   SIGSTOP/SIGCONT, SIGKILL and restart of a server, vanishing clients.
//! - **gossip**: three `serve --cluster` nodes through a UDP fault mesh
//!   (`tollgate_faults::udp`): loss, duplication, reordering, replay to
//!   the same and to another node, partitions, SIGKILL and restart.
//!
//! Once a schedule's steps ran, the system quiesces (faults off, every
//! client done, killed servers restarted, every server ready), and the
//! checker proves, polling until it holds or a generous deadline passes:
//!
//! - no server exited that the schedule did not kill;
//! - copy pools (Redis): every count equals the copies held by live holds
//!   plus staged transfers, per server and per domain and group; none is
//!   zero or negative; no server that is gone still contributes; and once
//!   every hold is dropped and every transfer expired, nothing is counted
//!   and no contribution is left;
//! - rate limits: Redis admitted at most the limit (exact, no slack) per
//!   life of Redis's data; a gossip cluster's nodes converge on one
//!   count that holds every grant once (never twice, none lost unless a
//!   node died holding it), and admitted at most the capacity per node life
//!   (a partition's documented slack);
//! - memory: each server's pool registry in Redis holds at most the
//!   configured pools, Redis's key count stays under what the schedule
//!   can legitimately create, and a gossip node keeps at most `--max-keys`.
//!
//! Seeds: `TOLLGATE_CHAOS_SEEDS` (`1-200`, `3,17,40`) picks them, else a
//! few per family plus the regression seeds below. `TOLLGATE_CHAOS_FAMILIES`
//! (`redis,cluster,gossip`) picks families. With `TOLLGATE_CHAOS_REPORT`
//! set to a file, each schedule appends one JSON line there
//! (`scripts/chaos.sh` sums them). A failure prints the seed, the steps
//! and every violation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::panic::AssertUnwindSafe;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::serving::{self, Serving};
use common::Sandbox;
use serde_json::{json, Value};
use tollgate_faults::copylog::{self, Violation};
use tollgate_faults::schedule::{self, Call, Family, Fault, FaultTarget, Op, Profile, Step};
use tollgate_faults::tcp::{TcpMode, TcpProxy};
use tollgate_faults::udp::{UdpFaults, UdpMesh};
use tollgate_proto::v1::{
    self, session_request, session_response, tollgate_client::TollgateClient,
};
use tollgate_redis::testing::{Client, RedisCluster, RedisServer};

// ---------------------------------------------------------------------
// Seeds
// ---------------------------------------------------------------------

/// Seeds that found a bug, kept as regression tests: (family, seed, what
/// it found on the code of its day). Issue numbers are issue 16's items.
const REGRESSIONS: &[(&str, u64, &str)] = &[
    (
        "redis",
        2,
        "item 3: seizes of transfer ids nobody issued registered pools in the server's \
         {srv}:pools set (4 for 2 configured pools); and a hold leaked (the copy log counted 3 \
         copies for a server whose sessions held none)",
    ),
    (
        "redis",
        3,
        "item 8: Redis restarted empty (SHUTDOWN NOSAVE), and both servers exited with \
         `resigned from the copy log: this server was declared dead by another`",
    ),
    (
        "redis",
        7,
        "items 1 and 2: copies counted in the copy log for a server whose sessions hold none, \
         left after every hold was dropped",
    ),
    (
        "redis",
        10,
        "a dropped or reset Redis connection during a copy operation made the server resign \
         and exit (`a copy operation's outcome is unknown (Redis gave no answer): broken pipe`, \
         or `... applied after its caller gave up could not be taken back`)",
    ),
    ("redis", 11, "items 1 and 2: copies leaked in both pools"),
    (
        "cluster",
        1,
        "item 3 on a Redis Cluster: 5 pools registered per server for 2 configured",
    ),
    (
        "cluster",
        3,
        "items 1 and 2 on a Redis Cluster: 2 copies leaked while a master was stalled",
    ),
    (
        "gossip",
        1,
        "item 7: a 600-byte domain is never replicated: the nodes disagree on what remains \
         (each enforces the full limit alone)",
    ),
    ("gossip", 2, "item 7: the same, with partitions and loss"),
];

/// Fresh seeds `cargo test` runs per family besides the regressions
/// (more with `scripts/chaos.sh`).
const DEFAULT_SEEDS: std::ops::Range<u64> = 1000..1002;

/// The seeds of `family` to run: `TOLLGATE_CHAOS_SEEDS`, else the
/// defaults and the family's regressions.
fn seeds(family: &str) -> Vec<u64> {
    if let Ok(families) = std::env::var("TOLLGATE_CHAOS_FAMILIES") {
        if !families.split(',').any(|f| f.trim() == family) {
            return Vec::new();
        }
    }
    if let Ok(spec) = std::env::var("TOLLGATE_CHAOS_SEEDS") {
        return parse_seeds(&spec).unwrap_or_else(|e| panic!("TOLLGATE_CHAOS_SEEDS={spec:?}: {e}"));
    }
    let mut out: Vec<u64> = REGRESSIONS
        .iter()
        .filter(|(f, _, _)| *f == family)
        .map(|(_, s, _)| *s)
        .collect();
    out.extend(DEFAULT_SEEDS);
    out.sort_unstable();
    out.dedup();
    out
}

/// `1-200`, `3,17,40`, or both (`1-5,9`).
fn parse_seeds(spec: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map_err(|e| format!("{s:?} is not a seed: {e}"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if b < a || b - a > 1_000_000 {
                    return Err(format!("{part:?} is not a range of seeds"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    Ok(out)
}

/// `TOLLGATE_CHAOS_WITHOUT`: kinds of step to leave out of every
/// schedule, to narrow down what a failing seed needs (`abandon` makes
/// vanishing HTTP clients wait for their answer; the others drop the
/// steps): `abandon`, `session_drop`, `latency`, `stall`, `refuse`,
/// `drop`, `reset`, `sleep`, `restart`, `kill`, `seize_unknown`, `flood`,
/// `gossip`, `partition`.
fn without() -> Vec<String> {
    std::env::var("TOLLGATE_CHAOS_WITHOUT")
        .map(|s| s.split(',').map(|k| k.trim().to_owned()).collect())
        .unwrap_or_default()
}

fn leave_out(steps: Vec<Step>, without: &[String]) -> Vec<Step> {
    let off = |k: &str| without.iter().any(|w| w == k);
    steps
        .into_iter()
        .filter_map(|s| {
            let s = match s {
                Step::Client {
                    server,
                    op,
                    call: Call::Abandon,
                } if off("abandon") => Step::Client {
                    server,
                    op,
                    call: Call::Wait,
                },
                s => s,
            };
            let kind = match &s {
                Step::Client {
                    op: Op::SessionDrop { .. },
                    ..
                } => "session_drop",
                Step::Client {
                    op: Op::SeizeUnknown { .. },
                    ..
                } => "seize_unknown",
                Step::Client {
                    op: Op::Flood { .. },
                    ..
                } => "flood",
                Step::Client { .. } | Step::Pause { .. } => return Some(s),
                Step::Fault(Fault::Latency { .. }) => "latency",
                Step::Fault(Fault::Stall { .. }) => "stall",
                Step::Fault(Fault::Refuse { .. }) => "refuse",
                Step::Fault(Fault::Drop { .. }) => "drop",
                Step::Fault(Fault::Reset { .. }) => "reset",
                Step::Fault(Fault::RedisSleep { .. }) => "sleep",
                Step::Fault(Fault::RedisRestartEmpty { .. }) => "restart",
                Step::Fault(Fault::KillServer { .. } | Fault::RestartServer { .. }) => "kill",
                Step::Fault(Fault::Gossip { .. }) => "gossip",
                Step::Fault(Fault::Partition { .. }) => "partition",
            };
            (!off(kind)).then_some(s)
        })
        .collect()
}

// ---------------------------------------------------------------------
// Reports
// ---------------------------------------------------------------------

/// What one schedule did and found.
#[derive(Default)]
struct Report {
    family: &'static str,
    seed: u64,
    steps: usize,
    /// Faults injected, by kind.
    faults: BTreeMap<String, u64>,
    violations: Vec<Violation>,
    /// (what, largest seen, its bound).
    memory: Vec<(String, u64, u64)>,
}

impl Report {
    fn fault(&mut self, kind: &str, n: u64) {
        if n > 0 {
            *self.faults.entry(kind.to_owned()).or_default() += n;
        }
    }

    fn violate(&mut self, kind: &'static str, detail: String) {
        self.violations.push(Violation { kind, detail });
    }

    fn memory(&mut self, what: &str, seen: u64, bound: u64) {
        if seen > bound {
            // One violation per bound, with the worst sample.
            let detail = format!("{what}: {seen}, over its bound of {bound}");
            let prefix = format!("{what}: ");
            let before = self
                .violations
                .iter()
                .position(|v| v.kind == "memory_over_bound" && v.detail.starts_with(&prefix));
            match before {
                Some(i) => {
                    let worst = self.memory.iter().find(|(w, _, _)| w == what);
                    if worst.is_none_or(|(_, max, _)| seen > *max) {
                        self.violations[i].detail = detail;
                    }
                }
                None => self.violate("memory_over_bound", detail),
            }
        }
        match self.memory.iter_mut().find(|(w, _, _)| w == what) {
            // The bound may grow with the schedule (flooded domains).
            Some(m) => {
                m.1 = m.1.max(seen);
                m.2 = m.2.max(bound);
            }
            None => self.memory.push((what.to_owned(), seen, bound)),
        }
    }

    fn json(&self) -> Value {
        json!({
            "family": self.family,
            "seed": self.seed,
            "steps": self.steps,
            "faults": self.faults,
            "violations": self.violations.iter().map(|v| json!({"kind": v.kind, "detail": v.detail})).collect::<Vec<_>>(),
            "memory": self.memory.iter().map(|(w, m, b)| json!({"what": w, "max": m, "bound": b})).collect::<Vec<_>>(),
        })
    }
}

/// Runs every seed of `family` with `run`, appends each report to
/// `TOLLGATE_CHAOS_REPORT`, and fails listing every seed that broke an
/// invariant (or panicked), with its steps.
fn run_family(family: &'static str, profile: &Profile, run: fn(u64, &[Step]) -> Report) {
    let mut failures = Vec::new();
    let without = without();
    for seed in seeds(family) {
        let steps = leave_out(schedule::generate(seed, profile), &without);
        eprintln!("chaos {family} seed {seed}: {} steps", steps.len());
        let started = Instant::now();
        let report = match std::panic::catch_unwind(AssertUnwindSafe(|| run(seed, &steps))) {
            Ok(r) => r,
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                let mut r = Report {
                    family,
                    seed,
                    steps: steps.len(),
                    ..Report::default()
                };
                r.violate("harness_panic", msg);
                r
            }
        };
        eprintln!(
            "chaos {family} seed {seed}: {} violations, faults {:?}, memory {:?} ({:.1} s)",
            report.violations.len(),
            report.faults,
            report.memory,
            started.elapsed().as_secs_f64()
        );
        for v in &report.violations {
            eprintln!("chaos {family} seed {seed}: {v}");
        }
        if let Ok(path) = std::env::var("TOLLGATE_CHAOS_REPORT") {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("TOLLGATE_CHAOS_REPORT={path}: {e}"));
            writeln!(f, "{}", report.json()).unwrap();
        }
        if !report.violations.is_empty() {
            let list: Vec<String> = report
                .violations
                .iter()
                .map(|v| format!("  - {v}"))
                .collect();
            failures.push(format!(
                "{family} seed {seed} (rerun: TOLLGATE_CHAOS_FAMILIES={family} \
                 TOLLGATE_CHAOS_SEEDS={seed} cargo test -p tollgate --test chaos):\n{}\n  steps: {}",
                list.join("\n"),
                steps
                    .iter()
                    .enumerate()
                    .map(|(i, s)| format!("\n    {i:>3} {s:?}"))
                    .collect::<String>()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "invariant violations:\n{}",
        failures.join("\n\n")
    );
}

// ---------------------------------------------------------------------
// Helpers shared by the families
// ---------------------------------------------------------------------

/// A generous bound for anything the checker waits for.
const SETTLE: Duration = Duration::from_secs(15);

/// Polls `check` until it returns no violation or `SETTLE` passes;
/// returns the last violations.
fn settle(mut check: impl FnMut() -> Vec<Violation>) -> Vec<Violation> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let v = check();
        if v.is_empty() || Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends one HTTP request and closes the connection at once, without
/// reading the answer: a client that vanished mid-call.
fn abandon(addr: SocketAddr, method: &str, path: &str, body: &str) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return;
    };
    let _ = write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = s.flush();
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// One HTTP exchange whose answer is JSON; `None` when it failed.
fn call(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Option<(u16, Value)> {
    let (status, text) = serving::exchange(addr, method, path, body).ok()?;
    let v = serde_json::from_str(text.trim()).unwrap_or(Value::Null);
    Some((status, v))
}

/// A server started by the suite, or the reason it is not running.
struct Proc {
    serving: Option<Serving>,
    /// Killed by the schedule (so its absence is not a violation).
    killed: bool,
    /// Its copy-log id (Redis families).
    id: Option<String>,
}

impl Proc {
    fn running(&self) -> Option<&Serving> {
        self.serving.as_ref()
    }

    /// Whether it exited on its own; takes it out if so, with its last
    /// log lines.
    fn exited(&mut self) -> Option<String> {
        let s = self.serving.as_mut()?;
        let status = s.child.try_wait().ok().flatten()?;
        let last: Vec<String> = s
            .logs
            .lock()
            .unwrap()
            .iter()
            .rev()
            .filter(|l| l["level"] == "ERROR" || l["level"] == "WARN")
            .take(3)
            .map(|l| l["fields"].to_string())
            .collect();
        self.serving = None;
        Some(format!("exit {status}; last warnings and errors: {last:?}"))
    }

    fn kill(&mut self) {
        if let Some(mut s) = self.serving.take() {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
        self.killed = true;
    }
}

/// `serve` flags for the sandbox's `tollgate.yaml` on free ports, plus
/// `flags`, owned.
fn serve_args(flags: &[&str]) -> Vec<String> {
    ["--config", "tollgate.yaml"]
        .iter()
        .chain(&serving::FREE_PORTS)
        .chain(flags)
        .map(|s| (*s).to_owned())
        .collect()
}

/// Starts `tollgate serve` with `args`, retrying a few times: a start may
/// fail while the store is still unreachable (a restart during a fault).
fn start_with_retries(dir: &Sandbox, args: &[String]) -> Option<Serving> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for _ in 0..5 {
        let started = std::panic::catch_unwind(AssertUnwindSafe(|| {
            Serving::start(dir, &args, &[("TOLLGATE_LOG", "info")])
        }));
        if let Ok(s) = started {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    None
}

/// The copy-log id a Redis-backed server logged when it last joined.
fn copy_log_id(s: &Serving) -> Option<String> {
    let deadline = Instant::now() + SETTLE;
    loop {
        if let Some(l) = s.logged("joined the copy log").last() {
            return l["fields"]["server"].as_str().map(str::to_owned);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A metric of a running server; `None` when it cannot be read.
fn metric(s: &Serving, series: &str) -> Option<f64> {
    let (status, text) = serving::exchange(s.http, "GET", "/metrics", None).ok()?;
    if status != 200 {
        return None;
    }
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(name, _)| *name == series)
        .and_then(|(_, v)| v.trim().parse().ok())
}

fn ready(s: &Serving) -> bool {
    matches!(
        serving::exchange(s.http, "GET", "/readyz", None),
        Ok((200, _))
    )
}

// ---------------------------------------------------------------------
// Clients: what they believe they hold
// ---------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Hold {
    id: String,
    server: usize,
    resource: usize,
    domain: usize,
    copies: u64,
}

/// What the clients know, shared with background calls.
#[derive(Default)]
struct Clients {
    holds: Vec<Hold>,
    transfers: Vec<String>,
    /// Rate hits granted per (resource, domain), from answers read.
    granted: BTreeMap<(usize, usize), u64>,
    /// Hits asked by rate calls whose answer was never read, per
    /// (resource, domain): the store may have granted them.
    unknown: BTreeMap<(usize, usize), u64>,
}

type Shared = Arc<Mutex<Clients>>;

fn pick<T: Clone>(v: &[T], slot: u64) -> Option<(usize, T)> {
    if v.is_empty() {
        return None;
    }
    let i = (slot % v.len() as u64) as usize;
    Some((i, v[i].clone()))
}

/// The names of the schedule's indices, per family.
struct Names {
    namespace: &'static str,
    copy: &'static [&'static str],
    rate: &'static [&'static str],
    domains: Vec<String>,
}

impl Names {
    fn domain(&self, i: usize) -> &str {
        &self.domains[i % self.domains.len()]
    }

    /// A JSON body naming hold `h` (its id, namespace, resource and
    /// domain), then the fields in `rest`.
    fn hold_body(&self, h: &Hold, rest: &str) -> String {
        format!(
            r#"{{"hold_id":"{}","namespace":"{}","resource":"{}","domain":"{}",{rest}}}"#,
            h.id,
            self.namespace,
            self.copy[h.resource],
            self.domain(h.domain)
        )
    }
}

/// Carries out one HTTP operation on `addr` (a server's HTTP port) and
/// records what the answer says.
fn http_op(
    addrs: &[Option<SocketAddr>],
    server: usize,
    op: &Op,
    how: Call,
    clients: &Shared,
    n: &Names,
) {
    let ns = n.namespace;
    // (method, path, body), and what to do with a 200 answer.
    enum Then {
        NewHold {
            resource: usize,
            domain: usize,
        },
        Released(Hold),
        Deleted(Hold),
        Transferred(Hold, u64),
        Seized(String),
        Stranger,
        Renewed(Hold),
        /// Resource, domain, hits asked.
        Rate(usize, usize, u64),
    }
    // Calls on a hold go to the server that has it.
    let (method, path, body, then, server) = {
        let c = clients.lock().unwrap();
        match op {
            Op::Reserve {
                resource,
                domain,
                copies,
                min_copies,
                lease_ms,
            } => (
                "POST",
                "/v1/reserve".to_owned(),
                format!(
                    r#"{{"namespace":"{ns}","resource":"{}","domain":"{}","copies":{copies},"min_copies":{min_copies},"lease_ms":{lease_ms}}}"#,
                    n.copy[*resource % n.copy.len()],
                    n.domain(*domain)
                ),
                Then::NewHold {
                    resource: *resource % n.copy.len(),
                    domain: *domain,
                },
                server,
            ),
            Op::Release { hold, copies } => {
                let Some((_, h)) = pick(&c.holds, *hold) else {
                    return;
                };
                let copies = (*copies).min(h.copies);
                (
                    "POST",
                    "/v1/release".to_owned(),
                    n.hold_body(&h, &format!(r#""copies":{copies}"#)),
                    Then::Released(h.clone()),
                    h.server,
                )
            }
            Op::Delete { hold } => {
                let Some((_, h)) = pick(&c.holds, *hold) else {
                    return;
                };
                (
                    "DELETE",
                    format!("/v1/holds/{}", h.id),
                    String::new(),
                    Then::Deleted(h.clone()),
                    h.server,
                )
            }
            Op::Transfer {
                hold,
                copies,
                ttl_ms,
            } => {
                let Some((_, h)) = pick(&c.holds, *hold) else {
                    return;
                };
                let copies = (*copies).min(h.copies);
                (
                    "POST",
                    "/v1/transfer".to_owned(),
                    n.hold_body(&h, &format!(r#""copies":{copies},"ttl_ms":{ttl_ms}"#)),
                    Then::Transferred(h.clone(), copies),
                    h.server,
                )
            }
            Op::Seize { transfer, lease_ms } => {
                let Some((_, t)) = pick(&c.transfers, *transfer) else {
                    return;
                };
                (
                    "POST",
                    "/v1/seize".to_owned(),
                    format!(r#"{{"transfer_id":"{t}","lease_ms":{lease_ms}}}"#),
                    Then::Seized(t),
                    server,
                )
            }
            Op::SeizeUnknown { id } => (
                "POST",
                "/v1/seize".to_owned(),
                format!(r#"{{"transfer_id":"{id:032x}","lease_ms":1000}}"#),
                Then::Stranger,
                server,
            ),
            Op::Renew { hold, lease_ms } => {
                let Some((_, h)) = pick(&c.holds, *hold) else {
                    return;
                };
                (
                    "POST",
                    format!("/v1/holds/{}/renew", h.id),
                    format!(r#"{{"lease_ms":{lease_ms}}}"#),
                    Then::Renewed(h.clone()),
                    h.server,
                )
            }
            Op::Rate {
                resource,
                domain,
                hits,
            } => {
                let r = *resource % n.rate.len();
                let d = *domain % n.domains.len();
                (
                    "POST",
                    "/v1/request".to_owned(),
                    format!(
                        r#"{{"namespace":"{ns}","resource":"{}","domain":"{}","hits":{hits}}}"#,
                        n.rate[r],
                        n.domain(d)
                    ),
                    Then::Rate(r, d, *hits),
                    server,
                )
            }
            _ => return,
        }
    };
    let Some(addr) = addrs.get(server).copied().flatten() else {
        return;
    };
    if how == Call::Abandon {
        if let Then::Rate(r, d, hits) = then {
            *clients.lock().unwrap().unknown.entry((r, d)).or_default() += hits;
        }
        abandon(addr, method, &path, &body);
        return;
    }
    let body = (!body.is_empty()).then_some(body.as_str());
    let Some((status, v)) = call(addr, method, &path, body) else {
        if let Then::Rate(r, d, hits) = then {
            *clients.lock().unwrap().unknown.entry((r, d)).or_default() += hits;
        }
        return;
    };
    let mut c = clients.lock().unwrap();
    let gone = |c: &mut Clients, h: &Hold| c.holds.retain(|x| x.id != h.id);
    match then {
        Then::NewHold { resource, domain } if status == 200 => {
            if let (Some(id), Some(copies)) = (v["hold_id"].as_str(), v["granted"].as_u64()) {
                c.holds.push(Hold {
                    id: id.to_owned(),
                    server,
                    resource,
                    domain,
                    copies,
                });
            }
        }
        Then::Released(h) if status == 200 => match v["still_held"].as_u64() {
            Some(0) | None => gone(&mut c, &h),
            Some(still) => {
                if let Some(x) = c.holds.iter_mut().find(|x| x.id == h.id) {
                    x.copies = still;
                }
            }
        },
        Then::Deleted(h) if status == 200 => gone(&mut c, &h),
        Then::Transferred(h, copies) if status == 200 => {
            if let Some(t) = v["transfer_id"].as_str() {
                c.transfers.push(t.to_owned());
            }
            let left = h.copies.saturating_sub(copies);
            if left == 0 {
                gone(&mut c, &h);
            } else if let Some(x) = c.holds.iter_mut().find(|x| x.id == h.id) {
                x.copies = left;
            }
        }
        Then::Seized(t) => {
            if status == 200 || status == 404 {
                c.transfers.retain(|x| *x != t);
            }
            if status == 200 {
                let resource = v["resource"]
                    .as_str()
                    .and_then(|r| n.copy.iter().position(|x| *x == r));
                let domain = v["domain"]
                    .as_str()
                    .and_then(|d| n.domains.iter().position(|x| x == d));
                if let (Some(id), Some(resource), Some(domain), Some(copies)) = (
                    v["hold_id"].as_str(),
                    resource,
                    domain,
                    v["copies"].as_u64(),
                ) {
                    c.holds.push(Hold {
                        id: id.to_owned(),
                        server,
                        resource,
                        domain,
                        copies,
                    });
                }
            }
        }
        // Any other answer (429, 503 store_unavailable...) granted the
        // caller nothing, though a request that timed out may still be
        // counted by the store (the strict side).
        Then::Rate(r, d, _) if status == 200 => {
            *c.granted.entry((r, d)).or_default() += v["granted"].as_u64().unwrap_or(0);
        }
        Then::Released(h) | Then::Deleted(h) | Then::Transferred(h, _) | Then::Renewed(h)
            if status == 404 =>
        {
            gone(&mut c, &h);
        }
        // Refusals and errors change nothing the clients know.
        _ => {}
    }
}

/// `count` rate requests for new domains `f<first>`, `f<first+1>`...
fn flood(addr: SocketAddr, ns: &str, resource: &str, first: u64, count: u64) {
    for i in first..first + count {
        let body =
            format!(r#"{{"namespace":"{ns}","resource":"{resource}","domain":"f{i}","hits":1}}"#);
        if call(addr, "POST", "/v1/request", Some(&body)).is_none() {
            return;
        }
    }
}

// ---------------------------------------------------------------------
// gRPC sessions
// ---------------------------------------------------------------------

/// A native session: a stream of operations answered in order.
struct Session {
    tx: tokio::sync::mpsc::Sender<v1::SessionRequest>,
    rx: tonic::Streaming<v1::SessionResponse>,
    next: u64,
    /// (resource, domain, copies) held, as the answers said.
    holds: Vec<(usize, usize, u64)>,
}

/// How long a session call may take before the suite gives up on it.
const SESSION_CALL: Duration = Duration::from_secs(10);

impl Session {
    async fn open(grpc: SocketAddr) -> Option<Session> {
        let connect = TollgateClient::connect(format!("http://{grpc}"));
        let mut client = tokio::time::timeout(SESSION_CALL, connect)
            .await
            .ok()?
            .ok()?;
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let stream = client.session(tokio_stream::wrappers::ReceiverStream::new(rx));
        let rx = tokio::time::timeout(SESSION_CALL, stream)
            .await
            .ok()?
            .ok()?
            .into_inner();
        Some(Session {
            tx,
            rx,
            next: 1,
            holds: Vec::new(),
        })
    }

    async fn send(&mut self, op: session_request::Op) -> Option<()> {
        let id = self.next;
        self.next += 1;
        self.tx
            .send(v1::SessionRequest { id, op: Some(op) })
            .await
            .ok()
    }

    /// One operation; `None` when the session broke.
    async fn call(&mut self, op: session_request::Op) -> Option<session_response::Result> {
        self.send(op).await?;
        let answer = tokio::time::timeout(SESSION_CALL, self.rx.message())
            .await
            .ok()?
            .ok()??;
        answer.result
    }
}

// ---------------------------------------------------------------------
// The Redis families
// ---------------------------------------------------------------------

const REDIS_CONFIG: &str = r#"
namespaces:
  - name: chaos
    resources:
      - name: db
        kind: concurrency
        domain_limit: 4
        global_limit: 8
        groups:
          - { name: east, members: [d0, d1], limit: 6 }
      - name: box
        kind: concurrency
        domain_limit: 3
      - { name: api, algorithm: sliding_log, limit: 10, window: 1h }
"#;

/// The rate limit of `api`, exact in Redis.
const API_LIMIT: u64 = 10;

fn redis_names() -> Names {
    Names {
        namespace: "chaos",
        copy: &["db", "box"],
        rate: &["api"],
        domains: (0..3).map(|i| format!("d{i}")).collect(),
    }
}

fn redis_profile(family: Family) -> Profile {
    Profile {
        family,
        servers: 2,
        redis_nodes: if family == Family::Redis { 1 } else { 3 },
        copy_resources: 2,
        rate_resources: 1,
        domains: 3,
        steps: 40,
    }
}

/// The Redis a family runs on.
enum Store {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Store {
    fn nodes(&self) -> Vec<&RedisServer> {
        match self {
            Store::Single(r) => vec![r],
            Store::Cluster(c) => c.nodes.iter().collect(),
        }
    }
}

/// Servers on Redis, proxies between them, the clients' knowledge.
struct RedisWorld {
    dir: Sandbox,
    store: Store,
    /// One per server (none on a cluster).
    proxies: Vec<Arc<TcpProxy>>,
    /// Bumped by every proxy fault, so a fault's end does not end a later
    /// one.
    generations: Arc<Vec<AtomicU64>>,
    servers: Vec<Proc>,
    clients: Shared,
    sessions: Vec<Session>,
    rt: tokio::runtime::Runtime,
    background: Vec<std::thread::JoinHandle<()>>,
    /// When the last fault that makes Redis unreachable ends: such faults
    /// never overlap, so no server goes a whole heartbeat TTL without
    /// Redis (which would make it resign, as documented).
    outage_until: Instant,
    /// When the last fault ended (or ends).
    last_fault: Instant,
    data_losses: u64,
    lives: u64,
    /// Domains flooded so far (each may leave a rate key for its window).
    flooded: u64,
    names: Names,
    report: Report,
}

/// The servers' Redis timeout: stalls last longer.
const REDIS_TIMEOUT_MS: u64 = 300;

/// The servers' heartbeat TTL: longer than any outage a schedule makes
/// (stalls of at most 1.5 s, never overlapping), so a server that resigns
/// does so for a reason the suite did not design. Once a schedule ends,
/// the checker lets one TTL pass after the last Redis fault before it
/// looks, so a server that is going to notice something has.
const HEARTBEAT_TTL_MS: u64 = 3000;

impl RedisWorld {
    fn new(family: Family, seed: u64) -> RedisWorld {
        let name = if family == Family::Redis {
            "chaos-redis"
        } else {
            "chaos-cluster"
        };
        let dir = Sandbox::new(name);
        dir.write("tollgate.yaml", REDIS_CONFIG);
        let store = match family {
            Family::Redis => {
                Store::Single(RedisServer::start_with(&["--enable-debug-command", "yes"]))
            }
            _ => Store::Cluster(RedisCluster::start()),
        };
        let proxies = match &store {
            Store::Single(r) => (0..2)
                .map(|_| {
                    let target: SocketAddr = format!("127.0.0.1:{}", r.port).parse().unwrap();
                    Arc::new(TcpProxy::start(target).unwrap())
                })
                .collect(),
            Store::Cluster(_) => Vec::new(),
        };
        let mut w = RedisWorld {
            dir,
            store,
            proxies,
            generations: Arc::new((0..2).map(|_| AtomicU64::new(0)).collect()),
            servers: Vec::new(),
            clients: Shared::default(),
            sessions: Vec::new(),
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap(),
            background: Vec::new(),
            outage_until: Instant::now(),
            last_fault: Instant::now(),
            data_losses: 0,
            lives: 0,
            flooded: 0,
            names: redis_names(),
            report: Report {
                family: if family == Family::Redis {
                    "redis"
                } else {
                    "cluster"
                },
                seed,
                ..Report::default()
            },
        };
        for i in 0..2 {
            w.servers.push(Proc {
                serving: None,
                killed: false,
                id: None,
            });
            w.start_server(i);
        }
        w
    }

    fn store_url(&self, server: usize) -> String {
        match &self.store {
            Store::Single(_) => format!("redis://{}/", self.proxies[server].addr()),
            Store::Cluster(c) => c.url(),
        }
    }

    fn start_server(&mut self, i: usize) {
        let args = serve_args(&[
            "--store",
            &self.store_url(i),
            "--redis-timeout-ms",
            &REDIS_TIMEOUT_MS.to_string(),
            "--redis-connect-timeout-ms",
            "300",
            "--redis-max-reconnect-delay-ms",
            "200",
            "--heartbeat-ttl-ms",
            &HEARTBEAT_TTL_MS.to_string(),
        ]);
        let serving = start_with_retries(&self.dir, &args);
        let id = serving.as_ref().and_then(copy_log_id);
        if serving.is_none() {
            self.report.violate(
                "server_start",
                format!("server {i} did not start (5 attempts)"),
            );
        }
        self.lives += 1;
        self.servers[i] = Proc {
            serving,
            killed: false,
            id,
        };
    }

    fn http(&self, server: usize) -> Option<SocketAddr> {
        self.servers[server].running().map(|s| s.http)
    }

    fn proxies_of(&self, t: FaultTarget) -> Vec<usize> {
        match t {
            FaultTarget::One(i) => vec![i % self.proxies.len().max(1)],
            FaultTarget::All => (0..self.proxies.len()).collect(),
        }
    }

    /// Waits until the last outage ended (plus a breath), so outages never
    /// add up to a heartbeat TTL.
    fn wait_outage(&self) {
        let until = self.outage_until + Duration::from_millis(300);
        let now = Instant::now();
        if until > now {
            std::thread::sleep(until - now);
        }
    }

    /// Sets `mode` on proxy `p` for `ms`, then back to pass unless another
    /// fault took the proxy meanwhile.
    fn proxy_fault(&mut self, p: usize, mode: TcpMode, ms: u64) {
        if self.proxies.is_empty() {
            return;
        }
        let generation = self.generations[p].fetch_add(1, Ordering::SeqCst) + 1;
        self.proxies[p].set_mode(mode);
        let proxy = Arc::clone(&self.proxies[p]);
        let generations = Arc::clone(&self.generations);
        self.background.push(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            if generations[p].load(Ordering::SeqCst) == generation {
                proxy.set_mode(TcpMode::Pass);
            }
        }));
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Pause { ms } => std::thread::sleep(Duration::from_millis(*ms)),
            Step::Fault(f) => self.fault(f),
            Step::Client { server, op, call } => self.client(*server, op, *call),
        }
    }

    fn fault(&mut self, f: &Fault) {
        let lasts = match f {
            Fault::Latency { for_ms, .. }
            | Fault::Stall { for_ms, .. }
            | Fault::Refuse { for_ms, .. } => *for_ms,
            Fault::RedisSleep { ms, .. } => *ms,
            _ => 0,
        };
        self.last_fault = self
            .last_fault
            .max(Instant::now() + Duration::from_millis(lasts));
        match f {
            Fault::Latency { target, ms, for_ms } => {
                for p in self.proxies_of(*target) {
                    self.proxy_fault(p, TcpMode::Latency(Duration::from_millis(*ms)), *for_ms);
                }
            }
            Fault::Stall { target, for_ms } | Fault::Refuse { target, for_ms } => {
                self.wait_outage();
                let mode = if matches!(f, Fault::Stall { .. }) {
                    TcpMode::Stall
                } else {
                    TcpMode::Refuse
                };
                for p in self.proxies_of(*target) {
                    self.proxy_fault(p, mode, *for_ms);
                }
                self.outage_until = Instant::now() + Duration::from_millis(*for_ms);
            }
            Fault::Drop { target } => {
                for p in self.proxies_of(*target) {
                    self.proxies[p].drop_all();
                }
            }
            Fault::Reset { target } => {
                for p in self.proxies_of(*target) {
                    self.proxies[p].reset_all();
                }
            }
            Fault::RedisSleep { node, ms } => {
                self.wait_outage();
                let nodes = self.store.nodes();
                let port = nodes[node % nodes.len()].port;
                self.report.fault("redis_stall", 1);
                let ms = *ms;
                let single = matches!(self.store, Store::Single(_));
                self.background.push(std::thread::spawn(move || {
                    if single {
                        debug_sleep(port, ms);
                    } else {
                        sigstop(port, ms);
                    }
                }));
                self.outage_until = Instant::now() + Duration::from_millis(ms);
            }
            Fault::RedisRestartEmpty { .. } => {
                self.wait_outage();
                if let Store::Single(r) = &mut self.store {
                    self.report.fault("redis_restart_empty", 1);
                    let _ = r.command("SHUTDOWN NOSAVE");
                    r.restart();
                    self.data_losses += 1;
                }
                self.outage_until = Instant::now();
            }
            Fault::KillServer { server } => {
                self.report.fault("server_kill", 1);
                self.servers[*server].kill();
            }
            Fault::RestartServer { server } => {
                if self.servers[*server].serving.is_none() {
                    if let Some(p) = self.proxies.get(*server) {
                        // A server cannot start while its Redis is cut.
                        self.generations[*server].fetch_add(1, Ordering::SeqCst);
                        p.set_mode(TcpMode::Pass);
                    }
                    self.start_server(*server);
                }
            }
            Fault::Gossip { .. } | Fault::Partition { .. } => {}
        }
    }

    fn client(&mut self, server: usize, op: &Op, how: Call) {
        match op {
            Op::SessionOpen => {
                let Some(s) = self.servers[server].running() else {
                    return;
                };
                let grpc = s.grpc;
                if let Some(session) = self.rt.block_on(Session::open(grpc)) {
                    self.sessions.push(session);
                }
            }
            Op::SessionReserve {
                session,
                resource,
                domain,
                copies,
            } => {
                let Some(i) = self.session_slot(*session) else {
                    return;
                };
                let r = *resource % self.names.copy.len();
                let op = session_request::Op::Reserve(v1::ReserveRequest {
                    namespace: self.names.namespace.into(),
                    resource: self.names.copy[r].into(),
                    domain: self.names.domain(*domain).into(),
                    copies: *copies,
                    min_copies: None,
                    lease_ms: None,
                });
                let s = &mut self.sessions[i];
                match self.rt.block_on(s.call(op)) {
                    Some(session_response::Result::Reserve(v)) if v.granted > 0 => {
                        s.holds.push((r, *domain, v.granted));
                    }
                    Some(_) => {}
                    None => {
                        self.sessions.swap_remove(i);
                    }
                }
            }
            Op::SessionRelease { session, copies }
            | Op::SessionTransfer {
                session, copies, ..
            } => {
                let Some(i) = self.session_slot(*session) else {
                    return;
                };
                let s = &mut self.sessions[i];
                let Some(&(r, d, held)) = s.holds.first() else {
                    return;
                };
                let copies = (*copies).min(held);
                let (ns, res, dom) = (
                    self.names.namespace.to_owned(),
                    self.names.copy[r].to_owned(),
                    self.names.domain(d).to_owned(),
                );
                let request = match op {
                    Op::SessionTransfer { ttl_ms, .. } => {
                        session_request::Op::Transfer(v1::TransferRequest {
                            namespace: ns,
                            resource: res,
                            domain: dom,
                            copies,
                            groups: vec![],
                            ttl_ms: *ttl_ms,
                            hold_id: String::new(),
                        })
                    }
                    _ => session_request::Op::Release(v1::ReleaseRequest {
                        namespace: ns,
                        resource: res,
                        domain: dom,
                        copies,
                        groups: vec![],
                        hold_id: String::new(),
                    }),
                };
                match self.rt.block_on(s.call(request)) {
                    Some(
                        answer @ (session_response::Result::Release(_)
                        | session_response::Result::Transfer(_)),
                    ) => {
                        if let session_response::Result::Transfer(t) = answer {
                            self.clients.lock().unwrap().transfers.push(t.transfer_id);
                        }
                        s.holds[0].2 -= copies;
                        if s.holds[0].2 == 0 {
                            s.holds.remove(0);
                        }
                    }
                    Some(_) => {}
                    None => {
                        self.sessions.swap_remove(i);
                    }
                }
            }
            Op::SessionSeize { session, transfer } => {
                let Some(i) = self.session_slot(*session) else {
                    return;
                };
                let Some((_, t)) = pick(&self.clients.lock().unwrap().transfers, *transfer) else {
                    return;
                };
                let s = &mut self.sessions[i];
                let op = session_request::Op::Seize(v1::SeizeRequest {
                    transfer_id: t.clone(),
                    lease_ms: None,
                });
                match self.rt.block_on(s.call(op)) {
                    Some(session_response::Result::Seize(v)) => {
                        self.clients.lock().unwrap().transfers.retain(|x| *x != t);
                        let r = self.names.copy.iter().position(|x| *x == v.resource);
                        let d = self.names.domains.iter().position(|x| *x == v.domain);
                        if let (Some(r), Some(d)) = (r, d) {
                            s.holds.push((r, d, v.copies));
                        }
                    }
                    Some(_) => {}
                    None => {
                        self.sessions.swap_remove(i);
                    }
                }
            }
            Op::SessionClose { session } => {
                let Some(i) = self.session_slot(*session) else {
                    return;
                };
                let mut s = self.sessions.swap_remove(i);
                self.rt
                    .block_on(s.call(session_request::Op::Close(v1::Close {})));
            }
            Op::SessionDrop { session } => {
                let Some(i) = self.session_slot(*session) else {
                    return;
                };
                let mut s = self.sessions.swap_remove(i);
                let op = session_request::Op::Reserve(v1::ReserveRequest {
                    namespace: self.names.namespace.into(),
                    resource: self.names.copy[0].into(),
                    domain: self.names.domain(0).into(),
                    copies: 1,
                    min_copies: None,
                    lease_ms: None,
                });
                // Sent, then the stream and its connection are dropped
                // without waiting for the answer.
                self.rt.block_on(s.send(op));
                drop(s);
                self.report.fault("client_vanished", 1);
            }
            Op::Flood {
                resource,
                first,
                count,
            } => {
                let Some(addr) = self.http(server) else {
                    return;
                };
                flood(
                    addr,
                    self.names.namespace,
                    self.names.rate[*resource % self.names.rate.len()],
                    *first,
                    *count,
                );
            }
            _ => {
                if self.http(server).is_none() {
                    return;
                }
                if how == Call::Abandon {
                    self.report.fault("client_vanished", 1);
                }
                let addrs: Vec<Option<SocketAddr>> =
                    (0..self.servers.len()).map(|i| self.http(i)).collect();
                let clients = Arc::clone(&self.clients);
                let op = op.clone();
                if how == Call::Background {
                    let names = redis_names();
                    self.background.push(std::thread::spawn(move || {
                        http_op(&addrs, server, &op, how, &clients, &names);
                    }));
                } else {
                    http_op(&addrs, server, &op, how, &clients, &self.names);
                }
            }
        }
    }

    fn session_slot(&self, slot: u64) -> Option<usize> {
        (!self.sessions.is_empty()).then(|| (slot % self.sessions.len() as u64) as usize)
    }

    /// Faults off, clients done, every server running, ready and in the
    /// copy log's live set.
    fn quiesce(&mut self) {
        for (i, p) in self.proxies.iter().enumerate() {
            self.generations[i].fetch_add(1, Ordering::SeqCst);
            p.set_mode(TcpMode::Pass);
        }
        for t in self.background.drain(..) {
            let _ = t.join();
        }
        // Time for servers to notice what the last fault did (a heartbeat
        // finding the copy log gone, say): not an assertion, a settling.
        let settled =
            self.outage_until.max(self.last_fault) + Duration::from_millis(HEARTBEAT_TTL_MS + 500);
        if let Some(wait) = settled.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        self.check_exits();
        for i in 0..self.servers.len() {
            if self.servers[i].serving.is_none() {
                self.start_server(i);
            }
        }
        let v = settle(|| {
            self.servers
                .iter()
                .enumerate()
                .filter_map(|(i, p)| match p.running() {
                    Some(s) if ready(s) => None,
                    _ => Some(Violation {
                        kind: "not_ready",
                        detail: format!("server {i} is not ready (/readyz) once faults ended"),
                    }),
                })
                .collect()
        });
        self.report.violations.extend(v);
        // A server that joined the copy log again (after Redis lost it)
        // has a new id.
        for p in &mut self.servers {
            if let Some(id) = p.running().and_then(|s| {
                let last = s.logged("joined the copy log").last().cloned();
                last.and_then(|l| l["fields"]["server"].as_str().map(str::to_owned))
            }) {
                p.id = Some(id);
            }
        }
        // Every running server heartbeats in the live set.
        let v = settle(|| {
            let alive = self.alive();
            self.servers
                .iter()
                .enumerate()
                .filter_map(|(i, p)| {
                    let id = p.running().and(p.id.as_ref())?;
                    (!alive.contains(id)).then(|| Violation {
                        kind: "not_ready",
                        detail: format!(
                            "server {i} ({id}) is not in the copy log's live set once faults ended"
                        ),
                    })
                })
                .collect()
        });
        self.report.violations.extend(v);
        self.check_exits();
    }

    /// The ids in the copy log's live set (`{srv}:alive`), read on the
    /// node that has the key (in a cluster, the others would redirect).
    fn alive(&self) -> Vec<String> {
        const ALIVE: &str = "tollgate:{srv}:alive";
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut out = Vec::new();
            for node in self.store.nodes() {
                let mut c = node.client();
                if !c.scan(ALIVE).is_empty() {
                    out.extend(c.strings(&["ZRANGE", ALIVE, "0", "-1"]));
                }
            }
            out
        }))
        .unwrap_or_default()
    }

    /// Every copy pool in Redis, read node by node:
    /// (key, pool, staged transfers).
    fn read_pools(&self) -> Result<Vec<(String, copylog::Pool, Vec<copylog::Staged>)>, Violation> {
        let mut out = Vec::new();
        for node in self.store.nodes() {
            let mut c: Client = node.client();
            for key in c.scan("tollgate:{c:*}:pool") {
                let fields = c.hgetall(&key);
                let xfer = key.replace(":pool", ":xfer");
                let staged_fields = c.hgetall(&xfer);
                let pool = copylog::parse_pool(&key, &fields).map_err(|e| Violation {
                    kind: "malformed",
                    detail: e.to_string(),
                })?;
                let staged =
                    copylog::parse_transfers(&xfer, &staged_fields).map_err(|e| Violation {
                        kind: "malformed",
                        detail: e.to_string(),
                    })?;
                out.push((key, pool, staged));
            }
        }
        Ok(out)
    }

    /// Phase A: every pool's counts are owned by live holds or transfers.
    fn check_counts(&self) -> Vec<Violation> {
        let pools = match self.read_pools() {
            Ok(p) => p,
            Err(v) => return vec![v],
        };
        let mut out = Vec::new();
        for res in self.names.copy {
            let name = format!("{}/{res}", self.names.namespace);
            let series = format!("tollgate_holds{{pool=\"{name}\"}}");
            let mut live = BTreeMap::new();
            for p in &self.servers {
                let (Some(s), Some(id)) = (p.running(), &p.id) else {
                    continue;
                };
                let held = metric(s, &series).unwrap_or(0.0) as u64;
                live.insert(id.clone(), held);
            }
            let found: Vec<_> = pools
                .iter()
                .filter(|(_, p, _)| p.name.as_deref() == Some(name.as_str()))
                .collect();
            if found.is_empty() {
                // Redis counts nothing for this pool: so must the servers.
                let empty = copylog::Pool {
                    name: Some(name.clone()),
                    ..copylog::Pool::default()
                };
                out.extend(copylog::check_pool(&name, &empty, &[], &live));
            }
            for (key, pool, staged) in found {
                out.extend(copylog::check_pool(key, pool, staged, &live));
            }
        }
        // A pool without a name counts nothing.
        for (key, pool, staged) in pools.iter().filter(|(_, p, _)| p.name.is_none()) {
            out.extend(copylog::check_empty(key, pool, staged));
        }
        out
    }

    /// Phase B: with every hold dropped and every transfer expired,
    /// nothing is counted and no session is open.
    fn check_empty(&self) -> Vec<Violation> {
        let pools = match self.read_pools() {
            Ok(p) => p,
            Err(v) => return vec![v],
        };
        let mut out: Vec<Violation> = pools
            .iter()
            .flat_map(|(key, pool, staged)| copylog::check_empty(key, pool, staged))
            .collect();
        for (i, p) in self.servers.iter().enumerate() {
            let Some(s) = p.running() else { continue };
            match call(s.http, "GET", "/status", None)
                .and_then(|(_, v)| v["sessions"]["open"].as_u64())
            {
                Some(0) => {}
                Some(open) => out.push(Violation {
                    kind: "left_over",
                    detail: format!("server {i} still has {open} sessions open"),
                }),
                None => out.push(Violation {
                    kind: "not_ready",
                    detail: format!("server {i} does not answer GET /status"),
                }),
            }
        }
        out
    }

    /// Records servers that exited on their own since the last look.
    fn check_exits(&mut self) {
        for i in 0..self.servers.len() {
            if let Some(why) = self.servers[i].exited() {
                self.report.violate(
                    "server_exited",
                    format!("server {i} exited although nothing killed it: {why}"),
                );
            }
        }
    }

    /// Drops every hold and session the clients know of; the rest lapse.
    fn drop_everything(&mut self) {
        let holds = std::mem::take(&mut self.clients.lock().unwrap().holds);
        for h in holds {
            if let Some(addr) = self.http(h.server) {
                let _ = call(addr, "DELETE", &format!("/v1/holds/{}", h.id), None);
            }
        }
        for mut s in std::mem::take(&mut self.sessions) {
            self.rt
                .block_on(s.call(session_request::Op::Close(v1::Close {})));
        }
    }

    /// The memory bounds: pool registries and Redis's key count, sampled
    /// after every step and at the end.
    fn sample_memory(&mut self) {
        let flooded = self.flooded;
        let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut keys = 0u64;
            let mut largest_registry = 0u64;
            for node in self.store.nodes() {
                let mut c = node.client();
                let all = c.scan("*");
                keys += all.len() as u64;
                for k in all
                    .iter()
                    .filter(|k| k.starts_with("tollgate:{srv}:pools:"))
                {
                    let members = c.strings(&["HKEYS", k]).len() as u64;
                    largest_registry = largest_registry.max(members);
                }
            }
            (keys, largest_registry)
        }));
        // Redis restarting: the next sample sees it.
        let Ok((keys, largest_registry)) = read else {
            return;
        };
        self.report.memory(
            "pools registered per server in Redis",
            largest_registry,
            self.names.copy.len() as u64,
        );
        // Three keys per pool, one per rate key used, the live set, the
        // cleanup lease and set; per server life a registry and a dead
        // mark, and per pool the reply of its last copy operation (kept
        // until the server's next call there) and up to a few whose
        // acknowledgement was lost with a broken connection.
        let rate_keys = (self.names.domains.len() as u64 + flooded) * self.names.rate.len() as u64;
        let pools = self.names.copy.len() as u64;
        let replies = pools * self.lives * 4;
        let bound = 3 * pools + rate_keys + 3 + 2 * self.lives + replies;
        self.report.memory("Redis keys", keys, bound);
    }

    fn check_rates(&mut self) {
        let c = self.clients.lock().unwrap();
        let bound = API_LIMIT * (1 + self.data_losses);
        for ((r, d), granted) in &c.granted {
            if *granted > bound {
                let detail = format!(
                    "{}/{} for {}: {granted} hits granted, over the limit {API_LIMIT} \
                     ({} Redis data losses)",
                    self.names.namespace,
                    self.names.rate[*r],
                    self.names.domain(*d),
                    self.data_losses
                );
                drop(c);
                self.report.violate("rate_over_limit", detail);
                return;
            }
        }
    }

    fn count_proxy_faults(&mut self) {
        for p in &self.proxies {
            let s = p.stats();
            self.report.fault("redis_latency", s.latencies);
            self.report.fault("redis_proxy_stall", s.stalls);
            self.report.fault("redis_connection_refused", s.refused);
            self.report.fault("redis_connection_dropped", s.dropped);
            self.report.fault("redis_connection_reset", s.reset);
        }
    }
}

/// `DEBUG SLEEP` on the Redis at `port`: Redis itself stops answering.
fn debug_sleep(port: u16, ms: u64) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let secs = format!("{:.3}", ms as f64 / 1000.0);
    let _ = write!(
        s,
        "*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${}\r\n{secs}\r\n",
        secs.len()
    );
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = [0u8; 64];
    let _ = s.read(&mut buf);
}

/// Stops the redis-server at `port` with SIGSTOP for `ms`, then SIGCONT:
/// a cluster's master stalls (cluster nodes run without the DEBUG
/// command).
fn sigstop(port: u16, ms: u64) {
    let Some(pid) = redis_pid(port) else { return };
    let signal = |sig: &str| {
        let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
    };
    signal("-STOP");
    std::thread::sleep(Duration::from_millis(ms));
    signal("-CONT");
}

/// The process id of the redis-server at `port` (`INFO server`).
fn redis_pid(port: u16) -> Option<u32> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n").ok()?;
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    while !text.contains("process_id:") || !text[text.find("process_id:")?..].contains("\r\n") {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let rest = &text[text.find("process_id:")? + "process_id:".len()..];
    rest.split("\r\n").next()?.trim().parse().ok()
}

fn run_redis_family(family: Family, seed: u64, steps: &[Step]) -> Report {
    let mut w = RedisWorld::new(family, seed);
    w.report.steps = steps.len();
    for step in steps {
        if let Step::Client {
            op: Op::Flood { count, .. },
            ..
        } = step
        {
            w.flooded += count;
        }
        w.step(step);
        // Not while Redis is stalled: the sample would wait for it, and
        // hold back the steps the stall is for.
        if Instant::now() > w.outage_until {
            w.sample_memory();
        }
    }
    w.quiesce();
    let v = settle(|| w.check_counts());
    w.report.violations.extend(v);
    w.check_exits();
    w.drop_everything();
    let v = settle(|| w.check_empty());
    w.report.violations.extend(v);
    w.check_exits();
    w.sample_memory();
    w.check_rates();
    w.count_proxy_faults();
    w.report.violations.dedup();
    std::mem::take(&mut w.report)
}

#[test]
fn redis_schedules_keep_every_invariant() {
    run_family("redis", &redis_profile(Family::Redis), |seed, steps| {
        run_redis_family(Family::Redis, seed, steps)
    });
}

#[test]
fn redis_cluster_schedules_keep_every_invariant() {
    run_family(
        "cluster",
        &redis_profile(Family::RedisCluster),
        |seed, steps| run_redis_family(Family::RedisCluster, seed, steps),
    );
}

// ---------------------------------------------------------------------
// The gossip family
// ---------------------------------------------------------------------

/// Capacity 20, one token an hour: nothing refills during a schedule, so
/// what a node reports remaining is the capacity less what it knows was
/// granted.
const GOSSIP_CONFIG: &str = r#"
namespaces:
  - name: chaos
    resources:
      - { name: q, algorithm: token_bucket, capacity: 20, rate: 1/h }
      - { name: c, algorithm: token_bucket, capacity: 20, rate: 1/h, replication: counter }
"#;

const GOSSIP_CAPACITY: u64 = 20;
const GOSSIP_NODES: usize = 3;
const GOSSIP_MAX_KEYS: u64 = 1000;

fn gossip_names() -> Names {
    let mut domains: Vec<String> = (0..3).map(|i| format!("d{i}")).collect();
    // Longer than one gossip datagram's share for a key name.
    domains.push(format!("long-{}", "x".repeat(600)));
    Names {
        namespace: "chaos",
        copy: &[],
        rate: &["q", "c"],
        domains,
    }
}

fn gossip_profile() -> Profile {
    Profile {
        family: Family::Gossip,
        servers: GOSSIP_NODES,
        redis_nodes: 0,
        copy_resources: 0,
        rate_resources: 2,
        domains: 4,
        steps: 40,
    }
}

struct GossipWorld {
    dir: Sandbox,
    mesh: Arc<UdpMesh>,
    nodes: Vec<Proc>,
    clients: Shared,
    background: Vec<std::thread::JoinHandle<()>>,
    generation: Arc<AtomicU64>,
    /// Node lives (the first ones included): each may grant the capacity
    /// alone.
    lives: u64,
    killed_any: bool,
    names: Names,
    report: Report,
}

impl GossipWorld {
    fn new(seed: u64) -> GossipWorld {
        let dir = Sandbox::new("chaos-gossip");
        dir.write("tollgate.yaml", GOSSIP_CONFIG);
        dir.write("secret", "a chaos test secret, long enough\n");
        let mut w = GossipWorld {
            dir,
            mesh: Arc::new(UdpMesh::start(GOSSIP_NODES, seed).unwrap()),
            nodes: Vec::new(),
            clients: Shared::default(),
            background: Vec::new(),
            generation: Arc::new(AtomicU64::new(0)),
            lives: 0,
            killed_any: false,
            names: gossip_names(),
            report: Report {
                family: "gossip",
                seed,
                ..Report::default()
            },
        };
        for i in 0..GOSSIP_NODES {
            w.nodes.push(Proc {
                serving: None,
                killed: false,
                id: None,
            });
            w.start_node(i, i > 0);
        }
        w.wait_formed();
        w
    }

    /// Starts node `i`; `seeded`: with every other node as a seed (else
    /// it is the first of its cluster).
    fn start_node(&mut self, i: usize, seeded: bool) {
        let port = tollgate_testing::free_udp_addr().port();
        let real: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        self.mesh.set_node(i, real);
        let peers: Vec<String> = (0..GOSSIP_NODES)
            .filter(|k| *k != i)
            .map(|k| self.mesh.advertised(k).to_string())
            .collect();
        let mut args = serve_args(&[
            "--cluster",
            "chaos",
            "--node-id",
            &format!("n{i}"),
            "--gossip",
            &real.to_string(),
            "--gossip-advertise",
            &self.mesh.advertised(i).to_string(),
            "--cluster-secret-file",
            "secret",
            "--join-timeout-ms",
            "1500",
            "--anti-entropy-ms",
            "1000",
            "--max-keys",
            &GOSSIP_MAX_KEYS.to_string(),
        ]);
        if seeded {
            args.push("--peers".into());
            args.push(peers.join(","));
        }
        let serving = start_with_retries(&self.dir, &args);
        if serving.is_none() {
            self.report
                .violate("server_start", format!("node {i} did not start"));
        }
        self.lives += 1;
        self.nodes[i] = Proc {
            serving,
            killed: false,
            id: None,
        };
    }

    fn wait_formed(&mut self) {
        let n = GOSSIP_NODES;
        let v = settle(|| {
            self.nodes
                .iter()
                .enumerate()
                .filter_map(|(i, p)| {
                    let s = p.running()?;
                    let alive = metric(s, "tollgate_cluster_peers_alive");
                    (!ready(s) || alive != Some((n - 1) as f64)).then(|| Violation {
                        kind: "not_ready",
                        detail: format!(
                            "node {i}: not ready or sees {alive:?} live peers of {}",
                            n - 1
                        ),
                    })
                })
                .collect()
        });
        self.report.violations.extend(v);
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Pause { ms } => std::thread::sleep(Duration::from_millis(*ms)),
            Step::Fault(f) => self.fault(f),
            Step::Client { server, op, call } => {
                let Some(addr) = self.nodes[*server].running().map(|s| s.http) else {
                    return;
                };
                if let Op::Flood {
                    resource,
                    first,
                    count,
                } = op
                {
                    flood(
                        addr,
                        self.names.namespace,
                        self.names.rate[*resource % self.names.rate.len()],
                        *first,
                        *count,
                    );
                    self.sample_memory();
                    return;
                }
                if *call == Call::Abandon {
                    self.report.fault("client_vanished", 1);
                }
                let clients = Arc::clone(&self.clients);
                let addrs: Vec<Option<SocketAddr>> = self
                    .nodes
                    .iter()
                    .map(|p| p.running().map(|s| s.http))
                    .collect();
                let (op, how, server) = (op.clone(), *call, *server);
                if how == Call::Background {
                    self.background.push(std::thread::spawn(move || {
                        http_op(&addrs, server, &op, how, &clients, &gossip_names());
                    }));
                } else {
                    http_op(&addrs, server, &op, how, &clients, &self.names);
                }
            }
        }
    }

    fn fault(&mut self, f: &Fault) {
        match f {
            Fault::Gossip {
                loss,
                duplicate,
                reorder,
                replay,
                replay_elsewhere,
                for_ms,
            } => {
                self.mesh.set_faults(UdpFaults {
                    loss: *loss,
                    duplicate: *duplicate,
                    reorder: *reorder,
                    replay: *replay,
                    replay_elsewhere: *replay_elsewhere,
                    max_delay: Duration::from_millis(200),
                });
                self.report.fault("gossip_fault_period", 1);
                self.end_later(*for_ms);
            }
            Fault::Partition { side, for_ms } => {
                self.mesh.partition(side);
                self.report.fault("gossip_partition", 1);
                self.end_later(*for_ms);
            }
            Fault::KillServer { server } => {
                self.report.fault("server_kill", 1);
                self.killed_any = true;
                self.nodes[*server].kill();
            }
            Fault::RestartServer { server } if self.nodes[*server].serving.is_none() => {
                self.start_node(*server, true);
            }
            _ => {}
        }
    }

    /// Calms the network after `ms`, unless another fault came since.
    fn end_later(&mut self, ms: u64) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let (mesh, g) = (Arc::clone(&self.mesh), Arc::clone(&self.generation));
        self.background.push(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            if g.load(Ordering::SeqCst) == generation {
                mesh.calm();
            }
        }));
    }

    fn sample_memory(&mut self) {
        for i in 0..self.nodes.len() {
            if let Some(s) = self.nodes[i].running() {
                if let Some(keys) = metric(s, "tollgate_replica_keys") {
                    // The cap is enforced per shard (`ceil(N / 64)` in each
                    // of a node's 64 shards), so a node holds at most
                    // 64 × ceil(N / 64) keys (1,024 for 1,000).
                    self.report.memory(
                        "gossip node keys (--max-keys, per shard)",
                        keys as u64,
                        GOSSIP_MAX_KEYS.div_ceil(64) * 64,
                    );
                }
            }
        }
    }

    fn quiesce(&mut self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.mesh.calm();
        for t in self.background.drain(..) {
            let _ = t.join();
        }
        self.mesh.calm();
        for i in 0..self.nodes.len() {
            if let Some(why) = self.nodes[i].exited() {
                self.report.violate(
                    "server_exited",
                    format!("node {i} exited although nothing killed it: {why}"),
                );
            }
            if self.nodes[i].serving.is_none() {
                self.start_node(i, true);
            }
        }
        self.wait_formed();
    }

    /// Every node's peek at `resource`/`domain`: what it would still grant.
    fn remaining(&self, r: usize, d: usize) -> Vec<Option<i64>> {
        self.nodes
            .iter()
            .map(|p| {
                let s = p.running()?;
                let body = format!(
                    r#"{{"namespace":"{}","resource":"{}","domain":"{}","hits":0}}"#,
                    self.names.namespace,
                    self.names.rate[r],
                    self.names.domain(d)
                );
                let (_, v) = call(s.http, "POST", "/v1/request", Some(&body))?;
                v["remaining"].as_i64()
            })
            .collect()
    }

    /// Nodes converge on one count that holds every grant once.
    fn check_rates(&mut self) {
        let (granted, unknown) = {
            let c = self.clients.lock().unwrap();
            (c.granted.clone(), c.unknown.clone())
        };
        let cap = GOSSIP_CAPACITY as i64;
        eprintln!(
            "chaos gossip seed {}: granted {granted:?}, unread {unknown:?}",
            self.report.seed
        );
        for r in 0..self.names.rate.len() {
            for d in 0..self.names.domains.len() {
                let seen = granted.get(&(r, d)).copied().unwrap_or(0);
                let maybe = unknown.get(&(r, d)).copied().unwrap_or(0);
                let what = format!(
                    "{}/{} for {}",
                    self.names.namespace,
                    self.names.rate[r],
                    if d == 3 {
                        "the 600-byte domain"
                    } else {
                        self.names.domain(d)
                    }
                );
                let bound = GOSSIP_CAPACITY * self.lives;
                if seen > bound {
                    self.report.violate(
                        "rate_over_limit",
                        format!(
                            "{what}: {seen} hits granted, over the capacity {GOSSIP_CAPACITY} \
                             per node life ({} lives)",
                            self.lives
                        ),
                    );
                }
                // Never counted twice: at least what was not granted.
                let lowest = (cap - seen as i64 - maybe as i64).max(0);
                // None lost, unless a node died with grants it had not sent.
                let highest = if self.killed_any {
                    cap
                } else {
                    (cap - seen as i64).max(0)
                };
                let killed_any = self.killed_any;
                let v = settle(|| {
                    let got = self.remaining(r, d);
                    let agreed = got.windows(2).all(|w| w[0] == w[1]);
                    let Some(Some(first)) = got.first().copied() else {
                        return vec![Violation {
                            kind: "not_ready",
                            detail: format!("{what}: a node does not answer: {got:?}"),
                        }];
                    };
                    if !agreed {
                        return vec![Violation {
                            kind: "gossip_diverged",
                            detail: format!(
                                "{what}: nodes disagree on what remains once the network is calm: \
                                 {got:?} ({seen} granted)"
                            ),
                        }];
                    }
                    if first < lowest {
                        return vec![Violation {
                            kind: "gossip_counted_twice",
                            detail: format!(
                                "{what}: {first} remaining, but only {seen} hits (and at most \
                                 {maybe} more, asked by calls whose answer was never read) of \
                                 {cap} were granted"
                            ),
                        }];
                    }
                    if first > highest {
                        return vec![Violation {
                            kind: "gossip_lost_grant",
                            detail: format!(
                                "{what}: {first} remaining although {seen} of {cap} were granted \
                                 and no node died (killed: {killed_any})"
                            ),
                        }];
                    }
                    Vec::new()
                });
                self.report.violations.extend(v);
            }
        }
        self.sample_memory();
    }
}

fn run_gossip(seed: u64, steps: &[Step]) -> Report {
    let mut w = GossipWorld::new(seed);
    w.report.steps = steps.len();
    for step in steps {
        w.step(step);
        w.sample_memory();
    }
    w.quiesce();
    w.check_rates();
    let s = w.mesh.stats();
    for (kind, n) in [
        ("gossip_lost", s.lost),
        ("gossip_duplicated", s.duplicated),
        ("gossip_reordered", s.reordered),
        ("gossip_replayed", s.replayed),
        ("gossip_replayed_elsewhere", s.replayed_elsewhere),
        ("gossip_partitioned", s.partitioned),
    ] {
        w.report.fault(kind, n);
    }
    w.report.violations.dedup();
    std::mem::take(&mut w.report)
}

#[test]
fn gossip_schedules_keep_every_invariant() {
    run_family("gossip", &gossip_profile(), run_gossip);
}

#[test]
fn seed_lists_parse() {
    assert_eq!(parse_seeds("1-3,7").unwrap(), [1, 2, 3, 7]);
    assert_eq!(parse_seeds(" 5 ").unwrap(), [5]);
    assert!(parse_seeds("3-1").is_err());
    assert!(parse_seeds("x").is_err());
}
