//! The local over-limit cache (`src/cache.rs`): a key Redis rejected is
//! answered by the server until its state could admit again, exactly as
//! Redis would answer, and never admits anything itself.
//!
//! The reference is Redis itself: the same steps run through a store with
//! the cache and one without it, on one redis-server, and every answer
//! must be the same, field for field.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::strategies::step;
use common::{plan_of, runtime, unique_prefix, Item, RedisServer, Step, T0};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate_core::{
    Align, FixedWindow, Gcra, Hits, LeakyBucket, Limit, Mode, Nanos, PlanDecision, Rate,
    SlidingWindow, TokenBucket,
};
use tollgate_redis::{RedisOptions, RedisStore, ScriptClock};
use tollgate_store::{Key, LimitId, Plan, Store};

/// A store on `server` with its own prefix (or `prefix`), the caller's
/// clock unless `redis_clock`, and an over-limit cache of `cache` entries
/// that live up to an hour (so that no answer depends on the test's speed).
async fn store_with(
    server: &RedisServer,
    prefix: Option<&str>,
    redis_clock: bool,
    cache: usize,
) -> RedisStore {
    store_of(server, prefix, redis_clock, cache, |_| {}).await
}

/// [`store_with`], with `tweak` applied to the options last.
async fn store_of(
    server: &RedisServer,
    prefix: Option<&str>,
    redis_clock: bool,
    cache: usize,
    tweak: impl FnOnce(&mut RedisOptions),
) -> RedisStore {
    let mut o = RedisOptions::new(server.url());
    o.prefix = prefix.map_or_else(unique_prefix, str::to_owned);
    o.clock = if redis_clock {
        ScriptClock::Redis
    } else {
        ScriptClock::Caller
    };
    o.connect.response_timeout = Duration::from_secs(5);
    o.rejection_cache = cache;
    o.rejection_cache_max_age = Duration::from_secs(3600);
    tweak(&mut o);
    RedisStore::connect(o).await.unwrap()
}

/// Runs `steps` through a store with the cache and one without, on
/// `server`, and requires the same answer (or error) at every step;
/// returns how many the cache answered, and the script calls both made.
async fn agree(server: &RedisServer, items: &[Item], steps: &[Step]) -> (u64, u64) {
    let cached = store_with(server, None, false, 1024).await;
    let plain = store_with(server, None, false, 0).await;
    let calls = server.evalsha_calls();
    let mut now = T0;
    for (n, step) in steps.iter().enumerate() {
        now = now.saturating_add(step.advance);
        let Some(plan) = plan_of(items, step) else {
            continue;
        };
        let got = cached.decide(&plan, now, step.request, step.mode).await;
        let want = plain.decide(&plan, now, step.request, step.mode).await;
        assert_eq!(
            got,
            want,
            "step {n} at +{} ({step:?}) differs: with the cache (left), without (right)\n\
             items: {items:?}",
            now.saturating_sub(T0)
        );
    }
    (cached.cache_stats().hits, server.evalsha_calls() - calls)
}

fn per(count: u64, ms: u64) -> Rate {
    Rate::new(count, Nanos::from_millis(ms)).unwrap()
}

/// Any limit: the four the cache keeps (token buckets with and without
/// more initial tokens than capacity, GCRA, leaky bucket, fixed windows of
/// both alignments) and one it does not (the sliding window).
fn limit() -> impl Strategy<Value = Limit> {
    limit_over(20..2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random limits (some in shadow mode), plans of one to three of them,
    /// and requests of few hits (partial grants, malformed ranges, acquires
    /// now and then) at random times: with the cache or without, Redis's
    /// answers are the same.
    #[test]
    fn the_cache_answers_what_redis_answers(
        limits in proptest::collection::vec((limit(), any::<bool>()), 3),
        steps in proptest::collection::vec(step(3, 150_000_000, 4, 12), 1..60),
    ) {
        let items = items_of(limits);
        runtime().block_on(async {
            let server = RedisServer::start();
            agree(&server, &items, &steps).await;
        });
    }
}

/// Any limit, as [`limit`], over periods of 5 to 300 ms: with Redis's
/// clock a run lasts a fraction of a second, and its keys must be able to
/// admit again within it.
fn quick_limit() -> impl Strategy<Value = Limit> {
    limit_over(5..300)
}

/// Plan items of three limits (each maybe in shadow mode): two of them
/// per domain (scope `acme`), one over every domain.
fn items_of(limits: Vec<(Limit, bool)>) -> Vec<Item> {
    let scopes = ["acme", "acme", ""];
    limits
        .into_iter()
        .enumerate()
        .map(|(i, (limit, shadow))| {
            let item = Item::new(limit, i as u64 + 1, scopes[i]);
            if shadow {
                item.shadow()
            } else {
                item
            }
        })
        .collect()
}

/// Any limit, as [`limit`], over periods of `ms` milliseconds.
fn limit_over(ms: std::ops::Range<u64>) -> impl Strategy<Value = Limit> {
    prop_oneof![
        (1u64..6, 1u64..20, ms.clone(), 0u64..9).prop_map(|(cap, n, ms, init)| {
            Limit::TokenBucket(TokenBucket::with_initial(cap, per(n, ms), init).unwrap())
        }),
        (1u64..6, 1u64..20, ms.clone()).prop_map(|(cap, n, ms)| {
            Limit::TokenBucket(TokenBucket::new(cap, per(n, ms)).unwrap())
        }),
        (1u64..20, ms.clone(), 1u64..5)
            .prop_map(|(n, ms, b)| Limit::Gcra(Gcra::new(per(n, ms), b).unwrap())),
        (1u64..20, ms.clone(), 1u64..5).prop_map(|(n, ms, q)| {
            Limit::LeakyBucket(LeakyBucket::new(per(n, ms), q).unwrap())
        }),
        (1u64..6, ms.clone(), any::<bool>()).prop_map(|(l, ms, first)| {
            let align = if first { Align::FirstHit } else { Align::Epoch };
            Limit::FixedWindow(FixedWindow::new(l, Nanos::from_millis(ms), align).unwrap())
        }),
        (1u64..6, ms, 2u32..4).prop_map(|(l, ms, b)| {
            Limit::SlidingWindow(SlidingWindow::new(l, Nanos::from_millis(ms), b).unwrap())
        }),
    ]
}

/// Whether `d` refuses `request` for want of room (the cache's own test:
/// at least one hit asked, not allowed or limited by a shadow item).
fn rejects(d: &PlanDecision, request: Hits) -> bool {
    request.min_hits > 0 && request.is_well_formed() && (!d.allowed || d.shadow_limited)
}

/// Slack for the two clocks' whole microseconds (Redis's `TIME`, the
/// cache's), many times over.
const MICROS: Nanos = Nanos::from_micros(10);

/// What a local answer `cached` to `request` for `plan` may be, given
/// Redis's answer `redis` to the same request asked right after, at most
/// `elapsed` after the cache answered (measured around both). Not timed:
/// only inequalities that hold whatever the pace.
///
/// - The cache grants nothing, and answers a rejection; "allowed" only for
///   a plan of shadow items, which Redis allows whatever the state.
///   Anything else is an admission Redis never counted.
/// - Every rebuilt state admits at least what Redis's real one admits, and
///   each item's `retry_after` counts down at most one nanosecond a
///   nanosecond: so each local `retry_after` is at most Redis's plus the
///   time between them; a local "never" is Redis's "never".
/// - Where Redis grants an item anything right after, the cache's own
///   `retry_after` for it said it could by then: otherwise the cache
///   rejected what Redis would have admitted, beyond the documented strict
///   side.
fn answered_as_redis_would(
    plan: &Plan,
    request: Hits,
    cached: &PlanDecision,
    redis: &PlanDecision,
    elapsed: Nanos,
) -> Result<(), TestCaseError> {
    let items = plan.items();
    let shown = || format!("local {cached:?}\nRedis right after {redis:?}\n{request:?} {plan:?}");
    prop_assert!(
        rejects(cached, request),
        "the cache answered what is no rejection: {}",
        shown()
    );
    prop_assert!(
        cached.decisions.iter().all(|d| d.granted == 0),
        "the cache granted hits Redis never counted: {}",
        shown()
    );
    if cached.allowed {
        // Only a plan of shadow items (a plan whose live items are asked
        // no hits of their own is a zero-hit check, never answered here).
        prop_assert!(items.iter().all(|it| it.shadow), "{}", shown());
        prop_assert!(redis.allowed, "{}", shown());
    }
    for i in 0..items.len() {
        let (here, there) = (
            cached.decisions[i].retry_after,
            redis.decisions[i].retry_after,
        );
        match (here, there) {
            (None, Some(_)) => prop_assert!(false, "item {i}: never here: {}", shown()),
            (Some(h), Some(t)) => prop_assert!(
                h <= t.saturating_add(elapsed).saturating_add(MICROS),
                "item {i}: retry_after {h:?} here, {t:?} at Redis {elapsed:?} later: {}",
                shown()
            ),
            _ => {}
        }
        if redis.decisions[i].granted > 0 {
            prop_assert!(
                here.is_some_and(|h| h <= elapsed.saturating_add(MICROS)),
                "item {i}: the cache rejected, Redis admitted {elapsed:?} later: {}",
                shown()
            );
        }
    }
    Ok(())
}

/// The cache on Redis's clock (the server's real mode), against Redis
/// itself: random limits (some in shadow mode, one never cached), plans of
/// one to three of them, requests of few hits (ranges, malformed ones,
/// acquires) from two servers with caches and one without, sharing the
/// keys, with pauses of up to 3 ms so keys admit again during a run.
/// Whenever a server answers from its cache, the same request goes to
/// Redis at once, and the two answers must agree as
/// [`answered_as_redis_would`] says. Over all the cases, the cache must
/// have answered often, so the property is not vacuous.
#[test]
fn with_redis_clock_the_cache_answers_only_what_redis_answers_right_after() {
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    let checked = std::sync::atomic::AtomicU64::new(0);
    let strategy = (
        proptest::collection::vec((quick_limit(), any::<bool>()), 3),
        proptest::collection::vec((step(3, 3_000_000, 4, 12), 0usize..3), 1..150),
    );
    let result = runner.run(&strategy, |(limits, steps)| {
        let items = items_of(limits);
        runtime().block_on(async {
            let server = RedisServer::start();
            let prefix = unique_prefix();
            let servers = [
                store_with(&server, Some(&prefix), true, 1024).await,
                store_with(&server, Some(&prefix), true, 1024).await,
                store_with(&server, Some(&prefix), true, 0).await,
            ];
            let redis = &servers[2];
            for (step, by) in &steps {
                let Some(plan) = plan_of(&items, step) else {
                    continue;
                };
                // Another server's refund is seen here only when the entry
                // lapses: the documented strict side, outside this
                // property (`a_refund_updates_the_refunding_servers_cached_rejection`
                // covers a server's own). Reports only take more.
                let mut step = step.clone();
                if step.mode == Mode::Refund {
                    step.mode = Mode::Report;
                }
                let step = &step;
                if step.advance > Nanos::ZERO {
                    tokio::time::sleep(Duration::from_nanos(step.advance.as_u64())).await;
                }
                let s = &servers[*by];
                let before = s.cache_stats().hits;
                let started = Instant::now();
                let got = s.decide(&plan, Nanos::ZERO, step.request, step.mode).await;
                if s.cache_stats().hits == before {
                    continue;
                }
                let cached = got.unwrap();
                let right_after = redis
                    .decide(&plan, Nanos::ZERO, step.request, step.mode)
                    .await
                    .unwrap();
                let elapsed = Nanos::new(started.elapsed().as_nanos() as u64);
                checked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                answered_as_redis_would(&plan, step.request, &cached, &right_after, elapsed)?;
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let checked = checked.into_inner();
    assert!(checked > 40, "only {checked} local answers were checked");
}

/// A hot key, rejected over and over with every kind of request Redis
/// would reject (more than is left, a range whose minimum is more, a
/// shadow plan), is answered by the cache, as Redis answers it; the
/// requests that fit go to Redis and are granted, and so do checks of
/// zero hits, which Redis allows (finding 1 of the review).
#[tokio::test]
async fn a_hot_rejected_key_is_answered_locally_as_redis_answers_it() {
    let server = RedisServer::start();
    let bucket = Limit::TokenBucket(TokenBucket::new(3, per(10, 1000)).unwrap());
    let gcra = Limit::Gcra(Gcra::new(per(5, 1000), 2).unwrap());
    let window =
        Limit::FixedWindow(FixedWindow::new(3, Nanos::from_secs(1), Align::Epoch).unwrap());
    for limit in [bucket, gcra, window] {
        let items = [
            Item::new(limit.clone(), 1, "acme"),
            Item::new(limit, 1, "acme").shadow(),
        ];
        let ms = Nanos::from_millis;
        let mut steps = vec![Step::exactly(Nanos::ZERO, 3, 1)];
        for i in 0..200u64 {
            let (request, plan) = match i % 5 {
                0 => (Hits::exactly(1), vec![0]),
                1 => (Hits::exactly(2), vec![0]),
                2 => (Hits::between(2, 3), vec![0]),
                3 => (Hits::exactly(1), vec![1]),
                _ => (Hits::exactly(0), vec![0]),
            };
            steps.push(Step {
                advance: ms(3),
                request,
                mode: Mode::Try,
                items: plan,
                own: Vec::new(),
            });
        }
        let (hits, calls) = agree(&server, &items, &steps).await;
        // The plain store made one call a step; the cached one one for
        // every step the cache did not answer (and the first one, which
        // found the script not loaded yet, made two).
        assert!(hits > 100, "{hits} answered by the cache");
        let asked = 2 * steps.len() as u64 - hits;
        assert!(
            calls == asked || calls == asked + 1,
            "{calls} calls, {asked} asked"
        );
    }
}

/// With Redis's clock (the server's real mode), a key Redis rejected is
/// answered without Redis until it could admit again: the same rejection,
/// with the times counted down.
#[tokio::test]
async fn with_redis_clock_a_rejection_is_repeated_locally_with_its_times_counted_down() {
    let server = RedisServer::start();
    let s = store_with(&server, None, true, 1024).await;
    let limit = Arc::new(Limit::Gcra(Gcra::new(per(1, 3_600_000), 1).unwrap()));
    let plan = Plan::single(Key::new(LimitId(1), "acme"), limit);
    let ask = |s: &RedisStore| {
        let s = s.clone();
        let plan = plan.clone();
        async move {
            s.decide(&plan, Nanos::ZERO, Hits::exactly(1), Mode::Try)
                .await
                .unwrap()
        }
    };
    assert!(ask(&s).await.allowed);
    let first = ask(&s).await;
    assert!(!first.allowed);
    let calls = server.evalsha_calls();
    let mut last = first.clone();
    for _ in 0..100 {
        let d = ask(&s).await;
        assert!(!d.allowed);
        assert_eq!(d.granted, 0);
        assert_eq!(d.limited_by, Some(0));
        assert_eq!(d.decisions[0].remaining, 0);
        assert_eq!(d.rooms[0], 0);
        // Counted down, never up (an hour is far away).
        let retry = d.decisions[0].retry_after.unwrap();
        assert!(retry <= last.decisions[0].retry_after.unwrap());
        assert!(retry > Nanos::from_secs(3000));
        last = d;
    }
    assert_eq!(server.evalsha_calls(), calls, "the repeats reached Redis");
    assert_eq!(s.cache_stats().hits, 100);
    assert_eq!(s.cache_stats().entries, 1);
}

/// Several servers with caches, one key: the cache never admits, so
/// however their requests interleave, no more is granted than the limit
/// holds.
#[tokio::test]
async fn servers_with_caches_sharing_a_key_never_grant_more_than_the_limit() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(store_with(&server, Some(&prefix), false, 1024).await);
    }
    let limit = Arc::new(Limit::TokenBucket(
        TokenBucket::new(20, per(1, 3_600_000)).unwrap(),
    ));
    let plan = Plan::single(Key::new(LimitId(1), "acme"), limit);
    // In waves of 30 at once, so that later waves meet what the caches
    // learnt from earlier ones.
    let mut answers = Vec::new();
    for wave in 0..20u64 {
        let mut calls = Vec::new();
        for i in wave * 30..(wave + 1) * 30 {
            let (s, plan) = (stores[(i % 3) as usize].clone(), plan.clone());
            // Ranges and sizes vary: a rejection of 3 says nothing of 1.
            let request = match i % 4 {
                0 => Hits::exactly(3),
                1 => Hits::exactly(1),
                2 => Hits::between(1, 2),
                _ => Hits::exactly(2),
            };
            calls.push(async move { s.decide(&plan, T0, request, Mode::Try).await.unwrap() });
        }
        answers.extend(futures_util::future::join_all(calls).await);
    }
    let granted: u64 = answers.iter().map(|d| d.granted).sum();
    assert_eq!(granted, 20);
    let hits: u64 = stores.iter().map(|s| s.cache_stats().hits).sum();
    assert!(hits > 0, "the caches answered nothing");
}

/// Regression (review of issue 17, finding 1): a check of zero hits, which
/// Redis allows and which takes nothing, became a cache entry, and the
/// next such check was answered from it: another server's grants
/// meanwhile were invisible, and this server kept showing the key's
/// `remaining` as it was. Only a rejection may become an entry, and only
/// a rejection is answered locally. Two servers (stores) share one key
/// on one redis-server: A takes one, checks with zero hits, B takes the
/// rest; A's next check must say what Redis says.
#[tokio::test]
async fn a_check_of_zero_hits_is_not_cached_so_another_servers_grants_show() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let a = store_with(&server, Some(&prefix), false, 1024).await;
    let b = store_with(&server, Some(&prefix), false, 1024).await;
    let limit = Arc::new(Limit::TokenBucket(
        TokenBucket::new(3, per(1, 3_600_000)).unwrap(),
    ));
    let plan = Plan::single(Key::new(LimitId(1), "acme"), limit);
    let ms = |n| T0.saturating_add(Nanos::from_millis(n));
    let took = a.decide(&plan, ms(0), Hits::exactly(1), Mode::Try).await;
    assert_eq!(took.unwrap().granted, 1);
    let check = a
        .decide(&plan, ms(1), Hits::exactly(0), Mode::Try)
        .await
        .unwrap();
    assert!(check.allowed);
    assert_eq!(check.decisions[0].remaining, 2);
    assert_eq!(
        a.cache_stats().entries,
        0,
        "an allowed check became an entry"
    );
    let rest = b.decide(&plan, ms(2), Hits::exactly(2), Mode::Try).await;
    assert_eq!(rest.unwrap().granted, 2);
    let calls = server.evalsha_calls();
    let again = a
        .decide(&plan, ms(3), Hits::exactly(0), Mode::Try)
        .await
        .unwrap();
    assert_eq!(
        server.evalsha_calls(),
        calls + 1,
        "the check did not reach Redis"
    );
    assert_eq!(again.decisions[0].remaining, 0, "{again:?}");
    assert_eq!(a.cache_stats().hits, 0);
}

/// A GCRA limit of one an hour, and its plan for `acme`.
fn hourly() -> Plan {
    hourly_for("acme")
}

/// A GCRA limit of one an hour, and its plan for `scope`.
fn hourly_for(scope: &str) -> Plan {
    let limit = Arc::new(Limit::Gcra(Gcra::new(per(1, 3_600_000), 1).unwrap()));
    Plan::single(Key::new(LimitId(1), scope), limit)
}

/// Regression (review of issue 17, finding 2): an entry lived as long as
/// its key's `reset_after` (an hour here), so a Redis that lost the key
/// (`FLUSHALL`, a failover that lost writes, eviction) went on being
/// over-rejected by every server for that long. An entry now lives at
/// most `rejection_cache_max_age`: within it the cache still rejects
/// (the strict side, documented), and at its end Redis's own answer is
/// given.
#[tokio::test]
async fn after_redis_loses_a_rejected_key_its_answer_is_given_within_the_entry_cap() {
    let server = RedisServer::start();
    let s = store_of(&server, None, false, 1024, |o| {
        o.rejection_cache_max_age = Duration::from_secs(1);
    })
    .await;
    let plan = hourly();
    let ms = |n| T0.saturating_add(Nanos::from_millis(n));
    let ask = |at| {
        let (s, plan) = (s.clone(), plan.clone());
        async move {
            s.decide(&plan, at, Hits::exactly(1), Mode::Try)
                .await
                .unwrap()
        }
    };
    assert!(ask(ms(0)).await.allowed);
    assert!(!ask(ms(0)).await.allowed);
    assert!(!ask(ms(1)).await.allowed);
    assert_eq!(s.cache_stats().hits, 1);
    server.client().text(&["FLUSHALL"]);
    // Within the cap: the entry still answers (Redis is not asked).
    assert!(!ask(ms(999)).await.allowed);
    assert_eq!(s.cache_stats().hits, 2);
    // At the cap: Redis answers, and it lost the key.
    let d = ask(ms(1000)).await;
    assert!(d.allowed, "{d:?}");
    assert_eq!(s.cache_stats().hits, 2);
}

/// When the store finds that Redis lost its data (its heartbeat is gone
/// from the live set), it drops every entry of the over-limit cache at
/// once: the keys Redis rejected are Redis's to answer again, long before
/// their entries would have lapsed (an hour here).
#[tokio::test]
async fn a_store_that_finds_redis_lost_its_data_forgets_its_rejections() {
    let server = RedisServer::start();
    let s = store_of(&server, None, false, 1024, |o| {
        o.heartbeat_ttl = Duration::from_millis(300);
    })
    .await;
    let beating = tokio::spawn({
        let s = s.clone();
        async move { s.heartbeat().await }
    });
    let plan = hourly();
    let ask = |s: RedisStore, plan: Plan| async move {
        s.decide(&plan, T0, Hits::exactly(1), Mode::Try)
            .await
            .unwrap()
    };
    assert!(ask(s.clone(), plan.clone()).await.allowed);
    assert!(!ask(s.clone(), plan.clone()).await.allowed);
    assert_eq!(s.cache_stats().entries, 1);
    server.client().text(&["FLUSHALL"]);
    // Polled with a bound far above the heartbeat's period (a bound on a
    // hung test): at the same instant, only a cleared cache lets Redis's
    // answer through.
    common::eventually(Duration::from_secs(20), || {
        let (s, plan) = (s.clone(), plan.clone());
        async move { ask(s, plan).await.allowed }
    })
    .await;
    assert_eq!(s.cache_stats().entries, 0);
    beating.abort();
}

/// Regression (review of issue 17, finding 5): with Redis's clock, an
/// entry's times were counted from when its decision was asked, before it
/// waited in the store's queue behind a call in flight, so the cache's
/// answers read short by that wait (and the entry lapsed that much
/// early). They are counted from when the call was sent now. Here the
/// rejection waits two seconds in the queue behind a call Redis holds
/// (stopped, and the call seen to reach it before the rejection is
/// asked): the cache's next answer must show about Redis's own
/// `retry_after`, not two seconds less (the margin, one second, is for a
/// busy machine).
#[tokio::test]
async fn with_redis_clock_an_entry_counts_from_the_call_not_from_the_queue() {
    let server = RedisServer::start();
    // One connection, so that the rejection queues behind the call ahead.
    let s = store_of(&server, None, true, 1024, |o| o.connect.connections = 1).await;
    let plan = hourly();
    let ask = |s: &RedisStore, plan: &Plan| {
        let (s, plan) = (s.clone(), plan.clone());
        async move {
            s.decide(&plan, Nanos::ZERO, Hits::exactly(1), Mode::Try)
                .await
                .unwrap()
        }
    };
    assert!(ask(&s, &plan).await.allowed);
    server.pause();
    let unread = server.unread_bytes();
    let ahead = tokio::spawn(ask(&s, &hourly_for("other")));
    // The call ahead has reached Redis: the rejection, asked now, waits in
    // the queue behind it (alone, it is not sent beside a call in flight).
    server.await_unread_beyond(unread).await;
    let rejected = tokio::spawn(ask(&s, &plan));
    // The wait: Redis holds the call ahead for two seconds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.resume();
    let rejected = rejected.await.unwrap();
    assert!(ahead.await.unwrap().allowed);
    assert!(!rejected.allowed);
    let cached = ask(&s, &plan).await;
    assert_eq!(s.cache_stats().hits, 1);
    let redis = rejected.decisions[0].retry_after.unwrap();
    let here = cached.decisions[0].retry_after.unwrap();
    assert!(here <= redis, "{here:?} > {redis:?}");
    assert!(
        redis.saturating_sub(here) < Nanos::from_secs(1),
        "the cache's retry_after {here:?} is short of Redis's {redis:?} by the queue's wait"
    );
}

/// Issue 18 item 3: a refund gives hits back, the one request that moves a
/// key toward admission. The server that refunds learns the new state from
/// Redis's answer at once, so its next check is granted (not answered by
/// the cached rejection); a report only takes more, so the cache's
/// rejections stay exact, and the debt it leaves is cached as Redis says.
#[tokio::test]
async fn a_refund_updates_the_refunding_servers_cached_rejection() {
    let server = RedisServer::start();
    let s = store_with(&server, None, false, 64).await;
    let t = Nanos::from_secs(1_800_000_000);
    let one = Hits::exactly(1);
    // Burst 1, one an hour: the check takes it, the next is rejected and
    // cached.
    assert!(
        s.decide(&hourly(), t, one, Mode::Try)
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !s.decide(&hourly(), t, one, Mode::Try)
            .await
            .unwrap()
            .allowed
    );
    let calls = server.evalsha_calls();
    assert!(
        !s.decide(&hourly(), t, one, Mode::Try)
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(server.evalsha_calls(), calls, "answered by the cache");
    // A report of 1 more: owed, never refused; still rejected after.
    let d = s.decide(&hourly(), t, one, Mode::Report).await.unwrap();
    assert_eq!((d.allowed, d.granted), (true, 1));
    assert!(
        !s.decide(&hourly(), t, one, Mode::Try)
            .await
            .unwrap()
            .allowed
    );
    // Both back: the next check is Redis's, and granted.
    let d = s
        .decide(&hourly(), t, Hits::exactly(2), Mode::Refund)
        .await
        .unwrap();
    assert_eq!(d.granted, 2);
    assert!(
        s.decide(&hourly(), t, one, Mode::Try)
            .await
            .unwrap()
            .allowed
    );
}
