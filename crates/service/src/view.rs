//! The config view: a resolved [`Config`] compiled into what answering a
//! request needs — built algorithms, their [`LimitId`]s, lookup maps.
//!
//! Built once per config (load or reload), then shared read-only by every
//! request.

use std::collections::{HashMap, HashSet};

use hashbrown::DefaultHashBuilder;
use std::fmt;
use std::sync::Arc;

use tollgate_config::{
    AlgorithmSpec, Config, DescriptorTree, EnvoyMeta, RateSpec, Resource, ResourceKind,
};
use tollgate_core::copies::CopyLimits;
use tollgate_core::replicated::strategy::Replication;
use tollgate_core::{Limit, Nanos};
use tollgate_store::{LimitId, PoolKey, Refusal};

use crate::fingerprint::limit_id;

/// A map from names in the config (namespaces, resources, domains with
/// limits of their own), looked up on every decision: foldhash
/// (hashbrown's) rather than SipHash, at a third of its cost on short
/// names. Its keys come from the config, so no stranger chooses what
/// collides; a stranger's name is only ever looked up.
pub type ByName<V> = HashMap<String, V, DefaultHashBuilder>;

/// A limit of a config that a store cannot serve: where it is, and why
/// (the reason, its [`source`](std::error::Error::source), says what to
/// change). Shown alone it names the place; with its source (`{:#}` of an
/// `anyhow` error, or [`Unserved`]'s lines) it reads
/// "namespace `a`, resource `b`: why".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Unservable {
    /// The namespace.
    pub namespace: String,
    /// The resource.
    pub resource: String,
    /// The domain override the limit belongs to; `None` for the resource's
    /// own limits.
    pub domain: Option<String>,
    /// The limit's name, for one limit of a `limits:` list; `None` for a
    /// resource's single algorithm and its hard and global limits.
    pub limit: Option<String>,
    /// Why, and what to change: the store's refusal.
    pub reason: Refusal,
}

impl fmt::Display for Unservable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "namespace `{}`, resource `{}`",
            self.namespace, self.resource
        )?;
        if let Some(d) = &self.domain {
            write!(f, ", domain `{d}`")?;
        }
        if let Some(l) = &self.limit {
            write!(f, ", limit `{l}`")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unservable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.reason)
    }
}

/// A config a store cannot serve ([`Limiter::compile`](crate::Limiter::compile)):
/// every limit it refused, in the config's order, so one run shows all
/// there is to change. Shown, one line per problem: where, and why (with
/// the reason's own causes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unserved {
    /// The limits refused; never empty.
    pub problems: Vec<Unservable>,
}

impl fmt::Display for Unserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            // The place, then each cause in turn, as `{:#}` shows a chain.
            write!(f, "{problem}")?;
            let mut cause = std::error::Error::source(problem);
            while let Some(c) = cause {
                write!(f, ": {c}")?;
                cause = c.source();
            }
        }
        Ok(())
    }
}

/// Each problem is one line of the message; none is singled out as the
/// cause.
impl std::error::Error for Unserved {}

/// Puts `problems` in the order their resources are written in `config`
/// (a view's namespaces are a map), each resource's own before its
/// overrides' (otherwise as they were: a stable sort), and drops repeats.
/// The places are looked up once, not in every comparison.
pub fn in_config_order(config: &Config, problems: &mut Vec<Unservable>) {
    let places: HashMap<(&str, &str), (usize, usize)> = config
        .namespaces
        .iter()
        .enumerate()
        .flat_map(|(i, ns)| {
            ns.resources
                .iter()
                .enumerate()
                .map(move |(j, r)| ((ns.name.as_str(), r.name.as_str()), (i, j)))
        })
        .collect();
    problems.sort_by_cached_key(|p| {
        let place = places
            .get(&(p.namespace.as_str(), p.resource.as_str()))
            .copied()
            // Not in the config (it cannot be): after everything.
            .unwrap_or((usize::MAX, usize::MAX));
        (place, p.domain.is_some())
    });
    let mut seen = HashSet::new();
    problems.retain(|p| seen.insert(p.clone()));
}

/// Which limit of a resource (or of one of its domain overrides) a
/// refusal is about.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Part {
    /// The algorithm.
    Main,
    /// The per-domain hard limit.
    Hard,
    /// The global limit (the resource's alone).
    Global,
    /// One limit of a `limits:` list, by position.
    Listed(usize),
}

/// What a store refused of one resource's limits, as the problems to
/// list, added to `out` in the order given (the resource's own first).
/// A limit of an override that refines the resource ([`Resource::refining`])
/// is the resource's, inherited: refused with the resource's same limit,
/// it is told once, of the resource, as changing the resource changes it.
/// An override that replaces the resource's limits (names its own
/// `algorithm:`) is listed for its own refusals whatever they say: it has
/// to be changed too, even to an algorithm that reads alike.
fn list_refused(
    namespace: &str,
    resource: &Resource,
    refused: Vec<(Option<&str>, Part, Refusal)>,
    out: &mut Vec<Unservable>,
) {
    let spec_of = |domain: Option<&str>| match &resource.kind {
        tollgate_config::ResourceKind::Rate(rate) => Some(match domain {
            Some(d) => rate.for_domain(d),
            None => &rate.default,
        }),
        tollgate_config::ResourceKind::Concurrency(_) => None,
    };
    let own: Vec<Part> = refused
        .iter()
        .filter(|(domain, _, _)| domain.is_none())
        .map(|(_, part, _)| *part)
        .collect();
    for (domain, part, reason) in refused {
        if domain.is_some_and(|d| resource.refining.contains(d)) && own.contains(&part) {
            continue;
        }
        let limit = match part {
            Part::Listed(i) => spec_of(domain).map(|spec| spec.limit_name(i)),
            _ => None,
        };
        out.push(Unservable {
            namespace: namespace.to_owned(),
            resource: resource.name.clone(),
            domain: domain.map(str::to_owned),
            limit,
            reason,
        });
    }
}

/// A built algorithm and the id its state is kept under.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// Names the state.
    pub id: LimitId,
    /// The algorithm.
    pub limit: Arc<Limit>,
}

/// One limit of a `limits:` list, compiled, with what answers say of it.
#[derive(Clone, Debug)]
pub struct Listed {
    /// Its name (its `name:`, else its position from 1): what answers
    /// call it.
    pub name: std::sync::Arc<str>,
    /// The algorithm and the id of its state.
    pub compiled: Compiled,
    /// The algorithm's config name.
    pub algorithm: &'static str,
    /// The limit in envoyproxy/ratelimit's terms, when it is a count per
    /// unit (Envoy's `current_limit`).
    pub envoy: Option<tollgate_config::model::EnvoyLimit>,
}

/// What limits a domain's requests besides hard and global limits.
#[derive(Clone, Debug)]
pub enum Main {
    /// An algorithm with state.
    Limited(Compiled),
    /// Several limits (a `limits:` list), decided together; never empty.
    Listed(Vec<Listed>),
    /// Everything is granted.
    Unlimited,
    /// Everything is rejected.
    Deny,
}

/// The limits of one domain of a rate-limited resource.
#[derive(Clone, Debug)]
pub struct DomainLimits {
    /// The resource's algorithm.
    pub main: Main,
    /// The per-domain per-second hard limit.
    pub hard: Option<Compiled>,
    /// Its value, for responses.
    pub hard_limit: Option<u64>,
    /// The algorithm's config name.
    pub algorithm: &'static str,
}

/// A rate-limited resource, compiled.
#[derive(Clone, Debug)]
pub struct RateView {
    /// Limits of domains without an override.
    pub default: DomainLimits,
    /// Overrides.
    pub domains: ByName<DomainLimits>,
    /// The all-domain per-second limit.
    pub global: Option<Compiled>,
    /// Its value, for responses.
    pub global_limit: Option<u64>,
    /// The fastest limit a request may bring of its own
    /// (`allow_override`, `override_max`); `None`: requests may not.
    pub override_max: Option<tollgate_core::Rate>,
}

impl RateView {
    /// The limits for `domain`.
    pub fn for_domain(&self, domain: &str) -> &DomainLimits {
        self.domains.get(domain).unwrap_or(&self.default)
    }

    /// Every limit with state, with the override it belongs to (`None`:
    /// the resource's own) and which it is: the resource's first, then
    /// its overrides' by domain (as a config writes them).
    fn placed(&self) -> Vec<(Option<&str>, Part, &Compiled)> {
        let mut domains: Vec<(&String, &DomainLimits)> = self.domains.iter().collect();
        domains.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = Vec::new();
        let all = std::iter::once((None, &self.default))
            .chain(domains.into_iter().map(|(k, v)| (Some(k.as_str()), v)));
        for (domain, d) in all {
            match &d.main {
                Main::Limited(c) => out.push((domain, Part::Main, c)),
                Main::Listed(list) => out.extend(
                    list.iter()
                        .enumerate()
                        .map(|(i, l)| (domain, Part::Listed(i), &l.compiled)),
                ),
                Main::Unlimited | Main::Deny => {}
            }
            out.extend(d.hard.as_ref().map(|c| (domain, Part::Hard, c)));
        }
        out.extend(self.global.as_ref().map(|c| (None, Part::Global, c)));
        out
    }

    /// [`RateView::placed`], to rebuild the limits.
    fn placed_mut(&mut self) -> Vec<(Option<&str>, Part, &mut Compiled)> {
        let RateView {
            default,
            domains,
            global,
            ..
        } = self;
        let mut domains: Vec<(&String, &mut DomainLimits)> = domains.iter_mut().collect();
        domains.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = Vec::new();
        let all = std::iter::once((None, default))
            .chain(domains.into_iter().map(|(k, v)| (Some(k.as_str()), v)));
        for (domain, d) in all {
            match &mut d.main {
                Main::Limited(c) => out.push((domain, Part::Main, c)),
                Main::Listed(list) => out.extend(
                    list.iter_mut()
                        .enumerate()
                        .map(|(i, l)| (domain, Part::Listed(i), &mut l.compiled)),
                ),
                Main::Unlimited | Main::Deny => {}
            }
            out.extend(d.hard.as_mut().map(|c| (domain, Part::Hard, c)));
        }
        out.extend(global.as_mut().map(|c| (None, Part::Global, c)));
        out
    }
}

/// A resource, compiled.
#[derive(Clone, Debug)]
pub enum ResourceView {
    /// Rate-limited.
    Rate(RateView),
    /// Copy-limited: its pool and limits.
    Concurrency {
        /// The pool's key.
        pool: PoolKey,
        /// The effective limits.
        limits: Arc<CopyLimits>,
    },
}

/// A resource entry of a namespace.
#[derive(Clone, Debug)]
pub struct ResourceEntry {
    /// Its name.
    pub name: String,
    /// Never rejects; records what it would have done.
    pub shadow: bool,
    /// Envoy's rate-limit service charges it in report mode (`report:
    /// true`).
    pub report: bool,
    /// envoyproxy/ratelimit details.
    pub envoy: Option<EnvoyMeta>,
    /// The compiled limits.
    pub view: ResourceView,
}

/// A namespace, compiled.
#[derive(Clone, Debug)]
pub struct NamespaceView {
    /// Its name.
    pub name: String,
    /// Unknown resources are granted (and recorded).
    pub allow_unconfigured: bool,
    /// Limiting is off; use is recorded.
    pub ignore_configured: bool,
    /// Resources in config order (descriptor matches index into this).
    pub resources: Vec<ResourceEntry>,
    by_name: ByName<usize>,
    /// The descriptor tree of an envoyproxy/ratelimit namespace.
    pub descriptors: Option<DescriptorTree>,
    /// Every plan of this namespace carries it ([`tollgate_store::Plan::affinity`]),
    /// so a partitioned store keeps the namespace's keys together.
    pub affinity: u64,
}

impl NamespaceView {
    /// The resource called `name`.
    pub fn resource(&self, name: &str) -> Option<&ResourceEntry> {
        self.by_name.get(name).map(|&i| &self.resources[i])
    }
}

/// The whole compiled config.
#[derive(Clone, Debug, Default)]
pub struct View {
    namespaces: ByName<NamespaceView>,
    /// When the limits were loaded: smooth limiters' keys count from here.
    pub created_at: Nanos,
}

impl View {
    /// Compiles `config`; `created_at` is the load time.
    pub fn new(config: &Config, created_at: Nanos) -> View {
        let namespaces = config
            .namespaces
            .iter()
            .map(|ns| {
                let resources: Vec<ResourceEntry> = ns
                    .resources
                    .iter()
                    .map(|r| compile_resource(&ns.name, r, created_at))
                    .collect();
                let by_name = resources
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.name.clone(), i))
                    .collect();
                let view = NamespaceView {
                    name: ns.name.clone(),
                    allow_unconfigured: ns.allow_unconfigured,
                    ignore_configured: ns.ignore_configured,
                    resources,
                    by_name,
                    descriptors: ns.descriptors.clone(),
                    affinity: crate::fingerprint::limit_id(&["namespace", &ns.name]).0,
                };
                (ns.name.clone(), view)
            })
            .collect();
        View {
            namespaces,
            created_at,
        }
    }

    /// The namespace called `name`.
    pub fn namespace(&self, name: &str) -> Option<&NamespaceView> {
        self.namespaces.get(name)
    }

    /// Every namespace.
    pub fn namespaces(&self) -> impl Iterator<Item = &NamespaceView> {
        self.namespaces.values()
    }

    /// Rebuilds every limit with `prepare`, which sees the limit and how
    /// its resource asks to be replicated (`config` is the config the view
    /// was compiled from) and answers the limit to decide with, or why it
    /// cannot run. A replicated limit's id also covers its replication
    /// (strategy and gossip parameters), so changing them starts its state
    /// fresh and nodes that disagree never mix states. The error lists
    /// every limit `prepare` refused, in the config's order, so one run
    /// shows all there is to change; a limit a refining override inherits
    /// is told of its resource alone ([`list_refused`]).
    pub fn adapt(
        &mut self,
        config: &Config,
        mut prepare: impl FnMut(&Compiled, Option<&Replication>) -> Result<Limit, Refusal>,
    ) -> Result<(), Vec<Unservable>> {
        let mut problems: Vec<Unservable> = Vec::new();
        for configured_ns in &config.namespaces {
            let Some(ns) = self.namespaces.get_mut(&configured_ns.name) else {
                continue;
            };
            for configured in &configured_ns.resources {
                let Some(&i) = ns.by_name.get(&configured.name) else {
                    continue;
                };
                let ResourceView::Rate(rate) = &mut ns.resources[i].view else {
                    continue;
                };
                let replication = configured.replication.as_ref();
                let usage = if configured.usage.report {
                    Some("`report: true`")
                } else {
                    configured.usage.max_debt.map(|_| "`max_debt`")
                };
                let mut refused = Vec::new();
                for (domain, part, c) in rate.placed_mut() {
                    let limit = match prepare(c, replication) {
                        Ok(limit) => limit,
                        Err(reason) => {
                            refused.push((domain, part, reason));
                            continue;
                        }
                    };
                    if let (Some(field), Limit::Replicated(_)) = (usage, &limit) {
                        // The loader checked that the configured algorithm
                        // owes hits; the store's replicated form may not
                        // (a gossip cluster's queue and epoch strategies).
                        if !limit.takes_usage() {
                            let why = NoReplicatedUsage {
                                field,
                                algorithm: limit.algorithm_name(),
                            };
                            refused.push((domain, part, Refusal::limit(why)));
                            continue;
                        }
                    }
                    if let Limit::Replicated(how) = &limit {
                        // Whatever chose the replication (the resource or
                        // the cluster's default), nodes that replicate a
                        // limit differently never mix their states.
                        c.id = limit_id(&[
                            &c.id.to_string(),
                            "replication",
                            &how.replication.fingerprint(),
                        ]);
                    }
                    c.limit = Arc::new(limit);
                }
                list_refused(&ns.name, configured, refused, &mut problems);
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Every limit of this view (compiled from `config`) that `check`
    /// refuses, with its namespace, resource and domain override, in the
    /// config's order, as [`View::adapt`] lists them. Lets a caller hold a
    /// config to the rules of a store it has not built (`tollgate serve
    /// --check` and Redis, whose rules are its [`tollgate_store::Store::admit`]
    /// without a connection) and get the list the store itself would give.
    pub fn unservable(
        &self,
        config: &Config,
        mut check: impl FnMut(&Limit) -> Result<(), Refusal>,
    ) -> Vec<Unservable> {
        let mut problems = Vec::new();
        for configured_ns in &config.namespaces {
            let Some(ns) = self.namespaces.get(&configured_ns.name) else {
                continue;
            };
            for configured in &configured_ns.resources {
                let Some(ResourceView::Rate(rate)) = ns.resource(&configured.name).map(|r| &r.view)
                else {
                    continue;
                };
                let refused = rate
                    .placed()
                    .into_iter()
                    .filter_map(|(domain, part, c)| {
                        check(&c.limit).err().map(|reason| (domain, part, reason))
                    })
                    .collect();
                list_refused(&ns.name, configured, refused, &mut problems);
            }
        }
        problems
    }

    /// Every limit with state, with the namespace and resource it belongs
    /// to: main and hard limits of every domain, and global limits.
    pub fn limits(&self) -> impl Iterator<Item = (&str, &str, &Compiled)> {
        self.namespaces.values().flat_map(|ns| {
            ns.resources.iter().flat_map(move |r| {
                let mut out: Vec<&Compiled> = Vec::new();
                if let ResourceView::Rate(rate) = &r.view {
                    for d in std::iter::once(&rate.default).chain(rate.domains.values()) {
                        match &d.main {
                            Main::Limited(c) => out.push(c),
                            Main::Listed(list) => out.extend(list.iter().map(|l| &l.compiled)),
                            Main::Unlimited | Main::Deny => {}
                        }
                        out.extend(d.hard.as_ref());
                    }
                    out.extend(rate.global.as_ref());
                }
                out.into_iter()
                    .map(move |c| (ns.name.as_str(), r.name.as_str(), c))
            })
        })
    }
}

fn compile_resource(namespace: &str, r: &Resource, created_at: Nanos) -> ResourceEntry {
    let mut view = match &r.kind {
        ResourceKind::Rate(rate) => {
            let global = rate
                .global_limit
                .and_then(|g| per_second(&[namespace, &r.name, "global", &g.to_string()], g));
            ResourceView::Rate(RateView {
                default: compile_domain(namespace, &r.name, &rate.default, created_at),
                domains: rate
                    .domains
                    .iter()
                    .map(|(d, spec)| {
                        (
                            d.clone(),
                            compile_domain(namespace, &r.name, spec, created_at),
                        )
                    })
                    .collect(),
                global,
                global_limit: rate.global_limit,
                override_max: rate.override_max,
            })
        }
        ResourceKind::Concurrency(limits) => ResourceView::Concurrency {
            pool: PoolKey::new(namespace, &r.name),
            limits: Arc::new(limits.clone()),
        },
    };
    if let (Some(debt), ResourceView::Rate(rate)) = (r.usage.max_debt, &mut view) {
        // The resource's own algorithm, or each limit of its `limits:`
        // list, owes up to `max_debt`; the hard and global limits
        // (per-second logs) keep their default of one limit.
        for (_, part, c) in rate.placed_mut() {
            if !matches!(part, Part::Main | Part::Listed(_)) {
                continue;
            }
            // The loader checked that the debt fits every algorithm.
            if let Ok(limit) = Limit::clone(&c.limit).with_max_debt(debt) {
                c.limit = Arc::new(limit);
            }
        }
    }
    ResourceEntry {
        name: r.name.clone(),
        shadow: r.shadow,
        report: r.usage.report,
        envoy: r.envoy.clone(),
        view,
    }
}

fn compile_domain(
    namespace: &str,
    resource: &str,
    spec: &RateSpec,
    created_at: Nanos,
) -> DomainLimits {
    let main = match spec.algorithm() {
        Some(AlgorithmSpec::Unlimited) => Main::Unlimited,
        Some(AlgorithmSpec::Deny) => Main::Deny,
        Some(other) => match other.build(created_at) {
            Ok(Some(limit)) => Main::Limited(Compiled {
                id: limit_id(&[namespace, resource, "main", &other.to_string()]),
                limit: Arc::new(limit),
            }),
            // The loader validated every spec; a failure here would be a
            // loader bug, and refusing is the safe answer.
            _ => Main::Deny,
        },
        None => compile_listed(namespace, resource, spec, created_at),
    };
    let hard = spec
        .hard_limit
        .and_then(|h| per_second(&[namespace, resource, "hard", &h.to_string()], h));
    DomainLimits {
        main,
        hard,
        hard_limit: spec.hard_limit,
        algorithm: spec.limits.first().map_or("deny", |l| l.algorithm.name()),
    }
}

/// A `limits:` list, each limit keyed by its name (so reordering named
/// limits keeps their counters) and its parameters (so changing them
/// starts afresh, as for a single algorithm).
fn compile_listed(namespace: &str, resource: &str, spec: &RateSpec, created_at: Nanos) -> Main {
    let mut out = Vec::with_capacity(spec.limits.len());
    for (i, l) in spec.limits.iter().enumerate() {
        let name = spec.limit_name(i);
        let Ok(Some(limit)) = l.algorithm.build(created_at) else {
            // The loader validated every spec (and refuses `unlimited`
            // and `deny` in a list); refusing is the safe answer.
            return Main::Deny;
        };
        out.push(Listed {
            compiled: Compiled {
                id: limit_id(&[
                    namespace,
                    resource,
                    "limit",
                    &name,
                    &l.algorithm.to_string(),
                ]),
                limit: Arc::new(limit),
            },
            algorithm: l.algorithm.name(),
            envoy: tollgate_config::model::EnvoyLimit::of_algorithm(&l.algorithm),
            name: name.into(),
        });
    }
    if out.is_empty() {
        return Main::Deny;
    }
    Main::Listed(out)
}

fn per_second(parts: &[&str], limit: u64) -> Option<Compiled> {
    tollgate_core::per_second_limit(limit)
        .ok()
        .map(|l| Compiled {
            id: limit_id(parts),
            limit: Arc::new(Limit::SlidingLog(l)),
        })
}

/// Why a store cannot serve a resource with `allow_override: true`: the
/// limits its requests bring are fixed windows, which the store refuses
/// (a gossip cluster replicates token buckets and GCRA only).
#[derive(Debug, thiserror::Error)]
#[error(
    "`allow_override: true` lets requests bring limits of their own, fixed windows of a unit, \
     which this store cannot serve ({why}); remove `allow_override` and `override_max`, or \
     serve this config from the memory or Redis store (`--store`)"
)]
pub struct NoBroughtLimits {
    /// The store's refusal of such a limit.
    pub why: String,
}

/// Why a store's replicated form of a limit cannot serve a resource that
/// takes usage reported after the fact (`report: true` or `max_debt`): a
/// gossip cluster's `queue` and `epoch` strategies have no sound refund,
/// so they take no usage at all (`docs/algorithms/usage.md`).
#[derive(Debug, thiserror::Error)]
#[error(
    "{field} needs every limit to owe hits, and a gossip cluster replicates this one as \
     `{algorithm}`, which takes no reports or refunds; use `replication: counter`, remove \
     {field}, or serve the resource from the Redis store"
)]
pub struct NoReplicatedUsage {
    /// The resource's field that asks for usage.
    pub field: &'static str,
    /// The limit as the store replicates it.
    pub algorithm: &'static str,
}
