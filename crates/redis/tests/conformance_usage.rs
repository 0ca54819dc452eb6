//! Usage told after the fact (issue 18 item 3): reports and refunds decide
//! the same in Redis as in the memory store, for every algorithm that
//! takes them (debt past the limit, the bound's clamp, the debt blocking
//! until paid, refunds floored at fresh, shadow items), and are refused
//! alike where there is no sound debt. The property tests of each
//! algorithm's conformance file mix reports and refunds into their random
//! steps too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{ask, caller_clock_server, conform, refund, report, Item, T0};
use tollgate_core::{
    Align, FixedWindow, Gcra, LeakyBucket, Limit, Nanos, Rate, SlidingLog, SlidingWindow, Smooth,
    TokenBucket,
};

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

/// Every algorithm that takes usage, limit 5 (a second's worth), in pairs
/// with a small and the default debt bound.
fn usage_limits() -> Vec<Limit> {
    let rate = Rate::per_second(5).unwrap();
    let base = vec![
        Limit::TokenBucket(TokenBucket::new(5, rate).unwrap()),
        Limit::Gcra(Gcra::new(rate, 5).unwrap()),
        Limit::LeakyBucket(LeakyBucket::new(rate, 5).unwrap()),
        Limit::FixedWindow(FixedWindow::new(5, Nanos::SECOND, Align::Epoch).unwrap()),
        Limit::FixedWindow(FixedWindow::new(5, Nanos::SECOND, Align::FirstHit).unwrap()),
        Limit::SlidingWindow(SlidingWindow::new(5, Nanos::SECOND, 3).unwrap()),
        Limit::SlidingLog(SlidingLog::new(5, Nanos::SECOND).unwrap()),
        Limit::SlidingLog(
            SlidingLog::new(5, Nanos::SECOND)
                .unwrap()
                .with_min_gap(ms(100))
                .counting_rejected(true),
        ),
    ];
    let mut out = Vec::new();
    for l in base {
        out.push(l.clone().with_max_debt(3).unwrap());
        out.push(l);
    }
    out
}

/// The check-before / report-after flow on one limit and on a plan with a
/// shadow item: check, report the real usage past the limit, be refused
/// until the debt is paid, report past the bound (clamped), refund more
/// than was taken (floored at fresh), and carry on.
#[tokio::test]
async fn every_algorithm_with_a_debt_reports_and_refunds_as_the_memory_store() {
    let (_server, redis) = caller_clock_server().await;
    let steps = [
        ask(ms(0), 1, 1, &[0]),
        report(ms(0), 7, &[0]),
        ask(ms(0), 1, 1, &[0]),
        ask(ms(150), 1, 1, &[0]),
        ask(ms(400), 1, 1, &[0]),
        report(ms(0), 50, &[0, 1]),
        ask(ms(10), 0, 3, &[0]),
        refund(ms(0), 2, &[0, 1]),
        ask(ms(0), 1, 1, &[0, 1]),
        refund(ms(300), 100, &[0]),
        ask(ms(0), 1, 10, &[0]),
        report(ms(999), 4, &[1]),
        ask(ms(1), 1, 2, &[0, 1]),
        refund(ms(2000), 3, &[0, 1]),
        report(ms(0), 0, &[0]),
        refund(ms(0), 0, &[1]),
        ask(ms(5000), 5, 5, &[0]),
    ];
    for (i, limit) in usage_limits().into_iter().enumerate() {
        let id = 10 * i as u64;
        let items = [
            Item::new(limit.clone(), id + 1, "acme"),
            Item::new(limit, id + 2, "acme").shadow(),
        ];
        conform(&redis, &items, T0, &steps).await;
    }
}

/// Algorithms without a sound debt are refused in both stores, naming the
/// item, and nothing in the plan changes.
#[tokio::test]
async fn algorithms_without_a_debt_are_refused_alike() {
    let (_server, redis) = caller_clock_server().await;
    let rate = Rate::per_second(5).unwrap();
    let items = [
        Item::new(Limit::Gcra(Gcra::new(rate, 5).unwrap()), 1, "acme"),
        Item::new(Limit::Smooth(Smooth::bursty(rate, 1.0).unwrap()), 2, "acme"),
    ];
    let steps = [
        ask(ms(0), 1, 2, &[0]),
        report(ms(0), 9, &[0, 1]),
        refund(ms(0), 9, &[0, 1]),
        ask(ms(0), 3, 3, &[0, 1]),
    ];
    conform(&redis, &items, T0, &steps).await;
}

/// An Envoy request's check and the usage told beside it
/// (`Store::decide_together`) reach Redis as one script call: answered as
/// the memory store answers them; and when the call fails (Redis hangs
/// past the timeout), Redis decides both or neither, never the check
/// charged and the report lost.
#[tokio::test]
async fn a_check_and_the_usage_beside_it_are_one_call_decided_together_or_not_at_all() {
    use std::sync::Arc;
    use std::time::Duration;
    use tollgate_core::{Hits, Mode};
    use tollgate_redis::{RedisOptions, RedisStore, ScriptClock};
    use tollgate_store::{Key, LimitId, MemoryStore, Plan, Store, StoreError};

    let server = tollgate_redis::testing::RedisServer::start();
    let mut o = RedisOptions::new(server.url());
    o.prefix = common::unique_prefix();
    o.clock = ScriptClock::Caller;
    o.connect.response_timeout = Duration::from_millis(300);
    let redis = RedisStore::connect(o).await.unwrap();
    let rate = Rate::per_second(1).unwrap();
    let plan = |id: u64, capacity: u64| {
        let limit = Limit::TokenBucket(TokenBucket::new(capacity, rate).unwrap());
        Plan::single(Key::new(LimitId(id), "acme"), Arc::new(limit))
    };
    let (check, usage) = (plan(1, 5), plan(2, 100));
    let parts = [
        (&check, Hits::exactly(2), Mode::Try),
        (&usage, Hits::exactly(30), Mode::Report),
    ];
    // The script loaded first (a first call may find it missing and send
    // it again), so the count below is of decisions alone.
    redis.inspect(&check, T0).await.unwrap();
    let calls = server.evalsha_calls();
    let got = redis.decide_together(&parts, T0).await.unwrap();
    let want = MemoryStore::new()
        .decide_together(&parts, T0)
        .await
        .unwrap();
    assert_eq!(got, want);
    assert_eq!(server.evalsha_calls(), calls + 1, "one script call");
    // Redis hangs: the call times out. Whatever Redis does with it once
    // it runs again, it does to both parts.
    server.pause();
    let err = redis.decide_together(&parts, T0).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    server.resume();
    let left = |plan: &Plan| {
        let redis = &redis;
        let plan = plan.clone();
        async move {
            common::eventually(Duration::from_secs(30), || async {
                redis.inspect(&plan, T0).await.is_ok()
            })
            .await;
            redis.inspect(&plan, T0).await.unwrap().decisions[0].remaining
        }
    };
    let after = (left(&check).await, left(&usage).await);
    assert!(
        after == (3, 70) || after == (1, 40),
        "both parts or neither, not {after:?}"
    );
}
