//! Starts a real server in-process on free loopback ports, with a config
//! given as YAML, and stops it when dropped.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate_proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tollgate_proto::v1::tollgate_client::TollgateClient;
use tollgate_server::{App, Hurry, Server, ServerOptions};
use tollgate_service::{Clock, ManualClock, ServiceOptions, SessionLimits, SystemClock};
use tollgate_store::MemoryStore;

/// A running server.
pub struct TestServer {
    pub app: Arc<App<MemoryStore>>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// Cuts the shutdown delay short.
    #[allow(dead_code)] // not every test file uses a shutdown delay
    pub hurry: Hurry,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Starts a server with `yaml` as its config.
    pub async fn start(yaml: &str) -> TestServer {
        TestServer::start_with(yaml, SessionLimits::default(), ServerOptions::default()).await
    }

    /// Starts a server with explicit session limits and options (addresses
    /// are replaced by free loopback ports).
    pub async fn start_with(
        yaml: &str,
        limits: SessionLimits,
        options: ServerOptions,
    ) -> TestServer {
        let service = ServiceOptions {
            sessions: limits,
            ..ServiceOptions::default()
        };
        TestServer::start_full(yaml, service, options, Arc::new(SystemClock)).await
    }

    /// Starts a server whose clock the test moves by hand.
    pub async fn start_clocked(yaml: &str, clock: Arc<ManualClock>) -> TestServer {
        TestServer::start_full(
            yaml,
            ServiceOptions::default(),
            ServerOptions::default(),
            clock,
        )
        .await
    }

    /// Starts a server with explicit service and server options and clock
    /// (addresses are replaced by free loopback ports).
    pub async fn start_full(
        yaml: &str,
        service: ServiceOptions,
        options: ServerOptions,
        clock: Arc<dyn Clock>,
    ) -> TestServer {
        let loaded = tollgate_config::load_str("test.yaml", yaml).unwrap();
        let app = Arc::new(
            App::builder(MemoryStore::new(), "memory", loaded.config)
                .options(service)
                .clock(clock)
                .build()
                .unwrap(),
        );
        TestServer::serve(app, options, Duration::from_millis(20)).await
    }

    /// Serves `app` with `options` on free loopback ports (the addresses
    /// in `options` are replaced), its housekeeping running every
    /// `housekeeping`.
    pub async fn serve(
        app: Arc<App<MemoryStore>>,
        mut options: ServerOptions,
        housekeeping: Duration,
    ) -> TestServer {
        options.grpc = "127.0.0.1:0".parse().unwrap();
        options.http = "127.0.0.1:0".parse().unwrap();
        options.housekeeping_interval = housekeeping;
        let server = Server::bind(Arc::clone(&app), options).await.unwrap();
        let grpc = server.grpc_addr().unwrap();
        let http = server.http_addr().unwrap();
        let hurry = server.hurry();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        TestServer {
            app,
            grpc,
            http,
            hurry,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    pub async fn native(&self) -> TollgateClient<tonic::transport::Channel> {
        TollgateClient::connect(self.grpc_url()).await.unwrap()
    }

    pub async fn rls(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(self.grpc_url())
            .await
            .unwrap()
    }

    /// Begins a graceful shutdown without waiting for it.
    #[allow(dead_code)] // not every test file shuts down this way
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Waits until the server has stopped (after [`TestServer::begin_stop`]).
    #[allow(dead_code)] // not every test file shuts down this way
    pub async fn stopped(mut self) {
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    /// Stops the server gracefully and waits until it has.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Polls `check` until it holds (up to 10 s): for effects that happen in
/// the background (a session's holds released after its stream ends).
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    tollgate_testing::eventually_async(what, Duration::from_secs(10), || {
        let holds = check();
        async move { holds.then_some(()).ok_or_else(|| "not yet".to_owned()) }
    })
    .await;
}

/// Copies of `namespace/resource` held by `domain` and by everyone, asked
/// of the store directly (a reserve of nothing reports the context).
pub async fn holds(
    app: &App<MemoryStore>,
    namespace: &str,
    resource: &str,
    domain: &str,
) -> (u64, u64) {
    let r = app
        .limiter()
        .reserve(
            namespace,
            resource,
            domain,
            tollgate_core::Hits::between(0, 0),
            app.now(),
            tollgate_store::OpId::random(),
        )
        .await
        .unwrap();
    let c = r.reservation.context;
    (c.domain_holds, c.global_holds)
}
