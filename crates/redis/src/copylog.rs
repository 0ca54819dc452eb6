//! The copy log's bookkeeping on the Rust side: this server's identity,
//! its heartbeat, and the cleanup of servers that died (Charon §4.3.2).
//!
//! Every server has a random id. It joins the live set (`{srv}:alive`, a
//! sorted set of heartbeats by Redis's clock) when it connects and renews
//! its heartbeat every third of the TTL. Before it first holds copies of a
//! pool it registers the pool under its id, so whoever cleans up after it
//! knows where to look, and withdraws the registration once it holds
//! nothing there (crate::copies); the copy scripts record its contribution
//! to every count beside the count, in the same call.
//!
//! When a heartbeat is older than the TTL, a surviving server takes the
//! cleanup lease (one cleaner at a time), removes the dead server from the
//! live set — in the same script that checks its heartbeat is still stale,
//! so it cannot come back — and, pool by pool, subtracts its contributions
//! and leaves a tombstone that refuses its later reservations. A cleaner
//! that dies mid-way leaves the dead server in `{srv}:cleaning`, and the
//! next lease holder finishes the job (each pool's cleanup is idempotent).
//!
//! A cleaner also marks the dead server dead (`{srv}:dead:<id>`, for as
//! long as its tombstones last). A server whose heartbeat finds that mark
//! resigns: it refuses to hold copies from then on, because its sessions'
//! hold sets no longer match the copy log. A server missing from the live
//! set *without* the mark was not declared dead: Redis lost its data
//! (restarted empty, flushed), so it joins again and counts its holds
//! again (crate::copies) — losing Redis's data costs its counts for a
//! moment, never the servers. A server that could not renew its heartbeat
//! for a whole TTL cannot know which of the two happened until Redis
//! answers again; meanwhile it refuses new holds ([`CopyLog::is_suspect`]).
//!
//! A server that starts while no other server is alive also releases every
//! contribution of servers that are not alive, pool by pool over the whole
//! key space (§4.3.2's last paragraph): a previous generation that died all
//! at once leaves no stale holds behind.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{RedisError, Script, Value};

use crate::conn::Conn;
use crate::script;

/// A pool's affinity (its stable hash, [`tollgate_core::hash`]), which
/// names its keys' hash tag and forms the high half of its transfer ids.
pub(crate) fn affinity(pool: &str) -> u64 {
    tollgate_core::hash::fnv1a64(pool.as_bytes())
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
    resigned: AtomicBool,
    reason: Mutex<Option<String>>,
    last_beat: Mutex<Instant>,
    /// Pools cleaned after dead servers since last asked: their staged
    /// transfers are now this server's to expire.
    cleaned: Mutex<Vec<u64>>,
    /// With Sentinel, the grace (ms) this server's heartbeat starts when
    /// it finds the live set last written on another master (a
    /// failover): no server is declared dead meanwhile (`servers.lua`
    /// says why). 0 without Sentinel: never a grace.
    grace_ms: AtomicU64,
}

impl CopyLog {
    pub(crate) fn new(prefix: &str, ttl: Duration) -> CopyLog {
        CopyLog {
            id: format!("{:016x}", uuid::Uuid::new_v4().as_u64_pair().1),
            prefix: prefix.to_owned(),
            ttl,
            copies: Script::new(script::COPIES),
            servers: Script::new(script::SERVERS),
            resigned: AtomicBool::new(false),
            reason: Mutex::new(None),
            last_beat: Mutex::new(Instant::now()),
            cleaned: Mutex::new(Vec::new()),
            grace_ms: AtomicU64::new(0),
        }
    }

    /// Sets the grace after a failover: the heartbeat TTL plus `follow`,
    /// the longest a live server takes to follow the sentinels to a new
    /// master ([`crate::conn::Conn::follow_bound`]), so that every live
    /// server has beaten there before anyone may be declared dead.
    pub(crate) fn set_grace(&self, follow: Duration) {
        let ms = u64::try_from(self.ttl.saturating_add(follow).as_millis()).unwrap_or(u64::MAX);
        self.grace_ms.store(ms.max(1), Ordering::Relaxed);
    }

    /// The grace after a failover ([`CopyLog::set_grace`]); zero without
    /// Sentinel.
    pub(crate) fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms.load(Ordering::Relaxed))
    }

    /// The keys of the pool with affinity `a`, and the key remembering
    /// operation `op`'s reply (a placeholder no script writes for an
    /// operation without an id).
    pub(crate) fn pool_keys(&self, a: u64, op: Option<tollgate_store::OpId>) -> [String; 4] {
        let p = &self.prefix;
        let op_key = match op {
            Some(op) => self.op_key(a, op),
            None => format!("{p}{{c:{a:016x}}}:op:-"),
        };
        [
            format!("{p}{{c:{a:016x}}}:pool"),
            format!("{p}{{c:{a:016x}}}:xfer"),
            format!("{p}{{c:{a:016x}}}:xexp"),
            op_key,
        ]
    }

    /// The key remembering the reply of operation `op` on pool `a` (in the
    /// pool's hash slot).
    pub(crate) fn op_key(&self, a: u64, op: tollgate_store::OpId) -> String {
        format!("{}{{c:{a:016x}}}:op:{op}", self.prefix)
    }

    /// How long at most the copies script remembers an applied
    /// operation's reply (a server says when it has the reply, and the
    /// script forgets it then): an hour, or six heartbeat TTLs if longer.
    /// A server resends an operation for at most [`CopyLog::resend_for`],
    /// well within it.
    pub(crate) fn remember_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_mul(6)
            .max(3_600_000)
    }

    /// How long a server resends one copy operation before it gives up and
    /// resigns: nine tenths of [`CopyLog::remember_ms`], so a resend is
    /// always answered from the remembered reply if Redis applied it.
    pub(crate) fn resend_for(&self) -> Duration {
        Duration::from_millis(self.remember_ms() / 10 * 9)
    }

    fn server_keys(&self, of: &str) -> [String; 7] {
        let p = &self.prefix;
        [
            format!("{p}{{srv}}:alive"),
            format!("{p}{{srv}}:lease"),
            format!("{p}{{srv}}:cleaning"),
            format!("{p}{{srv}}:pools:{of}"),
            format!("{p}{{srv}}:dead:{of}"),
            format!("{p}{{srv}}:master"),
            format!("{p}{{srv}}:grace"),
        ]
    }

    pub(crate) fn is_resigned(&self) -> bool {
        self.resigned.load(Ordering::Relaxed)
    }

    /// Whether this server has not renewed its heartbeat for a whole TTL:
    /// others may be cleaning up after it, or Redis may be down for
    /// everyone; it cannot tell until Redis answers, and refuses new holds
    /// meanwhile.
    pub(crate) fn is_suspect(&self) -> bool {
        self.last_beat.lock().elapsed() >= self.ttl
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
        self.servers_op2(conn, op, pools_of, arg, "").await
    }

    async fn servers_op2(
        &self,
        conn: &Conn,
        op: &str,
        pools_of: &str,
        arg: &str,
        arg2: &str,
    ) -> Result<Value, RedisError> {
        let mut inv = self.servers.prepare_invoke();
        for k in self.server_keys(pools_of) {
            inv.key(k);
        }
        inv.arg(op)
            .arg(&self.id)
            .arg(self.ttl.as_millis() as u64)
            .arg(arg)
            .arg(arg2)
            .arg(self.grace_ms.load(Ordering::Relaxed));
        // The master the call reaches goes last: the live set records it,
        // and starts the grace when it changed.
        conn.invoke_naming_master(&mut inv).await
    }

    /// Registers pool `a` under this server, as registration `generation`,
    /// before it first holds copies there, so a cleaner finds it.
    /// `Ok(true)`: this server had to join the live set again (Redis lost
    /// it).
    pub(crate) async fn register(
        &self,
        conn: &Conn,
        a: u64,
        generation: u64,
    ) -> Result<bool, RedisError> {
        let rejoined: i64 = redis::from_redis_value(
            self.servers_op2(
                conn,
                "register",
                &self.id,
                &format!("{a:016x}"),
                &generation.to_string(),
            )
            .await?,
        )?;
        Ok(rejoined == 1)
    }

    /// Withdraws registration `generation` of pool `a`, where this server
    /// holds nothing any more; a later registration of the pool stays,
    /// however late this arrives.
    pub(crate) async fn unregister(
        &self,
        conn: &Conn,
        a: u64,
        generation: u64,
    ) -> Result<(), RedisError> {
        self.servers_op2(
            conn,
            "unregister",
            &self.id,
            &format!("{a:016x}"),
            &generation.to_string(),
        )
        .await?;
        Ok(())
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
    pub(crate) async fn beat(&self, conn: &Conn) -> Result<Beat, Resignation> {
        match self.servers_op(conn, "beat", &self.id, "").await {
            Ok(survey) => {
                let (others, dead) = parse_survey(&survey);
                if others == -1 {
                    return Err(self.resign("this server was declared dead by another"));
                }
                *self.last_beat.lock() = Instant::now();
                if let Err(e) = self.clean_dead(conn, &dead).await {
                    tracing::warn!(error = %e, "cleanup after a dead server failed; retrying at the next heartbeat");
                }
                Ok(if others == -2 {
                    Beat::Rejoined
                } else {
                    Beat::Renewed
                })
            }
            Err(e) => {
                if self.is_suspect() {
                    tracing::warn!(error = %e, since = ?self.last_beat.lock().elapsed(), "no heartbeat for a whole TTL: new holds are refused until Redis answers");
                } else {
                    tracing::warn!(error = %e, "heartbeat failed");
                }
                Ok(Beat::Failed)
            }
        }
    }

    /// The pools cleaned after dead servers since the last call.
    pub(crate) fn take_cleaned(&self) -> Vec<u64> {
        std::mem::take(&mut *self.cleaned.lock())
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
                self.cleaned.lock().push(a);
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
        for k in self.pool_keys(a, None) {
            inv.key(k);
        }
        if let Some(k) = extra_key {
            inv.key(k);
        }
        inv.arg(op)
            .arg("")
            .arg("")
            .arg(&self.id)
            .arg("")
            .arg("")
            .arg("0");
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

/// What one heartbeat found.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Beat {
    /// Renewed.
    Renewed,
    /// Redis had lost the live set: this server joined again, and must
    /// count its holds again where Redis lost them.
    Rejoined,
    /// Redis did not answer.
    Failed,
}

/// `{others, dead...}` from `join` and `beat`: `others` is -1 when this
/// server was declared dead, and `beat` puts -2 first when it joined again
/// (then the survey follows).
fn parse_survey(v: &Value) -> (i64, Vec<String>) {
    let Value::Array(items) = v else {
        return (0, Vec::new());
    };
    let first = match items.first() {
        Some(Value::Int(n)) => *n,
        _ => 0,
    };
    let skip = if first == -2 { 2 } else { 1 };
    let dead = items.iter().skip(skip).filter_map(value_str).collect();
    (first, dead)
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::conn::{ConnectOptions, RedisTarget};
    use crate::testing::RedisServer;

    /// Review of issue 16's fix: a withdrawal of a pool's registration
    /// that timed out could land after a later registration (on another
    /// of the multiplexed connections) and remove it, so a cleaner would
    /// not find the copies held there. A withdrawal removes only its own
    /// generation.
    #[tokio::test]
    async fn a_late_withdrawal_never_removes_a_later_registration() {
        let server = RedisServer::start();
        let target = RedisTarget::parse(&server.url()).unwrap();
        let conn = Conn::open(&target, &ConnectOptions::default())
            .await
            .unwrap();
        let log = CopyLog::new("t:", Duration::from_secs(5));
        log.join(&conn).await.unwrap();
        let a = 0xabcd;
        let registrations = format!("t:{{srv}}:pools:{}", log.id);
        log.register(&conn, a, 1).await.unwrap();
        log.register(&conn, a, 2).await.unwrap();
        log.unregister(&conn, a, 1).await.unwrap();
        assert_eq!(server.command(&format!("HLEN {registrations}")), ":1");
        log.unregister(&conn, a, 2).await.unwrap();
        assert_eq!(server.command(&format!("HLEN {registrations}")), ":0");
    }
}
