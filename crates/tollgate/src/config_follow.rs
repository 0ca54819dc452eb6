//! `serve --config-api URL`: the binary's side of following the config
//! API. The follower itself (fetching, reading deltas, retrying, its log)
//! is `tollgate_configapi::client`; this module puts what it follows in
//! force in the server's [`App`], loaded with the config file (if any),
//! so limits whose parameters did not change keep their state, and gives
//! its errors the binary's `anyhow` shape.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::sync::watch;
use tollgate_configapi::client::{
    self, ConfigText, FetchError, FirstError, SetupError, TokenError, TOKEN_VARIABLE,
};
pub use tollgate_configapi::client::{TokenRefused, TokenSource};
use tollgate_server::app::{ApiPart, App};
use tollgate_store::Store;

/// The config API's follower, as `serve` drives it.
pub struct Follower(client::Follower);

/// The server's part of the config, from the API's.
fn part(text: ConfigText) -> ApiPart {
    ApiPart {
        revision: text.revision,
        text: text.text,
    }
}

impl Follower {
    /// A follower of the API at `base`; see [`client::Follower::new`].
    pub fn new(
        base: &str,
        token_source: TokenSource,
        ca: Option<&PathBuf>,
        poll: Duration,
    ) -> Result<Follower> {
        // The library names what it was given neutrally; the flags that
        // gave it are this binary's to name.
        match client::Follower::new(base, token_source, ca, poll) {
            Ok(follower) => Ok(Follower(follower)),
            Err(SetupError::Token(TokenError::Missing)) => Err(anyhow::anyhow!(
                "--config-api needs a token: --config-api-token-file or {TOKEN_VARIABLE}"
            )),
            Err(e @ (SetupError::UserInfo(_) | SetupError::NotHttp(_))) => {
                Err(anyhow::Error::new(e).context("--config-api"))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The API's URL as messages and logs show it (no user or password).
    pub fn shown_url(&self) -> &str {
        self.0.shown_url()
    }

    /// Gets the whole config now (at startup): the part to start with. A
    /// refused token is a [`TokenRefused`] (`serve` does not retry it).
    pub async fn first(&mut self) -> Result<ApiPart> {
        match self.0.first().await {
            Ok(text) => Ok(part(text)),
            Err(FirstError::Fetch(FetchError::Refused(refused))) => Err(refused.into()),
            Err(e) => Err(e.into()),
        }
    }

    /// Follows the API until `stop`, putting each new revision in force
    /// with the config file at `file`.
    pub async fn run<S: Store>(
        self,
        app: Arc<App<S>>,
        file: Option<PathBuf>,
        stop: watch::Receiver<bool>,
    ) {
        let install = move |text| app.install_parts(file.as_deref(), Some(part(text)));
        self.0.run(install, stop).await
    }
}
