//! Property tests of usage told after the fact ([`Mode::Report`],
//! [`Mode::Refund`]): each algorithm that takes usage against a naive
//! reference model (the debt bound, the refund floor, then the ordinary
//! decisions that follow), and the contracts they share: a report never
//! rejects, a report then a refund of what it charged changes nothing, the
//! debt blocks until exactly `retry_after`, a refund never leaves a state
//! fresher than fresh, and a plan refuses every algorithm without a sound
//! debt before changing anything.

// Test code, where a panic is how a check fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cases, delta, start, UNIT};
use proptest::prelude::*;
use tollgate_core::plan::{self, PlanEntry, PlanError};
use tollgate_core::{
    Algorithm, Align, BurstTiers, FixedWindow, Gcra, Hits, LeakyBucket, Limit, LimitState, Mode,
    Nanos, Rate, SlidingLog, SlidingWindow, Smooth, Tier, TokenBucket,
};

/// One operation of a sequence: a try, a report or a refund of `hits`.
#[derive(Clone, Copy, Debug)]
enum Op {
    Try(Hits),
    Report(u64),
    Refund(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..=12, 0u64..=12).prop_map(|(a, b)| Op::Try(Hits::between(a.min(b), a.max(b)))),
        3 => prop_oneof![0u64..=12, 0u64..=60].prop_map(Op::Report),
        2 => prop_oneof![0u64..=12, 0u64..=60].prop_map(Op::Refund),
    ]
}

fn ops(max: usize) -> impl Strategy<Value = Vec<(u64, Op)>> {
    prop::collection::vec((delta(), op()), 1..max)
}

fn rate() -> impl Strategy<Value = Rate> {
    (1u64..=10, 1u64..=40).prop_map(|(count, k)| Rate::new(count, Nanos::new(k * UNIT)).unwrap())
}

fn span() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        4 => (1u64..=40).prop_map(|k| Nanos::new(k * UNIT)),
        1 => (1u64..2_000_000_000).prop_map(Nanos::new),
    ]
}

/// A bound on the debt: none, small, or the default (one limit).
fn max_debt() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), Just(Some(0)), (1u64..=25).prop_map(Some)]
}

/// Every algorithm that takes usage, with its debt bound.
fn usage_limit() -> impl Strategy<Value = Limit> {
    let base = prop_oneof![
        (1u64..=10, rate()).prop_map(|(c, r)| Limit::TokenBucket(TokenBucket::new(c, r).unwrap())),
        (rate(), 1u64..=10).prop_map(|(r, b)| Limit::Gcra(Gcra::new(r, b).unwrap())),
        (rate(), 1u64..=10).prop_map(|(r, q)| Limit::LeakyBucket(LeakyBucket::new(r, q).unwrap())),
        (1u64..=10, span(), prop::bool::ANY).prop_map(|(l, w, first)| {
            let align = if first { Align::FirstHit } else { Align::Epoch };
            Limit::FixedWindow(FixedWindow::new(l, w, align).unwrap())
        }),
        (1u64..=10, span(), 2u32..=5).prop_map(|(l, w, b)| {
            Limit::SlidingWindow(SlidingWindow::new(l, w.max(Nanos::new(8)), b).unwrap())
        }),
        (1u64..=10, span()).prop_map(|(l, w)| Limit::SlidingLog(SlidingLog::new(l, w).unwrap())),
    ];
    (base, max_debt()).prop_map(|(limit, debt)| match debt {
        Some(d) => limit.with_max_debt(d).unwrap(),
        None => limit,
    })
}

/// What a fresh state admits at once: the capacity, burst, queue or limit.
fn headline(limit: &Limit) -> u64 {
    match limit {
        Limit::TokenBucket(a) => a.capacity(),
        Limit::Gcra(a) => a.burst(),
        Limit::LeakyBucket(a) => a.queue_size(),
        Limit::FixedWindow(a) => a.limit(),
        Limit::SlidingWindow(a) => a.limit(),
        Limit::SlidingLog(a) => a.limit(),
        _ => unreachable!("not generated"),
    }
}

/// One entry's plan decision in `mode`.
fn usage(limit: &Limit, st: &mut LimitState, now: Nanos, hits: u64, mode: Mode) -> u64 {
    let mut entries = [PlanEntry {
        limit,
        state: st,
        shadow: false,
        hits: None,
    }];
    let d = plan::decide(&mut entries, now, Hits::exactly(hits), mode).unwrap();
    assert!(d.allowed, "usage is never refused");
    assert!(d.granted <= hits);
    d.granted
}

/// The grant rule of Charon §3.1.
fn expected_grant(req: Hits, room: u64) -> u64 {
    let n = room.min(req.hits);
    if n >= req.min_hits {
        n
    } else {
        0
    }
}

/// A token bucket (and so GCRA, and a leaky bucket's admission) as exact
/// token-time: `capacity × T` when full, negative in debt, down to
/// `-max_debt × T`.
struct BucketModel {
    t: i128,
    full: i128,
    debt: i128,
    tt: i128,
    last: Option<u64>,
}

impl BucketModel {
    fn level(&self, now: u64) -> i128 {
        match self.last {
            None => self.full,
            Some(last) => (self.tt + (now.saturating_sub(last)) as i128).min(self.full),
        }
    }

    fn apply(&mut self, now: u64, op: Op) -> u64 {
        let level = self.level(now);
        let (to, out) = match op {
            Op::Try(req) => {
                let g = expected_grant(req, (level.max(0) / self.t) as u64);
                (level - g as i128 * self.t, g)
            }
            Op::Report(h) => {
                let c = (h as i128).min((level + self.debt).max(0) / self.t);
                (level - c * self.t, c as u64)
            }
            Op::Refund(h) => {
                if level + h as i128 * self.t <= self.full {
                    (level + h as i128 * self.t, h)
                } else {
                    (self.full, ((self.full - level) / self.t) as u64)
                }
            }
        };
        self.tt = to;
        self.last = Some(now);
        out
    }
}

/// A fixed window's count, aligned to the epoch.
struct WindowModel {
    limit: u64,
    debt: u64,
    window: u64,
    start: u64,
    count: u64,
}

impl WindowModel {
    fn apply(&mut self, now: u64, op: Op) -> u64 {
        let start = now - now % self.window;
        if start != self.start {
            self.start = start;
            self.count = 0;
        }
        let n = match op {
            Op::Try(req) => expected_grant(req, self.limit - self.count.min(self.limit)),
            Op::Report(h) => h.min((self.limit + self.debt).saturating_sub(self.count)),
            Op::Refund(h) => {
                let back = h.min(self.count);
                self.count -= back;
                return back;
            }
        };
        self.count += n;
        n
    }
}

/// A sliding log as a list of hit times, brute force: a hit at `t` counts
/// while `now <= t + window`; a report logs up to `limit + max_debt`, a
/// refund forgets the newest hits still counted.
struct LogModel {
    limit: u64,
    debt: u64,
    window: u64,
    hits: Vec<u64>,
}

impl LogModel {
    fn apply(&mut self, now: u64, op: Op) -> u64 {
        let window = self.window;
        self.hits.retain(|t| now <= t.saturating_add(window));
        let counted = self.hits.len() as u64;
        let n = match op {
            Op::Try(req) => expected_grant(req, self.limit.saturating_sub(counted)),
            Op::Report(h) => h.min((self.limit + self.debt).saturating_sub(counted)),
            Op::Refund(h) => {
                let back = h.min(counted);
                self.hits.truncate((counted - back) as usize);
                return back;
            }
        };
        self.hits.extend(std::iter::repeat_n(now, n as usize));
        n
    }
}

/// Applies `op` to the real limit: the plan's grant.
fn real(limit: &Limit, st: &mut LimitState, now: Nanos, op: Op) -> u64 {
    match op {
        Op::Try(req) => limit.decide(st, now, req).granted,
        Op::Report(h) => usage(limit, st, now, h, Mode::Report),
        Op::Refund(h) => usage(limit, st, now, h, Mode::Refund),
    }
}

fn times(start: u64, ops: &[(u64, Op)]) -> Vec<(u64, Op)> {
    let mut now = start;
    ops.iter()
        .map(|&(d, op)| {
            now = now.saturating_add(d);
            (now, op)
        })
        .collect()
}

proptest! {
    #![proptest_config(cases(400))]

    /// A token bucket, a GCRA of the same burst and a leaky bucket of the
    /// same queue grant what exact token-time arithmetic grants, in debt
    /// and out of it.
    #[test]
    fn buckets_match_token_time(
        cap in 1u64..=10, r in rate(), debt in max_debt(),
        start in start(), ops in ops(50),
    ) {
        let t = r.interval().as_u64() as i128;
        let d = debt.unwrap_or(cap);
        let mut model = BucketModel { t, full: cap as i128 * t, debt: d as i128 * t, tt: 0, last: None };
        let limits = [
            Limit::TokenBucket(TokenBucket::new(cap, r).unwrap()),
            Limit::Gcra(Gcra::new(r, cap).unwrap()),
            Limit::LeakyBucket(LeakyBucket::new(r, cap).unwrap()),
        ]
        .map(|l| match debt {
            Some(d) => l.with_max_debt(d).unwrap(),
            None => l,
        });
        let mut states: Vec<LimitState> = limits.iter().map(|l| l.fresh()).collect();
        for (now, op) in times(start, &ops) {
            let want = model.apply(now, op);
            for (l, st) in limits.iter().zip(states.iter_mut()) {
                let got = real(l, st, Nanos::new(now), op);
                prop_assert_eq!(got, want, "{} at {} for {:?}", l.algorithm_name(), now, op);
            }
        }
    }

    /// A fixed window counts reports past its limit up to the debt bound,
    /// refunds down to zero, and forgets both at the window's end.
    #[test]
    fn fixed_window_matches_a_counter(
        limit in 1u64..=10, window in span(), debt in max_debt(),
        start in start(), ops in ops(50),
    ) {
        let mut w = FixedWindow::new(limit, window, Align::Epoch).unwrap();
        if let Some(d) = debt {
            w = w.with_max_debt(d);
        }
        let l = Limit::FixedWindow(w);
        let mut model = WindowModel {
            limit, debt: debt.unwrap_or(limit), window: window.as_u64(), start: u64::MAX, count: 0,
        };
        let mut st = l.fresh();
        for (now, op) in times(start, &ops) {
            let want = model.apply(now, op);
            prop_assert_eq!(real(&l, &mut st, Nanos::new(now), op), want, "at {} for {:?}", now, op);
        }
    }

    /// A sliding log logs reports up to `limit + max_debt` and forgets the
    /// newest hits on a refund, exactly as a list of hit times does.
    #[test]
    fn sliding_log_matches_a_list_of_hits(
        limit in 1u64..=10, window in span(), debt in max_debt(),
        start in start(), ops in ops(50),
    ) {
        let mut log = SlidingLog::new(limit, window).unwrap();
        if let Some(d) = debt {
            log = log.with_max_debt(d);
        }
        let l = Limit::SlidingLog(log);
        let mut model = LogModel { limit, debt: debt.unwrap_or(limit), window: window.as_u64(), hits: Vec::new() };
        let mut st = l.fresh();
        for (now, op) in times(start, &ops) {
            let want = model.apply(now, op);
            prop_assert_eq!(real(&l, &mut st, Nanos::new(now), op), want, "at {} for {:?}", now, op);
        }
    }

    /// From any state, at one instant: reports charge at most up to the
    /// bound (from fresh exactly `limit + max_debt`, then nothing); a
    /// refund of what a report charged gives it all back and leaves a
    /// state that decides as before; and a refund never leaves more room
    /// than a fresh state has.
    #[test]
    fn debt_is_bounded_and_a_refund_undoes_a_report(
        l in usage_limit(), start in start(), ops in ops(30), hits in 0u64..=60,
    ) {
        let mut st = l.fresh();
        let mut now = Nanos::ZERO;
        for (t, op) in times(start, &ops) {
            now = Nanos::new(t);
            real(&l, &mut st, now, op);
        }
        let before = st.clone();
        let charged = usage(&l, &mut st, now, hits, Mode::Report);
        prop_assert_eq!(usage(&l, &mut st, now, charged, Mode::Refund), charged);
        for h in [1, 2, 5, 100] {
            prop_assert_eq!(l.room(&st, now, h), l.room(&before, now, h), "room for {}", h);
        }
        let fresh = l.fresh();
        let mut st = before;
        usage(&l, &mut st, now, u64::MAX / 4, Mode::Refund);
        for h in [1, 2, 5, 100] {
            prop_assert!(l.room(&st, now, h) <= l.room(&fresh, now, h));
        }
        // From fresh, at one instant, exactly the bound.
        let mut st = l.fresh();
        let bound = headline(&l) + l.max_debt().unwrap();
        prop_assert_eq!(usage(&l, &mut st, now, u64::MAX / 4, Mode::Report), bound);
        prop_assert_eq!(usage(&l, &mut st, now, 1, Mode::Report), 0);
    }

    /// After a report leaves a debt, one more hit is refused until exactly
    /// the `retry_after` the report answered, and granted then.
    #[test]
    fn the_debt_blocks_until_retry_after(
        l in usage_limit(), start in start(), hits in 1u64..=40,
    ) {
        let now = Nanos::new(start);
        let mut st = l.fresh();
        let mut entries = [PlanEntry { limit: &l, state: &mut st, shadow: false, hits: None }];
        let d = plan::decide(&mut entries, now, Hits::exactly(hits), Mode::Report).unwrap();
        let retry = d.decisions[0].retry_after.expect("one hit is always admitted eventually");
        if retry > Nanos::ZERO {
            prop_assert_eq!(l.room(&st, now.saturating_add(retry.saturating_sub(Nanos::NANOSECOND)), 1), 0);
        }
        prop_assert_eq!(l.room(&st, now.saturating_add(retry), 1), 1);
    }
}

/// Every algorithm without a sound debt is refused, in both modes, and the
/// refusal changes no entry of the plan.
#[test]
fn algorithms_without_a_sound_debt_are_refused_unchanged() {
    let bucket = Limit::TokenBucket(TokenBucket::new(5, Rate::per_second(1).unwrap()).unwrap());
    let others = [
        Limit::Smooth(Smooth::bursty(Rate::per_second(5).unwrap(), 1.0).unwrap()),
        Limit::BurstTiers(
            BurstTiers::new(vec![Tier {
                limit: 5,
                window: Nanos::SECOND,
                active: Nanos::SECOND,
                cooldown: Nanos::SECOND,
                skippable: false,
            }])
            .unwrap(),
        ),
    ];
    for other in &others {
        for mode in [Mode::Report, Mode::Refund] {
            let (mut a, mut b) = (bucket.fresh(), other.fresh());
            let mut entries = [
                PlanEntry {
                    limit: &bucket,
                    state: &mut a,
                    shadow: false,
                    hits: None,
                },
                PlanEntry {
                    limit: other,
                    state: &mut b,
                    shadow: true,
                    hits: None,
                },
            ];
            let err =
                plan::decide(&mut entries, Nanos::SECOND, Hits::exactly(3), mode).unwrap_err();
            assert_eq!(
                err,
                PlanError::NoUsage {
                    index: 1,
                    algorithm: other.algorithm_name(),
                    mode,
                }
            );
            assert!(err.to_string().contains(other.algorithm_name()), "{err}");
            assert_eq!(a, bucket.fresh(), "nothing charged");
        }
    }
}

/// A report charges every entry of a plan on its own, shadow ones too; the
/// plan's grant is the least a live entry took, and `limited_by` names it.
#[test]
fn a_plan_reports_to_every_entry_and_names_the_tightest() {
    let big = Limit::FixedWindow(FixedWindow::new(100, Nanos::SECOND, Align::Epoch).unwrap());
    let small = Limit::FixedWindow(
        FixedWindow::new(10, Nanos::SECOND, Align::Epoch)
            .unwrap()
            .with_max_debt(5),
    );
    let shadow = Limit::FixedWindow(
        FixedWindow::new(1, Nanos::SECOND, Align::Epoch)
            .unwrap()
            .with_max_debt(0),
    );
    let (mut a, mut b, mut c) = (big.fresh(), small.fresh(), shadow.fresh());
    let mut entries = [
        PlanEntry {
            limit: &big,
            state: &mut a,
            shadow: false,
            hits: None,
        },
        PlanEntry {
            limit: &small,
            state: &mut b,
            shadow: false,
            hits: None,
        },
        PlanEntry {
            limit: &shadow,
            state: &mut c,
            shadow: true,
            hits: None,
        },
    ];
    let now = Nanos::from_secs(10);
    let d = plan::decide(&mut entries, now, Hits::exactly(40), Mode::Report).unwrap();
    assert!(d.allowed);
    assert_eq!(d.granted, 15, "the small window holds 10 + 5");
    assert_eq!(d.limited_by, Some(1));
    let charged: Vec<u64> = d.decisions.iter().map(|d| d.granted).collect();
    assert_eq!(charged, [40, 15, 1]);
    // Everything blocks until the window ends; a refund gives back what
    // each entry holds.
    let d = plan::decide(&mut entries, now, Hits::exactly(1), Mode::Try).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.decisions[1].retry_after, Some(Nanos::SECOND));
    let d = plan::decide(&mut entries, now, Hits::exactly(12), Mode::Refund).unwrap();
    let back: Vec<u64> = d.decisions.iter().map(|d| d.granted).collect();
    assert_eq!(back, [12, 12, 1]);
    assert_eq!(d.granted, 12);
    let d = plan::decide(&mut entries, now, Hits::exactly(7), Mode::Try).unwrap();
    assert!(d.allowed, "3 of 10 counted after the refund");
}

/// A token bucket in debt refills to zero before it grants anything: the
/// check-before / report-after flow of an LLM gateway.
#[test]
fn a_bucket_pays_its_debt_before_granting() {
    // 100 tokens, 10 per second, debt up to 100.
    let l = Limit::TokenBucket(TokenBucket::new(100, Rate::per_second(10).unwrap()).unwrap());
    let mut st = l.fresh();
    let t0 = Nanos::from_secs(1000);
    assert!(l.decide(&mut st, t0, Hits::exactly(1)).allowed, "the check");
    // The answer used 150 tokens: 149 more than the check took.
    assert_eq!(usage(&l, &mut st, t0, 149, Mode::Report), 149);
    let d = l.decide(&mut st, t0, Hits::exactly(1));
    assert!(!d.allowed);
    // 50 tokens owed, one more needed: 5.1 s.
    assert_eq!(d.retry_after, Some(Nanos::from_millis(5100)));
    let t1 = t0.saturating_add(Nanos::from_millis(5099));
    assert!(!l.decide(&mut st, t1, Hits::exactly(1)).allowed);
    let t2 = t0.saturating_add(Nanos::from_millis(5100));
    assert!(l.decide(&mut st, t2, Hits::exactly(1)).allowed);
    // A report past the bound is clamped: at most 100 owed.
    assert_eq!(usage(&l, &mut st, t2, 1000, Mode::Report), 100);
    // A refund never fills the bucket past full.
    assert_eq!(usage(&l, &mut st, t2, 1000, Mode::Refund), 200);
    assert_eq!(l.room(&st, t2, 1000), 100);
}
