//! Instructions per decision of the memory store, counted by callgrind:
//! stable on a busy machine, where timings are not (`docs/benchmarks.md`).
//!
//! ```text
//! crates/store/benches/instructions.sh            # every algorithm, both paths
//! instructions <algorithm> <limit|plan> <decisions> [rounds]
//! ```
//!
//! Stores one key of the named algorithm (the parameter sets of the
//! `decide` benchmark, `benches/common/algorithms.rs`) and decides it
//! `<decisions>` times with synthetic time, through `measured`, a function
//! the loop cannot inline: `decide_limit` for `limit`, `decide_now` on a
//! one-item plan for `plan`. Run under
//! `valgrind --tool=callgrind --toggle-collect='instructions::measured'`,
//! callgrind's total divided by `<decisions>` is the instructions per
//! decision; the script does that for every algorithm. Given `rounds`, it
//! runs that many rounds of `<decisions>` natively and prints the fastest
//! round's nanoseconds per decision instead: a quick timing, for
//! comparing two builds run alternately on a quiet machine.

use std::hint::black_box;
use std::sync::Arc;

use tollgate_core::{Hits, Limit, Mode, Nanos};
use tollgate_store::{Key, LimitId, MemoryStore, Plan};

// The benchmarks' parameter sets: constants, built with `unwrap`, that no
// argument reaches.
#[allow(clippy::unwrap_used)]
#[path = "../benches/common/algorithms.rs"]
mod algorithms;
use algorithms::{algorithms, STEP};

/// A plausible Unix-epoch time (November 2023) to start synthetic time at.
const T0: u64 = 1_700_000_000_000_000_000;

/// One decision. The whole answer goes through `black_box`, so that none
/// of it (remaining, retry and reset times) is optimised away because only
/// `allowed` is used here: a server encodes all of it.
#[inline(never)]
fn measured(store: &MemoryStore, plan: &Plan, limit: &Arc<Limit>, now: Nanos, lean: bool) -> bool {
    let one = Hits::exactly(1);
    if lean {
        let d = store.decide_limit(&plan.items()[0].key, limit, now, one);
        black_box(&d).as_ref().is_ok_and(|d| d.allowed)
    } else {
        let d = store.decide_now(plan, now, one, Mode::Try);
        black_box(&d).as_ref().is_ok_and(|d| d.allowed)
    }
}

/// Prints what was wrong with the arguments, if anything, and the usage,
/// then exits with status 2 (`instructions.sh` reads the algorithm names
/// from the usage of a run without arguments).
fn usage(problem: Option<String>) -> ! {
    if let Some(problem) = problem {
        eprintln!("instructions: {problem}");
    }
    let names: Vec<&str> = algorithms().iter().map(|(n, _)| *n).collect();
    eprintln!(
        "usage: instructions <algorithm> <limit|plan> <decisions> [rounds]\nalgorithms: {}",
        names.join(" ")
    );
    std::process::exit(2);
}

/// `arg` as a count of at least one, or the usage.
fn count(what: &str, arg: &str) -> u64 {
    match arg.parse() {
        Ok(n) if n > 0 => n,
        _ => usage(Some(format!("{what} {arg:?}: not a positive number"))),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (name, path, decisions, rounds) = match &args[..] {
        [name, path, decisions] => (name, path, decisions, None),
        [name, path, decisions, rounds] => (name, path, decisions, Some(rounds)),
        _ => usage(None),
    };
    let Some((_, limit)) = algorithms().into_iter().find(|(n, _)| n == name) else {
        usage(Some(format!("unknown algorithm {name:?}")))
    };
    let lean = match path.as_str() {
        "limit" => true,
        "plan" => false,
        other => usage(Some(format!("path {other:?}: limit or plan"))),
    };
    let decisions = count("decisions", decisions);
    let rounds = rounds.map(|r| count("rounds", r));
    let limit = Arc::new(limit);
    let store = MemoryStore::new();
    let plan = Plan::single(Key::new(LimitId(1), "user-1"), Arc::clone(&limit));
    let mut now = T0;
    // Stored before measuring, as in the `decide` benchmark.
    black_box(measured(&store, &plan, &limit, Nanos::new(now), lean));
    if let Some(rounds) = rounds {
        let mut best = f64::MAX;
        for _ in 0..rounds {
            let start = std::time::Instant::now();
            for _ in 0..decisions {
                now += STEP;
                black_box(measured(&store, &plan, &limit, Nanos::new(now), lean));
            }
            best = best.min(start.elapsed().as_nanos() as f64 / decisions as f64);
        }
        println!("{name} {path}: {best:.1} ns per decision, best of {rounds}");
        return;
    }
    let mut granted = 0u64;
    for _ in 0..decisions {
        now += STEP;
        granted += u64::from(measured(&store, &plan, &limit, Nanos::new(now), lean));
    }
    println!("{name} {path}: {granted} of {decisions} granted");
}
