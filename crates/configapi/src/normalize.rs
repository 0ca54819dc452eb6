//! Validation and normalization on write (Charon §4.1), by the same loader
//! `tollgate serve` and `tollgate check-config` use, so the API accepts
//! exactly what a config file may say and stores what the file loader would
//! make of it.
//!
//! JSON is YAML: a change is checked by loading a one-namespace document
//! built from the JSON body, and the normalized resource is read back from
//! the loader's own output (`tollgate_config::emit`).

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tollgate_config::yaml::{Kind, Node};

use crate::error::ApiError;

/// The longest name (in bytes) of a namespace, resource, group or domain in
/// the config API, in a path or as a domain override's key in a resource
/// body. Override keys are YAML keys in an export, and YAML refuses an
/// implicit key over 1024 characters: a longer key would make an export
/// that cannot be imported.
pub const MAX_NAME_BYTES: usize = 200;

/// A namespace's flags (Charon §4.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceFlags {
    /// Limiting off for the namespace; usage still recorded.
    #[serde(default)]
    pub ignore_configured: bool,
    /// Unknown resources get the most permissive limits.
    #[serde(default)]
    pub allow_unconfigured: bool,
}

/// A namespace and its resources, as the API stores them.
#[derive(Clone, Debug, PartialEq)]
pub struct NamespaceDoc {
    /// The namespace's name.
    pub name: String,
    /// Its flags.
    pub flags: NamespaceFlags,
    /// Its resources' normalized bodies.
    pub resources: Vec<Value>,
}

/// The whole config as one JSON document in the native format (which is
/// YAML too): what `tollgate serve` loads.
pub fn document(namespaces: &[NamespaceDoc]) -> Value {
    let list: Vec<Value> = namespaces
        .iter()
        .map(|ns| {
            json!({
                "name": ns.name,
                "ignore_configured": ns.flags.ignore_configured,
                "allow_unconfigured": ns.flags.allow_unconfigured,
                "resources": ns.resources,
            })
        })
        .collect();
    json!({ "namespaces": list })
}

/// Loads `doc` (named `what` in messages): the normalized document and
/// the warnings.
pub fn load(what: &str, doc: &Value) -> Result<(Value, Vec<String>), ApiError> {
    let text = serde_json::to_string_pretty(doc)
        .map_err(|e| ApiError::malformed(format!("cannot write the config: {e}")))?;
    // Positions in text this API wrote would only confuse: messages only.
    load_with(what, &text, false)
}

/// Loads a config text (YAML or JSON, tollgate's format): the normalized
/// document (as JSON) and the warnings. envoyproxy/ratelimit documents are
/// refused: the API stores tollgate's own format.
/// Messages name the line and column in `text`, which the caller wrote.
pub fn load_text(what: &str, text: &str) -> Result<(Value, Vec<String>), ApiError> {
    load_with(what, text, true)
}

fn load_with(what: &str, text: &str, positions: bool) -> Result<(Value, Vec<String>), ApiError> {
    let loaded = tollgate_config::load_str(what, text).map_err(|e| {
        let messages: Vec<String> = e
            .errors
            .iter()
            .map(|d| {
                if positions {
                    d.to_string()
                } else {
                    d.message.clone()
                }
            })
            .collect();
        ApiError::invalid(messages.join("; "))
    })?;
    if loaded
        .config
        .namespaces
        .iter()
        .any(|n| n.descriptors.is_some())
    {
        return Err(ApiError::invalid(
            "envoyproxy/ratelimit documents (domain + descriptors) cannot be stored: \
             the config API keeps tollgate's own format",
        ));
    }
    let warnings = loaded.warnings.iter().map(|w| w.message.clone()).collect();
    let emitted = tollgate_config::emit::to_yaml(&loaded.config);
    let nodes = tollgate_config::yaml::parse("normalized", &emitted)
        .map_err(|d| ApiError::invalid(format!("the normalized config does not parse: {d}")))?;
    let normalized = nodes
        .first()
        .map(to_json)
        .unwrap_or_else(|| json!({ "namespaces": [] }));
    Ok((normalized, warnings))
}

/// The namespaces of a normalized document.
pub fn namespaces_of(doc: &Value) -> Vec<NamespaceDoc> {
    let list = doc.get("namespaces").and_then(Value::as_array);
    list.map(|list| {
        list.iter()
            .map(|ns| {
                let flag = |k: &str| ns.get(k).and_then(Value::as_bool).unwrap_or(false);
                NamespaceDoc {
                    name: ns
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    flags: NamespaceFlags {
                        ignore_configured: flag("ignore_configured"),
                        allow_unconfigured: flag("allow_unconfigured"),
                    },
                    resources: ns
                        .get("resources")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                }
            })
            .collect()
    })
    .unwrap_or_default()
}

/// A resource checked and normalized, in its two forms.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    /// What the API stores and answers: the normalized resource whose
    /// domain overrides hold only what they change (see [`stored_form`]).
    pub stored: Value,
    /// What a limiting server enforces: every override resolved against
    /// the resource, as the file loader resolves it.
    pub resolved: Value,
    /// The normalization's warnings.
    pub warnings: Vec<String>,
}

/// An imported namespace: its stored resources, and the same resolved
/// (in the same order).
pub type Imported = (NamespaceDoc, Vec<Value>);

/// A config text to import (YAML or JSON, tollgate's format), checked as
/// [`load_text`] does: its namespaces, each with its stored resources
/// ([`stored_form`] of what the text says) and the same resources
/// resolved, and the warnings.
pub fn import(text: &str) -> Result<(Vec<Imported>, Vec<String>), ApiError> {
    let (doc, warnings) = load_text("import", text)?;
    // The text as written, for the fields each override gives: it loaded,
    // so it parses.
    // Every document of the text: a multi-document YAML file spreads its
    // namespaces over several.
    let raw: Vec<Value> = tollgate_config::yaml::parse("import", text)
        .map(|nodes| nodes.iter().map(to_json).collect())
        .unwrap_or_default();
    let named = |list: Option<&Value>, name: &str| -> Option<Value> {
        list.and_then(Value::as_array)?
            .iter()
            .find(|x| x.get("name").and_then(Value::as_str) == Some(name))
            .cloned()
    };
    let namespaces = namespaces_of(&doc)
        .into_iter()
        .map(|ns| {
            let raw_ns = raw
                .iter()
                .find_map(|d| named(d.get("namespaces"), &ns.name));
            let resolved = ns.resources.clone();
            let stored = ns
                .resources
                .iter()
                .map(|r| {
                    let name = r.get("name").and_then(Value::as_str).unwrap_or_default();
                    match named(raw_ns.as_ref().and_then(|n| n.get("resources")), name) {
                        Some(given) => stored_form(&given, r),
                        None => r.clone(),
                    }
                })
                .collect();
            (
                NamespaceDoc {
                    resources: stored,
                    ..ns
                },
                resolved,
            )
        })
        .collect();
    Ok((namespaces, warnings))
}

/// Checks one resource of namespace `ns`: its stored and resolved forms
/// and the warnings. `name` (from the path) wins over the body's; a
/// different name in the body is refused.
pub fn resource(
    ns: &str,
    flags: NamespaceFlags,
    name: &str,
    body: &Value,
) -> Result<Resource, ApiError> {
    let (resolved, warnings) = resolved(ns, flags, name, body)?;
    Ok(Resource {
        stored: stored_form(body, &resolved),
        resolved,
        warnings,
    })
}

/// The stored form of a resource given as `raw` and normalized (resolved)
/// as `resolved`: the resolved resource, except that each domain override
/// that refines (has no `algorithm`, config.md §3.7) keeps only the fields
/// `raw` gave it, with the values it gave (they passed validation), so it
/// goes on inheriting the rest from the resource when the resource
/// changes. Not the resolved values: those may be clamped by the
/// resource (an override's limit lowered to the resource's global
/// limit), and a clamped value stored would stay low when the resource's
/// limit is raised, where a file's override would rise with it. An override that
/// replaces (names its `algorithm`) inherits nothing and is kept whole, as
/// resolved. Overrides stored by earlier versions, complete with their
/// `algorithm`, are such replacing overrides: still valid, they resolve to
/// what they did, and do not inherit until written again without
/// `algorithm`.
pub fn stored_form(raw: &Value, resolved: &Value) -> Value {
    let mut stored = resolved.clone();
    let (Some(given), Some(Value::Object(domains))) = (
        raw.get("domains").and_then(Value::as_object),
        stored.get_mut("domains"),
    ) else {
        return stored;
    };
    for (domain, full) in domains.iter_mut() {
        let Some(Value::Object(fields)) = given.get(domain) else {
            continue;
        };
        if fields.contains_key("algorithm") {
            continue;
        }
        *full = Value::Object(fields.clone());
    }
    stored
}

/// The resource normalized by the loader, overrides resolved, and the
/// warnings.
fn resolved(
    ns: &str,
    flags: NamespaceFlags,
    name: &str,
    body: &Value,
) -> Result<(Value, Vec<String>), ApiError> {
    let Value::Object(fields) = body else {
        return Err(ApiError::malformed("a resource is a JSON object"));
    };
    match fields.get("name") {
        None => {}
        Some(Value::String(n)) if n == name => {}
        Some(other) => {
            return Err(ApiError::malformed(format!(
                "the body names resource {other}, the path {name:?}"
            )))
        }
    }
    if let Some(Value::Object(domains)) = fields.get("domains") {
        if let Some(long) = domains.keys().find(|d| d.len() > MAX_NAME_BYTES) {
            let mut start = 40;
            while !long.is_char_boundary(start) {
                start -= 1;
            }
            return Err(ApiError::invalid(format!(
                "domain override {:?}... is {} bytes long; a domain is at most {MAX_NAME_BYTES} bytes",
                &long[..start],
                long.len()
            )));
        }
    }
    let mut fields = fields.clone();
    fields.insert("name".to_owned(), Value::String(name.to_owned()));
    let doc = document(&[NamespaceDoc {
        name: ns.to_owned(),
        flags,
        resources: vec![Value::Object(fields)],
    }]);
    let (normalized, warnings) = load(&format!("{ns}/{name}"), &doc)?;
    let body = normalized
        .pointer("/namespaces/0/resources/0")
        .cloned()
        .ok_or_else(|| ApiError::invalid("the resource vanished in normalization"))?;
    Ok((body, warnings))
}

/// Checks a namespace's name and flags alone.
pub fn namespace(ns: &str, flags: NamespaceFlags) -> Result<Vec<String>, ApiError> {
    let doc = document(&[NamespaceDoc {
        name: ns.to_owned(),
        flags,
        resources: Vec::new(),
    }]);
    load(ns, &doc).map(|(_, w)| w)
}

/// A stored document (JSON) as block YAML that tollgate's loader reads
/// back to the same values: what `GET /v1/export` writes, so refining
/// overrides stay as stored (they would be written out whole by the
/// loader's own emitter, which resolves them). `name` comes first in
/// each map, the rest in the map's order.
pub fn to_yaml(doc: &Value) -> String {
    let mut out = String::new();
    match doc {
        Value::Object(map) if !map.is_empty() => yaml_map(map, 0, &mut out),
        other => {
            out.push_str(&yaml_inline(other));
            out.push('\n');
        }
    }
    out
}

/// A scalar, or an empty collection, on one line.
fn yaml_inline(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => tollgate_config::emit::scalar(s),
        Value::Array(_) => "[]".to_owned(),
        Value::Object(_) => "{}".to_owned(),
    }
}

fn is_nested(v: &Value) -> bool {
    match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        _ => false,
    }
}

fn yaml_map(map: &Map<String, Value>, indent: usize, out: &mut String) {
    let named = map.get_key_value("name");
    let rest = map.iter().filter(|(k, _)| k.as_str() != "name");
    for (i, (k, v)) in named.into_iter().chain(rest).enumerate() {
        // The first key of a sequence item follows its `- `.
        if !(i == 0 && out.ends_with("- ")) {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str(&tollgate_config::emit::scalar(k));
        out.push(':');
        yaml_value(v, indent, out);
    }
}

/// What follows `key:` at `indent`.
fn yaml_value(v: &Value, indent: usize, out: &mut String) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            yaml_map(m, indent + 2, out);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            for item in items {
                out.push_str(&" ".repeat(indent + 2));
                out.push_str("- ");
                match item {
                    Value::Object(m) if is_nested(item) => yaml_map(m, indent + 4, out),
                    Value::Array(_) if is_nested(item) => {
                        // Not in tollgate's format; written as JSON flow,
                        // which is YAML too.
                        out.push_str(&item.to_string());
                        out.push('\n');
                    }
                    other => {
                        out.push_str(&yaml_inline(other));
                        out.push('\n');
                    }
                }
            }
        }
        other => {
            out.push(' ');
            out.push_str(&yaml_inline(other));
            out.push('\n');
        }
    }
}

/// A YAML node as JSON (the loader's output read back).
pub fn to_json(node: &Node) -> Value {
    match &node.kind {
        Kind::Null => Value::Null,
        Kind::Bool(b) => Value::Bool(*b),
        Kind::Int(i) => json!(i),
        Kind::Float(f) => json!(f),
        Kind::Str(s) => Value::String(s.clone()),
        Kind::Seq(items) => Value::Array(items.iter().map(to_json).collect()),
        Kind::Map(pairs) => {
            let mut map = Map::new();
            for (k, v) in pairs {
                let key = match &k.kind {
                    Kind::Str(s) => s.clone(),
                    _ => match to_json(k) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    },
                };
                map.insert(key, to_json(v));
            }
            Value::Object(map)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_is_normalized_as_the_file_loader_does() {
        let body = json!({"algorithm": "token_bucket", "capacity": 100, "rate": "10/s"});
        let r = resource("shop", NamespaceFlags::default(), "api", &body).unwrap();
        assert_eq!(r.stored, r.resolved, "no overrides: one form");
        assert_eq!(r.stored["name"], "api");
        assert_eq!(r.stored["rate"], "10/1s");
        assert!(r.warnings.is_empty());
        // Charon §4.1: a copy limit above the global limit is lowered, with
        // a warning.
        let body = json!({"kind": "concurrency", "domain_limit": 50, "global_limit": 10});
        let r = resource("shop", NamespaceFlags::default(), "db", &body).unwrap();
        assert_eq!(r.stored["domain_limit"], 10);
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    }

    /// Issue 18 item 3: `max_debt` and `report` are kept, and refused where
    /// the file loader refuses them.
    #[test]
    fn usage_fields_are_stored_and_checked_as_in_a_file() {
        let body = json!({"algorithm": "gcra", "rate": "10/s", "burst": 5, "max_debt": 20, "report": true});
        let r = resource("llm", NamespaceFlags::default(), "tokens", &body).unwrap();
        assert_eq!(
            (&r.stored["max_debt"], &r.stored["report"]),
            (&json!(20), &json!(true))
        );
        let body = json!({"algorithm": "smooth_bursty", "rate": "5/s", "report": true});
        assert!(resource("llm", NamespaceFlags::default(), "calls", &body).is_err());
    }

    /// Issue 18: a resource with a `limits:` list goes through the API as
    /// through a file: normalized, named, and its overrides refining one
    /// limit by name stored as written, so they go on inheriting the rest.
    #[test]
    fn a_limits_list_is_normalized_and_its_overrides_refine_by_name() {
        let body = json!({
            "limits": [
                {"name": "burst", "algorithm": "token_bucket", "capacity": 20, "rate": "10/s"},
                {"name": "daily", "algorithm": "fixed_window", "limit": 1000, "window": "1d"},
            ],
            "domains": {"acme": {"limits": [{"name": "daily", "limit": 5000}]}},
        });
        let r = resource("shop", NamespaceFlags::default(), "api", &body).unwrap();
        assert_eq!(r.resolved["limits"][0]["rate"], "10/1s", "{}", r.resolved);
        assert_eq!(r.resolved["limits"][1]["align"], "epoch");
        assert_eq!(
            r.stored["domains"]["acme"],
            json!({"limits": [{"name": "daily", "limit": 5000}]})
        );
        let acme = &r.resolved["domains"]["acme"]["limits"];
        assert_eq!(acme[0]["capacity"], 20, "{}", r.resolved);
        assert_eq!(acme[1]["limit"], 5000);
        // A name that is not the resource's is refused, naming it.
        let bad = json!({
            "limits": [{"name": "burst", "algorithm": "gcra", "rate": "1/s"}],
            "domains": {"acme": {"limits": [{"name": "dayly", "limit": 5}]}},
        });
        let err = resource("shop", NamespaceFlags::default(), "api", &bad).unwrap_err();
        assert!(
            err.to_string()
                .contains("the resource has no limit called `dayly`"),
            "{err}"
        );
    }

    /// Issue 22: an override was stored with every inherited field written
    /// out, so raising the resource's rate left it at the old one.
    #[test]
    fn a_refining_override_stores_what_it_changes_and_resolves_the_rest() {
        let flags = NamespaceFlags::default();
        let body = json!({
            "algorithm": "token_bucket", "capacity": 100, "rate": "10/s",
            "domains": {
                "bigcorp": {"capacity": 1000},
                "other": {"algorithm": "gcra", "rate": "5/s"},
            },
        });
        let r = resource("shop", flags, "api", &body).unwrap();
        assert_eq!(r.stored["domains"]["bigcorp"], json!({"capacity": 1000}));
        assert_eq!(r.resolved["domains"]["bigcorp"]["rate"], "10/1s");
        assert_eq!(
            r.resolved["domains"]["bigcorp"]["algorithm"],
            "token_bucket"
        );
        // A replacing override is whole in both forms.
        assert_eq!(r.stored["domains"]["other"], r.resolved["domains"]["other"]);
        assert_eq!(r.stored["domains"]["other"]["algorithm"], "gcra");

        // The stored form written back with a new rate: the override
        // follows it.
        let mut raised = r.stored.clone();
        raised["rate"] = json!("20/s");
        let r2 = resource("shop", flags, "api", &raised).unwrap();
        assert_eq!(r2.resolved["domains"]["bigcorp"]["rate"], "20/1s");
        assert_eq!(r2.resolved["domains"]["bigcorp"]["capacity"], 1000);
        assert_eq!(r2.stored["domains"]["bigcorp"], json!({"capacity": 1000}));
        assert_eq!(r2.resolved["domains"]["other"]["rate"], "5/1s");

        // A value is stored as given (it was validated), resolved
        // normalized.
        let body = json!({"algorithm": "gcra", "rate": "10/s", "burst": 5,
                          "domains": {"acme": {"rate": "100/m"}}});
        let r = resource("shop", flags, "login", &body).unwrap();
        assert_eq!(r.stored["domains"]["acme"], json!({"rate": "100/m"}));
        assert_eq!(r.resolved["domains"]["acme"]["burst"], 5);
    }

    /// Review M1: an override's value clamped by its resource (a copy
    /// limit lowered to the global limit) was stored clamped, so raising
    /// the resource's global limit left the override at the old value,
    /// where a file's override rises with it.
    #[test]
    fn a_clamped_override_value_is_stored_as_given_and_rises_with_its_resource() {
        let flags = NamespaceFlags::default();
        let body = json!({"kind": "concurrency", "domain_limit": 5, "global_limit": 10,
                          "domains": {"acme": {"domain_limit": 50}}});
        let r = resource("shop", flags, "db", &body).unwrap();
        assert_eq!(r.resolved["domains"]["acme"]["domain_limit"], 10, "{r:?}");
        assert_eq!(r.stored["domains"]["acme"], json!({"domain_limit": 50}));
        let mut raised = r.stored.clone();
        raised["global_limit"] = json!(100);
        let r2 = resource("shop", flags, "db", &raised).unwrap();
        assert_eq!(r2.resolved["domains"]["acme"]["domain_limit"], 50, "{r2:?}");
    }

    /// Review M2: an import read the overrides as written from the first
    /// YAML document only, so a namespace in a later document had its
    /// refining overrides stored whole (frozen).
    #[test]
    fn an_import_finds_overrides_in_every_document() {
        let text = "namespaces:\n  - name: a\n    resources:\n      \
                    - { name: r, algorithm: token_bucket, capacity: 10, rate: 1/s }\n\
                    ---\n\
                    namespaces:\n  - name: b\n    resources:\n      \
                    - name: r\n        algorithm: token_bucket\n        capacity: 10\n        rate: 1/s\n        \
                    domains:\n          acme: { capacity: 99 }\n";
        let (namespaces, _) = import(text).unwrap();
        let b = namespaces.iter().find(|(ns, _)| ns.name == "b").unwrap();
        assert_eq!(b.0.resources[0]["domains"]["acme"], json!({"capacity": 99}));
        assert_eq!(b.1[0]["domains"]["acme"]["rate"], "1/1s");
    }

    /// Review M3: the export wrote the resolved view, so a backup
    /// imported again froze every override. The stored document written
    /// as YAML loads back to the same stored and resolved forms.
    #[test]
    fn the_stored_document_as_yaml_imports_to_the_same_forms() {
        let flags = NamespaceFlags::default();
        let body = json!({
            "algorithm": "token_bucket", "capacity": 100, "rate": "10/s",
            "domains": {
                "big corp": {"capacity": 1000},
                "true": {"algorithm": "gcra", "rate": "5/s", "burst": 2},
            },
        });
        let r = resource("shop-1", flags, "api", &body).unwrap();
        let doc = document(&[
            NamespaceDoc {
                name: "shop-1".into(),
                flags: NamespaceFlags {
                    ignore_configured: true,
                    allow_unconfigured: false,
                },
                resources: vec![r.stored.clone()],
            },
            NamespaceDoc {
                name: "empty".into(),
                flags,
                resources: vec![],
            },
        ]);
        let yaml = to_yaml(&doc);
        assert!(
            yaml.starts_with("namespaces:\n  - name: shop-1\n"),
            "{yaml}"
        );
        let (namespaces, _) = import(&yaml).unwrap_or_else(|e| panic!("{e:?}\n{yaml}"));
        let shop = namespaces.iter().find(|(n, _)| n.name == "shop-1").unwrap();
        assert!(shop.0.flags.ignore_configured);
        assert_eq!(shop.0.resources, vec![r.stored.clone()], "{yaml}");
        assert_eq!(shop.1, vec![r.resolved.clone()]);
        assert!(namespaces.iter().any(|(n, _)| n.name == "empty"));
    }

    #[test]
    fn invalid_resources_are_refused_with_the_loaders_message() {
        let body = json!({"algorithm": "token_bucket", "capacity": 100, "rat": "10/s"});
        let e = resource("shop", NamespaceFlags::default(), "api", &body).unwrap_err();
        assert_eq!(e.reason, "invalid_config");
        assert!(e.message.contains("rat"), "{}", e.message);
        let e = resource(
            "shop",
            NamespaceFlags::default(),
            "api",
            &json!({"name": "x"}),
        )
        .unwrap_err();
        assert_eq!(e.reason, "malformed_request");
        let e = resource("shop", NamespaceFlags::default(), "api", &json!([1])).unwrap_err();
        assert_eq!(e.reason, "malformed_request");
    }

    /// Issue 18, calendar windows: the API stores a calendar window as the
    /// loader writes it (the zone as the database spells it), refuses an
    /// unknown zone with the loader's message, and an export imports back
    /// to the same forms.
    #[test]
    fn a_calendar_window_is_normalized_refused_and_round_trips() {
        let flags = NamespaceFlags::default();
        let body = json!({
            "algorithm": "fixed_window", "limit": 1000, "window": "1mo",
            "align": "calendar", "timezone": "europe/paris",
            "domains": {"acme": {"limit": 5000}},
        });
        let r = resource("shop", flags, "quota", &body).unwrap();
        assert_eq!(r.stored["window"], "1mo");
        assert_eq!(r.stored["align"], "calendar");
        assert_eq!(r.stored["timezone"], "Europe/Paris");
        assert_eq!(r.resolved["domains"]["acme"]["timezone"], "Europe/Paris");
        let doc = document(&[NamespaceDoc {
            name: "shop".into(),
            flags,
            resources: vec![r.stored.clone()],
        }]);
        let yaml = to_yaml(&doc);
        let (namespaces, _) = import(&yaml).unwrap_or_else(|e| panic!("{e:?}\n{yaml}"));
        assert_eq!(namespaces[0].0.resources, vec![r.stored.clone()], "{yaml}");
        assert_eq!(namespaces[0].1, vec![r.resolved.clone()]);

        let bad = json!({
            "algorithm": "fixed_window", "limit": 1, "window": "1mo",
            "align": "calendar", "timezone": "Mars/Olympus_Mons",
        });
        let e = resource("shop", flags, "quota", &bad).unwrap_err();
        assert_eq!(e.reason, "invalid_config");
        assert!(
            e.message.contains("`timezone`") && e.message.contains("Mars/Olympus_Mons"),
            "{}",
            e.message
        );
    }
}
