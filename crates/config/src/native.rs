//! tollgate's own format: `namespaces:` → resources (see `docs/config.md`).
//!
//! Reads the position-carrying tree, validates every field and applies the
//! normalization of Charon §4.1, reporting each change as a warning.

use std::collections::{BTreeMap, BTreeSet};

use tollgate_core::copies::CopyLimits;
use tollgate_core::replicated::strategy::{Eager, Replication, StrategyKind};
use tollgate_core::{Align, Calendar, CalendarUnit, Nanos, Span, Tier};

use crate::diag::{Diagnostic, Diagnostics, Pos};
use crate::model::{
    AlgorithmSpec, LimitSpec, Namespace, RateResource, RateSpec, Resource, ResourceKind, UsageSpec,
    ALGORITHMS, MAX_LIMITS_PER_RESOURCE, RESERVED_LIMIT_NAMES,
};
use crate::units::{parse_duration, parse_rate};
use crate::yaml::{did_you_mean, Fields, Kind, Node};

const ROOT_FIELDS: &[&str] = &["namespaces"];
const NAMESPACE_FIELDS: &[&str] = &[
    "name",
    "allow_unconfigured",
    "ignore_configured",
    "resources",
];
/// Fields every rate-limited resource may have besides its algorithm's.
const RATE_COMMON: &[&str] = &[
    "name",
    "kind",
    "algorithm",
    "shadow_mode",
    "domains",
    "global_limit",
    "hard_limit",
    "replication",
    "max_debt",
    "report",
    "limits",
    "allow_override",
    "override_max",
];
/// Fields a rate resource's domain override may have besides its
/// algorithm's: [`RATE_COMMON`] without [`NOT_PER_DOMAIN`], so an unknown
/// field in an override is told only what an override may say.
const PER_DOMAIN: &[&str] = &["algorithm", "hard_limit"];
/// [`PER_DOMAIN`] for a resource with a `limits:` list, whose overrides
/// refine its limits by name under their own `limits:`.
const PER_DOMAIN_LISTED: &[&str] = &["algorithm", "hard_limit", "limits"];
/// Fields of an entry of `limits:` besides its algorithm's.
const LIMIT_FIELDS: &[&str] = &["algorithm", "name"];
/// Fields of a resource that a domain override may not set.
const NOT_PER_DOMAIN: &[&str] = &[
    "name",
    "kind",
    "shadow_mode",
    "domains",
    "global_limit",
    "replication",
    "max_debt",
    "report",
    "allow_override",
    "override_max",
];
const CONCURRENCY_FIELDS: &[&str] = &[
    "name",
    "kind",
    "shadow_mode",
    "domain_limit",
    "global_limit",
    "groups",
    "domains",
];
const GROUP_FIELDS: &[&str] = &["name", "members", "limit"];
const TIER_FIELDS: &[&str] = &["limit", "window", "active", "cooldown", "skippable"];
/// Fields of `replication:` in its mapping form.
const REPLICATION_FIELDS: &[&str] = &[
    "strategy",
    "gossip_interval",
    "eager",
    "window",
    "frequency_threshold",
    "least_informed",
    "near_limit",
    "epoch",
    "retention",
];
/// The replication strategies, in documentation order.
const STRATEGIES: &[&str] = &["counter", "queue", "epoch"];
/// Replication fields that only one strategy takes, and which.
const STRATEGY_FIELDS: &[(&str, StrategyKind)] = &[
    ("eager", StrategyKind::Queue),
    ("window", StrategyKind::Queue),
    ("frequency_threshold", StrategyKind::Queue),
    ("least_informed", StrategyKind::Queue),
    ("near_limit", StrategyKind::Queue),
    ("retention", StrategyKind::Queue),
    ("epoch", StrategyKind::Epoch),
];

/// The parameters each algorithm accepts.
pub(crate) fn algorithm_params(name: &str) -> &'static [&'static str] {
    match name {
        "token_bucket" => &["capacity", "rate", "initial_tokens"],
        "gcra" => &["rate", "burst"],
        "leaky_bucket" => &["rate", "queue_size"],
        "fixed_window" => &["limit", "window", "align", "timezone"],
        "sliding_window" => &["limit", "window", "buckets"],
        "sliding_log" => &["limit", "window", "min_gap", "count_rejected"],
        "smooth_bursty" => &["rate", "max_burst_seconds"],
        "smooth_warming_up" => &["rate", "warmup", "cold_factor"],
        "burst_tiers" => &["tiers"],
        _ => &[],
    }
}

/// Reads a native-format document.
pub(crate) fn read(root: &Fields<'_>, diags: &mut Diagnostics) -> Vec<Namespace> {
    diags
        .errors
        .extend(root.unknown(ROOT_FIELDS, "the top level"));
    let Some(list) = root.get("namespaces") else {
        return Vec::new();
    };
    let Some(items) = diags.take(list.as_seq("namespaces")) else {
        return Vec::new();
    };
    // Duplicate names are reported by the loader, across every document
    // and file.
    items
        .iter()
        .filter_map(|item| read_namespace(item, diags))
        .collect()
}

fn read_namespace(node: &Node, diags: &mut Diagnostics) -> Option<Namespace> {
    let f = diags.take(node.as_map("namespace"))?;
    let name = diags.take(required_name(&f, "a namespace"))?;
    let context = format!("namespace `{name}`");
    diags.errors.extend(f.unknown(NAMESPACE_FIELDS, &context));
    let allow_unconfigured = flag(&f, "allow_unconfigured", diags);
    let ignore_configured = flag(&f, "ignore_configured", diags);
    let mut resources: Vec<Resource> = Vec::new();
    if let Some(list) = f.get("resources") {
        for item in diags.take(list.as_seq("resources")).unwrap_or(&[]) {
            let Some(r) = read_resource(item, diags) else {
                continue;
            };
            if let Some(first) = resources.iter().find(|x| x.name == r.name) {
                diags.error(
                    &r.pos,
                    format!(
                        "resource `{}` is defined twice in {context} (first at {})",
                        r.name, first.pos
                    ),
                );
                continue;
            }
            resources.push(r);
        }
    }
    Some(Namespace {
        name,
        allow_unconfigured,
        ignore_configured,
        resources,
        descriptors: None,
        pos: node.pos.clone(),
    })
}

fn required_name(f: &Fields<'_>, what: &str) -> Result<String, Diagnostic> {
    let node = f.require("name", what)?;
    let name = node.scalar_text("name")?;
    if name.trim().is_empty() {
        return Err(Diagnostic::new(
            &node.pos,
            format!("{what} needs a non-empty `name`"),
        ));
    }
    Ok(name)
}

/// An optional boolean field, `false` when absent or invalid (with an error).
pub(crate) fn flag(f: &Fields<'_>, name: &str, diags: &mut Diagnostics) -> bool {
    f.get(name)
        .and_then(|n| diags.take(n.as_bool(name)))
        .unwrap_or(false)
}

fn read_resource(node: &Node, diags: &mut Diagnostics) -> Option<Resource> {
    let f = diags.take(node.as_map("resource"))?;
    let name = diags.take(required_name(&f, "a resource"))?;
    let context = format!("resource `{name}`");
    let kind = match f.get("kind") {
        None => "rate".to_owned(),
        Some(k) => diags.take(k.as_str("kind"))?.to_owned(),
    };
    let shadow = flag(&f, "shadow_mode", diags);
    let mut usage = UsageSpec::default();
    let (kind, replication, refining) = match kind.as_str() {
        "rate" => {
            // Both are read before either can give up, so that one run
            // reports the problems of each.
            let before = diags.errors.len();
            let replication = read_replication(&f, &context, diags);
            let rate = read_rate_resource(&f, &context, diags);
            if diags.errors.len() > before {
                return None;
            }
            let (rate, refining) = rate?;
            usage = read_usage(&f, &rate, &context, diags)?;
            (ResourceKind::Rate(rate), replication, refining)
        }
        "concurrency" => (
            ResourceKind::Concurrency(read_concurrency(&f, &context, diags)?),
            None,
            BTreeSet::new(),
        ),
        other => {
            let hint = did_you_mean(other, &["rate", "concurrency"])
                .map(|s| format!(", did you mean `{s}`?"))
                .unwrap_or_default();
            diags.error(
                f.pos_of("kind"),
                format!(
                    "{context}: unknown kind `{other}` (expected `rate` or `concurrency`){hint}"
                ),
            );
            return None;
        }
    };
    Some(Resource {
        name,
        kind,
        shadow,
        usage,
        replication,
        envoy: None,
        refining,
        pos: node.pos.clone(),
    })
}

/// Reads a rate resource's `max_debt:` and `report:` and checks them
/// against its algorithms (issue 18 item 3). `None` when invalid (with an
/// error at the field).
pub(crate) fn read_usage(
    f: &Fields<'_>,
    rate: &RateResource,
    context: &str,
    diags: &mut Diagnostics,
) -> Option<UsageSpec> {
    let usage = UsageSpec {
        max_debt: f
            .get("max_debt")
            .and_then(|n| diags.take(n.as_u64("max_debt").map_err(|d| in_context(d, context)))),
        report: flag(f, "report", diags),
    };
    if let Err(problem) = usage.check(rate) {
        let at = if f.has("report") {
            "report"
        } else {
            "max_debt"
        };
        diags.error(f.pos_of(at), format!("{context}: {problem}"));
        return None;
    }
    Some(usage)
}

/// Reads a rate resource's `replication:`: a strategy name, which takes
/// the thesis's defaults ([`Replication::new`]), or a mapping with
/// `strategy` and the parameters that differ. `None` when absent, or
/// invalid (with errors).
fn read_replication(f: &Fields<'_>, context: &str, diags: &mut Diagnostics) -> Option<Replication> {
    let node = f.get("replication")?;
    match &node.kind {
        Kind::Str(name) => strategy_kind(node, name, context, diags).map(Replication::new),
        Kind::Map(_) => read_replication_map(node, context, diags),
        _ => {
            diags.error(
                &node.pos,
                format!(
                    "{context}: `replication` must be a strategy name ({}) or a mapping with `strategy`, found {}",
                    STRATEGIES.join(", "),
                    node.type_name()
                ),
            );
            None
        }
    }
}

/// The strategy named `name` (written at `node`).
fn strategy_kind(
    node: &Node,
    name: &str,
    context: &str,
    diags: &mut Diagnostics,
) -> Option<StrategyKind> {
    let kind = StrategyKind::parse(name);
    if kind.is_none() {
        let hint = did_you_mean(name, STRATEGIES)
            .map(|s| format!(", did you mean `{s}`?"))
            .unwrap_or_default();
        diags.error(
            &node.pos,
            format!(
                "{context}: unknown replication strategy `{name}` (expected `counter`, `queue` or `epoch`){hint}"
            ),
        );
    }
    kind
}

fn read_replication_map(
    node: &Node,
    context: &str,
    diags: &mut Diagnostics,
) -> Option<Replication> {
    let f = diags.take(node.as_map("replication"))?;
    let context = format!("{context}, replication");
    let before = diags.errors.len();
    diags.errors.extend(f.unknown(REPLICATION_FIELDS, &context));
    let p = Params {
        f: &f,
        context: &context,
    };
    let Some(s) = f.get("strategy") else {
        p.missing("strategy", diags);
        return None;
    };
    let name = diags.take(s.as_str("strategy").map_err(|d| in_context(d, &context)))?;
    let kind = strategy_kind(s, name, &context, diags)?;
    let mut r = Replication::new(kind);
    // A field of another strategy is refused rather than ignored: it says
    // the writer expects a behaviour this strategy does not have. (The
    // arms below read only their own strategy's fields.)
    for (field, owner) in STRATEGY_FIELDS {
        if f.has(field) && *owner != kind {
            diags.error(
                f.pos_of(field),
                format!(
                    "{context}: `{field}` only applies to `strategy: {}`, not `strategy: {}`",
                    owner.as_str(),
                    kind.as_str()
                ),
            );
        }
    }
    if let Some(g) = p.opt_span("gossip_interval", diags) {
        r.gossip_interval = g.get();
    }
    match kind {
        StrategyKind::Queue => {
            let eager = f.get("eager").and_then(|n| diags.take(n.as_bool("eager")));
            let window = p.opt_positive_count("window", diags);
            let threshold = p.opt_span("frequency_threshold", diags);
            let tuning: Vec<&str> = ["window", "frequency_threshold"]
                .into_iter()
                .filter(|n| f.has(n))
                .collect();
            if eager == Some(false) && !tuning.is_empty() {
                let fields = tuning
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(" and ");
                diags.error(
                    f.pos_of("eager"),
                    format!(
                        "{context}: `eager: false` contradicts {fields} (with eager propagation off there is nothing to tune); remove one or the other"
                    ),
                );
            }
            // Tuning the frequency analysis turns it on; it is on by
            // default anyway, so only `eager: false` turns it off.
            r.eager = (eager != Some(false)).then(|| Eager {
                window,
                threshold: threshold.map_or(Eager::DEFAULT_THRESHOLD, Span::get),
            });
            r.least_informed = flag(&f, "least_informed", diags);
            if let Some(near) = f
                .get("near_limit")
                .and_then(|n| diags.take(n.as_bool("near_limit")))
            {
                r.near_limit = near;
            }
            r.retention = p.opt_span("retention", diags).map(Span::get);
        }
        StrategyKind::Epoch => {
            if let Some(e) = p.opt_span("epoch", diags) {
                r.epoch = e.get();
            }
        }
        StrategyKind::Counter => {}
    }
    (diags.errors.len() == before).then_some(r)
}

/// A rate resource's limits, and the domains whose override refines them
/// ([`Resource::refining`]).
fn read_rate_resource(
    f: &Fields<'_>,
    context: &str,
    diags: &mut Diagnostics,
) -> Option<(RateResource, BTreeSet<String>)> {
    let errors_before = diags.errors.len();
    let global_limit = positive_limit(f, "global_limit", context, diags);
    let override_max = read_override_max(f, context, diags);
    let base = f.without(NOT_PER_DOMAIN);
    // A resource's `limits:` entries, named, for the overrides to refine.
    let listed = match f.get("limits") {
        Some(list) => Some(limit_entries(list, context, diags)?),
        None => None,
    };
    let default = read_rate_spec(
        &base,
        &base,
        listed.as_deref(),
        context,
        RATE_COMMON,
        global_limit,
        diags,
    );
    let mut domains = BTreeMap::new();
    let mut refining = BTreeSet::new();
    if let Some(d) = f.get("domains") {
        if let Some(map) = diags.take(d.as_map("domains")) {
            for (domain, _, value) in map.iter() {
                let dcontext = format!("{context}, domain `{domain}`");
                let Some(over) = diags.take(value.as_map("a domain override")) else {
                    continue;
                };
                for bad in NOT_PER_DOMAIN {
                    if over.has(bad) {
                        diags.error(
                            over.pos_of(bad),
                            format!("{dcontext}: `{bad}` applies to the whole resource and cannot be set per domain"),
                        );
                    }
                }
                // An override that names an algorithm replaces the
                // resource's limits; otherwise it refines them (a listed
                // resource's limits by name, under its own `limits:`).
                let replaces = over.has("algorithm");
                let fields = if replaces {
                    over.clone()
                } else {
                    refining.insert(domain.to_owned());
                    base.overlay(&over)
                };
                // The fields refused above are not reported again as
                // unknown; the rest are checked against what an override
                // accepts.
                // A `limits:` the resource cannot take is refused below;
                // it is not reported again as unknown.
                let (own, extra) = if listed.is_some() {
                    (over.without(NOT_PER_DOMAIN), PER_DOMAIN_LISTED)
                } else {
                    (
                        over.without(NOT_PER_DOMAIN).without(&["limits"]),
                        PER_DOMAIN,
                    )
                };
                let entries = if replaces {
                    None
                } else {
                    match (&listed, over.get("limits")) {
                        (Some(listed), Some(list)) => {
                            refine_entries(listed, list, &dcontext, diags)
                        }
                        (Some(listed), None) => Some(listed.clone()),
                        (None, Some(_)) => {
                            diags.error(
                                over.pos_of("limits"),
                                format!("{dcontext}: the resource has one algorithm, not a `limits:` list; override its parameters directly"),
                            );
                            None
                        }
                        (None, None) => None,
                    }
                };
                if let Some(spec) = read_rate_spec(
                    &fields,
                    &own,
                    entries.as_deref(),
                    &dcontext,
                    extra,
                    global_limit,
                    diags,
                ) {
                    domains.insert(domain.to_owned(), spec);
                }
            }
        }
    }
    if diags.errors.len() > errors_before {
        return None;
    }
    Some((
        RateResource {
            default: default?,
            domains,
            global_limit,
            override_max,
        },
        refining,
    ))
}

/// `allow_override: true` and the `override_max` rate it requires: how
/// fast a limit a request brings may be. A request's own limit is a
/// stranger's word, so it is never unbounded.
fn read_override_max(
    f: &Fields<'_>,
    context: &str,
    diags: &mut Diagnostics,
) -> Option<tollgate_core::Rate> {
    let allowed = flag(f, "allow_override", diags);
    let max =
        match f.get("override_max") {
            Some(n) => {
                let text = diags.take(n.scalar_text("override_max"))?;
                Some(diags.take(parse_rate(&text).map_err(|e| {
                    Diagnostic::new(&n.pos, format!("{context}: override_max {e}"))
                }))?)
            }
            None => None,
        };
    match (allowed, max) {
        (true, Some(max)) => Some(max),
        (true, None) => {
            diags.error(
                f.pos_of("allow_override"),
                format!("{context}: `allow_override: true` needs `override_max`, the fastest rate a request may ask for (e.g. `override_max: 1000/s`)"),
            );
            None
        }
        (false, Some(_)) => {
            diags.error(
                f.pos_of("override_max"),
                format!("{context}: `override_max` is given but `allow_override` is not true"),
            );
            None
        }
        (false, None) => None,
    }
}

/// Reads the algorithm and hard limit from `fields`; unknown fields are
/// reported against `own` (the mapping the user wrote them in), which may
/// have the fields in `extra` besides the algorithm's parameters.
fn read_rate_spec(
    fields: &Fields<'_>,
    own: &Fields<'_>,
    listed: Option<&[(String, Fields<'_>, Fields<'_>)]>,
    context: &str,
    extra: &[&str],
    global_limit: Option<u64>,
    diags: &mut Diagnostics,
) -> Option<RateSpec> {
    if own.has("algorithm") && own.has("limits") {
        diags.error(
            own.pos_of("limits"),
            format!("{context}: give either `algorithm:` or `limits:`, not both"),
        );
        return None;
    }
    let limits = match listed {
        // A `limits:` list: the block itself takes only `extra`.
        Some(entries) if !own.has("algorithm") => {
            let before = diags.errors.len();
            diags.errors.extend(own.unknown(extra, context));
            let limits = read_listed(entries, context, diags);
            if diags.errors.len() > before {
                return None;
            }
            limits?
        }
        _ => vec![LimitSpec {
            name: None,
            algorithm: read_algorithm(fields, own, context, extra, diags)?,
        }],
    };
    let mut hard_limit = positive_limit(fields, "hard_limit", context, diags);
    if let (Some(h), Some(g)) = (hard_limit, global_limit) {
        if h > g {
            // A refining override that inherits the resource's hard limit
            // is warned about too (at the resource's `hard_limit`, where
            // `fields` found it): each domain whose limit changes is told,
            // as `check-config` prints the lowered value in each.
            diags.warn(
                fields.pos_of("hard_limit"),
                format!("{context}: hard_limit {h} is above the global_limit {g}; lowered to {g}"),
            );
            hard_limit = Some(g);
        }
    }
    Some(RateSpec { limits, hard_limit })
}

/// The entries of a `limits:` list: each one's name (its `name:`, else
/// its position from 1), the fields it is read from, and the fields its
/// writer gave (checked for unknown names). `None`, with errors, when the
/// list itself is malformed.
fn limit_entries<'a>(
    list: &'a Node,
    context: &str,
    diags: &mut Diagnostics,
) -> Option<Vec<(String, Fields<'a>, Fields<'a>)>> {
    let items = diags.take(list.as_seq("limits"))?;
    if items.is_empty() {
        diags.error(&list.pos, format!("{context}: `limits:` lists no limit"));
        return None;
    }
    if items.len() > MAX_LIMITS_PER_RESOURCE {
        diags.error(
            &list.pos,
            format!(
                "{context}: `limits:` lists {} limits; a resource has at most {MAX_LIMITS_PER_RESOURCE}",
                items.len()
            ),
        );
        return None;
    }
    let before = diags.errors.len();
    let mut out: Vec<(String, Fields<'a>, Fields<'a>)> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(f) = diags.take(item.as_map("a limit")) else {
            continue;
        };
        let name = match f.get("name") {
            Some(n) => match diags.take(n.scalar_text("name")) {
                Some(name) => match limit_name_problem(&name) {
                    None => name,
                    Some(problem) => {
                        diags.error(&n.pos, format!("{context}: limit name {name:?} {problem}"));
                        continue;
                    }
                },
                None => continue,
            },
            None => (i + 1).to_string(),
        };
        if out.iter().any(|(n, _, _)| *n == name) {
            diags.error(
                f.pos_of("name"),
                format!(
                    "{context}: two limits are called `{name}`; each limit's name must be unique"
                ),
            );
            continue;
        }
        out.push((name, f.clone(), f));
    }
    (diags.errors.len() == before).then_some(out)
}

/// Why `name` cannot name a limit, if it cannot: names appear in answers,
/// metrics and counter keys, so they are short and plain.
pub(crate) fn limit_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name.len() > 64 {
        return Some("is longer than 64 bytes".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
    {
        return Some("may only use letters, digits, `_`, `-` and `.`".into());
    }
    if RESERVED_LIMIT_NAMES.contains(&name) {
        return Some(format!(
            "is reserved (answers use {} for other limits)",
            RESERVED_LIMIT_NAMES.join(", ")
        ));
    }
    None
}

/// A domain override's `limits:` applied to the resource's entries: each
/// of the override's entries names one of the resource's limits, and
/// replaces it (with its own `algorithm:`) or refines it (inherits the
/// algorithm and every parameter it does not set); the limits it does not
/// name are the resource's.
fn refine_entries<'a>(
    listed: &[(String, Fields<'a>, Fields<'a>)],
    list: &'a Node,
    context: &str,
    diags: &mut Diagnostics,
) -> Option<Vec<(String, Fields<'a>, Fields<'a>)>> {
    let items = diags.take(list.as_seq("limits"))?;
    let before = diags.errors.len();
    let mut out: Vec<(String, Fields<'a>, Fields<'a>)> = listed
        .iter()
        .map(|(name, f, _)| {
            (
                name.clone(),
                f.clone(),
                f.without(&f.names().collect::<Vec<_>>()),
            )
        })
        .collect();
    let names: Vec<&str> = listed.iter().map(|(n, _, _)| n.as_str()).collect();
    let mut seen: Vec<String> = Vec::new();
    for item in items {
        let Some(f) = diags.take(item.as_map("a limit")) else {
            continue;
        };
        let Some(name) = f
            .get("name")
            .and_then(|n| diags.take(n.scalar_text("name")))
        else {
            if !f.has("name") {
                diags.error(
                    &item.pos,
                    format!("{context}: a limit of an override names the resource's limit it overrides (`name:`, one of: {})", names.join(", ")),
                );
            }
            continue;
        };
        let Some(at) = names.iter().position(|n| *n == name) else {
            let hint = did_you_mean(&name, &names)
                .map(|s| format!(", did you mean `{s}`?"))
                .unwrap_or_else(|| format!(" (it has: {})", names.join(", ")));
            diags.error(
                f.pos_of("name"),
                format!("{context}: the resource has no limit called `{name}`{hint}"),
            );
            continue;
        };
        if seen.contains(&name) {
            diags.error(
                f.pos_of("name"),
                format!("{context}: limit `{name}` is overridden twice"),
            );
            continue;
        }
        seen.push(name);
        let fields = if f.has("algorithm") {
            f.clone()
        } else {
            listed[at].1.overlay(&f)
        };
        out[at].1 = fields;
        out[at].2 = f;
    }
    (diags.errors.len() == before).then_some(out)
}

/// Reads each entry of a `limits:` list. `unlimited` and `deny` are
/// refused there: they are a whole resource's answer, not one limit
/// among several (`algorithm: deny` says it alone).
fn read_listed(
    entries: &[(String, Fields<'_>, Fields<'_>)],
    context: &str,
    diags: &mut Diagnostics,
) -> Option<Vec<LimitSpec>> {
    let before = diags.errors.len();
    let mut out = Vec::with_capacity(entries.len());
    for (name, fields, own) in entries {
        let lcontext = format!("{context}, limit `{name}`");
        let Some(algorithm) = read_algorithm(fields, own, &lcontext, LIMIT_FIELDS, diags) else {
            continue;
        };
        if matches!(algorithm, AlgorithmSpec::Unlimited | AlgorithmSpec::Deny) {
            diags.error(
                fields.pos_of("algorithm"),
                format!(
                    "{lcontext}: `{}` cannot be one limit of a list; give the resource `algorithm: {}` instead",
                    algorithm.name(),
                    algorithm.name()
                ),
            );
            continue;
        }
        out.push(LimitSpec {
            name: Some(name.clone()),
            algorithm,
        });
    }
    (diags.errors.len() == before).then_some(out)
}

/// Reads `algorithm:` and its parameters. `extra` are the fields the
/// surrounding block allows besides the algorithm's parameters.
pub(crate) fn read_algorithm(
    fields: &Fields<'_>,
    own: &Fields<'_>,
    context: &str,
    extra: &[&str],
    diags: &mut Diagnostics,
) -> Option<AlgorithmSpec> {
    let node = match fields.require("algorithm", context) {
        Ok(n) => n,
        Err(d) => {
            diags.errors.push(d);
            return None;
        }
    };
    let name = diags.take(node.as_str("algorithm"))?;
    if !ALGORITHMS.contains(&name) {
        let hint = did_you_mean(name, ALGORITHMS)
            .map(|s| format!(", did you mean `{s}`?"))
            .unwrap_or_else(|| format!(" (expected one of: {})", ALGORITHMS.join(", ")));
        diags.error(
            &node.pos,
            format!("{context}: unknown algorithm `{name}`{hint}"),
        );
        return None;
    }
    // Fields inherited from the resource were checked when it was read;
    // only the mapping the user wrote here needs checking.
    let before = diags.errors.len();
    let mut known: Vec<&str> = extra.to_vec();
    known.extend_from_slice(algorithm_params(name));
    diags.errors.extend(own.unknown(&known, context));
    let p = Params { f: fields, context };
    let spec = match name {
        "token_bucket" => AlgorithmSpec::TokenBucket {
            capacity: p.count("capacity", diags),
            rate: p.rate(diags)?,
            initial_tokens: p.opt_count("initial_tokens", diags),
        },
        "gcra" => AlgorithmSpec::Gcra {
            rate: p.rate(diags)?,
            burst: p.opt_count("burst", diags).unwrap_or(1),
        },
        "leaky_bucket" => AlgorithmSpec::LeakyBucket {
            rate: p.rate(diags)?,
            queue_size: p.count("queue_size", diags),
        },
        "fixed_window" => p.fixed_window(diags),
        "sliding_window" => AlgorithmSpec::SlidingWindow {
            limit: p.count("limit", diags),
            window: p.duration("window", diags),
            buckets: p.buckets(diags),
        },
        "sliding_log" => AlgorithmSpec::SlidingLog {
            limit: p.count("limit", diags),
            window: p.duration("window", diags),
            min_gap: p.opt_duration("min_gap", diags),
            count_rejected: flag(fields, "count_rejected", diags),
        },
        "smooth_bursty" => AlgorithmSpec::SmoothBursty {
            rate: p.rate(diags)?,
            max_burst_seconds: p.opt_f64("max_burst_seconds", diags).unwrap_or(1.0),
        },
        "smooth_warming_up" => AlgorithmSpec::SmoothWarmingUp {
            rate: p.rate(diags)?,
            warmup: p.duration("warmup", diags),
            cold_factor: p.opt_f64("cold_factor", diags).unwrap_or(3.0),
        },
        "burst_tiers" => AlgorithmSpec::BurstTiers {
            tiers: read_tiers(fields, context, diags),
        },
        "unlimited" => AlgorithmSpec::Unlimited,
        _ => AlgorithmSpec::Deny,
    };
    if diags.errors.len() > before {
        return None;
    }
    // The core validates what the parser cannot (zero limits, overflow,
    // Guava's refusals); its message names the parameter.
    if let Err(e) = spec.build(Nanos::ZERO) {
        diags.error(&node.pos, format!("{context}: {e}"));
        return None;
    }
    Some(spec)
}

/// Reads typed parameters of one algorithm, recording errors.
struct Params<'f, 'a> {
    f: &'f Fields<'a>,
    context: &'f str,
}

impl Params<'_, '_> {
    fn missing(&self, name: &str, diags: &mut Diagnostics) {
        // A misspelling of `name` was already reported with a did-you-mean;
        // one typo gets one error.
        if self
            .f
            .names()
            .any(|n| n != name && did_you_mean(n, &[name]).is_some())
        {
            return;
        }
        diags.error(
            &self.f.node.pos,
            format!("{} is missing required field `{name}`", self.context),
        );
    }

    fn count(&self, name: &str, diags: &mut Diagnostics) -> u64 {
        match self.f.get(name) {
            Some(n) => diags.take(n.as_u64(name)).unwrap_or(0),
            None => {
                self.missing(name, diags);
                0
            }
        }
    }

    fn opt_count(&self, name: &str, diags: &mut Diagnostics) -> Option<u64> {
        self.f.get(name).and_then(|n| diags.take(n.as_u64(name)))
    }

    /// An optional count that must be at least 1.
    fn opt_positive_count(&self, name: &str, diags: &mut Diagnostics) -> Option<u64> {
        let n = self.f.get(name)?;
        let v = diags.take(n.as_u64(name).map_err(|d| in_context(d, self.context)))?;
        if v == 0 {
            diags.error(
                &n.pos,
                format!("{}: `{name}` must be at least 1", self.context),
            );
            return None;
        }
        Some(v)
    }

    fn opt_f64(&self, name: &str, diags: &mut Diagnostics) -> Option<f64> {
        self.f.get(name).and_then(|n| diags.take(n.as_f64(name)))
    }

    fn rate(&self, diags: &mut Diagnostics) -> Option<tollgate_core::Rate> {
        let Some(n) = self.f.get("rate") else {
            self.missing("rate", diags);
            return None;
        };
        // A number is read as its text, so `rate: 10` is told what a rate
        // looks like rather than that it is not a string.
        let text = diags.take(n.scalar_text("rate"))?;
        diags.take(
            parse_rate(&text)
                .map_err(|e| Diagnostic::new(&n.pos, format!("{}: rate {e}", self.context))),
        )
    }

    fn duration(&self, name: &str, diags: &mut Diagnostics) -> Nanos {
        match self.f.get(name) {
            Some(n) => diags
                .take(duration(n, name).map_err(|d| in_context(d, self.context)))
                .unwrap_or(Nanos::ZERO),
            None => {
                self.missing(name, diags);
                Nanos::ZERO
            }
        }
    }

    fn opt_duration(&self, name: &str, diags: &mut Diagnostics) -> Option<Nanos> {
        self.f
            .get(name)
            .and_then(|n| diags.take(duration(n, name).map_err(|d| in_context(d, self.context))))
    }

    /// An optional duration that must be a [`Span`] (greater than zero
    /// and at most 146 years).
    fn opt_span(&self, name: &str, diags: &mut Diagnostics) -> Option<Span> {
        let n = self.f.get(name)?;
        let d = self.opt_duration(name, diags)?;
        match Span::new(d) {
            Ok(span) => Some(span),
            Err(problem) => {
                diags.error(&n.pos, format!("{}: `{name}` {problem}", self.context));
                None
            }
        }
    }

    /// A fixed window: `limit`, `window`, `align` and, with `align:
    /// calendar`, `timezone` (a calendar window is one of
    /// [`CalendarUnit`]'s, named `1d`, `1w`, `1mo` or `1y`).
    fn fixed_window(&self, diags: &mut Diagnostics) -> AlgorithmSpec {
        let limit = self.count("limit", diags);
        let align = self.align(diags);
        let zone = self.f.get("timezone");
        if align != Some(AlignKind::Calendar) {
            if let Some(z) = zone {
                diags.error(
                    &z.pos,
                    format!(
                        "{}: `timezone` applies only to `align: calendar` (windows aligned to \
                         the epoch or the first hit are the same in every zone)",
                        self.context
                    ),
                );
            }
            let window = match self.f.get("window") {
                // An `align` that is wrong was reported: one typo, one error.
                Some(_) if align.is_none() && self.f.get("align").is_some() => Nanos::ZERO,
                Some(n) if calendar_only(n).is_some() => {
                    let text = calendar_only(n).unwrap_or_default();
                    diags.error(
                        &n.pos,
                        format!(
                            "{}: `window: {text}` is a calendar period: add `align: calendar` \
                             (windows then start at local midnight of the first day of each \
                             period, in `timezone`, UTC by default), or write a fixed length \
                             such as `30d`",
                            self.context
                        ),
                    );
                    Nanos::ZERO
                }
                _ => self.duration("window", diags),
            };
            return AlgorithmSpec::FixedWindow {
                limit,
                window,
                align: match align {
                    Some(AlignKind::FirstHit) => Align::FirstHit,
                    _ => Align::Epoch,
                },
            };
        }
        let unit = match self.f.get("window") {
            None => {
                self.missing("window", diags);
                None
            }
            Some(n) => {
                let unit = diags
                    .take(
                        n.scalar_text("window")
                            .map_err(|d| in_context(d, self.context)),
                    )
                    .and_then(|text| {
                        let unit = calendar_unit(&text);
                        if unit.is_none() {
                            diags.error(
                                &n.pos,
                                format!(
                                    "{}: a calendar window (`align: calendar`) is one day, \
                                     week, month or year: write `window: 1d`, `1w`, `1mo` or \
                                     `1y`, found `{text}`",
                                    self.context
                                ),
                            );
                        }
                        unit
                    });
                unit
            }
        };
        let zone = match zone {
            None => Some(Calendar::DEFAULT_ZONE),
            Some(z) => diags.take(
                z.as_str("timezone")
                    .map_err(|d| in_context(d, self.context)),
            ),
        };
        let calendar = match (unit, zone) {
            (Some(unit), Some(name)) => match Calendar::new(unit, name) {
                Ok(c) => Some(c),
                Err(e) => {
                    let pos = self.f.get("timezone").map_or(&self.f.node.pos, |z| &z.pos);
                    diags.error(pos, format!("{}: {e}", self.context));
                    None
                }
            },
            _ => None,
        };
        match calendar {
            Some(c) => AlgorithmSpec::FixedWindow {
                limit,
                window: c.unit().nominal(),
                align: Align::Calendar(c),
            },
            // Reported above; a placeholder the loader never builds.
            None => AlgorithmSpec::FixedWindow {
                limit,
                window: Nanos::ZERO,
                align: Align::Epoch,
            },
        }
    }

    fn align(&self, diags: &mut Diagnostics) -> Option<AlignKind> {
        let n = self.f.get("align")?;
        match diags.take(n.as_str("align")) {
            Some("epoch") => Some(AlignKind::Epoch),
            Some("first_hit") => Some(AlignKind::FirstHit),
            Some("calendar") => Some(AlignKind::Calendar),
            Some(other) => {
                diags.error(
                    &n.pos,
                    format!(
                        "{}: align must be `epoch`, `first_hit` or `calendar`, found `{other}`",
                        self.context
                    ),
                );
                None
            }
            None => None,
        }
    }

    fn buckets(&self, diags: &mut Diagnostics) -> u32 {
        let Some(n) = self.f.get("buckets") else {
            return 2;
        };
        let v = diags.take(n.as_u64("buckets")).unwrap_or(2);
        u32::try_from(v).unwrap_or(u32::MAX)
    }
}

/// How a fixed window's `align` reads, before its calendar is built.
#[derive(Copy, Clone, PartialEq, Eq)]
enum AlignKind {
    Epoch,
    FirstHit,
    Calendar,
}

/// The calendar unit a calendar window's `window` names: `1mo`, `1y`, or
/// a duration of exactly one day or one week (`1d`, `24h`, `1w`, `7d`).
fn calendar_unit(text: &str) -> Option<CalendarUnit> {
    let text = text.trim();
    CalendarUnit::from_name(text).or_else(|| {
        let d = parse_duration(text).ok()?;
        [CalendarUnit::Day, CalendarUnit::Week]
            .into_iter()
            .find(|u| u.nominal() == d)
    })
}

/// The text of a `window` that only a calendar has (`1mo`, `2y`: months
/// and years, which no duration is), if it is one.
fn calendar_only(n: &Node) -> Option<String> {
    let Kind::Str(s) = &n.kind else {
        return None;
    };
    let t = s.trim();
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &t[digits.len()..];
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && matches!(unit, "mo" | "y"))
        .then(|| t.to_owned())
}

/// Prefixes a diagnostic's message with what it is about.
fn in_context(mut d: Diagnostic, context: &str) -> Diagnostic {
    d.message = format!("{context}: {}", d.message);
    d
}

/// A duration: a string like `300ms`, or the number 0.
pub(crate) fn duration(n: &Node, what: &str) -> Result<Nanos, Diagnostic> {
    match &n.kind {
        Kind::Str(s) => {
            parse_duration(s).map_err(|e| Diagnostic::new(&n.pos, format!("`{what}`: {e}")))
        }
        Kind::Int(0) => Ok(Nanos::ZERO),
        Kind::Int(i) => Err(Diagnostic::new(
            &n.pos,
            format!("`{what}` needs a unit: write `{i}s` or `{i}ms`"),
        )),
        _ => Err(Diagnostic::new(
            &n.pos,
            format!(
                "`{what}` must be a duration like 300ms, 1s, 5m, found {}",
                n.type_name()
            ),
        )),
    }
}

/// A per-second hit limit (hard or global) that must be at least 1.
fn positive_limit(
    f: &Fields<'_>,
    name: &str,
    context: &str,
    diags: &mut Diagnostics,
) -> Option<u64> {
    let n = f.get(name)?;
    let v = diags.take(n.as_u64(name))?;
    if v == 0 {
        diags.error(
            &n.pos,
            format!("{context}: `{name}` must be at least 1 (use `algorithm: deny` to refuse everything)"),
        );
        return None;
    }
    Some(v)
}

/// Reads and normalizes burst tiers (Charon §4.1).
fn read_tiers(f: &Fields<'_>, context: &str, diags: &mut Diagnostics) -> Vec<Tier> {
    let Some(list) = f.get("tiers") else {
        diags.error(
            &f.node.pos,
            format!("{context} is missing required field `tiers`"),
        );
        return Vec::new();
    };
    let items = diags.take(list.as_seq("tiers")).unwrap_or(&[]);
    let mut tiers = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let tcontext = format!("{context}, tier {}", i + 1);
        let Some(t) = diags.take(item.as_map("a tier")) else {
            continue;
        };
        diags.errors.extend(t.unknown(TIER_FIELDS, &tcontext));
        let p = Params {
            f: &t,
            context: &tcontext,
        };
        let limit = p.count("limit", diags);
        if limit == 0 && t.has("limit") {
            diags.error(
                t.pos_of("limit"),
                format!("{tcontext}: `limit` must be at least 1 (a tier with limit 0 can never be entered)"),
            );
        }
        let mut tier = Tier {
            limit,
            window: p.duration("window", diags),
            active: p.duration("active", diags),
            cooldown: p.opt_duration("cooldown", diags).unwrap_or(Nanos::ZERO),
            skippable: flag(&t, "skippable", diags),
        };
        if normalize_tier(&mut tier, &item.pos, &tcontext, diags) {
            tiers.push(tier);
        }
    }
    tiers
}

/// Applies Charon §4.1 to one tier; `false` if the tier is dropped.
pub(crate) fn normalize_tier(
    tier: &mut Tier,
    pos: &Pos,
    context: &str,
    diags: &mut Diagnostics,
) -> bool {
    if tier.active.is_zero() {
        diags.warn(
            pos,
            format!("{context}: active time is zero, so the tier can never be used; removed"),
        );
        return false;
    }
    if tier.window.is_zero() {
        diags.error(
            pos,
            format!("{context}: `window` must be greater than zero"),
        );
        return false;
    }
    if tier.window > tier.active {
        diags.warn(
            pos,
            format!(
                "{context}: window {} is longer than the active period {}; shortened to {}",
                tier.window, tier.active, tier.active
            ),
        );
        tier.window = tier.active;
    }
    let rem = tier.active.as_u64() % tier.window.as_u64();
    if rem != 0 {
        let trimmed = Nanos::new(tier.active.as_u64() - rem);
        diags.warn(
            pos,
            format!(
                "{context}: active period {} is not a multiple of the window {}; trimmed to {} so no partial window ends it",
                tier.active, tier.window, trimmed
            ),
        );
        tier.active = trimmed;
    }
    true
}

fn read_concurrency(f: &Fields<'_>, context: &str, diags: &mut Diagnostics) -> Option<CopyLimits> {
    let before = diags.errors.len();
    if f.has("replication") {
        diags.error(
            f.pos_of("replication"),
            format!("{context}: `replication` applies to rate-limited resources; concurrency resources need the Redis store in a cluster"),
        );
    }
    diags.errors.extend(
        f.without(&["replication"])
            .unknown(CONCURRENCY_FIELDS, context),
    );
    let p = Params { f, context };
    let global = p.opt_count("global_limit", diags);
    let cap = |value: u64, what: String, pos: &Pos, diags: &mut Diagnostics| -> u64 {
        match global {
            Some(g) if value > g => {
                diags.warn(
                    pos,
                    format!("{context}: {what} {value} is above the global_limit {g}; the effective limit is {g}"),
                );
                g
            }
            _ => value,
        }
    };
    let domain_limit = p.count("domain_limit", diags);
    let domain_limit = cap(
        domain_limit,
        "domain_limit".into(),
        f.pos_of("domain_limit"),
        diags,
    );
    let mut limits = CopyLimits::new(domain_limit, global);
    if let Some(list) = f.get("groups") {
        for item in diags.take(list.as_seq("groups")).unwrap_or(&[]) {
            let Some(g) = diags.take(item.as_map("a group")) else {
                continue;
            };
            let Some(name) = diags.take(required_name(&g, "a group")) else {
                continue;
            };
            let gcontext = format!("{context}, group `{name}`");
            diags.errors.extend(g.unknown(GROUP_FIELDS, &gcontext));
            let gp = Params {
                f: &g,
                context: &gcontext,
            };
            let limit = gp.count("limit", diags);
            let limit = cap(limit, format!("group `{name}` limit"), &item.pos, diags);
            let members: Vec<String> = match g.get("members") {
                Some(m) => diags
                    .take(m.as_seq("members"))
                    .unwrap_or(&[])
                    .iter()
                    .filter_map(|x| diags.take(x.scalar_text("members")))
                    .collect(),
                None => Vec::new(),
            };
            match limits.clone().with_group(name, limit, members) {
                Ok(l) => limits = l,
                Err(e) => diags.error(&item.pos, format!("{context}: {e}")),
            }
        }
    }
    if let Some(d) = f.get("domains") {
        if let Some(map) = diags.take(d.as_map("domains")) {
            for (domain, _, value) in map.iter() {
                let dcontext = format!("{context}, domain `{domain}`");
                let Some(over) = diags.take(value.as_map("a domain override")) else {
                    continue;
                };
                diags
                    .errors
                    .extend(over.unknown(&["domain_limit"], &dcontext));
                let dp = Params {
                    f: &over,
                    context: &dcontext,
                };
                let v = dp.count("domain_limit", diags);
                let v = cap(
                    v,
                    format!("domain `{domain}` domain_limit"),
                    over.pos_of("domain_limit"),
                    diags,
                );
                limits = limits.with_override(domain, v);
            }
        }
    }
    (diags.errors.len() == before).then_some(limits)
}
