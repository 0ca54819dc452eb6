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

/// Where the server's token for the API comes from: named in the
/// messages of a refusal, and read again after one (a fixed file is taken
/// without a restart).
#[derive(Clone, Debug)]
pub enum TokenSource {
    /// `--config-api-token-file`.
    File(PathBuf),
    /// `TOLLGATE_CONFIG_API_TOKEN`.
    Env,
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::File(path) => write!(f, "--config-api-token-file {}", path.display()),
            TokenSource::Env => f.write_str("TOLLGATE_CONFIG_API_TOKEN"),
        }
    }
}

impl TokenSource {
    /// The token it holds: the text, surrounding whitespace (a final
    /// newline) ignored. An empty one, or one of several lines, is refused
    /// here rather than sent and refused by the API.
    pub fn read(&self) -> Result<String> {
        let text = match self {
            TokenSource::File(path) => {
                let bytes = std::fs::read(path)
                    .with_context(|| format!("cannot read --config-api-token-file {}", path.display()))?;
                String::from_utf8(bytes).with_context(|| format!("{self} is not UTF-8"))?
            }
            TokenSource::Env => std::env::var("TOLLGATE_CONFIG_API_TOKEN").map_err(|_| {
                anyhow::anyhow!(
                    "--config-api needs a token: --config-api-token-file or TOLLGATE_CONFIG_API_TOKEN"
                )
            })?,
        };
        let token = text.trim();
        if token.is_empty() {
            bail!("{self} is empty: {TOKEN_FORMAT}");
        }
        if token.chars().any(char::is_control) {
            bail!("{self} holds more than one line: {TOKEN_FORMAT}");
        }
        Ok(token.to_owned())
    }
}

/// What the server's token is, for messages about a wrong one.
const TOKEN_FORMAT: &str = "it must hold a `read` token of the config API alone \
    (the TOKEN of a `read:NAME:TOKEN` line of the API's tokens file)";

/// The API refused the server's token (401, or 403): waiting does not
/// help, a token does.
#[derive(Debug)]
pub struct TokenRefused {
    base: String,
    source: TokenSource,
    status: reqwest::StatusCode,
    /// The API's message, when it sent its error shape.
    message: String,
    /// The token looks like a whole line of the tokens file.
    whole_line: bool,
}

impl std::fmt::Display for TokenRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the config API at {} refused the token in {} ({}: {}); {TOKEN_FORMAT}",
            self.base, self.source, self.status, self.message
        )?;
        if self.whole_line {
            f.write_str("; it holds a whole `ROLE:NAME:TOKEN` line: keep only the TOKEN part")?;
        }
        Ok(())
    }
}

impl std::error::Error for TokenRefused {}

/// How to reach the API.
pub struct Follower {
    http: reqwest::Client,
    base: String,
    token: String,
    token_source: TokenSource,
    poll: Duration,
    view: View,
}

/// Why a fetch failed, for the log while following: a new kind of failure
/// is logged at once, the same one again every 20 failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trouble {
    /// No answer (connection refused, timed out, TLS failed).
    Unreachable,
    /// 401 or 403: the token.
    Refused,
    /// Another error status, or an answer that is not a delta.
    BadAnswer,
}

impl Follower {
    /// A follower of the API at `base` (`http://` or `https://`), with
    /// the token of `token_source` (a `read` token), trusting `ca` (PEM)
    /// for TLS if given.
    pub fn new(
        base: &str,
        token_source: TokenSource,
        ca: Option<&PathBuf>,
        poll: Duration,
    ) -> Result<Follower> {
        let token = token_source.read()?;
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
            token_source,
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
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| text.chars().take(200).collect());
            let whole_line = ["read:", "admin:"]
                .iter()
                .any(|role| self.token.starts_with(role));
            return Err(TokenRefused {
                base: self.base.clone(),
                source: self.token_source.clone(),
                status,
                message,
                whole_line,
            }
            .into());
        }
        if !status.is_success() {
            bail!("the config API answered {status}: {text}");
        }
        serde_json::from_str(&text).context("the config API's answer is not JSON")
    }

    /// After a refusal: reads the token again, so a fixed token file is
    /// taken without a restart. Says so when the token changed.
    fn reread_token(&mut self) {
        match self.token_source.read() {
            Ok(token) if token != self.token => {
                tracing::info!(token = %self.token_source, "read a new config API token");
                self.token = token;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = ?format!("{e:#}"), "cannot read the config API token again")
            }
        }
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
        let mut last_trouble = None;
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
                    let trouble = if e.downcast_ref::<TokenRefused>().is_some() {
                        Trouble::Refused
                    } else if e.downcast_ref::<reqwest::Error>().is_some() {
                        Trouble::Unreachable
                    } else {
                        Trouble::BadAnswer
                    };
                    if last_trouble != Some(trouble) || failures % 20 == 0 {
                        let error = format!("{e:#}");
                        let in_force = self.view.revision;
                        match trouble {
                            Trouble::Refused => {
                                tracing::error!(error = ?error, api_revision = in_force, "the config API refused this server's token; keeping the config in force, and reading the token again before each retry")
                            }
                            Trouble::Unreachable => {
                                tracing::warn!(error = ?error, api_revision = in_force, "config API unreachable; keeping the config in force")
                            }
                            Trouble::BadAnswer => {
                                tracing::warn!(error = ?error, api_revision = in_force, "the config API answered with an error; keeping the config in force")
                            }
                        }
                    }
                    last_trouble = Some(trouble);
                    if trouble == Trouble::Refused {
                        self.reread_token();
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
                last_trouble = None;
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
