//! tollgate's memory store against governor's keyed GCRA limiter,
//! interleaved: `cargo bench -p tollgate-store --bench versus`.
//!
//! Why a second harness beside criterion's `decide`: on a shared or
//! virtualised machine, noise comes in bursts of seconds. criterion measures
//! each contender in its own window, so a burst lands on one side and moves
//! the ratio by tens of percent between runs. Here every contender runs in
//! short chunks (200,000 decisions), round-robin, for many rounds, and each
//! keeps its fastest chunk: a burst of noise cannot favour one side, and
//! the figure is what each costs when undisturbed.
//!
//! Contenders decide one GCRA limit per key, reading the same TSC clock on
//! every decision (governor: its `QuantaClock`; tollgate: the same `quanta`
//! calls):
//! - `tollgate`: `MemoryStore::decide_limit` (the single-limit path);
//! - `tollgate-plan`: `MemoryStore::decide_now` on one-item plans;
//! - `governor-string`: `DefaultKeyedRateLimiter<String>`, the like-for-like
//!   comparison (tollgate's keys are strings);
//! - `governor-u64`: governor's best case, integer keys.
//!
//! Environment: `VERSUS_ROUNDS` (default 40), `VERSUS_FILTER` (a substring
//! of the scenario names to run), `VERSUS_CHUNK` (decisions per thread in
//! a chunk, default 200,000: shorter chunks find more undisturbed windows
//! on a busy machine, at the price of timer and thread-start overhead).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: failing loudly is right

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate_core::{Gcra, Hits, Limit, Mode, Nanos, Rate};
use tollgate_store::{Key, LimitId, MemoryStore, Plan};

#[path = "common/tsc.rs"]
mod tsc;
use tsc::TscClock;

/// Decisions per thread in a chunk, unless `VERSUS_CHUNK` says otherwise.
const CHUNK: usize = 200_000;
const MANY: usize = 1_000_000;

/// A fixed pseudo-random permutation of `0..n` (xorshift64* Fisher–Yates).
fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..n).rev() {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        order.swap(
            i,
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) % (i as u64 + 1)) as usize,
        );
    }
    order
}

/// Runs `chunk` decisions over `keys`, round and round.
#[inline(always)]
fn walk<F: Fn(usize) -> bool>(keys: &[usize], chunk: usize, f: &F) {
    let mut ok = 0u64;
    let mut k = 0;
    for _ in 0..chunk {
        ok += u64::from(f(keys[k]));
        // No `%`: a runtime division per decision would blur both sides.
        k += 1;
        if k == keys.len() {
            k = 0;
        }
    }
    black_box(ok);
}

/// Nanoseconds per decision (aggregate over threads) for one chunk: each
/// thread walks its own slice of `order` (or all of it, when shared). The
/// clock runs from the first thread leaving the barrier to the last one
/// finishing, so starting threads is not counted (it would weigh on short
/// chunks).
fn chunk<F: Fn(usize) -> bool + Sync>(
    threads: usize,
    order: &[usize],
    shared: bool,
    decisions: usize,
    f: &F,
) -> f64 {
    let barrier = Barrier::new(threads);
    let per = if shared {
        order.len()
    } else {
        order.len() / threads
    };
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                let mine = if shared {
                    order
                } else {
                    &order[t * per..(t + 1) * per]
                };
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    walk(mine, decisions, f);
                    (start, Instant::now())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let start = spans.iter().map(|s| s.0).min().unwrap();
    let end = spans.iter().map(|s| s.1).max().unwrap();
    (end - start).as_nanos() as f64 / (decisions * threads) as f64
}

// Each contender decides behind a function that is never inlined into the
// measuring loop: both are measured as a call into their library, as a
// server pays it, and neither figure depends on how the loop around it
// happened to be compiled (inlined, they moved by 15 to 50% with
// unrelated changes to this file).

// tollgate's whole answer goes through `black_box`: only `allowed` is used
// here, and once the store's decision is inlined into these functions the
// compiler would otherwise skip what a server encodes (remaining, retry
// and reset times, with their division).

#[inline(never)]
fn tollgate_decide(store: &MemoryStore, key: &Key, limit: &Arc<Limit>, now: Nanos) -> bool {
    let d = store.decide_limit(key, limit, now, Hits::exactly(1));
    black_box(&d).as_ref().is_ok_and(|d| d.allowed)
}

#[inline(never)]
fn tollgate_plan_decide(store: &MemoryStore, plan: &Plan, now: Nanos) -> bool {
    let d = store.decide_now(plan, now, Hits::exactly(1), Mode::Try);
    black_box(&d).as_ref().is_ok_and(|d| d.allowed)
}

#[inline(never)]
fn governor_string(limiter: &DefaultKeyedRateLimiter<String>, key: &String) -> bool {
    limiter.check_key(key).is_ok()
}

#[inline(never)]
fn governor_u64(limiter: &DefaultKeyedRateLimiter<u64>, key: u64) -> bool {
    limiter.check_key(&key).is_ok()
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is expected.
    let rounds: usize = std::env::var("VERSUS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let filter = std::env::var("VERSUS_FILTER").unwrap_or_default();
    let decisions: usize = std::env::var("VERSUS_CHUNK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CHUNK);
    let scenarios: [(&str, usize, usize, bool); 5] = [
        ("1t_hot", 1, 1, false),
        ("1t_1M", 1, MANY, false),
        ("2t_distinct", 2, 2 * 1024, false),
        ("2t_distinct_1M", 2, MANY, false),
        ("2t_shared_hot", 2, 1, true),
    ];
    println!(
        "best of {rounds} interleaved chunks of {decisions} decisions per thread; ns per decision"
    );
    println!();
    println!("| scenario | tollgate | tollgate-plan | governor (String) | governor (u64) | tollgate ÷ governor (String) | tollgate ÷ governor (u64) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (shape, per_sec, burst) in [("allow", 1_000_000_000u32, 1000u32), ("reject", 1, 1)] {
        for (scenario, threads, keys, shared) in scenarios {
            let name = format!("{scenario}_{shape}");
            if !name.contains(filter.as_str()) {
                continue;
            }
            let limit = Arc::new(Limit::Gcra(
                Gcra::new(
                    Rate::per_second(u64::from(per_sec)).unwrap(),
                    u64::from(burst),
                )
                .unwrap(),
            ));
            let quota = Quota::per_second(NonZeroU32::new(per_sec).unwrap())
                .allow_burst(NonZeroU32::new(burst).unwrap());
            let clock = TscClock::new();
            let names: Vec<String> = (0..keys).map(|i| format!("user-{i}")).collect();
            let tkeys: Vec<Key> = names.iter().map(|s| Key::new(LimitId(1), s)).collect();
            let plans: Vec<Plan> = tkeys
                .iter()
                .map(|k| Plan::single(k.clone(), Arc::clone(&limit)))
                .collect();
            let store = MemoryStore::new();
            let gov_s: DefaultKeyedRateLimiter<String> = RateLimiter::keyed(quota);
            let gov_u: DefaultKeyedRateLimiter<u64> = RateLimiter::keyed(quota);
            // Every key stored before measuring: no first-time inserts.
            for (i, k) in tkeys.iter().enumerate() {
                store
                    .decide_limit(k, &limit, clock.now(), Hits::exactly(1))
                    .unwrap();
                black_box(gov_s.check_key(&names[i]).is_ok());
                black_box(gov_u.check_key(&(i as u64)).is_ok());
            }
            let order = shuffled(keys);
            let tollgate = |j: usize| tollgate_decide(&store, &tkeys[j], &limit, clock.now());
            let tollgate_plan = |j: usize| tollgate_plan_decide(&store, &plans[j], clock.now());
            let governor_s = |j: usize| governor_string(&gov_s, &names[j]);
            let governor_u = |j: usize| governor_u64(&gov_u, j as u64);
            let mut best = [f64::MAX; 4];
            for _ in 0..rounds {
                best[0] = best[0].min(chunk(threads, &order, shared, decisions, &tollgate));
                best[2] = best[2].min(chunk(threads, &order, shared, decisions, &governor_s));
                best[1] = best[1].min(chunk(threads, &order, shared, decisions, &tollgate_plan));
                best[3] = best[3].min(chunk(threads, &order, shared, decisions, &governor_u));
            }
            println!(
                "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | **{:.2}** | {:.2} |",
                best[0],
                best[1],
                best[2],
                best[3],
                best[0] / best[2],
                best[0] / best[3]
            );
        }
    }
}
