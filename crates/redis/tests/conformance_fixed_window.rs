//! The fixed window counter: the Redis store answers what the memory store
//! answers, step for step.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::strategies::step;
use common::{
    ask, caller_clock_server, caller_clock_store, conform, conform_on_a_new_server, gcra,
    mixed_items, pttl, Item, RedisServer, Step, T0,
};
use proptest::prelude::*;
use tollgate_core::{Align, FixedWindow, Hits, Limit, Mode, Nanos};

fn window(limit: u64, window: Nanos, align: Align) -> Limit {
    Limit::FixedWindow(FixedWindow::new(limit, window, align).unwrap())
}

const ZERO: Nanos = Nanos::ZERO;
const NS: Nanos = Nanos::NANOSECOND;

fn secs(n: u64) -> Nanos {
    Nanos::from_secs(n)
}

/// `before` ahead of the end of the epoch-aligned window of length `w`
/// that holds `T0`.
fn before_boundary(w: Nanos, before: Nanos) -> Nanos {
    let t = T0.as_u64();
    Nanos::new(t - t % w.as_u64() + w.as_u64() - before.as_u64())
}

#[tokio::test]
async fn epoch_windows_reset_exactly_at_the_boundary() {
    let server = RedisServer::start();
    let items = [
        Item::new(window(3, secs(60), Align::Epoch), 1, "acme"),
        Item::new(window(5, Nanos::new(333_333_333), Align::Epoch), 2, "acme"),
    ];
    let steps = [
        ask(ZERO, 1, 5, &[0]),
        ask(ZERO, 1, 1, &[0]),
        // The last nanosecond of the window.
        ask(Nanos::new(999_999_999), 1, 1, &[0]),
        // More than the limit: never.
        ask(ZERO, 4, 4, &[0]),
        ask(ZERO, 0, 2, &[0]),
        // The stampede: the next window admits three more at once.
        ask(NS, 1, 5, &[0]),
        ask(ZERO, 0, 0, &[0]),
        ask(Nanos::new(59_999_999_999), 1, 1, &[0, 1]),
        ask(NS, 2, 2, &[0, 1]),
        ask(ZERO, 2, 5, &[1, 0]),
        // Malformed request: min_hits > hits.
        ask(ZERO, 2, 1, &[0, 1]),
        ask(Nanos::new(333_333_333), 1, 9, &[1]),
        ask(secs(3600), 3, 3, &[0, 1]),
    ];
    let redis = caller_clock_store(&server).await;
    conform(&redis, &items, before_boundary(secs(60), secs(1)), &steps).await;
    // The same from an arbitrary instant.
    let redis = caller_clock_store(&server).await;
    conform(&redis, &items, T0, &steps).await;
}

#[tokio::test]
async fn epoch_alignment_is_exact_for_long_and_tiny_windows() {
    let server = RedisServer::start();
    // A window just below 2^52 ns (about 52 days), one of a nanosecond, and
    // odd lengths that divide neither a second nor the epoch.
    let long = Nanos::new((1 << 52) - 1);
    let items = [
        Item::new(window(3, long, Align::Epoch), 1, "acme"),
        Item::new(window(1, NS, Align::Epoch), 2, "acme"),
        Item::new(window(2, Nanos::new(1_000_000_007), Align::Epoch), 3, ""),
        Item::new(
            window(4, Nanos::new(86_399_999_999_999), Align::Epoch),
            4,
            "",
        ),
    ];
    let steps = [
        ask(ZERO, 1, 2, &[0, 1, 2, 3]),
        ask(ZERO, 1, 2, &[0, 1, 2, 3]),
        ask(ZERO, 1, 1, &[1]),
        ask(NS, 1, 1, &[0, 1]),
        ask(NS, 1, 1, &[1, 2]),
        ask(Nanos::new(1_000_000_005), 1, 3, &[2, 3]),
        ask(NS, 1, 3, &[2, 3]),
        ask(ZERO, 0, 0, &[0, 1, 2, 3]),
    ];
    let redis = caller_clock_store(&server).await;
    conform(&redis, &items, before_boundary(long, NS), &steps).await;
    let redis = caller_clock_store(&server).await;
    conform(&redis, &items, before_boundary(long, Nanos::new(3)), &steps).await;
    let redis = caller_clock_store(&server).await;
    conform(&redis, &items, T0, &steps).await;
    let day = Nanos::new(86_399_999_999_999);
    let redis = caller_clock_store(&server).await;
    conform(&redis, &items, before_boundary(day, NS), &steps).await;
}

#[tokio::test]
async fn first_hit_windows_start_with_the_hit() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        Item::new(window(2, secs(10), Align::FirstHit), 1, "acme"),
        Item::new(window(3, secs(1), Align::FirstHit), 2, "acme"),
    ];
    let steps = [
        // Nothing granted starts no window.
        ask(ZERO, 3, 3, &[0]),
        ask(secs(7), 0, 0, &[0]),
        ask(ZERO, 2, 2, &[0]),
        ask(secs(9), 1, 1, &[0]),
        ask(Nanos::new(999_999_999), 1, 1, &[0]),
        // The window ends exactly ten seconds after its first hit.
        ask(NS, 1, 1, &[0]),
        ask(ZERO, 1, 2, &[0, 1]),
        ask(Nanos::from_millis(400), 1, 9, &[1, 0]),
        ask(Nanos::from_millis(600), 1, 9, &[1]),
        ask(secs(9), 2, 2, &[0]),
        ask(ZERO, 3, 4, &[1]),
        ask(secs(100), 0, 1, &[0, 1]),
    ];
    conform(&redis, &items, T0, &steps).await;
}

#[tokio::test]
async fn shadow_windows_and_mixed_plans() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        Item::new(window(5, secs(1), Align::Epoch), 1, "acme"),
        Item::new(window(2, secs(1), Align::FirstHit), 2, "acme").shadow(),
        Item::new(gcra(4, secs(1), 3), 3, "acme"),
        Item::new(window(3, secs(2), Align::Epoch), 4, "").shadow(),
    ];
    let steps = [
        // The shadows would have granted 2 and 3.
        ask(ZERO, 1, 4, &[0, 1, 3]),
        // Below the first shadow's min: it records nothing.
        ask(ZERO, 1, 1, &[1]),
        ask(ZERO, 2, 3, &[1, 0, 3]),
        // GCRA bounds the plan.
        ask(Nanos::from_millis(300), 1, 6, &[2, 0, 1, 3]),
        ask(Nanos::from_millis(700), 0, 6, &[0, 2]),
        ask(secs(2), 3, 6, &[3, 1, 2, 0]),
        // A window cannot schedule: Acquire fails, changing nothing.
        Step {
            advance: ZERO,
            request: Hits::exactly(1),
            mode: Mode::Acquire,
            items: vec![2, 0],
            own: Vec::new(),
        },
        Step {
            advance: ZERO,
            request: Hits::exactly(1),
            mode: Mode::Acquire,
            items: vec![1],
            own: Vec::new(),
        },
        ask(ZERO, 1, 9, &[0, 1, 2, 3]),
    ];
    conform(&redis, &items, T0, &steps).await;
}

/// A key expires when its window ends (plus the entry script's margin,
/// measured on a window that ends a nanosecond later), and a window that
/// has ended is deleted.
#[tokio::test]
async fn keys_expire_when_the_window_ends() {
    let (server, redis) = caller_clock_server().await;
    let mut con = server.connection();
    let items = [
        Item::new(window(3, secs(60), Align::FirstHit), 1, "acme"),
        Item::new(window(3, secs(60), Align::Epoch), 2, "acme"),
        Item::new(window(3, secs(30), Align::FirstHit), 3, "acme"),
    ];
    let steps = [
        ask(ZERO, 1, 1, &[0]),
        // The first window's last nanosecond, 2.5 s before an epoch
        // boundary.
        ask(Nanos::new(59_999_999_999), 0, 0, &[0]),
        ask(ZERO, 1, 1, &[1]),
        ask(ZERO, 1, 1, &[2]),
    ];
    let start = before_boundary(secs(60), Nanos::new(62_500_000_001));
    conform(&redis, &items, start, &steps).await;
    let margin = pttl(&mut con, 1).unwrap();
    let near = |got: Option<i64>, want: i64| {
        let left = got.unwrap() - margin;
        assert!((left - want).abs() <= 500, "{left} ms left, want {want}");
    };
    near(pttl(&mut con, 2), 2_500);
    near(pttl(&mut con, 3), 30_000);
    // Rejected or not, a request after the window ended deletes its key.
    let steps = [ask(ZERO, 3, 3, &[0]), ask(secs(60), 4, 4, &[0])];
    assert_eq!(server.command("FLUSHALL"), "+OK");
    conform(&redis, &items, T0, &steps).await;
    assert_eq!(pttl(&mut con, 1), None);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn fixed_windows_match_the_memory_store(
        a in (1u64..10, 1u64..3_000_000_000, any::<bool>()),
        b in (1u64..10, 1u64..3_000_000_000, any::<bool>()),
        g in (1u64..50, 1u64..3000, 1u64..8),
        shadow in any::<bool>(),
        start in 0u64..3_000_000_000,
        steps in proptest::collection::vec(step(3, 2_000_000_000, 12, 16), 1..40),
    ) {
        let align = |first_hit: bool| if first_hit { Align::FirstHit } else { Align::Epoch };
        let items = mixed_items(
            window(a.0, Nanos::new(a.1), align(a.2)),
            window(b.0, Nanos::new(b.1), align(b.2)),
            shadow,
            g,
            "",
        );
        conform_on_a_new_server(&items, T0.saturating_add(Nanos::new(start)), &steps);
    }
}
