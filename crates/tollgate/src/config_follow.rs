//! `serve --config-api URL`: the server keeps a view of the configuration
//! API's namespaces and follows its revisions (Charon §4.1).
//!
//! It long-polls `GET /v1/config/wait?since=REV`: the API answers as soon as
//! a change is committed (so a change is in force within moments, the
//! "refresh on demand"), or after the poll interval with nothing new. Each
//! answer is a delta (deletions first, then what changed), applied to the
//! view; the whole view is then loaded with the config file (if any) and
//! put in force, so limits whose parameters did not change keep their
//! state. While the API is unreachable the server keeps serving the config
//! it has, and retries with backoff.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tokio::sync::watch;
use tollgate_configapi::normalize::{document, NamespaceDoc, NamespaceFlags};
use tollgate_server::app::{ApiPart, App};
use tollgate_store::Store;

/// The API's namespaces as this server knows them.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The database the view came from (see the API's `instance`).
    instance: Option<String>,
    revision: i64,
    namespaces: BTreeMap<String, (NamespaceFlags, BTreeMap<String, Value>)>,
}

impl View {
    /// Applies a delta (`GET /v1/config` JSON).
    fn apply(&mut self, delta: &Value) -> Result<()> {
        let Some(revision) = delta.get("revision").and_then(Value::as_i64) else {
            bail!("a delta without a revision");
        };
        // Everything from scratch: nothing of the old view survives (a
        // namespace deleted while this server was away has no tombstone it
        // could still see).
        if delta.get("since").and_then(Value::as_i64) == Some(0) {
            self.namespaces.clear();
        }
        let list = |k: &str| {
            delta
                .get(k)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        for d in list("deleted") {
            let ns = d
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match d.get("resource").and_then(Value::as_str) {
                Some(r) => {
                    if let Some((_, resources)) = self.namespaces.get_mut(ns) {
                        resources.remove(r);
                    }
                }
                None => {
                    self.namespaces.remove(ns);
                }
            }
        }
        for n in list("namespaces") {
            let name = n
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let flag = |k: &str| n.get(k).and_then(Value::as_bool).unwrap_or(false);
            let flags = NamespaceFlags {
                ignore_configured: flag("ignore_configured"),
                allow_unconfigured: flag("allow_unconfigured"),
            };
            self.namespaces.entry(name).or_default().0 = flags;
        }
        for r in list("resources") {
            let ns = r
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let body = r.get("body").cloned().unwrap_or(Value::Null);
            let Some(name) = body.get("name").and_then(Value::as_str).map(str::to_owned) else {
                bail!("a resource without a name in the delta");
            };
            self.namespaces
                .entry(ns.to_owned())
                .or_default()
                .1
                .insert(name, body);
        }
        self.revision = revision;
        self.instance = delta
            .get("instance")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(())
    }

    /// The view as a config text.
    fn part(&self) -> ApiPart {
        let docs: Vec<NamespaceDoc> = self
            .namespaces
            .iter()
            .map(|(name, (flags, resources))| NamespaceDoc {
                name: name.clone(),
                flags: *flags,
                resources: resources.values().cloned().collect(),
            })
            .collect();
        ApiPart {
            revision: self.revision,
            text: document(&docs).to_string(),
        }
    }
}

/// How to reach the API.
pub struct Follower {
    http: reqwest::Client,
    base: String,
    token: String,
    poll: Duration,
    view: View,
}

impl Follower {
    /// A follower of the API at `base` (`http://` or `https://`), with
    /// `token` (a `read` token), trusting `ca` (PEM) for TLS if given.
    pub fn new(
        base: &str,
        token: String,
        ca: Option<&PathBuf>,
        poll: Duration,
    ) -> Result<Follower> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(poll + Duration::from_secs(30));
        if let Some(ca) = ca {
            let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
            let cert = reqwest::Certificate::from_pem(&pem).context("the config API's CA")?;
            builder = builder.add_root_certificate(cert);
        }
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--config-api must be an http:// or https:// URL, not {base:?}");
        }
        Ok(Follower {
            http: builder
                .build()
                .context("cannot build the config API client")?,
            base: base.trim_end_matches('/').to_owned(),
            token,
            poll,
            view: View::default(),
        })
    }

    /// Fetches the delta after the view's revision; `wait` long-polls.
    async fn fetch(&self, wait: bool) -> Result<Value> {
        let since = self.view.revision;
        let url = if wait {
            format!(
                "{}/v1/config/wait?since={since}&timeout_ms={}",
                self.base,
                self.poll.as_millis()
            )
        } else {
            format!("{}/v1/config?since={since}", self.base)
        };
        let resp = self
            .http
            .get(&url)
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("cannot reach the config API at {}", self.base))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .context("reading the config API's answer")?;
        if !status.is_success() {
            bail!("the config API answered {status}: {text}");
        }
        serde_json::from_str(&text).context("the config API's answer is not JSON")
    }

    /// Gets the whole config now (at startup): the part to start with.
    pub async fn first(&mut self) -> Result<ApiPart> {
        let delta = self.fetch(false).await?;
        self.view.apply(&delta)?;
        Ok(self.view.part())
    }

    /// Follows the API until `stop`, putting each new revision in force.
    pub async fn run<S: Store>(
        mut self,
        app: Arc<App<S>>,
        file: Option<PathBuf>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut failures = 0u32;
        // The view was reset and must be put in force even if its revision
        // is the one it had.
        let mut reset = false;
        loop {
            let fetched = tokio::select! {
                r = self.fetch(true) => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            let delta = match fetched {
                Ok(d) => d,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let wait = Duration::from_millis(100u64 << failures.min(6))
                        .min(Duration::from_secs(5));
                    if failures == 1 || failures % 20 == 0 {
                        tracing::warn!(error = ?format!("{e:#}"), "config API unreachable; keeping the config in force");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                    continue;
                }
            };
            if failures > 0 {
                tracing::info!("config API reachable again");
                failures = 0;
            }
            let before = self.view.revision;
            // Another database (replaced, restored) or one that went back
            // in time: its deltas no longer describe changes to this view.
            // Start over from everything.
            let instance = delta.get("instance").and_then(Value::as_str);
            let other = self.view.instance.is_some() && instance != self.view.instance.as_deref();
            let behind = delta
                .get("revision")
                .and_then(Value::as_i64)
                .is_some_and(|r| r < before);
            if other || behind {
                tracing::warn!(api_revision = ?delta.get("revision"), view_revision = before, "the config API's database changed or went back; fetching everything again");
                self.view = View::default();
                reset = true;
                continue;
            }
            if let Err(e) = self.view.apply(&delta) {
                tracing::error!(error = ?e.to_string(), "a bad delta from the config API; fetching everything again");
                self.view = View::default();
                reset = true;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                continue;
            }
            if self.view.revision == before && !reset {
                continue;
            }
            reset = false;
            match app.install_parts(file.as_deref(), Some(self.view.part())) {
                Ok(local) => tracing::info!(
                    api_revision = self.view.revision,
                    revision = local,
                    "config API revision in force"
                ),
                Err(e) => {
                    tracing::error!(api_revision = self.view.revision, error = ?e.to_string(), "config API revision refused; the previous config keeps serving")
                }
            }
        }
    }
}
