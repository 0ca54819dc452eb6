//! Calendar windows (`fixed_window` with `align: calendar`): the Redis
//! store answers what the memory store answers, step for step, across
//! month edges, clock changes and the edge's last nanosecond; the script
//! takes the window holding Redis's own time among those the server
//! computed; a calendar year is refused.
//!
//! The Lua script has no time zone database: the server sends the edges
//! of three windows around its time (`params::encode`), the script picks
//! one. With the caller's clock (these conformance tests) the server's
//! time is the script's, so the answers must be identical.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::strategies::step;
use common::{ask, caller_clock_store, conform, conform_on_a_new_server, gcra, Item, Step};
use jiff::civil::date;
use jiff::tz::TimeZone;
use proptest::prelude::*;
use tollgate_core::{
    Calendar, CalendarUnit, Clock, FixedWindow, Hits, Limit, Mode, Nanos, SystemClock,
};
use tollgate_redis::testing::{RedisCluster, RedisServer};
use tollgate_redis::{check_limit, Inexact, RedisOptions, RedisStore, ScriptClock};
use tollgate_store::{Key, LimitId, Plan, Store};

const HOUR: u64 = 3_600_000_000_000;
const DAY: u64 = 24 * HOUR;

fn calendar(limit: u64, unit: CalendarUnit, zone: &str) -> Limit {
    Limit::FixedWindow(FixedWindow::calendar(limit, Calendar::new(unit, zone).unwrap()).unwrap())
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

#[test]
fn a_calendar_year_is_refused_and_shorter_ones_run() {
    for unit in [CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month] {
        check_limit(&calendar(1, unit, "Europe/Paris")).unwrap();
    }
    let e = check_limit(&calendar(1, CalendarUnit::Year, "Europe/Paris")).unwrap_err();
    assert_eq!(e, Inexact::CalendarTooLong(CalendarUnit::Year));
    let text = e.to_string();
    assert!(
        text.contains("a calendar window of 1y is too long for the Redis store")
            && text.contains("`1mo`"),
        "{text}"
    );
}
