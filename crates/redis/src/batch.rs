//! Decisions batched into shared script calls, pipelined on each
//! connection, and a Redis that stops answering told apart from one that is
//! merely busy.
//!
//! Pipelining alone (seed 002, "multiple round trips") still costs one
//! `EVALSHA` per decision: its write and read on both sides, and the
//! script's fixed cost in Redis (setting up the call, reading `TIME`). So
//! concurrent decisions share a call: each Redis connection has a driver
//! task that sends whatever decisions queued up as one `decide` call of up
//! to [`MAX_PLANS`] plans, which decides them one after the other, each
//! all or nothing (`lua/decide.lua`). Up to [`DEPTH`] calls are in flight
//! on a connection at once, the second only with at least half a batch to
//! send, so that under heavy load Redis has the next call in hand while
//! the server reads the last answer, and batches stay large. Nothing waits
//! to fill a batch: a decision alone is sent at once when nothing is in
//! flight; batches grow only when decisions arrive faster than Redis
//! answers. Redis runs each call atomically, which orders its
//! decisions as if they had arrived back to back.
//!
//! **Time.** A decision is not given a deadline of its own: under load it
//! waits in the queue behind the calls in flight, and that wait grows with
//! the load (Little's law: at 128 decisions in flight and 15,000 answered a
//! second, each waits 8.5 ms on average, and its tail several times that on
//! a busy machine). Such a deadline failed decisions of a Redis that was
//! answering every call (issue 17). What the timeout bounds instead is
//! *silence*: when the oldest call in flight on a connection has had no
//! answer for `timeout`, counted from when it was sent or from the last
//! answer to a driver's call on that connection, whichever is later (the
//! driver does not see the answers to other commands sharing the
//! connection: heartbeats, copy operations, pings), Redis is taken to have
//! stalled, and every decision in flight or queued on the connection fails
//! at once with [`Failure::Redis`] (a timeout). A stalled or dead Redis is
//! therefore noticed within the timeout of its last answer, as before; a
//! busy one is waited for. This timer is the only one on a decision call:
//! the connections the drivers get time nothing themselves (`conn.rs`),
//! since redis-rs would time each call from its own sending, failing a
//! call pipelined behind a slow one while Redis still answers (review of
//! issue 17, finding 3).
//!
//! **Bound.** At most `waiting` decisions wait in the queues, over all the
//! store's connections (`RedisOptions::max_waiting`, split evenly); one
//! more is shed at once with [`Failure::Overloaded`] rather than queued:
//! an answer that says so, which a closed-loop load (a fixed number of
//! clients) never meets below the bound. Besides those, a driver holds up
//! to [`MAX_PLANS`] taken for its next call and [`DEPTH`] calls in flight.
//! That bound is also what bounds a decision's wait while Redis answers:
//! the calls ahead of it (its queue's share of the bound over
//! [`MAX_PLANS`], plus those), each answered at Redis's pace, and at worst
//! each just before the timeout (`docs/redis.md` has the numbers).
//!
//! Encoding writes each plan straight into the command, numbers as numbers
//! (no string per argument), and the script answers one MessagePack array
//! (`reply::msgpack_ints`) rather than hundreds of RESP integers: together
//! they were most of what a decision cost the server beyond the request
//! itself (`docs/benchmarks.md`).
//!
//! A Redis Cluster gets no driver: plans of different namespaces live in
//! different slots, so each decision is a call of its own there
//! ([`Encoder::command`] of one plan, [`send`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, RedisResult, Value};
use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tollgate_core::{Hits, Limit, Mode, Nanos, PlanDecision};
use tollgate_store::{Key, Plan, StoreError};

use crate::conn::Link;
use crate::params;
use crate::reply;

/// At most this many plans in one call: a call holds Redis for its whole
/// length, so batches stay short (a few hundred microseconds).
pub(crate) const MAX_PLANS: usize = 32;

/// Calls in flight on one connection at once (the second only with half
/// a batch or more to send).
pub(crate) const DEPTH: usize = 2;

/// What a decision asks besides its plan.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Ask {
    pub request: Hits,
    pub mode: Mode,
    /// Read only ([`tollgate_store::Store::inspect`]): `request` is zero
    /// hits in `Mode::Try`, and the script writes nothing back.
    pub inspect: bool,
    /// The caller's clock (`ScriptClock::Caller`); `None`: Redis's `TIME`.
    pub now: Option<Nanos>,
    /// This server's time, whichever clock decides: where the windows a
    /// calendar limit's parameters carry are computed (Lua has no time
    /// zone database; `lua/algorithms/fixed_window.lua`).
    pub server_now: Nanos,
}

/// Why a decision got no answer from the script.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The script answered, refusing the plan or answering nonsense.
    Store(StoreError),
    /// No answer: the connection failed, or Redis stopped answering.
    Redis(RedisError),
    /// Shed: this many decisions already wait to be sent (the bound).
    Overloaded(usize),
    /// Sent to a master the store has since left for a new one (a
    /// Sentinel failover) and not answered: the old master may or may not
    /// have counted it, so it is neither answered nor sent again.
    Switched,
}

/// A decision's answer, with when its call was sent: Redis decided it
/// then or later (the over-limit cache counts its entries from there).
pub(crate) type Answer = Result<(PlanDecision, std::time::Instant), Failure>;

/// The answers of a [`Job`]'s plans, in order, with when its call was
/// sent; or why none came.
pub(crate) type Answers = Result<(SmallVec<[PlanDecision; 1]>, std::time::Instant), Failure>;

/// One decision waiting for a driver, or several that must be decided in
/// one call ([`Batcher::decide_together`]): a job is never split across
/// calls, so Redis runs its plans in one script, all or (on a failure)
/// none.
struct Job {
    plans: SmallVec<[(Plan, Ask); 1]>,
    answer: oneshot::Sender<Answers>,
}

/// Writes `decide` calls: the script's SHA and the key prefix.
pub(crate) struct Encoder {
    prefix: String,
    sha: String,
}

/// Appends the Redis key of a limit state to `out`:
/// `<prefix>{<affinity>}:l:<limit id>:<domain>`, ids in 16 hex digits. The
/// hash tag is the plan's affinity, so every key of a plan lands in one
/// cluster slot; a plan's keys are distinct, and so are their Redis keys
/// (the limit id ends at a `:`, the domain follows whole). Written by hand:
/// `format!` cost more than the rest of encoding a plan.
pub(crate) fn write_state_key(out: &mut Vec<u8>, prefix: &str, affinity: u64, key: &Key) {
    fn hex(out: &mut Vec<u8>, n: u64) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for i in (0..16).rev() {
            out.push(DIGITS[((n >> (i * 4)) & 0xf) as usize]);
        }
    }
    out.extend_from_slice(prefix.as_bytes());
    out.push(b'{');
    hex(out, affinity);
    out.extend_from_slice(b"}:l:");
    hex(out, key.limit.0);
    out.push(b':');
    out.extend_from_slice(key.scope().as_bytes());
}

impl Encoder {
    pub(crate) fn new(prefix: &str, script: &redis::Script) -> Encoder {
        Encoder {
            prefix: prefix.to_owned(),
            sha: script.get_hash().to_owned(),
        }
    }

    /// The `EVALSHA` of `decide` for `calls` (see `lua/decide.lua` for
    /// the layout: each limit's parameters once per call).
    pub(crate) fn command<'a>(
        &self,
        calls: impl Iterator<Item = (&'a Plan, &'a Ask)> + Clone,
    ) -> Cmd {
        // The call's distinct limits (by pointer: a config shares one Arc
        // per limit), and each item's number among them.
        let mut limits: SmallVec<[&Arc<Limit>; 8]> = SmallVec::new();
        let mut numbers: SmallVec<[usize; MAX_PLANS]> = SmallVec::new();
        // `own_items`: the items of plans that send a third number per
        // item (items asked hits of their own, below).
        let (mut plans, mut keys, mut own_items) = (0, 0, 0);
        for (plan, ask) in calls.clone() {
            plans += 1;
            if !ask.inspect && plan.items().iter().any(|it| it.hits.is_some()) {
                own_items += plan.len();
            }
            for item in plan.items() {
                keys += 1;
                let n = match limits.iter().position(|l| Arc::ptr_eq(l, &item.limit)) {
                    Some(n) => n,
                    None => {
                        limits.push(&item.limit);
                        limits.len() - 1
                    }
                };
                numbers.push(n + 1);
            }
        }
        let args = 5 + keys * 3 + own_items + limits.len() * 10 + plans * 6;
        let mut cmd = Cmd::with_capacity(args, keys * (self.prefix.len() + 64) + args * 8);
        cmd.arg("EVALSHA").arg(&self.sha).arg(keys);
        let mut buf = Vec::new();
        for (plan, _) in calls.clone() {
            for item in plan.items() {
                buf.clear();
                write_state_key(&mut buf, &self.prefix, plan.affinity(), &item.key);
                cmd.arg(&buf[..]);
            }
        }
        cmd.arg(plans).arg(limits.len());
        // One time for the call's calendar windows: the latest of its
        // decisions (they were asked within the call's batching delay).
        let server_now = calls
            .clone()
            .map(|(_, ask)| ask.server_now)
            .max()
            .unwrap_or(Nanos::ZERO);
        let mut text = String::new();
        for limit in &limits {
            let e = params::encode(limit, server_now);
            cmd.arg(e.code);
            e.write(&mut cmd, &mut text);
        }
        let mut numbers = numbers.into_iter();
        for (plan, ask) in calls {
            match ask.now {
                None => cmd.arg("").arg(""),
                Some(now) => {
                    let n = now.as_u64();
                    cmd.arg(n / 1_000_000_000).arg(n % 1_000_000_000)
                }
            };
            let mode: i8 = if ask.inspect {
                -1
            } else {
                match ask.mode {
                    Mode::Try => 0,
                    Mode::Acquire => 1,
                    Mode::Report => 2,
                    Mode::Refund => 3,
                }
            };
            // A plan some item of which is asked hits of its own sends its
            // length negated and a third number per item: those hits, or
            // -1 for the request's (`lua/decide.lua`). Every other plan
            // keeps two numbers per item, and so does an inspection, which
            // reads each item as it stands (zero hits), whatever it would
            // be asked (as the memory store's `probe`).
            let own = !ask.inspect && plan.items().iter().any(|it| it.hits.is_some());
            let len = i64::try_from(plan.len()).unwrap_or(i64::MAX);
            cmd.arg(mode)
                .arg(ask.request.hits)
                .arg(ask.request.min_hits)
                .arg(if own { -len } else { len });
            for item in plan.items() {
                cmd.arg(numbers.next().unwrap_or(0))
                    .arg(u8::from(item.shadow));
                if own {
                    match item.hits {
                        Some(h) => cmd.arg(h),
                        None => cmd.arg(-1),
                    };
                }
            }
        }
        cmd
    }
}

/// Sends a `decide` call, loading the script first if Redis answers
/// `NOSCRIPT` (after a restart or a `SCRIPT FLUSH`).
pub(crate) async fn send(conn: &mut impl ConnectionLike, cmd: &Cmd) -> RedisResult<Value> {
    // A server error comes back as a value; made an error here.
    let first = conn
        .req_packed_command(cmd)
        .await
        .and_then(Value::extract_error);
    match first {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(crate::script::DECIDE)
                .query_async::<String>(conn)
                .await?;
            conn.req_packed_command(cmd)
                .await
                .and_then(Value::extract_error)
        }
        other => other,
    }
}

/// The length of one plan's part of a reply whose status is `status`.
pub(crate) fn reply_len(status: i64, items: usize) -> usize {
    if status == 0 {
        1 + reply::HEADER + items * reply::PER_ITEM
    } else {
        2
    }
}

/// Splits a batch reply into each plan's part, in order; `None` if it
/// does not have the expected shape.
fn split(
    reply: &[i64],
    items: impl Iterator<Item = usize>,
) -> Option<smallvec::SmallVec<[std::ops::Range<usize>; MAX_PLANS]>> {
    let mut parts = smallvec::SmallVec::new();
    let mut at = 0;
    for n in items {
        let len = reply_len(*reply.get(at)?, n);
        let end = at.checked_add(len).filter(|&e| e <= reply.len())?;
        parts.push(at..end);
        at = end;
    }
    (at == reply.len()).then_some(parts)
}

/// The parts of each plan's answer in a call's reply, which is decoded
/// into `ints` (see [`split`]); `items` gives each plan's item count, in
/// the call's order.
pub(crate) fn parts(
    value: Value,
    items: impl Iterator<Item = usize>,
    ints: &mut Vec<i64>,
) -> Result<smallvec::SmallVec<[std::ops::Range<usize>; MAX_PLANS]>, StoreError> {
    let bytes = match value {
        Value::BulkString(b) => b,
        // Named by its kind only: a value of any size must not go whole
        // into an error that is logged.
        other => {
            let kind = match other {
                Value::Nil => "nil",
                Value::Int(_) => "an integer",
                Value::Array(_) => "an array",
                Value::SimpleString(_) => "a status",
                Value::Okay => "OK",
                _ => "another type",
            };
            return Err(StoreError::Unavailable(format!(
                "the Redis script answered malformed data: {kind} instead of MessagePack"
            )));
        }
    };
    reply::msgpack_ints(&bytes, ints)?;
    split(ints, items).ok_or_else(|| {
        StoreError::Unavailable(
            "the Redis script answered malformed data: a batch of the wrong shape".into(),
        )
    })
}

/// The drivers of a single Redis's connections.
#[derive(Clone)]
pub(crate) struct Batcher {
    queues: Arc<[mpsc::Sender<Job>]>,
    next: Arc<AtomicUsize>,
    max_waiting: usize,
}

impl Batcher {
    /// Starts a driver per connection in `managers`; at most
    /// `max_waiting` decisions wait to be sent over all of them, and a
    /// connection on which Redis answers nothing for `timeout` fails what
    /// it carries.
    pub(crate) fn start(
        managers: Vec<Link>,
        encoder: Arc<Encoder>,
        timeout: Duration,
        max_waiting: usize,
    ) -> Batcher {
        // The bound split exactly (three connections of 8,192 are 2,731,
        // 2,731 and 2,730), each queue at least one.
        let n = managers.len().max(1);
        let (per, extra) = (max_waiting / n, max_waiting % n);
        let queues: Vec<mpsc::Sender<Job>> = managers
            .into_iter()
            .enumerate()
            .map(|(i, conn)| {
                let room = (per + usize::from(i < extra)).max(1);
                let (tx, rx) = mpsc::channel(room);
                tokio::spawn(drive(conn, Arc::clone(&encoder), rx, timeout));
                tx
            })
            .collect();
        Batcher {
            queues: queues.into(),
            next: Arc::new(AtomicUsize::new(0)),
            max_waiting,
        }
    }

    /// Decides `plan` in the next call of a driver with room in its queue,
    /// or sheds it if none has.
    pub(crate) async fn decide(&self, plan: &Plan, ask: Ask) -> Answer {
        let mut plans = SmallVec::new();
        plans.push((plan.clone(), ask));
        let (mut answers, sent) = self.queue(plans).await?;
        let d = answers.pop().ok_or_else(|| {
            Failure::Store(StoreError::Unavailable("no answer for a plan".into()))
        })?;
        Ok((d, sent))
    }

    /// Decides `plans` together in the next call of a driver with room in
    /// its queue (one job, never split across calls: one script run), or
    /// sheds them if none has. Answered as a whole: every plan's answer,
    /// or the call's failure.
    pub(crate) async fn decide_together(&self, plans: SmallVec<[(Plan, Ask); 1]>) -> Answers {
        self.queue(plans).await
    }

    async fn queue(&self, plans: SmallVec<[(Plan, Ask); 1]>) -> Answers {
        let (answer, answered) = oneshot::channel();
        let mut job = Job { plans, answer };
        let n = self.queues.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            match self.queues[(first + i) % n].try_send(job) {
                Ok(()) => return answered.await.unwrap_or_else(|_| Err(stopped())),
                Err(mpsc::error::TrySendError::Full(j)) => job = j,
                Err(mpsc::error::TrySendError::Closed(_)) => return Err(stopped()),
            }
        }
        Err(Failure::Overloaded(self.max_waiting))
    }
}

fn stopped() -> Failure {
    Failure::Redis(RedisError::from(std::io::Error::other(
        "the Redis store's decision driver stopped",
    )))
}

/// The error of a connection on which Redis answered nothing for `limit`.
pub(crate) fn timed_out(limit: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("Redis did not answer within {limit:?}"),
    ))
}

/// A call in flight.
struct InFlight {
    id: u64,
    /// The generation of the link's connection it was sent on.
    generation: u64,
    /// Stops its task (whose reply will never be read).
    abort: tokio::task::AbortHandle,
    sent: Instant,
    /// `sent`, on the clock the over-limit cache reads.
    sent_at: std::time::Instant,
    jobs: Vec<Job>,
}

async fn drive(conn: Link, encoder: Arc<Encoder>, mut rx: mpsc::Receiver<Job>, timeout: Duration) {
    let mut calls: JoinSet<(u64, RedisResult<Value>)> = JoinSet::new();
    let mut flight: VecDeque<InFlight> = VecDeque::with_capacity(DEPTH);
    let mut next_id = 0u64;
    // When Redis last answered a call on this connection.
    let mut answered = Instant::now();
    let mut ints = Vec::new();
    // Decisions taken from the queue, for the next call.
    let mut pending: Vec<Job> = Vec::with_capacity(MAX_PLANS);
    // Told when the link moves to a new master (Sentinel).
    let mut switches = conn.subscribe();
    loop {
        // The next call goes at once when nothing is in flight; beside a
        // call in flight, only with half a batch or more: smaller calls
        // would cost Redis and the server their fixed part again for
        // little (measured: batches of 11 instead of 19 cost Redis 10%
        // more per decision), while the one in flight keeps Redis busy.
        // (`flight`, not `calls`: an aborted call stays in `calls` until
        // it is reaped, but is answered already.)
        let room = flight.is_empty() || (flight.len() < DEPTH && pending.len() >= MAX_PLANS / 2);
        if room && !pending.is_empty() {
            // Callers that stopped waiting (went away) were told nothing
            // was decided: do not spend their hits now.
            pending.retain(|j| !j.answer.is_closed());
            if pending.is_empty() {
                continue;
            }
            let jobs = std::mem::replace(&mut pending, Vec::with_capacity(MAX_PLANS));
            let cmd = encoder.command(
                jobs.iter()
                    .flat_map(|j| j.plans.iter().map(|(plan, ask)| (plan, ask))),
            );
            next_id += 1;
            let id = next_id;
            // The link's connection now: after a failover (Sentinel),
            // the new master's.
            let linked = conn.linked();
            let mut c = linked.conn;
            let sent_at = std::time::Instant::now();
            let abort = calls.spawn(async move { (id, send(&mut c, &cmd).await) });
            flight.push_back(InFlight {
                id,
                generation: linked.generation,
                abort,
                sent: Instant::now(),
                sent_at,
                jobs,
            });
            continue;
        }
        let silent_until = flight.front().map(|f| f.sent.max(answered) + timeout);
        tokio::select! {
            biased;
            Some(done) = calls.join_next(), if !calls.is_empty() => {
                // A call task never panics; an aborted one (its link
                // moved on) was answered when it was aborted.
                let Ok((id, result)) = done else { continue };
                answered = Instant::now();
                let Some(at) = flight.iter().position(|f| f.id == id) else { continue };
                let Some(call) = flight.remove(at) else { continue };
                finish(call.jobs, call.sent_at, result, &mut ints);
            }
            Ok(()) = switches.changed() => {
                // The link moved to a new master. Calls still in flight on
                // an older connection may never be answered (an old master
                // that died without closing its sockets), and must not hold
                // their decisions, nor those queued behind them, until its
                // TCP connection gives up; nor may their silence fail
                // decisions the new master answers. Whether the old master
                // counted them is unknown: they are answered as such, not
                // sent again (sent twice, a decision could count twice).
                let now = switches.borrow_and_update().generation;
                let mut kept = VecDeque::with_capacity(DEPTH);
                for call in flight.drain(..) {
                    if call.generation < now {
                        call.abort.abort();
                        for job in call.jobs {
                            let _ = job.answer.send(Err(Failure::Switched));
                        }
                    } else {
                        kept.push_back(call);
                    }
                }
                flight = kept;
                // Silence is counted on the new connection from now.
                answered = Instant::now();
            }
            () = tokio::time::sleep_until(silent_until.unwrap_or_else(Instant::now)),
                if silent_until.is_some() =>
            {
                // An answer may be in, not yet read because this task ran
                // first (a busy machine): let the connection's reader run.
                tokio::task::yield_now().await;
                let mut late = false;
                while let Some(done) = calls.try_join_next() {
                    // An aborted call (Err) was answered already.
                    let Ok((id, result)) = done else { continue };
                    late = true;
                    answered = Instant::now();
                    if let Some(at) = flight.iter().position(|f| f.id == id) {
                        if let Some(call) = flight.remove(at) {
                            finish(call.jobs, call.sent_at, result, &mut ints);
                        }
                    }
                    break;
                }
                if late {
                    continue;
                }
                // Silent for the whole timeout: Redis stalled or the
                // connection is dead. What is in flight and what waits
                // behind it fail now; their replies, should they come, are
                // dropped by the connection.
                calls = JoinSet::new();
                let e = timed_out(timeout);
                let waiting = std::iter::from_fn(|| rx.try_recv().ok());
                let stuck: Vec<Job> = flight
                    .drain(..)
                    .flat_map(|call| call.jobs)
                    .chain(pending.drain(..))
                    .chain(waiting)
                    .collect();
                for job in stuck {
                    let _ = job.answer.send(Err(Failure::Redis(e.clone())));
                }
                answered = Instant::now();
            }
            job = rx.recv(), if pending.len() < MAX_PLANS => {
                // Every sender gone: the store was dropped.
                let Some(job) = job else { break };
                pending.push(job);
                while pending.len() < MAX_PLANS {
                    match rx.try_recv() {
                        Ok(j) => pending.push(j),
                        Err(_) => break,
                    }
                }
            }
        }
    }
}

/// Answers the jobs of a call sent at `sent_at` from its result.
fn finish(
    jobs: Vec<Job>,
    sent_at: std::time::Instant,
    result: RedisResult<Value>,
    ints: &mut Vec<i64>,
) {
    let value = match result {
        Ok(v) => v,
        Err(e) => {
            for job in jobs {
                let _ = job.answer.send(Err(Failure::Redis(e.clone())));
            }
            return;
        }
    };
    let lens = jobs
        .iter()
        .flat_map(|j| j.plans.iter().map(|(plan, _)| plan.len()));
    match parts(value, lens, ints) {
        Ok(parts) => {
            let mut ranges = parts.into_iter();
            for job in jobs {
                // A job's answers, or the first refusal among them (its
                // other plans were decided all the same: the script decides
                // each on its own; callers check first what the script
                // would refuse).
                let mut answers = SmallVec::new();
                let mut refused = None;
                for (plan, ask) in &job.plans {
                    let Some(range) = ranges.next() else {
                        refused.get_or_insert(StoreError::Unavailable(
                            "a decide reply answered too few plans".into(),
                        ));
                        break;
                    };
                    match reply::plan_outcome(&ints[range], plan, ask.request.hits, ask.mode) {
                        Ok(d) => answers.push(d),
                        Err(e) => {
                            refused.get_or_insert(e);
                        }
                    }
                }
                let answer = match refused {
                    Some(e) => Err(Failure::Store(e)),
                    None => Ok((answers, sent_at)),
                };
                let _ = job.answer.send(answer);
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.answer.send(Err(Failure::Store(e.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_keys_name_the_affinity_limit_and_domain() {
        let mut out = Vec::new();
        let key = Key::new(tollgate_store::LimitId(0xabc), "acme");
        write_state_key(&mut out, "tollgate:", 0x1f, &key);
        assert_eq!(
            String::from_utf8_lossy(&out),
            format!("tollgate:{{{:016x}}}:l:{}:acme", 0x1f, key.limit)
        );
    }

    #[test]
    fn a_batch_reply_splits_by_status_and_item_count() {
        let decided_one = [0, 2, 1, 0, -1, 0, 2, 1, 10, 8, 5, -1, 0, -1, 0, 0, 0, 7];
        let mut reply = decided_one.to_vec();
        reply.extend([2, 0]);
        reply.extend(decided_one);
        let parts = split(&reply, [1, 3, 1].into_iter()).unwrap_or_default();
        assert_eq!(parts.len(), 3);
        assert_eq!(reply[parts[0].clone()], decided_one);
        assert_eq!(reply[parts[1].clone()], [2, 0]);
        assert_eq!(reply[parts[2].clone()], decided_one);
        // Too short, too long, or a count that does not match: no split.
        assert!(split(&reply[..reply.len() - 1], [1, 3, 1].into_iter()).is_none());
        assert!(split(&reply, [1, 3].into_iter()).is_none());
        assert!(split(&reply, [2, 3, 1].into_iter()).is_none());
    }
}

#[cfg(all(test, feature = "testing"))]
mod silence {
    use super::*;
    use crate::testing::RedisServer;
    use crate::{RedisOptions, RedisStore};
    use tollgate_core::{Rate, TokenBucket};
    use tollgate_store::{LimitId, Store};

    /// Regression (review of issue 17, finding 3): the connections timed
    /// each request from its own sending (redis-rs's response timeout), so
    /// a decision call pipelined behind a slow one failed while Redis was
    /// still answering. The driver's silence rule is the only timer now: a
    /// call fails when Redis has answered nothing on its connection for the
    /// timeout, counted from its sending or from the last answer, whichever
    /// is later.
    ///
    /// The order is made, not hoped for: Redis is stopped (SIGSTOP), and
    /// each send is seen to reach it (its unread bytes) before the next.
    /// On the driver's one connection go a decision call, then `CLIENT
    /// PAUSE` for 0.6 timeouts (sent on the same connection: Redis answers
    /// it and the call before it, and postpones what follows), then a
    /// second decision call; Redis stays stopped for 0.7 timeouts after
    /// that. It then answers the first call at once and the second 0.6
    /// timeouts later: 1.3 timeouts after the second was sent (so a timer
    /// from its sending must fail it, whatever the machine's pace), but
    /// within the timeout of the first answer (so the silence rule must
    /// not, with 0.4 timeouts to spare for a busy machine). (`DEBUG SLEEP`
    /// would not do: Redis sends the replies of what it read in one go
    /// only after running all of it, the sleep included.)
    #[tokio::test]
    async fn a_call_pipelined_behind_a_slow_one_is_timed_by_silence_not_by_its_sending() {
        let server = RedisServer::start();
        let timeout = Duration::from_secs(3);
        let mut o = RedisOptions::new(server.url());
        o.prefix = "silence:".into();
        o.connect.connections = 1;
        o.connect.response_timeout = timeout;
        // Before the fix the connections' own timer was the larger of the
        // decision timeout and the heartbeat TTL: the same here.
        o.heartbeat_ttl = timeout;
        o.rejection_cache = 0;
        let store = RedisStore::connect(o).await.unwrap();
        let limit = Arc::new(Limit::TokenBucket(
            TokenBucket::new(100, Rate::per_second(10).unwrap()).unwrap(),
        ));
        let ask = |user: usize| {
            let store = store.clone();
            let plan = Plan::single(
                Key::new(LimitId(1), &format!("user-{user}")),
                Arc::clone(&limit),
            );
            async move {
                store
                    .decide(&plan, Nanos::ZERO, Hits::exactly(1), Mode::Try)
                    .await
            }
        };
        // Loads the script: each call below is one EVALSHA.
        assert!(ask(0).await.unwrap().allowed);
        // The driver's connection (the store has one).
        let mut conn = store.conn.links().remove(0).linked().conn;
        server.pause();
        let unread = server.unread_bytes();
        let first = tokio::spawn(ask(1));
        let unread = server.await_unread_beyond(unread).await;
        let pause = tokio::spawn(async move {
            redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg((timeout * 6 / 10).as_millis() as u64)
                .arg("ALL")
                .query_async::<()>(&mut conn)
                .await
        });
        let unread = server.await_unread_beyond(unread).await;
        // Half a batch: the driver sends it beside the call in flight.
        let second: Vec<_> = (2..2 + MAX_PLANS / 2)
            .map(|user| tokio::spawn(ask(user)))
            .collect();
        server.await_unread_beyond(unread).await;
        // The stall: both calls and the pause wait in Redis.
        tokio::time::sleep(timeout * 7 / 10).await;
        server.resume();
        assert!(first.await.unwrap().unwrap().allowed);
        for d in second {
            match d.await.unwrap() {
                Ok(d) => assert!(d.allowed),
                Err(e) => panic!("a decision behind the pause failed: {e}"),
            }
        }
        pause.await.unwrap().unwrap();
    }
}
