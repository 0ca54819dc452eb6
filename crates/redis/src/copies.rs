//! Copy operations on the copy log, each driven to a definitive answer.
//!
//! # Why operations are resent, and why that is safe
//!
//! A copy operation (reserve, release, restore, transfer, seize) is one
//! call of the `copies` script. The call can time out or its connection
//! can break while Redis applies it anyway, so "no answer" says nothing
//! about what happened. So every operation carries an id ([`OpId`]); the
//! script remembers the reply of an operation it applied (for a few
//! heartbeat TTLs, longer than a server keeps resending before it resigns)
//! and answers a resent one with that reply instead of applying it again.
//! The store resends until it has an answer: the future of a copy
//! operation resolves only with what Redis did or refused. It runs in a
//! task of its own, so a caller that drops it changes nothing.
//!
//! # What this server holds, pool by pool
//!
//! Operations of this server on one pool run one at a time (an async lock
//! per pool), and after each the server updates its own record of what its
//! sessions hold there ([`PoolState::mine`]), the same numbers as its `s:`
//! fields in Redis. That record is what makes Redis losing its data cost
//! only counts, never holds or servers: when the script says the pool no
//! longer has this server's contribution (`TOLLGATE lost`: Redis restarted
//! empty, or a cluster node failed over to a replica that lagged), the
//! server counts its holds again (`reassert`) and resends. When its
//! heartbeat finds the live set lost, it does that for every pool at once
//! ([`RedisStore::recover`]).
//!
//! # What stays in Redis, and for how long
//!
//! Nothing a stranger sends: a seize looks the transfer up (`peek`) before
//! this server registers the pool, so a made-up id leaves nothing behind;
//! the registration of a pool where this server holds nothing any more is
//! withdrawn by the sweep; staged transfers are expired by the server that
//! staged them when they are due ([`RedisStore::expire_due`]), instead of
//! every pool being polled.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{RedisError, Value};
use tokio::sync::Mutex as AsyncMutex;
use tollgate_core::copies::Groups;
use tollgate_core::Nanos;
use tollgate_store::OpId;

use crate::store::RedisStore;

/// What this server knows of one pool.
#[derive(Debug, Default)]
pub(crate) struct PoolState {
    /// The pool's name, once known (a seize learns it from Redis).
    pub(crate) name: String,
    /// Whether the pool is in this server's registration set in Redis.
    pub(crate) registered: bool,
    /// The generation of that registration.
    pub(crate) generation: u64,
    /// The operation that last changed this server's holds here (`None`
    /// while it holds nothing): the `v:` the script keeps beside them, by
    /// which Redis losing them or going back to an older state shows.
    pub(crate) version: Option<OpId>,
    /// Copies this server's sessions hold here, by domain and groups:
    /// the same as its `s:` fields in Redis.
    pub(crate) mine: HashMap<(String, Groups), u64>,
    /// The latest operations applied here, so that one sent again by its
    /// caller (with the same id) is counted in [`PoolState::mine`] once,
    /// as Redis counts it once.
    applied: std::collections::VecDeque<OpId>,
    /// Operations whose replies arrived, whose remembered replies the next
    /// call on this pool tells the script to forget.
    pub(crate) acks: Vec<OpId>,
}

/// How many received replies a pool's state waits to acknowledge; older
/// ones are left to expire on their own.
const MAX_ACKS: usize = 32;

/// How many operation ids a pool's state remembers.
const REMEMBERED_OPS: usize = 64;

impl PoolState {
    /// Whether this server holds anything here.
    pub(crate) fn holds(&self) -> bool {
        !self.mine.is_empty()
    }

    /// Whether nothing of this pool needs remembering: no holds, no
    /// registration, no reply to acknowledge.
    fn is_idle(&self) -> bool {
        !self.holds() && !self.registered && self.acks.is_empty()
    }

    /// The version as the script takes it.
    pub(crate) fn version_arg(&self) -> String {
        self.version
            .map_or_else(|| "0".to_owned(), |op| op.to_string())
    }

    /// Notes that operation `op`'s reply arrived.
    fn ack(&mut self, op: OpId) {
        if self.acks.len() == MAX_ACKS {
            self.acks.remove(0);
        }
        self.acks.push(op);
    }

    /// Whether operation `op` is applied here for the first time (and
    /// remembers it).
    pub(crate) fn first_time(&mut self, op: OpId) -> bool {
        if self.applied.contains(&op) {
            return false;
        }
        if self.applied.len() == REMEMBERED_OPS {
            self.applied.pop_front();
        }
        self.applied.push_back(op);
        true
    }

    /// Adds `n` (subtracts, if negative) to what this server holds, as
    /// operation `op` did; `op` becomes the version, as in the script.
    pub(crate) fn add(&mut self, domain: &str, groups: &Groups, n: i128, op: OpId) {
        let key = (domain.to_owned(), groups.clone());
        let now = i128::from(self.mine.get(&key).copied().unwrap_or(0)) + n;
        if now <= 0 {
            self.mine.remove(&key);
        } else {
            self.mine
                .insert(key, u64::try_from(now).unwrap_or(u64::MAX));
        }
        self.version = (!self.mine.is_empty()).then_some(op);
    }

    /// The `reassert` arguments: every hold as domain, copies, group count,
    /// groups.
    fn reassert_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for ((domain, groups), n) in &self.mine {
            args.push(domain.clone());
            args.push(n.to_string());
            args.push(groups.len().to_string());
            args.extend(groups.iter().cloned());
        }
        args
    }
}

/// Every pool this server uses, with its lock, and when staged transfers
/// are next due where it staged them.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    by_affinity: Mutex<HashMap<u64, Arc<AsyncMutex<PoolState>>>>,
    due: Mutex<HashMap<u64, Instant>>,
    generations: std::sync::atomic::AtomicU64,
}

impl Pools {
    /// The lock of pool `a` (created empty when first used).
    pub(crate) fn get(&self, a: u64) -> Arc<AsyncMutex<PoolState>> {
        Arc::clone(self.by_affinity.lock().entry(a).or_default())
    }

    /// Every pool's affinity and lock.
    fn all(&self) -> Vec<(u64, Arc<AsyncMutex<PoolState>>)> {
        self.by_affinity
            .lock()
            .iter()
            .map(|(a, p)| (*a, Arc::clone(p)))
            .collect()
    }

    /// A new registration generation, unique in this server's life.
    pub(crate) fn next_generation(&self) -> u64 {
        self.generations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Comes back to pool `a` at `at` at the latest to expire transfers.
    pub(crate) fn due_at(&self, a: u64, at: Instant) {
        let mut due = self.due.lock();
        let e = due.entry(a).or_insert(at);
        *e = (*e).min(at);
    }

    /// Pools with transfers due by `now`, forgotten here (expiring them
    /// schedules the next).
    fn take_due(&self, now: Instant) -> Vec<u64> {
        let mut due = self.due.lock();
        let ready: Vec<u64> = due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(a, _)| *a)
            .collect();
        for a in &ready {
            due.remove(a);
        }
        ready
    }

    fn is_due(&self, a: u64) -> bool {
        self.due.lock().contains_key(&a)
    }

    /// Pools this server tracks (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.by_affinity.lock().len()
    }

    /// Forgets pool `a` at once if it holds nothing and nobody else uses
    /// it (a seize of a made-up id must not leave an entry until the next
    /// sweep). `state` is the caller's handle, which it gives up.
    pub(crate) fn forget_if_idle(&self, a: u64, state: Arc<AsyncMutex<PoolState>>) {
        let mut map = self.by_affinity.lock();
        // The map's handle and the caller's: nobody else can get one
        // without this lock.
        if Arc::strong_count(&state) == 2 && state.try_lock().is_ok_and(|st| st.is_idle()) {
            map.remove(&a);
        }
    }

    /// Drops pools nobody is using and that hold nothing: an entry whose
    /// lock only the map holds, and whose state is empty and unregistered.
    fn forget_idle(&self) {
        let mut map = self.by_affinity.lock();
        map.retain(|_, p| {
            if Arc::strong_count(p) > 1 {
                return true;
            }
            match p.try_lock() {
                Ok(st) => !st.is_idle(),
                Err(_) => true,
            }
        });
    }
}

/// How many times in a row one operation may find this server's holds
/// lost and write them again before it gives up (a Redis that keeps
/// losing them is not one to keep writing to).
const MAX_REWRITES: u32 = 5;

/// How long to wait before resending, after `attempt` failed sends.
fn backoff(attempt: u32) -> Duration {
    let ms = 10u64.saturating_mul(1 << attempt.min(6));
    Duration::from_millis(ms.min(500))
}

/// A copies-script error that is an answer (nothing changed), by its word.
pub(crate) fn refusal(e: &RedisError) -> Option<&str> {
    if e.code() != Some("TOLLGATE") {
        return None;
    }
    e.detail().and_then(|d| d.split_whitespace().next())
}

impl RedisStore {
    /// Sends copies-script `op` on pool `a` (whose state the caller holds
    /// locked) until Redis answers: a reply, or a refusal (`TOLLGATE ...`).
    /// Counts this server's holds again where Redis lost them. Fails only
    /// with a refusal, or when this server resigned.
    pub(crate) async fn drive(
        &self,
        a: u64,
        st: &mut PoolState,
        now: Nanos,
        op: &str,
        id: Option<OpId>,
        args: &[String],
    ) -> Result<Value, RedisError> {
        let started = Instant::now();
        let mut attempt = 0u32;
        let mut lost = 0u32;
        loop {
            if self.log.is_resigned() {
                return Err(resigned_error());
            }
            if started.elapsed() > self.log.resend_for() {
                // Redis would soon forget whether it applied the operation:
                // sent again after that, it could be applied twice. This
                // server's part of the copy log can no longer be trusted.
                self.log.resign(&format!(
                    "a copy operation ({op}) got no answer for {:?}",
                    started.elapsed()
                ));
                return Err(resigned_error());
            }
            match self.copies_call(a, st, now, op, id, args).await {
                Ok(v) => {
                    self.mark(true);
                    // A send that got no answer may still be queued on its
                    // connection: its remembered reply must outlive it, so
                    // only an operation answered at its first send is
                    // acknowledged (the others' replies expire on their own).
                    if let Some(id) = id.filter(|_| attempt == 0) {
                        st.ack(id);
                    }
                    return Ok(v);
                }
                Err(e) if refusal(&e) == Some("lost") => {
                    // Redis lost the pool or went back to an older state:
                    // its rate-limit states may have too.
                    self.forget_rejections();
                    lost += 1;
                    if lost > MAX_REWRITES {
                        return Err(redis::make_extension_error(
                            "TOLLGATE".to_owned(),
                            Some("lost_again".to_owned()),
                        ));
                    }
                    if lost > 1 {
                        self.pause_after(&e, &mut attempt).await;
                    }
                    self.reassert(a, st).await?;
                }
                Err(e) if refusal(&e).is_some() => {
                    self.mark(true);
                    return Err(e);
                }
                Err(e) => {
                    tracing::debug!(op, error = %e, attempt, "a copy operation got no answer; sending it again");
                    self.pause_after(&e, &mut attempt).await;
                }
            }
        }
    }

    /// Before sending again after `attempt` sends got no answer (`e`):
    /// notes the failure and backs off.
    async fn pause_after(&self, e: &RedisError, attempt: &mut u32) {
        self.note_failure(e);
        tokio::time::sleep(backoff(*attempt)).await;
        *attempt = attempt.saturating_add(1);
    }

    /// Counts again, in pool `a`, everything this server's sessions hold
    /// there (after Redis lost it); nothing if Redis still has it.
    async fn reassert(&self, a: u64, st: &mut PoolState) -> Result<(), RedisError> {
        let args = st.reassert_args();
        let id = OpId::random();
        // Registered again first: Redis may have lost the registration set
        // as well, and a cleaner must find this pool.
        st.registered = false;
        self.register(a, st).await?;
        let mut attempt = 0u32;
        loop {
            if self.log.is_resigned() {
                return Err(resigned_error());
            }
            match self
                .copies_call(a, st, Nanos::ZERO, "reassert", Some(id), &args)
                .await
            {
                Ok(v) => {
                    if attempt == 0 {
                        st.ack(id);
                    }
                    let copies = crate::store::int(Some(&v));
                    if copies > 0 {
                        metrics::counter!(REASSERTED).increment(copies);
                        tracing::warn!(pool = ?st.name, copies, "Redis had lost this server's holds in a pool (restarted empty?); counted them again");
                    }
                    return Ok(());
                }
                Err(e) if refusal(&e).is_some() => return Err(e),
                Err(e) => {
                    self.pause_after(&e, &mut attempt).await;
                }
            }
        }
    }

    /// Registers pool `a` under this server before it first holds copies
    /// there, so a cleaner finds it; resends until Redis answers.
    pub(crate) async fn register(&self, a: u64, st: &mut PoolState) -> Result<(), RedisError> {
        if st.registered {
            return Ok(());
        }
        let mut attempt = 0u32;
        loop {
            if self.log.is_resigned() {
                return Err(resigned_error());
            }
            let generation = self.pools.next_generation();
            match self.log.register(&self.conn, a, generation).await {
                Ok(rejoined) => {
                    st.registered = true;
                    st.generation = generation;
                    if rejoined {
                        self.lost_live_set();
                    }
                    return Ok(());
                }
                Err(e) if refusal(&e).is_some() => return Err(e),
                Err(e) => {
                    self.pause_after(&e, &mut attempt).await;
                }
            }
        }
    }

    /// Makes this server's contribution to every pool it knows exactly
    /// what its record says, after Redis lost its data or went back to an
    /// older state (its heartbeat found the live set lost, or the store
    /// followed a failover to a replica that may have lagged): its holds
    /// are counted again where Redis lost them, and copies Redis still
    /// counts for it that it no longer holds (a release the new master
    /// never saw) are taken away, in pools where it holds nothing too.
    /// Pools this server already forgot (the sweep forgets those it holds
    /// nothing in) are corrected at its next operation there, which finds
    /// the version wrong (`TOLLGATE lost`).
    pub async fn recover(&self) {
        for (a, pool) in self.pools.all() {
            let mut st = pool.lock().await;
            // Redis lost the registration set too: every pool registers
            // again before this server next holds copies there.
            st.registered = false;
            let done = if st.holds() {
                self.reassert(a, &mut st).await
            } else {
                self.clear_stale(a, &mut st).await
            };
            if let Err(e) = done {
                tracing::error!(pool = ?st.name, error = %e, "could not count this server's holds again");
            }
        }
    }

    /// Takes away whatever Redis still counts for this server in pool `a`,
    /// where its record says it holds nothing (review of issue 18,
    /// finding 1): a `reassert` of no holds, which changes nothing when
    /// Redis agrees. No registration (nothing is held), no remembered
    /// reply (sent again, it does the same). A few attempts: the next
    /// operation on the pool corrects it anyway.
    async fn clear_stale(&self, a: u64, st: &mut PoolState) -> Result<(), RedisError> {
        const ATTEMPTS: u32 = 5;
        let mut attempt = 0u32;
        loop {
            if self.log.is_resigned() {
                return Err(resigned_error());
            }
            match self
                .copies_call(a, st, Nanos::ZERO, "reassert", None, &[])
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if refusal(&e).is_some() || attempt + 1 >= ATTEMPTS => return Err(e),
                Err(e) => self.pause_after(&e, &mut attempt).await,
            }
        }
    }

    /// Expires the staged transfers of every pool where one is due, and
    /// withdraws the registration of pools where this server holds nothing
    /// any more. One attempt per pool, bounded in time, skipping pools an
    /// operation is using: the sweep must never wait for a Redis that
    /// does not answer (what is not done now is done at a later sweep).
    pub(crate) async fn expire_due(&self, now: Nanos) {
        let attempt = self.timeout().max(Duration::from_millis(200));
        for a in self.pools.take_due(Instant::now()) {
            let pool = self.pools.get(a);
            let Ok(mut st) = pool.try_lock() else {
                self.pools.due_at(a, Instant::now());
                continue;
            };
            let sent = tokio::time::timeout(
                attempt,
                self.copies_call(a, &mut st, now, "expire", None, &[]),
            )
            .await;
            match sent {
                Ok(Ok(Value::Int(us))) if us >= 0 => {
                    let wait = Duration::from_micros(u64::try_from(us).unwrap_or(0));
                    self.pools.due_at(a, Instant::now() + wait);
                }
                Ok(Ok(_)) => {}
                failed => {
                    if let Ok(Err(e)) = failed {
                        self.note_failure(&e);
                        tracing::debug!(error = %e, "expiring transfers failed; retrying at a later sweep");
                    }
                    self.pools
                        .due_at(a, Instant::now() + Duration::from_secs(1));
                }
            }
        }
        self.withdraw_idle(attempt).await;
    }

    /// Withdraws the registrations of pools this server holds nothing in
    /// (and expects no transfer in), and forgets them.
    async fn withdraw_idle(&self, attempt: Duration) {
        for (a, pool) in self.pools.all() {
            if self.pools.is_due(a) {
                continue;
            }
            // Busy pools are left for a later sweep.
            let Ok(mut st) = pool.try_lock() else {
                continue;
            };
            if st.holds() {
                continue;
            }
            if !st.acks.is_empty() {
                // Replies Redis still remembers: acknowledged before the
                // pool is forgotten (a call that changes nothing).
                let flushed = tokio::time::timeout(
                    attempt,
                    self.copies_call(a, &mut st, Nanos::ZERO, "expire", None, &[]),
                )
                .await;
                if !matches!(flushed, Ok(Ok(_))) {
                    continue;
                }
            }
            if !st.registered {
                continue;
            }
            // Not registered from here on, whatever becomes of the
            // withdrawal: the next hold here registers again, under a new
            // generation that a late withdrawal cannot remove.
            st.registered = false;
            let generation = st.generation;
            match tokio::time::timeout(attempt, self.log.unregister(&self.conn, a, generation))
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "withdrawing a pool's registration failed; it stays until this server dies")
                }
                Err(_) => {}
            }
        }
        self.pools.forget_idle();
    }

    /// The heartbeat or a registration found this server missing from the
    /// live set though nobody declared it dead: Redis lost its data.
    pub(crate) fn lost_live_set(&self) {
        metrics::counter!(LIVE_SET_LOST).increment(1);
        // Its rate-limit states went with it: keys the over-limit cache
        // rejects may admit again.
        self.forget_rejections();
        tracing::warn!(server = %self.log.id, "Redis had lost this server's heartbeat (restarted empty or flushed?): joined again; holds are counted again pool by pool");
        let store = self.clone();
        tokio::spawn(async move { store.recover().await });
    }
}

/// Counter: copies counted again after Redis lost them.
pub(crate) const REASSERTED: &str = "tollgate_store_copies_reasserted_total";
/// Counter: times this server found Redis had lost its heartbeat.
pub(crate) const LIVE_SET_LOST: &str = "tollgate_store_live_set_lost_total";

/// The error of an operation this server may no longer send.
pub(crate) fn resigned_error() -> RedisError {
    redis::make_extension_error("TOLLGATE".to_owned(), Some("resigned".to_owned()))
}
