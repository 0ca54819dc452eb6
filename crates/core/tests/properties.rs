//! Property tests: every algorithm against a naive reference model or a
//! brute-force bound, and the contracts every algorithm shares (exact
//! `retry_after`, maximal partial grants, monotone room, `is_idle`,
//! all-or-nothing plans, no panics).
//!
//! Times are generated as a start plus non-decreasing steps, biased towards
//! repeats, nanosecond jitter and multiples of 25 ms (the unit of every
//! generated window and period) ± 1 ns, so window edges are hit exactly.

// This whole file is test code, where a panic is how a check fails; the
// workspace's `allow-unwrap-in-tests` covers `#[test]` functions but not
// the helpers they share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

mod common;

use common::{cases, delta, start, UNIT};
use proptest::prelude::*;
use tollgate_core::algorithm::Schedule;
use tollgate_core::copies::{CopyError, CopyLimits, CopyPool, TransferId};
use tollgate_core::plan::{self, PlanEntry};
use tollgate_core::{
    Algorithm, Align, BurstTiers, Decision, FixedWindow, Gcra, Hits, LeakyBucket, Limit,
    LimitState, Mode, Nanos, Rate, SlidingLog, SlidingWindow, Smooth, Tier, TokenBucket,
};

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// Mostly well-formed requests; sometimes `min_hits > hits`.
fn request() -> impl Strategy<Value = Hits> {
    prop_oneof![
        8 => 0u64..=12,
        1 => 0u64..=200,
    ]
    .prop_flat_map(|hits| {
        (
            Just(hits),
            prop_oneof![6 => 0..=hits, 1 => Just(hits), 1 => Just(hits + 1)],
        )
    })
    .prop_map(|(hits, min_hits)| Hits { hits, min_hits })
}

#[derive(Clone, Debug)]
struct Step {
    delta: u64,
    req: Hits,
    /// Schedule `req.hits` with [`Mode::Acquire`] instead (where the
    /// algorithm can), which may leave the state in debt.
    acquire: bool,
}

fn steps(max: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (delta(), request(), prop::bool::weighted(0.1)).prop_map(|(delta, req, acquire)| Step {
            delta,
            req,
            acquire,
        }),
        1..max,
    )
}

/// Decides the steps' requests in order, scheduling those marked
/// `acquire` (if the algorithm can); yields each decided request's
/// `(now, request, state before, decision)`.
fn run(limit: &Limit, st: &mut LimitState, start: u64, steps: &[Step]) -> Vec<Decided> {
    let mut out = Vec::new();
    let mut now = start;
    for s in steps {
        now = now.saturating_add(s.delta);
        let t = Nanos::new(now);
        if s.acquire && limit.acquire(st, t, s.req.hits).is_some() {
            continue;
        }
        let before = st.clone();
        let d = limit.decide(st, t, s.req);
        out.push(Decided {
            now: t,
            req: s.req,
            before,
            after: st.clone(),
            d,
        });
    }
    out
}

/// One decided request of [`run`].
struct Decided {
    now: Nanos,
    req: Hits,
    before: LimitState,
    after: LimitState,
    d: Decision,
}

/// Yields `(now, request)` along a sequence (ignoring `acquire`).
fn times(start: u64, steps: &[Step]) -> Vec<(Nanos, Hits)> {
    let mut now = start;
    steps
        .iter()
        .map(|s| {
            now = now.saturating_add(s.delta);
            (Nanos::new(now), s.req)
        })
        .collect()
}

fn span() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        4 => (1u64..=40).prop_map(|k| Nanos::new(k * UNIT)),
        1 => (1u64..2_000_000_000).prop_map(Nanos::new),
    ]
}

fn rate() -> impl Strategy<Value = Rate> {
    (1u64..=10, 1u64..=40).prop_map(|(count, k)| Rate::new(count, Nanos::new(k * UNIT)).unwrap())
}

fn token_bucket() -> impl Strategy<Value = TokenBucket> {
    (1u64..=10, rate()).prop_map(|(cap, r)| TokenBucket::new(cap, r).unwrap())
}

fn token_bucket_any_initial() -> impl Strategy<Value = TokenBucket> {
    (1u64..=10, rate(), 0u64..=20)
        .prop_map(|(cap, r, init)| TokenBucket::with_initial(cap, r, init).unwrap())
}

fn gcra() -> impl Strategy<Value = Gcra> {
    (rate(), 1u64..=10).prop_map(|(r, b)| Gcra::new(r, b).unwrap())
}

fn leaky() -> impl Strategy<Value = LeakyBucket> {
    (rate(), 1u64..=10).prop_map(|(r, q)| LeakyBucket::new(r, q).unwrap())
}

fn fixed(align: Align) -> impl Strategy<Value = FixedWindow> {
    (1u64..=10, span()).prop_map(move |(l, w)| FixedWindow::new(l, w, align.clone()).unwrap())
}

fn sliding_window(buckets: std::ops::RangeInclusive<u32>) -> impl Strategy<Value = SlidingWindow> {
    (1u64..=10, span(), buckets).prop_map(|(l, w, b)| {
        // Every generated window is at least 1 ns per sub-window.
        SlidingWindow::new(l, w.max(Nanos::new(8)), b).unwrap()
    })
}

fn sliding_log_plain() -> impl Strategy<Value = SlidingLog> {
    (1u64..=10, span()).prop_map(|(l, w)| SlidingLog::new(l, w).unwrap())
}

fn sliding_log_any() -> impl Strategy<Value = SlidingLog> {
    (
        1u64..=10,
        span(),
        prop_oneof![Just(Nanos::ZERO), span()],
        any::<bool>(),
    )
        .prop_map(|(l, w, gap, counting)| {
            SlidingLog::new(l, w)
                .unwrap()
                .with_min_gap(gap)
                .counting_rejected(counting)
        })
}

fn smooth() -> impl Strategy<Value = Smooth> {
    let created = prop_oneof![Just(Nanos::ZERO), start().prop_map(Nanos::new)];
    prop_oneof![
        (
            rate(),
            prop_oneof![Just(0.0), Just(0.5), Just(1.0), Just(2.5)],
            created.clone()
        )
            .prop_map(|(r, b, c)| Smooth::bursty(r, b).unwrap().created_at(c)),
        (
            rate(),
            span(),
            prop_oneof![Just(1.0), Just(3.0), Just(10.0)],
            created
        )
            .prop_map(|(r, w, cf, c)| Smooth::warming_up(
                r,
                w.max(Nanos::from_micros(1)),
                cf
            )
            .unwrap()
            .created_at(c)),
    ]
}

fn tier() -> impl Strategy<Value = Tier> {
    (
        1u64..=5,
        span(),
        span(),
        prop_oneof![Just(Nanos::ZERO), span()],
        any::<bool>(),
    )
        .prop_map(|(limit, window, active, cooldown, skippable)| Tier {
            limit,
            window,
            active,
            cooldown,
            skippable,
        })
}

fn burst_tiers() -> impl Strategy<Value = BurstTiers> {
    prop::collection::vec(tier(), 0..=3).prop_map(|t| BurstTiers::new(t).unwrap())
}

/// Every algorithm, its token buckets and sliding logs drawn from the
/// strategies given (the two algorithms whose options decide whether a
/// rejection changes state).
fn every_algorithm(
    token_bucket: impl Strategy<Value = TokenBucket> + 'static,
    sliding_log: impl Strategy<Value = SlidingLog> + 'static,
) -> impl Strategy<Value = Limit> {
    prop_oneof![
        token_bucket.prop_map(Limit::TokenBucket),
        gcra().prop_map(Limit::Gcra),
        leaky().prop_map(Limit::LeakyBucket),
        prop_oneof![fixed(Align::Epoch), fixed(Align::FirstHit)].prop_map(Limit::FixedWindow),
        sliding_window(2..=5).prop_map(Limit::SlidingWindow),
        sliding_log.prop_map(Limit::SlidingLog),
        smooth().prop_map(Limit::Smooth),
        burst_tiers().prop_map(Limit::BurstTiers),
    ]
}

/// Any algorithm, with options that make rejections change state.
fn any_limit() -> impl Strategy<Value = Limit> {
    every_algorithm(token_bucket_any_initial(), sliding_log_any())
}

/// Any algorithm whose rejections record nothing (no `count_rejected`, no
/// token bucket refilling from a rejected first request).
fn quiet_limit() -> impl Strategy<Value = Limit> {
    every_algorithm(token_bucket(), sliding_log_plain())
}

/// The grant rule of Charon §3.1, written out again.
fn expected_grant(req: Hits, room: u64) -> (u64, bool) {
    if req.min_hits > req.hits {
        return (0, false);
    }
    let n = room.min(req.hits);
    if n >= req.min_hits {
        (n, true)
    } else {
        (0, false)
    }
}

/// Whether two states of `limit` admit the same at `now` and later: equal
/// for every algorithm but the logs, whose pruning may forget what no
/// longer counts.
fn assert_same_future(limit: &Limit, a: &LimitState, b: &LimitState, now: Nanos) {
    if !matches!(limit, Limit::SlidingLog(_) | Limit::BurstTiers(_)) {
        assert_eq!(a, b, "state changed");
        return;
    }
    for off in [
        0,
        1,
        2,
        UNIT - 1,
        UNIT,
        UNIT + 1,
        7 * UNIT,
        40 * UNIT,
        40 * UNIT + 1,
    ] {
        let t = now.saturating_add(Nanos::new(off));
        for hits in [1, 2, 3, 7, u64::MAX] {
            assert_eq!(
                limit.room(a, t, hits),
                limit.room(b, t, hits),
                "room for {hits} at now + {off}ns"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Naive reference models
// ---------------------------------------------------------------------------

proptest! {
    /// The sliding log admits exactly what a brute-force list of granted
    /// timestamps allows (a hit at `t` counts while `now <= t + window`),
    /// and so never more than `limit` in any window.
    #[test]
    fn sliding_log_matches_a_brute_force_log(
        log in sliding_log_plain(), start in start(), steps in steps(60),
    ) {
        let (limit, window) = (log.limit(), log.window().as_u64());
        let mut st = log.fresh();
        let mut granted: Vec<(u64, u64)> = Vec::new();
        for (now, req) in times(start, &steps) {
            let n = now.as_u64();
            let counted: u64 = granted
                .iter()
                .filter(|(t, _)| n <= t.saturating_add(window))
                .map(|(_, c)| c)
                .sum();
            let d = log.decide(&mut st, now, req);
            let (want, allowed) = expected_grant(req, limit - counted);
            prop_assert_eq!((d.granted, d.allowed), (want, allowed));
            prop_assert_eq!(d.remaining, limit - counted - d.granted);
            if d.granted > 0 {
                granted.push((n, d.granted));
            }
        }
        // No closed window [t, t + window] holds more than `limit`.
        for &(t, _) in &granted {
            let inside: u64 = granted
                .iter()
                .filter(|(u, _)| *u >= t && *u <= t.saturating_add(window))
                .map(|(_, c)| c)
                .sum();
            prop_assert!(inside <= limit, "{} hits in the window from {}", inside, t);
        }
    }

    /// With `min_gap` and `count_rejected`, fewer hits pass, never more.
    #[test]
    fn sliding_log_with_options_never_exceeds_the_limit(
        log in sliding_log_any(), start in start(), steps in steps(60),
    ) {
        let (limit, window) = (log.limit(), log.window().as_u64());
        let mut st = log.fresh();
        let mut granted: Vec<u64> = Vec::new();
        for (now, req) in times(start, &steps) {
            let d = log.decide(&mut st, now, req);
            granted.extend(std::iter::repeat_n(now.as_u64(), d.granted as usize));
        }
        for &t in &granted {
            let inside = granted
                .iter()
                .filter(|u| **u >= t && **u <= t.saturating_add(window))
                .count();
            prop_assert!(inside as u64 <= limit);
        }
    }

    /// Over any interval `[t_i, t_j]` between grants, a token bucket admits
    /// at most `capacity + (t_j - t_i) / T` hits (initial tokens at most the
    /// capacity; above it, the documented one-off burst returns after a
    /// long idle).
    #[test]
    fn token_bucket_never_exceeds_capacity_plus_refill(
        cap in 1u64..=10, r in rate(), init_frac in 0u64..=2,
        start in start(), steps in steps(60),
    ) {
        let initial = cap * init_frac / 2;
        let tb = TokenBucket::with_initial(cap, r, initial).unwrap();
        let interval = u128::from(r.interval().as_u64());
        let mut st = tb.fresh();
        let mut granted: Vec<(u64, u64)> = Vec::new();
        for (now, req) in times(start, &steps) {
            let d = tb.decide(&mut st, now, req);
            if d.granted > 0 {
                granted.push((now.as_u64(), d.granted));
            }
        }
        for i in 0..granted.len() {
            let mut sum = 0u128;
            for j in i..granted.len() {
                sum += u128::from(granted[j].1);
                let elapsed = u128::from(granted[j].0 - granted[i].0);
                prop_assert!(
                    sum <= u128::from(cap) + elapsed / interval,
                    "{} hits in {}ns", sum, elapsed
                );
            }
        }
    }

    /// Fixed windows aligned to the epoch: a count per `now / window`.
    #[test]
    fn fixed_window_epoch_matches_per_window_counts(
        fw in fixed(Align::Epoch), window in span(), start in start(), steps in steps(60),
    ) {
        let fw = FixedWindow::new(fw.limit(), window, Align::Epoch).unwrap();
        let w = window.as_u64();
        let mut st = fw.fresh();
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for (now, req) in times(start, &steps) {
            let c = counts.entry(now.as_u64() / w).or_insert(0);
            let d = fw.decide(&mut st, now, req);
            prop_assert_eq!((d.granted, d.allowed), expected_grant(req, fw.limit() - *c));
            *c += d.granted;
            prop_assert!(*c <= fw.limit());
            if *c > 0 {
                prop_assert_eq!(d.reset_after.as_u64(), w - now.as_u64() % w);
            }
        }
    }

    /// Fixed windows that start at the first hit after the previous one.
    #[test]
    fn fixed_window_first_hit_matches_a_reference(
        fw in fixed(Align::FirstHit), window in span(), start in start(), steps in steps(60),
    ) {
        let fw = FixedWindow::new(fw.limit(), window, Align::FirstHit).unwrap();
        let w = window.as_u64();
        let mut st = fw.fresh();
        let (mut begin, mut count) = (0u64, 0u64);
        for (now, req) in times(start, &steps) {
            let n = now.as_u64();
            if count > 0 && n >= begin.saturating_add(w) {
                count = 0;
            }
            let d = fw.decide(&mut st, now, req);
            prop_assert_eq!((d.granted, d.allowed), expected_grant(req, fw.limit() - count));
            if d.granted > 0 {
                if count == 0 {
                    begin = n;
                }
                count += d.granted;
            }
        }
    }

    /// GCRA decision for decision against the definition: `n` hits conform
    /// when `max(TAT, now) + n·T <= now + burst·T`.
    #[test]
    fn gcra_matches_a_naive_reference(
        r in rate(), burst in 1u64..=10, start in start(), steps in steps(60),
    ) {
        let g = Gcra::new(r, burst).unwrap();
        let t = u128::from(r.interval().as_u64());
        let mut st = g.fresh();
        let mut tat: u128 = 0;
        for (now, req) in times(start, &steps) {
            let n = u128::from(now.as_u64());
            let conforms = |k: u64| tat.max(n) + u128::from(k) * t <= n + u128::from(burst) * t;
            let room = (0..=req.hits.min(burst + 1)).rev().find(|&k| conforms(k)).unwrap_or(0);
            let d = g.decide(&mut st, now, req);
            let (want, allowed) = expected_grant(req, room);
            prop_assert_eq!((d.granted, d.allowed), (want, allowed));
            let remaining = (0..=burst).rev().find(|&k| {
                tat.max(n) + u128::from(want) * t + u128::from(k) * t <= n + u128::from(burst) * t
            });
            if want > 0 {
                tat = tat.max(n) + u128::from(want) * t;
            }
            prop_assert_eq!(Some(d.remaining), remaining);
            prop_assert_eq!(u128::from(st.tat.as_u64()), tat);
        }
    }

    /// `buckets: 2`: `current + previous × (W − elapsed) / W`, in integers:
    /// `n` fits when `(current + n)·W + previous·(W − e) <= limit·W`.
    #[test]
    fn sliding_window_two_buckets_matches_the_weighted_formula(
        limit in 1u64..=10, window in span(), start in start(), steps in steps(60),
    ) {
        let sw = SlidingWindow::new(limit, window, 2).unwrap();
        check_sliding_window(&sw, limit, window.as_u64(), 2, start, &steps)?;
    }

    /// `buckets: N`: N − 1 sub-windows of `window / (N − 1)`; the current
    /// and N − 2 whole ones count fully, the oldest by what is left of it.
    #[test]
    fn sliding_window_n_buckets_matches_the_weighted_formula(
        limit in 1u64..=10, window in span(), buckets in 2u32..=6,
        start in start(), steps in steps(60),
    ) {
        let window = window.max(Nanos::new(8));
        let sw = SlidingWindow::new(limit, window, buckets).unwrap();
        let sub = window.as_u64() / u64::from(buckets - 1);
        prop_assert_eq!(sw.sub_window().as_u64(), sub);
        check_sliding_window(&sw, limit, sub, buckets, start, &steps)?;
    }

    /// A leaky bucket's admitted requests proceed (`now + wait`) at least one
    /// interval per hit apart, and no more than `queue_size` hits are ever
    /// waiting (counting the one being released).
    #[test]
    fn leaky_bucket_output_is_smooth_and_bounded(
        r in rate(), queue in 1u64..=10, start in start(), steps in steps(60),
    ) {
        let lb = LeakyBucket::new(r, queue).unwrap();
        let t = r.interval().as_u64();
        let mut st = lb.fresh();
        // Each admitted hit's turn.
        let mut slots: Vec<u64> = Vec::new();
        let mut last_proceed: Option<u64> = None;
        for (now, req) in times(start, &steps) {
            let d = lb.decide(&mut st, now, req);
            if d.granted == 0 {
                prop_assert_eq!(d.wait, Nanos::ZERO);
                continue;
            }
            let proceed = now.as_u64() + d.wait.as_u64();
            if let Some(p) = last_proceed {
                prop_assert!(proceed >= p + d.granted * t, "{} after {}", proceed, p);
            }
            last_proceed = Some(proceed);
            slots.extend((0..d.granted).map(|k| proceed - k * t));
            let waiting = slots.iter().filter(|s| **s >= now.as_u64()).count() as u64;
            prop_assert!(waiting <= queue, "{} waiting, queue {}", waiting, queue);
        }
    }
}

fn check_sliding_window(
    sw: &SlidingWindow,
    limit: u64,
    sub: u64,
    buckets: u32,
    start: u64,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let n = u64::from(buckets);
    let mut counts: HashMap<u64, u64> = HashMap::new();
    let mut st = sw.fresh();
    for (now, req) in times(start, steps) {
        let idx = now.as_u64() / sub;
        let e = u128::from(now.as_u64() % sub);
        let whole: u64 = (0..n - 1)
            .filter_map(|k| idx.checked_sub(k))
            .map(|i| counts.get(&i).copied().unwrap_or(0))
            .sum();
        let oldest = idx
            .checked_sub(n - 1)
            .map_or(0, |i| counts.get(&i).copied().unwrap_or(0));
        let s = u128::from(sub);
        let fits = |k: u64| {
            u128::from(whole + k) * s + u128::from(oldest) * (s - e) <= u128::from(limit) * s
        };
        let room = (0..=req.hits.min(limit + 1))
            .rev()
            .find(|&k| fits(k))
            .unwrap_or(0);
        let d = sw.decide(&mut st, now, req);
        prop_assert_eq!((d.granted, d.allowed), expected_grant(req, room));
        *counts.entry(idx).or_insert(0) += d.granted;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Contracts shared by every algorithm
// ---------------------------------------------------------------------------

/// Times far enough ahead that anything that can happen has.
const FAR: [u64; 4] = [
    1_000_000_000,
    3_600_000_000_000,
    86_400_000_000_000,
    1 << 50,
];

proptest! {
    #![proptest_config(cases(512))]

    /// `retry_after = Some(d)`: a request for `min_hits` is refused at
    /// `now + d − 1ns` (when `d > 0`) and granted at `now + d`; `None`: it
    /// is never granted. Checked on copies of the state after every decision.
    #[test]
    fn retry_after_is_exact(limit in any_limit(), start in start(), steps in steps(40)) {
        let mut st = limit.fresh();
        for Decided { now, req, after: st, d, .. } in run(&limit, &mut st, start, &steps) {
            let probe = Hits::exactly(req.min_hits);
            match d.retry_after {
                Some(r) => {
                    let at = now.saturating_add(r);
                    prop_assume!(at < Nanos::MAX);
                    if !r.is_zero() {
                        let before = at.saturating_sub(Nanos::NANOSECOND);
                        let early = limit.decide(&mut st.clone(), before, probe);
                        prop_assert!(
                            !early.allowed,
                            "granted 1ns before retry_after {:?}: {:?}", r, d
                        );
                    } else {
                        prop_assert!(limit.room(&st, now, req.min_hits) >= req.min_hits);
                    }
                    let on_time = limit.decide(&mut st.clone(), at, probe);
                    prop_assert!(on_time.allowed, "refused at retry_after {:?}: {:?}", r, d);
                }
                None => {
                    for far in FAR {
                        let t = now.saturating_add(Nanos::new(far));
                        let later = limit.decide(&mut st.clone(), t, probe);
                        prop_assert!(!later.allowed, "retry_after None, granted {}ns later", far);
                    }
                }
            }
        }
    }

    /// A partial grant is the largest possible: the state before the
    /// decision would refuse one more. A rejection means `min_hits` did not
    /// fit. Either way the grant obeys Charon's rule.
    #[test]
    fn partial_grants_are_maximal(limit in any_limit(), start in start(), steps in steps(40)) {
        let mut st = limit.fresh();
        for Decided { now, req, before, d, .. } in run(&limit, &mut st, start, &steps) {
            let room = limit.room(&before, now, req.hits);
            prop_assert_eq!((d.granted, d.allowed), expected_grant(req, room));
            if !req.is_well_formed() {
                continue;
            }
            if d.allowed && d.granted < req.hits {
                let more = limit.decide(&mut before.clone(), now, Hits::exactly(d.granted + 1));
                prop_assert!(
                    !more.allowed,
                    "{} granted, {} would have fit", d.granted, d.granted + 1
                );
            }
            if !d.allowed {
                let min = limit.decide(&mut before.clone(), now, Hits::exactly(req.min_hits));
                prop_assert!(!min.allowed, "rejected, yet min_hits {} fits", req.min_hits);
            }
        }
    }

    /// Room is monotone: `room(h1) == min(room(h2), h1)` for `h1 <= h2`, so
    /// admitting `n` means admitting any fewer.
    #[test]
    fn room_is_monotone(
        limit in any_limit(), start in start(), steps in steps(40),
        probes in prop::collection::vec((0u64..=15, 0u64..=15), 4),
    ) {
        let mut st = limit.fresh();
        for Decided { now, req, after: st, .. } in run(&limit, &mut st, start, &steps) {
            let mut hs: Vec<(u64, u64)> = probes.clone();
            hs.push((0, u64::MAX));
            hs.push((req.min_hits, req.hits));
            for (a, b) in hs {
                let (h1, h2) = (a.min(b), a.max(b));
                let r1 = limit.room(&st, now, h1);
                let r2 = limit.room(&st, now, h2);
                prop_assert!(r1 <= h1 && r2 <= h2);
                prop_assert_eq!(r1, r2.min(h1), "room({}) vs room({})", h1, h2);
            }
        }
    }

    /// A state that `is_idle` decides exactly like a fresh one, for the next
    /// requests (the store may drop it).
    #[test]
    fn idle_states_decide_like_fresh_ones(
        limit in any_limit(), start in start(), steps in steps(40),
        gap in prop_oneof![Just(0u64), delta(), 0u64..100_000_000_000],
        after in steps(6),
    ) {
        let mut st = limit.fresh();
        let last: u64 = steps.iter().fold(start, |t, s| t.saturating_add(s.delta));
        run(&limit, &mut st, start, &steps);
        let now = Nanos::new(last).saturating_add(Nanos::new(gap));
        if limit.is_idle(&st, now) {
            let mut fresh = limit.fresh();
            for (t, req) in times(now.as_u64(), &after) {
                let a = limit.decide(&mut st, t, req);
                let b = limit.decide(&mut fresh, t, req);
                prop_assert_eq!(a, b, "idle state and fresh state differ at {:?}", t);
            }
        }
    }

    /// `plan::decide` grants the minimum of the non-shadow entries' own
    /// rooms (capped at `hits`, under Charon's rule) in every entry, or
    /// nothing in any; a rejected plan changes no state.
    #[test]
    fn plans_are_all_or_nothing(
        limits in prop::collection::vec((quiet_limit(), prop::bool::weighted(0.2)), 2..=3),
        start in start(), steps in steps(30),
    ) {
        let mut states: Vec<LimitState> = limits.iter().map(|(l, _)| l.fresh()).collect();
        for (now, req) in times(start, &steps) {
            let before = states.clone();
            let rooms: Vec<u64> = limits
                .iter()
                .zip(&states)
                .map(|((l, _), s)| l.room(s, now, req.hits))
                .collect();
            let min_room = limits
                .iter()
                .zip(&rooms)
                .filter(|((_, shadow), _)| !shadow)
                .map(|(_, r)| *r)
                .min()
                .unwrap_or(u64::MAX);
            let (want, allowed) = expected_grant(req, min_room);
            let mut entries: Vec<PlanEntry<'_>> = limits
                .iter()
                .zip(states.iter_mut())
                .map(|((limit, shadow), state)| PlanEntry { limit, state, shadow: *shadow, hits: None })
                .collect();
            let p = plan::decide(&mut entries, now, req, Mode::Try).unwrap();
            drop(entries);
            prop_assert_eq!((p.granted, p.allowed), (want, allowed));
            prop_assert_eq!(&p.rooms[..], &rooms[..]);
            prop_assert_eq!(p.decisions.len(), limits.len());
            let summary = p.summary();
            prop_assert_eq!((summary.granted, summary.allowed), (want, allowed));
            // A shadow entry records what it would as a live limit: the
            // request against it and the live limits together.
            let live = |i: usize| expected_grant(req, rooms[i].min(min_room)).0;
            for (i, ((limit, shadow), d)) in limits.iter().zip(&p.decisions).enumerate() {
                if *shadow {
                    prop_assert_eq!(d.granted, live(i));
                } else {
                    prop_assert_eq!((d.granted, d.allowed), (want, allowed), "entry {}", i);
                }
                if !allowed || (*shadow && live(i) == 0) {
                    assert_same_future(limit, &before[i], &states[i], now);
                }
            }
            if req.is_well_formed() && want < req.hits {
                let i = p.limited_by.expect("limited_by names the bounding entry");
                prop_assert!(!limits[i].1 && rooms[i] == min_room);
            } else {
                prop_assert_eq!(p.limited_by, None);
            }
            let shadow_limited = limits
                .iter()
                .enumerate()
                .any(|(i, (_, shadow))| *shadow && live(i) < want);
            prop_assert_eq!(p.shadow_limited, shadow_limited);
        }
    }
}

proptest! {
    /// Entries asked hits of their own (Envoy descriptors with their own
    /// `hits_addend`) keep the plan all or nothing: it is granted only if
    /// every live entry with its own hits has room for all of them and the
    /// rest grant the request; then each entry records exactly what it
    /// would alone for its own hits (the rest the request's grant), else
    /// none records anything.
    #[test]
    fn plans_with_hits_of_their_own_are_all_or_nothing(
        limits in prop::collection::vec(
            (quiet_limit(), prop::bool::weighted(0.2), prop::option::weighted(0.7, 0u64..6)),
            2..=3,
        ),
        start in start(), steps in steps(30),
    ) {
        let mut states: Vec<LimitState> = limits.iter().map(|(l, _, _)| l.fresh()).collect();
        for (now, req) in times(start, &steps) {
            let before = states.clone();
            let asked = |own: &Option<u64>| own.map_or(req, Hits::exactly);
            let rooms: Vec<u64> = limits
                .iter()
                .zip(&states)
                .map(|((l, _, own), s)| l.room(s, now, asked(own).hits))
                .collect();
            let live = |i: usize| !limits[i].1;
            let shared_room = (0..limits.len())
                .filter(|&i| live(i) && limits[i].2.is_none())
                .map(|i| rooms[i])
                .min()
                .unwrap_or(u64::MAX);
            let own_fit = (0..limits.len())
                .filter(|&i| live(i))
                .all(|i| limits[i].2.is_none_or(|h| rooms[i] >= h));
            let (want, shared_allowed) = expected_grant(req, shared_room);
            let allowed = shared_allowed && own_fit;
            let want = if own_fit { want } else { 0 };
            // What each entry alone would record for what it is asked.
            let alone: Vec<LimitState> = limits
                .iter()
                .zip(&before)
                .map(|((l, _, own), s)| {
                    let mut s = s.clone();
                    l.decide(&mut s, now, asked(own));
                    s
                })
                .collect();
            let mut entries: Vec<PlanEntry<'_>> = limits
                .iter()
                .zip(states.iter_mut())
                .map(|((limit, shadow, own), state)| PlanEntry {
                    limit,
                    state,
                    shadow: *shadow,
                    hits: *own,
                })
                .collect();
            let p = plan::decide(&mut entries, now, req, Mode::Try).unwrap();
            drop(entries);
            prop_assert_eq!(p.allowed, allowed);
            let all_own = limits.iter().all(|(_, _, own)| own.is_some());
            let granted = if all_own && allowed { req.hits } else { want };
            prop_assert_eq!(p.granted, granted);
            prop_assert_eq!(&p.rooms[..], &rooms[..]);
            for (i, ((limit, shadow, own), d)) in limits.iter().zip(&p.decisions).enumerate() {
                let expect = match own {
                    Some(h) if allowed && (!*shadow || rooms[i] >= *h) => *h,
                    Some(_) => 0,
                    None if *shadow => {
                        if own_fit {
                            expected_grant(req, rooms[i].min(shared_room)).0
                        } else {
                            0
                        }
                    }
                    None => want,
                };
                prop_assert_eq!(d.granted, expect, "entry {}", i);
                if expect == 0 {
                    assert_same_future(limit, &before[i], &states[i], now);
                } else if own.is_some() {
                    prop_assert_eq!(&states[i], &alone[i], "entry {} differs from alone", i);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// No input panics
// ---------------------------------------------------------------------------

fn edge() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(999),
        Just(1000),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(1 << 62),
        Just((1 << 62) + 1),
        Just(i64::MAX as u64),
        Just(i64::MAX as u64 + 1),
        1u64..1000,
        any::<u64>(),
    ]
}

fn edge_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(1.0),
        Just(3.0),
        Just(1e-300),
        Just(1e300),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
        Just(f64::EPSILON),
        0.0f64..100.0,
    ]
}

fn edge_rate() -> impl Strategy<Value = Option<Rate>> {
    (edge(), edge()).prop_map(|(c, p)| Rate::new(c, Nanos::new(p)).ok())
}

/// Any algorithm with extreme parameters, or `None` if they are refused.
fn extreme_limit() -> impl Strategy<Value = Option<Limit>> {
    prop_oneof![
        (edge(), edge_rate(), edge()).prop_map(|(c, r, i)| r
            .and_then(|r| TokenBucket::with_initial(c, r, i).ok())
            .map(Limit::TokenBucket)),
        (edge_rate(), edge())
            .prop_map(|(r, b)| r.and_then(|r| Gcra::new(r, b).ok()).map(Limit::Gcra)),
        (edge_rate(), edge()).prop_map(|(r, q)| r
            .and_then(|r| LeakyBucket::new(r, q).ok())
            .map(Limit::LeakyBucket)),
        (edge(), edge(), any::<bool>()).prop_map(|(l, w, first)| {
            let align = if first { Align::FirstHit } else { Align::Epoch };
            FixedWindow::new(l, Nanos::new(w), align)
                .ok()
                .map(Limit::FixedWindow)
        }),
        (edge(), edge(), 0u32..=1100).prop_map(|(l, w, b)| SlidingWindow::new(l, Nanos::new(w), b)
            .ok()
            .map(Limit::SlidingWindow)),
        (edge(), edge(), edge(), any::<bool>()).prop_map(|(l, w, g, c)| {
            SlidingLog::new(l, Nanos::new(w))
                .ok()
                .map(|s| Limit::SlidingLog(s.with_min_gap(Nanos::new(g)).counting_rejected(c)))
        }),
        (edge_rate(), edge_f64(), edge()).prop_map(|(r, b, c)| r
            .and_then(|r| Smooth::bursty(r, b).ok())
            .map(|s| Limit::Smooth(s.created_at(Nanos::new(c))))),
        (edge_rate(), edge(), edge_f64(), edge()).prop_map(|(r, w, cf, c)| r
            .and_then(|r| Smooth::warming_up(r, Nanos::new(w), cf).ok())
            .map(|s| Limit::Smooth(s.created_at(Nanos::new(c))))),
        prop::collection::vec((edge(), edge(), edge(), edge(), any::<bool>()), 0..=3).prop_map(
            |tiers| BurstTiers::new(
                tiers
                    .into_iter()
                    .map(|(limit, w, a, c, skippable)| Tier {
                        limit,
                        window: Nanos::new(w),
                        active: Nanos::new(a),
                        cooldown: Nanos::new(c),
                        skippable,
                    })
                    .collect()
            )
            .ok()
            .map(Limit::BurstTiers)
        ),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Decide { which: bool, now: u64, req: Hits },
    Acquire { which: bool, now: u64, hits: u64 },
    Plan { now: u64, req: Hits, acquire: bool },
}

fn op() -> impl Strategy<Value = Op> {
    let req = || (edge(), edge()).prop_map(|(hits, min_hits)| Hits { hits, min_hits });
    prop_oneof![
        4 => (any::<bool>(), edge(), req())
            .prop_map(|(which, now, req)| Op::Decide { which, now, req }),
        2 => (any::<bool>(), edge(), edge())
            .prop_map(|(which, now, hits)| Op::Acquire { which, now, hits }),
        1 => (edge(), req(), any::<bool>())
            .prop_map(|(now, req, acquire)| Op::Plan { now, req, acquire }),
    ]
}

proptest! {
    #![proptest_config(cases(2048))]

    /// Extreme parameters, huge requests, `u64::MAX` hits, times in any
    /// order (backwards included) and a key whose algorithm changes under
    /// it: nothing panics, and the basic invariants still hold.
    #[test]
    fn no_input_panics(
        a in extreme_limit(),
        b in extreme_limit(),
        ops in prop::collection::vec(op(), 1..30),
    ) {
        let (Some(a), Some(b)) = (a, b) else { return Ok(()); };
        let mut st = a.fresh();
        let mut other = b.fresh();
        for op in ops {
            match op {
                Op::Decide { which, now, req } => {
                    let l = if which { &a } else { &b };
                    let now = Nanos::new(now);
                    let room = l.room(&st, now, req.hits);
                    prop_assert!(room <= req.hits);
                    let d = l.decide(&mut st, now, req);
                    prop_assert!(d.granted <= req.hits);
                    prop_assert!(!d.allowed || d.granted >= req.min_hits);
                    l.is_idle(&st, now);
                    st.footprint();
                }
                Op::Acquire { which, now, hits } => {
                    let l = if which { &a } else { &b };
                    if let Some(d) = l.acquire(&mut st, Nanos::new(now), hits) {
                        prop_assert!(d.allowed && d.granted == hits);
                    }
                }
                Op::Plan { now, req, acquire } => {
                    let mode = if acquire { Mode::Acquire } else { Mode::Try };
                    let mut entries = [
                        PlanEntry { limit: &a, state: &mut st, shadow: false, hits: None },
                        PlanEntry { limit: &b, state: &mut other, shadow: true, hits: None },
                    ];
                    if let Ok(p) = plan::decide(&mut entries, Nanos::new(now), req, mode) {
                        p.summary();
                        prop_assert!(p.granted <= req.hits);
                    }
                }
            }
        }
    }
}

/// The typed algorithms' `acquire` (not only through `Limit`) with huge
/// requests and backwards time.
#[test]
fn schedule_with_huge_requests_does_not_panic() {
    let r = Rate::per_second(1000).unwrap();
    let tb = TokenBucket::new(10, r).unwrap();
    let g = Gcra::new(r, 10).unwrap();
    let lb = LeakyBucket::new(r, 10).unwrap();
    let sm = Smooth::warming_up(r, Nanos::from_secs(1), 3.0).unwrap();
    let times = [0, u64::MAX, 1, u64::MAX - 1, 0, 1 << 62];
    let (mut a, mut b, mut c, mut d) = (tb.fresh(), g.fresh(), lb.fresh(), sm.fresh());
    for (i, t) in times.into_iter().enumerate() {
        let now = Nanos::new(t);
        for hits in [u64::MAX, 0, 1, u64::MAX / 2] {
            let w = [
                tb.acquire(&mut a, now, hits).wait,
                g.acquire(&mut b, now, hits).wait,
                lb.acquire(&mut c, now, hits).wait,
                sm.acquire(&mut d, now, hits).wait,
            ];
            assert!(w.iter().all(|w| *w <= Nanos::MAX), "step {i}");
        }
    }
    // Deep in debt, nothing is admitted.
    assert!(!tb.decide(&mut a, Nanos::new(5), Hits::exactly(1)).allowed);
    assert!(!g.decide(&mut b, Nanos::new(5), Hits::exactly(1)).allowed);
}

// ---------------------------------------------------------------------------
// Copy pools against a model
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum CopyOp {
    Reserve {
        domain: usize,
        min: u64,
        max: u64,
        limits: bool,
    },
    Release {
        domain: usize,
        groups: bool,
        copies: u64,
    },
    Transfer {
        domain: usize,
        groups: bool,
        copies: u64,
        id: u8,
        ttl: u64,
    },
    Seize {
        id: u8,
    },
    Advance {
        by: u64,
    },
}

fn copy_op() -> impl Strategy<Value = CopyOp> {
    prop_oneof![
        4 => (0usize..4, 0u64..3, 0u64..5, any::<bool>())
            .prop_map(|(domain, min, max, limits)| CopyOp::Reserve { domain, min, max, limits }),
        3 => (0usize..4, any::<bool>(), 0u64..4)
            .prop_map(|(domain, groups, copies)| CopyOp::Release { domain, groups, copies }),
        2 => (0usize..4, any::<bool>(), 0u64..3, 0u8..4, 0u64..5)
            .prop_map(|(domain, groups, copies, id, ttl)| {
                CopyOp::Transfer { domain, groups, copies, id, ttl }
            }),
        2 => (0u8..4).prop_map(|id| CopyOp::Seize { id }),
        1 => (0u64..4).prop_map(|by| CopyOp::Advance { by }),
    ]
}

/// The groups `domain` last reserved under (none if it never did).
fn group_list(last: &HashMap<usize, Vec<String>>, domain: usize) -> Vec<String> {
    last.get(&domain).cloned().unwrap_or_default()
}

proptest! {
    /// Random reserve/release/transfer/seize/expire sequences, with group
    /// membership changing between two configurations: the pool's counts
    /// always equal a model's sums, no limit is ever exceeded by a reserve,
    /// and every refused operation leaves the pool unchanged.
    #[test]
    fn copy_pool_counts_match_a_model(ops in prop::collection::vec(copy_op(), 1..60)) {
        let domains = ["a", "b", "c", "d"];
        // Membership moves: "b" is in g1 under the first limits, in g2 under
        // the second.
        let l1 = CopyLimits::new(3, Some(6))
            .with_group("g1", 4, ["a", "b"]).unwrap()
            .with_group("g2", 3, ["a", "c"]).unwrap()
            .with_override("d", 5);
        let l2 = CopyLimits::new(3, Some(6))
            .with_group("g1", 4, ["a"]).unwrap()
            .with_group("g2", 3, ["a", "b", "c"]).unwrap()
            .with_override("d", 5);
        let mut pool = CopyPool::default();
        // (domain, groups) -> held; id -> (domain, groups, copies, expires)
        let mut held: HashMap<(usize, Vec<String>), u64> = HashMap::new();
        let mut staged: HashMap<u8, (usize, Vec<String>, u64, u64)> = HashMap::new();
        let mut now = 0u64;
        let mut last_groups: HashMap<usize, Vec<String>> = HashMap::new();
        for op in ops {
            let before = pool.clone();
            match op {
                CopyOp::Reserve { domain, min, max, limits } => {
                    let limits = if limits { &l1 } else { &l2 };
                    let room = pool.room(limits, domains[domain]);
                    let r = pool.reserve(limits, domains[domain], Hits::between(min, max));
                    let want = expected_grant(Hits::between(min, max), room);
                    prop_assert_eq!((r.granted, r.allowed), want);
                    if r.granted > 0 {
                        *held.entry((domain, r.groups.clone())).or_insert(0) += r.granted;
                        last_groups.insert(domain, r.groups.clone());
                    } else {
                        prop_assert_eq!(&pool, &before);
                    }
                    let ctx = &r.context;
                    prop_assert!(ctx.domain_holds <= ctx.domain_limit || r.granted == 0);
                    let within_global = ctx.global_limit.is_none_or(|g| ctx.global_holds <= g);
                    prop_assert!(within_global || r.granted == 0);
                    for g in &ctx.groups {
                        prop_assert!(g.holds <= g.limit || r.granted == 0);
                    }
                }
                CopyOp::Release { domain, groups, copies } => {
                    let g = if groups { group_list(&last_groups, domain) } else { Vec::new() };
                    let h = held.get(&(domain, g.clone())).copied().unwrap_or(0);
                    let res = pool.release(domains[domain], &g, copies);
                    if copies == 0 {
                        prop_assert_eq!(res, Err(CopyError::ZeroCopies));
                    } else if copies > h {
                        let is_not_held = matches!(res, Err(CopyError::NotHeld { .. }));
                        prop_assert!(is_not_held);
                    } else {
                        prop_assert_eq!(res, Ok(()));
                        *held.get_mut(&(domain, g)).unwrap() -= copies;
                    }
                    if copies == 0 || copies > h {
                        prop_assert_eq!(&pool, &before);
                    }
                }
                CopyOp::Transfer { domain, groups, copies, id, ttl } => {
                    let g = if groups { group_list(&last_groups, domain) } else { Vec::new() };
                    let h = held.get(&(domain, g.clone())).copied().unwrap_or(0);
                    let tid = TransferId(id.into());
                    let expires = Nanos::new(now + ttl);
                    let res = pool.transfer(domains[domain], &g, copies, tid, expires);
                    if res.is_err() {
                        prop_assert_eq!(&pool, &before, "a refused transfer changes nothing");
                    }
                    let duplicate = staged.contains_key(&id);
                    if duplicate {
                        prop_assert_eq!(res, Err(CopyError::DuplicateTransfer(tid)));
                    } else if copies == 0 {
                        prop_assert_eq!(res, Err(CopyError::ZeroCopies));
                    } else if copies > h {
                        let is_not_held = matches!(res, Err(CopyError::NotHeld { .. }));
                        prop_assert!(is_not_held);
                    } else {
                        prop_assert_eq!(res, Ok(()));
                        *held.get_mut(&(domain, g.clone())).unwrap() -= copies;
                        staged.insert(id, (domain, g, copies, now + ttl));
                    }
                }
                CopyOp::Seize { id } => {
                    let res = pool.seize(TransferId(id.into()), Nanos::new(now));
                    staged.retain(|_, s| s.3 > now);
                    match staged.remove(&id) {
                        Some((domain, g, copies, _)) => {
                            let s = res.unwrap();
                            let got = (s.domain.as_str(), &s.groups, s.copies);
                            prop_assert_eq!(got, (domains[domain], &g, copies));
                            *held.entry((domain, g)).or_insert(0) += copies;
                        }
                        None => prop_assert_eq!(res, Err(CopyError::UnknownTransfer)),
                    }
                }
                CopyOp::Advance { by } => {
                    now += by;
                    let expired = pool.expire(Nanos::new(now));
                    let want = staged.iter().filter(|(_, s)| s.3 <= now).count();
                    prop_assert_eq!(expired.len(), want);
                    staged.retain(|_, s| s.3 > now);
                }
            }
            // The pool's counts are the model's sums (held plus staged).
            let mut global = 0;
            let mut per_domain = [0u64; 4];
            let mut per_group: HashMap<String, u64> = HashMap::new();
            let entries = held
                .iter()
                .map(|((d, g), n)| (*d, g, *n))
                .chain(staged.values().map(|(d, g, n, _)| (*d, g, *n)));
            for (d, g, n) in entries {
                global += n;
                per_domain[d] += n;
                for name in g {
                    *per_group.entry(name.clone()).or_insert(0) += n;
                }
            }
            prop_assert_eq!(pool.global_holds(), global);
            for (d, name) in domains.iter().enumerate() {
                prop_assert_eq!(pool.domain_holds(name), per_domain[d]);
            }
            for g in ["g1", "g2"] {
                prop_assert_eq!(pool.group_holds(g), per_group.get(g).copied().unwrap_or(0));
            }
            for ((d, g), n) in &held {
                prop_assert_eq!(pool.held(domains[*d], g), *n);
            }
            prop_assert_eq!(pool.is_empty(), global == 0 && staged.is_empty());
        }
    }
}

/// A deterministic smoke test that the generic contracts above actually
/// exercise `retry_after` (a refused request whose retry is in the future).
#[test]
fn retry_after_checks_are_not_vacuous() {
    let g = Limit::Gcra(Gcra::new(Rate::per_second(10).unwrap(), 2).unwrap());
    let mut st = g.fresh();
    g.decide(&mut st, Nanos::ZERO, Hits::exactly(2));
    let d: Decision = g.decide(&mut st, Nanos::ZERO, Hits::exactly(1));
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(Nanos::from_millis(100)));
}

// ---------------------------------------------------------------------------
// Regressions: bugs these properties found, as fixed cases
// ---------------------------------------------------------------------------

/// `HitLog::push` added before trimming, with a saturating total: a
/// rejected request for ~`u64::MAX` hits logged by `count_rejected` left
/// `total` smaller than the sum of the entries, so a later `prune` or
/// `count_since` underflowed (a panic in debug builds, wrong counts in
/// release). Found by `no_input_panics`.
#[test]
fn bug_hit_log_total_saturated_by_a_huge_rejected_request() {
    let log = SlidingLog::new(5, Nanos::SECOND)
        .unwrap()
        .counting_rejected(true);
    let mut st = log.fresh();
    assert!(log.decide(&mut st, Nanos::ZERO, Hits::exactly(5)).allowed);
    let d = log.decide(&mut st, Nanos::new(1), Hits::exactly(u64::MAX));
    assert!(!d.allowed);
    assert_eq!(
        log.count(&st, Nanos::new(1)),
        5,
        "only the newest `limit` hits are kept"
    );
    // The rejected attempt (at 1ns) blocks until 1 s + 1ns, then all is free.
    let end = Nanos::SECOND.saturating_add(Nanos::new(1));
    assert!(!log.decide(&mut st.clone(), end, Hits::exactly(1)).allowed);
    let after = end.saturating_add(Nanos::new(1));
    assert_eq!(log.count(&st, after), 0);
    assert_eq!(log.decide(&mut st, after, Hits::between(1, 10)).granted, 5);
    // The same with a limit of `u64::MAX`, where the sum itself overflows.
    let log = SlidingLog::new(u64::MAX, Nanos::new(10))
        .unwrap()
        .counting_rejected(true);
    let mut st = log.fresh();
    assert!(
        log.decide(&mut st, Nanos::ZERO, Hits::exactly(u64::MAX))
            .allowed
    );
    assert!(!log.decide(&mut st, Nanos::new(1), Hits::exactly(1)).allowed);
    assert_eq!(log.count(&st, Nanos::new(11)), 1);
    assert_eq!(log.count(&st, Nanos::new(12)), 0);
}

/// The sliding log's `retry_after` ignored `min_hits == 0`: with `min_gap`
/// closed it reported the gap, though a request for at least 0 hits is
/// granted at once. Found by `retry_after_is_exact`.
#[test]
fn bug_sliding_log_retry_after_for_min_hits_zero() {
    let gap = Nanos::new(UNIT);
    let log = SlidingLog::new(1, gap).unwrap().with_min_gap(gap);
    let mut st = log.fresh();
    let d = log.decide(&mut st, Nanos::ZERO, Hits::between(0, 1));
    assert_eq!(d.granted, 1);
    assert_eq!(d.retry_after, Some(Nanos::ZERO));
    let d = log.decide(&mut st, Nanos::new(1), Hits::between(0, 1));
    assert!(d.allowed && d.granted == 0);
    assert_eq!(d.retry_after, Some(Nanos::ZERO));
    // For one hit the gap (and the window) still count.
    let d = log.decide(&mut st, Nanos::new(1), Hits::exactly(1));
    assert_eq!(d.retry_after, Some(gap));
}

/// `Smooth`'s `retry_after` was the debt in whole microseconds counted
/// from `now`'s microsecond, so for a `now` that is not a whole microsecond
/// it overshot by up to 999ns (the request was already granted 1ns before
/// it); and for `min_hits == 0` it reported the debt instead of zero. Found
/// by `retry_after_is_exact`.
#[test]
fn bug_smooth_retry_after_rounded_to_whole_microseconds() {
    // Created at 1 us, so nothing is stored when it is first used at 1.5 us.
    let sm = Smooth::bursty(Rate::per_second(5).unwrap(), 1.0)
        .unwrap()
        .created_at(Nanos::new(1_000));
    let mut st = sm.fresh();
    let now = Nanos::new(1_500);
    assert!(sm.decide(&mut st, now, Hits::exactly(1)).allowed);
    // The next permit is free at 200_001 us = 200_001_000 ns.
    let d = sm.decide(&mut st, now, Hits::exactly(1));
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(Nanos::new(200_001_000 - 1_500)));
    let free = Nanos::new(200_001_000);
    assert!(
        !sm.decide(&mut st.clone(), Nanos::new(200_000_999), Hits::exactly(1))
            .allowed
    );
    assert!(sm.decide(&mut st.clone(), free, Hits::exactly(1)).allowed);
    // Asking for at least nothing is granted now.
    let d = sm.decide(&mut st, now, Hits::between(0, 1));
    assert!(d.allowed && d.granted == 0);
    assert_eq!(d.retry_after, Some(Nanos::ZERO));
    // On whole microseconds (all of Guava's tests) nothing changes.
    let d = sm.decide(&mut st, Nanos::new(2_000), Hits::exactly(1));
    assert_eq!(d.retry_after, Some(Nanos::new(199_999_000)));
}

/// `Smooth::describe` computed a bursty limiter's `remaining` as
/// `stored_permits as u64 + 1`, which overflowed once the stored permits
/// reached `u64::MAX` (a huge but accepted `max_burst_seconds`, after a long
/// idle): a panic with overflow checks, `remaining: 0` without. Found by
/// `no_input_panics` with overflow checks on.
#[test]
fn bug_smooth_remaining_overflowed_with_a_huge_burst() {
    let sm = Smooth::bursty(Rate::per_second(1_000_000_000).unwrap(), 1e300).unwrap();
    let mut st = sm.fresh();
    let d = sm.decide(&mut st, Nanos::MAX, Hits::between(0, 1));
    assert!(d.allowed);
    assert_eq!(d.remaining, u64::MAX);
}

/// GCRA's (and so the leaky bucket's) and the token bucket's `retry_after`
/// ignored `min_hits == 0` too: after an acquire left the state in debt, a
/// request for at least 0 hits was allowed at once yet told to retry after
/// the debt. Found by `retry_after_is_exact` once it mixed in acquires.
#[test]
fn bug_retry_after_for_min_hits_zero_in_debt() {
    let r = Rate::per_second(10).unwrap();
    let limits = [
        Limit::Gcra(Gcra::new(r, 1).unwrap()),
        Limit::LeakyBucket(LeakyBucket::new(r, 1).unwrap()),
        Limit::TokenBucket(TokenBucket::new(1, r).unwrap()),
    ];
    for limit in limits {
        let mut st = limit.fresh();
        limit.acquire(&mut st, Nanos::ZERO, 3).unwrap();
        let d = limit.decide(&mut st, Nanos::ZERO, Hits::between(0, 1));
        assert!(d.allowed && d.granted == 0, "{limit:?}");
        assert_eq!(d.retry_after, Some(Nanos::ZERO), "{limit:?}");
        // One hit waits for the debt: three hits of 100 ms each, less the
        // burst of one, plus its own 100 ms. (The old answer for min_hits 0
        // was 200 ms.)
        let d = limit.decide(&mut st, Nanos::ZERO, Hits::exactly(1));
        assert_eq!(d.retry_after, Some(Nanos::from_millis(300)), "{limit:?}");
        let d = limit.decide(&mut st, Nanos::from_millis(300), Hits::exactly(1));
        assert!(d.allowed, "{limit:?}");
    }
}
