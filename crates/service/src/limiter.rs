//! The [`Limiter`]: requests in, plans to the store, outcomes out.
//!
//! It knows the config view and the namespace flags of Charon §4.3; it does
//! not know any wire protocol, and it does not know which store it talks
//! to. Requests are validated here, so the store and the core only ever
//! see well-formed ones.

use std::sync::Arc;

use arc_swap::ArcSwap;
use smallvec::SmallVec;
use tollgate_config::model::EnvoyLimit;
use tollgate_config::{Config, ResourceKind};
use tollgate_core::copies::{CopyContext, CopyLimits, Reservation};
use tollgate_core::{Decision, Hits, Limit, Mode, Nanos, PlanDecision, PlanError, TierInfo};
use tollgate_store::{Admit, DuplicateKey, Key, OpId, Plan, PoolKey, Refusal, Store, StoreError};

use crate::descriptors::{self, Planned, Split};
use crate::error::ServiceError;
use crate::view::{
    in_config_order, DomainLimits, Main, NamespaceView, NoBroughtLimits, RateView, ResourceEntry,
    ResourceView, Unservable, Unserved, View,
};

/// A request for hits of a rate-limited resource (Charon §3.1 `request`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateRequest<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// The resource.
    pub resource: &'a str,
    /// On whose behalf.
    pub domain: &'a str,
    /// The most hits wanted.
    pub hits: u64,
    /// The fewest still useful.
    pub min_hits: u64,
    /// Answer now, schedule, or tell of usage after the fact (report,
    /// refund).
    pub mode: Mode,
    /// A limit of the request's own, in place of the resource's algorithm
    /// (or list): only for a resource with `allow_override`, and no faster
    /// than its `override_max`.
    pub limit: Option<EnvoyLimit>,
}

/// Which limit bounded a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum LimitedBy {
    /// The resource's algorithm (not burst tiers).
    Limit,
    /// The domain's current burst tier.
    Tier,
    /// The per-domain hard limit.
    Hard,
    /// The all-domain global limit.
    Global,
    /// The resource denies everything.
    Deny,
}

impl LimitedBy {
    /// The name used in outputs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            LimitedBy::Limit => "limit",
            LimitedBy::Tier => "tier",
            LimitedBy::Hard => "hard",
            LimitedBy::Global => "global",
            LimitedBy::Deny => "deny",
        }
    }
}

/// The answer to a [`RateRequest`], with Charon §3.1's context.
#[derive(Clone, Debug, PartialEq)]
pub struct RateOutcome {
    /// Whether the request succeeded (forced true by shadow mode and
    /// `ignore_configured`).
    pub allowed: bool,
    /// Hits granted.
    pub granted: u64,
    /// The combined decision: limit, remaining, retry and reset times, wait.
    pub decision: Decision,
    /// What bounded the grant below what was asked.
    pub limited_by: Option<LimitedBy>,
    /// Burst-tier context.
    pub tier: Option<TierInfo>,
    /// The domain's hard limit (per second).
    pub hard_limit: Option<u64>,
    /// The global limit (per second).
    pub global_limit: Option<u64>,
    /// Hits by this domain in the last second (when a hard limit counts them).
    pub domain_hits_last_second: Option<u64>,
    /// Hits by all domains in the last second (when a global limit counts them).
    pub global_hits_last_second: Option<u64>,
    /// A shadow-mode limit would have rejected; the request was allowed.
    pub shadowed: bool,
    /// The namespace ignores its limits; the request was allowed.
    pub ignored: bool,
    /// The resource is not configured; the namespace allows that.
    pub unconfigured: bool,
    /// The algorithm that decided (of a `limits:` list: the binding
    /// limit's).
    pub algorithm: &'static str,
    /// Of a resource with a `limits:` list: the name of the limit that
    /// bound the request (or, when nothing limited it, the one with the
    /// least room), whose limit, remaining and reset the decision reports.
    /// `None` for a resource with one algorithm.
    pub limit_name: Option<Arc<str>>,
    /// Of a resource with a `limits:` list: every limit's own state after
    /// the decision, the list's limits first, then the hard and global
    /// limits. Empty for a resource with one algorithm (its one state is
    /// the decision).
    pub limits: Vec<LimitDetail>,
    /// Of a resource with a `limits:` list: the decision of the list's
    /// limit with the largest share used, which near-limit metrics judge
    /// beside the answer's (as [`DescriptorStatus::fullest`]). `None`
    /// otherwise.
    pub fullest: Option<Decision>,
}

/// One limit's state after a decision ([`RateOutcome::limits`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LimitDetail {
    /// Its name: a `limits:` entry's, or `hard` or `global`.
    pub name: Arc<str>,
    /// Its algorithm's config name.
    pub algorithm: &'static str,
    /// Its own decision: limit, remaining, reset, retry, tier.
    pub decision: Decision,
    /// Evaluated but never limits (shadow mode, or an ignoring namespace).
    pub shadow: bool,
}

/// A request in envoyproxy/ratelimit's terms: descriptors of one domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorRequest<'a> {
    /// The namespace (envoy `domain`).
    pub namespace: &'a str,
    /// The descriptors, each a list of `(key, value)` entries.
    pub descriptors: &'a [Vec<(String, String)>],
    /// Hits to add (envoy `hits_addend`; all or nothing): every
    /// descriptor's, but those [`DescriptorRequest::descriptor_hits`] gives
    /// hits of their own.
    pub hits: u64,
    /// Per descriptor, in order: hits of its own in place of `hits`
    /// (Envoy's descriptor-level `hits_addend`), still decided all or
    /// nothing with the others. Shorter than `descriptors` (or empty): the
    /// rest take `hits`.
    pub descriptor_hits: &'a [Option<u64>],
    /// Per descriptor, in order, in mode [`Mode::Try`]: whether it gives
    /// its hits back (Envoy's `is_negative_hits` on some descriptors of a
    /// request but not all; when all set it the mode is [`Mode::Refund`]).
    /// A refund is usage, never refused, and is given back whatever the
    /// other descriptors' check says. Shorter (or empty): the rest do not.
    pub refunds: &'a [bool],
    /// [`Mode::Try`], or [`Mode::Refund`] for Envoy's `is_negative_hits`
    /// (or [`Mode::Report`]: every descriptor reported). In `try`, the
    /// descriptors whose limit is `report: true` are charged in report
    /// mode when the request has hits.
    pub mode: Mode,
    /// Per descriptor, in order: the limit it brings of its own (Envoy's
    /// descriptor `limit`), which decides it in place of the config's, as
    /// envoyproxy/ratelimit does. Shorter than `descriptors` (or empty):
    /// the rest bring none.
    pub limits: &'a [Option<EnvoyLimit>],
}

/// One descriptor's result.
#[derive(Clone, Debug, PartialEq)]
pub struct DescriptorStatus {
    /// The resource that limited it; `None` when no limit applies (no match,
    /// replaced, or unlimited).
    pub resource: Option<String>,
    /// Where that resource is in its namespace's list
    /// ([`crate::NamespaceView::resources`]) in the view that decided it:
    /// a surface that needs the resource's settings takes it from there
    /// (checking the name, in case a reload came in between) rather than
    /// matching the descriptor against the tree a second time.
    pub entry: Option<usize>,
    /// The counter's domain.
    pub domain: Option<String>,
    /// Whether this descriptor is within its limit (or shadowed).
    pub allowed: bool,
    /// Its decision, when a limit applied (of a `limits:` list: the
    /// binding limit's, see [`DescriptorStatus::limit`]).
    pub decision: Option<Decision>,
    /// For a resource with a `limits:` list: the position in it of the
    /// limit that bound the descriptor (or, within every limit, the one
    /// with the least remaining), whose decision `decision` is.
    pub limit: Option<usize>,
    /// The limit the descriptor brought of its own, which decided it.
    pub limit_override: Option<EnvoyLimit>,
    /// The limit is `unlimited`.
    pub unlimited: bool,
    /// Over its limit but in shadow mode.
    pub shadowed: bool,
    /// How its counter was decided: `Try` (checked, all or nothing with
    /// the request's other checked descriptors), `Report` (its hits
    /// charged whatever the check said: a `report: true` limit, or a
    /// report), or `Refund` (its hits given back, Envoy's
    /// `is_negative_hits`). A descriptor without a counter keeps the mode
    /// it asked (a report for a `report: true` one with hits).
    pub mode: Mode,
    /// The hits it charged, or gave back, as `mode` says: a check's own
    /// hits when the whole request is OK (0 otherwise); usage as its
    /// counters took it whatever the answer (a report up to the debt's
    /// bound, a refund up to a fresh counter: the least any of its live
    /// limits took, every hit for a shadow limit, which never limits). A
    /// descriptor without a counter counts its hits when the request is OK,
    /// as an unconfigured resource does on the native API.
    pub charged: u64,
    /// Of a descriptor whose resource has a `limits:` list: the decision
    /// of the limit with the largest share used (`decision` is the
    /// binding one's). What near-limit metrics judge: a share past the
    /// ratio is near, so the list is near when any of its limits is (a
    /// daily quota nearly spent beside a burst bucket with fewer hits
    /// left, which binds). `None` otherwise.
    pub fullest: Option<Decision>,
}

impl DescriptorRequest<'_> {
    /// Descriptor `i`'s hits: its own (`descriptor_hits`), else the
    /// request's.
    pub(crate) fn hits_of(&self, i: usize) -> u64 {
        self.descriptor_hits
            .get(i)
            .copied()
            .flatten()
            .unwrap_or(self.hits)
    }
}

/// The answer to a [`DescriptorRequest`].
#[derive(Clone, Debug, PartialEq)]
pub struct DescriptorOutcome {
    /// OK overall: every descriptor allowed.
    pub allowed: bool,
    /// Per descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
}

/// The answer to a reserve (Charon §3.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReserveOutcome {
    /// What the store granted, with the context against the configured
    /// limits (also when they were ignored).
    pub reservation: Reservation,
    /// Granted only because the resource is in shadow mode: the configured
    /// limits would have refused some of it.
    pub shadowed: bool,
    /// Granted only because the namespace ignores its limits.
    pub ignored: bool,
}

/// What [`Limiter::inspect`] finds for one domain of a resource.
#[derive(Clone, Debug, PartialEq)]
pub enum Counters {
    /// A rate-limited resource: each limit a request of the domain must
    /// pass, in the order its plan decides them (none for an `unlimited`
    /// or `deny` resource without hard or global limits).
    Rate {
        /// The limits' states, named as a decision's
        /// [`RateOutcome::limits`] names them (`main` for a resource's
        /// single algorithm).
        limits: Vec<LimitDetail>,
        /// The resource denies everything (`deny`).
        deny: bool,
    },
    /// A copy-limited resource: the copies held (by the domain, by
    /// everyone, by each of the domain's groups) against their limits.
    Copies(CopyContext),
}

/// Answers limiting requests against a config view and a store.
pub struct Limiter<S> {
    store: S,
    view: ArcSwap<View>,
    /// Limits requests brought of their own, built and admitted by the
    /// store once each: requests with an override ask for few distinct
    /// ones (a SaaS's plans, an Envoy config's overrides). Bounded: at
    /// [`MAX_CACHED_OVERRIDES`] it is emptied and starts over.
    overrides: std::sync::Mutex<std::collections::HashMap<(String, EnvoyLimit), Override>>,
}

/// Most distinct request-brought limits a [`Limiter`] keeps built.
pub const MAX_CACHED_OVERRIDES: usize = 1024;

/// A limit a request brought, built, admitted by the store, with the id of
/// its state.
#[derive(Clone, Debug)]
struct Override {
    id: tollgate_store::LimitId,
    limit: Arc<Limit>,
}

/// What one plan item is for, to name what limited a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Role {
    Main,
    /// The limit at this position of a `limits:` list.
    Listed(usize),
    Hard,
    Global,
}

impl Role {
    /// The item's name and algorithm in an answer: a `limits:` entry's
    /// own, else `main` (the resource's algorithm, `algorithm`), `hard` or
    /// `global`.
    fn named(self, limits: &DomainLimits) -> (Arc<str>, &'static str) {
        match (self, &limits.main) {
            (Role::Listed(at), Main::Listed(list)) => match list.get(at) {
                Some(l) => (Arc::clone(&l.name), l.algorithm),
                None => ("main".into(), limits.algorithm),
            },
            (Role::Main | Role::Listed(_), _) => ("main".into(), limits.algorithm),
            (Role::Hard, _) => ("hard".into(), "sliding_log"),
            (Role::Global, _) => ("global".into(), "sliding_log"),
        }
    }
}

/// What [`Limiter::inspect`] and [`Limiter::reset`] work on.
// Built once per admin call and taken apart at once: boxing the plan
// would cost an allocation to save one move.
#[allow(clippy::large_enum_variant)]
enum Target {
    Rate {
        plan: Plan,
        /// Each item's name and algorithm ([`Role::named`]).
        names: SmallVec<[(Arc<str>, &'static str); 3]>,
        deny: bool,
    },
    Copies {
        pool: PoolKey,
        limits: Arc<CopyLimits>,
    },
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store` with `view`.
    pub fn new(store: S, view: View) -> Limiter<S> {
        Limiter {
            store,
            view: ArcSwap::from_pointee(view),
            overrides: Default::default(),
        }
    }

    /// The current view.
    pub fn view(&self) -> Arc<View> {
        self.view.load_full()
    }

    /// Replaces the view (a config reload). Requests already running finish
    /// with the view they started with.
    pub fn set_view(&self, view: View) {
        self.view.store(Arc::new(view));
    }

    /// Compiles `config` into a view this limiter's store can serve: every
    /// limit, and every copy pool, goes through [`Store::admit`] (a
    /// replicated store makes a rate limit its cluster's CRDT and refuses
    /// copy pools; Redis refuses what its scripts cannot decide exactly).
    /// The store then learns the limits it is about to serve
    /// ([`Store::serve_limits`]): call this only to put the view in force.
    /// The error lists every limit the store refused, in the order the
    /// config writes them, each with where it is and why, so one run shows
    /// all there is to change.
    pub fn compile(&self, config: &Config, created_at: Nanos) -> Result<View, Unserved> {
        let mut problems = Vec::new();
        for ns in &config.namespaces {
            for r in &ns.resources {
                let refused = match &r.kind {
                    ResourceKind::Concurrency(limits) => {
                        self.store.admit(Admit::Copies(limits)).err()
                    }
                    // Requests to it bring limits of their own: a store that
                    // cannot serve them would refuse every such request, so
                    // the config is refused now, when it loads.
                    ResourceKind::Rate(rate) if rate.override_max.is_some() => {
                        self.brought_refusal()
                    }
                    ResourceKind::Rate(_) => None,
                };
                if let Some(reason) = refused {
                    problems.push(Unservable {
                        namespace: ns.name.clone(),
                        resource: r.name.clone(),
                        domain: None,
                        limit: None,
                        reason,
                    });
                }
            }
        }
        let mut view = View::new(config, created_at);
        if let Err(refused) = view.adapt(config, |c, replication| {
            let mut limit = Limit::clone(&c.limit);
            self.store.admit(Admit::Rate {
                limit: &mut limit,
                replication,
            })?;
            Ok(limit)
        }) {
            problems.extend(refused);
        }
        if !problems.is_empty() {
            in_config_order(config, &mut problems);
            return Err(Unserved { problems });
        }
        self.store.serve_limits(
            view.limits()
                .map(|(_, _, c)| (c.id, Arc::clone(&c.limit)))
                .collect(),
        );
        Ok(view)
    }

    /// Why the store cannot serve the limits requests bring
    /// (`allow_override: true`): fixed windows of a unit, as one of a hit
    /// a second is asked to be admitted. `None`: it can.
    fn brought_refusal(&self) -> Option<Refusal> {
        let own = EnvoyLimit {
            requests_per_unit: 1,
            unit: tollgate_config::model::EnvoyUnit::Second,
        };
        let mut limit = own.algorithm().build(Nanos::ZERO).ok().flatten()?;
        let refusal = self
            .store
            .admit(Admit::Rate {
                limit: &mut limit,
                replication: None,
            })
            .err()?;
        Some(Refusal::limit(NoBroughtLimits {
            why: refusal.to_string(),
        }))
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides a rate request (Charon §3.1 `request`).
    pub async fn request(
        &self,
        req: &RateRequest<'_>,
        now: Nanos,
    ) -> Result<RateOutcome, ServiceError> {
        check_request(req.hits, req.min_hits)?;
        let view = self.view.load();
        let ns = namespace(&view, req.namespace)?;
        check_names(req.namespace, req.resource)?;
        let Some(entry) = ns.resource(req.resource) else {
            if ns.allow_unconfigured {
                if req.limit.is_some() {
                    // Granted without a limit, the brought one would be
                    // silently ignored: the caller believes it is limited.
                    return Err(ServiceError::LimitOverride(format!(
                        "resource `{}` in namespace `{}` is not configured, so it takes \
                         no limit from requests (only a resource with \
                         `allow_override: true` does)",
                        req.resource, req.namespace
                    )));
                }
                metrics::counter!("tollgate_unconfigured_hits_total", "namespace" => ns.name.clone())
                    .increment(req.hits);
                return Ok(unconfigured(req.hits));
            }
            return Err(ServiceError::UnknownResource {
                namespace: req.namespace.to_owned(),
                resource: req.resource.to_owned(),
            });
        };
        let ResourceView::Rate(rate) = &entry.view else {
            return Err(wrong_kind(
                req.namespace,
                req.resource,
                "concurrency",
                "rate",
                "request",
            ));
        };
        let mut limits = rate.for_domain(req.domain);
        let brought;
        if let Some(own) = req.limit {
            brought = self.brought_for_resource(req, rate, own)?;
            limits = &brought;
        }
        let shadow = entry.shadow || ns.ignore_configured;
        // A config gives each limit its own id, so the keys are distinct;
        // were they not, the request fails rather than counting twice.
        let (plan, roles) =
            rate_plan(rate, limits, req.domain, shadow).map_err(StoreError::from)?;
        let plan = plan.with_affinity(ns.affinity);
        let request = Hits::between(req.min_hits, req.hits);
        if matches!(limits.main, Main::Deny) && req.mode.is_usage() {
            // Nothing is counted against a deny: there is no debt to owe.
            return Err(StoreError::from(PlanError::NoUsage {
                index: 0,
                algorithm: "deny",
                mode: req.mode,
            })
            .into());
        }
        if matches!(limits.main, Main::Deny) && !shadow {
            return Ok(denied(limits, rate));
        }
        let pd = match self.store.decide(&plan, now, request, req.mode).await {
            Ok(pd) => pd,
            // A `limits:` entry refused: the answer names it.
            Err(StoreError::Plan(e)) if matches!(limits.main, Main::Listed(_)) => {
                let role = roles.get(e.index()).copied().unwrap_or(Role::Main);
                return Err(ServiceError::InLimit(Box::new(crate::error::InLimit {
                    resource: req.resource.to_owned(),
                    limit: role.named(limits).0.to_string(),
                    source: StoreError::Plan(e),
                })));
            }
            Err(e) => return Err(e.into()),
        };
        if req.mode == Mode::Report && pd.granted < req.hits {
            count_clamped(ns, req.hits - pd.granted);
        }
        let mut outcome = rate_outcome(
            &pd,
            &roles,
            limits,
            rate,
            req.hits,
            entry.shadow,
            ns.ignore_configured,
        );
        if matches!(limits.main, Main::Deny) {
            // Only reached in shadow mode or an ignoring namespace: the
            // request is allowed, but the deny would have rejected it, and
            // the plan (hard and global limits only) cannot know that.
            shadow_denied(&mut outcome, entry.shadow, ns.ignore_configured);
        }
        Ok(outcome)
    }

    /// The limits of a request that brings its own `limit`: the resource's
    /// hard limit (and, in the plan, its global limit) with the brought
    /// limit in place of its algorithm, or why the resource refuses it.
    fn brought_for_resource(
        &self,
        req: &RateRequest<'_>,
        rate: &RateView,
        own: EnvoyLimit,
    ) -> Result<DomainLimits, ServiceError> {
        let Some(max) = rate.override_max else {
            return Err(ServiceError::LimitOverride(format!(
                "resource `{}` in namespace `{}` does not take a limit from requests \
                 (its config sets no `allow_override: true` with `override_max`)",
                req.resource, req.namespace
            )));
        };
        if !own.within(&max) {
            return Err(ServiceError::LimitOverride(format!(
                "a limit of {} per {} is faster than resource `{}`'s override_max of {max}",
                own.requests_per_unit,
                own.unit.as_str(),
                req.resource
            )));
        }
        let main = match self.brought(&["resource", req.namespace, req.resource], own)? {
            Some(o) => Main::Limited(crate::view::Compiled {
                id: o.id,
                limit: o.limit,
            }),
            None => Main::Deny,
        };
        let limits = rate.for_domain(req.domain);
        Ok(DomainLimits {
            main,
            hard: limits.hard.clone(),
            hard_limit: limits.hard_limit,
            algorithm: own.algorithm().name(),
        })
    }

    /// The limit `own` that a request of `scope` (`["resource", namespace,
    /// resource]`, or `["descriptor", namespace]` for an Envoy domain)
    /// brought, built and admitted by the store, and the id of its state
    /// (its own: a request's limit never shares the config's counters, and
    /// two different limits or scopes never share one: the scope's parts
    /// are hashed apart, so no `/` in a name makes two scopes one); `None`
    /// for a limit of 0, which refuses everything. Built once per distinct
    /// limit; a full cache starts over, so limits a stranger sent first
    /// cannot keep everyone else's out of it for good.
    fn brought(&self, scope: &[&str], own: EnvoyLimit) -> Result<Option<Override>, ServiceError> {
        let spec = own.algorithm();
        if matches!(spec, tollgate_config::AlgorithmSpec::Deny) {
            return Ok(None);
        }
        // The parts as `limit_id` hashes them (joined by a 0 byte): equal
        // keys are equal ids.
        let key = (scope.join("\0"), own);
        if let Some(o) = self
            .overrides
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
        {
            return Ok(Some(o.clone()));
        }
        let refused = |why: String| {
            ServiceError::Store(StoreError::Unsupported(format!(
                "a limit of {} per {} brought by the request cannot be served by this store: {why}",
                own.requests_per_unit,
                own.unit.as_str()
            )))
        };
        let mut limit = match spec.build(Nanos::ZERO) {
            Ok(Some(limit)) => limit,
            Ok(None) => return Ok(None),
            Err(e) => return Err(refused(e.to_string())),
        };
        self.store
            .admit(Admit::Rate {
                limit: &mut limit,
                replication: None,
            })
            .map_err(|r| refused(r.to_string()))?;
        let canonical = spec.to_string();
        let mut parts: SmallVec<[&str; 5]> = SmallVec::new();
        parts.push("override");
        parts.extend_from_slice(scope);
        parts.push(&canonical);
        let built = Override {
            id: crate::fingerprint::limit_id(&parts),
            limit: Arc::new(limit),
        };
        let mut cache = self
            .overrides
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= MAX_CACHED_OVERRIDES {
            cache.clear();
        }
        cache.insert(key, built.clone());
        Ok(Some(built))
    }

    /// How many limits brought by requests are kept built (at most
    /// [`MAX_CACHED_OVERRIDES`]).
    pub fn cached_overrides(&self) -> usize {
        self.overrides
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// The live state of `domain`'s counters of `resource` at `now`,
    /// charging nothing and creating nothing ([`Store::inspect`],
    /// [`Store::holds`]). The plan is the one [`Limiter::request`] builds
    /// for the same names, so what is inspected is what decides.
    pub async fn inspect(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
        now: Nanos,
    ) -> Result<Counters, ServiceError> {
        match self.counters_of(namespace, resource, domain)? {
            Target::Rate { plan, names, deny } => {
                let pd = self.store.inspect(&plan, now).await?;
                let limits = plan
                    .items()
                    .iter()
                    .zip(names)
                    .zip(&pd.decisions)
                    .map(|((item, (name, algorithm)), d)| LimitDetail {
                        name,
                        algorithm,
                        decision: *d,
                        shadow: item.shadow,
                    })
                    .collect();
                Ok(Counters::Rate { limits, deny })
            }
            Target::Copies { pool, limits } => Ok(Counters::Copies(
                self.store.holds(&pool, &limits, domain, now).await?,
            )),
        }
    }

    /// Resets `domain`'s counters of `resource`: every limit of the plan
    /// [`Limiter::request`] would build for it starts afresh
    /// ([`Store::reset`]). A copy-limited resource is refused: its holds
    /// belong to the clients holding them, who release them.
    pub async fn reset(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
        now: Nanos,
    ) -> Result<usize, ServiceError> {
        match self.counters_of(namespace, resource, domain)? {
            Target::Rate { plan, .. } => {
                self.store.reset(&plan, now).await?;
                Ok(plan.len())
            }
            Target::Copies { .. } => Err(ServiceError::HoldsNotResettable {
                namespace: namespace.to_owned(),
                resource: resource.to_owned(),
            }),
        }
    }

    /// The counters of `domain` of `resource`: a rate resource's plan (as
    /// [`Limiter::request`] builds it), or a copy resource's pool.
    fn counters_of(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
    ) -> Result<Target, ServiceError> {
        let view = self.view.load();
        let ns = self::namespace(&view, namespace)?;
        check_names(namespace, resource)?;
        let Some(entry) = ns.resource(resource) else {
            // Nothing is counted for a resource the config does not name,
            // even in a namespace that allows such requests.
            return Err(ServiceError::UnknownResource {
                namespace: namespace.to_owned(),
                resource: resource.to_owned(),
            });
        };
        match &entry.view {
            ResourceView::Rate(rate) => {
                let limits = rate.for_domain(domain);
                let shadow = entry.shadow || ns.ignore_configured;
                let (plan, roles) =
                    rate_plan(rate, limits, domain, shadow).map_err(StoreError::from)?;
                Ok(Target::Rate {
                    plan: plan.with_affinity(ns.affinity),
                    names: roles.iter().map(|r| r.named(limits)).collect(),
                    deny: matches!(limits.main, Main::Deny),
                })
            }
            ResourceView::Concurrency { pool, limits } => Ok(Target::Copies {
                pool: pool.clone(),
                limits: Arc::clone(limits),
            }),
        }
    }

    /// Decides envoyproxy/ratelimit-style descriptors, all or nothing.
    ///
    /// The matching rules (descriptors to a plan, and the decided plan to
    /// statuses) are pure functions of the view and the request, in the
    /// crate's `descriptors` module; this loads the view, counts requests
    /// for unknown domains, and has the store decide the plan.
    pub async fn request_descriptors(
        &self,
        req: &DescriptorRequest<'_>,
        now: Nanos,
    ) -> Result<DescriptorOutcome, ServiceError> {
        let view = self.view.load();
        // The limits descriptors brought, built before planning (the plan
        // is a pure function of the view and the request). Only for a
        // namespace with descriptors: for any other the plan answers
        // without them (an unknown domain is OK, as upstream answers, even
        // where the store could not serve the limit), and a stranger's
        // domain names never reach the cache.
        // (Looked up only when a descriptor brought a limit: a request
        // without any pays nothing for them.)
        let has_tree = !req.limits.is_empty()
            && view
                .namespace(req.namespace)
                .is_some_and(|ns| ns.descriptors.is_some());
        let mut brought: SmallVec<[Option<descriptors::Brought>; 4]> = SmallVec::new();
        for own in req.limits.iter().filter(|_| has_tree) {
            brought.push(match own {
                Some(own) => Some(descriptors::Brought {
                    limit: *own,
                    built: self
                        .brought(&["descriptor", req.namespace], *own)?
                        .map(|o| (o.id, o.limit)),
                }),
                None => None,
            });
        }
        let to_decide = match descriptors::plan(&view, req, &brought)? {
            Planned::UnknownDomain(outcome) => {
                metrics::counter!("tollgate_unknown_descriptor_domain_total").increment(1);
                return Ok(outcome);
            }
            Planned::Denied(outcome) => return Ok(outcome),
            Planned::Decide(to_decide) => to_decide,
        };
        if req.mode == Mode::Acquire {
            return Err(ServiceError::Malformed(
                "descriptors are decided now or reported, never scheduled (mode `acquire`)".into(),
            ));
        }
        let hits = Hits::exactly(req.hits);
        match to_decide.split(req.hits, req.mode) {
            // A deny beside checks alone answers before this
            // ([`Planned::Denied`]); beside usage, the checks are only
            // inspected.
            Split::Whole(mode) if to_decide.denied && !mode.is_usage() => {
                let mut pd = self.store.inspect(&to_decide.plan, now).await?;
                // Each item's room: what it has left.
                for (room, d) in pd.rooms.iter_mut().zip(&pd.decisions) {
                    *room = d.remaining;
                }
                Ok(to_decide.outcome(&pd, req.hits, mode))
            }
            Split::Whole(mode) => {
                let pd = self.store.decide(&to_decide.plan, now, hits, mode).await?;
                if mode == Mode::Report {
                    count_dropped(&view, req, &to_decide.plan, &pd);
                }
                Ok(to_decide.outcome(&pd, req.hits, mode))
            }
            Split::Parts(parts) => {
                // A usage part the store would refuse whatever the state
                // (a limit without a sound debt) is refused before the
                // check is charged: nothing is decided.
                if let Some(e) = parts.iter().find_map(|p| p.plan.usage_refusal(p.mode)) {
                    return Err(StoreError::Plan(e).into());
                }
                // The probes first: they charge nothing, and one refused
                // makes the check only inspected (all or nothing).
                let mut decided: SmallVec<[Option<PlanDecision>; 4]> =
                    parts.iter().map(|_| None).collect();
                // A deny refuses the checks before anything is looked at.
                let mut refused = to_decide.denied;
                for (i, part) in parts.iter().enumerate().filter(|(_, p)| p.probe) {
                    let pd = self.store.decide(&part.plan, now, hits, part.mode).await?;
                    refused |= descriptors::ToDecide::exhausted(part, &pd);
                    decided[i] = Some(pd);
                }
                // Then the check and the usage, which is charged (or given
                // back) whatever the check says: it happened. In one store
                // step, so that a failure leaves both decided or neither,
                // never the check charged and the usage lost.
                let mut together: SmallVec<[(&Plan, Hits, Mode); 3]> = SmallVec::new();
                let mut at: SmallVec<[usize; 3]> = SmallVec::new();
                for (i, part) in parts.iter().enumerate().filter(|(_, p)| !p.probe) {
                    if refused && part.mode == Mode::Try {
                        let mut pd = self.store.inspect(&part.plan, now).await?;
                        // Each item's room: what it has left.
                        for (room, d) in pd.rooms.iter_mut().zip(&pd.decisions) {
                            *room = d.remaining;
                        }
                        decided[i] = Some(pd);
                    } else {
                        together.push((&part.plan, hits, part.mode));
                        at.push(i);
                    }
                }
                // One part alone is an ordinary decision (the Redis over-limit
                // cache may answer it); none, nothing to ask.
                let answers: SmallVec<[PlanDecision; 3]> = match together.as_slice() {
                    [] => SmallVec::new(),
                    [(plan, request, mode)] => {
                        smallvec::smallvec![self.store.decide(plan, now, *request, *mode).await?]
                    }
                    _ => self.store.decide_together(&together, now).await?,
                };
                for (i, pd) in at.into_iter().zip(answers) {
                    if parts[i].mode == Mode::Report {
                        count_dropped(&view, req, &parts[i].plan, &pd);
                    }
                    decided[i] = Some(pd);
                }
                let decided: SmallVec<[PlanDecision; 4]> =
                    decided.into_iter().collect::<Option<_>>().ok_or_else(|| {
                        StoreError::Unavailable(
                            "the store answered fewer parts than it was asked".into(),
                        )
                    })?;
                let joined: SmallVec<[(&descriptors::Part, &PlanDecision); 4]> =
                    parts.iter().zip(&decided).collect();
                let pd = to_decide.join(&joined);
                Ok(to_decide.outcome(&pd, req.hits, Mode::Try))
            }
        }
    }

    /// Reserves copies of a copy-limited resource (Charon §3.1 `reserve`)
    /// as store operation `op`. Sessions record what it grants
    /// ([`crate::Service::reserve`]); called alone, nothing will release it.
    pub async fn reserve(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
        request: Hits,
        now: Nanos,
        op: OpId,
    ) -> Result<ReserveOutcome, ServiceError> {
        check_request(request.hits, request.min_hits)?;
        let (pool, limits, ignore) = self.copy_resource(namespace, resource, "reserve")?;
        if !ignore.any() {
            let reservation = self
                .store
                .reserve(&pool, &limits, domain, request, now, op)
                .await?;
            return Ok(ReserveOutcome {
                reservation,
                shadowed: false,
                ignored: false,
            });
        }
        // Counted in the same groups, decided without limits, reported
        // against the real ones.
        let mut reservation = self
            .store
            .reserve(&pool, &limits.lifted(), domain, request, now, op)
            .await?;
        reservation.context = reservation.context.against(&limits, domain);
        let over = reservation.granted > 0 && reservation.context.over_limit();
        Ok(ReserveOutcome {
            reservation,
            shadowed: over && ignore.shadow,
            ignored: over && ignore.namespace,
        })
    }

    /// The groups `domain`'s copies of `resource` are counted in now, or why
    /// it cannot be reserved.
    pub fn copy_groups(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
    ) -> Result<tollgate_core::copies::Groups, ServiceError> {
        let (_, limits, _) = self.copy_resource(namespace, resource, "reserve")?;
        Ok(limits.groups_of(domain))
    }

    /// The pool of copy-limited `resource`, or why `operation` cannot use it.
    pub fn copy_pool(
        &self,
        namespace: &str,
        resource: &str,
        operation: &'static str,
    ) -> Result<PoolKey, ServiceError> {
        self.copy_resource(namespace, resource, operation)
            .map(|(pool, _, _)| pool)
    }

    /// The pool and limits of a copy-limited resource; an unknown one in a
    /// namespace that allows it gets the most permissive limits (and its
    /// holds are still recorded).
    fn copy_resource(
        &self,
        namespace: &str,
        resource: &str,
        operation: &'static str,
    ) -> Result<(PoolKey, Arc<CopyLimits>, Ignore), ServiceError> {
        let view = self.view.load();
        let ns = self::namespace(&view, namespace)?;
        check_names(namespace, resource)?;
        match ns.resource(resource) {
            Some(ResourceEntry {
                view: ResourceView::Concurrency { pool, limits },
                shadow,
                ..
            }) => Ok((
                pool.clone(),
                limits.clone(),
                Ignore {
                    shadow: *shadow,
                    namespace: ns.ignore_configured,
                },
            )),
            Some(_) => Err(wrong_kind(
                namespace,
                resource,
                "rate",
                "concurrency",
                operation,
            )),
            None if ns.allow_unconfigured => Ok((
                PoolKey::new(namespace, resource),
                Arc::new(CopyLimits::new(u64::MAX, None)),
                Ignore::default(),
            )),
            None => Err(ServiceError::UnknownResource {
                namespace: namespace.to_owned(),
                resource: resource.to_owned(),
            }),
        }
    }
}

/// Why a copy resource's limits are not enforced, if they are not.
#[derive(Copy, Clone, Debug, Default)]
struct Ignore {
    shadow: bool,
    namespace: bool,
}

impl Ignore {
    fn any(self) -> bool {
        self.shadow || self.namespace
    }
}

/// Counts a report the debt bound clamped: `tollgate_reports_clamped_total`
/// (reports) and `tollgate_report_clamped_hits_total` (hits not charged),
/// per namespace (a config's names, so bounded).
/// Counts a report of descriptors (`pd`, the decision of `plan`) that a
/// live item took only in part: by the most any of them dropped, each
/// item measured against the hits it was asked (its own, when the
/// descriptors' differ, else the request's). The plan's `granted` does
/// not tell it: it is the request's hits less that shortfall, floored at
/// zero.
fn count_dropped(view: &View, req: &DescriptorRequest<'_>, plan: &Plan, pd: &PlanDecision) {
    let dropped = plan
        .items()
        .iter()
        .zip(&pd.decisions)
        .filter(|(it, _)| !it.shadow)
        .map(|(it, d)| it.hits.unwrap_or(req.hits).saturating_sub(d.granted))
        .max()
        .unwrap_or(0);
    if dropped > 0 {
        if let Some(ns) = view.namespace(req.namespace) {
            count_clamped(ns, dropped);
        }
    }
}

fn count_clamped(ns: &NamespaceView, dropped: u64) {
    metrics::counter!("tollgate_reports_clamped_total", "namespace" => ns.name.clone())
        .increment(1);
    metrics::counter!("tollgate_report_clamped_hits_total", "namespace" => ns.name.clone())
        .increment(dropped);
}

fn check_request(hits: u64, min_hits: u64) -> Result<(), ServiceError> {
    if min_hits > hits {
        return Err(ServiceError::Malformed(format!(
            "min_hits ({min_hits}) is greater than hits ({hits})"
        )));
    }
    Ok(())
}

/// Empty names are a malformed request, not an unknown name: no config can
/// define them, and an `allow_unconfigured` namespace must not grant them.
pub(crate) fn check_names(namespace: &str, resource: &str) -> Result<(), ServiceError> {
    if namespace.is_empty() {
        return Err(ServiceError::Malformed("namespace is required".into()));
    }
    if resource.is_empty() {
        return Err(ServiceError::Malformed("resource is required".into()));
    }
    Ok(())
}

fn namespace<'v>(view: &'v View, name: &str) -> Result<&'v NamespaceView, ServiceError> {
    if name.is_empty() {
        return Err(ServiceError::Malformed("namespace is required".into()));
    }
    view.namespace(name)
        .ok_or_else(|| ServiceError::UnknownNamespace(name.to_owned()))
}

fn wrong_kind(
    namespace: &str,
    resource: &str,
    actual: &'static str,
    expected: &'static str,
    operation: &'static str,
) -> ServiceError {
    ServiceError::WrongKind {
        namespace: namespace.to_owned(),
        resource: resource.to_owned(),
        actual,
        expected,
        operation,
    }
}

/// The plan for one domain of a rate resource: its algorithm, its hard
/// limit, the global limit.
fn rate_plan(
    rate: &RateView,
    limits: &DomainLimits,
    domain: &str,
    shadow: bool,
) -> Result<(Plan, SmallVec<[Role; 3]>), DuplicateKey> {
    let mut plan = Plan::default();
    let mut roles = SmallVec::new();
    match &limits.main {
        Main::Limited(c) => {
            plan.push(Key::new(c.id, domain), c.limit.clone(), shadow)?;
            roles.push(Role::Main);
        }
        Main::Listed(list) => {
            for (i, l) in list.iter().enumerate() {
                let c = &l.compiled;
                plan.push(Key::new(c.id, domain), c.limit.clone(), shadow)?;
                roles.push(Role::Listed(i));
            }
        }
        Main::Unlimited | Main::Deny => {}
    }
    if let Some(h) = &limits.hard {
        plan.push(Key::new(h.id, domain), h.limit.clone(), shadow)?;
        roles.push(Role::Hard);
    }
    if let Some(g) = &rate.global {
        plan.push(Key::new(g.id, ""), g.limit.clone(), shadow)?;
        roles.push(Role::Global);
    }
    Ok((plan, roles))
}

fn rate_outcome(
    pd: &PlanDecision,
    roles: &[Role],
    limits: &DomainLimits,
    rate: &RateView,
    hits: u64,
    shadow: bool,
    ignored: bool,
) -> RateOutcome {
    let mut decision = pd.summary();
    let used = |role: Role| {
        roles
            .iter()
            .position(|r| *r == role)
            .and_then(|i| pd.decisions.get(i))
            .map(|d| d.limit.saturating_sub(d.remaining))
    };
    let mut tier = pd.decisions.first().and_then(|d| d.tier);
    // With everything in shadow, the plan never limits; name what would have.
    let bound = pd.limited_by.or_else(|| {
        pd.rooms
            .iter()
            .enumerate()
            .filter(|(_, r)| **r < hits)
            .min_by_key(|(_, r)| **r)
            .map(|(i, _)| i)
    });
    let limited_by = bound.and_then(|i| roles.get(i)).map(|role| match role {
        Role::Main if tier.is_some() => LimitedBy::Tier,
        Role::Main => LimitedBy::Limit,
        Role::Listed(i) if pd.decisions.get(*i).is_some_and(|d| d.tier.is_some()) => {
            LimitedBy::Tier
        }
        Role::Listed(_) => LimitedBy::Limit,
        Role::Hard => LimitedBy::Hard,
        Role::Global => LimitedBy::Global,
    });
    let mut algorithm = limits.algorithm;
    let mut limit_name = None;
    let mut details = Vec::new();
    let mut fullest = None;
    if let Main::Listed(list) = &limits.main {
        // The binding limit: the one that bound the request, else the
        // one with the least room left; the answer's limit, remaining
        // and reset are its own (a day's quota is not reset when the
        // second's bucket refills).
        let binding = bound.or_else(|| {
            pd.decisions
                .iter()
                .enumerate()
                .min_by_key(|(_, d)| d.remaining)
                .map(|(i, _)| i)
        });
        // The hard or global limit may be the binding one too: then its
        // own limit, remaining and reset are the answer's (not the
        // tightest limit's count beside the longest reset of them all).
        if let Some((i, d)) = binding.and_then(|i| pd.decisions.get(i).map(|d| (i, d))) {
            decision.limit = d.limit;
            decision.remaining = d.remaining;
            decision.reset_after = d.reset_after;
            if let Some(Role::Listed(at)) = roles.get(i) {
                if let Some(l) = list.get(*at) {
                    decision.tier = d.tier;
                    tier = d.tier;
                    algorithm = l.algorithm;
                    limit_name = Some(Arc::clone(&l.name));
                }
            }
        }
        fullest = descriptors::fullest(
            roles
                .iter()
                .zip(&pd.decisions)
                .filter(|(role, _)| matches!(role, Role::Listed(_)))
                .map(|(_, d)| *d),
        );
        let item_shadow = shadow || ignored;
        // Named as an inspection names them (a listed resource's plan
        // has no `Main` item).
        details = roles
            .iter()
            .zip(&pd.decisions)
            .map(|(role, d)| {
                let (name, algorithm) = role.named(limits);
                LimitDetail {
                    name,
                    algorithm,
                    decision: *d,
                    shadow: item_shadow,
                }
            })
            .collect();
    }
    let forced = shadow || ignored;
    if forced {
        decision.allowed = true;
        decision.granted = hits;
    }
    RateOutcome {
        allowed: decision.allowed,
        granted: decision.granted,
        decision,
        limited_by: if pd.granted < hits || forced {
            limited_by
        } else {
            None
        },
        tier,
        hard_limit: limits.hard_limit,
        global_limit: rate.global_limit,
        domain_hits_last_second: limits.hard.as_ref().and_then(|_| used(Role::Hard)),
        global_hits_last_second: rate.global.as_ref().and_then(|_| used(Role::Global)),
        shadowed: shadow && pd.shadow_limited,
        ignored: ignored && pd.shadow_limited,
        unconfigured: false,
        algorithm,
        limit_name,
        limits: details,
        fullest,
    }
}

fn denied(limits: &DomainLimits, rate: &RateView) -> RateOutcome {
    let mut decision = Decision::unlimited(0);
    decision.allowed = false;
    decision.limit = 0;
    decision.remaining = 0;
    decision.retry_after = None;
    RateOutcome {
        allowed: false,
        granted: 0,
        decision,
        limited_by: Some(LimitedBy::Deny),
        tier: None,
        hard_limit: limits.hard_limit,
        global_limit: rate.global_limit,
        domain_hits_last_second: None,
        global_hits_last_second: None,
        shadowed: false,
        ignored: false,
        unconfigured: false,
        algorithm: limits.algorithm,
        limit_name: None,
        limits: Vec::new(),
        fullest: None,
    }
}

/// Marks an allowed outcome of a `deny` resource as what the deny would
/// have done: limited by it, with nothing remaining.
fn shadow_denied(outcome: &mut RateOutcome, shadow: bool, ignored: bool) {
    outcome.limited_by = Some(LimitedBy::Deny);
    outcome.shadowed = shadow;
    outcome.ignored = ignored;
    outcome.decision.limit = 0;
    outcome.decision.remaining = 0;
    outcome.decision.retry_after = None;
}

fn unconfigured(hits: u64) -> RateOutcome {
    RateOutcome {
        allowed: true,
        granted: hits,
        decision: Decision::unlimited(hits),
        limited_by: None,
        tier: None,
        hard_limit: None,
        global_limit: None,
        domain_hits_last_second: None,
        global_hits_last_second: None,
        shadowed: false,
        ignored: false,
        unconfigured: true,
        algorithm: "unlimited",
        limit_name: None,
        limits: Vec::new(),
        fullest: None,
    }
}
