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

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tollgate_core::copies::{normalize_groups, CopyError, Groups, TransferId};
use tollgate_core::{Nanos, Request};
use tollgate_store::{PoolKey, Seized, Store, StoreError};

use crate::error::ServiceError;
use crate::limiter::{Limiter, ReserveOutcome};

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
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ServiceError::UnknownHold(s.chars().take(64).collect()));
        }
        u128::from_str_radix(s, 16)
            .map(SessionId)
            .map_err(|_| ServiceError::UnknownHold(s.to_owned()))
    }
}

/// What a session holds of one pool, for one domain, in one set of groups.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct HoldKey {
    pool: PoolKey,
    domain: String,
    groups: Groups,
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
        self.lock().holds.values().sum()
    }

    /// When a leased session lapses (`None`: it lasts as long as its
    /// connection).
    pub fn expires_at(&self) -> Option<Nanos> {
        self.lock().lease.map(|(at, _)| at)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a plain map, consistent after every statement: a
        // panic elsewhere while holding the lock leaves nothing half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How many sessions may be open, in all and per connection.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// Sessions open at once (gRPC streams and HTTP holds together).
    pub max_sessions: usize,
}

impl Default for SessionLimits {
    fn default() -> SessionLimits {
        SessionLimits {
            max_sessions: 100_000,
        }
    }
}

/// The result of a session release.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Released {
    /// Copies released.
    pub released: u64,
    /// Copies of that pool and domain the session still holds.
    pub still_held: u64,
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

    fn map(&self) -> MutexGuard<'_, HashMap<SessionId, Arc<Session>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session. With `lease = Some(ttl)` it lapses at `now + ttl`
    /// unless renewed (HTTP holds). Fails with
    /// [`ServiceError::TooManySessions`] at the limit.
    pub fn open(&self, lease: Option<Nanos>, now: Nanos) -> Result<Arc<Session>, ServiceError> {
        let mut map = self.map();
        if map.len() >= self.limits.max_sessions {
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

    /// Copies held by all sessions, by pool.
    pub fn holds_by_pool(&self) -> HashMap<PoolKey, u64> {
        let sessions: Vec<Arc<Session>> = self.map().values().cloned().collect();
        let mut out: HashMap<PoolKey, u64> = HashMap::new();
        for s in sessions {
            for (k, n) in &s.lock().holds {
                *out.entry(k.pool.clone()).or_default() += n;
            }
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

    /// Reserves copies into `session` (Charon §3.1 `reserve`).
    #[allow(clippy::too_many_arguments)]
    pub async fn reserve<S: Store>(
        &self,
        limiter: &Limiter<S>,
        session: &Session,
        namespace: &str,
        resource: &str,
        domain: &str,
        request: Request,
        now: Nanos,
    ) -> Result<ReserveOutcome, ServiceError> {
        let outcome = limiter
            .reserve(namespace, resource, domain, request, now)
            .await?;
        let reservation = &outcome.reservation;
        if reservation.granted == 0 {
            return Ok(outcome);
        }
        let key = HoldKey {
            pool: PoolKey::new(namespace, resource),
            domain: domain.to_owned(),
            groups: reservation.groups.clone(),
        };
        record(limiter, session, key, reservation.granted).await?;
        Ok(outcome)
    }

    /// Releases `copies` the session holds of `resource` for `domain`;
    /// `groups` picks holds taken in exactly those groups, `None` takes
    /// from any (the largest first).
    #[allow(clippy::too_many_arguments)]
    pub async fn release<S: Store>(
        &self,
        limiter: &Limiter<S>,
        session: &Session,
        namespace: &str,
        resource: &str,
        domain: &str,
        groups: Option<&[String]>,
        copies: u64,
    ) -> Result<Released, ServiceError> {
        let pool = PoolKey::new(namespace, resource);
        let taken = take(
            limiter, session, &pool, namespace, resource, domain, groups, copies,
        )?;
        for (i, (key, n)) in taken.iter().enumerate() {
            if let Err(e) = limiter
                .release_pool(&key.pool, &key.domain, &key.groups, *n)
                .await
            {
                // The store did not release: the session still holds these
                // and the ones not yet tried.
                give_back(limiter, session, &taken[i..]).await;
                return Err(e);
            }
        }
        let still_held = held_of(&session.lock(), &pool, domain);
        Ok(Released {
            released: copies,
            still_held,
        })
    }

    /// Stages `copies` the session holds for another client; they leave
    /// the session now and are released at `now + ttl` unless seized.
    #[allow(clippy::too_many_arguments)]
    pub async fn transfer<S: Store>(
        &self,
        limiter: &Limiter<S>,
        session: &Session,
        namespace: &str,
        resource: &str,
        domain: &str,
        groups: Option<&[String]>,
        copies: u64,
        ttl: Nanos,
        now: Nanos,
    ) -> Result<TransferId, ServiceError> {
        let pool = PoolKey::new(namespace, resource);
        let taken = take(
            limiter, session, &pool, namespace, resource, domain, groups, copies,
        )?;
        // A transfer stages one group set; copies held under several are
        // staged as one only when they share it.
        let [(key, n)] = taken.as_slice() else {
            give_back(limiter, session, &taken).await;
            return Err(ServiceError::Malformed(format!(
                "the {copies} copies of `{resource}` held for `{domain}` were reserved in \
                 different groups; transfer them per group (name `groups`)"
            )));
        };
        match limiter
            .transfer_pool(&key.pool, &key.domain, &key.groups, *n, ttl, now)
            .await
        {
            Ok(id) => Ok(id),
            Err(e) => {
                give_back(limiter, session, &taken).await;
                Err(e)
            }
        }
    }

    /// Takes staged copies into `session` (Charon §3.1 `seize`).
    pub async fn seize<S: Store>(
        &self,
        limiter: &Limiter<S>,
        session: &Session,
        id: TransferId,
        now: Nanos,
    ) -> Result<Seized, ServiceError> {
        let seized = limiter.seize(id, now).await?;
        let key = HoldKey {
            pool: seized.pool.clone(),
            domain: seized.staged.domain.clone(),
            groups: seized.staged.groups.clone(),
        };
        record(limiter, session, key, seized.staged.copies).await?;
        Ok(seized)
    }

    /// Ends `session`: it leaves the open set and everything it holds is
    /// released. Returns the copies released. Closing twice releases once.
    pub async fn close<S: Store>(&self, limiter: &Limiter<S>, session: &Session) -> u64 {
        self.map().remove(&session.id);
        let holds = {
            let mut state = session.lock();
            state.closed = true;
            std::mem::take(&mut state.holds)
        };
        let mut released = 0;
        for (key, n) in holds {
            if release_or_report(limiter, session.id, &key, n).await {
                released += n;
            }
        }
        released
    }

    /// Closes every leased session that lapsed by `now`; returns how many.
    pub async fn reap<S: Store>(&self, limiter: &Limiter<S>, now: Nanos) -> usize {
        let lapsed: Vec<Arc<Session>> = self
            .map()
            .values()
            .filter(|s| s.expires_at().is_some_and(|at| at <= now))
            .cloned()
            .collect();
        for s in &lapsed {
            self.close(limiter, s).await;
        }
        lapsed.len()
    }

    /// Closes every session (server shutdown); returns the copies released.
    pub async fn close_all<S: Store>(&self, limiter: &Limiter<S>) -> u64 {
        let all: Vec<Arc<Session>> = self.map().values().cloned().collect();
        let mut released = 0;
        for s in &all {
            released += self.close(limiter, s).await;
        }
        released
    }
}

/// Records `copies` just granted into `session`'s hold set; if the session
/// ended while the store was answering, nobody would ever release them, so
/// they are given back at once and the caller is told.
async fn record<S: Store>(
    limiter: &Limiter<S>,
    session: &Session,
    key: HoldKey,
    copies: u64,
) -> Result<(), ServiceError> {
    let closed = {
        let mut state = session.lock();
        if !state.closed {
            *state.holds.entry(key.clone()).or_default() += copies;
        }
        state.closed
    };
    if closed {
        limiter
            .release_pool(&key.pool, &key.domain, &key.groups, copies)
            .await?;
        return Err(ServiceError::SessionClosed);
    }
    Ok(())
}

fn held_of(state: &State, pool: &PoolKey, domain: &str) -> u64 {
    state
        .holds
        .iter()
        .filter(|(k, _)| k.pool == *pool && k.domain == domain)
        .map(|(_, n)| n)
        .sum()
}

/// Removes `copies` from the session's record, or nothing; says why not.
#[allow(clippy::too_many_arguments)]
fn take<S: Store>(
    limiter: &Limiter<S>,
    session: &Session,
    pool: &PoolKey,
    namespace: &str,
    resource: &str,
    domain: &str,
    groups: Option<&[String]>,
    copies: u64,
) -> Result<Vec<(HoldKey, u64)>, ServiceError> {
    crate::limiter::check_names(namespace, resource)?;
    if copies == 0 {
        return Err(ServiceError::Store(StoreError::Copy(CopyError::ZeroCopies)));
    }
    let wanted = groups.map(normalize_groups);
    let mut state = session.lock();
    if state.closed {
        // Its lease lapsed (or it was closed) while this ran: what it held
        // is already released.
        return Err(ServiceError::SessionClosed);
    }
    let mut candidates: Vec<(HoldKey, u64)> = state
        .holds
        .iter()
        .filter(|(k, _)| k.pool == *pool && k.domain == domain)
        .filter(|(k, _)| wanted.as_ref().is_none_or(|g| k.groups == *g))
        .map(|(k, n)| (k.clone(), *n))
        .collect();
    let held: u64 = candidates.iter().map(|(_, n)| n).sum();
    if held < copies {
        drop(state);
        if held == 0 {
            // Nothing of it here: a better error if the name is wrong.
            limiter.copy_pool(namespace, resource, "release")?;
        }
        return Err(ServiceError::Store(StoreError::Copy(CopyError::NotHeld {
            domain: domain.to_owned(),
            groups: wanted.unwrap_or_default(),
            held,
            requested: copies,
        })));
    }
    // Largest holds first: a release naming no groups touches as few group
    // sets as it can.
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

/// Puts copies back into the session's record after the store refused to
/// release or stage them.
async fn give_back<S: Store>(limiter: &Limiter<S>, session: &Session, taken: &[(HoldKey, u64)]) {
    let closed = {
        let mut state = session.lock();
        if !state.closed {
            for (key, n) in taken {
                *state.holds.entry(key.clone()).or_default() += n;
            }
        }
        state.closed
    };
    if closed {
        // The session ended meanwhile and released what it held; these were
        // out of its record then, so they are released here or nowhere.
        for (key, n) in taken {
            release_or_report(limiter, session.id, key, *n).await;
        }
    }
}

/// Releases copies nothing else will release; a failure is logged and
/// counted, as there is no one left to tell.
async fn release_or_report<S: Store>(
    limiter: &Limiter<S>,
    id: SessionId,
    key: &HoldKey,
    n: u64,
) -> bool {
    match limiter
        .release_pool(&key.pool, &key.domain, &key.groups, n)
        .await
    {
        Ok(()) => true,
        Err(e) => {
            metrics::counter!("tollgate_session_release_failures_total").increment(1);
            tracing::error!(session = %id, pool = ?key.pool.0, domain = ?key.domain, copies = n, error = ?e.to_string(), "releasing a closed session's holds failed");
            false
        }
    }
}
