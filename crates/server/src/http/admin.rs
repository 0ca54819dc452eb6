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
use crate::metrics as m;

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

/// Guards the admin endpoints (`/v1/denied`): a bearer token of the
/// server's `--admin-tokens-file` with at least the read role. Without
/// tokens configured they are off (404 naming the flag); a missing or
/// unknown token is 401 and counted (`tollgate_admin_auth_failures_total`
/// by `reason`). Tokens are never logged; a refusal logs the path only.
pub(super) async fn admin_auth<S: Store>(
    State(http): State<Http<S>>,
    req: Request,
    next: Next,
) -> Response {
    let tokens = http.app.admin_tokens();
    if tokens.is_empty() {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            Code::NotFound,
            "admin_endpoints_off",
            format!(
                "{} is an admin endpoint, and admin endpoints are off: start the server with \
                 --admin-tokens-file (or TOLLGATE_ADMIN_TOKENS_FILE), ROLE:NAME:TOKEN per line, \
                 and send a token as `Authorization: Bearer TOKEN`",
                req.uri().path()
            ),
        )
        .into_response();
    }
    let token = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::tokens::bearer);
    let (reason, message) = match token.map(|t| tokens.check(t)) {
        // Both roles read; `/v1/denied` only reads. Writes (resetting
        // counters) will need `admin`.
        Some(Some(_caller)) => return next.run(req).await,
        Some(None) => (
            "unknown_token",
            "the bearer token is not one of this server's admin tokens",
        ),
        None => (
            "no_token",
            "an admin endpoint needs `Authorization: Bearer TOKEN` with a token of the \
             server's --admin-tokens-file",
        ),
    };
    metrics::counter!(m::ADMIN_AUTH_FAILURES, "reason" => reason).increment(1);
    // Debug, not info: strangers could grow the log at will; the metric
    // above counts every refusal.
    tracing::debug!(path = req.uri().path(), reason, "admin request refused");
    let mut resp = ApiError::new(
        StatusCode::UNAUTHORIZED,
        Code::Unauthenticated,
        reason,
        message.to_owned(),
    )
    .into_response();
    resp.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer"),
    );
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
