//! Calendar windows in the memory store, with time moved by hand: a
//! monthly quota in a time zone resets at local midnight of the first of
//! the month, its `reset_after` is the real time to that edge (a month of
//! 29 days, a month an hour short for the clock change), it is decided all
//! or nothing beside another limit, and its state is swept once its
//! window ended.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use jiff::civil::date;
use jiff::tz::TimeZone;
use tollgate_core::{
    Calendar, CalendarUnit, Clock, FixedWindow, Gcra, Hits, Limit, ManualClock, Mode, Nanos, Rate,
};
use tollgate_store::{Key, LimitId, MemoryStore, Plan};

const HOUR: u64 = 3_600_000_000_000;
const DAY: u64 = 24 * HOUR;

/// Local midnight of `y-m-d` in `zone`, in nanoseconds.
fn midnight(zone: &str, y: i16, m: i8, d: i8) -> Nanos {
    let tz = TimeZone::get(zone).unwrap();
    let z = date(y, m, d).to_zoned_datetime(tz).unwrap();
    Nanos::new(u64::try_from(z.timestamp().as_nanosecond()).unwrap())
}

fn monthly(limit: u64, zone: &str) -> Arc<Limit> {
    let c = Calendar::new(CalendarUnit::Month, zone).unwrap();
    Arc::new(Limit::FixedWindow(FixedWindow::calendar(limit, c).unwrap()))
}

fn decide(store: &MemoryStore, plan: &Plan, clock: &ManualClock, hits: u64) -> (bool, u64, Nanos) {
    let d = store
        .decide_now(plan, clock.now(), Hits::exactly(hits), Mode::Try)
        .unwrap();
    let e = &d.decisions[0];
    (d.allowed, e.remaining, e.reset_after)
}

#[test]
fn a_monthly_quota_resets_at_local_midnight_of_the_first() {
    let store = MemoryStore::new();
    let quota = monthly(3, "America/New_York");
    let plan = Plan::single(Key::new(LimitId(1), "acme"), Arc::clone(&quota));
    // 2024 is a leap year: February has 29 days, all in EST (-05:00).
    let feb = midnight("America/New_York", 2024, 2, 1);
    let mar = midnight("America/New_York", 2024, 3, 1);
    assert_eq!(mar.as_u64() - feb.as_u64(), 29 * DAY);
    let clock = ManualClock::new(feb.saturating_add(Nanos::new(10 * DAY)));
    assert_eq!(
        decide(&store, &plan, &clock, 2),
        (true, 1, Nanos::new(19 * DAY))
    );
    clock.set(mar.saturating_sub(Nanos::new(1)));
    assert_eq!(decide(&store, &plan, &clock, 1), (true, 0, Nanos::new(1)));
    let (allowed, remaining, reset) = decide(&store, &plan, &clock, 1);
    assert!(!allowed && remaining == 0 && reset == Nanos::new(1));
    // UTC midnight of 1 March is still February in New York.
    clock.set(Nanos::new(mar.as_u64() - 5 * HOUR));
    assert!(!decide(&store, &plan, &clock, 1).0);
    // The edge: a fresh month, which ends on 1 April at local midnight,
    // EDT by then: March is 31 days less the hour the clocks skipped.
    clock.set(mar);
    assert_eq!(
        decide(&store, &plan, &clock, 1),
        (true, 2, Nanos::new(31 * DAY - HOUR))
    );
}

#[test]
fn a_calendar_quota_is_decided_all_or_nothing_beside_a_rate() {
    let store = MemoryStore::new();
    let quota = monthly(5, "Europe/Paris");
    let rate = Arc::new(Limit::Gcra(
        Gcra::new(Rate::new(1, Nanos::from_secs(3600)).unwrap(), 10).unwrap(),
    ));
    let mut plan = Plan::default();
    plan.push(Key::new(LimitId(1), "acme"), Arc::clone(&quota), false)
        .unwrap();
    plan.push(Key::new(LimitId(2), "acme"), rate, false)
        .unwrap();
    let t = midnight("Europe/Paris", 2025, 10, 30);
    let d = store
        .decide_now(&plan, t, Hits::between(1, 8), Mode::Try)
        .unwrap();
    assert_eq!(d.granted, 5, "the month's five");
    // From 30 October 2025 to 1 November: two days, both in CET (summer
    // time ended on the 26th).
    assert_eq!(d.decisions[0].reset_after, Nanos::new(2 * DAY));
    // The rate had room for 10 and took only the 5 the quota allowed.
    assert_eq!(d.decisions[1].remaining, 5);
    let d = store
        .decide_now(&plan, t, Hits::exactly(1), Mode::Try)
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(d.decisions[1].remaining, 5, "nothing taken");
}

#[test]
fn a_calendar_state_is_swept_once_its_month_ended() {
    let store = MemoryStore::new();
    let quota = monthly(2, "Asia/Tokyo");
    let plan = Plan::single(Key::new(LimitId(7), "acme"), Arc::clone(&quota));
    let jan = midnight("Asia/Tokyo", 2026, 1, 31);
    let feb = midnight("Asia/Tokyo", 2026, 2, 1);
    store
        .decide_now(&plan, jan, Hits::exactly(1), Mode::Try)
        .unwrap();
    assert_eq!(store.sweep_now(feb.saturating_sub(Nanos::new(1))), 0);
    assert_eq!(store.sweep_now(feb), 1);
    let d = store
        .decide_now(&plan, feb, Hits::exactly(2), Mode::Try)
        .unwrap();
    assert!(d.allowed);
    // February 2026 (28 days) in Tokyo, which keeps no summer time.
    assert_eq!(d.decisions[0].reset_after, Nanos::new(28 * DAY));
}
