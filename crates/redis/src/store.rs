//! [`RedisStore`]: limit state in Redis, decided by Lua scripts.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{ErrorKind, RedisError, Script};
use tollgate_core::copies::{CopyLimits, Groups, Reservation, TransferId};
use tollgate_core::{plan, Limit, Mode, Nanos, PlanDecision, Request};
use tollgate_store::{Plan, PoolKey, Seized, Store, StoreError};

use crate::conn::{redact, Conn, ConnectError, ConnectOptions, Target};
use crate::params::{self, MAX_EXACT};
use crate::reply;
use crate::script;

/// Whose clock decides.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Clock {
    /// Redis's `TIME`, read inside every script: servers with skewed clocks
    /// still agree. The default, and the only sane choice for a fleet.
    #[default]
    Redis,
    /// The `now` the caller passes. For tests that must control time (the
    /// conformance suite) and for replaying traces; never for a fleet.
    Caller,
}

/// How the store is set up.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// `redis://`, `rediss://`, `redis-cluster://` or `rediss-cluster://`.
    pub url: String,
    /// Prepended to every key, so one Redis can serve several deployments.
    /// Must not contain `{` or `}` (they would break cluster hash tags).
    pub prefix: String,
    /// Connections, timeouts and reconnection.
    pub connect: ConnectOptions,
    /// Whose clock decides.
    pub clock: Clock,
}

impl RedisOptions {
    /// Options for `url` with every other setting at its default.
    pub fn new(url: impl Into<String>) -> RedisOptions {
        RedisOptions {
            url: url.into(),
            prefix: "tollgate:".into(),
            connect: ConnectOptions::default(),
            clock: Clock::Redis,
        }
    }
}

/// The Redis [`Store`]: every decision is one Lua script call that reads,
/// decides and writes all of a plan's keys atomically inside Redis. See
/// the [crate docs](crate). Clones share the connections and the health.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    prefix: String,
    clock: Clock,
    url: String,
    timeout: Duration,
    decide: Script,
    /// Whether the last command reached Redis; `/readyz` reads it.
    up: Arc<AtomicBool>,
}

/// Gauge: 1 while Redis answers, 0 while it does not.
const UP_GAUGE: &str = "tollgate_store_up";
/// Counter: commands that failed to reach Redis or timed out.
const ERRORS_COUNTER: &str = "tollgate_store_errors_total";

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
        if options.prefix.contains(['{', '}']) {
            return Err(ConnectError::BadUrl {
                url: redact(&options.url),
                reason: format!(
                    "the key prefix `{}` must not contain `{{` or `}}`",
                    options.prefix
                ),
            });
        }
        let target = Target::parse(&options.url)?;
        let conn = Conn::open(&target, &options.connect).await?;
        Ok(RedisStore {
            conn,
            prefix: options.prefix,
            clock: options.clock,
            url: redact(&options.url),
            timeout: options.connect.response_timeout,
            decide: Script::new(script::DECIDE),
            up: Arc::new(AtomicBool::new(true)),
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
    }

    /// Pings Redis every `interval` until the returned future is dropped,
    /// so readiness comes back when Redis does even with no traffic (a
    /// server that is not ready gets none).
    pub async fn monitor(&self, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let cmd = redis::cmd("PING");
        loop {
            tick.tick().await;
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

    fn mark(&self, up: bool) {
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

    /// The URL, without its password.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// The Redis key of a limit state. The hash tag is the plan's affinity,
    /// so every key of a plan lands in one cluster slot.
    fn state_key(&self, affinity: u64, key: &tollgate_store::Key) -> String {
        format!(
            "{}{{{:016x}}}:l:{}:{}",
            self.prefix,
            affinity,
            key.limit,
            key.scope()
        )
    }

    fn clock_args(&self, now: Nanos) -> (String, String) {
        match self.clock {
            Clock::Redis => (String::new(), String::new()),
            Clock::Caller => {
                let n = now.as_u64();
                (
                    (n / 1_000_000_000).to_string(),
                    (n % 1_000_000_000).to_string(),
                )
            }
        }
    }

    /// Runs `decide` for `plan`.
    async fn decide_plan(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Request,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        if plan.items.is_empty() {
            return Ok(plan::decide(&mut [], now, request, mode)?);
        }
        if request.hits >= MAX_EXACT || request.min_hits >= MAX_EXACT {
            return Err(StoreError::Unsupported(format!(
                "{} hits: the Redis store counts exactly below 2^52",
                request.hits.max(request.min_hits)
            )));
        }
        let keys: Vec<String> = plan
            .items
            .iter()
            .map(|i| self.state_key(plan.affinity, &i.key))
            .collect();
        check_distinct(plan, &keys)?;
        let (secs, nanos) = self.clock_args(now);
        let mut inv = self.decide.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.arg(secs)
            .arg(nanos)
            .arg(u8::from(mode == Mode::Acquire))
            .arg(request.hits)
            .arg(request.min_hits)
            .arg(plan.items.len());
        for item in &plan.items {
            let e = params::encode(&item.limit);
            inv.arg(e.code)
                .arg(u8::from(item.shadow))
                .arg(e.params.len());
            for p in &e.params {
                inv.arg(p.as_str());
            }
        }
        let call = self.conn.invoke::<Vec<i64>>(&inv);
        let reply = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => return Err(self.error(e, plan, request.hits)),
            Err(_) => {
                self.mark(false);
                return Err(StoreError::Unavailable(format!(
                    "Redis did not answer within {:?}",
                    self.timeout
                )));
            }
        };
        self.mark(true);
        reply::plan_decision(&reply, plan.items.len())
    }

    fn error(&self, e: RedisError, plan: &Plan, hits: u64) -> StoreError {
        if e.code() == Some("TOLLGATE") {
            if let Some(pe) = e.detail().and_then(|d| reply::plan_error(d, plan, hits)) {
                return StoreError::Plan(pe);
            }
        }
        let what = match e.kind() {
            ErrorKind::Io => "cannot reach Redis",
            _ => "Redis failed",
        };
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
        {
            self.mark(false);
        }
        StoreError::Unavailable(format!("{what} ({}): {e}", self.url))
    }
}

/// Fails with [`StoreError::DuplicateKey`] if two items share a key.
fn check_distinct(plan: &Plan, keys: &[String]) -> Result<(), StoreError> {
    if keys.len() < 2 {
        return Ok(());
    }
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_unstable_by(|&a, &b| keys[a].cmp(&keys[b]));
    for w in order.windows(2) {
        if keys[w[0]] == keys[w[1]] {
            return Err(StoreError::DuplicateKey(plan.items[w[0]].key.to_string()));
        }
    }
    Ok(())
}

fn not_yet(what: &str) -> StoreError {
    StoreError::Unsupported(format!(
        "{what} of copy-limited resources is not available in the Redis store yet"
    ))
}

impl Store for RedisStore {
    async fn decide(
        &self,
        plan: &Plan,
        now: Nanos,
        request: Request,
        mode: Mode,
    ) -> Result<PlanDecision, StoreError> {
        self.decide_plan(plan, now, request, mode).await
    }

    async fn reserve(
        &self,
        _pool: &PoolKey,
        _limits: &CopyLimits,
        _domain: &str,
        _request: Request,
        _now: Nanos,
    ) -> Result<Reservation, StoreError> {
        Err(not_yet("reserve"))
    }

    async fn release(
        &self,
        _pool: &PoolKey,
        _domain: &str,
        _groups: &Groups,
        _copies: u64,
    ) -> Result<(), StoreError> {
        Err(not_yet("release"))
    }

    async fn transfer(
        &self,
        _pool: &PoolKey,
        _domain: &str,
        _groups: &Groups,
        _copies: u64,
        _ttl: Nanos,
        _now: Nanos,
    ) -> Result<TransferId, StoreError> {
        Err(not_yet("transfer"))
    }

    async fn seize(&self, _id: TransferId, _now: Nanos) -> Result<Seized, StoreError> {
        Err(not_yet("seize"))
    }

    async fn sweep(&self, _now: Nanos) {
        // Redis expires idle keys by itself (every write sets a TTL).
    }

    fn check_limit(&self, limit: &Limit) -> Result<(), String> {
        params::check_limit(limit)
    }

    fn is_ready(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }
}
