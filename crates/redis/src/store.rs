//! [`RedisStore`]: limit state in Redis, decided by Lua scripts.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis::{ErrorKind, RedisError, Script};
use smallvec::SmallVec;
use tollgate_core::copies::{
    normalize_groups, CopyContext, CopyError, CopyLimits, GroupContext, Groups, Reservation,
    Staged, TransferId,
};

use crate::copies::{refusal, Pools};
use crate::copylog::{self, Beat, CopyLog, Resignation};
use tollgate_core::{plan, Hits, Mode, Nanos, PlanDecision};
use tollgate_store::{
    Admit, Held, LimitId, OpId, Plan, PoolKey, Refusal, Seized, Store, StoreError,
};

use crate::batch::{self, Ask, Batcher, Encoder, Failure};
use crate::cache::{CacheClock, CacheStats, RejectionCache};
use crate::conn::{redact, Conn, ConnectError, ConnectOptions, RedisTarget};
use crate::params::{self, MAX_EXACT};
use crate::reply;
use crate::script;

/// Whose clock the scripts decide by: Redis's own, or the time the caller
/// passes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum ScriptClock {
    /// Redis's `TIME`, read inside every script: servers with skewed clocks
    /// still agree. The default, and the only sane choice for a fleet.
    #[default]
    Redis,
    /// The `now` the caller passes. For tests that must control time (the
    /// conformance suite) and for replaying traces; never for a fleet.
    Caller,
}

/// How the store is set up. `Debug` shows the URL without its password.
#[derive(Clone)]
pub struct RedisOptions {
    /// `redis://`, `rediss://`, `redis-cluster://`, `rediss-cluster://`,
    /// `redis-sentinel://` or `rediss-sentinel://`.
    pub url: String,
    /// Prepended to every key, so one Redis can serve several deployments.
    /// Must not contain `{` or `}` (they would break cluster hash tags).
    pub prefix: String,
    /// Connections, timeouts and reconnection.
    pub connect: ConnectOptions,
    /// How long a server's heartbeat lasts: when it lapses, another server
    /// releases the holds of the dead one's clients. Heartbeats are sent
    /// every third of it.
    pub heartbeat_ttl: Duration,
    /// Whose clock the scripts decide by.
    pub clock: ScriptClock,
    /// Entries of the local over-limit cache (keys Redis rejected, answered
    /// here until they could admit again, exactly as Redis would; see
    /// `docs/redis.md`); 0 turns it off.
    pub rejection_cache: usize,
    /// The longest an entry of the over-limit cache lives, however far
    /// off its key could admit again: how long a Redis that lost the key
    /// (flushed, failed over, evicted) may still be answered by the
    /// state it had (see `docs/redis.md`); zero turns the cache off.
    pub rejection_cache_max_age: Duration,
    /// Decisions that may wait to be sent to a single Redis; one more is
    /// shed at once with an answer that says so (see `docs/redis.md`).
    pub max_waiting: usize,
    /// With Redis Sentinel: the sentinels' own password, for sentinels
    /// that require one (`requirepass` in their config). The URL's
    /// credentials, and [`ConnectOptions::password`], are the master's.
    /// Ignored without Sentinel. Never shown.
    pub sentinel_password: Option<String>,
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured so that a new field cannot be printed by accident;
        // the URL may carry the password (`redis://:secret@host`).
        let RedisOptions {
            url,
            prefix,
            connect,
            heartbeat_ttl,
            clock,
            rejection_cache,
            rejection_cache_max_age,
            max_waiting,
            sentinel_password,
        } = self;
        f.debug_struct("RedisOptions")
            .field("url", &redact(url))
            .field("prefix", prefix)
            .field("connect", connect)
            .field("heartbeat_ttl", heartbeat_ttl)
            .field("clock", clock)
            .field("rejection_cache", rejection_cache)
            .field("rejection_cache_max_age", rejection_cache_max_age)
            .field("max_waiting", max_waiting)
            .field(
                "sentinel_password",
                &sentinel_password.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

/// [`RedisOptions::rejection_cache`] by default.
pub const DEFAULT_REJECTION_CACHE: usize = 65_536;

/// [`RedisOptions::rejection_cache_max_age`] by default: a hot rejected
/// key costs Redis one call a second per server, and a Redis that lost its
/// data is over-rejected for at most a second (`docs/redis.md` says why).
pub const DEFAULT_REJECTION_CACHE_MAX_AGE: Duration = Duration::from_secs(1);

/// [`RedisOptions::max_waiting`] by default.
pub const DEFAULT_MAX_WAITING: usize = 8_192;

impl RedisOptions {
    /// Options for `url` with every other setting at its default.
    pub fn new(url: impl Into<String>) -> RedisOptions {
        RedisOptions {
            url: url.into(),
            prefix: "tollgate:".into(),
            connect: ConnectOptions::default(),
            heartbeat_ttl: Duration::from_secs(5),
            clock: ScriptClock::Redis,
            rejection_cache: DEFAULT_REJECTION_CACHE,
            rejection_cache_max_age: DEFAULT_REJECTION_CACHE_MAX_AGE,
            max_waiting: DEFAULT_MAX_WAITING,
            sentinel_password: None,
        }
    }

    /// Checks everything [`RedisStore::connect`] checks before it opens a
    /// connection, and opens none: the key prefix, the URL, and the TLS
    /// material (present only with a TLS URL, certificates and key that
    /// parse and match). `tollgate serve --check` runs it; `connect` runs
    /// it first, so both refuse the same options with the same error.
    pub fn check(&self) -> Result<RedisTarget, ConnectError> {
        if self.prefix.contains(['{', '}']) {
            return Err(ConnectError::BadPrefix {
                prefix: self.prefix.clone(),
            });
        }
        let mut target = RedisTarget::parse(&self.url)?;
        if let RedisTarget::Sentinel(s) = &mut target {
            s.set_sentinel_password(self.sentinel_password.clone());
        }
        crate::conn::checked_tls(&target, &self.connect)?;
        Ok(target)
    }
}

/// The Redis [`Store`]: every decision is one Lua script call that reads,
/// decides and writes all of a plan's keys atomically inside Redis. See
/// the [crate docs](crate). Clones share the connections and the health.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) conn: Conn,
    prefix: String,
    clock: ScriptClock,
    url: String,
    timeout: Duration,
    /// Writes `decide` calls.
    encoder: Arc<Encoder>,
    /// Batches concurrent decisions into shared calls (single Redis only).
    batcher: Option<Batcher>,
    /// Keys Redis rejected, answered locally until they could admit again.
    cache: Option<Arc<RejectionCache>>,
    /// Decisions shed because too many waited to be sent.
    shed: Arc<AtomicU64>,
    /// Whether the last command reached Redis; `/readyz` reads it.
    up: Arc<AtomicBool>,
    /// This server's place in the copy log.
    pub(crate) log: Arc<CopyLog>,
    /// What this server holds, pool by pool (crate::copies).
    pub(crate) pools: Arc<Pools>,
    /// Whether a sweep is running.
    sweeping: Arc<AtomicBool>,
    /// Failovers followed (Sentinel).
    master_changes: Arc<AtomicU64>,
}

/// Gauge: 1 while Redis answers, 0 while it does not.
const UP_GAUGE: &str = "tollgate_store_up";
/// Counter: commands that failed to reach Redis or timed out.
const ERRORS_COUNTER: &str = "tollgate_store_errors_total";
/// Counter: decisions shed because too many waited to be sent.
const SHED_COUNTER: &str = "tollgate_store_decisions_shed_total";
/// Counter: decisions answered by the local over-limit cache.
const CACHE_HITS_COUNTER: &str = "tollgate_store_rejection_cache_hits_total";
/// Gauge: entries in the local over-limit cache.
const CACHE_ENTRIES_GAUGE: &str = "tollgate_store_rejection_cache_entries";
/// Counter: cache entries dropped to make room for others.
const CACHE_EVICTIONS_COUNTER: &str = "tollgate_store_rejection_cache_evictions_total";
/// Counter: failovers followed to a new master named by the sentinels.
const MASTER_CHANGES_COUNTER: &str = "tollgate_store_master_changes_total";

/// How often `tollgate serve` asks the sentinels for the master
/// ([`RedisStore::monitor`]'s interval there): the grace after a failover
/// assumes it until the monitor says otherwise.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to Redis and checks that it answers.
    pub async fn connect(options: RedisOptions) -> Result<RedisStore, ConnectError> {
        let target = options.check()?;
        // Decisions are bounded by `response_timeout` here: by the
        // drivers, as Redis's silence (single Redis), or in
        // `decide_alone` (cluster). Other commands wait up to a heartbeat
        // TTL, so a beat or a cleanup that Redis answers slowly under load
        // still counts (a server resigns only when Redis gave no answer
        // for a TTL).
        let mut connect = options.connect.clone();
        connect.response_timeout = connect.response_timeout.max(options.heartbeat_ttl);
        let conn = Conn::open(&target, &connect).await?;
        let log = Arc::new(CopyLog::new(&options.prefix, options.heartbeat_ttl));
        if let Some(follow) = conn.follow_bound(FOLLOW_INTERVAL) {
            log.set_grace(follow);
        }
        let released = log
            .join(&conn)
            .await
            .map_err(|cause| ConnectError::Connect {
                url: redact(&options.url),
                cause,
            })?;
        tracing::info!(server = %log.id, released, "joined the copy log");
        let decide = Script::new(script::DECIDE);
        let encoder = Arc::new(Encoder::new(&options.prefix, &decide));
        let batcher = (!conn.is_cluster()).then(|| {
            Batcher::start(
                conn.links(),
                Arc::clone(&encoder),
                options.connect.response_timeout,
                options.max_waiting.max(1),
            )
        });
        // An entry that may live no time could never answer: no cache.
        let on = options.rejection_cache > 0 && !options.rejection_cache_max_age.is_zero();
        let cache = on.then(|| {
            let clock = match options.clock {
                ScriptClock::Caller => CacheClock::Caller,
                ScriptClock::Redis => CacheClock::Local(std::time::Instant::now()),
            };
            let max_age =
                u64::try_from(options.rejection_cache_max_age.as_nanos()).unwrap_or(u64::MAX);
            Arc::new(RejectionCache::new(
                options.rejection_cache,
                clock,
                Nanos::new(max_age),
            ))
        });
        Ok(RedisStore {
            log,
            conn,
            prefix: options.prefix,
            clock: options.clock,
            url: redact(&options.url),
            timeout: options.connect.response_timeout,
            batcher,
            encoder,
            cache,
            shed: Arc::default(),
            up: Arc::new(AtomicBool::new(true)),
            pools: Arc::default(),
            sweeping: Arc::default(),
            master_changes: Arc::default(),
        })
    }

    /// Registers descriptions of the store's metrics with the installed
    /// `metrics` recorder.
    pub fn describe_metrics() {
        metrics::describe_gauge!(
            UP_GAUGE,
            "1 while the Redis store answers, 0 while it does not."
        );
        metrics::describe_counter!(
            ERRORS_COUNTER,
            "Redis store commands that failed to reach Redis or timed out."
        );
        metrics::describe_counter!(
            SHED_COUNTER,
            "Redis store decisions shed (answered store_overloaded at once) because the most \
             decisions that may wait for Redis already did."
        );
        metrics::describe_counter!(
            CACHE_HITS_COUNTER,
            "Redis store decisions answered by the local over-limit cache, without Redis."
        );
        metrics::describe_gauge!(
            CACHE_ENTRIES_GAUGE,
            "Keys in the Redis store's local over-limit cache."
        );
        metrics::describe_counter!(
            MASTER_CHANGES_COUNTER,
            "Failovers the Redis store followed to a new master named by Redis Sentinel."
        );
        metrics::describe_counter!(
            CACHE_EVICTIONS_COUNTER,
            "Entries of the Redis store's local over-limit cache dropped to make room for others."
        );
    }

    /// What the local over-limit cache counted (all zero when it is off).
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.as_ref().map(|c| c.stats()).unwrap_or_default()
    }

    /// Drops every entry of the over-limit cache: Redis lost its data
    /// (or went back to an older state), so a key it rejected may admit
    /// again now.
    pub(crate) fn forget_rejections(&self) {
        if let Some(c) = &self.cache {
            c.clear();
        }
    }

    /// Decisions shed so far because too many waited to be sent.
    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// Writes the counters the store keeps itself to the metrics, and
    /// drops the cache's lapsed entries.
    fn publish(&self) {
        metrics::counter!(SHED_COUNTER).absolute(self.shed());
        if let Some(c) = &self.cache {
            c.purge_lapsed();
        }
        let stats = self.cache_stats();
        metrics::counter!(CACHE_HITS_COUNTER).absolute(stats.hits);
        metrics::gauge!(CACHE_ENTRIES_GAUGE).set(stats.entries as f64);
        metrics::counter!(CACHE_EVICTIONS_COUNTER).absolute(stats.evictions);
    }

    /// Pings Redis every `interval` until the returned future is dropped,
    /// so readiness comes back when Redis does even with no traffic (a
    /// server that is not ready gets none). With Redis Sentinel it also
    /// asks the sentinels for the master every `interval`, and follows a
    /// failover ([`RedisStore::follow_master`]).
    pub async fn monitor(&self, interval: Duration) {
        tokio::join!(self.ping(interval), self.follow(interval));
    }

    /// Asks the sentinels for the master every `interval` (Sentinel only)
    /// until the returned future is dropped.
    async fn follow(&self, interval: Duration) {
        let Some(follow) = self.conn.follow_bound(interval) else {
            return;
        };
        // Asked every `interval`, this server may take that much longer
        // to follow a failover than the grace assumed.
        self.log
            .set_grace(follow.max(self.conn.follow_bound(FOLLOW_INTERVAL).unwrap_or_default()));
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Sentinels that cannot be asked are logged once, not every tick.
        let mut failing = false;
        loop {
            tick.tick().await;
            match self.try_follow().await {
                Ok(_) if failing => {
                    tracing::info!(url = %self.url, "the sentinels answer again");
                    failing = false;
                }
                Ok(_) => {}
                Err(e) => {
                    if !failing {
                        tracing::warn!(url = %self.url, error = %e, "cannot ask the sentinels for the master");
                    }
                    failing = true;
                }
            }
        }
    }

    /// With Redis Sentinel: asks the sentinels which server is the master
    /// now and, when it is a new one (a failover), moves every connection
    /// there, then treats the new master as one that may have lost the
    /// last writes: the over-limit cache is cleared and this server's
    /// holds are counted again in every pool from its own record
    /// (`docs/redis.md`, "Redis Sentinel"). Whether the connections
    /// moved; `false` without Sentinel, when the master is the same, or
    /// when the sentinels could not be asked (logged; the next call tries
    /// again).
    pub async fn follow_master(&self) -> bool {
        self.try_follow().await.unwrap_or_else(|e| {
            tracing::warn!(url = %self.url, error = %e, "cannot ask the sentinels for the master");
            false
        })
    }

    /// [`RedisStore::follow_master`], with the sentinels' error.
    async fn try_follow(&self) -> Result<bool, RedisError> {
        match self.conn.follow_master().await? {
            None => Ok(false),
            Some(master) => {
                metrics::counter!(MASTER_CHANGES_COUNTER).increment(1);
                self.master_changes.fetch_add(1, Ordering::Relaxed);
                // The promoted replica may lack the last writes the old
                // master acknowledged (replication is asynchronous): a key
                // the cache rejects may admit there, and a pool may miss
                // this server's last operations.
                self.forget_rejections();
                tracing::warn!(url = %self.url, master = %master, server = %self.log.id, "the sentinels name a new master: connections moved there; the over-limit cache is cleared and this server's holds are counted again pool by pool");
                let store = self.clone();
                tokio::spawn(async move {
                    store.beat_after_switch().await;
                    // Declared dead meanwhile: it holds nothing to count.
                    if !store.log.is_resigned() {
                        store.recover().await;
                    }
                });
                Ok(true)
            }
        }
    }

    /// Beats on the new master at once after a failover, rather than at
    /// the next tick of the heartbeat (which may still wait for a beat
    /// sent to the old master): the first beat there starts the grace in
    /// which nobody is declared dead, and each live server must beat
    /// within it (`lua/servers.lua`). Tried again until the new master
    /// answers, for at most the grace; a server that was declared dead
    /// meanwhile resigns here.
    async fn beat_after_switch(&self) {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            match self.log.beat(&self.conn).await {
                Err(_) => return,
                Ok(Beat::Rejoined) => return self.lost_live_set(),
                Ok(Beat::Renewed) => return,
                Ok(Beat::Failed) if started.elapsed() >= self.log.grace() => return,
                Ok(Beat::Failed) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// The master's address (`host:port`) as the sentinels last named it;
    /// `None` without Sentinel.
    pub fn master(&self) -> Option<String> {
        self.conn.master_addr()
    }

    /// Failovers this server followed since it connected.
    pub fn master_changes(&self) -> u64 {
        self.master_changes.load(Ordering::Relaxed)
    }

    /// Pings Redis every `interval` until the returned future is dropped.
    async fn ping(&self, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let cmd = redis::cmd("PING");
        loop {
            tick.tick().await;
            // Both series are written on every tick, not only on a change,
            // so they exist from the start whenever the recorder was
            // installed: a Redis that never failed shows as up with no
            // errors, not as no data.
            let up = self.up.load(Ordering::Relaxed);
            metrics::gauge!(UP_GAUGE).set(if up { 1.0 } else { 0.0 });
            metrics::counter!(ERRORS_COUNTER).increment(0);
            self.publish();
            let ping = self.conn.query::<String>(&cmd);
            match tokio::time::timeout(self.timeout.max(Duration::from_millis(200)), ping).await {
                Ok(Ok(_)) => self.mark(true),
                Ok(Err(e)) => {
                    if self.up.load(Ordering::Relaxed) {
                        tracing::warn!(url = %self.url, error = %e, "Redis is unreachable");
                    }
                    self.mark(false);
                }
                Err(_) => self.mark(false),
            }
        }
    }

    pub(crate) fn mark(&self, up: bool) {
        let was = self.up.swap(up, Ordering::Relaxed);
        if was != up {
            metrics::gauge!(UP_GAUGE).set(if up { 1.0 } else { 0.0 });
            if up {
                tracing::info!(url = %self.url, "Redis answers again");
            }
        }
        if !up {
            metrics::counter!(ERRORS_COUNTER).increment(1);
        }
    }

    /// This server's id in the copy log.
    pub fn server_id(&self) -> &str {
        &self.log.id
    }

    /// Sends heartbeats and cleans up after dead servers until this server
    /// resigns (declared dead by another); from then on it refuses to hold
    /// copies. The caller decides whether to exit. A heartbeat that finds
    /// Redis lost the live set joins again and counts this server's holds
    /// again ([`RedisStore::recover`]).
    pub async fn heartbeat(&self) -> Resignation {
        let mut tick = tokio::time::interval(self.log.ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.log.is_resigned() {
                return self.log.resign("resigned");
            }
            match self.log.beat(&self.conn).await {
                Err(r) => return r,
                Ok(Beat::Rejoined) => self.lost_live_set(),
                Ok(Beat::Renewed | Beat::Failed) => {}
            }
            let now = std::time::Instant::now();
            for a in self.log.take_cleaned() {
                self.pools.due_at(a, now);
            }
        }
    }

    /// One sweep, waited for (the [`Store::sweep`] the server runs does
    /// this in a task of its own): due transfers expired, registrations of
    /// pools held no more withdrawn. Bounded in time: one short attempt
    /// per pool.
    pub async fn sweep_now(&self, now: Nanos) {
        self.expire_due(now).await;
    }

    /// Pools this server keeps state for (holds, registration or due
    /// transfers): bounded by the pools it holds copies in.
    pub fn tracked_pools(&self) -> usize {
        self.pools.len()
    }

    /// Notes a failure that is not an answer (no reply, a broken
    /// connection): marks the store down when Redis could not be reached.
    pub(crate) fn note_failure(&self, e: &RedisError) {
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
        {
            self.mark(false);
        }
    }

    /// The URL, without its password.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    fn clock_args(&self, now: Nanos) -> (String, String) {
        match self.clock {
            ScriptClock::Redis => (String::new(), String::new()),
            ScriptClock::Caller => {
                let n = now.as_u64();
                (
                    (n / 1_000_000_000).to_string(),
                    (n % 1_000_000_000).to_string(),
                )
            }
        }
    }

    /// Runs `decide` for `plan`: from the local over-limit cache when it
    /// knows Redis's answer, else in a batched call (a single Redis) or a
    /// call of its own (a cluster). An `inspect` (zero hits, `Mode::Try`)
    /// always asks Redis, which writes nothing back, and teaches the cache
    /// nothing.
    async fn decide_plan(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Hits,
        mode: Mode,
        inspect: bool,
    ) -> Result<PlanDecision, StoreError> {
        if plan.is_empty() {
            return Ok(plan::decide(&mut [], now, request, mode)?);
        }
        exact(plan, request, inspect)?;
        let cache = self.cache.as_ref().filter(|_| !inspect);
        if let (Some(cache), Mode::Try) = (cache, mode) {
            if let Some(d) = cache.answer(plan, cache.now(now), request) {
                return Ok(d);
            }
        }
        let ask = self.ask(request, mode, inspect, now);
        // Before the call is sent: should the store find meanwhile that
        // Redis lost its data, the answer may describe what was lost.
        let generation = cache.map_or(0, |c| c.generation());
        let answer = match &self.batcher {
            Some(b) => b.decide(plan, ask).await,
            None => self.decide_alone(plan, ask).await,
        };
        match answer {
            Ok((d, sent)) => {
                self.mark(true);
                if let Some(cache) = cache {
                    // Counted from when the call was sent: Redis decided
                    // then or later, so an entry never outlives the state
                    // it describes (it lapses early by the call's wait in
                    // Redis and the network, toward asking Redis).
                    cache.learn(plan, &d, request, cache.at(now, sent), generation);
                }
                Ok(d)
            }
            Err(f) => Err(self.failed(f)),
        }
    }

    /// What the script is asked of a plan besides it, at this server's
    /// `now` (sent as the script's time with the caller's clock).
    fn ask(&self, request: Hits, mode: Mode, inspect: bool, now: Nanos) -> Ask {
        Ask {
            request,
            mode,
            inspect,
            now: (self.clock == ScriptClock::Caller).then_some(now),
            server_now: now,
        }
    }

    /// What a decision that got no answer (`f`) is to the caller, counted
    /// and marked as it says of Redis.
    fn failed(&self, f: Failure) -> StoreError {
        match f {
            Failure::Store(e @ StoreError::Unavailable(_)) => {
                // A reply of the wrong shape: Redis answered, but nonsense.
                // Counted as a failed command; says nothing of whether
                // Redis is up.
                metrics::counter!(ERRORS_COUNTER).increment(1);
                e
            }
            Failure::Store(e) => {
                // The script refused the plan: Redis is up.
                self.mark(true);
                e
            }
            Failure::Redis(e) => self.unavailable(e),
            Failure::Switched => {
                // Not an outage: the store moved to a new master, which
                // answers. Counted as a failed command.
                metrics::counter!(ERRORS_COUNTER).increment(1);
                StoreError::Unavailable(format!(
                    "the Redis master changed (a Sentinel failover) while this decision was in \
                     flight ({}): the old master may or may not have counted it",
                    self.url
                ))
            }
            Failure::Overloaded(most) => {
                // An answer, not an outage (the store stays up): clients
                // retry rather than fail open.
                self.shed.fetch_add(1, Ordering::Relaxed);
                StoreError::Overloaded(most)
            }
        }
    }

    /// [`Store::decide_together`]: the parts in one `decide` call, which
    /// Redis runs as one script, so a failure (a timeout, a dropped
    /// connection, a failover) leaves every part decided or none. On a
    /// single Redis the call goes through the batcher as one job (never
    /// split across calls), with its shedding and its silence timer; on a
    /// cluster it is a call of its own, as every decision there is. A part
    /// the script would refuse whatever the state (report or refund to a
    /// limit without a sound debt; acquire, whose refusals depend on the
    /// state, is not taken) is refused here before anything is sent: the
    /// script would refuse that part alone and decide the others.
    async fn decide_parts(
        &self,
        parts: &[(&Plan, Hits, Mode)],
        now: Nanos,
    ) -> Result<SmallVec<[PlanDecision; 3]>, StoreError> {
        let mut asks: SmallVec<[(&Plan, Ask); 3]> = SmallVec::new();
        for &(plan, request, mode) in parts {
            if mode == Mode::Acquire {
                return Err(StoreError::Unsupported(
                    "plans decided together are checks and usage, never scheduled".into(),
                ));
            }
            if let Some(e) = plan.usage_refusal(mode) {
                return Err(StoreError::Plan(e));
            }
            exact(plan, request, false)?;
            if !plan.is_empty() {
                asks.push((plan, self.ask(request, mode, false, now)));
            }
        }
        let cache = self.cache.as_ref();
        let generation = cache.map_or(0, |c| c.generation());
        let answered = if asks.is_empty() {
            Ok((SmallVec::new(), std::time::Instant::now()))
        } else {
            match &self.batcher {
                Some(b) => {
                    let plans = asks.iter().map(|(p, a)| (Plan::clone(p), *a)).collect();
                    b.decide_together(plans).await
                }
                None => self.decide_all(&asks).await,
            }
        };
        let (decided, sent) = answered.map_err(|f| self.failed(f))?;
        if !asks.is_empty() {
            self.mark(true);
        }
        let mut answers = decided.into_iter();
        let mut out = SmallVec::new();
        for &(plan, request, mode) in parts {
            if plan.is_empty() {
                out.push(plan::decide(&mut [], now, request, mode)?);
                continue;
            }
            let d = answers.next().ok_or_else(|| {
                StoreError::Unavailable("a decide call answered too few plans".into())
            })?;
            if let Some(cache) = cache {
                cache.learn(plan, &d, request, cache.at(now, sent), generation);
            }
            out.push(d);
        }
        Ok(out)
    }

    /// [`Store::holds`]: one `HMGET` of the pool's counts (`lua/copies.lua`
    /// keeps them summed: `g` everyone's, `d:<domain>` and `G:<group>`),
    /// which reads only. Staged transfers count as held until seized or
    /// released, as they do for a reserve.
    async fn read_holds(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
    ) -> Result<CopyContext, StoreError> {
        let a = copylog::affinity(&pool.0);
        let [key, ..] = self.log.pool_keys(a, None);
        let groups = limits.groups_of(domain);
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(&key).arg("g").arg(format!("d:{domain}"));
        for g in &groups {
            cmd.arg(format!("G:{g}"));
        }
        let counts =
            match tokio::time::timeout(self.timeout, self.conn.query::<Vec<Option<u64>>>(&cmd))
                .await
            {
                Ok(Ok(counts)) => counts,
                Ok(Err(e)) => return Err(self.unavailable(e)),
                Err(_) => return Err(self.unavailable(batch::timed_out(self.timeout))),
            };
        self.mark(true);
        let count = |i: usize| counts.get(i).copied().flatten().unwrap_or(0);
        // The limits are filled in by `against`, the core's own rule.
        let holds = CopyContext {
            domain_limit: 0,
            global_limit: None,
            global_holds: count(0),
            domain_holds: count(1),
            groups: groups
                .into_iter()
                .enumerate()
                .map(|(i, name)| GroupContext {
                    limit: 0,
                    holds: count(i + 2),
                    name,
                })
                .collect(),
        };
        Ok(holds.against(limits, domain))
    }

    /// [`Store::reset`]: one `DEL` of every key of `plan` (one slot: the
    /// plan's affinity is their hash tag), then the over-limit cache
    /// forgets them, so the next decision of each asks Redis and finds a
    /// fresh state. The cache forgets after Redis answered: a rejection
    /// learnt from a call sent before the `DEL` is dropped, and one
    /// answered after it belongs to a call sent before, which the cache's
    /// new generation keeps it from learning.
    async fn reset_plan(&self, plan: &Plan) -> Result<(), StoreError> {
        if plan.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("DEL");
        let mut buf = Vec::new();
        for item in plan.items() {
            buf.clear();
            batch::write_state_key(&mut buf, &self.prefix, plan.affinity(), &item.key);
            cmd.arg(&buf[..]);
        }
        let deleted = match tokio::time::timeout(self.timeout, self.conn.query::<i64>(&cmd)).await {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(self.unavailable(e)),
            Err(_) => return Err(self.unavailable(batch::timed_out(self.timeout))),
        };
        self.mark(true);
        if let Some(cache) = &self.cache {
            cache.forget(plan.items().iter().map(|item| &item.key));
        }
        tracing::debug!(keys = plan.len(), deleted, "counters reset");
        Ok(())
    }

    /// One plan in a call of its own (Redis Cluster), waiting up to the
    /// timeout for it.
    async fn decide_alone(&self, plan: &Plan, ask: Ask) -> batch::Answer {
        let (mut answers, sent) = self.decide_all(&[(plan, ask)]).await?;
        let d = answers.pop().ok_or_else(|| {
            Failure::Store(StoreError::Unavailable(
                "a decide call answered no plan".into(),
            ))
        })?;
        Ok((d, sent))
    }

    /// Several plans in one `decide` call of their own (one script run),
    /// each answered or the call failed as a whole.
    async fn decide_all(&self, asks: &[(&Plan, Ask)]) -> batch::Answers {
        let cmd = self.encoder.command(asks.iter().map(|(p, a)| (*p, a)));
        let sent = std::time::Instant::now();
        let value = match tokio::time::timeout(self.timeout, self.conn.send_decide(&cmd)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(Failure::Redis(e)),
            Err(_) => return Err(Failure::Redis(batch::timed_out(self.timeout))),
        };
        let mut ints = Vec::new();
        let ranges = batch::parts(value, asks.iter().map(|(p, _)| p.len()), &mut ints)
            .map_err(Failure::Store)?;
        let mut out = SmallVec::with_capacity(asks.len());
        for ((plan, ask), range) in asks.iter().zip(ranges) {
            let d = reply::plan_outcome(&ints[range], plan, ask.request.hits, ask.mode)
                .map_err(Failure::Store)?;
            out.push(d);
        }
        Ok((out, sent))
    }

    /// A failure that is not an answer: Redis is unreachable, too slow, or
    /// failed. Marks the store down when Redis could not be reached.
    fn unavailable(&self, e: RedisError) -> StoreError {
        let what = match e.kind() {
            ErrorKind::Io => "cannot reach Redis",
            _ => "Redis failed",
        };
        self.note_failure(&e);
        StoreError::Unavailable(format!("{what} ({}): {e}", self.url))
    }
}

/// Refuses `request` for `plan` when the request's hits, or any an item
/// is asked of its own (an inspection asks none), are past what the
/// scripts count exactly.
fn exact(plan: &Plan, request: Hits, inspect: bool) -> Result<(), StoreError> {
    let most = plan
        .items()
        .iter()
        .filter(|_| !inspect)
        .filter_map(|it| it.hits)
        .fold(request.hits.max(request.min_hits), u64::max);
    if most >= MAX_EXACT {
        return Err(StoreError::Unsupported(format!(
            "{most} hits: the Redis store counts exactly below 2^52"
        )));
    }
    Ok(())
}

impl Store for RedisStore {
    async fn decide(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Hits,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        self.decide_plan(plan, now, request, mode, false).await
    }

    async fn decide_together(
        &self,
        parts: &[(&Plan, Hits, Mode)],
        now: Nanos,
    ) -> Result<SmallVec<[PlanDecision; 3]>, StoreError> {
        self.decide_parts(parts, now).await
    }

    async fn holds(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
        _now: Nanos,
    ) -> Result<CopyContext, StoreError> {
        self.read_holds(pool, limits, domain).await
    }

    async fn inspect(&self, plan: &Plan, now: Nanos) -> Result<PlanDecision, StoreError> {
        self.decide_plan(plan, now, Hits::exactly(0), Mode::Try, true)
            .await
    }

    async fn reset(&self, plan: &Plan, _now: Nanos) -> Result<(), StoreError> {
        self.reset_plan(plan).await
    }

    async fn reserve(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
        request: Hits,
        now: Nanos,
        op: OpId,
    ) -> Result<Reservation, StoreError> {
        let (store, pool, limits, domain) = (
            self.clone(),
            pool.clone(),
            limits.clone(),
            domain.to_owned(),
        );
        detached(async move {
            store
                .reserve_copies(&pool, &limits, &domain, request, now, op)
                .await
        })
        .await
    }

    async fn release(&self, held: Held<'_>, op: OpId) -> Result<(), StoreError> {
        let (store, owned) = (self.clone(), Owned::from(held));
        detached(async move { store.release_copies(owned.held(), op, "release").await }).await
    }

    async fn restore(&self, held: Held<'_>, op: OpId) -> Result<(), StoreError> {
        let (store, owned) = (self.clone(), Owned::from(held));
        detached(async move { store.release_copies(owned.held(), op, "restore").await }).await
    }

    async fn transfer(
        &self,
        held: Held<'_>,
        ttl: Nanos,
        now: Nanos,
        op: OpId,
    ) -> Result<TransferId, StoreError> {
        let (store, owned) = (self.clone(), Owned::from(held));
        detached(async move { store.transfer_copies(owned.held(), ttl, now, op).await }).await
    }

    async fn seize(&self, id: TransferId, now: Nanos, op: OpId) -> Result<Seized, StoreError> {
        let store = self.clone();
        detached(async move { store.seize_copies(id, now, op, true).await }).await
    }

    async fn take_back(&self, id: TransferId, now: Nanos, op: OpId) -> Result<Seized, StoreError> {
        let store = self.clone();
        detached(async move { store.seize_copies(id, now, op, false).await }).await
    }

    /// Limit states need no sweep (every write sets a TTL); staged
    /// transfers this server is to expire are released when due, and the
    /// registrations of pools it holds nothing in are withdrawn — in a task
    /// of its own, one at a time, so the server's housekeeping (leases,
    /// shutdown) never waits for Redis.
    async fn sweep(&self, now: Nanos) {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Marks the sweep over however it ends (a panic included), so
        /// that one failure does not stop every later sweep.
        struct Done(Arc<AtomicBool>);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let store = self.clone();
        tokio::spawn(async move {
            let _done = Done(Arc::clone(&store.sweeping));
            store.sweep_now(now).await;
        });
    }

    /// Refuses rate limits the scripts cannot decide exactly
    /// ([`params::check_limit`]); keeps every copy pool (a copy limit of
    /// 2^52 or more is sent as none: no pool holds that many).
    fn admit(&self, limit: Admit<'_>) -> Result<(), Refusal> {
        match limit {
            Admit::Rate { limit, .. } => params::check_limit(limit).map_err(Refusal::limit),
            Admit::Copies(_) => Ok(()),
        }
    }

    /// Drops the over-limit cache's entries of limits no longer served
    /// (a reload; entries of a changed limit never apply anyway, this frees
    /// their room).
    fn serve_limits(&self, limits: Vec<(LimitId, Arc<tollgate_core::Limit>)>) {
        if let Some(c) = &self.cache {
            c.retain_limits(&limits);
        }
    }

    fn is_ready(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }
}

/// A limit as the copies script reads it: `inf` for none (or one too large
/// to count exactly).
fn limit_arg(limit: u64) -> String {
    if limit >= MAX_EXACT {
        "inf".to_owned()
    } else {
        limit.to_string()
    }
}

pub(crate) fn int(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

pub(crate) fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        Some(Value::Int(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// A copy operation's arguments, owned, for the task that drives it.
struct Owned {
    pool: PoolKey,
    domain: String,
    groups: Groups,
    copies: u64,
}

impl Owned {
    fn from(h: Held<'_>) -> Owned {
        Owned {
            pool: h.pool.clone(),
            domain: h.domain.to_owned(),
            groups: h.groups.clone(),
            copies: h.copies,
        }
    }

    fn held(&self) -> Held<'_> {
        Held {
            pool: &self.pool,
            domain: &self.domain,
            groups: &self.groups,
            copies: self.copies,
        }
    }
}

/// Runs a copy operation in a task of its own, so that it reaches its
/// answer (and this server's record of its holds stays right) even if the
/// caller drops the future.
async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::spawn(work).await.unwrap_or_else(|e| {
        Err(StoreError::Unavailable(format!(
            "a copy operation failed inside the server: {e}"
        )))
    })
}

impl RedisStore {
    /// Refuses new holds when this server may no longer count them.
    fn check_may_hold(&self) -> Result<(), StoreError> {
        if self.log.is_resigned() {
            return Err(StoreError::Unavailable(
                "this server resigned from the copy log (declared dead); it holds no copies".into(),
            ));
        }
        if self.log.is_suspect() {
            return Err(StoreError::Unavailable(
                "this server has not reached Redis for a heartbeat TTL; new holds are refused \
                 until it does"
                    .into(),
            ));
        }
        Ok(())
    }

    /// One copies-script call on pool `a` (whose state the caller holds
    /// locked), bounded only by the connections' own timeout. `id` makes
    /// Redis remember the reply; the call also tells Redis what this
    /// server holds there, and which remembered replies it has received.
    pub(crate) async fn copies_call(
        &self,
        a: u64,
        st: &mut crate::copies::PoolState,
        now: Nanos,
        op: &str,
        id: Option<OpId>,
        args: &[String],
    ) -> Result<Value, RedisError> {
        let (secs, nanos) = self.clock_args(now);
        let mut inv = self.log.copies.prepare_invoke();
        for k in self.log.pool_keys(a, id) {
            inv.key(k);
        }
        // Never this operation's own reply (a seize looks first under its
        // own id): that one is acknowledged once this call is answered.
        st.acks.retain(|ack| Some(*ack) != id);
        let acks = st.acks.len();
        for ack in &st.acks {
            inv.key(self.log.op_key(a, *ack));
        }
        let remember = id.map_or_else(String::new, |_| self.log.remember_ms().to_string());
        inv.arg(op)
            .arg(secs)
            .arg(nanos)
            .arg(&self.log.id)
            .arg(&st.name)
            .arg(remember)
            .arg(st.version_arg());
        for x in args {
            inv.arg(x.as_str());
        }
        let result = self.conn.invoke(&inv).await;
        // Forgotten only once Redis answered (a call that got no answer,
        // or was dropped, sends them again next time).
        if result.is_ok() {
            st.acks.drain(..acks);
        }
        result
    }

    /// How long one rate decision may wait for Redis.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Maps a copies-script refusal, or the resignation that ended a
    /// driven operation.
    fn copy_error(&self, e: RedisError, domain: &str, groups: &Groups, copies: u64) -> StoreError {
        let detail = e.detail().unwrap_or_default();
        let mut words = detail.split_whitespace();
        match refusal(&e) {
            Some("not_held") => {
                let _ = words.next();
                StoreError::Copy(CopyError::NotHeld {
                    domain: domain.to_owned(),
                    groups: groups.clone(),
                    held: words.next().and_then(|n| n.parse().ok()).unwrap_or(0),
                    requested: copies,
                })
            }
            Some("unknown_transfer") => StoreError::Copy(CopyError::UnknownTransfer),
            Some("duplicate_transfer") => {
                StoreError::Unavailable("a transfer id was drawn twice".into())
            }
            Some("resigned") => StoreError::Unavailable(
                "this server was declared dead and resigned from the copy log".into(),
            ),
            _ => self.unavailable(e),
        }
    }

    async fn reserve_copies(
        &self,
        pool: &PoolKey,
        limits: &CopyLimits,
        domain: &str,
        request: Hits,
        now: Nanos,
        op: OpId,
    ) -> Result<Reservation, StoreError> {
        self.check_may_hold()?;
        if request.hits >= MAX_EXACT {
            return Err(StoreError::Unsupported(format!(
                "{} copies: the Redis store counts exactly below 2^52",
                request.hits
            )));
        }
        let a = copylog::affinity(&pool.0);
        let groups = limits.groups_of(domain);
        let group_limit = |name: &str| {
            limits
                .groups()
                .iter()
                .find(|g| g.name == name)
                .map_or(u64::MAX, |g| g.limit)
        };
        let mut args = vec![
            domain.to_owned(),
            request.hits.to_string(),
            request.min_hits.to_string(),
            limit_arg(limits.domain_limit_for(domain)),
            limits.global_limit().map_or(String::new(), limit_arg),
        ];
        for g in &groups {
            args.push(g.clone());
            args.push(limit_arg(group_limit(g)));
        }
        let state = self.pools.get(a);
        let mut st = state.lock().await;
        st.name = pool.0.to_string();
        let reply = async {
            // Registered before it can hold anything here, so a cleaner
            // finds the pool should this server die.
            self.register(a, &mut st).await?;
            self.drive(a, &mut st, now, "reserve", Some(op), &args)
                .await
        }
        .await
        .map_err(|e| self.copy_error(e, domain, &groups, request.hits))?;
        let reply: Vec<i64> = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Unavailable(format!("Redis answered a reserve oddly: {e}")))?;
        let at = |i: usize| reply.get(i).map_or(0, |&n| u64::try_from(n).unwrap_or(0));
        if at(0) > 0 && st.first_time(op) {
            st.add(domain, &groups, i128::from(at(0)), op);
        }
        let context = CopyContext {
            domain_limit: limits.domain_limit_for(domain),
            global_limit: limits.global_limit(),
            domain_holds: at(2),
            global_holds: at(3),
            groups: groups
                .iter()
                .enumerate()
                .map(|(i, name)| GroupContext {
                    name: name.clone(),
                    limit: group_limit(name),
                    holds: at(4 + i),
                })
                .collect(),
        };
        Ok(Reservation {
            granted: at(0),
            allowed: at(1) != 0,
            groups,
            context,
        })
    }

    /// A release, or its inverse (`restore`): the same arguments.
    async fn release_copies(
        &self,
        held: Held<'_>,
        op: OpId,
        which: &'static str,
    ) -> Result<(), StoreError> {
        if held.copies == 0 {
            return Err(CopyError::ZeroCopies.into());
        }
        let groups = normalize_groups(held.groups);
        let a = copylog::affinity(&held.pool.0);
        let mut args = vec![held.domain.to_owned(), held.copies.to_string()];
        args.extend(groups.iter().cloned());
        let state = self.pools.get(a);
        let mut st = state.lock().await;
        st.name = held.pool.0.to_string();
        let restoring = which == "restore";
        if restoring {
            self.register(a, &mut st)
                .await
                .map_err(|e| self.copy_error(e, held.domain, &groups, held.copies))?;
        }
        self.drive(a, &mut st, Nanos::ZERO, which, Some(op), &args)
            .await
            .map_err(|e| self.copy_error(e, held.domain, &groups, held.copies))?;
        let n = i128::from(held.copies);
        if st.first_time(op) {
            st.add(held.domain, &groups, if restoring { n } else { -n }, op);
        }
        Ok(())
    }

    async fn transfer_copies(
        &self,
        held: Held<'_>,
        ttl: Nanos,
        now: Nanos,
        op: OpId,
    ) -> Result<TransferId, StoreError> {
        if held.copies == 0 {
            return Err(CopyError::ZeroCopies.into());
        }
        let ttl = ttl.min(Nanos::new(MAX_EXACT - 1));
        let groups = normalize_groups(held.groups);
        let a = copylog::affinity(&held.pool.0);
        // The high half names the pool's keys, so a seize by id alone finds
        // them (in Redis Cluster, their slot). Drawn from the operation id,
        // so that a resent transfer stages under the same id.
        let id = TransferId((u128::from(a) << 64) | (op.0 & u128::from(u64::MAX)));
        let mut args = vec![
            held.domain.to_owned(),
            held.copies.to_string(),
            ttl.as_u64().to_string(),
            id.to_string(),
        ];
        args.extend(groups.iter().cloned());
        let state = self.pools.get(a);
        let mut st = state.lock().await;
        st.name = held.pool.0.to_string();
        self.drive(a, &mut st, now, "transfer", Some(op), &args)
            .await
            .map_err(|e| self.copy_error(e, held.domain, &groups, held.copies))?;
        if st.first_time(op) {
            st.add(held.domain, &groups, -i128::from(held.copies), op);
        }
        // This server expires what it staged, when it is due.
        let due = std::time::Duration::from_nanos(ttl.as_u64());
        self.pools.due_at(
            a,
            std::time::Instant::now()
                .checked_add(due)
                .unwrap_or_else(std::time::Instant::now),
        );
        Ok(id)
    }

    /// A seize; `new_hold` is false when this server takes back what it
    /// staged itself (no new hold: allowed while it may not take new ones).
    async fn seize_copies(
        &self,
        id: TransferId,
        now: Nanos,
        op: OpId,
        new_hold: bool,
    ) -> Result<Seized, StoreError> {
        if new_hold {
            self.check_may_hold()?;
        } else if self.log.is_resigned() {
            return Err(StoreError::Unavailable(
                "this server resigned from the copy log (declared dead); it holds no copies".into(),
            ));
        }
        let a = (id.0 >> 64) as u64;
        let state = self.pools.get(a);
        let mut st = state.lock().await;
        let args = vec![id.to_string()];
        let no_groups = Vec::new();
        // Looked up first: a made-up id is refused before anything (this
        // server's registration of the pool included) is written. Under the
        // operation's id, so that a resent seize finds the first one's
        // reply rather than a transfer that is gone.
        if let Err(e) = self.drive(a, &mut st, now, "peek", Some(op), &args).await {
            drop(st);
            self.pools.forget_if_idle(a, state);
            return Err(self.copy_error(e, "", &no_groups, 0));
        }
        let reply = async {
            self.register(a, &mut st).await?;
            self.drive(a, &mut st, now, "seize", Some(op), &args).await
        }
        .await
        .map_err(|e| self.copy_error(e, "", &no_groups, 0))?;
        let reply: Vec<Value> = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Unavailable(format!("Redis answered a seize oddly: {e}")))?;
        let secs = int(reply.get(3));
        let nanos = int(reply.get(4));
        let seized = Seized {
            pool: PoolKey(text(reply.first()).into()),
            staged: Staged {
                domain: text(reply.get(1)),
                groups: reply.iter().skip(5).map(|v| text(Some(v))).collect(),
                copies: int(reply.get(2)),
                expires_at: Nanos::new(secs.saturating_mul(1_000_000_000).saturating_add(nanos)),
            },
        };
        st.name = seized.pool.0.to_string();
        if st.first_time(op) {
            st.add(
                &seized.staged.domain,
                &seized.staged.groups,
                i128::from(seized.staged.copies),
                op,
            );
        }
        Ok(seized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review of issue 17 (second): `RedisOptions` derived `Debug`, which
    /// printed the `--store` URL whole, password and all, though the
    /// password is never to reach a log.
    #[test]
    fn debug_of_the_options_shows_no_password() {
        let mut o = RedisOptions::new("redis://:hunter2@redis.internal:6379/0");
        o.connect.password = Some("swordfish".into());
        let shown = format!("{o:?}");
        for secret in ["hunter2", "swordfish"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(
            shown.contains("redis://***@redis.internal:6379/0"),
            "{shown}"
        );
    }
}
