//! tollgate's limiting server: the surfaces over the service layer.
//!
//! - [`native`]: the native gRPC API, with sessions that hold copies;
//! - [`rls`]: Envoy's rate-limit service v3 on the same gRPC port;
//! - [`health`] and [`reflection`]: gRPC health checking, following
//!   readiness as `/readyz` does, and server reflection, on that port too;
//! - [`http`]: the HTTP/JSON API, envoyproxy/ratelimit's `/json`, and the
//!   admin endpoints (`/status`, `/healthz`, `/readyz`, `/metrics`,
//!   `/v1/config`);
//! - [`listen`]: what each port admits: a connection cap and deadlines
//!   for handshakes, request heads, idle connections and bodies.
//! - [`tokens`]: bearer tokens with `read` and `admin` roles, from
//!   `ROLE:NAME:TOKEN` files, for the admin endpoints (`/v1/denied`):
//!   `tollgate_auth`, which the config API reads too.
//! - [`spans`]: an OpenTelemetry span per decision, in the caller's
//!   trace, exported in batches without holding a decision up.
//!
//! Surfaces only decode, call the service and encode; no limiting logic
//! lives here. [`Server`] binds both ports, runs background duties (HTTP
//! leases, store sweeps) and shuts down gracefully: it stops accepting,
//! ends every session (releasing its holds) and lets in-flight requests
//! finish.

#![deny(missing_docs)]

pub mod app;
pub mod convert;
pub mod decision_log;
pub mod denied;
pub mod errors;
pub mod health;
pub mod http;
pub mod listen;
pub mod metrics;
pub mod native;
pub mod reflection;
pub mod reload;
pub mod rls;
pub mod rls_json;
pub mod spans;
pub mod tls;
pub mod tokens;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_proto::rls::rate_limit_service_server::RateLimitServiceServer;
use tollgate_proto::v1::tollgate_server::TollgateServer;
use tollgate_store::Store;

pub use app::{App, AppBuilder, ConfigStatus, Readiness};
pub use listen::ConnectionLimits;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A listening address could not be bound.
    #[error("cannot listen on {addr} ({surface}): {source}")]
    Bind {
        /// `gRPC` or `HTTP`.
        surface: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// A descriptor set compiled into the binary for gRPC reflection does
    /// not decode.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Where and how the server listens.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// gRPC address (native API and Envoy RLS); port 0 picks a free port.
    pub grpc: SocketAddr,
    /// HTTP address; port 0 picks a free port.
    pub http: SocketAddr,
    /// Largest request message or body accepted, in bytes.
    pub max_message_bytes: usize,
    /// Concurrent HTTP/2 streams per gRPC connection (sessions and
    /// in-flight requests of one client).
    pub max_streams_per_connection: u32,
    /// How often lapsed HTTP holds are released and idle store state
    /// swept.
    pub housekeeping_interval: Duration,
    /// How often an idle gRPC connection is pinged. A client that
    /// vanished without closing (network cut, host down) fails the ping
    /// within `keepalive_timeout`, and its sessions end and release their
    /// holds.
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered.
    pub keepalive_timeout: Duration,
    /// TLS on both ports (mutual when it has a client CA); `None` serves
    /// plain text.
    pub tls: Option<tls::Tls>,
    /// How long a shutdown waits for connections to finish before it
    /// closes them anyway (a client that stopped reading would otherwise
    /// hold it up forever).
    pub shutdown_grace: Duration,
    /// How long a shutdown keeps serving, already not ready (`/readyz`
    /// 503, gRPC health `NOT_SERVING`), before it stops accepting: the
    /// time a load balancer needs to notice and stop sending here.
    pub shutdown_delay: Duration,
    /// Add `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`
    /// to Envoy RLS answers (envoyproxy/ratelimit's
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub rls_headers: bool,
    /// The connection cap (per port) and the handshake, header, idle and
    /// body timeouts of both ports.
    pub connection_limits: ConnectionLimits,
}

impl Default for ServerOptions {
    fn default() -> ServerOptions {
        ServerOptions {
            grpc: SocketAddr::from(([127, 0, 0, 1], 8081)),
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_message_bytes: 64 * 1024,
            max_streams_per_connection: 1024,
            housekeeping_interval: Duration::from_millis(250),
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(10),
            tls: None,
            rls_headers: false,
            shutdown_grace: Duration::from_secs(10),
            shutdown_delay: Duration::ZERO,
            connection_limits: ConnectionLimits::default(),
        }
    }
}

/// A bound server, ready to run.
pub struct Server<S> {
    app: Arc<App<S>>,
    options: ServerOptions,
    grpc: TcpListener,
    http: TcpListener,
    hurry: Hurry,
}

/// Cuts a shutdown's delay short ([`ServerOptions::shutdown_delay`]): for
/// a shutdown that must not wait for load balancers (a server that
/// resigned from the copy log, whose holds another server already
/// released), or an operator's second signal.
#[derive(Clone, Debug, Default)]
pub struct Hurry(Arc<tokio::sync::Notify>);

impl Hurry {
    /// Ends the shutdown delay now, or skips it if it has not begun.
    pub fn now(&self) {
        self.0.notify_one();
    }
}

impl<S: Store> Server<S> {
    /// Binds both ports.
    pub async fn bind(app: Arc<App<S>>, options: ServerOptions) -> Result<Server<S>, ServerError> {
        let bind = |surface, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind {
                    surface,
                    addr,
                    source,
                })
        };
        let grpc = bind("gRPC", options.grpc).await?;
        let http = bind("HTTP", options.http).await?;
        Ok(Server {
            app,
            options,
            grpc,
            http,
            hurry: Hurry::default(),
        })
    }

    /// A handle that cuts the shutdown delay short.
    pub fn hurry(&self) -> Hurry {
        self.hurry.clone()
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> std::io::Result<SocketAddr> {
        self.grpc.local_addr()
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> std::io::Result<SocketAddr> {
        self.http.local_addr()
    }

    /// Serves until `shutdown` completes, then stops gracefully: no new
    /// connections, sessions ended and their holds released, in-flight
    /// requests finished.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), ServerError> {
        let Server {
            app,
            options,
            grpc,
            http,
            hurry,
        } = self;
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            // An error means the sender is gone: stop as well.
            let _ = rx.wait_for(|s| *s).await;
        };

        let max = options.max_message_bytes;
        let native = TollgateServer::new(native::Native::new(Arc::clone(&app), stop_rx.clone()))
            .max_decoding_message_size(max);
        let rls = RateLimitServiceServer::new(
            rls::Rls::new(Arc::clone(&app)).with_headers(options.rls_headers),
        )
        .max_decoding_message_size(max);
        let health = health::service(Arc::clone(&app), stop_rx.clone(), max);
        let reflection_v1 = reflection::v1(max)?;
        let reflection_v1alpha = reflection::v1alpha(max)?;
        let grpc_server = tonic::transport::Server::builder()
            .max_concurrent_streams(Some(options.max_streams_per_connection))
            .http2_keepalive_interval(Some(options.keepalive_interval))
            .http2_keepalive_timeout(Some(options.keepalive_timeout))
            .add_service(native)
            .add_service(rls)
            .add_service(health)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .serve_with_incoming_shutdown(
                listen::grpc::incoming(
                    // tonic applies its own TCP settings only to listeners
                    // it binds itself: without NODELAY, Nagle's algorithm
                    // holds small answers back (p99.9 of 45 ms against 10
                    // ms).
                    tonic::transport::server::TcpIncoming::from(grpc)
                        .with_nodelay(Some(true))
                        .with_keepalive(Some(options.keepalive_interval)),
                    options.tls.as_ref().map(tls::Tls::grpc_config),
                    &options.connection_limits,
                ),
                stopped(stop_rx.clone()),
            );

        let http_server = listen::http::serve(
            http,
            http::router(Arc::clone(&app), max),
            listen::http::HttpPort {
                listener: "http",
                limits: options.connection_limits.clone(),
                tls: options.tls.as_ref().map(tls::Tls::http_config),
                body_timeout_response: http::body_timeout_response,
                shutdown_grace: options.shutdown_grace,
                direct: Some(http::direct_request(Arc::clone(&app), max)),
            },
            stopped(stop_rx.clone()),
        );

        let housekeeping = tokio::spawn(housekeeping(
            Arc::clone(&app),
            options.housekeeping_interval,
            stop_rx.clone(),
        ));
        let readiness = tokio::spawn(publish_readiness(
            Arc::clone(&app),
            options.housekeeping_interval,
            stop_rx.clone(),
        ));
        let delay = options.shutdown_delay;
        let signal = async {
            shutdown.await;
            app.begin_stopping();
            if !delay.is_zero() {
                // Not ready, still serving: load balancers stop sending
                // before the listeners close.
                tracing::info!(
                    ?delay,
                    "shutting down: not ready, serving until the delay ends"
                );
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = hurry.0.notified() => tracing::info!("shutdown delay cut short"),
                }
            }
            tracing::info!("shutting down: ending sessions, finishing in-flight requests");
            let _ = stop_tx.send(true);
        };
        let grace = options.shutdown_grace;
        let servers = async {
            let mut stopping = stop_rx.clone();
            let both = async { tokio::join!(grpc_server, http_server) };
            tokio::pin!(both);
            tokio::select! {
                r = &mut both => r,
                // Once stopping, the connections get `grace` to finish.
                () = async {
                    let _ = stopping.wait_for(|s| *s).await;
                    tokio::time::sleep(grace).await;
                } => {
                    tracing::warn!(?grace, "connections still open after the shutdown grace period; closing them");
                    (Ok(()), ())
                }
            }
        };
        let ((grpc_result, ()), ()) = tokio::join!(servers, signal);
        let _ = housekeeping.await;
        let _ = readiness.await;
        // Sessions end with their streams; anything left (HTTP holds) is
        // released here, waiting for the store at most the grace period.
        let released = app.service().close_all(grace).await;
        if let Some(log) = app.decision_log() {
            log.close();
        }
        tracing::info!(released, "stopped");
        grpc_result?;
        Ok(())
    }
}

/// Releases lapsed HTTP holds and sweeps the store, until stopped.
async fn housekeeping<S: Store>(
    app: Arc<App<S>>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported = std::collections::HashSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now = app.now();
        let lapsed = app.service().reap();
        if lapsed > 0 {
            ::metrics::counter!(metrics::LAPSED).increment(lapsed as u64);
            tracing::debug!(lapsed, "released lapsed HTTP holds");
        }
        app.limiter().store().sweep(now).await;
        if let Some(handle) = app.metrics() {
            // Drains histogram samples even when nothing scrapes.
            handle.run_upkeep();
        }
        ::metrics::gauge!(metrics::SESSIONS).set(app.sessions().len() as f64);
        reported = report_holds(&app, reported);
    }
}

/// Publishes the app's readiness to its watchers (gRPC health's Watch)
/// every `every`, until stopped: a store's readiness changes without an
/// event. Shutdown beginning is published at once by
/// [`App::begin_stopping`], not here.
async fn publish_readiness<S: Store>(
    app: Arc<App<S>>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        app.refresh_readiness();
    }
}

/// Sets `tollgate_holds` per pool: configured pools by name, the rest
/// together as `_unconfigured` (made-up names must not grow the label
/// set), and 0 for pools reported last time that hold nothing now.
fn report_holds<S: Store>(
    app: &App<S>,
    before: std::collections::HashSet<String>,
) -> std::collections::HashSet<String> {
    let view = app.limiter().view();
    let mut now: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for (pool, held) in app.sessions().holds_by_pool() {
        let (ns, resource) = pool.parts();
        let known = view
            .namespace(&ns)
            .and_then(|n| n.resource(&resource))
            .is_some();
        let label = if known {
            pool.0.to_string()
        } else {
            "_unconfigured".to_owned()
        };
        *now.entry(label).or_default() += held;
    }
    for gone in before.iter().filter(|p| !now.contains_key(*p)) {
        ::metrics::gauge!(metrics::HOLDS, "pool" => gone.clone()).set(0.0);
    }
    for (pool, held) in &now {
        ::metrics::gauge!(metrics::HOLDS, "pool" => pool.clone()).set(*held as f64);
    }
    now.into_keys().collect()
}
