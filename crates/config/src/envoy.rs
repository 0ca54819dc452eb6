//! envoyproxy/ratelimit's config format, loaded unchanged with that
//! project's semantics.
//!
//! A file has one `domain` (a tollgate namespace) and a tree of
//! `descriptors`. Every node with a `rate_limit` becomes a resource named by
//! its path (`message_type_marketing.to_number`, envoyproxy/ratelimit's
//! stats key without the domain) limited by a fixed window aligned to the
//! Unix epoch: `requests_per_unit` per `unit` (second, minute, hour, day,
//! week = 7 days, month = 30 days, year = 365 days). `unlimited: true` never
//! limits, `requests_per_unit: 0` (or missing) rejects everything,
//! `shadow_mode` never rejects, `replaces` drops named limits from a request.
//! As an extension, a `rate_limit` block may name any tollgate algorithm and
//! its parameters instead of `unit` and `requests_per_unit`.
//!
//! Matching a request's descriptor follows envoyproxy/ratelimit's
//! `GetLimit`: at each level an exact key and value first, then the first
//! wildcard value (`foo*`) in config order, then the key alone; no
//! backtracking; a limit applies only if the node matched by the *last*
//! entry has one. Each distinct set of values gets its own counter: the
//! domain of a match is built from every entry's key and value.
//!
//! Deliberate differences: keys and values are compared as pairs, not as a
//! joined `key_value` string (which lets `a_b`+`c` collide with `a`+`b_c`
//! upstream); counters are updated all or nothing, so an over-limit
//! descriptor no longer consumes from the others (DESIGN: "envoyproxy/
//! ratelimit increments every counter even when one is over limit").

use tollgate_core::Align;

use crate::diag::{Diagnostics, Pos};
use crate::model::{
    AlgorithmSpec, EnvoyLimit, EnvoyMeta, EnvoyUnit, LimitSpec, Namespace, RateResource, RateSpec,
    Resource, ResourceKind, UsageSpec, MAX_LIMITS_PER_RESOURCE,
};
use crate::native::{flag, read_algorithm};
use crate::yaml::{did_you_mean, Fields, Node};

/// Every key envoyproxy/ratelimit accepts, at any level: it checks keys
/// against this one flat list, so a known key at the wrong level is
/// accepted there and ignored.
const ENVOY_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
];
const ROOT_FIELDS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "report",
    "max_debt",
];
const RATE_LIMIT_FIELDS: &[&str] = &["unit", "requests_per_unit", "unlimited", "name", "replaces"];
/// What an extended `rate_limit` block allows besides the algorithm's
/// parameters.
const EXTENSION_FIELDS: &[&str] = &["algorithm", "name", "replaces"];

/// A descriptor tree: the `descriptors` of one envoyproxy/ratelimit domain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DescriptorTree {
    /// The top-level descriptors, in config order.
    pub roots: Vec<DescriptorNode>,
}

/// One node of a descriptor tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorNode {
    /// The entry key it matches.
    pub key: String,
    /// Which values it matches.
    pub value: ValueMatch,
    /// Index of its resource in the namespace, when it has a `rate_limit`.
    pub resource: Option<usize>,
    /// All values matching a wildcard share one counter.
    pub share_threshold: bool,
    /// Nested descriptors.
    pub children: Vec<DescriptorNode>,
}

/// Which values a descriptor node matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueMatch {
    /// No `value`: any value, each with its own counter.
    Any,
    /// Exactly this value.
    Exact(String),
    /// A wildcard `foo*`: values starting with `foo`.
    Prefix(String),
}

/// The resource a descriptor selects, and the domain its counter is kept
/// under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorMatch {
    /// Index of the resource in the namespace.
    pub resource: usize,
    /// `key=value` for every entry, joined with `/` (`%`, `/` and `=` in
    /// keys and values are percent-encoded).
    pub domain: String,
}

/// A descriptor's counter domain when the descriptor brings its own limit
/// (Envoy's descriptor `limit`): every entry's `key=value`, joined with
/// `/` and escaped as [`DescriptorMatch::domain`] is, whether or not the
/// tree matches it (envoyproxy/ratelimit keys such a limit by the
/// descriptor itself).
pub fn descriptor_domain<K: AsRef<str>, V: AsRef<str>>(entries: &[(K, V)]) -> String {
    let mut domain = String::new();
    for (key, value) in entries {
        if !domain.is_empty() {
            domain.push('/');
        }
        escape_into(&mut domain, key.as_ref());
        domain.push('=');
        escape_into(&mut domain, value.as_ref());
    }
    domain
}

impl DescriptorTree {
    /// The resource limiting a descriptor (a list of key/value entries), or
    /// `None` when no limit applies (envoyproxy/ratelimit then answers OK).
    pub fn find<K: AsRef<str>, V: AsRef<str>>(
        &self,
        entries: &[(K, V)],
    ) -> Option<DescriptorMatch> {
        let mut level = &self.roots;
        let mut domain = String::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let (key, value) = (key.as_ref(), value.as_ref());
            let node = level
                .iter()
                .find(|n| n.key == key && matches!(&n.value, ValueMatch::Exact(v) if v == value))
                .or_else(|| {
                    level.iter().find(|n| {
                        n.key == key && matches!(&n.value, ValueMatch::Prefix(p) if value.starts_with(p.as_str()))
                    })
                })
                .or_else(|| level.iter().find(|n| n.key == key && n.value == ValueMatch::Any))?;
            if !domain.is_empty() {
                domain.push('/');
            }
            escape_into(&mut domain, key);
            domain.push('=');
            match (&node.value, node.share_threshold) {
                (ValueMatch::Prefix(p), true) => {
                    escape_into(&mut domain, p);
                    domain.push('*');
                }
                _ => escape_into(&mut domain, value),
            }
            if i + 1 == entries.len() {
                return node
                    .resource
                    .map(|resource| DescriptorMatch { resource, domain });
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}

/// Appends `s` to `out` with `%`, `/` and `=` percent-encoded. Written
/// into the domain being built, with no string of its own: this runs for
/// every entry of every descriptor of every Envoy request.
fn escape_into(out: &mut String, s: &str) {
    let mut rest = s;
    while let Some(at) = rest.find(['%', '/', '=']) {
        out.push_str(&rest[..at]);
        out.push_str(match rest.as_bytes()[at] {
            b'%' => "%25",
            b'/' => "%2F",
            _ => "%3D",
        });
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

/// Reads an envoyproxy/ratelimit document into a namespace.
pub(crate) fn read(root: &Fields<'_>, diags: &mut Diagnostics) -> Option<Namespace> {
    check_keys(root, ROOT_FIELDS, "the top level", diags);
    let domain_node = match root.require("domain", "an envoyproxy/ratelimit config") {
        Ok(n) => n,
        Err(d) => {
            diags.errors.push(d);
            return None;
        }
    };
    let domain = diags.take(domain_node.scalar_text("domain"))?;
    if domain.is_empty() {
        diags.error(&domain_node.pos, "config file cannot have empty domain");
        return None;
    }
    let mut reader = Reader {
        resources: Vec::new(),
        diags,
    };
    let roots = match root.get("descriptors") {
        Some(list) => reader.descriptors(list, "")?,
        None => Vec::new(),
    };
    Some(Namespace {
        name: domain,
        allow_unconfigured: false,
        ignore_configured: false,
        resources: reader.resources,
        descriptors: Some(DescriptorTree { roots }),
        pos: root.node.pos.clone(),
    })
}

/// Reports keys unknown to envoyproxy/ratelimit as errors, and keys it
/// knows but ignores at this level as warnings.
fn check_keys(f: &Fields<'_>, allowed: &[&str], context: &str, diags: &mut Diagnostics) {
    for (name, key, _) in f.iter() {
        if allowed.contains(&name) {
            continue;
        }
        if ENVOY_KEYS.contains(&name) {
            diags.warn(
                &key.pos,
                format!("`{name}` has no meaning in {context} and is ignored, as envoyproxy/ratelimit does"),
            );
        } else {
            let hint = did_you_mean(name, allowed)
                .map(|s| format!(", did you mean `{s}`?"))
                .unwrap_or_default();
            diags.error(&key.pos, format!("unknown key `{name}` in {context}{hint}"));
        }
    }
}

struct Reader<'d> {
    resources: Vec<Resource>,
    diags: &'d mut Diagnostics,
}

impl Reader<'_> {
    fn descriptors(&mut self, list: &Node, parent: &str) -> Option<Vec<DescriptorNode>> {
        let items = self.diags.take(list.as_seq("descriptors"))?;
        let mut out: Vec<DescriptorNode> = Vec::new();
        let mut seen: Vec<(String, &Node)> = Vec::new();
        for item in items {
            let Some(f) = self.diags.take(item.as_map("a descriptor")) else {
                continue;
            };
            let Some(node) = self.descriptor(&f, item, parent, &mut seen) else {
                continue;
            };
            out.push(node);
        }
        Some(out)
    }

    fn descriptor<'n>(
        &mut self,
        f: &Fields<'n>,
        item: &'n Node,
        parent: &str,
        seen: &mut Vec<(String, &'n Node)>,
    ) -> Option<DescriptorNode> {
        let key = match f.require("key", "a descriptor") {
            Ok(n) => self.diags.take(n.scalar_text("key"))?,
            Err(d) => {
                self.diags.errors.push(d);
                return None;
            }
        };
        if key.is_empty() {
            self.diags.error(&item.pos, "descriptor has empty key");
            return None;
        }
        let value = match f.get("value") {
            Some(v) => self.diags.take(v.scalar_text("value"))?,
            None => String::new(),
        };
        let final_key = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        let path = if parent.is_empty() {
            final_key.clone()
        } else {
            format!("{parent}.{final_key}")
        };
        let context = format!("descriptor `{path}`");
        check_keys(f, DESCRIPTOR_FIELDS, &context, self.diags);
        if let Some((_, first)) = seen.iter().find(|(k, _)| *k == final_key) {
            self.diags.error(
                &item.pos,
                format!(
                    "duplicate descriptor composite key `{path}` (first at {})",
                    first.pos
                ),
            );
            return None;
        }
        seen.push((final_key, item));
        let share_threshold = flag(f, "share_threshold", self.diags);
        let value_match = if value.is_empty() {
            ValueMatch::Any
        } else if let Some(prefix) = value.strip_suffix('*') {
            ValueMatch::Prefix(prefix.to_owned())
        } else {
            if share_threshold {
                self.diags.error(
                    f.pos_of("share_threshold"),
                    format!("share_threshold can only be used with wildcard values (ending with '*'), but found key `{path}`"),
                );
            }
            ValueMatch::Exact(value)
        };
        let shadow = flag(f, "shadow_mode", self.diags);
        let detailed_metric = flag(f, "detailed_metric", self.diags);
        let _ = flag(f, "value_to_metric", self.diags);
        // tollgate's extension: usage reported after the fact.
        let usage = UsageSpec {
            max_debt: f
                .get("max_debt")
                .and_then(|n| self.diags.take(n.as_u64("max_debt"))),
            report: flag(f, "report", self.diags),
        };
        let usage_at = f.pos_of(if f.has("report") {
            "report"
        } else {
            "max_debt"
        });
        let resource = match f.get("rate_limit") {
            Some(rl) if matches!(rl.kind, crate::yaml::Kind::Seq(_)) => self.rate_limits(
                rl,
                &path,
                shadow,
                detailed_metric,
                (usage, usage_at),
                &item.pos,
            ),
            Some(rl) if !matches!(rl.kind, crate::yaml::Kind::Null) => self.rate_limit(
                rl,
                &path,
                shadow,
                detailed_metric,
                (usage, usage_at),
                &item.pos,
            ),
            _ => {
                if usage != UsageSpec::default() {
                    let field = if usage.report { "report" } else { "max_debt" };
                    self.diags.error(
                        f.pos_of(field),
                        format!("descriptor `{path}`: `{field}` needs a `rate_limit` in the same descriptor"),
                    );
                }
                None
            }
        };
        let children = match f.get("descriptors") {
            Some(list) => self.descriptors(list, &path).unwrap_or_default(),
            None => Vec::new(),
        };
        Some(DescriptorNode {
            key,
            value: value_match,
            resource,
            share_threshold,
            children,
        })
    }

    fn rate_limit(
        &mut self,
        node: &Node,
        path: &str,
        shadow: bool,
        detailed_metric: bool,
        usage: (UsageSpec, &Pos),
        pos: &Pos,
    ) -> Option<usize> {
        let f = self.diags.take(node.as_map("rate_limit"))?;
        let context = format!("rate_limit of descriptor `{path}`");
        let name = match f.get("name") {
            Some(n) => self
                .diags
                .take(n.scalar_text("name"))
                .filter(|s| !s.is_empty()),
            None => None,
        };
        let replaces = self.replaces(&f, name.as_deref(), &context);
        let (algorithm, limit) = if f.has("algorithm") {
            let algorithm = read_algorithm(&f, &f, &context, EXTENSION_FIELDS, self.diags)?;
            let limit = EnvoyLimit::of_algorithm(&algorithm);
            (algorithm, limit)
        } else {
            check_keys(&f, RATE_LIMIT_FIELDS, &context, self.diags);
            self.envoy_limit(&f, &context)?
        };
        self.push_resource(
            path,
            RateSpec::single(algorithm, None),
            shadow,
            usage,
            EnvoyMeta {
                name,
                replaces,
                detailed_metric,
                limit,
            },
            pos,
        )
    }

    /// A `rate_limit:` list (a tollgate extension): several limits on one
    /// descriptor, decided together, each entry a `rate_limit` block of its
    /// own with an optional `name` (what answers call it). `replaces` and
    /// `unlimited` belong to a whole descriptor and are refused in a list.
    fn rate_limits(
        &mut self,
        node: &Node,
        path: &str,
        shadow: bool,
        detailed_metric: bool,
        usage: (UsageSpec, &Pos),
        pos: &Pos,
    ) -> Option<usize> {
        let context = format!("rate_limit of descriptor `{path}`");
        let items = self.diags.take(node.as_seq("rate_limit"))?;
        if items.is_empty() || items.len() > MAX_LIMITS_PER_RESOURCE {
            self.diags.error(
                &node.pos,
                format!("{context}: a `rate_limit` list has 1 to {MAX_LIMITS_PER_RESOURCE} limits, found {}", items.len()),
            );
            return None;
        }
        let before = self.diags.errors.len();
        let mut limits: Vec<LimitSpec> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let Some(f) = self.diags.take(item.as_map("a rate_limit entry")) else {
                continue;
            };
            for refused in ["replaces", "unlimited"] {
                if f.has(refused) {
                    self.diags.error(
                        f.pos_of(refused),
                        format!("{context}: `{refused}` applies to a whole descriptor and cannot be given per entry of a `rate_limit` list"),
                    );
                }
            }
            let name = match f.get("name") {
                Some(n) => match self.diags.take(n.scalar_text("name")) {
                    Some(name) => name,
                    None => continue,
                },
                None => (i + 1).to_string(),
            };
            if let Some(problem) = crate::native::limit_name_problem(&name) {
                self.diags.error(
                    f.pos_of("name"),
                    format!("{context}: limit name {name:?} {problem}"),
                );
                continue;
            }
            if limits
                .iter()
                .any(|l| l.name.as_deref() == Some(name.as_str()))
            {
                self.diags.error(
                    f.pos_of("name"),
                    format!("{context}: two limits are called `{name}`; each limit's name must be unique"),
                );
                continue;
            }
            let lcontext = format!("{context}, limit `{name}`");
            let algorithm = if f.has("algorithm") {
                read_algorithm(&f, &f, &lcontext, &["algorithm", "name"], self.diags)
            } else {
                check_keys(
                    &f,
                    &["unit", "requests_per_unit", "name"],
                    &lcontext,
                    self.diags,
                );
                self.envoy_limit(&f, &lcontext).map(|(a, _)| a)
            };
            match algorithm {
                Some(AlgorithmSpec::Deny) => self.diags.error(
                    &item.pos,
                    format!("{lcontext}: a limit of 0 requests cannot be one limit of a list; give the descriptor a single `rate_limit` with `requests_per_unit: 0`"),
                ),
                Some(algorithm) => limits.push(LimitSpec {
                    name: Some(name),
                    algorithm,
                }),
                None => {}
            }
        }
        if self.diags.errors.len() > before {
            return None;
        }
        self.push_resource(
            path,
            RateSpec {
                limits,
                hard_limit: None,
            },
            shadow,
            usage,
            EnvoyMeta {
                name: None,
                replaces: Vec::new(),
                detailed_metric,
                limit: None,
            },
            pos,
        )
    }

    /// Adds the resource of descriptor `path`, warning when another
    /// descriptor's path prints alike.
    fn push_resource(
        &mut self,
        path: &str,
        spec: RateSpec,
        shadow: bool,
        (usage, usage_at): (UsageSpec, &Pos),
        envoy: EnvoyMeta,
        pos: &Pos,
    ) -> Option<usize> {
        if let Some(first) = self.resources.iter().find(|r| r.name == path) {
            // Dots inside keys make two paths print alike (upstream's stats
            // keys collide the same way); the limits stay separate.
            self.diags.warn(
                pos,
                format!(
                    "descriptor path `{path}` is also the path of the limit at {}; \
                     they are separate limits but share a name in outputs",
                    first.pos
                ),
            );
        }
        let rate = RateResource {
            default: spec,
            domains: Default::default(),
            global_limit: None,
            override_max: None,
        };
        if let Err(problem) = usage.check(&rate) {
            self.diags
                .error(usage_at, format!("descriptor `{path}`: {problem}"));
            return None;
        }
        self.resources.push(Resource {
            name: path.to_owned(),
            kind: ResourceKind::Rate(rate),
            shadow,
            usage,
            replication: None,
            refining: Default::default(),
            envoy: Some(envoy),
            pos: pos.clone(),
        });
        Some(self.resources.len() - 1)
    }

    fn replaces(&mut self, f: &Fields<'_>, own: Option<&str>, context: &str) -> Vec<String> {
        let Some(list) = f.get("replaces") else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for item in self.diags.take(list.as_seq("replaces")).unwrap_or(&[]) {
            let Some(r) = self.diags.take(item.as_map("a replaces entry")) else {
                continue;
            };
            let name = match r.get("name") {
                Some(n) => self.diags.take(n.scalar_text("name")).unwrap_or_default(),
                None => String::new(),
            };
            if name.is_empty() {
                self.diags.error(
                    &item.pos,
                    format!("{context}: should not have an empty replaces entry"),
                );
            } else if Some(name.as_str()) == own {
                self.diags.error(
                    &item.pos,
                    format!("{context}: replaces should not contain name of same descriptor"),
                );
            } else {
                out.push(name);
            }
        }
        out
    }

    /// `unit` + `requests_per_unit`, or `unlimited`: the algorithm, and the
    /// limit as written (none for `unlimited`).
    fn envoy_limit(
        &mut self,
        f: &Fields<'_>,
        context: &str,
    ) -> Option<(AlgorithmSpec, Option<EnvoyLimit>)> {
        let unlimited = flag(f, "unlimited", self.diags);
        let unit = match f.get("unit") {
            Some(n) => Some((self.diags.take(n.scalar_text("unit"))?, n)),
            None => None,
        };
        let parsed = unit.as_ref().and_then(|(u, _)| EnvoyUnit::parse(u));
        if unlimited {
            if parsed.is_some() {
                self.diags.error(
                    f.pos_of("unit"),
                    format!("{context}: should not specify rate limit unit when unlimited"),
                );
                return None;
            }
            return Some((AlgorithmSpec::Unlimited, None));
        }
        let Some(unit_parsed) = parsed else {
            let shown = unit.as_ref().map(|(u, _)| u.as_str()).unwrap_or("");
            let pos = unit.as_ref().map_or(&f.node.pos, |(_, n)| &n.pos);
            self.diags.error(
                pos,
                format!("{context}: invalid rate limit unit '{shown}' (expected second, minute, hour, day, week, month or year)"),
            );
            return None;
        };
        let requests = match f.get("requests_per_unit") {
            Some(n) => self.diags.take(n.as_u64("requests_per_unit"))?,
            None => 0,
        };
        if requests > u64::from(u32::MAX) {
            self.diags.error(
                f.pos_of("requests_per_unit"),
                format!("{context}: requests_per_unit must fit in 32 bits"),
            );
            return None;
        }
        let limit = EnvoyLimit {
            requests_per_unit: requests,
            unit: unit_parsed,
        };
        if requests == 0 {
            self.diags.warn(
                f.pos_of("requests_per_unit"),
                format!("{context}: requests_per_unit is 0 or missing, so every request is rejected (as envoyproxy/ratelimit does)"),
            );
            return Some((AlgorithmSpec::Deny, Some(limit)));
        }
        Some((
            AlgorithmSpec::FixedWindow {
                limit: requests,
                window: unit_parsed.window(),
                align: Align::Epoch,
            },
            Some(limit),
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use crate::model::{EnvoyLimit, EnvoyUnit};

    /// The limit of the resource called `name` in the only namespace.
    fn limit_of(yaml: &str, name: &str) -> Option<EnvoyLimit> {
        let loaded = crate::load_str("t.yaml", yaml).unwrap();
        let ns = &loaded.config.namespaces[0];
        ns.resource(name).unwrap().envoy.as_ref().unwrap().limit
    }

    #[test]
    fn the_limit_is_kept_as_written_for_current_limit() {
        let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: MINUTE, requests_per_unit: 10 }\n  - key: b\n    rate_limit: { unit: day, requests_per_unit: 0 }\n  - key: c\n    rate_limit: { unlimited: true }\n  - key: e\n    rate_limit: { algorithm: sliding_log, limit: 2, window: 1h }\n  - key: f\n    rate_limit: { algorithm: sliding_log, limit: 2, window: 90s }\n  - key: g\n    rate_limit: { algorithm: token_bucket, capacity: 5, rate: 1/s }\n";
        let per = |requests_per_unit, unit| {
            Some(EnvoyLimit {
                requests_per_unit,
                unit,
            })
        };
        assert_eq!(limit_of(yaml, "a"), per(10, EnvoyUnit::Minute));
        assert_eq!(limit_of(yaml, "b"), per(0, EnvoyUnit::Day));
        assert_eq!(limit_of(yaml, "c"), None);
        assert_eq!(limit_of(yaml, "e"), per(2, EnvoyUnit::Hour));
        assert_eq!(limit_of(yaml, "f"), None);
        assert_eq!(limit_of(yaml, "g"), None);
    }

    #[test]
    fn units_round_trip() {
        for unit in EnvoyUnit::ALL {
            assert_eq!(EnvoyUnit::parse(unit.as_str()), Some(unit));
            assert_eq!(EnvoyUnit::from_window(unit.window()), Some(unit));
        }
        assert_eq!(EnvoyUnit::parse("Week"), Some(EnvoyUnit::Week));
        assert_eq!(EnvoyUnit::parse("fortnight"), None);
    }
}
