//! Copy operations whose caller stopped waiting.
//!
//! A copy operation (reserve, release, transfer, seize) waits at most the
//! decision timeout. But once sent, Redis may still apply it after its
//! caller was told it failed, or after the caller went away. The session
//! and the copy log would then disagree for good: copies counted that no
//! session holds (a leak until the server dies), or copies a session holds
//! that are no longer counted.
//!
//! So every copy operation runs to its end in a task of its own
//! ([`Pending`]). If its caller is no longer waiting when it ends and Redis
//! applied it, the inverse operation is applied: a caller told "failed"
//! finds that nothing changed. If the outcome stays unknown (no answer
//! within the connections' own timeout, a heartbeat TTL) or the inverse
//! fails, the server resigns: its part of the copy log can no longer be
//! trusted, and resigning ends its sessions and lets a survivor clean up.

use std::time::Duration;

use redis::{RedisError, Value};
use tokio::task::JoinHandle;
use tollgate_core::copies::{Groups, TransferId};
use tollgate_core::Nanos;

use crate::store::{int, text, RedisStore};

/// How to take back a copy operation applied after its caller gave up.
pub(crate) enum Undo {
    /// Nothing to take back.
    Nothing,
    /// A reservation: release what it granted.
    Reserve { domain: String, groups: Groups },
    /// A release: count the copies again.
    Release {
        domain: String,
        groups: Groups,
        copies: u64,
    },
    /// A transfer: seize the staged copies back.
    Transfer { id: TransferId },
    /// A seize: release what it took.
    Seize,
}

/// A copies-script call in flight. Dropped before its result was taken
/// (timed out, or its caller went away), it is settled when it ends.
pub(crate) struct Pending {
    store: RedisStore,
    a: u64,
    pool: String,
    now: Nanos,
    call: Option<JoinHandle<Result<Value, RedisError>>>,
    undo: Undo,
}

impl Pending {
    /// Sends copies-script `op` on the pool with affinity `a`.
    pub(crate) fn start(
        store: &RedisStore,
        a: u64,
        pool: &str,
        now: Nanos,
        op: &'static str,
        args: Vec<String>,
        undo: Undo,
    ) -> Pending {
        let call = tokio::spawn({
            let store = store.clone();
            let pool = pool.to_owned();
            async move { store.copies_call(a, &pool, now, op, &args).await }
        });
        Pending {
            store: store.clone(),
            a,
            pool: pool.to_owned(),
            now,
            call: Some(call),
            undo,
        }
    }

    /// The call's result, or `None` if it did not end within `limit` (it
    /// goes on, and is settled when it ends).
    pub(crate) async fn wait(mut self, limit: Duration) -> Option<Result<Value, RedisError>> {
        let call = self.call.as_mut()?;
        let joined = tokio::time::timeout(limit, call).await.ok()?;
        self.call = None;
        Some(joined.unwrap_or_else(|e| Err(lost(&e.to_string()))))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let undo = std::mem::replace(&mut self.undo, Undo::Nothing);
        let store = self.store.clone();
        let (a, pool, now) = (self.a, std::mem::take(&mut self.pool), self.now);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(settle(store, a, pool, now, call, undo));
            }
            Err(_) => {
                call.abort();
                store
                    .log
                    .resign("a copy operation was abandoned with no runtime left to settle it");
            }
        }
    }
}

fn lost(why: &str) -> RedisError {
    RedisError::from(std::io::Error::other(format!(
        "the Redis call was lost: {why}"
    )))
}

/// Waits for an abandoned call and takes back what it did.
async fn settle(
    store: RedisStore,
    a: u64,
    pool: String,
    now: Nanos,
    call: JoinHandle<Result<Value, RedisError>>,
    undo: Undo,
) {
    let outcome = call.await.unwrap_or_else(|e| Err(lost(&e.to_string())));
    let value = match outcome {
        Ok(v) => v,
        // Refused (not held, unknown transfer, ...): nothing changed.
        Err(e) if e.code() == Some("TOLLGATE") => return,
        Err(e) => {
            store.log.resign(&format!(
                "a copy operation's outcome is unknown (Redis gave no answer): {e}"
            ));
            return;
        }
    };
    let Some((op, args)) = inverse(undo, &value) else {
        return;
    };
    match store.copies_call(a, &pool, now, op, &args).await {
        Ok(_) => tracing::info!(
            pool = ?pool,
            undo = op,
            "took back a copy operation that Redis applied after its caller gave up"
        ),
        Err(e) => {
            store.log.resign(&format!(
                "a copy operation applied after its caller gave up could not be taken back ({op}): {e}"
            ));
        }
    }
}

/// The copies-script call that takes back an operation that answered
/// `value`; `None` if it changed nothing.
fn inverse(undo: Undo, value: &Value) -> Option<(&'static str, Vec<String>)> {
    let items: &[Value] = match value {
        Value::Array(v) => v,
        _ => &[],
    };
    let with_groups = |domain: String, copies: u64, groups: Groups| {
        let mut args = vec![domain, copies.to_string()];
        args.extend(groups);
        args
    };
    match undo {
        Undo::Nothing => None,
        Undo::Reserve { domain, groups } => {
            let granted = int(items.first());
            (granted > 0).then(|| ("release", with_groups(domain, granted, groups)))
        }
        Undo::Release {
            domain,
            groups,
            copies,
        } => Some(("restore", with_groups(domain, copies, groups))),
        Undo::Transfer { id } => Some(("seize", vec![id.to_string()])),
        Undo::Seize => {
            let groups = items.iter().skip(5).map(|v| text(Some(v))).collect();
            let copies = int(items.get(2));
            (copies > 0).then(|| ("release", with_groups(text(items.get(1)), copies, groups)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn each_operation_is_taken_back_by_its_inverse() {
        let groups = vec!["big".to_owned()];
        let reserved = Value::Array(vec![Value::Int(3), Value::Int(1)]);
        assert_eq!(
            inverse(
                Undo::Reserve {
                    domain: "acme".into(),
                    groups: groups.clone()
                },
                &reserved
            ),
            Some(("release", vec!["acme".into(), "3".into(), "big".into()]))
        );
        let nothing = Value::Array(vec![Value::Int(0), Value::Int(0)]);
        let undo = Undo::Reserve {
            domain: "acme".into(),
            groups: Vec::new(),
        };
        assert_eq!(inverse(undo, &nothing), None);
        let undo = Undo::Release {
            domain: "acme".into(),
            groups: groups.clone(),
            copies: 2,
        };
        assert_eq!(
            inverse(undo, &Value::Int(0)),
            Some(("restore", vec!["acme".into(), "2".into(), "big".into()]))
        );
        let id = TransferId(7 << 64 | 9);
        assert_eq!(
            inverse(Undo::Transfer { id }, &Value::Int(0)),
            Some(("seize", vec![id.to_string()]))
        );
        let seized = Value::Array(vec![
            bulk("ns\u{1f}db"),
            bulk("globex"),
            Value::Int(4),
            Value::Int(1),
            Value::Int(2),
            bulk("big"),
        ]);
        assert_eq!(
            inverse(Undo::Seize, &seized),
            Some(("release", vec!["globex".into(), "4".into(), "big".into()]))
        );
        assert_eq!(inverse(Undo::Nothing, &seized), None);
    }
}
