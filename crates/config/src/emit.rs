//! Writes a resolved config back as YAML in tollgate's own format: what
//! `tollgate check-config` prints after normalization. Reading the output
//! back yields the same limits.

use std::fmt::Write;

use crate::model::{Config, Namespace, RateSpec, Resource, ResourceKind};

/// The config as native-format YAML.
pub fn to_yaml(config: &Config) -> String {
    let mut out = String::from("namespaces:\n");
    for ns in &config.namespaces {
        namespace(&mut out, ns);
    }
    out
}

fn namespace(out: &mut String, ns: &Namespace) {
    let _ = writeln!(out, "  - name: {}", scalar(&ns.name));
    if ns.descriptors.is_some() {
        out.push_str(
            "    # from an envoyproxy/ratelimit file: descriptors select these resources\n",
        );
    }
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
    match &r.kind {
        ResourceKind::Rate(rate) => {
            spec_lines(out, &rate.default, "        ");
            if let Some(g) = rate.global_limit {
                let _ = writeln!(out, "        global_limit: {g}");
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

fn spec_lines(out: &mut String, spec: &RateSpec, indent: &str) {
    let _ = writeln!(out, "{indent}algorithm: {}", spec.algorithm.name());
    for (k, v) in spec.algorithm.params() {
        let _ = writeln!(out, "{indent}{k}: {v}");
    }
    if let Some(h) = spec.hard_limit {
        let _ = writeln!(out, "{indent}hard_limit: {h}");
    }
}

fn spec_flow(spec: &RateSpec) -> String {
    let mut parts = vec![format!("algorithm: {}", spec.algorithm.name())];
    parts.extend(
        spec.algorithm
            .params()
            .into_iter()
            .map(|(k, v)| format!("{k}: {v}")),
    );
    if let Some(h) = spec.hard_limit {
        parts.push(format!("hard_limit: {h}"));
    }
    parts.join(", ")
}

/// A string as a YAML scalar: plain when unambiguous, else double-quoted.
fn scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./@".contains(c))
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && !matches!(
            s,
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
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
