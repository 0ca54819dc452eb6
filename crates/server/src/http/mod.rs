//! The HTTP/JSON API, envoyproxy/ratelimit's `POST /json`, and the admin
//! endpoints (`/status`, `/healthz`, `/readyz`, `/metrics`, `/v1/config`,
//! and `/v1/denied` and `/v1/counters`, which need an admin token).
//! `docs/http-api.md` is the reference, with examples.
//!
//! Bodies are the `tollgate.v1` messages as JSON. Every error, whatever
//! produced it (the service, a body that is not JSON, an unknown path),
//! answers the same shape: `{"error": {"code", "reason", "message"}}`.
//!
//! HTTP has no session, so every reserve and seize opens a session of its
//! own with a lease: a *hold*, named by its id. A client that vanishes
//! leaks nothing, because the server's housekeeping releases holds whose
//! lease lapsed; a client that needs longer renews.

mod admin;
mod api;
mod body;
mod counters;
pub mod headers;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef, FromRequestParts, Request, State};
use axum::middleware::{from_fn_with_state, map_response_with_state};
use axum::routing::{delete, get, post};
use http::Method;
use tollgate_store::Store;

use crate::app::App;
use crate::listen::http::Direct;

pub use body::{body_timeout_response, error_response};
pub use headers::RateHeaders;

/// What every handler shares.
struct Http<S> {
    app: Arc<App<S>>,
    /// To name the limit when refusing a body.
    max_body: usize,
}

// Derived `Clone` would require `S: Clone`; only the `Arc` is cloned.
impl<S> Clone for Http<S> {
    fn clone(&self) -> Http<S> {
        Http {
            app: Arc::clone(&self.app),
            max_body: self.max_body,
        }
    }
}

/// Lets handlers written against the app alone (`/json`) share the router.
impl<S> FromRef<Http<S>> for Arc<App<S>> {
    fn from_ref(http: &Http<S>) -> Arc<App<S>> {
        Arc::clone(&http.app)
    }
}

/// The caller's W3C trace context (`traceparent`, `tracestate`), read from
/// the headers only when decision spans are on; an extractor for handlers
/// mounted with the router's state or with the app alone (`/json`).
pub struct TraceContext(pub crate::spans::Caller);

impl<S: Store> FromRequestParts<Http<S>> for TraceContext {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &Http<S>,
    ) -> Result<TraceContext, Self::Rejection> {
        Ok(TraceContext(state.app.caller_from_http(&parts.headers)))
    }
}

impl<S: Store> FromRequestParts<Arc<App<S>>> for TraceContext {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        app: &Arc<App<S>>,
    ) -> Result<TraceContext, Self::Rejection> {
        Ok(TraceContext(app.caller_from_http(&parts.headers)))
    }
}

/// `POST /v1/request`, for the HTTP port to answer before the router
/// ([`Direct`]); the router answers it the same way.
pub fn direct_request<S: Store>(app: Arc<App<S>>, max_body: usize) -> Direct {
    let state = Http { app, max_body };
    Direct {
        method: Method::POST,
        path: "/v1/request",
        handler: Arc::new(move |req| Box::pin(api::request(state.clone(), req))),
    }
}

/// The HTTP router over `app`; bodies larger than `max_body` are refused.
///
/// A layer added here does not reach `POST /v1/request` on the server's
/// port, which answers it before the router ([`direct_request`]): what
/// every route must get belongs in the port (`listen::http`) or in the
/// handler itself.
pub fn router<S: Store>(app: Arc<App<S>>, max_body: usize) -> axum::Router {
    let state = Http { app, max_body };
    axum::Router::new()
        // Answered before the router by the port (`direct_request`); the
        // same handler here answers it where the router is served alone.
        .route(
            "/v1/request",
            post(|State(http): State<Http<S>>, req: Request| api::request(http, req)),
        )
        .route("/v1/reserve", post(api::reserve::<S>))
        .route("/v1/release", post(api::release::<S>))
        .route("/v1/transfer", post(api::transfer::<S>))
        .route("/v1/seize", post(api::seize::<S>))
        .route("/v1/holds/{id}/renew", post(api::renew::<S>))
        .route("/v1/holds/{id}", delete(api::drop_hold::<S>))
        // `/json` reads its body with axum's own extractor, which knows
        // the limit from `DefaultBodyLimit` and answers a body over it in
        // plain text: the layers that say the limit and give the answer
        // the API's error shape apply to it alone (every other route
        // reads its body through `body::JsonBody`, which does both), so
        // the other routes do not pay for them on every request.
        .route(
            "/json",
            post(crate::rls_json::json::<S>)
                .layer(DefaultBodyLimit::max(max_body))
                .layer(map_response_with_state(
                    state.clone(),
                    body::too_large_as_json::<S>,
                )),
        )
        .route("/v1/config", get(admin::config::<S>))
        .route("/status", get(admin::status::<S>))
        .route("/healthz", get(admin::healthz))
        .route("/readyz", get(admin::readyz::<S>))
        .route("/metrics", get(admin::metrics::<S>))
        // Admin endpoints: a bearer token of --admin-tokens-file, off
        // without one (`/v1/config` and `/status` stay open, as before).
        .merge(
            axum::Router::new()
                .route("/v1/denied", get(admin::denied::<S>))
                .route(
                    "/v1/counters",
                    get(counters::inspect::<S>).delete(counters::reset::<S>),
                )
                .route_layer(from_fn_with_state(state.clone(), admin::admin_auth::<S>)),
        )
        .fallback(body::not_found)
        // Applies to the routes above only, so it must come after them.
        .method_not_allowed_fallback(body::method_not_allowed)
        .with_state(state)
}
