//! Guava's smooth limiters (`SmoothBursty`, `SmoothWarmingUp`): the Redis
//! store answers what the memory store answers, step for step, and both
//! give Guava's own waits, to the microsecond.
//!
//! Guava's tests run on a fake stopwatch that advances only when someone
//! sleeps: the limiter (the wait `acquire` returns) or the user. A script
//! here is that timeline as steps, each call made after the previous call's
//! wait and the user's sleep. In try mode the same timeline is replayed: a
//! call Guava would make wait is tried (and refused, with the wait as its
//! `retry_after`) when the acquire would have been made, then tried again
//! once the wait has passed. Guava reserves at `next_free` either way (a
//! resync at `now == next_free` changes nothing), so the states stay those
//! of Guava's run and the refusals reveal Guava's waits too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use tollgate_testing::{guava_scripts, guava_steps, GuavaLimiter, GuavaStep};

use common::strategies::step;
use common::{
    caller_clock_server, caller_clock_store, conform, conform_on_a_new_server, gcra, mixed_items,
    Item, RedisServer, Step, T0,
};
use proptest::prelude::*;
use tollgate_core::{Algorithm, Hits, Limit, Mode, Nanos, PlanDecision, Rate, Smooth};
use tollgate_store::{Plan, Store};

fn per_second(n: u64) -> Rate {
    Rate::per_second(n).unwrap()
}

fn bursty_at(rate: Rate, max_burst_seconds: f64, created_at: Nanos) -> Limit {
    Limit::Smooth(
        Smooth::bursty(rate, max_burst_seconds)
            .unwrap()
            .created_at(created_at),
    )
}

fn warming_up_at(rate: Rate, warmup: Nanos, cold_factor: f64, created_at: Nanos) -> Limit {
    Limit::Smooth(
        Smooth::warming_up(rate, warmup, cold_factor)
            .unwrap()
            .created_at(created_at),
    )
}

/// `RateLimiter.create(permitsPerSecond)` on a stopwatch starting at T0.
fn bursty(rate: Rate) -> Limit {
    bursty_at(rate, 1.0, T0)
}

/// `RateLimiter.create(permitsPerSecond, warmup, MILLISECONDS, coldFactor)`
/// on a stopwatch starting at T0.
fn warming_up(rate: Rate, warmup_millis: u64, cold_factor: f64) -> Limit {
    warming_up_at(rate, Nanos::from_millis(warmup_millis), cold_factor, T0)
}

/// One `acquire(permits)` of a Guava script: the user's sleep before it,
/// and the wait Guava returns, both in microseconds.
#[derive(Copy, Clone, Debug)]
struct Call {
    sleep: u64,
    permits: u64,
    wait: u64,
}

fn call(sleep: u64, permits: u64, wait: u64) -> Call {
    Call {
        sleep,
        permits,
        wait,
    }
}

/// `n` acquires of one permit with these waits, the first after `sleep`.
fn ones(sleep: u64, waits: &[u64]) -> Vec<Call> {
    waits
        .iter()
        .enumerate()
        .map(|(i, &w)| call(if i == 0 { sleep } else { 0 }, 1, w))
        .collect()
}

/// Guava's warm-up vectors: eight one-permit acquires with the `cold`
/// waits, the same after `again_after` us (cold again), then after
/// `warm_after` us a first at once and seven at the stable `interval`.
fn cold_twice_then_warm(
    cold: &[u64],
    again_after: u64,
    warm_after: u64,
    interval: u64,
) -> Vec<Call> {
    let mut calls = ones(0, cold);
    calls.extend(ones(again_after, cold));
    let mut warm = vec![interval; 8];
    warm[0] = 0;
    calls.extend(ones(warm_after, &warm));
    calls
}

fn us(n: u64) -> Nanos {
    Nanos::from_micros(n)
}

fn one_item(hits: u64, mode: Mode, advance: Nanos) -> Step {
    Step {
        advance,
        request: Hits::exactly(hits),
        mode,
        items: vec![0],
        own: Vec::new(),
    }
}

/// The script in acquire mode: each call after the previous one's wait.
fn acquire_steps(calls: &[Call]) -> Vec<Step> {
    let mut prev_wait = 0;
    calls
        .iter()
        .map(|c| {
            let s = one_item(c.permits, Mode::Acquire, us(prev_wait + c.sleep));
            prev_wait = c.wait;
            s
        })
        .collect()
}

/// The script in try mode (see the module docs).
fn try_steps(calls: &[Call]) -> Vec<Step> {
    let mut steps = Vec::new();
    for c in calls {
        steps.push(one_item(c.permits, Mode::Try, us(c.sleep)));
        if c.wait > 0 {
            steps.push(one_item(c.permits, Mode::Try, us(c.wait)));
        }
    }
    steps
}

/// Decides `steps` in Redis alone, on a store of its own (so on keys no
/// other run touched), and returns every answer.
async fn redis_run(
    server: &RedisServer,
    items: &[Item],
    start: Nanos,
    steps: &[Step],
) -> Vec<PlanDecision> {
    let redis = caller_clock_store(server).await;
    let mut now = start;
    let mut out = Vec::new();
    for step in steps {
        now = now.saturating_add(step.advance);
        let mut plan = Plan::default().with_affinity(7);
        for &i in &step.items {
            let it = &items[i];
            plan.push(it.key.clone(), Arc::clone(&it.limit), it.shadow)
                .unwrap();
        }
        out.push(
            redis
                .decide(&plan, now, step.request, step.mode)
                .await
                .unwrap(),
        );
    }
    out
}

/// The part of T0 below its microsecond: every script advances in whole
/// microseconds, so every `now` has it, and a refusal's `retry_after` is
/// the wait less it (a request is granted from the first nanosecond of the
/// microsecond its debt is paid).
fn sub_micro() -> Nanos {
    Nanos::new(T0.as_u64() % 1000)
}

/// Runs a Guava script for `limit`, starting at T0, in acquire and in try
/// mode: through both stores, and checks that Redis gives Guava's waits.
async fn check_guava(server: &RedisServer, limit: Limit, calls: &[Call]) {
    let items = [Item::new(limit, 1, "acme")];
    let acquires = acquire_steps(calls);
    let tries = try_steps(calls);
    conform(&caller_clock_store(server).await, &items, T0, &acquires).await;
    conform(&caller_clock_store(server).await, &items, T0, &tries).await;

    let got = redis_run(server, &items, T0, &acquires).await;
    for (i, (d, c)) in got.iter().zip(calls).enumerate() {
        assert!(d.allowed, "acquire #{i} always grants");
        assert_eq!(d.granted, c.permits, "acquire #{i}");
        assert_eq!(d.wait, us(c.wait), "acquire #{i} of {calls:?}");
    }

    let got = redis_run(server, &items, T0, &tries).await;
    let mut answers = got.iter();
    for (i, c) in calls.iter().enumerate() {
        if c.wait > 0 {
            let refused = answers.next().unwrap();
            assert!(!refused.allowed, "try #{i} is early");
            assert_eq!(refused.granted, 0, "try #{i}");
            assert_eq!(
                refused.decisions[0].retry_after,
                Some(us(c.wait).saturating_sub(sub_micro())),
                "try #{i} of {calls:?}"
            );
        }
        let granted = answers.next().unwrap();
        assert!(granted.allowed, "try #{i} is on time");
        assert_eq!(granted.granted, c.permits, "try #{i}");
        assert_eq!(granted.wait, Nanos::ZERO, "try #{i}");
    }
}

/// tests/guava.rs's `check_script` timeline (tollgate-testing's
/// [`guava_steps`]) as calls with the Java port's waits.
fn java_script(seed: i64, waits: &[u64]) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut sleep = 0;
    for step in guava_steps(seed) {
        match step {
            GuavaStep::Acquire(permits) => {
                calls.push(call(sleep, permits, waits[calls.len()]));
                sleep = 0;
            }
            GuavaStep::SleepMillis(ms) => sleep += ms * 1000,
        }
    }
    assert_eq!(calls.len(), waits.len(), "seed {seed}");
    calls
}

/// tests/guava.rs's `odd_parameters_match_the_java_port`: odd rates,
/// warm-ups and cold factors, where the two truncated parts of a warm-up
/// wait do not add up to whole microseconds (tollgate-testing's
/// [`guava_scripts`]).
fn java_scripts() -> Vec<(Limit, i64, &'static [u64])> {
    guava_scripts()
        .map(|script| {
            // Rate::per_second(n) is Rate::new(n, 1 s).
            let rate = Rate::new(script.permits, Nanos::from_secs(script.seconds)).unwrap();
            let limit = match script.limiter {
                GuavaLimiter::Bursty => bursty(rate),
                GuavaLimiter::WarmingUp {
                    warmup_millis,
                    cold_factor,
                } => warming_up(rate, warmup_millis, cold_factor),
            };
            (limit, script.seed, script.waits)
        })
        .collect()
}

/// Guava's `"R0.00, R1.38, R1.13, R0.88, R0.63, R0.50, R0.50, R0.50"`.
const WARM_UP_2QPS_4S: [u64; 8] = [
    0, 1_375_000, 1_125_000, 875_000, 625_000, 500_000, 500_000, 500_000,
];

/// `testWarmUpWithColdFactor`'s cold run: the fifth wait is 227500 +
/// (long) 72727.27, Guava truncating the trapezoid and the rectangle
/// separately.
const COLD_5QPS_4S_10X: [u64; 8] = [
    0, 1_752_500, 1_257_500, 762_500, 300_227, 200_000, 200_000, 200_000,
];

#[tokio::test]
async fn guava_bursty_vectors_match() {
    let server = RedisServer::start();
    // testSimple
    check_guava(
        &server,
        bursty(per_second(5)),
        &ones(0, &[0, 200_000, 200_000]),
    )
    .await;
    // testSimpleWithWait
    check_guava(
        &server,
        bursty(per_second(5)),
        &[call(0, 1, 0), call(200_000, 1, 0), call(0, 1, 200_000)],
    )
    .await;
    // testSimpleAcquireEarliestAvailableIsInPast
    check_guava(
        &server,
        bursty(per_second(5)),
        &[
            call(0, 1, 0),
            call(400_000, 1, 0),
            call(0, 1, 0),
            call(0, 1, 200_000),
        ],
    )
    .await;
    // testOneSecondBurst
    let burst = [
        call(2_000_000, 1, 0),
        call(0, 1, 0),
        call(0, 3, 0),
        call(0, 1, 0),
        call(0, 1, 200_000),
    ];
    check_guava(&server, bursty(per_second(5)), &burst).await;
    // testSimpleWeights
    let weights = [1, 1, 2, 4, 8, 1]
        .into_iter()
        .zip([0, 1_000_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000])
        .map(|(p, w)| call(0, p, w))
        .collect::<Vec<_>>();
    check_guava(&server, bursty(per_second(1)), &weights).await;
    // No stored permits at all.
    check_guava(
        &server,
        bursty_at(per_second(5), 0.0, T0),
        &[call(5_000_000, 1, 0), call(0, 1, 200_000)],
    )
    .await;
}

#[tokio::test]
async fn guava_warming_up_vectors_match() {
    let server = RedisServer::start();
    // testWarmUp: cold, then cold again after 4.5 s, but not after 2.5 s.
    let calls = cold_twice_then_warm(&WARM_UP_2QPS_4S, 4_500_000, 2_500_000, 500_000);
    check_guava(&server, warming_up(per_second(2), 4000, 3.0), &calls).await;
    // testWarmUpWithColdFactor
    let calls = cold_twice_then_warm(&COLD_5QPS_4S_10X, 4_200_000, 1_200_000, 200_000);
    check_guava(&server, warming_up(per_second(5), 4000, 10.0), &calls).await;
    // testWarmUpWithColdFactor1
    let flat = [
        0, 200_000, 200_000, 200_000, 200_000, 200_000, 200_000, 200_000,
    ];
    let mut calls = ones(0, &flat);
    calls.extend(ones(340_000, &flat));
    check_guava(&server, warming_up(per_second(5), 4000, 1.0), &calls).await;
}

#[tokio::test]
async fn java_port_scripts_match() {
    let server = RedisServer::start();
    for (limit, seed, waits) in java_scripts() {
        check_guava(&server, limit, &java_script(seed, waits)).await;
    }
}

#[tokio::test]
async fn try_acquire_vectors_match() {
    let server = RedisServer::start();
    let items = [Item::new(bursty(per_second(5)), 1, "acme")];
    let ms = Nanos::from_millis;
    let tries = |advances: &[(Nanos, u64)]| -> Vec<Step> {
        advances
            .iter()
            .map(|&(a, hits)| one_item(hits, Mode::Try, a))
            .collect()
    };
    // tests/guava.rs's try_acquire_no_wait_allowed: the refusal says when
    // the next permit is free.
    let steps = tries(&[
        (Nanos::ZERO, 1),
        (Nanos::ZERO, 1),
        (Nanos::ZERO, 1),
        (ms(100), 1),
        (ms(100), 1),
    ]);
    conform(&caller_clock_store(&server).await, &items, T0, &steps).await;
    let got = redis_run(&server, &items, T0, &steps).await;
    let allowed: Vec<bool> = got.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, false, false, false, true]);
    // 100 ms to the microsecond the next permit is free, less T0's part
    // of a microsecond.
    assert_eq!(
        got[3].decisions[0].retry_after,
        Some(ms(100).saturating_sub(sub_micro()))
    );
    // testTryAcquire_negative: any size is granted when free.
    let steps = tries(&[(Nanos::ZERO, 5), (ms(900), 1), (ms(100), 1)]);
    conform(&caller_clock_store(&server).await, &items, T0, &steps).await;
    let got = redis_run(&server, &items, T0, &steps).await;
    let allowed: Vec<bool> = got.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, false, true]);
}

#[tokio::test]
async fn created_at_in_the_past_or_the_future_matches() {
    let server = RedisServer::start();
    let s = Nanos::from_secs;
    let burst = [
        call(0, 1, 0),
        call(0, 1, 0),
        call(0, 3, 0),
        call(0, 1, 0),
        call(0, 1, 200_000),
    ];
    // Created long ago (or never set: the epoch): a full second of permits.
    check_guava(
        &server,
        bursty_at(per_second(5), 1.0, T0.saturating_sub(s(10))),
        &burst,
    )
    .await;
    let never = Limit::Smooth(Smooth::bursty(per_second(5), 1.0).unwrap());
    check_guava(&server, never, &burst).await;
    // Created 1.5 s from now: the first request waits until then.
    let later = T0.saturating_add(Nanos::from_millis(1500));
    check_guava(
        &server,
        bursty_at(per_second(5), 1.0, later),
        &ones(0, &[1_500_000, 200_000, 200_000]),
    )
    .await;
    // A warming-up limiter is cold from its creation on, however long ago.
    let warm = |at| warming_up_at(per_second(2), s(4), 3.0, at);
    check_guava(
        &server,
        warm(T0.saturating_sub(s(100))),
        &ones(0, &WARM_UP_2QPS_4S),
    )
    .await;
    let mut late = WARM_UP_2QPS_4S;
    late[0] = 2_000_000;
    check_guava(&server, warm(T0.saturating_add(s(2))), &ones(0, &late)).await;
    // 3 permits per 7 s, created half a microsecond off T0's: the core's
    // micros() of created_at carries into the next microsecond.
    let odd = Rate::new(3, s(7)).unwrap();
    let created = T0.saturating_add(Nanos::new(500));
    let items = [
        Item::new(bursty_at(odd, 2.5, created), 1, "acme"),
        Item::new(
            warming_up_at(odd, Nanos::new(3_210_987_654), 2.75, created),
            2,
            "acme",
        ),
        Item::new(gcra(3, s(7), 2), 3, "acme"),
    ];
    let ms = Nanos::from_millis;
    let steps = [
        Step::exactly(Nanos::ZERO, 1, 3),
        Step::exactly(Nanos::new(211), 1, 3),
        Step::exactly(Nanos::new(1), 1, 2),
        Step::exactly(ms(2333), 2, 2),
        Step {
            advance: ms(10),
            request: Hits::between(0, 3),
            mode: Mode::Try,
            items: vec![1, 0, 2],
            own: Vec::new(),
        },
        Step {
            advance: ms(10),
            request: Hits::exactly(2),
            mode: Mode::Acquire,
            items: vec![0, 1, 2],
            own: Vec::new(),
        },
        Step {
            advance: s(3),
            request: Hits::between(1, 4),
            mode: Mode::Try,
            items: vec![2, 1],
            own: Vec::new(),
        },
        Step {
            advance: ms(1),
            request: Hits::exactly(0),
            mode: Mode::Acquire,
            items: vec![1],
            own: Vec::new(),
        },
        Step::exactly(s(20), 3, 1),
        Step::exactly(s(60), 2, 2),
    ];
    conform(&caller_clock_store(&server).await, &items, T0, &steps).await;
    let mut shadowed = items.clone();
    shadowed[1] = shadowed[1].clone().shadow();
    conform(&caller_clock_store(&server).await, &shadowed, T0, &steps).await;
}

/// Limits reloaded with a later `created_at` find the key's state of the
/// earlier ones (same limit, same scope): it is full and paid up, but not
/// idle, since a fresh state of the new limits would not be full yet, and
/// dropping it would refuse what the kept state grants.
#[tokio::test]
async fn a_reload_with_a_later_created_at_keeps_the_state() {
    let server = RedisServer::start();
    let s = Nanos::from_secs;
    let items = [
        Item::new(
            bursty_at(per_second(5), 1.0, T0.saturating_sub(s(60))),
            1,
            "acme",
        ),
        Item::new(
            bursty_at(per_second(5), 1.0, T0.saturating_add(s(10))),
            1,
            "acme",
        ),
        Item::new(warming_up_at(per_second(5), s(2), 3.0, T0), 2, "acme"),
        Item::new(
            warming_up_at(per_second(5), s(2), 3.0, T0.saturating_add(s(10))),
            2,
            "acme",
        ),
    ];
    let at = |advance, hits, item| Step {
        advance,
        request: Hits::exactly(hits),
        mode: Mode::Try,
        items: vec![item],
        own: Vec::new(),
    };
    let steps = [
        at(Nanos::ZERO, 3, 0),
        at(Nanos::ZERO, 1, 2),
        at(s(4), 0, 1),
        at(Nanos::ZERO, 0, 3),
        at(Nanos::from_millis(1), 1, 1),
        at(Nanos::ZERO, 1, 3),
    ];
    conform(&caller_clock_store(&server).await, &items, T0, &steps).await;
    let got = redis_run(&server, &items, T0, &steps).await;
    assert!(got[4].allowed && got[5].allowed, "the kept states grant");
}

/// The first time `limit`'s state after `steps` (from T0) is idle, by the
/// core's own is_idle, and the time of the last step.
fn idle_at(limit: &Limit, steps: &[Step]) -> (Nanos, Nanos) {
    let mut state = limit.fresh();
    let mut now = T0;
    for s in steps {
        now = now.saturating_add(s.advance);
        match s.mode {
            Mode::Acquire => {
                limit.acquire(&mut state, now, s.request.hits).unwrap();
            }
            Mode::Try => {
                limit.decide(&mut state, now, s.request);
            }
            // Refused (no sound debt), changing nothing.
            Mode::Report | Mode::Refund => {}
        }
    }
    let (mut lo, mut hi) = (now, now.saturating_add(Nanos::from_secs(1 << 20)));
    assert!(limit.is_idle(&state, hi));
    while lo < hi {
        let mid = Nanos::new(lo.as_u64() + (hi.as_u64() - lo.as_u64()) / 2);
        if limit.is_idle(&state, mid) {
            hi = mid;
        } else {
            lo = mid.saturating_add(Nanos::NANOSECOND);
        }
    }
    (lo, now)
}

/// The PTTL of every state key of limit 1 for scope `ttl` (a scope no
/// conformance run uses) in `server`.
fn ttl_keys(server: &RedisServer) -> Vec<(String, i64)> {
    let mut c = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:l:0000000000000001:ttl")
        .query(&mut c)
        .unwrap();
    keys.into_iter()
        .map(|k| {
            let ttl = redis::cmd("PTTL").arg(&k).query(&mut c).unwrap();
            (k, ttl)
        })
        .collect()
}

/// A key is kept exactly until the core calls its state idle, then
/// deleted; until then it expires no sooner than that (plus the entry
/// script's second of slack) and not much later.
#[tokio::test]
async fn keys_live_until_idle_and_expire_after() {
    let cases = [
        // Eight permits taken at once from a cold limiter: 6 s of debt
        // (4 s of trapezoid, 4 stable intervals), then 4 s to cool down.
        (
            warming_up(per_second(2), 4000, 3.0),
            vec![one_item(8, Mode::Acquire, Nanos::ZERO)],
        ),
        // Never used, but created 2.5 s from now: a fresh key is not idle
        // until a second after that, when a new one would be full too.
        (
            bursty_at(
                per_second(5),
                1.0,
                T0.saturating_add(Nanos::from_millis(2500)),
            ),
            vec![one_item(0, Mode::Try, Nanos::ZERO)],
        ),
        // Odd rate and burst: 3 permits per 7 s, 1.7 s of them.
        (
            bursty_at(Rate::new(3, Nanos::from_secs(7)).unwrap(), 1.7, T0),
            vec![
                one_item(1, Mode::Try, Nanos::from_secs(5)),
                one_item(1, Mode::Try, Nanos::from_secs(1)),
            ],
        ),
    ];
    for (limit, steps) in cases {
        let (server, redis) = caller_clock_server().await;
        let (idle, last) = idle_at(&limit, &steps);
        let wait = idle.saturating_sub(last);
        assert!(wait > Nanos::from_secs(1), "{limit:?}: {wait:?}");
        let items = [Item::new(limit.clone(), 1, "acme")];
        let mut all = steps.clone();
        all.push(one_item(0, Mode::Try, wait.saturating_sub(Nanos::new(1))));
        all.push(one_item(0, Mode::Try, Nanos::new(1)));
        conform(&caller_clock_store(&server).await, &items, T0, &all).await;

        let mut plan = Plan::default().with_affinity(7);
        let own = Item::new(limit.clone(), 1, "ttl");
        plan.push(own.key, Arc::clone(&own.limit), false).unwrap();
        let mut now = T0;
        for s in &steps {
            now = now.saturating_add(s.advance);
            redis.decide(&plan, now, s.request, s.mode).await.unwrap();
        }
        let ttl = ttl_keys(&server);
        // decide.lua's margin with the caller's clock is an hour.
        let want_ms = i64::try_from(wait.as_u64() / 1_000_000).unwrap() + 3_600_000;
        assert_eq!(ttl.len(), 1, "{limit:?}: {ttl:?}");
        // Real time passes between the SET and the PTTL; allow for it.
        assert!(
            (want_ms - 500..=want_ms + 1).contains(&ttl[0].1),
            "{limit:?}: PTTL {} ms, idle in {wait:?}",
            ttl[0].1
        );
        let zero = Hits::exactly(0);
        let before = idle.saturating_sub(Nanos::new(1));
        redis.decide(&plan, before, zero, Mode::Try).await.unwrap();
        assert_eq!(ttl_keys(&server).len(), 1, "{limit:?}: not idle yet");
        redis.decide(&plan, idle, zero, Mode::Try).await.unwrap();
        assert_eq!(ttl_keys(&server).len(), 0, "{limit:?}: idle");
    }
}

/// A smooth limiter with random parameters: bursty or warming up, rates
/// that need not be whole per second (3 per 7 s), any burst, warm-up (in
/// nanoseconds, which the core truncates to microseconds) and cold factor,
/// created at any nanosecond around T0 or never.
fn smooth_limit() -> impl Strategy<Value = Limit> {
    let rate = (1u64..20, 1u64..10_000)
        .prop_map(|(count, ms)| Rate::new(count, Nanos::from_millis(ms)).unwrap());
    let created = prop_oneof![
        1 => Just(Nanos::ZERO),
        4 => (-5_000_000_000i64..5_000_000_000).prop_map(|d| {
            Nanos::new(T0.as_u64().checked_add_signed(d).unwrap())
        }),
    ];
    let bursty = (
        rate.clone(),
        prop_oneof![Just(0.0), Just(1.0), 0.0f64..5.0],
        created.clone(),
    )
        .prop_map(|(rate, burst, at)| bursty_at(rate, burst, at));
    let warming = (
        rate,
        1_000u64..8_000_000_000,
        prop_oneof![Just(1.0), Just(3.0), 1.0f64..12.0],
        created,
    )
        .prop_map(|(rate, warmup, cold, at)| warming_up_at(rate, Nanos::new(warmup), cold, at));
    prop_oneof![bursty, warming]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn smooth_limiters_match_the_memory_store(
        a in smooth_limit(),
        b in smooth_limit(),
        g in (1u64..50, 1u64..3000, 1u64..8),
        shadow in any::<bool>(),
        steps in proptest::collection::vec(step(3, 3_000_000_000, 10, 6), 1..40),
    ) {
        conform_on_a_new_server(&mixed_items(a, b, shadow, g, ""), T0, &steps);
    }
}
