//! The config API's wire types: what `GET /v1/config` (a [`Delta`]),
//! `GET /v1/snapshot` (a [`Snapshot`]) and `GET /v1/audit` (a list of
//! [`AuditEntry`]) answer, as JSON, and the error shape ([`ErrorAnswer`]).
//!
//! The API writes them ([`crate::store`] reads them from the database);
//! the follower of a limiting server ([`crate::client`], behind the
//! `client` feature) and the web page read them. Both directions derive
//! from the same structs, so the shape is stated once; the tests below pin
//! it, field by field, as it has been served.
//!
//! Reading is lenient where a newer API may add: unknown fields are
//! ignored, so an older follower keeps following an API that answers more.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::normalize::NamespaceFlags;

/// The changes since a revision: what a limiting server applies to its view.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Delta {
    /// The database's identity: a follower whose view came from another
    /// database (replaced, restored) must start over from `since=0`.
    pub instance: String,
    /// The revision the delta brings the caller to.
    pub revision: i64,
    /// The revision it starts from.
    pub since: i64,
    /// Namespaces deleted since (with all their resources), and resources
    /// deleted since: apply these first. (A missing list reads as empty,
    /// here and below.)
    #[serde(default)]
    pub deleted: Vec<Deleted>,
    /// Namespaces created or changed since (flags only).
    #[serde(default)]
    pub namespaces: Vec<NamespaceEntry>,
    /// Resources created or changed since, whole and resolved (domain
    /// overrides complete): what a server enforces.
    #[serde(default)]
    pub resources: Vec<ResourceEntry>,
}

/// A deletion.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Deleted {
    /// The namespace.
    pub namespace: String,
    /// The resource, or `None` for the whole namespace.
    pub resource: Option<String>,
}

/// A namespace's flags, as listed.
///
/// Served as one flat object (`name`, the flags, `flags_revision`,
/// `revision`). It is read back through a flat struct of its own, not a
/// derive: [`NamespaceFlags`] refuses unknown fields (a `PUT` body with a
/// misspelt flag must fail), and serde cannot flatten such a struct into a
/// reader, where every other key of the object is unknown to it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct NamespaceEntry {
    /// Its name.
    pub name: String,
    /// Its flags.
    #[serde(flatten)]
    pub flags: NamespaceFlags,
    /// The revision that last changed its flags (`flags_revision`).
    #[serde(rename = "flags_revision")]
    pub revision: i64,
    /// The revision that last changed it or any of its resources: its
    /// `ETag` (see [`crate::precondition`]), answered as `revision`, as
    /// `GET /v1/namespaces/{ns}` answers it, so either can be sent as
    /// `If-Match`.
    #[serde(rename = "revision")]
    pub changed: i64,
}

/// How a [`NamespaceEntry`] is read: its object, flat, with the flags
/// that a missing key leaves off (as `PUT` does).
#[derive(Deserialize)]
struct NamespaceEntryWire {
    name: String,
    #[serde(default)]
    ignore_configured: bool,
    #[serde(default)]
    allow_unconfigured: bool,
    flags_revision: i64,
    revision: i64,
}

impl<'de> Deserialize<'de> for NamespaceEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NamespaceEntry, D::Error> {
        let w = NamespaceEntryWire::deserialize(d)?;
        Ok(NamespaceEntry {
            name: w.name,
            flags: NamespaceFlags {
                ignore_configured: w.ignore_configured,
                allow_unconfigured: w.allow_unconfigured,
            },
            revision: w.flags_revision,
            changed: w.revision,
        })
    }
}

/// A resource, as listed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResourceEntry {
    /// Its namespace.
    pub namespace: String,
    /// Its normalized body, overrides resolved.
    pub body: Value,
    /// The revision that last changed it.
    pub revision: i64,
}

/// One change in the audit trail.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct AuditEntry {
    /// The revision the change made.
    pub revision: i64,
    /// When (Unix ms).
    pub at_ms: i64,
    /// Who: the token's name.
    pub actor: String,
    /// What: `put_namespace`, `delete_resource`, `put_domain`, `import`, ...
    pub action: String,
    /// On what: `namespace` or `namespace/resource[/...]`.
    pub target: String,
    /// Before and after (JSON), when there was something.
    pub before: Option<Value>,
    /// After the change.
    pub after: Option<Value>,
}

/// A part of the whole config, read from one snapshot: what the web
/// page loads in one request instead of one per namespace.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Snapshot {
    /// The database's identity (see [`Delta::instance`]).
    pub instance: String,
    /// The config's revision when it was read.
    pub revision: i64,
    /// The namespaces, by name, each with its resources (by name).
    pub namespaces: Vec<SnapshotNamespace>,
    /// Where the next part starts (`after=` this), when this one ended at
    /// its bound: `NS` (namespaces up to NS are complete) or `NS/R`
    /// (namespace NS is complete up to its resource R, and comes again in
    /// the next part with the rest).
    pub next: Option<String>,
}

/// A namespace in a [`Snapshot`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SnapshotNamespace {
    /// Its name, flags and revisions.
    #[serde(flatten)]
    pub entry: NamespaceEntry,
    /// Its resources (in this part).
    pub resources: Vec<SnapshotResource>,
}

/// A resource in a [`Snapshot`], as `GET` answers it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SnapshotResource {
    /// The revision that last changed it (its `ETag`).
    pub revision: i64,
    /// As stored.
    pub resource: Value,
    /// Resolved.
    pub resolved: Value,
}

/// An error answer's body: `{"error": {"reason", "message"}}`, with the
/// target's state as `current` for a `412` (added by
/// [`crate::ApiError`]'s response, and ignored here).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ErrorAnswer {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong, in an [`ErrorAnswer`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ErrorDetail {
    /// Machine-readable: `invalid_config`, `not_found`, `unauthorized`, ...
    pub reason: String,
    /// For people.
    pub message: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn entry() -> NamespaceEntry {
        NamespaceEntry {
            name: "shop".into(),
            flags: NamespaceFlags {
                ignore_configured: false,
                allow_unconfigured: true,
            },
            revision: 3,
            changed: 7,
        }
    }

    /// The shape served before `Deserialize` was derived, pinned: the web
    /// page and older followers read these keys.
    #[test]
    fn a_delta_keeps_the_shape_it_was_served_in() {
        let delta = Delta {
            instance: "abc".into(),
            revision: 7,
            since: 2,
            deleted: vec![
                Deleted {
                    namespace: "old".into(),
                    resource: None,
                },
                Deleted {
                    namespace: "shop".into(),
                    resource: Some("gone".into()),
                },
            ],
            namespaces: vec![entry()],
            resources: vec![ResourceEntry {
                namespace: "shop".into(),
                body: json!({"name": "api", "algorithm": "unlimited"}),
                revision: 6,
            }],
        };
        let served = json!({
            "instance": "abc",
            "revision": 7,
            "since": 2,
            "deleted": [
                {"namespace": "old", "resource": null},
                {"namespace": "shop", "resource": "gone"},
            ],
            "namespaces": [{
                "name": "shop",
                "ignore_configured": false,
                "allow_unconfigured": true,
                "flags_revision": 3,
                "revision": 7,
            }],
            "resources": [{
                "namespace": "shop",
                "body": {"name": "api", "algorithm": "unlimited"},
                "revision": 6,
            }],
        });
        assert_eq!(serde_json::to_value(&delta).unwrap(), served);
        assert_eq!(serde_json::from_value::<Delta>(served).unwrap(), delta);
    }

    #[test]
    fn a_snapshot_keeps_the_shape_it_was_served_in() {
        let snapshot = Snapshot {
            instance: "abc".into(),
            revision: 7,
            namespaces: vec![SnapshotNamespace {
                entry: entry(),
                resources: vec![SnapshotResource {
                    revision: 6,
                    resource: json!({"name": "api"}),
                    resolved: json!({"name": "api", "algorithm": "unlimited"}),
                }],
            }],
            next: Some("shop/api".into()),
        };
        let served = json!({
            "instance": "abc",
            "revision": 7,
            "namespaces": [{
                "name": "shop",
                "ignore_configured": false,
                "allow_unconfigured": true,
                "flags_revision": 3,
                "revision": 7,
                "resources": [{
                    "revision": 6,
                    "resource": {"name": "api"},
                    "resolved": {"name": "api", "algorithm": "unlimited"},
                }],
            }],
            "next": "shop/api",
        });
        assert_eq!(serde_json::to_value(&snapshot).unwrap(), served);
        assert_eq!(
            serde_json::from_value::<Snapshot>(served).unwrap(),
            snapshot
        );
    }

    /// Unknown keys (a newer API's) are ignored; missing flags are off and
    /// missing lists empty; a missing revision is refused, naming it.
    #[test]
    fn reading_is_lenient_where_an_api_may_add_and_strict_where_it_must_say() {
        let delta: Delta = serde_json::from_value(json!({
            "instance": "abc", "revision": 4, "since": 0, "added_later": [1],
            "namespaces": [{"name": "shop", "flags_revision": 1, "revision": 4, "color": "red"}],
        }))
        .unwrap();
        assert_eq!(delta.namespaces[0].flags, NamespaceFlags::default());
        assert!(delta.deleted.is_empty() && delta.resources.is_empty());
        let e = serde_json::from_value::<Delta>(json!({"instance": "abc", "since": 0}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`revision`"), "{e}");
    }

    #[test]
    fn an_error_answer_keeps_its_shape() {
        let served = json!({"error": {"reason": "unauthorized", "message": "no"}});
        let answer: ErrorAnswer = serde_json::from_value(served.clone()).unwrap();
        assert_eq!(answer.error.reason, "unauthorized");
        assert_eq!(serde_json::to_value(&answer).unwrap(), served);
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9_.-]{1,12}"
    }

    /// Resource bodies: objects of names, numbers, strings and flags (no
    /// `null`: an `Option<Value>` holding `null` reads back as `None`).
    fn body() -> impl Strategy<Value = Value> {
        prop::collection::btree_map(
            name(),
            prop_oneof![
                any::<i64>().prop_map(Value::from),
                any::<bool>().prop_map(Value::from),
                name().prop_map(Value::from),
            ],
            0..4,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    fn namespace_entry() -> impl Strategy<Value = NamespaceEntry> {
        (
            name(),
            any::<bool>(),
            any::<bool>(),
            any::<i64>(),
            any::<i64>(),
        )
            .prop_map(
                |(name, ignore_configured, allow_unconfigured, revision, changed)| NamespaceEntry {
                    name,
                    flags: NamespaceFlags {
                        ignore_configured,
                        allow_unconfigured,
                    },
                    revision,
                    changed,
                },
            )
    }

    fn delta() -> impl Strategy<Value = Delta> {
        (
            name(),
            any::<i64>(),
            any::<i64>(),
            prop::collection::vec(
                (name(), prop::option::of(name())).prop_map(|(namespace, resource)| Deleted {
                    namespace,
                    resource,
                }),
                0..4,
            ),
            prop::collection::vec(namespace_entry(), 0..4),
            prop::collection::vec(
                (name(), body(), any::<i64>()).prop_map(|(namespace, body, revision)| {
                    ResourceEntry {
                        namespace,
                        body,
                        revision,
                    }
                }),
                0..4,
            ),
        )
            .prop_map(
                |(instance, revision, since, deleted, namespaces, resources)| Delta {
                    instance,
                    revision,
                    since,
                    deleted,
                    namespaces,
                    resources,
                },
            )
    }

    fn snapshot() -> impl Strategy<Value = Snapshot> {
        let resource = (any::<i64>(), body(), body()).prop_map(|(revision, resource, resolved)| {
            SnapshotResource {
                revision,
                resource,
                resolved,
            }
        });
        let namespace = (namespace_entry(), prop::collection::vec(resource, 0..3))
            .prop_map(|(entry, resources)| SnapshotNamespace { entry, resources });
        (
            name(),
            any::<i64>(),
            prop::collection::vec(namespace, 0..3),
            prop::option::of(name()),
        )
            .prop_map(|(instance, revision, namespaces, next)| Snapshot {
                instance,
                revision,
                namespaces,
                next,
            })
    }

    fn audit_entry() -> impl Strategy<Value = AuditEntry> {
        (
            any::<i64>(),
            any::<i64>(),
            name(),
            name(),
            name(),
            prop::option::of(body()),
            prop::option::of(body()),
        )
            .prop_map(|(revision, at_ms, actor, action, target, before, after)| {
                AuditEntry {
                    revision,
                    at_ms,
                    actor,
                    action,
                    target,
                    before,
                    after,
                }
            })
    }

    proptest! {
        /// What the API writes, a follower reads back as it was.
        #[test]
        fn deltas_read_back_as_written(d in delta()) {
            let text = serde_json::to_string(&d).unwrap();
            prop_assert_eq!(serde_json::from_str::<Delta>(&text).unwrap(), d);
        }

        #[test]
        fn snapshots_read_back_as_written(s in snapshot()) {
            let text = serde_json::to_string(&s).unwrap();
            prop_assert_eq!(serde_json::from_str::<Snapshot>(&text).unwrap(), s);
        }

        #[test]
        fn audit_entries_read_back_as_written(a in prop::collection::vec(audit_entry(), 0..4)) {
            let text = serde_json::to_string(&a).unwrap();
            prop_assert_eq!(serde_json::from_str::<Vec<AuditEntry>>(&text).unwrap(), a);
        }
    }
}
