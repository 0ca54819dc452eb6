//! The API's namespaces as a following server knows them: the deltas
//! applied one after the other, and the whole written out as a config
//! text the server loads.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::normalize::{document, NamespaceDoc, NamespaceFlags};
use crate::protocol::Delta;

/// The API's config as a following server has it: the part of its config
/// that came from the API, as a config text (JSON, which the YAML loader
/// reads), and the API's revision it stands for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigText {
    /// The API's revision.
    pub revision: i64,
    /// The namespaces, in tollgate's config format.
    pub text: String,
}

/// A delta the follower cannot apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadDelta {
    /// A resource's body has no `name`.
    #[error("a resource without a name in the delta")]
    ResourceWithoutName,
}

/// The API's namespaces as this server knows them: each namespace's flags
/// and its resources' resolved bodies, by name.
#[derive(Clone, Debug, Default)]
pub struct FollowedConfig {
    /// The database the copy came from (see [`Delta::instance`]).
    pub(crate) instance: Option<String>,
    pub(crate) revision: i64,
    namespaces: BTreeMap<String, (NamespaceFlags, BTreeMap<String, Value>)>,
}

impl FollowedConfig {
    /// The API's revision it stands for (0: nothing yet).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Applies a delta: deletions first, then what changed. A delta from
    /// revision 0 replaces everything.
    pub fn apply(&mut self, delta: &Delta) -> Result<(), BadDelta> {
        // Everything from scratch: nothing of the old copy survives (a
        // namespace deleted while this server was away has no tombstone it
        // could still see).
        if delta.since == 0 {
            self.namespaces.clear();
        }
        for d in &delta.deleted {
            match &d.resource {
                Some(r) => {
                    if let Some((_, resources)) = self.namespaces.get_mut(&d.namespace) {
                        resources.remove(r);
                    }
                }
                None => {
                    self.namespaces.remove(&d.namespace);
                }
            }
        }
        for n in &delta.namespaces {
            self.namespaces.entry(n.name.clone()).or_default().0 = n.flags;
        }
        for r in &delta.resources {
            let Some(name) = r.body.get("name").and_then(Value::as_str) else {
                return Err(BadDelta::ResourceWithoutName);
            };
            self.namespaces
                .entry(r.namespace.clone())
                .or_default()
                .1
                .insert(name.to_owned(), r.body.clone());
        }
        self.revision = delta.revision;
        self.instance = Some(delta.instance.clone());
        Ok(())
    }

    /// The copy as a config text.
    pub fn text(&self) -> ConfigText {
        let docs: Vec<NamespaceDoc> = self
            .namespaces
            .iter()
            .map(|(name, (flags, resources))| NamespaceDoc {
                name: name.clone(),
                flags: *flags,
                resources: resources.values().cloned().collect(),
            })
            .collect();
        ConfigText {
            revision: self.revision,
            text: document(&docs).to_string(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn delta(value: Value) -> Delta {
        serde_json::from_value(value).unwrap()
    }

    /// The namespaces of a config text, as the loader would read them.
    fn namespaces(copy: &FollowedConfig) -> Value {
        let text: Value = serde_json::from_str(&copy.text().text).unwrap();
        text["namespaces"].clone()
    }

    #[test]
    fn deltas_apply_deletions_first_and_a_delta_from_zero_starts_over() {
        let mut copy = FollowedConfig::default();
        copy.apply(&delta(json!({
            "instance": "db1", "revision": 3, "since": 0,
            "namespaces": [
                {"name": "shop", "allow_unconfigured": true, "flags_revision": 1, "revision": 3},
                {"name": "old", "flags_revision": 2, "revision": 2},
            ],
            "resources": [
                {"namespace": "shop", "body": {"name": "api", "algorithm": "unlimited"}, "revision": 3},
                {"namespace": "shop", "body": {"name": "gone", "algorithm": "unlimited"}, "revision": 3},
            ],
        })))
        .unwrap();
        assert_eq!(copy.revision(), 3);
        assert_eq!(copy.instance.as_deref(), Some("db1"));
        assert_eq!(
            namespaces(&copy),
            json!([
                {"name": "old", "ignore_configured": false, "allow_unconfigured": false, "resources": []},
                {"name": "shop", "ignore_configured": false, "allow_unconfigured": true, "resources": [
                    {"name": "api", "algorithm": "unlimited"},
                    {"name": "gone", "algorithm": "unlimited"},
                ]},
            ])
        );
        // A deletion and a change in one delta: the namespace `old` and
        // the resource `gone` go, `shop/gone` written again after its
        // deletion stays (deletions are applied first).
        copy.apply(&delta(json!({
            "instance": "db1", "revision": 5, "since": 3,
            "deleted": [
                {"namespace": "old", "resource": null},
                {"namespace": "shop", "resource": "api"},
            ],
            "resources": [
                {"namespace": "shop", "body": {"name": "api", "algorithm": "token_bucket"}, "revision": 5},
            ],
        })))
        .unwrap();
        assert_eq!(copy.text().revision, 5);
        assert_eq!(
            namespaces(&copy),
            json!([
                {"name": "shop", "ignore_configured": false, "allow_unconfigured": true, "resources": [
                    {"name": "api", "algorithm": "token_bucket"},
                    {"name": "gone", "algorithm": "unlimited"},
                ]},
            ])
        );
        // From zero again: nothing of the old copy survives.
        copy.apply(&delta(json!({
            "instance": "db2", "revision": 1, "since": 0,
            "namespaces": [{"name": "new", "flags_revision": 1, "revision": 1}],
        })))
        .unwrap();
        assert_eq!(
            namespaces(&copy),
            json!([{"name": "new", "ignore_configured": false, "allow_unconfigured": false, "resources": []}])
        );
        assert_eq!(copy.instance.as_deref(), Some("db2"));
    }

    /// A body without a name cannot be put in a config: the delta is
    /// refused (the follower then fetches everything again) and the
    /// revision does not move.
    #[test]
    fn a_resource_without_a_name_is_a_bad_delta() {
        let mut copy = FollowedConfig::default();
        let bad = delta(json!({
            "instance": "db1", "revision": 2, "since": 0,
            "resources": [{"namespace": "shop", "body": null, "revision": 2}],
        }));
        assert_eq!(copy.apply(&bad), Err(BadDelta::ResourceWithoutName));
        assert_eq!(copy.revision(), 0);
    }
}
