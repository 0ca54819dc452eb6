//! The database: namespaces, resources, tombstones and the audit trail in
//! SQLite or PostgreSQL, through sqlx's `Any` driver so one set of portable
//! queries serves both.
//!
//! Every change is one transaction that starts by bumping the revision
//! (`UPDATE tg_meta ... RETURNING`): that first write takes the database's
//! write lock (SQLite) or the row's lock (PostgreSQL), so concurrent
//! writers are serialized and each change gets its own revision, and a
//! change refused halfway (invalid config, missing namespace) rolls back
//! with nothing written.

use std::sync::Arc;

use serde_json::Value;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Row, Transaction};
use tollgate_core::clock::Clock;

use crate::error::ApiError;
use crate::normalize::{NamespaceDoc, NamespaceFlags};
use crate::precondition::Precondition;
pub use crate::protocol::{
    AuditEntry, Deleted, Delta, NamespaceEntry, ResourceEntry, Snapshot, SnapshotNamespace,
    SnapshotResource,
};

/// The database behind the API.
#[derive(Clone, Debug)]
pub struct Db {
    pool: AnyPool,
    /// PostgreSQL (else SQLite): reads that must see one snapshot ask for
    /// it.
    postgres: bool,
    /// This database's random identity (see [`Delta::instance`]).
    instance: String,
    /// Where the audit trail's times come from (and the API's rate
    /// limit's: [`crate::http::Api`] reads the same clock).
    clock: Arc<dyn Clock>,
}

/// A resource as the database holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// What the API answers: refining domain overrides hold only what
    /// they change ([`crate::normalize::stored_form`]).
    pub body: Value,
    /// What servers enforce: every override resolved.
    pub resolved: Value,
    /// The revision that last changed it.
    pub revision: i64,
}

/// Who changes what, for the audit trail.
#[derive(Clone, Debug)]
pub struct Change<'a> {
    /// The token's name.
    pub actor: &'a str,
    /// The action's name.
    pub action: &'a str,
    /// Its target.
    pub target: String,
}

/// The columns [`namespace_entry`] reads, from `tg_namespaces`.
const NAMESPACE_ROW: &str =
    "SELECT name, ignore_configured, allow_unconfigured, revision, changed FROM tg_namespaces";

/// 128 random bits as hex, from the standard library's randomly keyed
/// hasher (enough to tell two databases apart; not a secret). Each
/// `RandomState` has keys of its own (random per thread, then counted up),
/// so no time is needed to tell two calls apart.
fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let part = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", part(1), part(2))
}

fn flag(b: bool) -> i64 {
    i64::from(b)
}

fn parse_body(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// A row's resolved view: its `resolved` column, or, when that is empty
/// (a row written by an API binary older than the column, sharing the
/// database during a rolling upgrade: its default is ''), resolved here
/// from `body` as a write would (old binaries stored overrides whole, so
/// this is `body` itself unless it fails to load, when it is `body` as
/// stored).
fn resolved_of(ns: &str, name: &str, body: &Value, resolved: &str) -> Value {
    if !resolved.trim().is_empty() {
        return parse_body(resolved);
    }
    crate::normalize::resource(ns, NamespaceFlags::default(), name, body)
        .map(|r| r.resolved)
        .unwrap_or_else(|_| body.clone())
}

fn namespace_entry(row: &AnyRow) -> Result<NamespaceEntry, sqlx::Error> {
    Ok(NamespaceEntry {
        name: row.try_get(0)?,
        flags: NamespaceFlags {
            ignore_configured: row.try_get::<i64, _>(1)? != 0,
            allow_unconfigured: row.try_get::<i64, _>(2)? != 0,
        },
        revision: row.try_get(3)?,
        changed: row.try_get(4)?,
    })
}

impl Db {
    /// Connects to `url` (`sqlite://FILE`, created if missing, or
    /// `postgres://...`) and brings its schema up to date. The audit
    /// trail's times are read from `clock` (the binary passes the
    /// system's; tests a manual one).
    pub async fn connect(url: &str, clock: Arc<dyn Clock>) -> Result<Db, sqlx::Error> {
        sqlx::any::install_default_drivers();
        let url = if url.starts_with("sqlite:") && !url.contains("mode=") {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}mode=rwc")
        } else {
            url.to_owned()
        };
        let pool = AnyPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect(&url)
            .await?;
        migrator().run(&pool).await?;
        sqlx::query("UPDATE tg_meta SET instance = $1 WHERE id = 1 AND instance = ''")
            .bind(random_id())
            .execute(&pool)
            .await?;
        let instance: String = sqlx::query("SELECT instance FROM tg_meta WHERE id = 1")
            .fetch_one(&pool)
            .await?
            .try_get(0)?;
        Ok(Db {
            pool,
            postgres: !url.starts_with("sqlite:"),
            instance,
            clock,
        })
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    /// The current revision.
    pub async fn revision(&self) -> Result<i64, sqlx::Error> {
        sqlx::query("SELECT revision FROM tg_meta WHERE id = 1")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)
    }

    /// A read-only view of one moment: a transaction (repeatable read on
    /// PostgreSQL; SQLite's is serializable already) and the config's
    /// revision as of it. Everything read through it is of that revision.
    async fn snapshot_tx(&self) -> Result<(Transaction<'static, Any>, i64), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        if self.postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *tx)
                .await?;
        }
        let revision: i64 = sqlx::query("SELECT revision FROM tg_meta WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        Ok((tx, revision))
    }

    /// Every namespace, by name, and the config's revision, read in one
    /// transaction (one snapshot), so the revision is never newer than
    /// what was read: an `If-Match` with it cannot cover a change the
    /// caller did not see.
    pub async fn namespaces_at(&self) -> Result<(i64, Vec<NamespaceEntry>), sqlx::Error> {
        let (mut tx, revision) = self.snapshot_tx().await?;
        let sql = format!("{NAMESPACE_ROW} ORDER BY name");
        let rows = sqlx::query(&sql).fetch_all(&mut *tx).await?;
        let namespaces = rows.iter().map(namespace_entry).collect::<Result<_, _>>()?;
        tx.commit().await?;
        Ok((revision, namespaces))
    }

    /// Every namespace, by name.
    pub async fn namespaces(&self) -> Result<Vec<NamespaceEntry>, sqlx::Error> {
        let sql = format!("{NAMESPACE_ROW} ORDER BY name");
        let rows = sqlx::query(&sql).fetch_all(&self.pool).await?;
        rows.iter().map(namespace_entry).collect()
    }

    /// One namespace and its resources (by name), if it exists, with the
    /// revision of its last change (its `ETag`).
    pub async fn namespace(&self, ns: &str) -> Result<Option<(NamespaceDoc, i64)>, sqlx::Error> {
        let sql = format!("{NAMESPACE_ROW} WHERE name = $1");
        let Some(row) = sqlx::query(&sql)
            .bind(ns)
            .fetch_optional(&self.pool)
            .await?
        else {
            return Ok(None);
        };
        let entry = namespace_entry(&row)?;
        let resources =
            sqlx::query("SELECT body FROM tg_resources WHERE namespace = $1 ORDER BY name")
                .bind(ns)
                .fetch_all(&self.pool)
                .await?
                .iter()
                .map(|r| r.try_get::<String, _>(0).map(|b| parse_body(&b)))
                .collect::<Result<Vec<_>, _>>()?;
        Ok(Some((
            NamespaceDoc {
                name: entry.name,
                flags: entry.flags,
                resources,
            },
            entry.changed,
        )))
    }

    /// Every namespace with its resources (the whole config) and its
    /// revision, read in one transaction (one snapshot): a backup is never
    /// torn between two writes, and its `ETag` is the revision of what it
    /// holds (second review of issue 22: the revision and each namespace
    /// were read apart).
    pub async fn all_at(&self) -> Result<(i64, Vec<NamespaceDoc>), sqlx::Error> {
        let (mut tx, revision) = self.snapshot_tx().await?;
        let sql = format!("{NAMESPACE_ROW} ORDER BY name");
        let entries = sqlx::query(&sql)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(namespace_entry)
            .collect::<Result<Vec<_>, _>>()?;
        let mut bodies: std::collections::HashMap<String, Vec<Value>> =
            std::collections::HashMap::new();
        for r in sqlx::query("SELECT namespace, body FROM tg_resources ORDER BY namespace, name")
            .fetch_all(&mut *tx)
            .await?
        {
            let ns: String = r.try_get(0)?;
            let body = parse_body(&r.try_get::<String, _>(1)?);
            bodies.entry(ns).or_default().push(body);
        }
        tx.commit().await?;
        let docs = entries
            .into_iter()
            .map(|e| NamespaceDoc {
                resources: bodies.remove(&e.name).unwrap_or_default(),
                name: e.name,
                flags: e.flags,
            })
            .collect();
        Ok((revision, docs))
    }

    /// One resource, stored and resolved, with the revision that last
    /// changed it (its `ETag`), if it exists.
    pub async fn resource(&self, ns: &str, name: &str) -> Result<Option<Stored>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT body, resolved, revision FROM tg_resources WHERE namespace = $1 AND name = $2",
        )
        .bind(ns)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let body = parse_body(&r.try_get::<String, _>(0)?);
            Ok(Stored {
                resolved: resolved_of(ns, name, &body, &r.try_get::<String, _>(1)?),
                body,
                revision: r.try_get(2)?,
            })
        })
        .transpose()
    }

    /// The revision that deleted `ns` (`name` empty) or `ns/name`, if a
    /// tombstone says so: named in a 412's message.
    async fn deleted_at(
        tx: &mut Transaction<'static, Any>,
        ns: &str,
        name: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        let mut revision: Option<i64> = None;
        for (ns, name) in [(ns, name), (ns, "")] {
            let row =
                sqlx::query("SELECT revision FROM tg_deleted WHERE namespace = $1 AND name = $2")
                    .bind(ns)
                    .bind(name)
                    .fetch_optional(&mut **tx)
                    .await?;
            if let Some(r) = row {
                let r: i64 = r.try_get(0)?;
                revision = Some(revision.map_or(r, |x| x.max(r)));
            }
        }
        Ok(revision)
    }

    /// Marks namespace `ns` changed at `revision` (a change to one of its
    /// resources): its `ETag` moves.
    async fn touch(
        tx: &mut Transaction<'static, Any>,
        ns: &str,
        revision: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE tg_namespaces SET changed = $1 WHERE name = $2")
            .bind(revision)
            .bind(ns)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Opens a change: a transaction holding the next revision.
    async fn begin(&self) -> Result<(Transaction<'static, Any>, i64), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let revision: i64 = sqlx::query(
            "UPDATE tg_meta SET revision = revision + 1 WHERE id = 1 RETURNING revision",
        )
        .fetch_one(&mut *tx)
        .await?
        .try_get(0)?;
        Ok((tx, revision))
    }

    /// The clock the audit trail's times come from.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Now, in Unix milliseconds, by [`Db::clock`].
    fn now_ms(&self) -> i64 {
        i64::try_from(self.clock.now().as_u64() / 1_000_000).unwrap_or(i64::MAX)
    }

    async fn audit_row(
        &self,
        tx: &mut Transaction<'static, Any>,
        revision: i64,
        change: &Change<'_>,
        before: Option<&Value>,
        after: Option<&Value>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO tg_audit (revision, at_ms, actor, action, target, before_json, after_json) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(revision)
        .bind(self.now_ms())
        .bind(change.actor)
        .bind(change.action)
        .bind(&change.target)
        .bind(before.map(Value::to_string))
        .bind(after.map(Value::to_string))
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn namespace_in(
        tx: &mut Transaction<'static, Any>,
        ns: &str,
    ) -> Result<Option<NamespaceEntry>, sqlx::Error> {
        let sql = format!("{NAMESPACE_ROW} WHERE name = $1");
        let row = sqlx::query(&sql).bind(ns).fetch_optional(&mut **tx).await?;
        row.map(|r| namespace_entry(&r)).transpose()
    }

    /// Checks `pre` against namespace `ns` as it is in `tx`.
    async fn check_namespace(
        tx: &mut Transaction<'static, Any>,
        pre: &Precondition,
        ns: &str,
        entry: Option<&NamespaceEntry>,
    ) -> Result<(), ApiError> {
        if *pre == Precondition::None {
            return Ok(());
        }
        let deleted = match entry {
            Some(_) => None,
            None => Self::deleted_at(tx, ns, "").await?,
        };
        pre.check(
            &format!("namespace {ns:?}"),
            entry.map(|e| e.changed),
            deleted,
        )
    }

    /// Creates or changes a namespace's flags, if `pre` holds.
    pub async fn put_namespace(
        &self,
        change: &Change<'_>,
        ns: &str,
        flags: NamespaceFlags,
        pre: &Precondition,
    ) -> Result<i64, ApiError> {
        let (mut tx, revision) = self.begin().await?;
        let entry = Self::namespace_in(&mut tx, ns).await?;
        Self::check_namespace(&mut tx, pre, ns, entry.as_ref()).await?;
        let before = entry.map(|e| e.flags);
        sqlx::query(
            "INSERT INTO tg_namespaces \
             (name, ignore_configured, allow_unconfigured, revision, changed) \
             VALUES ($1, $2, $3, $4, $4) ON CONFLICT (name) DO UPDATE SET \
             ignore_configured = excluded.ignore_configured, \
             allow_unconfigured = excluded.allow_unconfigured, revision = excluded.revision, \
             changed = excluded.changed",
        )
        .bind(ns)
        .bind(flag(flags.ignore_configured))
        .bind(flag(flags.allow_unconfigured))
        .bind(revision)
        .execute(&mut *tx)
        .await?;
        let to_json = |f: &NamespaceFlags| serde_json::to_value(f).unwrap_or(Value::Null);
        self.audit_row(
            &mut tx,
            revision,
            change,
            before.as_ref().map(to_json).as_ref(),
            Some(&to_json(&flags)),
        )
        .await?;
        tx.commit().await?;
        Ok(revision)
    }

    /// Deletes a namespace and its resources, if `pre` holds.
    pub async fn delete_namespace(
        &self,
        change: &Change<'_>,
        ns: &str,
        pre: &Precondition,
    ) -> Result<i64, ApiError> {
        let (mut tx, revision) = self.begin().await?;
        let entry = Self::namespace_in(&mut tx, ns).await?;
        Self::check_namespace(&mut tx, pre, ns, entry.as_ref()).await?;
        let Some(before) = entry.map(|e| e.flags) else {
            return Err(ApiError::not_found(format!("no namespace {ns:?}")));
        };
        sqlx::query("DELETE FROM tg_resources WHERE namespace = $1")
            .bind(ns)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM tg_namespaces WHERE name = $1")
            .bind(ns)
            .execute(&mut *tx)
            .await?;
        Self::tombstone(&mut tx, ns, "", revision).await?;
        let before = serde_json::to_value(before).unwrap_or(Value::Null);
        self.audit_row(&mut tx, revision, change, Some(&before), None)
            .await?;
        tx.commit().await?;
        Ok(revision)
    }

    async fn tombstone(
        tx: &mut Transaction<'static, Any>,
        ns: &str,
        name: &str,
        revision: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO tg_deleted (namespace, name, revision) VALUES ($1, $2, $3) \
             ON CONFLICT (namespace, name) DO UPDATE SET revision = excluded.revision",
        )
        .bind(ns)
        .bind(name)
        .bind(revision)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Changes one resource in one transaction: `edit` gets the namespace's
    /// flags and the resource's current (stored) body (`None` when absent)
    /// and returns the new normalized bodies, stored and resolved (`None`
    /// deletes it), or refuses.
    /// The namespace must exist, and `pre` hold for the resource (the
    /// target of a write to any part of it). Returns the revision and the
    /// new body.
    pub async fn edit_resource(
        &self,
        change: &Change<'_>,
        ns: &str,
        name: &str,
        pre: &Precondition,
        edit: impl FnOnce(NamespaceFlags, Option<&Value>) -> Result<Option<(Value, Value)>, ApiError>,
    ) -> Result<(i64, Option<(Value, Value)>), ApiError> {
        let (mut tx, revision) = self.begin().await?;
        let Some(flags) = Self::namespace_in(&mut tx, ns).await?.map(|e| e.flags) else {
            // Under If-Match a vanished namespace is a vanished resource:
            // 412, and nothing re-created.
            if matches!(pre, Precondition::Revision(_) | Precondition::Exists) {
                let deleted = Self::deleted_at(&mut tx, ns, name).await?;
                pre.check(&format!("resource {ns}/{name}"), None, deleted)?;
            }
            return Err(ApiError::not_found(format!("no namespace {ns:?}")));
        };
        let row = sqlx::query(
            "SELECT body, revision FROM tg_resources WHERE namespace = $1 AND name = $2",
        )
        .bind(ns)
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| -> Result<(Value, i64), sqlx::Error> {
            Ok((parse_body(&r.try_get::<String, _>(0)?), r.try_get(1)?))
        })
        .transpose()?;
        if *pre != Precondition::None {
            let deleted = match row {
                Some(_) => None,
                None => Self::deleted_at(&mut tx, ns, name).await?,
            };
            pre.check(
                &format!("resource {ns}/{name}"),
                row.as_ref().map(|(_, r)| *r),
                deleted,
            )?;
        }
        let before = row.map(|(body, _)| body);
        let after = edit(flags, before.as_ref())?;
        match &after {
            Some((body, resolved)) => {
                sqlx::query(
                    "INSERT INTO tg_resources (namespace, name, body, resolved, revision) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (namespace, name) DO UPDATE SET \
                     body = excluded.body, resolved = excluded.resolved, \
                     revision = excluded.revision",
                )
                .bind(ns)
                .bind(name)
                .bind(body.to_string())
                .bind(resolved.to_string())
                .bind(revision)
                .execute(&mut *tx)
                .await?;
            }
            None => {
                if before.is_none() {
                    return Err(ApiError::not_found(format!("no resource {ns}/{name}")));
                }
                sqlx::query("DELETE FROM tg_resources WHERE namespace = $1 AND name = $2")
                    .bind(ns)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                Self::tombstone(&mut tx, ns, name, revision).await?;
            }
        }
        Self::touch(&mut tx, ns, revision).await?;
        let stored_after = after.as_ref().map(|(body, _)| body);
        self.audit_row(&mut tx, revision, change, before.as_ref(), stored_after)
            .await?;
        tx.commit().await?;
        Ok((revision, after))
    }

    /// Replaces the whole config with `namespaces` (already normalized:
    /// each namespace's stored resources, and the same resources
    /// resolved), in one transaction, if `pre` holds for the config's
    /// revision.
    pub async fn import(
        &self,
        change: &Change<'_>,
        namespaces: &[crate::normalize::Imported],
        pre: &Precondition,
    ) -> Result<i64, ApiError> {
        let (mut tx, revision) = self.begin().await?;
        pre.check("the config", Some(revision - 1), None)?;
        let old: Vec<String> = sqlx::query("SELECT name FROM tg_namespaces")
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        for ns in &old {
            Self::tombstone(&mut tx, ns, "", revision).await?;
        }
        sqlx::query("DELETE FROM tg_resources")
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM tg_namespaces")
            .execute(&mut *tx)
            .await?;
        for (ns, resolved) in namespaces {
            sqlx::query(
                "INSERT INTO tg_namespaces \
                 (name, ignore_configured, allow_unconfigured, revision, changed) \
                 VALUES ($1, $2, $3, $4, $4)",
            )
            .bind(&ns.name)
            .bind(flag(ns.flags.ignore_configured))
            .bind(flag(ns.flags.allow_unconfigured))
            .bind(revision)
            .execute(&mut *tx)
            .await?;
            for (body, resolved) in ns.resources.iter().zip(resolved) {
                let name = body.get("name").and_then(Value::as_str).unwrap_or_default();
                sqlx::query(
                    "INSERT INTO tg_resources (namespace, name, body, resolved, revision) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&ns.name)
                .bind(name)
                .bind(body.to_string())
                .bind(resolved.to_string())
                .bind(revision)
                .execute(&mut *tx)
                .await?;
            }
        }
        let stored: Vec<NamespaceDoc> = namespaces.iter().map(|(ns, _)| ns.clone()).collect();
        let after = crate::normalize::document(&stored);
        self.audit_row(&mut tx, revision, change, None, Some(&after))
            .await?;
        tx.commit().await?;
        Ok(revision)
    }

    /// What changed after `since`, up to the current revision, read from
    /// one snapshot (one transaction; repeatable read on PostgreSQL).
    pub async fn delta(&self, since: i64) -> Result<Delta, sqlx::Error> {
        let (mut tx, revision) = self.snapshot_tx().await?;
        let deleted = sqlx::query(
            "SELECT namespace, name FROM tg_deleted WHERE revision > $1 AND revision <= $2 \
             ORDER BY revision, namespace, name",
        )
        .bind(since)
        .bind(revision)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| {
            let name: String = r.try_get(1)?;
            Ok(Deleted {
                namespace: r.try_get(0)?,
                resource: (!name.is_empty()).then_some(name),
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
        let sql = format!("{NAMESPACE_ROW} WHERE revision > $1 AND revision <= $2 ORDER BY name");
        let namespaces = sqlx::query(&sql)
            .bind(since)
            .bind(revision)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(namespace_entry)
            .collect::<Result<Vec<_>, _>>()?;
        let resources = sqlx::query(
            "SELECT namespace, name, body, resolved, revision FROM tg_resources \
             WHERE revision > $1 AND revision <= $2 ORDER BY namespace, name",
        )
        .bind(since)
        .bind(revision)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| {
            let (ns, name): (String, String) = (r.try_get(0)?, r.try_get(1)?);
            let body = parse_body(&r.try_get::<String, _>(2)?);
            Ok(ResourceEntry {
                body: resolved_of(&ns, &name, &body, &r.try_get::<String, _>(3)?),
                namespace: ns,
                revision: r.try_get(4)?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
        tx.commit().await?;
        Ok(Delta {
            instance: self.instance.clone(),
            revision,
            since,
            deleted,
            namespaces,
            resources,
        })
    }

    /// The whole config, from one snapshot, in parts of at most `limit`
    /// namespaces and `limit` resources, starting after `after` (a
    /// [`Snapshot::next`]).
    pub async fn snapshot(&self, after: Option<&str>, limit: i64) -> Result<Snapshot, sqlx::Error> {
        let limit = limit.max(1);
        let (after_ns, after_res) = match after {
            None => (None, None),
            Some(cursor) => match cursor.split_once('/') {
                Some((ns, r)) => (Some(ns), Some(r)),
                None => (Some(cursor), None),
            },
        };
        let (mut tx, revision) = self.snapshot_tx().await?;
        // Namespaces from `after_ns` (itself again when it was cut within
        // its resources), resources after the cursor.
        let ns_sql = if after_res.is_some() {
            format!("{NAMESPACE_ROW} WHERE name >= $1 ORDER BY name LIMIT $2")
        } else {
            format!("{NAMESPACE_ROW} WHERE name > $1 ORDER BY name LIMIT $2")
        };
        let mut namespaces = sqlx::query(&ns_sql)
            .bind(after_ns.unwrap_or(""))
            .bind(limit + 1)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(namespace_entry)
            .collect::<Result<Vec<_>, _>>()?;
        // (`name > ''` leaves out no namespace: names are never empty.)
        let res_sql = if after_res.is_some() {
            "SELECT namespace, name, body, resolved, revision FROM tg_resources \
             WHERE namespace > $1 OR (namespace = $1 AND name > $2) \
             ORDER BY namespace, name LIMIT $3"
        } else {
            "SELECT namespace, name, body, resolved, revision FROM tg_resources \
             WHERE namespace > $1 AND name > $2 ORDER BY namespace, name LIMIT $3"
        };
        let resources = sqlx::query(res_sql)
            .bind(after_ns.unwrap_or(""))
            .bind(after_res.unwrap_or(""))
            .bind(limit + 1)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| {
                let (ns, name) = (r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?);
                let resource = parse_body(&r.try_get::<String, _>(2)?);
                let resolved = resolved_of(&ns, &name, &resource, &r.try_get::<String, _>(3)?);
                Ok((
                    ns,
                    name,
                    SnapshotResource {
                        resource,
                        resolved,
                        revision: r.try_get(4)?,
                    },
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        tx.commit().await?;
        // Both lists are in the database's order (its collation, which
        // need not be Rust's byte order): cut by position and membership,
        // never by comparing names here.
        let cap = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut next = None;
        if namespaces.len() > cap {
            namespaces.truncate(cap);
            next = namespaces.last().map(|n| n.name.clone());
        }
        let index: std::collections::HashMap<String, usize> = namespaces
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        // Resources of namespaces past the cut come after all others.
        let mut resources: Vec<_> = resources
            .into_iter()
            .filter(|(ns, _, _)| index.contains_key(ns))
            .collect();
        if resources.len() > cap {
            resources.truncate(cap);
            if let Some((ns, r, _)) = resources.last() {
                next = Some(format!("{ns}/{r}"));
                if let Some(&i) = index.get(ns) {
                    namespaces.truncate(i + 1);
                }
            }
        }
        let mut out: Vec<SnapshotNamespace> = namespaces
            .into_iter()
            .map(|entry| SnapshotNamespace {
                entry,
                resources: Vec::new(),
            })
            .collect();
        for (ns, _, resource) in resources {
            // A resource whose namespace row is missing cannot be (one
            // transaction writes both): skipped rather than misplaced.
            if let Some(n) = index.get(&ns).and_then(|&i| out.get_mut(i)) {
                n.resources.push(resource);
            }
        }
        Ok(Snapshot {
            instance: self.instance.clone(),
            revision,
            namespaces: out,
            next,
        })
    }

    /// The audit trail after `since`, at most `limit` rows: the oldest
    /// first, or the newest first (`newest`); only changes to `target` and
    /// what is under it (`shop/api` and `shop/api/domains/acme`), when
    /// given.
    pub async fn audit(
        &self,
        since: i64,
        limit: i64,
        target: Option<&str>,
        newest: bool,
    ) -> Result<Vec<AuditEntry>, sqlx::Error> {
        let order = if newest { "DESC" } else { "ASC" };
        // A prefix compared with substr, not LIKE: `_` is a wildcard there
        // and may be in names.
        let sql = format!(
            "SELECT revision, at_ms, actor, action, target, before_json, after_json FROM tg_audit \
             WHERE revision > $1 AND ($3 = '' OR target = $3 \
               OR substr(target, 1, length($3) + 1) = $3 || '/') \
             ORDER BY revision {order} LIMIT $2"
        );
        let rows = sqlx::query(&sql)
            .bind(since)
            .bind(limit)
            .bind(target.unwrap_or(""))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let json = |i: usize| -> Result<Option<Value>, sqlx::Error> {
                    Ok(r.try_get::<Option<String>, _>(i)?.map(|t| parse_body(&t)))
                };
                Ok(AuditEntry {
                    revision: r.try_get(0)?,
                    at_ms: r.try_get(1)?,
                    actor: r.try_get(2)?,
                    action: r.try_get(3)?,
                    target: r.try_get(4)?,
                    before: json(5)?,
                    after: json(6)?,
                })
            })
            .collect()
    }
}

/// The schema's migrations, embedded in the binary.
///
/// Built at run time from `include_str!` rather than by `sqlx::migrate!`:
/// the macro needs sqlx's `macros` feature, which compiles sqlx and a
/// second SQLite (C) for the build host and cost the first build about a
/// minute. Versions, descriptions and checksums are what the macro would
/// produce (the checksum is the SHA-384 of the SQL), so databases migrated
/// by earlier builds are recognised.
fn migrator() -> sqlx::migrate::Migrator {
    migrator_upto(usize::MAX)
}

/// The first `n` migrations (tests make databases of earlier versions).
fn migrator_upto(n: usize) -> sqlx::migrate::Migrator {
    use sqlx::migrate::{Migration, MigrationType, Migrator};
    use std::borrow::Cow;
    const FILES: [(i64, &str, &str); 4] = [
        (
            20261123000001,
            "config",
            include_str!("../migrations/20261123000001_config.sql"),
        ),
        (
            20261123000002,
            "instance",
            include_str!("../migrations/20261123000002_instance.sql"),
        ),
        (
            20261126000001,
            "changed",
            include_str!("../migrations/20261126000001_changed.sql"),
        ),
        (
            20261126000002,
            "resolved",
            include_str!("../migrations/20261126000002_resolved.sql"),
        ),
    ];
    let migrations = FILES
        .iter()
        .take(n)
        .map(|&(version, description, sql)| {
            Migration::new(
                version,
                Cow::Borrowed(description),
                MigrationType::Simple,
                Cow::Borrowed(sql),
                sql.starts_with("-- no-transaction"),
            )
        })
        .collect::<Vec<_>>();
    Migrator {
        migrations: Cow::Owned(migrations),
        ..Migrator::DEFAULT
    }
}

#[cfg(test)]
mod migration_tests {
    /// Every file in `migrations/` is embedded, with the version,
    /// description and SQL that `sqlx::migrate!` would have read from it;
    /// a new file that is not added to `migrator()` fails here.
    #[test]
    fn embedded_migrations_match_the_directory() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or("a migration file name is not UTF-8")?
                .to_owned();
            let (version, rest) = name.split_once('_').ok_or("no version prefix")?;
            let description = rest.trim_end_matches(".sql").replace('_', " ");
            files.push((
                version.parse::<i64>()?,
                description,
                std::fs::read_to_string(&path)?,
            ));
        }
        files.sort();
        let embedded: Vec<(i64, String, String)> = super::migrator()
            .migrations
            .iter()
            .map(|m| (m.version, m.description.to_string(), m.sql.to_string()))
            .collect();
        assert_eq!(embedded, files);
        Ok(())
    }
}

#[cfg(test)]
mod upgrade_tests {
    use super::*;

    /// Issue 22: overrides stored before `resolved` existed were written
    /// out whole (`algorithm` included). They are replacing overrides,
    /// still valid: after the migration they resolve to what they stored,
    /// and a resource written again makes refining ones inherit.
    #[tokio::test]
    async fn overrides_stored_before_the_migration_resolve_to_what_they_stored(
    ) -> Result<(), Box<dyn std::error::Error>> {
        sqlx::any::install_default_drivers();
        let path = std::env::temp_dir().join(format!("tg-upgrade-{}.db", random_id()));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let old = r#"{"algorithm":"token_bucket","capacity":100,"name":"api","rate":"10/1s",
            "domains":{"big":{"algorithm":"token_bucket","capacity":1000,"rate":"10/1s"}}}"#;
        {
            let pool = AnyPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await?;
            migrator_upto(3).run(&pool).await?;
            sqlx::query("INSERT INTO tg_namespaces (name, ignore_configured, allow_unconfigured, revision, changed) VALUES ('shop', 0, 0, 1, 2)")
                .execute(&pool)
                .await?;
            sqlx::query("INSERT INTO tg_resources (namespace, name, body, revision) VALUES ('shop', 'api', $1, 2)")
                .bind(old)
                .execute(&pool)
                .await?;
            sqlx::query("UPDATE tg_meta SET revision = 2")
                .execute(&pool)
                .await?;
            pool.close().await;
        }
        let db = Db::connect(&url, Arc::new(tollgate_core::SystemClock)).await?;
        let stored = db
            .resource("shop", "api")
            .await?
            .ok_or("the resource is gone")?;
        let old: Value = serde_json::from_str(old)?;
        assert_eq!((&stored.body, &stored.resolved), (&old, &old));
        let delta = db.delta(0).await?;
        assert_eq!(delta.resources[0].body, old);
        drop(db);
        let _ = std::fs::remove_file(&path);
        Ok(())
    }

    /// Review M4: an API binary older than the `resolved` column, on the
    /// same database during a rolling upgrade, inserts rows with
    /// `resolved = ''` (the column's default). Deltas carried `null` for
    /// them and following servers stopped ("a resource without a name in
    /// the delta"). They are resolved on read.
    #[tokio::test]
    async fn a_row_an_older_binary_wrote_without_resolved_is_resolved_on_read(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let path = std::env::temp_dir().join(format!("tg-rolling-{}.db", random_id()));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let db = Db::connect(&url, Arc::new(tollgate_core::SystemClock)).await?;
        let body = r#"{"algorithm":"token_bucket","capacity":100,"name":"api","rate":"10/1s",
            "domains":{"big":{"algorithm":"token_bucket","capacity":1000,"rate":"10/1s"}}}"#;
        // What the older binary's insert amounts to: no `resolved`.
        sqlx::query("INSERT INTO tg_namespaces (name, ignore_configured, allow_unconfigured, revision, changed) VALUES ('shop', 0, 0, 1, 1)")
            .execute(&db.pool)
            .await?;
        sqlx::query("INSERT INTO tg_resources (namespace, name, body, revision) VALUES ('shop', 'api', $1, 1)")
            .bind(body)
            .execute(&db.pool)
            .await?;
        sqlx::query("UPDATE tg_meta SET revision = 1")
            .execute(&db.pool)
            .await?;
        let body: Value = serde_json::from_str(body)?;
        let stored = db.resource("shop", "api").await?.ok_or("gone")?;
        assert_eq!(stored.resolved, body);
        let delta = db.delta(0).await?;
        assert_eq!(delta.resources[0].body["name"], "api");
        assert_eq!(delta.resources[0].body, body);
        let snapshot = db.snapshot(None, 10).await?;
        let dump = format!("{snapshot:?}");
        assert!(!dump.contains("resolved: Null"), "{dump}");
        drop(db);
        let _ = std::fs::remove_file(&path);
        Ok(())
    }
}

#[cfg(test)]
mod clock_tests {
    use std::time::Duration;

    use tollgate_core::{ManualClock, Nanos};

    use super::*;

    /// The audit trail's times are the database's clock's: a change made
    /// at a time set by hand is recorded at that time, to the millisecond
    /// (they were read from the wall clock, which no test could check).
    #[tokio::test]
    async fn audit_times_come_from_the_injected_clock() -> Result<(), Box<dyn std::error::Error>> {
        let path = std::env::temp_dir().join(format!("tg-clock-{}.db", random_id()));
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let clock = Arc::new(ManualClock::new(Nanos::new(1_700_000_000_123_456_789)));
        let db = Db::connect(&url, clock.clone()).await?;
        let change = |action| Change {
            actor: "alice",
            action,
            target: "shop".into(),
        };
        let flags = NamespaceFlags::default();
        db.put_namespace(&change("put_namespace"), "shop", flags, &Precondition::None)
            .await?;
        clock.advance(Duration::from_millis(2_500));
        let flags = NamespaceFlags {
            allow_unconfigured: true,
            ..flags
        };
        db.put_namespace(&change("put_namespace"), "shop", flags, &Precondition::None)
            .await?;
        let times: Vec<i64> = db
            .audit(0, 10, None, false)
            .await?
            .iter()
            .map(|e| e.at_ms)
            .collect();
        assert_eq!(times, [1_700_000_000_123, 1_700_000_002_623]);
        drop(db);
        let _ = std::fs::remove_file(&path);
        Ok(())
    }
}
