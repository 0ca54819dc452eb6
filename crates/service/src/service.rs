//! The [`Service`]: the limiter, the sessions and the clock behind one
//! facade, and the rule that keeps every copy with exactly one owner.
//!
//! # Copy operations are driven to an outcome
//!
//! A copy operation (reserve, release, transfer, seize) moves copies
//! between a session's record and the store's counts. Between the two
//! there is a round trip to the store that may stall for longer than the
//! caller waits, and a caller that may go away (an HTTP client that hangs
//! up makes hyper drop the handler's future). If the operation belonged to
//! its caller, either would leave the record and the store disagreeing for
//! good: copies counted that no session holds (a leak), or held copies
//! that are no longer counted.
//!
//! So every copy operation runs in a task of its own (DESIGN.md's failure
//! model), which owns the copies in flight and drives the store call to a
//! definitive answer (the store retries under one [`OpId`] until it knows,
//! and applies the operation at most once). The caller waits for the
//! outcome at most [`ServiceOptions::copy_deadline`]. Whoever comes first,
//! the outcome or the caller giving up (the deadline, or its future being
//! dropped), decides under one lock ([`Handoff`]):
//!
//! - the outcome first: the task applies it to the session's record and
//!   hands it over;
//! - the caller first: the caller is told the store did not answer, and
//!   when the outcome arrives the task *undoes* it, so that what the caller
//!   was told ("nothing happened") is true: a grant is released, a release
//!   is counted again and put back in the record, a transfer is seized back
//!   into the record, a seize is released.
//!
//! Ending a session (close, lapse, stream end, shutdown) is never undone:
//! the session's copies leave its record at once and their releases are
//! driven to the end whatever anyone waits for.
//!
//! # Order of record and store
//!
//! Copies enter a record only after the store counted them and leave it
//! before the store uncounts them, so the store never counts fewer copies
//! than the records hold, and an excess is always owned by a task in
//! flight that will record or release it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tollgate_core::copies::{CopyError, TransferId};
use tollgate_core::{Hits, Nanos};
use tollgate_store::{OpId, PoolKey, Seized, Store, StoreError};

use crate::clock::Clock;
use crate::error::ServiceError;
use crate::limiter::{
    Counters, DescriptorOutcome, DescriptorRequest, Limiter, RateOutcome, RateRequest,
    ReserveOutcome,
};
use crate::sessions::{saturating_sum, HoldKey, Session, SessionLimits, Sessions};

/// Counter: copy operations whose caller stopped waiting before the store
/// answered, by operation.
const ABANDONED: &str = "tollgate_copy_ops_abandoned_total";
/// Counter: copy operations undone because their caller had stopped
/// waiting when the store applied them, by operation.
const UNDONE: &str = "tollgate_copy_ops_undone_total";
/// Counter: releases nothing else would retry that the store refused or
/// could never answer (copies that may stay counted; each is logged).
const RELEASE_FAILURES: &str = "tollgate_session_release_failures_total";
/// Gauge: copy operations in flight.
const IN_FLIGHT: &str = "tollgate_copy_ops_in_flight";
/// Counter: copy operations refused because too many were in flight.
const SHED: &str = "tollgate_copy_ops_shed_total";
/// Counter: copy operations refused for a name longer than
/// [`ServiceOptions::max_name_bytes`], or for naming more than
/// [`MAX_NAMED_GROUPS`] groups.
const NAMES_TOO_LONG: &str = "tollgate_names_too_long_total";

/// The most groups a release or transfer that names no hold may name. A
/// hold's groups are those its domain was in when it was reserved: a list
/// equal to them is always taken, however long (the client names them back
/// as the reserve gave them). A list that names no hold is refused past
/// this bound as malformed, not echoed in a `not_held`: it bounds what a
/// stranger's request makes the service compare against its bounds and
/// could have echoed.
pub const MAX_NAMED_GROUPS: usize = 64;

/// Which resource, for whom.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// The resource.
    pub resource: &'a str,
    /// On whose behalf.
    pub domain: &'a str,
}

/// How the service bounds what clients make it do.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ServiceOptions {
    /// Sessions, and how much each may record.
    pub sessions: SessionLimits,
    /// How long a caller waits for a copy operation's outcome before it is
    /// told the store did not answer (the operation is then undone when
    /// the store does).
    pub copy_deadline: Duration,
    /// Longest namespace, resource or domain name of a copy operation, in
    /// bytes: bounds what a hold costs in a session's record and in the
    /// store's pools.
    pub max_name_bytes: usize,
    /// Copy operations that may wait for the store at once. A store that
    /// stalls for long would otherwise pile up one task per request; past
    /// this, new operations are answered `store_unavailable` at once
    /// (releases of ending sessions and undos are never refused).
    pub max_in_flight: usize,
}

impl Default for ServiceOptions {
    fn default() -> ServiceOptions {
        ServiceOptions {
            sessions: SessionLimits::default(),
            copy_deadline: Duration::from_secs(1),
            max_name_bytes: 1024,
            max_in_flight: 10_000,
        }
    }
}

/// The result of releasing copies from a session.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Released {
    /// Copies released.
    pub released: u64,
    /// Copies of that pool and domain the session still holds.
    pub still_held: u64,
}

/// The result of ending a session.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Closed {
    /// Copies the session held, all of them released or being released.
    pub released: u64,
    /// Whether the store had not yet confirmed every release when the
    /// answer was given (they are driven to the end regardless).
    pub pending: bool,
}

/// Answers limiting requests and owns sessions: the one entry point of the
/// surfaces. See the [module docs](self).
pub struct Service<S> {
    limiter: Limiter<S>,
    sessions: Sessions,
    clock: Arc<dyn Clock>,
    options: ServiceOptions,
    in_flight: Arc<InFlight>,
}

impl<S> std::fmt::Debug for Service<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("options", &self.options)
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl<S: Store> Service<S> {
    /// A service over `limiter`, reading time from `clock`.
    pub fn new(limiter: Limiter<S>, clock: Arc<dyn Clock>, options: ServiceOptions) -> Service<S> {
        Service {
            limiter,
            sessions: Sessions::new(options.sessions),
            clock,
            options,
            in_flight: Arc::default(),
        }
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<S> {
        &self.limiter
    }

    /// The open sessions.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// The clock every surface reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Now, by the service's clock.
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The options.
    pub fn options(&self) -> &ServiceOptions {
        &self.options
    }

    /// Copy operations in flight (their tasks, undoing included).
    pub fn in_flight(&self) -> usize {
        self.in_flight.count.load(Ordering::Relaxed)
    }

    /// Decides a rate request (Charon §3.1 `request`) now. Its domain is
    /// not bounded here: a store keeps a long one as a digest
    /// ([`tollgate_store::Key`]), so every key costs a bounded number of
    /// bytes.
    pub async fn request(&self, req: &RateRequest<'_>) -> Result<RateOutcome, ServiceError> {
        self.limiter.request(req, self.now()).await
    }

    /// [`Service::request`] at `now`, a reading of [`Service::now`] the
    /// caller took anyway (for its log and metrics): one clock read a
    /// decision rather than two.
    pub async fn request_at(
        &self,
        req: &RateRequest<'_>,
        now: Nanos,
    ) -> Result<RateOutcome, ServiceError> {
        self.limiter.request(req, now).await
    }

    /// The live state of `domain`'s counters of `resource` now
    /// ([`Limiter::inspect`]): nothing charged, nothing created.
    pub async fn inspect(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
    ) -> Result<Counters, ServiceError> {
        self.limiter
            .inspect(namespace, resource, domain, self.now())
            .await
    }

    /// Resets `domain`'s counters of `resource` now ([`Limiter::reset`]);
    /// answers how many limits were reset.
    pub async fn reset(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
    ) -> Result<usize, ServiceError> {
        self.limiter
            .reset(namespace, resource, domain, self.now())
            .await
    }

    /// Decides envoyproxy/ratelimit-style descriptors now (bounded in
    /// bytes by the surface's message size; long values are kept as
    /// digests, as domains are).
    pub async fn request_descriptors(
        &self,
        req: &DescriptorRequest<'_>,
    ) -> Result<DescriptorOutcome, ServiceError> {
        self.limiter.request_descriptors(req, self.now()).await
    }

    /// Refuses a name longer than [`ServiceOptions::max_name_bytes`].
    fn check_name(&self, what: &str, name: &str) -> Result<(), ServiceError> {
        let max = self.options.max_name_bytes;
        if name.len() > max {
            metrics::counter!(NAMES_TOO_LONG).increment(1);
            return Err(ServiceError::Malformed(format!(
                "the {what} is {} bytes long; the limit is {max} bytes",
                name.len()
            )));
        }
        Ok(())
    }

    /// Refuses a new copy operation at once while `max_in_flight` wait
    /// for the store. Checked before anything is taken out of a session's
    /// record, so a refused operation has moved nothing.
    fn admit(&self, op: &'static str) -> Result<(), ServiceError> {
        if self.in_flight() >= self.options.max_in_flight {
            metrics::counter!(SHED, "op" => op).increment(1);
            return Err(ServiceError::Store(StoreError::Unavailable(format!(
                "{} copy operations are already waiting for the store; the {op} was not sent",
                self.options.max_in_flight
            ))));
        }
        Ok(())
    }

    fn check_target(&self, t: &Target<'_>) -> Result<(), ServiceError> {
        crate::limiter::check_names(t.namespace, t.resource)?;
        self.check_name("namespace", t.namespace)?;
        self.check_name("resource", t.resource)?;
        self.check_name("domain", t.domain)
    }

    /// Refuses a list of groups that names no hold when it is longer than
    /// [`MAX_NAMED_GROUPS`], or has a name longer than
    /// [`ServiceOptions::max_name_bytes`]: the rule of the other names of a
    /// copy operation.
    fn check_groups(&self, groups: Option<&[String]>) -> Result<(), ServiceError> {
        let Some(groups) = groups else {
            return Ok(());
        };
        if groups.len() > MAX_NAMED_GROUPS {
            metrics::counter!(NAMES_TOO_LONG).increment(1);
            return Err(ServiceError::Malformed(format!(
                "the request names {} groups; the limit is {MAX_NAMED_GROUPS} (a hold is in \
                 the groups its domain was in when it was reserved; name none to take from any)",
                groups.len()
            )));
        }
        groups.iter().try_for_each(|g| self.check_name("group", g))
    }

    /// Opens a session; with `lease = Some(ttl)` it lapses `ttl` from now
    /// unless renewed (an HTTP hold).
    pub fn open(&self, lease: Option<Nanos>) -> Result<Arc<Session>, ServiceError> {
        let session = self.sessions.open(lease, self.now())?;
        metrics::gauge!("tollgate_sessions").set(self.sessions.len() as f64);
        Ok(session)
    }

    /// The live HTTP hold `id` (see [`Sessions::hold`]).
    pub fn hold(&self, id: &str) -> Result<Arc<Session>, ServiceError> {
        self.sessions.hold(id, self.now())
    }

    /// Extends the HTTP hold `id` to `ttl` from now (its own lease when
    /// `None`); returns when it now lapses.
    pub fn renew(&self, id: &str, ttl: Option<Nanos>) -> Result<Nanos, ServiceError> {
        let session = self.hold(id)?;
        self.sessions.renew(session.id(), ttl, self.now())
    }
}

impl<S: Store> Service<S> {
    /// Reserves copies into `session` (Charon §3.1 `reserve`).
    pub async fn reserve(
        self: &Arc<Self>,
        session: &Arc<Session>,
        target: Target<'_>,
        request: Hits,
    ) -> Result<ReserveOutcome, ServiceError> {
        self.check_target(&target)?;
        if session.is_closed() {
            return Err(ServiceError::SessionClosed);
        }
        self.admit("reserve")?;
        // Refused before the store is asked: a full session must not make
        // the store count copies it would have to give back.
        let groups = self
            .limiter
            .copy_groups(target.namespace, target.resource, target.domain)?;
        let key = HoldKey {
            pool: PoolKey::new(target.namespace, target.resource),
            domain: target.domain.to_owned(),
            groups,
        };
        let max_holds = self.options.sessions.max_holds;
        if session.would_overflow(&key, max_holds) {
            return Err(ServiceError::TooManyHolds(max_holds));
        }
        let (namespace, resource, domain) = (
            target.namespace.to_owned(),
            target.resource.to_owned(),
            target.domain.to_owned(),
        );
        let now = self.now();
        let session = Arc::clone(session);
        self.run("reserve", move |svc, handoff| async move {
            let outcome = svc
                .limiter
                .reserve(&namespace, &resource, &domain, request, now, OpId::random())
                .await;
            let (granted, groups) = match &outcome {
                Ok(o) if o.reservation.granted > 0 => {
                    (o.reservation.granted, o.reservation.groups.clone())
                }
                _ => {
                    // Nothing granted: nothing to record or undo.
                    handoff.deliver(|| outcome);
                    return;
                }
            };
            let key = HoldKey {
                pool: PoolKey::new(&namespace, &resource),
                domain,
                groups,
            };
            let mut unrecorded = false;
            let delivered = handoff.deliver(|| match session.record(&key, granted, max_holds) {
                Ok(()) => outcome,
                Err(not) => {
                    unrecorded = true;
                    Err(not.into())
                }
            });
            if !delivered {
                svc.undone("reserve");
                svc.release_for_good(&key, granted, "undoing an abandoned reserve")
                    .await;
            } else if unrecorded {
                svc.release_for_good(&key, granted, "a grant its session could not record")
                    .await;
            }
        })
        .await
    }

    /// Releases `copies` the session holds of `target`; `groups` picks
    /// holds taken in exactly those groups, `None` takes from any (the
    /// largest first).
    pub async fn release(
        self: &Arc<Self>,
        session: &Arc<Session>,
        target: Target<'_>,
        groups: Option<&[String]>,
        copies: u64,
    ) -> Result<Released, ServiceError> {
        self.admit("release")?;
        let (pool, taken) = self.take(session, &target, groups, copies, "release")?;
        let domain = target.domain.to_owned();
        let session = Arc::clone(session);
        self.run("release", move |svc, handoff| async move {
            let mut done: Vec<(HoldKey, u64)> = Vec::with_capacity(taken.len());
            let mut refused = None;
            let mut rest = taken.into_iter();
            for (key, n) in rest.by_ref() {
                match svc
                    .limiter
                    .store()
                    .release(key.held(n), OpId::random())
                    .await
                {
                    Ok(()) => done.push((key, n)),
                    Err(e) => {
                        refused = Some((e, (key, n)));
                        break;
                    }
                }
            }
            let delivered = match refused {
                Some((e, first)) => {
                    // Refused (not held, or this server resigned): the
                    // store did not release these, so the session still
                    // holds them. A refused release changes nothing, so
                    // what it released of other holds is counted again
                    // and recorded before the caller hears of it. What
                    // the store will not count again stays released, and
                    // the caller is told so: a release of that much, not
                    // an error (the hold is what the answer says).
                    let back: Vec<_> = std::iter::once(first).chain(rest).collect();
                    let gone = svc.restore_released(&session, done).await;
                    let leftovers = session.give_back(back);
                    handoff.deliver(|| {
                        if gone.is_empty() {
                            return Err(ServiceError::Store(e));
                        }
                        Ok(Released {
                            released: saturating_sum(gone.iter().map(|(_, n)| *n)),
                            still_held: session.held_of(&pool, &domain),
                        })
                    });
                    for (key, n) in leftovers {
                        svc.release_for_good(&key, n, "a refused release whose session closed")
                            .await;
                    }
                    // Nothing left to undo: the rest was put back above.
                    return;
                }
                None => {
                    let released = saturating_sum(done.iter().map(|(_, n)| *n));
                    handoff.deliver(|| {
                        Ok(Released {
                            released,
                            still_held: session.held_of(&pool, &domain),
                        })
                    })
                }
            };
            if !delivered {
                svc.undo_releases(&session, done).await;
            }
        })
        .await
    }

    /// Stages `copies` the session holds of `target` for another client;
    /// they leave the session now and are released `ttl` from now unless
    /// seized.
    pub async fn transfer(
        self: &Arc<Self>,
        session: &Arc<Session>,
        target: Target<'_>,
        groups: Option<&[String]>,
        copies: u64,
        ttl: Nanos,
    ) -> Result<TransferId, ServiceError> {
        self.admit("transfer")?;
        let (_, taken) = self.take(session, &target, groups, copies, "transfer")?;
        // A transfer stages one group set; copies held under several are
        // staged as one only when they share it.
        let [(key, n)] = <[_; 1]>::try_from(taken).map_err(|taken: Vec<_>| {
            // Nothing was sent: the record takes them back (and, were the
            // session closing, `close` would find them there or not at all).
            let leftovers = session.give_back(taken);
            debug_assert!(leftovers.is_empty() || session.is_closed());
            self.release_later(leftovers);
            ServiceError::Malformed(format!(
                "the {copies} copies of `{}` held for `{}` were reserved in different groups; \
                 transfer them per group (name `groups`)",
                target.resource, target.domain
            ))
        })?;
        let now = self.now();
        let session = Arc::clone(session);
        self.run("transfer", move |svc, handoff| async move {
            let staged = svc
                .limiter
                .store()
                .transfer(key.held(n), ttl, now, OpId::random())
                .await;
            match staged {
                Ok(id) => {
                    if handoff.deliver(|| Ok(id)) {
                        return;
                    }
                    svc.undone("transfer");
                    // Nobody learnt the id: take the copies back into the
                    // session they left.
                    match svc
                        .limiter
                        .store()
                        .take_back(id, svc.now(), OpId::random())
                        .await
                    {
                        Ok(seized) => svc.record_or_release(&session, &seized).await,
                        // Expired meanwhile (released by the store): done.
                        Err(StoreError::Copy(CopyError::UnknownTransfer)) => {}
                        Err(e) => tracing::error!(error = %e, "undoing an abandoned transfer failed; its copies stay staged until its ttl"),
                    }
                }
                Err(e) => {
                    let leftovers = session.give_back(vec![(key, n)]);
                    handoff.deliver(|| Err(ServiceError::Store(e)));
                    for (key, n) in leftovers {
                        svc.release_for_good(&key, n, "a refused transfer whose session closed")
                            .await;
                    }
                }
            }
        })
        .await
    }

    /// Takes staged copies into `session` (Charon §3.1 `seize`).
    pub async fn seize(
        self: &Arc<Self>,
        session: &Arc<Session>,
        id: TransferId,
    ) -> Result<Seized, ServiceError> {
        if session.is_closed() {
            return Err(ServiceError::SessionClosed);
        }
        self.admit("seize")?;
        let now = self.now();
        let session = Arc::clone(session);
        let max_holds = self.options.sessions.max_holds;
        self.run("seize", move |svc, handoff| async move {
            let seized = match svc.limiter.store().seize(id, now, OpId::random()).await {
                Ok(s) => s,
                Err(e) => {
                    handoff.deliver(|| Err(ServiceError::Store(e)));
                    return;
                }
            };
            let key = seized_key(&seized);
            let copies = seized.staged.copies;
            let mut unrecorded = false;
            let delivered = handoff.deliver(|| match session.record(&key, copies, max_holds) {
                Ok(()) => Ok(seized),
                Err(not) => {
                    unrecorded = true;
                    Err(not.into())
                }
            });
            if !delivered {
                svc.undone("seize");
                svc.release_for_good(&key, copies, "undoing an abandoned seize")
                    .await;
            } else if unrecorded {
                svc.release_for_good(&key, copies, "seized copies their session could not record")
                    .await;
            }
        })
        .await
    }

    /// Ends `session`: it leaves the open set and everything it holds is
    /// released (never undone). Waits for the store's confirmation at most
    /// the copy deadline. Closing twice releases once.
    pub async fn close(self: &Arc<Self>, session: &Session) -> Closed {
        let (released, done) = self.close_detached(session);
        let Some(done) = done else {
            return Closed::default();
        };
        let pending = tokio::time::timeout(self.options.copy_deadline, done)
            .await
            .is_err();
        Closed { released, pending }
    }

    /// Ends `session` like [`Service::close`] without waiting for the
    /// store: for callers that cannot wait (a `Drop`).
    pub fn end(self: &Arc<Self>, session: &Session) {
        self.close_detached(session);
    }

    /// Closes every leased session that lapsed by now, without waiting for
    /// the store; returns how many.
    pub fn reap(self: &Arc<Self>) -> usize {
        let lapsed = self.sessions.lapsed(self.now());
        for s in &lapsed {
            self.close_detached(s);
        }
        lapsed.len()
    }

    /// Closes every session (server shutdown) and waits up to `grace` for
    /// every copy operation in flight; returns the copies the sessions
    /// held.
    pub async fn close_all(self: &Arc<Self>, grace: Duration) -> u64 {
        let mut released = 0;
        for s in self.sessions.all() {
            released = self.close_detached(&s).0.saturating_add(released);
        }
        if tokio::time::timeout(grace, self.in_flight.idle())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = self.in_flight(),
                ?grace,
                "copy operations still in flight at shutdown; a shared store's copy log releases what they hold once this server's heartbeat lapses"
            );
        }
        released
    }

    /// Ends `session` and starts releasing what it held; returns the
    /// copies, and what completes once they are released (`None` when it
    /// held nothing).
    fn close_detached(self: &Arc<Self>, session: &Session) -> (u64, Option<oneshot::Receiver<()>>) {
        self.sessions.remove(session.id());
        metrics::gauge!("tollgate_sessions").set(self.sessions.len() as f64);
        let holds = session.close();
        if holds.is_empty() {
            return (0, None);
        }
        let copies = saturating_sum(holds.iter().map(|(_, n)| *n));
        let (tx, rx) = oneshot::channel();
        let id = session.id();
        self.spawn(move |svc| async move {
            for (key, n) in holds {
                svc.release_for_good(&key, n, "a closed session's holds")
                    .await;
            }
            tracing::debug!(session = %id, copies, "released a closed session's holds");
            let _ = tx.send(());
        });
        (copies, Some(rx))
    }

    /// Releases the session's holds in a task of its own (copies no record
    /// holds any more).
    fn release_later(self: &Arc<Self>, holds: Vec<(HoldKey, u64)>) {
        if holds.is_empty() {
            return;
        }
        self.spawn(move |svc| async move {
            for (key, n) in holds {
                svc.release_for_good(&key, n, "copies a closed session gave back")
                    .await;
            }
        });
    }

    /// Removes `copies` from the session's record for a release or a
    /// transfer, with a better error than "not held" when the resource
    /// name is wrong.
    fn take(
        &self,
        session: &Session,
        target: &Target<'_>,
        groups: Option<&[String]>,
        copies: u64,
        operation: &'static str,
    ) -> Result<(PoolKey, Vec<(HoldKey, u64)>), ServiceError> {
        self.check_target(target)?;
        let pool = PoolKey::new(target.namespace, target.resource);
        match session.take(&pool, target.domain, groups, copies, operation) {
            Ok(taken) => Ok((pool, taken)),
            Err(ServiceError::NotHeld(e)) => {
                // The groups of a hold are those the config put its domain
                // in, however many and however long: a list that names one
                // is taken above. Only a list that names none is held to
                // the bounds, before anything of it is echoed.
                self.check_groups(groups)?;
                if e.held == 0 {
                    // Nothing of it here: a better error if the name is wrong.
                    self.limiter
                        .copy_pool(target.namespace, target.resource, operation)?;
                }
                Err(ServiceError::NotHeld(e))
            }
            Err(e) => Err(e),
        }
    }

    /// Puts copies whose release was applied after its caller gave up back
    /// where they were: counted again, then in the record, or released
    /// again if the session ended meanwhile.
    async fn undo_releases(self: &Arc<Self>, session: &Session, done: Vec<(HoldKey, u64)>) {
        if done.is_empty() {
            return;
        }
        self.undone("release");
        self.restore_released(session, done).await;
    }

    /// Counts again copies the store released for `session` and puts them
    /// back in its record (or releases them again if it ended meanwhile:
    /// released is what its close did with everything else). Returns what
    /// the store would not count again, which stays released (logged).
    async fn restore_released(
        &self,
        session: &Session,
        done: Vec<(HoldKey, u64)>,
    ) -> Vec<(HoldKey, u64)> {
        let mut gone = Vec::new();
        for (key, n) in done {
            if session.is_closed() {
                // Released is what the close would have done anyway.
                continue;
            }
            match self
                .limiter
                .store()
                .restore(key.held(n), OpId::random())
                .await
            {
                Ok(()) => {
                    if session.record(&key, n, usize::MAX).is_err() {
                        self.release_for_good(&key, n, "restored copies whose session closed")
                            .await;
                    }
                }
                Err(e) => {
                    tracing::error!(pool = ?key.pool.0, domain = ?key.domain, copies = n, error = %e, "could not count again released copies; they stay released");
                    gone.push((key, n));
                }
            }
        }
        gone
    }

    /// Records seized copies taken back by an undone transfer, or releases
    /// them if their session ended.
    async fn record_or_release(&self, session: &Session, seized: &Seized) {
        let key = seized_key(seized);
        if session
            .record(&key, seized.staged.copies, usize::MAX)
            .is_err()
        {
            self.release_for_good(
                &key,
                seized.staged.copies,
                "copies taken back for a closed session",
            )
            .await;
        }
    }

    /// Releases copies nothing else will release; a failure is logged and
    /// counted, as there is no one left to tell.
    async fn release_for_good(&self, key: &HoldKey, n: u64, why: &'static str) {
        if let Err(e) = self
            .limiter
            .store()
            .release(key.held(n), OpId::random())
            .await
        {
            metrics::counter!(RELEASE_FAILURES).increment(1);
            tracing::error!(pool = ?key.pool.0, domain = ?key.domain, copies = n, error = %e, why, "releasing copies failed");
        }
    }

    fn undone(&self, op: &'static str) {
        metrics::counter!(UNDONE, "op" => op).increment(1);
        tracing::info!(
            op,
            "undid a copy operation the store applied after its caller gave up"
        );
    }

    /// Runs `work` in a task of its own and waits for the outcome it
    /// delivers through its [`Handoff`] at most the copy deadline. Once the
    /// caller gave up (the deadline, or this future dropped), `work` finds
    /// it cannot deliver, and undoes what the store did.
    async fn run<T, F, Fut>(self: &Arc<Self>, op: &'static str, work: F) -> Result<T, ServiceError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Self>, Arc<Handoff<T>>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, mut rx) = oneshot::channel();
        let handoff = Arc::new(Handoff::new(tx));
        self.spawn({
            let handoff = Arc::clone(&handoff);
            move |svc| work(svc, handoff)
        });
        let mut waiting = Abandon {
            handoff: &*handoff,
            op,
        };
        let outcome = match tokio::time::timeout(self.options.copy_deadline, &mut rx).await {
            Ok(received) => received,
            Err(_) if handoff.abandon() => {
                metrics::counter!(ABANDONED, "op" => op).increment(1);
                waiting.disarm();
                return Err(ServiceError::Store(StoreError::Unavailable(format!(
                    "the store did not answer the {op} within {:?}; it will be undone if the \
                     store applies it later",
                    self.options.copy_deadline
                ))));
            }
            // Delivered just as the deadline passed: the outcome is in the
            // channel, and already in the session's record.
            Err(_) => rx.await,
        };
        waiting.disarm();
        // A closed channel: the task ended without delivering (it panicked).
        outcome.unwrap_or_else(|_| {
            Err(ServiceError::Store(StoreError::Unavailable(format!(
                "the {op} failed inside the server"
            ))))
        })
    }

    /// Spawns `work` as a copy-operation task, counted in flight.
    fn spawn<F, Fut>(self: &Arc<Self>, work: F)
    where
        F: FnOnce(Arc<Self>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let guard = InFlight::enter(&self.in_flight);
        let svc = Arc::clone(self);
        tokio::spawn(async move {
            work(svc).await;
            drop(guard);
        });
    }
}

fn seized_key(seized: &Seized) -> HoldKey {
    HoldKey {
        pool: seized.pool.clone(),
        domain: seized.staged.domain.clone(),
        groups: seized.staged.groups.clone(),
    }
}

/// A copy operation's outcome on its way to a caller that may have given
/// up: delivering it and giving up are decided once, under one lock.
pub(crate) struct Handoff<T> {
    gate: Mutex<Gate<T>>,
}

enum Gate<T> {
    Waiting(oneshot::Sender<Result<T, ServiceError>>),
    Abandoned,
    Delivered,
}

impl<T> Handoff<T> {
    fn new(tx: oneshot::Sender<Result<T, ServiceError>>) -> Handoff<T> {
        Handoff {
            gate: Mutex::new(Gate::Waiting(tx)),
        }
    }

    /// If the caller still waits: runs `apply` (which puts the outcome in
    /// the session's record) and hands its result over, returning `true`.
    /// `false` if the caller gave up; then nothing ran.
    pub(crate) fn deliver(&self, apply: impl FnOnce() -> Result<T, ServiceError>) -> bool {
        let mut gate = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *gate, Gate::Delivered) {
            Gate::Waiting(tx) => {
                // The receiver may just have been dropped with its caller:
                // the outcome is then lost with it, like an answer lost on
                // the network (the record already has it).
                let _ = tx.send(apply());
                true
            }
            other => {
                *gate = other;
                false
            }
        }
    }

    /// Gives up waiting; `false` if the outcome was delivered first.
    fn abandon(&self) -> bool {
        let mut gate = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
        match *gate {
            Gate::Waiting(_) => {
                *gate = Gate::Abandoned;
                true
            }
            Gate::Abandoned => true,
            Gate::Delivered => false,
        }
    }
}

/// Gives up waiting when the caller's future is dropped before the outcome
/// arrived (an HTTP client that hung up).
struct Abandon<'a, T> {
    handoff: &'a Handoff<T>,
    op: &'static str,
}

impl<T> Abandon<'_, T> {
    fn disarm(&mut self) {
        self.op = "";
    }
}

impl<T> Drop for Abandon<'_, T> {
    fn drop(&mut self) {
        if !self.op.is_empty() && self.handoff.abandon() {
            metrics::counter!(ABANDONED, "op" => self.op).increment(1);
        }
    }
}

/// Copy-operation tasks in flight, so shutdown can wait for them.
#[derive(Debug, Default)]
struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

/// One task in flight; dropped (also when the task panics) it is not.
struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    fn enter(this: &Arc<InFlight>) -> InFlightGuard {
        let n = this.count.fetch_add(1, Ordering::Relaxed) + 1;
        metrics::gauge!(IN_FLIGHT).set(n as f64);
        InFlightGuard(Arc::clone(this))
    }

    /// Completes once no task is in flight.
    async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::Relaxed) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let n = self
            .0
            .count
            .fetch_sub(1, Ordering::Relaxed)
            .saturating_sub(1);
        metrics::gauge!(IN_FLIGHT).set(n as f64);
        if n == 0 {
            self.0.idle.notify_waiters();
        }
    }
}
