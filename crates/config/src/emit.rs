//! Writes a resolved config back as YAML: what `tollgate check-config`
//! prints after normalization. Namespaces of tollgate's own format come
//! first, in one document; each namespace loaded from an envoyproxy/ratelimit
//! file follows as a document of its own in that format. Reading the output
//! back yields the same limits.

use std::fmt::Write;

use tollgate_core::replicated::strategy::{Eager, Replication, StrategyKind};
use tollgate_core::Align;

use crate::envoy::{DescriptorNode, ValueMatch};
use crate::model::{AlgorithmSpec, Config, Namespace, RateSpec, Resource, ResourceKind};

/// The config as YAML, one or more documents.
pub fn to_yaml(config: &Config) -> String {
    let mut out = String::new();
    let native: Vec<&Namespace> = config
        .namespaces
        .iter()
        .filter(|n| n.descriptors.is_none())
        .collect();
    if !native.is_empty() {
        out.push_str("namespaces:\n");
        for ns in native {
            namespace(&mut out, ns);
        }
    }
    for ns in config.namespaces.iter().filter(|n| n.descriptors.is_some()) {
        if !out.is_empty() {
            out.push_str("---\n");
        }
        envoy_namespace(&mut out, ns);
    }
    out
}

fn namespace(out: &mut String, ns: &Namespace) {
    let _ = writeln!(out, "  - name: {}", scalar(&ns.name));
    let _ = writeln!(out, "    allow_unconfigured: {}", ns.allow_unconfigured);
    let _ = writeln!(out, "    ignore_configured: {}", ns.ignore_configured);
    if ns.resources.is_empty() {
        out.push_str("    resources: []\n");
        return;
    }
    out.push_str("    resources:\n");
    for r in &ns.resources {
        resource(out, r);
    }
}

fn resource(out: &mut String, r: &Resource) {
    let _ = writeln!(out, "      - name: {}", scalar(&r.name));
    if r.shadow {
        out.push_str("        shadow_mode: true\n");
    }
    if let Some(d) = r.usage.max_debt {
        let _ = writeln!(out, "        max_debt: {d}");
    }
    if r.usage.report {
        out.push_str("        report: true\n");
    }
    match &r.kind {
        ResourceKind::Rate(rate) => {
            spec_lines(out, &rate.default, "        ");
            if let Some(g) = rate.global_limit {
                let _ = writeln!(out, "        global_limit: {g}");
            }
            if let Some(max) = &rate.override_max {
                out.push_str("        allow_override: true\n");
                let _ = writeln!(
                    out,
                    "        override_max: {}/{}",
                    max.count(),
                    max.period()
                );
            }
            if let Some(rep) = &r.replication {
                let _ = writeln!(out, "        replication: {}", replication(rep));
            }
            if !rate.domains.is_empty() {
                out.push_str("        domains:\n");
                for (d, spec) in &rate.domains {
                    let _ = writeln!(out, "          {}: {{ {} }}", scalar(d), spec_flow(spec));
                }
            }
        }
        ResourceKind::Concurrency(c) => {
            out.push_str("        kind: concurrency\n");
            let _ = writeln!(out, "        domain_limit: {}", c.domain_limit());
            if let Some(g) = c.global_limit() {
                let _ = writeln!(out, "        global_limit: {g}");
            }
            if !c.groups().is_empty() {
                out.push_str("        groups:\n");
                for g in c.groups() {
                    let mut members: Vec<&String> = g.members.iter().collect();
                    members.sort();
                    let members: Vec<String> = members.iter().map(|m| scalar(m)).collect();
                    let _ = writeln!(
                        out,
                        "          - {{ name: {}, limit: {}, members: [{}] }}",
                        scalar(&g.name),
                        g.limit,
                        members.join(", ")
                    );
                }
            }
            if !c.overrides().is_empty() {
                out.push_str("        domains:\n");
                let mut overrides: Vec<_> = c.overrides().iter().collect();
                overrides.sort();
                for (d, v) in overrides {
                    let _ = writeln!(out, "          {}: {{ domain_limit: {v} }}", scalar(d));
                }
            }
        }
    }
}

/// `replication:`'s value: the strategy's name when everything else is
/// the default, else a flow mapping of `strategy` and the fields that
/// differ. Fields the strategy does not take are left out: the loader
/// refuses them, and the strategy ignores them.
fn replication(r: &Replication) -> String {
    let defaults = Replication::new(r.strategy);
    let mut parts = Vec::new();
    if r.gossip_interval != defaults.gossip_interval {
        parts.push(format!("gossip_interval: {}", r.gossip_interval));
    }
    match r.strategy {
        StrategyKind::Queue => {
            match r.eager {
                None => parts.push("eager: false".into()),
                Some(Eager { window, threshold }) => {
                    if let Some(w) = window {
                        parts.push(format!("window: {w}"));
                    }
                    if threshold != Eager::DEFAULT_THRESHOLD {
                        parts.push(format!("frequency_threshold: {threshold}"));
                    }
                }
            }
            if r.least_informed {
                parts.push("least_informed: true".into());
            }
            if r.near_limit != defaults.near_limit {
                parts.push(format!("near_limit: {}", r.near_limit));
            }
            if let Some(t) = r.retention {
                parts.push(format!("retention: {t}"));
            }
        }
        StrategyKind::Epoch => {
            if r.epoch != defaults.epoch {
                parts.push(format!("epoch: {}", r.epoch));
            }
        }
        StrategyKind::Counter => {}
    }
    if parts.is_empty() {
        return r.strategy.as_str().to_owned();
    }
    format!(
        "{{ strategy: {}, {} }}",
        r.strategy.as_str(),
        parts.join(", ")
    )
}

fn envoy_namespace(out: &mut String, ns: &Namespace) {
    let _ = writeln!(out, "domain: {}", scalar(&ns.name));
    let roots = ns
        .descriptors
        .as_ref()
        .map(|t| t.roots.as_slice())
        .unwrap_or(&[]);
    if roots.is_empty() {
        out.push_str("descriptors: []\n");
        return;
    }
    out.push_str("descriptors:\n");
    for node in roots {
        descriptor(out, ns, node, 1);
    }
}

fn descriptor(out: &mut String, ns: &Namespace, node: &DescriptorNode, depth: usize) {
    let pad = "  ".repeat(depth * 2 - 1);
    let _ = writeln!(out, "{pad}- key: {}", scalar(&node.key));
    let pad = "  ".repeat(depth * 2);
    match &node.value {
        ValueMatch::Any => {}
        ValueMatch::Exact(v) => {
            let _ = writeln!(out, "{pad}value: {}", scalar(v));
        }
        ValueMatch::Prefix(p) => {
            let _ = writeln!(out, "{pad}value: {}", scalar(&format!("{p}*")));
        }
    }
    if node.share_threshold {
        let _ = writeln!(out, "{pad}share_threshold: true");
    }
    if let Some(r) = node.resource.and_then(|i| ns.resources.get(i)) {
        if r.shadow {
            let _ = writeln!(out, "{pad}shadow_mode: true");
        }
        if let Some(d) = r.usage.max_debt {
            let _ = writeln!(out, "{pad}max_debt: {d}");
        }
        if r.usage.report {
            let _ = writeln!(out, "{pad}report: true");
        }
        let meta = r.envoy.clone().unwrap_or_default();
        if meta.detailed_metric {
            let _ = writeln!(out, "{pad}detailed_metric: true");
        }
        let mut parts = Vec::new();
        if let ResourceKind::Rate(rate) = &r.kind {
            if let Some(algorithm) = rate.default.algorithm() {
                parts.extend(envoy_limit(algorithm));
            } else {
                // A `rate_limit` list: each limit named, in its own terms.
                let list: Vec<String> = rate
                    .default
                    .limits
                    .iter()
                    .enumerate()
                    .map(|(i, l)| {
                        let mut entry =
                            vec![format!("name: {}", scalar(&rate.default.limit_name(i)))];
                        entry.extend(envoy_limit(&l.algorithm));
                        format!("{{ {} }}", entry.join(", "))
                    })
                    .collect();
                let _ = writeln!(out, "{pad}rate_limit: [{}]", list.join(", "));
            }
        }
        let listed = matches!(&r.kind, ResourceKind::Rate(rate) if rate.default.is_list());
        if let Some(n) = &meta.name {
            parts.push(format!("name: {}", scalar(n)));
        }
        if !meta.replaces.is_empty() {
            let names: Vec<String> = meta
                .replaces
                .iter()
                .map(|n| format!("{{ name: {} }}", scalar(n)))
                .collect();
            parts.push(format!("replaces: [{}]", names.join(", ")));
        }
        if !listed {
            let _ = writeln!(out, "{pad}rate_limit: {{ {} }}", parts.join(", "));
        }
    }
    if !node.children.is_empty() {
        let _ = writeln!(out, "{pad}descriptors:");
        for child in &node.children {
            descriptor(out, ns, child, depth + 1);
        }
    }
}

/// A limit in envoyproxy/ratelimit's own terms where it has them, else as
/// the tollgate-algorithm extension.
fn envoy_limit(spec: &AlgorithmSpec) -> Vec<String> {
    const UNITS: [(&str, u64); 7] = [
        ("second", 1),
        ("minute", 60),
        ("hour", 3_600),
        ("day", 86_400),
        ("week", 604_800),
        ("month", 2_592_000),
        ("year", 31_536_000),
    ];
    match spec {
        AlgorithmSpec::Unlimited => vec!["unlimited: true".into()],
        AlgorithmSpec::Deny => vec!["unit: second".into(), "requests_per_unit: 0".into()],
        AlgorithmSpec::FixedWindow {
            limit,
            window,
            align: Align::Epoch,
        } if *limit <= u64::from(u32::MAX) => {
            match UNITS
                .iter()
                .find(|(_, secs)| tollgate_core::Nanos::from_secs(*secs) == *window)
            {
                Some((unit, _)) => vec![
                    format!("unit: {unit}"),
                    format!("requests_per_unit: {limit}"),
                ],
                None => extension(spec),
            }
        }
        _ => extension(spec),
    }
}

fn extension(spec: &AlgorithmSpec) -> Vec<String> {
    let mut parts = vec![format!("algorithm: {}", spec.name())];
    parts.extend(spec.params().into_iter().map(|(k, v)| format!("{k}: {v}")));
    parts
}

fn spec_lines(out: &mut String, spec: &RateSpec, indent: &str) {
    match spec.algorithm() {
        Some(algorithm) => {
            let _ = writeln!(out, "{indent}algorithm: {}", algorithm.name());
            for (k, v) in algorithm.params() {
                let _ = writeln!(out, "{indent}{k}: {v}");
            }
        }
        None => {
            let _ = writeln!(out, "{indent}limits:");
            for flow in limit_flows(spec) {
                let _ = writeln!(out, "{indent}  - {{ {flow} }}");
            }
        }
    }
    if let Some(h) = spec.hard_limit {
        let _ = writeln!(out, "{indent}hard_limit: {h}");
    }
}

fn spec_flow(spec: &RateSpec) -> String {
    let mut parts = match spec.algorithm() {
        Some(algorithm) => algorithm_flow(algorithm),
        None => {
            let list: Vec<String> = limit_flows(spec)
                .into_iter()
                .map(|f| format!("{{ {f} }}"))
                .collect();
            vec![format!("limits: [{}]", list.join(", "))]
        }
    };
    if let Some(h) = spec.hard_limit {
        parts.push(format!("hard_limit: {h}"));
    }
    parts.join(", ")
}

/// `algorithm: NAME` and its parameters, as flow-mapping entries.
fn algorithm_flow(algorithm: &AlgorithmSpec) -> Vec<String> {
    let mut parts = vec![format!("algorithm: {}", algorithm.name())];
    parts.extend(
        algorithm
            .params()
            .into_iter()
            .map(|(k, v)| format!("{k}: {v}")),
    );
    parts
}

/// Each limit of a `limits:` list as the inside of a flow mapping, named.
fn limit_flows(spec: &RateSpec) -> Vec<String> {
    spec.limits
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut parts = vec![format!("name: {}", scalar(&spec.limit_name(i)))];
            parts.extend(algorithm_flow(&l.algorithm));
            parts.join(", ")
        })
        .collect()
}

/// A string as a YAML scalar: plain when unambiguous, else double-quoted
/// (also what the config API's export writes its keys and strings with).
///
/// Plain only when the YAML reader's own scalar resolution gives the same
/// string back: `True`, `NULL`, `~`, `0x10` or `.inf` written plain would
/// be read as a boolean, null or number (review of issue 22: a resource
/// named `NULL` came back as `"name": null`). YAML 1.1's yes/no/on/off
/// are quoted too, for readers that still resolve them.
pub fn scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./@".contains(c))
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "yes" | "no" | "on" | "off" | "y" | "n"
        )
        && matches!(
            saphyr::Scalar::parse_from_cow(std::borrow::Cow::Borrowed(s)),
            saphyr::Scalar::String(ref read) if read == s
        );
    if plain {
        return s.to_owned();
    }
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
