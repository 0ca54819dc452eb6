//! Copy-limited resources in Redis: the same answers as the memory store,
//! and no hold leaked when a server dies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{caller_clock_store, holds, store, unique_prefix, RedisServer, T0};
use tollgate_core::copies::{CopyError, CopyLimits};
use tollgate_core::{Nanos, Request};
use tollgate_redis::{RedisOptions, RedisStore};
use tollgate_store::{MemoryStore, PoolKey, Store, StoreError};

fn limits() -> CopyLimits {
    CopyLimits::new(5, Some(8))
        .with_group("big", 6, ["acme", "globex"])
        .unwrap()
        .with_override("initech", 2)
}

#[tokio::test]
async fn reserve_release_transfer_and_seize_answer_what_the_memory_store_answers() {
    let server = RedisServer::start();
    let redis = caller_clock_store(&server).await;
    let memory = MemoryStore::new();
    let pool = PoolKey::new("ns", "sandbox");
    let l = limits();
    let s = Nanos::SECOND;

    // Reservations against domain, group, global and override limits.
    for (domain, req) in [
        ("acme", Request::exactly(4)),
        ("globex", Request::between(1, 4)),
        ("acme", Request::exactly(2)),
        ("initech", Request::exactly(3)),
        ("initech", Request::between(0, 3)),
        ("hooli", Request::between(1, 5)),
        ("hooli", Request::exactly(1)),
    ] {
        let want = memory.reserve_now(&pool, &l, domain, req, T0).unwrap();
        let got = redis.reserve(&pool, &l, domain, req, T0).await.unwrap();
        assert_eq!(got, want, "reserve {domain} {req:?}");
    }
    let big = vec!["big".to_owned()];
    // Releasing more than held names what is held, in both stores.
    let want = memory.release_now(&pool, "acme", &big, 9).unwrap_err();
    let got = redis.release(&pool, "acme", &big, 9).await.unwrap_err();
    assert_eq!(got, want);
    assert!(matches!(
        got,
        StoreError::Copy(CopyError::NotHeld { held: 4, .. })
    ));
    assert_eq!(
        redis.release(&pool, "acme", &big, 0).await.unwrap_err(),
        memory.release_now(&pool, "acme", &big, 0).unwrap_err()
    );
    memory.release_now(&pool, "acme", &big, 1).unwrap();
    redis.release(&pool, "acme", &big, 1).await.unwrap();

    // A transfer keeps the copies counted until seized, then the seizer
    // holds them; an expired one is released and cannot be seized.
    let id_m = memory.transfer_now(&pool, "acme", &big, 2, s, T0).unwrap();
    let id_r = redis.transfer(&pool, "acme", &big, 2, s, T0).await.unwrap();
    let after = |store_m: &MemoryStore| {
        store_m.reserve_now(&pool, &l, "globex", Request::between(0, 9), T0)
    };
    let want = after(&memory).unwrap();
    let got = redis
        .reserve(&pool, &l, "globex", Request::between(0, 9), T0)
        .await
        .unwrap();
    assert_eq!(got, want, "staged copies still count");
    let t1 = T0.saturating_add(Nanos::from_millis(500));
    let want = memory.seize_now(id_m, t1).unwrap();
    let got = redis.seize(id_r, t1).await.unwrap();
    assert_eq!(got, want);
    assert_eq!(
        redis.seize(id_r, t1).await.unwrap_err(),
        StoreError::Copy(CopyError::UnknownTransfer)
    );
    redis.release(&pool, "acme", &big, 2).await.unwrap();
    memory.release_now(&pool, "acme", &big, 2).unwrap();

    let id_m = memory.transfer_now(&pool, "acme", &big, 1, s, t1).unwrap();
    let id_r = redis.transfer(&pool, "acme", &big, 1, s, t1).await.unwrap();
    let late = t1.saturating_add(s);
    assert_eq!(
        redis.seize(id_r, late).await.unwrap_err(),
        memory.seize_now(id_m, late).unwrap_err()
    );
    let want = memory
        .reserve_now(&pool, &l, "acme", Request::between(0, 9), late)
        .unwrap();
    let got = redis
        .reserve(&pool, &l, "acme", Request::between(0, 9), late)
        .await
        .unwrap();
    assert_eq!(got, want, "the expired transfer's copy is free again");
}

#[tokio::test]
async fn a_survivor_releases_the_holds_of_a_server_whose_heartbeat_lapsed() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(10, Some(10));
    let dead = store(&server.url(), &prefix, 600).await;
    let alive = store(&server.url(), &prefix, 600).await;
    assert_ne!(dead.server_id(), alive.server_id());
    dead.reserve(&pool, &l, "acme", Request::exactly(4), Nanos::ZERO)
        .await
        .unwrap();
    alive
        .reserve(&pool, &l, "acme", Request::exactly(3), Nanos::ZERO)
        .await
        .unwrap();
    alive
        .reserve(&pool, &l, "globex", Request::exactly(2), Nanos::ZERO)
        .await
        .unwrap();
    assert_eq!(holds(&alive, &pool, "acme").await, (7, 9));

    // Only the survivor sends heartbeats; the other is as good as dead.
    let beating = tokio::spawn({
        let alive = alive.clone();
        async move { alive.heartbeat().await }
    });
    common::eventually(Duration::from_secs(20), || async {
        holds(&alive, &pool, "acme").await == (3, 5)
    })
    .await;
    // The dead server cannot come back and hold copies again.
    let err = dead
        .reserve(&pool, &l, "acme", Request::exactly(1), Nanos::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    // Its survivor's own holds are untouched and release normally.
    alive.release(&pool, "acme", &Vec::new(), 3).await.unwrap();
    alive
        .release(&pool, "globex", &Vec::new(), 2)
        .await
        .unwrap();
    assert_eq!(holds(&alive, &pool, "acme").await, (0, 0));
    // What is left of the pool is its name and the dead server's
    // tombstone, in a key that expires when the tombstone would be
    // dropped, a day on.
    let keys = server.keys(&prefix);
    let pool_keys: Vec<&String> = keys.iter().filter(|k| k.ends_with(":pool")).collect();
    assert_eq!(pool_keys.len(), 1, "{keys:?}");
    let pttl: i64 = server
        .command(&format!("PTTL {}", pool_keys[0]))
        .trim_start_matches(':')
        .parse()
        .unwrap();
    assert!(pttl > 86_000_000 && pttl <= 86_400_000, "PTTL {pttl}");
    // A new hold makes the pool persistent again.
    alive
        .reserve(&pool, &l, "acme", Request::exactly(1), Nanos::ZERO)
        .await
        .unwrap();
    assert_eq!(server.command(&format!("PTTL {}", pool_keys[0])), ":-1");
    beating.abort();
}

#[tokio::test]
async fn a_server_that_was_declared_dead_resigns() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let zombie = store(&server.url(), &prefix, 400).await;
    let other = store(&server.url(), &prefix, 400).await;
    let pool = PoolKey::new("ns", "db");
    zombie
        .reserve(
            &pool,
            &CopyLimits::new(5, None),
            "acme",
            Request::exactly(1),
            Nanos::ZERO,
        )
        .await
        .unwrap();
    let beating = tokio::spawn({
        let other = other.clone();
        async move { other.heartbeat().await }
    });
    common::eventually(Duration::from_secs(20), || async {
        holds(&other, &pool, "acme").await == (0, 0)
    })
    .await;
    // The zombie's own heartbeat now finds it gone and resigns at once.
    let resigned = tokio::time::timeout(Duration::from_secs(20), zombie.heartbeat())
        .await
        .expect("resigns");
    assert!(resigned.0.contains("declared dead"), "{resigned:?}");
    beating.abort();
}

#[tokio::test]
async fn a_server_starting_alone_clears_holds_left_by_a_previous_generation() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(10, None);
    let old = store(&server.url(), &prefix, 300).await;
    old.reserve(&pool, &l, "acme", Request::exactly(6), Nanos::ZERO)
        .await
        .unwrap();
    // The old generation's live-set entry vanishes (as if Redis had lost
    // it) while its holds stay: only the orphan sweep can find them.
    assert_eq!(server.command(&format!("DEL {prefix}{{srv}}:alive")), ":1");
    drop(old);
    let fresh = store(&server.url(), &prefix, 300).await;
    assert_eq!(holds(&fresh, &pool, "acme").await, (0, 0));
}

#[tokio::test]
async fn a_server_keeps_its_holds_while_redis_is_only_slow() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let mut o = RedisOptions::new(server.url());
    o.prefix = unique_prefix();
    o.heartbeat_ttl = Duration::from_millis(900);
    // The default decision timeout, 50 ms: shorter than Redis's stalls.
    assert_eq!(o.connect.response_timeout, Duration::from_millis(50));
    let s = RedisStore::connect(o).await.unwrap();
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(10, None);
    s.reserve(&pool, &l, "acme", Request::exactly(2), Nanos::ZERO)
        .await
        .unwrap();
    let beating = tokio::spawn({
        let s = s.clone();
        async move { s.heartbeat().await }
    });
    // Redis stalls for 300 ms at a time, ten times in a row: every
    // heartbeat waits behind a stall, longer than a decision may wait but
    // well within the heartbeat TTL.
    let stalls = std::thread::spawn({
        let mut con = server.connection();
        move || {
            for _ in 0..10 {
                let _: () = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg("0.3")
                    .query(&mut con)
                    .unwrap();
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Copy operations during a stall fail fast instead of waiting; Redis
    // applies each after the stall all the same, and the store takes it
    // back, so that "failed" means nothing changed.
    let none = Vec::new();
    let failed = [
        s.reserve(&pool, &l, "acme", Request::exactly(1), Nanos::ZERO)
            .await
            .map(|_| ()),
        s.release(&pool, "acme", &none, 1).await,
        s.transfer(&pool, "acme", &none, 1, Nanos::from_secs(600), Nanos::ZERO)
            .await
            .map(|_| ()),
    ];
    for r in failed {
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    }
    tokio::task::spawn_blocking(move || stalls.join().unwrap())
        .await
        .unwrap();
    common::eventually(Duration::from_secs(10), || async {
        holds(&s, &pool, "acme").await == (2, 2)
    })
    .await;
    // The server never resigned: its heartbeats got through, and its holds
    // are exactly its own two.
    assert!(!beating.is_finished(), "resigned: {:?}", beating.await);
    assert!(matches!(
        s.release(&pool, "acme", &none, 3).await,
        Err(StoreError::Copy(CopyError::NotHeld { held: 2, .. }))
    ));
    s.release(&pool, "acme", &none, 2).await.unwrap();
    assert_eq!(holds(&s, &pool, "acme").await, (0, 0));
    beating.abort();
}
