//! `/v1/*`: rate requests and holds of copy-limited resources.
//!
//! A hold is a session with a lease, opened by one reserve or one seize; it
//! therefore holds copies of one resource for one domain. Once it holds
//! nothing (everything released or transferred) it is closed, so its id is
//! unknown from then on, exactly as after its lease lapsed.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header::RETRY_AFTER;
use http::{HeaderValue, StatusCode};
use tollgate_core::Nanos;
use tollgate_proto::v1;
use tollgate_service::{ServiceError, Session, SessionId};
use tollgate_store::Store;

use super::body::{fail, ApiError, JsonBody, OptionalJsonBody};
use super::Http;
use crate::app::App;
use crate::errors::malformed;
use crate::{clock, metrics as m, native};

/// A hold's lease when the request names none.
const DEFAULT_LEASE_MS: u64 = 30_000;
/// The longest lease: a hold is meant to be renewed while in use, and a
/// forgotten one should not pin copies for days.
const MAX_LEASE_MS: u64 = 24 * 60 * 60 * 1000;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// `POST /v1/request`: 200 when granted, 429 with `Retry-After` when not.
pub(super) async fn request<S: Store>(
    State(http): State<Http<S>>,
    JsonBody(req): JsonBody<v1::RateRequest>,
) -> Result<Response, ApiError> {
    let answer = native::rate(&http.app, "http", &req)
        .await
        .map_err(|e| ApiError::service(&e))?;
    if answer.allowed {
        return Ok(Json(answer).into_response());
    }
    let retry = answer.retry_after_ns;
    let mut response = (StatusCode::TOO_MANY_REQUESTS, Json(answer)).into_response();
    // Whole seconds, rounded up: retrying at the rounded-down second would
    // be rejected again.
    if let Some(ns) = retry.filter(|&ns| ns > 0) {
        let seconds = ns.div_ceil(NANOS_PER_SECOND);
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    Ok(response)
}

/// `POST /v1/reserve`: a new hold with what was granted; 429 and no hold
/// when nothing was.
pub(super) async fn reserve<S: Store>(
    State(http): State<Http<S>>,
    JsonBody(req): JsonBody<v1::ReserveRequest>,
) -> Result<Response, ApiError> {
    let app = &http.app;
    if req.copies == 0 {
        // It could only ever grant nothing, and a hold of nothing is no hold.
        return Err(fail(malformed("copies must be at least 1")));
    }
    let lease = lease(req.lease_ms).map_err(fail)?;
    let session = open(app, lease)?;
    match native::reserve(app, &session, &req).await {
        Ok(mut answer) if answer.granted > 0 => {
            answer.hold_id = session.id().to_string();
            Ok(Json(answer).into_response())
        }
        Ok(answer) => {
            close(app, &session).await;
            Ok((StatusCode::TOO_MANY_REQUESTS, Json(answer)).into_response())
        }
        Err(e) => {
            close(app, &session).await;
            Err(fail(e))
        }
    }
}

/// `POST /v1/release`: gives back copies of a hold; an emptied hold ends.
pub(super) async fn release<S: Store>(
    State(http): State<Http<S>>,
    JsonBody(req): JsonBody<v1::ReleaseRequest>,
) -> Result<Json<v1::ReleaseResponse>, ApiError> {
    let app = &http.app;
    let session = hold(app, &req.hold_id).map_err(fail)?;
    let answer = native::release(app, &session, &req).await.map_err(fail)?;
    close_if_empty(app, &session).await;
    Ok(Json(answer))
}

/// `POST /v1/transfer`: stages copies of a hold for another client; an
/// emptied hold ends (the staged copies live on in the store until seized
/// or their ttl ends).
pub(super) async fn transfer<S: Store>(
    State(http): State<Http<S>>,
    JsonBody(req): JsonBody<v1::TransferRequest>,
) -> Result<Json<v1::TransferResponse>, ApiError> {
    let app = &http.app;
    let session = hold(app, &req.hold_id).map_err(fail)?;
    let answer = native::transfer(app, &session, &req).await.map_err(fail)?;
    close_if_empty(app, &session).await;
    Ok(Json(answer))
}

/// `POST /v1/seize`: takes staged copies into a new hold.
pub(super) async fn seize<S: Store>(
    State(http): State<Http<S>>,
    JsonBody(req): JsonBody<v1::SeizeRequest>,
) -> Result<Json<v1::SeizeResponse>, ApiError> {
    let app = &http.app;
    if req.transfer_id.is_empty() {
        return Err(fail(malformed("transfer_id is required")));
    }
    let lease = lease(req.lease_ms).map_err(fail)?;
    let session = open(app, lease)?;
    match native::seize(app, &session, &req).await {
        Ok(mut answer) => {
            answer.hold_id = session.id().to_string();
            Ok(Json(answer))
        }
        Err(e) => {
            close(app, &session).await;
            Err(fail(e))
        }
    }
}

/// `POST /v1/holds/{id}/renew`'s optional body.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct Renew {
    /// The new lease; absent: the hold's current one.
    lease_ms: Option<u64>,
}

/// `POST /v1/holds/{id}/renew`'s answer.
#[derive(Debug, serde::Serialize)]
pub(super) struct Renewed {
    hold_id: String,
    /// When the hold now lapses (Unix ms).
    expires_at_ms: u64,
}

/// `POST /v1/holds/{id}/renew`: the hold now lapses a lease from now.
pub(super) async fn renew<S: Store>(
    State(http): State<Http<S>>,
    id: Result<Path<String>, PathRejection>,
    OptionalJsonBody(body): OptionalJsonBody<Renew>,
) -> Result<Json<Renewed>, ApiError> {
    let app = &http.app;
    let id = hold(app, &path(id)?).map_err(fail)?.id();
    let ttl = match body.and_then(|b| b.lease_ms) {
        Some(ms) => Some(lease(Some(ms)).map_err(fail)?),
        None => None,
    };
    let at = app.sessions.renew(id, ttl, clock::now()).map_err(fail)?;
    Ok(Json(Renewed {
        hold_id: id.to_string(),
        expires_at_ms: at.as_u64() / 1_000_000,
    }))
}

/// `DELETE /v1/holds/{id}`'s answer.
#[derive(Debug, serde::Serialize)]
pub(super) struct Dropped {
    released: u64,
}

/// `DELETE /v1/holds/{id}`: releases everything the hold holds.
pub(super) async fn drop_hold<S: Store>(
    State(http): State<Http<S>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Dropped>, ApiError> {
    let app = &http.app;
    let session = hold(app, &path(id)?).map_err(fail)?;
    let released = close(app, &session).await;
    Ok(Json(Dropped { released }))
}

/// The service answers an empty namespace with "unknown namespace ``" and,
/// in a namespace that allows unconfigured resources, grants an empty
/// resource name; both are almost surely a client's missing field.
fn lease(ms: Option<u64>) -> Result<Nanos, ServiceError> {
    match ms.unwrap_or(DEFAULT_LEASE_MS) {
        0 => Err(malformed("lease_ms must be at least 1")),
        ms if ms > MAX_LEASE_MS => Err(malformed(format!(
            "lease_ms must be at most {MAX_LEASE_MS} (24 h); renew the hold to keep it longer"
        ))),
        ms => Ok(clock::ms(ms)),
    }
}

fn path(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    id.map(|Path(id)| id)
        .map_err(|e| fail(malformed(format!("bad hold id in the path: {e}"))))
}

/// The live HTTP hold `id`. gRPC sessions have no lease and are not holds:
/// their holds belong to their stream alone. A hold whose lease lapsed is
/// unknown even before housekeeping reaps it, as `renew` has it.
fn hold<S: Store>(app: &App<S>, id: &str) -> Result<Arc<Session>, ServiceError> {
    if id.is_empty() {
        return Err(malformed("hold_id is required"));
    }
    let id: SessionId = id.parse()?;
    let session = app.sessions.get(id)?;
    match session.expires_at() {
        Some(at) if at > clock::now() => Ok(session),
        _ => Err(ServiceError::UnknownHold(id.to_string())),
    }
}

fn open<S: Store>(app: &App<S>, lease: Nanos) -> Result<Arc<Session>, ApiError> {
    let session = app.sessions.open(Some(lease), clock::now()).map_err(fail)?;
    metrics::gauge!(m::SESSIONS).set(app.sessions.len() as f64);
    Ok(session)
}

/// Ends a hold, releasing what it still holds; returns how many copies.
async fn close<S: Store>(app: &App<S>, session: &Session) -> u64 {
    let released = app.sessions.close(&app.limiter, session).await;
    metrics::gauge!(m::SESSIONS).set(app.sessions.len() as f64);
    released
}

async fn close_if_empty<S: Store>(app: &App<S>, session: &Session) {
    // Nothing adds to an existing hold (reserve and seize open new ones),
    // so empty now is empty for good.
    if session.held() == 0 {
        close(app, session).await;
    }
}
