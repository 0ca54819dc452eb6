//! Admin endpoints: what is running, with which config, and how it is
//! doing.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header::CONTENT_TYPE;
use http::StatusCode;
use tollgate_store::Store;
use tonic::Code;

use super::body::ApiError;
use super::Http;
use crate::app::ConfigStatus;

/// `GET /v1/config`: the normalized config in force, as YAML that loads
/// back into the same limits.
pub(super) async fn config<S: Store>(State(http): State<Http<S>>) -> Response {
    let yaml = tollgate_config::emit::to_yaml(&http.app.config());
    ([(CONTENT_TYPE, "application/yaml")], yaml).into_response()
}

/// `GET /status`'s answer.
#[derive(Debug, serde::Serialize)]
pub(super) struct Status {
    version: &'static str,
    store: &'static str,
    uptime_ms: u64,
    config: ConfigStatus,
    sessions: Sessions,
}

#[derive(Debug, serde::Serialize)]
struct Sessions {
    /// gRPC session streams and HTTP holds open now.
    open: usize,
    /// Opened since start.
    opened: u64,
}

/// `GET /status`.
pub(super) async fn status<S: Store>(State(http): State<Http<S>>) -> Json<Status> {
    let app = &http.app;
    Json(Status {
        version: env!("CARGO_PKG_VERSION"),
        store: app.store_name,
        uptime_ms: u64::try_from(app.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        config: app.config_status(),
        sessions: Sessions {
            open: app.sessions().len(),
            opened: app.sessions().opened(),
        },
    })
}

/// `GET /healthz`: the process answers.
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: the server answers requests. It is ready as soon as its
/// ports are bound (the config is loaded before that, and the memory store
/// needs no warm-up), and 503 from the moment shutdown begins, so a load
/// balancer stops sending before the listeners close (they stay open for
/// the shutdown delay, [`crate::ServerOptions::shutdown_delay`]), and while its store
/// cannot decide (Redis unreachable), so traffic goes to servers that can.
/// gRPC health answers by the same rule ([`crate::app::App::readiness`]).
pub(super) async fn readyz<S: Store>(State(http): State<Http<S>>) -> Response {
    let readiness = http.app.readiness();
    let status = if readiness.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, readiness.as_str()).into_response()
}

/// `GET /v1/denied`: the domains this server refused most lately (this
/// minute and the last), per configured resource (`NS/RESOURCE`), at most
/// 10 each, most first (see [`crate::denied`]).
pub(super) async fn denied<S: Store>(State(http): State<Http<S>>) -> Response {
    let top = http.app.denied.top(http.app.now().as_u64(), 10);
    axum::Json(serde_json::json!({
        "window_s": crate::denied::WINDOW / 1_000_000_000,
        "resources": top,
    }))
    .into_response()
}

/// `GET /metrics`: Prometheus text format, when a recorder is installed.
pub(super) async fn metrics<S: Store>(State(http): State<Http<S>>) -> Response {
    match &http.app.metrics {
        Some(handle) => (
            [(CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            Code::NotFound,
            "metrics_disabled",
            "no metrics recorder is installed in this process, so there is nothing to export"
                .to_owned(),
        )
        .into_response(),
    }
}
