//! Concurrent decisions share script calls (`src/batch.rs`): many at once
//! are decided in a few calls, each plan still all or nothing and exact,
//! and a plan the script refuses does not disturb the others of its call.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{gcra, store, unique_prefix, RedisServer};
use tollgate_core::{Align, FixedWindow, Hits, Limit, Mode, Nanos, PlanError};
use tollgate_store::{Key, LimitId, Plan, Store, StoreError};

#[tokio::test]
async fn many_concurrent_decisions_share_few_calls_and_stay_exact() {
    let server = RedisServer::start();
    let s = store(&server.url(), &unique_prefix(), 5000).await;
    let window = Arc::new(Limit::FixedWindow(
        FixedWindow::new(50, Nanos::from_secs(3600), Align::FirstHit).unwrap(),
    ));
    let rate = Arc::new(gcra(1000, Nanos::from_secs(86_400), 1000));
    let plan = |scope: &str| {
        let mut p = Plan::default().with_affinity(1);
        p.push(Key::new(LimitId(1), scope), Arc::clone(&window), false)
            .unwrap();
        p.push(Key::new(LimitId(2), "*"), Arc::clone(&rate), false)
            .unwrap();
        p
    };
    let before = server.evalsha_calls();
    // 200 decisions for acme and 40 for globex, sent at once, with 20
    // acquires a fixed window cannot schedule in between.
    let mut calls = Vec::new();
    for i in 0..260 {
        let (scope, mode) = match i % 13 {
            0 => ("acme", Mode::Acquire),
            1 | 2 => ("globex", Mode::Try),
            _ => ("acme", Mode::Try),
        };
        let (s, p) = (s.clone(), plan(scope));
        calls.push(async move {
            (
                scope,
                mode,
                s.decide(&p, Nanos::ZERO, Hits::exactly(1), mode).await,
            )
        });
    }
    let answers = futures_util::future::join_all(calls).await;
    let calls_used = server.evalsha_calls() - before;

    let granted = |who: &str| {
        answers
            .iter()
            .filter(|(s, m, r)| *s == who && *m == Mode::Try && r.as_ref().is_ok_and(|d| d.allowed))
            .count()
    };
    assert_eq!(granted("acme"), 50);
    assert_eq!(granted("globex"), 40);
    for (_, mode, r) in &answers {
        match mode {
            Mode::Acquire => assert!(
                matches!(
                    r,
                    Err(StoreError::Plan(PlanError::CannotSchedule { index: 0, .. }))
                ),
                "{r:?}"
            ),
            Mode::Try => assert!(r.is_ok(), "{r:?}"),
            Mode::Report | Mode::Refund => unreachable!("only try and acquire are sent"),
        }
    }
    // The shared rate saw every granted decision and nothing else: the
    // refused acquires changed nothing.
    let d = s
        .decide(&plan("initech"), Nanos::ZERO, Hits::exactly(0), Mode::Try)
        .await
        .unwrap();
    assert_eq!(d.decisions[1].remaining, 1000 - 90);
    // Sent at once, they went in a handful of calls, not 260.
    assert!(calls_used <= 20, "{calls_used} calls for 260 decisions");
}
