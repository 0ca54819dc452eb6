//! `tollgate bench-echo`: a gRPC server that answers without deciding
//! anything, built with the real server's stack (tonic, the same protos,
//! the same transport settings). What `tollgate bench` measures against it
//! is the ceiling of any gRPC service on the machine: the cost of HTTP/2,
//! protobuf and the runtime, with no limiting at all.

use std::net::SocketAddr;
use std::pin::Pin;

use anyhow::{Context, Result};
use clap::Args;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio_stream::Stream;
use tollgate_proto::rls::rate_limit_response::{Code, DescriptorStatus};
use tollgate_proto::rls::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use tollgate_proto::rls::{RateLimitRequest, RateLimitResponse};
use tollgate_proto::v1::tollgate_server::{Tollgate, TollgateServer};
use tollgate_proto::v1::{RateRequest, RateResponse, SessionRequest, SessionResponse};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

/// Arguments of `tollgate bench-echo`. The limits default to `tollgate
/// serve`'s, so both servers run with the same transport settings.
#[derive(Args, Debug)]
pub struct EchoArgs {
    /// gRPC address; port 0 picks a free port (the bound address is
    /// logged, as `tollgate serve` logs its own).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub grpc: SocketAddr,
    /// Concurrent streams per gRPC connection (as `tollgate serve`).
    #[arg(long, default_value_t = 1024)]
    pub max_streams_per_connection: u32,
    /// Largest request message, in bytes (as `tollgate serve`).
    #[arg(long, default_value_t = 64 * 1024)]
    pub max_message_bytes: usize,
    /// Leave Nagle's algorithm on (no TCP_NODELAY) on accepted
    /// connections. `tollgate serve` sets TCP_NODELAY, and so does the echo
    /// by default; this shows what Nagle's algorithm costs
    /// (docs/benchmarks.md).
    #[arg(long)]
    pub nagle: bool,
}

/// Runs the echo server until SIGTERM or SIGINT.
pub fn run(args: EchoArgs) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // The same runtime as `tollgate serve`: multi-threaded, one worker per
    // CPU.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: EchoArgs) -> Result<()> {
    let listener = TcpListener::bind(args.grpc)
        .await
        .with_context(|| format!("cannot listen on {} (gRPC)", args.grpc))?;
    let grpc = listener.local_addr()?;
    tracing::info!(%grpc, "tollgate listening (bench-echo: answers without deciding)");

    let max = args.max_message_bytes;
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("stopping");
    };
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(args.max_streams_per_connection))
        .add_service(TollgateServer::new(Echo).max_decoding_message_size(max))
        .add_service(RateLimitServiceServer::new(Echo).max_decoding_message_size(max))
        .serve_with_incoming_shutdown(
            // As the server does: tonic's own `tcp_nodelay` setting does
            // not apply to a listener passed in.
            TcpIncoming::from(listener).with_nodelay(Some(!args.nagle)),
            shutdown,
        )
        .await
        .context("gRPC server")?;
    Ok(())
}

/// Answers every request "allowed" without looking at it beyond its shape.
struct Echo;

#[tonic::async_trait]
impl RateLimitService for Echo {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // One OK status per descriptor, as a real answer has: the response
        // is as large as a real "all within limits" one.
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

#[tonic::async_trait]
impl Tollgate for Echo {
    async fn request(
        &self,
        request: Request<RateRequest>,
    ) -> Result<Response<RateResponse>, Status> {
        let hits = request.get_ref().hits_or_default();
        Ok(Response::new(RateResponse {
            allowed: true,
            granted: hits,
            algorithm: "echo".to_owned(),
            ..RateResponse::default()
        }))
    }

    type SessionStream = Pin<Box<dyn Stream<Item = Result<SessionResponse, Status>> + Send>>;

    async fn session(
        &self,
        _request: Request<Streaming<SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        Err(Status::unimplemented(
            "bench-echo answers unary requests only",
        ))
    }

    async fn status(
        &self,
        _request: Request<tollgate_proto::v1::StatusRequest>,
    ) -> Result<Response<tollgate_proto::v1::StatusResponse>, Status> {
        Ok(Response::new(tollgate_proto::v1::StatusResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            store: "echo".to_owned(),
            ready: true,
            ..Default::default()
        }))
    }

    async fn inspect(
        &self,
        _request: Request<tollgate_proto::v1::CountersRequest>,
    ) -> Result<Response<tollgate_proto::v1::CountersResponse>, Status> {
        Err(Status::unimplemented("bench-echo keeps no counters"))
    }

    async fn reset(
        &self,
        _request: Request<tollgate_proto::v1::CountersRequest>,
    ) -> Result<Response<tollgate_proto::v1::ResetResponse>, Status> {
        Err(Status::unimplemented("bench-echo keeps no counters"))
    }
}
