//! The follower a limiting server runs for `serve --config-api URL`: it
//! keeps a copy of the API's namespaces and follows its revisions
//! (Charon §4.1).
//!
//! It long-polls `GET /v1/config/wait?since=REV`: the API answers as soon
//! as a change is committed (so a change is in force within moments, the
//! "refresh on demand"), or after the poll interval with nothing new. Each
//! answer is a [`Delta`] (deletions first, then what changed), read with
//! the same structs the API writes it with and applied to the copy
//! ([`FollowedConfig`]); the whole copy is then handed to the caller as a
//! config text ([`ConfigText`]) to put in force. While the API is
//! unreachable the caller keeps serving the config it has, and the
//! follower retries with backoff.
//!
//! This crate does not know the server: [`Follower::run`] takes the step
//! that puts a revision in force as a function, which the binary makes
//! from its `App` (the config file's part and this one, loaded together).
//!
//! Behind the `client` feature: the API itself needs no HTTP client.

mod error;
mod followed;
mod throttle;
mod token;

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;

pub use error::{chain, FetchError, SetupError, TokenRefused};
pub use followed::{BadDelta, ConfigText, FollowedConfig};
pub use token::{TokenError, TokenSource, TOKEN_FORMAT, TOKEN_VARIABLE};

use crate::protocol::Delta;
use throttle::{Throttle, Trouble};

/// How to reach the API, and the copy of its config followed so far.
pub struct Follower {
    http: reqwest::Client,
    base: String,
    /// `base` as messages and logs show it: without a user or password.
    shown: String,
    token: String,
    token_source: TokenSource,
    poll: Duration,
    copy: FollowedConfig,
    throttle: Throttle,
}

impl Follower {
    /// A follower of the API at `base` (`http://` or `https://`), with
    /// the token of `token_source` (a `read` token), trusting `ca` (PEM)
    /// for TLS if given. Nothing is contacted.
    pub fn new(
        base: &str,
        token_source: TokenSource,
        ca: Option<&PathBuf>,
        poll: Duration,
    ) -> Result<Follower, SetupError> {
        let shown = tollgate_auth::redact(base.trim_end_matches('/'));
        let url = reqwest::Url::parse(base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"));
        // reqwest would send them as a second `Authorization` header,
        // beside the token's; the API reads one, and would refuse. The text
        // is checked as well as the parse: a password with a `/` in it
        // parses as a host, a port and a path with no user at all, or not
        // at all.
        let userinfo = shown != base.trim_end_matches('/')
            || url
                .as_ref()
                .is_some_and(|u| !u.username().is_empty() || u.password().is_some());
        if userinfo {
            return Err(SetupError::UserInfo(shown));
        }
        if url.is_none() {
            return Err(SetupError::NotHttp(shown));
        }
        let token = token_source.read()?;
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(poll + Duration::from_secs(30));
        if let Some(ca) = ca {
            let pem = std::fs::read(ca).map_err(|e| SetupError::CaUnreadable(ca.clone(), e))?;
            let cert = reqwest::Certificate::from_pem(&pem).map_err(SetupError::Ca)?;
            builder = builder.add_root_certificate(cert);
        }
        Ok(Follower {
            http: builder.build().map_err(SetupError::Client)?,
            base: base.trim_end_matches('/').to_owned(),
            shown,
            token,
            token_source,
            poll,
            copy: FollowedConfig::default(),
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
        tollgate_core::message::bounded(line)
    }

    /// Fetches the delta after the copy's revision; `wait` long-polls.
    async fn fetch(&self, wait: bool) -> Result<Delta, FetchError> {
        let since = self.copy.revision;
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
            .map_err(|source| FetchError::Unreachable {
                shown: self.shown.clone(),
                source,
            })?;
        let status = resp.status();
        let text = resp.text().await.map_err(FetchError::Reading)?;
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            let message = serde_json::from_str::<crate::protocol::ErrorAnswer>(&text)
                .map(|body| body.error.message)
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
            return Err(FetchError::Answered {
                status,
                message: self.shown_answer(&text),
            });
        }
        serde_json::from_str(&text).map_err(FetchError::NotDelta)
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
                let error = chain(&e);
                self.throttle
                    .read_failed(error.clone(), loud)
                    .then_some(error)
            }
        }
    }

    /// Gets the whole config now (at startup): the text to start with.
    pub async fn first(&mut self) -> Result<ConfigText, FirstError> {
        let delta = self.fetch(false).await?;
        self.copy.apply(&delta)?;
        Ok(self.copy.text())
    }

    /// After an answer this copy cannot follow (a bad delta, or a body that
    /// is not one): forgets the copy, so the next fetch asks for
    /// everything, and waits a second first; `true` when `stop` came
    /// meanwhile.
    async fn start_over(&mut self, stop: &mut watch::Receiver<bool>) -> bool {
        self.copy = FollowedConfig::default();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => false,
            _ = stop.wait_for(|s| *s) => true,
        }
    }

    /// Follows the API until `stop`, handing each new revision to
    /// `install`, which puts it in force and answers the server's own
    /// revision for the log, or why the server refused it (the previous
    /// config keeps serving).
    pub async fn run<F, E>(mut self, mut install: F, mut stop: watch::Receiver<bool>)
    where
        F: FnMut(ConfigText) -> Result<u64, E>,
        E: std::fmt::Display,
    {
        let mut failures = 0u32;
        // The copy was reset and must be put in force even if its revision
        // is the one it had.
        let mut reset = false;
        loop {
            let fetched = tokio::select! {
                r = self.fetch(true) => r,
                _ = stop.wait_for(|s| *s) => return,
            };
            let delta = match fetched {
                Ok(d) => d,
                // A success whose body is not a delta is what a bad delta
                // is: this copy and the API disagree on what was sent, so
                // the next fetch asks for everything rather than for the
                // same `since` again.
                Err(FetchError::NotDelta(e)) => {
                    tracing::error!(error = ?e.to_string(), "the config API answered with a body that is not a delta; fetching everything again");
                    if self.start_over(&mut stop).await {
                        return;
                    }
                    reset = true;
                    continue;
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let wait = Duration::from_millis(100u64 << failures.min(6))
                        .min(Duration::from_secs(5));
                    let trouble = self.throttle.classify(&e);
                    let logged = self.throttle.failed(trouble, &e);
                    let in_force = self.copy.revision;
                    match (&logged, trouble, &self.token_source) {
                        (None, _, _) => {}
                        (Some(error), Trouble::Refused, TokenSource::File { .. }) => {
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
            let before = self.copy.revision;
            // Another database (replaced, restored) or one that went back
            // in time: its deltas no longer describe changes to this copy.
            // Start over from everything.
            let other = self
                .copy
                .instance
                .as_deref()
                .is_some_and(|i| i != delta.instance);
            let behind = delta.revision < before;
            if other || behind {
                tracing::warn!(
                    api_revision = delta.revision,
                    view_revision = before,
                    "the config API's database changed or went back; fetching everything again"
                );
                self.copy = FollowedConfig::default();
                reset = true;
                continue;
            }
            if let Err(e) = self.copy.apply(&delta) {
                tracing::error!(error = ?e.to_string(), "a bad delta from the config API; fetching everything again");
                if self.start_over(&mut stop).await {
                    return;
                }
                reset = true;
                continue;
            }
            if self.copy.revision == before && !reset {
                continue;
            }
            reset = false;
            match install(self.copy.text()) {
                Ok(local) => tracing::info!(
                    api_revision = self.copy.revision,
                    revision = local,
                    "config API revision in force"
                ),
                Err(e) => {
                    tracing::error!(api_revision = self.copy.revision, error = ?e.to_string(), "config API revision refused; the previous config keeps serving")
                }
            }
        }
    }
}

/// Why [`Follower::first`] got no config.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FirstError {
    /// The fetch failed.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The delta cannot be applied.
    #[error(transparent)]
    BadDelta(#[from] BadDelta),
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    /// A file of its own under the system's temporary directory.
    pub(crate) fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tollgate-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn follower(token_file: &std::path::Path) -> Follower {
        Follower::new(
            "http://127.0.0.1:1",
            TokenSource::file(token_file),
            None,
            Duration::from_secs(1),
        )
        .unwrap()
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
        assert!(first.contains("cannot read the token file"), "{first}");
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

    /// Review of issue 23: a URL with a user and password was shown whole
    /// (in `/status`, which needs no token, and the log), and would have
    /// sent them as a second `Authorization` header.
    #[test]
    fn a_url_with_a_user_and_password_is_refused_without_showing_them() {
        let token = temp_file("userinfo", b"a-token-of-this-server\n");
        for url in [
            "https://fleet:hunter2@config.internal:8090",
            "http://hunter2@config.internal",
            // A `/` in the password: parsed as host `fleet`, port 12.
            "https://fleet:12/hunter2@config.internal",
            "https://fleet:ab/hunter2@config.internal",
        ] {
            let e = Follower::new(url, TokenSource::file(token.clone()), None, Duration::ZERO)
                .err()
                .unwrap();
            let e = chain(&e);
            assert!(!e.contains("hunter2"), "{e}");
            assert!(e.contains("***@config.internal"), "{e}");
            assert!(e.contains("remove `USER:PASSWORD@`"), "{e}");
        }
        let e = Follower::new("ftp://h", TokenSource::file(token), None, Duration::ZERO)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("the config API's URL must be an http:// or https:// URL"),
            "{e}"
        );
    }
}
