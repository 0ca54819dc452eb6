//! Charon's burst tiers as fixed vectors: §2.1 (Figures 1–3) and the §2.3
//! cookbook patterns.
//!
//! Every rejection is checked for two things: it changes no state (Charon
//! §3.1: "the access log will remain untouched"), and its `retry_after` is
//! exact: the same request still fails one nanosecond earlier and succeeds
//! at that instant (on copies of the state).

// This whole file is test code, where a panic is how a check fails; the
// workspace's `allow-unwrap-in-tests` covers `#[test]` functions but not
// the helpers they share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_core::algorithms::burst_tiers::BurstTiersState;
use tollgate_core::{Algorithm, BurstTiers, Decision, Hits, Nanos, Tier, TierInfo};

fn secs(n: u64) -> Nanos {
    Nanos::from_secs(n)
}

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

/// `t + d`.
fn at(t: Nanos, d: Nanos) -> Nanos {
    t.saturating_add(d)
}

const NS: Nanos = Nanos::NANOSECOND;

/// An arbitrary origin, far from zero so that nothing leans on `now - window`
/// saturating.
const T: Nanos = Nanos::new(1_000_000 * 1_000_000_000);

fn tier(limit: u64, window: Nanos, active: Nanos, cooldown: Nanos, skippable: bool) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable,
    }
}

fn info(index: u32, limit: u64, hits: u64, burst: bool) -> Option<TierInfo> {
    Some(TierInfo {
        index,
        limit,
        hits,
        burst,
    })
}

/// Decides and checks that the request was granted in full.
fn grant(bt: &BurstTiers, st: &mut BurstTiersState, now: Nanos, req: Hits) -> Decision {
    let d = bt.decide(st, now, req);
    assert!(d.allowed, "expected a grant at {now:?} for {req:?}: {d:?}");
    assert!(d.granted >= req.min_hits && d.granted <= req.hits);
    assert_eq!(d.retry_after.map(|_| ()), Some(()));
    d
}

fn hit(bt: &BurstTiers, st: &mut BurstTiersState, now: Nanos) -> Decision {
    let d = grant(bt, st, now, Hits::exactly(1));
    assert_eq!(d.granted, 1);
    d
}

/// Whether two states admit the same at `now` and at a spread of later
/// times: "changes no state" for what pruning may legitimately forget
/// (hits that left every window, tiers whose cooldown ended).
fn assert_same_future(bt: &BurstTiers, a: &BurstTiersState, b: &BurstTiersState, now: Nanos) {
    let offsets = [
        Nanos::ZERO,
        NS,
        ms(1),
        ms(999),
        secs(1),
        at(secs(1), NS),
        secs(10),
        secs(30),
        secs(60),
        secs(300),
        secs(3600),
        at(secs(3600), NS),
        secs(86_400),
        at(secs(86_400), NS),
    ];
    for off in offsets {
        let t = at(now, off);
        for hits in [1, 2, 5, 10, 60, 5000, u64::MAX] {
            assert_eq!(
                bt.room(a, t, hits),
                bt.room(b, t, hits),
                "room for {hits} at now + {off:?}"
            );
        }
    }
}

/// Decides a request that must be rejected; checks that it changed nothing
/// (`structurally`: not even a pruned log) and that `retry_after` is exact.
fn reject(
    bt: &BurstTiers,
    st: &mut BurstTiersState,
    now: Nanos,
    req: Hits,
    structurally: bool,
) -> Decision {
    let before = st.clone();
    let d = bt.decide(st, now, req);
    assert!(!d.allowed, "expected a rejection at {now:?}: {d:?}");
    assert_eq!(d.granted, 0);
    assert!(
        d.tier.is_some_and(|t| !t.burst),
        "a rejection bursts nowhere"
    );
    if structurally {
        assert_eq!(*st, before, "a rejected request changes no state");
    }
    assert_same_future(bt, &before, st, now);
    assert_retry_exact(bt, st, now, req, d.retry_after);
    d
}

/// `retry_after = Some(r)`: `min_hits` fails at `now + r - 1ns` (if `r > 0`)
/// and is granted at `now + r`; `None`: it fails at every probed time.
fn assert_retry_exact(
    bt: &BurstTiers,
    st: &BurstTiersState,
    now: Nanos,
    req: Hits,
    retry: Option<Nanos>,
) {
    let probe = Hits::exactly(req.min_hits);
    match retry {
        Some(r) => {
            let t = at(now, r);
            if !r.is_zero() {
                let early = bt.decide(&mut st.clone(), t.saturating_sub(NS), probe);
                assert!(!early.allowed, "granted 1ns before retry_after {r:?}");
            }
            let d = bt.decide(&mut st.clone(), t, probe);
            assert!(d.allowed, "not granted at retry_after {r:?}: {d:?}");
        }
        None => {
            for off in [0, 1, 60, 3600, 86_400, 10_000_000] {
                let d = bt.decide(&mut st.clone(), at(now, secs(off)), probe);
                assert!(!d.allowed, "retry_after None, yet granted {off}s later");
            }
        }
    }
}

/// Figure 2's tiers: tier 1 is `L=10` per 1 s, active 60 s, no cooldown;
/// tier 2 is `L=50` per 10 s, active 30 s, cooldown 300 s.
fn figure_2() -> BurstTiers {
    BurstTiers::new(vec![
        tier(10, secs(1), secs(60), Nanos::ZERO, false),
        tier(50, secs(10), secs(30), secs(300), false),
    ])
    .unwrap()
}

#[test]
fn successful_burst_figure_2() {
    let bt = figure_2();
    let mut st = bt.fresh();
    // The first hit bursts out of the fake tier 0 into tier 1.
    let d = hit(&bt, &mut st, T);
    assert_eq!(d.tier, info(1, 10, 1, true));
    assert_eq!(d.limit, 10);
    assert_eq!(
        d.remaining,
        9 + 50,
        "tier 1's room plus a burst into tier 2"
    );
    assert_eq!(st[0].entered, T);
    assert_eq!(d.reset_after, secs(60), "tier 1: active 60 s, no cooldown");
    for k in 2..=10 {
        let d = hit(&bt, &mut st, at(T, ms(10 * (k - 1))));
        assert_eq!(d.tier, info(1, 10, k, false), "hit {k}");
        assert_eq!(d.remaining, 10 - k + 50);
    }
    // The 11th: tier 1's window is full, so it bursts into tier 2.
    let t11 = at(T, ms(100));
    let d = hit(&bt, &mut st, t11);
    assert_eq!(d.tier, info(2, 50, 1, true));
    assert_eq!(d.limit, 50);
    assert_eq!(d.remaining, 49);
    assert_eq!(st[1].entered, t11);
    assert_eq!(st[0].entered, T, "tier 1 stays active beneath");
    assert_eq!(
        d.reset_after,
        secs(330),
        "tier 2: 30 s active + 300 s cooldown"
    );
    // Further hits stay in tier 2, no new burst.
    let d = hit(&bt, &mut st, at(T, ms(200)));
    assert_eq!(d.tier, info(2, 50, 2, false));
    // A multi-hit request fills tier 2 exactly; then nothing is left above.
    let d = grant(&bt, &mut st, at(T, ms(300)), Hits::between(1, 100));
    assert_eq!(d.granted, 48);
    assert_eq!(d.tier, info(2, 50, 50, false));
    assert_eq!(d.remaining, 0);
    let d = reject(&bt, &mut st, at(T, ms(400)), Hits::exactly(1), true);
    assert_eq!(d.tier, info(2, 50, 50, false));
    // Tier 2's oldest hit (t11 = T + 100 ms) leaves its 10 s window at
    // T + 10.1 s + 1ns, well before tier 2's active period ends.
    assert_eq!(d.retry_after, Some(at(ms(9_700), NS)));
}

#[test]
fn burst_blocked_by_cooldown_figure_3() {
    let bt = figure_2();
    let mut st = bt.fresh();
    assert_eq!(
        grant(&bt, &mut st, T, Hits::exactly(10)).tier,
        info(1, 10, 10, true)
    );
    let t2 = at(T, ms(100));
    assert_eq!(hit(&bt, &mut st, t2).tier, info(2, 50, 1, true));
    let active_end = at(t2, secs(30));
    // Tier 2 is current until the last nanosecond of its active period (its
    // first hit has left the 10 s window by then)...
    let d = hit(&bt, &mut st, active_end.saturating_sub(NS));
    assert_eq!(d.tier, info(2, 50, 1, false));
    // ...then it cools down and tier 1 (active until T + 60 s) is current.
    let d = hit(&bt, &mut st, active_end);
    assert_eq!(d.tier, info(1, 10, 1, false), "fallback to tier 1");
    assert_eq!(d.remaining, 9, "no burst possible: tier 2 cools down");

    // Fill tier 1's window; the next request cannot burst.
    let fill = at(T, secs(32));
    let d = grant(&bt, &mut st, fill, Hits::between(1, 100));
    assert_eq!(d.granted, 10);
    assert_eq!(d.tier, info(1, 10, 10, false));
    let now = at(fill, ms(500));
    let d = reject(&bt, &mut st, now, Hits::exactly(1), true);
    assert_eq!(d.tier, info(1, 10, 10, false));
    assert_eq!(d.limit, 10);
    assert_eq!(d.remaining, 0);
    // Tier 1's window frees one hit at fill + 1 s + 1ns.
    assert_eq!(d.retry_after, Some(at(ms(500), NS)));

    // Tier 1's active period ends at T + 60 s (no cooldown), before its
    // window frees. The fake tier bursts into tier 1 again — but the ten
    // hits of T + 59.8 s still count in its window, so the re-entry cannot
    // pass twenty hits in one second (Charon §4.1's concern): the retry is
    // when they leave, not the end of the active period.
    let t = at(T, secs(60)).saturating_sub(ms(200));
    let d = grant(&bt, &mut st, t, Hits::exactly(10));
    assert_eq!(d.tier, info(1, 10, 10, false));
    let d = reject(&bt, &mut st, at(t, ms(100)), Hits::exactly(1), true);
    assert_eq!(
        d.retry_after,
        Some(at(ms(900), NS)),
        "tier 1's window frees at T + 60.8 s + 1ns"
    );
    // (Only normalizes the ended period: compared by behaviour.)
    reject(&bt, &mut st, at(T, secs(60)), Hits::exactly(1), false);
    let reentry = at(t, at(secs(1), NS));
    let d = hit(&bt, &mut st, reentry);
    assert_eq!(d.tier, info(1, 10, 1, true));
    assert_eq!(st[0].entered, reentry);

    // Tier 2 cools down until t2 + 330 s. Just before, a full tier 1 cannot
    // burst; the retry is the end of the cooldown, not tier 1's window.
    let end = at(t2, secs(330));
    let before_end = end.saturating_sub(ms(100));
    let d = grant(&bt, &mut st, before_end, Hits::exactly(10));
    assert_eq!(d.tier, info(1, 10, 10, true), "tier 1 re-entered");
    let d = reject(&bt, &mut st, before_end, Hits::exactly(1), true);
    assert_eq!(d.retry_after, Some(ms(100)));
    let d = reject(&bt, &mut st, end.saturating_sub(NS), Hits::exactly(1), true);
    assert_eq!(d.retry_after, Some(NS));
    let d = hit(&bt, &mut st, end);
    assert_eq!(d.tier, info(2, 50, 1, true), "the cooldown is over: burst");
    assert_eq!(st[1].entered, end);
}

fn skip_tiers(skippable: bool) -> BurstTiers {
    BurstTiers::new(vec![
        tier(2, secs(1), secs(60), Nanos::ZERO, false),
        tier(3, secs(1), secs(5), secs(100), skippable),
        tier(5, secs(1), secs(60), Nanos::ZERO, false),
    ])
    .unwrap()
}

#[test]
fn skippable_tier_in_cooldown_is_skipped() {
    let bt = skip_tiers(true);
    let mut st = bt.fresh();
    let d = grant(&bt, &mut st, T, Hits::exactly(5));
    assert_eq!(d.tier, info(2, 3, 3, true));
    // Tier 2 cools down from T + 5 s to T + 105 s.
    let t = at(T, secs(6));
    let d = grant(&bt, &mut st, t, Hits::exactly(2));
    assert_eq!(d.tier, info(1, 2, 2, false));
    assert_eq!(d.remaining, 5, "the burst capacity is tier 3's");
    let d = hit(&bt, &mut st, t);
    assert_eq!(d.tier, info(3, 5, 1, true), "tier 2 skipped");
    assert_eq!(st[1].entered, T, "the skipped tier is not re-entered");
    assert_eq!(st[2].entered, t);
    // Multi-hit: tier 3 takes the rest.
    let d = grant(&bt, &mut st, t, Hits::between(1, 10));
    assert_eq!(d.granted, 4);
    assert_eq!(d.tier, info(3, 5, 5, false));
}

#[test]
fn non_skippable_tier_in_cooldown_blocks_the_burst() {
    let bt = skip_tiers(false);
    let mut st = bt.fresh();
    grant(&bt, &mut st, T, Hits::exactly(5));
    let t = at(T, secs(6));
    let d = grant(&bt, &mut st, t, Hits::exactly(2));
    assert_eq!(d.tier, info(1, 2, 2, false));
    assert_eq!(d.remaining, 0, "no burst past tier 2");
    let d = reject(&bt, &mut st, t, Hits::exactly(1), true);
    assert_eq!(d.tier, info(1, 2, 2, false));
    assert_eq!(d.retry_after, Some(at(secs(1), NS)), "tier 1's window");
    assert_eq!(st[2].entered, Nanos::MAX, "tier 3 never entered");
    // The cooldown ends at T + 105 s; tier 1 has been re-entered by then.
    let end = at(T, secs(105));
    let d = grant(&bt, &mut st, end, Hits::between(1, 100));
    assert_eq!(d.granted, 10);
    assert_eq!(d.tier, info(3, 5, 5, true));
}

#[test]
fn fallback_drops_several_levels_at_once() {
    let bt = BurstTiers::new(vec![
        tier(1, secs(1), secs(100), Nanos::ZERO, false),
        tier(1, secs(10), secs(10), secs(50), false),
        tier(1, secs(10), secs(10), secs(50), false),
    ])
    .unwrap();
    let mut st = bt.fresh();
    let d = grant(&bt, &mut st, T, Hits::exactly(3));
    assert_eq!(d.tier, info(3, 1, 1, true));
    // (Not structurally unchanged: tier 1's hit is pruned from its log.)
    let d = reject(
        &bt,
        &mut st,
        at(T, secs(10)).saturating_sub(NS),
        Hits::exactly(1),
        false,
    );
    assert_eq!(d.tier, info(3, 1, 1, false));
    assert_eq!(
        d.retry_after,
        Some(NS),
        "tier 1 is current again, and empty"
    );
    // Tiers 3 and 2 leave their active periods together: 3 -> 1.
    let d = hit(&bt, &mut st, at(T, secs(10)));
    assert_eq!(d.tier, info(1, 1, 1, false));
    let d = reject(&bt, &mut st, at(T, secs(10)), Hits::exactly(1), true);
    assert_eq!(d.tier, info(1, 1, 1, false));
    assert_eq!(d.retry_after, Some(at(secs(1), NS)));
}

#[test]
fn one_request_passes_through_several_tiers() {
    let bt = BurstTiers::new(vec![
        tier(2, secs(1), secs(60), Nanos::ZERO, false),
        tier(3, secs(1), secs(60), Nanos::ZERO, false),
        tier(5, secs(1), secs(60), Nanos::ZERO, false),
    ])
    .unwrap();
    let mut st = bt.fresh();
    assert_eq!(hit(&bt, &mut st, T).tier, info(1, 2, 1, true));
    // Partial: 1 left in tier 1, 3 in tier 2, 5 in tier 3.
    let t = at(T, ms(1));
    let d = grant(&bt, &mut st, t, Hits::between(3, 20));
    assert_eq!(d.granted, 9);
    assert_eq!(d.tier, info(3, 5, 5, true));
    assert_eq!(d.remaining, 0);
    assert_eq!((st[1].entered, st[2].entered), (t, t));
    let d = reject(&bt, &mut st, at(T, ms(2)), Hits::exactly(1), true);
    assert_eq!(d.retry_after, Some(at(secs(1), NS).saturating_sub(ms(1))));

    // min_hits: 10 does not fit the walk now (1 + 3 + 5)...
    let mut st = bt.fresh();
    hit(&bt, &mut st, T);
    let d = reject(&bt, &mut st, T, Hits::between(10, 20), true);
    assert_eq!(d.tier, info(1, 2, 1, false));
    // ...but it does once tier 1's hit leaves its window: 2 + 3 + 5.
    assert_eq!(d.retry_after, Some(at(secs(1), NS)));
    let d = grant(&bt, &mut st, at(T, at(secs(1), NS)), Hits::between(10, 20));
    assert_eq!(d.granted, 10);
    assert_eq!(d.tier, info(3, 5, 5, true));

    // More than every tier together never fits.
    let mut st = bt.fresh();
    let d = reject(&bt, &mut st, T, Hits::exactly(11), true);
    assert_eq!(d.retry_after, None);
    assert_eq!(d.tier, info(0, 0, 0, false));
    assert_eq!(d.remaining, 10);
    let d = grant(&bt, &mut st, T, Hits::between(1, u64::MAX));
    assert_eq!(d.granted, 10);
}

#[test]
fn fake_tier_zero() {
    let bt = figure_2();
    let mut st = bt.fresh();
    // Nothing active: the fake tier is current, and a request from it always
    // bursts.
    let d = reject(&bt, &mut st, T, Hits::exactly(61), true);
    assert_eq!(d.tier, info(0, 0, 0, false));
    assert_eq!(d.limit, 0);
    assert_eq!(d.remaining, 60);
    assert!(bt.is_idle(&st, T));
    let d = hit(&bt, &mut st, T);
    assert_eq!(d.tier, info(1, 10, 1, true));
    // After tier 1's active period (no cooldown) nothing is active again;
    // a rejected request there reports tier 0.
    let later = at(T, secs(60));
    assert!(bt.is_idle(&st, later));
    assert!(!bt.is_idle(&st, later.saturating_sub(NS)));
    let d = reject(&bt, &mut st, later, Hits::exactly(61), false);
    assert_eq!(d.tier, info(0, 0, 0, false));
    assert_eq!(d.retry_after, None);
}

#[test]
fn no_tiers_reject_everything() {
    let bt = BurstTiers::new(Vec::new()).unwrap();
    let mut st = bt.fresh();
    for req in [
        Hits::exactly(1),
        Hits::between(1, 10),
        Hits::exactly(u64::MAX),
    ] {
        let d = reject(&bt, &mut st, T, req, true);
        assert_eq!(d.retry_after, None);
        assert_eq!(d.tier, info(0, 0, 0, false));
        assert_eq!((d.limit, d.remaining), (0, 0));
    }
    assert_eq!(bt.room(&st, T, u64::MAX), 0);
    assert!(bt.is_idle(&st, T));
}

#[test]
fn invalid_tiers_are_refused() {
    let ok = tier(1, secs(1), secs(1), Nanos::ZERO, false);
    assert!(BurstTiers::new(vec![ok]).is_ok());
    for bad in [
        Tier { limit: 0, ..ok },
        Tier {
            window: Nanos::ZERO,
            ..ok
        },
        Tier {
            active: Nanos::ZERO,
            ..ok
        },
        Tier {
            cooldown: Nanos::MAX,
            ..ok
        },
        Tier {
            window: Nanos::MAX,
            ..ok
        },
    ] {
        assert!(BurstTiers::new(vec![ok, bad]).is_err(), "{bad:?}");
    }
}

/// §2.3 Penalties: higher tiers give more, briefly, and cool down longer.
#[test]
fn penalties_pattern() {
    let bt = BurstTiers::new(vec![
        tier(10, secs(1), secs(60), Nanos::ZERO, false),
        tier(20, secs(1), secs(5), secs(60), false),
        tier(40, secs(1), secs(5), secs(120), false),
    ])
    .unwrap();
    let mut st = bt.fresh();
    let all = Hits::between(1, 1000);
    // A heavy burst gets every tier: 10 + 20 + 40.
    let d = grant(&bt, &mut st, T, all);
    assert_eq!(d.granted, 70);
    assert_eq!(d.tier, info(3, 40, 40, true));
    // A second later the window has room in tier 3 (active 5 s).
    let d = grant(&bt, &mut st, at(T, at(secs(1), NS)), all);
    assert_eq!(d.granted, 40);
    // After 5 s the upper tiers cool down: 10 per window, no bursting. (A
    // hit at t counts until t + 1 s inclusive, hence the extra nanosecond.)
    let mut now = at(T, secs(5));
    let mut windows = 0;
    while now < at(T, secs(59)) {
        let d = grant(&bt, &mut st, now, all);
        assert_eq!(d.granted, 10, "at {now:?}");
        assert_eq!(d.tier, info(1, 10, 10, false), "at {now:?}");
        let d = reject(&bt, &mut st, now, Hits::exactly(1), true);
        assert_eq!(d.retry_after, Some(at(secs(1), NS)), "at {now:?}");
        now = at(now, at(secs(1), NS));
        windows += 1;
    }
    assert_eq!(windows, 54);
    // Tier 1 is re-entered at 60 s; tier 2 is usable again at 65 s, tier 3
    // still cools down (until 125 s) and blocks.
    let d = grant(&bt, &mut st, at(T, secs(60)), all);
    assert_eq!((d.granted, d.tier), (10, info(1, 10, 10, true)));
    let d = grant(&bt, &mut st, at(T, secs(65)), all);
    assert_eq!((d.granted, d.tier), (30, info(2, 20, 20, true)));
    // At 125 s tier 3 is free, but tier 2 (entered at 65 s) cools down
    // until 130 s and blocks the way; tier 1 ended at 120 s, re-entered.
    let d = grant(&bt, &mut st, at(T, secs(125)), all);
    assert_eq!((d.granted, d.tier), (10, info(1, 10, 10, true)));
    let d = reject(&bt, &mut st, at(T, secs(125)), Hits::exactly(1), true);
    assert_eq!(
        d.retry_after,
        Some(at(secs(1), NS)),
        "tier 1's window first"
    );
    // At 130 s all three are available again.
    let d = grant(&bt, &mut st, at(T, secs(130)), all);
    assert_eq!((d.granted, d.tier), (70, info(3, 40, 40, true)));
}

/// §2.3 Punishment: a buffer tier, then a prison tier of limit 1 and a long
/// active period.
#[test]
fn punishment_prison_tier() {
    let hour = secs(3600);
    let bt = BurstTiers::new(vec![
        tier(5, secs(1), secs(60), Nanos::ZERO, false),
        tier(1, hour, hour, Nanos::ZERO, false),
    ])
    .unwrap();
    let mut st = bt.fresh();
    grant(&bt, &mut st, T, Hits::exactly(5));
    // The 6th hit in a second is captured: entering the prison grants 1.
    let caught = at(T, ms(1));
    let d = hit(&bt, &mut st, caught);
    assert_eq!(d.tier, info(2, 1, 1, true));
    let free = at(caught, hour);
    let d = reject(&bt, &mut st, at(caught, NS), Hits::between(1, 100), true);
    assert_eq!(d.remaining, 0);
    for now in [
        at(caught, NS),
        at(T, secs(2)),
        at(T, secs(61)),
        at(caught, secs(1800)),
        free.saturating_sub(NS),
    ] {
        let d = reject(&bt, &mut st, now, Hits::exactly(1), false);
        assert_eq!(d.tier, info(2, 1, 1, false));
        assert_eq!(d.retry_after, Some(free.saturating_sub(now)));
    }
    // Released when the active period ends; everything below is inactive
    // too, so the fake tier bursts into tier 1.
    let d = hit(&bt, &mut st, free);
    assert_eq!(d.tier, info(1, 5, 1, true));
}

/// §2.3 Batch processing: `L=5000, Tw=300, Ta=300, Tc=86100`.
#[test]
fn batch_processing_pattern() {
    let bt = BurstTiers::new(vec![tier(5000, secs(300), secs(300), secs(86_100), false)]).unwrap();
    let mut st = bt.fresh();
    // 50 hits every 3 s: 5000 within the first 5 minutes.
    for k in 0..100 {
        let d = grant(&bt, &mut st, at(T, secs(3 * k)), Hits::exactly(50));
        assert_eq!(d.tier, info(1, 5000, 50 * (k + 1), k == 0));
    }
    let day = at(T, secs(86_400));
    // Nothing more during the active period, then nothing during the
    // cooldown; the retry is always the end of the cooldown.
    for (now, structurally) in [
        (at(T, secs(299)), true),
        (at(T, secs(300)).saturating_sub(NS), true),
        (at(T, secs(300)), true),
        (at(T, secs(301)), false),
        (at(T, secs(40_000)), false),
        (day.saturating_sub(NS), false),
    ] {
        let d = reject(&bt, &mut st, now, Hits::exactly(1), structurally);
        assert_eq!(d.retry_after, Some(day.saturating_sub(now)), "at {now:?}");
        let index = u32::from(now < at(T, secs(300)));
        assert_eq!(d.tier.map(|t| t.index), Some(index));
    }
    // 24 hours after entry the batch can run again, 5000 hits.
    let d = grant(&bt, &mut st, day, Hits::between(1, 10_000));
    assert_eq!(d.granted, 5000);
    assert_eq!(d.tier, info(1, 5000, 5000, true));
    assert_eq!(st[0].entered, day);
}
