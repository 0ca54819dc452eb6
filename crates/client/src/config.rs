//! How a client connects and behaves.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::{Backoff, Timer, TokioTimer};

/// The environment variable that turns the kill switch on (`1`, `true`,
/// `yes` or `on`), read by [`ClientConfig::new`].
pub const KILL_SWITCH_ENV: &str = "TOLLGATE_KILL_SWITCH";

/// TLS towards the servers: the CA that signs their certificates (the
/// system's web roots when absent), the name they present, and this
/// client's certificate for servers that require mutual TLS. PEM bytes,
/// so the caller decides where secrets come from (the CLI reads files).
#[derive(Clone, Default)]
pub struct Tls {
    /// PEM CA certificate(s) to trust instead of the web roots.
    pub ca: Option<Vec<u8>>,
    /// The server name to verify (default: the endpoint's host).
    pub domain: Option<String>,
    /// PEM certificate chain and private key presented to the server.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

// The private key never appears in logs or panics.
impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca.as_ref().map(|c| c.len()))
            .field("domain", &self.domain)
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A client's settings. [`ClientConfig::new`] gives the defaults for some
/// endpoints; every field is public to change.
#[derive(Clone)]
pub struct ClientConfig {
    /// Servers, in order of preference: `host:port`, `http://host:port`
    /// or `https://host:port`. A call goes to the first that answers.
    pub endpoints: Vec<String>,
    /// TLS for every endpoint (`https://` endpoints need it, or use the
    /// web roots).
    pub tls: Option<Tls>,
    /// Longest wait for a connection to one server.
    pub connect_timeout: Duration,
    /// Longest wait for one answer; past it, the server counts as not
    /// answering.
    pub request_timeout: Duration,
    /// Backoff after rejections (Charon §3.2).
    pub backoff: Backoff,
    /// After a server could not be reached, the first wait before trying it
    /// again; doubled (with jitter) after every failure up to
    /// [`ClientConfig::reconnect_max`].
    pub reconnect_base: Duration,
    /// The longest wait between two attempts to reach a server.
    pub reconnect_max: Duration,
    /// When no server answers, or one fails with a server error, grant the
    /// minimum (`min_hits`, `min_copies`) and mark it degraded (Charon
    /// §4.3). On by default: the application keeps running without its
    /// limiter. A server that answers but has no room is not "no server":
    /// that ends in [`Error::AtCapacity`](crate::Error::AtCapacity).
    pub fail_open: bool,
    /// Turn every rejection into a grant, marked overridden (Charon §4.3):
    /// for running new limits in shadow. Also set by
    /// [`KILL_SWITCH_ENV`].
    pub kill_switch: bool,
    /// What `max_wait` is measured with and sleeps wait on.
    pub timer: Arc<dyn Timer>,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("endpoints", &self.endpoints)
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("backoff", &self.backoff)
            .field("fail_open", &self.fail_open)
            .field("kill_switch", &self.kill_switch)
            .finish_non_exhaustive()
    }
}

impl ClientConfig {
    /// The defaults for `endpoints`: 1 s to connect, 2 s per answer,
    /// 100 ms backoff unit, reconnection from 100 ms up to 5 s, fail-open
    /// on, the kill switch as [`KILL_SWITCH_ENV`] says.
    pub fn new<I, S>(endpoints: I) -> ClientConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tls: None,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(2),
            backoff: Backoff::default(),
            reconnect_base: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            fail_open: true,
            kill_switch: kill_switch_from_env(),
            timer: Arc::new(TokioTimer::default()),
        }
    }
}

/// Whether [`KILL_SWITCH_ENV`] turns the kill switch on.
pub fn kill_switch_from_env() -> bool {
    std::env::var(KILL_SWITCH_ENV).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}
