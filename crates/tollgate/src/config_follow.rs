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

use crate::cmd::serve::read_flag_file;

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
            TokenSource::Env => f.write_str(TOKEN_VARIABLE),
        }
    }
}

/// The variable a token may come from.
const TOKEN_VARIABLE: &str = "TOLLGATE_CONFIG_API_TOKEN";

impl TokenSource {
    /// The token it holds: the text, surrounding whitespace (a final
    /// newline) ignored. An empty one, one of several lines, or one with
    /// another control character is refused here rather than sent and
    /// refused by the API. No message quotes the token.
    pub fn read(&self) -> Result<String> {
        let text = match self {
            TokenSource::File(path) => {
                let bytes = read_flag_file("--config-api-token-file", path)?;
                String::from_utf8(bytes).with_context(|| format!("{self} is not valid UTF-8"))?
            }
            TokenSource::Env => match std::env::var(TOKEN_VARIABLE) {
                Ok(text) => text,
                Err(std::env::VarError::NotPresent) => {
                    bail!("--config-api needs a token: --config-api-token-file or {TOKEN_VARIABLE}")
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    bail!("{self} is not valid UTF-8: {TOKEN_FORMAT}")
                }
            },
        };
        let token = text.trim();
        if token.is_empty() {
            bail!("{self} is empty: {TOKEN_FORMAT}");
        }
        if token.contains(['\n', '\r']) {
            bail!("{self} holds several lines: {TOKEN_FORMAT}");
        }
        if let Some(c) = token.chars().find(|c| c.is_control()) {
            bail!(
                "{self} holds the control character U+{:04X}: {TOKEN_FORMAT}",
                u32::from(c)
            );
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
    /// The API's URL as shown (without a user or password).
    shown: String,
    source: TokenSource,
    status: reqwest::StatusCode,
    /// The API's message (its error shape's), or the start of its body,
    /// as [`Follower::shown_answer`] makes it.
    message: String,
    /// The token looks like a whole line of the tokens file.
    whole_line: bool,
}

impl std::fmt::Display for TokenRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the config API at {} refused the token in {} ({}: {}); {TOKEN_FORMAT}",
            self.shown, self.source, self.status, self.message
        )?;
        if self.whole_line {
            f.write_str("; it holds a whole `ROLE:NAME:TOKEN` line: keep only the TOKEN part")?;
        }
        Ok(())
    }
}

impl std::error::Error for TokenRefused {}

/// The API answered with another error status than a refused token's.
#[derive(Debug)]
struct Answered {
    status: reqwest::StatusCode,
    /// Its body, as [`Follower::shown_answer`] makes it.
    message: String,
}

impl std::fmt::Display for Answered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the config API answered {}: {}",
            self.status, self.message
        )
    }
}

impl std::error::Error for Answered {}

/// How to reach the API.
pub struct Follower {
    http: reqwest::Client,
    base: String,
    /// `base` as messages and logs show it: without a user or password.
    shown: String,
    token: String,
    token_source: TokenSource,
    poll: Duration,
    view: View,
    throttle: Throttle,
}

/// Why a fetch failed, for the log while following.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trouble {
    /// No answer (connection refused, timed out, TLS failed).
    Unreachable,
    /// 401 or 403: the token; or a 429 right after one (the API's rate
    /// limit puts every unknown token in one bucket, so a refused token
    /// meets it too, and it says nothing new of the token).
    Refused,
    /// Another error status, or an answer that is not a delta.
    BadAnswer,
}

/// A kind of trouble is logged the first time it happens after a
/// success, then every this many times.
const LOG_EVERY: u32 = 20;

/// What the follower says of its failures, so an outage or a refused
/// token makes a few log lines, not one per retry. Each kind of trouble
/// is counted on its own since the last success, so two kinds that
/// alternate (a refused token and the rate limit, an API restarting)
/// are each logged the first time and every [`LOG_EVERY`] times. It
/// only counts: the caller logs.
#[derive(Debug, Default)]
struct Throttle {
    /// Failures of each kind since the last success, by `Trouble as usize`.
    counts: [u32; 3],
    /// The last trouble since the last success.
    last: Option<Trouble>,
    /// The last refusal's message: what a 429 that counts as a refusal
    /// logs.
    refusal: Option<String>,
    /// The last error reading the token again, logged when it changes.
    read_error: Option<String>,
}

impl Throttle {
    /// The kind of trouble `e` is.
    fn classify(&self, e: &anyhow::Error) -> Trouble {
        let rate_limited = e
            .downcast_ref::<Answered>()
            .is_some_and(|a| a.status == reqwest::StatusCode::TOO_MANY_REQUESTS);
        if e.downcast_ref::<TokenRefused>().is_some()
            || (rate_limited && self.last == Some(Trouble::Refused))
        {
            Trouble::Refused
        } else if e.downcast_ref::<reqwest::Error>().is_some() {
            Trouble::Unreachable
        } else {
            Trouble::BadAnswer
        }
    }

    /// Counts a failure `e` of kind `trouble`: the text to log (for a
    /// refusal, the refusal's, also after a 429), if this one is logged.
    fn failed(&mut self, trouble: Trouble, e: &anyhow::Error) -> Option<String> {
        let error = format!("{e:#}");
        if e.downcast_ref::<TokenRefused>().is_some() {
            self.refusal = Some(error.clone());
        }
        self.last = Some(trouble);
        let n = &mut self.counts[trouble as usize];
        *n = n.saturating_add(1);
        if *n != 1 && *n % LOG_EVERY != 0 {
            return None;
        }
        match (trouble, &self.refusal) {
            (Trouble::Refused, Some(refusal)) => Some(refusal.clone()),
            _ => Some(error),
        }
    }

    /// Reading the token again failed with `error`: whether to log it (a
    /// new error, or `loud`: the refusal is logged now too).
    fn read_failed(&mut self, error: String, loud: bool) -> bool {
        let new = self.read_error.as_ref() != Some(&error);
        self.read_error = Some(error);
        new || loud
    }

    /// A fetch succeeded: whether the token had been refused since the
    /// last success. Every count starts again.
    fn recovered(&mut self) -> bool {
        let refused = self.counts[Trouble::Refused as usize] > 0;
        *self = Throttle::default();
        refused
    }
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
        let shown = tollgate_redis::conn::redact(base.trim_end_matches('/'));
        let url = reqwest::Url::parse(base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"));
        let Some(url) = url else {
            bail!("--config-api must be an http:// or https:// URL, not {shown:?}");
        };
        // reqwest would send them as a second `Authorization` header,
        // beside the token's; the API reads one, and would refuse.
        if !url.username().is_empty() || url.password().is_some() {
            bail!(
                "--config-api {shown}: the URL holds a user or password, which the config API \
                 does not take; remove `USER:PASSWORD@` (the server's credential is the read \
                 token, in --config-api-token-file or {TOKEN_VARIABLE})"
            );
        }
        let token = token_source.read()?;
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(poll + Duration::from_secs(30));
        if let Some(ca) = ca {
            let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
            let cert = reqwest::Certificate::from_pem(&pem).context("the config API's CA")?;
            builder = builder.add_root_certificate(cert);
        }
        Ok(Follower {
            http: builder
                .build()
                .context("cannot build the config API client")?,
            base: base.trim_end_matches('/').to_owned(),
            shown,
            token,
            token_source,
            poll,
            view: View::default(),
            throttle: Throttle::default(),
        })
    }

    /// The API's URL as messages and logs show it (no user or password).
    pub fn shown_url(&self) -> &str {
        &self.shown
    }

    /// What the API (or a proxy before it) answered, fit for a message:
    /// the token replaced with `<token>` (a proxy that echoes the request
    /// would otherwise put it in the log), on one line, and bounded.
    fn shown_answer(&self, text: &str) -> String {
        let text = text.replace(&self.token, "<token>");
        let line: String = text
            .trim()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        tollgate_server::errors::bounded(line)
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
            .with_context(|| format!("cannot reach the config API at {}", self.shown))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .context("reading the config API's answer")?;
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or(text);
            let whole_line = ["read:", "admin:"]
                .iter()
                .any(|role| self.token.starts_with(role));
            return Err(TokenRefused {
                shown: self.shown.clone(),
                source: self.token_source.clone(),
                status,
                message: self.shown_answer(&message),
                whole_line,
            }
            .into());
        }
        if !status.is_success() {
            return Err(Answered {
                status,
                message: self.shown_answer(&text),
            }
            .into());
        }
        serde_json::from_str(&text).context("the config API's answer is not JSON")
    }

    /// After a refusal: reads the token file again, so a fixed one is
    /// taken without a restart (a variable cannot change: nothing to do).
    /// Says so when the token changed; a failure to read is logged when
    /// it differs from the last one, or when `loud` (the refusal is
    /// logged now too), not at every retry.
    fn reread_token(&mut self, loud: bool) -> Option<String> {
        if matches!(self.token_source, TokenSource::Env) {
            return None;
        }
        match self.token_source.read() {
            Ok(token) => {
                self.throttle.read_error = None;
                if token != self.token {
                    tracing::info!(token_source = %self.token_source, "read a new config API token");
                    self.token = token;
                }
                None
            }
            Err(e) => {
                let error = format!("{e:#}");
                self.throttle
                    .read_failed(error.clone(), loud)
                    .then_some(error)
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
                    let trouble = self.throttle.classify(&e);
                    let logged = self.throttle.failed(trouble, &e);
                    let in_force = self.view.revision;
                    match (&logged, trouble, &self.token_source) {
                        (None, _, _) => {}
                        (Some(error), Trouble::Refused, TokenSource::File(_)) => {
                            tracing::error!(error = ?error, api_revision = in_force, "the config API refused this server's token; keeping the config in force, and reading the token file again before each retry")
                        }
                        (Some(error), Trouble::Refused, TokenSource::Env) => {
                            tracing::error!(error = ?error, api_revision = in_force, "the config API refused this server's token; keeping the config in force and retrying (TOLLGATE_CONFIG_API_TOKEN is read at start only: a new token needs a restart)")
                        }
                        (Some(error), Trouble::Unreachable, _) => {
                            tracing::warn!(error = ?error, api_revision = in_force, "config API unreachable; keeping the config in force")
                        }
                        (Some(error), Trouble::BadAnswer, _) => {
                            tracing::warn!(error = ?error, api_revision = in_force, "the config API answered with an error; keeping the config in force")
                        }
                    }
                    if trouble == Trouble::Refused {
                        if let Some(error) = self.reread_token(logged.is_some()) {
                            tracing::warn!(error = ?error, token_source = %self.token_source, "cannot read the config API token again")
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                    continue;
                }
            };
            if failures > 0 {
                failures = 0;
                if self.throttle.recovered() {
                    tracing::info!("the config API accepted this server's token again");
                } else {
                    tracing::info!("config API reachable again");
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of its own under the system's temporary directory.
    fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tollgate-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn follower(token_file: &std::path::Path) -> Follower {
        Follower::new(
            "http://127.0.0.1:1",
            TokenSource::File(token_file.to_path_buf()),
            None,
            Duration::from_secs(1),
        )
        .unwrap()
    }

    fn refused(f: &Follower) -> anyhow::Error {
        TokenRefused {
            shown: f.shown.clone(),
            source: f.token_source.clone(),
            status: reqwest::StatusCode::UNAUTHORIZED,
            message: "the bearer token is not known".into(),
            whole_line: false,
        }
        .into()
    }

    fn answered(status: u16) -> anyhow::Error {
        Answered {
            status: reqwest::StatusCode::from_u16(status).unwrap(),
            message: "too many requests; retry in 20 ms".into(),
        }
        .into()
    }

    /// Review of issue 23: the API's rate limit puts unknown tokens in
    /// one bucket, so a refused token's retries alternate 401 and 429,
    /// and a change of kind logged every one of them. A 429 after a
    /// refusal counts as one; it logs the refusal; each kind is counted on
    /// its own.
    #[test]
    fn alternating_refusals_and_rate_limits_are_logged_as_one_refusal_now_and_then() {
        let token = temp_file("alternating", b"a-token-of-this-server\n");
        let f = follower(&token);
        let mut throttle = Throttle::default();
        let mut logged = Vec::new();
        for i in 0..80 {
            let e = if i % 2 == 0 {
                refused(&f)
            } else {
                answered(429)
            };
            let trouble = throttle.classify(&e);
            assert_eq!(trouble, Trouble::Refused, "try {i}");
            if let Some(text) = throttle.failed(trouble, &e) {
                assert!(text.contains("refused the token"), "{text}");
                logged.push(i);
            }
        }
        // The 1st, 20th, 40th, 60th and 80th.
        assert_eq!(logged, [0, 19, 39, 59, 79]);

        // A 429 without a refusal before it is the API answering with an
        // error; two kinds alternating are each logged once in 20.
        let mut throttle = Throttle::default();
        assert_eq!(throttle.classify(&answered(429)), Trouble::BadAnswer);
        let mut logged = Vec::new();
        for i in 0..40 {
            let e = if i % 2 == 0 {
                answered(500)
            } else {
                refused(&f)
            };
            let trouble = throttle.classify(&e);
            if throttle.failed(trouble, &e).is_some() {
                logged.push((i, trouble));
            }
        }
        assert_eq!(
            logged,
            [
                (0, Trouble::BadAnswer),
                (1, Trouble::Refused),
                (38, Trouble::BadAnswer),
                (39, Trouble::Refused)
            ]
        );
        // After a success, the first of each kind is logged again, and
        // the recovery says the token was accepted.
        assert!(throttle.recovered());
        let e = answered(500);
        assert!(throttle.failed(throttle.classify(&e), &e).is_some());
        assert!(!throttle.recovered());
    }

    /// Review of issue 23: after every refusal the token file was read
    /// again and a failure to read it logged each time. It is logged when
    /// the error changes, or with the refusal's own line.
    #[test]
    fn a_token_file_that_cannot_be_read_again_is_logged_when_its_error_changes() {
        let token = temp_file("reread", b"a-token-of-this-server\n");
        let mut f = follower(&token);
        std::fs::remove_file(&token).unwrap();
        let first = f.reread_token(false).expect("the first failure is logged");
        assert!(
            first.contains("cannot read --config-api-token-file"),
            "{first}"
        );
        assert_eq!(f.reread_token(false), None);
        assert_eq!(f.reread_token(false), None);
        assert_eq!(f.reread_token(true).as_deref(), Some(first.as_str()));
        std::fs::write(&token, "\n").unwrap();
        let empty = f.reread_token(false).expect("a new error is logged");
        assert!(empty.contains("is empty"), "{empty}");
        assert_eq!(f.reread_token(false), None);
        // Fixed: taken, and a later failure is news again.
        std::fs::write(&token, "the-fixed-token-of-this-server\n").unwrap();
        assert_eq!(f.reread_token(false), None);
        assert_eq!(f.token, "the-fixed-token-of-this-server");
        std::fs::remove_file(&token).unwrap();
        assert!(f.reread_token(false).is_some());
    }

    /// Review of issue 23: a proxy (or an API) that echoes the request put
    /// `Bearer TOKEN` in the refusal's log line, unbounded.
    #[test]
    fn an_answer_that_echoes_the_token_is_shown_without_it_and_bounded() {
        let secret = "s3cret-token-0123456789abcdef";
        let token = temp_file("echo", format!("{secret}\n").as_bytes());
        let f = follower(&token);
        let echoed = format!(
            "GET /v1/config HTTP/1.1\r\nauthorization: Bearer {secret}\r\n{}",
            "x".repeat(5000)
        );
        let shown = f.shown_answer(&echoed);
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("authorization: Bearer <token>"), "{shown}");
        assert!(!shown.contains(['\r', '\n']), "{shown}");
        assert!(shown.len() <= 1100, "{} bytes", shown.len());
    }

    /// Review of issue 23: every control character was called "more than
    /// one line"; a variable that is not unicode was "needs a token".
    #[test]
    fn a_token_is_refused_naming_what_is_wrong_without_quoting_it() {
        let cases: [(&[u8], &str); 5] = [
            (b"  \n", "is empty"),
            (b"abc\ndef\n", "holds several lines"),
            (b"abc\rdef", "holds several lines"),
            (b"abc\x1bdef", "holds the control character U+001B"),
            (b"abc\xffdef", "is not valid UTF-8"),
        ];
        for (i, (contents, problem)) in cases.into_iter().enumerate() {
            let path = temp_file(&format!("bad-{i}"), contents);
            let e = format!("{:#}", TokenSource::File(path.clone()).read().unwrap_err());
            assert!(
                e.starts_with(&format!(
                    "--config-api-token-file {} {problem}",
                    path.display()
                )),
                "{e}"
            );
            assert!(!e.contains("abc"), "{e}");
        }
        let path = temp_file("good", b"\t a-token-of-this-server \n");
        assert_eq!(
            TokenSource::File(path).read().unwrap(),
            "a-token-of-this-server"
        );
    }

    /// Review of issue 23: a URL with a user and password was shown whole
    /// (in `/status`, which needs no token, and the log), and would have
    /// sent them as a second `Authorization` header.
    #[test]
    fn a_url_with_a_user_and_password_is_refused_without_showing_them() {
        let token = temp_file("userinfo", b"a-token-of-this-server\n");
        for url in [
            "https://fleet:hunter2@config.internal:8090",
            "http://hunter2@config.internal",
        ] {
            let e = Follower::new(url, TokenSource::File(token.clone()), None, Duration::ZERO)
                .err()
                .unwrap();
            let e = format!("{e:#}");
            assert!(!e.contains("hunter2"), "{e}");
            assert!(e.contains("***@config.internal"), "{e}");
            assert!(e.contains("remove `USER:PASSWORD@`"), "{e}");
        }
        let e = Follower::new("ftp://h", TokenSource::File(token), None, Duration::ZERO)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("--config-api must be an http:// or https:// URL"),
            "{e}"
        );
    }
}
