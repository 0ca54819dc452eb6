//! What the Redis store's tests share: real redis-server processes on free
//! ports, and the conformance runner that drives the memory store and the
//! Redis store through the same scenario.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::copies::{CopyLimits, Reservation};
use tollgate_core::{Hits, Limit, Mode, Nanos};
pub use tollgate_redis::testing::RedisServer;
use tollgate_redis::{RedisOptions, RedisStore, ScriptClock};
use tollgate_store::{Key, LimitId, MemoryStore, OpId, Plan, PoolKey, Store, StoreError};

/// A time in 2026, so the scripts see realistic absolute times (the core's
/// saturation at zero never comes into play).
pub const T0: Nanos = Nanos::new(1_790_000_000_123_456_789);

static PREFIXES: AtomicU64 = AtomicU64::new(0);

/// A prefix no other store in this process uses.
pub fn unique_prefix() -> String {
    format!("t{}:", PREFIXES.fetch_add(1, Ordering::Relaxed))
}

/// A redis-server of its own and a store on it taking the caller's clock
/// (the server stops when dropped, so it is returned too).
pub async fn caller_clock_server() -> (RedisServer, RedisStore) {
    let server = RedisServer::start();
    let redis = caller_clock_store(&server).await;
    (server, redis)
}

/// A Redis store on `server` taking the caller's clock, with its own
/// prefix and a timeout generous enough for a loaded test machine.
pub async fn caller_clock_store(server: &RedisServer) -> RedisStore {
    let mut o = RedisOptions::new(server.url());
    o.prefix = unique_prefix();
    o.clock = ScriptClock::Caller;
    o.connect.response_timeout = Duration::from_secs(5);
    RedisStore::connect(o).await.unwrap()
}

/// A Redis store on `url` with Redis's clock, `prefix` and a heartbeat TTL
/// of `ttl_ms`: one limiting server of a copy-log test (several share a
/// prefix).
pub async fn store(url: &str, prefix: &str, ttl_ms: u64) -> RedisStore {
    let mut o = RedisOptions::new(url);
    o.prefix = prefix.to_owned();
    o.heartbeat_ttl = Duration::from_millis(ttl_ms);
    o.connect.response_timeout = Duration::from_secs(5);
    RedisStore::connect(o).await.unwrap()
}

/// What `domain` and everyone hold in `pool`, as `store` reads it (a
/// reservation of zero copies that changes nothing).
pub async fn holds(store: &RedisStore, pool: &PoolKey, domain: &str) -> (u64, u64) {
    let r = store
        .reserve(
            pool,
            &CopyLimits::new(1000, Some(1000)),
            domain,
            Hits::between(0, 0),
            Nanos::ZERO,
            OpId::random(),
        )
        .await
        .unwrap();
    (r.context.domain_holds, r.context.global_holds)
}

/// One limit of a scenario: its algorithm, the key it is kept under and
/// whether it is in shadow mode.
#[derive(Clone, Debug)]
pub struct Item {
    pub limit: Arc<Limit>,
    pub key: Key,
    pub shadow: bool,
}

impl Item {
    /// Limit `id` for domain `scope`.
    pub fn new(limit: Limit, id: u64, scope: &str) -> Item {
        Item {
            limit: Arc::new(limit),
            key: Key::new(LimitId(id), scope),
            shadow: false,
        }
    }

    /// The same, in shadow mode.
    pub fn shadow(mut self) -> Item {
        self.shadow = true;
        self
    }
}

/// One request of a scenario: `advance` after the previous step, the
/// request and mode, and which of the scenario's items form its plan
/// (indices, in plan order).
#[derive(Clone, Debug)]
pub struct Step {
    pub advance: Nanos,
    pub request: Hits,
    pub mode: Mode,
    pub items: Vec<usize>,
    /// Per plan item (in `items` order), hits of its own in place of the
    /// request's (Envoy descriptors with their own `hits_addend`); empty or
    /// shorter: the rest take the request's.
    pub own: Vec<Option<u64>>,
}

impl Step {
    /// A `Try` request for exactly `hits` against every item, `advance`
    /// after the previous step.
    pub fn exactly(advance: Nanos, hits: u64, items: usize) -> Step {
        Step {
            advance,
            request: Hits::exactly(hits),
            mode: Mode::Try,
            items: (0..items).collect(),
            own: Vec::new(),
        }
    }
}

/// The plan of `step`, or `None` when the step lists one key twice: a
/// plan refuses a key it already holds ([`Plan::push`]), so no store ever
/// sees such a request (the stores used to refuse it alike, changing
/// nothing, which skipping the step keeps).
pub fn plan_of(items: &[Item], step: &Step) -> Option<Plan> {
    let mut plan = Plan::default().with_affinity(7);
    for (at, &i) in step.items.iter().enumerate() {
        let it = &items[i];
        if let Err(e) = plan.push(it.key.clone(), Arc::clone(&it.limit), it.shadow) {
            let listed = step.items.iter().filter(|&&j| items[j].key == it.key);
            assert!(e.key == it.key && listed.count() > 1, "{e} ({step:?})");
            return None;
        }
        if let Some(&Some(h)) = step.own.get(at) {
            plan.ask(at, h);
        }
    }
    Some(plan)
}

/// Runs `steps` through a fresh memory store and `redis` (which must take
/// the caller's clock), starting at `start`, and panics at the first step
/// whose answers differ, showing both.
pub async fn conform(redis: &RedisStore, items: &[Item], start: Nanos, steps: &[Step]) {
    let memory = MemoryStore::new();
    let mut now = start;
    for (n, step) in steps.iter().enumerate() {
        now = now.saturating_add(step.advance);
        let Some(plan) = plan_of(items, step) else {
            continue;
        };
        let want = memory.decide_now(&plan, now, step.request, step.mode);
        let got = redis.decide(&plan, now, step.request, step.mode).await;
        assert_eq!(
            got,
            want,
            "step {n} at +{} ({step:?}) differs: Redis (left) vs memory (right)\nitems: {items:?}",
            now.saturating_sub(start)
        );
    }
}

/// A runtime for tests that drive async stores from synchronous code
/// (proptest bodies).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A `Try` request for between `min` and `hits` against `items`.
pub fn ask(advance: Nanos, min: u64, hits: u64, items: &[usize]) -> Step {
    Step {
        advance,
        request: Hits::between(min, hits),
        mode: Mode::Try,
        items: items.to_vec(),
        own: Vec::new(),
    }
}

/// An `Acquire` of `hits` against `items`.
pub fn acquire(advance: Nanos, hits: u64, items: &[usize]) -> Step {
    Step {
        advance,
        request: Hits::exactly(hits),
        mode: Mode::Acquire,
        items: items.to_vec(),
        own: Vec::new(),
    }
}

/// A `Report` of `hits` against `items`: usage told after the fact.
pub fn report(advance: Nanos, hits: u64, items: &[usize]) -> Step {
    Step {
        advance,
        request: Hits::exactly(hits),
        mode: Mode::Report,
        items: items.to_vec(),
        own: Vec::new(),
    }
}

/// A `Refund` of `hits` against `items`.
pub fn refund(advance: Nanos, hits: u64, items: &[usize]) -> Step {
    Step {
        advance,
        request: Hits::exactly(hits),
        mode: Mode::Refund,
        items: items.to_vec(),
        own: Vec::new(),
    }
}

/// Checks `steps` against the memory store on a redis-server of their own
/// (a store taking the caller's clock), from a synchronous proptest body.
pub fn conform_on_a_new_server(items: &[Item], start: Nanos, steps: &[Step]) {
    runtime().block_on(async {
        let server = RedisServer::start();
        let redis = caller_clock_store(&server).await;
        conform(&redis, items, start, steps).await;
    });
}

/// The items the property tests mix: `first` and `second` for acme (the
/// second in shadow mode when `shadow`), then the GCRA limit `g` (count,
/// period in milliseconds, burst) in `g_scope`: items 1, 2 and 3.
pub fn mixed_items(
    first: Limit,
    second: Limit,
    shadow: bool,
    g: (u64, u64, u64),
    g_scope: &str,
) -> Vec<Item> {
    let mut second = Item::new(second, 2, "acme");
    if shadow {
        second = second.shadow();
    }
    vec![
        Item::new(first, 1, "acme"),
        second,
        Item::new(gcra(g.0, Nanos::from_millis(g.1), g.2), 3, g_scope),
    ]
}

/// Property steps without item 3 unless `three` (a step left with no item
/// asks item 0), and, when `coarse`, advancing whole milliseconds, so that
/// steps land exactly on window edges and the algorithm's other edges.
pub fn shaped_steps(steps: Vec<Step>, three: bool, coarse: bool) -> Vec<Step> {
    steps
        .into_iter()
        .map(|mut s| {
            if !three {
                s.items.retain(|&i| i != 3);
                if s.items.is_empty() {
                    s.items.push(0);
                }
            }
            if coarse {
                s.advance = Nanos::from_millis(s.advance.as_u64() / 1_000_000);
            }
            s
        })
        .collect()
}

/// Reserves copies of `pool` for `domain` at time zero, as one new
/// operation.
pub async fn reserve_as(
    s: &RedisStore,
    pool: &PoolKey,
    l: &CopyLimits,
    domain: &str,
    request: Hits,
) -> Result<Reservation, StoreError> {
    s.reserve(pool, l, domain, request, Nanos::ZERO, OpId::random())
        .await
}

/// Proptest strategies shared by the conformance tests.
pub mod strategies {
    use proptest::prelude::*;
    use tollgate_core::{Hits, Mode, Nanos};

    use super::Step;

    /// A step over a plan of `items` items: a random advance up to
    /// `max_advance`, up to `max_hits` hits with a random minimum (now and
    /// then a malformed one), `Acquire` about one time in `acquire_one_in`
    /// (never if 0), a report or a refund one time in eight each (refused
    /// alike by both stores for algorithms without a sound debt), and a
    /// random non-empty subset of the items.
    pub fn step(
        items: usize,
        max_advance: u64,
        max_hits: u64,
        acquire_one_in: u32,
    ) -> impl Strategy<Value = Step> {
        (
            prop_oneof![3 => Just(0u64), 7 => 0..=max_advance],
            0..=max_hits,
            0..=max_hits.saturating_add(1),
            0..acquire_one_in.max(1),
            proptest::collection::vec(any::<bool>(), items),
            0u8..8,
            // Now and then, items asked hits of their own.
            proptest::collection::vec(proptest::option::weighted(0.15, 0..=max_hits), items),
        )
            .prop_map(move |(advance, hits, min, acq, mask, usage, own)| {
                let mut chosen: Vec<usize> = (0..items).filter(|&i| mask[i]).collect();
                if chosen.is_empty() {
                    chosen.push(0);
                }
                // Mostly well-formed requests; min > hits now and then.
                let min_hits = if min > hits && min % 4 != 0 {
                    hits
                } else {
                    min
                };
                let mode = if acquire_one_in > 0 && acq == 0 {
                    Mode::Acquire
                } else {
                    match usage {
                        0 => Mode::Report,
                        1 => Mode::Refund,
                        _ => Mode::Try,
                    }
                };
                Step {
                    advance: Nanos::new(advance),
                    request: Hits::between(min_hits, hits),
                    own: chosen.iter().map(|&i| own[i]).collect(),
                    mode,
                    items: chosen,
                }
            })
    }
}

/// Waits until `check` holds, polling; panics after `limit` (a bound on a
/// hung test, not a timing assertion: the behaviour is that it happens).
pub async fn eventually<F, Fut>(limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    tollgate_testing::eventually_async("the condition holds", limit, || {
        let holds = check();
        async move {
            if holds.await {
                Ok(())
            } else {
                Err("it does not yet".to_owned())
            }
        }
    })
    .await;
}

/// A GCRA limit of `count` per `period` with `burst`: the second limit of
/// many conformance plans.
pub fn gcra(count: u64, period: Nanos, burst: u64) -> Limit {
    Limit::Gcra(
        tollgate_core::Gcra::new(tollgate_core::Rate::new(count, period).unwrap(), burst).unwrap(),
    )
}

/// Runs `steps` on a store of its own, so scenarios never share keys.
pub async fn run(server: &RedisServer, items: &[Item], steps: &[Step]) {
    let redis = caller_clock_store(server).await;
    conform(&redis, items, T0, steps).await;
}

/// Decides `steps` on a Redis store of its own and checks after each that
/// every key of the plan lives at least as long as its decision's
/// `reset_after` (the time until the state is idle), and that an idle state
/// is gone. `conform` cannot see a key that expires too soon: the store
/// expires keys in real time, which a test's steps barely spend.
pub async fn check_ttls(server: &RedisServer, items: &[Item], steps: &[Step]) {
    let prefix = unique_prefix();
    let mut o = RedisOptions::new(server.url());
    o.prefix = prefix.clone();
    o.clock = ScriptClock::Caller;
    o.connect.response_timeout = Duration::from_secs(5);
    let redis = RedisStore::connect(o).await.unwrap();
    let mut now = T0;
    for (n, step) in steps.iter().enumerate() {
        now = now.saturating_add(step.advance);
        let Some(plan) = plan_of(items, step) else {
            continue;
        };
        let Ok(d) = redis.decide(&plan, now, step.request, step.mode).await else {
            continue;
        };
        for (k, &i) in step.items.iter().enumerate() {
            let key = &items[i].key;
            // RedisStore's key layout: prefix, {affinity}, limit id, scope.
            let name = format!("{prefix}{{{:016x}}}:l:{}:{}", 7, key.limit, key.scope());
            let pttl: i64 = server
                .command(&format!("PTTL {name}"))
                .trim_start_matches(':')
                .parse()
                .unwrap();
            let reset = d.decisions[k].reset_after;
            if reset.is_zero() {
                assert_eq!(pttl, -2, "step {n}: {name} is idle, yet kept");
            } else {
                let ttl = u64::try_from(pttl).unwrap_or(0).saturating_mul(1_000_000);
                assert!(
                    ttl >= reset.as_u64(),
                    "step {n}: {name} expires in {pttl} ms, before its reset_after {reset:?}"
                );
            }
        }
    }
}

/// The milliseconds left before the state key of limit `id` expires, if
/// the key exists.
pub fn pttl(con: &mut redis::Connection, id: u64) -> Option<i64> {
    let pattern = format!("*:l:{id:016x}:*");
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(con).unwrap();
    assert!(keys.len() <= 1, "{keys:?}");
    keys.first()
        .map(|k| redis::cmd("PTTL").arg(k).query(con).unwrap())
}
