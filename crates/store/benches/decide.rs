//! Decision cost of the memory store, and tollgate against governor.
//!
//! Run with `cargo bench -p tollgate-store --bench decide`; the results and
//! how to read them are in `docs/benchmarks.md`.
//!
//! Two groups:
//!
//! - `algorithm/hot/<name>` and `algorithm/1M/<name>`:
//!   [`MemoryStore::decide_now`] on a one-item plan, for every algorithm, on
//!   one hot key and over one million stored keys. Time is synthetic here:
//!   it advances by [`STEP`] per decision. So the figure is the store's cost
//!   alone, with no clock read, and every run sees the same mix of grants
//!   and rejections (printed as `mix:` lines on stderr).
//! - `vs_governor/<scenario>_<shape>/<impl>`: tollgate's memory store
//!   deciding one GCRA limit against governor's keyed GCRA limiter
//!   (`check_key`), with the same quota, in the same run, on one thread and
//!   on two. Here both sides read a real clock on every decision. governor
//!   uses its default `QuantaClock`. tollgate uses the same TSC clock
//!   (`quanta::Clock`, the same two calls), offset to Unix-epoch
//!   nanoseconds, so the clock costs both sides the same. One extra line,
//!   `tollgate-systime`, reads `SystemTime::now()` instead, to show what
//!   the standard library's clock costs a caller.
//!
//! Keys are the strings `user-<n>`. Every key is stored before it is
//! measured, inserted in order `0, 1, 2, ...`. Decisions then visit the keys
//! in a fixed pseudo-random order. That way the map's memory is touched
//! like real traffic touches it (no luck from allocation order matching
//! visit order), while the key each decision asks about sits in a vector
//! read front to back, as a freshly parsed request key would be in cache.

// Benchmark setup that fails (a bad parameter, a thread that panics) must
// abort the run loudly; there is no caller to hand an error to.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate_core::{Gcra, Hits, Limit, Mode, Nanos, Rate};
use tollgate_store::{Key, LimitId, MemoryStore, Plan};

#[path = "common/tsc.rs"]
mod tsc;
use tsc::TscClock;

/// A plausible Unix-epoch time (November 2023) to start synthetic time at.
const T0: u64 = 1_700_000_000_000_000_000;
/// Keys in the "1M" benchmarks.
const MANY: usize = 1_000_000;
/// Keys each thread walks in the `2t_distinct` benchmarks.
const PER_THREAD: usize = 1024;

// ------------------------------------------------------------------ keys

fn scope(i: usize) -> String {
    format!("user-{i}")
}

fn key(i: usize) -> Key {
    Key::new(LimitId(1), &scope(i))
}

/// A fixed pseudo-random permutation of `0..n` (Fisher–Yates driven by
/// xorshift64*), the order decisions visit keys in.
fn visit_order(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..n).rev() {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        order.swap(i, (r % (i as u64 + 1)) as usize);
    }
    order
}

/// One one-item plan per key, in visit order, all sharing `limit`.
fn plans(limit: &Arc<Limit>, n: usize) -> Vec<Plan> {
    visit_order(n)
        .into_iter()
        .map(|i| Plan::single(key(i), Arc::clone(limit)))
        .collect()
}

// ------------------------------------------------------------ algorithms

#[path = "common/algorithms.rs"]
mod algorithms;
use algorithms::{algorithms, STEP};

/// A store holding `n` keys of `limit` (decided once each, in key order,
/// [`STEP`] apart from `*now`), and their plans in visit order.
fn stored(limit: &Arc<Limit>, n: usize, now: &mut u64) -> (MemoryStore, Vec<Plan>) {
    let store = MemoryStore::new();
    for i in 0..n {
        *now += STEP;
        let plan = Plan::single(key(i), Arc::clone(limit));
        black_box(
            store
                .decide_now(&plan, Nanos::new(*now), Hits::exactly(1), Mode::Try)
                .ok(),
        );
    }
    assert_eq!(store.stats().keys, n, "every key stays stored");
    (store, plans(limit, n))
}

fn bench_algorithms(c: &mut Criterion) {
    let mut g = c.benchmark_group("algorithm");
    tune(&mut g);
    let one = Hits::exactly(1);
    for (name, limit) in algorithms() {
        let limit = Arc::new(limit);
        for (scenario, n) in [("hot", 1), ("1M", MANY)] {
            // Set up on first use, so a filtered-out benchmark costs
            // nothing, and dropped after, so one million keys of only one
            // algorithm are resident at a time.
            let mut setup: Option<(MemoryStore, Vec<Plan>)> = None;
            let (mut now, mut i, mut granted, mut total) = (T0, 0, 0u64, 0u64);
            g.bench_function(format!("{scenario}/{name}"), |b| {
                let (store, plans) = setup.get_or_insert_with(|| stored(&limit, n, &mut now));
                b.iter(|| {
                    now += STEP;
                    let d =
                        store.decide_limit(&plans[i].items()[0].key, &limit, Nanos::new(now), one);
                    i += 1;
                    if i == n {
                        i = 0;
                    }
                    // The whole answer through `black_box`: see `Tollgate::decide`.
                    let allowed = black_box(&d).as_ref().is_ok_and(|d| d.allowed);
                    granted += u64::from(allowed);
                    total += 1;
                    black_box(allowed)
                })
            });
            drop(setup);
            if total > 0 {
                let pct = granted as f64 * 100.0 / total as f64;
                eprintln!("mix: {scenario}/{name}: {pct:.1}% of {total} decisions granted");
            }
        }
    }
    g.finish();
}

// ------------------------------------------------------- against governor

/// A limiter the comparison can drive: decides one hit for the key at
/// position `j` of its visit order, reading its clock.
trait Check: Sync {
    fn check(&self, j: usize) -> bool;
}

/// tollgate's memory store deciding one GCRA limit per key through its
/// single-limit API ([`MemoryStore::decide_limit`]).
struct Tollgate {
    store: MemoryStore,
    limit: Arc<Limit>,
    keys: Vec<Key>,
    clock: TscClock,
}

impl Tollgate {
    fn new(limit: &Arc<Limit>, n: usize) -> Tollgate {
        let store = MemoryStore::new();
        let clock = TscClock::new();
        for i in 0..n {
            let d = store.decide_limit(&key(i), limit, clock.now(), Hits::exactly(1));
            black_box(d.ok());
        }
        assert_eq!(store.stats().keys, n, "every key stays stored");
        Tollgate {
            store,
            limit: Arc::clone(limit),
            keys: visit_order(n).into_iter().map(key).collect(),
            clock,
        }
    }

    /// One decision. The whole answer goes through `black_box`: only
    /// `allowed` is used here, and with the store's decision inlined the
    /// compiler would otherwise skip what a server encodes (remaining,
    /// retry and reset times).
    #[inline]
    fn decide(&self, j: usize, now: Nanos) -> bool {
        let d = self
            .store
            .decide_limit(&self.keys[j], &self.limit, now, Hits::exactly(1));
        black_box(&d).as_ref().is_ok_and(|d| d.allowed)
    }
}

impl Check for Tollgate {
    #[inline]
    fn check(&self, j: usize) -> bool {
        self.decide(j, self.clock.now())
    }
}

/// As [`Tollgate`], through one-item plans ([`MemoryStore::decide_now`]),
/// the path a request with several limits takes.
struct TollgatePlan {
    inner: Tollgate,
    plans: Vec<Plan>,
}

impl Check for TollgatePlan {
    #[inline]
    fn check(&self, j: usize) -> bool {
        let now = self.inner.clock.now();
        let d = self
            .inner
            .store
            .decide_now(&self.plans[j], now, Hits::exactly(1), Mode::Try);
        black_box(&d).as_ref().is_ok_and(|d| d.allowed)
    }
}

/// As [`Tollgate`], reading `SystemTime::now()` per decision.
struct TollgateSysTime(Tollgate);

impl Check for TollgateSysTime {
    #[inline]
    fn check(&self, j: usize) -> bool {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        self.0.decide(j, Nanos::from(now))
    }
}

/// governor's default keyed limiter (DashMap, std `RandomState`,
/// `QuantaClock`) with `String` keys: the same strings tollgate's keys
/// hold, so the like-for-like comparison.
struct GovernorString {
    limiter: DefaultKeyedRateLimiter<String>,
    keys: Vec<String>,
}

impl GovernorString {
    fn new(quota: Quota, n: usize) -> GovernorString {
        let limiter = RateLimiter::keyed(quota);
        for i in 0..n {
            black_box(limiter.check_key(&scope(i)).is_ok());
        }
        assert_eq!(limiter.len(), n, "every key stored");
        let keys = visit_order(n).into_iter().map(scope).collect();
        GovernorString { limiter, keys }
    }
}

impl Check for GovernorString {
    #[inline]
    fn check(&self, j: usize) -> bool {
        self.limiter.check_key(&self.keys[j]).is_ok()
    }
}

/// governor's default keyed limiter with `u64` keys: its best case, not a
/// like-for-like comparison (tollgate's keys are strings).
struct GovernorU64 {
    limiter: DefaultKeyedRateLimiter<u64>,
    keys: Vec<u64>,
}

impl GovernorU64 {
    fn new(quota: Quota, n: usize) -> GovernorU64 {
        let limiter = RateLimiter::keyed(quota);
        for i in 0..n as u64 {
            black_box(limiter.check_key(&i).is_ok());
        }
        assert_eq!(limiter.len(), n, "every key stored");
        let keys = visit_order(n).into_iter().map(|i| i as u64).collect();
        GovernorU64 { limiter, keys }
    }
}

impl Check for GovernorU64 {
    #[inline]
    fn check(&self, j: usize) -> bool {
        self.limiter.check_key(&self.keys[j]).is_ok()
    }
}

/// The same limit on both sides: `per_second` hits per second, `burst` at
/// once.
#[derive(Copy, Clone)]
struct Shape {
    name: &'static str,
    per_second: u32,
    burst: u32,
}

/// `allow`: one hit per nanosecond, so every decision is granted and
/// writes its state. `reject`: one per second and a burst of one, so after
/// its first hit a key is rejected until a second has passed, and its
/// state is only read.
const SHAPES: [Shape; 2] = [
    Shape {
        name: "allow",
        per_second: 1_000_000_000,
        burst: 1_000,
    },
    Shape {
        name: "reject",
        per_second: 1,
        burst: 1,
    },
];

impl Shape {
    fn tollgate_limit(self) -> Arc<Limit> {
        let rate = Rate::per_second(u64::from(self.per_second)).unwrap();
        Arc::new(Limit::Gcra(Gcra::new(rate, u64::from(self.burst)).unwrap()))
    }

    fn quota(self) -> Quota {
        Quota::per_second(NonZeroU32::new(self.per_second).unwrap())
            .allow_burst(NonZeroU32::new(self.burst).unwrap())
    }
}

/// Which keys the threads decide.
#[derive(Copy, Clone)]
enum Keys {
    /// Every thread decides one and the same key.
    Hot,
    /// Thread `t` walks its own `n` keys, `t·n .. (t+1)·n`.
    PerThread(usize),
}

impl Keys {
    fn total(self, threads: usize) -> usize {
        match self {
            Keys::Hot => 1,
            Keys::PerThread(n) => n * threads,
        }
    }
}

/// Decides `count` times on thread `t`'s keys, round-robin.
#[inline]
fn walk<L: Check>(l: &L, keys: Keys, t: usize, count: u64) {
    let (base, n) = match keys {
        Keys::Hot => (0, 1),
        Keys::PerThread(n) => (t * n, n),
    };
    let mut i = 0;
    for _ in 0..count {
        black_box(l.check(black_box(base + i)));
        i += 1;
        if i == n {
            i = 0;
        }
    }
}

/// Wall time for `iters` decisions spread evenly over `threads` threads,
/// from a common start to the last thread's end. Criterion's time per
/// iteration is then the aggregate time per decision (the inverse of
/// throughput), comparable across thread counts.
fn run<L: Check>(l: &L, keys: Keys, threads: usize, iters: u64) -> Duration {
    if threads == 1 {
        let start = Instant::now();
        walk(l, keys, 0, iters);
        return start.elapsed();
    }
    let barrier = Barrier::new(threads + 1);
    thread::scope(|s| {
        for t in 0..threads {
            let share = iters / threads as u64 + u64::from((t as u64) < iters % threads as u64);
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                walk(l, keys, t, share);
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed()
    })
}

/// Benchmarks the limiter `make` builds (with its keys already stored).
/// Built on first use, so a filtered-out benchmark costs nothing, and
/// dropped after, so a million keys of only one limiter are resident at a
/// time.
fn bench_one<L: Check>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    id: String,
    make: impl FnOnce() -> L,
    keys: Keys,
    threads: usize,
) {
    let mut make = Some(make);
    let mut limiter: Option<L> = None;
    g.bench_function(id, |b| {
        if let Some(make) = make.take() {
            limiter = Some(make());
        }
        if let Some(l) = &limiter {
            b.iter_custom(|iters| run(l, keys, threads, iters));
        }
    });
}

fn bench_vs_governor(c: &mut Criterion) {
    let mut g = c.benchmark_group("vs_governor");
    tune(&mut g);
    let scenarios: [(&str, Keys, usize); 5] = [
        ("1t_hot", Keys::Hot, 1),
        ("1t_1M", Keys::PerThread(MANY), 1),
        ("2t_distinct", Keys::PerThread(PER_THREAD), 2),
        ("2t_distinct_1M", Keys::PerThread(MANY / 2), 2),
        ("2t_shared_hot", Keys::Hot, 2),
    ];
    for (scenario, keys, threads) in scenarios {
        for shape in SHAPES {
            let n = keys.total(threads);
            let id = |name: &str| format!("{scenario}_{}/{name}", shape.name);
            // tollgate and governor run back to back, so a burst of noise
            // from other work on the machine lands on one pair rather than
            // on one side.
            let limit = shape.tollgate_limit();
            let make = || Tollgate::new(&limit, n);
            bench_one(&mut g, id("tollgate"), make, keys, threads);
            if scenario == "1t_hot" {
                let make = || TollgateSysTime(Tollgate::new(&limit, n));
                bench_one(&mut g, id("tollgate-systime"), make, keys, threads);
                let make = || TollgatePlan {
                    inner: Tollgate::new(&limit, n),
                    plans: plans(&limit, n),
                };
                bench_one(&mut g, id("tollgate-plan"), make, keys, threads);
            }
            let make = || GovernorString::new(shape.quota(), n);
            bench_one(&mut g, id("governor-string"), make, keys, threads);
            let make = || GovernorU64::new(shape.quota(), n);
            bench_one(&mut g, id("governor-u64"), make, keys, threads);
        }
    }
    g.finish();
}

/// Short enough that the whole suite runs in a few minutes, long enough
/// (millions of decisions per benchmark) to be stable.
fn tune(g: &mut BenchmarkGroup<'_, WallTime>) {
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
}

criterion_group!(benches, bench_vs_governor, bench_algorithms);
criterion_main!(benches);
