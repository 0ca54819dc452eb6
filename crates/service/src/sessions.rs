//! Sessions and their hold sets (Charon §4.2, §4.3.1).
//!
//! Every copy a client holds belongs to a session. A gRPC session lives as
//! long as its stream; an HTTP hold is a session with a lease that lapses
//! unless renewed. When a session ends, for whatever reason, everything it
//! still holds is released: a client crash or a network cut leaks nothing.
//!
//! The hold set is the session's own record of what it holds, by pool,
//! domain and the groups the copies were reserved in. It is what makes a
//! release that names no groups work, what refuses to release another
//! session's copies, and what a closing session gives back. It does not
//! depend on the config: holds taken before a reload are released after it
//! even if their resource is gone.
//!
//! This module is the bookkeeping only, all synchronous: the store calls
//! that move copies, and the rule that keeps a record and the store in step
//! whatever the caller does, are in [`crate::service`]. The rule, in short:
//! copies enter a record only after the store counted them, and leave it
//! before the store uncounts them, so the store never counts fewer copies
//! than the records hold, and any excess belongs to an operation in flight
//! that will either record or release it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tollgate_core::copies::{normalize_groups, CopyError, Groups};
use tollgate_core::Nanos;
use tollgate_store::{Held, PoolKey, StoreError};

use crate::error::{Holding, NotHeld, ServiceError};

/// A session's id: random, so that knowing one's own tells nothing about
/// another's (an HTTP hold id is a capability).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u128);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::str::FromStr for SessionId {
    type Err = ServiceError;
    fn from_str(s: &str) -> Result<SessionId, ServiceError> {
        // Only the first characters are echoed back: an id is 32 of them,
        // and an error must not carry a stranger's megabyte.
        let shown = || s.chars().take(64).collect::<String>();
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ServiceError::UnknownHold(shown()));
        }
        u128::from_str_radix(s, 16)
            .map(SessionId)
            .map_err(|_| ServiceError::UnknownHold(shown()))
    }
}

/// What a session holds of one pool, for one domain, in one set of groups.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct HoldKey {
    pub(crate) pool: PoolKey,
    pub(crate) domain: String,
    pub(crate) groups: Groups,
}

impl HoldKey {
    /// `copies` of this key, as the store names them.
    pub(crate) fn held(&self, copies: u64) -> Held<'_> {
        Held {
            pool: &self.pool,
            domain: &self.domain,
            groups: &self.groups,
            copies,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    holds: HashMap<HoldKey, u64>,
    /// Set once the session is closing: a grant that arrives after it is
    /// given back at once instead of being recorded.
    closed: bool,
    /// When a leased session lapses, and the lease it renews to.
    lease: Option<(Nanos, Nanos)>,
}

/// Why copies could not enter a session's record.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum NotRecorded {
    /// The session ended meanwhile.
    Closed,
    /// The session holds copies under as many distinct keys as it may.
    Full(usize),
}

impl From<NotRecorded> for ServiceError {
    fn from(n: NotRecorded) -> ServiceError {
        match n {
            NotRecorded::Closed => ServiceError::SessionClosed,
            NotRecorded::Full(max) => ServiceError::TooManyHolds(max),
        }
    }
}

/// One session: an id and a hold set.
#[derive(Debug)]
pub struct Session {
    id: SessionId,
    state: Mutex<State>,
}

impl Session {
    /// The session's id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// Copies held, in all pools.
    pub fn held(&self) -> u64 {
        saturating_sum(self.lock().holds.values().copied())
    }

    /// When a leased session lapses (`None`: it lasts as long as its
    /// connection).
    pub fn expires_at(&self) -> Option<Nanos> {
        self.lock().lease.map(|(at, _)| at)
    }

    /// Whether the session has ended.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a plain map, consistent after every statement: a
        // panic elsewhere while holding the lock leaves nothing half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether recording under `key` would need a new entry the session has
    /// no room for (checked before asking the store, so a full session is
    /// refused without a round trip; [`Session::record`] checks again).
    pub(crate) fn would_overflow(&self, key: &HoldKey, max_holds: usize) -> bool {
        let state = self.lock();
        !state.holds.contains_key(key) && state.holds.len() >= max_holds
    }

    /// Adds `copies` the store just counted to the record, unless the
    /// session ended or has no room; then the caller must release them.
    pub(crate) fn record(
        &self,
        key: &HoldKey,
        copies: u64,
        max_holds: usize,
    ) -> Result<(), NotRecorded> {
        let mut state = self.lock();
        if state.closed {
            return Err(NotRecorded::Closed);
        }
        if let Some(n) = state.holds.get_mut(key) {
            *n = n.saturating_add(copies);
            return Ok(());
        }
        if state.holds.len() >= max_holds {
            return Err(NotRecorded::Full(max_holds));
        }
        state.holds.insert(key.clone(), copies);
        Ok(())
    }

    /// Removes `copies` of `pool` held for `domain` from the record (from
    /// holds in exactly `groups` if given, else the largest first), or
    /// nothing; the caller then owns them until the store answers.
    /// `operation` names what they are taken for in a refusal.
    pub(crate) fn take(
        &self,
        pool: &PoolKey,
        domain: &str,
        groups: Option<&[String]>,
        copies: u64,
        operation: &'static str,
    ) -> Result<Vec<(HoldKey, u64)>, ServiceError> {
        if copies == 0 {
            return Err(ServiceError::Store(StoreError::Copy(CopyError::ZeroCopies)));
        }
        let wanted = groups.map(normalize_groups);
        let mut state = self.lock();
        if state.closed {
            // Its lease lapsed (or it was closed) while this ran: what it
            // held is already released.
            return Err(ServiceError::SessionClosed);
        }
        let mut candidates: Vec<(HoldKey, u64)> = state
            .holds
            .iter()
            .filter(|(k, _)| k.pool == *pool && k.domain == domain)
            .filter(|(k, _)| wanted.as_ref().is_none_or(|g| k.groups == *g))
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        let held = saturating_sum(candidates.iter().map(|(_, n)| *n));
        if held < copies {
            let (namespace, resource) = pool.parts();
            let (holds, more) = holdings(&state.holds, pool, domain);
            return Err(ServiceError::NotHeld(Box::new(NotHeld {
                holder: if state.lease.is_some() {
                    "hold"
                } else {
                    "session"
                },
                operation,
                namespace,
                resource,
                domain: domain.to_owned(),
                groups: wanted,
                held,
                requested: copies,
                holds,
                more,
            })));
        }
        // Largest holds first: a release naming no groups touches as few
        // group sets as it can.
        candidates.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.groups.cmp(&b.0.groups)));
        let mut left = copies;
        let mut taken = Vec::new();
        for (key, n) in candidates {
            if left == 0 {
                break;
            }
            let t = n.min(left);
            left -= t;
            if let Some(h) = state.holds.get_mut(&key) {
                *h -= t;
                if *h == 0 {
                    state.holds.remove(&key);
                }
            }
            taken.push((key, t));
        }
        Ok(taken)
    }

    /// Puts back copies [`Session::take`] removed, after the store refused
    /// to move them. Returns them if the session ended meanwhile: they
    /// were out of its record when it released everything, so the caller
    /// must release them.
    pub(crate) fn give_back(&self, taken: Vec<(HoldKey, u64)>) -> Vec<(HoldKey, u64)> {
        let mut state = self.lock();
        if state.closed {
            return taken;
        }
        for (key, n) in taken {
            // Never refused for room: these entries were in the record a
            // moment ago, and a give-back that could fail would leak.
            let h = state.holds.entry(key).or_default();
            *h = h.saturating_add(n);
        }
        Vec::new()
    }

    /// Copies of `pool` held for `domain`.
    pub(crate) fn held_of(&self, pool: &PoolKey, domain: &str) -> u64 {
        self.lock()
            .holds
            .iter()
            .filter(|(k, _)| k.pool == *pool && k.domain == domain)
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add)
    }

    /// Marks the session ended and takes everything it holds, which the
    /// caller must release. Closing twice takes nothing the second time.
    pub(crate) fn close(&self) -> Vec<(HoldKey, u64)> {
        let mut state = self.lock();
        state.closed = true;
        std::mem::take(&mut state.holds).into_iter().collect()
    }

    fn holds_by_pool(&self, out: &mut HashMap<PoolKey, u64>) {
        for (k, n) in &self.lock().holds {
            let total = out.entry(k.pool.clone()).or_default();
            *total = total.saturating_add(*n);
        }
    }
}

/// What a record holds, for a refusal to say: the entries of `pool` and
/// `domain` first, then of `pool`, then the rest, each by most copies; at
/// most [`NotHeld::SHOWN`] of them, and how many more there are.
///
/// Runs under the session's lock on every refusal, over a record of up to
/// `max_holds` entries: the few shown are selected in linear time, and
/// only they are sorted and cloned.
fn holdings(holds: &HashMap<HoldKey, u64>, pool: &PoolKey, domain: &str) -> (Vec<Holding>, usize) {
    let rank = |k: &HoldKey| match (k.pool == *pool, k.domain == domain) {
        (true, true) => 0,
        (true, false) => 1,
        _ => 2,
    };
    let order = |(a, m): &(&HoldKey, u64), (b, n): &(&HoldKey, u64)| {
        rank(a)
            .cmp(&rank(b))
            .then(n.cmp(m))
            .then_with(|| (&a.pool.0, &a.domain, &a.groups).cmp(&(&b.pool.0, &b.domain, &b.groups)))
    };
    let mut entries: Vec<(&HoldKey, u64)> = holds.iter().map(|(k, n)| (k, *n)).collect();
    let more = entries.len().saturating_sub(NotHeld::SHOWN);
    if more > 0 {
        entries.select_nth_unstable_by(NotHeld::SHOWN - 1, order);
        entries.truncate(NotHeld::SHOWN);
    }
    entries.sort_unstable_by(order);
    let shown = entries
        .into_iter()
        .map(|(k, copies)| {
            let (namespace, resource) = k.pool.parts();
            Holding {
                namespace,
                resource,
                domain: k.domain.clone(),
                groups: k.groups.clone(),
                copies,
            }
        })
        .collect();
    (shown, more)
}

/// The sum of `counts`, saturating: a session may hold `u64::MAX` copies
/// of an unconfigured resource under each of several keys.
pub(crate) fn saturating_sum(counts: impl IntoIterator<Item = u64>) -> u64 {
    counts.into_iter().fold(0, u64::saturating_add)
}

/// How many sessions may be open, and how much each may record.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// Sessions open at once (gRPC streams and HTTP holds together).
    pub max_sessions: usize,
    /// Distinct (resource, domain, groups) entries one session may hold
    /// copies under: bounds a session's record in entries (and, with the
    /// service's name limit, in bytes).
    pub max_holds: usize,
}

impl Default for SessionLimits {
    fn default() -> SessionLimits {
        SessionLimits {
            max_sessions: 100_000,
            max_holds: 1_000,
        }
    }
}

/// Open sessions, by id.
#[derive(Debug, Default)]
pub struct Sessions {
    open: Mutex<HashMap<SessionId, Arc<Session>>>,
    limits: SessionLimits,
    opened: AtomicU64,
}

impl Sessions {
    /// No sessions yet, at most `limits`.
    pub fn new(limits: SessionLimits) -> Sessions {
        Sessions {
            open: Mutex::default(),
            limits,
            opened: AtomicU64::new(0),
        }
    }

    /// The limits.
    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    fn map(&self) -> MutexGuard<'_, HashMap<SessionId, Arc<Session>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session. With `lease = Some(ttl)` it lapses at `now + ttl`
    /// unless renewed (HTTP holds). Fails with
    /// [`ServiceError::TooManySessions`] at the limit.
    pub fn open(&self, lease: Option<Nanos>, now: Nanos) -> Result<Arc<Session>, ServiceError> {
        let mut map = self.map();
        if map.len() >= self.limits.max_sessions {
            metrics::counter!("tollgate_sessions_refused_total").increment(1);
            return Err(ServiceError::TooManySessions(self.limits.max_sessions));
        }
        let mut id = SessionId(uuid::Uuid::new_v4().as_u128());
        while map.contains_key(&id) {
            id = SessionId(uuid::Uuid::new_v4().as_u128());
        }
        let session = Arc::new(Session {
            id,
            state: Mutex::new(State {
                lease: lease.map(|ttl| (now.saturating_add(ttl), ttl)),
                ..State::default()
            }),
        });
        map.insert(id, Arc::clone(&session));
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(session)
    }

    /// The open session `id`.
    pub fn get(&self, id: SessionId) -> Result<Arc<Session>, ServiceError> {
        self.map()
            .get(&id)
            .cloned()
            .ok_or_else(|| ServiceError::UnknownHold(id.to_string()))
    }

    /// The live HTTP hold named `id`: a leased session whose lease has not
    /// lapsed by `now`. gRPC sessions have no lease and are not holds (their
    /// holds belong to their stream alone); a lapsed hold is unknown even
    /// before housekeeping reaps it, exactly as after.
    pub fn hold(&self, id: &str, now: Nanos) -> Result<Arc<Session>, ServiceError> {
        if id.is_empty() {
            return Err(ServiceError::Malformed("hold_id is required".into()));
        }
        let id: SessionId = id.parse()?;
        let session = self.get(id)?;
        match session.expires_at() {
            Some(at) if at > now => Ok(session),
            _ => Err(ServiceError::UnknownHold(id.to_string())),
        }
    }

    /// Forgets `id` (its session is closing).
    pub(crate) fn remove(&self, id: SessionId) {
        self.map().remove(&id);
    }

    /// Sessions open now.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// Sessions opened since start.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Every open session.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.map().values().cloned().collect()
    }

    /// The leased sessions that lapsed by `now`.
    pub fn lapsed(&self, now: Nanos) -> Vec<Arc<Session>> {
        self.map()
            .values()
            .filter(|s| s.expires_at().is_some_and(|at| at <= now))
            .cloned()
            .collect()
    }

    /// Copies held by all sessions, by pool.
    pub fn holds_by_pool(&self) -> HashMap<PoolKey, u64> {
        let mut out = HashMap::new();
        for s in self.all() {
            s.holds_by_pool(&mut out);
        }
        out
    }

    /// Extends a leased session to `now + ttl` (its own lease when `ttl` is
    /// `None`); returns when it now lapses.
    pub fn renew(
        &self,
        id: SessionId,
        ttl: Option<Nanos>,
        now: Nanos,
    ) -> Result<Nanos, ServiceError> {
        let session = self.get(id)?;
        let mut state = session.lock();
        let (at, own) = state
            .lease
            .as_mut()
            .ok_or_else(|| ServiceError::UnknownHold(id.to_string()))?;
        if *at <= now {
            // Lapsed but not yet reaped: too late, as if reaped.
            return Err(ServiceError::UnknownHold(id.to_string()));
        }
        let ttl = ttl.unwrap_or(*own);
        *own = ttl;
        *at = now.saturating_add(ttl);
        Ok(*at)
    }
}
