//! Copy-limited resources in Redis: the same answers as the memory store,
//! and no hold leaked when a server dies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{caller_clock_server, holds, reserve_as, store, unique_prefix, RedisServer, T0};
use tollgate_core::copies::{CopyError, CopyLimits, Reservation, TransferId};
use tollgate_core::{Hits, Nanos};
use tollgate_redis::{RedisOptions, RedisStore};
use tollgate_store::{Held, MemoryStore, OpId, PoolKey, Store, StoreError};

fn limits() -> CopyLimits {
    CopyLimits::new(5, Some(8))
        .with_group("big", 6, ["acme", "globex"])
        .unwrap()
        .with_override("initech", 2)
}

/// Reserves copies of `pool` for `acme`, as one new operation.
async fn reserve(
    s: &RedisStore,
    pool: &PoolKey,
    l: &CopyLimits,
    request: Hits,
) -> Result<Reservation, StoreError> {
    reserve_as(s, pool, l, "acme", request).await
}

/// Releases `held`, as one new operation.
async fn release(s: &RedisStore, held: Held<'_>) -> Result<(), StoreError> {
    s.release(held, OpId::random()).await
}

/// Stages `held` for `ttl` from time zero, as one new operation.
async fn transfer(s: &RedisStore, held: Held<'_>, ttl: Nanos) -> Result<TransferId, StoreError> {
    s.transfer(held, ttl, Nanos::ZERO, OpId::random()).await
}

/// Releases acme's `copies` of `pool` in `groups`, after which nobody holds
/// any copy of it.
async fn releases_to_nothing(s: &RedisStore, pool: &PoolKey, groups: &Vec<String>, copies: u64) {
    release(s, held(pool, groups, copies)).await.unwrap();
    assert_eq!(holds(s, pool, "acme").await, (0, 0));
}

/// A redis-server of its own, a prefix no other store uses, and a store
/// there whose heartbeat TTL is `ttl_ms`.
async fn server_and_store(ttl_ms: u64) -> (RedisServer, String, RedisStore) {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let s = store(&server.url(), &prefix, ttl_ms).await;
    (server, prefix, s)
}

/// Runs `s`'s heartbeat until it resigns.
fn beat(s: &RedisStore) -> tokio::task::JoinHandle<tollgate_redis::Resignation> {
    let s = s.clone();
    tokio::spawn(async move { s.heartbeat().await })
}

#[tokio::test]
async fn reserve_release_transfer_and_seize_answer_what_the_memory_store_answers() {
    let (_server, redis) = caller_clock_server().await;
    let memory = MemoryStore::new();
    let pool = PoolKey::new("ns", "sandbox");
    let l = limits();
    let s = Nanos::SECOND;

    // Reservations against domain, group, global and override limits.
    for (domain, req) in [
        ("acme", Hits::exactly(4)),
        ("globex", Hits::between(1, 4)),
        ("acme", Hits::exactly(2)),
        ("initech", Hits::exactly(3)),
        ("initech", Hits::between(0, 3)),
        ("hooli", Hits::between(1, 5)),
        ("hooli", Hits::exactly(1)),
    ] {
        let want = memory.reserve_now(&pool, &l, domain, req, T0).unwrap();
        let got = redis
            .reserve(&pool, &l, domain, req, T0, OpId::random())
            .await
            .unwrap();
        assert_eq!(got, want, "reserve {domain} {req:?}");
    }
    let big = vec!["big".to_owned()];
    // Releasing more than held names what is held, in both stores.
    let want = memory.release_now(&pool, "acme", &big, 9).unwrap_err();
    let got = release(&redis, held(&pool, &big, 9)).await.unwrap_err();
    assert_eq!(got, want);
    assert!(matches!(
        got,
        StoreError::Copy(CopyError::NotHeld { held: 4, .. })
    ));
    // Issue 23: the groups read as the set the copies are counted in, not
    // as ``groups [big]`` (or ``groups []`` for none).
    assert_eq!(
        got.to_string(),
        "domain `acme` holds 4 copies in group `big`, cannot release 9"
    );
    assert_eq!(
        release(&redis, held(&pool, &big, 0)).await.unwrap_err(),
        memory.release_now(&pool, "acme", &big, 0).unwrap_err()
    );
    memory.release_now(&pool, "acme", &big, 1).unwrap();
    release(&redis, held(&pool, &big, 1)).await.unwrap();

    // A transfer keeps the copies counted until seized, then the seizer
    // holds them; an expired one is released and cannot be seized.
    let id_m = memory.transfer_now(&pool, "acme", &big, 2, s, T0).unwrap();
    let id_r = redis
        .transfer(held(&pool, &big, 2), s, T0, OpId::random())
        .await
        .unwrap();
    let after =
        |store_m: &MemoryStore| store_m.reserve_now(&pool, &l, "globex", Hits::between(0, 9), T0);
    let want = after(&memory).unwrap();
    let got = redis
        .reserve(&pool, &l, "globex", Hits::between(0, 9), T0, OpId::random())
        .await
        .unwrap();
    assert_eq!(got, want, "staged copies still count");
    let t1 = T0.saturating_add(Nanos::from_millis(500));
    let want = memory.seize_now(id_m, t1).unwrap();
    let got = redis.seize(id_r, t1, OpId::random()).await.unwrap();
    assert_eq!(got, want);
    assert_eq!(
        redis.seize(id_r, t1, OpId::random()).await.unwrap_err(),
        StoreError::Copy(CopyError::UnknownTransfer)
    );
    release(&redis, held(&pool, &big, 2)).await.unwrap();
    memory.release_now(&pool, "acme", &big, 2).unwrap();

    let id_m = memory.transfer_now(&pool, "acme", &big, 1, s, t1).unwrap();
    let id_r = redis
        .transfer(held(&pool, &big, 1), s, t1, OpId::random())
        .await
        .unwrap();
    let late = t1.saturating_add(s);
    assert_eq!(
        redis.seize(id_r, late, OpId::random()).await.unwrap_err(),
        memory.seize_now(id_m, late).unwrap_err()
    );
    let want = memory
        .reserve_now(&pool, &l, "acme", Hits::between(0, 9), late)
        .unwrap();
    let got = redis
        .reserve(&pool, &l, "acme", Hits::between(0, 9), late, OpId::random())
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
    reserve(&dead, &pool, &l, Hits::exactly(4)).await.unwrap();
    reserve(&alive, &pool, &l, Hits::exactly(3)).await.unwrap();
    reserve_as(&alive, &pool, &l, "globex", Hits::exactly(2))
        .await
        .unwrap();
    assert_eq!(holds(&alive, &pool, "acme").await, (7, 9));

    // Only the survivor sends heartbeats; the other is as good as dead.
    let beating = beat(&alive);
    common::eventually(Duration::from_secs(20), || async {
        holds(&alive, &pool, "acme").await == (3, 5)
    })
    .await;
    // The dead server cannot come back and hold copies again.
    let err = reserve(&dead, &pool, &l, Hits::exactly(1))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    // Its survivor's own holds are untouched and release normally.
    release(&alive, held_by(&pool, "acme", &Vec::new(), 3))
        .await
        .unwrap();
    release(&alive, held_by(&pool, "globex", &Vec::new(), 2))
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
    reserve(&alive, &pool, &l, Hits::exactly(1)).await.unwrap();
    assert_eq!(server.command(&format!("PTTL {}", pool_keys[0])), ":-1");
    beating.abort();
}

#[tokio::test]
async fn a_server_that_was_declared_dead_resigns() {
    let (server, prefix, zombie) = server_and_store(400).await;
    let other = store(&server.url(), &prefix, 400).await;
    let pool = PoolKey::new("ns", "db");
    reserve(&zombie, &pool, &CopyLimits::new(5, None), Hits::exactly(1))
        .await
        .unwrap();
    let beating = beat(&other);
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
    reserve(&old, &pool, &l, Hits::exactly(6)).await.unwrap();
    // The old generation's live-set entry vanishes (as if Redis had lost
    // it) while its holds stay: only the orphan sweep can find them.
    assert_eq!(server.command(&format!("DEL {prefix}{{srv}}:alive")), ":1");
    drop(old);
    let fresh = store(&server.url(), &prefix, 300).await;
    assert_eq!(holds(&fresh, &pool, "acme").await, (0, 0));
}

/// The Redis key of the one pool under `prefix` (its counts' hash).
fn pool_hash(server: &RedisServer, prefix: &str) -> String {
    server
        .keys(&format!("{prefix}{{c:"))
        .into_iter()
        .find(|k| k.ends_with(":pool"))
        .unwrap()
}

fn held_by<'a>(
    pool: &'a PoolKey,
    domain: &'a str,
    groups: &'a Vec<String>,
    copies: u64,
) -> Held<'a> {
    Held {
        pool,
        domain,
        groups,
        copies,
    }
}

fn held<'a>(pool: &'a PoolKey, groups: &'a Vec<String>, copies: u64) -> Held<'a> {
    held_by(pool, "acme", groups, copies)
}

/// Issue 16 item 1: copy operations sent while Redis stalls longer than a
/// decision may wait are not given up (their outcome would be unknown):
/// they wait for Redis and are applied exactly once, and the server, whose
/// heartbeats get through between stalls, keeps every hold.
#[tokio::test]
async fn copy_operations_during_stalls_are_applied_once_and_the_server_keeps_its_holds() {
    let server = RedisServer::start();
    let mut o = RedisOptions::new(server.url());
    o.prefix = unique_prefix();
    o.heartbeat_ttl = Duration::from_millis(900);
    // The default decision timeout, 50 ms: shorter than Redis's stalls.
    assert_eq!(o.connect.response_timeout, Duration::from_millis(50));
    let s = RedisStore::connect(o).await.unwrap();
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(10, None);
    let none = Vec::new();
    reserve(&s, &pool, &l, Hits::exactly(2)).await.unwrap();
    let beating = beat(&s);
    // Redis stalls for 300 ms at a time, ten times in a row: every
    // heartbeat and copy operation waits behind a stall, longer than a
    // decision may wait but within the heartbeat TTL. A stall is a `CLIENT
    // PAUSE`: unlike a `DEBUG SLEEP`, Redis answers it when the stall
    // begins, so the test knows (rather than sleeps until it guesses) that
    // what it sends next waits for Redis.
    let (began, stalled) = tokio::sync::oneshot::channel();
    let stalls = std::thread::spawn({
        let mut con = server.connection();
        move || {
            let mut began = Some(began);
            for _ in 0..10 {
                let _: () = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(300)
                    .arg("ALL")
                    .query(&mut con)
                    .unwrap();
                if let Some(began) = began.take() {
                    let _ = began.send(());
                }
                // Answered when the stall ends, with the commands queued
                // behind it (heartbeats included) before the next stall.
                let _: String = redis::cmd("PING").query(&mut con).unwrap();
            }
        }
    });
    stalled.await.unwrap();
    let r = reserve(&s, &pool, &l, Hits::exactly(1)).await.unwrap();
    assert_eq!(r.granted, 1);
    release(&s, held(&pool, &none, 1)).await.unwrap();
    let id = transfer(&s, held(&pool, &none, 1), Nanos::from_secs(600))
        .await
        .unwrap();
    tokio::task::spawn_blocking(move || stalls.join().unwrap())
        .await
        .unwrap();
    // Two held: 2 + 1 - 1 - 1 staged, and the staged one still counts.
    assert_eq!(holds(&s, &pool, "acme").await, (2, 2));
    // The server never resigned: its heartbeats got through.
    assert!(!beating.is_finished(), "resigned: {:?}", beating.await);
    assert!(matches!(
        release(&s, held(&pool, &none, 2)).await,
        Err(StoreError::Copy(CopyError::NotHeld { held: 1, .. }))
    ));
    s.seize(id, Nanos::ZERO, OpId::random()).await.unwrap();
    releases_to_nothing(&s, &pool, &none, 2).await;
    beating.abort();
}

/// The copy log applies an operation at most once however often it is
/// sent: a resent reserve, release or seize answers what it answered the
/// first time and changes nothing more.
#[tokio::test]
async fn a_resent_operation_is_applied_once() {
    let server = RedisServer::start();
    let s = store(&server.url(), &unique_prefix(), 5_000).await;
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(10, None);
    let none = Vec::new();
    let op = OpId::random();
    let first = s
        .reserve(&pool, &l, "acme", Hits::exactly(3), Nanos::ZERO, op)
        .await
        .unwrap();
    let again = s
        .reserve(&pool, &l, "acme", Hits::exactly(3), Nanos::ZERO, op)
        .await
        .unwrap();
    assert_eq!((first.granted, again.granted), (3, 3));
    assert_eq!(again.context.domain_holds, 3, "the first answer, again");
    assert_eq!(holds(&s, &pool, "acme").await, (3, 3), "counted once");
    let op = OpId::random();
    s.release(held(&pool, &none, 1), op).await.unwrap();
    s.release(held(&pool, &none, 1), op).await.unwrap();
    assert_eq!(holds(&s, &pool, "acme").await, (2, 2), "released once");
    let id = transfer(&s, held(&pool, &none, 2), Nanos::from_secs(60))
        .await
        .unwrap();
    let op = OpId::random();
    let seized = s.seize(id, Nanos::ZERO, op).await.unwrap();
    let twice = s.seize(id, Nanos::ZERO, op).await.unwrap();
    assert_eq!(seized, twice, "a resent seize finds what the first took");
    assert!(matches!(
        s.seize(id, Nanos::ZERO, OpId::random()).await,
        Err(StoreError::Copy(CopyError::UnknownTransfer))
    ));
    releases_to_nothing(&s, &pool, &none, 2).await;
}

/// Issue 16 item 3: seizes of made-up transfer ids leave nothing behind:
/// no registration of a pool, no state of this server to sweep.
#[tokio::test]
async fn seizes_of_unknown_transfers_leave_nothing_in_redis() {
    let (server, prefix, s) = server_and_store(5_000).await;
    let before = server.keys(&prefix);
    for i in 0..200u64 {
        let id = tollgate_core::copies::TransferId(
            u128::from(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) << 64 | 7,
        );
        assert!(matches!(
            s.seize(id, Nanos::ZERO, OpId::random()).await,
            Err(StoreError::Copy(CopyError::UnknownTransfer))
        ));
        assert_eq!(s.tracked_pools(), 0, "not even until the next sweep");
    }
    s.sweep_now(Nanos::ZERO).await;
    assert_eq!(server.keys(&prefix), before, "no key was written");
    assert_eq!(s.tracked_pools(), 0, "and nothing is kept to sweep");
}

/// A pool's registration is withdrawn once this server holds nothing
/// there, so pools used once do not pile up in the registration set.
#[tokio::test]
async fn the_registration_of_a_pool_held_no_more_is_withdrawn() {
    let (server, prefix, s) = server_and_store(5_000).await;
    let none = Vec::new();
    for i in 0..20 {
        let pool = PoolKey::new("ns", &format!("made-up-{i}"));
        reserve(&s, &pool, &CopyLimits::new(5, None), Hits::exactly(1))
            .await
            .unwrap();
        release(&s, held(&pool, &none, 1)).await.unwrap();
    }
    let registrations = format!("{prefix}{{srv}}:pools:{}", s.server_id());
    assert_eq!(server.command(&format!("HLEN {registrations}")), ":20");
    s.sweep_now(Nanos::ZERO).await;
    assert_eq!(server.command(&format!("HLEN {registrations}")), ":0");
    assert_eq!(s.tracked_pools(), 0);
    // No pool is left, only the replies of applied operations, which
    // expire on their own.
    for key in server.keys(&format!("{prefix}{{c:")) {
        assert!(key.contains(":op:"), "{key} is left");
        let ttl: i64 = server.command(&format!("PTTL {key}"))[1..].parse().unwrap();
        assert!(ttl > 0, "{key} expires");
    }
}

/// Issue 16 item 8: Redis restarts empty under a server that holds copies.
/// The server does not resign (nobody declared it dead): it joins again
/// and counts its holds again, so the limits hold and its holds release.
#[tokio::test]
async fn a_redis_that_restarts_empty_costs_its_counts_not_the_server() {
    let (mut server, _prefix, s) = server_and_store(600).await;
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(3, None);
    let none = Vec::new();
    reserve(&s, &pool, &l, Hits::exactly(3)).await.unwrap();
    let beating = beat(&s);
    server.restart();
    // The heartbeat finds itself gone though nobody declared it dead, and
    // counts its holds again.
    common::eventually(Duration::from_secs(20), || async {
        holds(&s, &pool, "acme").await == (3, 3)
    })
    .await;
    assert!(!beating.is_finished(), "resigned: {:?}", beating.await);
    // The limit holds again, and the holds release.
    let r = reserve(&s, &pool, &l, Hits::exactly(1)).await.unwrap();
    assert_eq!(r.granted, 0);
    releases_to_nothing(&s, &pool, &none, 3).await;
    beating.abort();
}

/// The same loss found by a copy operation before any heartbeat: the pool
/// no longer has this server's contribution, so it counts it again first.
#[tokio::test]
async fn a_pool_redis_lost_is_counted_again_by_the_next_operation() {
    let (server, _prefix, s) = server_and_store(5_000).await;
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(3, None);
    let none = Vec::new();
    reserve(&s, &pool, &l, Hits::exactly(2)).await.unwrap();
    assert_eq!(server.command("FLUSHALL"), "+OK");
    // Without the recount this would grant 3 (and the release below would
    // be refused as not held).
    let r = reserve(&s, &pool, &l, Hits::between(1, 3)).await.unwrap();
    assert_eq!(r.granted, 1, "two were counted again first");
    releases_to_nothing(&s, &pool, &none, 3).await;
}

/// Review of issue 16's fix: a pool this server stayed registered in (a
/// transfer was due there) kept its "registered" mark after Redis lost the
/// registration set, so later holds there were never registered again and
/// a cleaner after this server's death could not find them.
#[tokio::test]
async fn a_pool_registered_before_redis_restarted_empty_is_registered_again() {
    let (mut server, prefix, a) = server_and_store(600).await;
    let b = store(&server.url(), &prefix, 600).await;
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(3, None);
    let none = Vec::new();
    reserve(&a, &pool, &l, Hits::exactly(1)).await.unwrap();
    transfer(&a, held(&pool, &none, 1), Nanos::from_secs(600))
        .await
        .unwrap();
    let beating = beat(&a);
    let _b_beating = beat(&b);
    server.restart();
    let alive = format!("{prefix}{{srv}}:alive");
    common::eventually(Duration::from_secs(20), || async {
        server.command(&format!("ZSCORE {alive} {}", a.server_id())) != "$-1"
    })
    .await;
    assert_eq!(
        reserve(&a, &pool, &l, Hits::exactly(2))
            .await
            .unwrap()
            .granted,
        2
    );
    // Registered again, by the reserve or by the recovery that follows the
    // rejoin, whichever gets the pool first.
    let registrations = format!("{prefix}{{srv}}:pools:{}", a.server_id());
    common::eventually(Duration::from_secs(20), || async {
        server.command(&format!("HLEN {registrations}")) == ":1"
    })
    .await;
    // A dies; B cleans up after it and finds the two copies.
    beating.abort();
    drop(a);
    common::eventually(Duration::from_secs(20), || async {
        holds(&b, &pool, "acme").await == (0, 0)
    })
    .await;
}

/// A store on `server` in which acme holds one copy of `ns/db` (limit 5),
/// with the key of the pool's counts and their dump as they then stand.
async fn one_copy_then_dumped(
    server: &RedisServer,
) -> (RedisStore, PoolKey, CopyLimits, String, Vec<u8>) {
    let prefix = unique_prefix();
    let s = store(&server.url(), &prefix, 5_000).await;
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(5, None);
    reserve(&s, &pool, &l, Hits::exactly(1)).await.unwrap();
    let key = pool_hash(server, &prefix);
    let old = server.client().dump(&key);
    (s, pool, l, key, old)
}

/// Review of issue 16's fix: a pool that went back to an older state (a
/// failover to a replica that lagged, a snapshot) still had this server's
/// total, only an old one: it was not noticed, and releases of what the
/// sessions hold were refused. The next operation now rewrites this
/// server's contribution from its own record first.
#[tokio::test]
async fn a_pool_that_went_back_to_an_older_state_is_written_again() {
    let server = RedisServer::start();
    let (s, pool, l, key, old) = one_copy_then_dumped(&server).await;
    let none = Vec::new();
    reserve(&s, &pool, &l, Hits::exactly(2)).await.unwrap();
    // Back to the state with one copy.
    server.client().restore(&key, &old);
    assert_eq!(
        holds(&s, &pool, "acme").await,
        (3, 3),
        "written again first"
    );
    releases_to_nothing(&s, &pool, &none, 3).await;
}

/// A remembered reply is forgotten once this server has it: the script
/// deletes it with the server's next call on the pool, so replies do not
/// pile up for their whole lifetime.
#[tokio::test]
async fn remembered_replies_are_forgotten_once_received() {
    let (server, prefix, s) = server_and_store(5_000).await;
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(100, None);
    for _ in 0..20 {
        reserve(&s, &pool, &l, Hits::exactly(1)).await.unwrap();
    }
    let remembered = server
        .keys(&format!("{prefix}{{c:"))
        .into_iter()
        .filter(|k| k.contains(":op:"))
        .count();
    assert_eq!(remembered, 1, "only the last reply, until the next call");
}

/// Review of issue 16's fix: counts are kept in Lua doubles, and limits
/// that are unbounded (unconfigured resources, shadow mode) let a pool's
/// counts pass 2^53, where they are no longer exact (this server's own
/// total then never matched its record, and every call was refused).
/// Every count stays below 2^52.
#[tokio::test]
async fn counts_stay_exact_whatever_the_limits() {
    let server = RedisServer::start();
    let s = store(&server.url(), &unique_prefix(), 5_000).await;
    let pool = PoolKey::new("ns", "made-up");
    let unbounded = CopyLimits::new(u64::MAX, None);
    let most = (1u64 << 52) - 1;
    let r = reserve(&s, &pool, &unbounded, Hits::between(1, most))
        .await
        .unwrap();
    assert_eq!(r.granted, most);
    let r = reserve_as(&s, &pool, &unbounded, "globex", Hits::between(0, 5))
        .await
        .unwrap();
    assert_eq!(r.granted, 0, "no room left below 2^52");
    let none = Vec::new();
    release(&s, held(&pool, &none, 3)).await.unwrap();
    let r = reserve_as(&s, &pool, &unbounded, "globex", Hits::between(0, 5))
        .await
        .unwrap();
    assert_eq!(r.granted, 3, "and exactly what was given back");
    assert_eq!(r.context.global_holds, most);
}

/// Review of issue 16's fix: a pool put back to an older state with the
/// same total as now (this server released one copy for `acme` and
/// reserved one for `globex`) went unnoticed: the total matched. The
/// version (the operation that last changed this server's holds) tells.
#[tokio::test]
async fn a_pool_put_back_to_an_older_state_with_the_same_total_is_written_again() {
    let server = RedisServer::start();
    let (s, pool, l, key, old) = one_copy_then_dumped(&server).await;
    let none = Vec::new();
    release(&s, held(&pool, &none, 1)).await.unwrap();
    reserve_as(&s, &pool, &l, "globex", Hits::exactly(1))
        .await
        .unwrap();
    server.client().restore(&key, &old);
    // globex's copy can be released (it could not, were acme's still
    // counted as this server's instead), and nothing is left.
    release(&s, held_by(&pool, "globex", &none, 1))
        .await
        .unwrap();
    assert_eq!(holds(&s, &pool, "acme").await, (0, 0));
}

/// Review of issue 16's fix: a transfer whose caller gave up is taken back
/// into its hold, but a server that had not renewed its heartbeat for a
/// TTL refused (it takes no new holds until it reaches Redis again), so
/// the copies stayed staged under an id nobody knew. Taking back is not a
/// new hold.
#[tokio::test]
async fn a_server_that_may_take_no_new_holds_still_takes_back_its_own_transfer() {
    let server = RedisServer::start();
    // No heartbeat runs: once the TTL has passed since joining, the store
    // cannot know whether a survivor cleaned up after it.
    let s = store(&server.url(), &unique_prefix(), 300).await;
    let pool = PoolKey::new("ns", "db");
    let l = CopyLimits::new(5, None);
    let none = Vec::new();
    reserve(&s, &pool, &l, Hits::exactly(2)).await.unwrap();
    let id = transfer(&s, held(&pool, &none, 2), Nanos::from_secs(600))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let refused = s.seize(id, Nanos::ZERO, OpId::random()).await;
    assert!(
        matches!(&refused, Err(StoreError::Unavailable(m)) if m.contains("heartbeat TTL")),
        "{refused:?}"
    );
    let taken = s.take_back(id, Nanos::ZERO, OpId::random()).await.unwrap();
    assert_eq!(taken.staged.copies, 2);
    release(&s, held(&pool, &none, 2)).await.unwrap();
}
