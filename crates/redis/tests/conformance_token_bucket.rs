//! The token bucket: the Redis store answers what the memory store answers,
//! step for step.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::strategies::step;
use common::{
    acquire, ask, caller_clock_server, conform, conform_on_a_new_server, gcra, mixed_items, pttl,
    Item, T0,
};
use proptest::prelude::*;
use std::sync::Arc;

use tollgate_core::{Hits, Limit, Mode, Nanos, Rate, TokenBucket};
use tollgate_store::{Key, LimitId, Plan, Store, StoreError};

fn bucket(capacity: u64, count: u64, period: Nanos) -> Limit {
    Limit::TokenBucket(TokenBucket::new(capacity, Rate::new(count, period).unwrap()).unwrap())
}

fn bucket_with(capacity: u64, count: u64, period: Nanos, initial: u64) -> Limit {
    Limit::TokenBucket(
        TokenBucket::with_initial(capacity, Rate::new(count, period).unwrap(), initial).unwrap(),
    )
}

const ZERO: Nanos = Nanos::ZERO;
const NS: Nanos = Nanos::NANOSECOND;

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

fn secs(n: u64) -> Nanos {
    Nanos::from_secs(n)
}

#[tokio::test]
async fn fractional_refill_and_the_forgetting_boundary() {
    let (_server, redis) = caller_clock_server().await;
    // 10 tokens, one every 250 ms: a full refill takes 2.5 s.
    let items = [Item::new(bucket(10, 4, Nanos::SECOND), 1, "acme")];
    let steps = [
        ask(ZERO, 10, 10, &[0]),
        // 0.4 of a token is not enough, but it is kept.
        ask(ms(100), 1, 1, &[0]),
        ask(ms(150), 1, 1, &[0]),
        // Partial grant: two of five.
        ask(ms(500), 1, 5, &[0]),
        // min_hits 0 succeeds with nothing left.
        ask(ZERO, 0, 5, &[0]),
        // min_hits above what is left: rejected, retry when refilled.
        ask(ms(1), 3, 8, &[0]),
        ask(ms(1), 0, 0, &[0]),
        // Full again exactly 2.5 s after the last take: still remembered.
        ask(ms(2498), 0, 0, &[0]),
        ask(ZERO, 0, 0, &[0]),
        // One nanosecond later: forgotten (the Redis store deletes the key).
        ask(NS, 0, 0, &[0]),
        ask(ZERO, 1, 10, &[0]),
        // More than the capacity never succeeds.
        ask(ms(10), 11, 11, &[0]),
        ask(ZERO, 11, 12, &[0]),
        // Malformed request: min_hits > hits.
        ask(ZERO, 3, 2, &[0]),
        ask(secs(3600), 10, 10, &[0]),
    ];
    conform(&redis, &items, T0, &steps).await;
}

#[tokio::test]
async fn initial_tokens_below_capacity_refill_from_the_first_request() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        // 10 tokens, one a second, a new bucket holds 2.
        Item::new(bucket_with(10, 1, Nanos::SECOND, 2), 1, "acme"),
        // A new bucket holds nothing.
        Item::new(bucket_with(3, 1, ms(100), 0), 2, "acme"),
    ];
    let steps = [
        // Rejected, yet the refill starts now.
        ask(ZERO, 5, 5, &[0]),
        ask(ms(2999), 5, 5, &[0]),
        ask(Nanos::new(999_999), 5, 5, &[0]),
        ask(NS, 5, 5, &[0]),
        // Full ten seconds after the last take, forgotten just after.
        ask(secs(10), 0, 0, &[0]),
        ask(NS, 0, 0, &[0]),
        ask(ZERO, 3, 3, &[0]),
        ask(ZERO, 1, 1, &[1]),
        ask(ms(100), 1, 2, &[1]),
        ask(ms(50), 1, 1, &[1, 0]),
        ask(ms(50), 1, 1, &[0, 1]),
        ask(secs(1), 1, 5, &[1, 0]),
        ask(secs(30), 0, 0, &[0, 1]),
        ask(ZERO, 1, 4, &[0, 1]),
    ];
    conform(&redis, &items, T0, &steps).await;
}

#[tokio::test]
async fn initial_tokens_above_capacity_are_a_one_off_burst() {
    let (_server, redis) = caller_clock_server().await;
    // 100 tokens, one every 600 ms, a new bucket holds 150.
    let items = [
        Item::new(bucket_with(100, 100, secs(60), 150), 1, "acme"),
        Item::new(bucket_with(4, 2, Nanos::SECOND, 6), 2, "acme"),
    ];
    let steps = [
        ask(ZERO, 1, 1000, &[0]),
        // Thirty seconds refill fifty, not more.
        ask(secs(30), 1, 1000, &[0]),
        // More than the capacity, not more than the initial tokens: only a
        // forgotten bucket holds them, a refill time (60 s) after the last
        // take.
        ask(ZERO, 120, 120, &[0]),
        // Beyond the initial tokens: never.
        ask(ZERO, 151, 151, &[0]),
        ask(secs(60), 120, 120, &[0]),
        ask(NS, 120, 120, &[0]),
        // Above the capacity, the level is spent and never refilled.
        ask(ZERO, 1, 1, &[1]),
        ask(secs(1), 0, 0, &[1]),
        ask(ZERO, 5, 5, &[1]),
        ask(ZERO, 4, 4, &[1]),
        ask(ms(500), 5, 6, &[1]),
        ask(ms(1500), 6, 6, &[1]),
        // Forgotten: idle for more than the 2 s refill time.
        ask(NS, 6, 6, &[1]),
        ask(ZERO, 6, 6, &[1]),
        ask(ZERO, 7, 7, &[1]),
        // In debt, the burst returns once the debt is repaid and a whole
        // refill time has passed on top: 5 s + 2 s.
        acquire(ZERO, 10, &[1]),
        ask(ZERO, 5, 5, &[1]),
        ask(secs(7), 5, 5, &[1]),
        ask(NS, 5, 5, &[1]),
    ];
    conform(&redis, &items, T0, &steps).await;
}

#[tokio::test]
async fn acquire_goes_into_debt_and_waits_it_out() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        // Two tokens, one every 100 ms.
        Item::new(bucket(2, 10, Nanos::SECOND), 1, "acme"),
        Item::new(gcra(5, Nanos::SECOND, 2), 2, "acme"),
        Item::new(bucket_with(3, 1, Nanos::SECOND, 5), 3, "acme").shadow(),
    ];
    let steps = [
        acquire(ZERO, 2, &[0]),
        acquire(ZERO, 3, &[0]),
        // min_hits 0 is granted now, even in debt.
        ask(ZERO, 0, 1, &[0]),
        // The debt is repaid before anything is admitted again.
        ask(ms(350), 1, 1, &[0]),
        ask(ZERO, 0, 1, &[0]),
        ask(ZERO, 0, 0, &[0]),
        ask(ms(50), 1, 1, &[0]),
        // Unused for the refill time plus the debt: forgotten just after.
        acquire(ms(10), 0, &[0]),
        acquire(ZERO, 50, &[0]),
        ask(secs(5), 0, 0, &[0]),
        ask(ms(190), 0, 0, &[0]),
        ask(NS, 1, 2, &[0]),
        // Plans: the longest wait of the live limits; a shadow's is ignored.
        acquire(ZERO, 4, &[0, 1]),
        acquire(ms(30), 1, &[1, 0, 2]),
        acquire(ZERO, 9, &[2, 0]),
        ask(ms(100), 1, 3, &[0, 1, 2]),
        acquire(secs(2), 0, &[2]),
        acquire(ZERO, 1_000_000, &[0, 2]),
        ask(secs(1), 1, 1, &[0, 1, 2]),
        ask(secs(200_000), 2, 2, &[0, 1, 2]),
    ];
    conform(&redis, &items, T0, &steps).await;
}

#[tokio::test]
async fn shadow_buckets_record_what_they_would_live() {
    let (_server, redis) = caller_clock_server().await;
    let items = [
        Item::new(bucket(10, 10, Nanos::SECOND), 1, "acme"),
        Item::new(bucket(3, 1, Nanos::SECOND), 2, "acme").shadow(),
        Item::new(bucket_with(5, 1, Nanos::SECOND, 1), 3, "acme").shadow(),
        Item::new(gcra(4, Nanos::SECOND, 4), 4, "acme"),
    ];
    let steps = [
        // The shadows would have granted 3 and nothing.
        ask(ZERO, 2, 5, &[0, 1, 2]),
        ask(ZERO, 3, 4, &[0, 1, 2]),
        ask(ms(100), 1, 9, &[1, 0, 2, 3]),
        ask(ms(900), 2, 6, &[0, 3, 1]),
        ask(ZERO, 1, 1, &[1, 2]),
        ask(secs(3), 0, 2, &[2, 1, 0, 3]),
        ask(secs(60), 1, 3, &[0, 1, 2, 3]),
    ];
    conform(&redis, &items, T0, &steps).await;
}

#[tokio::test]
async fn large_spans_stay_exact() {
    let (_server, redis) = caller_clock_server().await;
    // Full times just below 2^52 ns (about 52 days), odd intervals.
    let interval = ((1u64 << 52) - 1) / 7;
    let items = [
        Item::new(bucket(7, 1, Nanos::new(interval)), 1, "acme"),
        Item::new(bucket_with(3, 3, Nanos::new(1_000_000_007), 1), 2, ""),
    ];
    let steps = [
        ask(ZERO, 1, 7, &[0]),
        ask(Nanos::new(interval - 1), 1, 1, &[0, 1]),
        ask(NS, 1, 1, &[0, 1]),
        acquire(Nanos::new(12_345), 2, &[1]),
        ask(Nanos::new(interval * 3 + 17), 0, 9, &[0, 1]),
        ask(Nanos::new(interval * 7), 0, 0, &[0, 1]),
        ask(NS, 1, 1, &[0]),
    ];
    conform(&redis, &items, T0, &steps).await;
}

/// A key expires once its state must have been forgotten (plus the entry
/// script's margin, measured on a key forgotten a nanosecond later), and a
/// forgotten state is deleted.
#[tokio::test]
async fn keys_expire_once_forgotten_and_idle_ones_are_deleted() {
    let (server, redis) = caller_clock_server().await;
    let mut con = server.connection();
    // Ten tokens, one a second: full ten seconds after the last take.
    let tb = || bucket(10, 1, Nanos::SECOND);
    let items = [
        Item::new(tb(), 1, "acme"),
        Item::new(tb(), 2, "acme"),
        Item::new(tb(), 3, "acme"),
    ];
    let steps = [
        // Five seconds of debt: forgotten after 15 s; at 15 s, a nanosecond
        // is left.
        acquire(ZERO, 15, &[2]),
        ask(secs(15), 0, 0, &[2]),
        ask(ZERO, 10, 10, &[0]),
        acquire(ZERO, 15, &[1]),
    ];
    conform(&redis, &items, T0, &steps).await;
    let margin = pttl(&mut con, 3).unwrap();
    let near = |got: Option<i64>, want: i64| {
        let left = got.unwrap() - margin;
        assert!((left - want).abs() <= 500, "{left} ms left, want {want}");
    };
    near(pttl(&mut con, 1), 10_000);
    near(pttl(&mut con, 2), 15_000);
    // A nanosecond later the bucket is forgotten and its key deleted.
    let steps = [
        acquire(ZERO, 15, &[0]),
        ask(Nanos::new(15_000_000_001), 0, 0, &[0]),
    ];
    assert_eq!(server.command("FLUSHALL"), "+OK");
    conform(&redis, &items, T0, &steps).await;
    assert_eq!(pttl(&mut con, 1), None);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn token_buckets_match_the_memory_store(
        a in (1u64..20, 1u64..50, 1u64..3000, 0u64..30),
        b in (1u64..20, 1u64..50, 1u64..3000, 0u64..30),
        g in (1u64..50, 1u64..3000, 1u64..8),
        default_initial in any::<bool>(),
        shadow in any::<bool>(),
        steps in proptest::collection::vec(step(3, 3_000_000_000, 25, 6), 1..40),
    ) {
        let ms = Nanos::from_millis;
        let first = if default_initial {
            bucket(a.0, a.1, ms(a.2))
        } else {
            bucket_with(a.0, a.1, ms(a.2), a.3)
        };
        let second = bucket_with(b.0, b.1, ms(b.2), b.3);
        conform_on_a_new_server(&mixed_items(first, second, shadow, g, ""), T0, &steps);
    }
}

#[tokio::test]
async fn an_acquire_that_would_wait_52_days_or_more_is_refused_and_changes_nothing() {
    let (_server, redis) = caller_clock_server().await;
    let limit = Arc::new(Limit::TokenBucket(
        TokenBucket::new(10, Rate::per_second(1).unwrap()).unwrap(),
    ));
    let plan = Plan::single(Key::new(LimitId(1), "acme"), Arc::clone(&limit));
    // 2^52 ns is about 4.5 million seconds: at one token a second, asking
    // for five million more than the bucket holds is past it.
    let err = redis
        .decide(&plan, T0, Hits::exactly(5_000_010), Mode::Acquire)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
    // Nothing was taken: the full bucket still grants its ten.
    let d = redis
        .decide(&plan, T0, Hits::exactly(10), Mode::Try)
        .await
        .unwrap();
    assert_eq!(d.granted, 10);
}

/// Regression (found by the property test above): a refund to a forgotten
/// bucket that starts below capacity gives nothing and leaves it forgotten,
/// so it refills only from its next request. The over-limit cache learnt
/// the refund's answer (its initial tokens, a full refill to go) as a
/// bucket refilling from the refund's time, and answered the next check
/// with tokens the bucket never had.
#[test]
fn a_refund_to_a_forgotten_bucket_below_capacity_is_not_learnt_as_refilling() {
    use common::Step;
    let ms = Nanos::from_millis;
    let items = [Item::new(bucket_with(8, 10, ms(717), 0), 1, "acme")];
    let st = |advance: u64, hits, min, mode| Step {
        advance: Nanos::new(advance),
        request: Hits::between(min, hits),
        mode,
        items: vec![0],
        own: Vec::new(),
    };
    // Refilled in 573.6 ms from its first (refused) request; forgotten
    // 581.9 ms later, when the refund comes; checked a refill time after.
    let steps = [
        st(0, 16, 1, Mode::Try),
        st(581_918_522, 15, 15, Mode::Refund),
        st(1_000_000, 0, 0, Mode::Report),
        st(572_801_706, 9, 9, Mode::Try),
    ];
    conform_on_a_new_server(&items, T0, &steps);
}
