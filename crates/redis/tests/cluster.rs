//! The Redis store on a real Redis Cluster of three masters started by the
//! test: plans of many namespaces spread over the masters, each plan's
//! keys in one slot, deciding exactly what the memory store decides (reports
//! and refunds included); and
//! the copy log, whose pools live in other slots than the coordination
//! keys, releasing a dead server's holds in every pool and seizing
//! transfers by id alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{gcra, holds, reserve_as, store, unique_prefix, T0};
use tollgate_core::copies::CopyLimits;
use tollgate_core::{Align, FixedWindow, Hits, Limit, Mode, Nanos};
use tollgate_redis::testing::RedisCluster;
use tollgate_redis::{RedisOptions, RedisStore, ScriptClock};
use tollgate_store::{Held, Key, LimitId, MemoryStore, OpId, Plan, PoolKey, Store};

/// The hash tag of a key (`...{tag}...`), which decides its slot.
fn tag(key: &str) -> &str {
    let open = key.find('{').expect("a hash tag");
    let close = key[open..].find('}').expect("a closed hash tag") + open;
    &key[open + 1..close]
}

#[tokio::test]
async fn plans_of_many_namespaces_spread_over_the_masters_and_decide_like_memory() {
    let cluster = RedisCluster::start();
    let prefix = unique_prefix();
    let mut o = RedisOptions::new(cluster.url());
    o.prefix = prefix.clone();
    o.clock = ScriptClock::Caller;
    o.connect.response_timeout = Duration::from_secs(5);
    let redis = RedisStore::connect(o).await.unwrap();
    assert!(redis.is_cluster());
    let memory = MemoryStore::new();

    let window = Arc::new(Limit::FixedWindow(
        FixedWindow::new(5, Nanos::SECOND, Align::FirstHit).unwrap(),
    ));
    let rate = Arc::new(gcra(3, Nanos::SECOND, 4));
    // 24 namespaces (affinities), each with a plan of two limits for two
    // domains: a window per domain and a rate shared by the namespace.
    let affinities: Vec<u64> = (0..24u64)
        .map(|a| a.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let mut now = T0;
    for step in 0..8u64 {
        now = now.saturating_add(Nanos::from_millis(150));
        for (i, &affinity) in affinities.iter().enumerate() {
            let id = |n: u64| LimitId(i as u64 * 2 + n);
            let domain = if step % 3 == 0 { "globex" } else { "acme" };
            let mut plan = Plan::default().with_affinity(affinity);
            plan.push(Key::new(id(0), domain), Arc::clone(&window), false)
                .unwrap();
            plan.push(Key::new(id(1), "*"), Arc::clone(&rate), false)
                .unwrap();
            // Usage after the fact too (issue 18): a report past both
            // limits, later a refund.
            let (request, mode) = match step {
                2 => (Hits::exactly(9), Mode::Report),
                5 => (Hits::exactly(4), Mode::Refund),
                _ => (Hits::between(1, 1 + step % 2), Mode::Try),
            };
            let want = memory.decide_now(&plan, now, request, mode);
            let got = redis.decide(&plan, now, request, mode).await;
            assert_eq!(got, want, "affinity {affinity:x}, step {step}");
        }
    }

    // Every master holds some plans, and each plan's keys are on one.
    let by_node = cluster.keys_by_node(&prefix);
    let mut seen = BTreeSet::new();
    for (n, keys) in by_node.iter().enumerate() {
        let tags: BTreeSet<&str> = keys
            .iter()
            .filter(|k| k.contains(":l:"))
            .map(|k| tag(k))
            .collect();
        assert!(!tags.is_empty(), "master {n} holds no plan: {by_node:?}");
        for t in tags {
            assert!(seen.insert(t.to_owned()), "plan {t} split over masters");
        }
    }
    assert_eq!(seen.len(), affinities.len(), "{by_node:?}");
}

#[tokio::test]
async fn the_copy_log_spans_slots_cleans_up_after_a_dead_server_and_seizes_by_id() {
    let cluster = RedisCluster::start();
    let prefix = unique_prefix();
    let url = cluster.url();
    let dead = store(&url, &prefix, 600).await;
    let alive = store(&url, &prefix, 600).await;
    let l = CopyLimits::new(10, Some(10));
    let pools: Vec<PoolKey> = (0..6)
        .map(|i| PoolKey::new("ns", &format!("db{i}")))
        .collect();
    for pool in &pools {
        reserve_as(&dead, pool, &l, "acme", Hits::exactly(4))
            .await
            .unwrap();
        reserve_as(&alive, pool, &l, "acme", Hits::exactly(3))
            .await
            .unwrap();
    }
    // The pools landed on more than one master.
    let pool_nodes = cluster
        .keys_by_node(&prefix)
        .iter()
        .filter(|keys| keys.iter().any(|k| k.ends_with(":pool")))
        .count();
    assert!(pool_nodes >= 2, "{:?}", cluster.keys_by_node(&prefix));

    // A transfer id alone leads the seizer to the pool's slot.
    let id = dead
        .transfer(
            Held {
                pool: &pools[0],
                domain: "acme",
                groups: &Vec::new(),
                copies: 1,
            },
            Nanos::from_secs(60),
            Nanos::ZERO,
            OpId::random(),
        )
        .await
        .unwrap();
    alive.seize(id, Nanos::ZERO, OpId::random()).await.unwrap();

    // Only the survivor beats: it releases the dead server's holds in
    // every pool (found through the dead server's registry, in another
    // slot than the pools), and nothing of its own.
    let beating = tokio::spawn({
        let alive = alive.clone();
        async move { alive.heartbeat().await }
    });
    for (i, pool) in pools.iter().enumerate() {
        let mine = if i == 0 { 4 } else { 3 };
        common::eventually(Duration::from_secs(20), || async {
            holds(&alive, pool, "acme").await == (mine, mine)
        })
        .await;
    }
    for (i, pool) in pools.iter().enumerate() {
        let mine = if i == 0 { 4 } else { 3 };
        alive
            .release(
                Held {
                    pool,
                    domain: "acme",
                    groups: &Vec::new(),
                    copies: mine,
                },
                OpId::random(),
            )
            .await
            .unwrap();
        assert_eq!(holds(&alive, pool, "acme").await, (0, 0));
    }
    beating.abort();
}
