//! Live counters (issue 18, item 5) on the Redis store: `inspect` answers
//! what the memory store answers and writes nothing (no key created, none
//! changed or re-expired, the over-limit cache neither read nor taught),
//! `reset` deletes a plan's keys and the cache's entries for them, and
//! `holds` reads a copy pool's counts, on one Redis and on a Redis Cluster.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{unique_prefix, RedisServer, T0};
use tollgate_core::copies::CopyLimits;
use tollgate_core::{
    Align, BurstTiers, Calendar, CalendarUnit, FixedWindow, Gcra, Hits, LeakyBucket, Limit, Mode,
    Nanos, Rate, SlidingLog, SlidingWindow, Smooth, Tier, TokenBucket,
};
use tollgate_redis::testing::RedisCluster;
use tollgate_redis::{RedisOptions, RedisStore, ScriptClock};
use tollgate_store::{Key, LimitId, MemoryStore, OpId, Plan, PoolKey, Store};

/// A store on `url` with the caller's clock, its own prefix, and an
/// over-limit cache whose entries live an hour (no answer depends on the
/// test's speed).
async fn store(url: String) -> (RedisStore, String) {
    let prefix = unique_prefix();
    let mut o = RedisOptions::new(url);
    o.prefix = prefix.clone();
    o.clock = ScriptClock::Caller;
    o.connect.response_timeout = Duration::from_secs(5);
    o.rejection_cache = 1024;
    o.rejection_cache_max_age = Duration::from_secs(3600);
    (RedisStore::connect(o).await.unwrap(), prefix)
}

/// Every algorithm, with spans short enough that a test moves through
/// their windows and refills.
fn all_limits() -> Vec<Arc<Limit>> {
    let ms = Nanos::from_millis;
    let paris = |unit| Calendar::new(unit, "Europe/Paris").unwrap();
    let rate = |n, p| Rate::new(n, p).unwrap();
    let tier = |limit, window, active, cooldown| Tier {
        limit,
        window,
        active,
        cooldown,
        skippable: false,
    };
    vec![
        Limit::TokenBucket(TokenBucket::new(5, rate(5, Nanos::SECOND)).unwrap()),
        Limit::Gcra(Gcra::new(rate(4, Nanos::SECOND), 3).unwrap()),
        Limit::LeakyBucket(LeakyBucket::new(rate(4, Nanos::SECOND), 2).unwrap()),
        Limit::FixedWindow(FixedWindow::new(4, ms(700), Align::Epoch).unwrap()),
        Limit::FixedWindow(FixedWindow::new(4, ms(700), Align::FirstHit).unwrap()),
        // Calendar windows: the script keeps a year's times as seconds
        // and nanoseconds, and inspects them as it decides them.
        Limit::FixedWindow(FixedWindow::calendar(4, paris(CalendarUnit::Month)).unwrap()),
        Limit::FixedWindow(FixedWindow::calendar(4, paris(CalendarUnit::Year)).unwrap()),
        Limit::SlidingWindow(SlidingWindow::new(6, Nanos::SECOND, 4).unwrap()),
        Limit::SlidingLog(SlidingLog::new(5, Nanos::SECOND).unwrap()),
        Limit::Smooth(Smooth::bursty(rate(5, Nanos::SECOND), 1.0).unwrap()),
        Limit::BurstTiers(
            BurstTiers::new(vec![
                tier(3, Nanos::SECOND, ms(500), ms(500)),
                tier(6, Nanos::SECOND, ms(300), ms(900)),
            ])
            .unwrap(),
        ),
    ]
    .into_iter()
    .map(Arc::new)
    .collect()
}

/// Writes Redis has applied since it started (`INFO persistence`): any
/// `SET`, `DEL` or `PEXPIRE` that changed something counts.
fn writes(server: &RedisServer) -> u64 {
    let info = server.client().text(&["INFO", "persistence"]);
    info.lines()
        .find_map(|l| l.strip_prefix("rdb_changes_since_last_save:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO persistence names rdb_changes_since_last_save")
}

/// Inspecting answers what the memory store's inspection answers (a
/// request of zero hits) for every algorithm, after any history, and
/// makes Redis write nothing: a domain never decided gets no key, a
/// stored key is not rewritten or given a new expiry. Every inspection
/// asks Redis (a rejection the cache holds is not answered from it), and
/// teaches the cache nothing.
#[tokio::test]
async fn inspect_answers_like_memory_and_writes_nothing() {
    let server = RedisServer::start();
    let (redis, prefix) = store(server.url()).await;
    let memory = MemoryStore::new();
    let limits = all_limits();
    let plans: Vec<Plan> = limits
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut plan = Plan::default().with_affinity(3);
            plan.push(Key::new(LimitId(i as u64), "acme"), Arc::clone(l), false)
                .unwrap();
            plan.push(
                Key::new(LimitId(1000), ""),
                Arc::new(Limit::Gcra(
                    Gcra::new(Rate::new(50, Nanos::SECOND).unwrap(), 40).unwrap(),
                )),
                false,
            )
            .unwrap();
            plan
        })
        .collect();
    let mut now = T0;
    for step in 0..24u64 {
        for (p, plan) in plans.iter().enumerate() {
            let (before, calls) = (writes(&server), server.evalsha_calls());
            let entries = redis.cache_stats().entries;
            let got = redis.inspect(plan, now).await.unwrap();
            assert_eq!(
                writes(&server),
                before,
                "plan {p}, step {step}: inspect wrote"
            );
            // More than one the first time: Redis loads the script.
            assert!(
                server.evalsha_calls() > calls,
                "plan {p}, step {step}: inspect did not ask Redis"
            );
            assert_eq!(redis.cache_stats().entries, entries, "the cache learnt");
            let want = memory.inspect(plan, now).await.unwrap();
            assert_eq!(got, want, "plan {p}, step {step}: Redis (left) vs memory");
            if step % 3 != 2 {
                let hits = Hits::between(1, 2);
                let got = redis.decide(plan, now, hits, Mode::Try).await;
                let want = memory.decide_now(plan, now, hits, Mode::Try);
                assert_eq!(got, want, "plan {p}, step {step}");
            }
        }
        now = now.saturating_add(Nanos::from_millis(90 + step * 7));
    }

    // Regression (review of per-item hits): an item asked hits of its own
    // is inspected as it stands, as the memory store inspects it; Redis
    // decided it for those hits (without writing them).
    for (p, plan) in plans.iter().enumerate() {
        let mut own = plan.clone();
        for i in 0..own.len() {
            own.ask(i, 2);
        }
        let got = redis.inspect(&own, now).await.unwrap();
        let want = memory.inspect(&own, now).await.unwrap();
        assert_eq!(
            got, want,
            "plan {p} asked its own hits: Redis (left) vs memory"
        );
    }

    // A domain never decided: answered fresh, no key made.
    let before = writes(&server);
    for (i, l) in limits.iter().enumerate() {
        let plan =
            Plan::single(Key::new(LimitId(i as u64), "never-seen"), Arc::clone(l)).with_affinity(3);
        let got = redis.inspect(&plan, now).await.unwrap();
        assert_eq!(got, memory.inspect(&plan, now).await.unwrap(), "{l:?}");
    }
    assert_eq!(writes(&server), before);
    assert!(
        server
            .keys(&prefix)
            .iter()
            .all(|k| !k.ends_with(":never-seen")),
        "{:?}",
        server.keys(&prefix)
    );
}

/// A reset deletes the plan's keys in Redis (and only those) and drops
/// their over-limit cache entries: the next decision sees a fresh state,
/// though the cache had learnt the domain's rejection.
#[tokio::test]
async fn reset_deletes_the_keys_and_the_cache_entries() {
    let server = RedisServer::start();
    let (redis, prefix) = store(server.url()).await;
    let window = Arc::new(Limit::FixedWindow(
        FixedWindow::new(3, Nanos::from_secs(3600), Align::Epoch).unwrap(),
    ));
    let mut plan = Plan::default().with_affinity(9);
    plan.push(Key::new(LimitId(1), "alice"), Arc::clone(&window), false)
        .unwrap();
    plan.push(Key::new(LimitId(2), "alice"), Arc::clone(&window), false)
        .unwrap();
    let bob = Plan::single(Key::new(LimitId(1), "bob"), Arc::clone(&window)).with_affinity(9);
    for _ in 0..3 {
        assert!(
            redis
                .decide(&plan, T0, Hits::exactly(1), Mode::Try)
                .await
                .unwrap()
                .allowed
        );
    }
    redis
        .decide(&bob, T0, Hits::exactly(1), Mode::Try)
        .await
        .unwrap();
    // Rejected, and learnt: the next rejection is the cache's.
    assert!(
        !redis
            .decide(&plan, T0, Hits::exactly(1), Mode::Try)
            .await
            .unwrap()
            .allowed
    );
    let calls = server.evalsha_calls();
    assert!(
        !redis
            .decide(&plan, T0, Hits::exactly(1), Mode::Try)
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(
        server.evalsha_calls(),
        calls,
        "the cache answers the rejection"
    );
    assert_eq!(
        server
            .keys(&prefix)
            .iter()
            .filter(|k| k.contains(":l:"))
            .count(),
        3
    );

    redis.reset(&plan, T0).await.unwrap();
    let left: Vec<String> = server
        .keys(&prefix)
        .into_iter()
        .filter(|k| k.contains(":l:"))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].ends_with(":bob"), "{left:?}");
    let fresh = MemoryStore::new();
    assert_eq!(
        redis.decide(&plan, T0, Hits::exactly(1), Mode::Try).await,
        fresh.decide_now(&plan, T0, Hits::exactly(1), Mode::Try),
        "the first decision after the reset"
    );
    // Bob's counter was not touched.
    let inspected = redis.inspect(&bob, T0).await.unwrap();
    assert_eq!(inspected.decisions[0].remaining, 2);
    // A reset of keys that are not there is no error.
    let nobody = Plan::single(Key::new(LimitId(1), "nobody"), window).with_affinity(9);
    redis.reset(&nobody, T0).await.unwrap();
}

/// `holds` reads a pool's counts as a reserve's context gives them, and
/// reserves nothing; an absent pool holds nothing and gets no key.
#[tokio::test]
async fn holds_read_the_pool_counts_without_reserving() {
    let server = RedisServer::start();
    let (redis, prefix) = store(server.url()).await;
    let pool = PoolKey::new("ns", "seats");
    let limits = CopyLimits::new(5, Some(8))
        .with_group("team", 6, ["a", "b"])
        .unwrap();
    for (domain, copies) in [("a", 3), ("b", 2)] {
        let r = redis
            .reserve(
                &pool,
                &limits,
                domain,
                Hits::exactly(copies),
                T0,
                OpId::random(),
            )
            .await
            .unwrap();
        assert_eq!(r.granted, copies);
    }
    let before = writes(&server);
    let h = redis.holds(&pool, &limits, "a", T0).await.unwrap();
    assert_eq!(writes(&server), before, "holds wrote");
    assert_eq!((h.domain_holds, h.global_holds), (3, 5));
    assert_eq!((h.domain_limit, h.global_limit), (5, Some(8)));
    assert_eq!(
        (
            h.groups[0].name.as_str(),
            h.groups[0].holds,
            h.groups[0].limit
        ),
        ("team", 5, 6)
    );
    let r = redis
        .reserve(&pool, &limits, "a", Hits::between(0, 0), T0, OpId::random())
        .await
        .unwrap();
    assert_eq!(r.context, h, "a reserve of nothing sees the same");
    let keys = server.keys(&prefix).len();
    let none = redis
        .holds(&PoolKey::new("ns", "empty"), &limits, "z", T0)
        .await
        .unwrap();
    assert_eq!((none.domain_holds, none.global_holds), (0, 0));
    assert_eq!(server.keys(&prefix).len(), keys);
}

/// On a Redis Cluster a plan's keys share a slot (its affinity), so one
/// `DEL` resets them, and an inspection reads them where they live.
#[tokio::test]
async fn inspect_and_reset_on_a_cluster() {
    let cluster = RedisCluster::start();
    let (redis, prefix) = store(cluster.url()).await;
    assert!(redis.is_cluster());
    let memory = MemoryStore::new();
    let window = Arc::new(Limit::FixedWindow(
        FixedWindow::new(4, Nanos::from_secs(3600), Align::Epoch).unwrap(),
    ));
    // Plans of several namespaces, spread over the masters.
    for a in 0..6u64 {
        let affinity = a.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut plan = Plan::default().with_affinity(affinity);
        plan.push(Key::new(LimitId(a * 2), "acme"), Arc::clone(&window), false)
            .unwrap();
        plan.push(Key::new(LimitId(a * 2 + 1), ""), Arc::clone(&window), false)
            .unwrap();
        for _ in 0..3 {
            let got = redis.decide(&plan, T0, Hits::exactly(1), Mode::Try).await;
            assert_eq!(
                got,
                memory.decide_now(&plan, T0, Hits::exactly(1), Mode::Try)
            );
        }
        let got = redis.inspect(&plan, T0).await.unwrap();
        assert_eq!(got, memory.inspect(&plan, T0).await.unwrap());
        assert_eq!(got.decisions[0].remaining, 1);
        redis.reset(&plan, T0).await.unwrap();
        memory.reset(&plan, T0).await.unwrap();
        let got = redis.inspect(&plan, T0).await.unwrap();
        assert_eq!(got.decisions[0].remaining, 4, "after the reset");
        assert_eq!(got, memory.inspect(&plan, T0).await.unwrap());
    }
    let left: usize = cluster
        .keys_by_node(&prefix)
        .iter()
        .map(|keys| keys.iter().filter(|k| k.contains(":l:")).count())
        .sum();
    assert_eq!(left, 0, "every plan was reset");
}
