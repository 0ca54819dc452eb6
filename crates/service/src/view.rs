//! The config view: a resolved [`Config`] compiled into what answering a
//! request needs — built algorithms, their [`LimitId`]s, lookup maps.
//!
//! Built once per config (load or reload), then shared read-only by every
//! request.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use tollgate_config::{
    AlgorithmSpec, Config, DescriptorTree, EnvoyMeta, RateSpec, Resource, ResourceKind,
};
use tollgate_core::copies::CopyLimits;
use tollgate_core::replicated::strategy::Replication;
use tollgate_core::{Limit, Nanos};
use tollgate_store::{LimitId, PoolKey};

use crate::fingerprint::limit_id;

/// A limit of a config that a store cannot serve: where it is, and why
/// (the reason says what to change).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unservable {
    /// The namespace.
    pub namespace: String,
    /// The resource.
    pub resource: String,
    /// The domain override the limit belongs to; `None` for the resource's
    /// own limits.
    pub domain: Option<String>,
    /// Why, and what to change.
    pub reason: String,
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
        write!(f, ": {}", self.reason)
    }
}

/// Puts `problems` in the order their resources are written in `config`
/// (a view's namespaces are a map), the resource's own before its
/// overrides', and drops repeats.
pub fn in_config_order(config: &Config, problems: &mut Vec<Unservable>) {
    let place = |p: &Unservable| {
        config
            .namespaces
            .iter()
            .position(|n| n.name == p.namespace)
            .map(|i| {
                let r = config.namespaces[i]
                    .resources
                    .iter()
                    .position(|r| r.name == p.resource);
                (i, r)
            })
    };
    problems.sort_by(|a, b| {
        place(a)
            .cmp(&place(b))
            .then_with(|| a.domain.cmp(&b.domain))
    });
    problems.dedup();
}

/// A built algorithm and the id its state is kept under.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// Names the state.
    pub id: LimitId,
    /// The algorithm.
    pub limit: Arc<Limit>,
}

/// What limits a domain's requests besides hard and global limits.
#[derive(Clone, Debug)]
pub enum Main {
    /// An algorithm with state.
    Limited(Compiled),
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
    pub domains: HashMap<String, DomainLimits>,
    /// The all-domain per-second limit.
    pub global: Option<Compiled>,
    /// Its value, for responses.
    pub global_limit: Option<u64>,
}

impl RateView {
    /// The limits for `domain`.
    pub fn for_domain(&self, domain: &str) -> &DomainLimits {
        self.domains.get(domain).unwrap_or(&self.default)
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
    by_name: HashMap<String, usize>,
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
    namespaces: HashMap<String, NamespaceView>,
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
    /// every limit `prepare` refused, so one run shows all there is to
    /// change; a domain override refused for the reason its resource was is
    /// not listed again.
    pub fn adapt(
        &mut self,
        config: &Config,
        mut prepare: impl FnMut(&Compiled, Option<&Replication>) -> Result<Limit, String>,
    ) -> Result<(), Vec<Unservable>> {
        let mut problems: Vec<Unservable> = Vec::new();
        for ns in self.namespaces.values_mut() {
            let Some(configured) = config.namespace(&ns.name) else {
                continue;
            };
            for r in &mut ns.resources {
                let replication = configured
                    .resource(&r.name)
                    .and_then(|c| c.replication.as_ref());
                let ResourceView::Rate(rate) = &mut r.view else {
                    continue;
                };
                // Each limit with the domain override it belongs to (none:
                // the resource's own), the resource's first.
                let mut compiled: Vec<(Option<&str>, &mut Compiled)> = Vec::new();
                let mut domains: Vec<(&String, &mut DomainLimits)> =
                    rate.domains.iter_mut().collect();
                domains.sort_by(|a, b| a.0.cmp(b.0));
                let all = std::iter::once((None, &mut rate.default))
                    .chain(domains.into_iter().map(|(k, v)| (Some(k.as_str()), v)));
                for (domain, d) in all {
                    if let Main::Limited(c) = &mut d.main {
                        compiled.push((domain, c));
                    }
                    compiled.extend(d.hard.as_mut().map(|c| (domain, c)));
                }
                compiled.extend(rate.global.as_mut().map(|c| (None, c)));
                let mut refused: Vec<String> = Vec::new();
                for (domain, c) in compiled {
                    let limit = match prepare(c, replication) {
                        Ok(limit) => limit,
                        Err(reason) => {
                            if domain.is_none() || !refused.contains(&reason) {
                                problems.push(Unservable {
                                    namespace: ns.name.clone(),
                                    resource: r.name.clone(),
                                    domain: domain.map(str::to_owned),
                                    reason: reason.clone(),
                                });
                            }
                            if domain.is_none() {
                                refused.push(reason);
                            }
                            continue;
                        }
                    };
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
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Every limit with state, with the namespace and resource it belongs
    /// to: main and hard limits of every domain, and global limits.
    pub fn limits(&self) -> impl Iterator<Item = (&str, &str, &Compiled)> {
        self.namespaces.values().flat_map(|ns| {
            ns.resources.iter().flat_map(move |r| {
                let mut out: Vec<&Compiled> = Vec::new();
                if let ResourceView::Rate(rate) = &r.view {
                    for d in std::iter::once(&rate.default).chain(rate.domains.values()) {
                        if let Main::Limited(c) = &d.main {
                            out.push(c);
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
    let view = match &r.kind {
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
            })
        }
        ResourceKind::Concurrency(limits) => ResourceView::Concurrency {
            pool: PoolKey::new(namespace, &r.name),
            limits: Arc::new(limits.clone()),
        },
    };
    ResourceEntry {
        name: r.name.clone(),
        shadow: r.shadow,
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
    let canonical = spec.algorithm.to_string();
    let main = match &spec.algorithm {
        AlgorithmSpec::Unlimited => Main::Unlimited,
        AlgorithmSpec::Deny => Main::Deny,
        other => match other.build(created_at) {
            Ok(Some(limit)) => Main::Limited(Compiled {
                id: limit_id(&[namespace, resource, "main", &canonical]),
                limit: Arc::new(limit),
            }),
            // The loader validated every spec; a failure here would be a
            // loader bug, and refusing is the safe answer.
            _ => Main::Deny,
        },
    };
    let hard = spec
        .hard_limit
        .and_then(|h| per_second(&[namespace, resource, "hard", &h.to_string()], h));
    DomainLimits {
        main,
        hard,
        hard_limit: spec.hard_limit,
        algorithm: spec.algorithm.name(),
    }
}

fn per_second(parts: &[&str], limit: u64) -> Option<Compiled> {
    tollgate_core::per_second_limit(limit)
        .ok()
        .map(|l| Compiled {
            id: limit_id(parts),
            limit: Arc::new(Limit::SlidingLog(l)),
        })
}
