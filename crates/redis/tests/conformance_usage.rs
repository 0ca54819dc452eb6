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
