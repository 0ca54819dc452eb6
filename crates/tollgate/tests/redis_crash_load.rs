//! The copy log under load, with a crash: counts never go negative and never
//! leak (Charon §4.2, §4.3.2; docs/redis.md, "The copy log and crash
//! safety").
//!
//! Two `tollgate serve` processes share one redis-server. Sixteen client
//! threads, eight per server, reserve and release copies of two concurrency
//! resources (domain, group and global limits, every domain contended) as
//! HTTP holds, each a session of its own, while a sampler reads the pools'
//! hashes straight from Redis. Mid-run one server is killed with SIGKILL; its
//! clients stop using it, the other server's clients go on, during the kill
//! and after it.
//!
//! What it proves, each a check that fails if the copy log breaks:
//!
//! - In every sample (one `HGETALL`, so one consistent state of a pool) no
//!   count is zero or negative (a count at zero must be deleted), none is
//!   above its limit, and every count equals the sum of the servers'
//!   contributions recorded beside it (`g`, every `d:<domain>` and every
//!   `G:<group>`). Since the copy script clamps a count at zero, subtracting
//!   too much would not show as a negative number but as a count below the
//!   contributions: this equality is what catches it.
//! - The survivor releases exactly what the dead server held (the log's
//!   `released` equals the dead server's contributions seen right after
//!   the kill), removes every one of its contributions, leaves its
//!   tombstone in every pool it used, and removes it from the live set.
//! - After the cleanup, with the clients stopped, every count in Redis
//!   equals what the survivor's clients believe they hold, hold by hold
//!   summed per domain, per group and globally; and the survivor has one
//!   session open per hold.
//! - Once they release everything, no count is left at all (no leak), and
//!   each resource's full limit can be reserved again on the survivor, and
//!   not one copy more.
//!
//! No assertion depends on timing: waits poll with generous deadlines.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::serving::{self, Serving};
use common::Sandbox;
use serde_json::Value;
use tollgate_redis::testing::{Client, RedisServer};

const CONFIG: &str = r#"
namespaces:
  - name: shop
    resources:
      - name: db
        kind: concurrency
        domain_limit: 8
        global_limit: 20
        groups:
          - { name: east, members: [acme, globex], limit: 12 }
          - { name: west, members: [globex, initech], limit: 12 }
      - name: cache
        kind: concurrency
        domain_limit: 5
        groups:
          - { name: east, members: [acme, globex], limit: 8 }
"#;

const DOMAINS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];
const RESOURCES: [&str; 2] = ["db", "cache"];

/// The limits of `CONFIG`, as the checks need them.
struct Limits {
    domain: u64,
    global: Option<u64>,
    groups: &'static [(&'static str, u64, &'static [&'static str])],
}

fn limits(resource: &str) -> Limits {
    match resource {
        "db" => Limits {
            domain: 8,
            global: Some(20),
            groups: &[
                ("east", 12, &["acme", "globex"]),
                ("west", 12, &["globex", "initech"]),
            ],
        },
        "cache" => Limits {
            domain: 5,
            global: None,
            groups: &[("east", 8, &["acme", "globex"])],
        },
        other => panic!("no resource {other}"),
    }
}

/// The groups `domain` belongs to in `resource`, sorted (as the store keys
/// its contributions).
fn groups_of(resource: &str, domain: &str) -> Vec<String> {
    let mut g: Vec<String> = limits(resource)
        .groups
        .iter()
        .filter(|(_, _, members)| members.contains(&domain))
        .map(|(name, _, _)| (*name).to_owned())
        .collect();
    g.sort();
    g
}

const THREADS_PER_SERVER: u64 = 8;
/// Operations (both servers) before the kill.
const OPS_BEFORE_KILL: u64 = 1000;
/// Survivor operations after the dead server's holds were released.
const OPS_AFTER_CLEANUP: u64 = 300;
/// A safety net for every wait, not a requirement.
const DEADLINE: Duration = Duration::from_secs(60);

fn serve(dir: &Sandbox, redis: &RedisServer) -> Serving {
    Serving::start_redis(dir, &redis.url(), &["--heartbeat-ttl-ms", "1000"], &[])
}

/// The server's id in the copy log, from its "joined the copy log" line.
fn server_id(s: &Serving) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let found = s
            .logs
            .lock()
            .unwrap()
            .iter()
            .find(|l| l["fields"]["message"] == "joined the copy log")
            .map(|l| l["fields"]["server"].as_str().unwrap().to_owned());
        if let Some(id) = found {
            return id;
        }
        assert!(Instant::now() < deadline, "no \"joined the copy log\" line");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// HTTP that reports a server that is gone instead of panicking.

/// One HTTP/1.1 exchange with `addr`: `Err` when the connection fails or the
/// answer is cut short (the server died), else (status, JSON body).
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, Value), String> {
    let (status, text) = serving::exchange(addr, method, path, body)?;
    let v = serde_json::from_str(text.trim())
        .map_err(|e| format!("a cut or bad answer ({e}): {text:?}"))?;
    Ok((status, v))
}

/// For requests that must succeed (the survivor, the checks).
fn must(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    exchange(addr, method, path, body)
        .unwrap_or_else(|e| panic!("{method} {path} {}: {e}", body.unwrap_or("")))
}

// ---------------------------------------------------------------------------
// Holds, as a client keeps track of them.

#[derive(Clone, Debug)]
struct Hold {
    id: String,
    resource: &'static str,
    domain: &'static str,
    copies: u64,
}

/// Reserves into a new hold: `Ok(None)` when nothing was granted (429).
fn reserve(
    addr: SocketAddr,
    resource: &'static str,
    domain: &'static str,
    copies: u64,
    min_copies: u64,
) -> Result<Option<Hold>, String> {
    let body = format!(
        r#"{{"namespace":"shop","resource":"{resource}","domain":"{domain}","copies":{copies},"min_copies":{min_copies},"lease_ms":600000}}"#
    );
    let (status, v) = exchange(addr, "POST", "/v1/reserve", Some(&body))?;
    let granted = v["granted"].as_u64().unwrap_or(u64::MAX);
    let l = limits(resource);
    match status {
        200 => {
            assert!(
                granted >= min_copies.max(1) && granted <= copies,
                "{body} -> {v}"
            );
            let id = v["hold_id"].as_str().unwrap().to_owned();
            assert_eq!(id.len(), 32, "{v}");
            // What the reserve saw right after counting itself.
            assert!(v["domain_holds"].as_u64().unwrap() <= l.domain, "{v}");
            assert!(
                v["domain_holds"].as_u64().unwrap() >= granted,
                "{body} -> {v}"
            );
            if let Some(global) = l.global {
                assert!(v["global_holds"].as_u64().unwrap() <= global, "{v}");
            }
            for g in v["group_limits"].as_array().unwrap() {
                assert!(g["holds"].as_u64() <= g["limit"].as_u64(), "{v}");
            }
            Ok(Some(Hold {
                id,
                resource,
                domain,
                copies: granted,
            }))
        }
        429 => {
            assert_eq!(granted, 0, "{body} -> {v}");
            // min_copies 0 accepts a grant of nothing: allowed, but no hold.
            assert_eq!(v["allowed"], min_copies == 0, "{body} -> {v}");
            assert_eq!(v["hold_id"], "", "{v}");
            Ok(None)
        }
        _ => panic!("{body} -> {status} {v}"),
    }
}

/// Releases `copies` of `hold` (all of them with `DELETE` when `delete`);
/// returns what the hold still holds.
fn release(addr: SocketAddr, hold: &Hold, copies: u64, delete: bool) -> Result<u64, String> {
    if delete {
        let path = format!("/v1/holds/{}", hold.id);
        let (status, v) = exchange(addr, "DELETE", &path, None)?;
        assert_eq!(status, 200, "DELETE {path} ({hold:?}) -> {v}");
        assert_eq!(v["released"].as_u64(), Some(hold.copies), "{hold:?} -> {v}");
        return Ok(0);
    }
    let body = format!(
        r#"{{"hold_id":"{}","namespace":"shop","resource":"{}","domain":"{}","copies":{copies}}}"#,
        hold.id, hold.resource, hold.domain
    );
    let (status, v) = exchange(addr, "POST", "/v1/release", Some(&body))?;
    assert_eq!(status, 200, "{body} ({hold:?}) -> {v}");
    assert_eq!(v["released"].as_u64(), Some(copies), "{body} -> {v}");
    let still = v["still_held"].as_u64().unwrap();
    assert_eq!(still, hold.copies - copies, "{body} ({hold:?}) -> {v}");
    Ok(still)
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// In `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 32) % n
    }

    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }
}

/// What the threads share.
#[derive(Default)]
struct Shared {
    /// Set when the workers and the sampler must stop (also on a panic of
    /// the main thread, so the scope can end).
    stop: AtomicBool,
    stop_sampler: AtomicBool,
    /// Set just before the victim is killed: only then may it fail.
    killed: AtomicBool,
    /// Set by any thread that panics, so waits give up at once.
    failed: AtomicBool,
    victim_ops: AtomicU64,
    survivor_ops: AtomicU64,
    samples: AtomicU64,
    /// Reserves granted in full, in part, and not at all.
    full: AtomicU64,
    partial: AtomicU64,
    refused: AtomicU64,
}

/// Sets a flag when dropped; with `only_panicking`, only during a panic.
struct FlagOnDrop<'a>(&'a AtomicBool, bool);

impl Drop for FlagOnDrop<'_> {
    fn drop(&mut self) {
        if !self.1 || std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

fn wait_until(shared: &Shared, what: &str, mut done: impl FnMut() -> bool) {
    tollgate_testing::eventually(what, DEADLINE, || {
        if done() {
            return Ok(());
        }
        assert!(
            !shared.failed.load(Ordering::SeqCst),
            "another thread failed while waiting for: {what}"
        );
        Err("not yet".into())
    });
}

/// One client thread: reserves and releases on `addr` until told to stop.
/// Returns the holds it still has; on the victim, stops (returning nothing)
/// as soon as the server is gone.
fn worker(addr: SocketAddr, seed: u64, on_victim: bool, shared: &Shared) -> Vec<Hold> {
    let _flag = FlagOnDrop(&shared.failed, true);
    let ops = if on_victim {
        &shared.victim_ops
    } else {
        &shared.survivor_ops
    };
    let mut rng = Rng::new(seed);
    let mut holds: Vec<Hold> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        let result = if holds.is_empty() || (holds.len() < 3 && rng.below(2) == 0) {
            let resource = rng.pick(&RESOURCES);
            let domain = rng.pick(&DOMAINS);
            let copies = 1 + rng.below(3);
            let min_copies = match rng.below(3) {
                0 => 0,
                1 => 1,
                _ => copies,
            };
            reserve(addr, resource, domain, copies, min_copies).map(|h| {
                let outcome = match &h {
                    Some(h) if h.copies == copies => &shared.full,
                    Some(_) => &shared.partial,
                    None => &shared.refused,
                };
                outcome.fetch_add(1, Ordering::SeqCst);
                holds.extend(h);
            })
        } else {
            let i = rng.below(holds.len() as u64) as usize;
            let delete = rng.below(4) == 0;
            let copies = if delete {
                holds[i].copies
            } else {
                1 + rng.below(holds[i].copies)
            };
            release(addr, &holds[i], copies, delete).map(|still| {
                if still == 0 {
                    holds.swap_remove(i);
                } else {
                    holds[i].copies = still;
                }
            })
        };
        match result {
            Ok(()) => {
                ops.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => {
                assert!(
                    on_victim && shared.killed.load(Ordering::SeqCst),
                    "a request failed on a server that is up: {e}"
                );
                // The server is gone, and with it (once the survivor cleans
                // up) what this client held there.
                return Vec::new();
            }
        }
        // Hold briefly, sometimes.
        if rng.below(4) == 0 {
            std::thread::sleep(Duration::from_micros(rng.below(1500)));
        }
    }
    holds
}

// ---------------------------------------------------------------------------
// Redis, read directly (RESP over a socket; the tests need no Redis client).

/// What the test reads from Redis: the pools' hashes and the
/// coordination keys.
struct Redis(Client);

impl Redis {
    fn connect(redis: &RedisServer) -> Redis {
        Redis(redis.client())
    }

    fn strings(&mut self, args: &[&str]) -> Vec<String> {
        self.0.strings(args)
    }

    fn exists(&mut self, key: &str) -> bool {
        self.0.exists(key)
    }

    /// Every pool hash of the default prefix.
    fn pool_keys(&mut self) -> Vec<String> {
        self.0.scan("tollgate:{c:*}:pool")
    }

    /// One pool's hash, read atomically.
    fn pool(&mut self, key: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.0.hgetall(key)
    }

    /// Every pool, checked, by resource name.
    fn pools(&mut self, servers: &[&str]) -> BTreeMap<String, Pool> {
        let mut out = BTreeMap::new();
        for key in self.pool_keys() {
            let fields = self.pool(&key);
            if let Some(p) = check_pool(&key, &fields, servers) {
                assert!(
                    out.insert(p.resource.clone(), p).is_none(),
                    "two pools for one resource"
                );
            }
        }
        out
    }
}

/// Decodes a hold key (cmsgpack of `{domain, group...}`).
fn decode_hold_key(mut b: &[u8]) -> Vec<String> {
    let n = match b.first() {
        Some(&t) if t & 0xf0 == 0x90 => usize::from(t & 0x0f),
        other => panic!("a hold key that is not a short msgpack array: {other:?}"),
    };
    b = &b[1..];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (len, skip) = match b[0] {
            t if t & 0xe0 == 0xa0 => (usize::from(t & 0x1f), 1),
            0xd9 => (usize::from(b[1]), 2),
            0xda => (usize::from(u16::from_be_bytes([b[1], b[2]])), 3),
            t => panic!("unexpected msgpack type {t:#x} in a hold key"),
        };
        out.push(String::from_utf8(b[skip..skip + len].to_vec()).unwrap());
        b = &b[skip + len..];
    }
    assert!(b.is_empty(), "trailing bytes in a hold key");
    out
}

/// One pool's counts, as read from Redis.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Pool {
    resource: String,
    global: u64,
    domains: BTreeMap<String, u64>,
    groups: BTreeMap<String, u64>,
    /// server -> (domain -> copies).
    contributions: BTreeMap<String, BTreeMap<String, u64>>,
    tombstones: Vec<String>,
}

impl Pool {
    fn counts_nothing(&self) -> bool {
        self.global == 0
            && self.domains.is_empty()
            && self.groups.is_empty()
            && self.contributions.is_empty()
    }

    fn contributed_by(&self, server: &str) -> u64 {
        self.contributions
            .get(server)
            .map_or(0, |c| c.values().sum())
    }
}

/// Checks one consistent state of a pool; `None` if the hash is gone.
fn check_pool(key: &str, fields: &[(Vec<u8>, Vec<u8>)], servers: &[&str]) -> Option<Pool> {
    if fields.is_empty() {
        return None;
    }
    let mut p = Pool::default();
    let count = |f: &str, v: &[u8]| -> u64 {
        let text = std::str::from_utf8(v).unwrap();
        let n: i64 = text
            .parse()
            .unwrap_or_else(|_| panic!("{key} {f} = {text:?}: not a whole number"));
        assert!(n > 0, "{key} {f} = {n}: a count is never zero or negative");
        n as u64
    };
    // Contributions summed: global, per domain, per group.
    let mut sum_global = 0;
    let mut sum_domains: BTreeMap<String, u64> = BTreeMap::new();
    let mut sum_groups: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen_contributions = Vec::new();
    // Each server's total beside its contributions (`m:<server>`).
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for (f, v) in fields {
        if f == b"n" {
            let name = std::str::from_utf8(v).unwrap();
            p.resource = name
                .strip_prefix("shop/")
                .unwrap_or_else(|| panic!("{key}: pool {name}"))
                .to_owned();
        } else if f == b"g" {
            p.global = count("g", v);
        } else if let Some(d) = f.strip_prefix(b"d:") {
            let d = String::from_utf8(d.to_vec()).unwrap();
            let n = count(&format!("d:{d}"), v);
            p.domains.insert(d, n);
        } else if let Some(g) = f.strip_prefix(b"G:") {
            let g = String::from_utf8(g.to_vec()).unwrap();
            let n = count(&format!("G:{g}"), v);
            p.groups.insert(g, n);
        } else if let Some(x) = f.strip_prefix(b"x:") {
            p.tombstones.push(String::from_utf8(x.to_vec()).unwrap());
        } else if f.starts_with(b"v:") {
            // A server's version (the operation that last changed its
            // holds): checked by the store's own tests.
        } else if let Some(m) = f.strip_prefix(b"m:") {
            let server = String::from_utf8(m.to_vec()).unwrap();
            let n = count(&format!("m:{server}"), v);
            totals.insert(server, n);
        } else if let Some(rest) = f.strip_prefix(b"s:") {
            let colon = rest.iter().position(|&b| b == b':').unwrap();
            let server = String::from_utf8(rest[..colon].to_vec()).unwrap();
            assert!(
                servers.contains(&server.as_str()),
                "{key}: a contribution of an unknown server {server}"
            );
            let hold_key = decode_hold_key(&rest[colon + 1..]);
            let n = count(&format!("s:{server}:{hold_key:?}"), v);
            seen_contributions.push((server, hold_key, n));
        } else {
            panic!("{key}: unexpected field {:?}", String::from_utf8_lossy(f));
        }
    }
    let counts_any = p.global > 0 || !p.domains.is_empty() || !p.groups.is_empty();
    if p.resource.is_empty() {
        assert!(
            !counts_any && seen_contributions.is_empty(),
            "{key}: counts without a pool name: {fields:?}"
        );
        return None;
    }
    let l = limits(&p.resource);
    for (server, hold_key, n) in seen_contributions {
        let (domain, groups) = hold_key.split_first().unwrap();
        assert_eq!(
            groups,
            groups_of(&p.resource, domain).as_slice(),
            "{key}: {server}'s contribution for {domain} is not under {domain}'s groups"
        );
        sum_global += n;
        *sum_domains.entry(domain.clone()).or_default() += n;
        for g in groups {
            *sum_groups.entry(g.clone()).or_default() += n;
        }
        *p.contributions
            .entry(server)
            .or_default()
            .entry(domain.clone())
            .or_default() += n;
    }
    // Each server's total is the sum of its contributions.
    let summed: BTreeMap<String, u64> = p
        .contributions
        .keys()
        .map(|s| (s.clone(), p.contributed_by(s)))
        .collect();
    assert_eq!(totals, summed, "{key}: m: vs contributions: {p:?}");
    // No transfers are staged here, so the counts are exactly the servers'
    // contributions.
    assert_eq!(p.global, sum_global, "{key}: g vs contributions: {p:?}");
    assert_eq!(p.domains, sum_domains, "{key}: d: vs contributions: {p:?}");
    assert_eq!(p.groups, sum_groups, "{key}: G: vs contributions: {p:?}");
    // And within the limits.
    if let Some(global) = l.global {
        assert!(p.global <= global, "{key}: over the global limit: {p:?}");
    }
    for (d, &n) in &p.domains {
        assert!(n <= l.domain, "{key}: {d} over its domain limit: {p:?}");
    }
    for (g, &n) in &p.groups {
        let (_, limit, _) = l
            .groups
            .iter()
            .find(|(name, _, _)| name == g)
            .unwrap_or_else(|| panic!("{key}: unknown group {g}"));
        assert!(n <= *limit, "{key}: group {g} over its limit: {p:?}");
    }
    Some(p)
}

/// The counts `holds` make, per resource, as the copy log must record
/// them for `server`.
fn expected(holds: &[Hold], server: &str) -> BTreeMap<String, Pool> {
    let mut out: BTreeMap<String, Pool> = BTreeMap::new();
    for h in holds {
        let p = out.entry(h.resource.to_owned()).or_default();
        p.resource = h.resource.to_owned();
        p.global += h.copies;
        *p.domains.entry(h.domain.to_owned()).or_default() += h.copies;
        for g in groups_of(h.resource, h.domain) {
            *p.groups.entry(g).or_default() += h.copies;
        }
        *p.contributions
            .entry(server.to_owned())
            .or_default()
            .entry(h.domain.to_owned())
            .or_default() += h.copies;
    }
    out
}

/// Compares the counts in Redis with `holds` (the tombstones aside).
fn assert_counts_match(redis: &mut Redis, servers: &[&str], holds: &[Hold], server: &str) {
    let want = expected(holds, server);
    let got = redis.pools(servers);
    for r in RESOURCES {
        let mut got = got.get(r).cloned().unwrap_or_default();
        got.tombstones.clear();
        if got.counts_nothing() {
            got.resource.clear();
        }
        let want = want.get(r).cloned().unwrap_or_default();
        assert_eq!(got, want, "resource {r}: Redis vs the clients' holds");
    }
}

fn sessions_open(s: &Serving) -> u64 {
    let (status, v) = must(s.http, "GET", "/status", None);
    assert_eq!(status, 200, "{v}");
    v["sessions"]["open"].as_u64().unwrap()
}

#[test]
fn counts_never_go_negative_nor_leak_under_load_while_a_server_is_killed() {
    let dir = Sandbox::new("redis-crash-load");
    dir.write("tollgate.yaml", CONFIG);
    let redis = RedisServer::start();
    let mut victim = serve(&dir, &redis);
    let survivor = serve(&dir, &redis);
    let victim_id = server_id(&victim);
    let survivor_id = server_id(&survivor);
    assert_ne!(victim_id, survivor_id);
    let ids = [victim_id.as_str(), survivor_id.as_str()];
    let (victim_http, survivor_http) = (victim.http, survivor.http);

    // The victim holds these for sure when it dies, in both pools.
    let anchors = [
        reserve(victim_http, "db", "umbrella", 2, 2).unwrap(),
        reserve(victim_http, "cache", "initech", 2, 2).unwrap(),
    ];
    assert!(anchors
        .iter()
        .all(|h| h.as_ref().map(|h| h.copies) == Some(2)));

    let shared = Shared::default();
    let mut db = Redis::connect(&redis);
    let redis_server = &redis;
    let survivor_holds: Vec<Hold> = std::thread::scope(|scope| {
        // Whatever happens here, the threads stop, so the scope ends.
        let _stop = FlagOnDrop(&shared.stop, false);
        let _stop_sampler = FlagOnDrop(&shared.stop_sampler, false);
        let shared = &shared;

        let sampler = scope.spawn(move || {
            let _flag = FlagOnDrop(&shared.failed, true);
            let mut redis = Redis::connect(redis_server);
            let (mut busy, mut db_max) = (0u64, 0u64);
            while !shared.stop_sampler.load(Ordering::SeqCst) {
                let pools = redis.pools(&ids);
                if pools.values().any(|p| p.global > 0) {
                    busy += 1;
                }
                db_max = db_max.max(pools.get("db").map_or(0, |p| p.global));
                shared.samples.fetch_add(1, Ordering::SeqCst);
            }
            (busy, db_max)
        });
        let workers: Vec<_> = (0..2 * THREADS_PER_SERVER)
            .map(|t| {
                let on_victim = t % 2 == 0;
                let addr = if on_victim {
                    victim_http
                } else {
                    survivor_http
                };
                scope.spawn(move || worker(addr, 1000 + t, on_victim, shared))
            })
            .collect();

        let total = || {
            shared.victim_ops.load(Ordering::SeqCst) + shared.survivor_ops.load(Ordering::SeqCst)
        };
        wait_until(shared, "load on both servers, sampled", || {
            total() >= OPS_BEFORE_KILL
                && shared.victim_ops.load(Ordering::SeqCst) > 0
                && shared.samples.load(Ordering::SeqCst) >= 10
        });

        // Kill the victim mid-run.
        shared.killed.store(true, Ordering::SeqCst);
        victim.child.kill().unwrap();
        victim.child.wait().unwrap();
        let survivor_ops_at_kill = shared.survivor_ops.load(Ordering::SeqCst);
        let victim_ops_at_kill = shared.victim_ops.load(Ordering::SeqCst);
        // What the dead server held when it died (its contributions do not
        // change any more).
        let at_kill = db.pools(&ids);
        let dead_held: u64 = at_kill.values().map(|p| p.contributed_by(&victim_id)).sum();
        assert!(dead_held >= 4, "the anchors are held: {at_kill:?}");

        // The survivor finds the victim's heartbeat stale and releases its
        // holds; its clients keep going meanwhile.
        let mut released = None;
        wait_until(shared, "the survivor releases the victim's holds", || {
            released = survivor.logs.lock().unwrap().iter().find_map(|l| {
                (l["fields"]["message"] == "released the holds of a dead server"
                    && l["fields"]["dead"] == victim_id.as_str())
                .then(|| l["fields"]["released"].as_u64().unwrap())
            });
            released.is_some()
        });
        assert_eq!(
            released,
            Some(dead_held),
            "released exactly what the dead server held: {at_kill:?}"
        );
        let survivor_ops_at_cleanup = shared.survivor_ops.load(Ordering::SeqCst);
        let after = db.pools(&ids);
        for r in RESOURCES {
            let p = &after[r];
            assert_eq!(p.contributed_by(&victim_id), 0, "{p:?}");
            assert!(p.contributions.keys().all(|s| *s == survivor_id), "{p:?}");
            assert_eq!(p.tombstones, [victim_id.as_str()], "{p:?}");
        }
        assert_eq!(
            db.strings(&["ZRANGE", "tollgate:{srv}:alive", "0", "-1"]),
            [survivor_id.as_str()]
        );
        assert!(db
            .strings(&["SMEMBERS", "tollgate:{srv}:cleaning"])
            .is_empty());

        // The survivor's clients go on for a while, then stop.
        wait_until(shared, "more load on the survivor", || {
            shared.survivor_ops.load(Ordering::SeqCst)
                >= survivor_ops_at_cleanup + OPS_AFTER_CLEANUP
        });
        shared.stop.store(true, Ordering::SeqCst);
        let mut holds = Vec::new();
        for (t, w) in workers.into_iter().enumerate() {
            let mine = w.join().unwrap();
            if t % 2 == 0 {
                assert!(mine.is_empty(), "a victim client kept holds");
            }
            holds.extend(mine);
        }
        shared.stop_sampler.store(true, Ordering::SeqCst);
        let (busy, db_max) = sampler.join().unwrap();
        let samples = shared.samples.load(Ordering::SeqCst);
        assert!(busy > 0 && samples >= busy, "{busy} of {samples} samples");
        eprintln!(
            "ops: {} on the victim ({victim_ops_at_kill} before the kill), {} on the survivor \
             ({survivor_ops_at_kill} before the kill, {} between kill and cleanup); \
             {samples} samples of Redis ({busy} with copies held, db's global count up to \
             {db_max} of 20); reserves: {} in full, {} in part, {} refused; \
             the victim held {dead_held} when killed; the survivor's clients hold {} copies in {} holds",
            shared.victim_ops.load(Ordering::SeqCst),
            shared.survivor_ops.load(Ordering::SeqCst),
            survivor_ops_at_cleanup - survivor_ops_at_kill,
            shared.full.load(Ordering::SeqCst),
            shared.partial.load(Ordering::SeqCst),
            shared.refused.load(Ordering::SeqCst),
            holds.iter().map(|h| h.copies).sum::<u64>(),
            holds.len(),
        );
        holds
    });

    // Quiet now: Redis counts exactly what the survivor's clients hold, and
    // the survivor has a session per hold.
    assert_counts_match(&mut db, &ids, &survivor_holds, &survivor_id);
    assert_eq!(sessions_open(&survivor) as usize, survivor_holds.len());

    // They give everything back: nothing is left counted.
    for (i, h) in survivor_holds.iter().enumerate() {
        assert_eq!(release(survivor_http, h, h.copies, i % 2 == 0), Ok(0));
    }
    assert_counts_match(&mut db, &ids, &[], &survivor_id);
    assert_eq!(sessions_open(&survivor), 0);
    for key in db.pool_keys() {
        for (f, _) in db.pool(&key) {
            assert!(
                f == b"n" || f.starts_with(b"x:"),
                "{key}: {} is left",
                String::from_utf8_lossy(&f)
            );
        }
        let xfer = key.replace(":pool", ":xfer");
        let xexp = key.replace(":pool", ":xexp");
        assert!(!db.exists(&xfer) && !db.exists(&xexp), "{key}");
    }

    // The full limits are free again, and not one copy more: db is bounded
    // by acme's domain limit (8), then the east group (12: 4 for globex),
    // then the global limit (20: 8 for initech, none for umbrella); cache
    // by each domain's limit (5), then the east group (8: 3 for globex).
    let mut full = Vec::new();
    for (resource, domain, want) in [
        ("db", "acme", 8),
        ("db", "globex", 4),
        ("db", "initech", 8),
        ("db", "umbrella", 0),
        ("cache", "acme", 5),
        ("cache", "globex", 3),
        ("cache", "initech", 5),
        ("cache", "umbrella", 5),
    ] {
        let h = reserve(survivor_http, resource, domain, 10, 0).unwrap();
        assert_eq!(
            h.as_ref().map_or(0, |h| h.copies),
            want,
            "{resource} {domain}"
        );
        full.extend(h);
    }
    for (resource, domain) in RESOURCES
        .iter()
        .flat_map(|r| DOMAINS.iter().map(move |d| (*r, *d)))
    {
        let h = reserve(survivor_http, resource, domain, 1, 1).unwrap();
        assert!(h.is_none(), "{resource} {domain}: one more than the limit");
    }
    assert_counts_match(&mut db, &ids, &full, &survivor_id);
    for h in &full {
        assert_eq!(release(survivor_http, h, h.copies, true), Ok(0));
    }
    assert_counts_match(&mut db, &ids, &[], &survivor_id);
}
