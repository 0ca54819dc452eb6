//! The stores `serve` runs on, each built into one [`Backend`]: the store,
//! its name, the tasks it runs beside the server, and the failure that
//! ends the server.
//!
//! This is the only place that knows every kind of store. `serve` decides
//! which one the flags ask for and hands the [`Backend`] to a server loop
//! that is generic over the store and knows none of them: a Redis
//! server's heartbeat and a cluster node's gossip are tasks like any
//! other, and a Redis server resigning from the copy log is a [`Fatal`]
//! like any other.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::watch;
use tollgate_core::replicated::strategy::Replication;
use tollgate_core::Nanos;
use tollgate_redis::{RedisOptions, RedisStore};
use tollgate_replica::discovery::{Discovery, DnsResolver};
use tollgate_replica::wire::ClusterKey;
use tollgate_replica::{Node, NodeConfig, Replica, ReplicaOptions, ReplicaStore};
use tollgate_service::Clock;
use tollgate_store::MemoryStore;

use super::serve::{unless_stopped, ClusterSettings, ServeArgs, StopSignal};

/// A boxed future that sends nothing back.
type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Work a backend runs beside the server, told to stop (its receiver turns
/// `true`) after the last request was answered. The server waits a little
/// for it to finish. When it starts is the backend's choice
/// ([`Backend::early`], [`Backend::tasks`]).
pub(crate) type Task = Box<dyn FnOnce(watch::Receiver<bool>) -> Work + Send>;

/// Why a backend can no longer serve: the server stops at once, without
/// its shutdown delay, and exits with an error.
#[derive(Debug)]
pub(crate) struct Fatal {
    /// What happened, as the log line and the exit error begin
    /// ("resigned from the copy log").
    pub what: &'static str,
    /// Why it happened.
    pub reason: String,
}

/// A store ready to serve, with what it needs beside the server.
pub(crate) struct Backend<S> {
    /// The store the server decides with.
    pub store: S,
    /// Its name, as `/status`, the listening line and errors give it.
    pub name: &'static str,
    /// What it runs beside the server from the moment the server is
    /// being set up, before the config is compiled and the ports bound:
    /// the Redis heartbeat, because this server joined the copy log when
    /// it connected and peers declare it dead if it does not beat within
    /// the heartbeat TTL, however long the rest of startup takes.
    pub early: Vec<Task>,
    /// What it runs beside the server once the config is compiled and the
    /// ports are bound (gossip: so a peer's keys find their limits).
    pub tasks: Vec<Task>,
    /// Completes when the backend fails for good (a Redis server resigned
    /// from the copy log); never, for a backend that cannot.
    pub fatal: Pin<Box<dyn Future<Output = Fatal> + Send>>,
    /// The address this server's peers reach it at, for a backend with
    /// peers (a cluster node's gossip); the listening line names it.
    pub gossip: Option<SocketAddr>,
}

impl<S> Backend<S> {
    /// A backend that runs nothing beside the server and cannot fail.
    fn plain(store: S, name: &'static str) -> Backend<S> {
        Backend {
            store,
            name,
            early: Vec::new(),
            tasks: Vec::new(),
            fatal: Box::pin(std::future::pending()),
            gossip: None,
        }
    }
}

/// The memory store `--max-keys` and `--max-transfers` describe.
pub(crate) fn memory_store(args: &ServeArgs) -> MemoryStore {
    MemoryStore::with_options(tollgate_store::MemoryStoreOptions {
        max_keys: args.max_keys,
        max_transfers: args.max_transfers,
        ..Default::default()
    })
}

/// The embedded memory store.
pub(crate) fn memory(args: &ServeArgs) -> Backend<MemoryStore> {
    Backend::plain(memory_store(args), "memory")
}

/// Redis, connected (`None`: SIGTERM or SIGINT came first). Its tasks ping
/// it for its metrics and keep this server's heartbeat in the copy log;
/// losing the heartbeat is fatal unless `--keep-serving-after-resign`.
pub(crate) async fn redis(
    args: &ServeArgs,
    options: RedisOptions,
    stop: &mut StopSignal,
) -> Result<Option<Backend<RedisStore>>> {
    let connect = async {
        RedisStore::connect(options)
            .await
            .map_err(|e| args.redis_error(e))
    };
    let Some(store) = unless_stopped(stop, "Redis", connect).await? else {
        return Ok(None);
    };
    tracing::info!(server = store.server_id(), "connected to Redis");
    RedisStore::describe_metrics();
    let monitor: Task = Box::new({
        let store = store.clone();
        move |stopped| {
            Box::pin(async move {
                until_stopped(stopped, store.monitor(Duration::from_millis(500))).await;
            })
        }
    });
    let (resign_tx, resign_rx) = tokio::sync::oneshot::channel();
    let heartbeat: Task = Box::new({
        let store = store.clone();
        move |stopped| {
            Box::pin(async move {
                let beating = async {
                    let _ = resign_tx.send(store.heartbeat().await);
                };
                until_stopped(stopped, beating).await;
            })
        }
    });
    let mut backend = Backend::plain(store, "redis");
    backend.early = vec![monitor, heartbeat];
    // Resigning from the copy log ends the server (Charon §4.3.2): its
    // sessions' holds were released by another server, so it must not keep
    // them. A supervisor restarts it with a new id.
    if !args.keep_serving_after_resign {
        backend.fatal = Box::pin(async move {
            match resign_rx.await {
                Ok(r) => Fatal {
                    what: "resigned from the copy log",
                    reason: r.0,
                },
                // The heartbeat stopped without resigning: nothing ends.
                Err(_) => std::future::pending().await,
            }
        });
    }
    Ok(Some(backend))
}

/// Runs `work` until it ends or `stopped` turns true.
async fn until_stopped(mut stopped: watch::Receiver<bool>, work: impl Future<Output = ()>) {
    tokio::select! {
        () = work => {}
        _ = stopped.wait_for(|s| *s) => {}
    }
}

/// A node of the replicated cluster `settings` describes, its gossip
/// socket bound; its task gossips (and resolves `dns:` seeds) until the
/// server stops, then leaves the cluster. It reads the time from `clock`,
/// shifted by the test hook `--gossip-clock-offset-ms`.
pub(crate) async fn cluster(
    args: &ServeArgs,
    settings: &ClusterSettings,
    clock: Arc<dyn Clock>,
) -> Result<Backend<ReplicaStore>> {
    let ClusterSettings {
        cluster,
        node_name,
        node,
        secret,
        strategy,
    } = settings;
    let replica = Arc::new(Replica::new(ReplicaOptions {
        node: *node,
        default: Replication::new(*strategy),
        max_keys: args.max_keys,
        dissemination: args.dissemination,
        ..ReplicaOptions::default()
    }));
    let socket = tokio::net::UdpSocket::bind(args.gossip)
        .await
        .with_context(|| format!("cannot listen for gossip on {}", args.gossip))?;
    let bound = socket
        .local_addr()
        .context("the gossip socket has no address")?;
    let addr = args.gossip_advertise.unwrap_or(bound);
    let offset = args.gossip_clock_offset_ms.unwrap_or(0);
    let now: tollgate_replica::runtime::NowFn = Arc::new(move || {
        let shifted = i128::from(clock.now().as_u64()) + i128::from(offset) * 1_000_000;
        Nanos::new(u64::try_from(shifted.max(0)).unwrap_or(u64::MAX))
    });
    // Plain addresses are seeds from the start; dns: names are resolved
    // by a task that gives the running node every new list (DNS
    // discovery, docs/replicated.md).
    let seeds = Discovery::addresses(&args.peers);
    let discovery = if Discovery::has_names(&args.peers) {
        let resolver = match args.dns_server {
            Some(server) => DnsResolver::server(server)
                .with_context(|| format!("cannot use --dns-server {server}"))?,
            None => DnsResolver::system().context(
                "--peers has dns: names, which need a DNS resolver; name one with --dns-server",
            )?,
        };
        Some(
            Discovery::new(
                args.peers.clone(),
                resolver,
                Duration::from_millis(args.peers_refresh_ms),
            )
            .joining(Duration::from_millis(args.join_timeout_ms)),
        )
    } else {
        None
    };
    let node_config = NodeConfig {
        cluster: cluster.clone(),
        node: *node,
        addr,
        seeds: seeds.clone(),
        seeds_discovered: discovery.is_some(),
        key: ClusterKey::new(secret, cluster),
        incarnation: now().as_u64(),
        max_clock_skew: Nanos::from_millis(args.max_clock_skew_ms),
        join_timeout: Nanos::from_millis(args.join_timeout_ms),
        probe_interval: Nanos::from_millis(1000),
        // Grows as DNS lists more peers (Node::set_seeds).
        expected_size: u32::try_from(seeds.len() + 1).unwrap_or(u32::MAX),
        anti_entropy: Nanos::from_millis(args.anti_entropy_ms),
    };
    let store = ReplicaStore::new(Arc::clone(&replica));
    let node = Node::new(node_config, replica, rand::random());
    let faults = args.gossip_fault_file.clone();
    let gossip: Task = Box::new(move |stopped| {
        Box::pin(async move {
            // Discovery stops when the node's receiver is dropped.
            let seeds = discovery.map(|discovery| {
                let (tx, rx) = watch::channel(seeds);
                tokio::spawn(discovery.run(tx));
                rx
            });
            tollgate_replica::runtime::run(node, socket, now, stopped, faults, seeds).await;
        })
    });
    tollgate_replica::metrics::describe();
    let peers: Vec<String> = args.peers.iter().map(ToString::to_string).collect();
    tracing::info!(cluster = %cluster, node = %node_name, gossip = %addr, peers = ?peers, "joining the cluster");
    let mut backend = Backend::plain(store, "replicated");
    backend.tasks = vec![gossip];
    backend.gossip = Some(addr);
    Ok(backend)
}
