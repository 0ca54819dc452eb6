//! Connections to Redis: one server or a cluster, multiplexed, with
//! timeouts and reconnection.
//!
//! A single server is reached through a few [`ConnectionManager`]s, each
//! one multiplexed TCP (or TLS) connection that pipelines every command
//! sent on it while earlier ones are in flight, and reconnects by itself
//! with exponential backoff when the connection breaks. Each carries the
//! decisions of one driver (`batch.rs`), and other commands are spread
//! over them round robin, so a handful of connections carry any number of
//! concurrent decisions (seed 002, "multiple round trips"). The managers
//! themselves time nothing: redis-rs would time each request from its own
//! sending, which fails a decision call pipelined behind a slow one while
//! Redis is still answering (review of issue 17, finding 3). The driver
//! times decisions by Redis's silence instead, and every other command
//! sent here ([`Conn::invoke`], [`Conn::query`], [`Conn::send_decide`]) is
//! bounded by `response_timeout` around it, as redis-rs would. A cluster is
//! reached through the cluster
//! client's own multiplexed connection per node, which routes each script
//! call by its first key's slot.
//!
//! TLS (`rediss://`, `rediss-cluster://`) trusts the system's roots unless
//! [`ConnectOptions::tls_ca`] names the CA certificates to trust instead,
//! and presents [`ConnectOptions::tls_client`] when Redis requires client
//! certificates (mutual TLS). The material is checked before the first
//! connection, so a bad file is a startup error naming it rather than a
//! handshake that fails later, and it is refused with a URL that does not
//! use TLS. Key material never appears in logs, errors or `Debug` output.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, TlsMode};
use redis::{
    Client, ClientTlsConfig, FromRedisValue, IntoConnectionInfo, RedisError, RedisResult,
    ScriptInvocation, TlsCertificates,
};
use thiserror::Error;
use tollgate_tls::{certificates, private_key, trust_anchors, Anchors};

/// Where the store's Redis is, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://` or `rediss://` (TLS).
    Single(String),
    /// A cluster, by seed nodes: `redis-cluster://a:6379,b:6379` or
    /// `rediss-cluster://...` (TLS).
    Cluster {
        /// The seed nodes as `redis://` or `rediss://` URLs.
        seeds: Vec<String>,
    },
    /// A master found through Redis Sentinel, and followed when the
    /// sentinels fail it over:
    /// `redis-sentinel://[[USER]:PASSWORD@]HOST:PORT,HOST:PORT,.../MASTER_NAME[/DB]`
    /// or `rediss-sentinel://...` (TLS to the sentinels and the master).
    Sentinel(SentinelTarget),
}

/// The sentinels to ask, and the master they are asked for. The
/// credentials are the master's (as in a `redis://` URL); `Debug` shows
/// none of them.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// The sentinels, as `host:port` (26379 when the URL gives no port).
    pub sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the master under.
    pub master: String,
    /// The database on the master (the URL's `/MASTER_NAME/DB`; 0 without).
    pub db: i64,
    /// Whether the sentinels and the master are reached over TLS.
    pub tls: bool,
    /// The master's user (ACL), from the URL.
    username: Option<String>,
    /// The master's password, from the URL.
    password: Option<String>,
    /// The sentinels' own password (their `requirepass`), when they
    /// require one: never from the URL, whose credentials are the
    /// master's ([`RedisOptions::sentinel_password`](crate::RedisOptions::sentinel_password)).
    sentinel_password: Option<String>,
}

impl fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured so that a new field cannot be printed by accident.
        let SentinelTarget {
            sentinels,
            master,
            db,
            tls,
            username,
            password,
            sentinel_password,
        } = self;
        f.debug_struct("SentinelTarget")
            .field("sentinels", sentinels)
            .field("master", master)
            .field("db", db)
            .field("tls", tls)
            .field("username", &username.as_ref().map(|_| "***"))
            .field("password", &password.as_ref().map(|_| "***"))
            .field(
                "sentinel_password",
                &sentinel_password.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

/// Attempts of one reconnection of a connection to a Sentinel-managed
/// master: backoff from 10 ms doubling to `--redis-max-reconnect-delay-ms`
/// (2 s by default), about half a minute in all.
const SENTINEL_RETRIES: usize = 20;

/// The most sentinels a URL may list: each is asked every tick.
pub const MAX_SENTINELS: usize = 16;

/// The port sentinels listen on unless told otherwise.
pub const SENTINEL_PORT: u16 = 26379;

impl SentinelTarget {
    /// Parses what follows `redis-sentinel://` (or `rediss-sentinel://`):
    /// `[[USER]:PASSWORD@]HOST[:PORT],.../MASTER_NAME[/DB]`. Each error
    /// names the part that is wrong.
    fn parse(rest: &str, tls: bool) -> Result<SentinelTarget, String> {
        const FORM: &str = "the form is redis-sentinel://HOST:PORT,HOST:PORT/MASTER_NAME";
        if rest.contains(['?', '#']) {
            return Err(format!(
                "a sentinel URL takes no query or fragment ({FORM}; in a password, \
                 percent-encode `?` as %3F and `#` as %23)"
            ));
        }
        // Credentials, if any, come before the first host and are the
        // master's, read as a redis:// URL reads them (percent-decoded).
        // They end at the last `@` that a `/` follows (the one before the
        // master name): a password may hold `/` and `@`, and a master
        // name may hold `@` (review of issue 18, finding 9).
        let auth_end = rest
            .rmatch_indices('@')
            .map(|(i, _)| i)
            .find(|&i| rest[i..].contains('/'));
        let (auth, after) = match auth_end {
            Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
            None => (None, rest),
        };
        let (username, password) = match auth {
            Some(auth) => {
                let info = format!("redis://{auth}@localhost")
                    .as_str()
                    .into_connection_info()
                    .map_err(|_| "the user and password before `@` cannot be read".to_owned())?;
                let r = info.redis_settings();
                (
                    r.username().map(str::to_owned),
                    r.password().map(str::to_owned),
                )
            }
            None => (None, None),
        };
        let (hosts, path) = after.split_once('/').ok_or_else(|| {
            format!("no master name: add /MASTER_NAME after the sentinels ({FORM})")
        })?;
        let (master, db) = match path.split_once('/') {
            Some((master, db)) => (master, Some(db)),
            None => (path, None),
        };
        if master.is_empty() {
            return Err(format!(
                "no master name: add /MASTER_NAME after the sentinels ({FORM})"
            ));
        }
        if !master.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "bad master name `{master}`: printable ASCII without spaces expected"
            ));
        }
        let db = match db {
            None | Some("") => 0,
            Some(db) => match db.parse::<i64>() {
                Ok(n) if n >= 0 => n,
                _ => {
                    return Err(format!(
                        "bad database `{db}` after the master name: a number from 0 expected"
                    ))
                }
            },
        };
        let mut sentinels = Vec::new();
        for host in hosts.split(',').map(str::trim) {
            if host.is_empty() {
                continue;
            }
            sentinels.push(sentinel_addr(host)?);
        }
        if sentinels.is_empty() {
            return Err(format!("no sentinels before the master name ({FORM})"));
        }
        if sentinels.len() > MAX_SENTINELS {
            return Err(format!(
                "{} sentinels: at most {MAX_SENTINELS} are asked",
                sentinels.len()
            ));
        }
        for (i, (host, port)) in sentinels.iter().enumerate() {
            if sentinels[..i].contains(&(host.clone(), *port)) {
                return Err(format!("sentinel `{host}:{port}` is listed twice"));
            }
        }
        Ok(SentinelTarget {
            sentinels,
            master: master.to_owned(),
            db,
            tls,
            username,
            password,
            sentinel_password: None,
        })
    }

    /// Asks the sentinels with `password` (their `requirepass`); `None`:
    /// without a password.
    pub fn set_sentinel_password(&mut self, password: Option<String>) {
        self.sentinel_password = password;
    }

    /// How a connection to a sentinel at `host:port` is set up: TLS as
    /// the URL says, the sentinels' password if they require one.
    fn sentinel_info(&self, host: &str, port: u16) -> RedisResult<redis::ConnectionInfo> {
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        };
        let mut info = addr.into_connection_info()?;
        if let Some(pw) = &self.sentinel_password {
            let settings = info.redis_settings().clone().set_password(pw);
            info = info.set_redis_settings(settings);
        }
        Ok(info)
    }

    /// How errors and logs show it: no credentials.
    fn shown(&self) -> String {
        let scheme = if self.tls {
            "rediss-sentinel"
        } else {
            "redis-sentinel"
        };
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("[{h}]:{p}")
                } else {
                    format!("{h}:{p}")
                }
            })
            .collect();
        let auth = if self.password.is_some() || self.username.is_some() {
            "***@"
        } else {
            ""
        };
        format!("{scheme}://{auth}{}/{}", hosts.join(","), self.master)
    }
}

/// One sentinel of a URL: `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`.
fn sentinel_addr(host: &str) -> Result<(String, u16), String> {
    let (name, port) = match host.rsplit_once(':') {
        // A colon inside brackets is part of an IPv6 address.
        Some((name, port)) if !port.contains(']') => (name, Some(port)),
        _ => (host, None),
    };
    let port = match port {
        None => SENTINEL_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(format!(
                    "bad port `{p}` of sentinel `{host}`: a number from 1 to 65535 expected"
                ))
            }
        },
    };
    if name.is_empty() || name == "[]" {
        return Err(format!("sentinel `{host}` has no host"));
    }
    // The host is read as a redis:// URL reads it.
    let info = format!("redis://{name}:{port}")
        .as_str()
        .into_connection_info()
        .map_err(|e| format!("bad sentinel `{host}`: {e}"))?;
    match info.addr() {
        redis::ConnectionAddr::Tcp(h, p) => Ok((h.clone(), *p)),
        _ => Err(format!("bad sentinel `{host}`")),
    }
}

/// Why the store could not reach Redis at startup.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL is not one the store understands.
    #[error("bad Redis URL `{url}`: {reason}")]
    BadUrl {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The key prefix would break Redis Cluster's hash tags.
    #[error(
        "bad --store-prefix `{prefix}`: it must not contain `{{` or `}}` \
         (tollgate puts each key's hash tag in braces itself)"
    )]
    BadPrefix {
        /// The prefix.
        prefix: String,
    },
    /// TLS material was given for a URL that does not use TLS.
    #[error(
        "TLS certificates were given for `{url}`, which does not use TLS: \
         use rediss:// (or rediss-cluster://), or give no TLS material"
    )]
    TlsOnPlainUrl {
        /// The URL, with any password removed.
        url: String,
    },
    /// Some TLS material cannot be used.
    #[error("bad TLS {part} for Redis at {url}: {reason}")]
    BadTls {
        /// The URL, with any password removed.
        url: String,
        /// Which material.
        part: TlsPart,
        /// What is wrong with it (never any key material).
        reason: String,
    },
    /// Redis did not answer.
    #[error("cannot connect to Redis at {url}: {cause}")]
    Connect {
        /// The URL, with any password removed.
        url: String,
        /// The client's error: shown in the message, so not a `source`
        /// (which would print it twice in an error chain).
        cause: RedisError,
    },
}

/// A part of the TLS material, as [`ConnectError::BadTls`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsPart {
    /// [`ConnectOptions::tls_ca`].
    Ca,
    /// [`ClientCert::cert_pem`].
    ClientCert,
    /// [`ClientCert::key_pem`].
    ClientKey,
}

impl fmt::Display for TlsPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsPart::Ca => "CA certificates",
            TlsPart::ClientCert => "client certificate",
            TlsPart::ClientKey => "client key",
        })
    }
}

/// `url` with the password (if any) replaced, for logs and errors (one
/// rule for every URL tollgate shows: [`tollgate_auth::redact`]).
pub use tollgate_auth::redact;

impl RedisTarget {
    /// Whether its connections use TLS (`rediss://`, `rediss-cluster://`,
    /// `rediss-sentinel://`).
    pub fn is_tls(&self) -> bool {
        match self {
            RedisTarget::Single(url) => url.starts_with("rediss://"),
            RedisTarget::Cluster { seeds } => seeds.iter().all(|s| s.starts_with("rediss://")),
            RedisTarget::Sentinel(s) => s.tls,
        }
    }

    /// The URL (or the seeds') as errors show it, without passwords.
    fn shown(&self) -> String {
        match self {
            RedisTarget::Single(url) => redact(url),
            RedisTarget::Cluster { seeds } => seeds
                .iter()
                .map(|s| redact(s))
                .collect::<Vec<_>>()
                .join(","),
            RedisTarget::Sentinel(s) => s.shown(),
        }
    }

    /// Parses `--store`'s URL.
    pub fn parse(url: &str) -> Result<RedisTarget, ConnectError> {
        let bad = |reason: &str| ConnectError::BadUrl {
            url: redact(url),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            bad(
                "expected `memory` (the embedded store), or a URL: redis://, rediss://, \
                 redis-cluster://, rediss-cluster://, redis-sentinel:// or rediss-sentinel://",
            )
        })?;
        match scheme {
            "redis" | "rediss" => {
                url.into_connection_info()
                    .map_err(|e| bad(&e.to_string()))?;
                Ok(RedisTarget::Single(url.to_owned()))
            }
            "redis-cluster" | "rediss-cluster" => {
                let node_scheme = scheme.trim_end_matches("-cluster");
                // Credentials, if any, come before the first host and
                // apply to every node.
                let (auth, hosts) = match rest.rsplit_once('@') {
                    Some((auth, hosts)) => (format!("{auth}@"), hosts),
                    None => (String::new(), rest),
                };
                let hosts = hosts.trim_end_matches('/');
                let seeds: Vec<String> = hosts
                    .split(',')
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(|h| format!("{node_scheme}://{auth}{h}"))
                    .collect();
                if seeds.is_empty() {
                    return Err(bad("no seed nodes after the scheme"));
                }
                for s in &seeds {
                    s.as_str()
                        .into_connection_info()
                        .map_err(|e| bad(&e.to_string()))?;
                }
                Ok(RedisTarget::Cluster { seeds })
            }
            "redis-sentinel" | "rediss-sentinel" => {
                SentinelTarget::parse(rest, scheme == "rediss-sentinel")
                    .map(RedisTarget::Sentinel)
                    .map_err(|reason| bad(&reason))
            }
            other => Err(bad(&format!(
                "unknown scheme `{other}` (expected redis, rediss, redis-cluster, rediss-cluster, \
                 redis-sentinel or rediss-sentinel)"
            ))),
        }
    }
}

/// A client certificate and its private key, presented to a Redis that
/// requires client certificates (mutual TLS). `Debug` shows neither.
#[derive(Clone)]
pub struct ClientCert {
    /// The certificate chain, PEM, the client's own certificate first.
    pub cert_pem: Vec<u8>,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured so that a new field cannot be printed by accident.
        let ClientCert {
            cert_pem,
            key_pem: _,
        } = self;
        f.debug_struct("ClientCert")
            .field("cert_pem", &format_args!("<{} bytes>", cert_pem.len()))
            .field("key_pem", &format_args!("<redacted>"))
            .finish()
    }
}

/// How to connect.
#[derive(Clone)]
pub struct ConnectOptions {
    /// A password that overrides the URL's (`TOLLGATE_REDIS_PASSWORD`).
    pub password: Option<String>,
    /// PEM CA certificates that a TLS Redis's certificate must chain to,
    /// instead of the system's roots. Only with a TLS URL.
    pub tls_ca: Option<Vec<u8>>,
    /// The certificate and key to present to Redis (mutual TLS). Only with
    /// a TLS URL.
    pub tls_client: Option<ClientCert>,
    /// Multiplexed connections to a single server.
    pub connections: usize,
    /// How long one command may take before it fails.
    pub response_timeout: Duration,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// The longest pause between reconnection attempts.
    pub max_reconnect_delay: Duration,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions {
            password: None,
            tls_ca: None,
            tls_client: None,
            connections: 2,
            response_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            max_reconnect_delay: Duration::from_secs(2),
        }
    }
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Destructured so that a new field cannot be printed by accident.
        let ConnectOptions {
            password,
            tls_ca,
            tls_client,
            connections,
            response_timeout,
            connect_timeout,
            max_reconnect_delay,
        } = self;
        f.debug_struct("ConnectOptions")
            .field("password", &password.as_ref().map(|_| "***"))
            .field(
                "tls_ca",
                &tls_ca
                    .as_ref()
                    .map(|pem| format!("<{} bytes of PEM>", pem.len())),
            )
            .field("tls_client", tls_client)
            .field("connections", connections)
            .field("response_timeout", response_timeout)
            .field("connect_timeout", connect_timeout)
            .field("max_reconnect_delay", max_reconnect_delay)
            .finish()
    }
}

impl ConnectOptions {
    /// The TLS material for redis-rs, checked; `None` when there is none
    /// (TLS, if the URL asks for it, then trusts the system's roots).
    ///
    /// The check builds the rustls configuration redis-rs builds for each
    /// connection, so whatever it would refuse at the first handshake (no
    /// certificate in a file, a key that is not PEM or does not match the
    /// certificate) is refused here, naming the part.
    fn tls_certificates(&self) -> Result<Option<TlsCertificates>, (TlsPart, String)> {
        if self.tls_ca.is_none() && self.tls_client.is_none() {
            return Ok(None);
        }
        // Every CA certificate must be usable: redis-rs refuses a bundle
        // with one it cannot add, at the first connection.
        let roots = match &self.tls_ca {
            Some(pem) => {
                trust_anchors(pem, Anchors::Every).map_err(|e| (TlsPart::Ca, e.to_string()))?
            }
            None => rustls::RootCertStore::empty(),
        };
        if let Some(client) = &self.tls_client {
            let chain =
                certificates(&client.cert_pem).map_err(|e| (TlsPart::ClientCert, e.to_string()))?;
            // The error names the PEM block, never the key's bytes.
            let key =
                private_key(&client.key_pem).map_err(|e| (TlsPart::ClientKey, e.to_string()))?;
            rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .map_err(|e| {
                    (
                        TlsPart::ClientKey,
                        format!("unusable with the certificate: {e}"),
                    )
                })?;
        }
        Ok(Some(TlsCertificates {
            client_tls: self.tls_client.as_ref().map(|c| ClientTlsConfig {
                client_cert: c.cert_pem.clone(),
                client_key: c.key_pem.clone(),
            }),
            root_cert: self.tls_ca.clone(),
        }))
    }
}

/// The TLS material of `options` for `target`, checked without any I/O:
/// refused for a URL that does not use TLS, and refused when redis-rs
/// would refuse it at the first handshake.
pub(crate) fn checked_tls(
    target: &RedisTarget,
    options: &ConnectOptions,
) -> Result<Option<TlsCertificates>, ConnectError> {
    let shown = target.shown();
    // redis-rs refuses certificates for a plain URL with a vague error
    // (one server) or silently switches the seeds to TLS (a cluster).
    if (options.tls_ca.is_some() || options.tls_client.is_some()) && !target.is_tls() {
        return Err(ConnectError::TlsOnPlainUrl { url: shown });
    }
    options
        .tls_certificates()
        .map_err(|(part, reason)| ConnectError::BadTls {
            url: shown,
            part,
            reason,
        })
}

/// One multiplexed connection to a single server, whose server may
/// change: when the sentinels name a new master, [`Conn::follow_master`]
/// puts a connection to it in every link. Whoever sends a command takes
/// the link's connection at that moment (a clone: the same multiplexed
/// connection); commands already sent finish on the old one.
///
/// Each connection a link has held has a generation, counted from 0 and
/// bumped by every switch, which a subscriber is told of
/// ([`Link::subscribe`]): the decision driver fails its calls of an older
/// generation when the link moves on (`batch.rs`), because an old master
/// that died without closing its sockets (a crash, a partition, a frozen
/// VM) would otherwise hold them, and the decisions queued behind them,
/// until its TCP connection gives up (review of issue 18, finding 2).
#[derive(Clone)]
pub(crate) struct Link(Arc<tokio::sync::watch::Sender<Linked>>);

/// What a [`Link`] holds: its connection now, that connection's
/// generation, and the master it goes to as the sentinels named it
/// (empty without Sentinel).
#[derive(Clone)]
pub(crate) struct Linked {
    pub(crate) conn: ConnectionManager,
    pub(crate) generation: u64,
    /// Read with the connection, so a command that names the master it
    /// is sent to ([`Conn::invoke_naming_master`]) never names one and
    /// reaches another while the link moves.
    pub(crate) master: Arc<str>,
}

impl Link {
    fn new(m: ConnectionManager, master: Arc<str>) -> Link {
        Link(Arc::new(tokio::sync::watch::Sender::new(Linked {
            conn: m,
            generation: 0,
            master,
        })))
    }

    /// The connection to send on now, with its generation.
    pub(crate) fn linked(&self) -> Linked {
        self.0.borrow().clone()
    }

    /// A receiver that sees every switch of this link (`changed()`).
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<Linked> {
        self.0.subscribe()
    }

    /// Moves the link to `m`, a connection of the next generation, to
    /// the master at `master`.
    fn set(&self, m: ConnectionManager, master: Arc<str>) {
        self.0.send_modify(|l| {
            l.conn = m;
            l.generation += 1;
            l.master = master;
        });
    }
}

/// What following a Sentinel-managed master needs: a connection to each
/// sentinel for the question asked every tick, the sentinels' client
/// (redis-rs's own, which asks them in turn for a master that is not down
/// and checks with `ROLE` that it is one) for when the answer changes, the
/// master's address as last found, and how to open connections to a new
/// one.
pub(crate) struct Master {
    client: tokio::sync::Mutex<SentinelClient>,
    /// Each sentinel, asked `SENTINEL get-master-addr-by-name` every tick.
    sentinels: Vec<Arc<Sentinel>>,
    /// The name the sentinels know the master by.
    name: String,
    addr: Mutex<ConnectionAddr>,
    config: ConnectionManagerConfig,
    connect_timeout: Duration,
    /// The URL as logs show it (no credentials).
    shown: String,
}

impl Master {
    /// A client for the server the sentinels name master now (checked to
    /// be one), within a bound: a sentinel or a master that does not
    /// answer must not hold the caller up.
    async fn find(&self) -> RedisResult<Client> {
        let mut client = self.client.lock().await;
        self.find_with(&mut client).await
    }

    /// [`Master::find`], with the sentinels' client already locked.
    /// redis-rs takes the sentinels' answers in the order of the URL, and
    /// times its connections to them itself (about half a second to give
    /// up on one that hangs, a second to connect again): the bound is at
    /// least [`LOOKUP_BOUND`], whatever `--redis-connect-timeout-ms`, so
    /// that a hung first sentinel does not make every lookup time out
    /// (review of issue 18, finding 5).
    async fn find_with(&self, client: &mut SentinelClient) -> RedisResult<Client> {
        let bound = (self.connect_timeout * 2).max(LOOKUP_BOUND);
        tokio::time::timeout(bound, client.async_get_client())
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the sentinels did not name a master in time",
                )))
            })
    }

    /// The master's address as most of the sentinels that answer name it
    /// (`SENTINEL get-master-addr-by-name`), all asked at once, each
    /// within [`Master::ask_bound`], over connections kept open: a cheap
    /// question that opens no connection to the master (the full,
    /// `ROLE`-checked lookup did, every tick: review of issue 18, finding
    /// 6), and that a hung sentinel does not delay beyond its bound. A tie
    /// between addresses goes to `current` if it is one of them.
    async fn named(&self, current: Option<(&str, u16)>) -> RedisResult<(String, u16)> {
        let bound = self.ask_bound();
        // Tasks of their own, so that all are asked at once.
        let mut asking = tokio::task::JoinSet::new();
        for sentinel in &self.sentinels {
            let (sentinel, name) = (Arc::clone(sentinel), self.name.clone());
            asking.spawn(async move { sentinel.ask(&name, bound).await });
        }
        let answers = asking.join_all().await;
        let mut votes: Vec<((String, u16), usize)> = Vec::new();
        let mut error = None;
        for answer in answers {
            match answer {
                Ok(Some(addr)) => match votes.iter_mut().find(|(a, _)| *a == addr) {
                    Some((_, n)) => *n += 1,
                    None => votes.push((addr, 1)),
                },
                Ok(None) => {}
                Err(e) => error = error.or(Some(e)),
            }
        }
        let most = votes.iter().map(|(_, n)| *n).max().unwrap_or(0);
        let best: Vec<(String, u16)> = votes
            .into_iter()
            .filter(|(_, n)| *n == most)
            .map(|(a, _)| a)
            .collect();
        let pick = best
            .iter()
            .find(|(h, p)| current == Some((h.as_str(), *p)))
            .or(best.first())
            .cloned();
        match pick {
            Some(addr) => Ok(addr),
            None => Err(error.unwrap_or_else(|| {
                RedisError::from(std::io::Error::other(format!(
                    "no sentinel knows a master named `{}`",
                    self.name
                )))
            })),
        }
    }

    /// How long one sentinel may take to answer (connecting included).
    fn ask_bound(&self) -> Duration {
        self.connect_timeout.max(Duration::from_millis(500))
    }

    /// The longest a server whose sentinels answer within their bounds
    /// takes, once they name a new master, to move `links` connections
    /// there, asking every `interval`: the wait for its next question,
    /// the question ([`Master::ask_bound`]), the full lookup
    /// ([`Master::find_with`]) and the connections, opened one after the
    /// other; plus [`SENTINEL_PAUSE`], for a sentinel left alone after a
    /// failed question while the others do not all name the new master
    /// yet (sentinels tell each other of a failover every 2 s), so that
    /// the votes this server counts lag behind another server's.
    fn follow_bound(&self, interval: Duration, links: usize) -> Duration {
        let lookup = (self.connect_timeout * 2).max(LOOKUP_BOUND);
        let connections = self
            .connect_timeout
            .saturating_mul(u32::try_from(links).unwrap_or(u32::MAX));
        interval
            .saturating_add(self.ask_bound())
            .saturating_add(lookup)
            .saturating_add(connections)
            .saturating_add(SENTINEL_PAUSE)
    }
}

/// The least bound on the full, `ROLE`-checked lookup of the master
/// ([`Master::find_with`]).
const LOOKUP_BOUND: Duration = Duration::from_secs(5);

/// One sentinel, and a connection to it once one is open (dropped when a
/// question fails, opened again at the next).
struct Sentinel {
    client: Client,
    conn: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    /// When its last question failed, and why: it is not asked again
    /// for [`SENTINEL_PAUSE`] (the same error stands meanwhile), so that
    /// one that hangs is not sent a new connection every tick.
    failed: Mutex<Option<(std::time::Instant, RedisError)>>,
}

/// How long a sentinel whose question failed is left alone.
const SENTINEL_PAUSE: Duration = Duration::from_secs(5);

impl Sentinel {
    /// The master's address as this sentinel names it (`None`: it knows
    /// no master by that name), within `bound`.
    async fn ask(&self, name: &str, bound: Duration) -> RedisResult<Option<(String, u16)>> {
        let failed = self
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some((at, e)) = failed {
            if at.elapsed() < SENTINEL_PAUSE {
                return Err(e);
            }
        }
        let answer = self.ask_now(name, bound).await;
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = match &answer {
            Err(e) => Some((std::time::Instant::now(), e.clone())),
            Ok(_) => None,
        };
        answer
    }

    /// [`Sentinel::ask`], whatever happened before.
    async fn ask_now(&self, name: &str, bound: Duration) -> RedisResult<Option<(String, u16)>> {
        let late = || {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "a sentinel did not answer in time",
            ))
        };
        let asked = tokio::time::timeout(bound, async {
            let mut conn = self.conn.lock().await;
            let mut c = match conn.as_ref() {
                Some(c) => c.clone(),
                None => {
                    let c = self.client.get_multiplexed_async_connection().await?;
                    *conn = Some(c.clone());
                    c
                }
            };
            let answer = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(name)
                .query_async::<Option<(String, String)>>(&mut c)
                .await;
            if answer.is_err() {
                *conn = None;
            }
            answer
        })
        .await;
        let answer = match asked {
            Ok(answer) => answer?,
            Err(_) => {
                // Dropped with the question: a connection that hung.
                if let Ok(mut conn) = self.conn.try_lock() {
                    *conn = None;
                }
                return Err(late());
            }
        };
        Ok(match answer {
            Some((host, port)) => Some((
                host,
                port.parse().map_err(|_| {
                    RedisError::from(std::io::Error::other(format!(
                        "a sentinel named the master at port `{port}`"
                    )))
                })?,
            )),
            None => None,
        })
    }
}

/// The host and port of a TCP address.
fn host_port(addr: &ConnectionAddr) -> Option<(&str, u16)> {
    match addr {
        ConnectionAddr::Tcp(h, p) => Some((h, *p)),
        ConnectionAddr::TcpTls { host, port, .. } => Some((host, *port)),
        _ => None,
    }
}

/// Open connections to one server or a cluster. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single {
        /// Connections that time nothing themselves (the module docs
        /// say why).
        links: Arc<[Link]>,
        next: Arc<AtomicUsize>,
        /// How long a command sent through [`Conn`] may take.
        timeout: Duration,
        /// The sentinels, when the server is a master they manage.
        master: Option<Arc<Master>>,
    },
    Cluster(ClusterConnection),
}

/// Where [`Conn::next`] sends a command.
enum Next<'a> {
    /// A single server's connection, how long the command may take, the
    /// master it goes to (empty without Sentinel), and a receiver told
    /// when its link moves on to another master ([`on_link`]).
    Single(
        ConnectionManager,
        Duration,
        Arc<str>,
        tokio::sync::watch::Receiver<Linked>,
    ),
    /// A cluster's client.
    Cluster(&'a ClusterConnection),
}

/// How a single server's connections are set up: no timer of their own
/// (the module docs say why), reconnection forever with backoff.
fn manager_config(options: &ConnectOptions) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(options.connect_timeout))
        .set_max_delay(options.max_reconnect_delay)
        .set_min_delay(Duration::from_millis(10))
        .set_number_of_retries(usize::MAX)
}

/// `n` connections to `client`'s server, each within `connect_timeout`
/// (the error of one plain attempt when it times out: [`why_not`]).
async fn open_managers(
    client: &Client,
    config: &ConnectionManagerConfig,
    n: usize,
    connect_timeout: Duration,
) -> RedisResult<Vec<ConnectionManager>> {
    let mut managers = Vec::with_capacity(n.max(1));
    for _ in 0..n.max(1) {
        let m = tokio::time::timeout(
            connect_timeout,
            client.get_connection_manager_with_config(config.clone()),
        )
        .await;
        match m {
            Ok(m) => managers.push(m?),
            Err(_) => return Err(why_not(client, connect_timeout).await),
        }
    }
    Ok(managers)
}

/// The sentinels' client for `target`: the URL's credentials (or
/// `options.password`) and the TLS material go to the master; the TLS
/// material to the sentinels too, and the sentinels' own password when
/// they require one.
fn sentinel_client(
    target: &SentinelTarget,
    options: &ConnectOptions,
    tls: Option<TlsCertificates>,
) -> RedisResult<SentinelClient> {
    let addrs = target.sentinels.iter().map(|(host, port)| {
        if target.tls {
            ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.clone(), *port)
        }
    });
    let mut b = SentinelClientBuilder::new(addrs, &target.master, SentinelServerType::Master)?
        .set_client_to_redis_db(target.db);
    if let Some(pw) = &target.sentinel_password {
        b = b.set_client_to_sentinel_password(pw);
    }
    if let Some(user) = &target.username {
        b = b.set_client_to_redis_username(user);
    }
    if let Some(pw) = options.password.as_ref().or(target.password.as_ref()) {
        b = b.set_client_to_redis_password(pw);
    }
    if target.tls {
        b = b
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(certs) = tls {
            b = b
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs);
        }
    }
    b.build()
}

impl Conn {
    /// Connects; fails if Redis does not answer now, so a bad address is a
    /// startup error rather than a server that never serves.
    pub(crate) async fn open(
        target: &RedisTarget,
        options: &ConnectOptions,
    ) -> Result<Conn, ConnectError> {
        let tls = checked_tls(target, options)?;
        match target {
            RedisTarget::Single(url) => {
                let connect_err = |cause| ConnectError::Connect {
                    url: redact(url),
                    cause,
                };
                let mut info = url.as_str().into_connection_info().map_err(connect_err)?;
                if let Some(pw) = &options.password {
                    let settings = info.redis_settings().clone().set_password(pw);
                    info = info.set_redis_settings(settings);
                }
                let client = match tls {
                    Some(certs) => Client::build_with_tls(info, certs),
                    None => Client::open(info),
                }
                .map_err(connect_err)?;
                let config = manager_config(options);
                let managers = open_managers(
                    &client,
                    &config,
                    options.connections,
                    options.connect_timeout,
                )
                .await
                .map_err(connect_err)?;
                let plain: Arc<str> = Arc::from("");
                Ok(Conn::Single {
                    links: managers
                        .into_iter()
                        .map(|m| Link::new(m, Arc::clone(&plain)))
                        .collect(),
                    next: Arc::new(AtomicUsize::new(0)),
                    timeout: options.response_timeout,
                    master: None,
                })
            }
            RedisTarget::Sentinel(s) => {
                let connect_err = |cause| ConnectError::Connect {
                    url: s.shown(),
                    cause,
                };
                let asked = s
                    .sentinels
                    .iter()
                    .map(|(host, port)| {
                        let info = s.sentinel_info(host, *port)?;
                        let client = match &tls {
                            Some(certs) => Client::build_with_tls(info, certs.clone()),
                            None => Client::open(info),
                        }?;
                        Ok(Arc::new(Sentinel {
                            client,
                            conn: tokio::sync::Mutex::new(None),
                            failed: Mutex::new(None),
                        }))
                    })
                    .collect::<RedisResult<Vec<_>>>()
                    .map_err(connect_err)?;
                let sentinels = sentinel_client(s, options, tls).map_err(connect_err)?;
                let master = Master {
                    client: tokio::sync::Mutex::new(sentinels),
                    sentinels: asked,
                    name: s.master.clone(),
                    addr: Mutex::new(ConnectionAddr::Tcp(String::new(), 0)),
                    // A connection left behind on an old master that died
                    // must stop reconnecting to it: each reconnection
                    // gives up after about half a minute. The current
                    // master's connections start one again at the next
                    // command that fails to reach it (the ping, every
                    // 500 ms, is one).
                    config: manager_config(options).set_number_of_retries(SENTINEL_RETRIES),
                    connect_timeout: options.connect_timeout,
                    shown: s.shown(),
                };
                let client = master.find().await.map_err(connect_err)?;
                let managers = open_managers(
                    &client,
                    &master.config,
                    options.connections,
                    options.connect_timeout,
                )
                .await
                .map_err(connect_err)?;
                let addr = client.get_connection_info().addr().clone();
                tracing::info!(url = %master.shown, master = %addr, "the sentinels name the master");
                let named: Arc<str> = Arc::from(addr.to_string());
                *master.addr.lock().unwrap_or_else(PoisonError::into_inner) = addr;
                Ok(Conn::Single {
                    links: managers
                        .into_iter()
                        .map(|m| Link::new(m, Arc::clone(&named)))
                        .collect(),
                    next: Arc::new(AtomicUsize::new(0)),
                    timeout: options.response_timeout,
                    master: Some(Arc::new(master)),
                })
            }
            RedisTarget::Cluster { seeds } => {
                let connect_err = |cause| ConnectError::Connect {
                    url: target.shown(),
                    cause,
                };
                let mut builder = ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                    .connection_timeout(options.connect_timeout)
                    .response_timeout(options.response_timeout);
                if let Some(pw) = &options.password {
                    builder = builder.password(pw.clone());
                }
                if let Some(certs) = tls {
                    builder = builder.certs(certs);
                }
                let client = builder.build().map_err(connect_err)?;
                let conn = tokio::time::timeout(
                    options.connect_timeout * 4,
                    client.get_async_connection(),
                )
                .await
                .map_err(|_| {
                    connect_err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "cluster connection timed out",
                    )))
                })?
                .map_err(connect_err)?;
                Ok(Conn::Cluster(conn))
            }
        }
    }

    /// Where the next command goes: a single server's next connection,
    /// round robin (a clone: the same multiplexed connection), with the
    /// bound on commands sent through [`Conn`]; or the cluster client,
    /// which routes each command itself.
    fn next(&self) -> Next<'_> {
        match self {
            Conn::Single {
                links,
                next,
                timeout,
                ..
            } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % links.len();
                // The connection is read through the receiver, so that a
                // switch after this read is one the receiver sees.
                let mut moved = links[i].subscribe();
                let linked = moved.borrow_and_update().clone();
                Next::Single(linked.conn, *timeout, linked.master, moved)
            }
            Conn::Cluster(c) => Next::Cluster(c),
        }
    }

    /// Runs a script invocation on the next connection.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self.next() {
            Next::Single(mut c, timeout, _, moved) => {
                on_link(timeout, moved, inv.invoke_async(&mut c)).await
            }
            Next::Cluster(c) => inv.invoke_async(&mut c.clone()).await,
        }
    }

    /// Runs a script invocation on the next connection, with the address
    /// of the master that connection goes to (as the sentinels named it;
    /// empty without Sentinel) as its last argument: the copy log's
    /// heartbeats tell the live set which master they reached, read
    /// together with the connection, so a heartbeat never names the old
    /// master and reaches the new one while the store follows a failover.
    pub(crate) async fn invoke_naming_master<T: FromRedisValue>(
        &self,
        inv: &mut ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self.next() {
            Next::Single(mut c, timeout, master, moved) => {
                inv.arg(&*master);
                on_link(timeout, moved, inv.invoke_async(&mut c)).await
            }
            Next::Cluster(c) => {
                inv.arg("");
                inv.invoke_async(&mut c.clone()).await
            }
        }
    }

    /// Runs a command on the next connection (a cluster routes it by its
    /// first key, or to a random node when it has none).
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match self.next() {
            Next::Single(mut c, timeout, _, moved) => {
                on_link(timeout, moved, cmd.query_async(&mut c)).await
            }
            Next::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Sends a packed command on the next connection (a cluster routes it
    /// by its first key), loading `decide` first if Redis answers
    /// `NOSCRIPT`.
    pub(crate) async fn send_decide(&self, cmd: &redis::Cmd) -> RedisResult<redis::Value> {
        match self.next() {
            Next::Single(mut c, timeout, _, moved) => {
                on_link(timeout, moved, crate::batch::send(&mut c, cmd)).await
            }
            Next::Cluster(c) => crate::batch::send(&mut c.clone(), cmd).await,
        }
    }

    /// A single server's links, one per multiplexed connection, with
    /// no timeout of their own (for the decision drivers, which time
    /// Redis's silence); none for a cluster.
    pub(crate) fn links(&self) -> Vec<Link> {
        match self {
            Conn::Single { links, .. } => links.to_vec(),
            Conn::Cluster(_) => Vec::new(),
        }
    }

    /// With Sentinel: asks the sentinels which server is the master, and
    /// when it is not the one the connections go to, opens connections to
    /// it and puts them in every link. `Ok(Some(address))` when the
    /// connections moved; `Ok(None)` when the master is the same, or
    /// without Sentinel. Calls are serialised (the sentinels' client stays
    /// locked throughout): two at once would both see the new master and
    /// open two sets of connections (review of issue 18, finding 7).
    pub(crate) async fn follow_master(&self) -> RedisResult<Option<String>> {
        let Conn::Single {
            links,
            master: Some(m),
            ..
        } = self
        else {
            return Ok(None);
        };
        let mut sentinels = m.client.lock().await;
        let current = m
            .addr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let named = m.named(host_port(&current)).await?;
        if host_port(&current) == Some((named.0.as_str(), named.1)) {
            return Ok(None);
        }
        // The sentinels name another server: the full lookup, which
        // checks that it is a master, and gives its client.
        let client = m.find_with(&mut sentinels).await?;
        let addr = client.get_connection_info().addr().clone();
        if *m.addr.lock().unwrap_or_else(PoisonError::into_inner) == addr {
            return Ok(None);
        }
        let managers = open_managers(&client, &m.config, links.len(), m.connect_timeout).await?;
        let shown = addr.to_string();
        let named: Arc<str> = Arc::from(shown.as_str());
        for (link, new) in links.iter().zip(managers) {
            link.set(new, Arc::clone(&named));
        }
        *m.addr.lock().unwrap_or_else(PoisonError::into_inner) = addr;
        Ok(Some(shown))
    }

    /// With Sentinel: the longest this server takes to follow a failover
    /// once the sentinels name the new master, asking them every
    /// `interval` ([`Master::follow_bound`]); `None` without Sentinel.
    pub(crate) fn follow_bound(&self, interval: Duration) -> Option<Duration> {
        match self {
            Conn::Single {
                links,
                master: Some(m),
                ..
            } => Some(m.follow_bound(interval, links.len())),
            _ => None,
        }
    }

    /// The master's address as last found (Sentinel only).
    pub(crate) fn master_addr(&self) -> Option<String> {
        match self {
            Conn::Single {
                master: Some(m), ..
            } => Some(
                m.addr
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .to_string(),
            ),
            _ => None,
        }
    }

    /// Whether this is a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

/// `request`, failed with a timeout (the error redis-rs gives for its own)
/// if it takes longer than `limit`. Dropping a request a multiplexed
/// connection has sent is what redis-rs's own timeout does too: its reply,
/// should it come, is read and dropped.
async fn bounded<T>(
    limit: Duration,
    request: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    tokio::time::timeout(limit, request)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()))
}

/// `request`, sent on a link's connection, bounded as by [`bounded`], and
/// failed at once when the link moves to another master (`moved`: a
/// Sentinel failover): an old master that died without closing its
/// sockets would hold it for its whole bound (at least the heartbeat TTL
/// for heartbeats and copy operations), and the pool's other operations,
/// or the heartbeat, behind it. Whoever sent it sends it again on the new
/// master (copy operations carry their id; heartbeats, registrations and
/// cleanups are idempotent). The error is not a connection error: the
/// store is not down.
async fn on_link<T>(
    limit: Duration,
    mut moved: tokio::sync::watch::Receiver<Linked>,
    request: impl std::future::Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    tokio::select! {
        answer = bounded(limit, request) => answer,
        // A closed channel (no link any more) disables this branch.
        Ok(()) = moved.changed() => Err(RedisError::from((
            redis::ErrorKind::Client,
            "the Redis master changed (a Sentinel failover) while this command was in flight",
        ))),
    }
}

/// Why `client` cannot reach its server: the error of one attempt to
/// connect and PING. A connection manager retries whatever fails until
/// its caller's timeout, which hides the cause (a refused connection, a
/// server certificate not signed by a trusted CA, a server that wants a
/// client certificate); a single attempt shows it.
async fn why_not(client: &Client, timeout: Duration) -> RedisError {
    let timed_out = || {
        RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connection timed out",
        ))
    };
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let attempt = async {
        let mut c = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("PING").query_async::<()>(&mut c).await
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Err(e)) => e,
        // It answers now, or is still silent: the timeout it was.
        Ok(Ok(())) | Err(_) => timed_out(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_give_one_seed_per_host() {
        let t = RedisTarget::parse("redis-cluster://:pw@a:1,b:2").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            t,
            RedisTarget::Cluster {
                seeds: vec!["redis://:pw@a:1".into(), "redis://:pw@b:2".into()]
            }
        );
        assert!(RedisTarget::parse("memcached://x").is_err());
        assert!(RedisTarget::parse("redis-cluster://").is_err());
        let err = RedisTarget::parse("nonsense")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("expected `memory` (the embedded store), or a URL: redis://"),
            "{err}"
        );
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_the_master_and_the_database() {
        let t = RedisTarget::parse("redis-sentinel://:pw@a:26380, b ,[::1]:7/mymaster/2")
            .unwrap_or_else(|e| panic!("{e}"));
        let RedisTarget::Sentinel(s) = &t else {
            panic!("{t:?}")
        };
        assert_eq!(
            s.sentinels,
            vec![
                ("a".to_owned(), 26380),
                ("b".to_owned(), SENTINEL_PORT),
                ("::1".to_owned(), 7)
            ]
        );
        assert_eq!((s.master.as_str(), s.db, s.tls), ("mymaster", 2, false));
        assert_eq!(s.password.as_deref(), Some("pw"));
        // Neither Debug nor errors show the password.
        assert!(!format!("{t:?}").contains("pw"), "{t:?}");
        assert_eq!(
            t.shown(),
            "redis-sentinel://***@a:26380,b:26379,[::1]:7/mymaster"
        );
        let tls = RedisTarget::parse("rediss-sentinel://h:1/m").unwrap_or_else(|e| panic!("{e}"));
        assert!(tls.is_tls());
        // Regression (review of issue 18, finding 9): a master name with
        // an `@` was read as credentials `h/my`. Credentials still end at
        // the `@` before the sentinels (percent-encoded, as in redis://).
        for (url, master, password) in [
            ("redis-sentinel://h/my@master", "my@master", None),
            ("redis-sentinel://:pw@h/my@master", "my@master", Some("pw")),
            ("redis-sentinel://:a%2Fb%40c@h:1/m", "m", Some("a/b@c")),
            ("redis-sentinel://:p%3Fw@h/m", "m", Some("p?w")),
        ] {
            let t = RedisTarget::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            let RedisTarget::Sentinel(s) = &t else {
                panic!("{t:?}")
            };
            assert_eq!(
                (s.master.as_str(), s.password.as_deref()),
                (master, password),
                "{url}"
            );
        }
    }

    #[test]
    fn bad_sentinel_urls_name_what_is_wrong() {
        for (url, want) in [
            ("redis-sentinel://h:26379", "no master name"),
            ("redis-sentinel://h:26379/", "no master name"),
            (
                "redis-sentinel:///mymaster",
                "no sentinels before the master name",
            ),
            (
                "redis-sentinel://,/mymaster",
                "no sentinels before the master name",
            ),
            (
                "redis-sentinel://a:1,b:port/m",
                "bad port `port` of sentinel `b:port`: a number from 1 to 65535",
            ),
            ("redis-sentinel://a:0/m", "bad port `0` of sentinel `a:0`"),
            ("redis-sentinel://a:70000/m", "bad port `70000`"),
            ("redis-sentinel://:1/m", "sentinel `:1` has no host"),
            (
                "redis-sentinel://a/m/x",
                "bad database `x` after the master name",
            ),
            ("redis-sentinel://a/m?x=1", "takes no query"),
            (
                "redis-sentinel://a:1,b,a:1/m",
                "sentinel `a:1` is listed twice",
            ),
            (
                "redis-sentinel://h1,h2,h3,h4,h5,h6,h7,h8,h9,h10,h11,h12,h13,h14,h15,h16,h17/m",
                "17 sentinels: at most 16 are asked",
            ),
        ] {
            let err = RedisTarget::parse(url)
                .map(|t| format!("{t:?}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{url}: {err}");
        }
        for url in [
            "redis-sentinel://:hunter2@a:x/m",
            // Regression (review of issue 18, finding 3): refused for its
            // `?` or `#`, and shown whole.
            "redis-sentinel://:hunter2?@a:1/m",
            "redis-sentinel://:hun#ter2@a:1/m",
            // Not percent-encoded: cannot be read, and not shown.
            "redis-sentinel://:hunter2/x@y@a:1/m",
        ] {
            let err = RedisTarget::parse(url)
                .map(|t| format!("{t:?}"))
                .unwrap_err()
                .to_string();
            assert!(
                !err.contains("hunter2") && !err.contains("ter2") && err.contains("***"),
                "{err}"
            );
        }
    }

    #[test]
    fn only_rediss_urls_use_tls() {
        let tls = |url: &str| {
            RedisTarget::parse(url)
                .unwrap_or_else(|e| panic!("{e}"))
                .is_tls()
        };
        assert!(tls("rediss://h:1/0"));
        assert!(tls("rediss-cluster://a:1,b:2"));
        assert!(!tls("redis://h:1/0"));
        assert!(!tls("redis-cluster://a:1,b:2"));
    }

    #[test]
    fn debug_shows_no_key_and_no_password() {
        let o = ConnectOptions {
            password: Some("hunter2".into()),
            tls_ca: Some(b"CA-PEM".to_vec()),
            tls_client: Some(ClientCert {
                cert_pem: b"CERT-PEM".to_vec(),
                key_pem: b"KEY-PEM".to_vec(),
            }),
            ..ConnectOptions::default()
        };
        let shown = format!("{o:?}");
        for secret in ["hunter2", "KEY-PEM", "75, 69, 89"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
