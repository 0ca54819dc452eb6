//! `tollgate serve`: the limiting server.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::backend::{self, Backend};
use super::store_rules;
use crate::config_follow::{Follower, TokenRefused, TokenSource};
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};
use tollgate_core::replicated::strategy::StrategyKind;
use tollgate_core::replicated::NodeId;
use tollgate_core::Nanos;
use tollgate_redis::{ClientCert, ConnectError, ConnectOptions, RedisOptions, TlsPart};
use tollgate_replica::discovery::Seed;
use tollgate_replica::Dissemination;
use tollgate_server::app::ApiPart;
use tollgate_server::{App, Server, ServerOptions};
use tollgate_service::{
    Clock, Limiter, ServiceOptions, SessionLimits, SystemClock, Unserved, View,
};
use tollgate_store::Store;

/// The config served when none is given: the bundled example.
const BUNDLED: &str = include_str!("../../../../examples/tollgate.yaml");

/// Log output formats.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Arguments of `tollgate serve`. Every flag also reads an environment
/// variable; a flag given on the command line wins.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Check the flags, the config (against the rules of the store it
    /// would run on), the TLS files, the store URL and the cluster secret,
    /// print a one-line summary and exit, without binding a port or
    /// contacting anything (Redis, peers, the config API).
    #[arg(long)]
    pub check: bool,
    /// Config file or directory (default: the bundled example, unless
    /// --config-api is given).
    #[arg(long, env = "TOLLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Follow the configuration API at this URL (`http://` or `https://`):
    /// its namespaces are served, with the config file's if both are given.
    // The URL's value stays out of --help: it may hold a password.
    #[arg(long, env = "TOLLGATE_CONFIG_API", hide_env_values = true)]
    pub config_api: Option<String>,
    /// A `read` token of the config API, read from this file (never
    /// logged); or set TOLLGATE_CONFIG_API_TOKEN.
    #[arg(long, env = "TOLLGATE_CONFIG_API_TOKEN_FILE")]
    pub config_api_token_file: Option<PathBuf>,
    /// PEM CA that signs the config API's certificate.
    #[arg(long, env = "TOLLGATE_CONFIG_API_CA")]
    pub config_api_ca: Option<PathBuf>,
    /// Longest time between two looks at the config API, in milliseconds
    /// (changes arrive at once through a long poll; this bounds a poll).
    #[arg(long, env = "TOLLGATE_CONFIG_API_POLL_MS", default_value_t = 30_000)]
    pub config_api_poll_ms: u64,
    /// How long to wait at startup for the config API's first answer.
    #[arg(long, default_value_t = 30_000)]
    pub config_api_startup_ms: u64,
    /// gRPC address: the native API and Envoy's rate-limit service.
    #[arg(long, env = "TOLLGATE_GRPC", default_value = "127.0.0.1:8081")]
    pub grpc: SocketAddr,
    /// HTTP address: the JSON API, /json, /status, /metrics.
    #[arg(long, env = "TOLLGATE_HTTP", default_value = "127.0.0.1:8080")]
    pub http: SocketAddr,
    /// Log format. What is logged is TOLLGATE_LOG's filter (`info` by
    /// default; `debug`, `info,tollgate_server=debug`, ...).
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// How often the config file is checked for changes (milliseconds).
    #[arg(long, env = "TOLLGATE_WATCH_INTERVAL_MS", default_value_t = 1000)]
    pub watch_interval_ms: u64,
    /// Sessions (gRPC session streams and HTTP holds) open at once.
    #[arg(long, env = "TOLLGATE_MAX_SESSIONS", default_value_t = 100_000)]
    pub max_sessions: usize,
    /// Distinct (resource, domain, groups) entries one session or HTTP hold
    /// may hold copies under.
    #[arg(long, env = "TOLLGATE_MAX_HOLDS_PER_SESSION", default_value_t = 1000)]
    pub max_holds_per_session: usize,
    /// Longest namespace, resource or domain name of a hold (reserve,
    /// release, transfer), in bytes.
    #[arg(long, env = "TOLLGATE_MAX_NAME_BYTES", default_value_t = 1024)]
    pub max_name_bytes: usize,
    /// How long a copy operation (reserve, release, transfer, seize) waits
    /// for the store before its caller is told it failed; the operation is
    /// then undone if the store applies it later (milliseconds).
    #[arg(long, env = "TOLLGATE_COPY_DEADLINE_MS", default_value_t = 1000)]
    pub copy_deadline_ms: u64,
    /// Copy operations that may wait for the store at once; past it, new
    /// ones are answered `store_unavailable` at once.
    #[arg(
        long,
        env = "TOLLGATE_MAX_COPY_OPS_IN_FLIGHT",
        default_value_t = 10_000
    )]
    pub max_copy_ops_in_flight: usize,
    /// Concurrent streams (sessions and in-flight requests) per gRPC
    /// connection.
    #[arg(
        long,
        env = "TOLLGATE_MAX_STREAMS_PER_CONNECTION",
        default_value_t = 1024
    )]
    pub max_streams_per_connection: u32,
    /// Largest request message or HTTP body, in bytes.
    #[arg(long, env = "TOLLGATE_MAX_MESSAGE_BYTES", default_value_t = 64 * 1024)]
    pub max_message_bytes: usize,
    /// Most keys the memory store keeps (a flood of unique domains beyond
    /// it is decided untracked).
    #[arg(long, env = "TOLLGATE_MAX_KEYS", default_value_t = 10_000_000)]
    pub max_keys: usize,
    /// Most transfers the memory store keeps staged at once (each holds
    /// copies until seized or expired); beyond it a transfer is refused
    /// with `too_many_transfers`.
    #[arg(long, env = "TOLLGATE_MAX_TRANSFERS", default_value_t = 1_000_000)]
    pub max_transfers: usize,
    /// Record decisions as JSON lines `tollgate replay` reads back: a file
    /// (appended to), or `-` for standard output.
    #[arg(long, env = "TOLLGATE_DECISION_LOG")]
    pub decision_log: Option<tollgate_server::decision_log::LogTarget>,
    /// PEM certificate chain: serve TLS on both ports (with --tls-key).
    #[arg(long, env = "TOLLGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (read from the file; never logged).
    #[arg(long, env = "TOLLGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates: require client certificates signed by them
    /// (mutual TLS) on both ports.
    #[arg(long, env = "TOLLGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// How long a shutdown waits for open connections before closing them
    /// (milliseconds).
    #[arg(long, env = "TOLLGATE_SHUTDOWN_GRACE_MS", default_value_t = 10_000)]
    pub shutdown_grace_ms: u64,
    /// How long a shutdown keeps serving after it begins, with /readyz and
    /// gRPC health already saying "stopping", before the ports close
    /// (milliseconds): time for a load balancer (Kubernetes' endpoints) to
    /// stop sending new requests here.
    #[arg(long, env = "TOLLGATE_SHUTDOWN_DELAY_MS", default_value_t = 0)]
    pub shutdown_delay_ms: u64,
    /// Connection cap and handshake, header, idle and body timeouts.
    #[command(flatten)]
    pub connections: super::connections::ServeConnectionArgs,
    /// Trace export: a span per decision over OTLP (off by default).
    #[command(flatten)]
    pub otlp: super::otlp::OtlpArgs,
    /// Bearer tokens for the admin endpoints (GET /v1/denied), one
    /// `ROLE:NAME:TOKEN` per line as the config API's (`read` suffices);
    /// without it those endpoints are off. Tokens are never logged.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKENS_FILE")]
    pub admin_tokens_file: Option<PathBuf>,
    /// RateLimit headers of HTTP answers, the near-limit ratio, and the
    /// most refused domains on /metrics.
    #[command(flatten)]
    pub answers: super::answers::ServeAnswerArgs,
    /// Add RateLimit-Limit/Remaining/Reset headers to Envoy RLS answers.
    #[arg(long, env = "TOLLGATE_RLS_RESPONSE_HEADERS")]
    pub rls_response_headers: bool,
    /// Fraction of decisions recorded in the decision log, in (0, 1].
    #[arg(long, env = "TOLLGATE_DECISION_LOG_SAMPLE", default_value_t = 1.0)]
    pub decision_log_sample: f64,
    /// Where limit state lives: `memory` (embedded, the default), or Redis
    /// shared by a fleet of servers: `redis://HOST:PORT/DB`, `rediss://`
    /// (TLS), `redis-cluster://SEED,SEED,...`, `rediss-cluster://`, or
    /// `redis-sentinel://SENTINEL,SENTINEL,.../MASTER_NAME` (the master
    /// the sentinels name, followed across failovers; `rediss-sentinel://`).
    // The URL's value stays out of --help: it may hold a password.
    #[arg(
        long,
        env = "TOLLGATE_STORE",
        default_value = "memory",
        hide_env_values = true
    )]
    pub store: String,
    /// Prefix of every Redis key, so one Redis can serve several
    /// deployments.
    #[arg(long, env = "TOLLGATE_STORE_PREFIX", default_value = "tollgate:")]
    pub store_prefix: String,
    /// File holding the Redis password (overrides one in the URL). The
    /// password can also come from TOLLGATE_REDIS_PASSWORD; it is never
    /// logged.
    #[arg(long, env = "TOLLGATE_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,
    /// File holding the password of sentinels that require one
    /// (`redis-sentinel://` only; the master's password is
    /// --redis-password-file's). It can also come from
    /// TOLLGATE_REDIS_SENTINEL_PASSWORD; it is never logged.
    #[arg(long, env = "TOLLGATE_REDIS_SENTINEL_PASSWORD_FILE")]
    pub redis_sentinel_password_file: Option<PathBuf>,
    /// PEM CA certificates that Redis's TLS certificate must chain to,
    /// instead of the system's roots (`rediss://` only).
    #[arg(long, env = "TOLLGATE_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to Redis, for mutual TLS (with
    /// --redis-key-file; `rediss://` only).
    #[arg(long, env = "TOLLGATE_REDIS_CERT_FILE")]
    pub redis_cert_file: Option<PathBuf>,
    /// PEM private key of --redis-cert-file (read from the file; never
    /// logged).
    #[arg(long, env = "TOLLGATE_REDIS_KEY_FILE")]
    pub redis_key_file: Option<PathBuf>,
    /// Multiplexed connections to a single Redis server; every concurrent
    /// decision is pipelined over them.
    #[arg(long, env = "TOLLGATE_REDIS_CONNECTIONS", default_value_t = 2)]
    pub redis_connections: usize,
    /// How long Redis may leave the oldest decision call on a connection
    /// unanswered, counted from its sending or Redis's last answer on that
    /// connection, before every decision waiting on it fails
    /// (milliseconds). A busy Redis that keeps answering is waited for
    /// (docs/redis.md).
    #[arg(long, env = "TOLLGATE_REDIS_TIMEOUT_MS", default_value_t = 50)]
    pub redis_timeout_ms: u64,
    /// How long one connection attempt to Redis may take (milliseconds).
    #[arg(
        long,
        env = "TOLLGATE_REDIS_CONNECT_TIMEOUT_MS",
        default_value_t = 1000
    )]
    pub redis_connect_timeout_ms: u64,
    /// Longest pause between reconnection attempts (milliseconds).
    #[arg(
        long,
        env = "TOLLGATE_REDIS_MAX_RECONNECT_DELAY_MS",
        default_value_t = 2000
    )]
    pub redis_max_reconnect_delay_ms: u64,
    /// Keys the local over-limit cache keeps: a key Redis rejected is
    /// answered by this server, exactly as Redis would, until it could
    /// admit again (docs/redis.md). 0 turns the cache off.
    #[arg(
        long,
        env = "TOLLGATE_REDIS_REJECTION_CACHE",
        default_value_t = tollgate_redis::DEFAULT_REJECTION_CACHE
    )]
    pub redis_rejection_cache: usize,
    /// The longest an entry of the over-limit cache lives (milliseconds),
    /// however far off its key could admit again: how long a Redis that
    /// lost its data may still be answered by what it had. 0 turns the
    /// cache off.
    #[arg(
        long,
        env = "TOLLGATE_REDIS_REJECTION_CACHE_MS",
        default_value_t = 1000
    )]
    pub redis_rejection_cache_ms: u64,
    /// Decisions that may wait to be sent to a single Redis; one more is
    /// shed at once, answered `store_overloaded`.
    #[arg(
        long,
        env = "TOLLGATE_REDIS_MAX_WAITING",
        default_value_t = tollgate_redis::DEFAULT_MAX_WAITING
    )]
    pub redis_max_waiting: usize,
    /// How long this server's heartbeat in Redis lasts (milliseconds): when
    /// it lapses, another server releases the holds of this one's clients.
    #[arg(long, env = "TOLLGATE_HEARTBEAT_TTL_MS", default_value_t = 5000)]
    pub heartbeat_ttl_ms: u64,
    /// After resigning from the copy log (heartbeat lapsed), keep serving
    /// rate limits instead of exiting; holds are refused.
    #[arg(long, env = "TOLLGATE_KEEP_SERVING_AFTER_RESIGN")]
    pub keep_serving_after_resign: bool,
    /// Join the replicated gossip cluster NAME instead of using a store:
    /// every server decides locally and gossips its state to its peers
    /// (docs/replicated.md). Servers of another cluster are ignored.
    #[arg(long, env = "TOLLGATE_CLUSTER", conflicts_with = "store")]
    pub cluster: Option<String>,
    /// This server's id in the cluster: any name, unique in the cluster
    /// and kept across restarts (its grants are counted under it).
    #[arg(long, env = "TOLLGATE_NODE_ID", requires = "cluster")]
    pub node_id: Option<String>,
    /// UDP address the cluster's gossip listens on (port 0 picks one).
    #[arg(long, env = "TOLLGATE_GOSSIP", default_value = "127.0.0.1:7946")]
    pub gossip: SocketAddr,
    /// The gossip address peers reach this server at, when it differs
    /// from --gossip (an unspecified --gossip such as 0.0.0.0 needs it).
    #[arg(long, env = "TOLLGATE_GOSSIP_ADVERTISE")]
    pub gossip_advertise: Option<SocketAddr>,
    /// Seed peers, comma-separated: gossip addresses (IP:PORT), or
    /// dns:NAME:PORT for every A and AAAA record of NAME (a Kubernetes
    /// headless Service), re-resolved every --peers-refresh-ms; other
    /// members are learned from them.
    #[arg(long, env = "TOLLGATE_PEERS", value_delimiter = ',')]
    pub peers: Vec<Seed>,
    /// How often dns: peers are resolved again (milliseconds).
    #[arg(
        long,
        env = "TOLLGATE_PEERS_REFRESH_MS",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(100..)
    )]
    pub peers_refresh_ms: u64,
    /// The DNS server dns: peers are resolved with (IP:PORT), instead of
    /// the system's (/etc/resolv.conf).
    #[arg(long, env = "TOLLGATE_DNS_SERVER")]
    pub dns_server: Option<SocketAddr>,
    /// File holding the cluster's shared secret, which authenticates every
    /// gossip datagram (or TOLLGATE_CLUSTER_SECRET; never logged).
    #[arg(long, env = "TOLLGATE_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    #[command(flatten)]
    pub replication: store_rules::ReplicationArg,
    /// Largest clock offset to a peer before the server reports itself
    /// unhealthy (/readyz 503); it keeps limiting (milliseconds).
    #[arg(long, env = "TOLLGATE_MAX_CLOCK_SKEW_MS", default_value_t = 250)]
    pub max_clock_skew_ms: u64,
    /// How long a joining server waits for a peer's full state before it
    /// decides alone (milliseconds).
    #[arg(long, env = "TOLLGATE_JOIN_TIMEOUT_MS", default_value_t = 3000)]
    pub join_timeout_ms: u64,
    /// How often a node compares digests of its state with one random
    /// peer, and the two exchange what differs, repairing what lost
    /// datagrams dropped (milliseconds; 0 turns it off).
    #[arg(long, env = "TOLLGATE_ANTI_ENTROPY_MS", default_value_t = 30_000)]
    pub anti_entropy_ms: u64,
    /// How updates spread: `origin` (each node sends its own updates to
    /// every peer, and relays only where a peer cannot hear the origin) or
    /// `epidemic` (the thesis's: everything learnt is forwarded to every
    /// other peer, one neighbour a round; much more gossip).
    #[arg(long, env = "TOLLGATE_DISSEMINATION", default_value = "origin", value_parser = parse_dissemination)]
    pub dissemination: Dissemination,
    /// Test hook: a file listing gossip addresses to cut off (one per
    /// line), re-read every 100 ms, to inject partitions.
    #[arg(long, env = "TOLLGATE_GOSSIP_FAULT_FILE", hide = true)]
    pub gossip_fault_file: Option<PathBuf>,
    /// Test hook: shift the clock this server gossips with (milliseconds,
    /// may be negative), to show the skew check.
    #[arg(
        long,
        env = "TOLLGATE_GOSSIP_CLOCK_OFFSET_MS",
        hide = true,
        allow_hyphen_values = true
    )]
    pub gossip_clock_offset_ms: Option<i64>,
    /// Test hook: shift the server's clock (milliseconds, may be
    /// negative), so a test can stand a server just before an edge it
    /// cannot wait for (a calendar month's).
    #[arg(
        long,
        env = "TOLLGATE_CLOCK_OFFSET_MS",
        hide = true,
        allow_hyphen_values = true
    )]
    pub clock_offset_ms: Option<i64>,
}

/// The bytes of the file `flag` names.
pub(crate) fn read_flag_file(flag: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))
}

impl ServeArgs {
    /// The TLS material for Redis, read from the files the flags name: the
    /// CA certificates, and the client certificate with its key (both or
    /// neither).
    fn redis_tls(&self) -> Result<(Option<Vec<u8>>, Option<ClientCert>)> {
        let ca = match &self.redis_ca_file {
            Some(path) => Some(read_flag_file("--redis-ca-file", path)?),
            None => None,
        };
        let client = match (&self.redis_cert_file, &self.redis_key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(ClientCert {
                cert_pem: read_flag_file("--redis-cert-file", cert)?,
                key_pem: read_flag_file("--redis-key-file", key)?,
            }),
            (Some(cert), None) => anyhow::bail!(
                "--redis-cert-file {} needs --redis-key-file, the certificate's private key",
                cert.display()
            ),
            (None, Some(key)) => anyhow::bail!(
                "--redis-key-file {} needs --redis-cert-file, the certificate it belongs to",
                key.display()
            ),
        };
        Ok((ca, client))
    }

    /// The TLS flag (and its file) that `err` is about, if any: the library
    /// names the part of the material, the user knows the flag.
    fn redis_tls_culprit(&self, err: &ConnectError) -> Option<String> {
        let shown = |flag: &str, path: &Option<PathBuf>| {
            path.as_ref().map(|p| format!("{flag} {}", p.display()))
        };
        match err {
            ConnectError::BadTls { part, .. } => match part {
                TlsPart::Ca => shown("--redis-ca-file", &self.redis_ca_file),
                TlsPart::ClientCert => shown("--redis-cert-file", &self.redis_cert_file),
                TlsPart::ClientKey => shown("--redis-key-file", &self.redis_key_file),
                _ => None,
            },
            ConnectError::TlsOnPlainUrl { .. } => {
                let given: Vec<String> = [
                    shown("--redis-ca-file", &self.redis_ca_file),
                    shown("--redis-cert-file", &self.redis_cert_file),
                    shown("--redis-key-file", &self.redis_key_file),
                ]
                .into_iter()
                .flatten()
                .collect();
                Some(given.join(", "))
            }
            _ => None,
        }
    }

    /// `err` of the Redis store, in the words of the flags: the URL
    /// (without its password) and the TLS flag it is about.
    pub(crate) fn redis_error(&self, err: ConnectError) -> anyhow::Error {
        if matches!(err, ConnectError::BadPrefix { .. }) {
            // It names its flag; the URL is not at fault.
            return anyhow::Error::new(err);
        }
        let store = tollgate_redis::conn::redact(&self.store);
        let context = match self.redis_tls_culprit(&err) {
            Some(flags) => format!("cannot use --store {store} with {flags}"),
            None => format!("cannot use --store {store}"),
        };
        anyhow::Error::new(err).context(context)
    }

    /// The Redis store's options, with the password read from its file or
    /// the environment and the TLS material from its files.
    fn redis_options(&self) -> Result<RedisOptions> {
        let secret = |file: &Option<PathBuf>, what: &str, var: &str| -> Result<Option<String>> {
            Ok(match file {
                Some(path) => Some(
                    std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read the {what} file {}", path.display()))?
                        .trim_end_matches(['\n', '\r'])
                        .to_owned(),
                ),
                None => std::env::var(var).ok(),
            })
        };
        let password = secret(
            &self.redis_password_file,
            "Redis password",
            "TOLLGATE_REDIS_PASSWORD",
        )?;
        let sentinel_password = secret(
            &self.redis_sentinel_password_file,
            "Redis sentinel password",
            "TOLLGATE_REDIS_SENTINEL_PASSWORD",
        )?;
        let (tls_ca, tls_client) = self.redis_tls()?;
        let mut o = RedisOptions::new(self.store.clone());
        o.prefix = self.store_prefix.clone();
        o.heartbeat_ttl = Duration::from_millis(self.heartbeat_ttl_ms.max(30));
        o.connect = ConnectOptions {
            password,
            tls_ca,
            tls_client,
            connections: self.redis_connections.max(1),
            response_timeout: Duration::from_millis(self.redis_timeout_ms.max(1)),
            connect_timeout: Duration::from_millis(self.redis_connect_timeout_ms.max(1)),
            max_reconnect_delay: Duration::from_millis(self.redis_max_reconnect_delay_ms.max(1)),
        };
        o.rejection_cache = self.redis_rejection_cache;
        o.rejection_cache_max_age = Duration::from_millis(self.redis_rejection_cache_ms);
        o.max_waiting = self.redis_max_waiting.max(1);
        o.sentinel_password = sentinel_password;
        Ok(o)
    }
}

/// Runs the server until SIGTERM or SIGINT; with `--check`, only checks
/// what serving would check first, and exits.
pub fn run(args: ServeArgs) -> Result<()> {
    if args.check {
        return check(&args);
    }
    init_logs(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(args))
}

pub(crate) fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Where a server keeps its limit state, as the flags say, checked
/// (nothing built yet: [`backend`] builds it).
enum StoreChoice {
    /// The embedded memory store.
    Memory,
    /// Redis, with options whose URL, prefix and TLS material were checked
    /// (nothing was connected to).
    Redis(RedisOptions),
    /// A node of a replicated gossip cluster.
    Cluster(ClusterSettings),
}

impl StoreChoice {
    /// The store's name, as `/status` and errors give it.
    fn name(&self) -> &'static str {
        match self {
            StoreChoice::Memory => "memory",
            StoreChoice::Redis(_) => "redis",
            StoreChoice::Cluster(_) => "replicated",
        }
    }
}

/// A cluster node's settings, checked.
pub(crate) struct ClusterSettings {
    pub cluster: String,
    pub node_name: String,
    pub node: NodeId,
    /// The shared secret, at least 16 bytes (never logged).
    pub secret: Vec<u8>,
    pub strategy: StrategyKind,
}

/// Everything `serve` checks before it binds a port or contacts anything
/// (Redis, peers, the config API). `serve --check` stops here, so what it
/// accepts is what `serve` accepts up to the network, refused with the
/// same errors.
struct Prepared {
    /// The config of the file, or the bundled one; with `--config-api`, the
    /// file's part alone (the API's part is fetched when serving).
    config: tollgate_config::Config,
    warnings: Vec<String>,
    /// The config API's client, built (its CA loaded, its token read).
    follower: Option<Follower>,
    tls: Option<tollgate_server::tls::Tls>,
    backend: StoreChoice,
    /// The trace export, checked (its CA read, its variables parsed).
    otlp: Option<super::otlp::Settings>,
}

/// Checks the flags, the config (against the rules of the store it will
/// run on), the TLS files, the store's URL and the cluster's secret,
/// without binding a port or connecting to anything.
fn prepare(args: &ServeArgs, now: Nanos) -> Result<Prepared> {
    let follower = follower(args)?;
    let (config, warnings) = local_config(args, follower.is_some())?;
    let backend = store_choice(args)?;
    check_config_on(args, &backend, &config, now)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tollgate_server::tls::Tls::load(
            &tollgate_server::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
            },
        )?),
        _ => None,
    };
    let otlp = super::otlp::settings(&args.otlp)?;
    Ok(Prepared {
        config,
        warnings,
        follower,
        tls,
        backend,
        otlp,
    })
}

/// `serve --check`: [`prepare`], then a one-line summary on standard
/// output (warnings on standard error).
fn check(args: &ServeArgs) -> Result<()> {
    let p = prepare(args, SystemClock.now())?;
    for w in &p.warnings {
        eprintln!("warning: {w}");
    }
    let resources: usize = p.config.namespaces.iter().map(|n| n.resources.len()).sum();
    let transport = transport(p.tls.as_ref());
    let origin = ConfigOrigin::of(args);
    let mut line = format!(
        "ok: grpc={} http={} transport={transport} store={}",
        args.grpc,
        args.http,
        p.backend.name()
    );
    match &p.backend {
        StoreChoice::Memory => {}
        StoreChoice::Redis(o) => {
            line += &format!(" redis={}", tollgate_redis::conn::redact(&o.url))
        }
        StoreChoice::Cluster(c) => {
            line += &format!(
                " cluster={} node={} gossip={}",
                c.cluster, c.node_name, args.gossip
            );
            if let Some(a) = args.gossip_advertise {
                line += &format!(" advertise={a}");
            }
        }
    }
    if let Some(otlp) = &p.otlp {
        line += &format!(" otlp={}", otlp.endpoint());
    }
    line += &format!(
        " config={} namespaces={} resources={resources} warnings={}",
        origin.file_field(),
        p.config.namespaces.len(),
        p.warnings.len()
    );
    if let Some(url) = &origin.api {
        line += &format!(" config_api={url} (not contacted)");
    }
    println!("{line}");
    Ok(())
}

/// Where the config comes from, named the same way by `serve --check`,
/// `/status` (and the Status RPC) and the listening line: the file (or
/// directory) and the config API, each when given; neither is the
/// bundled example. The API's URL is shown without a user or password:
/// `/status` needs no token.
struct ConfigOrigin {
    file: Option<String>,
    api: Option<String>,
}

impl ConfigOrigin {
    fn of(args: &ServeArgs) -> ConfigOrigin {
        ConfigOrigin {
            file: args.config.as_ref().map(|p| p.display().to_string()),
            api: args
                .config_api
                .as_deref()
                .map(|url| tollgate_redis::conn::redact(url.trim_end_matches('/'))),
        }
    }

    /// As `/status` reports it: `FILE`, `config API URL` or `FILE +
    /// config API URL`; `None` for the bundled example.
    fn source(&self) -> Option<String> {
        let api = self.api.as_ref().map(|url| format!("config API {url}"));
        match (&self.file, api) {
            (Some(file), Some(api)) => Some(format!("{file} + {api}")),
            (file, api) => file.clone().or(api),
        }
    }

    /// For the listening line: the source, with the config API's
    /// revision in force when it follows one.
    fn label(&self, api_revision: Option<i64>) -> String {
        match (self.source(), api_revision) {
            (Some(source), Some(revision)) => format!("{source} at revision {revision}"),
            (Some(source), None) => source,
            (None, _) => "bundled example".to_owned(),
        }
    }

    /// `serve --check`'s `config=`: the file, `none` when the config API
    /// alone gives the config, or `bundled`.
    fn file_field(&self) -> &str {
        match (&self.file, &self.api) {
            (Some(file), _) => file,
            (None, Some(_)) => "none",
            (None, None) => "bundled",
        }
    }
}

/// The config `serve` starts from before any config API answers: the
/// file (or directory), or the bundled example when there is neither a
/// file nor a config API.
fn local_config(
    args: &ServeArgs,
    follows_api: bool,
) -> Result<(tollgate_config::Config, Vec<String>)> {
    if follows_api {
        // The file's part alone: the API's is fetched when serving.
        return compose(args, None);
    }
    let loaded = match &args.config {
        Some(path) => tollgate_config::load_path(path),
        None => tollgate_config::load_str("examples/tollgate.yaml (bundled)", BUNDLED),
    }
    // Each diagnostic names the file: the wrapper says only what failed
    // (as a reload says it: the diagnostics without their `error: `).
    .map_err(tollgate_server::app::ComposeError::File)
    .context("cannot load the config")?;
    let warnings = loaded.warnings.iter().map(ToString::to_string).collect();
    Ok((loaded.config, warnings))
}

/// The store the flags choose, checked without connecting.
fn store_choice(args: &ServeArgs) -> Result<StoreChoice> {
    if let Some(cluster) = &args.cluster {
        return cluster_settings(args, cluster).map(StoreChoice::Cluster);
    }
    if args.store == "memory" {
        return Ok(StoreChoice::Memory);
    }
    let options = args.redis_options()?;
    options.check().map_err(|e| args.redis_error(e))?;
    Ok(StoreChoice::Redis(options))
}

/// The settings of a node of `cluster`: its secret (at least 16 bytes),
/// id, default replication strategy, and a gossip address peers can reach.
fn cluster_settings(args: &ServeArgs, cluster: &str) -> Result<ClusterSettings> {
    let secret = match &args.cluster_secret_file {
        Some(path) => read_flag_file("--cluster-secret-file", path)?,
        None => std::env::var("TOLLGATE_CLUSTER_SECRET")
            .map(String::into_bytes)
            .map_err(|_| {
                anyhow::anyhow!(
                    "--cluster {cluster} needs the cluster's secret: --cluster-secret-file or \
                     TOLLGATE_CLUSTER_SECRET (gossip from anyone without it is refused)"
                )
            })?,
    };
    let secret: Vec<u8> = secret
        .strip_suffix(b"\n")
        .map(<[u8]>::to_vec)
        .unwrap_or(secret);
    if secret.len() < 16 {
        anyhow::bail!(
            "the cluster secret is {} bytes; use at least 16",
            secret.len()
        );
    }
    let Some(node_name) = args.node_id.clone() else {
        anyhow::bail!("--cluster {cluster} needs --node-id: a name unique in the cluster, kept across restarts");
    };
    // The socket binds the address it is given, so an unspecified one
    // stays unspecified once bound: known before binding.
    match args.gossip_advertise {
        Some(a) if a.ip().is_unspecified() => {
            anyhow::bail!("--gossip-advertise {a} is not an address peers can reach")
        }
        None if args.gossip.ip().is_unspecified() => anyhow::bail!(
            "--gossip {} is not an address peers can reach; give --gossip-advertise",
            args.gossip
        ),
        _ => {}
    }
    Ok(ClusterSettings {
        cluster: cluster.to_owned(),
        node: NodeId(tollgate_replica::wire::cluster_tag(&node_name)),
        node_name,
        secret,
        strategy: args.replication.strategy.0,
    })
}

/// The config file's part (if any) and the config API's `part` (if it
/// follows one) as one config, as the server installs it.
fn compose(
    args: &ServeArgs,
    part: Option<&tollgate_server::app::ApiPart>,
) -> Result<(tollgate_config::Config, Vec<String>)> {
    tollgate_server::app::compose(args.config.as_deref(), part).context("cannot load the config")
}

/// The error of a config the store cannot serve (the same from `serve`
/// and `serve --check`).
fn refused(store: &'static str, unserved: Unserved) -> anyhow::Error {
    store_rules::Refused { store, unserved }.into()
}

/// Holds `config` to the rules of the store it will run on, without a
/// connection: it is compiled as the server compiles it, on a store of the
/// same kind that is dropped afterwards ([`store_rules`]).
fn check_config_on(
    args: &ServeArgs,
    backend: &StoreChoice,
    config: &tollgate_config::Config,
    now: Nanos,
) -> Result<()> {
    let compiled = match backend {
        StoreChoice::Memory => Limiter::new(backend::memory_store(args), View::default())
            .compile(config, now)
            .map(drop),
        StoreChoice::Redis(_) => store_rules::on_redis(config, now),
        StoreChoice::Cluster(settings) => store_rules::on_cluster(config, settings.strategy, now),
    };
    compiled.map_err(|unserved| refused(backend.name(), unserved))
}

/// The config API's client (`--config-api`), with its token read and its
/// CA loaded; nothing is contacted.
fn follower(args: &ServeArgs) -> Result<Option<Follower>> {
    let Some(url) = &args.config_api else {
        return Ok(None);
    };
    let token = match &args.config_api_token_file {
        Some(path) => TokenSource::File {
            path: path.clone(),
            label: "--config-api-token-file",
        },
        None => TokenSource::Env,
    };
    let poll = Duration::from_millis(args.config_api_poll_ms.max(100));
    Follower::new(url, token, args.config_api_ca.as_ref(), poll).map(Some)
}

/// Gets the config API's whole config, retrying for
/// `--config-api-startup-ms`; a refused token is not retried (waiting
/// does not fix it).
async fn follow(args: &ServeArgs, mut follower: Follower) -> Result<(Follower, ApiPart)> {
    let url = follower.shown_url().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(args.config_api_startup_ms);
    let mut wait = Duration::from_millis(100);
    loop {
        match follower.first().await {
            Ok(part) => {
                tracing::info!(url = %url, api_revision = part.revision, "config from the config API");
                return Ok((follower, part));
            }
            Err(e) if e.downcast_ref::<TokenRefused>().is_some() => return Err(e),
            Err(e) if tokio::time::Instant::now() + wait < deadline => {
                tracing::warn!(error = ?format!("{e:#}"), "waiting for the config API");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e.context("the config API did not answer at startup")),
        }
    }
}

/// SIGTERM or SIGINT, whichever comes first: its name.
pub(crate) type StopSignal = Pin<Box<dyn Future<Output = &'static str> + Send>>;

/// Installs the SIGTERM and SIGINT handlers (from here on neither kills
/// the process) and returns the future that completes when one arrives.
fn stop_signal() -> Result<StopSignal> {
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(Box::pin(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    }))
}

/// Waits for a startup step that may take long (`waiting_for` says what
/// it waits for), or for SIGTERM or SIGINT: `None` when the signal came
/// first, and the server exits without serving.
pub(crate) async fn unless_stopped<T>(
    stop: &mut StopSignal,
    waiting_for: &str,
    step: impl Future<Output = Result<T>>,
) -> Result<Option<T>> {
    tokio::select! {
        done = step => done.map(Some),
        signal = stop => {
            tracing::info!(signal, waiting_for, "stopped while starting: exiting without serving");
            Ok(None)
        }
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    // Before anything that can wait (the config API, Redis): as PID 1 in a
    // container a signal without a handler is ignored, so a SIGTERM while
    // starting would go unheard until the kubelet's SIGKILL. This same
    // future later stops the server.
    let mut stop = stop_signal()?;
    // The one clock of the server: its app, its service and its gossip
    // read the time from it.
    let clock: Arc<dyn Clock> = match args.clock_offset_ms {
        Some(ms) => Arc::new(tollgate_core::ShiftedClock::new(ms)),
        None => Arc::new(SystemClock),
    };
    let Prepared {
        config,
        warnings,
        follower,
        tls,
        backend: choice,
        otlp,
    } = prepare(&args, clock.now())?;
    let (config, warnings, follow) = match follower {
        Some(follower) => {
            let Some((follower, part)) =
                unless_stopped(&mut stop, "the config API", follow(&args, follower)).await?
            else {
                return Ok(());
            };
            let (config, warnings) = compose(&args, Some(&part))?;
            (config, warnings, Some((follower, part)))
        }
        None => (config, warnings, None),
    };
    for w in &warnings {
        tracing::warn!(warning = ?w.to_string(), "config warning");
    }
    // Installed before the store is built, so the store can describe its
    // metrics (a description given before there is a recorder is lost).
    let metrics = match tollgate_server::metrics::install() {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::warn!(error = %e, "metrics disabled");
            None
        }
    };
    let mut initial = Initial {
        config,
        warnings,
        follow,
        tls,
        otlp,
        metrics,
        clock,
        stop,
    };
    match choice {
        StoreChoice::Memory => {
            let memory = backend::memory(&args);
            serve_with(args, memory, initial).await
        }
        StoreChoice::Redis(options) => {
            let Some(redis) = backend::redis(&args, options, &mut initial.stop).await? else {
                return Ok(());
            };
            serve_with(args, redis, initial).await
        }
        StoreChoice::Cluster(settings) => {
            let node = backend::cluster(&args, &settings, Arc::clone(&initial.clock)).await?;
            serve_with(args, node, initial).await
        }
    }
}

/// What a server starts with: the config, its warnings, the config API it
/// follows (with the part of the config that came from it), its TLS
/// material, its trace export, the metrics handle, the clock it reads,
/// and the signal that stops it.
struct Initial {
    config: tollgate_config::Config,
    warnings: Vec<String>,
    follow: Option<(Follower, ApiPart)>,
    tls: Option<tollgate_server::tls::Tls>,
    otlp: Option<super::otlp::Settings>,
    metrics: Option<tollgate_server::metrics::PrometheusHandle>,
    clock: Arc<dyn Clock>,
    stop: StopSignal,
}

/// Serves `config` over `backend`'s store until SIGTERM or SIGINT, or
/// until the backend fails for good.
async fn serve_with<S: Store>(
    args: ServeArgs,
    backend: Backend<S>,
    initial: Initial,
) -> Result<()> {
    let Initial {
        config,
        warnings,
        follow,
        tls,
        otlp,
        metrics,
        clock,
        stop,
    } = initial;
    let Backend {
        store,
        name: store_name,
        early,
        tasks,
        fatal,
        gossip,
    } = backend;
    let (tasks_stop, tasks_stopped) = watch::channel(false);
    let spawn = |tasks: Vec<backend::Task>| {
        tasks
            .into_iter()
            .map(|task| tokio::spawn(task(tasks_stopped.clone())))
            .collect::<Vec<_>>()
    };
    let mut running = spawn(early);
    let mut app = App::builder(store, store_name, config)
        .source(ConfigOrigin::of(&args).source())
        .warnings(warnings)
        .options(ServiceOptions {
            sessions: SessionLimits {
                max_sessions: args.max_sessions,
                max_holds: args.max_holds_per_session,
            },
            copy_deadline: Duration::from_millis(args.copy_deadline_ms.max(1)),
            max_name_bytes: args.max_name_bytes,
            max_in_flight: args.max_copy_ops_in_flight.max(1),
        })
        .clock(clock);
    app = args.answers.apply(app);
    if let Some(path) = &args.admin_tokens_file {
        app = app.admin_tokens(admin_tokens(path)?);
    }
    if let Some(target) = &args.decision_log {
        app = app.decision_log(
            tollgate_server::decision_log::DecisionLog::open(target, args.decision_log_sample)
                .context("cannot open the decision log")?,
        );
    }
    let exporting = match otlp.map(super::otlp::start).transpose()? {
        Some((spans, exporting)) => {
            app = app.spans(spans);
            Some(exporting)
        }
        None => None,
    };
    if let Some(handle) = metrics {
        app = app.metrics(handle);
    }
    let app = app.build().map_err(|e| refused(store_name, e))?;
    if app.metrics().is_some() {
        tollgate_server::metrics::config_loaded_at_start(app.config_status().revision);
    }
    let app = Arc::new(app);
    let scheme = transport(tls.as_ref());
    let options = ServerOptions {
        tls,
        rls_headers: args.rls_response_headers,
        shutdown_grace: Duration::from_millis(args.shutdown_grace_ms),
        shutdown_delay: Duration::from_millis(args.shutdown_delay_ms),
        grpc: args.grpc,
        http: args.http,
        max_message_bytes: args.max_message_bytes,
        max_streams_per_connection: args.max_streams_per_connection,
        connection_limits: args.connections.limits(),
        ..ServerOptions::default()
    };
    let server = Server::bind(Arc::clone(&app), options).await?;
    running.extend(spawn(tasks));
    let grpc = server.grpc_addr()?;
    let http = server.http_addr()?;

    let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    let (hup_tx, hup_rx) = mpsc::channel(1);
    let (stop_tx, stop_rx) = watch::channel(false);
    let shown_config =
        ConfigOrigin::of(&args).label(follow.as_ref().map(|(_, part)| part.revision));
    if let Some((follower, part)) = follow {
        app.adopt_api_part(part);
        tokio::spawn(follower.run(Arc::clone(&app), args.config.clone(), stop_rx.clone()));
    }
    if let Some(path) = args.config.clone() {
        tokio::spawn(tollgate_server::reload::watch(
            Arc::clone(&app),
            path,
            Duration::from_millis(args.watch_interval_ms.max(10)),
            hup_rx,
            stop_rx,
        ));
    }
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the config");
            // Full: a reload is already pending, which reads the newest file.
            let _ = hup_tx.try_send(());
        }
    });
    // Said once SIGHUP is handled and the config file is watched: what a
    // caller does on seeing this line (a reload, an edit of the file) is
    // taken as it would be at any later time.
    tracing::info!(%grpc, %http, gossip = gossip.map(tracing::field::display), transport = %scheme, store = %store_name, config = %shown_config, "tollgate listening");
    let failed = Arc::new(std::sync::Mutex::new(None));
    let hurry = server.hurry();
    let shutdown = {
        let failed = Arc::clone(&failed);
        async move {
            tokio::select! {
                signal = stop => {
                    tracing::info!("{signal} received");
                    // A second signal skips what is left of the shutdown
                    // delay.
                    if let Ok(again) = stop_signal() {
                        let hurry = hurry.clone();
                        tokio::spawn(async move {
                            let signal = again.await;
                            tracing::info!("{signal} received again: not waiting for the shutdown delay");
                            hurry.now();
                        });
                    }
                }
                f = fatal => {
                    tracing::error!(reason = %f.reason, "{}: shutting down", f.what);
                    *failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(f);
                    // The backend can no longer serve (a resigned server's
                    // holds were released by another): no delay.
                    hurry.now();
                }
            }
            let _ = stop_tx.send(true);
        }
    };
    let served = server.run(shutdown).await;
    // Every decision has been answered: export the spans still queued,
    // within the grace period.
    if let Some(exporting) = exporting {
        exporting
            .finish(Duration::from_millis(args.shutdown_grace_ms))
            .await;
    }
    served?;
    // Stop the backend's tasks after the last request (a cluster node
    // leaves the cluster: peers stop probing us).
    let _ = tasks_stop.send(true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    for task in running {
        let _ = tokio::time::timeout_at(deadline, task).await;
    }
    if let Some(f) = failed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
    {
        anyhow::bail!("{}: {}", f.what, f.reason);
    }
    Ok(())
}

/// How clients reach the server, as `serve --check` and the listening log
/// line name it: `plain`, `tls` or `mutual-tls`.
fn transport(tls: Option<&tollgate_server::tls::Tls>) -> &'static str {
    match tls {
        Some(t) if t.is_mutual() => "mutual-tls",
        Some(_) => "tls",
        None => "plain",
    }
}

/// The admin endpoints' tokens from `path` (`--admin-tokens-file`); an
/// error names the line, never a token.
fn admin_tokens(path: &std::path::Path) -> Result<tollgate_server::tokens::Tokens> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the admin tokens file {}", path.display()))?;
    let tokens = tollgate_server::tokens::Tokens::parse(&text)
        .with_context(|| format!("bad admin tokens in {}", path.display()))?;
    if tokens.is_empty() {
        bail!(
            "the admin tokens file {} holds no token (one ROLE:NAME:TOKEN per line); without \
             --admin-tokens-file the admin endpoints are off",
            path.display()
        );
    }
    Ok(tokens)
}

/// Reads `--dissemination`.
fn parse_dissemination(name: &str) -> Result<Dissemination, String> {
    Dissemination::parse(name).ok_or_else(|| format!("`{name}`: expected origin or epidemic"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn origin(args: &[&str]) -> ConfigOrigin {
        let cli = Cli::parse_from(std::iter::once("serve").chain(args.iter().copied()));
        ConfigOrigin::of(&cli.serve)
    }

    /// Review of issue 23: the config was named three ways in three
    /// places, and a config API URL's user and password were shown in
    /// `/status`, which needs no token.
    #[test]
    fn the_config_is_named_one_way_without_a_urls_password() {
        let api = origin(&["--config-api", "https://fleet:hunter2@config.internal/"]);
        assert_eq!(
            api.source().as_deref(),
            Some("config API https://***@config.internal")
        );
        assert_eq!(
            api.label(Some(7)),
            "config API https://***@config.internal at revision 7"
        );
        assert_eq!(api.file_field(), "none");

        let both = origin(&["--config", "limits.yaml", "--config-api", "http://h:8090"]);
        assert_eq!(
            both.source().as_deref(),
            Some("limits.yaml + config API http://h:8090")
        );
        assert_eq!(both.file_field(), "limits.yaml");

        let bundled = origin(&[]);
        assert_eq!(bundled.source(), None);
        assert_eq!(bundled.label(None), "bundled example");
        assert_eq!(bundled.file_field(), "bundled");
    }
}
