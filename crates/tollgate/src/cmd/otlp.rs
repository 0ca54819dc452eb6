//! `tollgate serve --otlp-endpoint`: decision spans exported over
//! OTLP/gRPC to an OpenTelemetry collector (`docs/server.md`, "Tracing").
//!
//! The flags follow the OpenTelemetry SDK's environment variables where
//! one exists (`OTEL_BSP_*` for batching), so a deployment configured the
//! usual way works unchanged; the exporter itself also reads
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT` and
//! `OTEL_EXPORTER_OTLP_COMPRESSION`, and the resource `OTEL_SERVICE_NAME`
//! and `OTEL_RESOURCE_ATTRIBUTES`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use tollgate_server::spans::{self, BatchOptions, Exporting, Spans};

/// Trace export flags of `tollgate serve`.
#[derive(Args, Debug, Clone)]
pub struct OtlpArgs {
    /// Export a span per decision over OTLP/gRPC to this collector
    /// (`http://HOST:4317`, or `https://` for TLS). Off when not given.
    #[arg(long, env = "TOLLGATE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// PEM CA certificates the collector's TLS certificate must chain to,
    /// instead of the bundled Mozilla roots (`https://` endpoints only).
    #[arg(long, env = "TOLLGATE_OTLP_CA", requires = "otlp_endpoint")]
    pub otlp_ca: Option<PathBuf>,
    /// How long a span waits at most before it is exported (milliseconds).
    #[arg(long, env = "OTEL_BSP_SCHEDULE_DELAY", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub otlp_schedule_delay_ms: u64,
    /// Spans waiting for export at most; beyond it they are dropped and
    /// counted in tollgate_spans_dropped_total (a decision never waits).
    #[arg(long, env = "OTEL_BSP_MAX_QUEUE_SIZE", default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub otlp_max_queue: u64,
    /// Spans sent in one export at most.
    #[arg(long, env = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub otlp_max_batch: u64,
    /// How long one export may take before its spans are given up
    /// (milliseconds).
    #[arg(long, env = "OTEL_BSP_EXPORT_TIMEOUT", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub otlp_export_timeout_ms: u64,
}

/// Starts exporting decision spans if `--otlp-endpoint` is given: what the
/// app records spans with, and the handle that flushes them at shutdown.
/// Must run within the tokio runtime the exporter will use.
pub fn start(args: &OtlpArgs) -> Result<Option<(Spans, Exporting)>> {
    let Some(endpoint) = &args.otlp_endpoint else {
        return Ok(None);
    };
    let exporter = exporter(endpoint, args.otlp_ca.as_ref())
        .with_context(|| format!("cannot export traces to --otlp-endpoint {endpoint}"))?;
    // The SDK's resource reads OTEL_SERVICE_NAME and
    // OTEL_RESOURCE_ATTRIBUTES; the service is `tollgate` unless they say
    // otherwise.
    let mut resource = Resource::builder();
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|n| !n.trim().is_empty());
    if !named {
        resource = resource.with_service_name("tollgate");
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let to_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let (tracer, exporting) = spans::batch::start(
        exporter,
        resource,
        BatchOptions {
            max_queue: to_usize(args.otlp_max_queue),
            max_batch: to_usize(args.otlp_max_batch),
            delay: Duration::from_millis(args.otlp_schedule_delay_ms),
            export_timeout: Duration::from_millis(args.otlp_export_timeout_ms),
        },
    );
    tracing::info!(endpoint = %endpoint, "exporting decision spans over OTLP");
    Ok(Some((Spans::new(tracer), exporting)))
}

/// The OTLP/gRPC exporter for `endpoint`, with TLS for `https://` (the
/// CA in `ca`, or Mozilla's roots).
fn exporter(endpoint: &str, ca: Option<&PathBuf>) -> Result<opentelemetry_otlp::SpanExporter> {
    let uri: tonic::codegen::http::Uri = endpoint
        .parse()
        .context("not a URL (expected http://HOST:PORT or https://HOST:PORT)")?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => anyhow::bail!("the URL must start with http:// or https://"),
    };
    if uri.host().is_none() {
        anyhow::bail!("the URL names no host");
    }
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint);
    match (https, ca) {
        (false, Some(ca)) => anyhow::bail!(
            "--otlp-ca {} needs an https:// endpoint (an http:// one is plain text)",
            ca.display()
        ),
        (false, None) => {}
        (true, ca) => {
            let tls = tonic::transport::ClientTlsConfig::new();
            let tls = match ca {
                Some(path) => {
                    let pem = std::fs::read(path)
                        .with_context(|| format!("cannot read --otlp-ca {}", path.display()))?;
                    tls.ca_certificate(tonic::transport::Certificate::from_pem(pem))
                }
                None => tls.with_webpki_roots(),
            };
            builder = builder.with_tls_config(tls);
        }
    }
    Ok(builder.build()?)
}
