//! The resolved configuration: what the service limits with.
//!
//! Everything here is validated and normalized; building a [`Limit`] from
//! an [`AlgorithmSpec`] that came out of the loader cannot fail.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use tollgate_core::copies::CopyLimits;
use tollgate_core::replicated::strategy::Replication;
use tollgate_core::{
    Align, BurstTiers, FixedWindow, Gcra, LeakyBucket, Limit, Nanos, ParamError, Rate, SlidingLog,
    SlidingWindow, Smooth, Tier, TokenBucket,
};

use crate::diag::Pos;
use crate::envoy::DescriptorTree;

/// A whole configuration: its namespaces.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// The namespaces, in file order.
    pub namespaces: Vec<Namespace>,
}

impl Config {
    /// The namespace called `name`.
    pub fn namespace(&self, name: &str) -> Option<&Namespace> {
        self.namespaces.iter().find(|n| n.name == name)
    }
}

/// A group of resources with its flags (Charon §4.3).
#[derive(Clone, Debug, PartialEq)]
pub struct Namespace {
    /// Its name (an envoyproxy/ratelimit `domain`).
    pub name: String,
    /// Unknown resources get the most permissive limits; their use is still
    /// recorded.
    pub allow_unconfigured: bool,
    /// Limiting is off for the namespace; use is still recorded.
    pub ignore_configured: bool,
    /// The resources.
    pub resources: Vec<Resource>,
    /// For a namespace loaded from an envoyproxy/ratelimit file: its
    /// descriptor tree, mapping descriptors to resources.
    pub descriptors: Option<DescriptorTree>,
    /// Where it was defined.
    pub pos: Pos,
}

impl Namespace {
    /// The resource called `name`.
    pub fn resource(&self, name: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.name == name)
    }
}

/// One limited resource.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    /// Its name, unique in the namespace.
    pub name: String,
    /// Rate-limited or copy-limited, with the limits.
    pub kind: ResourceKind,
    /// Decided and recorded, but never rejects (envoyproxy/ratelimit's
    /// `shadow_mode`).
    pub shadow: bool,
    /// Usage reported after the fact (`report:`, `max_debt:`; rate
    /// resources only).
    pub usage: UsageSpec,
    /// How the resource is replicated in a gossip cluster (`replication:`);
    /// `None`: the cluster's default strategy. Ignored by the memory and
    /// Redis stores. Only rate-limited resources have one.
    pub replication: Option<Replication>,
    /// envoyproxy/ratelimit details, for resources loaded from its format.
    pub envoy: Option<EnvoyMeta>,
    /// The domains of a rate resource whose override refines its limits
    /// (names no `algorithm:`, so inherits the algorithm and every
    /// parameter it does not set) rather than replacing them. Like `pos`,
    /// where the config came from, not what it limits (an override is
    /// resolved either way): an error about a limit an override inherits
    /// is told of the resource alone. Empty for envoyproxy/ratelimit files
    /// and for the config API's documents, which store every override
    /// resolved, with its `algorithm:`.
    pub refining: BTreeSet<String>,
    /// Where it was defined.
    pub pos: Pos,
}

/// How a rate resource takes usage reported after the fact
/// (`tollgate_core::Mode::Report` and `Refund`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageSpec {
    /// `max_debt:`, the most hits a report may leave owing beyond what a
    /// fresh state admits, for the resource's algorithm in every domain;
    /// `None`: one capacity or limit of that algorithm. Hard and global
    /// limits always owe at most one limit.
    pub max_debt: Option<u64>,
    /// `report: true`: Envoy's rate-limit service charges this resource in
    /// report mode (after the fact, never rejecting).
    pub report: bool,
}

impl UsageSpec {
    /// Checks the usage settings of rate resource `rate`: `max_debt` must
    /// fit each of its algorithms, and only algorithms with a sound debt
    /// may take it or be `report: true`. The error says what to change.
    pub fn check(&self, rate: &RateResource) -> Result<(), String> {
        if self.max_debt.is_none() && !self.report {
            return Ok(());
        }
        // Every limit of a `limits:` list is charged by a report, so each
        // must be able to owe hits.
        let specs = std::iter::once(&rate.default).chain(rate.domains.values());
        for spec in specs.flat_map(|s| s.limits.iter()) {
            let name = spec.algorithm.name();
            let limit = match &spec.algorithm {
                AlgorithmSpec::Unlimited => continue,
                AlgorithmSpec::Deny => None,
                other => other.build(Nanos::ZERO).ok().flatten(),
            };
            let Some(limit) = limit.filter(|l| l.takes_usage()) else {
                let what = if self.report {
                    "`report: true`"
                } else {
                    "`max_debt`"
                };
                return Err(format!(
                    "{what} needs an algorithm that can owe hits (token_bucket, gcra, \
                     leaky_bucket, fixed_window, sliding_window or sliding_log); `{name}` cannot"
                ));
            };
            if let Some(debt) = self.max_debt {
                limit.with_max_debt(debt).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}

/// What an envoyproxy/ratelimit `rate_limit` block adds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvoyMeta {
    /// The limit's `name`, which other limits' `replaces` refer to.
    pub name: Option<String>,
    /// Names of limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Metrics per descriptor value rather than per config path.
    pub detailed_metric: bool,
    /// The limit in envoyproxy/ratelimit's own terms, which Envoy's
    /// rate-limit service reports back as a descriptor's `current_limit`.
    /// `None` for `unlimited`, and for an algorithm extension that cannot
    /// be said as "N per unit" (a token bucket, a window that is not a
    /// whole unit).
    pub limit: Option<EnvoyLimit>,
}

/// `requests_per_unit` per `unit`: an envoyproxy/ratelimit limit as
/// written, kept because the resolved algorithm (a fixed window of some
/// nanoseconds) no longer says which unit it was. Also the shape of a
/// limit a request brings ([`RateResource::override_max`], Envoy's
/// descriptor `limit`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct EnvoyLimit {
    /// Hits per unit; 0 for a limit that rejects everything.
    pub requests_per_unit: u64,
    /// The unit.
    pub unit: EnvoyUnit,
}

impl EnvoyLimit {
    /// Whether this limit's rate is at most `max` (compared exactly:
    /// `requests_per_unit / unit <= count / period`).
    pub fn within(&self, max: &Rate) -> bool {
        let unit = u128::from(self.unit.window().as_u64());
        let period = u128::from(max.period().as_u64());
        u128::from(self.requests_per_unit) * period <= u128::from(max.count()) * unit
    }

    /// The algorithm it decides with: a fixed window of `requests_per_unit`
    /// per `unit`, aligned to the Unix epoch, as envoyproxy/ratelimit
    /// counts; `deny` for 0.
    pub fn algorithm(&self) -> AlgorithmSpec {
        if self.requests_per_unit == 0 {
            return AlgorithmSpec::Deny;
        }
        AlgorithmSpec::FixedWindow {
            limit: self.requests_per_unit,
            window: self.unit.window(),
            align: Align::Epoch,
        }
    }

    /// The limit an algorithm extension amounts to, when it is a count
    /// per window and the window is exactly one unit (`sliding_log` of 2
    /// per `1s` is 2 per second); `None` otherwise.
    pub fn of_algorithm(spec: &AlgorithmSpec) -> Option<EnvoyLimit> {
        let (limit, window) = match spec {
            AlgorithmSpec::FixedWindow { limit, window, .. }
            | AlgorithmSpec::SlidingWindow { limit, window, .. }
            | AlgorithmSpec::SlidingLog { limit, window, .. } => (*limit, *window),
            _ => return None,
        };
        EnvoyUnit::from_window(window).map(|unit| EnvoyLimit {
            requests_per_unit: limit,
            unit,
        })
    }
}

/// envoyproxy/ratelimit's units. A month is 30 days and a year 365, as
/// upstream counts them by default.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum EnvoyUnit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3 600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl EnvoyUnit {
    /// Every unit, shortest first.
    pub const ALL: [EnvoyUnit; 7] = [
        EnvoyUnit::Second,
        EnvoyUnit::Minute,
        EnvoyUnit::Hour,
        EnvoyUnit::Day,
        EnvoyUnit::Week,
        EnvoyUnit::Month,
        EnvoyUnit::Year,
    ];

    /// The unit named `name`, in any letter case.
    pub fn parse(name: &str) -> Option<EnvoyUnit> {
        EnvoyUnit::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(name))
    }

    /// Its name as the config writes it (`second`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EnvoyUnit::Second => "second",
            EnvoyUnit::Minute => "minute",
            EnvoyUnit::Hour => "hour",
            EnvoyUnit::Day => "day",
            EnvoyUnit::Week => "week",
            EnvoyUnit::Month => "month",
            EnvoyUnit::Year => "year",
        }
    }

    /// Its length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            EnvoyUnit::Second => 1,
            EnvoyUnit::Minute => 60,
            EnvoyUnit::Hour => 3_600,
            EnvoyUnit::Day => 86_400,
            EnvoyUnit::Week => 604_800,
            EnvoyUnit::Month => 2_592_000,
            EnvoyUnit::Year => 31_536_000,
        }
    }

    /// Its length.
    pub fn window(self) -> Nanos {
        Nanos::from_secs(self.seconds())
    }

    /// The unit exactly `window` long, if any.
    pub fn from_window(window: Nanos) -> Option<EnvoyUnit> {
        EnvoyUnit::ALL.into_iter().find(|u| u.window() == window)
    }
}

/// The two kinds of resources (Charon §2).
#[derive(Clone, Debug, PartialEq)]
pub enum ResourceKind {
    /// Tracked by access frequency.
    Rate(RateResource),
    /// Tracked by number of copies held.
    Concurrency(CopyLimits),
}

/// A rate-limited resource's limits.
#[derive(Clone, Debug, PartialEq)]
pub struct RateResource {
    /// The limits of domains without an override.
    pub default: RateSpec,
    /// Per-domain overrides (Charon §2: a domain-specific configuration
    /// replaces the default one).
    pub domains: BTreeMap<String, RateSpec>,
    /// Hits per second across all domains (Charon's global limit).
    pub global_limit: Option<u64>,
    /// `allow_override` with its `override_max`: requests may bring their
    /// own limit (`requests_per_unit` per `unit`, in place of the
    /// resource's algorithm or list) up to this rate. `None`: they may not.
    pub override_max: Option<Rate>,
}

impl RateResource {
    /// The limits that apply to `domain`.
    pub fn for_domain(&self, domain: &str) -> &RateSpec {
        self.domains.get(domain).unwrap_or(&self.default)
    }
}

/// The limits applied to one domain of a rate-limited resource.
#[derive(Clone, Debug, PartialEq)]
pub struct RateSpec {
    /// The limits a request must pass together, all or nothing, in config
    /// order; never empty. A resource written with `algorithm:` has one,
    /// without a name; one written with `limits:` has one per entry.
    pub limits: Vec<LimitSpec>,
    /// Hits per second for one domain (Charon's hard limit).
    pub hard_limit: Option<u64>,
}

/// One limit of a rate-limited resource: an algorithm, and its name when
/// the resource lists several (`limits:`).
#[derive(Clone, Debug, PartialEq)]
pub struct LimitSpec {
    /// Its `name:`, unique in the resource; `None` when not given.
    pub name: Option<String>,
    /// The algorithm and its parameters.
    pub algorithm: AlgorithmSpec,
}

/// Names a limit of a `limits:` list may not take: the names answers
/// already give to other limits (`limited_by`).
pub const RESERVED_LIMIT_NAMES: &[&str] = &["limit", "tier", "hard", "global", "deny"];

/// Most limits one resource may list: a request decides each of them.
pub const MAX_LIMITS_PER_RESOURCE: usize = 16;

impl RateSpec {
    /// The limits of a resource written with one `algorithm:`.
    pub fn single(algorithm: AlgorithmSpec, hard_limit: Option<u64>) -> RateSpec {
        RateSpec {
            limits: vec![LimitSpec {
                name: None,
                algorithm,
            }],
            hard_limit,
        }
    }

    /// The algorithm of a resource written with `algorithm:` (its only
    /// limit); `None` for a `limits:` list ([`RateSpec::is_list`]).
    pub fn algorithm(&self) -> Option<&AlgorithmSpec> {
        match self.limits.as_slice() {
            [only] if only.name.is_none() => Some(&only.algorithm),
            _ => None,
        }
    }

    /// Whether the limits are a `limits:` list: several, or named. Such
    /// limits are named in answers, and their counters are keyed by name.
    pub fn is_list(&self) -> bool {
        self.algorithm().is_none()
    }

    /// The name answers give the limit at `index`: its `name:`, else its
    /// position in the list counted from 1.
    pub fn limit_name(&self, index: usize) -> String {
        match self.limits.get(index).and_then(|l| l.name.as_deref()) {
            Some(name) => name.to_owned(),
            None => (index + 1).to_string(),
        }
    }
}

/// An algorithm and its parameters, as configured.
#[derive(Clone, Debug, PartialEq)]
pub enum AlgorithmSpec {
    /// Token bucket.
    TokenBucket {
        /// Tokens a full bucket holds.
        capacity: u64,
        /// Refill rate.
        rate: Rate,
        /// Tokens of a new bucket (default: `capacity`).
        initial_tokens: Option<u64>,
    },
    /// GCRA.
    Gcra {
        /// Sustained rate.
        rate: Rate,
        /// Requests admitted at once.
        burst: u64,
    },
    /// Leaky bucket as a queue.
    LeakyBucket {
        /// Drain rate.
        rate: Rate,
        /// Hits the bucket holds.
        queue_size: u64,
    },
    /// Fixed window counter.
    FixedWindow {
        /// Hits per window.
        limit: u64,
        /// Window length.
        window: Nanos,
        /// Window alignment.
        align: Align,
    },
    /// Approximated sliding window.
    SlidingWindow {
        /// Hits per window.
        limit: u64,
        /// Window length.
        window: Nanos,
        /// Counters kept.
        buckets: u32,
    },
    /// Exact sliding log.
    SlidingLog {
        /// Hits per window.
        limit: u64,
        /// Window length.
        window: Nanos,
        /// Least time between two requests.
        min_gap: Option<Nanos>,
        /// Whether rejected attempts are logged.
        count_rejected: bool,
    },
    /// Guava's SmoothBursty.
    SmoothBursty {
        /// Stable rate.
        rate: Rate,
        /// Seconds of unused permits kept.
        max_burst_seconds: f64,
    },
    /// Guava's SmoothWarmingUp.
    SmoothWarmingUp {
        /// Stable rate.
        rate: Rate,
        /// Warm-up period.
        warmup: Nanos,
        /// Cold interval over stable interval.
        cold_factor: f64,
    },
    /// Charon's burst tiers.
    BurstTiers {
        /// The tiers, lowest first, normalized.
        tiers: Vec<Tier>,
    },
    /// No limit: everything is granted (and recorded).
    Unlimited,
    /// Everything is rejected (envoyproxy/ratelimit's `requests_per_unit: 0`).
    Deny,
}

/// The algorithm names the config accepts, in documentation order.
pub const ALGORITHMS: &[&str] = &[
    "token_bucket",
    "gcra",
    "leaky_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "smooth_bursty",
    "smooth_warming_up",
    "burst_tiers",
    "unlimited",
    "deny",
];

impl AlgorithmSpec {
    /// The algorithm's name as written in the config.
    pub fn name(&self) -> &'static str {
        match self {
            AlgorithmSpec::TokenBucket { .. } => "token_bucket",
            AlgorithmSpec::Gcra { .. } => "gcra",
            AlgorithmSpec::LeakyBucket { .. } => "leaky_bucket",
            AlgorithmSpec::FixedWindow { .. } => "fixed_window",
            AlgorithmSpec::SlidingWindow { .. } => "sliding_window",
            AlgorithmSpec::SlidingLog { .. } => "sliding_log",
            AlgorithmSpec::SmoothBursty { .. } => "smooth_bursty",
            AlgorithmSpec::SmoothWarmingUp { .. } => "smooth_warming_up",
            AlgorithmSpec::BurstTiers { .. } => "burst_tiers",
            AlgorithmSpec::Unlimited => "unlimited",
            AlgorithmSpec::Deny => "deny",
        }
    }

    /// Builds the core algorithm; `None` for `unlimited` and `deny`, which
    /// need no state. `created_at` is when the smooth limiters' per-key
    /// Guava limiters are considered created (when the limits were loaded).
    pub fn build(&self, created_at: Nanos) -> Result<Option<Limit>, ParamError> {
        Ok(Some(match self {
            AlgorithmSpec::TokenBucket {
                capacity,
                rate,
                initial_tokens,
            } => Limit::TokenBucket(TokenBucket::with_initial(
                *capacity,
                *rate,
                initial_tokens.unwrap_or(*capacity),
            )?),
            AlgorithmSpec::Gcra { rate, burst } => Limit::Gcra(Gcra::new(*rate, *burst)?),
            AlgorithmSpec::LeakyBucket { rate, queue_size } => {
                Limit::LeakyBucket(LeakyBucket::new(*rate, *queue_size)?)
            }
            AlgorithmSpec::FixedWindow {
                limit,
                window,
                align,
            } => Limit::FixedWindow(FixedWindow::new(*limit, *window, align.clone())?),
            AlgorithmSpec::SlidingWindow {
                limit,
                window,
                buckets,
            } => Limit::SlidingWindow(SlidingWindow::new(*limit, *window, *buckets)?),
            AlgorithmSpec::SlidingLog {
                limit,
                window,
                min_gap,
                count_rejected,
            } => Limit::SlidingLog(
                SlidingLog::new(*limit, *window)?
                    .with_min_gap(min_gap.unwrap_or(Nanos::ZERO))
                    .counting_rejected(*count_rejected),
            ),
            AlgorithmSpec::SmoothBursty {
                rate,
                max_burst_seconds,
            } => Limit::Smooth(Smooth::bursty(*rate, *max_burst_seconds)?.created_at(created_at)),
            AlgorithmSpec::SmoothWarmingUp {
                rate,
                warmup,
                cold_factor,
            } => Limit::Smooth(
                Smooth::warming_up(*rate, *warmup, *cold_factor)?.created_at(created_at),
            ),
            AlgorithmSpec::BurstTiers { tiers } => {
                Limit::BurstTiers(BurstTiers::new(tiers.clone())?)
            }
            AlgorithmSpec::Unlimited | AlgorithmSpec::Deny => return Ok(None),
        }))
    }

    /// The parameters as `(name, value)` pairs in config syntax, for the
    /// normalized output and for fingerprints.
    pub fn params(&self) -> Vec<(&'static str, String)> {
        let rate = |r: &Rate| format!("{}/{}", r.count(), r.period());
        match self {
            AlgorithmSpec::TokenBucket {
                capacity,
                rate: r,
                initial_tokens,
            } => {
                let mut p = vec![("capacity", capacity.to_string()), ("rate", rate(r))];
                if let Some(i) = initial_tokens {
                    p.push(("initial_tokens", i.to_string()));
                }
                p
            }
            AlgorithmSpec::Gcra { rate: r, burst } => {
                vec![("rate", rate(r)), ("burst", burst.to_string())]
            }
            AlgorithmSpec::LeakyBucket {
                rate: r,
                queue_size,
            } => {
                vec![("rate", rate(r)), ("queue_size", queue_size.to_string())]
            }
            AlgorithmSpec::FixedWindow {
                limit,
                window,
                align,
            } => match align {
                // The zone is part of the parameters, and so of the
                // limit's fingerprint: a changed zone starts fresh counters.
                Align::Calendar(c) => vec![
                    ("limit", limit.to_string()),
                    ("window", c.unit().name().into()),
                    ("align", "calendar".into()),
                    ("timezone", c.zone().into()),
                ],
                _ => vec![
                    ("limit", limit.to_string()),
                    ("window", window.to_string()),
                    (
                        "align",
                        if *align == Align::FirstHit {
                            "first_hit".into()
                        } else {
                            "epoch".into()
                        },
                    ),
                ],
            },
            AlgorithmSpec::SlidingWindow {
                limit,
                window,
                buckets,
            } => vec![
                ("limit", limit.to_string()),
                ("window", window.to_string()),
                ("buckets", buckets.to_string()),
            ],
            AlgorithmSpec::SlidingLog {
                limit,
                window,
                min_gap,
                count_rejected,
            } => {
                let mut p = vec![("limit", limit.to_string()), ("window", window.to_string())];
                if let Some(g) = min_gap {
                    p.push(("min_gap", g.to_string()));
                }
                if *count_rejected {
                    p.push(("count_rejected", "true".into()));
                }
                p
            }
            AlgorithmSpec::SmoothBursty {
                rate: r,
                max_burst_seconds,
            } => vec![
                ("rate", rate(r)),
                ("max_burst_seconds", max_burst_seconds.to_string()),
            ],
            AlgorithmSpec::SmoothWarmingUp {
                rate: r,
                warmup,
                cold_factor,
            } => vec![
                ("rate", rate(r)),
                ("warmup", warmup.to_string()),
                ("cold_factor", cold_factor.to_string()),
            ],
            AlgorithmSpec::BurstTiers { tiers } => {
                let list = tiers
                    .iter()
                    .map(|t| {
                        format!(
                            "{{ limit: {}, window: {}, active: {}, cooldown: {}, skippable: {} }}",
                            t.limit, t.window, t.active, t.cooldown, t.skippable
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                vec![("tiers", format!("[{list}]"))]
            }
            AlgorithmSpec::Unlimited | AlgorithmSpec::Deny => vec![],
        }
    }
}

impl fmt::Display for AlgorithmSpec {
    /// A canonical one-line form: `token_bucket { capacity: 10, rate: 1/1s }`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        let params = self.params();
        if !params.is_empty() {
            let inner = params
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ");
            write!(f, " {{ {inner} }}")?;
        }
        Ok(())
    }
}

impl fmt::Display for RateSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.algorithm() {
            Some(algorithm) => write!(f, "{algorithm}")?,
            None => {
                write!(f, "limits: [")?;
                for (i, l) in self.limits.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{}: {}", self.limit_name(i), l.algorithm)?;
                }
                write!(f, "]")?;
            }
        }
        if let Some(h) = self.hard_limit {
            write!(f, " hard_limit: {h}")?;
        }
        Ok(())
    }
}
