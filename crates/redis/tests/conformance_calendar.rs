//! Calendar windows (`fixed_window` with `align: calendar`): the Redis
//! store answers what the memory store answers, step for step, across
//! month and year edges, clock changes and the edge's last nanosecond; the
//! script takes the window holding Redis's own time among those the server
//! computed. A calendar year runs too, exact to the nanosecond although
//! its times pass 2^53 ns (the scripts keep calendar times as seconds and
//! nanoseconds); states stored in the layout scripts wrote before years
//! ran still read back.
//!
//! The Lua script has no time zone database: the server sends the edges
//! of three windows around its time (`params::encode`), the script picks
//! one. With the caller's clock (these conformance tests) the server's
//! time is the script's, so the answers must be identical.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::strategies::step;
use common::{
    ask, caller_clock_store, check_ttls, conform, conform_on_a_new_server, gcra, plan_of, refund,
    report, unique_prefix, Item, Step,
};
use jiff::civil::date;
use jiff::tz::TimeZone;
use proptest::prelude::*;
use tollgate_core::{
    Calendar, CalendarUnit, Clock, FixedWindow, Hits, Limit, Mode, Nanos, SystemClock,
};
use tollgate_redis::testing::{RedisCluster, RedisServer};
use tollgate_redis::{check_limit, RedisOptions, RedisStore, ScriptClock};
use tollgate_store::{Key, LimitId, Plan, Store};

const HOUR: u64 = 3_600_000_000_000;
const DAY: u64 = 24 * HOUR;
/// 2^53 ns (about 104 days): beyond it a double no longer holds every
/// nanosecond, so a year's times must not be counted in nanoseconds.
const TWO53: u64 = 1 << 53;

fn calendar(limit: u64, unit: CalendarUnit, zone: &str) -> Limit {
    Limit::FixedWindow(FixedWindow::calendar(limit, Calendar::new(unit, zone).unwrap()).unwrap())
}

/// `steps` given at absolute times (each with its request) as steps that
/// advance from `start`.
fn at(start: Nanos, steps: &[(Nanos, Step)]) -> Vec<Step> {
    let mut prev = start;
    steps
        .iter()
        .map(|(t, step)| {
            assert!(*t >= prev, "steps out of order at {t:?}");
            let advance = t.saturating_sub(prev);
            prev = *t;
            Step {
                advance,
                ..step.clone()
            }
        })
        .collect()
}

/// Local midnight of `y-m-d` in `zone`.
fn midnight(zone: &str, y: i16, m: i8, d: i8) -> Nanos {
    let z = date(y, m, d)
        .to_zoned_datetime(TimeZone::get(zone).unwrap())
        .unwrap();
    Nanos::new(u64::try_from(z.timestamp().as_nanosecond()).unwrap())
}

#[tokio::test]
async fn months_and_days_reset_at_their_local_edges_as_in_memory() {
    let server = RedisServer::start();
    let redis = caller_clock_store(&server).await;
    let items = [
        Item::new(calendar(3, CalendarUnit::Month, "Europe/Paris"), 1, "acme"),
        // Santiago's clocks skipped its midnight on 2024-09-08.
        Item::new(
            calendar(2, CalendarUnit::Day, "America/Santiago"),
            2,
            "acme",
        )
        .shadow(),
        Item::new(gcra(100, Nanos::from_secs(1), 50), 3, "acme"),
    ];
    // An hour before Paris's March ends (and its clocks went forward on
    // the 31st), then September 2024 across Santiago's gap.
    let start = midnight("Europe/Paris", 2024, 4, 1).saturating_sub(Nanos::new(HOUR));
    let steps = [
        ask(Nanos::ZERO, 1, 2, &[0, 2]),
        ask(Nanos::ZERO, 1, 5, &[0, 1, 2]),
        ask(Nanos::ZERO, 1, 1, &[0]),
        // The month's last nanosecond, then its edge.
        ask(Nanos::new(HOUR - 1), 1, 1, &[0, 1]),
        ask(Nanos::new(1), 1, 1, &[0, 1]),
        ask(Nanos::ZERO, 0, 4, &[0, 1, 2]),
        // Two hits more than the limit: never.
        ask(Nanos::ZERO, 4, 4, &[0]),
        ask(Nanos::new(29 * DAY), 1, 3, &[0, 1]),
        ask(Nanos::new(DAY + 5 * HOUR), 1, 3, &[0, 1, 2]),
        // Into September: Santiago's days of 23 hours.
        ask(Nanos::new(130 * DAY), 2, 2, &[1, 0]),
        ask(Nanos::new(HOUR), 1, 2, &[1]),
        ask(Nanos::new(20 * HOUR), 1, 2, &[1, 0]),
        ask(Nanos::new(3 * HOUR), 1, 2, &[1]),
    ];
    conform(&redis, &items, start, &steps).await;
}

/// A nanosecond count that no multiple of a microsecond (Redis's clock)
/// is: the caller's clock puts arbitrary nanoseconds into every time.
const ODD: u64 = 987_654_321;

/// A Paris year of three hits (with a Paris month and a shadow New York
/// year), from the last hour of 2026 across the new year, the change to
/// summer time, the instants 2^53 ns and 2^53 − 1 ns before 2028 (the
/// last `reset_after` a double holds to the nanosecond and the first it
/// does not), into 2028 (366 days), with reports and refunds, at times
/// with arbitrary nanoseconds. Before calendar years ran, the Redis store
/// refused the limit; counting a year's times in nanoseconds, as months
/// are, would round them (a relative time past 2^53 ns with an odd
/// nanosecond is no double).
#[tokio::test]
async fn a_year_resets_at_local_new_year_as_in_memory_to_the_nanosecond() {
    let server = RedisServer::start();
    let redis = caller_clock_store(&server).await;
    let paris = "Europe/Paris";
    let items = [
        Item::new(calendar(3, CalendarUnit::Year, paris), 1, "acme"),
        Item::new(calendar(2, CalendarUnit::Month, paris), 2, "acme"),
        Item::new(
            calendar(1, CalendarUnit::Year, "America/New_York"),
            3,
            "acme",
        )
        .shadow(),
        Item::new(gcra(10, Nanos::from_secs(1), 5), 4, "acme"),
    ];
    let y27 = midnight(paris, 2027, 1, 1);
    let y28 = midnight(paris, 2028, 1, 1);
    let summer = midnight(paris, 2027, 3, 28).saturating_add(Nanos::new(HOUR));
    let t = |base: Nanos, plus: u64| base.saturating_add(Nanos::new(plus));
    let before = |base: Nanos, minus: u64| base.saturating_sub(Nanos::new(minus));
    let start = before(y27, HOUR + ODD);
    let steps = at(
        start,
        &[
            (start, ask(Nanos::ZERO, 1, 2, &[0, 1])),
            (start, ask(Nanos::ZERO, 1, 2, &[0, 3])),
            (start, ask(Nanos::ZERO, 1, 1, &[0, 2])),
            // 2026's last nanosecond, then 2027 (365 days to go).
            (before(y27, 1), ask(Nanos::ZERO, 1, 1, &[0])),
            (y27, ask(Nanos::ZERO, 1, 1, &[0, 1, 2])),
            // New York's new year, six hours later.
            (
                t(y27, 7 * HOUR + ODD),
                ask(Nanos::ZERO, 1, 3, &[0, 1, 2, 3]),
            ),
            (t(y27, 7 * HOUR + ODD), ask(Nanos::ZERO, 1, 1, &[0, 2])),
            (t(y27, 10 * DAY + 555), report(Nanos::ZERO, 2, &[0, 1])),
            (t(y27, 10 * DAY + 556), ask(Nanos::ZERO, 0, 1, &[0, 1, 2])),
            (t(y27, 10 * DAY + 557), refund(Nanos::ZERO, 4, &[0])),
            (t(y27, 10 * DAY + 557), ask(Nanos::ZERO, 1, 1, &[0])),
            // Across the change to summer time (an hour shorter day).
            (before(summer, 1), ask(Nanos::ZERO, 1, 2, &[0, 1, 2])),
            (t(summer, HOUR + 31), ask(Nanos::ZERO, 0, 1, &[0, 1, 2])),
            // The last reset a double holds, and the first it does not.
            (before(y28, TWO53), ask(Nanos::ZERO, 1, 1, &[0, 2])),
            (before(y28, TWO53 - 1), ask(Nanos::ZERO, 1, 1, &[0, 2])),
            (before(y28, ODD), ask(Nanos::ZERO, 1, 1, &[0, 1])),
            // 2028 is a leap year: 366 days to go.
            (y28, ask(Nanos::ZERO, 1, 2, &[0, 1, 2])),
            (t(y28, 200 * DAY + ODD), ask(Nanos::ZERO, 1, 2, &[0, 2])),
            (t(y28, 200 * DAY + ODD + 1), refund(Nanos::ZERO, 1, &[0, 1])),
            (t(y28, 200 * DAY + ODD + 2), ask(Nanos::ZERO, 1, 4, &[0])),
        ],
    );
    conform(&redis, &items, start, &steps).await;
}

/// A year's state key lives as long as its window, which the script bounds
/// by the whole second after the window's end when that end is 2^53 ns or
/// more away (a year of 2027, from 2026's last days).
#[tokio::test]
async fn a_year_state_lives_until_its_window_ends() {
    let server = RedisServer::start();
    let items = [Item::new(
        calendar(2, CalendarUnit::Year, "Europe/Paris"),
        1,
        "acme",
    )];
    // From T0 (2026-09-21), 102 days reach 2027 in Paris.
    let steps = [
        Step::exactly(Nanos::ZERO, 1, 1),
        Step::exactly(Nanos::new(102 * DAY), 1, 1),
        Step::exactly(Nanos::new(ODD), 2, 1),
        Step::exactly(Nanos::new(300 * DAY), 1, 1),
    ];
    check_ttls(&server, &items, &steps).await;
}

/// States of calendar windows stored by the scripts before calendar years
/// ran (`{code, base, start, count, end}`, the end in nanoseconds after the
/// base second) read back as they were: a server upgraded in place keeps a
/// month's count. Months are still stored so (an older script reading
/// them back keeps the count too); only an end 2^53 ns or more away (a
/// year's) takes the new layout, with the seconds apart.
#[tokio::test]
async fn a_month_stored_before_years_ran_still_reads() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let mut o = RedisOptions::new(server.url());
    o.prefix = prefix.clone();
    o.clock = ScriptClock::Caller;
    o.connect.response_timeout = std::time::Duration::from_secs(5);
    let redis = RedisStore::connect(o).await.unwrap();
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let key_name = |item: &Item| {
        format!(
            "{prefix}{{{:016x}}}:l:{}:{}",
            7,
            item.key.limit,
            item.key.scope()
        )
    };
    let paris = "Europe/Paris";
    let items = [Item::new(
        calendar(3, CalendarUnit::Month, paris),
        1,
        "acme",
    )];
    let (march, april) = (midnight(paris, 2027, 3, 1), midnight(paris, 2027, 4, 1));
    let plan = plan_of(&items, &Step::exactly(Nanos::ZERO, 1, 1)).unwrap();
    // The memory store takes two hits on 10 March; Redis gets the state
    // the old script wrote for that decision, byte for byte.
    let memory = tollgate_store::MemoryStore::new();
    let t1 = march.saturating_add(Nanos::new(9 * DAY + ODD));
    memory
        .decide_now(&plan, t1, Hits::exactly(2), Mode::Try)
        .unwrap();
    let base = t1.as_u64() / 1_000_000_000;
    let rel = |t: Nanos| {
        i64::try_from(t.as_u64()).unwrap() - i64::try_from(base * 1_000_000_000).unwrap()
    };
    let mut old = vec![0x95, 0x04, 0xce];
    old.extend(u32::try_from(base).unwrap().to_be_bytes());
    old.push(0xd3);
    old.extend(rel(march).to_be_bytes());
    old.push(0x02);
    // cmsgpack packs a positive integer past 2^32 as a uint 64 (0xcf), a
    // negative one as an int 64 (0xd3).
    old.push(0xcf);
    old.extend(u64::try_from(rel(april)).unwrap().to_be_bytes());
    let _: () = redis::cmd("SET")
        .arg(key_name(&items[0]))
        .arg(&old)
        .query(&mut con)
        .unwrap();
    let t2 = t1.saturating_add(Nanos::new(DAY + 17));
    for (now, hits) in [
        (t2, 1),
        (t2, 1),
        (april.saturating_sub(Nanos::NANOSECOND), 1),
        (april, 3),
    ] {
        let want = memory.decide_now(&plan, now, Hits::exactly(hits), Mode::Try);
        let got = redis
            .decide(&plan, now, Hits::exactly(hits), Mode::Try)
            .await;
        assert_eq!(got, want, "at {now:?}: Redis (left) vs memory (right)");
    }
    let stored: Vec<u8> = redis::cmd("GET")
        .arg(key_name(&items[0]))
        .query(&mut con)
        .unwrap();
    assert_eq!(
        stored.first(),
        Some(&0x95),
        "a month in the old layout: {stored:?}"
    );
    // A year more than 2^53 ns from its end: six fields.
    let year = [Item::new(calendar(3, CalendarUnit::Year, paris), 2, "acme")];
    let plan = plan_of(&year, &Step::exactly(Nanos::ZERO, 1, 1)).unwrap();
    redis
        .decide(&plan, t1, Hits::exactly(1), Mode::Try)
        .await
        .unwrap();
    let stored: Vec<u8> = redis::cmd("GET")
        .arg(key_name(&year[0]))
        .query(&mut con)
        .unwrap();
    assert_eq!(
        stored.first(),
        Some(&0x96),
        "a year's end apart: {stored:?}"
    );
}

/// On a Redis Cluster each plan is a call of its own (no batching): the
/// edges travel the same way.
#[tokio::test]
async fn a_cluster_decides_calendar_windows_as_memory_does() {
    let cluster = RedisCluster::start();
    let mut o = RedisOptions::new(cluster.url());
    o.prefix = common::unique_prefix();
    o.clock = ScriptClock::Caller;
    o.connect.response_timeout = std::time::Duration::from_secs(5);
    let redis = RedisStore::connect(o).await.unwrap();
    assert!(redis.is_cluster());
    let items = [
        Item::new(calendar(2, CalendarUnit::Month, "Asia/Tokyo"), 1, "acme"),
        Item::new(calendar(1, CalendarUnit::Week, "UTC"), 2, "globex"),
    ];
    let start = midnight("Asia/Tokyo", 2028, 3, 1).saturating_sub(Nanos::new(2 * DAY));
    let steps = [
        ask(Nanos::ZERO, 1, 3, &[0, 1]),
        ask(Nanos::new(DAY), 1, 1, &[0]),
        ask(Nanos::new(DAY - 1), 1, 1, &[0, 1]),
        ask(Nanos::new(1), 1, 2, &[0]),
        ask(Nanos::new(7 * DAY), 1, 1, &[1, 0]),
    ];
    conform(&redis, &items, start, &steps).await;
    // A Lisbon year, across its new year, at times with arbitrary
    // nanoseconds (resets past 2^53 ns).
    let items = [
        Item::new(calendar(2, CalendarUnit::Year, "Europe/Lisbon"), 3, "acme"),
        Item::new(calendar(1, CalendarUnit::Month, "Asia/Tokyo"), 4, "acme"),
    ];
    let start = midnight("Europe/Lisbon", 2029, 1, 1).saturating_sub(Nanos::new(DAY + ODD));
    let steps = [
        ask(Nanos::ZERO, 1, 2, &[0, 1]),
        ask(Nanos::new(DAY + ODD - 1), 1, 1, &[0]),
        ask(Nanos::new(1), 1, 3, &[0, 1]),
        ask(Nanos::new(40 * DAY + ODD), 1, 1, &[0, 1]),
        ask(Nanos::new(250 * DAY + 3), 1, 1, &[1, 0]),
    ];
    conform(&redis, &items, start, &steps).await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Any calendar window of a day, a week or a month, in zones with
    /// clock changes (at midnight, by half an hour, by a whole day),
    /// started near a month's edge and stepped by up to ten days.
    #[test]
    fn calendar_windows_match_the_memory_store(
        a in (1u64..6, 0usize..3, 0usize..5),
        b in (1u64..6, 0usize..3, 0usize..5),
        shadow in any::<bool>(),
        year in 1990i16..2060,
        month in 1i8..=12,
        offset in prop_oneof![Just(0i64), Just(-1i64), -2 * DAY as i64..2 * DAY as i64],
        steps in proptest::collection::vec(step(3, 10 * DAY, 6, 16), 1..40),
    ) {
        const UNITS: [CalendarUnit; 3] = [CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month];
        const ZONES: [&str; 5] =
            ["UTC", "Europe/Paris", "America/Santiago", "Australia/Lord_Howe", "Pacific/Apia"];
        let first = Item::new(calendar(a.0, UNITS[a.1], ZONES[a.2]), 1, "acme");
        let mut second = Item::new(calendar(b.0, UNITS[b.1], ZONES[b.2]), 2, "acme");
        if shadow {
            second = second.shadow();
        }
        let items = [first, second, Item::new(gcra(20, Nanos::from_secs(3600), 4), 3, "")];
        let start = midnight(ZONES[a.2], year, month, 1).as_u64().saturating_add_signed(offset);
        let steps: Vec<Step> = steps;
        conform_on_a_new_server(&items, Nanos::new(start), &steps);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A calendar year in zones with clock changes (at midnight, by half
    /// an hour, by a whole day), beside any calendar window, started up to
    /// 200 days from a new year at a time with arbitrary nanoseconds and
    /// stepped by up to 120 days: resets on both sides of 2^53 ns.
    #[test]
    fn calendar_years_match_the_memory_store(
        a in (1u64..6, 0usize..5),
        b in (1u64..6, 0usize..4, 0usize..5),
        shadow in any::<bool>(),
        year in 1990i16..2060,
        offset in prop_oneof![Just(0i64), Just(-1i64), -200 * DAY as i64..200 * DAY as i64],
        steps in proptest::collection::vec(step(3, 120 * DAY, 6, 16), 1..30),
    ) {
        const ZONES: [&str; 5] =
            ["UTC", "Europe/Paris", "America/Santiago", "Australia/Lord_Howe", "Pacific/Apia"];
        let first = Item::new(calendar(a.0, CalendarUnit::Year, ZONES[a.1]), 1, "acme");
        let mut second = Item::new(calendar(b.0, CalendarUnit::ALL[b.1], ZONES[b.2]), 2, "acme");
        if shadow {
            second = second.shadow();
        }
        let items = [first, second, Item::new(gcra(20, Nanos::from_secs(3600), 4), 3, "")];
        let start = midnight(ZONES[a.1], year, 1, 1).as_u64().saturating_add_signed(offset);
        let steps: Vec<Step> = steps;
        conform_on_a_new_server(&items, Nanos::new(start), &steps);
    }
}

/// With Redis's own clock, the window is the one holding Redis's time
/// among the three the server sends: a server whose clock runs a day
/// behind still gets today's window, ending at the next UTC midnight as
/// Redis's clock counts.
#[tokio::test]
async fn redis_time_picks_the_window_among_the_servers() {
    let server = RedisServer::start();
    let mut o = RedisOptions::new(server.url());
    o.connect.response_timeout = std::time::Duration::from_secs(5);
    let redis = RedisStore::connect(o).await.unwrap();
    let limit = std::sync::Arc::new(calendar(5, CalendarUnit::Day, "UTC"));
    let plan = Plan::single(Key::new(LimitId(9), "acme"), limit);
    let day = |t: Nanos| t.as_u64() / DAY;
    loop {
        let before = SystemClock.now();
        let behind = before.saturating_sub(Nanos::new(DAY));
        let d = redis
            .decide(&plan, behind, Hits::exactly(1), Mode::Try)
            .await
            .unwrap();
        let after = SystemClock.now();
        if day(before) != day(after) {
            // Midnight passed during the call: ask again.
            continue;
        }
        let next_midnight = (day(before) + 1) * DAY;
        let reset = d.decisions[0].reset_after.as_u64();
        // Redis's clock is this machine's: the window ends at the next
        // midnight, less the time Redis read its clock after `before`.
        assert!(
            reset <= next_midnight - before.as_u64() && reset >= next_midnight - after.as_u64(),
            "reset {reset} for the window ending at {next_midnight}, asked between {} and {}",
            before.as_u64(),
            after.as_u64()
        );
        break;
    }
}

/// Regression (review of issue 18, calendar years, finding 1): a server
/// whose clock runs more than a window behind Redis's sends three windows
/// that are all over by Redis's clock. The script took the server's
/// window anyway, which had already ended: every hit was granted and
/// forgotten at once (a limit of 2 a day, or a year, granted all 4 asks,
/// each answering `remaining: 2`, and no key was kept). The hits now
/// count for the server's window's length from Redis's time: the limit
/// holds, and the window ends within that length.
#[tokio::test]
async fn a_server_more_than_a_window_behind_redis_still_counts_its_hits() {
    let server = RedisServer::start();
    let mut o = RedisOptions::new(server.url());
    o.prefix = unique_prefix();
    o.connect.response_timeout = std::time::Duration::from_secs(5);
    let redis = RedisStore::connect(o).await.unwrap();
    let year = 366 * DAY;
    for (id, unit, zone, behind, longest) in [
        (11, CalendarUnit::Day, "UTC", 3 * DAY, DAY),
        (12, CalendarUnit::Year, "Europe/Paris", 3 * year, year),
    ] {
        let limit = std::sync::Arc::new(calendar(2, unit, zone));
        let plan = Plan::single(Key::new(LimitId(id), "acme"), limit);
        let mut granted = 0;
        let mut last = None;
        for _ in 0..4 {
            let now = SystemClock.now().saturating_sub(Nanos::new(behind));
            let d = redis
                .decide(&plan, now, Hits::exactly(1), Mode::Try)
                .await
                .unwrap();
            granted += d.granted;
            last = Some(d);
        }
        let d = last.unwrap();
        assert_eq!(granted, 2, "{unit}: {d:?}");
        assert!(!d.allowed, "{unit}: {d:?}");
        let reset = d.decisions[0].reset_after.as_u64();
        assert!(reset > 0 && reset <= longest, "{unit}: reset {reset}");
        assert_eq!(d.decisions[0].retry_after, Some(Nanos::new(reset)));
    }
}

/// A calendar year was refused (`Inexact::CalendarTooLong`) when its
/// windows passed the scripts' 2^52 ns bound; every unit runs now.
#[test]
fn every_calendar_unit_runs_a_year_included() {
    for unit in CalendarUnit::ALL {
        check_limit(&calendar(1, unit, "Europe/Paris")).unwrap();
    }
}
