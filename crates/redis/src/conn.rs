//! Connections to Redis: one server or a cluster, multiplexed, with
//! timeouts and reconnection.
//!
//! A single server is reached through a few [`ConnectionManager`]s, each
//! one multiplexed TCP (or TLS) connection that pipelines every command
//! sent on it while earlier ones are in flight, and reconnects by itself
//! with exponential backoff when the connection breaks. Decisions from
//! many clients are spread over them round robin, so a handful of
//! connections carry any number of concurrent decisions (seed 002,
//! "multiple round trips"). A cluster is reached through the cluster
//! client's own multiplexed connection per node, which routes each script
//! call by its first key's slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    Client, FromRedisValue, IntoConnectionInfo, RedisError, RedisResult, ScriptInvocation,
};
use thiserror::Error;

/// Where the store's Redis is, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// One server: `redis://` or `rediss://` (TLS).
    Single(String),
    /// A cluster, by seed nodes: `redis-cluster://a:6379,b:6379` or
    /// `rediss-cluster://...` (TLS).
    Cluster {
        /// The seed nodes as `redis://` or `rediss://` URLs.
        seeds: Vec<String>,
    },
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
    /// Redis did not answer.
    #[error("cannot connect to Redis at {url}: {source}")]
    Connect {
        /// The URL, with any password removed.
        url: String,
        /// The client's error.
        source: RedisError,
    },
}

/// `url` with the password (if any) replaced, for logs and errors.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let host_end = rest.find('/').unwrap_or(rest.len());
    match rest[..host_end].rfind('@') {
        Some(at) => format!("{}://***@{}", &url[..scheme_end], &rest[at + 1..]),
        None => url.to_owned(),
    }
}

impl Target {
    /// Parses `--store`'s URL.
    pub fn parse(url: &str) -> Result<Target, ConnectError> {
        let bad = |reason: &str| ConnectError::BadUrl {
            url: redact(url),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            bad("expected redis://, rediss://, redis-cluster:// or rediss-cluster://")
        })?;
        match scheme {
            "redis" | "rediss" => {
                url.into_connection_info()
                    .map_err(|e| bad(&e.to_string()))?;
                Ok(Target::Single(url.to_owned()))
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
                Ok(Target::Cluster { seeds })
            }
            other => Err(bad(&format!(
                "unknown scheme `{other}` (expected redis, rediss, redis-cluster or rediss-cluster)"
            ))),
        }
    }
}

/// How to connect.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// A password that overrides the URL's (`TOLLGATE_REDIS_PASSWORD`).
    pub password: Option<String>,
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
            connections: 2,
            response_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            max_reconnect_delay: Duration::from_secs(2),
        }
    }
}

/// Open connections to one server or a cluster. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single {
        managers: Arc<[ConnectionManager]>,
        next: Arc<AtomicUsize>,
    },
    Cluster(ClusterConnection),
}

impl Conn {
    /// Connects; fails if Redis does not answer now, so a bad address is a
    /// startup error rather than a server that never serves.
    pub(crate) async fn open(
        target: &Target,
        options: &ConnectOptions,
    ) -> Result<Conn, ConnectError> {
        match target {
            Target::Single(url) => {
                let connect_err = |source| ConnectError::Connect {
                    url: redact(url),
                    source,
                };
                let mut info = url.as_str().into_connection_info().map_err(connect_err)?;
                if let Some(pw) = &options.password {
                    let settings = info.redis_settings().clone().set_password(pw);
                    info = info.set_redis_settings(settings);
                }
                let client = Client::open(info).map_err(connect_err)?;
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(options.response_timeout))
                    .set_connection_timeout(Some(options.connect_timeout))
                    .set_max_delay(options.max_reconnect_delay)
                    .set_min_delay(Duration::from_millis(10))
                    .set_number_of_retries(usize::MAX);
                let mut managers = Vec::with_capacity(options.connections.max(1));
                for _ in 0..options.connections.max(1) {
                    let m = tokio::time::timeout(
                        options.connect_timeout,
                        client.get_connection_manager_with_config(config.clone()),
                    )
                    .await
                    .map_err(|_| {
                        connect_err(RedisError::from(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "connection timed out",
                        )))
                    })?
                    .map_err(connect_err)?;
                    managers.push(m);
                }
                Ok(Conn::Single {
                    managers: managers.into(),
                    next: Arc::new(AtomicUsize::new(0)),
                })
            }
            Target::Cluster { seeds } => {
                let shown = seeds
                    .iter()
                    .map(|s| redact(s))
                    .collect::<Vec<_>>()
                    .join(",");
                let connect_err = |source| ConnectError::Connect {
                    url: shown.clone(),
                    source,
                };
                let mut builder = ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                    .connection_timeout(options.connect_timeout)
                    .response_timeout(options.response_timeout);
                if let Some(pw) = &options.password {
                    builder = builder.password(pw.clone());
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

    /// Runs a script invocation on the next connection.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        inv: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        match self {
            Conn::Single { managers, next } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % managers.len();
                let mut c = managers[i].clone();
                inv.invoke_async(&mut c).await
            }
            Conn::Cluster(c) => inv.invoke_async(&mut c.clone()).await,
        }
    }

    /// Runs a command on the next connection (a cluster routes it by its
    /// first key, or to a random node when it has none).
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match self {
            Conn::Single { managers, next } => {
                let i = next.fetch_add(1, Ordering::Relaxed) % managers.len();
                let mut c = managers[i].clone();
                cmd.query_async(&mut c).await
            }
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Whether this is a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
    }

    #[test]
    fn cluster_urls_give_one_seed_per_host() {
        let t = Target::parse("redis-cluster://:pw@a:1,b:2").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            t,
            Target::Cluster {
                seeds: vec!["redis://:pw@a:1".into(), "redis://:pw@b:2".into()]
            }
        );
        assert!(Target::parse("memcached://x").is_err());
        assert!(Target::parse("redis-cluster://").is_err());
        let err = Target::parse("nonsense")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected redis://"), "{err}");
    }
}
