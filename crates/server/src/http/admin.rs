//! Admin endpoints: what is running, with which config, and how it is
//! doing.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header::CONTENT_TYPE;
use http::StatusCode;
use tollgate_store::Store;
use tonic::Code;

use super::body::ApiError;
use super::Http;
use crate::app::ConfigStatus;
use crate::tokens::Refused;

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
        store: app.store_name(),
        uptime_ms: u64::try_from(app.uptime().as_millis()).unwrap_or(u64::MAX),
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
/// minute and the last), per configured namespace and resource, at most
/// 10 each, most first (see [`crate::denied`]). An admin endpoint: only
/// with a token ([`super::admin_auth`]).
pub(super) async fn denied<S: Store>(State(http): State<Http<S>>) -> Response {
    let top = http.app.denied().top(http.app.now().as_u64(), 10);
    axum::Json(serde_json::json!({
        "window_s": crate::denied::WINDOW / 1_000_000_000,
        "namespaces": top,
    }))
    .into_response()
}

/// Guards the admin endpoints (`/v1/denied`, `/v1/counters`): a bearer
/// token of the server's `--admin-tokens-file`, of either role for a `GET`
/// and of role `admin` for anything else (a reset). Without tokens
/// configured they are off (404 naming the flag); a missing or unknown
/// token is 401 with `WWW-Authenticate: Bearer`, a `read` token that
/// writes 403, each counted (`tollgate_admin_auth_failures_total` by
/// `reason`). Tokens are never logged; a refusal logs the path only.
pub(super) async fn admin_auth<S: Store>(
    State(http): State<Http<S>>,
    req: Request,
    next: Next,
) -> Response {
    let authorization = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let write = req.method() != http::Method::GET && req.method() != http::Method::HEAD;
    let refused = match crate::tokens::authorize(http.app.admin_tokens(), authorization, write) {
        Ok(caller) => {
            // Handlers name who did what (a reset's log line).
            let mut req = req;
            req.extensions_mut().insert(caller);
            return next.run(req).await;
        }
        Err(refused) => refused,
    };
    let path = req.uri().path();
    let (status, code) = match refused {
        Refused::Off => (StatusCode::NOT_FOUND, Code::NotFound),
        Refused::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, Code::Unauthenticated),
        Refused::Forbidden => (StatusCode::FORBIDDEN, Code::PermissionDenied),
    };
    if refused != Refused::Off {
        // Debug, not info: strangers could grow the log at will; the
        // metric counts every refusal.
        tracing::debug!(path, reason = refused.reason(), "admin request refused");
    }
    let mut resp =
        ApiError::new(status, code, refused.reason(), refused.message(path)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
    }
    resp
}

/// `GET /metrics`: Prometheus text format, when a recorder is installed;
/// with `serve --denied-metrics-top K`, followed by the top K refused
/// domains of each resource ([`crate::denied::Denied::write_metrics`]).
pub(super) async fn metrics<S: Store>(State(http): State<Http<S>>) -> Response {
    let app = &http.app;
    match app.metrics() {
        Some(handle) => {
            let mut text = handle.render();
            let top = app.denied_metrics_top();
            if top > 0 {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                app.denied()
                    .write_metrics(app.now().as_u64(), top, &mut text);
            }
            ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
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
