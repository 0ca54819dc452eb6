//! Decisions batched into one script call.
//!
//! Pipelining alone (seed 002, "multiple round trips") still costs one
//! `EVALSHA` per decision: its write and read on both sides, and the
//! script's fixed cost in Redis (setting up the call, reading `TIME`). So
//! concurrent decisions share a call: each Redis connection has a driver
//! task that sends whatever decisions queued up while its previous call
//! was in flight as one `decide` call, which decides the plans one after
//! the other, each all or nothing (`lua/decide.lua`). Nothing waits to
//! fill a batch: a decision alone is sent at once, as before; batches grow
//! only when decisions arrive faster than Redis answers. Redis runs the
//! whole call atomically, which orders the batch's decisions as if they
//! had arrived back to back.
//!
//! A Redis Cluster gets no driver: plans of different namespaces live in
//! different slots, so each decision is a call of its own there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use redis::{RedisError, Script};
use tokio::sync::{mpsc, oneshot};

use crate::conn::Conn;

/// At most this many plans in one call: a call holds Redis for its whole
/// length, so batches stay short (a few hundred microseconds).
const MAX_PLANS: usize = 32;

/// Decisions queued per driver before callers wait for room.
const QUEUE: usize = 1024;

/// One plan's share of a `decide` call: its keys and its arguments (see
/// `lua/decide.lua`).
pub(crate) struct PlanCall {
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

/// What a call answered for one plan: its part of the reply (status
/// first), or the error the whole call failed with.
pub(crate) type PlanReply = Result<Vec<i64>, RedisError>;

struct Job {
    call: PlanCall,
    /// The plan's item count, which gives the length of its part of
    /// the reply ([`reply_len`]).
    items: usize,
    answer: oneshot::Sender<PlanReply>,
}

/// The drivers of a single Redis's connections.
#[derive(Clone)]
pub(crate) struct Batcher {
    queues: Arc<[mpsc::Sender<Job>]>,
    next: Arc<AtomicUsize>,
}

impl Batcher {
    /// Starts `drivers` driver tasks sending `decide` calls on `conn`.
    pub(crate) fn start(conn: &Conn, script: &Script, drivers: usize) -> Batcher {
        let queues: Vec<mpsc::Sender<Job>> = (0..drivers.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel(QUEUE);
                tokio::spawn(drive(conn.clone(), script.clone(), rx));
                tx
            })
            .collect();
        Batcher {
            queues: queues.into(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Decides `call` (a plan of `items` items) in the next call of a
    /// driver; answers its part of the reply.
    pub(crate) async fn decide(&self, call: PlanCall, items: usize) -> PlanReply {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.queues.len();
        let (answer, answered) = oneshot::channel();
        let job = Job {
            call,
            items,
            answer,
        };
        if self.queues[i].send(job).await.is_err() {
            return Err(stopped());
        }
        answered.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn stopped() -> RedisError {
    RedisError::from(std::io::Error::other(
        "the Redis store's decision driver stopped",
    ))
}

/// Sends one `decide` call for `calls` on `conn` (also what a cluster
/// does, with one plan).
pub(crate) async fn invoke<'a>(
    conn: &Conn,
    script: &Script,
    calls: impl Iterator<Item = &'a PlanCall> + Clone,
) -> Result<Vec<i64>, RedisError> {
    let mut inv = script.prepare_invoke();
    inv.arg(calls.clone().count());
    for c in calls {
        for k in &c.keys {
            inv.key(k);
        }
        for a in &c.args {
            inv.arg(a.as_str());
        }
    }
    conn.invoke(&inv).await
}

/// The length of one plan's part of a reply whose status is `status`.
pub(crate) fn reply_len(status: i64, items: usize) -> usize {
    if status == 0 {
        1 + crate::reply::HEADER + items * crate::reply::PER_ITEM
    } else {
        2
    }
}

/// Splits a batch reply into each plan's part, in order; `None` if it
/// does not have the expected shape.
fn split(reply: &[i64], items: impl Iterator<Item = usize>) -> Option<Vec<Vec<i64>>> {
    let mut parts = Vec::new();
    let mut at = 0;
    for n in items {
        let len = reply_len(*reply.get(at)?, n);
        parts.push(reply.get(at..at + len)?.to_vec());
        at += len;
    }
    (at == reply.len()).then_some(parts)
}

async fn drive(conn: Conn, script: Script, mut rx: mpsc::Receiver<Job>) {
    let mut jobs: Vec<Job> = Vec::with_capacity(MAX_PLANS);
    while let Some(first) = rx.recv().await {
        jobs.push(first);
        while jobs.len() < MAX_PLANS {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        // Callers that stopped waiting (timed out while Redis was slow, or
        // went away) were told nothing was decided: do not spend their
        // hits now.
        jobs.retain(|j| !j.answer.is_closed());
        if jobs.is_empty() {
            continue;
        }
        let result = invoke(&conn, &script, jobs.iter().map(|j| &j.call)).await;
        match result {
            Ok(reply) => match split(&reply, jobs.iter().map(|j| j.items)) {
                Some(parts) => {
                    for (job, part) in jobs.drain(..).zip(parts) {
                        let _ = job.answer.send(Ok(part));
                    }
                }
                None => {
                    let e = RedisError::from((
                        redis::ErrorKind::Parse,
                        "the decide script answered a batch of the wrong shape",
                    ));
                    for job in jobs.drain(..) {
                        let _ = job.answer.send(Err(e.clone()));
                    }
                }
            },
            Err(e) => {
                for job in jobs.drain(..) {
                    let _ = job.answer.send(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_reply_splits_by_status_and_item_count() {
        let decided_one = [0, 2, 1, 0, -1, 0, 2, 1, 10, 8, 5, -1, 0, -1, 0, 0, 0, 7];
        let mut reply = decided_one.to_vec();
        reply.extend([2, 0]);
        reply.extend(decided_one);
        let parts = split(&reply, [1, 3, 1].into_iter()).unwrap_or_default();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], decided_one);
        assert_eq!(parts[1], [2, 0]);
        assert_eq!(parts[2], decided_one);
        // Too short, too long, or a count that does not match: no split.
        assert!(split(&reply[..reply.len() - 1], [1, 3, 1].into_iter()).is_none());
        assert!(split(&reply, [1, 3].into_iter()).is_none());
        assert!(split(&reply, [2, 3, 1].into_iter()).is_none());
    }
}
