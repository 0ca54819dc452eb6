//! Memory report: bytes of state per key for every algorithm, and the
//! resident memory of a [`MemoryStore`] holding one million active keys.
//!
//! ```text
//! cargo run --release -p tollgate-store --example memory
//! cargo run --release -p tollgate-store --example memory -- --keys 900000
//! ```
//!
//! Each resident-memory figure is taken in a fresh child process (this
//! binary re-run with `--child <what>`), so no measurement inherits the
//! allocator's free lists or the page cache of another. Resident memory is
//! read from `/proc/self/statm` (Linux only), so no C library is needed.
//! Results and how to read them are in `docs/benchmarks.md`.

// A report binary: a failed setup step (a bad parameter, a child process
// that cannot start) should abort it loudly, with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::mem::size_of;
use std::num::NonZeroU32;
use std::process::Command;
use std::sync::Arc;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate_core::algorithms::burst_tiers::TierState;
use tollgate_core::algorithms::fixed_window::FixedWindowState;
use tollgate_core::algorithms::gcra::GcraState;
use tollgate_core::algorithms::hit_log::HitLog;
use tollgate_core::algorithms::sliding_window::SlidingWindowState;
use tollgate_core::algorithms::smooth::SmoothState;
use tollgate_core::algorithms::token_bucket::TokenBucketState;
use tollgate_core::{
    Algorithm, Align, BurstTiers, FixedWindow, Gcra, Hits, LeakyBucket, Limit, LimitState, Mode,
    Nanos, Rate, SlidingLog, SlidingWindow, Smooth, Tier, TokenBucket,
};
use tollgate_store::{Key, LimitId, MemoryStore, Plan};

/// Keys inserted for the resident-memory figures, unless `--keys N`.
const KEYS: usize = 1_000_000;
/// Every key is decided at this one instant, so at that instant every one
/// of them is active (not idle): the store keeps them all, and a sweep at
/// that time drops none.
const NOW: Nanos = Nanos::from_secs(1_700_000_000);

/// The algorithms of the resident-memory figures, with a limit that grants
/// a key's first hit and keeps state for it: 100 per second.
fn stored_limit(name: &str) -> Option<Limit> {
    let rate = Rate::per_second(100).unwrap();
    Some(match name {
        "gcra" => Limit::Gcra(Gcra::new(rate, 100).unwrap()),
        "token_bucket" => Limit::TokenBucket(TokenBucket::new(100, rate).unwrap()),
        "fixed_window" => {
            Limit::FixedWindow(FixedWindow::new(100, Nanos::SECOND, Align::Epoch).unwrap())
        }
        _ => return None,
    })
}

const STORED: [&str; 3] = ["gcra", "token_bucket", "fixed_window"];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, what, keys] if flag == "--child" => child(what, keys.parse().unwrap()),
        [flag, keys] if flag == "--keys" => {
            state_sizes();
            resident(keys.parse().expect("--keys takes a number"));
        }
        [] => {
            state_sizes();
            resident(KEYS);
        }
        _ => panic!("usage: memory [--keys N]"),
    }
}

// ------------------------------------------------------- bytes per state

/// One state of every algorithm after a few hits, as a store keeps it.
fn states() -> Vec<(&'static str, Limit, u64)> {
    let ms = Nanos::from_millis;
    let rate = Rate::per_second(100).unwrap();
    let tier = |limit, skippable| Tier {
        limit,
        window: Nanos::SECOND,
        active: Nanos::from_secs(10),
        cooldown: Nanos::from_secs(60),
        skippable,
    };
    // (name, limit, hits recorded one millisecond apart before measuring)
    vec![
        (
            "token_bucket",
            Limit::TokenBucket(TokenBucket::new(100, rate).unwrap()),
            10,
        ),
        ("gcra", Limit::Gcra(Gcra::new(rate, 100).unwrap()), 10),
        (
            "leaky_bucket",
            Limit::LeakyBucket(LeakyBucket::new(rate, 100).unwrap()),
            10,
        ),
        (
            "fixed_window",
            Limit::FixedWindow(FixedWindow::new(100, Nanos::SECOND, Align::Epoch).unwrap()),
            10,
        ),
        (
            "sliding_window (2 buckets)",
            Limit::SlidingWindow(SlidingWindow::new(100, Nanos::SECOND, 2).unwrap()),
            10,
        ),
        (
            "sliding_window (5 buckets)",
            Limit::SlidingWindow(SlidingWindow::new(100, ms(60_000), 5).unwrap()),
            10,
        ),
        (
            "sliding_log (1 hit logged)",
            Limit::SlidingLog(SlidingLog::new(100, Nanos::SECOND).unwrap()),
            1,
        ),
        (
            "sliding_log (100 hits logged)",
            Limit::SlidingLog(SlidingLog::new(100, Nanos::SECOND).unwrap()),
            100,
        ),
        (
            "smooth_bursty",
            Limit::Smooth(Smooth::bursty(rate, 1.0).unwrap()),
            10,
        ),
        (
            "smooth_warming_up",
            Limit::Smooth(Smooth::warming_up(rate, Nanos::SECOND, 3.0).unwrap()),
            10,
        ),
        (
            "burst_tiers (2 tiers, 1 hit)",
            Limit::BurstTiers(BurstTiers::new(vec![tier(50, true), tier(100, false)]).unwrap()),
            1,
        ),
    ]
}

fn state_sizes() {
    println!("# Bytes of state per key (map overhead excluded)");
    println!();
    println!(
        "`size_of::<LimitState>()` = {} (every stored state has this inline size); \
         the algorithm's own state type; `LimitState::footprint()` = inline + heap.",
        size_of::<LimitState>()
    );
    println!();
    println!("| algorithm | `size_of` its state type | footprint (inline + heap) |");
    println!("|---|---:|---:|");
    for (name, limit, hits) in states() {
        let mut state = limit.fresh();
        for i in 0..hits {
            let at = NOW.saturating_add(Nanos::from_millis(i));
            limit.decide(&mut state, at, Hits::exactly(1));
        }
        let own = match &state {
            LimitState::TokenBucket(_) => size_of::<TokenBucketState>(),
            LimitState::Gcra(_) => size_of::<GcraState>(),
            LimitState::FixedWindow(_) => size_of::<FixedWindowState>(),
            LimitState::SlidingWindow(_) => size_of::<SlidingWindowState>(),
            LimitState::SlidingLog(_) => size_of::<HitLog>(),
            LimitState::Smooth(_) => size_of::<SmoothState>(),
            LimitState::BurstTiers(_) => size_of::<TierState>(),
            LimitState::Replicated(_) => {
                size_of::<tollgate_core::replicated::strategy::ReplicatedState>()
            }
        };
        println!("| {name} | {own} | {} |", state.footprint());
    }
    println!();
    println!(
        "Per stored key the memory store also keeps its `Key` ({} bytes: `LimitId` + \
         domain name, inline up to 22 bytes) and an `Arc<Limit>` ({} bytes), \
         counted below as map overhead.",
        size_of::<Key>(),
        size_of::<Arc<Limit>>()
    );
    println!();
}

// ------------------------------------------------------ resident memory

fn resident(keys: usize) {
    println!("# Resident memory, {keys} active keys (fresh process each)");
    println!();
    println!("| store | algorithm | keys stored | RSS before | RSS after | bytes/key (RSS) |");
    println!("|---|---|---:|---:|---:|---:|");
    let exe = std::env::current_exe().unwrap();
    let children = STORED
        .iter()
        .map(|s| s.to_string())
        .chain(["governor-string".to_string(), "governor-u64".to_string()]);
    for what in children {
        let out = Command::new(&exe)
            .args(["--child", &what, &keys.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "child {what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    println!();
    println!(
        "Keys are `user-<n>` (at most 12 bytes, kept inline in the key); \
         RSS is read from /proc/self/statm."
    );
}

/// Inserts `keys` keys into one limiter and prints one table row.
fn child(what: &str, keys: usize) {
    let before = rss_bytes();
    if let Some(limit) = stored_limit(what) {
        let limit = Arc::new(limit);
        let store = MemoryStore::new();
        let mut scope = String::new();
        for i in 0..keys {
            scope.clear();
            push_scope(&mut scope, i);
            // Built per key and dropped at once: only the store's copy of
            // the key stays resident.
            let plan = Plan::single(Key::new(LimitId(1), &scope), Arc::clone(&limit));
            let d = store.decide_now(&plan, NOW, Hits::exactly(1), Mode::Try);
            assert!(d.is_ok_and(|d| d.allowed));
        }
        // Every key is active at `NOW`: a sweep then drops none.
        assert_eq!(store.sweep_now(NOW), 0);
        let stored = store.stats().keys;
        let after = rss_bytes();
        black_box(&store);
        ("tollgate MemoryStore", what.to_string(), stored).report(before, after);
        return;
    }
    let quota = Quota::per_second(NonZeroU32::new(100).unwrap());
    match what {
        "governor-string" => {
            let lim: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(quota);
            let mut scope = String::new();
            for i in 0..keys {
                scope.clear();
                push_scope(&mut scope, i);
                assert!(lim.check_key(&scope).is_ok());
            }
            let stored = lim.len();
            let after = rss_bytes();
            black_box(&lim);
            ("governor keyed (String)", "gcra".to_string(), stored).report(before, after);
        }
        "governor-u64" => {
            let lim: DefaultKeyedRateLimiter<u64> = RateLimiter::keyed(quota);
            for i in 0..keys {
                assert!(lim.check_key(&(i as u64)).is_ok());
            }
            let stored = lim.len();
            let after = rss_bytes();
            black_box(&lim);
            ("governor keyed (u64)", "gcra".to_string(), stored).report(before, after);
        }
        other => panic!("unknown child {other}"),
    }
}

trait Report {
    fn report(self, before: u64, after: u64);
}

impl Report for (&str, String, usize) {
    fn report(self, before: u64, after: u64) {
        let (store, algorithm, stored) = self;
        let per_key = after.saturating_sub(before) as f64 / stored.max(1) as f64;
        println!(
            "| {store} | {algorithm} | {stored} | {} | {} | {per_key:.0} |",
            mib(before),
            mib(after)
        );
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `user-<i>`, the scope the benchmarks use.
fn push_scope(s: &mut String, i: usize) {
    use std::fmt::Write;
    write!(s, "user-{i}").unwrap();
}

/// Resident set size in bytes, from `/proc/self/statm` (in pages).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc/self/statm");
    let pages: u64 = statm
        .split_ascii_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's second field: resident pages");
    pages * page_size()
}

/// The page size, from the auxiliary vector (`AT_PAGESZ`), without libc.
fn page_size() -> u64 {
    const AT_PAGESZ: u64 = 6;
    if let Ok(auxv) = std::fs::read("/proc/self/auxv") {
        for pair in auxv.chunks_exact(16) {
            let key = u64::from_ne_bytes(pair[..8].try_into().unwrap());
            let value = u64::from_ne_bytes(pair[8..].try_into().unwrap());
            match key {
                AT_PAGESZ => return value,
                0 => break,
                _ => {}
            }
        }
    }
    4096
}
