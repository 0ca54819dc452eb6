//! The copy log's bookkeeping on the Rust side: this server's identity,
//! its heartbeat, and the cleanup of servers that died (Charon §4.3.2).
//!
//! Every server has a random id. It joins the live set (`{srv}:alive`, a
//! sorted set of heartbeats by Redis's clock) when it connects and renews
//! its heartbeat every third of the TTL. Before it first holds copies of a
//! pool it registers the pool under its id, so whoever cleans up after it
//! knows where to look; the copy scripts record its contribution to every
//! count beside the count, in the same call.
//!
//! When a heartbeat is older than the TTL, a surviving server takes the
//! cleanup lease (one cleaner at a time), removes the dead server from the
//! live set — in the same script that checks its heartbeat is still stale,
//! so it cannot come back — and, pool by pool, subtracts its contributions
//! and leaves a tombstone that refuses its later reservations. A cleaner
//! that dies mid-way leaves the dead server in `{srv}:cleaning`, and the
//! next lease holder finishes the job (each pool's cleanup is idempotent).
//!
//! A server that finds itself removed, or that could not renew its
//! heartbeat for a whole TTL (others may be cleaning up after it), resigns:
//! it refuses to hold copies from then on, because its sessions' hold sets
//! no longer match the copy log.
//!
//! A server that starts while no other server is alive also releases every
//! contribution of servers that are not alive, pool by pool over the whole
//! key space (§4.3.2's last paragraph): a previous generation that died all
//! at once leaves no stale holds behind.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{RedisError, Script, Value};

use crate::conn::Conn;
use crate::script;

/// A 64-bit FNV-1a hash: a pool's affinity, which names its keys' hash tag
/// and forms the high half of its transfer ids.
pub(crate) fn affinity(pool: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in pool.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Why this server stopped holding copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resignation(pub String);

/// This server's place in the copy log.
pub(crate) struct CopyLog {
    pub(crate) id: String,
    prefix: String,
    pub(crate) ttl: Duration,
    pub(crate) copies: Script,
    servers: Script,
    registered: Mutex<HashSet<u64>>,
    resigned: AtomicBool,
    reason: Mutex<Option<String>>,
    last_beat: Mutex<Instant>,
}

impl CopyLog {
    pub(crate) fn new(prefix: &str, ttl: Duration) -> CopyLog {
        CopyLog {
            id: format!("{:016x}", uuid::Uuid::new_v4().as_u64_pair().1),
            prefix: prefix.to_owned(),
            ttl,
            copies: Script::new(script::COPIES),
            servers: Script::new(script::SERVERS),
            registered: Mutex::new(HashSet::new()),
            resigned: AtomicBool::new(false),
            reason: Mutex::new(None),
            last_beat: Mutex::new(Instant::now()),
        }
    }

    /// The three keys of the pool with affinity `a`.
    pub(crate) fn pool_keys(&self, a: u64) -> [String; 3] {
        let p = &self.prefix;
        [
            format!("{p}{{c:{a:016x}}}:pool"),
            format!("{p}{{c:{a:016x}}}:xfer"),
            format!("{p}{{c:{a:016x}}}:xexp"),
        ]
    }

    fn server_keys(&self, pools_of: &str) -> [String; 4] {
        let p = &self.prefix;
        [
            format!("{p}{{srv}}:alive"),
            format!("{p}{{srv}}:lease"),
            format!("{p}{{srv}}:cleaning"),
            format!("{p}{{srv}}:pools:{pools_of}"),
        ]
    }

    pub(crate) fn is_resigned(&self) -> bool {
        self.resigned.load(Ordering::Relaxed)
    }

    /// Stops holding copies from now on, for `why`; the heartbeat loop
    /// ([`CopyLog::run`]) then ends with the first reason given.
    pub(crate) fn resign(&self, why: &str) -> Resignation {
        let mut reason = self.reason.lock();
        if !self.resigned.swap(true, Ordering::Relaxed) {
            tracing::error!(server = %self.id, reason = why, "resigned from the copy log: holds are refused from now on");
            *reason = Some(why.to_owned());
        }
        Resignation(reason.clone().unwrap_or_else(|| why.to_owned()))
    }

    async fn servers_op(
        &self,
        conn: &Conn,
        op: &str,
        pools_of: &str,
        arg: &str,
    ) -> Result<Value, RedisError> {
        let mut inv = self.servers.prepare_invoke();
        for k in self.server_keys(pools_of) {
            inv.key(k);
        }
        inv.arg(op)
            .arg(&self.id)
            .arg(self.ttl.as_millis() as u64)
            .arg(arg);
        conn.invoke(&inv).await
    }

    /// Registers pool `a` under this server before it first holds copies
    /// there, so a cleaner finds it.
    pub(crate) async fn register(&self, conn: &Conn, a: u64) -> Result<(), RedisError> {
        if self.registered.lock().contains(&a) {
            return Ok(());
        }
        self.servers_op(conn, "register", &self.id, &format!("{a:016x}"))
            .await?;
        self.registered.lock().insert(a);
        Ok(())
    }

    /// The pools this server registered (for its sweeps).
    pub(crate) fn registered(&self) -> Vec<u64> {
        self.registered.lock().iter().copied().collect()
    }

    /// Joins the live set; if no other server is alive, also clears what
    /// servers that are not alive left in the copy log. Returns how many
    /// copies were released.
    pub(crate) async fn join(&self, conn: &Conn) -> Result<u64, RedisError> {
        let survey = self.servers_op(conn, "join", &self.id, "").await?;
        *self.last_beat.lock() = Instant::now();
        let (others, dead) = parse_survey(&survey);
        let mut released = self.clean_dead(conn, &dead).await?;
        if others == 0 && !conn.is_cluster() {
            released += self.clear_orphans(conn).await?;
        }
        Ok(released)
    }

    /// One heartbeat: renews this server's, cleans up after dead ones.
    /// `Err` means this server must resign.
    pub(crate) async fn beat(&self, conn: &Conn) -> Result<(), Resignation> {
        match self.servers_op(conn, "beat", &self.id, "").await {
            Ok(survey) => {
                let (others, dead) = parse_survey(&survey);
                if others < 0 {
                    return Err(self.resign("this server was declared dead by another"));
                }
                *self.last_beat.lock() = Instant::now();
                if let Err(e) = self.clean_dead(conn, &dead).await {
                    tracing::warn!(error = %e, "cleanup after a dead server failed; retrying at the next heartbeat");
                }
                Ok(())
            }
            Err(e) => {
                let since = self.last_beat.lock().elapsed();
                if since >= self.ttl {
                    return Err(self.resign(&format!(
                        "no heartbeat for {since:?} (TTL {:?}): {e}",
                        self.ttl
                    )));
                }
                tracing::warn!(error = %e, "heartbeat failed");
                Ok(())
            }
        }
    }

    /// Heartbeats until this server resigns.
    pub(crate) async fn run(&self, conn: &Conn) -> Resignation {
        let mut tick = tokio::time::interval(self.ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.is_resigned() {
                return self.resign("resigned");
            }
            if let Err(r) = self.beat(conn).await {
                return r;
            }
        }
    }

    /// Claims and cleans up each of `dead`; skips those another server is
    /// cleaning or that came back.
    async fn clean_dead(&self, conn: &Conn, dead: &[String]) -> Result<u64, RedisError> {
        let mut released = 0;
        for d in dead {
            let claimed = self.servers_op(conn, "claim", d, d).await?;
            let Value::Array(pools) = claimed else {
                continue;
            };
            for p in pools {
                let Some(a) = value_str(&p).and_then(|s| u64::from_str_radix(&s, 16).ok()) else {
                    continue;
                };
                released += self
                    .pool_op::<u64>(conn, a, "cleanup", None, &[d.as_str()])
                    .await?;
            }
            self.servers_op(conn, "finish", d, d).await?;
            tracing::info!(dead = %d, released, "released the holds of a dead server");
        }
        Ok(released)
    }

    /// Runs a copies-script op on pool `a` with no pool name check;
    /// `extra_key` follows the pool's keys (the live set, for `orphans`).
    async fn pool_op<T: redis::FromRedisValue>(
        &self,
        conn: &Conn,
        a: u64,
        op: &str,
        extra_key: Option<&str>,
        args: &[&str],
    ) -> Result<T, RedisError> {
        let mut inv = self.copies.prepare_invoke();
        for k in self.pool_keys(a) {
            inv.key(k);
        }
        if let Some(k) = extra_key {
            inv.key(k);
        }
        inv.arg(op).arg("").arg("").arg(&self.id).arg("");
        for a in args {
            inv.arg(*a);
        }
        conn.invoke(&inv).await
    }

    /// Releases every contribution of servers not alive, in every pool.
    async fn clear_orphans(&self, conn: &Conn) -> Result<u64, RedisError> {
        let alive = format!("{}{{srv}}:alive", self.prefix);
        let pattern = format!("{}{{c:*}}:pool", self.prefix);
        let mut cursor: u64 = 0;
        let mut released = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = conn
                .query(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000),
                )
                .await?;
            for k in keys {
                let Some(a) = k
                    .rsplit_once("{c:")
                    .and_then(|(_, rest)| rest.split_once('}'))
                    .and_then(|(hex, _)| u64::from_str_radix(hex, 16).ok())
                else {
                    continue;
                };
                released += self
                    .pool_op::<u64>(conn, a, "orphans", Some(&alive), &[])
                    .await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        if released > 0 {
            tracing::info!(released, "released holds left by servers that are gone");
        }
        Ok(released)
    }
}

fn value_str(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// `{others, dead...}` from `join` and `beat` (`others` is -1 when this
/// server was declared dead).
fn parse_survey(v: &Value) -> (i64, Vec<String>) {
    let Value::Array(items) = v else {
        return (0, Vec::new());
    };
    let others = match items.first() {
        Some(Value::Int(n)) => *n,
        _ => 0,
    };
    let dead = items.iter().skip(1).filter_map(value_str).collect();
    (others, dead)
}
